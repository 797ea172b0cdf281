/**
 * @file kvhal_xfer.h
 * @brief KV transfer between processes and hosts (prefill/decode disaggregation) over UCX (libkvhal-xfer).
 *
 * libkvhal-xfer.so, built when meson finds UCX (-Dtransfer=auto|ucx); libkvhal itself keeps no UCX dependency.
 *
 * Model. Each process makes one agent for one paged cache. The decode side (the receiver) hands its address blob
 * to the prefill side (the sender) out of band; the sender connects with the token the receiver was configured
 * with. The receiver chooses the pages a request's K/V goes into (e.g. from kvhal_cache_manager_allocate) and posts
 * them with kvhal_xfer_post_receive; the sender learns them from a GRANT event and sends its own pages into them
 * with kvhal_xfer_send_pages (all layers, K and V; pages scattered on both sides). Both sides complete a transfer
 * handle: the receiver when every granted page of every layer has arrived, the sender when the receiver
 * acknowledged every byte. Many transfers may be in flight on many peers. On one host, where the receiver reads
 * the sender's cache itself (the IPC and CMA paths), the sender may instead offer a request's pages first
 * (kvhal_xfer_offer_pages): the receive posted for it then takes them without a GRANT.
 *
 * Safety. Remote peers are bad input: a peer that does not prove it holds the token is refused (and a listener
 * that does not is sent nothing); every size, page id and
 * layer index in a frame is checked against the receiver's own grant and cache before anything is written (each
 * (page, layer) at most once); a peer that breaks the protocol is dropped. A page is the caller's again only when
 * its transfer completed; on failure, timeout or cancel the receiver's granted pages go back to the cache manager
 * given to kvhal_xfer_post_receive. A peer that dies or stalls fails its transfers within the agent's timeout.
 *
 * Threads: an agent and everything made from it (peers, transfers) are used by one thread at a time. The agent's
 * copy workers (KVHAL_XFER_THREADS, started on first use) run beside it: they read peer pages (the CMA path),
 * gather TCP frames and make the staging copies of a device cache (its pages to and from host memory, on streams of
 * their own); they touch only the registered cache and the frames the agent hands them, and may run between calls
 * while transfers are in flight. An agent belongs to the process that created it: a child made by fork() must not
 * use it (UCX's context is not fork-safe; the copy workers are not in the child). kvhal_xfer_agent_destroy waits
 * for the copies already under way (process_vm_readv, staging copies), however long they take.
 * Graph capture: no call here may be made while a CUDA/HIP stream of the cache's device is capturing, and while a
 * transfer of a GPU cache is in flight no stream of that device may capture in the global capture mode (the
 * workers' staging copies, made between calls, would break it): capture in thread-local or relaxed mode.
 * Stream: the agent's own streams, waited for before a frame is sent or acknowledged: the staged path's copies
 * between the cache and pinned staging (a sender synchronizes the cache's device in kvhal_xfer_send_pages, so that
 * every write queued to its pages is in) and the IPC path's copies. A staged frame is acknowledged only once its
 * pages are on the device, so a completed receive's pages hold the data. */
#ifndef KVHAL_XFER_H
#define KVHAL_XFER_H

#include "kvhal.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Longest token accepted (characters, without the NUL). */
#define KVHAL_XFER_TOKEN_MAX 63
/** Longest agent name accepted (characters, without the NUL). */
#define KVHAL_XFER_NAME_MAX 31
/** Bounds per peer (a remote peer is bad input): events of one peer queued and not yet taken by
 * kvhal_xfer_progress, and page ids held by its queued GRANT events, at most. A peer past either fails
 * (KVHAL_XFER_EVENT_PEER_FAILED, status KVHAL_OUT_OF_MEMORY, "grant flood"); the agent and its other peers go on.
 * The other per-peer bounds: 2^20 offered pages and 4096 offers waiting (kvhal_xfer_offer_pages), a grant of 65536
 * pages; frames in flight are bounded by what this side granted or sent; a handshake waits timeout_ms at most. */
#define KVHAL_XFER_PEER_EVENTS_MAX 4096
/** Page ids held by one peer's queued GRANT events, at most (see KVHAL_XFER_PEER_EVENTS_MAX). */
#define KVHAL_XFER_PEER_GRANT_PAGES_MAX (1 << 20)

/** An agent: one UCX worker, one registered paged cache, its peers and transfers. */
typedef struct kvhal_xfer_agent kvhal_xfer_agent;
/** A connection to another agent (either side of it). Owned by the agent. */
typedef struct kvhal_xfer_peer kvhal_xfer_peer;
/** One transfer: pages being sent, or pages granted and being received. Owned by the caller until released. */
typedef struct kvhal_xfer kvhal_xfer;

/** Agent configuration. Strings are copied during kvhal_xfer_agent_create. */
typedef struct kvhal_xfer_config {
    const char *name;       /**< this agent's name in peers' messages (NULL = "kvhal"), at most KVHAL_XFER_NAME_MAX */
    const char *token;      /**< the shared secret both sides of a connection prove they hold (never sent):
                                 1..KVHAL_XFER_TOKEN_MAX characters; a long random one (its proofs cross the wire,
                                 so a guessable token can be found offline from a recorded handshake) */
    uint32_t timeout_ms;    /**< connect and handshake limit, stalled transfer limit (a transfer that makes no
                                 progress for this long fails, and so does its peer); 0 = 10000. An idle peer with
                                 nothing in flight is not dropped: max_peers bounds them, kvhal_xfer_disconnect ends
                                 them */
    const char *transports; /**< UCX transports (UCX_TLS syntax: "tcp", "shm", "posix,cma"); NULL = UCX's choice */
    int32_t max_peers;      /**< live peers at most, connections being authenticated included (a connection past
                                 it is refused); 0 = 64 */
} kvhal_xfer_config;

/** What kvhal_xfer_progress reports. */
typedef enum kvhal_xfer_event_type {
    KVHAL_XFER_EVENT_NONE = 0,           /**< nothing happened within the timeout */
    KVHAL_XFER_EVENT_PEER_CONNECTED = 1, /**< a peer connected to this agent with the right token (peer set) */
    KVHAL_XFER_EVENT_PEER_REJECTED = 2,  /**< a connection was refused (wrong token, geometry, too many peers) */
    KVHAL_XFER_EVENT_PEER_FAILED = 3,    /**< a peer died, stalled, closed or broke the protocol (peer set; it
                                              stays allocated, refusing calls with the reason, until
                                              kvhal_xfer_disconnect frees it) */
    KVHAL_XFER_EVENT_GRANT = 4,          /**< the peer granted pages for request_id: send into pages[0..num_pages) */
    KVHAL_XFER_EVENT_RECV_DONE = 5,      /**< a posted receive finished (status OK or why not; xfer set) */
    KVHAL_XFER_EVENT_SEND_DONE = 6,      /**< a send finished (status OK or why not; xfer set) */
    KVHAL_XFER_EVENT_OFFER = 7,          /**< the peer offered pages for request_id (kvhal_xfer_offer_pages) and no
                                              receive is posted for it yet: num_pages is the request's page count;
                                              post a receive of that many pages to take them (one event per
                                              offer, e.g. per layer range) */
    KVHAL_XFER_EVENT_LAYER_DONE = 8,     /**< a layer of a receive posted with kvhal_xfer_post_receive_layers is
                                              in (every page of it, K and V): xfer, request_id set; num_pages holds
                                              the layer's index (kvhal_xfer_event is frozen, see the streaming
                                              section) */
    KVHAL_XFER_EVENT_LISTENER_LOST = 9   /**< UCX stopped accepting connections on the agent's TCP listening socket
                                              (status KVHAL_BACKEND_ERROR): connections wait in its queue unaccepted
                                              for timeout_ms, as after the process ran out of file descriptors
                                              (EMFILE: UCX 1.13 then drops the socket for good). The agent's peers
                                              go on; new ones cannot reach it: make a new agent (and raise
                                              RLIMIT_NOFILE). Reported once per agent */
} kvhal_xfer_event_type;

/** One notification. pages and message stay valid until the next kvhal_xfer_progress call on the agent. */
typedef struct kvhal_xfer_event {
    kvhal_xfer_event_type type; /**< what happened */
    kvhal_xfer_peer *peer;   /**< the peer concerned (NULL for a refused connection) */
    kvhal_xfer *xfer;        /**< RECV_DONE, SEND_DONE: the transfer (still the caller's to release) */
    uint64_t request_id;     /**< GRANT, RECV_DONE, SEND_DONE */
    kvhal_status status;     /**< RECV_DONE, SEND_DONE, PEER_FAILED, PEER_REJECTED */
    int32_t num_pages;       /**< GRANT, OFFER */
    const int32_t *pages;    /**< GRANT: the receiver's page ids, in the receiver's order (NULL otherwise) */
    char message[256];       /**< what happened, for logs ("" when nothing to say) */
} kvhal_xfer_event;

/** Progress of one transfer. */
typedef struct kvhal_xfer_info {
    uint64_t request_id;     /**< the request the transfer carries */
    uint64_t bytes_total;    /**< K and V of every page and layer of the transfer */
    uint64_t bytes_done;     /**< received (receiver) or acknowledged by the receiver (sender) */
    kvhal_status status;     /**< KVHAL_BUSY while in flight, then the final status */
    bool is_receive;         /**< true on the receiving side */
} kvhal_xfer_info;

/**
 * Creates an agent (a UCX context and worker), listening where the environment's UCX_NET_DEVICES says, else on
 * loopback only ("lo": peers on this host): kvhal_xfer_agent_create_on(cfg, NULL, out).
 * @param cfg  read during the call only; cfg->token is required.
 * @param out  receives the agent (destroy with kvhal_xfer_agent_destroy); NULL on failure.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (a NULL argument, an empty or too long token or name, a bad max_peers)
 *         naming the field; KVHAL_BACKEND_ERROR when UCX cannot start (the message has UCX's reason, e.g. an
 *         unknown transport); KVHAL_OUT_OF_MEMORY.
 * Thread safety: agents are independent of each other.
 */
KVHAL_API kvhal_status kvhal_xfer_agent_create(const kvhal_xfer_config *cfg, kvhal_xfer_agent **out);

/**
 * Creates an agent that listens (and connects) on the network devices named.
 * @param cfg          as kvhal_xfer_agent_create.
 * @param net_devices  UCX_NET_DEVICES syntax: "lo", "eth1", "mlx5_0:1", "eth1,lo"; "all": every device; NULL: the
 *                     environment's UCX_NET_DEVICES, else "lo". Name a private interface for peers on other hosts:
 *                     frames are not encrypted (docs/guide.md says what protects the link).
 * @param out          as kvhal_xfer_agent_create.
 * @return as kvhal_xfer_agent_create; KVHAL_INVALID_ARGUMENT naming net_devices when UCX refuses it (a device that
 *         does not exist is refused when the agent starts: KVHAL_BACKEND_ERROR).
 */
KVHAL_API kvhal_status kvhal_xfer_agent_create_on(const kvhal_xfer_config *cfg, const char *net_devices,
                                                  kvhal_xfer_agent **out);

/**
 * Destroys an agent: closes every peer, fails every transfer still in flight (granted pages go back to their cache
 * manager), and frees every peer and every transfer handle it made (handles are invalid afterwards).
 * @param agent  NULL is OK (like free(NULL)).
 * @return KVHAL_OK; KVHAL_INVALID_HANDLE for a pointer that is not an agent.
 */
KVHAL_API kvhal_status kvhal_xfer_agent_destroy(kvhal_xfer_agent *agent);

/**
 * Registers the paged cache whose pages this agent sends and receives (all layers, K and V). One cache per agent,
 * registered before connecting; the cache must outlive the agent. Two connected agents' caches must have the same
 * num_layers, num_heads, head_dim, block_size, dtype and layout (order, page count and device may differ).
 * Host caches are read and written in place (UCX registers them); caches on other devices are staged through host
 * memory of the device (kvhal_host_memory_create: pinned on CUDA and HIP, kept in a pool for reuse), a frame of
 * every layer in one batched page copy (kvhal_paged_cache_transfer), other frames with kvhal_memcpy_d2h / _h2d.
 * @param agent  the agent.
 * @param cache  borrowed; not destroyed by the agent.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, a second cache); KVHAL_BACKEND_ERROR (UCX could not register it).
 */
KVHAL_API kvhal_status kvhal_xfer_register_paged_cache(kvhal_xfer_agent *agent, kvhal_paged_cache *cache);

/**
 * Writes the agent's address blob (opaque bytes, to hand to peers out of band).
 * @param agent  the agent.
 * @param blob   receives up to cap bytes; may be NULL with cap 0 to ask the size.
 * @param cap    capacity of blob.
 * @param len    receives the blob's size.
 * @return KVHAL_OK; KVHAL_OUT_OF_RANGE when cap is smaller than the blob (*len tells the size, nothing written).
 */
KVHAL_API kvhal_status kvhal_xfer_local_address(kvhal_xfer_agent *agent, void *blob, size_t cap, size_t *len);

/**
 * Connects to the agent whose address blob is given, proving the token, and waits (progressing this agent) until
 * the peer accepts or refuses, at most the agent's timeout.
 * @param agent     the agent (a cache registered).
 * @param blob      the peer's address blob (read during the call), len bytes.
 * @param len       the blob's size in bytes (kvhal_xfer_local_address of the peer gives it).
 * @param token     the token the peer was configured with.
 * @param out       receives the peer, owned by the agent (kvhal_xfer_disconnect frees it earlier).
 * Both sides prove they hold the token without sending it (HMAC-SHA-256 over fresh nonces of both, both sessions,
 * names, hosts and geometries; docs/design/transfer.md): this side checks the listener's proof and its cache
 * geometry before it sends its own proof or anything else.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, a malformed blob, no cache registered); KVHAL_PEER_FAILED (the
 *         peer refused with a reason: different cache geometry, too many peers, ...; it did not prove the token
 *         (another token, or not the agent the blob names); its geometry differs; or it is unreachable);
 *         KVHAL_TIMEOUT (no answer within the timeout: also what another wire version gets; the receiver's
 *         KVHAL_XFER_EVENT_PEER_REJECTED names the reason); KVHAL_BACKEND_ERROR (no random numbers).
 */
KVHAL_API kvhal_status kvhal_xfer_connect(kvhal_xfer_agent *agent, const void *blob, size_t len, const char *token,
                                          kvhal_xfer_peer **out);

/**
 * Closes a peer (telling it) and frees it: its transfers in flight fail with KVHAL_CANCELED (their handles stay
 * the caller's to release).
 * @param peer  NULL is OK.
 * @return KVHAL_OK.
 */
KVHAL_API kvhal_status kvhal_xfer_disconnect(kvhal_xfer_peer *peer);

/**
 * The name the peer's agent was configured with ("" when unknown). Valid while the peer lives.
 * @param peer  the peer.
 * @return the name; "" for NULL.
 */
KVHAL_API const char *kvhal_xfer_peer_name(const kvhal_xfer_peer *peer);

/**
 * Receiver: grants pages for a request to a peer and tells it (a GRANT event on the sender), or, when the peer
 * offered the request already (kvhal_xfer_offer_pages, an OFFER event here), takes the offered pages: they are
 * copied into these pages and no GRANT is sent. The pages receive K and V of every layer; the transfer completes
 * when every (page, layer) has arrived. Until then the pages are the agent's: on failure, timeout (the agent's
 * timeout without any data), peer loss or cancel they are given back with kvhal_cache_manager_free(cm, pages, n)
 * when cm is not NULL.
 * @param peer        a connected peer.
 * @param request_id  the caller's id for the request (unique among this peer's pending receives).
 * @param pages       n page ids of the registered cache, distinct, copied during the call.
 * @param n           1..65536.
 * @param cm          the cache manager the pages came from, or NULL (then the caller frees them on failure).
 * @param out         receives the transfer (release with kvhal_xfer_release).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT / KVHAL_OUT_OF_RANGE (a page past the cache, a repeated page, a
 *         request id already pending) naming the argument; KVHAL_PEER_FAILED (the peer is gone).
 */
KVHAL_API kvhal_status kvhal_xfer_post_receive(kvhal_xfer_peer *peer, uint64_t request_id, const int32_t *pages,
                                               int32_t n, kvhal_cache_manager *cm, kvhal_xfer **out);

/**
 * Sender: sends layers [first_layer, first_layer + num_layers) of K and V of src_pages (this agent's cache) into
 * the peer's dst_pages (from its GRANT for request_id), split into frames as needed. The source pages must not
 * change (no write, no reuse) until the transfer completes (SEND_DONE: the receiver acknowledged every frame).
 * Path (kvhal_xfer_path): when the peer runs on this host (same boot_id and hostname) and this agent's cache is
 * shareable (kvhal_paged_cache_create_shareable) and the peer imported its handle at connect time (after its
 * challenge proved the handle names this agent's own memory: a nonce of its choosing written into the cache's proof
 * area, past its pages, and read back through the handle; a peer whose handle fails it is dropped), frames carry
 * page ids only and the receiver copies the pages itself, device to device (frames that arrive together share one
 * batched copy), then acknowledges; this call synchronizes the cache's device first, so that every write queued to
 * the source pages is complete before they are announced. Host caches on one host whose agents' transports allow CMA (cfg.transports
 * NULL, or naming cma, shm, sm or all) take the CMA path instead: the same frames, and the receiver reads the pages
 * from this process with process_vm_readv straight into its own (one kernel copy, scattered to scattered), after its
 * challenge at connect time proved this process is the peer (a nonce of its choosing written here and read back,
 * and this process's pid from the kernel over a Unix socket). Otherwise pages go through UCX (in place for host
 * caches, staged through host memory for device caches).
 * @param peer         a connected peer.
 * @param request_id   the receiver's request id (from the GRANT event).
 * @param src_pages    n page ids of this agent's cache, copied during the call.
 * @param dst_pages    n page ids of the peer's cache, copied during the call.
 * @param n            >= 1.
 * @param first_layer  first layer to send (0 for all).
 * @param num_layers   layers to send (the cache's num_layers for all).
 * @param out          receives the transfer (release with kvhal_xfer_release).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT / KVHAL_OUT_OF_RANGE naming the argument (pages past either cache,
 *         layers out of range); KVHAL_PEER_FAILED (the peer is gone); KVHAL_BACKEND_ERROR (UCX refused the send);
 *         KVHAL_OUT_OF_MEMORY. A device cache's pages are copied to host memory after the call (by a copy worker,
 *         or by the agent's progress where none runs): a copy that fails fails the transfer (SEND_DONE with its
 *         status), not this call.
 */
KVHAL_API kvhal_status kvhal_xfer_send_pages(kvhal_xfer_peer *peer, uint64_t request_id, const int32_t *src_pages,
                                             const int32_t *dst_pages, int32_t n, int32_t first_layer,
                                             int32_t num_layers, kvhal_xfer **out);

/**
 * Sender, on the IPC and CMA paths: offers layers [first_layer, first_layer + num_layers) of K and V of src_pages
 * (this agent's cache) for request_id before the receiver has granted pages for it, so that the transfer costs no
 * grant: the receiver copies them at once into the pages of its receive for request_id when that is posted already,
 * else when it is posted (kvhal_xfer_post_receive takes the pending offers and sends no GRANT; the receiver gets an
 * OFFER event). Page i of the offer goes into page i of the receive, which must have n pages (else both fail with
 * KVHAL_OUT_OF_RANGE). A GRANT for request_id that crosses the offer is not reported. Several offers may make up one
 * request (e.g. one per layer range); kvhal_xfer_send_pages refuses a request with an offer in flight. Like
 * kvhal_xfer_send_pages on the IPC path, this call synchronizes the cache's device first, and the source pages
 * must not change until the transfer completes (SEND_DONE: the receiver copied and acknowledged every page).
 * An offer no receive takes within half the receiver's timeout, or within this agent's timeout, fails with
 * KVHAL_TIMEOUT (SEND_DONE); one past the receiver's limits (2^20 pages, 4096 offers of this peer waiting) with
 * KVHAL_OUT_OF_MEMORY; the request's other waiting offers fail with it. A canceled or failed offer is withdrawn:
 * it completes once the receiver dropped the frames it had not taken and finished copying those it had (or the
 * peer failed, or did not answer within the timeout: the message says so); until then a new offer of the request
 * is refused.
 * @param peer         a connected peer that imported this agent's cache (kvhal_xfer_peer_ipc "ipc" or "cma").
 * @param request_id   the request (the receiver's id for it, agreed out of band, e.g. the engine's request id).
 * @param src_pages    n page ids of this agent's cache, in the request's order, copied during the call.
 * @param n            1..65536: the receive's page count.
 * @param first_layer  first layer offered (0 for all).
 * @param num_layers   layers offered (the cache's num_layers for all).
 * @param out          receives the transfer (release with kvhal_xfer_release).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT / KVHAL_OUT_OF_RANGE naming the argument; KVHAL_UNSUPPORTED when the peer
 *         reads no pages from this process (another host, no shareable cache, a refused handle: use
 *         kvhal_xfer_send_pages after its GRANT); KVHAL_PEER_FAILED; KVHAL_OUT_OF_MEMORY.
 */
KVHAL_API kvhal_status kvhal_xfer_offer_pages(kvhal_xfer_peer *peer, uint64_t request_id, const int32_t *src_pages,
                                              int32_t n, int32_t first_layer, int32_t num_layers, kvhal_xfer **out);

/**
 * Progresses the agent and returns the next event, waiting up to timeout_ms for one. While the agent's device
 * copies (the IPC path) are running, an event already queued is returned at once, without progressing.
 * @param agent       the agent.
 * @param timeout_ms  0 = only what is ready now.
 * @param ev          receives the event (type KVHAL_XFER_EVENT_NONE when none came).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for NULL.
 */
KVHAL_API kvhal_status kvhal_xfer_progress(kvhal_xfer_agent *agent, uint32_t timeout_ms, kvhal_xfer_event *ev);

/**
 * The transfer's state without waiting (progresses the agent once).
 * @param xfer  the transfer.
 * @return KVHAL_BUSY while in flight; KVHAL_OK when complete; otherwise why it failed (KVHAL_PEER_FAILED,
 *         KVHAL_TIMEOUT, KVHAL_CANCELED, KVHAL_OUT_OF_RANGE for a frame the receiver refused, ...) with the message.
 */
KVHAL_API kvhal_status kvhal_xfer_test(kvhal_xfer *xfer);

/**
 * Waits for the transfer, progressing its agent, at most timeout_ms (events that arrive meanwhile are queued
 * for kvhal_xfer_progress).
 * @param xfer        the transfer.
 * @param timeout_ms  how long to wait.
 * @return as kvhal_xfer_test; KVHAL_BUSY when it is still in flight after timeout_ms.
 */
KVHAL_API kvhal_status kvhal_xfer_wait(kvhal_xfer *xfer, uint32_t timeout_ms);

/**
 * Cancels a transfer in flight. A receive stops accepting frames, and its pages go back to the cache manager
 * once no frame is being written into them; a send stops sending frames not yet handed to UCX. The transfer
 * then completes with KVHAL_CANCELED (wait for it before reusing source pages). A finished transfer is unchanged.
 * @param xfer  the transfer.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for NULL.
 */
KVHAL_API kvhal_status kvhal_xfer_cancel(kvhal_xfer *xfer);

/**
 * Releases a transfer handle (cancelling it first if it is in flight; the agent finishes the cancel by itself).
 * @param xfer  NULL is OK.
 * @return KVHAL_OK.
 */
KVHAL_API kvhal_status kvhal_xfer_release(kvhal_xfer *xfer);

/**
 * Reports a transfer's progress.
 * @param xfer  the transfer.
 * @param out   receives the state.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for NULL.
 */
KVHAL_API kvhal_status kvhal_xfer_get_info(const kvhal_xfer *xfer, kvhal_xfer_info *out);

/**
 * How a transfer's pages moved: "ipc" (the receiver copied them device to device from the sender's cache, imported
 * through the backend's IPC), "cma" (host caches on one host: the receiver read them from the sender's process with
 * process_vm_readv), "staged" (device caches through host memory and UCX), "host" (host caches, UCX in place); ""
 * before any frame (receiver) or for an invalid handle.
 * @param xfer  the transfer (either side).
 * @return a static string. Thread safety: as the agent.
 */
KVHAL_API const char *kvhal_xfer_path(const kvhal_xfer *xfer);

/**
 * The IPC state of a connection as this side's sends see it: "ipc" (the peer imported this agent's cache),
 * "cma" (the peer reads this agent's host cache from this process), "offered" (no answer yet), the peer's reason for refusing the handle, "same host, no shareable cache" or
 * "other host". For logs and the tool.
 * @param peer  the peer. @return a string valid while the peer lives; "" for an invalid handle.
 */
KVHAL_API const char *kvhal_xfer_peer_ipc(const kvhal_xfer_peer *peer);

/* ------------------------------------------------------------------------------------------------------------ */
/* Layer-by-layer streaming (prefill/decode): a request's layers sent as prefill writes them.                    */
/* ------------------------------------------------------------------------------------------------------------ */
/* The receiver posts its pages once for the whole request (kvhal_xfer_post_receive_layers: one GRANT) and sees a
 * LAYER_DONE event per layer as it lands, then RECV_DONE, so decode may start on the first layers while the last
 * ones are still computed and sent. The sender opens a stream into the granted pages (kvhal_xfer_stream_open), then
 * hands it each layer as prefill writes it (kvhal_xfer_stream_layer), with the device event that marks the layer's
 * writes: the layer's data moves as soon as the event completes (found by the agent's progress, which polls it),
 * while the next layer is computed. Each layer is sent as its own frames on the peer's path (host, staged, IPC,
 * CMA) and acknowledged per frame; there is no grant and no wait for an acknowledgement between layers. A peer
 * that dies mid-stream fails both sides as for any transfer (the receiver's pages go back to its cache manager). */

/**
 * Receiver: kvhal_xfer_post_receive, and a KVHAL_XFER_EVENT_LAYER_DONE event for each layer once all its pages
 * (K and V) are in the receive's pages (on the IPC path: once the copy into them completed). Layers are reported
 * as their frames complete: in the order the sender streams them, except that frames landing in one progress round
 * may complete in any order; RECV_DONE follows the last one. A layer's event is not sent when the receive
 * fails first (RECV_DONE tells why; kvhal_xfer_layer_ready tells which layers were complete).
 * @param peer, request_id, pages, n, cm, out  as kvhal_xfer_post_receive.
 * @return as kvhal_xfer_post_receive.
 */
KVHAL_API kvhal_status kvhal_xfer_post_receive_layers(kvhal_xfer_peer *peer, uint64_t request_id,
                                                      const int32_t *pages, int32_t n, kvhal_cache_manager *cm,
                                                      kvhal_xfer **out);

/**
 * Receiver: whether one layer of a receive posted with kvhal_xfer_post_receive_layers is in (without progressing).
 * @param xfer   the receive.
 * @param layer  0..num_layers-1.
 * @return KVHAL_OK when every page of the layer is written; KVHAL_BUSY while not; KVHAL_INVALID_ARGUMENT (NULL, not
 *         such a receive); KVHAL_OUT_OF_RANGE (layer).
 */
KVHAL_API kvhal_status kvhal_xfer_layer_ready(const kvhal_xfer *xfer, int32_t layer);

/**
 * Sender: opens a stream of request_id's layers from src_pages (this agent's cache) into the peer's dst_pages (its
 * GRANT for the request). Nothing moves until layers are handed to it (kvhal_xfer_stream_layer). The returned
 * transfer completes (SEND_DONE) once every layer of the cache was handed and acknowledged, or fails with the
 * first layer that failed (the layers still in flight are canceled); kvhal_xfer_test, _wait, _cancel, _release,
 * _get_info (bytes acknowledged so far of every layer) and _path work on it as on a send.
 * @param peer       a connected peer.
 * @param request_id the receiver's request id (from the GRANT event).
 * @param src_pages  n page ids of this agent's cache, copied during the call.
 * @param dst_pages  n page ids of the peer's cache, copied during the call.
 * @param n          1..65536.
 * @param out        receives the stream's transfer (release with kvhal_xfer_release).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT / KVHAL_OUT_OF_RANGE naming the argument; KVHAL_PEER_FAILED;
 *         KVHAL_OUT_OF_MEMORY.
 */
KVHAL_API kvhal_status kvhal_xfer_stream_open(kvhal_xfer_peer *peer, uint64_t request_id, const int32_t *src_pages,
                                              const int32_t *dst_pages, int32_t n, kvhal_xfer **out);

/**
 * Sender: layer `layer` of the stream's source pages is written, or will be once `written` completes: its K and V
 * go to the receiver then. The agent polls the event from its progress (kvhal_xfer_progress, _test, _wait, and
 * this call), and sends the layer without waiting for the device (the event is the layer's fence); without an event
 * the layer goes now (a device cache's device is synchronized first, as kvhal_xfer_send_pages does). Each layer is
 * handed once, in any order.
 * @param stream   a transfer from kvhal_xfer_stream_open.
 * @param layer    0..num_layers-1.
 * @param written  NULL, or an event of the cache's device recorded after the layer's writes; borrowed: it must
 *                 stay alive, and not be recorded again, until the stream completes.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (not a stream, a layer handed already, an event of another device);
 *         KVHAL_OUT_OF_RANGE (layer); the stream's status when it failed already (with its message); what the
 *         layer's send returned when it went at once (KVHAL_PEER_FAILED, KVHAL_OUT_OF_MEMORY, ...).
 */
KVHAL_API kvhal_status kvhal_xfer_stream_layer(kvhal_xfer *stream, int32_t layer, kvhal_event *written);

#ifdef __cplusplus
}
#endif
#endif /* KVHAL_XFER_H */

/* xfer_rooms.h — what each room of libkvhal-xfer offers the others (private to transfer/; above xfer_types.h in the
 * layering, and nothing includes it but the rooms' .c files). The rooms form layers, bottom to top: a room calls
 * only rooms below it (or beside it on the same layer, never one that calls it back):
 *   1. xfer_util.c     the clock and deadlines, names, session ids, handle checks, the host's identity, waits
 *      xfer_workers.c  the worker pool (xfer_workers.h), which knows nothing of the rooms
 *      xfer_pools.c    bounce buffers (gathered frames) and staging buffers (device caches)
 *      xfer_auth.c     the handshake's nonces and proofs of the token (HMAC-SHA-256, Nettle)
 *   2. xfer_msgs.c     small frames queued for a peer and sent from pump, endpoints closed, acknowledgements
 *   3. xfer_transfer.c transfers (new, settle, finish, free, release), events, grant lookups
 *   4. xfer_frames.c   what sending and receiving share: a frame's IOV and buffer, a send frame posted
 *      xfer_peer.c     peers: the handshake (HELLO, HELLO_ACK, AUTH; our IPC_MAP), the start of a connect, peer failure
 *   5. xfer_send.c     DATA frames sent, their acknowledgements; the host path (both sides)
 *      xfer_recv.c     DATA frames received
 *   6. xfer_staged.c   the staged path: device caches through host staging, on both sides
 *      xfer_jobs.c     the IPC paths' common part: their sends (DATA_IPC, OFFER), the frames accepted as copy jobs
 *   7. xfer_ipc.c      the IPC path: copies from an imported cache, in launch groups
 *      xfer_cma.c      the CMA path: reads of a peer's process
 *      xfer_offer.c    offers: pages named before the grant, taken by a receive
 *   8. xfer_grant.c    grants: a receive posted (or the offers waiting for it taken), a peer's GRANT
 *      xfer_map.c      the IPC map: a peer's IPC_MAP imported (IPC or CMA path), its handle's challenge, its answer taken
 *      xfer_stream.c   streams: a request's layers sent as their device events complete, each through the peer's
 *                      send path as a transfer of its own, collected into the stream's; a receive's layer events
 *   9. xfer_agent.c    the agent: create, destroy, the cache, the progress loop (pump), the active-message dispatch,
 *                      connect and disconnect
 * What a lower room must have done above it goes through the data-path table (struct xfer_path, xfer_types.h),
 * set by the upper rooms: the agent's and the peers' paths are chosen by the agent and xfer_map.c, and the lower
 * rooms call through them (a transfer's sends, a frame's receive, a job's queue, the paths' progress).
 * Everything runs on the caller's thread inside pump(): UCX callbacks only record (frames, completions, errors);
 * connection set-up, acknowledgements and deadlines are handled after ucp_worker_progress returns. The exception is
 * the copy workers, which run the work the rooms hand to the pool and touch nothing else. */
#ifndef KVHAL_XFER_ROOMS_H
#define KVHAL_XFER_ROOMS_H

#include "handles.h" /* core/handles.c, built into this library too: its live transfer handles */
#include "xfer_types.h"

/* ---- the data paths (xfer_send.c, xfer_staged.c, xfer_ipc.c, xfer_cma.c) ---- */
enum { XFER_PATHS = 4 };
extern const xfer_path xfer_path_host, xfer_path_staged, xfer_path_ipc, xfer_path_cma;
extern const xfer_path *const xfer_paths[XFER_PATHS]; /* all of them, for the agent's loops (xfer_agent.c) */

/* ---- xfer_util.c ---- */
uint64_t now_ns(void);
uint64_t random_session(void);
void copy_name(char *dst, size_t cap, const char *src); /* printable ASCII, truncated to cap */
void printable(char *s); /* a peer's words in place: anything but printable ASCII becomes '?' (like names) */
uint64_t deadline_from_now(const kvhal_xfer_agent *a);
kvhal_status check_agent(const kvhal_xfer_agent *a);
kvhal_status check_peer(const kvhal_xfer_peer *p);
kvhal_status check_xfer(const kvhal_xfer *x);
kvhal_status check_pages(const char *arg, const int32_t *pages, int32_t n, int64_t limit);
void host_identity(char *out, size_t cap);
typedef struct idle_state {
    unsigned idle, rounds;
} idle_state;
void idle_wait(idle_state *w, unsigned work); /* between rounds of a progress loop */

/* ---- xfer_pools.c ---- */
void frame_unbounce(kvhal_xfer_agent *a, send_frame *f);
void *bounce_get(kvhal_xfer_agent *a, size_t len);
void bounce_pool_free(kvhal_xfer_agent *a);
void *stage_alloc(kvhal_xfer_agent *a, size_t len, kvhal_host_memory **mem);
void stage_release(kvhal_xfer_agent *a, kvhal_host_memory *mem, void *p);
void stage_pool_free(kvhal_xfer_agent *a);

/* ---- xfer_msgs.c ---- */
/* A frame to send from pump (never from a UCX callback): to p's endpoint, or to ep (a refusal's). */
void queue_msg(kvhal_xfer_agent *a, kvhal_xfer_peer *p, ucp_ep_h ep, const void *hdr, size_t len, const void *data,
               size_t data_len, bool close_after);
void flush_msgs(kvhal_xfer_agent *a);
void send_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t xfer_id, uint32_t frame, kvhal_status st,
              uint64_t bytes, const char *reason);

/* ---- xfer_transfer.c ---- */
void push_event(kvhal_xfer_agent *a, kvhal_xfer_event_type type, kvhal_xfer_peer *p, kvhal_xfer *x,
                uint64_t request_id, kvhal_status st, int32_t *pages_owned, int32_t n, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
void scrub_events(kvhal_xfer_agent *a, const kvhal_xfer_peer *p, const kvhal_xfer *x);
kvhal_xfer *xfer_new(kvhal_xfer_agent *a, kvhal_xfer_peer *p, bool is_recv, uint64_t request_id);
void xfer_free(kvhal_xfer *x);
void xfer_settle(kvhal_xfer *x);
void xfer_finish(kvhal_xfer *x, kvhal_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void recv_frame_end(kvhal_xfer *x, kvhal_status st, uint64_t bytes, const char *reason);
kvhal_xfer *find_xfer_id(kvhal_xfer_agent *a, uint64_t id);
int32_t grant_index(const kvhal_xfer *x, int32_t page);
kvhal_xfer *find_grant(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t request_id);
bool offer_in_flight(const kvhal_xfer_peer *p, uint64_t request_id, bool failing_only);
/* A receive's frame of layers [l0, l0 + nl) x np pages written: its layer events (kvhal_xfer_post_receive_layers). */
void recv_layers_end(kvhal_xfer *x, int32_t l0, int32_t nl, int32_t np);

/* ---- xfer_frames.c ---- */
ucp_dt_iov_t *build_iov(const kvhal_xfer_agent *a, const int32_t *pages, int32_t n, int32_t l0, int32_t nl,
                        size_t *count);
void *frame_buffer(ucp_dt_iov_t *iov, size_t iov_count, void *contig, size_t bytes, ucp_request_param_t *prm,
                   size_t *count);
void send_cb(void *request, ucs_status_t status, void *user_data);
bool post_frame(kvhal_xfer_peer *p, kvhal_xfer *x, int32_t fi, const void *buf, size_t count,
                const ucp_request_param_t *prm);

/* ---- xfer_peer.c ---- */
void peer_fail(kvhal_xfer_peer *p, kvhal_status st, bool tell, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
kvhal_xfer_peer *find_session(kvhal_xfer_agent *a, uint64_t s);
void on_hello_ack(kvhal_xfer_agent *a, const void *header, size_t header_length, uint64_t dest, uint16_t version);
ucs_status_t ep_create(kvhal_xfer_agent *a, ucp_ep_params_t *prm, ucp_ep_h *ep);
void accept_hello(kvhal_xfer_agent *a, pending_hello *ph);
void on_auth(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length);
void on_auth_ok(kvhal_xfer_agent *a, kvhal_xfer_peer *p, size_t header_length);
void auth_refuse(kvhal_xfer_peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void queue_hello(kvhal_xfer_agent *a, const void *header, size_t hlen, const void *data, size_t length,
                 uint16_t version);
void offer_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p);
kvhal_status peer_connect(kvhal_xfer_agent *a, const void *blob, size_t len, const char *token,
                          kvhal_xfer_peer **out);

/* ---- xfer_send.c ---- */
void post_pending(kvhal_xfer_agent *a);
kvhal_status send_data_pages(kvhal_xfer_peer *p, const xfer_send_req *r, kvhal_xfer **out);
void on_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length);
void send_frame_submit(kvhal_xfer_agent *a, send_frame *f);
bool send_frame_pending(xfer_work *w);
void send_frame_worked(send_frame *f, xfer_work_status st, const char *what);

/* ---- xfer_recv.c ---- */
void recv_frame_free(kvhal_xfer_agent *a, recv_frame *f);
ucs_status_t on_data(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length, void *data,
                     size_t length, bool rndv);
void recv_frame_done(kvhal_xfer_agent *a, recv_frame *f);
void recv_frame_finish(kvhal_xfer_agent *a, recv_frame *f, kvhal_status st, const char *reason, bool ack);

/* ---- xfer_jobs.c ---- */
kvhal_status send_pages_ipc(kvhal_xfer_peer *p, const xfer_send_req *r, kvhal_xfer **out);
void on_data_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length, const void *data,
                 size_t length, bool rndv);
void ipc_accept(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x, uint64_t request_id, uint64_t xfer_id,
                uint32_t frame, int32_t l0, int32_t nl, int32_t *pairs, int32_t n, const char *what);
void ipc_job_free(ipc_job *j);
void ipc_job_complete(kvhal_xfer_agent *a, ipc_job *j, kvhal_status st, const char *why);

/* ---- xfer_cma.c ---- */
void cma_precheck(const kvhal_xfer_agent *a, const xw_cma_blob *cb, char *why, size_t cap);
bool cma_challenge(kvhal_xfer_agent *a, kvhal_xfer_peer *p, char *why, size_t cap);
void cma_sock_poll(kvhal_xfer_agent *a);
void cma_sock_close(kvhal_xfer_agent *a);
void cma_readback(kvhal_xfer_agent *a, const kvhal_xfer_peer *p, const xw_cma_blob *cb, char *why, size_t cap);
void on_cma_challenge(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length);

/* ---- xfer_offer.c ---- */
int offer_take_pending(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x);
void on_offer(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length, const void *data,
              size_t length, bool rndv);
void on_withdraw(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length);
void offers_expire(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now);
void offers_free(kvhal_xfer_peer *p);

/* ---- xfer_grant.c ---- */
void on_grant(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length, const void *data,
              size_t length, bool rndv);

/* ---- xfer_stream.c ---- */
/* The streams' layers whose events completed sent, their finished layers collected, finished streams settled. */
unsigned streams_progress(kvhal_xfer_agent *a);

/* ---- xfer_map.c ---- */
void process_ipc_map(kvhal_xfer_agent *a, kvhal_xfer_peer *p);
void cma_claim_check(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now);
void on_ipc_map_ack(kvhal_xfer_peer *p, const void *header, size_t header_length);
void on_ipc_proof(kvhal_xfer_peer *p, const void *header, size_t header_length);
void ipc_proof_check(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now);
void on_ipc_challenge(kvhal_xfer_peer *p, const void *header, size_t header_length);
void ipc_answer(kvhal_xfer_agent *a, kvhal_xfer_peer *p);
void ipc_slot_release(kvhal_xfer_peer *p);

/* ---- xfer_agent.c ---- */
/* One round of UCX, the copies and the deadlines; returns how much moved (0: nothing, the caller may back off). */
unsigned pump(kvhal_xfer_agent *a);

/* ---- the cache: chunk addresses ---- */
static inline size_t chunk_off(const kvhal_xfer_agent *a, int32_t layer, int side, int32_t page)
{
    return (side ? a->v_off[layer] : a->k_off[layer]) + (size_t)page * a->block_stride;
}

#endif

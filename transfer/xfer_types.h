/* xfer_types.h — the transfer agent's records, private to transfer/: the agent, its peers, transfers, frames in
 * flight, copies of the IPC paths, and the table of data paths. The layering of transfer/'s private headers:
 * xfer_wire.h (the frames) and xfer_workers.h (the worker pool, which knows nothing of transfers) at the bottom,
 * then this file, then xfer_rooms.h (what each room of transfer/ offers the others). */
#ifndef KVHAL_XFER_TYPES_H
#define KVHAL_XFER_TYPES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <ucp/api/ucp.h>

#include "kvhal_xfer.h"
#include "xfer_wire.h"
#include "xfer_workers.h"

/* The number of statuses (codes are 0 .. n-1), counted from the public list. */
#define XFER_COUNT_X(name, code, msg) +1
enum { XFER_STATUS_N = 0 KVHAL_STATUS_MAP(XFER_COUNT_X) };
#undef XFER_COUNT_X

#define AGENT_MAGIC 0x4b584147u /* KXAG */
#define PEER_MAGIC 0x4b585045u  /* KXPE */
#define XFER_MAGIC 0x4b585846u  /* KXXF */
#define DEAD_MAGIC 0x44454144u
#define MAX_EVENTS 65536
#define MAX_FRAME_PAGES 256
#define RNDV_FRAME_BYTES 65536u           /* DATA frames of this size and more go by rendezvous */
#define BOUNCE_POOL 256                   /* idle bounce buffers an agent keeps */
#define BOUNCE_POOL_BYTES (256ull << 20)  /* and their bytes at most */
#define STAGE_POOL 64                     /* idle staging buffers (pinned host memory) a device-cache agent keeps */
#define STAGE_POOL_BYTES (256ull << 20)   /* and their bytes at most */
#define STAGE_PINNED_MAX (1ull << 30)     /* pinned staging held by frames at once; past it frames stage in malloc'd
                                           * (pageable) memory, so a huge send cannot pin the host's memory away */
#define GATHER_AHEAD_BYTES (8ull << 20)   /* gathered frames posted and not yet sent, at most (one at least) */
#define STAGE_AHEAD_BYTES (64ull << 20)   /* device caches: frames with the copy workers at once, each way, at most
                                           * (one at least): later ones wait (sender) or are copied by pump
                                           * (receiver: its UCX then waits too) */
#define GATHER_FRAME_BYTES (1u << 20)     /* gathered (TCP) frames carry this much at most (one page at least) */
#define WORKERS_DEFAULT 4                 /* copy workers by default at most, half the online cores */
#define CMA_PIECE_BYTES (512u << 10)      /* a CMA frame is split across workers in pieces of this size at least */
#define CMA_IOV_MAX 1024                  /* runs in one process_vm_readv call (the kernel's UIO_MAXIOV) */
#define IPC_STREAMS 8                     /* copies from imported caches in flight at once, one stream each */
#define IPC_CHAIN_BYTES (512u << 10)      /* see ipc_chain_slot (xfer_ipc.c) */
#define OFFER_PAGES_MAX (1 << 20)         /* pages of one peer's offers waiting for a receive at most (past it:
                                           * refused) */
#define OFFER_FRAMES_MAX 4096             /* and its OFFER frames waiting at most */
#define PROOF_SLOTS_MAX 128               /* nonces of IPC challenges held at once in the proof area (one a peer
                                           * until it answered our IPC_MAP; more wait for a free slot) */
#define CMA_CONNS_MAX 16                  /* connections to the CMA challenge socket waiting for their answer */
#define PEER_EVENTS_MAX KVHAL_XFER_PEER_EVENTS_MAX           /* kvhal_xfer.h: events of one peer queued */
#define PEER_GRANT_PAGES_MAX KVHAL_XFER_PEER_GRANT_PAGES_MAX /* and the page ids of its GRANT events (4 MiB) */

#define ERR(st, ...) kvhal_error_set((st), __VA_ARGS__)
#define CHECK_ARG(cond, ...)                                                                                    \
    do {                                                                                                        \
        if (!(cond)) return ERR(KVHAL_INVALID_ARGUMENT, __VA_ARGS__);                                           \
    } while (0)

/* P_AUTH: the listener's side of a handshake, its challenge (HELLO_ACK) sent and the connector's proof (AUTH) not
 * yet checked; never handed to the application, freed by pump when it fails (reap). */
typedef enum { P_CONNECTING, P_CONNECTED, P_FAILED, P_AUTH } peer_state;

enum { IPC_NONE = 0, IPC_OFFERED = 1, IPC_READY = 2, IPC_REFUSED = -1 };

typedef struct xfer_path xfer_path;
typedef struct ipc_job ipc_job;

typedef struct offer_rec { /* receiver: an OFFER frame that no posted receive took yet */
    uint64_t request_id, xfer_id;
    uint32_t frame;
    int32_t l0, nl, first_page, total, n;
    int32_t *src;           /* n source page ids, checked against the imported cache */
    uint64_t expires_ns;    /* refused (ACK TIMEOUT) past it: half the agent's timeout after it came */
    struct offer_rec *next;
} offer_rec;

typedef struct closing_ep {
    void *req; /* the ucp_ep_close_nbx request still in progress */
    struct closing_ep *next;
} closing_ep;

struct kvhal_xfer_peer {
    uint32_t magic;
    kvhal_xfer_agent *agent;
    ucp_ep_h ep;
    peer_state state;
    bool ep_error;          /* UCX reported the endpoint failed (from its error callback) */
    ucs_status_t ep_status;
    bool accepted_side;     /* made by an incoming HELLO (vs kvhal_xfer_connect) */
    uint64_t my_session;    /* dest_session of frames to us */
    uint64_t their_session; /* dest_session of frames we send */
    char name[XW_NAME_LEN];
    xw_geometry g;          /* the peer's */
    kvhal_status fail_status;
    char fail_msg[256];
    uint64_t deadline_ns;   /* connecting and P_AUTH only */
    xw_transcript tr;       /* the handshake's transcript (both nonces, sessions, names, hosts, geometries) */
    char token[XW_TOKEN_LEN]; /* connecting: the token given to kvhal_xfer_connect, wiped once the handshake ends */
    bool reap;              /* P_AUTH that failed: pump frees it (the application never saw it) */
    bool auth_sent;         /* connecting: our proof (AUTH) sent, AUTH_OK awaited */
    int32_t ev_queued;      /* events naming it in the agent's queue (PEER_EVENTS_MAX) */
    int64_t ev_pages;       /* and the page ids they hold (PEER_GRANT_PAGES_MAX) */
    const xfer_path *tx_path; /* how we send it pages: the agent's DATA path, or IPC / CMA once it imported our cache */
    const xfer_path *rx_path; /* how we copy what it names: IPC or CMA once we imported its cache (else NULL) */
    /* the IPC path (same host): */
    bool same_host;         /* the HELLO / HELLO_ACK named our host */
    int ipc_state;          /* as the sender: IPC_NONE, IPC_OFFERED (map sent), IPC_READY (peer imported it), IPC_REFUSED */
    char ipc_reason[XW_REASON_LEN]; /* why the peer refused our handle */
    int ipc_kind;           /* as the sender: what we offered (XW_IPC_HANDLE, XW_IPC_CMA) */
    kvhal_buffer *ipc_buf;  /* as the receiver: the peer's cache, imported on our cache's device */
    bool cma;               /* as the receiver: we read the peer's host cache with process_vm_readv */
    uint32_t cma_pid;       /* its process */
    uint64_t cma_base;      /* its cache's address there */
    uint64_t *ipc_off;      /* its 2 x num_layers byte offsets of block 0 (K, V of each layer) */
    /* the CMA challenge, as the receiver: the map claimed, the nonce chosen, what the socket proved */
    void *cma_claim;        /* the IPC_MAP frame of kind CMA waiting for its proof (header then data) */
    size_t cma_claim_len;
    uint8_t cma_nonce[XW_CMA_PROBE];
    bool cma_challenged;    /* CMA_CHALLENGE sent */
    int32_t cma_cred_pid;   /* the pid SO_PEERCRED gave for a socket message naming this session and nonce (-1: none) */
    uint64_t cma_deadline_ns;
    /* as the sender: where the receiver's nonce goes (its address is the probe address of our IPC_MAP) */
    uint8_t cma_probe[XW_CMA_PROBE];
    /* the IPC handle's challenge (xw_wire.h, XW_IPC_SLOT), as the receiver: the imported cache waiting for its
     * proof (not yet ipc_buf: nothing is read from it but the proof), the nonce, where the pages end */
    kvhal_buffer *ipc_claim;
    uint8_t ipc_nonce[XW_NONCE];
    uint64_t ipc_extent;    /* the first byte past every page the map names: the proof lies at or past it */
    uint64_t ipc_deadline_ns;
    bool ipc_proof_in;      /* its IPC_PROOF came (ipc_proof), checked from pump */
    xw_ipc_proof ipc_proof;
    /* ... as the sender: the receiver's nonce to write (pending until a slot is free), the slot it holds */
    bool ipc_chal_pending;
    uint8_t ipc_chal[XW_NONCE];
    int ipc_slot;           /* 1 + our proof area's slot holding its nonce until its IPC_MAP_ACK (0: none) */
    uint64_t ipc_stride;    /* its bytes between blocks */
    int64_t ipc_blocks;     /* its page count */
    size_t ipc_queued;      /* (page, layer, K/V) chunks of its DATA_IPC frames waiting in the agent's ipc_jobs */
    offer_rec *offers, *offers_tail; /* as the receiver: its OFFER frames no receive took yet, oldest first */
    int64_t offered_pages;  /* their pages */
    int32_t offered_frames; /* and how many */
    void *map_frame;        /* an IPC_MAP received (header then data), imported from pump */
    size_t map_len;
    kvhal_xfer_peer *next;
};

typedef struct send_frame {
    kvhal_xfer *x;
    xw_data *hdr;           /* kept until the send completes */
    size_t hdr_len;
    ucp_dt_iov_t *iov;
    size_t iov_count;
    void *staging;          /* device caches: the frame's data (stage_mem's); IPC frames: their (src, dst) pairs */
    kvhal_host_memory *stage_mem; /* device caches: staging from the agent's pool (pinned where the backend can) */
    void *bounce;           /* gathered frames: the frame's chunks copied here (a pool buffer) until it is sent */
    uint64_t bytes;
    bool gather;            /* gathered into a bounce buffer when it is posted (see kvhal_xfer_send_pages) */
    bool posted;
    bool in_flight;
    bool acked;             /* the receiver acknowledged it (once: a second ACK of it breaks the protocol) */
    bool answered;          /* an offer's frame: the receiver acknowledged or refused it */
    /* device caches: the frame's source pages, copied to its staging before it is posted (by a copy worker, so
     * that pump sends one frame while the next ones are copied, or by pump where no worker runs); NULL once staged */
    int32_t *stage_src;
    /* with a copy worker (gathered or staged): counted in x->sends_inflight until the pool hands it back */
    xfer_work work;
    kvhal_status work_status; /* the worker's: how its copy went */
    char work_why[XW_REASON_LEN];
} send_frame;

typedef struct recv_frame {
    kvhal_xfer *x;
    uint64_t xfer_id;
    uint32_t frame;
    ucp_dt_iov_t *iov;
    size_t iov_count;
    void *staging;          /* device caches: received here (stage_mem's), then copied to the device */
    kvhal_host_memory *stage_mem;
    int32_t *stage_pages;   /* device caches: the frame's pages, and its layers [stage_l0, + stage_nl) */
    int32_t stage_n, stage_l0, stage_nl;
    uint64_t bytes;
    int32_t l0, nl, np;     /* its layers [l0, l0 + nl) of np pages (a receive's layer events) */
    ucs_status_t done_status;
    bool done;
    struct recv_frame *next;
    /* device caches with copy workers: the copy of the staging to the device runs on a worker, so that pump
     * receives the next frames meanwhile; the pool hands the frame back to pump, which completes it */
    xfer_work work;
    kvhal_status work_status; /* the worker's */
    char work_why[XW_REASON_LEN];
} recv_frame;

struct kvhal_xfer {
    uint32_t magic;
    kvhal_xfer_agent *agent;
    kvhal_xfer_peer *peer;
    bool is_recv, released, finished, failing;
    kvhal_status status;    /* BUSY while in flight */
    char message[256];
    uint64_t request_id, xfer_id;
    uint64_t bytes_total, bytes_done;
    uint64_t deadline_ns;
    int32_t n;
    /* receive */
    int32_t *pages;         /* the grant, in the caller's order */
    int32_t *sorted;        /* (page, index) pairs sorted by page, for lookups */
    uint8_t *claimed;       /* n x num_layers: a frame was accepted for (page, layer) */
    int64_t claimed_count;
    int inflight;           /* frames being written into the pages */
    kvhal_cache_manager *cm;
    const xfer_path *path;  /* how its pages moved (a receive: its last frame's), NULL before */
    /* send */
    send_frame *frames;
    int32_t num_frames, frames_acked, sends_inflight;
    int32_t next_post;      /* frames before it are posted (post_pending) */
    bool offer;             /* pages offered (kvhal_xfer_offer_pages): the receiver takes them with a receive */
    bool withdrawn;         /* an offer that failed: WITHDRAW sent; it settles once the receiver answered every frame */
    bool abandoned;         /* ... or once the peer failed to answer within the timeout (settled regardless) */
    kvhal_xfer *next;
    /* streams (xfer_stream.c) */
    struct xfer_stream *stream; /* a stream's transfer: its layers, each sent as a transfer of its own (one block) */
    bool quiet;             /* a stream's layer: settles without an event; its stream collects and frees it */
    int32_t *layer_left;    /* a receive with layer events: per layer, its pages not yet in */
};

typedef struct pending_msg { /* a frame to send from pump(), not from a UCX callback */
    kvhal_xfer_peer *peer;
    ucp_ep_h ep;            /* a refusal goes on its own endpoint, closed afterwards */
    void *buf;
    size_t len;
    const void *data;
    size_t data_len;
    void *data_owned;
    bool close_after, force;
    bool done;              /* sent (or failed): its buffers may go */
    struct pending_msg *next;
} pending_msg;

typedef struct pending_hello {
    xw_hello h;
    uint16_t version;       /* another wire version than ours: refused (h holds what its header had of ours) */
    void *addr;
    struct pending_hello *next;
} pending_hello;

struct ipc_job { /* a DATA_IPC frame (or an offer's frame a receive took) accepted, its pages claimed */
    kvhal_xfer *x;
    kvhal_xfer_peer *p;
    uint64_t xfer_id;
    uint32_t frame;
    int32_t l0, nl, n;
    int32_t *pairs;         /* n (src, dst) */
    int32_t *idx;           /* n grant indices of dst */
    const xfer_path *path;  /* the peer's rx_path when it came: IPC (an imported handle) or CMA (process_vm_readv) */
    int slot;               /* IPC, running: the stream of a->ipc_streams it was queued on */
    uint64_t launch;        /* IPC, running: its launch group (the frames copied by one batched copy) */
    bool marked;            /* IPC, running: a group was chained behind its group on its stream, and
                             * ipc_events[slot] marks the end of its own (it is reaped by that event, not the stream) */
    /* CMA on the copy workers: the runs to read, built by pump and read-only afterwards */
    uint32_t pid;           /* the peer's process */
    struct iovec *lv, *rv;  /* runs: ours (the granted pages), the peer's */
    struct cma_piece *pieces;
    int pieces_left;        /* pump's: pieces the pool has not handed back */
    atomic_bool abort;      /* a piece failed: the workers skip the pieces they have not started */
    bool skipped;           /* pump's: a piece was skipped (the frame is not complete) */
    bool failed;            /* pump's: a read failed or came short (why says how) */
    char why[XW_REASON_LEN];
    ipc_job *next;
};

static inline size_t ipc_job_chunks(const ipc_job *j) /* the frame's (page, layer, K/V) chunks: its ranges at most */
{
    return (size_t)j->n * (size_t)j->nl * 2u;
}

typedef struct event_item {
    kvhal_xfer_event ev;
    int32_t *pages_owned;
} event_item;

/* What a frame's sender does just before it is posted (xfer_path.frame_ready). */
typedef enum {
    FRAME_POST,      /* ready: post it now */
    FRAME_WORKING,   /* handed to a copy worker: posted when the pool hands it back */
    FRAME_BLOCKED,   /* a limit on bytes out holds it: post_pending comes back to it */
    FRAME_FAILED,    /* the transfer failed */
} frame_ready;

/* A send as kvhal_xfer_send_pages / kvhal_xfer_offer_pages asked for it (checked): dst NULL for an offer. */
typedef struct xfer_send_req {
    uint64_t request_id;
    const int32_t *src, *dst;
    int32_t n, first_layer, num_layers;
    bool written;   /* a stream's layer whose event completed: the device is not synchronized before the send */
    bool quiet;     /* a stream's layer: the transfer settles without an event (xfer_stream.c collects it) */
} xfer_send_req;

/* A data path: how pages move between two agents. Chosen once: the agent's DATA path (host or staged) when its
 * cache is registered; a peer's send path when it is set up (the agent's DATA path) and when it imports our cache
 * (IPC, CMA); a peer's receive path when we import its cache. A transfer keeps the path it was set up with. The
 * entries a path does not take part in are NULL. */
struct xfer_path {
    const char *name; /* kvhal_xfer_path */
    bool sync_device; /* sender: the device's queued work waited for before a send (copies on our own streams) */
    /* sender: the frames of a send, built, and posted or queued for post_pending */
    kvhal_status (*send)(kvhal_xfer_peer *p, const xfer_send_req *r, kvhal_xfer **out);
    /* sender, DATA frames: a frame's buffers, when the transfer is set up (src: its cnt pages) */
    bool (*frame_init)(kvhal_xfer_agent *a, send_frame *f, const int32_t *src, int32_t cnt, int32_t l0, int32_t nl);
    /* sender, DATA frames: the frame's last step before it is posted (gathered, staged) */
    frame_ready (*frame_ready)(kvhal_xfer *x, send_frame *f);
    /* sender, DATA frames: how many bytes a frame carries at most (0: no bound but the header's pages) */
    uint64_t (*frame_bytes)(const kvhal_xfer_agent *a);
    /* receiver, DATA frames: where a frame's data goes (into the pages, or into staging) */
    bool (*recv_init)(kvhal_xfer_agent *a, recv_frame *f, const int32_t *pages, int32_t n, int32_t l0, int32_t nl);
    /* receiver, DATA frames: a frame's data is in; true when it was handed on (finished later), else *st says how
     * its last step went (reason: why not) */
    bool (*recv_done)(kvhal_xfer_agent *a, recv_frame *f, kvhal_status *st, char *reason, size_t cap);
    /* receiver, IPC frames: an accepted frame queued for its copy (made from pump) */
    void (*job_queue)(kvhal_xfer_agent *a, ipc_job *j);
    /* pump: the path's copies launched and reaped; returns the work done (see pump) */
    unsigned (*progress)(kvhal_xfer_agent *a);
    /* a peer goes away: what still reads its cache or process finishes, or forgets it */
    void (*peer_lost)(kvhal_xfer_agent *a, const kvhal_xfer_peer *p);
    /* the agent goes: every copy still writing our pages waited for */
    void (*drain)(kvhal_xfer_agent *a);
    /* records the path holds (kvhal__xfer_agent_held) */
    size_t (*held)(const kvhal_xfer_agent *a);
};

struct kvhal_xfer_agent {
    uint32_t magic;
    char name[XW_NAME_LEN];
    char token[XW_TOKEN_LEN];
    uint32_t timeout_ms;
    int32_t max_peers;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    size_t max_am_header;
    bool no_peer_errors;    /* the transports have no peer-failure handling (UCX shared memory) */
    bool cma_ok;            /* the transports allow CMA (cma, shm, sm, all or UCX's choice): the CMA path */
    char tcp_seg[XW_SEG_LEN]; /* UCX's TCP receive segment size as configured, "" when TCP is not used */
    int listen_fds[8];      /* the TCP listening sockets UCX opened for the worker (watched: LISTENER_LOST) */
    uint64_t listen_ino[8]; /* and their inodes (the socket itself, not a descriptor number reused since) */
    int n_listen_fds;
    uint64_t listen_check_ns; /* the next look at them */
    uint64_t listen_stuck_ns; /* since when a connection waits in their queue unaccepted (0: none waits) */
    bool listener_lost;     /* reported */
    int cma_sock;           /* the receiver's abstract Unix socket for CMA challenges (made on first use; -1 none) */
    char cma_sock_name[XW_SOCK_LEN];
    int cma_conns[CMA_CONNS_MAX]; /* connections accepted on it whose answer has not come yet (-1: none) */
    unsigned cma_next_conn;
    struct { void *p; size_t cap; } pool[BOUNCE_POOL]; /* idle bounce buffers, kept for reuse */
    size_t pool_bytes;
    kvhal_host_memory *stage_pool[STAGE_POOL]; /* idle staging buffers of a device cache, kept for reuse */
    size_t stage_pool_bytes;
    uint64_t stage_live;    /* bytes of pinned staging held by frames (not in the pool) */
    kvhal_stream *stage_stream; /* the staged path's copies between the device cache and staging (made on first use) */
    uint64_t gathered;      /* bytes of gathered frames posted and not yet sent */
    /* the cache */
    kvhal_paged_cache *cache;
    kvhal_buffer *cache_buf;
    bool host;              /* in-place (host memory) or staged */
    const xfer_path *data_path; /* DATA frames: host or staged */
    uint8_t *host_base;
    ucp_mem_h memh;
    xw_geometry g;
    size_t *k_off, *v_off;  /* byte offset of block 0 of each layer's K and V */
    size_t block_stride;    /* bytes between blocks */
    /* state */
    kvhal_xfer_peer *peers;
    int32_t live_peers;
    kvhal_xfer *xfers;
    uint64_t next_xfer_id;
    pending_hello *hellos;
    pending_msg *msgs, *msgs_tail;
    pending_msg *sent;      /* handed to UCX, buffers kept until their send completes */
    closing_ep *closing;
    recv_frame *rframes;
    event_item *events;     /* a ring */
    size_t ev_head, ev_count, ev_cap;
    uint64_t events_dropped;
    int32_t *last_pages;    /* the pages of the event handed out last */
    char last_message[256];
    /* the IPC paths */
    char host_id[XW_HOST_LEN];      /* boot_id/hostname */
    uint8_t ipc_blob[XW_IPC_BLOB_MAX]; /* our cache's handle (a shareable cache), else ipc_blob_len 0 */
    size_t ipc_blob_len;
    uint64_t proof_off;     /* our shareable cache's proof area: the buffer's tail past every page (IPC_PROOF) */
    int proof_slots;        /* its slots of XW_IPC_SLOT bytes (at most PROOF_SLOTS_MAX) */
    uint64_t proof_busy[PROOF_SLOTS_MAX / 64]; /* slots holding a nonce a receiver has not checked yet */
    kvhal_stream *ipc_streams[IPC_STREAMS]; /* the receiver's copies from imported caches (made on first use) */
    int ipc_stream_groups[IPC_STREAMS];  /* launch groups running on each (0, 1, or 2 with one chained) */
    kvhal_event *ipc_events[IPC_STREAMS]; /* per stream: the end of the first of two chained groups (made on use) */
    ipc_job *ipc_jobs, *ipc_jobs_tail;  /* accepted DATA_IPC frames of the IPC path, launched from pump */
    ipc_job *ipc_running;               /* launched, oldest first, acknowledged once their stream is done */
    uint64_t ipc_launches;              /* launch groups so far */
    size_t *ipc_ranges;                 /* a launch group's dst offsets, src offsets, lengths: 3 x ipc_ranges_cap */
    size_t ipc_ranges_cap;              /* (grown on demand, kept for the next group: no allocation per launch) */
    int ipc_groups_running;             /* launch groups in ipc_running */
    ipc_job *cma_jobs, *cma_jobs_tail;  /* accepted frames of the CMA path, copied from pump */
    ipc_job *cma_running;               /* handed to the copy workers, completed once every piece is back */
    pid_t pid;                          /* the process that created the agent (a forked child fails IPC copies) */
    /* the copy workers (started on first use, stopped by kvhal_xfer_agent_destroy): CMA reads, gathers, staging */
    xfer_pool workers;
    size_t cma_piece;       /* CMA frames are split in pieces of this many bytes at least (CMA_PIECE_BYTES) */
    size_t gather_frame;    /* TCP frames carry this many bytes at most (GATHER_FRAME_BYTES) */
    size_t gather_min;      /* TCP frames of this many bytes and more are gathered by the copy workers in transfers
                             * of several frames, others by pump (half of gather_frame) */
    uint64_t ipc_chain;     /* bytes a launch group not full may hold at most to be chained behind the one running
                             * (IPC_CHAIN_BYTES; 0: never) */
    uint64_t staging_out;   /* bytes of send frames with the workers for staging */
    uint64_t rstaging_out;  /* bytes of received frames with the workers for their copy to the device */
    int rstaging;           /* and how many of those */
};

#endif

/* kvhal_xfer.c — the transfer agent (include/kvhal/kvhal_xfer.h): one UCX context and worker per agent, active messages for
 * everything (xfer_wire.h), so that the receiver itself writes every byte into its pages after checking the frame
 * against its own grant. Large frames arrive by UCX rendezvous straight into the granted pages (an IOV of K/V
 * chunks) for host caches, or into a staging buffer (pinned host memory of the device, pooled) copied to the
 * device with one batched page copy otherwise (kvhal_paged_cache_transfer; kvhal_memcpy_h2d for part of the layers).
 *
 * Everything runs on the caller's thread inside pump(): UCX callbacks only record (frames, completions, errors);
 * connection set-up, acknowledgements and deadlines are handled after ucp_worker_progress returns. The one exception
 * is the CMA path's copying: the agent's copy workers (cma_worker) read the peer's pages into ours with
 * process_vm_readv, and touch nothing but the runs pump hands them and the job's completion fields (under cma_mu). */
#define _GNU_SOURCE /* process_vm_readv (the CMA path) */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "kvhal_xfer.h"
#include "xfer_internal.h"
#include "xfer_wire.h"

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
#define RNDV_FRAME_BYTES 65536u         /* DATA frames of this size and more go by rendezvous */
#define BOUNCE_POOL 256                   /* idle bounce buffers an agent keeps */
#define BOUNCE_POOL_BYTES (256ull << 20)  /* and their bytes at most */
#define STAGE_POOL 64                     /* idle staging buffers (pinned host memory) a device-cache agent keeps */
#define STAGE_POOL_BYTES (256ull << 20)   /* and their bytes at most */
#define STAGE_PINNED_MAX (1ull << 30)     /* pinned staging held by frames at once; past it frames stage in malloc'd
                                           * (pageable) memory, so a huge send cannot pin the host's memory away */
#ifndef GATHER_AHEAD_BYTES
#define GATHER_AHEAD_BYTES (8ull << 20)   /* gathered frames posted and not yet sent, at most (one at least) */
#endif
#define STAGE_AHEAD_BYTES (64ull << 20)   /* device caches: frames with the copy workers at once, each way, at most
                                           * (one at least): later ones wait (sender) or are copied by pump
                                           * (receiver: its UCX then waits too) */
#define GATHER_FRAME_BYTES (1u << 20)     /* gathered (TCP) frames carry this much at most (one page at least;
                                           * KVHAL_XFER_GATHER_FRAME_KIB) */
#define CMA_THREADS_MAX 64                /* copy workers of the CMA path at most (KVHAL_XFER_CMA_THREADS) */
#define CMA_THREADS_DEFAULT 4             /* and by default at most, half the online cores */
#define CMA_PIECE_BYTES (512u << 10)      /* a frame is split across workers in pieces of this size at least */
#define CMA_IOV_MAX 1024                  /* runs in one process_vm_readv call (the kernel's UIO_MAXIOV) */
#define CMA_SPIN_NS 50000ull              /* an idle worker polls this long for the next piece before it sleeps */


#define ERR(st, ...) kvhal_error_set((st), __VA_ARGS__)
#define CHECK_ARG(cond, ...)                                                                                    \
    do {                                                                                                        \
        if (!(cond)) return ERR(KVHAL_INVALID_ARGUMENT, __VA_ARGS__);                                           \
    } while (0)

typedef enum { P_CONNECTING, P_CONNECTED, P_FAILED } peer_state;

typedef struct offer_rec { /* receiver: an OFFER frame that no posted receive took yet */
    uint64_t request_id, xfer_id;
    uint32_t frame;
    int32_t l0, nl, first_page, total, n;
    int32_t *src;           /* n source page ids, checked against the imported cache */
    uint64_t expires_ns;    /* refused (ACK TIMEOUT) past it: half the agent's timeout after it came */
    struct offer_rec *next;
} offer_rec;

#define OFFER_PAGES_MAX (1 << 20) /* pages of one peer's offers waiting for a receive at most (past it: refused) */
#define OFFER_FRAMES_MAX 4096     /* and its OFFER frames waiting at most */

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
    uint64_t deadline_ns;   /* connecting only */
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

enum { IPC_NONE = 0, IPC_OFFERED = 1, IPC_READY = 2, IPC_REFUSED = -1 };
enum { PATH_NONE = 0, PATH_HOST = 1, PATH_STAGED = 2, PATH_IPC = 3, PATH_CMA = 4 };

struct ipc_job;
struct send_frame;
struct recv_frame;
typedef struct cma_piece { /* a copy worker's task: a share of a CMA job's runs, a frame to gather or stage */
    struct ipc_job *j;      /* a CMA read: runs j->lv[first .. first + count) */
    size_t first, count;
    struct send_frame *f;   /* (j NULL) a gather: f's chunks into f->bounce; or (f->stage_src) f's pages staged */
    struct recv_frame *rf;  /* (j, f NULL) a received frame of a device cache: its staging copied to the device */
    struct cma_piece *next; /* in a->cma_head's queue */
} cma_piece;

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
    /* gathered by a copy worker (gather_submit): counted in x->sends_inflight until pump reaps it */
    bool gathering;         /* pump's: queued or being gathered */
    bool gdone, gskip;      /* under a->cma_mu: the worker is done with it; pump: skip it (the transfer failed) */
    cma_piece task;
    struct send_frame *gnext; /* in a->gathering */
    /* device caches: the frame's source pages, copied to its staging by a copy worker before it is posted (the
     * same gather_submit / gather_reap), so that pump sends one frame while the next ones are copied, or by pump
     * in post_frames where no worker runs; NULL once staged */
    int32_t *stage_src;
    kvhal_status gstatus;   /* under a->cma_mu with gdone: how the worker's staging copy went */
    char gwhy[XW_REASON_LEN];
} send_frame;

typedef struct recv_frame {
    kvhal_xfer *x;
    uint64_t xfer_id;
    uint32_t frame;
    ucp_dt_iov_t *iov;
    size_t iov_count;
    void *staging;          /* device caches: received here (stage_mem's), then copied to the device */
    kvhal_host_memory *stage_mem;
    uint64_t bytes;
    ucs_status_t done_status;
    bool done;
    struct recv_frame *next;
    /* device caches with copy workers: the copy of the staging to the device runs on a worker (rstage_submit),
     * so that pump receives the next frames meanwhile; pump completes the frame in rstage_reap */
    bool rdone, rskip;      /* under a->cma_mu: the worker is done; pump: skip the copy (the transfer failed) */
    kvhal_status rstatus;   /* under a->cma_mu with rdone */
    char rwhy[XW_REASON_LEN];
    cma_piece task;
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
    int path;               /* PATH_*: how its pages moved (the last frame's) */
    /* send */
    send_frame *frames;
    int32_t num_frames, frames_acked, sends_inflight;
    int32_t next_post;      /* frames before it are posted (post_pending) */
    bool offer;             /* pages offered (kvhal_xfer_offer_pages): the receiver takes them with a receive */
    bool withdrawn;         /* an offer that failed: WITHDRAW sent; it settles once the receiver answered every frame */
    bool abandoned;         /* ... or once the peer failed to answer within the timeout (settled regardless) */
    kvhal_xfer *next;
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

typedef struct ipc_job { /* a DATA_IPC frame accepted (pages claimed), copied from pump */
    kvhal_xfer *x;
    kvhal_xfer_peer *p;
    uint64_t xfer_id;
    uint32_t frame;
    int32_t l0, nl, n;
    int32_t *pairs;         /* n (src, dst) */
    int32_t *idx;           /* n grant indices of dst */
    int path;               /* PATH_IPC (from an imported handle) or PATH_CMA (process_vm_readv) */
    int slot;               /* running: the stream of a->ipc_streams it was queued on */
    uint64_t launch;        /* running: its launch group (the frames copied by one batched copy) */
    bool marked;            /* running: a group was chained behind its group on its stream, and ipc_events[slot]
                             * marks the end of its own (it is reaped by that event, not by the stream) */
    /* the CMA kind on the copy workers (cma_submit): the runs to read, built by pump and read-only afterwards */
    uint32_t pid;           /* the peer's process */
    struct iovec *lv, *rv;  /* runs: ours (the granted pages), the peer's */
    struct cma_piece *pieces;
    int pieces_left;        /* under a->cma_mu: pieces not yet read (or skipped); 0: the workers are done with it */
    bool skip;              /* under a->cma_mu: set by pump, the transfer failed: pieces not started are skipped */
    bool skipped;           /* under a->cma_mu: a piece was skipped (the frame is not complete) */
    bool failed;            /* under a->cma_mu: a read failed or came short (why says how) */
    char why[XW_REASON_LEN];
    struct ipc_job *next;
} ipc_job;

#define IPC_STREAMS 8 /* copies from imported caches in flight at once, one stream each */

static size_t ipc_job_chunks(const ipc_job *j) /* the frame's (page, layer, K/V) chunks: its ranges at most */
{
    return (size_t)j->n * (size_t)j->nl * 2u;
}

typedef struct event_item {
    kvhal_xfer_event ev;
    int32_t *pages_owned;
} event_item;

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
    uint8_t cma_probe[XW_CMA_PROBE]; /* random; a peer reading them proves it can read our cache (offer_ipc) */
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
    /* the IPC path */
    char host_id[XW_HOST_LEN];      /* boot_id/hostname */
    uint8_t ipc_blob[XW_IPC_BLOB_MAX]; /* our cache's handle (a shareable cache), else ipc_blob_len 0 */
    size_t ipc_blob_len;
    kvhal_stream *ipc_streams[IPC_STREAMS]; /* the receiver's copies from imported caches (made on first use) */
    int ipc_stream_groups[IPC_STREAMS];  /* launch groups running on each (0, 1, or 2 with one chained) */
    kvhal_event *ipc_events[IPC_STREAMS]; /* per stream: the end of the first of two chained groups (made on use) */
    ipc_job *ipc_jobs, *ipc_jobs_tail;  /* accepted DATA_IPC frames, launched from pump */
    ipc_job *ipc_running;               /* launched, oldest first, acknowledged once their stream is done */
    uint64_t ipc_launches;              /* launch groups so far */
    int ipc_groups_running;             /* launch groups in ipc_running */
    uint64_t ipc_chain;                 /* bytes a group not full may hold at most to be chained behind the one
                                         * running (KVHAL_XFER_IPC_CHAIN_KIB; 0: never) */
    pid_t pid;                          /* the process that created the agent (a forked child fails IPC copies) */
    /* the CMA path's copy workers (started on the first CMA frame, stopped by kvhal_xfer_agent_destroy) */
    int cma_threads;        /* wanted (KVHAL_XFER_CMA_THREADS, else min(4, online cores / 2)); 0: pump copies */
    size_t cma_piece;       /* split frames in pieces of this many bytes at least (KVHAL_XFER_CMA_PIECE_KIB) */
    size_t gather_min;      /* TCP frames of this many bytes and more are gathered by the copy workers
                             * (KVHAL_XFER_GATHER_KIB) in transfers of several frames, others by pump */
    size_t gather_frame;    /* TCP frames carry this many bytes at most (KVHAL_XFER_GATHER_FRAME_KIB) */
    int cma_started;        /* running */
    pid_t cma_pid;          /* the process that started them (a forked child has none of them) */
    pthread_t cma_th[CMA_THREADS_MAX];
    pthread_mutex_t cma_mu; /* guards the queue, cma_stop, the jobs' pieces_left, skip, skipped, failed, why, the
                             * send frames' gdone, gskip, gstatus, gwhy and the receive frames' rdone, rskip,
                             * rstatus, rwhy */
    pthread_cond_t cma_work, cma_done; /* a piece queued (or stop); a job's last piece done */
    bool cma_sync;          /* cma_mu and the conditions are initialized */
    bool cma_stop;
    atomic_int cma_queued;  /* pieces in the queue (read without the lock by spinning workers) */
    cma_piece *cma_head, *cma_tail;
    ipc_job *cma_running;   /* pump's: jobs handed to the workers, completed once pieces_left is 0 */
    send_frame *gathering;  /* pump's: frames handed to the workers to gather, posted once gdone */
    recv_frame *rstaging;   /* pump's: received frames whose copy to the device a worker makes (rstage_submit) */
    uint64_t staging_out, rstaging_out; /* pump's: bytes of frames with the workers for staging, send and receive */
};

/* ---------------------------------------------------------------------------------------------------------- */
/* small helpers                                                                                              */
/* ---------------------------------------------------------------------------------------------------------- */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t random_session(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = now_ns() * 0x9e3779b97f4a7c15ull;
    }
    return v;
}

static void copy_name(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
    dst[i] = '\0';
}

static uint64_t deadline_from_now(const kvhal_xfer_agent *a) { return now_ns() + (uint64_t)a->timeout_ms * 1000000ull; }

static void push_event(kvhal_xfer_agent *a, kvhal_xfer_event_type type, kvhal_xfer_peer *p, kvhal_xfer *x,
                       uint64_t request_id, kvhal_status st, int32_t *pages_owned, int32_t n, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));
static void push_event(kvhal_xfer_agent *a, kvhal_xfer_event_type type, kvhal_xfer_peer *p, kvhal_xfer *x,
                       uint64_t request_id, kvhal_status st, int32_t *pages_owned, int32_t n, const char *fmt, ...)
{
    if (a->ev_count == a->ev_cap) {
        size_t cap = a->ev_cap ? a->ev_cap * 2 : 64;
        event_item *ne = cap <= MAX_EVENTS ? malloc(cap * sizeof *ne) : NULL;
        if (!ne) {
            a->events_dropped++;
            free(pages_owned);
            return;
        }
        for (size_t i = 0; i < a->ev_count; i++) ne[i] = a->events[(a->ev_head + i) % a->ev_cap];
        free(a->events);
        a->events = ne;
        a->ev_cap = cap;
        a->ev_head = 0;
    }
    event_item *it = &a->events[(a->ev_head + a->ev_count) % a->ev_cap];
    memset(it, 0, sizeof *it);
    it->ev.type = type;
    it->ev.peer = p;
    it->ev.xfer = x;
    it->ev.request_id = request_id;
    it->ev.status = st;
    it->ev.num_pages = n;
    it->pages_owned = pages_owned;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->ev.message, sizeof it->ev.message, fmt, ap);
    va_end(ap);
    a->ev_count++;
}

/* Forgets queued events that name p or x (both about to be freed). */
static void scrub_events(kvhal_xfer_agent *a, const kvhal_xfer_peer *p, const kvhal_xfer *x)
{
    for (size_t i = 0; i < a->ev_count; i++) {
        event_item *it = &a->events[(a->ev_head + i) % a->ev_cap];
        if (p && it->ev.peer == p) it->ev.peer = NULL;
        if (x && it->ev.xfer == x) it->ev.xfer = NULL;
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* sending small frames (queued, sent from pump)                                                               */
/* ---------------------------------------------------------------------------------------------------------- */
static void close_ep(kvhal_xfer_agent *a, ucp_ep_h ep, bool force);

static void queue_msg(kvhal_xfer_agent *a, kvhal_xfer_peer *p, ucp_ep_h ep, const void *hdr, size_t len,
                      const void *data, size_t data_len, bool close_after)
{
    pending_msg *m = calloc(1, sizeof *m);
    void *b = malloc(len ? len : 1);
    void *d = data_len ? malloc(data_len) : NULL;
    if (!m || !b || (data_len && !d)) {
        free(m);
        free(b);
        free(d);
        if (close_after) close_ep(a, ep, true);
        return;
    }
    if (len) memcpy(b, hdr, len);
    if (data_len) memcpy(d, data, data_len);
    m->peer = p;
    m->ep = ep;
    m->buf = b;
    m->len = len;
    m->data = d;
    m->data_len = data_len;
    m->data_owned = d;
    m->close_after = close_after;
    if (a->msgs_tail) a->msgs_tail->next = m;
    else a->msgs = m;
    a->msgs_tail = m;
}

static void close_ep(kvhal_xfer_agent *a, ucp_ep_h ep, bool force)
{
    if (!ep) return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *r = ucp_ep_close_nbx(ep, &prm);
    if (force && UCS_PTR_IS_ERR(r)) { /* UCX forces only endpoints with peer-failure handling (see ep_create): the
                                       * refusal left this one open, so it is closed by flushing */
        prm.flags = 0;
        r = ucp_ep_close_nbx(ep, &prm);
    }
    if (!r || !UCS_PTR_IS_PTR(r)) return;
    closing_ep *c = malloc(sizeof *c);
    if (!c) { /* cannot track it: finish it here */
        while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(a->worker);
        ucp_request_free(r);
        return;
    }
    c->req = r;
    c->next = a->closing;
    a->closing = c;
}

static void msg_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    ((pending_msg *)user_data)->done = true;
    ucp_request_free(request);
}

/* Hands the queued frames to UCX without waiting for them (a peer that does not progress must not stall us): a
 * frame's buffers stay on a->sent until its send completes. An endpoint closed after its frame: at once when
 * forced (the frame may be dropped; its request completes with an error), else once the frame went out. */
static void flush_msgs(kvhal_xfer_agent *a)
{
    while (a->msgs) {
        pending_msg *m = a->msgs;
        a->msgs = m->next;
        if (!a->msgs) a->msgs_tail = NULL;
        ucp_ep_h ep = m->ep ? m->ep : (m->peer && m->peer->state != P_FAILED ? m->peer->ep : NULL);
        m->ep = ep;
        m->done = true;
        if (ep && m->len) {
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                                       UCP_OP_ATTR_FIELD_FLAGS,
                                       .cb.send = msg_sent_cb, .user_data = m, .flags = UCP_AM_SEND_FLAG_EAGER};
            void *r = ucp_am_send_nbx(ep, XW_AM_ID, m->buf, m->len, m->data, m->data_len, &prm);
            if (r && UCS_PTR_IS_PTR(r)) m->done = false;
        }
        if (ep && m->close_after && (m->force || m->done)) {
            close_ep(a, ep, m->force);
            m->close_after = false;
        }
        m->next = a->sent;
        a->sent = m;
    }
    for (pending_msg **pp = &a->sent; *pp;) {
        pending_msg *m = *pp;
        if (!m->done) {
            pp = &m->next;
            continue;
        }
        if (m->ep && m->close_after) close_ep(a, m->ep, m->force);
        *pp = m->next;
        free(m->buf);
        free(m->data_owned);
        free(m);
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* transfers                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
static void bounce_put(kvhal_xfer_agent *a, void *p);

/* A gathered frame was sent (or will not be): its bounce buffer goes back to the pool. */
static void frame_unbounce(kvhal_xfer_agent *a, send_frame *f)
{
    if (!f->bounce) return;
    bounce_put(a, f->bounce);
    f->bounce = NULL;
    a->gathered -= f->bytes;
}

static void stage_release(kvhal_xfer_agent *a, kvhal_host_memory *mem, void *p);

static void xfer_free(kvhal_xfer *x)
{
    kvhal_xfer_agent *a = x->agent;
    for (kvhal_xfer **pp = &a->xfers; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    scrub_events(a, NULL, x);
    if (x->frames) {
        for (int32_t i = 0; i < x->num_frames; i++) {
            free(x->frames[i].hdr);
            free(x->frames[i].iov);
            free(x->frames[i].stage_src);
            stage_release(a, x->frames[i].stage_mem, x->frames[i].staging);
            frame_unbounce(a, &x->frames[i]);
        }
        free(x->frames);
    }
    free(x->pages);
    free(x->sorted);
    free(x->claimed);
    x->magic = DEAD_MAGIC;
    free(x);
}

/* The transfer is over when nothing UCX holds points into its pages any more: then the pages go back (receive,
 * failed) and the completion event is queued. */
/* An offer's frames sent and not yet answered by the receiver (which may still be copying them). */
static int32_t offer_unanswered(const kvhal_xfer *x)
{
    int32_t n = 0;
    for (int32_t i = 0; i < x->num_frames; i++) n += x->frames[i].posted && !x->frames[i].answered;
    return n;
}

/* An offer that failed (canceled, released, refused, timed out) while its peer is connected: the peer may take its
 * frames still, and copy our pages, so it is told to drop them (WITHDRAW) and the offer settles only once every frame
 * sent was answered (copied, or dropped), the peer failed, or it did not answer within the timeout. */
static bool offer_held(kvhal_xfer *x)
{
    if (!x->offer || x->abandoned || !x->peer || x->peer->state != P_CONNECTED || !offer_unanswered(x)) return false;
    if (!x->withdrawn) {
        x->withdrawn = true;
        x->deadline_ns = deadline_from_now(x->agent);
        xw_withdraw w = {.c = {XW_MAGIC, XW_VERSION, XW_WITHDRAW, x->peer->their_session},
                         .request_id = x->request_id, .xfer_id = x->xfer_id};
        queue_msg(x->agent, x->peer, NULL, &w, sizeof w, NULL, 0, false);
    }
    return true;
}

static void xfer_settle(kvhal_xfer *x)
{
    if (x->finished || !x->failing) return;
    if (x->is_recv ? x->inflight > 0 : x->sends_inflight > 0) return;
    if (x->status != KVHAL_OK && offer_held(x)) return;
    x->finished = true;
    if (x->is_recv && x->status != KVHAL_OK && x->cm) {
        kvhal_status st = kvhal_cache_manager_free(x->cm, x->pages, x->n);
        if (st != KVHAL_OK)
            snprintf(x->message + strlen(x->message), sizeof x->message - strlen(x->message),
                     " (returning its pages failed: %s)", kvhal_last_error());
    }
    if (x->released) {
        xfer_free(x);
        return;
    }
    push_event(x->agent, x->is_recv ? KVHAL_XFER_EVENT_RECV_DONE : KVHAL_XFER_EVENT_SEND_DONE, x->peer, x,
               x->request_id, x->status, NULL, 0, "%s", x->message);
}

static void xfer_finish(kvhal_xfer *x, kvhal_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void xfer_finish(kvhal_xfer *x, kvhal_status st, const char *fmt, ...)
{
    if (x->failing || x->finished) return;
    x->failing = true; /* "settling": final status known, waiting for UCX to let go */
    x->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->message, sizeof x->message, fmt, ap);
    va_end(ap);
    xfer_settle(x);
}

static void peer_fail(kvhal_xfer_peer *p, kvhal_status st, bool tell, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void peer_fail(kvhal_xfer_peer *p, kvhal_status st, bool tell, const char *fmt, ...)
{
    if (p->state == P_FAILED) return;
    kvhal_xfer_agent *a = p->agent;
    const bool was_connected = p->state == P_CONNECTED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->fail_msg, sizeof p->fail_msg, fmt, ap);
    va_end(ap);
    p->fail_status = st;
    p->state = P_FAILED;
    a->live_peers--;
    for (kvhal_xfer *x = a->xfers, *nx; x; x = nx) {
        nx = x->next;
        if (x->peer != p) continue;
        if (x->failing && x->offer && x->withdrawn && !x->finished) { /* it waited for the peer's answers */
            snprintf(x->message + strlen(x->message), sizeof x->message - strlen(x->message),
                     " (peer %s failed before it confirmed the withdrawal: %s)", p->name, p->fail_msg);
            xfer_settle(x); /* may free x */
            continue;
        }
        xfer_finish(x, st, "peer %s: %s", p->name, p->fail_msg);
    }
    /* The endpoint is closed from pump (never from a UCX callback): after a BYE when the peer is to be told,
     * otherwise forcibly, which completes every send still on it with an error and releases its buffers. */
    ucp_ep_h ep = p->ep;
    p->ep = NULL;
    if (ep) {
        xw_common bye = {XW_MAGIC, XW_VERSION, XW_BYE, p->their_session};
        const bool say = tell && was_connected && !p->ep_error;
        queue_msg(a, NULL, ep, &bye, say ? sizeof bye : 0, NULL, 0, true);
        if (a->msgs_tail && a->msgs_tail->ep == ep) a->msgs_tail->force = true;
    }
    if (was_connected)
        push_event(a, KVHAL_XFER_EVENT_PEER_FAILED, p, NULL, 0, st, NULL, 0, "peer %s: %s", p->name, p->fail_msg);
}

static kvhal_xfer *find_xfer_id(kvhal_xfer_agent *a, uint64_t id)
{
    for (kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->xfer_id == id) return x;
    return NULL;
}

static kvhal_xfer_peer *find_session(kvhal_xfer_agent *a, uint64_t s)
{
    if (s == 0) return NULL;
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->my_session == s && p->state != P_FAILED) return p;
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the cache: chunk addresses                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */
static size_t chunk_off(const kvhal_xfer_agent *a, int32_t layer, int side, int32_t page)
{
    return (side ? a->v_off[layer] : a->k_off[layer]) + (size_t)page * a->block_stride;
}

/* Bounce buffers for the contiguous path (see kvhal_xfer_send_pages): reused, so that a frame does not pay for
 * fresh pages (a large malloc is an mmap whose pages the kernel clears on first touch). */
static void *bounce_get(kvhal_xfer_agent *a, size_t len)
{
    int best = -1;
    for (int i = 0; i < BOUNCE_POOL; i++)
        if (a->pool[i].p && a->pool[i].cap >= len && (best < 0 || a->pool[i].cap < a->pool[best].cap)) best = i;
    if (best < 0) {
        size_t *b = malloc(64 + (len ? len : 1));
        if (!b) return NULL;
        b[0] = len;
        return (uint8_t *)b + 64;
    }
    void *p = a->pool[best].p;
    a->pool_bytes -= a->pool[best].cap;
    a->pool[best].p = NULL;
    return p;
}

static void bounce_put(kvhal_xfer_agent *a, void *p)
{
    if (!p) return;
    size_t *b = (size_t *)(void *)((uint8_t *)p - 64);
    if (a->pool_bytes + b[0] <= BOUNCE_POOL_BYTES)
        for (int i = 0; i < BOUNCE_POOL; i++)
            if (!a->pool[i].p) {
                a->pool[i].p = p;
                a->pool[i].cap = b[0];
                a->pool_bytes += b[0];
                return;
            }
    free(b);
}

static void bounce_pool_free(kvhal_xfer_agent *a)
{
    for (int i = 0; i < BOUNCE_POOL; i++)
        if (a->pool[i].p) free((uint8_t *)a->pool[i].p - 64);
    memset(a->pool, 0, sizeof a->pool);
    a->pool_bytes = 0;
}

/* IOV over pages x layers x {K, V} in wire order, adjacent chunks merged. */
static ucp_dt_iov_t *build_iov(const kvhal_xfer_agent *a, const int32_t *pages, int32_t n, int32_t l0, int32_t nl,
                               size_t *count)
{
    const size_t max = (size_t)n * (size_t)nl * 2;
    ucp_dt_iov_t *iov = malloc(max * sizeof *iov);
    if (!iov) return NULL;
    size_t c = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = l0; l < l0 + nl; l++)
            for (int s = 0; s < 2; s++) {
                uint8_t *p = a->host_base + chunk_off(a, l, s, pages[i]);
                if (c && (uint8_t *)iov[c - 1].buffer + iov[c - 1].length == p)
                    iov[c - 1].length += a->g.chunk_bytes;
                else
                    iov[c++] = (ucp_dt_iov_t){p, a->g.chunk_bytes};
            }
    *count = c;
    return iov;
}

/* Device caches: chunks between the cache and a contiguous host buffer in wire order. */
static kvhal_status stage_run(kvhal_xfer_agent *a, kvhal_stream *s, bool to_host, uint8_t *host, size_t co,
                              size_t len)
{
    return to_host ? kvhal_memcpy_d2h(host, a->cache_buf, co, len, s) : kvhal_memcpy_h2d(a->cache_buf, co, host, len, s);
}

/* One copy per run of chunks that are adjacent in the cache too (a page-first cache: a page's layers). */
static kvhal_status stage(kvhal_xfer_agent *a, kvhal_stream *sm, bool to_host, uint8_t *host, const int32_t *pages,
                          int32_t n, int32_t l0, int32_t nl)
{
    size_t o = 0, run_host = 0, run_dev = 0, run_len = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = l0; l < l0 + nl; l++)
            for (int s = 0; s < 2; s++, o += a->g.chunk_bytes) {
                const size_t co = chunk_off(a, l, s, pages[i]);
                if (run_len && run_dev + run_len == co) {
                    run_len += a->g.chunk_bytes;
                    continue;
                }
                if (run_len) {
                    kvhal_status st = stage_run(a, sm, to_host, host + run_host, run_dev, run_len);
                    if (st != KVHAL_OK) return st;
                }
                run_host = o;
                run_dev = co;
                run_len = a->g.chunk_bytes;
            }
    return run_len ? stage_run(a, sm, to_host, host + run_host, run_dev, run_len) : KVHAL_OK;
}

/* Staging buffers of a device cache's frames: host memory of the cache's device (pinned on CUDA and HIP, so that
 * the copies run at the link's speed and UCX reads and writes memory that stays put), reused because pinning is
 * slow (milliseconds for megabytes). The smallest idle one that fits and wastes at most half, else a new one. */
static kvhal_host_memory *stage_get(kvhal_xfer_agent *a, size_t len)
{
    if (len > STAGE_POOL_BYTES || a->stage_live + len > STAGE_PINNED_MAX) return NULL; /* pageable then */
    int best = -1;
    for (int i = 0; i < STAGE_POOL; i++) {
        const size_t cap = a->stage_pool[i] ? kvhal_host_memory_size(a->stage_pool[i]) : 0;
        if (cap >= len && cap / 2 <= len &&
            (best < 0 || cap < kvhal_host_memory_size(a->stage_pool[best])))
            best = i;
    }
    if (best >= 0) {
        kvhal_host_memory *m = a->stage_pool[best];
        a->stage_pool[best] = NULL;
        a->stage_pool_bytes -= kvhal_host_memory_size(m);
        a->stage_live += kvhal_host_memory_size(m);
        return m;
    }
    kvhal_host_memory *m = NULL;
    if (kvhal_host_memory_create(kvhal_buffer_device(a->cache_buf), len ? len : 1, &m) != KVHAL_OK) m = NULL;
    kvhal_clear_error();
    if (m) a->stage_live += kvhal_host_memory_size(m);
    return m;
}

/* A frame's staging: pinned from the pool where it may (stage_get), else malloc'd; *mem says which (NULL: malloc). */
static void *stage_alloc(kvhal_xfer_agent *a, size_t len, kvhal_host_memory **mem)
{
    *mem = stage_get(a, len);
    return *mem ? kvhal_host_memory_ptr(*mem) : malloc(len ? len : 1);
}

static void stage_put(kvhal_xfer_agent *a, kvhal_host_memory *m)
{
    if (!m) return;
    const size_t cap = kvhal_host_memory_size(m);
    a->stage_live -= cap;
    if (a->stage_pool_bytes + cap <= STAGE_POOL_BYTES)
        for (int i = 0; i < STAGE_POOL; i++)
            if (!a->stage_pool[i]) {
                a->stage_pool[i] = m;
                a->stage_pool_bytes += cap;
                return;
            }
    kvhal_host_memory_destroy(m);
}

/* Gives a frame's staging back: to the pool (pinned) or to the heap (stage_alloc's malloc). */
static void stage_release(kvhal_xfer_agent *a, kvhal_host_memory *mem, void *p)
{
    if (mem) stage_put(a, mem);
    else free(p);
}

static void stage_pool_free(kvhal_xfer_agent *a)
{
    for (int i = 0; i < STAGE_POOL; i++) kvhal_host_memory_destroy(a->stage_pool[i]);
    memset(a->stage_pool, 0, sizeof a->stage_pool);
    a->stage_pool_bytes = 0;
    kvhal_stream_destroy(a->stage_stream);
    a->stage_stream = NULL;
}

/* A frame of every layer between the device cache and its staging buffer: the frame's wire order (page, layer, K
 * then V) is the host-page layout of kvhal_paged_cache_transfer, so pages n move in one batched copy (the page
 * transfer's kernel on GPU backends) on the agent's own stream, waited for here. false: that copy does not apply
 * (a page twice in the frame, which the page transfer refuses; a backend without it) and nothing was copied. */
static bool stage_pages(kvhal_xfer_agent *a, kvhal_stream **stream, bool to_host, kvhal_host_memory *m,
                        const int32_t *pages, int32_t n, kvhal_status *st)
{
    enum { MAX_PAIRS = MAX_FRAME_PAGES }; /* a frame's pages at most (DATA frames of a device cache) */
    if (n > MAX_PAIRS || (uint64_t)n * (uint64_t)a->g.num_layers * 2u * a->g.chunk_bytes > kvhal_host_memory_size(m))
        return false;
    if (!*stream && kvhal_stream_create(kvhal_buffer_device(a->cache_buf), stream) != KVHAL_OK) {
        *stream = NULL;
        kvhal_clear_error();
        return false;
    }
    int64_t pairs[2 * MAX_PAIRS];
    for (int32_t i = 0; i < n; i++) {
        pairs[2 * i] = pages[i];
        pairs[2 * i + 1] = i;
    }
    *st = kvhal_paged_cache_transfer(a->cache, m, pairs, n, to_host ? KVHAL_TO_HOST : KVHAL_TO_DEVICE, *stream);
    if (*st == KVHAL_INVALID_ARGUMENT || *st == KVHAL_UNSUPPORTED) { /* refused before anything was copied */
        kvhal_clear_error();
        return false;
    }
    /* waited for even after an error: a copy that failed part-way may have queued some of its work, which must be
     * done before the staging buffer or the pages are used again */
    const kvhal_status ws = kvhal_stream_synchronize(*stream);
    if (*st == KVHAL_OK) *st = ws;
    return true;
}

/* A frame's pages (layers l0 .. l0 + nl) between the device cache and its staging host (m's, or a heap buffer when
 * m is NULL): by stage_pages on *stream (made on first use) where that applies, else run by run (stage). Called by
 * pump (the agent's stage_stream) and by the copy workers (a stream each): it reads nothing of the agent that
 * changes after kvhal_xfer_agent_create. */
static kvhal_status stage_frame(kvhal_xfer_agent *a, kvhal_stream **stream, bool to_host, kvhal_host_memory *m,
                                void *host, const int32_t *pages, int32_t n, int32_t l0, int32_t nl)
{
    kvhal_status st = KVHAL_OK;
    if (m && l0 == 0 && nl == a->g.num_layers && stage_pages(a, stream, to_host, m, pages, n, &st)) return st;
    /* run by run on the same stream (never the device's default one, which would wait for the application's
     * streams), waited for here: also after an error, for the runs already queued */
    if (!*stream && kvhal_stream_create(kvhal_buffer_device(a->cache_buf), stream) != KVHAL_OK) {
        *stream = NULL;
        kvhal_clear_error();
    }
    st = stage(a, *stream, to_host, host, pages, n, l0, nl);
    if (*stream) {
        const kvhal_status ws = kvhal_stream_synchronize(*stream);
        if (st == KVHAL_OK) st = ws;
    }
    return st;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* incoming frames                                                                                             */
/* ---------------------------------------------------------------------------------------------------------- */
static void send_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t xfer_id, uint32_t frame, kvhal_status st,
                     uint64_t bytes, const char *reason)
{
    xw_ack ack;
    memset(&ack, 0, sizeof ack);
    ack.c = (xw_common){XW_MAGIC, XW_VERSION, XW_ACK, p->their_session};
    ack.xfer_id = xfer_id;
    ack.frame = frame;
    ack.status = (int32_t)st;
    ack.bytes = bytes;
    copy_name(ack.reason, sizeof ack.reason, reason);
    queue_msg(a, p, NULL, &ack, sizeof ack, NULL, 0, false);
}

static int cmp_pair(const void *x, const void *y)
{
    const int32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

/* Index of page in the grant, or -1. */
static int32_t grant_index(const kvhal_xfer *x, int32_t page)
{
    int32_t lo = 0, hi = x->n - 1;
    while (lo <= hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        const int32_t v = x->sorted[2 * mid];
        if (v == page) return x->sorted[2 * mid + 1];
        if (v < page) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static kvhal_xfer *find_grant(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t request_id)
{
    for (kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->is_recv && x->peer == p && x->request_id == request_id && !x->failing && !x->finished) return x;
    return NULL;
}

static void recv_frame_done(kvhal_xfer_agent *a, recv_frame *f);

/* What UCX sends a frame from or receives it into, as prm's datatype and count: a contiguous buffer (gathered,
 * staged) as bytes, else the host chunks: their one run as bytes, or the IOV. */
static void *frame_buffer(ucp_dt_iov_t *iov, size_t iov_count, void *contig, size_t bytes, ucp_request_param_t *prm,
                          size_t *count)
{
    prm->datatype = ucp_dt_make_contig(1);
    *count = bytes;
    if (contig) return contig;
    if (iov_count == 1) return iov[0].buffer;
    prm->datatype = ucp_dt_make_iov();
    *count = iov_count;
    return iov;
}

static void recv_data_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    recv_frame *f = user_data;
    f->done = true;
    f->done_status = status;
    ucp_request_free(request);
}

/* A DATA frame from peer p: everything checked before one byte is written. Returns the UCS status for the
 * handler (an error status refuses a rendezvous frame, which fails the sender's send with it). */
static ucs_status_t on_data(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
                            void *data, size_t length, const ucp_am_recv_param_t *param)
{
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    xw_data h;
    if (header_length < sizeof h) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "truncated DATA frame: header of %zu bytes, at least %zu expected",
                  header_length, sizeof h);
        return UCS_ERR_INVALID_PARAM;
    }
    memcpy(&h, header, sizeof h);
    if (h.n_pages < 1 || h.n_pages > MAX_FRAME_PAGES ||
        header_length != sizeof h + (size_t)h.n_pages * sizeof(int32_t)) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed DATA frame: n_pages %d with a header of %zu bytes",
                  (int)h.n_pages, header_length);
        return UCS_ERR_INVALID_PARAM;
    }
    kvhal_xfer *x = find_grant(a, p, h.request_id);
    if (!x) { /* a cancelled or timed-out grant is not the peer's fault: refuse the frame, keep the peer */
        char r[XW_REASON_LEN];
        snprintf(r, sizeof r, "request %llu has no pending grant from %s", (unsigned long long)h.request_id, a->name);
        send_ack(a, p, h.xfer_id, h.frame, KVHAL_NOT_FOUND, 0, r);
        return UCS_ERR_NO_ELEM;
    }
    const int32_t L = a->g.num_layers;
    const char *bad = NULL;
    char why[200];
    if (h.chunk_bytes != a->g.chunk_bytes) {
        snprintf(why, sizeof why, "chunk_bytes %llu, this cache's is %llu", (unsigned long long)h.chunk_bytes,
                 (unsigned long long)a->g.chunk_bytes);
        bad = why;
    } else if (h.first_layer < 0 || h.num_layers < 1 || h.first_layer > L - h.num_layers) {
        snprintf(why, sizeof why, "layers [%d, %d+%d) outside [0, %d)", (int)h.first_layer, (int)h.first_layer,
                 (int)h.num_layers, (int)L);
        bad = why;
    } else if (length != (uint64_t)h.n_pages * (uint64_t)h.num_layers * 2u * h.chunk_bytes) {
        snprintf(why, sizeof why, "%zu data bytes, %d pages x %d layers x K,V x %llu bytes expected", length,
                 (int)h.n_pages, (int)h.num_layers, (unsigned long long)h.chunk_bytes);
        bad = why;
    }
    int32_t pages[MAX_FRAME_PAGES], idx[MAX_FRAME_PAGES];
    if (!bad) {
        memcpy(pages, (const uint8_t *)header + sizeof h, (size_t)h.n_pages * sizeof(int32_t));
        for (int32_t i = 0; i < h.n_pages && !bad; i++) {
            if (pages[i] < 0 || pages[i] >= a->g.num_blocks) {
                snprintf(why, sizeof why, "page %d is out of range [0, %lld)", (int)pages[i],
                         (long long)a->g.num_blocks);
                bad = why;
            } else if ((idx[i] = grant_index(x, pages[i])) < 0) {
                snprintf(why, sizeof why, "page %d is not granted to request %llu", (int)pages[i],
                         (unsigned long long)h.request_id);
                bad = why;
            }
        }
        /* each (page, layer) at most once, in this frame and across frames: claim, or undo and refuse */
        for (int32_t i = 0; i < h.n_pages && !bad; i++)
            for (int32_t l = h.first_layer; l < h.first_layer + h.num_layers; l++)
                if (x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l]) {
                    snprintf(why, sizeof why, "page %d layer %d was already sent", (int)pages[i], (int)l);
                    bad = why;
                    for (int32_t j = 0; j < i; j++)
                        for (int32_t m = h.first_layer; m < h.first_layer + h.num_layers; m++)
                            x->claimed[(size_t)idx[j] * (size_t)L + (size_t)m] = 0;
                    for (int32_t m = h.first_layer; m < l; m++) x->claimed[(size_t)idx[i] * (size_t)L + (size_t)m] = 0;
                    break;
                } else {
                    x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l] = 1;
                }
    }
    if (bad) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "refused DATA frame for request %llu: %s",
                  (unsigned long long)h.request_id, bad);
        return UCS_ERR_INVALID_PARAM;
    }
    x->claimed_count += (int64_t)h.n_pages * h.num_layers;
    x->deadline_ns = deadline_from_now(a);
    x->path = a->host ? PATH_HOST : PATH_STAGED;

    recv_frame *f = calloc(1, sizeof *f);
    if (!f) goto nomem;
    f->x = x;
    f->xfer_id = h.xfer_id;
    f->frame = h.frame;
    f->bytes = length;
    if (!a->host) {
        f->staging = stage_alloc(a, length, &f->stage_mem);
        f->iov = malloc(sizeof *f->iov + (size_t)h.n_pages * sizeof(int32_t) + 2 * sizeof(int32_t));
        if (!f->staging || !f->iov) goto nomem;
        /* keep the page list and layers for the copy to the device after the data is in */
        int32_t *keep = (int32_t *)(f->iov + 1);
        keep[0] = h.first_layer;
        keep[1] = h.num_layers;
        memcpy(keep + 2, pages, (size_t)h.n_pages * sizeof(int32_t));
        f->iov[0] = (ucp_dt_iov_t){f->staging, length};
        f->iov_count = (size_t)h.n_pages; /* for the staged case: the number of pages kept */
    } else {
        f->iov = build_iov(a, pages, h.n_pages, h.first_layer, h.num_layers, &f->iov_count);
        if (!f->iov) goto nomem;
    }
    x->inflight++;
    f->next = a->rframes;
    a->rframes = f;
    if (!rndv) { /* eager: the data is here */
        if (a->host) {
            const uint8_t *src = data;
            for (size_t i = 0; i < f->iov_count; i++) {
                memcpy(f->iov[i].buffer, src, f->iov[i].length);
                src += f->iov[i].length;
            }
        } else {
            memcpy(f->staging, data, length);
        }
        f->done = true;
        f->done_status = UCS_OK;
        return UCS_OK;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_DATATYPE,
                               .cb.recv_am = recv_data_cb, .user_data = f};
    size_t count; /* UCX writes each fragment straight into its chunks (see send_pages), or into the staging buffer */
    void *buf = frame_buffer(f->iov, f->iov_count, f->staging, length, &prm, &count);
    void *r = ucp_am_recv_data_nbx(a->worker, data, buf, count, &prm);
    if (r == NULL) {
        f->done = true;
        f->done_status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(r)) {
        f->done = true;
        f->done_status = UCS_PTR_STATUS(r);
    }
    return UCS_INPROGRESS;
nomem:
    kvhal_clear_error();
    if (f) {
        free(f->iov);
        stage_release(a, f->stage_mem, f->staging);
        free(f);
    }
    for (int32_t i = 0; i < h.n_pages; i++)
        for (int32_t l = h.first_layer; l < h.first_layer + h.num_layers; l++)
            x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l] = 0;
    x->claimed_count -= (int64_t)h.n_pages * h.num_layers;
    send_ack(a, p, h.xfer_id, h.frame, KVHAL_OUT_OF_MEMORY, 0, "receiver out of host memory");
    return UCS_ERR_NO_MEMORY;
}

/* A finished receive frame (from pump): copy staged data to the device, account, acknowledge. */
static bool rstage_submit(kvhal_xfer_agent *a, recv_frame *f);
static void recv_frame_finish(kvhal_xfer_agent *a, recv_frame *f, kvhal_status st, const char *reason, bool ack);

/* A device cache's received frame: its staging copied to the granted pages (the page list and layers were kept
 * after the IOV head), then acknowledged. */
static kvhal_status recv_stage(kvhal_xfer_agent *a, kvhal_stream **stream, recv_frame *f, char *reason, size_t cap)
{
    const int32_t *keep = (const int32_t *)(f->iov + 1);
    const kvhal_status st = stage_frame(a, stream, false, f->stage_mem, f->staging, keep + 2, (int32_t)f->iov_count,
                                        keep[0], keep[1]);
    if (st != KVHAL_OK) snprintf(reason, cap, "copy to the device failed: %s", kvhal_last_error());
    return st;
}

static void recv_frame_done(kvhal_xfer_agent *a, recv_frame *f)
{
    kvhal_xfer *x = f->x;
    kvhal_status st = KVHAL_OK;
    char reason[XW_REASON_LEN] = "";
    if (f->done_status != UCS_OK) {
        st = KVHAL_PEER_FAILED;
        snprintf(reason, sizeof reason, "receiving the frame failed: %s", ucs_status_string(f->done_status));
    } else if (!a->host && !x->failing) {
        /* a copy worker copies it (completed by rstage_reap), up to STAGE_AHEAD_BYTES at once; past that pump
         * does, and receives nothing meanwhile */
        if ((!a->rstaging || a->rstaging_out + f->bytes <= STAGE_AHEAD_BYTES) && rstage_submit(a, f)) return;
        st = recv_stage(a, &a->stage_stream, f, reason, sizeof reason);
    }
    recv_frame_finish(a, f, st, reason, true);
}

/* The frame's end: acknowledged (unless ack is false), its buffers freed, its transfer settled (which may free it). */
static void recv_frame_finish(kvhal_xfer_agent *a, recv_frame *f, kvhal_status st, const char *reason, bool ack)
{
    kvhal_xfer *x = f->x;
    x->inflight--;
    if (ack && x->peer && x->peer->state == P_CONNECTED)
        send_ack(a, x->peer, f->xfer_id, f->frame, st, f->bytes, reason);
    free(f->iov);
    stage_release(a, f->stage_mem, f->staging);
    if (st == KVHAL_OK) {
        x->bytes_done += f->bytes;
        free(f);
        if (!x->failing && x->claimed_count == (int64_t)x->n * a->g.num_layers && x->inflight == 0) {
            x->failing = true; /* final */
            x->status = KVHAL_OK;
            x->message[0] = '\0';
        }
        xfer_settle(x); /* may free x */
    } else {
        free(f);
        if (!x->failing) xfer_finish(x, st, "%s", reason); /* settles: may free x */
        else xfer_settle(x);                                 /* already failing: this may have been the last frame */
    }
}

static void on_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_ack k;
    if (header_length != sizeof k) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed ACK frame (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    kvhal_xfer *x = find_xfer_id(a, k.xfer_id);
    if (!x || x->is_recv || x->peer != p || k.frame >= (uint32_t)x->num_frames || x->finished) return; /* stale */
    send_frame *f = &x->frames[k.frame];
    if (!f->posted) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "ACK of frame %u, which was not sent yet", (unsigned)k.frame);
        return;
    }
    if (x->offer) { /* answered once, either way */
        if (f->answered) {
            peer_fail(p, KVHAL_PEER_FAILED, true, "ACK of frame %u of the offer of request %llu, which was answered "
                      "already", (unsigned)k.frame, (unsigned long long)x->request_id);
            return;
        }
        f->answered = true;
        if (x->failing) { /* withdrawn: waiting for the answers, then it settles */
            xfer_settle(x);
            return;
        }
    }
    if (k.status != KVHAL_OK) {
        kvhal_status st = (k.status > 0 && k.status < XFER_STATUS_N) ? (kvhal_status)k.status : KVHAL_PEER_FAILED;
        xfer_finish(x, st, "peer %s refused frame %u: %s", p->name, (unsigned)k.frame, k.reason);
        return;
    }
    if (f->acked) { /* counted once: a repeated ACK must not complete a transfer whose other frames never arrived */
        peer_fail(p, KVHAL_PEER_FAILED, true, "ACK of frame %u of request %llu, which was acknowledged already",
                  (unsigned)k.frame, (unsigned long long)x->request_id);
        return;
    }
    if (k.bytes != f->bytes) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "ACK of frame %u says %llu bytes, %llu were sent", (unsigned)k.frame,
                  (unsigned long long)k.bytes, (unsigned long long)f->bytes);
        return;
    }
    f->acked = true;
    x->frames_acked++;
    x->bytes_done += f->bytes;
    x->deadline_ns = deadline_from_now(a);
    if (x->frames_acked == x->num_frames && !x->failing) {
        x->failing = true;
        x->status = KVHAL_OK;
        xfer_settle(x);
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the IPC path: same host, the sender's cache shareable; the receiver imports it and copies pages itself      */
/* ---------------------------------------------------------------------------------------------------------- */
/* "boot_id/hostname": two agents with the same one run on the same host (kernel instance). */
static void host_identity(char *out, size_t cap)
{
    char boot[64] = "", host[72] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    snprintf(out, cap, "%s/%s", boot, host);
}

/* Sender: offers our cache's handle to a peer on our host (once per connection). */
static void offer_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
{
    if (!p->same_host || p->ipc_state != IPC_NONE) return;
    /* a shareable cache: its handle; else a host cache, where CMA is among the transports: where to read it */
    const bool cma = !a->ipc_blob_len && a->host && a->cma_ok;
    if (!a->ipc_blob_len && !cma) return;
    xw_cma_blob cb;
    memset(&cb, 0, sizeof cb);
    cb.pid = (uint32_t)getpid();
    cb.base = (uint64_t)(uintptr_t)a->host_base;
    cb.size = a->cache_buf ? kvhal_buffer_size(a->cache_buf) : 0;
    cb.probe_addr = (uint64_t)(uintptr_t)a->cma_probe;
    memcpy(cb.probe, a->cma_probe, sizeof cb.probe);
    const void *blob = cma ? (const void *)&cb : (const void *)a->ipc_blob;
    const size_t blob_len = cma ? sizeof cb : a->ipc_blob_len;
    const int32_t L = a->g.num_layers;
    const size_t dlen = blob_len + 2u * (size_t)L * sizeof(uint64_t);
    uint8_t *d = malloc(dlen);
    if (!d) return; /* through UCX then */
    memcpy(d, blob, blob_len);
    uint64_t *off = (uint64_t *)(void *)(d + blob_len);
    for (int32_t l = 0; l < L; l++) {
        const uint64_t ko = a->k_off[l], vo = a->v_off[l];
        memcpy(&off[2 * l], &ko, sizeof ko);
        memcpy(&off[2 * l + 1], &vo, sizeof vo);
    }
    xw_ipc_map m;
    memset(&m, 0, sizeof m);
    m.c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_MAP, p->their_session};
    m.blob_len = (uint32_t)blob_len;
    m.num_layers = L;
    m.block_stride = a->block_stride;
    m.num_blocks = a->g.num_blocks;
    m.kind = cma ? XW_IPC_CMA : XW_IPC_HANDLE;
    queue_msg(a, p, NULL, &m, sizeof m, d, dlen, false);
    free(d);
    p->ipc_state = IPC_OFFERED;
    p->ipc_kind = (int)m.kind;
}

static void send_map_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_status st, const char *reason)
{
    xw_ipc_map_ack k;
    memset(&k, 0, sizeof k);
    k.c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_MAP_ACK, p->their_session};
    k.status = (int32_t)st;
    copy_name(k.reason, sizeof k.reason, reason);
    queue_msg(a, p, NULL, &k, sizeof k, NULL, 0, false);
}

/* Receiver: may we read a peer's host cache with process_vm_readv (the XW_IPC_CMA kind of IPC_MAP)? Our cache in
 * host memory, CMA among our transports, and the peer's probe bytes read back from its process, which proves the
 * pid and that the kernel lets us (ptrace rules). Else why says why not. */
static void cma_probe(kvhal_xfer_agent *a, const xw_cma_blob *cb, char *why, size_t cap)
{
    uint64_t end;
    if (!a->host) {
        snprintf(why, cap, "this cache is not in host memory");
        return;
    }
    if (!a->cma_ok) {
        snprintf(why, cap, "CMA is not among this agent's transports");
        return;
    }
    if (cb->pid == 0 || cb->base == 0 || __builtin_add_overflow(cb->base, cb->size, &end)) {
        snprintf(why, cap, "bad CMA map (pid %u, %llu bytes)", (unsigned)cb->pid, (unsigned long long)cb->size);
        return;
    }
    uint8_t got[XW_CMA_PROBE];
    struct iovec l = {got, sizeof got}, r = {(void *)(uintptr_t)cb->probe_addr, sizeof got};
    const ssize_t n = process_vm_readv((pid_t)cb->pid, &l, 1, &r, 1, 0);
    if (n < 0) snprintf(why, cap, "cannot read process %u: %s", (unsigned)cb->pid, strerror(errno));
    else if ((size_t)n != sizeof got || memcmp(got, cb->probe, sizeof got) != 0)
        snprintf(why, cap, "process %u does not hold the peer's probe", (unsigned)cb->pid);
}

/* Receiver (from pump): checks a peer's IPC_MAP, imports its handle on our cache's device, checks that every page
 * of every layer it could name lies inside what was imported, and answers. A handle that cannot be imported is
 * refused (the peer then sends through host memory); a malformed frame drops the peer. */
static void process_ipc_map(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
{
    uint8_t *fr = p->map_frame;
    const size_t len = p->map_len;
    p->map_frame = NULL;
    p->map_len = 0;
    xw_ipc_map m;
    memcpy(&m, fr, sizeof m);
    const uint8_t *data = fr + sizeof m;
    const size_t dlen = len - sizeof m;
    const int32_t L = a->g.num_layers;
    char why[XW_REASON_LEN] = "";
    if (p->ipc_buf || p->cma) {
        free(fr);
        peer_fail(p, KVHAL_PEER_FAILED, true, "a second IPC_MAP on one connection");
        return;
    }
    if (m.blob_len < 1 || m.blob_len > XW_IPC_BLOB_MAX || m.num_layers != L ||
        (m.kind != XW_IPC_HANDLE && m.kind != XW_IPC_CMA) ||
        (m.kind == XW_IPC_CMA && m.blob_len != sizeof(xw_cma_blob)) ||
        dlen != (size_t)m.blob_len + 2u * (size_t)L * sizeof(uint64_t) || m.num_blocks != p->g.num_blocks ||
        m.block_stride < a->g.chunk_bytes) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed IPC_MAP frame (handle %u bytes, %d layers, %lld pages, "
                  "stride %llu, %zu data bytes)", (unsigned)m.blob_len, (int)m.num_layers, (long long)m.num_blocks,
                  (unsigned long long)m.block_stride, dlen);
        free(fr);
        return;
    }
    uint64_t *off = malloc(2u * (size_t)L * sizeof *off);
    kvhal_buffer *buf = NULL;
    xw_cma_blob cb;
    uint64_t size = 0;
    if (!off) snprintf(why, sizeof why, "out of host memory");
    else memcpy(off, data + m.blob_len, 2u * (size_t)L * sizeof *off);
    if (!why[0] && m.kind == XW_IPC_CMA) {
        memcpy(&cb, data, sizeof cb);
        cma_probe(a, &cb, why, sizeof why);
        size = cb.size;
    } else if (!why[0]) {
        if (kvhal_buffer_ipc_import(kvhal_buffer_device(a->cache_buf), data, m.blob_len, &buf) != KVHAL_OK)
            snprintf(why, sizeof why, "import failed: %s", kvhal_last_error());
        else size = kvhal_buffer_size(buf);
    }
    if (!why[0]) { /* the last byte any (page, layer, side) can reach, overflow-checked */
        uint64_t span;
        if (__builtin_mul_overflow((uint64_t)(m.num_blocks - 1), m.block_stride, &span) ||
            __builtin_add_overflow(span, a->g.chunk_bytes, &span))
            snprintf(why, sizeof why, "%lld pages of stride %llu overflow", (long long)m.num_blocks,
                     (unsigned long long)m.block_stride);
        for (int32_t i = 0; i < 2 * L && !why[0]; i++) {
            uint64_t end;
            if (__builtin_add_overflow(off[i], span, &end) || end > size)
                snprintf(why, sizeof why, "layer %d %s: its pages reach past the %llu imported bytes", (int)(i / 2),
                         i % 2 ? "V" : "K", (unsigned long long)size);
        }
    }
    free(fr);
    if (why[0]) {
        kvhal_buffer_destroy(buf);
        free(off);
        kvhal_clear_error();
        send_map_ack(a, p, KVHAL_UNSUPPORTED, why);
        return;
    }
    p->ipc_buf = buf;
    if (m.kind == XW_IPC_CMA) {
        p->cma = true;
        p->cma_pid = cb.pid;
        p->cma_base = cb.base;
    }
    p->ipc_off = off;
    p->ipc_stride = m.block_stride;
    p->ipc_blocks = m.num_blocks;
    send_map_ack(a, p, KVHAL_OK, "");
}

static void on_ipc_map_ack(kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_ipc_map_ack k;
    if (header_length != sizeof k || p->ipc_state != IPC_OFFERED) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "unexpected or malformed IPC_MAP_ACK (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    if (k.status == 0) {
        p->ipc_state = IPC_READY;
    } else {
        p->ipc_state = IPC_REFUSED;
        copy_name(p->ipc_reason, sizeof p->ipc_reason, k.reason);
    }
}

/* Receiver: a DATA_IPC frame, checked like DATA (grant, page ids, each (page, layer) once) plus the source page
 * ids against the imported cache; accepted pages are claimed now and copied from pump. */
static void ipc_accept(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x, uint64_t request_id, uint64_t xfer_id,
                       uint32_t frame, int32_t l0, int32_t nl, int32_t *pairs, int32_t n, const char *what);

static void on_data_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
                        const void *data, size_t length, bool rndv)
{
    xw_data_ipc h;
    if (header_length != sizeof h || rndv) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed DATA_IPC frame (%zu header bytes%s)", header_length,
                  rndv ? ", rendezvous" : "");
        return;
    }
    memcpy(&h, header, sizeof h);
    if (!p->ipc_buf && !p->cma) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "DATA_IPC frame without an imported IPC handle");
        return;
    }
    if (h.n_pages < 1 || h.n_pages > XW_IPC_FRAME_PAGES || length != (size_t)h.n_pages * 2u * sizeof(int32_t)) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed DATA_IPC frame: %d pages with %zu data bytes",
                  (int)h.n_pages, length);
        return;
    }
    kvhal_xfer *x = find_grant(a, p, h.request_id);
    if (!x) {
        char r[XW_REASON_LEN];
        snprintf(r, sizeof r, "request %llu has no pending grant from %s", (unsigned long long)h.request_id, a->name);
        send_ack(a, p, h.xfer_id, h.frame, KVHAL_NOT_FOUND, 0, r);
        return;
    }
    const int32_t L = a->g.num_layers;
    if (h.first_layer < 0 || h.num_layers < 1 || h.first_layer > L - h.num_layers) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "refused DATA_IPC frame: layers [%d, %d+%d) outside [0, %d)",
                  (int)h.first_layer, (int)h.first_layer, (int)h.num_layers, (int)L);
        return;
    }
    int32_t *pairs = malloc(length);
    if (!pairs) {
        send_ack(a, p, h.xfer_id, h.frame, KVHAL_OUT_OF_MEMORY, 0, "receiver out of host memory");
        return;
    }
    memcpy(pairs, data, length);
    ipc_accept(a, p, x, h.request_id, h.xfer_id, h.frame, h.first_layer, h.num_layers, pairs, h.n_pages, "DATA_IPC frame");
}

/* Receiver: the (src, dst) pairs of a DATA_IPC frame, or of an offer that x took, checked (source pages in the
 * imported cache, destination pages in x's grant, each (page, layer) once) and claimed, then queued for pump's
 * copy. pairs: n of them, ours (freed here when refused). A violation drops the peer. */
static void ipc_accept(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x, uint64_t request_id, uint64_t xfer_id,
                       uint32_t frame, int32_t l0, int32_t nl, int32_t *pairs, int32_t n, const char *what)
{
    const int32_t L = a->g.num_layers;
    ipc_job *j = calloc(1, sizeof *j);
    int32_t *idx = malloc((size_t)n * sizeof(int32_t));
    if (!j || !idx) {
        free(j);
        free(pairs);
        free(idx);
        send_ack(a, p, xfer_id, frame, KVHAL_OUT_OF_MEMORY, 0, "receiver out of host memory");
        return;
    }
    char why[200] = "";
    for (int32_t i = 0; i < n && !why[0]; i++) {
        const int32_t src = pairs[2 * i], dst = pairs[2 * i + 1];
        if (src < 0 || src >= p->ipc_blocks)
            snprintf(why, sizeof why, "source page %d is out of range [0, %lld)", (int)src, (long long)p->ipc_blocks);
        else if (dst < 0 || dst >= a->g.num_blocks)
            snprintf(why, sizeof why, "page %d is out of range [0, %lld)", (int)dst, (long long)a->g.num_blocks);
        else if ((idx[i] = grant_index(x, dst)) < 0)
            snprintf(why, sizeof why, "page %d is not granted to request %llu", (int)dst,
                     (unsigned long long)request_id);
    }
    int32_t claimed_pages = 0; /* pages of this frame claimed so far (undone on refusal) */
    for (int32_t i = 0; i < n && !why[0]; i++) {
        for (int32_t l = l0; l < l0 + nl; l++)
            if (x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l]) {
                snprintf(why, sizeof why, "page %d layer %d was already sent", (int)pairs[2 * i + 1], (int)l);
                for (int32_t m = l0; m < l; m++) x->claimed[(size_t)idx[i] * (size_t)L + (size_t)m] = 0;
                break;
            } else {
                x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l] = 1;
            }
        if (!why[0]) claimed_pages++;
    }
    if (why[0]) {
        for (int32_t i = 0; i < claimed_pages; i++)
            for (int32_t l = l0; l < l0 + nl; l++)
                x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l] = 0;
        free(j);
        free(pairs);
        free(idx);
        peer_fail(p, KVHAL_PEER_FAILED, true, "refused %s for request %llu: %s", what,
                  (unsigned long long)request_id, why);
        return;
    }
    x->claimed_count += (int64_t)n * nl;
    x->deadline_ns = deadline_from_now(a);
    x->inflight++;
    j->x = x;
    j->p = p;
    j->xfer_id = xfer_id;
    j->frame = frame;
    j->l0 = l0;
    j->nl = nl;
    j->n = n;
    j->pairs = pairs;
    j->idx = idx;
    j->path = p->cma ? PATH_CMA : PATH_IPC;
    p->ipc_queued += ipc_job_chunks(j);
    if (a->ipc_jobs_tail) a->ipc_jobs_tail->next = j;
    else a->ipc_jobs = j;
    a->ipc_jobs_tail = j;
}

static void ipc_job_free(ipc_job *j)
{
    free(j->pairs);
    free(j->idx);
    free(j->lv);
    free(j->rv);
    free(j->pieces);
    free(j);
}

/* ---- offers: the sender names its pages first (kvhal_xfer_offer_pages), the receiver takes them with a receive ---- */
static void offer_unlink(kvhal_xfer_peer *p, offer_rec *prev, offer_rec *o)
{
    if (prev) prev->next = o->next;
    else p->offers = o->next;
    if (p->offers_tail == o) p->offers_tail = prev;
    p->offered_pages -= o->n;
    p->offered_frames--;
}

static void offer_free(offer_rec *o)
{
    free(o->src);
    free(o);
}

/* Receiver: refuses (ACK st, reason) every OFFER frame of request_id from p still waiting for a receive: a request
 * is taken whole or not at all, so that a receive never takes part of it and waits for frames refused already. */
static void offers_refuse_request(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t request_id, kvhal_status st,
                                  const char *reason)
{
    for (offer_rec *o = p->offers, *prev = NULL, *nx; o; o = nx) {
        nx = o->next;
        if (o->request_id != request_id) {
            prev = o;
            continue;
        }
        offer_unlink(p, prev, o);
        send_ack(a, p, o->xfer_id, o->frame, st, 0, reason);
        offer_free(o);
    }
}

/* Receiver: x (a receive posted for o's request) takes the offer o (unlinked; freed here): its source pages, in the
 * request's order, go into x's pages of the same index. */
static void offer_take(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x, offer_rec *o)
{
    char r[XW_REASON_LEN];
    if (o->total != x->n) {
        snprintf(r, sizeof r, "request %llu: %d pages offered, a receive of %d posted", (unsigned long long)o->request_id,
                 (int)o->total, (int)x->n);
        send_ack(a, p, o->xfer_id, o->frame, KVHAL_OUT_OF_RANGE, 0, r);
        xfer_finish(x, KVHAL_OUT_OF_RANGE, "peer %s: %s", p->name, r);
        offer_free(o);
        return;
    }
    int32_t *pairs = malloc((size_t)o->n * 2u * sizeof(int32_t));
    if (!pairs) {
        send_ack(a, p, o->xfer_id, o->frame, KVHAL_OUT_OF_MEMORY, 0, "receiver out of host memory");
        xfer_finish(x, KVHAL_OUT_OF_MEMORY, "request %llu: out of host memory taking the offer of peer %s",
                    (unsigned long long)o->request_id, p->name);
        offer_free(o);
        return;
    }
    for (int32_t i = 0; i < o->n; i++) {
        pairs[2 * i] = o->src[i];
        pairs[2 * i + 1] = x->pages[o->first_page + i];
    }
    ipc_accept(a, p, x, o->request_id, o->xfer_id, o->frame, o->l0, o->nl, pairs, o->n, "OFFER frame");
    offer_free(o);
}

/* Receiver: takes the offers of p for x's request waiting since before the receive was posted. Returns how many. */
static int offer_take_pending(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x)
{
    int taken = 0;
    for (offer_rec *o = p->offers, *prev = NULL, *nx; o && !x->failing && p->state == P_CONNECTED; o = nx) {
        nx = o->next;
        if (o->request_id != x->request_id) {
            prev = o;
            continue;
        }
        offer_unlink(p, prev, o);
        offer_take(a, p, x, o);
        taken++;
    }
    if (x->failing && p->state == P_CONNECTED) /* a size that differs: the request's other frames too */
        offers_refuse_request(a, p, x->request_id, x->status, x->message);
    return taken;
}

static void on_offer(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
                     const void *data, size_t length, bool rndv)
{
    xw_offer h;
    if (header_length != sizeof h || rndv) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed OFFER frame (%zu header bytes%s)", header_length,
                  rndv ? ", rendezvous" : "");
        return;
    }
    memcpy(&h, header, sizeof h);
    if (!p->ipc_buf && !p->cma) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "OFFER frame without an imported IPC handle");
        return;
    }
    const int32_t L = a->g.num_layers;
    if (h.n_pages < 1 || h.n_pages > XW_IPC_FRAME_PAGES || length != (size_t)h.n_pages * sizeof(int32_t) ||
        h.total_pages < 1 || h.total_pages > XW_MAX_GRANT || h.first_page < 0 ||
        h.first_page > h.total_pages - h.n_pages || h.first_layer < 0 || h.num_layers < 1 ||
        h.first_layer > L - h.num_layers) {
        peer_fail(p, KVHAL_PEER_FAILED, true,
                  "malformed OFFER frame: pages [%d, %d+%d) of %d, layers [%d, %d+%d) of %d, %zu data bytes",
                  (int)h.first_page, (int)h.first_page, (int)h.n_pages, (int)h.total_pages, (int)h.first_layer,
                  (int)h.first_layer, (int)h.num_layers, (int)L, length);
        return;
    }
    offer_rec *o = calloc(1, sizeof *o);
    int32_t *src = malloc(length);
    if (!o || !src) {
        free(o);
        free(src);
        send_ack(a, p, h.xfer_id, h.frame, KVHAL_OUT_OF_MEMORY, 0, "receiver out of host memory");
        return;
    }
    memcpy(src, data, length);
    for (int32_t i = 0; i < h.n_pages; i++)
        if (src[i] < 0 || src[i] >= p->ipc_blocks) {
            peer_fail(p, KVHAL_PEER_FAILED, true, "refused OFFER frame for request %llu: source page %d is out of "
                      "range [0, %lld)", (unsigned long long)h.request_id, (int)src[i], (long long)p->ipc_blocks);
            free(o);
            free(src);
            return;
        }
    *o = (offer_rec){.request_id = h.request_id, .xfer_id = h.xfer_id, .frame = h.frame, .l0 = h.first_layer,
                     .nl = h.num_layers, .first_page = h.first_page, .total = h.total_pages, .n = h.n_pages,
                     .src = src};
    kvhal_xfer *x = find_grant(a, p, h.request_id);
    if (x) {
        offer_take(a, p, x, o);
        return;
    }
    if (p->offered_pages + h.n_pages > OFFER_PAGES_MAX || p->offered_frames >= OFFER_FRAMES_MAX) {
        char r[XW_REASON_LEN];
        snprintf(r, sizeof r, "%lld pages in %d offers of %s wait for a receive already (at most %d, %d)",
                 (long long)p->offered_pages, (int)p->offered_frames, p->name, OFFER_PAGES_MAX, OFFER_FRAMES_MAX);
        send_ack(a, p, h.xfer_id, h.frame, KVHAL_OUT_OF_MEMORY, 0, r);
        offers_refuse_request(a, p, h.request_id, KVHAL_OUT_OF_MEMORY, r);
        offer_free(o);
        return;
    }
    o->expires_ns = now_ns() + (uint64_t)a->timeout_ms * 500000ull;
    if (p->offers_tail) p->offers_tail->next = o;
    else p->offers = o;
    p->offers_tail = o;
    p->offered_pages += o->n;
    p->offered_frames++;
    if (h.first_page == 0)
        push_event(a, KVHAL_XFER_EVENT_OFFER, p, NULL, h.request_id, KVHAL_OK, NULL, h.total_pages,
                   "peer %s offered %d pages of layers [%d, %d) for request %llu", p->name, (int)h.total_pages,
                   (int)h.first_layer, (int)(h.first_layer + h.num_layers), (unsigned long long)h.request_id);
}

/* Receiver: the sender canceled an offer: its frames no receive took are dropped and refused. */
static void on_withdraw(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_withdraw w;
    if (header_length != sizeof w) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed WITHDRAW frame (%zu bytes)", header_length);
        return;
    }
    memcpy(&w, header, sizeof w);
    for (offer_rec *o = p->offers, *prev = NULL, *nx; o; o = nx) {
        nx = o->next;
        if (o->xfer_id != w.xfer_id) {
            prev = o;
            continue;
        }
        offer_unlink(p, prev, o);
        send_ack(a, p, o->xfer_id, o->frame, KVHAL_CANCELED, 0, "offer withdrawn");
        offer_free(o);
    }
}

/* Receiver (pump): offers no receive took within half the timeout are refused (the sender's own deadline is the
 * whole timeout: it hears of it before it gives up on the peer). */
static void offers_expire(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now)
{
    while (p->offers && now > p->offers->expires_ns) { /* the oldest first: its request's other frames with it */
        char r[XW_REASON_LEN];
        snprintf(r, sizeof r, "request %llu: no receive was posted for the offer within %u ms",
                 (unsigned long long)p->offers->request_id, (unsigned)(a->timeout_ms / 2));
        offers_refuse_request(a, p, p->offers->request_id, KVHAL_TIMEOUT, r);
    }
}

static void offers_free(kvhal_xfer_peer *p)
{
    while (p->offers) {
        offer_rec *o = p->offers;
        offer_unlink(p, NULL, o);
        offer_free(o);
    }
}

/* Receiver: a DATA_IPC frame's copy is over (st: how it went): the pages are written, acknowledge. */
static void ipc_job_complete(kvhal_xfer_agent *a, ipc_job *j, kvhal_status st, const char *why)
{
    kvhal_xfer *x = j->x;
    kvhal_xfer_peer *p = j->p;
    const uint64_t bytes = (uint64_t)j->n * (uint64_t)j->nl * 2u * a->g.chunk_bytes;
    char reason[XW_REASON_LEN];
    snprintf(reason, sizeof reason, "%s", why);
    x->inflight--;
    x->path = j->path;
    if (p && p->state == P_CONNECTED) send_ack(a, p, j->xfer_id, j->frame, st, st == KVHAL_OK ? bytes : 0, reason);
    if (st == KVHAL_OK) {
        x->bytes_done += bytes;
        if (!x->failing && x->claimed_count == (int64_t)x->n * a->g.num_layers && x->inflight == 0) {
            x->failing = true; /* final */
            x->status = KVHAL_OK;
            x->message[0] = '\0';
        }
        xfer_settle(x); /* may free x */
    } else if (!x->failing) {
        xfer_finish(x, st, "%s", reason);
    } else {
        xfer_settle(x);
    }
    ipc_job_free(j);
}

/* Takes the oldest running launch group off the list once its stream is done (wait: block for it), and completes
 * its frames. */
static bool ipc_job_reap(kvhal_xfer_agent *a, bool wait)
{
    ipc_job *j = a->ipc_running;
    if (!j) return false;
    kvhal_stream *sm = a->ipc_streams[j->slot];
    kvhal_event *ev = j->marked ? a->ipc_events[j->slot] : NULL;
    kvhal_status st = ev ? (wait ? kvhal_event_synchronize(ev) : kvhal_event_query(ev))
                         : (wait ? kvhal_stream_synchronize(sm) : kvhal_stream_query(sm));
    if (st == KVHAL_BUSY) return false;
    char why[XW_REASON_LEN] = "";
    if (st != KVHAL_OK) snprintf(why, sizeof why, "device copy failed: %s", kvhal_last_error());
    a->ipc_stream_groups[j->slot]--;
    a->ipc_groups_running--;
    const uint64_t launch = j->launch;
    do {
        a->ipc_running = j->next;
        ipc_job_complete(a, j, st, why);
    } while ((j = a->ipc_running) && j->launch == launch);
    return true;
}

/* Receiver (from pump), the CMA kind: every (page, layer, K/V) chunk of a DATA_IPC frame read from the peer's
 * process straight into our granted pages with process_vm_readv (chunks adjacent on both sides merged, up to 1024
 * of them a call), then acknowledged. The source addresses are the peer's map, checked against its size when it
 * came; whatever the peer's process no longer holds fails the frame. */
static bool cma_read(uint32_t pid, struct iovec *lv, struct iovec *rv, size_t c, char *why, size_t cap)
{
    /* One call moves at most MAX_RW_COUNT (about 2 GiB) and returns that much: the rest is read by the next call,
     * from where it stopped (the runs moved past are not given back: both lists are the caller's scratch). */
    while (c > 0) {
        ssize_t n;
        do n = process_vm_readv((pid_t)pid, lv, (unsigned long)c, rv, (unsigned long)c, 0);
        while (n < 0 && errno == EINTR);
        if (n <= 0) {
            char buf[128];
            snprintf(why, cap, "reading the peer's pages (process %u) failed: %s", (unsigned)pid,
                     n < 0 ? strerror_r(errno, buf, sizeof buf) : "nothing read");
            return false;
        }
        size_t done = (size_t)n;
        while (c > 0 && done >= lv->iov_len) { /* local and remote runs have the same lengths */
            done -= lv->iov_len;
            lv++;
            rv++;
            c--;
        }
        if (c > 0 && done) {
            lv->iov_base = (uint8_t *)lv->iov_base + done;
            lv->iov_len -= done;
            rv->iov_base = (uint8_t *)rv->iov_base + done;
            rv->iov_len -= done;
        }
    }
    return true;
}

static void cma_copy(kvhal_xfer_agent *a, ipc_job *j)
{
    kvhal_xfer_peer *p = j->p;
    const uint64_t cb = a->g.chunk_bytes;
    enum { BATCH = 1024 };
    struct iovec lv[BATCH], rv[BATCH];
    size_t c = 0;
    bool ok = true;
    char why[XW_REASON_LEN] = "";
    for (int32_t i = 0; i < j->n && ok; i++)
        for (int32_t l = j->l0; l < j->l0 + j->nl && ok; l++)
            for (int sd = 0; sd < 2 && ok; sd++) {
                uint8_t *d = a->host_base + chunk_off(a, l, sd, j->pairs[2 * i + 1]);
                uint8_t *s = (uint8_t *)(uintptr_t)(p->cma_base + p->ipc_off[2 * l + sd] +
                                                    (uint64_t)j->pairs[2 * i] * p->ipc_stride);
                if (c && (uint8_t *)lv[c - 1].iov_base + lv[c - 1].iov_len == d &&
                    (uint8_t *)rv[c - 1].iov_base + rv[c - 1].iov_len == s) {
                    lv[c - 1].iov_len += cb;
                    rv[c - 1].iov_len += cb;
                    continue;
                }
                if (c == BATCH) {
                    ok = cma_read(p->cma_pid, lv, rv, c, why, sizeof why);
                    c = 0;
                }
                lv[c] = (struct iovec){d, cb};
                rv[c] = (struct iovec){s, cb};
                c++;
            }
    if (ok && c) ok = cma_read(p->cma_pid, lv, rv, c, why, sizeof why);
    ipc_job_complete(a, j, ok ? KVHAL_OK : KVHAL_PEER_FAILED, why);
}


/* Reads runs [0, c) of lv/rv from the peer's process, CMA_IOV_MAX a call. */
static bool cma_read_runs(uint32_t pid, struct iovec *lv, struct iovec *rv, size_t c, char *why, size_t cap)
{
    for (size_t k = 0; k < c; k += CMA_IOV_MAX)
        if (!cma_read(pid, lv + k, rv + k, c - k < CMA_IOV_MAX ? c - k : CMA_IOV_MAX, why, cap)) return false;
    return true;
}

/* A gathered frame's chunks (our cache) copied one after the other into its bounce buffer. */
static void gather_copy(const send_frame *f)
{
    uint8_t *b = f->bounce;
    for (size_t i = 0; i < f->iov_count; i++) {
        memcpy(b, f->iov[i].buffer, f->iov[i].length);
        b += f->iov[i].length;
    }
}

/* A copy worker: takes tasks off the queue (CMA reads, gathers, staging copies of a device cache's frames: the
 * latter on a stream of its own) and does them, touching only the task's frame or job and what of the agent is
 * fixed after kvhal_xfer_agent_create (its cache and geometry); when the queue is empty it polls it for
 * CMA_SPIN_NS (the next frame usually follows within microseconds) before it sleeps. */
static void *cma_worker(void *arg)
{
    kvhal_xfer_agent *a = arg;
    kvhal_stream *stream = NULL; /* the worker's own, for the staging copies of a device cache's frames */
    pthread_mutex_lock(&a->cma_mu);
    for (;;) {
        if (!a->cma_head && !a->cma_stop) {
            pthread_mutex_unlock(&a->cma_mu);
            const uint64_t until = now_ns() + CMA_SPIN_NS;
            unsigned spins = 0;
            while (atomic_load_explicit(&a->cma_queued, memory_order_relaxed) == 0 && now_ns() < until)
                if ((++spins & 63) == 0) sched_yield();
            pthread_mutex_lock(&a->cma_mu);
            while (!a->cma_head && !a->cma_stop) pthread_cond_wait(&a->cma_work, &a->cma_mu);
        }
        if (!a->cma_head) break; /* stopped, nothing left */
        cma_piece *pc = a->cma_head;
        a->cma_head = pc->next;
        if (!a->cma_head) a->cma_tail = NULL;
        atomic_fetch_sub_explicit(&a->cma_queued, 1, memory_order_relaxed);
        if (!pc->j && pc->rf) { /* a received frame's staging to the device cache (pump leaves the frame alone meanwhile) */
            recv_frame *rf = pc->rf;
            const bool rskip = rf->rskip;
            pthread_mutex_unlock(&a->cma_mu);
            char why[XW_REASON_LEN] = "";
            const kvhal_status st = rskip ? KVHAL_CANCELED : recv_stage(a, &stream, rf, why, sizeof why);
            pthread_mutex_lock(&a->cma_mu);
            rf->rstatus = st;
            memcpy(rf->rwhy, why, sizeof why);
            rf->rdone = true;
            pthread_cond_broadcast(&a->cma_done);
            continue;
        }
        if (!pc->j) { /* a gather: the frame's chunks (our cache) into its bounce buffer, both left alone by pump;
                       * or a device cache's frame: its source pages copied to its staging */
            send_frame *f = pc->f;
            const bool gskip = f->gskip;
            pthread_mutex_unlock(&a->cma_mu);
            kvhal_status st = KVHAL_OK;
            char why[XW_REASON_LEN] = "";
            if (!gskip && f->stage_src) {
                st = stage_frame(a, &stream, true, f->stage_mem, f->staging, f->stage_src, f->hdr->n_pages,
                                 f->hdr->first_layer, f->hdr->num_layers);
                if (st != KVHAL_OK) snprintf(why, sizeof why, "%s", kvhal_last_error());
            } else if (!gskip) {
                gather_copy(f);
            }
            pthread_mutex_lock(&a->cma_mu);
            f->gstatus = st;
            memcpy(f->gwhy, why, sizeof why);
            f->gdone = true;
            pthread_cond_broadcast(&a->cma_done);
            continue;
        }
        ipc_job *j = pc->j;
        const bool skip = j->skip || j->failed;
        pthread_mutex_unlock(&a->cma_mu);
        char why[XW_REASON_LEN] = "";
        const bool ok = skip || cma_read_runs(j->pid, j->lv + pc->first, j->rv + pc->first, pc->count, why, sizeof why);
        pthread_mutex_lock(&a->cma_mu);
        if (skip) j->skipped = true;
        if (!ok && !j->failed) {
            j->failed = true;
            memcpy(j->why, why, sizeof why);
        }
        if (--j->pieces_left == 0) pthread_cond_broadcast(&a->cma_done);
    }
    pthread_mutex_unlock(&a->cma_mu);
    kvhal_stream_destroy(stream); /* its copies were all waited for */
    return NULL;
}

/* A forked child of the process that started the copy workers: none of them runs here, and their mutex may be held
 * for ever (taken by a worker when the process forked). */
static bool cma_orphaned(const kvhal_xfer_agent *a) { return a->cma_pid && a->cma_pid != getpid(); }

/* In a child forked while workers ran, their threads are gone and their mutex may be held for ever: forget them
 * (nothing to join or destroy there) and let pump copy. */
static void cma_pool_forget_if_forked(kvhal_xfer_agent *a)
{
    if ((a->cma_started || a->cma_sync) && a->cma_pid != getpid()) {
        a->cma_started = 0;
        a->cma_sync = false;
        a->cma_threads = 0;
    }
}

/* Starts the copy workers on the first CMA frame (false: none, pump copies). Their signals are blocked: the
 * application's handlers run on its own threads. A thread that does not start leaves fewer workers. */
static bool cma_pool_start(kvhal_xfer_agent *a)
{
    cma_pool_forget_if_forked(a);
    if (a->cma_started) return true;
    if (a->cma_threads <= 0) return false;
    if (!a->cma_sync) {
        if (pthread_mutex_init(&a->cma_mu, NULL)) {
            a->cma_threads = 0;
            return false;
        }
        if (pthread_cond_init(&a->cma_work, NULL)) {
            pthread_mutex_destroy(&a->cma_mu);
            a->cma_threads = 0;
            return false;
        }
        if (pthread_cond_init(&a->cma_done, NULL)) {
            pthread_cond_destroy(&a->cma_work);
            pthread_mutex_destroy(&a->cma_mu);
            a->cma_threads = 0;
            return false;
        }
        a->cma_sync = true;
        a->cma_pid = getpid();
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (a->cma_started < a->cma_threads && pthread_create(&a->cma_th[a->cma_started], NULL, cma_worker, a) == 0)
        a->cma_started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!a->cma_started) a->cma_threads = 0; /* no threads to be had: pump copies from now on */
    return a->cma_started > 0;
}

/* Stops and joins the workers (every job reaped before: cma_jobs_drain). */
static void cma_pool_stop(kvhal_xfer_agent *a)
{
    cma_pool_forget_if_forked(a);
    if (a->cma_started) {
        pthread_mutex_lock(&a->cma_mu);
        a->cma_stop = true;
        pthread_cond_broadcast(&a->cma_work);
        pthread_mutex_unlock(&a->cma_mu);
        for (int k = 0; k < a->cma_started; k++) pthread_join(a->cma_th[k], NULL);
        a->cma_started = 0;
    }
    if (a->cma_sync) {
        pthread_cond_destroy(&a->cma_done);
        pthread_cond_destroy(&a->cma_work);
        pthread_mutex_destroy(&a->cma_mu);
        a->cma_sync = false;
    }
}

/* Queues n tasks (pcs[0 .. n)) for the copy workers and wakes as many. */
static void cma_enqueue(kvhal_xfer_agent *a, cma_piece *pcs, int n)
{
    pthread_mutex_lock(&a->cma_mu);
    for (int k = 0; k < n; k++) {
        pcs[k].next = NULL;
        if (a->cma_tail) a->cma_tail->next = &pcs[k];
        else a->cma_head = &pcs[k];
        a->cma_tail = &pcs[k];
    }
    atomic_fetch_add_explicit(&a->cma_queued, n, memory_order_relaxed);
    if (n > 1) pthread_cond_broadcast(&a->cma_work);
    else pthread_cond_signal(&a->cma_work);
    pthread_mutex_unlock(&a->cma_mu);
}

/* Receiver (from pump), the CMA kind with copy workers: the frame's runs (as cma_copy merges them, but no longer
 * than a piece) are built here, cut into up to one piece per worker (CMA_PIECE_BYTES at least each) and queued;
 * pump completes the job once every piece is read (cma_reap). false: not queued (no workers, or no memory for the
 * runs): the caller copies it itself. */
static bool cma_submit(kvhal_xfer_agent *a, ipc_job *j)
{
    if (!cma_pool_start(a)) return false;
    kvhal_xfer_peer *p = j->p;
    const uint64_t cb = a->g.chunk_bytes;
    const size_t max = (size_t)j->n * (size_t)j->nl * 2u;
    const uint64_t total = (uint64_t)max * cb;
    size_t per = a->cma_piece; /* bytes of a piece: the frame shared by the workers, a piece's worth at least */
    if (total / (uint64_t)a->cma_started > per) per = (size_t)((total + (uint64_t)a->cma_started - 1) / (uint64_t)a->cma_started);
    j->lv = malloc(max * sizeof *j->lv);
    j->rv = malloc(max * sizeof *j->rv);
    j->pieces = malloc((size_t)a->cma_started * sizeof *j->pieces);
    if (!j->lv || !j->rv || !j->pieces) {
        free(j->lv);
        free(j->rv);
        free(j->pieces);
        j->lv = j->rv = NULL;
        j->pieces = NULL;
        return false;
    }
    size_t c = 0;
    for (int32_t i = 0; i < j->n; i++)
        for (int32_t l = j->l0; l < j->l0 + j->nl; l++)
            for (int sd = 0; sd < 2; sd++) {
                uint8_t *d = a->host_base + chunk_off(a, l, sd, j->pairs[2 * i + 1]);
                uint8_t *src = (uint8_t *)(uintptr_t)(p->cma_base + p->ipc_off[2 * l + sd] +
                                                      (uint64_t)j->pairs[2 * i] * p->ipc_stride);
                if (c && (uint8_t *)j->lv[c - 1].iov_base + j->lv[c - 1].iov_len == d &&
                    (uint8_t *)j->rv[c - 1].iov_base + j->rv[c - 1].iov_len == src && j->lv[c - 1].iov_len + cb <= per) {
                    j->lv[c - 1].iov_len += cb;
                    j->rv[c - 1].iov_len += cb;
                    continue;
                }
                j->lv[c] = (struct iovec){d, cb};
                j->rv[c] = (struct iovec){src, cb};
                c++;
            }
    /* pieces: consecutive runs of about per bytes each, the last one taking what is left */
    int np = 0;
    for (size_t k = 0; k < c;) {
        cma_piece *pc = &j->pieces[np];
        *pc = (cma_piece){.j = j};
        pc->first = k;
        size_t bytes = 0;
        if (np == a->cma_started - 1) {
            k = c;
        } else {
            while (k < c && bytes < per) bytes += j->rv[k++].iov_len;
        }
        pc->count = k - pc->first;
        np++;
    }
    j->pid = p->cma_pid;
    j->pieces_left = np;
    j->next = a->cma_running;
    a->cma_running = j;
    cma_enqueue(a, j->pieces, np);
    return true;
}

/* Completes the jobs whose pieces are all done (wait: blocks until one is, unless none runs); returns how many.
 * Jobs of transfers that failed meanwhile are marked so that their pieces not yet started are skipped. */
static unsigned cma_reap(kvhal_xfer_agent *a, bool wait)
{
    if (!a->cma_running) return 0;
    ipc_job *done = NULL;
    const bool orphaned = cma_orphaned(a); /* getpid: once a call */
    if (orphaned) { /* a forked child: the parent's workers will never finish these; they fail here */
        while (a->cma_running) {
            ipc_job *j = a->cma_running;
            a->cma_running = j->next;
            j->failed = true;
            j->p = NULL; /* no ACK from here: the connection is the parent's, whose workers still copy the frame */
            snprintf(j->why, sizeof j->why, "the process forked while the frame was being copied");
            j->next = done;
            done = j;
        }
        wait = false;
    } else {
        pthread_mutex_lock(&a->cma_mu);
    }
    for (; !orphaned;) {
        for (ipc_job **pp = &a->cma_running; *pp;) {
            ipc_job *j = *pp;
            if (j->pieces_left == 0) {
                *pp = j->next;
                j->next = done;
                done = j;
            } else {
                if (j->x->failing || !j->p) j->skip = true;
                pp = &j->next;
            }
        }
        if (!wait || done || !a->cma_running) break;
        pthread_cond_wait(&a->cma_done, &a->cma_mu);
    }
    if (!orphaned) pthread_mutex_unlock(&a->cma_mu);
    if (a->cma_running) { /* a receive whose frames our workers still copy is not stalled by its peer */
        const uint64_t deadline = deadline_from_now(a);
        for (ipc_job *j = a->cma_running; j; j = j->next) j->x->deadline_ns = deadline;
    }
    unsigned n = 0;
    while (done) { /* the workers are done with these: pump's alone now */
        ipc_job *j = done;
        done = j->next;
        kvhal_status st = KVHAL_OK;
        char why[XW_REASON_LEN] = "";
        if (j->failed) {
            st = KVHAL_PEER_FAILED;
            memcpy(why, j->why, sizeof why);
        } else if (j->skipped) {
            st = KVHAL_CANCELED;
            snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)j->x->request_id);
        }
        ipc_job_complete(a, j, st, why);
        n++;
    }
    return n;
}

static void cma_jobs_drain(kvhal_xfer_agent *a)
{
    while (a->cma_running) cma_reap(a, true); /* in a forked child: fails them at once */
}

/* Sender (from post_frames): a frame to gather (its bounce buffer taken) handed to a copy worker, so that pump goes
 * on sending while it is copied; false: no workers, the caller gathers it. The frame counts as a send in flight
 * (its transfer cannot settle, its buffers stay) until gather_reap. */
static bool gather_submit(kvhal_xfer_agent *a, send_frame *f)
{
    if (!cma_pool_start(a)) return false;
    f->gathering = true;
    f->gdone = f->gskip = false;
    f->gstatus = KVHAL_OK;
    f->task = (cma_piece){.f = f};
    f->x->sends_inflight++;
    f->gnext = a->gathering;
    a->gathering = f;
    cma_enqueue(a, &f->task, 1);
    return true;
}

static bool post_frame(kvhal_xfer_peer *p, kvhal_xfer *x, int32_t fi, const void *buf, size_t count,
                       const ucp_request_param_t *prm);
static void frame_prm(send_frame *f, ucp_request_param_t *prm);

/* Posts the frames whose gathering is over (wait: blocks until one is, unless none is out); returns how many were
 * reaped. A frame of a transfer that failed meanwhile is not posted: its buffer goes back and the transfer settles
 * (which may free it). Frames of failed transfers not yet started are skipped. */
static unsigned gather_reap(kvhal_xfer_agent *a, bool wait)
{
    if (!a->gathering) return 0;
    send_frame *done = NULL;
    const bool orphaned = cma_orphaned(a); /* getpid: once a call */
    if (orphaned) { /* a forked child: the parent's workers will never gather these; skipped (failed) here */
        while (a->gathering) {
            send_frame *f = a->gathering;
            a->gathering = f->gnext;
            f->gskip = true;
            f->gnext = done;
            done = f;
        }
        wait = false;
    } else {
        pthread_mutex_lock(&a->cma_mu);
    }
    for (; !orphaned;) {
        for (send_frame **pp = &a->gathering; *pp;) {
            send_frame *f = *pp;
            if (f->gdone) {
                *pp = f->gnext;
                f->gnext = done;
                done = f;
            } else {
                if (f->x->failing) f->gskip = true;
                pp = &f->gnext;
            }
        }
        if (!wait || done || !a->gathering) break;
        pthread_cond_wait(&a->cma_done, &a->cma_mu);
    }
    if (!orphaned) pthread_mutex_unlock(&a->cma_mu);
    if (a->gathering) { /* a send whose frames our workers still gather or stage is not stalled by its peer */
        const uint64_t deadline = deadline_from_now(a);
        for (send_frame *f = a->gathering; f; f = f->gnext) f->x->deadline_ns = deadline;
    }
    unsigned n = 0;
    while (done) {
        send_frame *f = done;
        done = f->gnext;
        kvhal_xfer *x = f->x;
        f->gathering = false;
        x->sends_inflight--;
        n++;
        const bool staged = f->stage_src != NULL;
        if (staged) { /* staged (or skipped): the page list is done with */
            a->staging_out -= f->bytes;
            free(f->stage_src);
            f->stage_src = NULL;
        }
        kvhal_xfer_peer *p = x->peer;
        if (orphaned || f->gskip || x->failing || !p || p->state != P_CONNECTED) {
            frame_unbounce(a, f);
            if (x->failing) xfer_settle(x);
            else if (orphaned) /* not "peer gone": the peer is the parent's, which still sends this frame */
                xfer_finish(x, KVHAL_PEER_FAILED, "frame %d: the process forked while the frame was being %s",
                            (int)(f - x->frames), staged ? "staged" : "gathered"); /* settles: may free x */
            else xfer_finish(x, KVHAL_PEER_FAILED, "peer gone"); /* settles: may free x */
            continue;
        }
        if (f->gstatus != KVHAL_OK) {
            xfer_finish(x, f->gstatus, "src_pages: copying frame %d to host memory failed: %s", (int)(f - x->frames),
                        f->gwhy); /* settles: may free x */
            continue;
        }
        ucp_request_param_t prm;
        frame_prm(f, &prm);
        size_t count;
        const void *buf = frame_buffer(f->iov, f->iov_count, f->bounce ? f->bounce : f->staging, f->bytes, &prm, &count);
        post_frame(p, x, (int32_t)(f - x->frames), buf, count, &prm); /* may fail x */
    }
    return n;
}

/* Receiver (recv_frame_done), a device cache's frame whose data is in: a copy worker copies its staging to the
 * device, so that pump goes on receiving; the frame stays in flight in its transfer (which cannot settle) until
 * rstage_reap. false: no workers, the caller copies it. */
static bool rstage_submit(kvhal_xfer_agent *a, recv_frame *f)
{
    if (!cma_pool_start(a)) return false;
    f->rdone = f->rskip = false;
    f->rstatus = KVHAL_OK;
    f->rwhy[0] = '\0';
    f->task = (cma_piece){.rf = f};
    f->next = a->rstaging;
    a->rstaging = f;
    a->rstaging_out += f->bytes;
    cma_enqueue(a, &f->task, 1);
    return true;
}

/* Completes the received frames whose copy to the device is over (wait: blocks until one is, unless none is out);
 * returns how many. Copies of transfers that failed meanwhile and not started yet are skipped. */
static unsigned rstage_reap(kvhal_xfer_agent *a, bool wait)
{
    if (!a->rstaging) return 0;
    recv_frame *done = NULL;
    const bool orphaned = cma_orphaned(a); /* getpid: once a call */
    if (orphaned) { /* a forked child: the parent's workers will never copy these; they fail here */
        while (a->rstaging) {
            recv_frame *f = a->rstaging;
            a->rstaging = f->next;
            f->rstatus = KVHAL_PEER_FAILED;
            snprintf(f->rwhy, sizeof f->rwhy, "the process forked while the frame was being copied");
            f->next = done;
            done = f;
        }
        wait = false;
    } else {
        pthread_mutex_lock(&a->cma_mu);
    }
    for (; !orphaned;) {
        for (recv_frame **pp = &a->rstaging; *pp;) {
            recv_frame *f = *pp;
            if (f->rdone) {
                *pp = f->next;
                f->next = done;
                done = f;
            } else {
                if (f->x->failing) f->rskip = true;
                pp = &f->next;
            }
        }
        if (!wait || done || !a->rstaging) break;
        pthread_cond_wait(&a->cma_done, &a->cma_mu);
    }
    if (!orphaned) pthread_mutex_unlock(&a->cma_mu);
    if (a->rstaging) { /* a receive whose frames our workers still copy is not stalled by its peer */
        const uint64_t deadline = deadline_from_now(a);
        for (recv_frame *f = a->rstaging; f; f = f->next) f->x->deadline_ns = deadline;
    }
    unsigned n = 0;
    while (done) { /* the workers are done with these: pump's alone now */
        recv_frame *f = done;
        done = f->next;
        a->rstaging_out -= f->bytes;
        char why[XW_REASON_LEN];
        if (f->rstatus == KVHAL_CANCELED && !f->rwhy[0])
            snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)f->x->request_id);
        else
            memcpy(why, f->rwhy, sizeof why);
        /* a forked child does not acknowledge: the connection is the parent's, whose workers still copy the frame
         * and acknowledge it */
        recv_frame_finish(a, f, f->rstatus, why, !orphaned); /* may free its transfer */
        n++;
    }
    return n;
}

/* A peer going away (kvhal_xfer_disconnect): its jobs still with the workers forget it (they read its process by
 * pid, and complete without an acknowledgement); what is not started yet is skipped. */
static void cma_jobs_detach(kvhal_xfer_agent *a, const kvhal_xfer_peer *p)
{
    if (!a->cma_running) return;
    /* in a forked child no worker runs, and the mutex may have been taken by one when the process forked: the
     * jobs are this thread's alone (cma_reap fails them) */
    const bool orphaned = cma_orphaned(a);
    if (!orphaned) pthread_mutex_lock(&a->cma_mu);
    for (ipc_job *j = a->cma_running; j; j = j->next)
        if (j->p == p) {
            j->p = NULL;
            j->skip = true;
        }
    if (!orphaned) pthread_mutex_unlock(&a->cma_mu);
}

/* Receiver (from pump): the accepted DATA_IPC frames. Frames that need no device copy are settled first (their
 * transfer no longer received, their peer gone: refused; the CMA kind: to the copy workers, or read here). The
 * frames to copy from an imported cache go out in launch groups: queued frames of one peer become one batched copy
 * of all their (page, layer, K/V) chunks (adjacent ones merged) on a free stream, and pump acknowledges each frame
 * of the group once that stream is done. A group is full at IPC_GROUP_FULL ranges (a frame of 24 or more pages of
 * a 4-layer cache fills one alone; frames are added whole, up to IPC_GROUP_RANGES): a full group takes the next
 * free stream, so large copies overlap on up to IPC_STREAMS streams, and when every stream is busy pump waits for
 * the oldest copy (it ends within a copy's time). A group not full goes at once only when no other copy runs, else
 * it waits, gathering the frames that arrive meanwhile, until it fills or the running copy ends: a lone frame on an
 * idle receiver is copied at once, and under load the copies of many small transfers share one launch, whose cost
 * on the host is of the order of a 256 KiB transfer's copy over NVLink. Measured on 2 x H200 (session 12,
 * kvhal-xfer cuda:0 -> cuda:1 against cudaMemcpyPeer): with 16 transfers in flight 0.23 -> 0.56 at 256 KiB,
 * 0.40 -> 0.85 at 1 MiB, 0.71 -> 1.00 at 4 MiB against a launch per frame; waiting for the oldest copy rather than
 * going round pump when every stream is busy: 0.94 -> 1.25 at 16 MiB with 64 in flight. */
#define IPC_GROUP_FULL 192     /* ranges of a full launch group: two launches of the CUDA/HIP batched copy */
#define IPC_SMALL_GROUPS 1     /* launch groups running beyond which a group not full waits */
#define IPC_GROUP_RANGES 4096  /* ranges of a launch group at most, unless its first frame alone has more */
/* KVHAL_XFER_IPC_CHAIN_KIB (see ipc_chain_slot): a group not full whose copy is shorter than the launch and the
 * detection of its end (a few us each) gains from going at once behind the running one; a larger one gains from
 * gathering the frames that land meanwhile into one launch. Measured with ABBA rounds on 2 x H100 (session 15,
 * cuda:0 -> cuda:1, 4-layer pages of 256 KiB; ratio to cudaMemcpyPeer, no chaining -> chaining): offers of 256 KiB
 * with 4 in flight 0.33 -> 0.39 and 0.31 -> 0.38, with 16 in flight 0.56 -> 0.64 and 0.54 -> 0.63 (two calls of
 * 10 rounds; bounded at 512 KiB 0.35 and 0.61); chaining groups of any size moved larger batches by -12% to +14%
 * either way, as much as rounds of one setting differ, and 64 offers of 256 KiB in flight 1.23 -> 1.01 in one call
 * (0.94 -> 0.93 in the other). So only groups of at most 512 KiB are chained by default; 13 rounds on a quieter
 * machine, none -> this bound: 256 KiB offers 0.37 -> 0.45 (4 in flight), 0.75 -> 0.81 (16), 1.42 -> 1.44 (64),
 * grants 0.31 -> 0.34, 0.77 -> 0.73, 1.22 -> 1.22, larger batches unchanged. */
#define IPC_CHAIN_KIB 512

static bool ipc_job_needs_stream(const ipc_job *j)
{
    return !j->x->failing && j->p->state == P_CONNECTED && j->p->ipc_buf && !j->p->cma;
}

/* Settles a frame that needs no stream (see above). */
static void ipc_job_settle(kvhal_xfer_agent *a, ipc_job *j)
{
    kvhal_xfer *x = j->x;
    kvhal_xfer_peer *p = j->p;
    if (x->failing) {
        char why[XW_REASON_LEN];
        snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)x->request_id);
        ipc_job_complete(a, j, KVHAL_CANCELED, why);
    } else if (p->state != P_CONNECTED || (!p->ipc_buf && !p->cma)) {
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, "peer gone");
    } else if (!cma_submit(a, j)) {
        cma_copy(a, j); /* no workers: copied here, now */
    }
}

static int ipc_free_stream(kvhal_xfer_agent *a)
{
    for (int k = 0; k < IPC_STREAMS; k++)
        if (!a->ipc_stream_groups[k] &&
            (a->ipc_streams[k] || kvhal_stream_create(kvhal_buffer_device(a->cache_buf), &a->ipc_streams[k]) == KVHAL_OK))
            return k;
    return -1;
}

/* Appends a frame's chunks to the group's ranges (merging adjacent ones); false, with nothing appended, when that
 * would pass cap ranges. */
static bool ipc_job_ranges(const kvhal_xfer_agent *a, const ipc_job *j, size_t *dof, size_t *sof, size_t *len,
                           size_t *count, size_t cap)
{
    const kvhal_xfer_peer *p = j->p;
    const uint64_t cb = a->g.chunk_bytes;
    size_t c = *count;
    for (int32_t i = 0; i < j->n; i++)
        for (int32_t l = j->l0; l < j->l0 + j->nl; l++)
            for (int sd = 0; sd < 2; sd++) {
                const size_t so = (size_t)(p->ipc_off[2 * l + sd] + (uint64_t)j->pairs[2 * i] * p->ipc_stride);
                const size_t d = chunk_off(a, l, sd, j->pairs[2 * i + 1]);
                if (c && sof[c - 1] + len[c - 1] == so && dof[c - 1] + len[c - 1] == d && c > *count) {
                    len[c - 1] += cb;
                } else {
                    if (c == cap) return false;
                    sof[c] = so;
                    dof[c] = d;
                    len[c] = cb;
                    c++;
                }
            }
    *count = c;
    return true;
}

/* The first peer in the queue whose queued frames hold IPC_GROUP_FULL chunks, or NULL. */
static kvhal_xfer_peer *ipc_full_peer(const kvhal_xfer_agent *a)
{
    for (const ipc_job *j = a->ipc_jobs; j; j = j->next)
        if (j->p->ipc_queued >= IPC_GROUP_FULL) return j->p;
    return NULL;
}

/* Takes j, which follows prev (NULL: j is the head), off the queue of accepted frames. */
static void ipc_jobs_unlink(kvhal_xfer_agent *a, ipc_job *prev, ipc_job *j)
{
    *(prev ? &prev->next : &a->ipc_jobs) = j->next;
    if (a->ipc_jobs_tail == j) a->ipc_jobs_tail = prev;
    j->p->ipc_queued -= ipc_job_chunks(j);
    j->next = NULL;
}

/* Where a group not full may go while another runs: behind the one running, on its stream, when that is the only
 * group running, alone on its stream, and the head's peer's waiting chunks hold at most a->ipc_chain bytes. The end of the running group
 * is marked first with its stream's event, so that it is acknowledged when it is done and not when the group behind
 * it is. -1: the group waits (no chaining, the load is not light, or the event cannot be made or recorded). */
static int ipc_chain_slot(kvhal_xfer_agent *a)
{
    ipc_job *r = a->ipc_running;
    if (!a->ipc_chain || a->ipc_groups_running != 1 || !r ||
        (uint64_t)a->ipc_jobs->p->ipc_queued * a->g.chunk_bytes > a->ipc_chain)
        return -1;
    const int slot = r->slot;
    if (a->ipc_stream_groups[slot] != 1) return -1;
    if (!a->ipc_events[slot] && kvhal_event_create(kvhal_buffer_device(a->cache_buf), &a->ipc_events[slot]) != KVHAL_OK)
        return -1;
    if (kvhal_event_record(a->ipc_events[slot], a->ipc_streams[slot]) != KVHAL_OK) return -1;
    for (ipc_job *j = r; j && j->launch == r->launch; j = j->next) j->marked = true;
    return slot;
}

static void ipc_jobs_launch(kvhal_xfer_agent *a)
{
    for (;;) {
        for (ipc_job **pp = &a->ipc_jobs, *prev = NULL; *pp;) { /* first, the frames that need no stream */
            ipc_job *j = *pp;
            if (ipc_job_needs_stream(j)) {
                prev = j;
                pp = &j->next;
                continue;
            }
            ipc_jobs_unlink(a, prev, j);
            ipc_job_settle(a, j);
        }
        if (!a->ipc_jobs) return;
        /* the group: a peer's queued frames, in order, until they hold IPC_GROUP_FULL ranges (its first frame
         * always goes, however many it has): the first peer in the queue whose frames fill a group; none full, the
         * head's peer, unless another group runs (see above) */
        kvhal_xfer_peer *p = ipc_full_peer(a);
        int slot = -1;
        if (!p) {
            if (a->ipc_groups_running >= IPC_SMALL_GROUPS) {
                slot = ipc_chain_slot(a);
                if (slot < 0) return;
            }
            p = a->ipc_jobs->p;
        }
        if (slot < 0) slot = ipc_free_stream(a);
        if (slot < 0) {
            if (a->ipc_running) {
                if (!ipc_job_reap(a, true)) return;
                continue;
            }
            ipc_job *j = a->ipc_jobs; /* no stream can be made at all: the frames fail */
            ipc_jobs_unlink(a, NULL, j);
            char why[XW_REASON_LEN];
            snprintf(why, sizeof why, "no stream for the copy: %s", kvhal_last_error());
            ipc_job_complete(a, j, KVHAL_BACKEND_ERROR, why);
            continue;
        }
        const ipc_job *first = a->ipc_jobs;
        while (first->p != p) first = first->next;
        const size_t head = ipc_job_chunks(first);
        const size_t cap = head > IPC_GROUP_RANGES ? head : IPC_GROUP_RANGES;
        size_t *dof = malloc(cap * sizeof *dof), *sof = malloc(cap * sizeof *sof), *len = malloc(cap * sizeof *len);
        const bool mem = dof && sof && len;
        ipc_job *group = NULL, **gtail = &group;
        size_t c = 0;
        for (ipc_job **pp = &a->ipc_jobs, *prev = NULL; *pp && c < IPC_GROUP_FULL;) {
            ipc_job *j = *pp;
            if (j->p != p) {
                prev = j;
                pp = &j->next;
                continue;
            }
            if (mem && !ipc_job_ranges(a, j, dof, sof, len, &c, cap)) break; /* the next group's */
            ipc_jobs_unlink(a, prev, j);
            *gtail = j;
            gtail = &j->next;
            if (!mem) break; /* the head alone, to fail */
        }
        kvhal_status st = KVHAL_OUT_OF_MEMORY;
        char why[XW_REASON_LEN] = "receiver out of host memory";
        if (mem) {
            st = kvhal_memcpy_d2d_batch(a->cache_buf, p->ipc_buf, dof, sof, len, (int32_t)c, a->ipc_streams[slot]);
            if (st != KVHAL_OK) snprintf(why, sizeof why, "device copy failed: %s", kvhal_last_error());
        }
        free(dof);
        free(sof);
        free(len);
        if (st != KVHAL_OK) {
            /* a batch cut in several launches may have started some: they finish before the pages go back */
            if (mem) kvhal_stream_synchronize(a->ipc_streams[slot]);
            while (group) {
                ipc_job *j = group;
                group = j->next;
                ipc_job_complete(a, j, st, why);
            }
            continue;
        }
        const uint64_t launch = ++a->ipc_launches;
        a->ipc_groups_running++;
        a->ipc_stream_groups[slot]++;
        ipc_job **tail = &a->ipc_running;
        while (*tail) tail = &(*tail)->next;
        *tail = group;
        for (ipc_job *j = group; j; j = j->next) {
            j->slot = slot;
            j->launch = launch;
        }
    }
}

/* In a process forked from the agent's: the copies queued or on the parent's streams fail here, unacknowledged
 * (the connection is the parent's, which copies and acknowledges them itself), and their pages go back. */
static void ipc_jobs_forget_forked(kvhal_xfer_agent *a)
{
    static const char why[] = "the process forked while the frame was being copied";
    while (a->ipc_running) {
        ipc_job *j = a->ipc_running;
        a->ipc_running = j->next;
        j->p = NULL;
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, why);
    }
    while (a->ipc_jobs) {
        ipc_job *j = a->ipc_jobs;
        ipc_jobs_unlink(a, NULL, j);
        j->p = NULL;
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, why);
    }
    a->ipc_groups_running = 0;
    memset(a->ipc_stream_groups, 0, sizeof a->ipc_stream_groups);
}

/* Launches the accepted frames, completes the copies that are over; returns how many groups (and CMA frames)
 * completed. A transfer whose frames wait or are being copied here is not stalled: its deadline moves on. */
static unsigned ipc_jobs_run(kvhal_xfer_agent *a)
{
    unsigned n = cma_reap(a, false);
    if (!a->ipc_jobs && !a->ipc_running) return n;
    if (a->pid != getpid()) {
        ipc_jobs_forget_forked(a);
        return n;
    }
    while (ipc_job_reap(a, false)) n++; /* first: their streams take the frames waiting */
    ipc_jobs_launch(a);
    const uint64_t deadline = deadline_from_now(a);
    for (ipc_job *j = a->ipc_jobs; j; j = j->next) j->x->deadline_ns = deadline;
    for (ipc_job *j = a->ipc_running; j; j = j->next) j->x->deadline_ns = deadline;
    return n;
}

/* Waits for every running copy (they read a peer's imported memory or process and write our pages) and completes
 * them. */
static void ipc_jobs_drain(kvhal_xfer_agent *a)
{
    while (ipc_job_reap(a, true)) {
    }
    cma_jobs_drain(a);
}

static void peer_ipc_free(kvhal_xfer_peer *p)
{
    offers_free(p);
    if (p->ipc_buf) kvhal_buffer_destroy(p->ipc_buf);
    p->ipc_buf = NULL;
    p->cma = false;
    free(p->ipc_off);
    p->ipc_off = NULL;
    free(p->map_frame);
    p->map_frame = NULL;
}

static void on_grant(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
                     const void *data, size_t length, bool rndv)
{
    xw_grant g;
    if (header_length != sizeof g || rndv) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed GRANT frame (%zu header bytes)", header_length);
        return;
    }
    memcpy(&g, header, sizeof g);
    if (g.n_pages < 1 || g.n_pages > XW_MAX_GRANT || length != (size_t)g.n_pages * sizeof(int32_t)) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed GRANT frame: %d pages in %zu bytes", (int)g.n_pages, length);
        return;
    }
    int32_t *pages = malloc(length);
    if (!pages) {
        a->events_dropped++;
        return;
    }
    memcpy(pages, data, length);
    for (int32_t i = 0; i < g.n_pages; i++)
        if (pages[i] < 0 || pages[i] >= p->g.num_blocks) {
            peer_fail(p, KVHAL_PEER_FAILED, true, "GRANT for request %llu names page %d, outside the peer's [0, %lld)",
                      (unsigned long long)g.request_id, (int)pages[i], (long long)p->g.num_blocks);
            free(pages);
            return;
        }
    for (const kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->offer && x->peer == p && x->request_id == g.request_id && !x->finished) {
            free(pages); /* offered: the receiver takes the pages itself (the grant crossed the offer) */
            return;
        }
    push_event(a, KVHAL_XFER_EVENT_GRANT, p, NULL, g.request_id, KVHAL_OK, pages, g.n_pages,
               "peer %s granted %d pages for request %llu", p->name, (int)g.n_pages, (unsigned long long)g.request_id);
}

static void on_hello_ack(kvhal_xfer_agent *a, const void *header, size_t header_length, uint64_t dest,
                         uint16_t version)
{
    xw_hello_ack k;
    kvhal_xfer_peer *p = NULL;
    for (kvhal_xfer_peer *q = a->peers; q; q = q->next)
        if (q->my_session == dest && q->state == P_CONNECTING) p = q;
    if (!p) return; /* not for a connect in progress: ignore */
    if (version != XW_VERSION) { /* its reason (a refusal's) is where ours is, whatever the version */
        char why[XW_REASON_LEN] = "";
        const size_t ro = offsetof(xw_hello_ack, reason);
        if (header_length >= ro + XW_REASON_LEN) {
            memcpy(why, (const uint8_t *)header + ro, XW_REASON_LEN);
            why[XW_REASON_LEN - 1] = '\0';
            for (char *q = why; *q; q++)
                if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e) *q = '?';
        }
        peer_fail(p, KVHAL_PEER_FAILED, false, "speaks wire version %u, this agent %u: not compatible%s%s",
                  (unsigned)version, (unsigned)XW_VERSION, why[0] ? "; it said: " : "", why);
        return;
    }
    if (header_length != sizeof k) {
        peer_fail(p, KVHAL_PEER_FAILED, false, "malformed HELLO_ACK (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    k.name[sizeof k.name - 1] = '\0';
    copy_name(p->name, sizeof p->name, k.name);
    if (k.status != 0) {
        peer_fail(p, KVHAL_PEER_FAILED, false, "refused the connection: %s", k.reason);
        return;
    }
    if (k.src_session == 0 || k.g.num_blocks < 1) {
        peer_fail(p, KVHAL_PEER_FAILED, false, "malformed HELLO_ACK (session 0 or no pages)");
        return;
    }
    p->their_session = k.src_session;
    p->g = k.g;
    p->state = P_CONNECTED;
    k.host[sizeof k.host - 1] = '\0';
    p->same_host = a->host_id[0] && strcmp(k.host, a->host_id) == 0;
    offer_ipc(a, p);
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status);

/* An endpoint that reports peer failure where the transports can (tcp); shared-memory transports of UCX 1.13 have
 * no peer-failure handling, so there the endpoint goes without it and the agent's timeouts alone detect a dead or
 * stalled peer. */
static ucs_status_t ep_create(kvhal_xfer_agent *a, ucp_ep_params_t *prm, ucp_ep_h *ep)
{
    ucs_status_t us = UCS_ERR_UNREACHABLE;
    if (!a->no_peer_errors) us = ucp_ep_create(a->worker, prm, ep);
    if (us == UCS_ERR_UNREACHABLE && (prm->field_mask & UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE)) {
        ucp_ep_params_t q = *prm;
        q.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        us = ucp_ep_create(a->worker, &q, ep);
        if (us == UCS_OK) a->no_peer_errors = true; /* the transports cannot: do not ask (and log) again */
    }
    return us;
}

static bool same_geometry(const xw_geometry *x, const xw_geometry *y)
{
    return x->num_layers == y->num_layers && x->num_heads == y->num_heads && x->head_dim == y->head_dim &&
           x->block_size == y->block_size && x->dtype == y->dtype && x->layout == y->layout &&
           x->chunk_bytes == y->chunk_bytes;
}

/* A HELLO (from pump): token, bounds, geometry; then an endpoint back to the connector and the answer. */
static void accept_hello(kvhal_xfer_agent *a, pending_hello *ph)
{
    xw_hello *h = &ph->h;
    h->name[sizeof h->name - 1] = '\0';
    char name[XW_NAME_LEN];
    copy_name(name, sizeof name, h->name);
    char reason[XW_REASON_LEN] = "";
    /* constant-time token comparison over the whole field */
    unsigned diff = 0;
    h->token[sizeof h->token - 1] = '\0';
    h->tcp_seg[sizeof h->tcp_seg - 1] = '\0';
    for (char *q = h->tcp_seg; *q; q++)
        if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e) *q = '?';
    for (size_t i = 0; i < XW_TOKEN_LEN; i++) diff |= (unsigned)(uint8_t)(h->token[i] ^ a->token[i]);
    if (ph->version) {
        snprintf(name, sizeof name, "?");
        snprintf(reason, sizeof reason, "wire version %u, this agent speaks %u", (unsigned)ph->version,
                 (unsigned)XW_VERSION);
    } else if (diff) snprintf(reason, sizeof reason, "wrong token");
    else if (!a->cache) snprintf(reason, sizeof reason, "no paged cache registered");
    else if (!same_geometry(&h->g, &a->g))
        snprintf(reason, sizeof reason, "cache geometry differs (layers %d/%d heads %d/%d dim %d/%d block %d/%d "
                 "dtype %d/%d layout %d/%d)", (int)h->g.num_layers, (int)a->g.num_layers, (int)h->g.num_heads,
                 (int)a->g.num_heads, (int)h->g.head_dim, (int)a->g.head_dim, (int)h->g.block_size,
                 (int)a->g.block_size, (int)h->g.dtype, (int)a->g.dtype, (int)h->g.layout, (int)a->g.layout);
    else if (h->g.num_blocks < 1) snprintf(reason, sizeof reason, "the connector's cache has no pages");
    else if (h->tcp_seg[0] && a->tcp_seg[0] && strncmp(h->tcp_seg, a->tcp_seg, XW_SEG_LEN) != 0)
        snprintf(reason, sizeof reason, "UCX TCP receive segments differ (%.15s here, %.15s there; "
                 "UCX_TCP_RX_SEG_SIZE): UCX cannot mix them", a->tcp_seg, h->tcp_seg);
    else if (a->live_peers >= a->max_peers) snprintf(reason, sizeof reason, "too many peers (%d)", (int)a->max_peers);
    else if (h->src_session == 0) snprintf(reason, sizeof reason, "session 0");

    if (ph->version || diff) {
        /* Not authenticated (another wire version cannot be checked either): no endpoint to the address it carries
         * and no answer, so an unknown peer cannot make this agent connect out to an address of its choosing. The
         * connector sees its connect time out; the reason is this side's event. */
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from %s refused without an answer: %s", name, reason);
        return;
    }
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = (const ucp_address_t *)ph->addr};
    kvhal_xfer_peer *p = NULL;
    if (!reason[0]) {
        p = calloc(1, sizeof *p);
        if (!p) snprintf(reason, sizeof reason, "out of memory");
    }
    /* the same error handling as every other endpoint (UCX refuses asymmetric ones), also for a refusal's */
    ep_params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = ep_error_cb;
    ep_params.err_handler.arg = p; /* NULL for a refusal: nothing to report */
    ucp_ep_h ep = NULL;
    ucs_status_t us = ep_create(a, &ep_params, &ep);
    if (us != UCS_OK) {
        free(p);
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from %s: cannot reach it back: %s", name, ucs_status_string(us));
        return;
    }
    xw_hello_ack k;
    memset(&k, 0, sizeof k);
    k.c = (xw_common){XW_MAGIC, XW_VERSION, XW_HELLO_ACK, h->src_session};
    copy_name(k.name, sizeof k.name, a->name);
    k.g = a->g;
    memcpy(k.host, a->host_id, sizeof k.host);
    memcpy(k.tcp_seg, a->tcp_seg, sizeof k.tcp_seg);
    if (reason[0]) {
        k.status = KVHAL_PEER_FAILED;
        copy_name(k.reason, sizeof k.reason, reason);
        queue_msg(a, NULL, ep, &k, sizeof k, NULL, 0, true);
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from %s refused: %s", name, reason);
        return;
    }
    p->magic = PEER_MAGIC;
    p->agent = a;
    p->ep = ep;
    p->state = P_CONNECTED;
    p->accepted_side = true;
    p->my_session = random_session();
    p->their_session = h->src_session;
    p->g = h->g;
    memcpy(p->name, name, sizeof name);
    p->next = a->peers;
    a->peers = p;
    a->live_peers++;
    k.src_session = p->my_session;
    queue_msg(a, p, NULL, &k, sizeof k, NULL, 0, false);
    h->host[sizeof h->host - 1] = '\0';
    p->same_host = a->host_id[0] && strcmp(h->host, a->host_id) == 0;
    offer_ipc(a, p);
    push_event(a, KVHAL_XFER_EVENT_PEER_CONNECTED, p, NULL, 0, KVHAL_OK, NULL, 0, "peer %s connected", name);
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    kvhal_xfer_peer *p = arg;
    if (!p) return;
    p->ep_error = true; /* handled in pump */
    p->ep_status = status;
}

/* Keeps a HELLO for pump (accept_hello): hlen bytes of its header (the rest zero), the connector's address (its
 * data), and its wire version when it is not ours (0: ours). Out of memory: dropped, the connector times out. */
static void queue_hello(kvhal_xfer_agent *a, const void *header, size_t hlen, const void *data, size_t length,
                        uint16_t version)
{
    pending_hello *ph = calloc(1, sizeof *ph);
    void *addr = malloc(length);
    if (!ph || !addr) {
        free(ph);
        free(addr);
        return;
    }
    memcpy(&ph->h, header, hlen);
    ph->h.addr_len = (uint32_t)length;
    memcpy(addr, data, length);
    ph->version = version;
    ph->addr = addr;
    ph->next = a->hellos;
    a->hellos = ph;
}

static ucs_status_t am_handler(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    kvhal_xfer_agent *a = arg;
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    xw_common c;
    if (header_length < sizeof c) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK; /* nobody to blame: dropped */
    memcpy(&c, header, sizeof c);
    if (c.magic != XW_MAGIC) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    if (c.version != XW_VERSION) { /* a connection attempt or its answer gets a clear error; the rest is dropped */
        if (c.type == XW_HELLO && !rndv && length > 0 && length <= XW_MAX_ADDR &&
            header_length >= offsetof(xw_hello, name)) {
            /* the common header and src_session sit at the same offsets in every version; the rest may not */
            queue_hello(a, header, offsetof(xw_hello, name), data, length, c.version ? c.version : UINT16_MAX);
        } else if (c.type == XW_HELLO && !rndv) {
            push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                       "malformed HELLO of wire version %u (this agent speaks %u)", (unsigned)c.version,
                       (unsigned)XW_VERSION);
        } else if (c.type == XW_HELLO_ACK && !rndv) {
            on_hello_ack(a, header, header_length, c.dest_session, c.version);
        }
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (c.type == XW_HELLO) {
        xw_hello h;
        if (header_length != sizeof h || rndv) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
        memcpy(&h, header, sizeof h);
        if (h.addr_len == 0 || h.addr_len > XW_MAX_ADDR || h.addr_len != length) {
            push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                       "malformed HELLO: address of %u bytes with %zu data bytes", (unsigned)h.addr_len, length);
            return UCS_OK;
        }
        queue_hello(a, &h, sizeof h, data, length, 0);
        return UCS_OK;
    }
    if (c.type == XW_HELLO_ACK) {
        if (!rndv) on_hello_ack(a, header, header_length, c.dest_session, c.version);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    kvhal_xfer_peer *p = find_session(a, c.dest_session);
    if (!p || p->state != P_CONNECTED) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK; /* unknown session: dropped */
    switch (c.type) {
    case XW_DATA: { /* an eager frame's handler must return OK: UCX takes an error only for rendezvous */
        ucs_status_t r = on_data(a, p, header, header_length, data, length, param);
        return rndv ? r : UCS_OK;
    }
    case XW_GRANT: on_grant(a, p, header, header_length, data, length, rndv); break;
    case XW_ACK:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "ACK frame with rendezvous data");
        else on_ack(a, p, header, header_length);
        break;
    case XW_BYE: peer_fail(p, KVHAL_PEER_FAILED, false, "closed the connection"); break;
    case XW_IPC_MAP: /* kept for pump, which imports it */
        if (rndv || header_length != sizeof(xw_ipc_map) || length > XW_IPC_BLOB_MAX + 2u * 65536u * 8u ||
            p->map_frame || p->ipc_buf || p->cma) {
            peer_fail(p, KVHAL_PEER_FAILED, true, "malformed or repeated IPC_MAP frame");
        } else if ((p->map_frame = malloc(header_length + length)) != NULL) {
            memcpy(p->map_frame, header, header_length);
            if (length) memcpy((uint8_t *)p->map_frame + header_length, data, length);
            p->map_len = header_length + length;
        }
        break;
    case XW_IPC_MAP_ACK:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "IPC_MAP_ACK frame with rendezvous data");
        else on_ipc_map_ack(p, header, header_length);
        break;
    case XW_DATA_IPC: on_data_ipc(a, p, header, header_length, data, length, rndv); break;
    case XW_OFFER: on_offer(a, p, header, header_length, data, length, rndv); break;
    case XW_WITHDRAW: on_withdraw(a, p, header, header_length); break;
    default: peer_fail(p, KVHAL_PEER_FAILED, true, "unknown frame type %u", (unsigned)c.type); break;
    }
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* progress                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */
/* Returns how much UCX progressed (0: nothing moved; the caller may back off). */
static void post_pending(kvhal_xfer_agent *a);

static unsigned pump(kvhal_xfer_agent *a)
{
    unsigned work = 0;
    for (int i = 0; i < 64; i++) {
        const unsigned n = ucp_worker_progress(a->worker);
        if (!n) break;
        work += n;
    }
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->map_frame && p->state == P_CONNECTED) process_ipc_map(a, p);
    /* copies completed, and copies still with the workers or on the device, count as work: the loops do not nap
     * (20 us, which the kernel's timer slack makes ~70) while frames land, and see a copy's end at once (a device
     * copy's end frees a stream for the frames waiting, and a nap there left the streams idle: 2 x H200, session 12) */
    work += ipc_jobs_run(a) + (a->cma_running != NULL) + (a->ipc_running != NULL);
    work += gather_reap(a, false) + (a->gathering != NULL); /* gathered frames posted (before post_pending) */
    work += rstage_reap(a, false) + (a->rstaging != NULL); /* received frames copied to the device, acknowledged */
    while (a->hellos) {
        pending_hello *ph = a->hellos;
        a->hellos = ph->next;
        accept_hello(a, ph);
        free(ph->addr);
        free(ph);
    }
    for (recv_frame **pp = &a->rframes; *pp;) {
        recv_frame *f = *pp;
        if (f->done) {
            *pp = f->next;
            recv_frame_done(a, f);
        } else {
            pp = &f->next;
        }
    }
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->ep_error && p->state != P_FAILED) {
            peer_fail(p, KVHAL_PEER_FAILED, false, "unreachable: %s", ucs_status_string(p->ep_status));
        }
    flush_msgs(a);
    post_pending(a);
    const uint64_t now = now_ns();
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state == P_CONNECTED && p->offers) offers_expire(a, p, now);
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state == P_CONNECTING && now > p->deadline_ns)
            peer_fail(p, KVHAL_TIMEOUT, false,
                      "no answer to the connection within %u ms (unreachable, or the receiver refused it without an "
                      "answer: a wrong token or another wire version; its PEER_REJECTED event says which)",
                      (unsigned)a->timeout_ms);
again: /* failing one transfer may free others (released ones of the same peer): start over after each */
    for (kvhal_xfer *x = a->xfers; x; x = x->next) {
        if (x->offer && x->withdrawn && x->failing && !x->finished && !x->abandoned && now > x->deadline_ns) {
            x->abandoned = true; /* withdrawn, and the peer did not answer every frame: settled regardless */
            snprintf(x->message + strlen(x->message), sizeof x->message - strlen(x->message),
                     " (peer %s did not confirm the withdrawal within %u ms)", x->peer ? x->peer->name : "?",
                     (unsigned)a->timeout_ms);
            xfer_settle(x); /* may free x */
            goto again;
        }
        if (x->failing || x->finished || now <= x->deadline_ns) continue;
        if (x->offer) { /* not taken, or taken and not acknowledged, within the timeout: withdrawn, the peer stays */
            xfer_finish(x, KVHAL_TIMEOUT, "request %llu: peer %s did not take the offer within %u ms",
                        (unsigned long long)x->request_id, x->peer ? x->peer->name : "?", (unsigned)a->timeout_ms);
            goto again;
        }
        if (x->is_recv && x->inflight == 0) {
            xfer_finish(x, KVHAL_TIMEOUT, "request %llu: no data from peer %s within %u ms",
                        (unsigned long long)x->request_id, x->peer ? x->peer->name : "?", (unsigned)a->timeout_ms);
            goto again;
        }
        if (x->peer) { /* a stalled peer holds our buffers: drop it, which releases them */
            peer_fail(x->peer, KVHAL_TIMEOUT, false, "stalled: request %llu made no progress within %u ms",
                      (unsigned long long)x->request_id, (unsigned)a->timeout_ms);
            goto again;
        }
        x->deadline_ns = UINT64_MAX; /* no peer left to blame: it settles when UCX lets go */
    }
    for (closing_ep **pp = &a->closing; *pp;) {
        closing_ep *c = *pp;
        if (ucp_request_check_status(c->req) != UCS_INPROGRESS) {
            ucp_request_free(c->req);
            *pp = c->next;
            free(c);
        } else {
            pp = &c->next;
        }
    }
    return work;
}

/* Waiting in the progress loops. A side that naps while a transfer moves stalls the shared-memory FIFO or the
 * socket its peer waits on (the FIFO holds about 64 us of data), so rounds in which UCX did something (work: what
 * pump returned) reset the idle count, and only 2000 idle rounds in a row lead to 20 us naps. Every 64th round
 * yields the CPU: free on an idle core, and on a busy host it lets the peer process (or anyone) run instead of
 * this loop's spinning. */
typedef struct idle_state {
    unsigned idle, rounds;
} idle_state;

static void idle_wait(idle_state *w, unsigned work)
{
    if (work) w->idle = 0;
    else if (++w->idle >= 2000) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        return;
    }
    if ((++w->rounds & 63) == 0) sched_yield();
}

/* ---------------------------------------------------------------------------------------------------------- */
/* API                                                                                                         */
/* ---------------------------------------------------------------------------------------------------------- */
static kvhal_status check_agent(const kvhal_xfer_agent *a)
{
    CHECK_ARG(a, "agent: NULL");
    if (a->magic != AGENT_MAGIC) return ERR(KVHAL_INVALID_HANDLE, "agent: %p is not a live transfer agent", (void *)a);
    return KVHAL_OK;
}

static kvhal_status check_peer(const kvhal_xfer_peer *p)
{
    CHECK_ARG(p, "peer: NULL");
    if (p->magic != PEER_MAGIC) return ERR(KVHAL_INVALID_HANDLE, "peer: %p is not a live transfer peer", (void *)p);
    if (p->state == P_FAILED) return ERR(p->fail_status, "peer %s: %s", p->name, p->fail_msg);
    return KVHAL_OK;
}

static kvhal_status check_xfer(const kvhal_xfer *x)
{
    CHECK_ARG(x, "xfer: NULL");
    if (x->magic != XFER_MAGIC || x->released)
        return ERR(KVHAL_INVALID_HANDLE, "xfer: %p is not a live transfer", (const void *)x);
    return KVHAL_OK;
}

/* Whether a UCX_TLS-style list lets UCX use CMA (cma, or shm / sm / all, which include it; NULL: UCX's choice):
 * then on one host the peer may read our host cache itself with process_vm_readv (offer_ipc), which is what UCX's
 * CMA transport does, for scattered pages too. "^list" excludes. */
static bool transports_name(const char *t, const char *want)
{
    if (!t) return true;
    const bool exclude = t[0] == '^';
    bool named = false;
    for (const char *q = t + exclude; *q;) {
        const size_t n = strcspn(q, ",");
        if ((n == strlen(want) && !strncmp(q, want, n)) || (n == 3 && !strncmp(q, "all", 3))) named = true;
        q += n + (q[n] == ',');
    }
    return exclude ? !named : named;
}

static bool transports_allow_cma(const char *t)
{
    if (t && t[0] == '^') return transports_name(t, "cma") && transports_name(t, "shm") && transports_name(t, "sm");
    return transports_name(t, "cma") || transports_name(t, "shm") || transports_name(t, "sm");
}

/* An environment variable holding a whole number in [lo, hi]; else def (a value that is not one is ignored). */
static long env_long(const char *name, long lo, long hi, long def)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    errno = 0;
    const long n = strtol(v, &end, 10);
    if (errno || !end || *end || n < lo || n > hi) return def;
    return n;
}

/* The copy workers: KVHAL_XFER_CMA_THREADS (0 .. CMA_THREADS_MAX; 0: pump copies each frame itself, as before
 * session 8), else min(4, online cores / 2); CMA frames are split across them in pieces of at least
 * KVHAL_XFER_CMA_PIECE_KIB KiB (default 512); TCP frames carry at most KVHAL_XFER_GATHER_FRAME_KIB KiB (default
 * 1024, one page at least), and those of KVHAL_XFER_GATHER_KIB KiB and more (default half of the former) of a
 * transfer of several frames are gathered by the workers while pump sends the frames before them (a transfer of one
 * frame, or a small frame, is gathered by pump: there is nothing to overlap, and the hand-over measured slower at
 * 256 KiB-1 MiB). */
static void cma_config(kvhal_xfer_agent *a)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    const long def = cores / 2 < CMA_THREADS_DEFAULT ? cores / 2 : CMA_THREADS_DEFAULT;
    a->cma_threads = (int)env_long("KVHAL_XFER_CMA_THREADS", 0, CMA_THREADS_MAX, def);
    a->cma_piece = (size_t)env_long("KVHAL_XFER_CMA_PIECE_KIB", 1, 1l << 20, CMA_PIECE_BYTES >> 10) << 10;
    a->gather_frame = (size_t)env_long("KVHAL_XFER_GATHER_FRAME_KIB", 1, 1l << 20, GATHER_FRAME_BYTES >> 10) << 10;
    /* half the cut by default: a frame is cut to whole pages, so a full one may fall short of the cut itself */
    a->gather_min = (size_t)env_long("KVHAL_XFER_GATHER_KIB", 0, 1l << 20, (long)(a->gather_frame >> 11)) << 10;
    a->ipc_chain = (uint64_t)env_long("KVHAL_XFER_IPC_CHAIN_KIB", 0, 1l << 30, IPC_CHAIN_KIB) << 10;
}

kvhal_status kvhal_xfer_agent_create(const kvhal_xfer_config *cfg, kvhal_xfer_agent **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    CHECK_ARG(cfg, "cfg: NULL");
    CHECK_ARG(cfg->token && cfg->token[0], "cfg.token: NULL or empty (a peer must present a token)");
    CHECK_ARG(strlen(cfg->token) <= KVHAL_XFER_TOKEN_MAX, "cfg.token: %zu characters, at most %d",
              strlen(cfg->token), KVHAL_XFER_TOKEN_MAX);
    CHECK_ARG(!cfg->name || strlen(cfg->name) <= KVHAL_XFER_NAME_MAX, "cfg.name: longer than %d characters",
              KVHAL_XFER_NAME_MAX);
    CHECK_ARG(cfg->max_peers >= 0 && cfg->max_peers <= 65536, "cfg.max_peers: %d is outside [0, 65536]",
              (int)cfg->max_peers);
    kvhal_xfer_agent *a = calloc(1, sizeof *a);
    if (!a) return ERR(KVHAL_OUT_OF_MEMORY, "transfer agent: cannot allocate it");
    copy_name(a->name, sizeof a->name, cfg->name ? cfg->name : "kvhal");
    memcpy(a->token, cfg->token, strlen(cfg->token));
    a->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 10000;
    a->max_peers = cfg->max_peers ? cfg->max_peers : 64;
    a->pid = getpid();
    a->next_xfer_id = random_session() & 0xffffffffull;
    host_identity(a->host_id, sizeof a->host_id);
    /* shared memory alone (shm, sm, posix, sysv, cma, self): no peer-failure handling in UCX 1.13 (see ep_create) */
    if (cfg->transports && !strstr(cfg->transports, "tcp") && !strstr(cfg->transports, "all") &&
        !strstr(cfg->transports, "ib") && !strstr(cfg->transports, "rc") && !strstr(cfg->transports, "ud") &&
        !strstr(cfg->transports, "dc") && !strstr(cfg->transports, "cuda") && !strstr(cfg->transports, "rocm"))
        a->no_peer_errors = true;

    a->cma_ok = transports_allow_cma(cfg->transports);
    cma_config(a);
    if (getrandom(a->cma_probe, sizeof a->cma_probe, 0) != (ssize_t)sizeof a->cma_probe)
        for (size_t i = 0; i < sizeof a->cma_probe; i++) a->cma_probe[i] = (uint8_t)(random_session() >> 13);

    ucp_config_t *uc = NULL;
    ucs_status_t us = ucp_config_read(NULL, NULL, &uc);
    if (us == UCS_OK && cfg->transports) us = ucp_config_modify(uc, "TLS", cfg->transports);
    /* TCP: 256 KiB receive segments instead of UCX 1.13's 64 KiB, unless the environment sets them: a rendezvous
     * frame then goes in 256 KiB zero-copy fragments (a quarter of the sendmsg calls, of the receiver's handler
     * rounds); measured with UCX_TCP_RX_SEG_SIZE=256k on the 16-core host: 0.64-0.74 -> 0.69-0.87 of
     * ucx_perftest -e (docs/measurements/session7). Only where TCP may be used (else UCX warns of an unused key). */
    if (us == UCS_OK && transports_name(cfg->transports, "tcp")) {
        const char *env = getenv("UCX_TCP_RX_SEG_SIZE");
        if (env) copy_name(a->tcp_seg, sizeof a->tcp_seg, env);
        else if (ucp_config_modify(uc, "RX_SEG_SIZE", "256k") == UCS_OK) copy_name(a->tcp_seg, sizeof a->tcp_seg, "256k");
        else copy_name(a->tcp_seg, sizeof a->tcp_seg, "64k"); /* UCX 1.13's default */
    }
    if (us != UCS_OK) {
        if (uc) ucp_config_release(uc);
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "cfg.transports: UCX refused \"%s\": %s",
                   cfg->transports ? cfg->transports : "(default)", ucs_status_string(us));
    }
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                       .features = UCP_FEATURE_AM, .name = "kvhal-xfer"};
    us = ucp_init(&pp, uc, &a->ctx);
    ucp_config_release(uc);
    if (us != UCS_OK) {
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "transfer agent: UCX could not start (transports %s): %s",
                   cfg->transports ? cfg->transports : "default", ucs_status_string(us));
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    us = ucp_worker_create(a->ctx, &wp, &a->worker);
    if (us == UCS_OK) us = ucp_worker_get_address(a->worker, &a->addr, &a->addr_len);
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    if (us == UCS_OK) us = ucp_worker_query(a->worker, &wa);
    if (us == UCS_OK) {
        a->max_am_header = wa.max_am_header;
        ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                                   UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                     .id = XW_AM_ID, .cb = am_handler, .arg = a};
        us = ucp_worker_set_am_recv_handler(a->worker, &hp);
    }
    if (us != UCS_OK) {
        if (a->addr) ucp_worker_release_address(a->worker, a->addr);
        if (a->worker) ucp_worker_destroy(a->worker);
        ucp_cleanup(a->ctx);
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "transfer agent: UCX worker: %s", ucs_status_string(us));
    }
    if (a->addr_len > XW_MAX_ADDR) {
        const size_t alen = a->addr_len;
        ucp_worker_release_address(a->worker, a->addr);
        ucp_worker_destroy(a->worker);
        ucp_cleanup(a->ctx);
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "transfer agent: UCX worker address of %zu bytes is too large", alen);
    }
    a->magic = AGENT_MAGIC;
    *out = a;
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_agent_destroy(kvhal_xfer_agent *a)
{
    if (!a) return KVHAL_OK;
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state != P_FAILED) peer_fail(p, KVHAL_CANCELED, true, "the agent was destroyed");
    /* let UCX finish or cancel what it holds (bounded: force-closed endpoints complete their requests) */
    const uint64_t until = now_ns() + 2000000000ull;
    pump(a); /* the BYEs */
    while ((a->rframes || a->closing || a->msgs || a->sent || a->ipc_running || a->cma_running || a->gathering ||
            a->rstaging) &&
           now_ns() < until)
        pump(a);
    ipc_jobs_drain(a); /* copies still writing our pages wait here: before the transfers go */
    while (a->gathering) gather_reap(a, true); /* gathers still writing bounce buffers (nothing is posted: failed) */
    while (a->rstaging) rstage_reap(a, true); /* copies still writing our pages */
    cma_pool_stop(a);  /* nothing is queued any more */
    for (kvhal_xfer *x = a->xfers, *nx; x; x = nx) { /* whatever is left: UCX is going away, give pages back */
        nx = x->next;
        if (!x->finished) {
            x->inflight = 0;
            x->sends_inflight = 0;
            if (!x->failing) xfer_finish(x, KVHAL_CANCELED, "the agent was destroyed");
            else xfer_settle(x);
        }
    }
    while (a->xfers) xfer_free(a->xfers);
    while (a->rframes) {
        recv_frame *f = a->rframes;
        a->rframes = f->next;
        free(f->iov);
        stage_release(a, f->stage_mem, f->staging);
        free(f);
    }
    while (a->hellos) {
        pending_hello *ph = a->hellos;
        a->hellos = ph->next;
        free(ph->addr);
        free(ph);
    }
    /* frames never sent or never completed (a peer that stopped progressing): UCX drops their requests with the
     * worker below; their buffers go after it */
    pending_msg *left = a->msgs;
    a->msgs = a->msgs_tail = NULL;
    for (pending_msg *m = a->sent, *nx; m; m = nx) {
        nx = m->next;
        m->next = left;
        left = m;
    }
    a->sent = NULL;
    while (a->closing) {
        closing_ep *c = a->closing;
        a->closing = c->next;
        ucp_request_cancel(a->worker, c->req);
        ucp_request_free(c->req);
        free(c);
    }
    while (a->ipc_jobs) { /* launched by the pumps above; none is left unless UCX delivered one since */
        ipc_job *j = a->ipc_jobs;
        a->ipc_jobs = j->next;
        free(j->pairs);
        free(j->idx);
        free(j);
    }
    a->ipc_jobs_tail = NULL;
    while (a->peers) {
        kvhal_xfer_peer *p = a->peers;
        a->peers = p->next;
        peer_ipc_free(p);
        p->magic = DEAD_MAGIC;
        free(p);
    }
    for (size_t i = 0; i < a->ev_count; i++) free(a->events[(a->ev_head + i) % a->ev_cap].pages_owned);
    free(a->events);
    free(a->last_pages);
    if (a->memh) ucp_mem_unmap(a->ctx, a->memh);
    for (int k = 0; k < IPC_STREAMS; k++) {
        kvhal_stream_destroy(a->ipc_streams[k]);
        kvhal_event_destroy(a->ipc_events[k]);
    }
    free(a->k_off);
    free(a->v_off);
    ucp_worker_release_address(a->worker, a->addr);
    ucp_worker_destroy(a->worker);
    ucp_cleanup(a->ctx);
    while (left) {
        pending_msg *m = left;
        left = m->next;
        free(m->buf);
        free(m->data_owned);
        free(m);
    }
    bounce_pool_free(a);
    stage_pool_free(a);
    a->magic = DEAD_MAGIC;
    free(a);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_register_paged_cache(kvhal_xfer_agent *a, kvhal_paged_cache *cache)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(cache, "cache: NULL");
    CHECK_ARG(!a->cache, "cache: agent %s already has a paged cache registered (one per agent)", a->name);
    kvhal_tensor k0, v0;
    st = kvhal_paged_cache_layer(cache, 0, &k0, &v0);
    if (st != KVHAL_OK) return st;
    xw_geometry g = {0};
    g.num_blocks = k0.shape[0];
    g.block_size = (int32_t)k0.shape[1];
    g.num_heads = (int32_t)k0.shape[2];
    g.head_dim = (int32_t)k0.shape[3];
    g.dtype = (int32_t)k0.dtype;
    g.layout = k0.strides[1] == k0.shape[2] * k0.shape[3] ? KVHAL_LAYOUT_NHD : KVHAL_LAYOUT_HND;
    const size_t es = kvhal_dtype_size(k0.dtype);
    g.chunk_bytes = (uint64_t)k0.shape[1] * (uint64_t)k0.shape[2] * (uint64_t)k0.shape[3] * es;
    int32_t L = 0;
    kvhal_tensor kt, vt;
    while (kvhal_paged_cache_layer(cache, L, &kt, &vt) == KVHAL_OK) L++;
    kvhal_clear_error();
    g.num_layers = L;
    size_t *ko = malloc((size_t)L * sizeof *ko), *vo = malloc((size_t)L * sizeof *vo);
    if (!ko || !vo) {
        free(ko);
        free(vo);
        return ERR(KVHAL_OUT_OF_MEMORY, "cache: cannot allocate %d layer offsets", (int)L);
    }
    for (int32_t l = 0; l < L; l++) {
        kvhal_paged_cache_layer(cache, l, &kt, &vt);
        ko[l] = kt.offset;
        vo[l] = vt.offset;
    }
    kvhal_buffer *buf = k0.buffer;
    const kvhal_device dev = kvhal_buffer_device(buf);
    const bool host = dev.type == KVHAL_DEVICE_CPU;
    if (host) {
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = kvhal_buffer_native(buf), .length = kvhal_buffer_size(buf)};
        ucs_status_t us = ucp_mem_map(a->ctx, &mp, &a->memh);
        if (us != UCS_OK) {
            free(ko);
            free(vo);
            a->memh = NULL;
            return ERR(KVHAL_BACKEND_ERROR, "cache: UCX could not register its %zu bytes: %s",
                       kvhal_buffer_size(buf), ucs_status_string(us));
        }
        a->host_base = kvhal_buffer_native(buf);
    }
    a->cache = cache;
    a->cache_buf = buf;
    a->host = host;
    a->g = g;
    a->k_off = ko;
    a->v_off = vo;
    a->block_stride = (size_t)k0.strides[0] * es;

    /* a shareable cache: its handle for peers on this host (the IPC path), and a stream for our copies from theirs */
    if (kvhal_buffer_is_shareable(buf) &&
        kvhal_buffer_ipc_export(buf, a->ipc_blob, sizeof a->ipc_blob, &a->ipc_blob_len) != KVHAL_OK)
        a->ipc_blob_len = 0;
    kvhal_clear_error();
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_local_address(kvhal_xfer_agent *a, void *blob, size_t cap, size_t *len)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(len, "len: NULL");
    *len = sizeof(xw_blob) + a->addr_len;
    if (cap < *len)
        return ERR(KVHAL_OUT_OF_RANGE, "cap: %zu bytes, the address blob needs %zu", cap, *len);
    CHECK_ARG(blob, "blob: NULL");
    xw_blob b;
    memset(&b, 0, sizeof b);
    b.magic = XW_BLOB_MAGIC;
    b.version = XW_VERSION;
    b.addr_len = (uint32_t)a->addr_len;
    copy_name(b.name, sizeof b.name, a->name);
    memcpy(blob, &b, sizeof b);
    memcpy((uint8_t *)blob + sizeof b, a->addr, a->addr_len);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_connect(kvhal_xfer_agent *a, const void *blob, size_t len, const char *token,
                                kvhal_xfer_peer **out)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    CHECK_ARG(blob, "blob: NULL");
    CHECK_ARG(token, "token: NULL");
    CHECK_ARG(strlen(token) <= KVHAL_XFER_TOKEN_MAX, "token: longer than %d characters", KVHAL_XFER_TOKEN_MAX);
    CHECK_ARG(a->cache, "agent: register a paged cache before connecting");
    xw_blob b;
    CHECK_ARG(len > sizeof b, "len: %zu bytes is too short for an address blob", len);
    memcpy(&b, blob, sizeof b);
    CHECK_ARG(b.magic == XW_BLOB_MAGIC, "blob: not a kvhal transfer address");
    CHECK_ARG(b.version == XW_VERSION, "blob: an address of wire version %u, this agent speaks %u: not compatible",
              (unsigned)b.version, (unsigned)XW_VERSION);
    CHECK_ARG(b.addr_len > 0 && b.addr_len <= XW_MAX_ADDR && len == sizeof b + b.addr_len,
              "len: %zu bytes, the blob says %zu", len, sizeof b + (size_t)b.addr_len);
    CHECK_ARG(a->live_peers < a->max_peers, "agent: already %d peers (cfg.max_peers)", (int)a->max_peers);
    kvhal_xfer_peer *p = calloc(1, sizeof *p);
    void *addr = malloc(b.addr_len);
    if (!p || !addr) {
        free(p);
        free(addr);
        return ERR(KVHAL_OUT_OF_MEMORY, "connect: cannot allocate the peer");
    }
    memcpy(addr, (const uint8_t *)blob + sizeof b, b.addr_len);
    b.name[sizeof b.name - 1] = '\0';
    copy_name(p->name, sizeof p->name, b.name);
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                                 .address = addr, .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                                 .err_handler = {ep_error_cb, p}};
    ucs_status_t us = ep_create(a, &ep_params, &p->ep);
    free(addr);
    if (us != UCS_OK) {
        free(p);
        return ERR(KVHAL_PEER_FAILED, "blob: cannot reach %s: %s", b.name, ucs_status_string(us));
    }
    p->magic = PEER_MAGIC;
    p->agent = a;
    p->state = P_CONNECTING;
    p->my_session = random_session();
    p->deadline_ns = deadline_from_now(a);
    p->next = a->peers;
    a->peers = p;
    a->live_peers++;
    xw_hello h;
    memset(&h, 0, sizeof h);
    h.c = (xw_common){XW_MAGIC, XW_VERSION, XW_HELLO, 0};
    h.src_session = p->my_session;
    copy_name(h.name, sizeof h.name, a->name);
    memcpy(h.token, token, strlen(token));
    h.g = a->g;
    h.addr_len = (uint32_t)a->addr_len;
    memcpy(h.host, a->host_id, sizeof h.host);
    memcpy(h.tcp_seg, a->tcp_seg, sizeof h.tcp_seg);
    queue_msg(a, p, p->ep, &h, sizeof h, a->addr, a->addr_len, false);
    idle_state spins = {0, 0};
    /* and, on the same host with a shareable cache, for the peer's answer to our IPC handle (bounded by the
     * timeout: without an answer the transfers go through host memory) */
    while (p->state == P_CONNECTING || (p->state == P_CONNECTED && p->ipc_state == IPC_OFFERED &&
                                        now_ns() < p->deadline_ns)) {
        idle_wait(&spins, pump(a));
    }
    if (p->state == P_FAILED) {
        st = ERR(p->fail_status, "connect to %s: %s", p->name, p->fail_msg);
        kvhal_xfer_disconnect(p);
        return st;
    }
    *out = p;
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_disconnect(kvhal_xfer_peer *p)
{
    if (!p) return KVHAL_OK;
    if (p->magic != PEER_MAGIC) return ERR(KVHAL_INVALID_HANDLE, "peer: %p is not a live transfer peer", (void *)p);
    kvhal_xfer_agent *a = p->agent;
    if (p->state != P_FAILED) peer_fail(p, KVHAL_CANCELED, true, "disconnected by %s", a->name);
    ipc_jobs_run(a);   /* frames accepted but not launched: refused now (the peer failed) */
    while (ipc_job_reap(a, true)) { /* device copies may still read the peer's imported cache (closed below) */
    }
    cma_jobs_detach(a, p); /* CMA copies read its process by pid: they finish (or are skipped) without it */
    flush_msgs(a); /* the BYE, and the endpoint's close */
    for (kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->peer == p) x->peer = NULL;
    scrub_events(a, p, NULL);
    for (kvhal_xfer_peer **pp = &a->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (pending_msg *m = a->msgs; m; m = m->next)
        if (m->peer == p) m->peer = NULL;
    for (pending_msg *m = a->sent; m; m = m->next)
        if (m->peer == p) m->peer = NULL;
    peer_ipc_free(p);
    p->magic = DEAD_MAGIC;
    free(p);
    return KVHAL_OK;
}

const char *kvhal_xfer_peer_name(const kvhal_xfer_peer *p) { return p && p->magic == PEER_MAGIC ? p->name : ""; }

static kvhal_xfer *xfer_new(kvhal_xfer_agent *a, kvhal_xfer_peer *p, bool is_recv, uint64_t request_id)
{
    kvhal_xfer *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->magic = XFER_MAGIC;
    x->agent = a;
    x->peer = p;
    x->is_recv = is_recv;
    x->status = KVHAL_BUSY;
    x->request_id = request_id;
    x->xfer_id = ++a->next_xfer_id;
    x->deadline_ns = deadline_from_now(a);
    return x;
}

static kvhal_status check_pages(const char *arg, const int32_t *pages, int32_t n, int64_t limit)
{
    for (int32_t i = 0; i < n; i++)
        if (pages[i] < 0 || pages[i] >= limit)
            return ERR(KVHAL_OUT_OF_RANGE, "%s[%d]: page %d is out of range [0, %lld)", arg, (int)i, (int)pages[i],
                       (long long)limit);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_post_receive(kvhal_xfer_peer *p, uint64_t request_id, const int32_t *pages, int32_t n,
                                     kvhal_cache_manager *cm, kvhal_xfer **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_status st = check_peer(p);
    if (st != KVHAL_OK) return st;
    kvhal_xfer_agent *a = p->agent;
    CHECK_ARG(pages, "pages: NULL");
    CHECK_ARG(n >= 1 && n <= XW_MAX_GRANT, "n: %d is outside [1, %d]", (int)n, XW_MAX_GRANT);
    if ((st = check_pages("pages", pages, n, a->g.num_blocks)) != KVHAL_OK) return st;
    CHECK_ARG(!find_grant(a, p, request_id), "request_id: %llu already has a pending receive from peer %s",
              (unsigned long long)request_id, p->name);
    kvhal_xfer *x = xfer_new(a, p, true, request_id);
    if (!x) return ERR(KVHAL_OUT_OF_MEMORY, "post_receive: cannot allocate the transfer");
    x->n = n;
    x->cm = cm;
    x->pages = malloc((size_t)n * sizeof(int32_t));
    x->sorted = malloc((size_t)n * 2 * sizeof(int32_t));
    x->claimed = calloc((size_t)n, (size_t)a->g.num_layers);
    if (!x->pages || !x->sorted || !x->claimed) {
        free(x->pages);
        free(x->sorted);
        free(x->claimed);
        free(x);
        return ERR(KVHAL_OUT_OF_MEMORY, "post_receive: cannot allocate the grant of %d pages", (int)n);
    }
    memcpy(x->pages, pages, (size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) {
        x->sorted[2 * i] = pages[i];
        x->sorted[2 * i + 1] = i;
    }
    qsort(x->sorted, (size_t)n, 2 * sizeof(int32_t), cmp_pair);
    for (int32_t i = 1; i < n; i++)
        if (x->sorted[2 * i] == x->sorted[2 * i - 2]) {
            const int32_t pg = x->sorted[2 * i];
            free(x->pages);
            free(x->sorted);
            free(x->claimed);
            free(x);
            return ERR(KVHAL_INVALID_ARGUMENT, "pages: page %d appears twice", (int)pg);
        }
    x->bytes_total = (uint64_t)n * (uint64_t)a->g.num_layers * 2u * a->g.chunk_bytes;
    x->next = a->xfers;
    a->xfers = x;
    *out = x;
    /* offered already: the sender waits for no grant, the pages are copied from pump */
    if (p->offers && offer_take_pending(a, p, x)) {
        flush_msgs(a);
        return KVHAL_OK;
    }
    xw_grant g;
    memset(&g, 0, sizeof g);
    g.c = (xw_common){XW_MAGIC, XW_VERSION, XW_GRANT, p->their_session};
    g.request_id = request_id;
    g.n_pages = n;
    queue_msg(a, p, NULL, &g, sizeof g, pages, (size_t)n * sizeof(int32_t), false);
    flush_msgs(a);
    return KVHAL_OK;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    send_frame *f = user_data;
    kvhal_xfer *x = f->x;
    f->in_flight = false;
    x->sends_inflight--;
    frame_unbounce(x->agent, f);
    ucp_request_free(request);
    if (status != UCS_OK && !x->failing) /* settles: may free x */
        xfer_finish(x, KVHAL_PEER_FAILED, "sending frame to peer %s failed: %s", x->peer ? x->peer->name : "?",
                    ucs_status_string(status));
    else
        xfer_settle(x);
}

/* Posts frame fi of x to p (its header, then count units of buf as prm's datatype says); a send still in flight is
 * counted until send_cb. false when UCX refused it: x has failed then, and the caller posts no further frame. */
static bool post_frame(kvhal_xfer_peer *p, kvhal_xfer *x, int32_t fi, const void *buf, size_t count,
                       const ucp_request_param_t *prm)
{
    send_frame *f = &x->frames[fi];
    /* a peer attached without an endpoint (kvhal__xfer_attach_peer, the fuzzer's) drops what it is sent */
    void *r = p->ep ? ucp_am_send_nbx(p->ep, XW_AM_ID, f->hdr, f->hdr_len, buf, count, prm) : NULL;
    if (UCS_PTR_IS_ERR(r)) {
        frame_unbounce(x->agent, f);
        xfer_finish(x, KVHAL_PEER_FAILED, "UCX refused frame %d: %s", (int)fi, ucs_status_string(UCS_PTR_STATUS(r)));
        return false;
    }
    f->posted = true;
    if (r) {
        f->in_flight = true;
        x->sends_inflight++;
    } else {
        frame_unbounce(x->agent, f); /* sent already */
    }
    return true;
}

/* rendezvous for every frame but small ones, whatever UCX's threshold says: an eager frame of megabytes is assembled
 * in a buffer of the receiver's UCX before the handler sees it (one more copy) */
static void frame_prm(send_frame *f, ucp_request_param_t *prm)
{
    *prm = (ucp_request_param_t){.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS,
                                 .cb.send = send_cb, .user_data = f,
                                 .flags = f->bytes >= RNDV_FRAME_BYTES ? UCP_AM_SEND_FLAG_RNDV : 0};
}

/* Posts x's next frames, gathering those that are gathered (into bounce buffers) just before: at most
 * GATHER_AHEAD_BYTES of them wait for UCX at a time, so that the copies stay in cache, a transfer's first frame
 * does not wait for its last to be gathered, and memory stays bounded. false: x is blocked on that limit. */
static bool post_frames(kvhal_xfer *x)
{
    kvhal_xfer_agent *a = x->agent;
    kvhal_xfer_peer *p = x->peer;
    while (x->next_post < x->num_frames && !x->failing && p && p->state == P_CONNECTED) {
        const int32_t fi = x->next_post;
        send_frame *f = &x->frames[fi];
        if (f->stage_src) { /* a device cache's frame: a copy worker stages it; posted by gather_reap */
            if (a->staging_out && a->staging_out + f->bytes > STAGE_AHEAD_BYTES) return false;
            if (gather_submit(a, f)) {
                a->staging_out += f->bytes;
                x->next_post++;
                continue;
            }
            const kvhal_status st = stage_frame(a, &a->stage_stream, true, f->stage_mem, f->staging, f->stage_src,
                                                f->hdr->n_pages, f->hdr->first_layer, f->hdr->num_layers);
            free(f->stage_src);
            f->stage_src = NULL;
            if (st != KVHAL_OK) {
                char why[XW_REASON_LEN];
                snprintf(why, sizeof why, "%s", kvhal_last_error());
                xfer_finish(x, st, "src_pages: copying frame %d to host memory failed: %s", (int)fi, why);
                return true;
            }
        }
        if (f->gather) {
            if (a->gathered && a->gathered + f->bytes > GATHER_AHEAD_BYTES) return false;
            if (!(f->bounce = bounce_get(a, f->bytes))) {
                xfer_finish(x, KVHAL_OUT_OF_MEMORY, "sending frame %d: no host memory to gather its %llu bytes",
                            (int)fi, (unsigned long long)f->bytes);
                return true;
            }
            a->gathered += f->bytes;
            /* a copy worker gathers it; posted by gather_reap */
            if (x->num_frames > 1 && f->bytes >= a->gather_min && gather_submit(a, f)) {
                x->next_post++;
                continue;
            }
            gather_copy(f);
        }
        x->next_post++;
        ucp_request_param_t prm;
        frame_prm(f, &prm);
        size_t count;
        const void *buf = frame_buffer(f->iov, f->iov_count, f->bounce ? f->bounce : f->staging, f->bytes, &prm, &count);
        if (!post_frame(p, x, fi, buf, count, &prm)) return true; /* x failed (and may be gone) */
    }
    return true;
}

/* Frames not yet posted, oldest transfer first, until the gathering limit blocks one. */
static void post_pending(kvhal_xfer_agent *a)
{
    for (;;) {
        kvhal_xfer *old = NULL;
        for (kvhal_xfer *x = a->xfers; x; x = x->next)
            if (!x->is_recv && x->next_post < x->num_frames && !x->failing &&
                (!old || x->xfer_id < old->xfer_id))
                old = x;
        if (!old || !post_frames(old)) return;
    }
}

/* The IPC path of kvhal_xfer_send_pages: the peer imported our cache, so frames carry (src, dst) page ids only and
 * the peer copies the pages itself. Our pages' writes must be complete before they are announced (the device is
 * synchronized first), and they must stay unchanged until the peer's ACK (the transfer's completion). */
/* The IPC path's sends: DATA_IPC frames of (src, dst) pairs, or (dst_pages NULL: an offer) OFFER frames of
 * source pages, the receiver's pages being those of its receive. */
static kvhal_status send_pages_ipc(kvhal_xfer_peer *p, uint64_t request_id, const int32_t *src_pages,
                                   const int32_t *dst_pages, int32_t n, int32_t first_layer, int32_t num_layers,
                                   kvhal_xfer **out)
{
    const bool offer = dst_pages == NULL;
    kvhal_xfer_agent *a = p->agent;
    kvhal_status st = kvhal_device_synchronize(kvhal_buffer_device(a->cache_buf));
    if (st != KVHAL_OK) return st;
    kvhal_xfer *x = xfer_new(a, p, false, request_id);
    if (!x) return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate the transfer");
    const int32_t per = XW_IPC_FRAME_PAGES;
    x->n = n;
    x->offer = offer;
    x->path = p->ipc_kind == XW_IPC_CMA ? PATH_CMA : PATH_IPC;
    x->num_frames = (n + per - 1) / per;
    x->next_post = x->num_frames; /* posted here, all at once (post_pending leaves it alone) */
    x->frames = calloc((size_t)x->num_frames, sizeof *x->frames);
    const uint64_t frame_chunk = (uint64_t)num_layers * 2u * a->g.chunk_bytes;
    x->bytes_total = (uint64_t)n * frame_chunk;
    bool ok = x->frames != NULL;
    for (int32_t fi = 0; ok && fi < x->num_frames; fi++) {
        send_frame *f = &x->frames[fi];
        const int32_t first = fi * per;
        const int32_t cnt = n - first < per ? n - first : per;
        f->x = x;
        f->hdr_len = offer ? sizeof(xw_offer) : sizeof(xw_data_ipc);
        f->hdr = calloc(1, f->hdr_len);
        int32_t *ids = malloc((size_t)cnt * (offer ? 1u : 2u) * sizeof(int32_t));
        f->staging = ids;
        f->bytes = (uint64_t)cnt * frame_chunk;
        if (!f->hdr || !ids) {
            ok = false;
            break;
        }
        if (offer) {
            xw_offer h = {.c = {XW_MAGIC, XW_VERSION, XW_OFFER, p->their_session}, .request_id = request_id,
                          .xfer_id = x->xfer_id, .frame = (uint32_t)fi, .first_layer = first_layer,
                          .num_layers = num_layers, .first_page = first, .total_pages = n, .n_pages = cnt};
            memcpy(f->hdr, &h, sizeof h);
            memcpy(ids, src_pages + first, (size_t)cnt * sizeof(int32_t));
            continue;
        }
        xw_data_ipc h = {.c = {XW_MAGIC, XW_VERSION, XW_DATA_IPC, p->their_session}, .request_id = request_id,
                         .xfer_id = x->xfer_id, .frame = (uint32_t)fi, .first_layer = first_layer,
                         .num_layers = num_layers, .n_pages = cnt};
        memcpy(f->hdr, &h, sizeof h);
        for (int32_t i = 0; i < cnt; i++) {
            ids[2 * i] = src_pages[first + i];
            ids[2 * i + 1] = dst_pages[first + i];
        }
    }
    x->next = a->xfers;
    a->xfers = x;
    if (!ok) {
        xfer_free(x);
        return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate %d frames", (int)(n / per + 1));
    }
    flush_msgs(a);
    for (int32_t fi = 0; fi < x->num_frames; fi++) {
        send_frame *f = &x->frames[fi];
        const size_t ids = offer ? (size_t)((const xw_offer *)(const void *)f->hdr)->n_pages
                                 : 2u * (size_t)((const xw_data_ipc *)(const void *)f->hdr)->n_pages;
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                                   UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS,
                                   .cb.send = send_cb, .user_data = f, .datatype = ucp_dt_make_contig(1),
                                   .flags = UCP_AM_SEND_FLAG_EAGER};
        if (!post_frame(p, x, fi, f->staging, ids * sizeof(int32_t), &prm)) break;
    }
    *out = x;
    return KVHAL_OK;
}

/* An offer of request_id to p not finished (withdrawing: failing only). */
static bool offer_in_flight(const kvhal_xfer_peer *p, uint64_t request_id, bool failing_only)
{
    for (const kvhal_xfer *x = p->agent->xfers; x; x = x->next)
        if (x->offer && x->peer == p && x->request_id == request_id && !x->finished && (!failing_only || x->failing))
            return true;
    return false;
}

kvhal_status kvhal_xfer_offer_pages(kvhal_xfer_peer *p, uint64_t request_id, const int32_t *src_pages, int32_t n,
                                    int32_t first_layer, int32_t num_layers, kvhal_xfer **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_status st = check_peer(p);
    if (st != KVHAL_OK) return st;
    kvhal_xfer_agent *a = p->agent;
    CHECK_ARG(src_pages, "src_pages: NULL");
    CHECK_ARG(n >= 1 && n <= XW_MAX_GRANT, "n: %d is outside [1, %d]", (int)n, XW_MAX_GRANT);
    if (first_layer < 0 || num_layers < 1 || first_layer > a->g.num_layers - num_layers)
        return ERR(KVHAL_OUT_OF_RANGE, "first_layer, num_layers: [%d, %d+%d) is outside the cache's [0, %d)",
                   (int)first_layer, (int)first_layer, (int)num_layers, (int)a->g.num_layers);
    if ((st = check_pages("src_pages", src_pages, n, a->g.num_blocks)) != KVHAL_OK) return st;
    CHECK_ARG(!offer_in_flight(p, request_id, true), "request_id: an offer of %llu to peer %s is being withdrawn "
              "(wait for its SEND_DONE)", (unsigned long long)request_id, p->name);
    if (p->ipc_state != IPC_READY)
        return ERR(KVHAL_UNSUPPORTED, "peer: %s reads no pages from this process (IPC state: %s); send the pages "
                   "after its GRANT (kvhal_xfer_send_pages)", p->name, kvhal_xfer_peer_ipc(p));
    return send_pages_ipc(p, request_id, src_pages, NULL, n, first_layer, num_layers, out);
}

kvhal_status kvhal_xfer_send_pages(kvhal_xfer_peer *p, uint64_t request_id, const int32_t *src_pages,
                                   const int32_t *dst_pages, int32_t n, int32_t first_layer, int32_t num_layers,
                                   kvhal_xfer **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_status st = check_peer(p);
    if (st != KVHAL_OK) return st;
    kvhal_xfer_agent *a = p->agent;
    CHECK_ARG(src_pages, "src_pages: NULL");
    CHECK_ARG(dst_pages, "dst_pages: NULL");
    CHECK_ARG(n >= 1 && n <= XW_MAX_GRANT, "n: %d is outside [1, %d]", (int)n, XW_MAX_GRANT);
    if (first_layer < 0 || num_layers < 1 || first_layer > a->g.num_layers - num_layers)
        return ERR(KVHAL_OUT_OF_RANGE, "first_layer, num_layers: [%d, %d+%d) is outside the cache's [0, %d)",
                   (int)first_layer, (int)first_layer, (int)num_layers, (int)a->g.num_layers);
    if ((st = check_pages("src_pages", src_pages, n, a->g.num_blocks)) != KVHAL_OK) return st;
    if ((st = check_pages("dst_pages", dst_pages, n, p->g.num_blocks)) != KVHAL_OK) return st;
    CHECK_ARG(!offer_in_flight(p, request_id, false), "request_id: %llu is offered to peer %s "
              "(kvhal_xfer_offer_pages): its receiver takes the offered pages itself", (unsigned long long)request_id,
              p->name);
    if (p->ipc_state == IPC_READY) return send_pages_ipc(p, request_id, src_pages, dst_pages, n, first_layer,
                                                         num_layers, out);
    /* Host caches: a frame's K/V chunks are scattered in our cache and in the peer's. UCX 1.13's rendezvous
     * sends data by zero-copy put/get only where both buffers are contiguous and (put) the endpoint has no
     * peer-failure handling; otherwise the sender's UCX sends it as active-message fragments, copied (packed)
     * from an IOV into 8 KiB buffers and sent one syscall each (TCP: a quarter of the socket's bandwidth), or
     * sent zero-copy in 64 KiB fragments from a contiguous buffer. So on endpoints with peer-failure handling
     * (TCP) a frame of several runs is gathered here into a contiguous bounce buffer (the same one copy that the
     * pack made, then 64 KiB sendmsg calls); the receiver's UCX writes every fragment straight into its scattered
     * chunks (an IOV receive) either way. Over shared memory (no peer-failure handling) frames stay IOVs: UCX
     * copies them through its FIFO, one copy on each side at once, where a gathered frame would cost a third
     * (measured in session 7: gathered frames cut at the receiver's pages, read by CMA, were slower). On one host,
     * where the transports allow CMA, host caches skip this: the peer reads our pages itself (see offer_ipc). */
    size_t per = MAX_FRAME_PAGES;
    if (a->max_am_header > sizeof(xw_data)) {
        const size_t fit = (a->max_am_header - sizeof(xw_data)) / sizeof(int32_t);
        if (fit < per) per = fit;
    }
    if (per < 1) return ERR(KVHAL_BACKEND_ERROR, "UCX allows active-message headers of %zu bytes only", a->max_am_header);
    const uint64_t frame_chunk = (uint64_t)num_layers * 2u * a->g.chunk_bytes;
    /* gathered frames are cut to GATHER_FRAME_BYTES: several of them fit GATHER_AHEAD_BYTES, so that one is
     * gathered (by a copy worker) while those before it are sent; a 16 MiB frame alone in that limit was gathered,
     * then sent, then the next one gathered (0.53-0.57 of perftest at 4 and 16 MiB; cut to 1 MiB and gathered by
     * the workers, 0.73-0.82: docs/measurements/session9) */
    if (a->host && !a->no_peer_errors) {
        const uint64_t fit = a->gather_frame / frame_chunk;
        if (fit < per) per = fit ? (size_t)fit : 1;
    }
    /* a device cache is copied to staging on the agent's own stream: every write queued to the pages first */
    if (!a->host && (st = kvhal_device_synchronize(kvhal_buffer_device(a->cache_buf))) != KVHAL_OK) return st;
    kvhal_xfer *x = xfer_new(a, p, false, request_id);
    if (!x) return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate the transfer");
    x->n = n;
    x->path = a->host ? PATH_HOST : PATH_STAGED;
    x->num_frames = (int32_t)(((size_t)n + per - 1) / per);
    x->frames = calloc((size_t)x->num_frames, sizeof *x->frames);
    x->bytes_total = (uint64_t)n * frame_chunk;
    bool ok = x->frames != NULL;
    for (int32_t fi = 0; ok && fi < x->num_frames; fi++) {
        send_frame *f = &x->frames[fi];
        const int32_t first = fi * (int32_t)per;
        const int32_t cnt = (int32_t)((size_t)(n - first) < per ? (size_t)(n - first) : per);
        f->x = x;
        f->hdr_len = sizeof(xw_data) + (size_t)cnt * sizeof(int32_t);
        f->hdr = calloc(1, f->hdr_len);
        f->bytes = (uint64_t)cnt * frame_chunk;
        if (!f->hdr) {
            ok = false;
            break;
        }
        *f->hdr = (xw_data){.c = {XW_MAGIC, XW_VERSION, XW_DATA, p->their_session}, .request_id = request_id,
                            .xfer_id = x->xfer_id, .frame = (uint32_t)fi, .first_layer = first_layer,
                            .num_layers = num_layers, .n_pages = cnt, .chunk_bytes = a->g.chunk_bytes};
        memcpy((uint8_t *)f->hdr + sizeof(xw_data), dst_pages + first, (size_t)cnt * sizeof(int32_t));
        if (a->host) {
            f->iov = build_iov(a, src_pages + first, cnt, first_layer, num_layers, &f->iov_count);
            ok = f->iov != NULL;
            f->gather = ok && f->iov_count > 1 && !a->no_peer_errors; /* see above; from post_frames */
        } else {
            f->staging = stage_alloc(a, f->bytes, &f->stage_mem);
            ok = f->staging != NULL;
            /* the pages are copied to the staging when the frame is posted (post_frames): by a copy worker, so that
             * the frames before it are sent meanwhile, or by pump where none runs; a copy that fails fails the
             * transfer (SEND_DONE with the error), whichever copies it */
            ok = ok && (f->stage_src = malloc((size_t)cnt * sizeof(int32_t))) != NULL;
            if (ok) memcpy(f->stage_src, src_pages + first, (size_t)cnt * sizeof(int32_t));
        }
    }
    x->next = a->xfers;
    a->xfers = x;
    if (!ok) {
        xfer_free(x);
        return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate %d frames", (int)x->num_frames);
    }
    flush_msgs(a);
    post_pending(a);
    *out = x;
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_progress(kvhal_xfer_agent *a, uint32_t timeout_ms, kvhal_xfer_event *ev)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(ev, "ev: NULL");
    memset(ev, 0, sizeof *ev);
    free(a->last_pages);
    a->last_pages = NULL;
    const uint64_t until = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    idle_state spins = {0, 0};
    for (;;) {
        /* On a device cache's agent (either side), and wherever device copies run, an event already queued is
         * returned without a pump first: there a pump (a round of UCX and of the copies) may wait for the oldest
         * copy, and a pump per event held 16 and 64 transfers in flight on the IPC path at half their rate
         * (returning queued events at once: 256 KiB batches 0.28 -> 0.62 and 0.43 -> 0.97 of cudaMemcpyPeer, 2 x
         * H200, session 13). Returning them at once only while this agent's copies run (the IPC sender has none)
         * measured 0.94 of cudaMemcpyPeer where this rule has 1.09 (256 KiB) and 1.03 (1 MiB) with 64 grants in
         * flight, though 1.03 where this has 0.91 at 4 MiB with 16 (ABBA rounds, 2 x H100, session 14). On a host
         * cache's agent a pump per event is cheap and keeps UCX moving: host caches over TCP and shared memory
         * were 4-13% slower by median without it at 256 KiB-1 MiB (session 13). */
        const unsigned work = (a->ev_count && ((a->cache_buf && !a->host) || a->ipc_running)) ? 1 : pump(a);
        if (a->ev_count) {
            event_item *it = &a->events[a->ev_head];
            a->ev_head = (a->ev_head + 1) % a->ev_cap;
            a->ev_count--;
            *ev = it->ev;
            ev->pages = it->pages_owned;
            a->last_pages = it->pages_owned;
            return KVHAL_OK;
        }
        if (now_ns() >= until) return KVHAL_OK;
        idle_wait(&spins, work);
    }
}

kvhal_status kvhal_xfer_test(kvhal_xfer *x)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    pump(x->agent);
    if (!x->finished) return KVHAL_BUSY;
    if (x->status != KVHAL_OK) return ERR(x->status, "%s", x->message);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_wait(kvhal_xfer *x, uint32_t timeout_ms)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    const uint64_t until = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    idle_state spins = {0, 0};
    for (;;) {
        const unsigned work = pump(x->agent);
        if (x->finished) return x->status == KVHAL_OK ? KVHAL_OK : ERR(x->status, "%s", x->message);
        if (now_ns() >= until)
            return ERR(KVHAL_BUSY, "xfer: request %llu still in flight after %u ms", (unsigned long long)x->request_id,
                       (unsigned)timeout_ms);
        idle_wait(&spins, work);
    }
}

kvhal_status kvhal_xfer_cancel(kvhal_xfer *x)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    xfer_finish(x, KVHAL_CANCELED, "request %llu canceled", (unsigned long long)x->request_id);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_release(kvhal_xfer *x)
{
    if (!x) return KVHAL_OK;
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    if (x->finished) {
        xfer_free(x);
        return KVHAL_OK;
    }
    xfer_finish(x, KVHAL_CANCELED, "request %llu released while in flight", (unsigned long long)x->request_id);
    if (x->finished) {
        xfer_free(x); /* settled at once: scrub its event */
        return KVHAL_OK;
    }
    x->released = true; /* freed by xfer_settle once UCX lets go */
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_get_info(const kvhal_xfer *x, kvhal_xfer_info *out)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(out, "out: NULL");
    out->request_id = x->request_id;
    out->bytes_total = x->bytes_total;
    out->bytes_done = x->bytes_done;
    out->status = x->finished ? x->status : KVHAL_BUSY;
    out->is_receive = x->is_recv;
    return KVHAL_OK;
}

const char *kvhal_xfer_path(const kvhal_xfer *x)
{
    if (!x || x->magic != XFER_MAGIC) return "";
    switch (x->path) {
    case PATH_HOST: return "host";
    case PATH_STAGED: return "staged";
    case PATH_IPC: return "ipc";
    case PATH_CMA: return "cma";
    default: return "";
    }
}

const char *kvhal_xfer_peer_ipc(const kvhal_xfer_peer *p)
{
    if (!p || p->magic != PEER_MAGIC) return "";
    switch (p->ipc_state) {
    case IPC_READY: return p->ipc_kind == XW_IPC_CMA ? "cma" : "ipc";
    case IPC_OFFERED: return "offered";
    case IPC_REFUSED: return p->ipc_reason[0] ? p->ipc_reason : "refused";
    default: return p->same_host ? "same host, no shareable cache" : "other host";
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* internal: the receive side without a connection (xfer_internal.h; fuzz/fuzz_xfer.c)                         */
/* ---------------------------------------------------------------------------------------------------------- */
ucs_status_t kvhal__xfer_recv_frame(kvhal_xfer_agent *a, const void *header, size_t header_length, void *data,
                                    size_t length, bool rndv)
{
    const ucp_am_recv_param_t prm = {.recv_attr = rndv ? UCP_AM_RECV_ATTR_FLAG_RNDV : 0};
    return am_handler(a, header, header_length, data, length, &prm);
}

kvhal_status kvhal__xfer_attach_peer(kvhal_xfer_agent *a, uint64_t session, const xw_geometry *g,
                                     kvhal_xfer_peer **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(g, "g: NULL");
    CHECK_ARG(session && !find_session(a, session), "session: 0 or already a peer's");
    kvhal_xfer_peer *p = calloc(1, sizeof *p);
    if (!p) return ERR(KVHAL_OUT_OF_MEMORY, "attach: cannot allocate the peer");
    p->magic = PEER_MAGIC;
    p->agent = a;
    p->state = P_CONNECTED;
    p->accepted_side = true;
    p->my_session = session;
    p->their_session = session;
    p->g = *g;
    copy_name(p->name, sizeof p->name, "attached");
    p->next = a->peers;
    a->peers = p;
    a->live_peers++;
    *out = p;
    return KVHAL_OK;
}

uint64_t kvhal__xfer_id(const kvhal_xfer *x) { return x ? x->xfer_id : 0; }

size_t kvhal__xfer_agent_held(const kvhal_xfer_agent *a)
{
    size_t n = a->ev_count;
    for (const kvhal_xfer *x = a->xfers; x; x = x->next) n++;
    for (const kvhal_xfer_peer *p = a->peers; p; p = p->next) n++;
    for (const recv_frame *f = a->rframes; f; f = f->next) n++;
    for (const recv_frame *f = a->rstaging; f; f = f->next) n++;
    for (const pending_msg *m = a->msgs; m; m = m->next) n++;
    for (const pending_msg *m = a->sent; m; m = m->next) n++;
    for (const pending_hello *h = a->hellos; h; h = h->next) n++;
    for (const ipc_job *j = a->ipc_jobs; j; j = j->next) n++;
    for (const ipc_job *j = a->ipc_running; j; j = j->next) n++;
    for (const ipc_job *j = a->cma_running; j; j = j->next) n++;
    for (const send_frame *f = a->gathering; f; f = f->gnext) n++;
    for (const closing_ep *c = a->closing; c; c = c->next) n++;
    return n;
}

/* xfer_send.c — sending: DATA frames cut and posted in order (post_pending), their completions and
 * acknowledgements; the host path (frames from the pages' IOV, or gathered into bounce buffers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

/* rendezvous for every frame but small ones, whatever UCX's threshold says: an eager frame of megabytes is assembled
 * in a buffer of the receiver's UCX before the handler sees it (one more copy) */
static void frame_prm(send_frame *f, ucp_request_param_t *prm)
{
    *prm = (ucp_request_param_t){.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                                 UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS,
                                 .cb.send = send_cb, .user_data = f,
                                 .flags = f->bytes >= RNDV_FRAME_BYTES ? UCP_AM_SEND_FLAG_RNDV : 0};
}

/* Posts frame f of x to p from the buffer its path prepared (a bounce buffer, staging, or the pages' IOV). */
static bool send_frame_post(kvhal_xfer_peer *p, kvhal_xfer *x, send_frame *f)
{
    ucp_request_param_t prm;
    frame_prm(f, &prm);
    size_t count;
    const void *buf = frame_buffer(f->iov, f->iov_count, f->bounce ? f->bounce : f->staging, f->bytes, &prm, &count);
    return post_frame(p, x, (int32_t)(f - x->frames), buf, count, &prm);
}

/* Posts x's next frames, each made ready by its path just before (gathered, staged): at most GATHER_AHEAD_BYTES of
 * gathered frames wait for UCX at a time, so that the copies stay in cache, a transfer's first frame does not wait
 * for its last to be gathered, and memory stays bounded (STAGE_AHEAD_BYTES for staged ones). false: x is blocked on
 * such a limit. */
static bool post_frames(kvhal_xfer *x)
{
    kvhal_xfer_peer *p = x->peer;
    while (x->next_post < x->num_frames && !x->failing && p && p->state == P_CONNECTED) {
        send_frame *f = &x->frames[x->next_post];
        const frame_ready r = x->path->frame_ready ? x->path->frame_ready(x, f) : FRAME_POST;
        if (r == FRAME_BLOCKED) return false;
        if (r == FRAME_FAILED) return true;
        x->next_post++;
        if (r == FRAME_WORKING) continue; /* posted when the pool hands it back (send_frame_worked) */
        if (!send_frame_post(p, x, f)) return true; /* x failed (and may be gone) */
    }
    return true;
}

/* Frames not yet posted, oldest transfer first, until the gathering limit blocks one. */
void post_pending(kvhal_xfer_agent *a)
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

/* The frame cut of a DATA send: the pages a frame carries at most (0: UCX's header limit is too small). */
static size_t data_frame_pages(const kvhal_xfer_agent *a, const xfer_path *path, uint64_t frame_chunk)
{
    size_t per = MAX_FRAME_PAGES;
    if (a->max_am_header > sizeof(xw_data)) {
        const size_t fit = (a->max_am_header - sizeof(xw_data)) / sizeof(int32_t);
        if (fit < per) per = fit;
    }
    if (per < 1) return 0;
    const uint64_t cap = path->frame_bytes ? path->frame_bytes(a) : 0;
    if (cap) {
        const uint64_t fit = cap / frame_chunk;
        if (fit < per) per = fit ? (size_t)fit : 1;
    }
    return per;
}

/* The DATA paths' sends (host, staged): frames of (page, layer, K/V) chunks the receiver writes into the pages it
 * granted, posted in order by post_pending. */
kvhal_status send_data_pages(kvhal_xfer_peer *p, const xfer_send_req *r, kvhal_xfer **out)
{
    kvhal_xfer_agent *a = p->agent;
    const xfer_path *path = p->tx_path;
    const uint64_t frame_chunk = (uint64_t)r->num_layers * 2u * a->g.chunk_bytes;
    const size_t per = data_frame_pages(a, path, frame_chunk);
    if (per < 1) return ERR(KVHAL_BACKEND_ERROR, "UCX allows active-message headers of %zu bytes only", a->max_am_header);
    /* a device cache is copied to staging on the agent's own stream: every write queued to the pages first */
    kvhal_status st;
    if (path->sync_device && !r->written &&
        (st = kvhal_device_synchronize(kvhal_buffer_device(a->cache_buf))) != KVHAL_OK)
        return st;
    kvhal_xfer *x = xfer_new(a, p, false, r->request_id);
    if (!x) return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate the transfer");
    x->quiet = r->quiet;
    x->n = r->n;
    x->path = path;
    x->num_frames = (int32_t)(((size_t)r->n + per - 1) / per);
    x->frames = calloc((size_t)x->num_frames, sizeof *x->frames);
    x->bytes_total = (uint64_t)r->n * frame_chunk;
    bool ok = x->frames != NULL;
    for (int32_t fi = 0; ok && fi < x->num_frames; fi++) {
        send_frame *f = &x->frames[fi];
        const int32_t first = fi * (int32_t)per;
        const int32_t cnt = (int32_t)((size_t)(r->n - first) < per ? (size_t)(r->n - first) : per);
        f->x = x;
        f->hdr_len = sizeof(xw_data) + (size_t)cnt * sizeof(int32_t);
        f->hdr = calloc(1, f->hdr_len);
        f->bytes = (uint64_t)cnt * frame_chunk;
        if (!f->hdr) {
            ok = false;
            break;
        }
        *f->hdr = (xw_data){.c = {XW_MAGIC, XW_VERSION, XW_DATA, p->their_session}, .request_id = r->request_id,
                            .xfer_id = x->xfer_id, .frame = (uint32_t)fi, .first_layer = r->first_layer,
                            .num_layers = r->num_layers, .n_pages = cnt, .chunk_bytes = a->g.chunk_bytes};
        memcpy((uint8_t *)f->hdr + sizeof(xw_data), r->dst + first, (size_t)cnt * sizeof(int32_t));
        ok = path->frame_init(a, f, r->src + first, cnt, r->first_layer, r->num_layers);
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
    CHECK_ARG(p->tx_path, "agent: no paged cache registered");
    const xfer_send_req r = {.request_id = request_id, .src = src_pages, .dst = dst_pages, .n = n,
                             .first_layer = first_layer, .num_layers = num_layers};
    return p->tx_path->send(p, &r, out);
}

void on_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_ack k;
    if (header_length != sizeof k) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed ACK frame (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    printable(k.reason); /* it reaches the application's messages */
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

/* A gathered frame's chunks (our cache) copied one after the other into its bounce buffer. */
static void gather_copy(const send_frame *f)
{
    uint8_t *b = f->bounce;
    for (size_t i = 0; i < f->iov_count; i++) {
        memcpy(b, f->iov[i].buffer, f->iov[i].length);
        b += f->iov[i].length;
    }
}

/* Hands a frame to the copy workers (gathered or staged, as f->work says); it counts as a send in flight (its
 * transfer cannot settle, its buffers stay) until the pool hands it back. */
void send_frame_submit(kvhal_xfer_agent *a, send_frame *f)
{
    f->x->sends_inflight++;
    xfer_work *w = &f->work;
    xfer_pool_submit(&a->workers, &w, 1);
}

/* While a frame is with the workers: a send whose frames our workers still gather or stage is not stalled by its
 * peer; the frames of a transfer that failed meanwhile are not started. */
bool send_frame_pending(xfer_work *w)
{
    kvhal_xfer *x = XFER_WORK_OWNER(w, send_frame, work)->x;
    x->deadline_ns = deadline_from_now(x->agent);
    return !x->failing;
}

/* A frame a copy worker gathered or staged (what), handed back: posted, unless its transfer failed meanwhile (its
 * buffer goes back and the transfer settles, which may free it) or the work did not run or failed. */
void send_frame_worked(send_frame *f, xfer_work_status st, const char *what)
{
    kvhal_xfer *x = f->x;
    kvhal_xfer_agent *a = x->agent;
    x->sends_inflight--;
    kvhal_xfer_peer *p = x->peer;
    if (st != XFER_WORK_DONE || x->failing || !p || p->state != P_CONNECTED) {
        frame_unbounce(a, f);
        if (x->failing) xfer_settle(x);
        else if (st == XFER_WORK_ORPHANED) /* not "peer gone": the peer is the parent's, which still sends it */
            xfer_finish(x, KVHAL_PEER_FAILED, "frame %d: the process forked while the frame was being %s",
                        (int)(f - x->frames), what); /* settles: may free x */
        else xfer_finish(x, KVHAL_PEER_FAILED, "peer gone"); /* settles: may free x */
        return;
    }
    if (f->work_status != KVHAL_OK) {
        xfer_finish(x, f->work_status, "src_pages: copying frame %d to host memory failed: %s", (int)(f - x->frames),
                    f->work_why); /* settles: may free x */
        return;
    }
    send_frame_post(p, x, f); /* may fail x */
}

/* ---- the host path: a frame of scattered chunks, gathered into a bounce buffer where that pays ---- */

static void gather_work(xfer_work *w, void **local)
{
    (void)local;
    gather_copy(XFER_WORK_OWNER(w, send_frame, work));
}

static void gather_done(xfer_work *w, xfer_work_status st)
{
    send_frame_worked(XFER_WORK_OWNER(w, send_frame, work), st, "gathered");
}

/* Host caches: a frame's K/V chunks are scattered in our cache and in the peer's. UCX 1.13's rendezvous sends data
 * by zero-copy put/get only where both buffers are contiguous and (put) the endpoint has no peer-failure handling;
 * otherwise the sender's UCX sends it as active-message fragments, copied (packed) from an IOV into 8 KiB buffers
 * and sent one syscall each (TCP: a quarter of the socket's bandwidth), or sent zero-copy in 64 KiB fragments from
 * a contiguous buffer. So on endpoints with peer-failure handling (TCP) a frame of several runs is gathered into a
 * contiguous bounce buffer when it is posted (the same one copy that the pack made, then 64 KiB sendmsg calls); the
 * receiver's UCX writes every fragment straight into its scattered chunks (an IOV receive) either way. Over shared
 * memory (no peer-failure handling) frames stay IOVs: UCX copies them through its FIFO, one copy on each side at
 * once, where a gathered frame would cost a third (gathered frames cut at the receiver's pages, read by CMA,
 * measured slower). On one host, where the transports allow CMA, host caches skip this: the peer reads our pages
 * itself (the CMA path). */
static bool host_frame_init(kvhal_xfer_agent *a, send_frame *f, const int32_t *src, int32_t cnt, int32_t l0,
                            int32_t nl)
{
    f->iov = build_iov(a, src, cnt, l0, nl, &f->iov_count);
    f->gather = f->iov && f->iov_count > 1 && !a->no_peer_errors;
    return f->iov != NULL;
}

/* Gathered frames are cut to a->gather_frame bytes: several of them fit GATHER_AHEAD_BYTES, so that one is gathered
 * (by a copy worker) while those before it are sent; a 16 MiB frame alone in that limit was gathered, then sent,
 * then the next one gathered (0.53-0.57 of perftest at 4 and 16 MiB; cut to 1 MiB and gathered by the workers,
 * 0.73-0.82). */
static uint64_t host_frame_bytes(const kvhal_xfer_agent *a) { return a->no_peer_errors ? 0 : a->gather_frame; }

/* A frame to gather: its bounce buffer taken, and gathered by a copy worker (in a transfer of several frames, a
 * frame of a->gather_min bytes at least), so that pump goes on sending meanwhile, else here: there is nothing to
 * overlap, and the hand-over measured slower at 256 KiB-1 MiB. */
static frame_ready host_frame_ready(kvhal_xfer *x, send_frame *f)
{
    if (!f->gather) return FRAME_POST;
    kvhal_xfer_agent *a = x->agent;
    if (a->gathered && a->gathered + f->bytes > GATHER_AHEAD_BYTES) return FRAME_BLOCKED;
    if (!(f->bounce = bounce_get(a, f->bytes))) {
        xfer_finish(x, KVHAL_OUT_OF_MEMORY, "sending frame %d: no host memory to gather its %llu bytes",
                    (int)(f - x->frames), (unsigned long long)f->bytes);
        return FRAME_FAILED;
    }
    a->gathered += f->bytes;
    if (x->num_frames > 1 && f->bytes >= a->gather_min && xfer_pool_start(&a->workers)) {
        f->work = (xfer_work){.work = gather_work, .done = gather_done, .pending = send_frame_pending};
        f->work_status = KVHAL_OK;
        send_frame_submit(a, f);
        return FRAME_WORKING;
    }
    gather_copy(f);
    return FRAME_POST;
}

/* The host path's receive: UCX writes a DATA frame's chunks straight into the granted pages (an IOV). */
static bool host_recv_init(kvhal_xfer_agent *a, recv_frame *f, const int32_t *pages, int32_t n, int32_t l0, int32_t nl)
{
    f->iov = build_iov(a, pages, n, l0, nl, &f->iov_count);
    return f->iov != NULL;
}

/* The host path: a host cache's pages sent as DATA frames (from IOVs or gathered), received straight into the
 * granted pages. */
const xfer_path xfer_path_host = {
    .name = "host",
    .send = send_data_pages,
    .frame_init = host_frame_init,
    .frame_ready = host_frame_ready,
    .frame_bytes = host_frame_bytes,
    .recv_init = host_recv_init,
};

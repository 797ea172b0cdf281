/* xfer_ipc.c — the IPC paths (same host): the sender offers its cache (IPC_MAP: an IPC handle, or where to read it
 * with process_vm_readv), the receiver imports it and copies the pages that DATA_IPC (and OFFER) frames name; and
 * the IPC path itself, whose copies from an imported cache go out in launch groups on the receiver's streams. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xfer_rooms.h"


/* Sender: offers our cache's handle to a peer on our host (once per connection). */
void offer_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
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

/* Receiver (from pump): checks a peer's IPC_MAP, imports its handle on our cache's device, checks that every page
 * of every layer it could name lies inside what was imported, and answers. A handle that cannot be imported is
 * refused (the peer then sends through host memory); a malformed frame drops the peer. */
void process_ipc_map(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
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
    if (p->rx_path) {
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
    p->rx_path = &xfer_path_ipc;
    if (m.kind == XW_IPC_CMA) {
        p->cma = true;
        p->cma_pid = cb.pid;
        p->cma_base = cb.base;
        p->rx_path = &xfer_path_cma;
    }
    p->ipc_off = off;
    p->ipc_stride = m.block_stride;
    p->ipc_blocks = m.num_blocks;
    send_map_ack(a, p, KVHAL_OK, "");
}

void on_ipc_map_ack(kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_ipc_map_ack k;
    if (header_length != sizeof k || p->ipc_state != IPC_OFFERED) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "unexpected or malformed IPC_MAP_ACK (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    if (k.status == 0) { /* the peer reads our pages itself from now on */
        p->ipc_state = IPC_READY;
        p->tx_path = p->ipc_kind == XW_IPC_CMA ? &xfer_path_cma : &xfer_path_ipc;
    } else {
        p->ipc_state = IPC_REFUSED;
        copy_name(p->ipc_reason, sizeof p->ipc_reason, k.reason);
    }
}

/* Receiver: a DATA_IPC frame, checked like DATA (grant, page ids, each (page, layer) once) plus the source page
 * ids against the imported cache; accepted pages are claimed now and copied from pump. */

void on_data_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
                        const void *data, size_t length, bool rndv)
{
    xw_data_ipc h;
    if (header_length != sizeof h || rndv) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed DATA_IPC frame (%zu header bytes%s)", header_length,
                  rndv ? ", rendezvous" : "");
        return;
    }
    memcpy(&h, header, sizeof h);
    if (!p->rx_path) {
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
void ipc_accept(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x, uint64_t request_id, uint64_t xfer_id,
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
    j->path = p->rx_path;
    j->path->job_queue(a, j);
}

static void ipc_queue(kvhal_xfer_agent *a, ipc_job *j)
{
    j->p->ipc_queued += ipc_job_chunks(j);
    if (a->ipc_jobs_tail) a->ipc_jobs_tail->next = j;
    else a->ipc_jobs = j;
    a->ipc_jobs_tail = j;
}

void ipc_job_free(ipc_job *j)
{
    free(j->pairs);
    free(j->idx);
    free(j->lv);
    free(j->rv);
    free(j->pieces);
    free(j);
}

/* Receiver: a DATA_IPC frame's copy is over (st: how it went): the pages are written, acknowledge. */
void ipc_job_complete(kvhal_xfer_agent *a, ipc_job *j, kvhal_status st, const char *why)
{
    kvhal_xfer *x = j->x;
    kvhal_xfer_peer *p = j->p;
    const uint64_t bytes = (uint64_t)j->n * (uint64_t)j->nl * 2u * a->g.chunk_bytes;
    char reason[XW_REASON_LEN];
    snprintf(reason, sizeof reason, "%s", why);
    x->inflight--;
    x->path = j->path;
    if (p && p->state == P_CONNECTED) send_ack(a, p, j->xfer_id, j->frame, st, st == KVHAL_OK ? bytes : 0, reason);
    ipc_job_free(j);
    recv_frame_end(x, st, bytes, reason); /* may free x */
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

/* Receiver (from pump): the accepted frames of the IPC path. Frames that need no device copy are settled first
 * (their transfer no longer received, their peer gone: refused). The
 * frames to copy from an imported cache go out in launch groups: queued frames of one peer become one batched copy
 * of all their (page, layer, K/V) chunks (adjacent ones merged) on a free stream, and pump acknowledges each frame
 * of the group once that stream is done. A group is full at IPC_GROUP_FULL ranges (a frame of 24 or more pages of
 * a 4-layer cache fills one alone; frames are added whole, up to IPC_GROUP_RANGES): a full group takes the next
 * free stream, so large copies overlap on up to IPC_STREAMS streams, and when every stream is busy pump waits for
 * the oldest copy (it ends within a copy's time). A group not full goes at once only when no other copy runs, else
 * it waits, gathering the frames that arrive meanwhile, until it fills or the running copy ends: a lone frame on an
 * idle receiver is copied at once, and under load the copies of many small transfers share one launch, whose cost
 * on the host is of the order of a 256 KiB transfer's copy over NVLink. Measured on 2 x H200 (
 * kvhal-xfer cuda:0 -> cuda:1 against cudaMemcpyPeer): with 16 transfers in flight 0.23 -> 0.56 at 256 KiB,
 * 0.40 -> 0.85 at 1 MiB, 0.71 -> 1.00 at 4 MiB against a launch per frame; waiting for the oldest copy rather than
 * going round pump when every stream is busy: 0.94 -> 1.25 at 16 MiB with 64 in flight. */
#define IPC_GROUP_FULL 192     /* ranges of a full launch group: two launches of the CUDA/HIP batched copy */
#define IPC_SMALL_GROUPS 1     /* launch groups running beyond which a group not full waits */
#define IPC_GROUP_RANGES 4096  /* ranges of a launch group at most, unless its first frame alone has more */
/* Chaining (see ipc_chain_slot): a group not full whose copy is shorter than the launch and the
 * detection of its end (a few us each) gains from going at once behind the running one; a larger one gains from
 * gathering the frames that land meanwhile into one launch. Measured with ABBA rounds on 2 x H100 (
 * cuda:0 -> cuda:1, 4-layer pages of 256 KiB; ratio to cudaMemcpyPeer, no chaining -> chaining): offers of 256 KiB
 * with 4 in flight 0.33 -> 0.39 and 0.31 -> 0.38, with 16 in flight 0.56 -> 0.64 and 0.54 -> 0.63 (two calls of
 * 10 rounds; bounded at 512 KiB 0.35 and 0.61); chaining groups of any size moved larger batches by -12% to +14%
 * either way, as much as rounds of one setting differ, and 64 offers of 256 KiB in flight 1.23 -> 1.01 in one call
 * (0.94 -> 0.93 in the other). So only groups of at most 512 KiB are chained by default; 13 rounds on a quieter
 * machine, none -> this bound: 256 KiB offers 0.37 -> 0.45 (4 in flight), 0.75 -> 0.81 (16), 1.42 -> 1.44 (64),
 * grants 0.31 -> 0.34, 0.77 -> 0.73, 1.22 -> 1.22, larger batches unchanged (IPC_CHAIN_BYTES). */

static bool ipc_job_needs_stream(const ipc_job *j)
{
    return !j->x->failing && j->p->state == P_CONNECTED && j->p->ipc_buf;
}

/* Settles a frame that needs no copy (see above): refused. */
static void ipc_job_settle(kvhal_xfer_agent *a, ipc_job *j)
{
    kvhal_xfer *x = j->x;
    if (x->failing) {
        char why[XW_REASON_LEN];
        snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)x->request_id);
        ipc_job_complete(a, j, KVHAL_CANCELED, why);
    } else {
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, "peer gone");
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

/* Launches the accepted frames, completes the copies that are over; returns how many groups completed, and one
 * more while copies run (pump's work: copies on the device count as work, so that the progress loops do not nap
 * while frames land and see a copy's end at once, which frees a stream for the frames waiting). A transfer whose
 * frames wait or are being copied here is not stalled: its deadline moves on. */
static unsigned ipc_progress(kvhal_xfer_agent *a)
{
    unsigned n = 0;
    if (!a->ipc_jobs && !a->ipc_running) return 0;
    if (a->pid != getpid()) {
        ipc_jobs_forget_forked(a);
        return n;
    }
    while (ipc_job_reap(a, false)) n++; /* first: their streams take the frames waiting */
    ipc_jobs_launch(a);
    const uint64_t deadline = deadline_from_now(a);
    for (ipc_job *j = a->ipc_jobs; j; j = j->next) j->x->deadline_ns = deadline;
    for (ipc_job *j = a->ipc_running; j; j = j->next) j->x->deadline_ns = deadline;
    return n + (a->ipc_running != NULL);
}

/* Waits for every running copy (they read a peer's imported memory and write our pages) and completes them. */
static void ipc_drain(kvhal_xfer_agent *a)
{
    while (ipc_job_reap(a, true)) {
    }
}

/* A peer going away: the device copies may still read its imported cache (closed when it is freed). */
static void ipc_peer_lost(kvhal_xfer_agent *a, const kvhal_xfer_peer *p)
{
    (void)p;
    ipc_drain(a);
}

static size_t ipc_held(const kvhal_xfer_agent *a)
{
    size_t n = 0;
    for (const ipc_job *j = a->ipc_jobs; j; j = j->next) n++;
    for (const ipc_job *j = a->ipc_running; j; j = j->next) n++;
    return n;
}

void peer_ipc_free(kvhal_xfer_peer *p)
{
    offers_free(p);
    if (p->ipc_buf) kvhal_buffer_destroy(p->ipc_buf);
    p->ipc_buf = NULL;
    p->cma = false;
    p->rx_path = NULL;
    free(p->ipc_off);
    p->ipc_off = NULL;
    free(p->map_frame);
    p->map_frame = NULL;
}

/* The IPC paths' sends (IPC, CMA): the peer imported our cache, so frames carry page ids only and the peer copies
 * the pages itself: DATA_IPC frames of (src, dst) pairs, or (r->dst NULL: an offer) OFFER frames of source pages,
 * the receiver's pages being those of its receive. Our pages' writes must be complete before they are announced
 * (the device is synchronized first), and they must stay unchanged until the peer's ACK (the transfer's
 * completion). */
kvhal_status send_pages_ipc(kvhal_xfer_peer *p, const xfer_send_req *r, kvhal_xfer **out)
{
    const uint64_t request_id = r->request_id;
    const int32_t *src_pages = r->src, *dst_pages = r->dst;
    const int32_t n = r->n, first_layer = r->first_layer, num_layers = r->num_layers;
    const bool offer = dst_pages == NULL;
    kvhal_xfer_agent *a = p->agent;
    kvhal_status st = kvhal_device_synchronize(kvhal_buffer_device(a->cache_buf));
    if (st != KVHAL_OK) return st;
    kvhal_xfer *x = xfer_new(a, p, false, request_id);
    if (!x) return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate the transfer");
    const int32_t per = XW_IPC_FRAME_PAGES;
    x->n = n;
    x->offer = offer;
    x->path = p->tx_path;
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

/* The IPC path: same host, the sender's cache shareable; the receiver imports its handle and copies the pages
 * itself on its device, in launch groups. */
const xfer_path xfer_path_ipc = {
    .name = "ipc",
    .send = send_pages_ipc,
    .job_queue = ipc_queue,
    .progress = ipc_progress,
    .peer_lost = ipc_peer_lost,
    .drain = ipc_drain,
    .held = ipc_held,
};

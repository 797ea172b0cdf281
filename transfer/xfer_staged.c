/* xfer_staged.c — the staged path: a device cache's pages go through host staging (the agent's pool) on both sides,
 * copied by one batched page copy where that applies, on the agent's stream or on a copy worker's own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"


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

/* A device cache's received frame: its staging copied to its pages. */
static kvhal_status recv_stage(kvhal_xfer_agent *a, kvhal_stream **stream, recv_frame *f, char *reason, size_t cap)
{
    const kvhal_status st = stage_frame(a, stream, false, f->stage_mem, f->staging, f->stage_pages, f->stage_n,
                                        f->stage_l0, f->stage_nl);
    if (st != KVHAL_OK) snprintf(reason, cap, "copy to the device failed: %s", kvhal_last_error());
    return st;
}

/* ---- sender: a frame's pages staged before it is posted ---- */

static bool staged_frame_init(kvhal_xfer_agent *a, send_frame *f, const int32_t *src, int32_t cnt, int32_t l0,
                              int32_t nl)
{
    (void)l0;
    (void)nl;
    /* the pages are copied to the staging when the frame is posted (staged_frame_ready): by a copy worker, so that
     * the frames before it are sent meanwhile, or by pump where none runs; a copy that fails fails the transfer
     * (SEND_DONE with the error), whichever copies it */
    f->staging = stage_alloc(a, f->bytes, &f->stage_mem);
    if (!f->staging || !(f->stage_src = malloc((size_t)cnt * sizeof(int32_t)))) return false;
    memcpy(f->stage_src, src, (size_t)cnt * sizeof(int32_t));
    return true;
}

/* On a copy worker (its own stream): the frame's source pages into its staging. */
static void stage_send_work(xfer_work *w, void **local)
{
    send_frame *f = XFER_WORK_OWNER(w, send_frame, work);
    f->work_status = stage_frame(f->x->agent, (kvhal_stream **)local, true, f->stage_mem, f->staging, f->stage_src,
                                 f->hdr->n_pages, f->hdr->first_layer, f->hdr->num_layers);
    if (f->work_status != KVHAL_OK) snprintf(f->work_why, sizeof f->work_why, "%s", kvhal_last_error());
}

static void stage_send_done(xfer_work *w, xfer_work_status st)
{
    send_frame *f = XFER_WORK_OWNER(w, send_frame, work);
    f->x->agent->staging_out -= f->bytes;
    free(f->stage_src); /* staged (or skipped): the page list is done with */
    f->stage_src = NULL;
    send_frame_worked(f, st, "staged");
}

static frame_ready staged_frame_ready(kvhal_xfer *x, send_frame *f)
{
    kvhal_xfer_agent *a = x->agent;
    if (a->staging_out && a->staging_out + f->bytes > STAGE_AHEAD_BYTES) return FRAME_BLOCKED;
    if (xfer_pool_start(&a->workers)) {
        f->work = (xfer_work){.work = stage_send_work, .done = stage_send_done, .pending = send_frame_pending};
        f->work_status = KVHAL_OK;
        f->work_why[0] = '\0';
        a->staging_out += f->bytes;
        send_frame_submit(a, f);
        return FRAME_WORKING;
    }
    const kvhal_status st = stage_frame(a, &a->stage_stream, true, f->stage_mem, f->staging, f->stage_src,
                                        f->hdr->n_pages, f->hdr->first_layer, f->hdr->num_layers);
    free(f->stage_src);
    f->stage_src = NULL;
    if (st != KVHAL_OK) {
        char why[XW_REASON_LEN];
        snprintf(why, sizeof why, "%s", kvhal_last_error());
        xfer_finish(x, st, "src_pages: copying frame %d to host memory failed: %s", (int)(f - x->frames), why);
        return FRAME_FAILED;
    }
    return FRAME_POST;
}

/* ---- receiver: a frame received into staging, then copied to the device ---- */

static bool staged_recv_init(kvhal_xfer_agent *a, recv_frame *f, const int32_t *pages, int32_t n, int32_t l0,
                             int32_t nl)
{
    f->staging = stage_alloc(a, f->bytes, &f->stage_mem);
    f->stage_pages = malloc((size_t)n * sizeof(int32_t));
    if (!f->staging || !f->stage_pages) return false;
    memcpy(f->stage_pages, pages, (size_t)n * sizeof(int32_t));
    f->stage_n = n;
    f->stage_l0 = l0;
    f->stage_nl = nl;
    return true;
}

static void rstage_work(xfer_work *w, void **local)
{
    recv_frame *f = XFER_WORK_OWNER(w, recv_frame, work);
    f->work_status = recv_stage(f->x->agent, (kvhal_stream **)local, f, f->work_why, sizeof f->work_why);
}

/* While the copy is out: a receive whose frames our workers still copy is not stalled by its peer; the copies of a
 * transfer that failed meanwhile are not started. */
static bool rstage_pending(xfer_work *w)
{
    kvhal_xfer *x = XFER_WORK_OWNER(w, recv_frame, work)->x;
    x->deadline_ns = deadline_from_now(x->agent);
    return !x->failing;
}

static void rstage_done(xfer_work *w, xfer_work_status st)
{
    recv_frame *f = XFER_WORK_OWNER(w, recv_frame, work);
    kvhal_xfer_agent *a = f->x->agent;
    a->rstaging_out -= f->bytes;
    a->rstaging--;
    kvhal_status s = f->work_status;
    char why[XW_REASON_LEN];
    memcpy(why, f->work_why, sizeof why);
    if (st == XFER_WORK_ORPHANED) {
        s = KVHAL_PEER_FAILED;
        snprintf(why, sizeof why, "the process forked while the frame was being copied");
    } else if (st == XFER_WORK_CANCELED) {
        s = KVHAL_CANCELED;
        snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)f->x->request_id);
    }
    /* a forked child does not acknowledge: the connection is the parent's, whose workers still copy the frame and
     * acknowledge it */
    recv_frame_finish(a, f, s, why, st != XFER_WORK_ORPHANED); /* may free its transfer */
}

/* The frame's data is in: a copy worker copies its staging to the device, so that pump goes on receiving (the frame
 * stays in flight in its transfer until rstage_done), up to STAGE_AHEAD_BYTES at once; past that, or without
 * workers, pump copies it here, and receives nothing meanwhile. */
static bool staged_recv_done(kvhal_xfer_agent *a, recv_frame *f, kvhal_status *st, char *reason, size_t cap)
{
    if ((!a->rstaging || a->rstaging_out + f->bytes <= STAGE_AHEAD_BYTES) && xfer_pool_start(&a->workers)) {
        f->work = (xfer_work){.work = rstage_work, .done = rstage_done, .pending = rstage_pending};
        f->work_status = KVHAL_OK;
        f->work_why[0] = '\0';
        a->rstaging++;
        a->rstaging_out += f->bytes;
        xfer_work *w = &f->work;
        xfer_pool_submit(&a->workers, &w, 1);
        return true;
    }
    *st = recv_stage(a, &a->stage_stream, f, reason, cap);
    return false;
}

/* The staged path: a device cache's pages go through host staging on both sides (DATA frames). */
const xfer_path xfer_path_staged = {
    .name = "staged",
    .send = send_data_pages,
    .sync_device = true,
    .frame_init = staged_frame_init,
    .frame_ready = staged_frame_ready,
    .recv_init = staged_recv_init,
    .recv_done = staged_recv_done,
};

/* xfer_jobs.c — the IPC paths' common part: their sends (DATA_IPC and OFFER frames of page ids), and on the
 * receiver the frames accepted (DATA_IPC frames, offers taken) as copy jobs: checked, claimed, queued on the peer's
 * receive path, and completed (acknowledged) once copied. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

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
    kvhal_status st = r->written ? KVHAL_OK : kvhal_device_synchronize(kvhal_buffer_device(a->cache_buf));
    if (st != KVHAL_OK) return st;
    kvhal_xfer *x = xfer_new(a, p, false, request_id);
    if (!x) return ERR(KVHAL_OUT_OF_MEMORY, "send_pages: cannot allocate the transfer");
    x->quiet = r->quiet;
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
    if (st == KVHAL_OK) recv_layers_end(x, j->l0, j->nl, j->n);
    ipc_job_free(j);
    recv_frame_end(x, st, bytes, reason); /* may free x */
}

/* xfer_recv.c — receiving DATA frames: checked against the grant before one byte is written, received where the
 * agent's DATA path puts them (straight into the pages, or into staging), acknowledged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

static void recv_data_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    recv_frame *f = user_data;
    f->done = true;
    f->done_status = status;
    ucp_request_free(request);
}

/* A DATA frame's checks against the grant x (h copied out, its n_pages checked): chunk size, layers, data length,
 * every page granted, and each (page, layer) at most once in this frame and across frames, which are claimed here
 * (pages, idx: the frame's pages and their grant indices). NULL, or why the frame is refused (in why). */
static const char *data_frame_claim(const kvhal_xfer_agent *a, kvhal_xfer *x, const xw_data *h, const void *header,
                                    size_t length, int32_t *pages, int32_t *idx, char *why, size_t cap)
{
    const int32_t L = a->g.num_layers;
    if (h->chunk_bytes != a->g.chunk_bytes) {
        snprintf(why, cap, "chunk_bytes %llu, this cache's is %llu", (unsigned long long)h->chunk_bytes,
                 (unsigned long long)a->g.chunk_bytes);
        return why;
    }
    if (h->first_layer < 0 || h->num_layers < 1 || h->first_layer > L - h->num_layers) {
        snprintf(why, cap, "layers [%d, %d+%d) outside [0, %d)", (int)h->first_layer, (int)h->first_layer,
                 (int)h->num_layers, (int)L);
        return why;
    }
    if (length != (uint64_t)h->n_pages * (uint64_t)h->num_layers * 2u * h->chunk_bytes) {
        snprintf(why, cap, "%zu data bytes, %d pages x %d layers x K,V x %llu bytes expected", length,
                 (int)h->n_pages, (int)h->num_layers, (unsigned long long)h->chunk_bytes);
        return why;
    }
    memcpy(pages, (const uint8_t *)header + sizeof *h, (size_t)h->n_pages * sizeof(int32_t));
    for (int32_t i = 0; i < h->n_pages; i++) {
        if (pages[i] < 0 || pages[i] >= a->g.num_blocks) {
            snprintf(why, cap, "page %d is out of range [0, %lld)", (int)pages[i], (long long)a->g.num_blocks);
            return why;
        }
        if ((idx[i] = grant_index(x, pages[i])) < 0) {
            snprintf(why, cap, "page %d is not granted to request %llu", (int)pages[i],
                     (unsigned long long)h->request_id);
            return why;
        }
    }
    /* claim, or undo and refuse */
    const int32_t l0 = h->first_layer, l1 = h->first_layer + h->num_layers;
    for (int32_t i = 0; i < h->n_pages; i++)
        for (int32_t l = l0; l < l1; l++) {
            if (!x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l]) {
                x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l] = 1;
                continue;
            }
            snprintf(why, cap, "page %d layer %d was already sent", (int)pages[i], (int)l);
            for (int32_t j = 0; j < i; j++)
                for (int32_t m = l0; m < l1; m++) x->claimed[(size_t)idx[j] * (size_t)L + (size_t)m] = 0;
            for (int32_t m = l0; m < l; m++) x->claimed[(size_t)idx[i] * (size_t)L + (size_t)m] = 0;
            return why;
        }
    return NULL;
}

/* Frees a receive frame and its buffers (the page list and staging of a device cache's). */
void recv_frame_free(kvhal_xfer_agent *a, recv_frame *f)
{
    free(f->iov);
    free(f->stage_pages);
    stage_release(a, f->stage_mem, f->staging);
    free(f);
}

/* The frame's data is in UCX's buffer (eager): copied to where the path receives it. */
static void recv_eager(recv_frame *f, const void *data)
{
    if (f->staging) {
        memcpy(f->staging, data, f->bytes);
        return;
    }
    const uint8_t *src = data;
    for (size_t i = 0; i < f->iov_count; i++) {
        memcpy(f->iov[i].buffer, src, f->iov[i].length);
        src += f->iov[i].length;
    }
}

/* A frame accepted: its data received where the agent's DATA path puts it (eager: copied now; rendezvous: UCX
 * writes each fragment straight into the chunks, or into the staging buffer). */
static ucs_status_t recv_start(kvhal_xfer_agent *a, recv_frame *f, void *data, bool rndv)
{
    f->next = a->rframes;
    a->rframes = f;
    f->x->inflight++;
    if (!rndv) {
        recv_eager(f, data);
        f->done = true;
        f->done_status = UCS_OK;
        return UCS_OK;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_DATATYPE,
                               .cb.recv_am = recv_data_cb, .user_data = f};
    size_t count;
    void *buf = frame_buffer(f->iov, f->iov_count, f->staging, f->bytes, &prm, &count);
    void *r = ucp_am_recv_data_nbx(a->worker, data, buf, count, &prm);
    if (r == NULL) {
        f->done = true;
        f->done_status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(r)) {
        f->done = true;
        f->done_status = UCS_PTR_STATUS(r);
    }
    return UCS_INPROGRESS;
}

/* A DATA frame from peer p: everything checked before one byte is written. Returns the UCS status for the
 * handler (an error status refuses a rendezvous frame, which fails the sender's send with it). */
ucs_status_t on_data(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length, void *data,
                     size_t length, bool rndv)
{
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
    int32_t pages[MAX_FRAME_PAGES], idx[MAX_FRAME_PAGES];
    char why[200];
    const char *bad = data_frame_claim(a, x, &h, header, length, pages, idx, why, sizeof why);
    if (bad) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "refused DATA frame for request %llu: %s",
                  (unsigned long long)h.request_id, bad);
        return UCS_ERR_INVALID_PARAM;
    }
    x->claimed_count += (int64_t)h.n_pages * h.num_layers;
    x->deadline_ns = deadline_from_now(a);
    x->path = a->data_path;
    recv_frame *f = calloc(1, sizeof *f);
    if (f) {
        *f = (recv_frame){.x = x, .xfer_id = h.xfer_id, .frame = h.frame, .bytes = length, .l0 = h.first_layer,
                          .nl = h.num_layers, .np = h.n_pages};
        if (a->data_path->recv_init(a, f, pages, h.n_pages, h.first_layer, h.num_layers))
            return recv_start(a, f, data, rndv);
        recv_frame_free(a, f);
    }
    kvhal_clear_error();
    const int32_t L = a->g.num_layers;
    for (int32_t i = 0; i < h.n_pages; i++)
        for (int32_t l = h.first_layer; l < h.first_layer + h.num_layers; l++)
            x->claimed[(size_t)idx[i] * (size_t)L + (size_t)l] = 0;
    x->claimed_count -= (int64_t)h.n_pages * h.num_layers;
    send_ack(a, p, h.xfer_id, h.frame, KVHAL_OUT_OF_MEMORY, 0, "receiver out of host memory");
    return UCS_ERR_NO_MEMORY;
}

/* A DATA frame's data is in (from pump): its path's last step (a device cache: the copy to the device), then the
 * frame ends. */
void recv_frame_done(kvhal_xfer_agent *a, recv_frame *f)
{
    kvhal_status st = KVHAL_OK;
    char reason[XW_REASON_LEN] = "";
    if (f->done_status != UCS_OK) {
        st = KVHAL_PEER_FAILED;
        snprintf(reason, sizeof reason, "receiving the frame failed: %s", ucs_status_string(f->done_status));
    } else if (!f->x->failing && a->data_path->recv_done &&
               a->data_path->recv_done(a, f, &st, reason, sizeof reason)) {
        return; /* handed on: ended later */
    }
    recv_frame_finish(a, f, st, reason, true);
}

/* The frame's end: acknowledged (unless ack is false), its buffers freed, its transfer settled (which may free it). */
void recv_frame_finish(kvhal_xfer_agent *a, recv_frame *f, kvhal_status st, const char *reason, bool ack)
{
    kvhal_xfer *x = f->x;
    const uint64_t bytes = f->bytes;
    x->inflight--;
    if (ack && x->peer && x->peer->state == P_CONNECTED) send_ack(a, x->peer, f->xfer_id, f->frame, st, bytes, reason);
    if (st == KVHAL_OK) recv_layers_end(x, f->l0, f->nl, f->np);
    recv_frame_free(a, f);
    recv_frame_end(x, st, bytes, reason); /* may free x */
}

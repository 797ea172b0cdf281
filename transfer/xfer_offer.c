/* xfer_offer.c — offers: on the IPC paths a sender names a request's pages before the receiver's grant
 * (kvhal_xfer_offer_pages); the receiver's receive takes them, or they expire or are withdrawn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

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
int offer_take_pending(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_xfer *x)
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

void on_offer(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
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
void on_withdraw(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length)
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
void offers_expire(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now)
{
    while (p->offers && now > p->offers->expires_ns) { /* the oldest first: its request's other frames with it */
        char r[XW_REASON_LEN];
        snprintf(r, sizeof r, "request %llu: no receive was posted for the offer within %u ms",
                 (unsigned long long)p->offers->request_id, (unsigned)(a->timeout_ms / 2));
        offers_refuse_request(a, p, p->offers->request_id, KVHAL_TIMEOUT, r);
    }
}

void offers_free(kvhal_xfer_peer *p)
{
    while (p->offers) {
        offer_rec *o = p->offers;
        offer_unlink(p, NULL, o);
        offer_free(o);
    }
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
    const xfer_send_req r = {.request_id = request_id, .src = src_pages, .n = n, .first_layer = first_layer,
                             .num_layers = num_layers};
    return p->tx_path->send(p, &r, out);
}

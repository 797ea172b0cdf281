/* xfer_stream.c — layer-by-layer streaming (kvhal_xfer.h, "Layer-by-layer streaming"). A stream is a send transfer
 * of its own (x->stream set, no frames): each layer handed to it goes, once its device event completed, as a send of
 * that one layer through the peer's send path (host, staged, IPC, CMA), a transfer marked quiet (it settles without
 * an event). pump collects the finished layers (streams_progress): their bytes count in the stream's, the first
 * failure fails the stream and cancels the layers still in flight, and the stream settles, like any send, once no
 * layer of it is left in flight (x->sends_inflight counts them). The receiver's side is a receive whose frames
 * report their layers (recv_layers_end, xfer_transfer.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

enum { LAYER_IDLE = 0, LAYER_WAITING = 1, LAYER_SENT = 2, LAYER_DONE = 3 };

struct xfer_stream { /* one block: the struct, then L layer transfers, L events, n + n pages, L states */
    kvhal_xfer **sub;     /* per layer: its send while in flight (LAYER_SENT) */
    kvhal_event **ev;     /* per layer: the caller's event (LAYER_WAITING; NULL: none) */
    int32_t *src, *dst;   /* n pages each */
    uint8_t *state;       /* per layer: LAYER_* */
    int32_t layers, done; /* the cache's layers; those acknowledged */
    uint64_t bytes;       /* acknowledged bytes of the layers collected */
    bool cancel_sent;     /* the stream failed: its layers in flight were canceled */
};

static kvhal_status check_stream(const kvhal_xfer *x)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(x->stream, "stream: request %llu is not a stream (kvhal_xfer_stream_open)",
              (unsigned long long)x->request_id);
    return KVHAL_OK;
}

/* Sends layer l of x now (its event, if any, completed: written). */
static kvhal_status layer_send(kvhal_xfer *x, int32_t l, bool written)
{
    struct xfer_stream *s = x->stream;
    kvhal_xfer_peer *p = x->peer;
    if (!p || p->state != P_CONNECTED || !p->tx_path)
        return ERR(KVHAL_PEER_FAILED, "stream of request %llu: the peer is gone", (unsigned long long)x->request_id);
    const xfer_send_req r = {.request_id = x->request_id, .src = s->src, .dst = s->dst, .n = x->n,
                             .first_layer = l, .num_layers = 1, .written = written, .quiet = true};
    kvhal_xfer *sub = NULL;
    kvhal_status st = p->tx_path->send(p, &r, &sub);
    if (st != KVHAL_OK) return st;
    s->sub[l] = sub;
    s->ev[l] = NULL;
    s->state[l] = LAYER_SENT;
    x->sends_inflight++;
    return KVHAL_OK;
}

/* One round of stream x: finished layers collected, layers whose event completed sent, the failure propagated;
 * *changed: the agent's list of transfers changed (a layer freed or made, x settled) or a round more is due. Returns
 * the layers still waiting on their events: pump polls them without napping (nothing else wakes it for them). */
static unsigned stream_step(kvhal_xfer *x, bool *changed)
{
    struct xfer_stream *s = x->stream;
    unsigned work = 0;
    uint64_t live = 0;
    for (int32_t l = 0; l < s->layers; l++) {
        kvhal_xfer *sub = s->sub[l];
        if (!sub) continue;
        if (!sub->finished) {
            live += sub->bytes_done;
            continue;
        }
        if (sub->status == KVHAL_OK) {
            s->state[l] = LAYER_DONE;
            s->done++;
        } else if (!x->failing) {
            xfer_finish(x, sub->status, "layer %d: %s", (int)l, sub->message);
        }
        s->bytes += sub->bytes_done;
        s->sub[l] = NULL;
        x->sends_inflight--;
        xfer_free(sub);
        *changed = true;
    }
    if (x->failing && !s->cancel_sent) { /* canceled, released, peer lost, a layer failed: the others stop */
        s->cancel_sent = true;
        for (int32_t l = 0; l < s->layers; l++)
            if (s->sub[l]) xfer_finish(s->sub[l], x->status, "the stream of request %llu failed: %s",
                                       (unsigned long long)x->request_id, x->message);
        *changed = true; /* those that settled at once are collected in the next round */
    }
    for (int32_t l = 0; l < s->layers && !x->failing; l++) {
        if (s->state[l] != LAYER_WAITING) continue;
        kvhal_status st = kvhal_event_query(s->ev[l]);
        if (st == KVHAL_BUSY) {
            work++;
            continue;
        }
        if (st == KVHAL_OK) st = layer_send(x, l, true);
        if (st != KVHAL_OK) xfer_finish(x, st, "layer %d: %s", (int)l, kvhal_last_error());
        *changed = true;
    }
    x->bytes_done = s->bytes + live;
    if (!x->failing && s->done == s->layers) {
        x->failing = true; /* final */
        x->status = KVHAL_OK;
        x->message[0] = '\0';
    }
    if (x->failing && !x->finished && x->sends_inflight == 0) {
        xfer_settle(x); /* may free x (released) */
        *changed = true;
    }
    return work;
}

unsigned streams_progress(kvhal_xfer_agent *a)
{
    unsigned work = 0;
again: /* a layer made or freed, or a stream freed, changes the list: start over (each time something moved) */
    for (kvhal_xfer *x = a->xfers; x; x = x->next) {
        if (!x->stream || x->finished) continue;
        bool changed = false;
        work += stream_step(x, &changed);
        if (changed) goto again;
    }
    return work;
}

kvhal_status kvhal_xfer_stream_open(kvhal_xfer_peer *p, uint64_t request_id, const int32_t *src_pages,
                                    const int32_t *dst_pages, int32_t n, kvhal_xfer **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_status st = check_peer(p);
    if (st != KVHAL_OK) return st;
    kvhal_xfer_agent *a = p->agent;
    CHECK_ARG(p->tx_path, "agent: no paged cache registered");
    CHECK_ARG(src_pages, "src_pages: NULL");
    CHECK_ARG(dst_pages, "dst_pages: NULL");
    CHECK_ARG(n >= 1 && n <= XW_MAX_GRANT, "n: %d is outside [1, %d]", (int)n, XW_MAX_GRANT);
    if ((st = check_pages("src_pages", src_pages, n, a->g.num_blocks)) != KVHAL_OK) return st;
    if ((st = check_pages("dst_pages", dst_pages, n, p->g.num_blocks)) != KVHAL_OK) return st;
    CHECK_ARG(!offer_in_flight(p, request_id, false), "request_id: %llu is offered to peer %s "
              "(kvhal_xfer_offer_pages): its receiver takes the offered pages itself", (unsigned long long)request_id,
              p->name);
    const size_t L = (size_t)a->g.num_layers;
    const size_t bytes = sizeof(struct xfer_stream) + L * (sizeof(kvhal_xfer *) + sizeof(kvhal_event *)) +
                         2u * (size_t)n * sizeof(int32_t) + L;
    kvhal_xfer *x = xfer_new(a, p, false, request_id);
    struct xfer_stream *s = x ? calloc(1, bytes) : NULL;
    if (!s) {
        free(x);
        return ERR(KVHAL_OUT_OF_MEMORY, "stream_open: cannot allocate the stream of %d pages", (int)n);
    }
    s->sub = (kvhal_xfer **)(void *)(s + 1);
    s->ev = (kvhal_event **)(void *)(s->sub + L);
    s->src = (int32_t *)(void *)(s->ev + L);
    s->dst = s->src + n;
    s->state = (uint8_t *)(s->dst + n);
    s->layers = (int32_t)L;
    memcpy(s->src, src_pages, (size_t)n * sizeof(int32_t));
    memcpy(s->dst, dst_pages, (size_t)n * sizeof(int32_t));
    x->stream = s;
    x->n = n;
    x->path = p->tx_path;
    x->bytes_total = (uint64_t)n * L * 2u * a->g.chunk_bytes;
    x->deadline_ns = UINT64_MAX; /* the stream waits for its caller; its layers, once sent, for the peer */
    x->next = a->xfers;
    a->xfers = x;
    *out = x;
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_stream_layer(kvhal_xfer *x, int32_t layer, kvhal_event *written)
{
    kvhal_status st = check_stream(x);
    if (st != KVHAL_OK) return st;
    struct xfer_stream *s = x->stream;
    if (layer < 0 || layer >= s->layers)
        return ERR(KVHAL_OUT_OF_RANGE, "layer: %d is outside the cache's [0, %d)", (int)layer, (int)s->layers);
    if (x->failing || x->finished)
        return ERR(x->status == KVHAL_OK || x->status == KVHAL_BUSY ? KVHAL_INVALID_ARGUMENT : x->status,
                   "stream of request %llu: %s", (unsigned long long)x->request_id,
                   x->message[0] ? x->message : "finished");
    CHECK_ARG(s->state[layer] == LAYER_IDLE, "layer: %d was handed to the stream of request %llu already", (int)layer,
              (unsigned long long)x->request_id);
    streams_progress(x->agent); /* layers handed before whose events completed go first */
    if (x->failing || x->finished) return ERR(x->status, "stream of request %llu: %s",
                                              (unsigned long long)x->request_id, x->message);
    if (written) {
        const kvhal_device d = kvhal_event_device(written), c = kvhal_buffer_device(x->agent->cache_buf);
        CHECK_ARG(d.type == c.type && d.id == c.id, "written: an event of %s:%d, the cache is on %s:%d",
                  kvhal_device_type_name(d.type), (int)d.id, kvhal_device_type_name(c.type), (int)c.id);
        s->ev[layer] = written;
        s->state[layer] = LAYER_WAITING; /* polled now, then from pump */
    } else if ((st = layer_send(x, layer, false)) != KVHAL_OK) {
        xfer_finish(x, st, "layer %d: %s", (int)layer, kvhal_last_error());
        return ERR(st, "%s", x->message);
    }
    streams_progress(x->agent);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_post_receive_layers(kvhal_xfer_peer *p, uint64_t request_id, const int32_t *pages, int32_t n,
                                            kvhal_cache_manager *cm, kvhal_xfer **out)
{
    kvhal_status st = check_peer(p);
    if (st != KVHAL_OK) return st;
    const int32_t L = p->agent->g.num_layers;
    int32_t *left = malloc((size_t)(L > 0 ? L : 1) * sizeof(int32_t));
    if (!left) return ERR(KVHAL_OUT_OF_MEMORY, "post_receive_layers: cannot allocate %d layer counts", (int)L);
    for (int32_t l = 0; l < L; l++) left[l] = n;
    if ((st = kvhal_xfer_post_receive(p, request_id, pages, n, cm, out)) != KVHAL_OK) {
        free(left);
        return st;
    }
    (*out)->layer_left = left; /* before any frame: they are written from pump */
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_layer_ready(const kvhal_xfer *x, int32_t layer)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(x->is_recv && x->layer_left, "xfer: request %llu is not a receive with layer events "
              "(kvhal_xfer_post_receive_layers)", (unsigned long long)x->request_id);
    const int32_t L = x->agent->g.num_layers;
    if (layer < 0 || layer >= L)
        return ERR(KVHAL_OUT_OF_RANGE, "layer: %d is outside the cache's [0, %d)", (int)layer, (int)L);
    if (x->layer_left[layer] == 0) return KVHAL_OK;
    if (x->finished && x->status != KVHAL_OK) return ERR(x->status, "%s", x->message);
    return KVHAL_BUSY;
}

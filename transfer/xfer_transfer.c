/* xfer_transfer.c — transfers (their life: new, settle, finish, release, free), the agent's event queue, and the
 * lookups of transfers and grants the rooms above share. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

void push_event(kvhal_xfer_agent *a, kvhal_xfer_event_type type, kvhal_xfer_peer *p, kvhal_xfer *x,
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
    if (p) {
        p->ev_queued++;
        p->ev_pages += pages_owned ? n : 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->ev.message, sizeof it->ev.message, fmt, ap);
    va_end(ap);
    a->ev_count++;
}

/* Forgets queued events that name p or x (both about to be freed). */
void scrub_events(kvhal_xfer_agent *a, const kvhal_xfer_peer *p, const kvhal_xfer *x)
{
    for (size_t i = 0; i < a->ev_count; i++) {
        event_item *it = &a->events[(a->ev_head + i) % a->ev_cap];
        if (p && it->ev.peer == p) it->ev.peer = NULL;
        if (x && it->ev.xfer == x) it->ev.xfer = NULL;
    }
}

kvhal_xfer *xfer_new(kvhal_xfer_agent *a, kvhal_xfer_peer *p, bool is_recv, uint64_t request_id)
{
    kvhal_xfer *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->magic = XFER_MAGIC;
    if (!kvhal__handle_add(x)) {
        free(x);
        return NULL;
    }
    x->agent = a;
    x->peer = p;
    x->is_recv = is_recv;
    x->status = KVHAL_BUSY;
    x->request_id = request_id;
    x->xfer_id = ++a->next_xfer_id;
    x->deadline_ns = deadline_from_now(a);
    return x;
}

void xfer_free(kvhal_xfer *x)
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
    free(x->stream);
    free(x->layer_left);
    kvhal__handle_remove_kind(x, XFER_MAGIC);
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

void xfer_settle(kvhal_xfer *x)
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
    if (x->quiet) return; /* a stream's layer: the stream collects it from pump (xfer_stream.c) */
    push_event(x->agent, x->is_recv ? KVHAL_XFER_EVENT_RECV_DONE : KVHAL_XFER_EVENT_SEND_DONE, x->peer, x,
               x->request_id, x->status, NULL, 0, "%s", x->message);
}

void xfer_finish(kvhal_xfer *x, kvhal_status st, const char *fmt, ...)
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

/* A receive's frame ended (st, bytes written; reason: why it failed): the receive completes once every (page, layer)
 * of its grant is written and no frame is in flight, fails with the frame's failure, or settles (may free x). */
void recv_frame_end(kvhal_xfer *x, kvhal_status st, uint64_t bytes, const char *reason)
{
    if (st == KVHAL_OK) {
        x->bytes_done += bytes;
        if (!x->failing && x->claimed_count == (int64_t)x->n * x->agent->g.num_layers && x->inflight == 0) {
            x->failing = true; /* final */
            x->status = KVHAL_OK;
            x->message[0] = '\0';
        }
        xfer_settle(x);
    } else if (!x->failing) {
        xfer_finish(x, st, "%s", reason);
    } else {
        xfer_settle(x); /* already failing: this may have been the last frame */
    }
}

kvhal_xfer *find_xfer_id(kvhal_xfer_agent *a, uint64_t id)
{
    for (kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->xfer_id == id) return x;
    return NULL;
}

/* Index of page in the grant, or -1. */
int32_t grant_index(const kvhal_xfer *x, int32_t page)
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

kvhal_xfer *find_grant(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t request_id)
{
    for (kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->is_recv && x->peer == p && x->request_id == request_id && !x->failing && !x->finished) return x;
    return NULL;
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
    if (!x || !kvhal__handle_live(x, XFER_MAGIC) || !x->path) return "";
    return x->path->name;
}

/* An offer of request_id to p not finished (withdrawing: failing only). */
bool offer_in_flight(const kvhal_xfer_peer *p, uint64_t request_id, bool failing_only)
{
    for (const kvhal_xfer *x = p->agent->xfers; x; x = x->next)
        if (x->offer && x->peer == p && x->request_id == request_id && !x->finished && (!failing_only || x->failing))
            return true;
    return false;
}

/* A receive with layer events (kvhal_xfer_post_receive_layers): np pages of layers [l0, l0 + nl) are written; a layer
 * whose every page is in is reported, unless the receive failed or was released meanwhile. */
void recv_layers_end(kvhal_xfer *x, int32_t l0, int32_t nl, int32_t np)
{
    if (!x->layer_left) return;
    for (int32_t l = l0; l < l0 + nl; l++) {
        x->layer_left[l] -= np;
        if (x->layer_left[l] == 0 && !x->failing && !x->released)
            push_event(x->agent, KVHAL_XFER_EVENT_LAYER_DONE, x->peer, x, x->request_id, KVHAL_OK, NULL, l,
                       "layer %d of request %llu is in", (int)l, (unsigned long long)x->request_id);
    }
}

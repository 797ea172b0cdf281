/* xfer_transfer.c — transfers (their life: settle, finish, release), the agent's event queue, and grants (a
 * receive posted: its GRANT frame; a peer's GRANT: an event for the sender). */
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

static int cmp_pair(const void *x, const void *y)
{
    const int32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
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

kvhal_status check_pages(const char *arg, const int32_t *pages, int32_t n, int64_t limit)
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

void on_grant(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length,
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
    if (!x || x->magic != XFER_MAGIC || !x->path) return "";
    return x->path->name;
}

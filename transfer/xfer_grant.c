/* xfer_grant.c — grants: a receive posted (its GRANT frame, or the offers waiting for it taken), and a peer's GRANT
 * (an event for the sender). */
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

static int cmp_pair(const void *x, const void *y)
{
    const int32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
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
        xfer_free(x);
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
            xfer_free(x);
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
    if (p->ev_queued >= PEER_EVENTS_MAX || p->ev_pages + g.n_pages > PEER_GRANT_PAGES_MAX) {
        peer_fail(p, KVHAL_OUT_OF_MEMORY, true, "grant flood: %d events with %lld page ids of this peer not yet "
                  "taken by kvhal_xfer_progress, and a GRANT of %d more (at most %d events, %d page ids)",
                  (int)p->ev_queued, (long long)p->ev_pages, (int)g.n_pages, PEER_EVENTS_MAX, PEER_GRANT_PAGES_MAX);
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

/* tier.h — the tier interface under a cache manager's device pages, and what the manager's hooks call.
 *
 * A tier (kvhal__tier) holds copies of whole device pages (one block of every layer's K and V) keyed by the page's
 * chain hash (kvhal_kv_page_hash) and checked against its tokens. The manager never looks inside a tier: it asks
 * find (is this page there?), store (copy these device pages in, making room as the tier sees fit), load (copy these
 * tier entries into these device pages), pin/unpin (keep entries a load is about to read), and wait/query for the
 * copies in flight. The host tier (host_tier.c) is the one implementation; a file or remote store implements the
 * same table and goes below it (its find/load then fall through to the next tier), without any change to the radix
 * tree or the manager. Copies of one tier go, in order, on one stream: a slot reused by a later store is written
 * after the loads that read it were, so an entry's slot needs no guard beyond the pins of the current call.
 *
 * The tiering (kvhal__tiering, tiering.c) is the manager's side: the map from each device page of the prefix tree
 * to its hash, parent hash and tokens (filled when a finished request's pages enter the tree, read on eviction),
 * the write policy, the KV event queue and the hooks below. */
#ifndef KVHAL_CORE_TIER_H
#define KVHAL_CORE_TIER_H

#include "internal.h"

typedef struct kvhal__kv_events kvhal__kv_events;

typedef struct kvhal__tier kvhal__tier;
typedef struct kvhal__tier_ops {
    const char *name;
    /* The entry holding the page hash with these tokens (page_size of them), or -1. any: also an entry whose copy
     * in is still in flight (pending: never a hit, but not to be copied again). */
    int32_t (*find)(kvhal__tier *t, uint64_t hash, const int32_t *tokens, bool any);
    /* Marks an entry most recently used. */
    void (*touch)(kvhal__tier *t, int32_t slot);
    /* Copies n device pages in (dev_pages[i] with hashes[i], parents[i], tokens + i * page_size), making room by
     * dropping least recently used unpinned entries (reported as removed events). Pages it already holds are
     * touched, not copied again. *stored: pages copied, their device pages in copied[0..*stored) (cap n). The new
     * entries are pending until complete(): their stored events go out then. On an error nothing of this call is
     * kept. */
    kvhal_status (*store)(kvhal__tier *t, size_t n, const int32_t *dev_pages, const uint64_t *hashes,
                          const uint64_t *parents, const int32_t *tokens, size_t *stored, int32_t *copied);
    /* Enqueues copies of entries slots[i] into device pages dev_pages[i]. */
    kvhal_status (*load)(kvhal__tier *t, size_t n, const int32_t *slots, const int32_t *dev_pages);
    void (*pin)(kvhal__tier *t, int32_t slot, int delta);
    /* Drops every entry (a cleared event). */
    kvhal_status (*clear)(kvhal__tier *t);
    kvhal_status (*wait)(kvhal__tier *t);
    /* KVHAL_OK when every copy enqueued so far is complete, KVHAL_BUSY when not (never waits, except where the
     * device has no stream to poll). */
    kvhal_status (*query)(kvhal__tier *t);
    /* Called once wait or query said the copies are complete: pending entries become valid. */
    void (*complete)(kvhal__tier *t);
    kvhal_status (*check)(const kvhal__tier *t);
    void (*stats)(const kvhal__tier *t, kvhal_host_tier_stats *out);
    void (*destroy)(kvhal__tier *t);
} kvhal__tier_ops;

struct kvhal__tier {
    const kvhal__tier_ops *ops;
};

/* The host tier: host_budget bytes of pinned host pages for cache, copies on stream (NULL: its own or the default
 * stream). *out NULL and KVHAL_OK when the budget holds no page. */
KVHAL_HIDDEN kvhal_status kvhal__host_tier_create(kvhal_paged_cache *cache, uint64_t host_budget,
                                                  kvhal_stream *stream, int32_t page_size, kvhal__kv_events *ev,
                                                  kvhal__tier **out);

/* ---- KV events (kv_events.c) ---- */
KVHAL_HIDDEN kvhal_status kvhal__kv_events_create(uint32_t capacity, int32_t page_size, kvhal__kv_events **out);
KVHAL_HIDDEN void kvhal__kv_events_destroy(kvhal__kv_events *ev);
/* Queues one event (ev may be NULL: nothing). tokens: page_size tokens for a stored event, else NULL. A full queue
 * turns its last entry into an overflow event that counts what is lost. */
KVHAL_HIDDEN void kvhal__kv_event_push(kvhal__kv_events *ev, kvhal_kv_event_type type, kvhal_kv_tier tier,
                                       uint64_t hash, uint64_t parent, int32_t page, const int32_t *tokens);
/* Removed events for pages[0..n) (hash[p], parent[p] per page p; pages at or past total are skipped), as n pushes
 * would queue them. */
KVHAL_HIDDEN void kvhal__kv_events_push_removed(kvhal__kv_events *ev, kvhal_kv_tier tier, const int32_t *pages,
                                               size_t n, const uint64_t *hash, const uint64_t *parent, uint32_t total);
KVHAL_HIDDEN size_t kvhal__kv_events_read(kvhal__kv_events *ev, kvhal_kv_event *out, int32_t *tokens, size_t cap);
KVHAL_HIDDEN uint64_t kvhal__kv_events_dropped(const kvhal__kv_events *ev);

/* ---- the manager's side (tiering.c) ---- */
typedef struct kvhal__tiering kvhal__tiering;
KVHAL_HIDDEN kvhal_status kvhal__tiering_create(const kvhal_host_tier_config *cfg, int32_t total_pages,
                                                int32_t page_size, kvhal__tiering **out);
KVHAL_HIDDEN void kvhal__tiering_destroy(kvhal__tiering *t);
/* A finished request's pages [first, aligned) of pages (tokens from the same index, parent the hash before page 0)
 * entered the tree; pages [0, first) were already there. */
KVHAL_HIDDEN kvhal_status kvhal__tiering_inserted(kvhal__tiering *t, const int32_t *tokens, const int32_t *pages,
                                                  size_t first, size_t aligned, uint64_t parent);
/* The hash of a tree page (the parent of what follows it). */
KVHAL_HIDDEN uint64_t kvhal__tiering_page_hash(const kvhal__tiering *t, int32_t page);
KVHAL_HIDDEN uint64_t kvhal__tiering_root(const kvhal__tiering *t);
/* Eviction: pages leave the tree (removed events, when events are on). Nothing is copied, waited for
 * or completed here: copies that finished are reaped by the next allocate, load_back or transfer call. */
KVHAL_HIDDEN void kvhal__tiering_evicted(kvhal__tiering *t, const int32_t *pages, size_t n);
/* Write-back with a host tier: evicted pages first, first + step, ... (len of them, step >= 1), which the manager
 * took from the tree and made drain, are queued for their copy (in eviction order; the next reap stores them). */
KVHAL_HIDDEN void kvhal__tiering_queue(kvhal__tiering *t, int32_t first, int32_t step, int32_t len);
/* A bit per device page whose copy out is in flight or not reaped yet (write-through: pages stored on insert), for
 * eviction to read by words: an evicted page with its bit set drains (the manager keeps it from requests until a
 * reap hands it back). NULL when no page has one. Valid until the next tiering call. */
KVHAL_HIDDEN const uint64_t *kvhal__tiering_copy_bits(const kvhal__tiering *t);
/* Whether write-backs are queued or copies out of device pages (or into host entries) may be in flight. */
KVHAL_HIDDEN bool kvhal__tiering_busy(const kvhal__tiering *t);
/* Stores the queued write-backs (store: their copies enqueued; it may drop host entries to make room), then, when
 * the tier's copies are complete (wait: waits for them; else a query that never waits): host entries become valid. *done[0..*n) lists the device pages now
 * done with (copies finished, or nothing to copy); the manager frees those that drain. An error of the store is
 * returned after *done is filled (the pages are lost to the host tier only). */
KVHAL_HIDDEN kvhal_status kvhal__tiering_reap(kvhal__tiering *t, bool wait, bool store, const uint64_t *drain_bits,
                                              int32_t ndrain, const int32_t **done, size_t *n);
/* Whether a copy out of device page p is in flight. */
KVHAL_HIDDEN bool kvhal__tiering_copying(const kvhal__tiering *t, int32_t p);
/* check_integrity: every page queued for write-back drains (once), and every draining page (drain_bits, the
 * manager's) is queued or has a copy out of it in flight. */
KVHAL_HIDDEN kvhal_status kvhal__tiering_check_drain(const kvhal__tiering *t, const uint64_t *drain_bits);
/* Write-back with a host tier: eviction queues every page it evicts for its copy (the manager makes them drain at
 * once, instead of freeing them, and queues them with kvhal__tiering_queue); otherwise only those flagged in
 * kvhal__tiering_copy_bits drain. */
KVHAL_HIDDEN bool kvhal__tiering_queues_all(const kvhal__tiering *t);
/* How many whole pages past a device match the host tier holds: tokens from page index first, parent hash given.
 * slots (may be NULL) receives their entries, up to cap. */
KVHAL_HIDDEN size_t kvhal__tiering_host_run(kvhal__tiering *t, const int32_t *tokens, size_t num_tokens, size_t first,
                                            uint64_t parent, int32_t *slots, size_t cap);
KVHAL_HIDDEN kvhal__tier *kvhal__tiering_tier(kvhal__tiering *t);
KVHAL_HIDDEN kvhal__kv_events *kvhal__tiering_events(kvhal__tiering *t);
/* Every page of the tree has the page-map entry its insert wrote (hash = f(parent hash, tokens)); the tier checks. */
KVHAL_HIDDEN kvhal_status kvhal__tiering_check(const kvhal__tiering *t, const kvhal_prefix_cache *pc);

#endif

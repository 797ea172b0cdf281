/* tiering.h — the cache manager's side of the tiers (tiering.c): the map from each device page of the prefix tree
 * to its hash, parent hash and tokens (filled when a finished request's pages enter the tree, read on eviction),
 * the write policy, the KV event queue and the hooks the manager calls. */
#ifndef KVHAL_CORE_TIERING_H
#define KVHAL_CORE_TIERING_H

#include "kv_events.h"
#include "tier.h"

typedef struct kvhal__tiering kvhal__tiering;
KVHAL_HIDDEN kvhal_status kvhal__tiering_create(const kvhal_host_tier_config *cfg, int32_t total_pages,
                                                int32_t page_size, kvhal__tiering **out);
KVHAL_HIDDEN void kvhal__tiering_destroy(kvhal__tiering *t);
/* A finished request's pages [first, aligned) of pages (tokens from the same index, parent the hash before page 0)
 * entered the tree; pages [0, first) were already there. It cannot fail: the pages are the tree's now. A
 * write-through copy that fails (an allocation, a device error) leaves the pages on the device only, counted by
 * kvhal__tiering_write_failures and logged as a warning. */
KVHAL_HIDDEN void kvhal__tiering_inserted(kvhal__tiering *t, const int32_t *tokens, const int32_t *pages,
                                                  size_t first, size_t aligned, uint64_t parent);
/* Pages whose copy to the host tier failed (write-through finishes and write-back stores). */
KVHAL_HIDDEN uint64_t kvhal__tiering_write_failures(const kvhal__tiering *t);
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
 * the tier's copies are complete (wait: waits for every copy on the tier's stream, load_back's too, even when no
 * copy out is in flight; else a query that never waits): host entries become valid. *done[0..*n) lists the device pages now
 * done with (copies finished, or nothing to copy); the manager frees those that drain. A store that fails is no
 * error here: its pages are lost to the host tier only (counted, kvhal__tiering_write_failures); the error returned
 * is the wait's or the query's (a device error). */
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

/* kv_events.h — the queue of KV events (kv_events.c): pages stored in and removed from the device and host tiers,
 * for a cache manager's caller to read. */
#ifndef KVHAL_CORE_KV_EVENTS_H
#define KVHAL_CORE_KV_EVENTS_H

#include "common.h"

typedef struct kvhal__kv_events kvhal__kv_events;

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

#endif

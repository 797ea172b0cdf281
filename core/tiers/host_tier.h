/* host_tier.h — the host tier (host_tier.c): pinned host pages below a cache manager's device pages. */
#ifndef KVHAL_CORE_HOST_TIER_H
#define KVHAL_CORE_HOST_TIER_H

#include "kv_events.h"
#include "tier.h"

/* The host tier: host_budget bytes of pinned host pages for cache, copies on stream (NULL: its own or the default
 * stream). *out NULL and KVHAL_OK when the budget holds no page. */
KVHAL_HIDDEN kvhal_status kvhal__host_tier_create(kvhal_paged_cache *cache, uint64_t host_budget,
                                                  kvhal_stream *stream, int32_t page_size, kvhal__kv_events *ev,
                                                  kvhal__tier **out);

#endif

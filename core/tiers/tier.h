/* tier.h — the tier interface under a cache manager's device pages. Definitions only: a tier implements the table
 * (host_tier.c), the tiering (tiering.c) and the cache manager call it.
 *
 * A tier (kvhal__tier) holds copies of whole device pages (one block of every layer's K and V) keyed by the page's
 * chain hash (kvhal_kv_page_hash) and checked against its tokens. The manager never looks inside a tier: it asks
 * find (is this page there?), store (copy these device pages in, making room as the tier sees fit), load (copy these
 * tier entries into these device pages), pin/unpin (keep entries a load is about to read), and wait/query for the
 * copies in flight. The host tier (host_tier.c) is the one implementation; a file or remote store implements the
 * same table and goes below it (its find/load then fall through to the next tier), without any change to the radix
 * tree or the manager. Copies of one tier go, in order, on one stream: a slot reused by a later store is written
 * after the loads that read it were, so an entry's slot needs no guard beyond the pins of the current call. */
#ifndef KVHAL_CORE_TIER_H
#define KVHAL_CORE_TIER_H

#include "common.h"

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

#endif

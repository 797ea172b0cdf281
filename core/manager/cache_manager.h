/* cache_manager.h — what the files of the cache manager share (cache_manager.c implements it): the manager's
 * struct, its handle checks, the owner bits of a page, and the reap of finished copies out of draining pages. */
#ifndef KVHAL_CORE_CACHE_MANAGER_H
#define KVHAL_CORE_CACHE_MANAGER_H

#include "error.h"
#include "handles.h"
#include "tiering.h"

#define CM_MAGIC 0x4b56434du /* KVCM */

struct kvhal_cache_manager {
    uint32_t magic;
    atomic_bool in_use;      /* KVHAL_OWNER_ENTER / LEAVE */
    int32_t total;
    int32_t page_size;
    int32_t nfree;
    kvhal_prefix_cache *pc;
    uint64_t *free_bits;     /* bit p: page p is free; bits past total stay 0 */
    uint64_t *tree_bits;     /* bit p: page p is the prefix cache's (never with its free bit) */
    uint64_t *free_sum;      /* bit w: free_bits[w] != 0 */
    uint64_t *drain_bits;    /* bit p: page p left the tree and a copy out of it is in flight (tiered only):
                              * neither free nor cached nor held; free again once a reap sees the copy done */
    int32_t ndrain;
    size_t nwords, nsum;
    size_t low;              /* every bitmap word below this one is 0 (no free page) */
    int64_t held;            /* pages held by running requests */
    uint64_t evicted_pages;
    kvhal_status cb_status;  /* first error seen inside an eviction callback */
    kvhal__tiering *tiering; /* NULL unless made by create_tiered (tiering.c, tier.h) */
    int32_t *view_match;     /* match_view's page ids when they span several nodes (total of room, made at its first
                              * call; within one node they are the tree's own), then allocate_view's */
    int32_t *view_alloc;
    int32_t *view_admit;     /* admit's: the matched page ids, then the allocated ones (total of room) */
};

static inline kvhal_status kvhal__cm_check_magic(const kvhal_cache_manager *cm)
{
    if (!cm) return kvhal__err(KVHAL_INVALID_HANDLE, "cm: NULL");
    if (cm->magic != CM_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "cm: %p is not a live cache manager", (const void *)cm);
    return KVHAL_OK;
}

/* The entry points' check: the live-handle set first, so that a destroyed cache manager is refused without its memory
 * being read (unless a new object of this kind was created at the same address since: see kvhal.h); the calls
 * behind them use the magic check only. */
static inline kvhal_status kvhal__cm_check(const kvhal_cache_manager *cm)
{
    if (cm && !kvhal__handle_live(cm, CM_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "cm: %p is not a live cache manager (destroyed?)", (const void *)cm);
    return kvhal__cm_check_magic(cm);
}

static inline bool page_is_tree(const kvhal_cache_manager *cm, uint32_t p)
{
    return (cm->tree_bits[p >> 6] >> (p & 63)) & 1;
}

/* Completed drains become free: a query that never waits, or (wait) a wait for the tier's copies. The queued
 * write-backs are stored first (their copies enqueued), except by match (store false), which must see the host
 * tier as it was (storing may drop host entries to make room). */
KVHAL_HIDDEN kvhal_status kvhal__cm_reap(kvhal_cache_manager *cm, bool wait, bool store);
/* match, allocate and free without taking cm: for the tiered entry points (manager_tiered.c), which hold it. */
KVHAL_HIDDEN kvhal_status kvhal__cm_match(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                          kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                          size_t pages_cap);
KVHAL_HIDDEN kvhal_status kvhal__cm_allocate(kvhal_cache_manager *cm, int32_t n, int32_t *pages);
KVHAL_HIDDEN kvhal_status kvhal__cm_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n);

#endif

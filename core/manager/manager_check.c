/* manager_check.c — the full check of a cache manager's invariants (kvhal_cache_manager_check_integrity): the
 * owner bits against the free count, the prefix cache and the tiers. */
#include "cache_manager.h"
#include "owner.h"
#include "prefix_owned.h"
#include "prefix_pages.h"

typedef struct tree_count {
    const kvhal_cache_manager *cm;
    size_t pages;
    int32_t bad; /* first page not marked as the tree's, or -1 */
} tree_count;

static void count_tree_page(const int32_t *pages, size_t n, void *user)
{
    tree_count *tc = user;
    for (size_t i = 0; i < n; i++) {
        int32_t p = pages[i];
        if (tc->bad < 0 && (p < 0 || p >= tc->cm->total || !page_is_tree(tc->cm, (uint32_t)p)))
            tc->bad = p;
    }
    tc->pages += n;
}

/* The free set: bitmap, summary bits and count agree, no bit past the last page, nothing free below `low`. */
static kvhal_status check_free_set(const kvhal_cache_manager *cm)
{
    size_t total = (size_t)cm->total, count = 0;
    for (size_t w = 0; w < cm->nwords; w++) {
        uint64_t x = cm->free_bits[w];
        count += (size_t)__builtin_popcountll(x);
        if (((cm->free_sum[w >> 6] >> (w & 63)) & 1) != (x != 0))
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: summary bit of free word %zu is wrong", w);
    }
    if (total % 64 && cm->free_bits[cm->nwords - 1] >> (total % 64))
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: free bits set past the last page");
    if (cm->nwords % 64 && cm->free_sum[cm->nsum - 1] >> (cm->nwords % 64))
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: summary bits set past the last word");
    if (count != (size_t)cm->nfree || cm->nfree < 0 || cm->low >= cm->nwords)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %zu free bits but a count of %d (lowest free word %zu of "
                          "%zu)", count, (int)cm->nfree, cm->low, cm->nwords);
    for (size_t w = 0; w < cm->low; w++)
        if (cm->free_bits[w])
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: free pages in word %zu, below the lowest free word %zu",
                              w, cm->low);
    return KVHAL_OK;
}

static kvhal_status kvhal_cache_manager_check_integrity__body(const kvhal_cache_manager *cm)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    KVHAL_TRY(check_free_set(cm));
    KVHAL_TRY(kvhal__prefix_check_integrity_owned(cm->pc));
    int64_t cached = 0, draining = 0;
    for (size_t w = 0; w < cm->nwords; w++) {
        const uint64_t both = cm->free_bits[w] & cm->tree_bits[w];
        if (both)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %zu is both free and cached",
                              (w << 6) + (size_t)__builtin_ctzll(both));
        const uint64_t dboth = cm->drain_bits[w] & (cm->free_bits[w] | cm->tree_bits[w]);
        if (dboth)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %zu is draining and also free or cached",
                              (w << 6) + (size_t)__builtin_ctzll(dboth));
        if (cm->drain_bits[w] && !cm->tiering)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %zu is draining in a manager without tiers",
                              (w << 6) + (size_t)__builtin_ctzll(cm->drain_bits[w]));
        cached += __builtin_popcountll(cm->tree_bits[w]);
        draining += __builtin_popcountll(cm->drain_bits[w]);
    }
    if (cm->tiering) KVHAL_TRY(kvhal__tiering_check_drain(cm->tiering, cm->drain_bits));
    if (draining != cm->ndrain)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %lld pages flagged draining, a count of %d",
                          (long long)draining, (int)cm->ndrain);
    if (cm->total % 64 && cm->tree_bits[cm->nwords - 1] >> (cm->total % 64))
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: cached bits set past the last page");
    const int64_t held = (int64_t)cm->total - cm->nfree - cached - draining; /* no bit */
    kvhal_prefix_size_info si;
    KVHAL_TRY(kvhal__prefix_size_info_get_owned(cm->pc, &si));
    tree_count tc = {cm, 0, -1};
    KVHAL_TRY(kvhal__prefix_for_each_page(cm->pc, count_tree_page, &tc));
    if (tc.bad >= 0)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d is in the prefix cache but not marked as its own",
                          (int)tc.bad);
    size_t tree_pages = si.total_tokens / (size_t)cm->page_size;
    if (cm->tiering) KVHAL_TRY(kvhal__tiering_check(cm->tiering, cm->pc));
    int32_t nfree = cm->nfree;
    if (held != cm->held || (size_t)cached != tree_pages || tc.pages != tree_pages ||
        (int64_t)nfree + cm->held + (int64_t)tree_pages + cm->ndrain != cm->total)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %d free + %zu cached (%zu evictable, %zu protected) + %lld "
                          "held by requests + %d draining != %d pages (pages seen: %d free, %lld cached, %lld held)",
                          (int)nfree, tree_pages, si.evictable_tokens / (size_t)cm->page_size,
                          si.protected_tokens / (size_t)cm->page_size, (long long)cm->held, (int)cm->ndrain,
                          (int)cm->total,
                          (int)nfree, (long long)cached, (long long)held);
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_check_integrity(const kvhal_cache_manager *cm)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), (kvhal_cache_manager *)cm, "cm", kvhal_cache_manager_check_integrity__body(cm));
}

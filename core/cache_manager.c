/* cache_manager.c — the pages of one paged cache, split between three owners: the free pool (a block pool), the
 * prefix cache (finished requests' prefixes, evictable unless locked) and running requests. Allocation evicts
 * prefixes when free pages run short; a finished request hands its pages to the prefix cache.
 * A per-page owner byte lets every call check the pages it is given (a tree page can never be freed by a request,
 * a free page never inserted), so a caller's bookkeeping error is reported instead of corrupting the cache.
 * Whether a page is free is the block pool's to say (reference count 0); the owner byte only tells the allocated
 * ones apart (held by a request or cached), so eviction touches one array per page, not two.
 * Not thread-safe: the scheduler that owns it serialises calls. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

#define CM_MAGIC 0x4b56434du /* KVCM */

/* PAGE_FREE is written where a request gives a page back; an evicted page keeps PAGE_TREE until it is allocated
 * again (the pool's count says it is free), so a free page reads FREE or TREE, never HELD. */
enum { PAGE_FREE = 0, PAGE_HELD = 1, PAGE_TREE = 2, PAGE_MARK = 3 };

struct kvhal_cache_manager {
    uint32_t magic;
    int32_t total;
    int32_t page_size;
    kvhal_block_pool *pool;
    kvhal_prefix_cache *pc;
    uint8_t *state;          /* per page: PAGE_* */
    int64_t held;            /* pages held by running requests */
    uint64_t evicted_pages;
    kvhal_status cb_status;  /* first error seen inside an eviction callback */
};

static kvhal_status check_cm(const kvhal_cache_manager *cm)
{
    if (!cm) return kvhal__err(KVHAL_INVALID_HANDLE, "cm: NULL");
    if (cm->magic != CM_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "cm: %p is not a live cache manager", (const void *)cm);
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_create(int32_t total_pages, int32_t page_size, kvhal_prefix_kind kind,
                                        kvhal_cache_manager **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    if (total_pages < 1) return kvhal__err(KVHAL_INVALID_ARGUMENT, "total_pages: %d must be >= 1", (int)total_pages);
    if (page_size < 1) return kvhal__err(KVHAL_INVALID_ARGUMENT, "page_size: %d must be >= 1", (int)page_size);
    kvhal_cache_manager *cm = kvhal__calloc(1, sizeof *cm);
    if (!cm) return kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory for the manager");
    kvhal_status st = kvhal_prefix_cache_create(kind, page_size, &cm->pc);
    if (st == KVHAL_OK) st = kvhal_block_pool_create(total_pages, &cm->pool);
    if (st == KVHAL_OK && !(cm->state = kvhal__malloc((size_t)total_pages)))
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory for the owner of %d pages", (int)total_pages);
    if (st == KVHAL_OK) memset(cm->state, PAGE_FREE, (size_t)total_pages); /* touched now, not page by page later */
    if (st != KVHAL_OK) {
        kvhal_block_pool_destroy(cm->pool);
        kvhal_prefix_cache_destroy(cm->pc);
        free(cm);
        return st;
    }
    cm->total = total_pages;
    cm->page_size = page_size;
    cm->magic = CM_MAGIC;
    if (!kvhal__handle_add(cm)) {
        kvhal_block_pool_destroy(cm->pool);
        kvhal_prefix_cache_destroy(cm->pc);
        free(cm->state);
        free(cm);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory to register the handle");
    }
    *out = cm;
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_destroy(kvhal_cache_manager *cm)
{
    if (!cm) return KVHAL_OK;
    if (!kvhal__handle_remove_kind(cm, CM_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "cm: %p is not a live cache manager (destroyed twice?)", (void *)cm);
    cm->magic = KVHAL_MAGIC_DEAD;
    kvhal_prefix_cache_destroy(cm->pc);
    kvhal_block_pool_destroy(cm->pool);
    free(cm->state);
    free(cm);
    return KVHAL_OK;
}

kvhal_prefix_cache *kvhal_cache_manager_prefix(kvhal_cache_manager *cm)
{
    return (cm && cm->magic == CM_MAGIC) ? cm->pc : NULL;
}

kvhal_status kvhal_cache_manager_match(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                       kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                       size_t pages_cap)
{
    KVHAL_TRY(check_cm(cm));
    kvhal_prefix_handle h = NULL;
    KVHAL_TRY(kvhal_prefix_match(cm->pc, tokens, num_tokens, &h, cached_len, pages, pages_cap));
    if (h) KVHAL_TRY(kvhal_prefix_lock(cm->pc, h)); /* fresh from match: only a lock-count overflow can fail */
    if (handle) *handle = h;
    return KVHAL_OK;
}

/* Eviction hands a leaf's tree pages back to the pool, in one call per leaf. */
static void evicted_cb(const int32_t *pages, size_t n, void *user)
{
    kvhal_cache_manager *cm = user;
    if (kvhal__block_pool_release_many(cm->pool, pages, n) == KVHAL_OK) {
        cm->evicted_pages += n;
        return;
    }
    /* Something is off (a page free already, listed twice, or not ours): free what can be freed, page by page,
     * and report the first bad one; check_integrity tells the rest. */
    for (size_t i = 0; i < n; i++) {
        int32_t p = pages[i];
        if (p >= 0 && p < cm->total && cm->state[p] == PAGE_TREE && kvhal_block_pool_ref_count(cm->pool, p) > 0) {
            kvhal_block_pool_release(cm->pool, p);
            cm->evicted_pages++;
        } else if (cm->cb_status == KVHAL_OK) {
            cm->cb_status = kvhal__err(KVHAL_INTEGRITY, "cache manager: evicted page %d was not a cached page",
                                       (int)p);
        }
    }
}

static kvhal_status evict_tokens(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted)
{
    cm->cb_status = KVHAL_OK;
    KVHAL_TRY(kvhal_prefix_evict(cm->pc, num_tokens, evicted_cb, cm, evicted));
    return cm->cb_status;
}

kvhal_status kvhal_cache_manager_evict(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted)
{
    KVHAL_TRY(check_cm(cm));
    if (evicted) *evicted = 0;
    kvhal_prefix_size_info si;
    KVHAL_TRY(kvhal_prefix_size_info_get(cm->pc, &si));
    if (si.evictable_tokens == 0) return KVHAL_OK; /* also keeps the naive cache's evict(n > 0) error away */
    return evict_tokens(cm, num_tokens, evicted);
}

kvhal_status kvhal_cache_manager_allocate(kvhal_cache_manager *cm, int32_t n, int32_t *pages)
{
    KVHAL_TRY(check_cm(cm));
    if (n < 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "n: %d is negative", (int)n);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(pages, "pages: NULL for %d pages", (int)n);
    int32_t nfree = kvhal_block_pool_num_free(cm->pool);
    if (nfree < n) {
        kvhal_prefix_size_info si;
        KVHAL_TRY(kvhal_prefix_size_info_get(cm->pc, &si));
        size_t evictable = si.evictable_tokens / (size_t)cm->page_size;
        if ((size_t)nfree + evictable < (size_t)n)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "n: %d pages requested, only %d free + %zu evictable of %d (the "
                              "rest are locked by running requests or held by them)", (int)n, (int)nfree, evictable,
                              (int)cm->total);
        KVHAL_TRY(evict_tokens(cm, (size_t)(n - nfree) * (size_t)cm->page_size, NULL));
    }
    KVHAL_TRY(kvhal__block_pool_allocate_tagged(cm->pool, n, pages, cm->state, PAGE_HELD));
    cm->held += n;
    return KVHAL_OK;
}

/* Checks that pages[from..to) are distinct pages held by requests and gives them the owner mark (PAGE_MARK or
 * PAGE_TREE); on failure every mark is undone. A page seen twice reads the mark the first sight left. */
static kvhal_status mark_held_slow(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to,
                                   uint8_t mark)
{
    uint8_t *restrict state = cm->state;
    const uint32_t total = (uint32_t)cm->total;
    for (size_t i = from; i < to; i++) {
        int32_t p = pages[i];
        if ((uint32_t)p < total && state[p] == PAGE_HELD) {
            state[p] = mark;
            continue;
        }
        size_t bad = i;
        bool seen = false;
        for (size_t j = from; j < i && !seen; j++) seen = pages[j] == p;
        while (i-- > from) cm->state[pages[i]] = PAGE_HELD;
        if (p < 0 || p >= cm->total)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "pages[%zu]: %d is out of range [0, %d)", bad, (int)p,
                              (int)cm->total);
        const char *why = seen ? "listed twice"
                          : (state[p] == PAGE_FREE || kvhal_block_pool_ref_count(cm->pool, p) == 0)
                              ? "free (not allocated)"
                              : "owned by the prefix cache, not by the request";
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "pages[%zu]: page %d is %s", bad, (int)p, why);
    }
    return KVHAL_OK;
}

/* The same, run once per page of every finished request (hundreds at page size 1): the range check is one
 * vectorized pass first, so the marking loop has a single branch per page; on any failure the marks made are
 * undone (every one of them was HELD) and the careful loop above finds the page to report. */
static kvhal_status mark_held(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to, uint8_t mark)
{
    const int32_t *restrict pg = pages;
    const uint32_t total = (uint32_t)cm->total;
    uint32_t out_of_range = 0;
    for (size_t i = from; i < to; i++) out_of_range |= (uint32_t)pg[i] >= total;
    if (out_of_range) return mark_held_slow(cm, pages, from, to, mark);
    uint8_t *restrict state = cm->state;
    size_t i = from;
    for (; i < to; i++) {
        if (state[pg[i]] != PAGE_HELD) break;
        state[pg[i]] = mark;
    }
    if (i == to) return KVHAL_OK;
    while (i-- > from) state[pg[i]] = PAGE_HELD;
    return mark_held_slow(cm, pages, from, to, mark);
}

static void unmark(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to, uint8_t mark)
{
    uint8_t *restrict state = cm->state;
    for (size_t i = from; i < to; i++) state[pages[i]] = mark;
}

/* Pages known to be held and distinct go back to the pool. */
static kvhal_status give_back(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    if (from >= to) return KVHAL_OK;
    unmark(cm, pages, from, to, PAGE_FREE);
    kvhal_status st = kvhal__block_pool_release_many(cm->pool, pages + from, to - from);
    if (st != KVHAL_OK) {
        char why[512]; /* the message is rebuilt in the same thread-local buffer: copy it out first */
        snprintf(why, sizeof why, "%s", kvhal_last_error());
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: pool and page owners disagree: %s", why);
    }
    cm->held -= (int64_t)(to - from);
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n)
{
    KVHAL_TRY(check_cm(cm));
    if (n < 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "n: %d is negative", (int)n);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(pages, "pages: NULL for %d pages", (int)n);
    KVHAL_TRY(mark_held(cm, pages, 0, (size_t)n, PAGE_MARK));
    return give_back(cm, pages, 0, (size_t)n);
}

kvhal_status kvhal_cache_manager_cache_finished(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                                const int32_t *pages, kvhal_prefix_handle handle)
{
    KVHAL_TRY(check_cm(cm));
    size_t ps = (size_t)cm->page_size;
    size_t npages = (num_tokens + ps - 1) / ps;
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || npages == 0, "pages: NULL for %zu pages", npages);
    size_t matched;
    KVHAL_TRY(kvhal__prefix_handle_len(cm->pc, handle, &matched));
    if (matched > num_tokens)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "num_tokens: %zu, fewer than the %zu the handle matched",
                          num_tokens, matched);
    size_t own = matched / ps; /* pages[0..own) are the tree's, from match: insert checks them */
    /* One pass marks the request's pages as the tree's; the few that turn out duplicates or the partial tail are
     * freed after the insert, and a failed insert puts every mark back. */
    KVHAL_TRY(mark_held(cm, pages, own, npages, PAGE_TREE));
    size_t already = 0;
    kvhal_status st = kvhal__prefix_insert_unlock(cm->pc, tokens, num_tokens, pages, handle, &already);
    if (st != KVHAL_OK) {
        unmark(cm, pages, own, npages, PAGE_HELD);
        return st;
    }
    size_t aligned = num_tokens / ps;
    size_t dup_end = already / ps; /* >= own: the handle's path was on the tokens' path */
    cm->held -= (int64_t)(aligned - dup_end);
    KVHAL_TRY(give_back(cm, pages, own, dup_end));
    return give_back(cm, pages, aligned, npages);
}

int32_t kvhal_cache_manager_available(const kvhal_cache_manager *cm)
{
    if (!cm || cm->magic != CM_MAGIC) return 0;
    kvhal_prefix_size_info si;
    if (kvhal_prefix_size_info_get(cm->pc, &si) != KVHAL_OK) return 0;
    return kvhal_block_pool_num_free(cm->pool) + (int32_t)(si.evictable_tokens / (size_t)cm->page_size);
}

int32_t kvhal_cache_manager_num_free(const kvhal_cache_manager *cm)
{
    return (cm && cm->magic == CM_MAGIC) ? kvhal_block_pool_num_free(cm->pool) : 0;
}

uint64_t kvhal_cache_manager_pages_evicted(const kvhal_cache_manager *cm)
{
    return (cm && cm->magic == CM_MAGIC) ? cm->evicted_pages : 0;
}

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
        if (tc->bad < 0 && (p < 0 || p >= tc->cm->total || tc->cm->state[p] != PAGE_TREE ||
                            kvhal_block_pool_ref_count(tc->cm->pool, p) != 1))
            tc->bad = p;
    }
    tc->pages += n;
}

kvhal_status kvhal_cache_manager_check_integrity(const kvhal_cache_manager *cm)
{
    KVHAL_TRY(check_cm(cm));
    KVHAL_TRY(kvhal_block_pool_check_integrity(cm->pool));
    KVHAL_TRY(kvhal_prefix_check_integrity(cm->pc));
    int64_t count[4] = {0}; /* free (by the pool), held, cached */
    for (int32_t p = 0; p < cm->total; p++) {
        uint8_t s = cm->state[p];
        int32_t ref = kvhal_block_pool_ref_count(cm->pool, p);
        if (s > PAGE_TREE) return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d has owner %u", (int)p, s);
        if (ref == 0 ? s == PAGE_HELD : (s == PAGE_FREE || ref != 1))
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d is marked %s but has %d references in the pool",
                              (int)p, s == PAGE_FREE ? "free" : s == PAGE_HELD ? "held" : "cached", (int)ref);
        count[ref == 0 ? PAGE_FREE : s]++;
    }
    kvhal_prefix_size_info si;
    KVHAL_TRY(kvhal_prefix_size_info_get(cm->pc, &si));
    tree_count tc = {cm, 0, -1};
    KVHAL_TRY(kvhal__prefix_for_each_page(cm->pc, count_tree_page, &tc));
    if (tc.bad >= 0)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d is in the prefix cache but not marked as its own",
                          (int)tc.bad);
    size_t tree_pages = si.total_tokens / (size_t)cm->page_size;
    int32_t nfree = kvhal_block_pool_num_free(cm->pool);
    if (count[PAGE_FREE] != nfree || count[PAGE_HELD] != cm->held || (size_t)count[PAGE_TREE] != tree_pages ||
        tc.pages != tree_pages || (int64_t)nfree + cm->held + (int64_t)tree_pages != cm->total)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %d free + %zu cached (%zu evictable, %zu protected) + %lld "
                          "held by requests != %d pages (pages seen: %lld free, %lld cached, %lld held)", (int)nfree,
                          tree_pages, si.evictable_tokens / (size_t)cm->page_size,
                          si.protected_tokens / (size_t)cm->page_size, (long long)cm->held, (int)cm->total,
                          (long long)count[PAGE_FREE], (long long)count[PAGE_TREE], (long long)count[PAGE_HELD]);
    return KVHAL_OK;
}

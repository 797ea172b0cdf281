/* cache_manager.c — the pages of one paged cache, split between three owners: the free set, the prefix cache
 * (finished requests' prefixes, evictable unless locked) and running requests. Allocation evicts prefixes when
 * free pages run short; a finished request hands its pages to the prefix cache.
 * A per-page owner byte lets every call check the pages it is given (a tree page can never be freed by a request,
 * a free page never inserted), so a caller's bookkeeping error is reported instead of corrupting the cache.
 * Free pages are a bitmap, not a stack of ids: allocation takes the lowest free pages, so a request gets runs of
 * consecutive ids even after eviction has returned pages in LRU order (freed neighbours merge by themselves in a
 * bitmap), and the pages in use stay packed at the low end of the cache. Runs keep every per-page array touched
 * downstream (owner bytes, the caller's page tables) sequential instead of scattered, and packing keeps those
 * arrays' working set at the size of what is in use, not of the whole cache. A page is never shared here, so a
 * bit is all the reference count it needs. A summary bit per bitmap word (set when the word has a free page) and
 * the index of the lowest word that may have one bound the search to total/4096 words.
 * Whether a page is free is the bitmap's to say; the owner byte only tells the allocated ones apart (held by a
 * request or cached), so eviction touches the bitmap and reads the owner byte, nothing else per page.
 * Not thread-safe: the scheduler that owns it serialises calls. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CM_MAGIC 0x4b56434du /* KVCM */

/* PAGE_FREE is written where a request gives a page back; an evicted page keeps PAGE_TREE until it is allocated
 * again (the bitmap says it is free), so a free page reads FREE or TREE, never HELD. */
enum { PAGE_FREE = 0, PAGE_HELD = 1, PAGE_TREE = 2, PAGE_MARK = 3 };

struct kvhal_cache_manager {
    uint32_t magic;
    int32_t total;
    int32_t page_size;
    int32_t nfree;
    kvhal_prefix_cache *pc;
    uint8_t *state;          /* per page: PAGE_* */
    uint64_t *free_bits;     /* bit p: page p is free; bits past total stay 0 */
    uint64_t *free_sum;      /* bit w: free_bits[w] != 0 */
    size_t nwords, nsum;
    size_t low;              /* every bitmap word below this one is 0 (no free page) */
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

/* ---------------------------------------------------------------------------------------------------------- */
/* free pages                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

static inline bool page_is_free(const kvhal_cache_manager *cm, uint32_t p)
{
    return (cm->free_bits[p >> 6] >> (p & 63)) & 1;
}

static inline void page_set_free(kvhal_cache_manager *cm, uint32_t p)
{
    size_t w = p >> 6;
    cm->free_bits[w] |= 1ull << (p & 63);
    cm->free_sum[w >> 6] |= 1ull << (w & 63);
    if (w < cm->low) cm->low = w;
}

/* The first word at or after `from` with a free page; the caller knows there is one (from <= the lowest). */
static size_t next_free_word(const kvhal_cache_manager *cm, size_t from)
{
    size_t si = from >> 6;
    uint64_t m = si < cm->nsum ? cm->free_sum[si] & (~0ull << (from & 63)) : 0;
    while (!m) {
        si = si + 1 >= cm->nsum ? 0 : si + 1; /* wraps only if the caller was wrong: then any free word will do */
        m = cm->free_sum[si];
    }
    return (si << 6) + (size_t)__builtin_ctzll(m);
}

/* Takes the n lowest free pages (n <= nfree) and marks them held. A whole free word is a run of 64 ids: written
 * as one, without looking at its bits. */
static void take_pages(kvhal_cache_manager *cm, int32_t n, int32_t *restrict out)
{
    uint64_t *restrict bits = cm->free_bits;
    uint8_t *restrict state = cm->state;
    size_t w = cm->low;
    int32_t k = 0;
    while (k < n) {
        uint64_t x = bits[w];
        if (!x) {
            w = next_free_word(cm, w + 1);
            x = bits[w];
        }
        uint32_t base = (uint32_t)(w << 6);
        if (x == ~0ull && n - k >= 64) {
            for (uint32_t i = 0; i < 64; i++) out[k + (int32_t)i] = (int32_t)(base + i);
            memset(state + base, PAGE_HELD, 64);
            k += 64;
            x = 0;
        } else {
            do {
                uint32_t p = base + (uint32_t)__builtin_ctzll(x);
                x &= x - 1;
                out[k++] = (int32_t)p;
                state[p] = PAGE_HELD;
            } while (x && k < n);
        }
        bits[w] = x;
        if (!x) cm->free_sum[w >> 6] &= ~(1ull << (w & 63));
    }
    cm->low = w;
    cm->nfree -= n;
}

/* What create allocated (any part may be NULL after a failed create). */
static void free_manager(kvhal_cache_manager *cm)
{
    kvhal_prefix_cache_destroy(cm->pc);
    free(cm->state);
    free(cm->free_bits);
    free(cm->free_sum);
    free(cm);
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
    size_t total = (size_t)total_pages;
    cm->nwords = (total + 63) / 64;
    cm->nsum = (cm->nwords + 63) / 64;
    kvhal_status st = kvhal_prefix_cache_create(kind, page_size, &cm->pc);
    if (st == KVHAL_OK && (!(cm->state = kvhal__malloc(total)) ||
                           !(cm->free_bits = kvhal__malloc(cm->nwords * sizeof *cm->free_bits)) ||
                           !(cm->free_sum = kvhal__malloc(cm->nsum * sizeof *cm->free_sum))))
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory for the owners of %d pages", (int)total_pages);
    if (st != KVHAL_OK) goto fail;
    /* written now (malloc, not calloc), so that first use does not fault the pages in one by one */
    memset(cm->state, PAGE_FREE, total);
    memset(cm->free_bits, 0xff, cm->nwords * sizeof *cm->free_bits);
    if (total % 64) cm->free_bits[cm->nwords - 1] = (1ull << (total % 64)) - 1;
    memset(cm->free_sum, 0xff, cm->nsum * sizeof *cm->free_sum);
    if (cm->nwords % 64) cm->free_sum[cm->nsum - 1] = (1ull << (cm->nwords % 64)) - 1;
    cm->total = total_pages;
    cm->nfree = total_pages;
    cm->page_size = page_size;
    cm->magic = CM_MAGIC;
    if (!kvhal__handle_add(cm)) {
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory to register the handle");
        goto fail;
    }
    *out = cm;
    return KVHAL_OK;
fail:
    free_manager(cm);
    return st;
}

kvhal_status kvhal_cache_manager_destroy(kvhal_cache_manager *cm)
{
    if (!cm) return KVHAL_OK;
    if (!kvhal__handle_remove_kind(cm, CM_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "cm: %p is not a live cache manager (destroyed twice?)", (void *)cm);
    cm->magic = KVHAL_MAGIC_DEAD;
    free_manager(cm);
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

/* Eviction hands a leaf's tree pages back, in one call per leaf. Each page must be cached (owner byte TREE) and
 * not free already: a page listed twice finds its bit set at the second sight. A bad page is reported and
 * skipped, the good ones are freed all the same (the leaf is gone either way); check_integrity tells the rest. */
static void evicted_cb(const int32_t *pages, size_t n, void *user)
{
    kvhal_cache_manager *cm = user;
    const uint8_t *restrict state = cm->state;
    uint64_t *restrict bits = cm->free_bits;
    uint64_t *restrict sum = cm->free_sum;
    const uint32_t total = (uint32_t)cm->total;
    /* A leaf's pages come in runs: the bits of one bitmap word are gathered in a register and written once. */
    size_t cw = 0, low = cm->low;
    uint64_t acc = 0;
    size_t freed = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t p = (uint32_t)pages[i];
        size_t w = p >> 6;
        uint64_t bit = 1ull << (p & 63);
        if (p < total && state[p] == PAGE_TREE) {
            if (w != cw) {
                if (acc) {
                    bits[cw] |= acc;
                    sum[cw >> 6] |= 1ull << (cw & 63);
                    if (cw < low) low = cw;
                }
                cw = w;
                acc = 0;
            }
            if (!((bits[w] | acc) & bit)) {
                acc |= bit;
                freed++;
                continue;
            }
        }
        if (cm->cb_status == KVHAL_OK)
            cm->cb_status = kvhal__err(KVHAL_INTEGRITY, "cache manager: evicted page %d was not a cached page",
                                       (int)pages[i]);
    }
    if (acc) {
        bits[cw] |= acc;
        sum[cw >> 6] |= 1ull << (cw & 63);
        if (cw < low) low = cw;
    }
    cm->low = low;
    cm->nfree += (int32_t)freed;
    cm->evicted_pages += freed;
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
    int32_t nfree = cm->nfree;
    if (nfree < n) {
        kvhal_prefix_size_info si;
        KVHAL_TRY(kvhal_prefix_size_info_get(cm->pc, &si));
        size_t evictable = si.evictable_tokens / (size_t)cm->page_size;
        if ((size_t)nfree + evictable < (size_t)n)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "n: %d pages requested, only %d free + %zu evictable of %d (the "
                              "rest are locked by running requests or held by them)", (int)n, (int)nfree, evictable,
                              (int)cm->total);
        KVHAL_TRY(evict_tokens(cm, (size_t)(n - nfree) * (size_t)cm->page_size, NULL));
        if (cm->nfree < n)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: eviction left %d free pages, %d needed", (int)cm->nfree,
                              (int)n);
    }
    take_pages(cm, n, pages);
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
                          : page_is_free(cm, (uint32_t)p) ? "free (not allocated)"
                          : "owned by the prefix cache, not by the request";
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "pages[%zu]: page %d is %s", bad, (int)p, why);
    }
    return KVHAL_OK;
}

/* The same, run once per page of every finished request (hundreds at page size 1). The range check is one
 * vectorized pass first; a run of consecutive pages is one range check and one memset; otherwise one tight loop,
 * and on a failure the careful loop above finds the page to report. */
/* Whether pages[from..to) are the consecutive ids p0, p0 + 1, ... (all in range): lowest-first allocation hands
 * out runs, so a request's pages mostly are one. One vectorized pass. */
static bool page_run(const kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    if (to - from < 2) return false;
    const uint32_t p0 = (uint32_t)pages[from], n = (uint32_t)(to - from);
    if (p0 >= (uint32_t)cm->total || (uint32_t)cm->total - p0 < n || (uint32_t)pages[to - 1] != p0 + n - 1)
        return false;
    uint32_t diff = 0;
    for (uint32_t i = 0; i < n; i++) diff |= (uint32_t)pages[from + i] ^ (p0 + i);
    return diff == 0;
}

static kvhal_status mark_held(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to, uint8_t mark)
{
    const int32_t *restrict pg = pages;
    const uint32_t total = (uint32_t)cm->total;
    if (page_run(cm, pages, from, to)) {
        /* a run is distinct by construction: its owner bytes are one range to check and one to set */
        uint8_t *st = cm->state + pages[from];
        const size_t n = to - from;
        uint8_t bad = 0;
        for (size_t i = 0; i < n; i++) bad |= st[i] ^ PAGE_HELD;
        if (bad) return mark_held_slow(cm, pages, from, to, mark);
        memset(st, mark, n);
        return KVHAL_OK;
    }
    uint32_t out_of_range = 0;
    for (size_t i = from; i < to; i++) out_of_range |= (uint32_t)pg[i] >= total;
    if (out_of_range) return mark_held_slow(cm, pages, from, to, mark);
    /* Every page read is checked before its mark is written, so a failure leaves the pages before it marked (all
     * were HELD: they go back to HELD) and nothing else touched; a page listed twice reads the mark at its second
     * sight. The branch is taken only on a bad list. */
    uint8_t *restrict state = cm->state;
    size_t i = from;
    for (; i < to; i++) {
        const int32_t p = pg[i];
        if (state[p] != PAGE_HELD) break;
        state[p] = mark;
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

/* Pages known to be held and distinct become free. */
static void give_back(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    uint8_t *restrict state = cm->state;
    for (size_t i = from; i < to; i++) {
        uint32_t p = (uint32_t)pages[i];
        state[p] = PAGE_FREE;
        page_set_free(cm, p);
    }
    cm->nfree += (int32_t)(to - from);
    cm->held -= (int64_t)(to - from);
}

kvhal_status kvhal_cache_manager_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n)
{
    KVHAL_TRY(check_cm(cm));
    if (n < 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "n: %d is negative", (int)n);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(pages, "pages: NULL for %d pages", (int)n);
    KVHAL_TRY(mark_held(cm, pages, 0, (size_t)n, PAGE_MARK));
    give_back(cm, pages, 0, (size_t)n);
    return KVHAL_OK;
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
    give_back(cm, pages, own, dup_end);
    give_back(cm, pages, aligned, npages);
    return KVHAL_OK;
}

int32_t kvhal_cache_manager_available(const kvhal_cache_manager *cm)
{
    if (!cm || cm->magic != CM_MAGIC) return 0;
    kvhal_prefix_size_info si;
    if (kvhal_prefix_size_info_get(cm->pc, &si) != KVHAL_OK) return 0;
    return cm->nfree + (int32_t)(si.evictable_tokens / (size_t)cm->page_size);
}

int32_t kvhal_cache_manager_num_free(const kvhal_cache_manager *cm)
{
    return (cm && cm->magic == CM_MAGIC) ? cm->nfree : 0;
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
                            page_is_free(tc->cm, (uint32_t)p)))
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

kvhal_status kvhal_cache_manager_check_integrity(const kvhal_cache_manager *cm)
{
    KVHAL_TRY(check_cm(cm));
    KVHAL_TRY(check_free_set(cm));
    KVHAL_TRY(kvhal_prefix_check_integrity(cm->pc));
    int64_t count[3] = {0}; /* free (by the bitmap), held, cached */
    for (int32_t p = 0; p < cm->total; p++) {
        uint8_t s = cm->state[p];
        bool is_free = page_is_free(cm, (uint32_t)p);
        if (s > PAGE_TREE) return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d has owner %u", (int)p, s);
        if (is_free ? s == PAGE_HELD : s == PAGE_FREE)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d is marked %s but is %s", (int)p,
                              s == PAGE_FREE ? "free" : "held", is_free ? "free" : "allocated");
        count[is_free ? PAGE_FREE : s]++;
    }
    kvhal_prefix_size_info si;
    KVHAL_TRY(kvhal_prefix_size_info_get(cm->pc, &si));
    tree_count tc = {cm, 0, -1};
    KVHAL_TRY(kvhal__prefix_for_each_page(cm->pc, count_tree_page, &tc));
    if (tc.bad >= 0)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d is in the prefix cache but not marked as its own",
                          (int)tc.bad);
    size_t tree_pages = si.total_tokens / (size_t)cm->page_size;
    int32_t nfree = cm->nfree;
    if (count[PAGE_FREE] != nfree || count[PAGE_HELD] != cm->held || (size_t)count[PAGE_TREE] != tree_pages ||
        tc.pages != tree_pages || (int64_t)nfree + cm->held + (int64_t)tree_pages != cm->total)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %d free + %zu cached (%zu evictable, %zu protected) + %lld "
                          "held by requests != %d pages (pages seen: %lld free, %lld cached, %lld held)", (int)nfree,
                          tree_pages, si.evictable_tokens / (size_t)cm->page_size,
                          si.protected_tokens / (size_t)cm->page_size, (long long)cm->held, (int)cm->total,
                          (long long)count[PAGE_FREE], (long long)count[PAGE_TREE], (long long)count[PAGE_HELD]);
    return KVHAL_OK;
}

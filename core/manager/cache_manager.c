/* cache_manager.c — the pages of one paged cache, split between three owners: the free set, the prefix cache
 * (finished requests' prefixes, evictable unless locked) and running requests. Allocation evicts prefixes when
 * free pages run short; a finished request hands its pages to the prefix cache.
 * Each page's owner is two bits in two bitmaps, free and cached (the prefix cache's); a page with neither is held
 * by a request. They let every call check the pages it is given (a tree page can never be freed by a request, a
 * free page never inserted), so a caller's bookkeeping error is reported instead of corrupting the cache. Bits,
 * not a byte per page: a request's decode pages are scattered (one per step, interleaved with the batch's), and at
 * 2 bits a page the owners of a million pages (256 KiB) stay in a core's cache where bytes (1 MiB) do not.
 * Free pages are a bitmap, not a stack of ids: allocation takes the lowest free pages, so a request gets runs of
 * consecutive ids even after eviction has returned pages in LRU order (freed neighbours merge by themselves in a
 * bitmap), and the pages in use stay packed at the low end of the cache. Runs keep every per-page array touched
 * downstream (owner bits, the caller's page tables) sequential instead of scattered, and packing keeps those
 * arrays' working set at the size of what is in use, not of the whole cache. A page is never shared here, so a
 * bit is all the reference count it needs. A summary bit per bitmap word (set when the word has a free page) and
 * the index of the lowest word that may have one bound the search to total/4096 words.
 * A free page is never cached (free => !cached), so allocation only clears free bits, and a run of pages (what
 * lowest-first allocation hands out) is checked and moved between owners 64 pages to a word operation.
 * Not thread-safe: the scheduler that owns it serialises calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cache_manager.h"
#include "faults.h"
#include "owner.h"
#include "prefix_owned.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* free pages                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

static inline bool page_is_free(const kvhal_cache_manager *cm, uint32_t p)
{
    return (cm->free_bits[p >> 6] >> (p & 63)) & 1;
}

/* Cached pages m of word w become free. */
static inline void tree_to_free(kvhal_cache_manager *cm, size_t w, uint64_t m)
{
    cm->tree_bits[w] &= ~m;
    cm->free_bits[w] |= m;
    cm->free_sum[w >> 6] |= 1ull << (w & 63);
    if (w < cm->low) cm->low = w;
}

static inline bool page_is_draining(const kvhal_cache_manager *cm, uint32_t p)
{
    return (cm->drain_bits[p >> 6] >> (p & 63)) & 1;
}

/* Cached pages m of word w drain (write-back: queued for their copy). */
static inline void tree_to_drain(kvhal_cache_manager *cm, size_t w, uint64_t m)
{
    cm->tree_bits[w] &= ~m;
    cm->drain_bits[w] |= m;
}

kvhal_status kvhal__cm_reap(kvhal_cache_manager *cm, bool wait, bool store)
{
    if (!cm->tiering || !kvhal__tiering_busy(cm->tiering)) return KVHAL_OK;
    const int32_t *done;
    size_t n;
    const kvhal_status st = kvhal__tiering_reap(cm->tiering, wait, store, cm->drain_bits, cm->ndrain, &done, &n);
    for (size_t i = 0; i < n; i++) {
        const uint32_t p = (uint32_t)done[i];
        if (!page_is_draining(cm, p)) continue; /* a write-through copy of a page still in the tree */
        const size_t w = p >> 6;
        cm->drain_bits[w] &= ~(1ull << (p & 63));
        cm->free_bits[w] |= 1ull << (p & 63);
        cm->free_sum[w >> 6] |= 1ull << (w & 63);
        if (w < cm->low) cm->low = w;
        cm->nfree++;
        cm->ndrain--;
    }
    return st;
}

/* Page lists as arithmetic progressions. Lowest-first allocation hands a request runs (step 1) at admission and,
 * at page size 1, one page per decode step interleaved with the rest of the batch: p, p + b, p + 2b, ... for a
 * batch of b. Taken as progressions, a list is checked and moved between owners a bitmap word at a time (64 / step
 * pages per operation) instead of a page at a time. */

/* For a step d of 1..64: bits 0, d, 2d, ... below 64, and 64 % d (how much closer to its word's start each
 * word's first element lies than the previous word's). */
static const struct {
    uint64_t pattern;
    uint32_t rem;
} ap_step[65] = {
    {0x0000000000000000ull, 0}, {0xffffffffffffffffull, 0}, {0x5555555555555555ull, 0},
    {0x9249249249249249ull, 1}, {0x1111111111111111ull, 0}, {0x1084210842108421ull, 4},
    {0x1041041041041041ull, 4}, {0x8102040810204081ull, 1}, {0x0101010101010101ull, 0},
    {0x8040201008040201ull, 1}, {0x1004010040100401ull, 4}, {0x0080100200400801ull, 9},
    {0x1001001001001001ull, 4}, {0x0010008004002001ull, 12}, {0x0100040010004001ull, 8},
    {0x1000200040008001ull, 4}, {0x0001000100010001ull, 0}, {0x0008000400020001ull, 13},
    {0x0040001000040001ull, 10}, {0x0200004000080001ull, 7}, {0x1000010000100001ull, 4},
    {0x8000040000200001ull, 1}, {0x0000100000400001ull, 20}, {0x0000400000800001ull, 18},
    {0x0001000001000001ull, 16}, {0x0004000002000001ull, 14}, {0x0010000004000001ull, 12},
    {0x0040000008000001ull, 10}, {0x0100000010000001ull, 8}, {0x0400000020000001ull, 6},
    {0x1000000040000001ull, 4}, {0x4000000080000001ull, 2}, {0x0000000100000001ull, 0},
    {0x0000000200000001ull, 31}, {0x0000000400000001ull, 30}, {0x0000000800000001ull, 29},
    {0x0000001000000001ull, 28}, {0x0000002000000001ull, 27}, {0x0000004000000001ull, 26},
    {0x0000008000000001ull, 25}, {0x0000010000000001ull, 24}, {0x0000020000000001ull, 23},
    {0x0000040000000001ull, 22}, {0x0000080000000001ull, 21}, {0x0000100000000001ull, 20},
    {0x0000200000000001ull, 19}, {0x0000400000000001ull, 18}, {0x0000800000000001ull, 17},
    {0x0001000000000001ull, 16}, {0x0002000000000001ull, 15}, {0x0004000000000001ull, 14},
    {0x0008000000000001ull, 13}, {0x0010000000000001ull, 12}, {0x0020000000000001ull, 11},
    {0x0040000000000001ull, 10}, {0x0080000000000001ull, 9}, {0x0100000000000001ull, 8},
    {0x0200000000000001ull, 7}, {0x0400000000000001ull, 6}, {0x0800000000000001ull, 5},
    {0x1000000000000001ull, 4}, {0x2000000000000001ull, 3}, {0x4000000000000001ull, 2},
    {0x8000000000000001ull, 1}, {0x0000000000000001ull, 0}
};

/* The longest progression pages[i], pages[i] + d, ... (1 <= d <= 64) from i that lies in [0, total): its length
 * (1 for a lone page, 0 when pages[i] is out of range) and *step (1 for a lone page). */
static inline size_t ap_at(const int32_t *pages, size_t i, size_t to, uint32_t total, uint32_t *step)
{
    const uint32_t p0 = (uint32_t)pages[i];
    *step = 1;
    if (p0 >= total) return 0;
    if (i + 1 == to) return 1;
    const uint32_t d = (uint32_t)pages[i + 1] - p0;
    if (d - 1u >= 64u) return 1;
    /* pages[j] == e: eight at a time, then one at a time */
    size_t j = i + 1;
    uint32_t e = p0 + d;
#if defined(__SSE2__)
    /* two 4-lane compares per step (SSE2 is part of x86-64's baseline; the compiler does not vectorize the loop
     * below by itself): a finished request's list is hundreds of pages at page size 1 */
    if (j + 8 < to) {
        const int32_t sd = (int32_t)d;
        __m128i want_lo = _mm_add_epi32(_mm_set1_epi32((int32_t)e), _mm_set_epi32(4 * sd, 3 * sd, 2 * sd, sd));
        __m128i want_hi = _mm_add_epi32(want_lo, _mm_set1_epi32((int32_t)(4 * d)));
        const __m128i stride = _mm_set1_epi32((int32_t)(8 * d));
        do {
            const __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(pages + j + 1));
            const __m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(pages + j + 5));
            const __m128i diff = _mm_or_si128(_mm_xor_si128(lo, want_lo), _mm_xor_si128(hi, want_hi));
            if (_mm_movemask_epi8(_mm_cmpeq_epi32(diff, _mm_setzero_si128())) != 0xffff) break;
            want_lo = _mm_add_epi32(want_lo, stride);
            want_hi = _mm_add_epi32(want_hi, stride);
            j += 8;
            e += 8 * d;
        } while (j + 8 < to);
    }
#else
    while (j + 8 < to) {
        uint32_t diff = 0;
        for (uint32_t k = 1; k <= 8; k++) diff |= (uint32_t)pages[j + k] ^ (e + k * d);
        if (diff) break;
        j += 8;
        e += 8 * d;
    }
#endif
    while (j + 1 < to && (uint32_t)pages[j + 1] == e + d) {
        j++;
        e += d;
    }
    /* pages[j] is p0 + (j - i) * d modulo 2^32: the progression is the integers themselves while that stays in range */
    size_t len = j - i + 1;
    if ((uint64_t)p0 + (uint64_t)(len - 1) * d >= total) len = (total - 1 - p0) / d + 1;
    *step = d;
    return len;
}

/* The bitmap words a progression (p0, d, len) touches, one at a time: word w, its bits in mask. The offset of
 * the first element in each next word follows from the last one by subtracting 64 % d (mod d): no division and
 * no bit count per word. */
typedef struct ap_words {
    size_t w, last_w;
    uint64_t pat, b, next_b, last_mask, mask;
    uint32_t d, rem;
} ap_words;

static inline void apw_first(ap_words *a, uint32_t p0, uint32_t d, size_t len)
{
    const uint64_t last = (uint64_t)p0 + (uint64_t)(len - 1) * d;
    a->w = p0 >> 6;
    a->last_w = (size_t)(last >> 6);
    a->pat = ap_step[d].pattern;
    a->rem = ap_step[d].rem;
    a->b = p0 & 63;
    a->d = d;
    /* the first word may start anywhere (b >= d too); from the second on, b < d. Its elements: (63 - b) / d + 1
     * (a division, not a bit count: without the popcnt instruction, which the baseline x86-64 lacks, a bit count
     * is a library call); a run (d = 1) needs neither. */
    const uint64_t in_first = d == 1 ? 64 - a->b : (63 - a->b) / d + 1;
    a->next_b = a->b + in_first * d - 64;
    a->last_mask = ~0ull >> (63 - (last & 63));
    a->mask = (a->pat << a->b) & (a->w == a->last_w ? a->last_mask : ~0ull);
}

/* Moves to the next word; false after the last. */
static inline bool apw_next(ap_words *a)
{
    if (a->w == a->last_w) return false;
    const uint64_t b = a->next_b;
    a->b = b;
    a->next_b = b >= a->rem ? b - a->rem : b + a->d - a->rem;
    a->w++;
    a->mask = (a->pat << b) & (a->w == a->last_w ? a->last_mask : ~0ull);
    return true;
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

/* Takes the n lowest free pages (n <= nfree): clearing their free bits makes them held (a free page has no cached
 * bit). A whole free word is a run of 64 ids: written as one, without looking at its bits. */
static void take_pages(kvhal_cache_manager *cm, int32_t n, int32_t *restrict out)
{
    uint64_t *restrict bits = cm->free_bits;
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
            k += 64;
            x = 0;
        } else {
            do {
                uint32_t p = base + (uint32_t)__builtin_ctzll(x);
                x &= x - 1;
                out[k++] = (int32_t)p;
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
    kvhal__tiering_destroy(cm->tiering);
    if (kvhal__prefix_set_manager_owned(cm->pc, false)) kvhal_prefix_cache_destroy(cm->pc);
    free(cm->tree_bits);
    free(cm->free_bits);
    free(cm->free_sum);
    free(cm->drain_bits);
    free(cm->view_match);
    free(cm->view_alloc);
    free(cm->view_admit);
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
    if (st == KVHAL_OK) kvhal__prefix_set_manager_owned(cm->pc, true);
    if (st == KVHAL_OK && (!(cm->tree_bits = kvhal__malloc(cm->nwords * sizeof *cm->tree_bits)) ||
                           !(cm->free_bits = kvhal__malloc(cm->nwords * sizeof *cm->free_bits)) ||
                           !(cm->free_sum = kvhal__malloc(cm->nsum * sizeof *cm->free_sum)) ||
                           !(cm->drain_bits = kvhal__malloc(cm->nwords * sizeof *cm->drain_bits))))
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory for the owners of %d pages", (int)total_pages);
    if (st != KVHAL_OK) goto fail;
    /* written now (malloc, not calloc), so that first use does not fault the pages in one by one */
    memset(cm->tree_bits, 0, cm->nwords * sizeof *cm->tree_bits);
    memset(cm->drain_bits, 0, cm->nwords * sizeof *cm->drain_bits); /* eviction writes it (tiered) */
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
    return (cm && kvhal__handle_live(cm, CM_MAGIC)) ? cm->pc : NULL;
}

/* view: NULL, or match_view's (kvhal__prefix_match_owned). */
static kvhal_status kvhal_cache_manager_match__body(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                       kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                       size_t pages_cap, const int32_t **view)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    KVHAL_CHECK_ARG(handle, "handle: NULL (the request's handle is needed to finish it)");
    kvhal_prefix_handle h = 0, ticket = 0;
    size_t len = 0;
    KVHAL_TRY(kvhal__prefix_match_owned(cm->pc, tokens, num_tokens, &h, &len, pages, pages_cap, view));
    /* a request handle of its own, even for an empty match: finishing it twice is refused */
    /* bound: a load_back of this request reads no host page past the tokens this match was given */
    KVHAL_TRY(kvhal__prefix_ticket(cm->pc, h, num_tokens, &ticket));
    *handle = ticket;
    if (cached_len) *cached_len = len;
    return KVHAL_OK;
}

/* Eviction hands a leaf's tree pages back, in one call per leaf. Each page must be cached: a page listed twice
 * finds its cached bit cleared at the second sight. A bad page is reported and skipped, the good ones are freed
 * all the same (the leaf is gone either way); check_integrity tells the rest. Pages go free, or drain: all of them
 * under write-back with a host tier (each is queued for its copy), and otherwise those whose write-through copy out
 * is flagged (in flight, or complete but not reaped yet: the next reap frees them), read a word at a time. */
static void evicted_cb(const int32_t *pages, size_t n, void *user)
{
    kvhal_cache_manager *cm = user;
    const uint64_t *restrict copy = NULL;
    bool drain_all = false;
    if (cm->tiering) {
        kvhal__tiering_evicted(cm->tiering, pages, n);
        drain_all = kvhal__tiering_queues_all(cm->tiering);
        if (!drain_all) copy = kvhal__tiering_copy_bits(cm->tiering);
    }
    const uint64_t *restrict tree = cm->tree_bits;
    const uint32_t total = (uint32_t)cm->total;
    size_t freed = 0, drained = 0;
    for (size_t i = 0; i < n;) {
        uint32_t d;
        const size_t len = ap_at(pages, i, n, total, &d);
        if (len) {
            ap_words a;
            uint64_t missing = 0;
            apw_first(&a, (uint32_t)pages[i], d, len);
            do missing |= a.mask & ~tree[a.w];
            while (apw_next(&a));
            if (!missing) {
                apw_first(&a, (uint32_t)pages[i], d, len);
                if (drain_all) {
                    do tree_to_drain(cm, a.w, a.mask);
                    while (apw_next(&a));
                    kvhal__tiering_queue(cm->tiering, pages[i], (int32_t)d, (int32_t)len);
                    drained += len;
                } else if (copy) {
                    do {
                        const uint64_t dm = a.mask & copy[a.w];
                        if (dm) {
                            tree_to_drain(cm, a.w, dm);
                            drained += (size_t)__builtin_popcountll(dm);
                        }
                        if (a.mask & ~dm) tree_to_free(cm, a.w, a.mask & ~dm);
                    } while (apw_next(&a));
                } else {
                    do tree_to_free(cm, a.w, a.mask);
                    while (apw_next(&a));
                }
                freed += len;
                i += len;
                continue;
            }
        }
        /* a page out of range, not cached, or listed twice (its bit went with the first sight): page by page */
        const size_t end = len ? i + len : i + 1;
        for (; i < end; i++) {
            const uint32_t p = (uint32_t)pages[i];
            if (p < total && page_is_tree(cm, p)) {
                const uint64_t m = 1ull << (p & 63);
                if (drain_all || (copy && (copy[p >> 6] & m))) {
                    tree_to_drain(cm, p >> 6, m);
                    if (drain_all) kvhal__tiering_queue(cm->tiering, (int32_t)p, 1, 1);
                    drained++;
                } else {
                    tree_to_free(cm, p >> 6, m);
                }
                freed++;
            } else if (cm->cb_status == KVHAL_OK) {
                cm->cb_status = kvhal__err(KVHAL_INTEGRITY, "cache manager: evicted page %d was not a cached page",
                                           (int)pages[i]);
            }
        }
    }
    cm->ndrain += (int32_t)drained;
    cm->nfree += (int32_t)(freed - drained);
    cm->evicted_pages += freed;
}

/* No copy, wait or reap here: eviction costs what leaving the tree costs. Write-back queues the evicted pages
 * (they drain); write-through pages whose copy out is not reaped drain too; the next allocate, load_back or
 * transfer call completes the copies and frees the drained pages. */
static kvhal_status evict_tokens(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted)
{
    cm->cb_status = KVHAL_OK;
    KVHAL_TRY(kvhal__prefix_evict_owned(cm->pc, num_tokens, evicted_cb, cm, evicted));
    return cm->cb_status;
}

static kvhal_status kvhal_cache_manager_evict__body(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    if (evicted) *evicted = 0;
    kvhal_prefix_size_info si;
    KVHAL_TRY(kvhal__prefix_size_info_get_owned(cm->pc, &si));
    if (si.evictable_tokens == 0) return KVHAL_OK; /* also keeps the naive cache's evict(n > 0) error away */
    return evict_tokens(cm, num_tokens, evicted);
}

static kvhal_status kvhal_cache_manager_allocate__body(kvhal_cache_manager *cm, int32_t n, int32_t *pages)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    if (n < 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "n: %d is negative", (int)n);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(pages, "pages: NULL for %d pages", (int)n);
    /* free pages first, then copies that completed (a query: drained pages go free, and write-through pages whose
     * copy is done are evicted straight to free), then eviction of what the drains in flight cannot cover, then a
     * query for the pages that eviction made drain (write-back: stored first), and a wait only when still short */
    if (cm->nfree < n) KVHAL_TRY(kvhal__cm_reap(cm, false, true));
    int32_t nfree = cm->nfree;
    if (nfree < n) {
        kvhal_prefix_size_info si;
        KVHAL_TRY(kvhal__prefix_size_info_get_owned(cm->pc, &si));
        size_t evictable = si.evictable_tokens / (size_t)cm->page_size;
        if ((size_t)nfree + (size_t)cm->ndrain + evictable < (size_t)n)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "n: %d pages requested, only %d free + %d draining + %zu evictable "
                              "of %d (the rest are locked by running requests or held by them)", (int)n, (int)nfree,
                              (int)cm->ndrain, evictable, (int)cm->total);
        const int64_t short_by = (int64_t)n - nfree - cm->ndrain;
        if (short_by > 0) KVHAL_TRY(evict_tokens(cm, (size_t)short_by * (size_t)cm->page_size, NULL));
        if (cm->nfree < n) KVHAL_TRY(kvhal__cm_reap(cm, false, true));
        if (cm->nfree < n) KVHAL_TRY(kvhal__cm_reap(cm, true, true));
        if (cm->nfree < n)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: eviction left %d free pages, %d needed", (int)cm->nfree,
                              (int)n);
    }
    take_pages(cm, n, pages);
    cm->held += n;
    return KVHAL_OK;
}

/* Cached pages[from..to) (distinct, all set) go back to held. */
static void unmark(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    uint64_t *restrict tree = cm->tree_bits;
    for (size_t i = from; i < to; i++) {
        const uint32_t p = (uint32_t)pages[i];
        tree[p >> 6] &= ~(1ull << (p & 63));
    }
}

/* Checks that pages[from..to) are distinct pages held by requests and marks them cached; on failure every mark is
 * undone. A page seen twice reads the mark the first sight left. */
static kvhal_status mark_tree_slow(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    const uint32_t total = (uint32_t)cm->total;
    for (size_t i = from; i < to; i++) {
        const int32_t p = pages[i];
        if ((uint32_t)p < total && !page_is_free(cm, (uint32_t)p) && !page_is_tree(cm, (uint32_t)p) &&
            !page_is_draining(cm, (uint32_t)p)) {
            cm->tree_bits[(uint32_t)p >> 6] |= 1ull << ((uint32_t)p & 63);
            continue;
        }
        bool seen = false;
        for (size_t j = from; j < i && !seen; j++) seen = pages[j] == p;
        unmark(cm, pages, from, i);
        if (p < 0 || p >= cm->total)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "pages[%zu]: %d is out of range [0, %d)", i, (int)p,
                              (int)cm->total);
        const char *why = seen ? "listed twice"
                          : page_is_free(cm, (uint32_t)p) ? "free (not allocated)"
                          : page_is_draining(cm, (uint32_t)p) ? "draining (evicted; its copy to the host tier is in "
                                                                "flight), not allocated"
                          : "owned by the prefix cache, not by the request";
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "pages[%zu]: page %d is %s", i, (int)p, why);
    }
    return KVHAL_OK;
}

/* The same, run over every page a finished request hands over (hundreds at page size 1), a progression at a time:
 * its words checked, then marked. A progression's pages are distinct; a page listed again later finds the mark
 * the earlier one left. On a failure the marks of the progressions before are undone and the careful loop above
 * finds the page to report. */
static kvhal_status mark_tree(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    uint64_t *restrict tree = cm->tree_bits;
    const uint64_t *restrict fr = cm->free_bits;
    const uint64_t *restrict dr = cm->drain_bits;
    const uint32_t total = (uint32_t)cm->total;
    for (size_t i = from; i < to;) {
        uint32_t d;
        const size_t len = ap_at(pages, i, to, total, &d);
        ap_words a;
        uint64_t busy = len ? 0 : 1;
        if (len) {
            apw_first(&a, (uint32_t)pages[i], d, len);
            do busy |= (fr[a.w] | tree[a.w] | dr[a.w]) & a.mask;
            while (apw_next(&a));
        }
        if (busy) { /* taken only on a bad list */
            unmark(cm, pages, from, i);
            return mark_tree_slow(cm, pages, from, to);
        }
        apw_first(&a, (uint32_t)pages[i], d, len);
        do tree[a.w] |= a.mask;
        while (apw_next(&a));
        i += len;
    }
    return KVHAL_OK;
}

/* Pages just marked cached by mark_tree (held by a request until then) become free. */
static void give_back(kvhal_cache_manager *cm, const int32_t *pages, size_t from, size_t to)
{
    const uint32_t total = (uint32_t)cm->total;
    for (size_t i = from; i < to;) {
        uint32_t d;
        const size_t len = ap_at(pages, i, to, total, &d); /* >= 1: mark_tree checked the range */
        ap_words a;
        apw_first(&a, (uint32_t)pages[i], d, len);
        do tree_to_free(cm, a.w, a.mask);
        while (apw_next(&a));
        i += len;
    }
    cm->nfree += (int32_t)(to - from);
    cm->held -= (int64_t)(to - from);
}

static kvhal_status kvhal_cache_manager_free__body(kvhal_cache_manager *cm, const int32_t *pages, int32_t n)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    if (n < 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "n: %d is negative", (int)n);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(pages, "pages: NULL for %d pages", (int)n);
    KVHAL_TRY(mark_tree(cm, pages, 0, (size_t)n)); /* checks them; the marks go with the pages */
    give_back(cm, pages, 0, (size_t)n);
    return KVHAL_OK;
}

/* cache_finished and cache_finished_suffix: suffix says whether tokens and pages start at the handle's cached
 * length or at 0. */
static kvhal_status finish_impl(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                const int32_t *pages, kvhal_prefix_handle handle, bool suffix)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    size_t ps = (size_t)cm->page_size;
    size_t npages = (num_tokens + ps - 1) / ps;
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || npages == 0, "pages: NULL for %zu pages", npages);
    if (!(handle >> 63))
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx is not a request handle: pass the one "
                          "kvhal_cache_manager_match gave this request (each request finishes once)",
                          (unsigned long long)handle);
    size_t matched;
    KVHAL_TRY(kvhal__prefix_handle_len(cm->pc, handle, &matched));
    uint64_t parent = 0; /* the chain hash before tokens[0], for the tiers' page map */
    if (cm->tiering) {
        int32_t last = -1;
        if (suffix) KVHAL_TRY(kvhal__prefix_handle_last_page(cm->pc, handle, &last));
        parent = last >= 0 ? kvhal__tiering_page_hash(cm->tiering, last) : kvhal__tiering_root(cm->tiering);
    }
    if (!suffix && matched > num_tokens)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "num_tokens: %zu, fewer than the %zu the handle matched",
                          num_tokens, matched);
    /* pages[0..own) are the tree's, from match: insert checks them (none are passed with a suffix) */
    size_t own = suffix ? 0 : matched / ps;
    /* One pass marks the request's pages as the tree's; the few that turn out duplicates or the partial tail are
     * freed after the insert, and a failed insert puts every mark back. */
    KVHAL_TRY(mark_tree(cm, pages, own, npages));
    size_t already = 0;
    kvhal_status st = kvhal__prefix_insert_unlock(cm->pc, tokens, num_tokens, pages, handle, suffix, &already);
    if (st != KVHAL_OK) {
        unmark(cm, pages, own, npages);
        return st;
    }
    size_t aligned = num_tokens / ps;
    size_t dup_end = already / ps; /* >= own: the handle's path was on the tokens' path */
    cm->held -= (int64_t)(aligned - dup_end);
    give_back(cm, pages, own, dup_end);
    give_back(cm, pages, aligned, npages);
    /* the pages that entered the tree: page map, stored events, write-through copies */
    if (cm->tiering) kvhal__tiering_inserted(cm->tiering, tokens, pages, dup_end, aligned, parent);
    return KVHAL_OK;
}

static kvhal_status kvhal_cache_manager_cache_finished__body(kvhal_cache_manager *cm, const int32_t *tokens,
                                                             size_t num_tokens,
                                                const int32_t *pages, kvhal_prefix_handle handle)
{
    return finish_impl(cm, tokens, num_tokens, pages, handle, false);
}

static kvhal_status kvhal_cache_manager_cache_finished_suffix__body(kvhal_cache_manager *cm, kvhal_prefix_handle handle,
                                                       const int32_t *tokens, size_t num_tokens,
                                                       const int32_t *pages)
{
    return finish_impl(cm, tokens, num_tokens, pages, handle, true);
}

int32_t kvhal_cache_manager_available(const kvhal_cache_manager *cm)
{
    if (!cm || !kvhal__handle_live(cm, CM_MAGIC)) return 0;
    kvhal_prefix_size_info si;
    if (kvhal__prefix_size_info_get_owned(cm->pc, &si) != KVHAL_OK) return 0;
    return cm->nfree + cm->ndrain + (int32_t)(si.evictable_tokens / (size_t)cm->page_size);
}

int32_t kvhal_cache_manager_num_free(const kvhal_cache_manager *cm)
{
    return (cm && kvhal__handle_live(cm, CM_MAGIC)) ? cm->nfree : 0;
}

uint64_t kvhal_cache_manager_pages_evicted(const kvhal_cache_manager *cm)
{
    return (cm && kvhal__handle_live(cm, CM_MAGIC)) ? cm->evicted_pages : 0;
}

/* The calls behind the tiered entry points (manager_tiered.c), which hold cm themselves. */
kvhal_status kvhal__cm_match(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens, kvhal_prefix_handle *handle,
                             size_t *cached_len, int32_t *pages, size_t pages_cap)
{
    return kvhal_cache_manager_match__body(cm, tokens, num_tokens, handle, cached_len, pages, pages_cap, NULL);
}

kvhal_status kvhal__cm_allocate(kvhal_cache_manager *cm, int32_t n, int32_t *pages)
{
    return kvhal_cache_manager_allocate__body(cm, n, pages);
}

kvhal_status kvhal__cm_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n)
{
    return kvhal_cache_manager_free__body(cm, pages, n);
}

kvhal_status kvhal_cache_manager_match(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                       kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                       size_t pages_cap)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm",
                     kvhal_cache_manager_match__body(cm, tokens, num_tokens, handle, cached_len, pages, pages_cap, NULL));
}

kvhal_status kvhal_cache_manager_evict(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm", kvhal_cache_manager_evict__body(cm, num_tokens, evicted));
}

kvhal_status kvhal_cache_manager_allocate(kvhal_cache_manager *cm, int32_t n, int32_t *pages)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm", kvhal_cache_manager_allocate__body(cm, n, pages));
}

kvhal_status kvhal_cache_manager_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm", kvhal_cache_manager_free__body(cm, pages, n));
}

kvhal_status kvhal_cache_manager_cache_finished(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                                const int32_t *pages, kvhal_prefix_handle handle)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm",
                     kvhal_cache_manager_cache_finished__body(cm, tokens, num_tokens, pages, handle));
}

kvhal_status kvhal_cache_manager_cache_finished_suffix(kvhal_cache_manager *cm, kvhal_prefix_handle handle,
                                                       const int32_t *tokens, size_t num_tokens,
                                                       const int32_t *pages)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm",
                     kvhal_cache_manager_cache_finished_suffix__body(cm, handle, tokens, num_tokens, pages));
}

/* ---- page ids handed out as views of the manager's own storage ---- */
static kvhal_status view_room(int32_t **buf, int32_t total)
{
    if (!*buf && !(*buf = kvhal__malloc(sizeof(int32_t) * (size_t)total)))
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "pages: no room for the manager's page view (%d ids)", (int)total);
    return KVHAL_OK;
}

static kvhal_status kvhal_cache_manager_match_view__body(kvhal_cache_manager *cm, const int32_t *tokens,
                                                         size_t num_tokens, kvhal_prefix_handle *handle,
                                                         size_t *cached_len, const int32_t **pages,
                                                         size_t *num_pages)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    KVHAL_CHECK_ARG(pages, "pages: NULL (receives the view)");
    KVHAL_CHECK_ARG(num_pages, "num_pages: NULL");
    KVHAL_TRY(view_room(&cm->view_match, cm->total));
    size_t len = 0; /* a match never holds more pages than the manager has */
    const int32_t *v = NULL; /* the tree's own storage, or view_match */
    KVHAL_TRY(kvhal_cache_manager_match__body(cm, tokens, num_tokens, handle, &len, cm->view_match,
                                              (size_t)cm->total, &v));
    if (cached_len) *cached_len = len;
    *pages = v;
    *num_pages = len / (size_t)cm->page_size;
    return KVHAL_OK;
}

static kvhal_status kvhal_cache_manager_allocate_view__body(kvhal_cache_manager *cm, int32_t n,
                                                            const int32_t **pages)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    KVHAL_CHECK_ARG(pages, "pages: NULL (receives the view)");
    KVHAL_TRY(view_room(&cm->view_alloc, cm->total));
    if (n > cm->total)
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "n: %d pages requested of a manager of %d", (int)n, (int)cm->total);
    KVHAL_TRY(kvhal_cache_manager_allocate__body(cm, n, cm->view_alloc));
    *pages = cm->view_alloc;
    return KVHAL_OK;
}

/* admit: match + lock, then the pages past the match; the matched ids are copied into view_admit and the new ones
 * taken straight after them, so the request's page-table row is one list. A failed allocation gives the lock back:
 * the request leaves nothing behind (a split the match made stays: it changes no prefix the cache holds). */
static kvhal_status kvhal_cache_manager_admit__body(kvhal_cache_manager *cm, const int32_t *tokens,
                                                    size_t num_tokens, size_t extra_tokens,
                                                    kvhal_prefix_handle *handle, size_t *cached_len,
                                                    const int32_t **pages, size_t *num_pages)
{
    KVHAL_TRY(kvhal__cm_check_magic(cm));
    KVHAL_CHECK_ARG(handle, "handle: NULL (the request's handle is needed to finish it)");
    KVHAL_CHECK_ARG(pages, "pages: NULL (receives the view)");
    KVHAL_CHECK_ARG(num_pages, "num_pages: NULL");
    const size_t ps = (size_t)cm->page_size;
    KVHAL_TRY(view_room(&cm->view_admit, cm->total));
    kvhal_prefix_handle h;
    size_t len = 0;
    KVHAL_TRY(kvhal_cache_manager_match__body(cm, tokens, num_tokens, &h, &len, cm->view_admit, (size_t)cm->total,
                                              NULL));
    const size_t matched = len / ps;
    const size_t all = extra_tokens > SIZE_MAX - num_tokens - ps ? SIZE_MAX : (num_tokens + extra_tokens + ps - 1) / ps;
    const kvhal_status st = all - matched > (size_t)cm->total
                                ? kvhal__err(KVHAL_OUT_OF_MEMORY, "n: %zu pages, more than the manager's %d",
                                             all - matched, (int)cm->total)
                                : kvhal_cache_manager_allocate__body(cm, (int32_t)(all - matched),
                                                                     cm->view_admit + matched);
    if (st != KVHAL_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", kvhal_last_error());
        (void)kvhal_prefix_unlock(cm->pc, h); /* the request's own live lock: never refused */
        return kvhal__err(st, "extra_tokens: the %zu tokens past the %zu cached (%zu tokens + %zu extra) need %zu "
                          "pages, not allocated (the match's lock is given back): %s", num_tokens - len + extra_tokens,
                          len, num_tokens, extra_tokens, all - matched, why);
    }
    *handle = h;
    if (cached_len) *cached_len = len;
    *pages = cm->view_admit;
    *num_pages = all;
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_admit(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                      size_t extra_tokens, kvhal_prefix_handle *handle, size_t *cached_len,
                                      const int32_t **pages, size_t *num_pages)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm",
                     kvhal_cache_manager_admit__body(cm, tokens, num_tokens, extra_tokens, handle, cached_len, pages,
                                                     num_pages));
}

kvhal_status kvhal_cache_manager_match_view(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                            kvhal_prefix_handle *handle, size_t *cached_len, const int32_t **pages,
                                            size_t *num_pages)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm",
                     kvhal_cache_manager_match_view__body(cm, tokens, num_tokens, handle, cached_len, pages,
                                                          num_pages));
}

kvhal_status kvhal_cache_manager_allocate_view(kvhal_cache_manager *cm, int32_t n, const int32_t **pages)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm", kvhal_cache_manager_allocate_view__body(cm, n, pages));
}

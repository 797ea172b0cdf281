/* test_prefix.c — the prefix cache. Unit tests of each operation and of the design's examples (split on a partial
 * match, a lock protects its path, LRU eviction order, a parent becoming evictable, page alignment, the naive
 * kind), failure atomicity under injected allocation faults, and a property test: long random sequences of
 * match/lock/insert/unlock/evict/reset checked step by step against a page-level reference model, with
 * check_integrity after every step, at page sizes 1, 4 and 16. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"
#include "kvhal_test.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* helpers                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

typedef struct collected {
    int32_t pages[4096];
    size_t n;
    size_t calls;
} collected;

static void collect(const int32_t *pages, size_t n, void *user)
{
    collected *c = user;
    for (size_t i = 0; i < n && c->n < 4096; i++) c->pages[c->n++] = pages[i];
    c->calls++;
}

static kvhal_prefix_cache *make(kvhal_prefix_kind kind, int32_t ps)
{
    kvhal_prefix_cache *pc = NULL;
    assert_int_equal(kvhal_prefix_cache_create(kind, ps, &pc), KVHAL_OK);
    assert_non_null(pc);
    return pc;
}

static void seq(int32_t *t, size_t n, int32_t start)
{
    for (size_t i = 0; i < n; i++) t[i] = start + (int32_t)i;
}

static kvhal_prefix_size_info info(const kvhal_prefix_cache *pc)
{
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(pc, &si), KVHAL_OK);
    assert_int_equal(si.total_tokens, si.evictable_tokens + si.protected_tokens);
    return si;
}

static size_t insert(kvhal_prefix_cache *pc, const int32_t *t, size_t n, const int32_t *pages)
{
    size_t already = 12345;
    assert_int_equal(kvhal_prefix_insert(pc, t, n, pages, &already), KVHAL_OK);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    return already;
}

static size_t match(kvhal_prefix_cache *pc, const int32_t *t, size_t n, kvhal_prefix_handle *h, int32_t *pages,
                    size_t cap)
{
    size_t got = 12345;
    assert_int_equal(kvhal_prefix_match(pc, t, n, h, &got, pages, cap), KVHAL_OK);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    return got;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* unit tests                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

static void test_insert_and_match(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    assert_int_equal(kvhal_prefix_cache_page_size(pc), 1);
    int32_t t[8], pg[8], out[8];
    seq(t, 8, 100);
    seq(pg, 8, 0);
    kvhal_prefix_handle h = (kvhal_prefix_handle)0x1;
    assert_int_equal(match(pc, t, 8, &h, out, 8), 0); /* empty cache */
    assert_null(h);
    assert_int_equal(insert(pc, t, 8, pg), 0);
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.evictable_tokens, 8);
    assert_int_equal(si.protected_tokens, 0);
    assert_int_equal(si.num_nodes, 1);
    /* full match, a longer query, and a re-insert reporting everything as present */
    memset(out, -1, sizeof out);
    assert_int_equal(match(pc, t, 8, &h, out, 8), 8);
    assert_non_null(h);
    for (int i = 0; i < 8; i++) assert_int_equal(out[i], i);
    int32_t longer[12];
    seq(longer, 12, 100);
    int32_t out12[12];
    assert_int_equal(match(pc, longer, 12, &h, out12, 12), 8);
    int32_t dup[8] = {50, 51, 52, 53, 54, 55, 56, 57};
    assert_int_equal(insert(pc, t, 8, dup), 8);
    assert_int_equal(match(pc, t, 8, &h, out, 8), 8);
    for (int i = 0; i < 8; i++) assert_int_equal(out[i], i); /* the tree kept its own pages */
    /* a first token never seen: no match */
    int32_t other[3] = {7, 8, 9};
    assert_int_equal(match(pc, other, 3, &h, out, 8), 0);
    assert_null(h);
    assert_int_equal(match(pc, t, 0, &h, NULL, 0), 0);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* The design's example: a match that ends inside an edge splits it so that the handle ends exactly there. */
static void test_split_on_partial_match(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    int32_t t[8], pg[8], out[8];
    seq(t, 8, 1);
    seq(pg, 8, 10);
    insert(pc, t, 8, pg);
    assert_int_equal(info(pc).num_nodes, 1);
    int32_t q[5] = {1, 2, 3, 99, 98};
    kvhal_prefix_handle h;
    assert_int_equal(match(pc, q, 5, &h, out, 8), 3);
    assert_int_equal(out[0], 10);
    assert_int_equal(out[1], 11);
    assert_int_equal(out[2], 12);
    assert_int_equal(info(pc).num_nodes, 2); /* [1 2 3] -> [4..8] */
    /* locking the handle protects exactly the 3 matched tokens */
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_OK);
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.protected_tokens, 3);
    assert_int_equal(si.evictable_tokens, 5);
    collected c = {0};
    size_t ev = 0;
    assert_int_equal(kvhal_prefix_evict(pc, 100, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 5);
    assert_int_equal(c.n, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(c.pages[i], 13 + i);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    /* insert a sibling below the split point */
    assert_int_equal(insert(pc, q, 5, (int32_t[]){90, 91, 92, 93, 94}), 3);
    assert_int_equal(info(pc).num_nodes, 2);
    assert_int_equal(match(pc, q, 5, NULL, out, 8), 5);
    assert_int_equal(out[3], 93);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_OK);
    assert_int_equal(info(pc).protected_tokens, 0);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* An insert diverging inside an edge splits it; a handle taken before the split stays valid (it now names the
 * lower part, whose path covers the same tokens). */
static void test_split_on_insert_keeps_handles(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 2);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pa[4] = {0, 1, 2, 3};
    insert(pc, a, 8, pa);
    kvhal_prefix_handle h;
    int32_t out[4];
    assert_int_equal(match(pc, a, 8, &h, out, 4), 8);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_OK);
    int32_t b[8] = {1, 2, 3, 4, 9, 9, 9, 9}, pb[4] = {20, 21, 22, 23};
    assert_int_equal(insert(pc, b, 8, pb), 4);
    assert_int_equal(info(pc).num_nodes, 3);
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.protected_tokens, 8); /* the lock now covers both parts of the split edge */
    assert_int_equal(si.evictable_tokens, 4);
    collected c = {0};
    size_t ev;
    assert_int_equal(kvhal_prefix_evict(pc, 100, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 4);
    assert_int_equal(c.pages[0], 22);
    assert_int_equal(c.pages[1], 23);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_OK);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    c.n = 0;
    assert_int_equal(kvhal_prefix_evict(pc, 100, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 8);
    assert_int_equal(info(pc).num_nodes, 0);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

static void test_lock_protects(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 7, 8}, pa[4] = {0, 1, 2, 3}, pb[4] = {9, 9, 4, 5}, out[4];
    insert(pc, a, 4, pa);
    insert(pc, b, 4, pb);
    kvhal_prefix_handle h;
    assert_int_equal(match(pc, a, 4, &h, out, 4), 4);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_OK); /* counted */
    collected c = {0};
    size_t ev;
    assert_int_equal(kvhal_prefix_evict(pc, 1000, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 2); /* only [7 8]: [1 2] and [3 4] are on the locked path */
    assert_int_equal(c.pages[0], 4);
    assert_int_equal(c.pages[1], 5);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_OK);
    assert_int_equal(kvhal_prefix_evict(pc, 1000, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 0); /* still locked once */
    assert_int_equal(info(pc).protected_tokens, 4);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_INVALID_ARGUMENT); /* one unlock too many */
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    assert_int_equal(info(pc).evictable_tokens, 4);
    assert_int_equal(kvhal_prefix_evict(pc, 1000, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 4);
    /* the evicted node is gone: its handle is refused, not followed */
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* A handle gives back only the locks taken with it: a shorter handle whose node lies on a longer handle's path
 * cannot unlock that path's other lock by being unlocked once too often. */
static void test_unlock_only_own_locks(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pa[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[8];
    insert(pc, a, 8, pa);
    int32_t a4[5] = {1, 2, 3, 4, 99};
    kvhal_prefix_handle h_short, h_long;
    assert_int_equal(match(pc, a4, 5, &h_short, out, 8), 4); /* splits [1..8] at 4 */
    assert_int_equal(match(pc, a, 8, &h_long, out, 8), 8);
    assert_ptr_not_equal(h_short, h_long);
    assert_int_equal(kvhal_prefix_lock(pc, h_short), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, h_long), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, h_short), KVHAL_OK);
    /* h_short's node still counts h_long's lock, but none of its own is left */
    assert_int_equal(kvhal_prefix_unlock(pc, h_short), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "not locked"));
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(info(pc).protected_tokens, 8);
    assert_int_equal(kvhal_prefix_unlock(pc, h_long), KVHAL_OK);
    assert_int_equal(info(pc).protected_tokens, 0);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* Leaves go in LRU order; a parent becomes a candidate once its last child is gone; evict stops at whole leaves
 * once enough tokens are freed. */
static void test_evict_order(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    int32_t sys[3] = {5, 5, 5};
    int32_t a[5] = {5, 5, 5, 1, 1}, b[5] = {5, 5, 5, 2, 2}, c5[5] = {5, 5, 5, 3, 3}, d[2] = {9, 9};
    insert(pc, a, 5, (int32_t[]){0, 1, 2, 10, 11});
    insert(pc, b, 5, (int32_t[]){0, 1, 2, 20, 21});
    insert(pc, c5, 5, (int32_t[]){0, 1, 2, 30, 31});
    insert(pc, d, 2, (int32_t[]){40, 41});
    int32_t out[5];
    match(pc, a, 5, NULL, out, 5); /* a becomes the most recent */
    collected c = {0};
    size_t ev;
    assert_int_equal(kvhal_prefix_evict(pc, 1, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 2); /* a whole leaf: b */
    assert_int_equal(c.pages[0], 20);
    assert_int_equal(c.pages[1], 21);
    c.n = 0;
    assert_int_equal(kvhal_prefix_evict(pc, 3, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 4); /* c5, then d */
    assert_int_equal(c.calls, 3);
    assert_int_equal(c.pages[0], 30);
    assert_int_equal(c.pages[2], 40);
    /* sys has one child left (a); evicting a makes sys a leaf, and it goes next */
    c.n = 0;
    assert_int_equal(kvhal_prefix_evict(pc, 2, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 2);
    assert_int_equal(c.pages[0], 10);
    assert_int_equal(info(pc).num_nodes, 1);
    assert_int_equal(match(pc, sys, 3, NULL, out, 5), 3);
    c.n = 0;
    assert_int_equal(kvhal_prefix_evict(pc, 1, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 3);
    assert_int_equal(c.pages[0], 0);
    assert_int_equal(kvhal_prefix_evict(pc, 1, collect, &c, &ev), KVHAL_OK);
    assert_int_equal(ev, 0); /* nothing left */
    assert_int_equal(kvhal_prefix_evict(pc, 0, NULL, NULL, &ev), KVHAL_OK);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

static void test_page_alignment(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 4);
    int32_t t[10], pg[2] = {7, 8}, out[2];
    seq(t, 10, 1);
    assert_int_equal(insert(pc, t, 10, pg), 0); /* 8 tokens, 2 pages; the partial page is not cached */
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.total_tokens, 8);
    kvhal_prefix_handle h;
    assert_int_equal(match(pc, t, 10, &h, out, 2), 8);
    assert_int_equal(match(pc, t, 7, &h, out, 2), 4); /* 7 tokens: one whole page */
    assert_int_equal(out[0], 7);
    assert_int_equal(match(pc, t, 3, &h, out, 2), 0);
    assert_null(h);
    /* a query differing inside the second page matches one page and splits at the page boundary */
    int32_t q[8] = {1, 2, 3, 4, 5, 6, 0, 8};
    assert_int_equal(match(pc, q, 8, &h, out, 2), 4);
    assert_int_equal(info(pc).num_nodes, 2);
    /* differing inside the first page: no match, no split */
    int32_t r[8] = {1, 2, 0, 4, 5, 6, 7, 8};
    assert_int_equal(match(pc, r, 8, &h, out, 2), 0);
    assert_int_equal(insert(pc, r, 8, (int32_t[]){30, 31}), 0);
    assert_int_equal(info(pc).num_nodes, 3);
    assert_int_equal(match(pc, r, 8, &h, out, 2), 8);
    assert_int_equal(out[0], 30);
    assert_int_equal(out[1], 31);
    /* inserting fewer tokens than one page stores nothing */
    assert_int_equal(insert(pc, (int32_t[]){42, 43, 44}, 3, NULL), 0);
    assert_int_equal(info(pc).total_tokens, 16);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* With page size > 1, children are found by a hash of their first page: pages that share their first token
 * (or collide) must still be told apart by their content. */
static void test_many_children(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 2);
    enum { N = 3000 };
    for (int32_t i = 0; i < N; i++) {
        int32_t t[4] = {i % 7, i, 1, 2};
        int32_t pg[2] = {2 * i, 2 * i + 1};
        size_t already;
        assert_int_equal(kvhal_prefix_insert(pc, t, 4, pg, &already), KVHAL_OK);
        assert_int_equal(already, 0);
    }
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(info(pc).num_nodes, N);
    for (int32_t i = 0; i < N; i += 97) {
        int32_t t[4] = {i % 7, i, 1, 2}, out[2];
        assert_int_equal(match(pc, t, 4, NULL, out, 2), 4);
        assert_int_equal(out[0], 2 * i);
    }
    size_t ev;
    assert_int_equal(kvhal_prefix_evict(pc, 2 * N - 10, NULL, NULL, &ev), KVHAL_OK);
    assert_true(ev >= 2 * N - 10);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

static void test_reset(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    int32_t a[3] = {1, 2, 3}, b[3] = {1, 5, 6}, out[3];
    insert(pc, a, 3, (int32_t[]){0, 1, 2});
    insert(pc, b, 3, (int32_t[]){9, 3, 4});
    kvhal_prefix_handle h;
    match(pc, a, 3, &h, out, 3);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_OK);
    collected c = {0};
    assert_int_equal(kvhal_prefix_reset(pc, collect, &c), KVHAL_OK);
    assert_int_equal(c.n, 5);
    int seen = 0;
    for (size_t i = 0; i < c.n; i++) seen |= 1 << c.pages[i];
    assert_int_equal(seen, 0x1f);
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.total_tokens, 0);
    assert_int_equal(si.num_nodes, 0);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    /* usable again */
    assert_int_equal(insert(pc, a, 3, (int32_t[]){0, 1, 2}), 0);
    assert_int_equal(match(pc, a, 3, NULL, out, 3), 3);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

static void test_naive(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_NAIVE, 4);
    int32_t t[10], pg[2] = {0, 1}, out[2];
    seq(t, 10, 1);
    assert_int_equal(insert(pc, t, 10, pg), 8); /* keeps nothing: every page stays the caller's */
    kvhal_prefix_handle h = 0x1;
    assert_int_equal(match(pc, t, 10, &h, out, 2), 0);
    assert_int_equal(h, 0);
    size_t ev = 77;
    assert_int_equal(kvhal_prefix_evict(pc, 0, NULL, NULL, &ev), KVHAL_OK);
    assert_int_equal(ev, 0);
    assert_int_equal(kvhal_prefix_evict(pc, 1, NULL, NULL, &ev), KVHAL_UNSUPPORTED);
    assert_non_null(strstr(kvhal_last_error(), "naive"));
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.total_tokens, 0);
    assert_int_equal(kvhal_prefix_reset(pc, NULL, NULL), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, 0), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

static void test_errors(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = (kvhal_prefix_cache *)0x1;
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 0, &pc), KVHAL_INVALID_ARGUMENT);
    assert_null(pc);
    assert_non_null(strstr(kvhal_last_error(), "page_size: 0"));
    assert_int_equal(kvhal_prefix_cache_create((kvhal_prefix_kind)3, 1, &pc), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, NULL), KVHAL_INVALID_ARGUMENT);
    pc = make(KVHAL_PREFIX_RADIX, 2);
    int32_t t[8], pg[4] = {0, 1, 2, 3}, out[4] = {-1, -1, -1, -1};
    seq(t, 8, 1);
    insert(pc, t, 8, pg);
    /* pages_cap too small: an error, nothing written, nothing split */
    int32_t q[8] = {1, 2, 3, 4, 5, 6, 0, 0};
    kvhal_prefix_handle h = 0;
    size_t got = 99;
    assert_int_equal(kvhal_prefix_match(pc, q, 8, &h, &got, out, 2), KVHAL_OUT_OF_RANGE);
    assert_non_null(strstr(kvhal_last_error(), "pages_cap: 2"));
    assert_int_equal(out[0], -1);
    assert_int_equal(info(pc).num_nodes, 1);
    assert_int_equal(kvhal_prefix_match(pc, NULL, 8, &h, &got, out, 4), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_match(pc, q, 8, &h, &got, NULL, 4), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_insert(pc, NULL, 4, pg, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_insert(pc, q, 8, NULL, NULL), KVHAL_INVALID_ARGUMENT);
    int32_t negative[4] = {0, 1, 2, -3};
    assert_int_equal(kvhal_prefix_insert(pc, q, 8, negative, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "pages[3]: -3"));
    assert_int_equal(info(pc).num_nodes, 1);
    assert_int_equal(kvhal_prefix_unlock(pc, 0), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_lock(pc, 0), KVHAL_INVALID_ARGUMENT);
    /* a handle from another cache */
    kvhal_prefix_cache *other = make(KVHAL_PREFIX_RADIX, 2);
    insert(other, t, 8, pg);
    kvhal_prefix_handle oh;
    match(other, t, 8, &oh, out, 4);
    assert_int_equal(kvhal_prefix_lock(pc, oh), KVHAL_INVALID_HANDLE);
    assert_non_null(strstr(kvhal_last_error(), "another"));
    /* a handle of a naive cache is never valid */
    kvhal_prefix_cache *naive = make(KVHAL_PREFIX_NAIVE, 2);
    assert_int_equal(kvhal_prefix_lock(naive, oh), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_size_info_get(pc, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_prefix_check_integrity(NULL), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_evict(NULL, 1, NULL, NULL, NULL), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_cache_page_size(NULL), 0);
    assert_int_equal(kvhal_prefix_cache_destroy(naive), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(other), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(NULL), KVHAL_OK);
}

/* check_integrity finds a page held in two places (the caller's bookkeeping error it exists to catch). */
static void test_integrity_detects_shared_page(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, 1);
    insert(pc, (int32_t[]){1, 2}, 2, (int32_t[]){5, 6});
    size_t already;
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){3, 4}, 2, (int32_t[]){7, 5}, &already), KVHAL_OK);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_INTEGRITY);
    assert_non_null(strstr(kvhal_last_error(), "page 5"));
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* Every allocation inside match (split) and insert (split + new leaf + table/heap growth) may fail: the call
 * reports OUT_OF_MEMORY and the cache is exactly as before. */
static void test_fault_injection(void **state)
{
    (void)state;
    for (int32_t ps = 1; ps <= 4; ps *= 4) {
        int failures = 0;
        for (int64_t k = 1;; k++) {
            kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, ps);
            int32_t base[64], pages[64];
            /* 70 short sequences so that the table and the heap have to grow during the faulty call */
            for (int32_t i = 0; i < 70; i++) {
                seq(base, 2 * (size_t)ps, 1000 * i);
                seq(pages, 2, 2 * i);
                insert(pc, base, 2 * (size_t)ps, pages);
            }
            seq(base, 16 * (size_t)ps, 1);
            seq(pages, 16, 1000);
            insert(pc, base, 16 * (size_t)ps, pages);
            kvhal_prefix_size_info before = info(pc);
            int32_t q[64];
            seq(q, 16 * (size_t)ps, 1);
            q[8 * ps + ps - 1] = -5; /* diverges inside the long edge, in page 8 */
            int32_t qpages[16];
            seq(qpages, 16, 2000);
            size_t already = 0;
            kvhal_fault_inject_alloc(k);
            kvhal_status st = kvhal_prefix_insert(pc, q, 16 * (size_t)ps, qpages, &already);
            kvhal_fault_inject_alloc(0);
            assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
            if (st == KVHAL_OK) {
                assert_int_equal(already, 8 * (size_t)ps);
                assert_int_equal(info(pc).total_tokens, before.total_tokens + 8 * (size_t)ps);
                assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
                break;
            }
            failures++;
            assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
            kvhal_prefix_size_info after = info(pc);
            assert_int_equal(after.total_tokens, before.total_tokens);
            assert_int_equal(after.num_nodes, before.num_nodes);
            /* the same for a match that must split */
            int32_t out[16];
            size_t got = 0;
            kvhal_fault_inject_alloc(1);
            st = kvhal_prefix_match(pc, q, 16 * (size_t)ps, NULL, &got, out, 16);
            kvhal_fault_inject_alloc(0);
            if (st != KVHAL_OK) {
                assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
                assert_int_equal(info(pc).num_nodes, before.num_nodes);
            }
            assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
            assert_int_equal(match(pc, q, 16 * (size_t)ps, NULL, out, 16), 8 * (size_t)ps);
            assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
            assert_true(k < 50);
        }
        assert_true(failures >= 2); /* the split buffer and the leaf buffer at least */
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* property test against a page-level reference model                                                         */
/* ---------------------------------------------------------------------------------------------------------- */

/* The model: one entry per cached page, named by the whole token prefix up to that page's end. A page is a leaf
 * when no entry extends it; LRU evicts the unlocked leaf page with the oldest tick, one page at a time. Every
 * access touches a whole root path, so two leaves never share a tick and this order is fully determined: the
 * radix tree, which evicts whole edges, must free exactly the same pages. */
#define MAXLEN 64
#define MAXP 4096
#define MAXH 24

typedef struct mpage {
    bool live;
    int depth;        /* page index */
    uint64_t hash;    /* of tokens[0 .. (depth+1)*ps) */
    int32_t tok[MAXLEN];
    int32_t page;
    uint64_t tick;
    int lock;
    int nchild;
    int parent;       /* slot of the page before, -1 at depth 0 */
} mpage;

typedef struct held_lock {
    kvhal_prefix_handle h;
    int32_t tok[MAXLEN];
    int npages;
} held_lock;

typedef struct model {
    int32_t ps;
    mpage *p; /* MAXP slots */
    int live;
    uint64_t clock;
    held_lock held[MAXH];
    int nheld;
    int32_t next_page;
    int hwm; /* slots at and above are all dead */
} model;

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void prefix_hashes(const int32_t *t, size_t n, int32_t ps, uint64_t *out)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (uint32_t)t[i]) * 0x100000001b3ULL;
        if ((i + 1) % (size_t)ps == 0) out[i / (size_t)ps] = h;
    }
}

static int m_find(const model *m, const int32_t *t, int depth, uint64_t hash)
{
    for (int i = 0; i < m->hwm; i++) {
        const mpage *p = &m->p[i];
        if (p->live && p->depth == depth && p->hash == hash &&
            memcmp(p->tok, t, (size_t)(depth + 1) * (size_t)m->ps * sizeof(int32_t)) == 0)
            return i;
    }
    return -1;
}

/* Slots of the cached pages of t (longest run from the root); returns their count. */
static int m_path(const model *m, const int32_t *t, size_t n, int *slots)
{
    uint64_t hs[MAXLEN];
    int np = (int)(n / (size_t)m->ps);
    prefix_hashes(t, n, m->ps, hs);
    int k = 0;
    for (; k < np; k++) {
        int s = m_find(m, t, k, hs[k]);
        if (s < 0) break;
        slots[k] = s;
    }
    return k;
}

static void m_check_sizes(const model *m, const kvhal_prefix_cache *pc)
{
    size_t ev = 0, pr = 0;
    for (int i = 0; i < MAXP; i++)
        if (m->p[i].live) {
            if (m->p[i].lock) pr += (size_t)m->ps; else ev += (size_t)m->ps;
        }
    kvhal_prefix_size_info si = info(pc);
    assert_int_equal(si.evictable_tokens, ev);
    assert_int_equal(si.protected_tokens, pr);
    assert_true(si.num_nodes <= (size_t)m->live);
    assert_true((m->live == 0) == (si.num_nodes == 0));
}

static void gen_tokens(uint64_t *rng, int32_t bases[][MAXLEN], int32_t *t, size_t *n)
{
    int b = (int)(rng_next(rng) % 6);
    size_t len = (size_t)(rng_next(rng) % (MAXLEN + 1));
    memcpy(t, bases[b], len * sizeof(int32_t));
    int muts = (int)(rng_next(rng) % 3);
    for (int i = 0; i < muts && len; i++) t[rng_next(rng) % len] = (int32_t)(rng_next(rng) % 4);
    *n = len;
}

typedef struct evict_log {
    int32_t pages[MAXP];
    size_t n;
    size_t batch_start[MAXP];
    size_t nbatch;
} evict_log;

static void log_evicted(const int32_t *pages, size_t n, void *user)
{
    evict_log *l = user;
    assert_true(n > 0);
    assert_true(l->n + n <= MAXP);
    l->batch_start[l->nbatch++] = l->n;
    memcpy(l->pages + l->n, pages, n * sizeof(int32_t));
    l->n += n;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int m_slot_of_page(const model *m, int32_t page)
{
    for (int i = 0; i < m->hwm; i++)
        if (m->p[i].live && m->p[i].page == page) return i;
    return -1;
}

static void m_remove(model *m, int s)
{
    mpage *p = &m->p[s];
    assert_true(p->live && p->nchild == 0 && p->lock == 0);
    if (p->parent >= 0) m->p[p->parent].nchild--;
    p->live = false;
    m->live--;
}

static void step_evict(model *m, kvhal_prefix_cache *pc, size_t want)
{
    static evict_log log;
    log.n = log.nbatch = 0;
    size_t ev = 0;
    assert_int_equal(kvhal_prefix_evict(pc, want, log_evicted, &log, &ev), KVHAL_OK);
    assert_int_equal(ev, log.n * (size_t)m->ps);
    /* whole leaves in LRU order: each batch is one unlocked edge with one tick, ticks never go back */
    uint64_t last_tick = 0;
    for (size_t b = 0; b < log.nbatch; b++) {
        size_t end = b + 1 < log.nbatch ? log.batch_start[b + 1] : log.n;
        uint64_t tick = 0;
        for (size_t i = log.batch_start[b]; i < end; i++) {
            int s = m_slot_of_page(m, log.pages[i]);
            assert_true(s >= 0);
            assert_int_equal(m->p[s].lock, 0);
            if (i == log.batch_start[b]) tick = m->p[s].tick;
            assert_true(m->p[s].tick == tick);
        }
        assert_true(tick >= last_tick);
        last_tick = tick;
    }
    /* the model frees the same number of pages its own way */
    static int32_t expect[MAXP];
    size_t ne = 0;
    for (size_t k = 0; k < log.n; k++) {
        int best = -1;
        for (int i = 0; i < m->hwm; i++) {
            const mpage *p = &m->p[i];
            if (p->live && p->nchild == 0 && p->lock == 0 && (best < 0 || p->tick < m->p[best].tick)) best = i;
        }
        assert_true(best >= 0);
        expect[ne++] = m->p[best].page;
        m_remove(m, best);
    }
    static int32_t got[MAXP];
    memcpy(got, log.pages, log.n * sizeof(int32_t));
    qsort(got, log.n, sizeof(int32_t), cmp_i32);
    qsort(expect, ne, sizeof(int32_t), cmp_i32);
    assert_memory_equal(got, expect, ne * sizeof(int32_t));
    /* it stopped only when enough was freed or nothing unlocked is left */
    if (ev < want)
        for (int i = 0; i < MAXP; i++) assert_false(m->p[i].live && m->p[i].lock == 0);
}

static void step_match(model *m, kvhal_prefix_cache *pc, const int32_t *t, size_t n, bool lock)
{
    int slots[MAXLEN];
    int k = m_path(m, t, n, slots);
    int32_t out[MAXLEN];
    kvhal_prefix_handle h;
    size_t got = 0;
    assert_int_equal(kvhal_prefix_match(pc, t, n, &h, &got, out, MAXLEN), KVHAL_OK);
    assert_int_equal(got, (size_t)k * (size_t)m->ps);
    assert_true((k == 0) == (h == 0));
    uint64_t now = ++m->clock;
    for (int i = 0; i < k; i++) {
        assert_int_equal(out[i], m->p[slots[i]].page);
        m->p[slots[i]].tick = now;
    }
    if (lock && h && m->nheld < MAXH) {
        assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_OK);
        held_lock *hl = &m->held[m->nheld++];
        hl->h = h;
        memcpy(hl->tok, t, n * sizeof(int32_t));
        hl->npages = k;
        for (int i = 0; i < k; i++) m->p[slots[i]].lock++;
    }
}

static void step_unlock(model *m, kvhal_prefix_cache *pc, size_t which)
{
    held_lock hl = m->held[which];
    m->held[which] = m->held[--m->nheld];
    int slots[MAXLEN];
    int k = m_path(m, hl.tok, (size_t)hl.npages * (size_t)m->ps, slots);
    assert_int_equal(k, hl.npages); /* a locked path is never evicted */
    assert_int_equal(kvhal_prefix_unlock(pc, hl.h), KVHAL_OK);
    for (int i = 0; i < k; i++) m->p[slots[i]].lock--;
}

static void step_insert(model *m, kvhal_prefix_cache *pc, const int32_t *t, size_t n)
{
    int32_t ps = m->ps;
    int np = (int)(n / (size_t)ps);
    int32_t pages[MAXLEN];
    for (int i = 0; i < np; i++) pages[i] = m->next_page++;
    int slots[MAXLEN];
    int k = m_path(m, t, n, slots);
    size_t already = 0;
    assert_int_equal(kvhal_prefix_insert(pc, t, n, pages, &already), KVHAL_OK);
    assert_int_equal(already, (size_t)k * (size_t)ps);
    uint64_t hs[MAXLEN];
    prefix_hashes(t, n, ps, hs);
    uint64_t now = ++m->clock;
    for (int i = 0; i < k; i++) m->p[slots[i]].tick = now;
    int parent = k ? slots[k - 1] : -1;
    for (int i = k; i < np; i++) {
        int s = 0;
        while (m->p[s].live) s++;
        assert_true(s < MAXP);
        if (s >= m->hwm) m->hwm = s + 1;
        mpage *p = &m->p[s];
        p->live = true;
        p->depth = i;
        p->hash = hs[i];
        memcpy(p->tok, t, (size_t)(i + 1) * (size_t)ps * sizeof(int32_t));
        p->page = pages[i];
        p->tick = now;
        p->lock = 0;
        p->nchild = 0;
        p->parent = parent;
        if (parent >= 0) m->p[parent].nchild++;
        parent = s;
        m->live++;
    }
}

static void run_property(int32_t ps, uint64_t seed, int steps)
{
    model m = {0};
    m.ps = ps;
    m.p = calloc(MAXP, sizeof(mpage));
    assert_non_null(m.p);
    kvhal_prefix_cache *pc = make(KVHAL_PREFIX_RADIX, ps);
    uint64_t rng = seed;
    int32_t bases[6][MAXLEN];
    for (int b = 0; b < 6; b++)
        for (int i = 0; i < MAXLEN; i++) bases[b][i] = (int32_t)(rng_next(&rng) % 4);
    /* make pairs of bases share long heads, so that edges split deep inside */
    memcpy(bases[1], bases[0], 40 * sizeof(int32_t));
    memcpy(bases[3], bases[2], 17 * sizeof(int32_t));
    int32_t t[MAXLEN];
    size_t n;
    for (int step = 0; step < steps; step++) {
        unsigned r = (unsigned)(rng_next(&rng) % 100);
        if (r < 25) {
            gen_tokens(&rng, bases, t, &n);
            step_match(&m, pc, t, n, true);
        } else if (r < 35) {
            gen_tokens(&rng, bases, t, &n);
            step_match(&m, pc, t, n, false);
        } else if (r < 65) {
            gen_tokens(&rng, bases, t, &n);
            step_insert(&m, pc, t, n);
        } else if (r < 82) {
            if (m.nheld) step_unlock(&m, pc, (size_t)(rng_next(&rng) % (uint64_t)m.nheld));
        } else if (r < 99) {
            size_t want = (size_t)(rng_next(&rng) % (uint64_t)(m.live + 2)) * (size_t)ps / 2;
            step_evict(&m, pc, want);
        } else {
            collected c = {0};
            assert_int_equal(kvhal_prefix_reset(pc, collect, &c), KVHAL_OK);
            assert_int_equal(c.n, (size_t)m.live);
            for (size_t i = 0; i < c.n; i++) assert_true(m_slot_of_page(&m, c.pages[i]) >= 0);
            memset(m.p, 0, MAXP * sizeof(mpage));
            m.live = 0;
            m.nheld = 0;
            m.hwm = 0;
        }
        assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
        m_check_sizes(&m, pc);
        /* keep the model small: evict when it grows */
        if (m.live > 300) step_evict(&m, pc, (size_t)100 * (size_t)ps);
    }
    while (m.nheld) step_unlock(&m, pc, 0);
    step_evict(&m, pc, SIZE_MAX);
    assert_int_equal(m.live, 0);
    assert_int_equal(info(pc).num_nodes, 0);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
    free(m.p);
}

static void test_property_ps1(void **state)
{
    (void)state;
    run_property(1, 1, 6000);
    run_property(1, 2, 6000);
}

static void test_property_ps4(void **state)
{
    (void)state;
    run_property(4, 3, 6000);
    run_property(4, 4, 6000);
}

static void test_property_ps16(void **state)
{
    (void)state;
    run_property(16, 5, 6000);
    run_property(16, 6, 6000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_insert_and_match),
        cmocka_unit_test(test_split_on_partial_match),
        cmocka_unit_test(test_split_on_insert_keeps_handles),
        cmocka_unit_test(test_lock_protects),
        cmocka_unit_test(test_unlock_only_own_locks),
        cmocka_unit_test(test_evict_order),
        cmocka_unit_test(test_page_alignment),
        cmocka_unit_test(test_many_children),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_naive),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_integrity_detects_shared_page),
        cmocka_unit_test(test_fault_injection),
        cmocka_unit_test(test_property_ps1),
        cmocka_unit_test(test_property_ps4),
        cmocka_unit_test(test_property_ps16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

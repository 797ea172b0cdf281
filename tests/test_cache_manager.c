/* test_cache_manager.c — the cache manager: allocation that evicts when free pages run short and fails without a
 * partial allocation, cache_finished (insert, duplicate and tail pages freed, unlock), the page accounting that
 * check_integrity verifies, refusal of a caller's bookkeeping errors without any change, the naive kind, and a
 * randomized serving simulation where every page carries a shadow of the token prefix written into it, so that a
 * prefix hit returning a wrong page is caught. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"
#include "kvhal_test.h"

static kvhal_cache_manager *make(int32_t total, int32_t ps, kvhal_prefix_kind kind)
{
    kvhal_cache_manager *cm = NULL;
    assert_int_equal(kvhal_cache_manager_create(total, ps, kind, &cm), KVHAL_OK);
    assert_non_null(cm);
    assert_non_null(kvhal_cache_manager_prefix(cm));
    return cm;
}

static void ok(const kvhal_cache_manager *cm)
{
    kvhal_status st = kvhal_cache_manager_check_integrity(cm);
    if (st != KVHAL_OK) fail_msg("%s", kvhal_last_error());
}

static kvhal_prefix_size_info info(kvhal_cache_manager *cm)
{
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(cm), &si), KVHAL_OK);
    return si;
}

/* A request handle for a request that matched nothing (finishing needs one from match). */
static kvhal_prefix_handle nomatch(kvhal_cache_manager *cm)
{
    kvhal_prefix_handle h = 0;
    assert_int_equal(kvhal_cache_manager_match(cm, NULL, 0, &h, NULL, NULL, 0), KVHAL_OK);
    assert_true(h != 0);
    return h;
}

static void seq(int32_t *t, size_t n, int32_t start)
{
    for (size_t i = 0; i < n; i++) t[i] = start + (int32_t)i;
}

/* One request: match + lock, allocate the rest, finish. Returns the cached length it found. */
static size_t run_request(kvhal_cache_manager *cm, const int32_t *t, size_t n)
{
    int32_t ps = kvhal_prefix_cache_page_size(kvhal_cache_manager_prefix(cm));
    int32_t pages[256];
    size_t np = (n + (size_t)ps - 1) / (size_t)ps;
    kvhal_prefix_handle h;
    size_t cached = 0;
    assert_int_equal(kvhal_cache_manager_match(cm, t, n, &h, &cached, pages, 256), KVHAL_OK);
    size_t have = cached / (size_t)ps;
    assert_int_equal(kvhal_cache_manager_allocate(cm, (int32_t)(np - have), pages + have), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, n, pages, h), KVHAL_OK);
    ok(cm);
    return cached;
}

/* The flow of test_flow and test_finish_suffix: request A (tokens 1..20, page size 4) runs and is cached. */
static void cache_a(kvhal_cache_manager *cm)
{
    int32_t a[20];
    seq(a, 20, 1);
    assert_int_equal(run_request(cm, a, 20), 0);
}

/* Then B shares 12 tokens with A and has 18: its match finds A's first 3 pages (pages[0..3)) and locks them. */
static kvhal_prefix_handle match_b(kvhal_cache_manager *cm, int32_t b[18], int32_t pages[8])
{
    seq(b, 18, 1);
    b[12] = 99;
    kvhal_prefix_handle h;
    size_t cached;
    assert_int_equal(kvhal_cache_manager_match(cm, b, 18, &h, &cached, pages, 8), KVHAL_OK);
    assert_int_equal(cached, 12);
    return h;
}

static void test_flow(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(16, 4, KVHAL_PREFIX_RADIX);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 16);
    assert_int_equal(kvhal_cache_manager_available(cm), 16);
    cache_a(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 11);
    assert_int_equal(kvhal_cache_manager_available(cm), 16); /* 11 free + 5 evictable */
    assert_int_equal(info(cm).total_tokens, 20);

    /* B: the matched 3 pages are reused, one new full page is cached, the tail freed */
    int32_t b[18], pages[8];
    kvhal_prefix_handle h = match_b(cm, b, pages);
    assert_int_equal(info(cm).protected_tokens, 12);
    assert_int_equal(kvhal_cache_manager_available(cm), 13); /* locked pages are not available */
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pages + 3), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 9);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, b, 18, pages, h), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 10);
    assert_int_equal(info(cm).total_tokens, 24);
    assert_int_equal(info(cm).protected_tokens, 0);
    assert_int_equal(run_request(cm, b, 18), 16);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Two requests with the same new prompt run at the same time: the second to finish finds it cached and its
 * pages go back to the free pool. */
static void test_duplicates_freed(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(16, 2, KVHAL_PREFIX_RADIX);
    int32_t t[8];
    seq(t, 8, 5);
    kvhal_prefix_handle h1, h2;
    size_t c1, c2;
    int32_t p1[4], p2[4];
    assert_int_equal(kvhal_cache_manager_match(cm, t, 8, &h1, &c1, p1, 4), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_match(cm, t, 8, &h2, &c2, p2, 4), KVHAL_OK);
    assert_int_equal(c1 + c2, 0);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 4, p1), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 4, p2), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 8);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 8, p1, h1), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 8, p2, h2), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 12);
    int32_t out[4];
    kvhal_prefix_handle h;
    size_t got;
    assert_int_equal(kvhal_prefix_match(kvhal_cache_manager_prefix(cm), t, 8, &h, &got, out, 4), KVHAL_OK);
    assert_memory_equal(out, p1, sizeof out); /* the first finisher's pages are the cached ones */
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

static void test_allocate_evicts(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(10, 1, KVHAL_PREFIX_RADIX);
    int32_t a[4], b[4], c[2];
    seq(a, 4, 100);
    seq(b, 4, 200);
    seq(c, 2, 300);
    run_request(cm, a, 4);
    run_request(cm, b, 4);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 2);
    /* touch a: b is now the least recently used */
    run_request(cm, a, 4);
    int32_t pages[10];
    assert_int_equal(kvhal_cache_manager_allocate(cm, 5, pages), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_pages_evicted(cm), 4);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 1);
    int32_t out[4];
    size_t got;
    kvhal_prefix_handle h;
    assert_int_equal(kvhal_prefix_match(kvhal_cache_manager_prefix(cm), a, 4, &h, &got, out, 4), KVHAL_OK);
    assert_int_equal(got, 4);
    assert_int_equal(kvhal_prefix_match(kvhal_cache_manager_prefix(cm), b, 4, &h, &got, out, 4), KVHAL_OK);
    assert_int_equal(got, 0);

    /* a is locked by a running request: nothing can be evicted, allocation fails and changes nothing */
    kvhal_prefix_handle ha;
    assert_int_equal(kvhal_cache_manager_match(cm, a, 4, &ha, &got, out, 4), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_available(cm), 1);
    int32_t more[4] = {-1, -1, -1, -1};
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, more), KVHAL_OUT_OF_MEMORY);
    assert_non_null(strstr(kvhal_last_error(), "n: 2"));
    assert_int_equal(more[0], -1);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 1);
    assert_int_equal(info(cm).total_tokens, 4);
    assert_int_equal(kvhal_cache_manager_pages_evicted(cm), 4);
    ok(cm);
    /* freeing the running request's own pages and unlocking makes room */
    assert_int_equal(kvhal_cache_manager_free(cm, pages, 5), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), ha), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 10, pages), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_pages_evicted(cm), 8);
    assert_int_equal(kvhal_cache_manager_available(cm), 0);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_free(cm, pages, 10), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

static void test_evict_api(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(32, 4, KVHAL_PREFIX_RADIX);
    int32_t t[16];
    for (int r = 0; r < 4; r++) {
        seq(t, 16, 100 * r);
        run_request(cm, t, 16);
    }
    assert_int_equal(kvhal_cache_manager_num_free(cm), 16);
    size_t ev = 0;
    assert_int_equal(kvhal_cache_manager_evict(cm, 20, &ev), KVHAL_OK);
    assert_int_equal(ev, 32); /* whole leaves: two of 16 tokens */
    assert_int_equal(kvhal_cache_manager_num_free(cm), 24);
    assert_int_equal(kvhal_cache_manager_pages_evicted(cm), 8);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_evict(cm, 1000, &ev), KVHAL_OK);
    assert_int_equal(ev, 32);
    assert_int_equal(kvhal_cache_manager_evict(cm, 1000, &ev), KVHAL_OK);
    assert_int_equal(ev, 0);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 32);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Wrong pages, a tree page freed by a request, a handle finished twice: refused with a message, nothing changed. */
static void test_misuse_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(16, 2, KVHAL_PREFIX_RADIX);
    int32_t t[8];
    seq(t, 8, 1);
    run_request(cm, t, 8);
    kvhal_prefix_handle h;
    size_t cached;
    int32_t pages[6];
    int32_t u[12];
    seq(u, 12, 1);
    assert_int_equal(kvhal_cache_manager_match(cm, u, 12, &h, &cached, pages, 6), KVHAL_OK);
    assert_int_equal(cached, 8);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pages + 4), KVHAL_OK);
    ok(cm);
    int free_before = kvhal_cache_manager_num_free(cm);

    /* a request may not free pages it got from match */
    assert_int_equal(kvhal_cache_manager_free(cm, pages, 1), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "prefix cache"));
    /* nor a page twice, nor a free page, nor one out of range */
    int32_t twice[2] = {pages[4], pages[4]};
    assert_int_equal(kvhal_cache_manager_free(cm, twice, 2), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "twice"));
    int32_t nofree[1] = {15};
    assert_int_equal(kvhal_cache_manager_free(cm, nofree, 1), KVHAL_INVALID_ARGUMENT);
    int32_t far[1] = {16};
    assert_int_equal(kvhal_cache_manager_free(cm, far, 1), KVHAL_OUT_OF_RANGE);
    assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
    ok(cm);

    /* cache_finished with a matched page swapped for another */
    int32_t wrong[6];
    memcpy(wrong, pages, sizeof wrong);
    wrong[1] = pages[4];
    wrong[4] = pages[1];
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, u, 12, wrong, h), KVHAL_INVALID_ARGUMENT);
    ok(cm);
    /* tokens that do not extend the handle's prefix */
    int32_t v[12];
    seq(v, 12, 1);
    v[3] = 77;
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, v, 12, pages, h), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, u, 6, pages, h), KVHAL_INVALID_ARGUMENT);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
    assert_int_equal(info(cm).protected_tokens, 8); /* still locked */

    assert_int_equal(kvhal_cache_manager_cache_finished(cm, u, 12, pages, h), KVHAL_OK);
    ok(cm);
    assert_int_equal(info(cm).total_tokens, 12);
    assert_int_equal(info(cm).protected_tokens, 0);
    /* finished twice: the request handle was consumed */
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, u, 12, pages, h), KVHAL_INVALID_HANDLE);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_allocate(cm, -1, pages), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 1, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_allocate(NULL, 1, pages), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_cache_manager_check_integrity(NULL), KVHAL_INVALID_HANDLE);
    assert_null(kvhal_cache_manager_prefix(NULL));
    assert_int_equal(kvhal_cache_manager_available(NULL), 0);
    kvhal_cache_manager *bad = (kvhal_cache_manager *)0x1;
    assert_int_equal(kvhal_cache_manager_create(0, 1, KVHAL_PREFIX_RADIX, &bad), KVHAL_INVALID_ARGUMENT);
    assert_null(bad);
    assert_int_equal(kvhal_cache_manager_create(4, 1, (kvhal_prefix_kind)9, &bad), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Evicting behind the manager's back (through its prefix cache) is caught by check_integrity. */
static void test_integrity_detects_lost_pages(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(8, 1, KVHAL_PREFIX_RADIX);
    int32_t t[4];
    seq(t, 4, 1);
    run_request(cm, t, 4);
    size_t ev;
    assert_int_equal(kvhal_prefix_evict(kvhal_cache_manager_prefix(cm), 4, NULL, NULL, &ev), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_check_integrity(cm), KVHAL_INTEGRITY);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

static void test_naive(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(8, 2, KVHAL_PREFIX_NAIVE);
    int32_t t[7];
    seq(t, 7, 1);
    assert_int_equal(run_request(cm, t, 7), 0);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 8); /* everything went back */
    assert_int_equal(run_request(cm, t, 7), 0);             /* never matches */
    int32_t pages[8];
    assert_int_equal(kvhal_cache_manager_allocate(cm, 8, pages), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 1, pages), KVHAL_OUT_OF_MEMORY);
    size_t ev = 9;
    assert_int_equal(kvhal_cache_manager_evict(cm, 4, &ev), KVHAL_OK);
    assert_int_equal(ev, 0);
    assert_int_equal(kvhal_cache_manager_free(cm, pages, 8), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Every allocation failure inside create, allocate (with eviction) and cache_finished leaves no trace. */
static void test_fault_injection(void **state)
{
    (void)state;
    for (int64_t k = 1; k <= 8; k++) {
        kvhal_cache_manager *cm = NULL;
        kvhal_fault_inject_alloc(k);
        kvhal_status st = kvhal_cache_manager_create(8, 1, KVHAL_PREFIX_RADIX, &cm);
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) {
            assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
            break;
        }
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_null(cm);
    }
    for (int64_t k = 1;; k++) {
        assert_true(k < 50);
        kvhal_cache_manager *cm = make(64, 2, KVHAL_PREFIX_RADIX);
        int32_t t[40];
        seq(t, 40, 1);
        run_request(cm, t, 40);
        t[31] = -9;
        kvhal_prefix_handle h;
        size_t cached;
        int32_t pages[20];
        assert_int_equal(kvhal_cache_manager_match(cm, t, 40, &h, &cached, pages, 20), KVHAL_OK);
        assert_int_equal(cached, 30);
        assert_int_equal(kvhal_cache_manager_allocate(cm, 5, pages + 15), KVHAL_OK);
        int free_before = kvhal_cache_manager_num_free(cm);
        kvhal_prefix_size_info before = info(cm);
        kvhal_fault_inject_alloc(k);
        kvhal_status st = kvhal_cache_manager_cache_finished(cm, t, 40, pages, h);
        kvhal_fault_inject_alloc(0);
        ok(cm);
        if (st == KVHAL_OK) {
            assert_int_equal(info(cm).total_tokens, before.total_tokens + 10);
            assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
            break;
        }
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
        assert_int_equal(info(cm).total_tokens, before.total_tokens);
        assert_int_equal(info(cm).protected_tokens, before.protected_tokens);
        assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 40, pages, h), KVHAL_OK);
        ok(cm);
        assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* randomized serving simulation                                                                              */
/* ---------------------------------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define SIM_MAXLEN 160
#define SIM_SLOTS 6

typedef struct sim_req {
    bool active;
    int32_t tok[SIM_MAXLEN];
    uint64_t hash[SIM_MAXLEN]; /* hash[i] = hash of tok[0..i] */
    size_t len, target;        /* tokens so far, tokens at finish */
    int32_t pages[SIM_MAXLEN];
    kvhal_prefix_handle h;
    size_t matched;
} sim_req;

static uint64_t hash_step(uint64_t h, int32_t t)
{
    h ^= (uint32_t)t + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdULL;
}

static void sim_write(uint64_t *shadow, int32_t ps, const sim_req *r, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        shadow[(size_t)r->pages[i / (size_t)ps] * (size_t)ps + i % (size_t)ps] = r->hash[i];
}

static void run_sim(int32_t ps, int32_t total, uint64_t seed, int steps)
{
    kvhal_cache_manager *cm = make(total, ps, KVHAL_PREFIX_RADIX);
    uint64_t *shadow = calloc((size_t)total * (size_t)ps, sizeof(uint64_t));
    sim_req *req = calloc(SIM_SLOTS, sizeof(sim_req));
    assert_non_null(shadow);
    assert_non_null(req);
    uint64_t rng = seed;
    int32_t sys[4][SIM_MAXLEN];
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < SIM_MAXLEN; i++) sys[s][i] = (int32_t)(rng_next(&rng) % 50);
    size_t hits = 0, finished = 0, dropped = 0, verified = 0;
    for (int step = 0; step < steps; step++) {
        sim_req *r = &req[rng_next(&rng) % SIM_SLOTS];
        if (!r->active) {
            /* admit: a system prompt of one of 4 groups, a random question, a target output length */
            int g = (int)(rng_next(&rng) % 4);
            size_t sys_len = 8 + (size_t)(rng_next(&rng) % 64);
            size_t q_len = (size_t)(rng_next(&rng) % 24);
            memcpy(r->tok, sys[g], sys_len * sizeof(int32_t));
            for (size_t i = 0; i < q_len; i++) r->tok[sys_len + i] = (int32_t)(rng_next(&rng) % 50);
            r->len = sys_len + q_len;
            r->target = r->len + (size_t)(rng_next(&rng) % 40);
            for (size_t i = 0; i < r->target; i++) {
                if (i >= r->len) r->tok[i] = (int32_t)(rng_next(&rng) % 50);
                r->hash[i] = hash_step(i ? r->hash[i - 1] : 0, r->tok[i]);
            }
            size_t cached = 0;
            assert_int_equal(kvhal_cache_manager_match(cm, r->tok, r->len, &r->h, &cached, r->pages, SIM_MAXLEN),
                             KVHAL_OK);
            for (size_t i = 0; i < cached; i++) {
                uint64_t got = shadow[(size_t)r->pages[i / (size_t)ps] * (size_t)ps + i % (size_t)ps];
                assert_true(got == r->hash[i]); /* the cached page holds exactly this prefix */
                verified++;
            }
            hits += cached > 0;
            r->matched = cached;
            size_t have = cached / (size_t)ps, need = (r->len + (size_t)ps - 1) / (size_t)ps;
            kvhal_status st = kvhal_cache_manager_allocate(cm, (int32_t)(need - have), r->pages + have);
            if (st != KVHAL_OK) {
                assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
                if (r->h) assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), r->h), KVHAL_OK);
                dropped++;
            } else {
                sim_write(shadow, ps, r, cached, r->len);
                r->active = true;
            }
        } else if (r->len < r->target) {
            /* decode one token: a new page at each page boundary */
            if (r->len % (size_t)ps == 0) {
                kvhal_status st = kvhal_cache_manager_allocate(cm, 1, r->pages + r->len / (size_t)ps);
                if (st != KVHAL_OK) {
                    /* preempted: give back its own pages, drop the lock */
                    assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
                    size_t own = r->matched / (size_t)ps, np = (r->len + (size_t)ps - 1) / (size_t)ps;
                    assert_int_equal(kvhal_cache_manager_free(cm, r->pages + own, (int32_t)(np - own)), KVHAL_OK);
                    if (r->h) assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), r->h), KVHAL_OK);
                    r->active = false;
                    dropped++;
                    goto check;
                }
            }
            sim_write(shadow, ps, r, r->len, r->len + 1);
            r->len++;
        } else {
            /* both ways of finishing: the whole request, or what follows its match */
            const size_t own = r->matched / (size_t)ps;
            if (rng_next(&rng) & 1)
                assert_int_equal(kvhal_cache_manager_cache_finished(cm, r->tok, r->len, r->pages, r->h), KVHAL_OK);
            else
                assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, r->h, r->tok + r->matched,
                                                                           r->len - r->matched, r->pages + own),
                                 KVHAL_OK);
            r->active = false;
            finished++;
        }
    check:
        if (step % 4 == 0 || ps > 1) ok(cm);
    }
    for (int s = 0; s < SIM_SLOTS; s++)
        if (req[s].active)
            assert_int_equal(kvhal_cache_manager_cache_finished(cm, req[s].tok, req[s].len, req[s].pages, req[s].h),
                             KVHAL_OK);
    ok(cm);
    assert_int_equal(info(cm).protected_tokens, 0);
    assert_int_equal(kvhal_cache_manager_available(cm), total);
    /* the run must have exercised what it is meant to */
    assert_true(hits > 50);
    assert_true(finished > 50);
    assert_true(verified > 1000);
    assert_true(kvhal_cache_manager_pages_evicted(cm) > 0);
    print_message("page size %d: %zu finished, %zu dropped for lack of pages, %zu prefix hits, %zu tokens verified\n",
                  (int)ps, finished, dropped, hits, verified);
    free(shadow);
    free(req);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

static void test_simulation(void **state)
{
    (void)state;
    run_sim(1, 400, 11, 20000);
    run_sim(4, 100, 12, 20000);
    run_sim(16, 30, 13, 20000);
}

static void expect_run(const int32_t *pages, size_t n, int32_t first)
{
    for (size_t i = 0; i < n; i++) assert_int_equal(pages[i], first + (int32_t)i);
}

/* The free set hands out the lowest free pages, whole runs when the pages are free in a row, and freed
 * neighbours merge again (also across the 64-page words of the bitmap and the odd tail past the last full one). */
static void test_free_runs(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(200, 1, KVHAL_PREFIX_RADIX);
    int32_t *all = malloc(200 * sizeof *all);
    assert_non_null(all);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 10, all), KVHAL_OK);
    expect_run(all, 10, 0);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 100, all + 10), KVHAL_OK);
    expect_run(all + 10, 100, 10);
    ok(cm);
    /* two holes; the next allocation fills the lower one first, then splits the upper one */
    assert_int_equal(kvhal_cache_manager_free(cm, all + 60, 10), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(cm, all + 20, 10), KVHAL_OK);
    ok(cm);
    int32_t got[15];
    assert_int_equal(kvhal_cache_manager_allocate(cm, 15, got), KVHAL_OK);
    expect_run(got, 10, 20);
    expect_run(got + 10, 5, 60);
    ok(cm);
    /* the rest of the upper hole, then the untouched tail */
    assert_int_equal(kvhal_cache_manager_allocate(cm, 8, got), KVHAL_OK);
    expect_run(got, 5, 65);
    expect_run(got + 5, 3, 110);
    ok(cm);
    /* everything back, in a scattered order: one run of all 200 again */
    int32_t n = 200 - kvhal_cache_manager_num_free(cm);
    int32_t held[200], k = 0;
    for (int32_t p = 199; p >= 0; p--)
        if (p < 113) held[k++] = p;
    assert_int_equal(k, n);
    for (int32_t i = 0; i < k; i += 2) assert_int_equal(kvhal_cache_manager_free(cm, held + i, 1), KVHAL_OK);
    for (int32_t i = 1; i < k; i += 2) assert_int_equal(kvhal_cache_manager_free(cm, held + i, 1), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 200);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 200, all), KVHAL_OK);
    expect_run(all, 200, 0);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 1, got), KVHAL_OUT_OF_MEMORY);
    assert_int_equal(kvhal_cache_manager_free(cm, all, 200), KVHAL_OK);
    ok(cm);
    free(all);
    kvhal_cache_manager_destroy(cm);
}

/* Pages that eviction hands back in LRU order of leaves merge with their neighbours: after the whole tree is
 * evicted, the cache is one run again; and the leaves go in LRU order (the oldest request's pages first). */
static void test_evicted_pages_merge(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(96, 1, KVHAL_PREFIX_RADIX);
    int32_t t[3][24];
    for (int r = 0; r < 3; r++) seq(t[r], 24, 1000 * (r + 1));
    for (int r = 0; r < 3; r++) run_request(cm, t[r], 24);
    run_request(cm, t[0], 24); /* request 0 is now the newest: request 1's pages (24..47) go first */
    assert_int_equal(kvhal_cache_manager_num_free(cm), 24);
    int32_t got[96];
    assert_int_equal(kvhal_cache_manager_allocate(cm, 48, got), KVHAL_OK);
    expect_run(got, 24, 24); /* request 1's leaf, evicted, taken back as the lowest free run */
    expect_run(got + 24, 24, 72);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_free(cm, got, 48), KVHAL_OK);
    size_t ev = 0;
    assert_int_equal(kvhal_cache_manager_evict(cm, SIZE_MAX, &ev), KVHAL_OK);
    assert_int_equal(ev, 48);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 96, got), KVHAL_OK);
    expect_run(got, 96, 0);
    assert_int_equal(kvhal_cache_manager_free(cm, got, 96), KVHAL_OK);
    ok(cm);
    kvhal_cache_manager_destroy(cm);
}

/* A page listed twice next to itself or a few places later, a tree page after several good ones, or a page
 * listed twice at the end is refused, and every owner mark made before it is undone. */
static void test_finish_bad_page_in_group(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(64, 1, KVHAL_PREFIX_RADIX);
    int32_t t[20], cached_t[4];
    seq(t, 20, 1);
    seq(cached_t, 4, 500);
    run_request(cm, cached_t, 4); /* pages 0..3 now belong to the tree */
    for (int variant = 0; variant < 4; variant++) {
        int32_t pages[20];
        kvhal_prefix_handle h;
        size_t cached;
        assert_int_equal(kvhal_cache_manager_match(cm, t, 20, &h, &cached, pages, 20), KVHAL_OK);
        assert_int_equal(cached, 0);
        assert_int_equal(kvhal_cache_manager_allocate(cm, 20, pages), KVHAL_OK);
        int32_t bad[20];
        memcpy(bad, pages, sizeof bad);
        switch (variant) {
        case 0: bad[9] = bad[8]; break;    /* twice, next to each other in the third group */
        case 1: bad[11] = bad[8]; break;   /* twice, at the ends of one group */
        case 2: bad[13] = 2; break;        /* a tree page after three good groups */
        default: bad[18] = bad[1]; break;  /* twice, in the scalar tail */
        }
        int32_t free_before = kvhal_cache_manager_num_free(cm);
        assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 20, bad, h), KVHAL_INVALID_ARGUMENT);
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
        assert_int_equal(info(cm).total_tokens, 4);
        /* every page is still the request's: freeing them all works */
        assert_int_equal(kvhal_cache_manager_free(cm, pages, 20), KVHAL_OK);
        ok(cm);
    }
    kvhal_cache_manager_destroy(cm);
}

/* A request's pages that are one run of consecutive ids take a range check: a run holding a page the request gave
 * back (free) or one the tree owns is refused just the same, and nothing changes. */
static void test_finish_bad_page_in_run(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(64, 1, KVHAL_PREFIX_RADIX);
    int32_t t[12];
    seq(t, 12, 1);
    for (int variant = 0; variant < 2; variant++) {
        int32_t pages[12];
        kvhal_prefix_handle h;
        size_t cached;
        assert_int_equal(kvhal_cache_manager_match(cm, t, 12, &h, &cached, pages, 12), KVHAL_OK);
        assert_int_equal(cached, 0);
        assert_int_equal(kvhal_cache_manager_allocate(cm, 12, pages), KVHAL_OK);
        for (int i = 1; i < 12; i++) assert_int_equal(pages[i], pages[0] + i); /* a fresh manager hands out a run */
        int32_t freed = pages[7];
        if (variant == 0) {
            assert_int_equal(kvhal_cache_manager_free(cm, &freed, 1), KVHAL_OK); /* page 7 is free now */
        }
        int32_t free_before = kvhal_cache_manager_num_free(cm);
        if (variant == 0) {
            assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 12, pages, h), KVHAL_INVALID_ARGUMENT);
            assert_non_null(strstr(kvhal_last_error(), "pages[7]"));
            ok(cm);
            assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
            assert_int_equal(info(cm).total_tokens, 0);
            int32_t rest[11];
            memcpy(rest, pages, 7 * sizeof *rest);
            memcpy(rest + 7, pages + 8, 4 * sizeof *rest);
            assert_int_equal(kvhal_cache_manager_free(cm, rest, 11), KVHAL_OK);
        } else {
            /* the same run finished twice: the second time every page is the tree's */
            assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 12, pages, h), KVHAL_OK);
            assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 12, pages, h), KVHAL_INVALID_HANDLE);
            ok(cm);
            assert_int_equal(info(cm).total_tokens, 12);
        }
        ok(cm);
    }
    kvhal_cache_manager_destroy(cm);
}

/* A request whose pages are an arithmetic progression of the ids (a decode step's pages interleave with the rest
 * of the batch's: p, p + b, p + 2b, ...), for steps within a bitmap word (2..64) and beyond it (65, 100): the
 * pages are checked and marked a word at a time, inserted, evicted back to free; the pages between them stay the
 * other requests' throughout. Then free() of the same shapes. */
static void test_strided_pages(void **state)
{
    (void)state;
    static const int32_t steps[] = {2, 3, 7, 8, 63, 64, 65, 100};
    enum { TOTAL = 3000, N = 24 };
    for (size_t si = 0; si < sizeof steps / sizeof steps[0]; si++) {
        const int32_t d = steps[si];
        kvhal_cache_manager *cm = make(TOTAL, 1, KVHAL_PREFIX_RADIX);
        int32_t *all = malloc(TOTAL * sizeof *all);
        assert_non_null(all);
        const int32_t used = d * N + 5;
        bool *cached_page = calloc(TOTAL, sizeof *cached_page);
        assert_non_null(cached_page);
        assert_int_equal(kvhal_cache_manager_allocate(cm, used, all), KVHAL_OK);
        expect_run(all, used, 0);
        for (int32_t off = 0; off < 2; off++) {
            /* request `off` holds pages off + 3, off + 3 + d, ...: progressions that start inside a word */
            int32_t t[N], pages[N];
            seq(t, N, 10000 * (off + 1));
            for (int32_t i = 0; i < N; i++) cached_page[pages[i] = off + 3 + i * d] = true;
            kvhal_prefix_handle h;
            size_t cached;
            int32_t dummy[N];
            assert_int_equal(kvhal_cache_manager_match(cm, t, N, &h, &cached, dummy, N), KVHAL_OK);
            assert_int_equal(cached, 0);
            assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, N, pages, h), KVHAL_OK);
            ok(cm);
            assert_int_equal(info(cm).total_tokens, (size_t)(off + 1) * N);
            /* a hit hands the same pages back */
            assert_int_equal(kvhal_cache_manager_match(cm, t, N, &h, &cached, dummy, N), KVHAL_OK);
            assert_int_equal(cached, N);
            assert_memory_equal(dummy, pages, sizeof pages);
            assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h), KVHAL_OK);
        }
        /* the tree's pages go back to free; the rest are still held */
        size_t ev = 0;
        assert_int_equal(kvhal_cache_manager_evict(cm, SIZE_MAX, &ev), KVHAL_OK);
        assert_int_equal(ev, 2 * N);
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), TOTAL - used + 2 * N);
        /* free the held rest in two strided passes: every d-th from page 1, then what is left */
        int32_t k = 0, *rest = malloc(TOTAL * sizeof *rest);
        assert_non_null(rest);
        for (int32_t p = 1; p < used; p += d)
            if (!cached_page[p]) {
                rest[k++] = p;
                cached_page[p] = true; /* gone now too */
            }
        assert_int_equal(kvhal_cache_manager_free(cm, rest, k), KVHAL_OK);
        ok(cm);
        int32_t k2 = 0;
        for (int32_t p = 0; p < used; p++)
            if (!cached_page[p]) rest[k2++] = p;
        assert_int_equal(kvhal_cache_manager_free(cm, rest, k2), KVHAL_OK);
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), TOTAL);
        assert_int_equal(kvhal_cache_manager_allocate(cm, TOTAL, all), KVHAL_OK);
        expect_run(all, TOTAL, 0);
        free(cached_page);
        free(rest);
        free(all);
        kvhal_cache_manager_destroy(cm);
    }
}

/* Bad pages inside and between progressions: nothing changes, the message names the first bad entry. */
static void test_strided_bad_pages(void **state)
{
    (void)state;
    enum { TOTAL = 200 };
    kvhal_cache_manager *cm = make(TOTAL, 1, KVHAL_PREFIX_RADIX);
    int32_t tree_t[4];
    seq(tree_t, 4, 900);
    run_request(cm, tree_t, 4); /* pages 0..3 are the tree's */
    int32_t held[TOTAL];
    const int32_t nheld = TOTAL - 4;
    assert_int_equal(kvhal_cache_manager_allocate(cm, nheld, held), KVHAL_OK); /* 4..199 */
    kvhal_cache_manager_free(cm, &held[100], 1);                                  /* page 104 free again */
    static const struct {
        int32_t n;
        int32_t pages[8];
        kvhal_status st;
        int bad;
        const char *why;
    } cases[] = {
        {6, {10, 12, 14, 16, 18, 14}, KVHAL_INVALID_ARGUMENT, 5, "listed twice"},  /* after its progression */
        {7, {10, 12, 14, 11, 13, 15, 12}, KVHAL_INVALID_ARGUMENT, 6, "listed twice"}, /* across progressions */
        {5, {96, 100, 104, 108, 112}, KVHAL_INVALID_ARGUMENT, 2, "free"},              /* inside a stride of 4 */
        {5, {9, 6, 3, 0, 20}, KVHAL_INVALID_ARGUMENT, 2, "prefix cache"},            /* a tree page */
        {4, {193, 195, 197, 199 + 2}, KVHAL_OUT_OF_RANGE, 3, "out of range"},         /* runs past the end */
        {3, {-3, -1, 1}, KVHAL_OUT_OF_RANGE, 0, "out of range"},                       /* negative */
        {4, {130, 194, 258, 322}, KVHAL_OUT_OF_RANGE, 2, "out of range"},             /* a step of 64 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t t[8];
        seq(t, 8, 3000 + 10 * (int32_t)c);
        int32_t free_before = kvhal_cache_manager_num_free(cm);
        kvhal_status st = kvhal_cache_manager_cache_finished(cm, t, (size_t)cases[c].n, cases[c].pages, nomatch(cm));
        assert_int_equal(st, cases[c].st);
        char want[32];
        snprintf(want, sizeof want, "pages[%d]", cases[c].bad);
        if (!strstr(kvhal_last_error(), want) || !strstr(kvhal_last_error(), cases[c].why))
            fail_msg("case %zu: %s", c, kvhal_last_error());
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
        assert_int_equal(info(cm).total_tokens, 4);
        /* free() refuses the same lists the same way */
        assert_int_equal(kvhal_cache_manager_free(cm, cases[c].pages, cases[c].n), cases[c].st);
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
    }
    /* a run over three bitmap words (10..130) whose second word holds the free page 104: the first word's marks
     * are undone, and the message names that entry */
    {
        int32_t run[121], t[121];
        for (int32_t i = 0; i < 121; i++) run[i] = 10 + i;
        seq(t, 121, 5000);
        int32_t free_before = kvhal_cache_manager_num_free(cm);
        assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 121, run, nomatch(cm)), KVHAL_INVALID_ARGUMENT);
        if (!strstr(kvhal_last_error(), "pages[94]") || !strstr(kvhal_last_error(), "free"))
            fail_msg("%s", kvhal_last_error());
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
        assert_int_equal(info(cm).total_tokens, 4);
        /* a stride-3 progression from 105 that runs past the last page (201 at entry 32): its in-range part spans
         * three words and is marked, then undone when the next entry is out of range */
        int32_t prog[40];
        for (int32_t i = 0; i < 40; i++) prog[i] = 105 + 3 * i;
        assert_int_equal(kvhal_cache_manager_free(cm, prog, 40), KVHAL_OUT_OF_RANGE);
        assert_non_null(strstr(kvhal_last_error(), "pages[32]"));
        ok(cm);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
    }
    /* every held page is still the requests': all go back */
    int32_t k = 0, rest[TOTAL];
    for (int32_t i = 0; i < nheld; i++)
        if (i != 100) rest[k++] = held[i];
    assert_int_equal(kvhal_cache_manager_free(cm, rest, k), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), TOTAL - 4);
    kvhal_cache_manager_destroy(cm);
}

/* Random page lists made of progressions (steps 1..70 from anywhere in a word, lengths 1..40, lone pages between)
 * freed against a plain model of which pages are held: after every free the free set is exactly the model's, as
 * the lowest-first allocation shows page by page. */
static void test_progressions_random(void **state)
{
    (void)state;
    enum { TOTAL = 4096 };
    kvhal_cache_manager *cm = make(TOTAL, 1, KVHAL_PREFIX_RADIX);
    int32_t *list = malloc(TOTAL * sizeof *list), *got = malloc(TOTAL * sizeof *got);
    bool *held = malloc(TOTAL * sizeof *held), *in_list = calloc(TOTAL, sizeof *in_list);
    assert_non_null(list);
    assert_non_null(got);
    assert_non_null(held);
    assert_non_null(in_list);
    assert_int_equal(kvhal_cache_manager_allocate(cm, TOTAL, got), KVHAL_OK);
    for (int32_t p = 0; p < TOTAL; p++) held[p] = true;
    uint64_t rng = 77;
    for (int round = 0; round < 300; round++) {
        int32_t n = 0;
        for (int part = 0; part < 4; part++) {
            int32_t p = (int32_t)(rng_next(&rng) % TOTAL), d = 1 + (int32_t)(rng_next(&rng) % 70);
            int32_t len = 1 + (int32_t)(rng_next(&rng) % 40);
            for (int32_t k = 0; k < len && p < TOTAL; k++, p += d)
                if (held[p] && !in_list[p]) in_list[list[n++] = p] = true;
        }
        if (n == 0) continue;
        assert_int_equal(kvhal_cache_manager_free(cm, list, n), KVHAL_OK);
        for (int32_t i = 0; i < n; i++) held[list[i]] = in_list[list[i]] = false;
        ok(cm);
        if (round % 10 == 9) {
            /* take all free pages back: they come lowest first, and must be exactly the model's free ones */
            int32_t nfree = kvhal_cache_manager_num_free(cm), k = 0;
            assert_int_equal(kvhal_cache_manager_allocate(cm, nfree, got), KVHAL_OK);
            for (int32_t p = 0; p < TOTAL; p++)
                if (!held[p]) {
                    assert_int_equal(got[k++], p);
                    held[p] = true;
                }
            assert_int_equal(k, nfree);
            ok(cm);
        }
    }
    free(list);
    free(got);
    free(held);
    free(in_list);
    kvhal_cache_manager_destroy(cm);
}

/* cache_finished_suffix: the tokens and pages after the match, inserted below the handle; the same outcome as
 * cache_finished (cached tokens, freed tail and duplicate pages, unlock), and the same refusals of pages a request
 * does not hold, a handle finished twice, a naive cache's handle. */
static void test_finish_suffix(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(32, 4, KVHAL_PREFIX_RADIX);
    cache_a(cm);
    /* B: 3 pages matched, one new full page cached, the tail page freed */
    int32_t b[18], pages[8];
    kvhal_prefix_handle h = match_b(cm, b, pages);
    size_t cached;
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pages + 3), KVHAL_OK);
    int32_t free_before = kvhal_cache_manager_num_free(cm);
    /* a page of the match passed as one of the request's own: refused, nothing changed */
    int32_t wrong[2] = {pages[4], pages[0]};
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, b + 12, 6, wrong), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "pages[1]"));
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
    assert_int_equal(info(cm).protected_tokens, 12);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, NULL, 6, pages + 3), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, b + 12, 6, pages + 3), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), free_before + 1); /* the tail page */
    assert_int_equal(info(cm).total_tokens, 24);
    assert_int_equal(info(cm).protected_tokens, 0);
    /* finished twice: the request handle was consumed */
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, b + 12, 6, pages + 3), KVHAL_INVALID_HANDLE);
    ok(cm);
    /* the whole of B is found again, with its pages */
    int32_t again[8];
    assert_int_equal(kvhal_cache_manager_match(cm, b, 18, &h, &cached, again, 8), KVHAL_OK);
    assert_int_equal(cached, 16);
    assert_memory_equal(again, pages, 4 * sizeof *pages);
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h), KVHAL_OK);

    /* two requests behind the same match finish with the same continuation: the second one's pages are duplicates
     * and go back; meanwhile a third request's match split the handle's edge (the handle stays valid) */
    int32_t c[16];
    seq(c, 16, 1);
    c[8] = 500;
    kvhal_prefix_handle h1, h2, h3;
    size_t c1, c2, c3;
    int32_t p1[4], p2[4], p3[4];
    assert_int_equal(kvhal_cache_manager_match(cm, c, 16, &h1, &c1, p1, 4), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_match(cm, c, 16, &h2, &c2, p2, 4), KVHAL_OK);
    assert_int_equal(c1, 8);
    assert_int_equal(c2, 8);
    int32_t d[8];
    seq(d, 8, 1);
    d[4] = 600; /* diverges inside the first page-aligned edge: splits it at 4 */
    assert_int_equal(kvhal_cache_manager_match(cm, d, 8, &h3, &c3, p3, 4), KVHAL_OK);
    assert_int_equal(c3, 4);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, p1 + 2), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, p2 + 2), KVHAL_OK);
    free_before = kvhal_cache_manager_num_free(cm);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h1, c + 8, 8, p1 + 2), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h2, c + 8, 8, p2 + 2), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), free_before + 2);
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h3), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_match(cm, c, 16, &h, &cached, again, 8), KVHAL_OK);
    assert_int_equal(cached, 16);
    assert_memory_equal(again, p1, sizeof p1); /* the first finisher's pages */
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h), KVHAL_OK);
    /* finished twice with nothing of its own (an empty suffix, or the whole request no longer than its match): the
     * second is refused even while a longer handle's lock runs through the same node */
    kvhal_prefix_handle h_short, h_long;
    assert_int_equal(kvhal_cache_manager_match(cm, c, 8, &h_short, &c1, p1, 4), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_match(cm, c, 16, &h_long, &c2, p2, 4), KVHAL_OK);
    assert_int_equal(c1, 8);
    assert_int_equal(c2, 16);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h_short, NULL, 0, NULL), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h_short, NULL, 0, NULL), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, c, 8, p1, h_short), KVHAL_INVALID_HANDLE);
    ok(cm);
    assert_int_equal(info(cm).protected_tokens, 16);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, c, 16, p2, h_long), KVHAL_OK);
    ok(cm);
    assert_int_equal(info(cm).protected_tokens, 0);
    /* a request that matched nothing: the suffix is the whole request */
    int32_t e[4], pe[1];
    seq(e, 4, 700);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 1, pe), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, nomatch(cm), e, 4, pe), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_match(cm, e, 4, &h, &cached, again, 8), KVHAL_OK);
    assert_int_equal(cached, 4);
    assert_int_equal(again[0], pe[0]);
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);

    /* naive: keeps nothing, every page goes back; a handle other than a request handle is refused */
    cm = make(8, 2, KVHAL_PREFIX_NAIVE);
    int32_t pn[2];
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pn), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, (kvhal_prefix_handle)(uintptr_t)pn, e, 4, pn),
                     KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, nomatch(cm), e, 4, pn), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 8);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* match_view and allocate_view hand out the same ids as match and allocate, from the manager's own storage (the
 * same pointer call after call), valid until the next call of the same kind; their bad arguments are refused. */
static void test_views(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(16, 4, KVHAL_PREFIX_RADIX);
    cache_a(cm);
    int32_t b[18], copied[8];
    kvhal_prefix_handle hc = match_b(cm, b, copied); /* the copy, for comparison */
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), hc), KVHAL_OK);
    kvhal_prefix_handle h;
    size_t cached = 0, np = 0;
    const int32_t *view = NULL;
    assert_int_equal(kvhal_cache_manager_match_view(cm, b, 18, &h, &cached, &view, &np), KVHAL_OK);
    assert_int_equal(cached, 12);
    assert_int_equal(np, 3);
    assert_non_null(view);
    assert_memory_equal(view, copied, 3 * sizeof(int32_t));
    const int32_t *own = NULL;
    assert_int_equal(kvhal_cache_manager_allocate_view(cm, 2, &own), KVHAL_OK);
    assert_memory_equal(view, copied, 3 * sizeof(int32_t)); /* allocate_view leaves match_view's ids */
    int32_t pages[5] = {view[0], view[1], view[2], own[0], own[1]};
    for (int i = 3; i < 5; i++)
        for (int j = 0; j < i; j++) assert_int_not_equal(pages[i], pages[j]);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, b, 18, pages, h), KVHAL_OK);
    ok(cm);
    const int32_t *again = NULL;
    assert_int_equal(kvhal_cache_manager_match_view(cm, b, 18, &h, &cached, &again, &np), KVHAL_OK);
    assert_int_equal(np, 4);
    assert_memory_equal(again, pages, 4 * sizeof(int32_t));
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_match_view(cm, b, 18, &h, &cached, NULL, &np), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_match_view(cm, b, 18, &h, &cached, &again, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_allocate_view(cm, 2, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_allocate_view(cm, 17, &own), KVHAL_OUT_OF_MEMORY);
    assert_int_equal(kvhal_cache_manager_allocate_view(cm, -1, &own), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_cache_manager_match_view(NULL, b, 18, &h, &cached, &again, &np), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_cache_manager_allocate_view(NULL, 1, &own), KVHAL_INVALID_HANDLE);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

static uint64_t view_rng = 0x9e3779b97f4a7c15ull;
static uint32_t view_rand(uint32_t n)
{
    view_rng ^= view_rng << 13;
    view_rng ^= view_rng >> 7;
    view_rng ^= view_rng << 17;
    return (uint32_t)(view_rng % n);
}

/* One request with the copying calls on both twins (same results), or unlocked again when its pages do not fit. */
static void twin_request(kvhal_cache_manager *cm, kvhal_cache_manager *ref, const int32_t *toks, size_t n, int32_t ps)
{
    int32_t pages[2][64];
    kvhal_cache_manager *m[2] = {cm, ref};
    kvhal_prefix_handle h[2];
    size_t cached[2];
    kvhal_status st[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(kvhal_cache_manager_match(m[k], toks, n, &h[k], &cached[k], pages[k], 64), KVHAL_OK);
        const size_t np = cached[k] / (size_t)ps;
        st[k] = kvhal_cache_manager_allocate(m[k], (int32_t)((n + (size_t)ps - 1) / (size_t)ps - np), pages[k] + np);
        if (st[k] == KVHAL_OK)
            assert_int_equal(kvhal_cache_manager_cache_finished(m[k], toks, n, pages[k], h[k]), KVHAL_OK);
        else
            assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(m[k]), h[k]), KVHAL_OK);
    }
    assert_int_equal(cached[0], cached[1]);
    assert_int_equal(st[0], st[1]);
    assert_memory_equal(pages[0], pages[1], (n + (size_t)ps - 1) / (size_t)ps * sizeof(int32_t));
}

/* match_view against match on a twin manager given the same requests: the same ids every time, whether the match
 * lies within one node (the view is the tree's own storage) or runs through several (a copy), and a view stays
 * unchanged through every other call (allocation that evicts, finishes that split and compact its node, evictions
 * that free it) until the next match_view. The prompts are prefixes of a few base sequences cut at random lengths
 * plus short random tails, so that nodes split at every position, have many children and are evicted after
 * splits; under valgrind a view read from memory the cache gave back would be reported. */
static void views_random(int32_t ps, int32_t total, int steps)
{
    enum { FAMILIES = 3, BASE = 40, MAXT = 64 };
    kvhal_cache_manager *cm = make(total, ps, KVHAL_PREFIX_RADIX), *ref = make(total, ps, KVHAL_PREFIX_RADIX);
    int32_t base[FAMILIES][BASE];
    for (int f = 0; f < FAMILIES; f++)
        for (int i = 0; i < BASE; i++) base[f][i] = 1000 * (f + 1) + (int32_t)view_rand(4);
    int32_t toks[MAXT], seen[MAXT], ref_pages[MAXT];
    const int32_t *view = NULL, *copies = NULL; /* copies: where a view through several nodes is copied */
    size_t view_n = 0, in_tree = 0;
    for (int step = 0; step < steps; step++) {
        const int f = (int)view_rand(FAMILIES);
        const size_t cut = view_rand(BASE + 1), tail = view_rand(MAXT - BASE + 1);
        size_t n = cut + tail;
        memcpy(toks, base[f], cut * sizeof(int32_t));
        for (size_t i = cut; i < n; i++) toks[i] = (int32_t)view_rand(3);
        const size_t prompt = n ? view_rand((uint32_t)n + 1) : 0; /* the part the match is given */
        kvhal_prefix_handle h = 0, rh = 0;
        size_t cached = 0, rcached = 0, np = 0;
        assert_int_equal(kvhal_cache_manager_match_view(cm, toks, prompt, &h, &cached, &view, &np), KVHAL_OK);
        assert_int_equal(kvhal_cache_manager_match(ref, toks, prompt, &rh, &rcached, ref_pages, MAXT), KVHAL_OK);
        assert_int_equal(cached, rcached);
        assert_int_equal(np, cached / (size_t)ps);
        if (np) assert_memory_equal(view, ref_pages, np * sizeof(int32_t));
        if (!np) copies = view; /* nothing matched: the manager's own array */
        else if (copies && view != copies) in_tree++;
        view_n = np;
        memcpy(seen, view, view_n * sizeof(int32_t));
        const size_t need = (n + (size_t)ps - 1) / (size_t)ps - np;
        const int32_t *own = NULL;
        kvhal_status st = kvhal_cache_manager_allocate_view(cm, (int32_t)need, &own);
        assert_int_equal(kvhal_cache_manager_allocate(ref, (int32_t)need, ref_pages + np), st);
        if (view_n) assert_memory_equal(view, seen, view_n * sizeof(int32_t)); /* allocation may have evicted */
        if (st != KVHAL_OK) {
            assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h), KVHAL_OK);
            assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(ref), rh), KVHAL_OK);
        } else {
            if (need) assert_memory_equal(own, ref_pages + np, need * sizeof(int32_t));
            if (view_rand(2)) {
                assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, toks + cached, n - cached, own),
                                 KVHAL_OK);
            } else { /* the whole request: the view itself goes back in */
                int32_t all[MAXT];
                memcpy(all, view, np * sizeof(int32_t));
                memcpy(all + np, own, need * sizeof(int32_t));
                assert_int_equal(kvhal_cache_manager_cache_finished(cm, toks, n, all, h), KVHAL_OK);
            }
            assert_int_equal(kvhal_cache_manager_cache_finished(ref, toks, n, ref_pages, rh), KVHAL_OK);
        }
        if (view_n) assert_memory_equal(view, seen, view_n * sizeof(int32_t)); /* finishing may have split it */
        if (view_rand(4) == 0) {
            const size_t want = view_rand((uint32_t)(total * ps) + 1);
            size_t got = 0, rgot = 0;
            assert_int_equal(kvhal_cache_manager_evict(cm, want, &got), KVHAL_OK);
            assert_int_equal(kvhal_cache_manager_evict(ref, want, &rgot), KVHAL_OK);
            assert_int_equal(got, rgot);
            if (view_n) assert_memory_equal(view, seen, view_n * sizeof(int32_t)); /* its node may be gone */
        }
        /* another request: its new nodes take buffers the cache got back (the most recent first) */
        const size_t other = view_rand(MAXT - BASE + 1);
        int32_t more[MAXT];
        memcpy(more, base[view_rand(FAMILIES)], BASE * sizeof(int32_t));
        for (size_t i = 0; i < other; i++) more[BASE - other / 2 + i] = (int32_t)view_rand(3);
        twin_request(cm, ref, more, BASE + other / 2, ps);
        if (view_n) assert_memory_equal(view, seen, view_n * sizeof(int32_t));
        ok(cm);
        ok(ref);
        assert_int_equal(kvhal_cache_manager_num_free(cm), kvhal_cache_manager_num_free(ref));
    }
    assert_true(in_tree > 0); /* some views were the tree's own storage */
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_destroy(ref), KVHAL_OK);
}

static void test_views_random(void **state)
{
    (void)state;
    views_random(1, 96, 600);  /* token-granular: splits at every position */
    views_random(4, 24, 400);  /* page-aligned splits */
    views_random(1, 400, 300); /* room for most of it: long edges, many children */
}

/* admit against match + allocate (the three-call sequence) on a twin manager given the same random requests: the
 * same status, cached length and page ids (the matched ones then the new ones, in one list), the same state after a
 * refusal (the twin unlocks its match: admit has kept nothing), and both finish alike, admit's list going back whole
 * (cache_finished) or from the match on (cache_finished_suffix). Small managers, so that admissions evict and fail. */
static void admit_random(int32_t ps, int32_t total, int steps)
{
    enum { FAMILIES = 3, BASE = 40, MAXT = 64, EXTRA = 24 };
    kvhal_cache_manager *cm = make(total, ps, KVHAL_PREFIX_RADIX), *ref = make(total, ps, KVHAL_PREFIX_RADIX);
    int32_t base[FAMILIES][BASE];
    for (int f = 0; f < FAMILIES; f++)
        for (int i = 0; i < BASE; i++) base[f][i] = 1000 * (f + 1) + (int32_t)view_rand(4);
    int32_t toks[MAXT + EXTRA], ref_pages[MAXT + EXTRA];
    int refused = 0, finished = 0;
    for (int step = 0; step < steps; step++) {
        const int f = (int)view_rand(FAMILIES);
        const size_t cut = view_rand(BASE + 1), tail = view_rand(MAXT - BASE + 1), extra = view_rand(EXTRA + 1);
        const size_t n = cut + tail;
        memcpy(toks, base[f], cut * sizeof(int32_t));
        for (size_t i = cut; i < n + extra; i++) toks[i] = (int32_t)view_rand(3);
        kvhal_prefix_handle h = 0, rh = 0;
        size_t cached = 9999, rcached = 0, np = 0;
        const int32_t *row = NULL;
        const kvhal_status st = kvhal_cache_manager_admit(cm, toks, n, extra, &h, &cached, &row, &np);
        if (st != KVHAL_OK) assert_non_null(strstr(kvhal_last_error(), "extra_tokens"));
        assert_int_equal(kvhal_cache_manager_match(ref, toks, n, &rh, &rcached, ref_pages, MAXT + EXTRA), KVHAL_OK);
        const size_t all = (n + extra + (size_t)ps - 1) / (size_t)ps, have = rcached / (size_t)ps;
        const kvhal_status rst = kvhal_cache_manager_allocate(ref, (int32_t)(all - have), ref_pages + have);
        assert_int_equal(st, rst);
        if (st != KVHAL_OK) {
            assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
            assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(ref), rh), KVHAL_OK);
            refused++;
        } else {
            assert_int_equal(cached, rcached);
            assert_int_equal(np, all);
            assert_memory_equal(row, ref_pages, all * sizeof(int32_t));
            const size_t done = n + view_rand((uint32_t)extra + 1); /* the tokens the request ran to */
            if (view_rand(2))
                assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, toks + cached, done - cached,
                                                                           row + cached / (size_t)ps), KVHAL_OK);
            else
                assert_int_equal(kvhal_cache_manager_cache_finished(cm, toks, done, row, h), KVHAL_OK);
            assert_int_equal(kvhal_cache_manager_cache_finished(ref, toks, done, ref_pages, rh), KVHAL_OK);
            /* the pages allocated past the tokens it ran to are still the request's: freed alike */
            const size_t used = (done + (size_t)ps - 1) / (size_t)ps;
            assert_int_equal(kvhal_cache_manager_free(ref, ref_pages + used, (int32_t)(all - used)), KVHAL_OK);
            assert_int_equal(kvhal_cache_manager_free(cm, ref_pages + used, (int32_t)(all - used)), KVHAL_OK);
            finished++;
        }
        ok(cm);
        ok(ref);
        assert_int_equal(kvhal_cache_manager_num_free(cm), kvhal_cache_manager_num_free(ref));
        assert_int_equal(kvhal_cache_manager_available(cm), kvhal_cache_manager_available(ref));
        const kvhal_prefix_size_info a = info(cm), b = info(ref);
        assert_int_equal(a.protected_tokens, 0);
        assert_int_equal(a.evictable_tokens, b.evictable_tokens);
        assert_int_equal(a.num_nodes, b.num_nodes);
    }
    assert_true(refused > 0 && finished > 0);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_destroy(ref), KVHAL_OK);
}

/* Every allocation admit makes (its row's storage at the first call, the split of a partly matched edge, request
 * handles' room) failing in turn: KVHAL_OUT_OF_MEMORY with nothing kept, and the same admit succeeding after. */
static void test_admit_faults(void **state)
{
    (void)state;
    for (int64_t k = 1;; k++) {
        assert_true(k < 50);
        kvhal_cache_manager *cm = make(64, 2, KVHAL_PREFIX_RADIX);
        int32_t t[46]; /* a prompt of 40, then 6 generated */
        seq(t, 46, 1);
        run_request(cm, t, 40);
        t[31] = -9; /* the match ends inside the cached edge: a split */
        const int free_before = kvhal_cache_manager_num_free(cm);
        const kvhal_prefix_size_info before = info(cm);
        kvhal_prefix_handle h = 0;
        size_t cached = 0, np = 0;
        const int32_t *row = NULL;
        kvhal_fault_inject_alloc(k);
        const kvhal_status st = kvhal_cache_manager_admit(cm, t, 40, 6, &h, &cached, &row, &np);
        kvhal_fault_inject_alloc(0);
        ok(cm);
        if (st == KVHAL_OK) {
            assert_int_equal(cached, 30);
            assert_int_equal(np, 23);
            assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, t + 30, 16, row + 15), KVHAL_OK);
            assert_int_equal(info(cm).protected_tokens, 0);
            ok(cm);
            assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
            break;
        }
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_int_equal(kvhal_cache_manager_num_free(cm), free_before);
        assert_int_equal(info(cm).total_tokens, before.total_tokens);
        assert_int_equal(info(cm).protected_tokens, 0);
        assert_int_equal(kvhal_cache_manager_admit(cm, t, 40, 6, &h, &cached, &row, &np), KVHAL_OK);
        assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 46, row, h), KVHAL_OK);
        ok(cm);
        assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
    }
}

static void test_admit_random(void **state)
{
    (void)state;
    admit_random(1, 64, 600);
    admit_random(4, 16, 400);
}

/* admit's bad arguments and its refusals: nothing kept; the list is the manager's own (the same storage each call). */
static void test_admit(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make(16, 4, KVHAL_PREFIX_RADIX);
    int32_t t[40];
    seq(t, 40, 1);
    kvhal_prefix_handle h = 0;
    size_t cached = 0, np = 0;
    const int32_t *row = NULL, *first = NULL;
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 5, &h, &cached, &row, &np), KVHAL_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(np, 6); /* ceil(23 / 4) */
    first = row;
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, t, 23, row, h), KVHAL_OK);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 0, &h, &cached, &row, &np), KVHAL_OK);
    assert_int_equal(cached, 16);
    assert_int_equal(np, 5);
    assert_ptr_equal(row, first);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, t + 16, 2, row + 4), KVHAL_OK);
    ok(cm);
    const int32_t nfree = kvhal_cache_manager_num_free(cm), avail = kvhal_cache_manager_available(cm);
    /* 11 free + 5 cached pages, of which the match locks 4: 13 more pages are not there; 61 exceed the manager */
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 50, &h, &cached, &row, &np), KVHAL_OUT_OF_MEMORY);
    assert_non_null(strstr(kvhal_last_error(), "extra_tokens"));
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 240, &h, &cached, &row, &np), KVHAL_OUT_OF_MEMORY);
    assert_non_null(strstr(kvhal_last_error(), "extra_tokens"));
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, SIZE_MAX, &h, &cached, &row, &np), KVHAL_OUT_OF_MEMORY);
    assert_int_equal(kvhal_cache_manager_num_free(cm), nfree);
    assert_int_equal(kvhal_cache_manager_available(cm), avail);
    assert_int_equal(info(cm).protected_tokens, 0);
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 0, NULL, &cached, &row, &np), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 0, &h, &cached, NULL, &np), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "pages"));
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 0, &h, &cached, &row, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "num_pages"));
    assert_int_equal(kvhal_cache_manager_admit(cm, NULL, 18, 0, &h, &cached, &row, &np), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "tokens"));
    assert_int_equal(kvhal_cache_manager_admit(NULL, t, 18, 0, &h, &cached, &row, &np), KVHAL_INVALID_HANDLE);
    assert_int_equal(info(cm).protected_tokens, 0);
    assert_int_equal(kvhal_cache_manager_num_free(cm), nfree);
    /* exactly what is there: the 11 free and the one evictable page the match leaves unlocked */
    assert_int_equal(kvhal_cache_manager_admit(cm, t, 18, 46, &h, &cached, &row, &np), KVHAL_OK);
    assert_int_equal(np, 16);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 0);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, h, t + 16, 2, row + 4), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(cm, row + 5, 11), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_num_free(cm), 12);
    ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flow),
        cmocka_unit_test(test_duplicates_freed),
        cmocka_unit_test(test_allocate_evicts),
        cmocka_unit_test(test_evict_api),
        cmocka_unit_test(test_misuse_refused),
        cmocka_unit_test(test_integrity_detects_lost_pages),
        cmocka_unit_test(test_naive),
        cmocka_unit_test(test_fault_injection),
        cmocka_unit_test(test_simulation),
        cmocka_unit_test(test_free_runs),
        cmocka_unit_test(test_evicted_pages_merge),
        cmocka_unit_test(test_finish_bad_page_in_group),
        cmocka_unit_test(test_finish_bad_page_in_run),
        cmocka_unit_test(test_strided_pages),
        cmocka_unit_test(test_strided_bad_pages),
        cmocka_unit_test(test_finish_suffix),
        cmocka_unit_test(test_progressions_random),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_views_random),
        cmocka_unit_test(test_admit),
        cmocka_unit_test(test_admit_faults),
        cmocka_unit_test(test_admit_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

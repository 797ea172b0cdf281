/* test_model_workload.c — the model-checked workload, at CI size: 10^6 operations on a cache manager
 * (requests that match, allocate, decode, finish whole or by suffix, are dropped; eviction; misuse that must be
 * refused: a second finish or unlock of a request, a stale node handle of its prefix cache), checked against a
 * model after every operation:
 * - content: every page a match returns holds exactly the requester's token prefix (a shadow hash per token slot,
 *   written when a request computes the token), so no request is ever served another's K/V;
 * - ownership: a page the model knows a running request holds is never handed out by allocate, never returned by
 *   a match, and the manager's free + evictable + protected + held counts add up (check_integrity, every 4096
 *   operations and at the end);
 * - refusals: misuse returns KVHAL_INVALID_HANDLE and changes no count.
 * KVHAL_MODEL_OPS overrides the operation count (the outside run used 10.6 M). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

#define PAGES 512
#define MAXLEN 96
#define SLOTS 12

typedef struct req {
    bool active;
    int32_t tok[MAXLEN + 8];
    uint64_t hash[MAXLEN + 8];
    size_t len, matched;
    int32_t pages[MAXLEN + 8];
    size_t npages;
    kvhal_prefix_handle h, done_h;
} req;

typedef struct model {
    int32_t ps;
    kvhal_cache_manager *cm;
    uint64_t shadow[PAGES * 4];  /* per token slot: the hash of the prefix that token ends */
    int owner[PAGES];            /* the running request holding the page as its own, -1 none */
    req r[SLOTS];
    uint64_t rng;
    long hits, finishes, drops, refusals;
} model;

static uint64_t rnd(model *m)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng;
}

static uint64_t step(uint64_t h, int32_t t)
{
    return (h ^ ((uint64_t)(uint32_t)t + 0x9e3779b97f4a7c15ULL)) * 0xff51afd7ed558ccdULL;
}

static void ok(kvhal_status st)
{
    if (st != KVHAL_OK) fail_msg("%s: %s", kvhal_status_name(st), kvhal_last_error());
}

static void write_tokens(model *m, req *q, size_t from, size_t to)
{
    const size_t ps = (size_t)m->ps;
    for (size_t i = from; i < to; i++) m->shadow[(size_t)q->pages[i / ps] * ps + i % ps] = q->hash[i];
}

static void own(model *m, req *q, size_t from_page, int who)
{
    for (size_t p = from_page; p < q->npages; p++) {
        int32_t pg = q->pages[p];
        if (who >= 0 && m->owner[pg] >= 0) fail_msg("page %d handed out while request %d holds it", pg, m->owner[pg]);
        m->owner[pg] = who;
    }
}

static void start(model *m, int k)
{
    req *q = &m->r[k];
    /* prompts from a few shared stems, so that prefixes are shared and split */
    size_t len = 1 + rnd(m) % (MAXLEN - 16);
    uint32_t stem = (uint32_t)(rnd(m) % 6);
    for (size_t i = 0; i < len; i++) {
        q->tok[i] = i < len / 2 ? (int32_t)(stem * 1000 + i) : (int32_t)(rnd(m) % 4);
        q->hash[i] = step(i ? q->hash[i - 1] : 0, q->tok[i]);
    }
    q->len = len;
    size_t cached = 0;
    int32_t got[MAXLEN + 8];
    ok(kvhal_cache_manager_match(m->cm, q->tok, len - 1, &q->h, &cached, got, MAXLEN + 8));
    for (size_t i = 0; i < cached; i++) {
        int32_t pg = got[i / (size_t)m->ps];
        if (m->owner[pg] >= 0) fail_msg("match returned page %d, held by running request %d", pg, m->owner[pg]);
        if (m->shadow[(size_t)pg * (size_t)m->ps + i % (size_t)m->ps] != q->hash[i])
            fail_msg("match returned page %d holding another prefix (token %zu)", pg, i);
    }
    if (cached) m->hits++;
    memcpy(q->pages, got, cached / (size_t)m->ps * sizeof *got);
    q->matched = cached;
    size_t have = cached / (size_t)m->ps, need = (len + (size_t)m->ps - 1) / (size_t)m->ps;
    kvhal_status st = kvhal_cache_manager_allocate(m->cm, (int32_t)(need - have), q->pages + have);
    if (st == KVHAL_OUT_OF_MEMORY) {
        ok(kvhal_prefix_unlock(kvhal_cache_manager_prefix(m->cm), q->h));
        q->done_h = q->h;
        return;
    }
    ok(st);
    q->npages = need;
    own(m, q, have, k);
    write_tokens(m, q, cached, len);
    q->active = true;
}

static void decode(model *m, int k)
{
    req *q = &m->r[k];
    if (q->len >= MAXLEN) return;
    if (q->len % (size_t)m->ps == 0) {
        kvhal_status st = kvhal_cache_manager_allocate(m->cm, 1, q->pages + q->npages);
        if (st == KVHAL_OUT_OF_MEMORY) return;
        ok(st);
        q->npages++;
        own(m, q, q->npages - 1, k);
    }
    q->tok[q->len] = (int32_t)(rnd(m) % 4);
    q->hash[q->len] = step(q->hash[q->len - 1], q->tok[q->len]);
    write_tokens(m, q, q->len, q->len + 1);
    q->len++;
}

static void finish(model *m, int k, bool suffix)
{
    req *q = &m->r[k];
    size_t own_from = q->matched / (size_t)m->ps;
    if (suffix)
        ok(kvhal_cache_manager_cache_finished_suffix(m->cm, q->h, q->tok + q->matched, q->len - q->matched,
                                                     q->pages + own_from));
    else
        ok(kvhal_cache_manager_cache_finished(m->cm, q->tok, q->len, q->pages, q->h));
    own(m, q, own_from, -1);
    q->done_h = q->h;
    q->active = false;
    m->finishes++;
}

static void drop(model *m, int k)
{
    req *q = &m->r[k];
    size_t own_from = q->matched / (size_t)m->ps;
    ok(kvhal_cache_manager_free(m->cm, q->pages + own_from, (int32_t)(q->npages - own_from)));
    ok(kvhal_prefix_unlock(kvhal_cache_manager_prefix(m->cm), q->h));
    own(m, q, own_from, -1);
    q->done_h = q->h;
    q->active = false;
    m->drops++;
}

/* A finished or dropped request's handle again, with its old pages (which may be another request's now). */
static void misuse(model *m, int k)
{
    req *q = &m->r[k];
    if (!q->done_h || q->active || !q->npages) return;
    int32_t free0 = kvhal_cache_manager_num_free(m->cm), avail0 = kvhal_cache_manager_available(m->cm);
    size_t own_from = q->matched / (size_t)m->ps;
    kvhal_status st = (rnd(m) & 1) ? kvhal_cache_manager_cache_finished_suffix(m->cm, q->done_h, q->tok + q->matched,
                                                                               q->len - q->matched, q->pages + own_from)
                                   : kvhal_cache_manager_cache_finished(m->cm, q->tok, q->len, q->pages, q->done_h);
    if (st != KVHAL_INVALID_HANDLE) fail_msg("a second finish returned %s", kvhal_status_name(st));
    if (kvhal_prefix_unlock(kvhal_cache_manager_prefix(m->cm), q->done_h) != KVHAL_INVALID_HANDLE)
        fail_msg("%s", "a second unlock was accepted");
    if (kvhal_cache_manager_num_free(m->cm) != free0 || kvhal_cache_manager_available(m->cm) != avail0)
        fail_msg("%s", "a refused call changed the counts");
    m->refusals++;
}

static void run(int32_t ps, long ops, uint64_t seed)
{
    model *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->ps = ps;
    m->rng = seed;
    for (int i = 0; i < PAGES; i++) m->owner[i] = -1;
    ok(kvhal_cache_manager_create(PAGES, ps, KVHAL_PREFIX_RADIX, &m->cm));
    for (long op = 0; op < ops; op++) {
        int k = (int)(rnd(m) % SLOTS);
        req *q = &m->r[k];
        unsigned what = (unsigned)(rnd(m) % 16);
        if (!q->active) {
            if (what < 12) start(m, k);
            else misuse(m, k);
        } else if (what < 9) {
            decode(m, k);
        } else if (what < 13) {
            finish(m, k, what & 1);
        } else if (what < 14) {
            drop(m, k);
        } else if (what < 15) {
            size_t ev;
            ok(kvhal_cache_manager_evict(m->cm, (size_t)(rnd(m) % 64), &ev));
        } else {
            misuse(m, (k + 1) % SLOTS);
        }
        if (op % 4096 == 0) ok(kvhal_cache_manager_check_integrity(m->cm));
    }
    for (int k = 0; k < SLOTS; k++)
        if (m->r[k].active) finish(m, k, false);
    ok(kvhal_cache_manager_check_integrity(m->cm));
    assert_int_equal(kvhal_cache_manager_available(m->cm), PAGES);
    printf("page size %d: %ld operations, %ld finished, %ld dropped, %ld prefix hits, %ld stale handles refused\n",
           (int)ps, ops, m->finishes, m->drops, m->hits, m->refusals);
    ok(kvhal_cache_manager_destroy(m->cm));
    free(m);
}

static void test_model_workload(void **state)
{
    (void)state;
    long ops = 1000000;
    const char *env = getenv("KVHAL_MODEL_OPS");
    if (env && *env) ops = strtol(env, NULL, 10);
    /* the operations split over page sizes 1, 2 and 4 */
    run(1, ops / 2, 0x9e3779b97f4a7c15ULL);
    run(2, ops / 4, 0x1234567887654321ULL);
    run(4, ops - ops / 2 - ops / 4, 0x0badc0ffee0ddf00ULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_workload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

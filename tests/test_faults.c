/* test_faults.c — fault injection: for every create/duplicate/update path, make the 1st, 2nd, ... N-th host or
 * device allocation fail (kvhal_fault_inject_alloc) until the path runs clean. Each failing run must return a
 * clean error status with a message, leak nothing (CI runs this under ASan and valgrind), and leave existing
 * state untouched (cache contents compared before and after a failed update). */
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

static const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
static int64_t points_walked;

/* Runs scenario with the n-th allocation failing for n = 1, 2, ... until it succeeds with fewer than n
 * allocations. Every failure must be an error status with a message. */
static void walk(const char *name, kvhal_status (*scenario)(void))
{
    int64_t n = 1;
    for (;; n++) {
        kvhal_clear_error();
        kvhal_fault_inject_alloc(n);
        kvhal_status st = scenario();
        int64_t used = kvhal_fault_alloc_count();
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) {
            assert_true(used < n); /* succeeded: the fault point was never reached */
            break;
        }
        points_walked++;
        if (st != KVHAL_OUT_OF_MEMORY) fail_msg("%s: fault at allocation %lld gave %s (%s)", name, (long long)n,
                                                kvhal_status_name(st), kvhal_last_error());
        assert_true(strlen(kvhal_last_error()) > 0);
        assert_true(n < 10000);
    }
    printf("[ faults   ] %-28s %lld allocation points walked\n", name, (long long)(n - 1));
    /* and once more with no fault: the path still works after all those failures */
    assert_int_equal(scenario(), KVHAL_OK);
}

#define TRY(x)                                                                                                  \
    do {                                                                                                        \
        st = (x);                                                                                               \
        if (st != KVHAL_OK) goto out;                                                                           \
    } while (0)

static kvhal_status scen_buffer(void)
{
    kvhal_buffer *b = NULL;
    kvhal_stream *s = NULL;
    kvhal_status st;
    TRY(kvhal_buffer_create(cpu, 1 << 16, &b));
    TRY(kvhal_stream_create(cpu, &s));
    TRY(kvhal_memset(b, 0, 7, 1 << 16, s));
out:
    if (s) kvhal_stream_destroy(s);
    if (b) kvhal_buffer_destroy(b);
    return st;
}

static kvhal_status scen_kv_cache(void)
{
    kvhal_kv_cache *c = NULL, *d = NULL;
    kvhal_kv_cache_config cfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = 3, .num_kv_heads = 4, .head_dim_k = 16, .head_dim_v = 8,
                                 .max_len = 64, .dtype = KVHAL_F16, .num_devices = 1, .devices = &cpu};
    kvhal_status st;
    TRY(kvhal_kv_cache_create(&cfg, &c));
    TRY(kvhal_kv_cache_duplicate(c, 17, &d));
out:
    if (d) kvhal_kv_cache_destroy(d);
    if (c) kvhal_kv_cache_destroy(c);
    return st;
}

/* Fills a tensor's buffer with a byte pattern. */
static void fill(kvhal_tensor *t, uint8_t seed)
{
    size_t n = kvhal_buffer_size(t->buffer);
    uint8_t *p = kvhal_buffer_native(t->buffer); /* cpu: host memory */
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed + i * 31);
}

static kvhal_static_cache *sc;
static kvhal_buffer *sbuf;
static kvhal_tensor sk, sv;

static kvhal_status scen_static_update(void)
{
    kvhal_tensor kh, vh;
    return kvhal_static_cache_update(sc, 1, &sk, &sv, 5, &kh, &vh, NULL);
}

static void test_static_cache(void **state)
{
    (void)state;
    kvhal_static_cache_config cfg = {.struct_size = sizeof(kvhal_static_cache_config), .num_layers = 2, .batch = 2, .num_heads_k = 3, .num_heads_v = 2,
                                     .head_dim_k = 8, .head_dim_v = 4, .max_len = 32, .dtype = KVHAL_F32,
                                     .device = cpu};
    /* create itself, walked */
    kvhal_status st;
    for (int64_t n = 1;; n++) {
        kvhal_fault_inject_alloc(n);
        st = kvhal_static_cache_create(&cfg, &sc);
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) break;
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        points_walked++;
    }
    int64_t kshape[4] = {2, 3, 4, 8}, vshape[4] = {2, 2, 4, 4};
    assert_int_equal(kvhal_buffer_create(cpu, (2 * 3 * 4 * 8 + 2 * 2 * 4 * 4) * 4, &sbuf), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(sbuf, 0, KVHAL_F32, 4, kshape, NULL, &sk), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(sbuf, 2 * 3 * 4 * 8 * 4, KVHAL_F32, 4, vshape, NULL, &sv), KVHAL_OK);
    fill(&sk, 3);
    /* A failed update must leave the cache as it was: snapshot layer 1's history before each attempt. */
    kvhal_tensor kh0, vh0;
    assert_int_equal(kvhal_static_cache_update(sc, 1, &sk, &sv, 0, &kh0, &vh0, NULL), KVHAL_OK);
    size_t kb = kvhal_buffer_size(kh0.buffer);
    uint8_t *before = malloc(kb);
    memcpy(before, kvhal_buffer_native(kh0.buffer), kb);
    for (int64_t n = 1;; n++) {
        kvhal_fault_inject_alloc(n);
        /* descriptor caches hide allocations after the first call: clear them so every path allocates */
        kvhal_desc_cache_clear(cpu);
        st = scen_static_update();
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) break;
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_memory_equal(before, kvhal_buffer_native(kh0.buffer), kb);
        points_walked++;
    }
    free(before);
    assert_int_equal(kvhal_static_cache_destroy(sc), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(sbuf), KVHAL_OK);
}

static kvhal_status scen_paged(void)
{
    kvhal_paged_cache *c = NULL;
    kvhal_buffer *in = NULL, *slots = NULL;
    kvhal_status st;
    kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 2, .num_heads = 2, .head_dim = 16, .block_size = 4,
                                    .dtype = KVHAL_F16, .layout = KVHAL_LAYOUT_HND, .order = KVHAL_PAGE_FIRST,
                                    .memory_budget = 2 * 2 * 2 * 16 * 4 * 2 * 8, .device = cpu};
    TRY(kvhal_paged_cache_create(&cfg, &c));
    TRY(kvhal_buffer_create(cpu, 2 * 5 * 2 * 16 * 2, &in));
    TRY(kvhal_buffer_create(cpu, 5 * 8, &slots));
    int64_t sl[5] = {0, 3, -1, 9, 30};
    TRY(kvhal_memcpy_h2d(slots, 0, sl, sizeof sl, NULL));
    kvhal_tensor k, v, s;
    int64_t shape[3] = {5, 2, 16}, sshape[1] = {5};
    TRY(kvhal_tensor_make(in, 0, KVHAL_F16, 3, shape, NULL, &k));
    TRY(kvhal_tensor_make(in, 5 * 2 * 16 * 2, KVHAL_F16, 3, shape, NULL, &v));
    TRY(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, sshape, NULL, &s));
    kvhal_desc_cache_clear(cpu);
    TRY(kvhal_paged_cache_update(c, 1, &k, &v, &s, NULL));
    int64_t pairs[4] = {0, 5, 2, 7};
    TRY(kvhal_paged_cache_copy_blocks(c, pairs, 2, NULL));
out:
    if (slots) kvhal_buffer_destroy(slots);
    if (in) kvhal_buffer_destroy(in);
    if (c) kvhal_paged_cache_destroy(c);
    return st;
}

static kvhal_status scen_prefix(void)
{
    kvhal_prefix_cache *pc = NULL;
    kvhal_status st;
    int32_t toks[64], pages[16];
    for (int i = 0; i < 64; i++) toks[i] = i % 7;
    for (int i = 0; i < 16; i++) pages[i] = i;
    TRY(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 4, &pc));
    size_t already = 0, got = 0, evicted = 0;
    TRY(kvhal_prefix_insert(pc, toks, 32, pages, &already));
    toks[20] = 99; /* forces a split */
    TRY(kvhal_prefix_insert(pc, toks, 64, pages, &already));
    kvhal_prefix_handle h;
    int32_t out[16];
    TRY(kvhal_prefix_match(pc, toks, 64, &h, &got, out, 16));
    TRY(kvhal_prefix_evict(pc, 8, NULL, NULL, &evicted));
    TRY(kvhal_prefix_check_integrity(pc));
out:
    if (pc) kvhal_prefix_cache_destroy(pc);
    return st;
}

static kvhal_status scen_manager(void)
{
    kvhal_cache_manager *cm = NULL;
    kvhal_status st;
    int32_t toks[40], pages[10], matched[10];
    for (int i = 0; i < 40; i++) toks[i] = i;
    TRY(kvhal_cache_manager_create(12, 4, KVHAL_PREFIX_RADIX, &cm));
    for (int r = 0; r < 3; r++) {
        kvhal_prefix_handle h;
        size_t cached = 0;
        TRY(kvhal_cache_manager_match(cm, toks, 40, &h, &cached, matched, 10));
        int32_t have = (int32_t)(cached / 4);
        memcpy(pages, matched, (size_t)have * sizeof(int32_t));
        TRY(kvhal_cache_manager_allocate(cm, 10 - have, pages + have));
        TRY(kvhal_cache_manager_cache_finished(cm, toks, 40, pages, h));
        toks[39 - r * 8] += 100;
    }
    TRY(kvhal_cache_manager_check_integrity(cm));
out:
    if (cm) kvhal_cache_manager_destroy(cm);
    return st;
}

static kvhal_status scen_block_pool(void)
{
    kvhal_block_pool *p = NULL;
    kvhal_status st;
    int32_t b[8];
    TRY(kvhal_block_pool_create(64, &p));
    TRY(kvhal_block_pool_allocate(p, 8, b));
    TRY(kvhal_block_pool_share(p, b[3]));
    TRY(kvhal_block_pool_check_integrity(p));
out:
    if (p) kvhal_block_pool_destroy(p);
    return st;
}

static int destroyed;
static void user_destroy(void *desc, kvhal_device dev, void *user)
{
    (void)dev;
    (void)user;
    free(desc);
    destroyed++;
}

static kvhal_status scen_desc_put(void)
{
    static kvhal_op_kind op = -1;
    kvhal_status st = KVHAL_OK;
    if (op < 0) TRY(kvhal_desc_op_register("faults.user_op", user_destroy, NULL, &op));
    kvhal_desc_key key;
    TRY(kvhal_desc_key_init(&key, op));
    TRY(kvhal_desc_key_add_u64(&key, 42));
    void *d = malloc(16);
    st = kvhal_desc_cache_put(cpu, &key, d);
    if (st != KVHAL_OK) free(d); /* put failed: ownership stays with the caller */
    else kvhal_desc_cache_clear(cpu);
out:
    return st;
}

static void test_buffer(void **s) { (void)s; walk("buffer+stream+memset", scen_buffer); }
static void test_kv_cache(void **s) { (void)s; walk("kv_cache create+duplicate", scen_kv_cache); }
static void test_paged(void **s) { (void)s; walk("paged create+update+copy", scen_paged); }
static void test_prefix(void **s) { (void)s; walk("prefix insert/match/evict", scen_prefix); }
static void test_manager(void **s) { (void)s; walk("cache_manager requests", scen_manager); }
static void test_block_pool(void **s) { (void)s; walk("block_pool", scen_block_pool); }
static void test_desc(void **s) { (void)s; walk("desc_cache put", scen_desc_put); }

/* kvhal_fault_hold_streams holds event queries too (BUSY while held), on every device type present */
static void test_hold_streams_events(void **state)
{
    (void)state;
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        int32_t n = 0;
        if (kvhal_device_count((kvhal_device_type)t, &n) != KVHAL_OK || n == 0) continue;
        const kvhal_device dev = {(kvhal_device_type)t, 0};
        kvhal_event *e = NULL;
        assert_int_equal(kvhal_event_create(dev, &e), KVHAL_OK);
        assert_int_equal(kvhal_event_record(e, NULL), KVHAL_OK);
        assert_int_equal(kvhal_event_synchronize(e), KVHAL_OK);
        kvhal_fault_hold_streams(1);
        assert_int_equal(kvhal_event_query(e), KVHAL_BUSY);
        kvhal_fault_hold_streams(0);
        assert_int_equal(kvhal_event_query(e), KVHAL_OK);
        assert_int_equal(kvhal_event_destroy(e), KVHAL_OK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buffer),  cmocka_unit_test(test_kv_cache), cmocka_unit_test(test_static_cache),
        cmocka_unit_test(test_paged),   cmocka_unit_test(test_prefix),   cmocka_unit_test(test_manager),
        cmocka_unit_test(test_block_pool), cmocka_unit_test(test_desc), cmocka_unit_test(test_hold_streams_events),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    printf("fault injection: %lld allocation points walked\n", (long long)points_walked);
    return r;
}

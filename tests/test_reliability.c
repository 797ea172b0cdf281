/* test_reliability.c — regression tests for reliability and security defects, one (or more) per
 * defect, named test_d<N>_... after the defect's number in the review that found them. Each failed before its fix
 * (the commit messages say how). Handles are only compared with 0 and passed on, so that the same
 * source also compiles against the header from before the fixes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvhal.h"

#ifndef KVHAL_TEST_BUILD_ROOT
#define KVHAL_TEST_BUILD_ROOT "."
#endif
/* A module folder as an attacker leaves it (made by main before the first kvhal call, first in KVHAL_BACKEND_PATH):
 * 80 junk files named like modules (more than the old 64-module table), a FIFO named like one, a copy of a real
 * module that its group may write, and a world-writable folder holding another copy. */
#define HOSTILE_DIR KVHAL_TEST_BUILD_ROOT "/tests/hostile-modules"
#define NPU_MODULE KVHAL_TEST_BUILD_ROOT "/examples/vendor-plugin/libkvhal-npu.so"
#define JUNK_FILES 80

static int copy_file(const char *from, const char *to, mode_t mode);

static kvhal_cache_manager *make_cm(int32_t total, int32_t ps)
{
    kvhal_cache_manager *cm = NULL;
    assert_int_equal(kvhal_cache_manager_create(total, ps, KVHAL_PREFIX_RADIX, &cm), KVHAL_OK);
    return cm;
}

static void cm_ok(const kvhal_cache_manager *cm)
{
    if (kvhal_cache_manager_check_integrity(cm) != KVHAL_OK) fail_msg("%s", kvhal_last_error());
}

static size_t protected_tokens(kvhal_prefix_cache *pc)
{
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(pc, &si), KVHAL_OK);
    return si.protected_tokens;
}

/* Defect 2: a node handle whose node was evicted, after an unrelated insert took its slot, must not lock (or
 * unlock) the unrelated entry. */
static void test_d2_stale_prefix_handle_refused(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = NULL;
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, &pc), KVHAL_OK);
    size_t already, got, ev;
    int32_t out[4];
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){1, 2}, 2, (int32_t[]){0, 1}, &already), KVHAL_OK);
    kvhal_prefix_handle h;
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){1, 2}, 2, &h, &got, out, 4), KVHAL_OK);
    assert_int_equal(got, 2);
    assert_true(h != 0);
    assert_int_equal(kvhal_prefix_evict(pc, 100, NULL, NULL, &ev), KVHAL_OK);
    assert_int_equal(ev, 2);
    /* the unrelated entry takes the freed node slot */
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){5, 6}, 2, (int32_t[]){2, 3}, &already), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_INVALID_HANDLE);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    assert_int_equal(protected_tokens(pc), 0);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_INVALID_HANDLE);
    /* the same after a reset */
    kvhal_prefix_handle h2;
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){5, 6}, 2, &h2, &got, out, 4), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, h2), KVHAL_OK);
    assert_int_equal(kvhal_prefix_reset(pc, NULL, NULL), KVHAL_OK);
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){7, 8}, 2, (int32_t[]){4, 5}, &already), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, h2), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_lock(pc, h2), KVHAL_INVALID_HANDLE);
    assert_int_equal(protected_tokens(pc), 0);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* Defect 2: request A finishes twice; between the two, A's cached suffix is evicted and its pages go to request
 * B, which holds a lock on the same node A matched. The second finish must be refused: accepted, it put B's pages
 * under A's tokens and a later match served them (another request's K/V). */
static void test_d2_double_finish_suffix_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make_cm(8, 1);
    kvhal_prefix_cache *pc = kvhal_cache_manager_prefix(cm);
    int32_t seed_pages[2], pa[2], pb[6], out[8];
    size_t cached;
    kvhal_prefix_handle h0, ha, hb;
    /* the shared prefix [1, 2] */
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2}, 2, &h0, &cached, out, 8), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, seed_pages), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, (int32_t[]){1, 2}, 2, seed_pages, h0), KVHAL_OK);
    /* A: [1, 2, 3, 4] */
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3, 4}, 4, &ha, &cached, out, 8), KVHAL_OK);
    assert_int_equal(cached, 2);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pa), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){3, 4}, 2, pa), KVHAL_OK);
    cm_ok(cm);
    /* B: [1, 2, 9] locks the node A matched; A's suffix leaf is evicted and B gets every free page (A's too) */
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 9}, 3, &hb, &cached, out, 8), KVHAL_OK);
    assert_int_equal(cached, 2);
    size_t ev = 0;
    assert_int_equal(kvhal_cache_manager_evict(cm, 100, &ev), KVHAL_OK);
    assert_int_equal(ev, 2);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 6, pb), KVHAL_OK);
    /* A finishes again with its old pages, now B's */
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){3, 4}, 2, pa), KVHAL_INVALID_HANDLE);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    cm_ok(cm);
    /* nobody is served B's pages for A's tokens */
    kvhal_prefix_handle hc;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3, 4}, 4, &hc, &cached, out, 8), KVHAL_OK);
    assert_int_equal(cached, 2);
    assert_int_equal(kvhal_prefix_unlock(pc, hc), KVHAL_OK);
    /* B's own handle still works, once */
    assert_int_equal(kvhal_cache_manager_free(cm, pb, 6), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, hb), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, hb), KVHAL_INVALID_HANDLE);
    assert_int_equal(protected_tokens(pc), 0);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 2: a request that matched nothing finishes twice (its pages reused by B in between): refused too. */
static void test_d2_double_finish_empty_match_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make_cm(4, 1);
    int32_t pa[2], pb[4], out[4];
    size_t cached;
    kvhal_prefix_handle ha;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2}, 2, &ha, &cached, out, 4), KVHAL_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pa), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){1, 2}, 2, pa), KVHAL_OK);
    size_t ev;
    assert_int_equal(kvhal_cache_manager_evict(cm, 100, &ev), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 4, pb), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){1, 2}, 2, pa), KVHAL_INVALID_HANDLE);
    cm_ok(cm);
    kvhal_prefix_handle hc;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2}, 2, &hc, &cached, out, 4), KVHAL_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), hc), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(cm, pb, 4), KVHAL_OK);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 2: calls with a destroyed prefix cache or cache manager are refused through the live-handle set, without
 * the freed memory being read (on b783e89 each was an ASan heap-use-after-free; a plain build read freed memory). */
static void test_d2_destroyed_prefix_cache_and_manager_refused(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = NULL;
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, &pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
    int32_t out[2];
    size_t cached, already;
    kvhal_prefix_handle h;
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){1, 2}, 2, &h, &cached, out, 2), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){1, 2}, 2, (int32_t[]){0, 1}, &already), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_cache_page_size(pc), 0);
    kvhal_cache_manager *cm = make_cm(4, 1);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 1, out), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_cache_manager_check_integrity(cm), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_cache_manager_available(cm), 0);
    assert_null(kvhal_cache_manager_prefix(cm));
}

/* Defect 3: the prefix cache a manager owns cannot be destroyed on its own; the manager keeps working. */
static void test_d3_manager_prefix_destroy_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make_cm(8, 2);
    kvhal_prefix_cache *pc = kvhal_cache_manager_prefix(cm);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "cache manager"));
    int32_t pages[2], out[2];
    size_t cached;
    kvhal_prefix_handle h;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3, 4}, 4, &h, &cached, out, 2), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pages), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, (int32_t[]){1, 2, 3, 4}, 4, pages, h), KVHAL_OK);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 9: a refused match (pages_cap too small) writes nothing: not pages, not handle, not cached_len. */
static void test_d9_refused_match_writes_nothing(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = NULL;
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, &pc), KVHAL_OK);
    size_t already;
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){1, 2, 3}, 3, (int32_t[]){0, 1, 2}, &already), KVHAL_OK);
    kvhal_prefix_handle h, h_before;
    memset(&h, 0xab, sizeof h);
    h_before = h;
    size_t cached = 12345;
    int32_t out[2] = {-7, -7};
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){1, 2, 3}, 3, &h, &cached, out, 2), KVHAL_OUT_OF_RANGE);
    assert_memory_equal(&h, &h_before, sizeof h);
    assert_int_equal(cached, 12345);
    assert_int_equal(out[0], -7);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
    /* the manager's match likewise */
    kvhal_cache_manager *cm = make_cm(8, 1);
    kvhal_prefix_handle h0;
    int32_t pg[3], o8[8];
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3}, 3, &h0, &cached, o8, 8), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 3, pg), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, (int32_t[]){1, 2, 3}, 3, pg, h0), KVHAL_OK);
    h = h_before;
    cached = 12345;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3}, 3, &h, &cached, out, 2), KVHAL_OUT_OF_RANGE);
    assert_memory_equal(&h, &h_before, sizeof h);
    assert_int_equal(cached, 12345);
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(cm), &si), KVHAL_OK);
    assert_int_equal(si.protected_tokens, 0); /* no lock taken either */
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 4: a destroy function that puts a new descriptor of its own kind (re-entry is allowed). */
static kvhal_op_kind d4_op = -1;
static int d4_created, d4_destroyed, d4_refused;
static _Thread_local int d4_depth;

static void d4_put_new(void)
{
    kvhal_desc_key key;
    assert_int_equal(kvhal_desc_key_init(&key, d4_op), KVHAL_OK);
    assert_int_equal(kvhal_desc_key_add_u64(&key, (uint64_t)(1000000 + d4_created)), KVHAL_OK);
    int *d = malloc(sizeof *d);
    assert_non_null(d);
    d4_created++;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_status st = kvhal_desc_cache_put(cpu, &key, d);
    if (st != KVHAL_OK) { /* refused (full LRU from a destroy function, or teardown): the caller keeps it */
        assert_int_equal(st, KVHAL_BUSY);
        d4_refused++;
        free(d);
    }
}

static void d4_destroy(void *desc, kvhal_device dev, void *user)
{
    (void)dev;
    (void)user;
    free(desc);
    d4_destroyed++;
    if (d4_depth < 100000) { /* every destroy puts one back */
        d4_depth++;
        d4_put_new();
        d4_depth--;
    }
}

static void *d4_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20; i++) d4_put_new();
    return NULL; /* thread exit destroys this thread's cache: each destroy puts again */
}

static void test_d4_desc_destroy_reentry_terminates(void **state)
{
    (void)state;
    alarm(60); /* the old loop never ended: fail instead of hanging */
    assert_int_equal(kvhal_desc_op_register("reentrant_put", d4_destroy, NULL, &d4_op), KVHAL_OK);
    assert_int_equal(kvhal_desc_cache_set_capacity(d4_op, 4), KVHAL_OK);
    for (int i = 0; i < 50; i++) d4_put_new(); /* evicting puts */
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_desc_cache_stats st;
    assert_int_equal(kvhal_desc_cache_get_stats(cpu, d4_op, &st), KVHAL_OK);
    if (st.size > 4) fail_msg("size %zu", st.size); /* at most one over capacity, from the puts of destroy functions */
    assert_int_equal(kvhal_desc_cache_clear(cpu), KVHAL_OK); /* what destroy puts back during a clear stays */
    assert_int_equal(kvhal_desc_cache_get_stats(cpu, d4_op, &st), KVHAL_OK);
    assert_true(st.size <= 4);
    assert_true(d4_refused > 0); /* puts from destroy functions into a full LRU: KVHAL_BUSY, the caller keeps it */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, d4_thread, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(d4_created - d4_refused - d4_destroyed, 0 + (int)st.size); /* the rest is cached here */
    assert_int_equal(kvhal_desc_cache_set_capacity(d4_op, 0), KVHAL_OK);
    assert_int_equal(kvhal_desc_cache_clear(cpu), KVHAL_OK);
    alarm(0);
}

/* Defect 5: the live-handle table follows what is live: after many create/destroy pairs with nothing else live, it
 * is back at its smallest size (it held 2^20 slots, 8 MiB, after 10^6 pairs). The test's own small allocations in
 * between (a ring of varied sizes) make the handles land at ever new addresses, as in a program; a burst of 20000
 * live handles first grows the table, and destroying them must shrink it. kvhal__handle_table_slots is internal. */
size_t kvhal__handle_table_slots(void);

static void test_d5_live_handle_table_shrinks(void **state)
{
    (void)state;
    enum { PAIRS = 300000, RING = 512, BURST = 20000 };
    kvhal_block_pool **burst = calloc(BURST, sizeof *burst);
    assert_non_null(burst);
    for (int i = 0; i < BURST; i++) assert_int_equal(kvhal_block_pool_create(1, &burst[i]), KVHAL_OK);
    size_t grown = kvhal__handle_table_slots();
    assert_true(grown >= 2 * BURST);
    for (int i = 0; i < BURST; i++) assert_int_equal(kvhal_block_pool_destroy(burst[i]), KVHAL_OK);
    free(burst);
    if (kvhal__handle_table_slots() > 1024) fail_msg("%zu slots with nothing live", kvhal__handle_table_slots());
    void **ring = calloc(RING, sizeof *ring);
    assert_non_null(ring);
    for (int i = 0; i < PAIRS; i++) {
        free(ring[i % RING]);
        ring[i % RING] = malloc(16 + (size_t)(i * 37 % 2000));
        kvhal_block_pool *p = NULL;
        assert_int_equal(kvhal_block_pool_create(1, &p), KVHAL_OK);
        assert_int_equal(kvhal_block_pool_destroy(p), KVHAL_OK);
    }
    for (int i = 0; i < RING; i++) free(ring[i]);
    free(ring);
    if (kvhal__handle_table_slots() > 1024)
        fail_msg("%zu slots after %d create/destroy pairs with nothing live", kvhal__handle_table_slots(), (int)PAIRS);
}

/* Defect 7: kvhal_tensor_span_bytes of a hand-built tensor whose span does not fit (stride 2^62, 2 elements of 4
 * bytes) is SIZE_MAX, not a wrapped 4; validation refuses it. */
static void test_d7_span_bytes_does_not_wrap(void **state)
{
    (void)state;
    kvhal_buffer *buf = NULL;
    assert_int_equal(kvhal_buffer_create((kvhal_device){KVHAL_DEVICE_CPU, 0}, 64, &buf), KVHAL_OK);
    kvhal_tensor t = {.buffer = buf, .dtype = KVHAL_F32, .ndim = 1, .shape = {2}, .strides = {(int64_t)1 << 62}};
    assert_true(kvhal_tensor_span_bytes(&t) == SIZE_MAX);
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_OUT_OF_RANGE);
    /* (shape - 1) * stride = 2^64 - 1 exactly: one past it wraps to 0 */
    kvhal_tensor u = {.buffer = buf, .dtype = KVHAL_I32, .ndim = 1, .shape = {4},
                      .strides = {(int64_t)6148914691236517205LL}};
    assert_true(kvhal_tensor_span_bytes(&u) == SIZE_MAX);
    assert_int_equal(kvhal_tensor_validate(&u), KVHAL_OUT_OF_RANGE);
    kvhal_tensor neg = {.buffer = buf, .dtype = KVHAL_F32, .ndim = 1, .shape = {2}, .strides = {-1}};
    assert_true(kvhal_tensor_span_bytes(&neg) == SIZE_MAX);
    kvhal_tensor ok = {.buffer = buf, .dtype = KVHAL_F32, .ndim = 2, .shape = {2, 3}, .strides = {3, 1}};
    assert_int_equal(kvhal_tensor_span_bytes(&ok), 24);
    ok.shape[0] = 0;
    assert_int_equal(kvhal_tensor_span_bytes(&ok), 0);
    assert_int_equal(kvhal_buffer_destroy(buf), KVHAL_OK);
}

/* Defect 7: paged caching on the CPU with stride-0 views and K and V head dims of INT32_MAX (every slot padding):
 * the CPU backend summed the two head dims in int (signed overflow: UBSan, halt_on_error in CI, stops the test). */
static void test_d7_cpu_paged_caching_huge_head_dim_no_overflow(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_buffer *buf = NULL, *sb = NULL;
    assert_int_equal(kvhal_buffer_create(cpu, 64, &buf), KVHAL_OK);
    assert_int_equal(kvhal_buffer_create(cpu, 8, &sb), KVHAL_OK);
    const int64_t zero4[4] = {0, 0, 0, 0}, zero3[3] = {0, 0, 0};
    const int64_t cshape[4] = {1, 1, 1, INT32_MAX}, ishape[3] = {1, 1, INT32_MAX}, one = 1;
    kvhal_tensor kc, vc, k, v, slots;
    assert_int_equal(kvhal_tensor_make(buf, 0, KVHAL_F32, 4, cshape, zero4, &kc), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(buf, 16, KVHAL_F32, 4, cshape, zero4, &vc), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(buf, 32, KVHAL_F32, 3, ishape, zero3, &k), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(buf, 48, KVHAL_F32, 3, ishape, zero3, &v), KVHAL_OK);
    int64_t pad = -1;
    assert_int_equal(kvhal_memcpy_h2d(sb, 0, &pad, sizeof pad, NULL), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(sb, 0, KVHAL_I64, 1, &one, NULL, &slots), KVHAL_OK);
    kvhal_status st = kvhal_paged_caching(&kc, &vc, &k, &v, &slots, 1.0f, 1.0f, NULL);
    /* it runs (every slot is padding), and without undefined behaviour */
    if (st != KVHAL_OK) fail_msg("%s", kvhal_last_error());
    assert_int_equal(kvhal_buffer_destroy(sb), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(buf), KVHAL_OK);
}

/* Defect 8: concurrent use of a single-owner object is detected: a call on a prefix cache while another thread is
 * inside a call on it (here: held inside an evict callback until the other thread has tried), and a callback that
 * calls back into its cache, get KVHAL_BUSY and change nothing. Then two threads share one cache manager, retrying
 * on KVHAL_BUSY: no hang, no corruption (TSan-clean: the flag orders the calls). */
typedef struct d8_state {
    kvhal_prefix_cache *pc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase; /* 1: A is inside the callback; 2: B has tried */
    kvhal_status b_status, reentry_status;
} d8_state;

static void d8_evict_cb(const int32_t *pages, size_t n, void *user)
{
    (void)pages;
    (void)n;
    d8_state *s = user;
    kvhal_prefix_size_info si;
    s->reentry_status = kvhal_prefix_size_info_get(s->pc, &si); /* calling back in */
    pthread_mutex_lock(&s->mu);
    s->phase = 1;
    pthread_cond_broadcast(&s->cv);
    while (s->phase != 2) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void *d8_other(void *arg)
{
    d8_state *s = arg;
    pthread_mutex_lock(&s->mu);
    while (s->phase != 1) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    size_t already;
    s->b_status = kvhal_prefix_insert(s->pc, (int32_t[]){9, 9}, 2, (int32_t[]){7, 8}, &already);
    pthread_mutex_lock(&s->mu);
    s->phase = 2;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

typedef struct d8_worker {
    kvhal_cache_manager *cm;
    int32_t base;
    long busy;
} d8_worker;

#define D8_RETRY(w, call)                                                                                       \
    do {                                                                                                        \
        kvhal_status st_;                                                                                       \
        while ((st_ = (call)) == KVHAL_BUSY) (w)->busy++;                                                       \
        assert_int_equal(st_, KVHAL_OK);                                                                        \
    } while (0)

static void *d8_worker_fn(void *arg)
{
    d8_worker *w = arg;
    for (int i = 0; i < 10000; i++) {
        int32_t tok[8], pages[8];
        for (int j = 0; j < 8; j++) tok[j] = w->base + (i % 13) * 8 + j;
        kvhal_prefix_handle h;
        size_t cached = 0;
        D8_RETRY(w, kvhal_cache_manager_match(w->cm, tok, 8, &h, &cached, pages, 8));
        kvhal_status st;
        while ((st = kvhal_cache_manager_allocate(w->cm, 8 - (int32_t)cached, pages + cached)) == KVHAL_BUSY) w->busy++;
        if (st == KVHAL_OUT_OF_MEMORY) { /* the other worker holds the rest: drop this request */
            D8_RETRY(w, kvhal_prefix_unlock(kvhal_cache_manager_prefix(w->cm), h));
            continue;
        }
        assert_int_equal(st, KVHAL_OK);
        D8_RETRY(w, kvhal_cache_manager_cache_finished(w->cm, tok, 8, pages, h));
    }
    return NULL;
}

static void test_d8_concurrent_use_detected(void **state)
{
    (void)state;
    d8_state s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, &s.pc), KVHAL_OK);
    size_t already, ev = 0;
    assert_int_equal(kvhal_prefix_insert(s.pc, (int32_t[]){1, 2}, 2, (int32_t[]){0, 1}, &already), KVHAL_OK);
    pthread_t b;
    assert_int_equal(pthread_create(&b, NULL, d8_other, &s), 0);
    assert_int_equal(kvhal_prefix_evict(s.pc, 2, d8_evict_cb, &s, &ev), KVHAL_OK);
    assert_int_equal(pthread_join(b, NULL), 0);
    assert_int_equal(ev, 2);
    assert_int_equal(s.reentry_status, KVHAL_BUSY);
    assert_int_equal(s.b_status, KVHAL_BUSY);
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(s.pc, &si), KVHAL_OK);
    assert_int_equal(si.total_tokens, 0); /* B's refused insert changed nothing */
    assert_int_equal(kvhal_prefix_check_integrity(s.pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(s.pc), KVHAL_OK);

    kvhal_cache_manager *cm = make_cm(64, 1);
    d8_worker w[2] = {{cm, 0, 0}, {cm, 100000, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, d8_worker_fn, &w[i]), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_available(cm), 64); /* nothing held, nothing locked */
    printf("d8: %ld + %ld calls refused with KVHAL_BUSY while the other thread was inside\n", w[0].busy, w[1].busy);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 10: a message cut to fit its buffer ends on a whole UTF-8 character (it was cut mid-character). */
static bool valid_utf8(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t k = *p < 0x80 ? 1 : (*p & 0xe0) == 0xc0 ? 2 : (*p & 0xf0) == 0xe0 ? 3 : (*p & 0xf8) == 0xf0 ? 4 : 0;
        if (!k) return false;
        for (size_t i = 1; i < k; i++)
            if ((p[i] & 0xc0) != 0x80) return false;
        p += k;
    }
    return true;
}

static void test_d10_messages_cut_on_utf8_boundaries(void **state)
{
    (void)state;
    for (int shift = 0; shift < 3; shift++) {
        char path[2048];
        int n = snprintf(path, sizeof path, "/nonexistent%.*s/", shift, "xx");
        while (n + 4 < (int)sizeof path - 16) /* euro signs */
            n += snprintf(path + n, sizeof path - (size_t)n, "\xe2\x82\xac");
        snprintf(path + n, sizeof path - (size_t)n, "/libkvhal-x.so");
        assert_int_equal(kvhal_backend_load(path), KVHAL_LOAD_FAILED);
        if (!valid_utf8(kvhal_last_error())) fail_msg("shift %d: the message ends mid-character", shift);
        kvhal_backend_module_info mi;
        int32_t count;
        assert_int_equal(kvhal_backend_module_count(&count), KVHAL_OK);
        assert_int_equal(kvhal_backend_module_get(count - 1, &mi), KVHAL_OK);
        assert_true(valid_utf8(mi.path) && valid_utf8(mi.reason));
    }
}

static const kvhal_backend_module_info *find_module(const char *name, kvhal_backend_module_info *buf)
{
    int32_t n = 0;
    assert_int_equal(kvhal_backend_module_count(&n), KVHAL_OK);
    for (int32_t i = 0; i < n; i++) {
        assert_int_equal(kvhal_backend_module_get(i, buf), KVHAL_OK);
        if (!strcmp(buf->name, name)) return buf;
    }
    return NULL;
}

/* Defect 6: a FIFO named like a module is refused without being opened for reading (discovery used to block in
 * dlopen for ever); 80 junk modules do not keep the real ones from loading (no limit), each is listed. */
static void test_d6_module_folder_fifo_and_junk(void **state)
{
    (void)state;
    kvhal_backend_module_info mi;
    for (int i = 0; i < JUNK_FILES; i++) {
        char name[32];
        snprintf(name, sizeof name, "aa%02d", i);
        const kvhal_backend_module_info *j = find_module(name, &mi);
        if (!j) fail_msg("junk module %s is not listed", name);
        assert_false(j->loaded);
    }
    /* the real modules after them still load */
    kvhal_device_type npu;
    assert_int_equal(kvhal_device_type_find("npu", &npu), KVHAL_OK);
    int32_t count = 0;
    assert_int_equal(kvhal_device_count(npu, &count), KVHAL_OK);
    assert_true(count > 0);
    const kvhal_backend_module_info *ocl = find_module("opencl", &mi);
    if (ocl) assert_true(ocl->loaded);
    const kvhal_backend_module_info *fifo = find_module("fifo", &mi);
    assert_non_null(fifo);
    assert_false(fifo->loaded);
    assert_non_null(strstr(fifo->reason, "not a regular file"));
}

/* Defect 1: module files and folders that others than their owner (or root) may write are refused, with the
 * reason listed (a setuid program would otherwise run what an unprivileged user put there). */
static void test_d1_unsafe_module_permissions_refused(void **state)
{
    (void)state;
    kvhal_backend_module_info mi;
    const kvhal_backend_module_info *gw = find_module("groupwritable", &mi);
    assert_non_null(gw);
    assert_false(gw->loaded);
    if (!strstr(gw->reason, "writable by its group")) fail_msg("%s", gw->reason);
    const kvhal_backend_module_info *ww = find_module("inopenfolder", &mi);
    assert_non_null(ww);
    assert_false(ww->loaded);
    if (!strstr(ww->reason, "module folder") || !strstr(ww->reason, "everyone")) fail_msg("%s", ww->reason);
    /* the same by kvhal_backend_load */
    assert_int_equal(kvhal_backend_load(HOSTILE_DIR "/open/libkvhal-inopenfolder.so"), KVHAL_LOAD_FAILED);
    assert_non_null(strstr(kvhal_last_error(), "writable"));
}

/* Defect 1: under secure execution (a set-user-id program) KVHAL_BACKEND_PATH is ignored: a set-user-id copy of a
 * helper, run by root, must not load the npu module the variable names, while a plain copy does (so the test can
 * see a load). Needs root (CI runs as root) and a file system that honours set-user-id; skipped otherwise. */
#define HELPER KVHAL_TEST_BUILD_ROOT "/tests/secure_env_helper"
#define HELPER_COPY KVHAL_TEST_BUILD_ROOT "/tests/secure-env-helper-setuid"

static void run_helper(const char *path, char *out, size_t n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "env KVHAL_BACKEND_PATH='%s' KVHAL_BACKENDS= ASAN_OPTIONS=detect_leaks=0 '%s' 2>&1",
             KVHAL_TEST_BUILD_ROOT "/examples/vendor-plugin", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    pclose(p);
}

static void test_d1_secure_execution_ignores_module_env(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        printf("not root: the set-user-id case cannot be made here\n");
        skip();
    }
    char out[512];
    run_helper(HELPER, out, sizeof out);
    if (!strstr(out, "secure=0 npu=loaded")) fail_msg("plain run: %s", out);
    unlink(HELPER_COPY);
    assert_int_equal(copy_file(HELPER, HELPER_COPY, 0755), 0);
    assert_int_equal(chown(HELPER_COPY, 65534, 65534), 0);
    assert_int_equal(chmod(HELPER_COPY, 04755), 0);
    run_helper(HELPER_COPY, out, sizeof out);
    unlink(HELPER_COPY);
    if (strstr(out, "secure=0")) {
        printf("set-user-id not honoured here (%s)\n", out);
        skip();
    }
    if (!strstr(out, "secure=1 npu=absent")) fail_msg("set-user-id run: %s", out);
}

/* Defect 6: a module whose init fills its reason buffer with no terminator is listed with a bounded reason (the
 * registry used to read past the buffer on its stack: an ASan stack-buffer-overflow). */
static void test_d6_unterminated_module_reason_bounded(void **state)
{
    (void)state;
    assert_int_equal(kvhal_backend_load(KVHAL_TEST_BUILD_ROOT "/tests/plugins_rt/libkvhal-badreason.so"),
                     KVHAL_LOAD_FAILED);
    kvhal_backend_module_info mi;
    const kvhal_backend_module_info *m = find_module("badreason", &mi);
    assert_non_null(m);
    assert_false(m->loaded);
    assert_true(strnlen(m->reason, sizeof m->reason) < sizeof m->reason);
    assert_non_null(strstr(m->reason, "init failed"));
    assert_non_null(strstr(m->reason, "xxxx"));
}

/* A module that sets some of the event slots but not all is refused at load, naming the first one missing: a core
 * that called event_record of a module without event_destroy would leak, one without event_query would crash. */
static void test_half_event_slots_refused(void **state)
{
    (void)state;
    assert_int_equal(kvhal_backend_load(KVHAL_TEST_BUILD_ROOT "/tests/plugins_rt/libkvhal-halfevents.so"),
                     KVHAL_LOAD_FAILED);
    kvhal_backend_module_info mi;
    const kvhal_backend_module_info *m = find_module("halfevents", &mi);
    assert_non_null(m);
    assert_false(m->loaded);
    assert_non_null(strstr(m->reason, "device.event_destroy (the event slots go together)"));
    kvhal_device dev;
    assert_int_not_equal(kvhal_device_parse("halfevents:0", &dev), KVHAL_OK);
}

static int copy_file(const char *from, const char *to, mode_t mode)
{
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    int ok = in && out;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok && chmod(to, mode) == 0 ? 0 : -1;
}

/* The hostile folder; 0 when made (KVHAL_TEST_HOSTILE=fifo,junk,perm picks parts: for runs against older trees). */
static int make_hostile_dir(void)
{
    const char *parts = getenv("KVHAL_TEST_HOSTILE");
    if (!parts) parts = "fifo,junk,perm";
    if (system("rm -rf '" HOSTILE_DIR "'") != 0 || mkdir(HOSTILE_DIR, 0755) != 0 ||
        chmod(HOSTILE_DIR, 0755) != 0)
        return -1;
    if (strstr(parts, "junk"))
        for (int i = 0; i < JUNK_FILES; i++) {
            char path[512];
            snprintf(path, sizeof path, HOSTILE_DIR "/libkvhal-aa%02d.so", i);
            FILE *f = fopen(path, "w");
            if (!f) return -1;
            fputs("not an ELF file\n", f);
            fclose(f);
        }
    if (strstr(parts, "fifo") && mkfifo(HOSTILE_DIR "/libkvhal-fifo.so", 0644) != 0) return -1;
    if (strstr(parts, "perm")) {
        if (copy_file(NPU_MODULE, HOSTILE_DIR "/libkvhal-groupwritable.so", 0775) != 0) return -1;
        if (mkdir(HOSTILE_DIR "/open", 0777) != 0 || chmod(HOSTILE_DIR "/open", 0777) != 0) return -1;
        if (copy_file(NPU_MODULE, HOSTILE_DIR "/open/libkvhal-inopenfolder.so", 0755) != 0) return -1;
    }
    /* a run limited to some backends (KVHAL_BACKENDS=cpu under valgrind) still discovers this folder's modules */
    const char *only = getenv("KVHAL_BACKENDS");
    if (only && *only) {
        static char list[4096];
        int n = snprintf(list, sizeof list, "%s,npu,fifo,groupwritable,inopenfolder", only);
        for (int i = 0; i < JUNK_FILES && n > 0 && (size_t)n < sizeof list; i++)
            n += snprintf(list + n, sizeof list - (size_t)n, ",aa%02d", i);
        if (setenv("KVHAL_BACKENDS", list, 1) != 0) return -1;
    }
    const char *old = getenv("KVHAL_BACKEND_PATH");
    static char path_env[8192];
    snprintf(path_env, sizeof path_env, "%s%s%s", HOSTILE_DIR, old && *old ? ":" : "", old ? old : "");
    return setenv("KVHAL_BACKEND_PATH", path_env, 1);
}

int main(void)
{
    if (make_hostile_dir() != 0) {
        fprintf(stderr, "cannot make %s\n", HOSTILE_DIR);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_d2_stale_prefix_handle_refused),
        cmocka_unit_test(test_d2_double_finish_suffix_refused),
        cmocka_unit_test(test_d2_double_finish_empty_match_refused),
        cmocka_unit_test(test_d2_destroyed_prefix_cache_and_manager_refused),
        cmocka_unit_test(test_d3_manager_prefix_destroy_refused),
        cmocka_unit_test(test_d9_refused_match_writes_nothing),
        cmocka_unit_test(test_d6_module_folder_fifo_and_junk),
        cmocka_unit_test(test_d1_unsafe_module_permissions_refused),
        cmocka_unit_test(test_d1_secure_execution_ignores_module_env),
        cmocka_unit_test(test_d6_unterminated_module_reason_bounded),
        cmocka_unit_test(test_half_event_slots_refused),
        cmocka_unit_test(test_d4_desc_destroy_reentry_terminates),
        cmocka_unit_test(test_d5_live_handle_table_shrinks),
        cmocka_unit_test(test_d7_span_bytes_does_not_wrap),
        cmocka_unit_test(test_d7_cpu_paged_caching_huge_head_dim_no_overflow),
        cmocka_unit_test(test_d8_concurrent_use_detected),
        cmocka_unit_test(test_d10_messages_cut_on_utf8_boundaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

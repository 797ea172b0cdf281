/* test_threads.c — concurrent caches on one device: threads that each own a paged cache, a static cache, a
 * contiguous cache and a cache manager work at the same time on cpu:0 (sharing the registry, the live-handle set
 * and one read-only input buffer), and every thread checks its own results. Run under TSan in CI. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

#define THREADS 8
#define HEADS 2
#define DIM 32
#define TOKENS 48

static const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
static kvhal_buffer *shared_in; /* [TOKENS, HEADS, DIM] f32, read by every thread */

typedef struct {
    int index;
    int errors;
    char what[256];
} worker;

#define EXPECT(w, cond, ...)                                                                                    \
    do {                                                                                                        \
        if (!(cond)) {                                                                                          \
            if (!(w)->errors) snprintf((w)->what, sizeof (w)->what, __VA_ARGS__);                               \
            (w)->errors++;                                                                                      \
            goto out;                                                                                           \
        }                                                                                                       \
    } while (0)

static float value(int t, int h, int d) { return (float)(t * 1000 + h * 100 + d); }

static void *run(void *arg)
{
    worker *w = arg;
    kvhal_paged_cache *pc = NULL;
    kvhal_static_cache *sc = NULL;
    kvhal_kv_cache *kv = NULL, *kv2 = NULL;
    kvhal_cache_manager *cm = NULL;
    kvhal_buffer *slots = NULL;
    for (int round = 0; round < 20; round++) {
        /* paged cache: every thread scatters the shared tokens to its own slot permutation */
        kvhal_paged_cache_config pcfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 2, .num_heads = HEADS, .head_dim = DIM, .block_size = 8,
                                         .dtype = KVHAL_F32, .layout = (round & 1) ? KVHAL_LAYOUT_HND : KVHAL_LAYOUT_NHD,
                                         .memory_budget = 2 * 2 * 8 * HEADS * DIM * 4 * 8, .device = cpu};
        EXPECT(w, kvhal_paged_cache_create(&pcfg, &pc) == KVHAL_OK, "paged create: %s", kvhal_last_error());
        int64_t capacity = kvhal_paged_cache_num_blocks(pc) * 8;
        int64_t sl[TOKENS];
        for (int t = 0; t < TOKENS; t++) sl[t] = (t * 7 + w->index + round) % capacity;
        EXPECT(w, kvhal_buffer_create(cpu, sizeof sl, &slots) == KVHAL_OK, "slots: %s", kvhal_last_error());
        EXPECT(w, kvhal_memcpy_h2d(slots, 0, sl, sizeof sl, NULL) == KVHAL_OK, "h2d: %s", kvhal_last_error());
        kvhal_tensor in, st, kc, vc;
        int64_t ishape[3] = {TOKENS, HEADS, DIM}, sshape[1] = {TOKENS};
        EXPECT(w, kvhal_tensor_make(shared_in, 0, KVHAL_F32, 3, ishape, NULL, &in) == KVHAL_OK, "in");
        EXPECT(w, kvhal_tensor_make(slots, 0, KVHAL_I64, 1, sshape, NULL, &st) == KVHAL_OK, "slots tensor");
        EXPECT(w, kvhal_paged_cache_update(pc, 1, &in, &in, &st, NULL) == KVHAL_OK, "update: %s", kvhal_last_error());
        EXPECT(w, kvhal_paged_cache_layer(pc, 1, &kc, &vc) == KVHAL_OK, "layer");
        const float *base = (const float *)((const char *)kvhal_buffer_native(kc.buffer) + kc.offset);
        for (int t = 0; t < TOKENS; t++)
            for (int h = 0; h < HEADS; h++)
                for (int d = 0; d < DIM; d += 7) {
                    int64_t s = sl[t], off = (s / 8) * kc.strides[0] + (s % 8) * kc.strides[1] + h * kc.strides[2] +
                                            d * kc.strides[3];
                    EXPECT(w, base[off] == value(t, h, d), "paged: token %d head %d dim %d", t, h, d);
                }
        kvhal_buffer_destroy(slots);
        slots = NULL;
        kvhal_paged_cache_destroy(pc);
        pc = NULL;

        /* static cache: history views after two updates */
        kvhal_static_cache_config scfg = {.struct_size = sizeof(kvhal_static_cache_config), .num_layers = 1, .batch = 1, .num_heads_k = HEADS, .num_heads_v = HEADS,
                                          .head_dim_k = DIM, .head_dim_v = DIM, .max_len = 2 * TOKENS,
                                          .dtype = KVHAL_F32, .device = cpu};
        EXPECT(w, kvhal_static_cache_create(&scfg, &sc) == KVHAL_OK, "static create: %s", kvhal_last_error());
        kvhal_tensor win, kh, vh;
        int64_t wshape[4] = {1, HEADS, TOKENS, DIM}, wstr[4] = {0, DIM, HEADS * DIM, 1};
        EXPECT(w, kvhal_tensor_make(shared_in, 0, KVHAL_F32, 4, wshape, wstr, &win) == KVHAL_OK, "window");
        EXPECT(w, kvhal_static_cache_update(sc, 0, &win, &win, 0, &kh, &vh, NULL) == KVHAL_OK, "static 1");
        EXPECT(w, kvhal_static_cache_update(sc, 0, &win, &win, TOKENS, &kh, &vh, NULL) == KVHAL_OK, "static 2");
        EXPECT(w, kh.shape[2] == 2 * TOKENS, "history length %lld", (long long)kh.shape[2]);
        const float *hb = (const float *)((const char *)kvhal_buffer_native(kh.buffer) + kh.offset);
        for (int t = 0; t < 2 * TOKENS; t += 5)
            EXPECT(w, hb[1 * kh.strides[1] + t * kh.strides[2] + 3] == value(t % TOKENS, 1, 3), "static t=%d", t);
        kvhal_static_cache_destroy(sc);
        sc = NULL;

        /* contiguous cache and its duplicate */
        kvhal_kv_cache_config kcfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = 2, .num_kv_heads = HEADS, .head_dim_k = DIM, .head_dim_v = DIM,
                                      .max_len = 64, .dtype = KVHAL_F16, .num_devices = 1, .devices = &cpu};
        EXPECT(w, kvhal_kv_cache_create(&kcfg, &kv) == KVHAL_OK, "kv create");
        kvhal_tensor k0, v0;
        EXPECT(w, kvhal_kv_cache_layer(kv, 0, 1, &k0, &v0) == KVHAL_OK, "kv layer");
        EXPECT(w, kvhal_memset(k0.buffer, k0.offset, w->index + 1, 16 * HEADS * DIM * 2, NULL) == KVHAL_OK, "memset");
        EXPECT(w, kvhal_kv_cache_duplicate(kv, 16, &kv2) == KVHAL_OK, "duplicate: %s", kvhal_last_error());
        kvhal_tensor k1, v1;
        EXPECT(w, kvhal_kv_cache_layer(kv2, 0, 1, &k1, &v1) == KVHAL_OK, "kv2 layer");
        const uint8_t *db = (const uint8_t *)kvhal_buffer_native(k1.buffer) + k1.offset;
        for (int i = 0; i < 16 * HEADS * DIM * 2; i += 61) EXPECT(w, db[i] == w->index + 1, "duplicate byte %d", i);
        kvhal_kv_cache_destroy(kv2);
        kv2 = NULL;
        kvhal_kv_cache_destroy(kv);
        kv = NULL;

        /* cache manager: a few requests sharing a prefix */
        EXPECT(w, kvhal_cache_manager_create(32, 4, KVHAL_PREFIX_RADIX, &cm) == KVHAL_OK, "manager");
        int32_t toks[40], pages[10], matched[10];
        for (int i = 0; i < 40; i++) toks[i] = i < 24 ? i : 1000 + w->index * 100 + round;
        for (int r = 0; r < 4; r++) {
            kvhal_prefix_handle h;
            size_t cached = 0;
            toks[39] = r;
            EXPECT(w, kvhal_cache_manager_match(cm, toks, 40, &h, &cached, matched, 10) == KVHAL_OK, "match");
            int32_t have = (int32_t)(cached / 4);
            memcpy(pages, matched, (size_t)have * sizeof(int32_t));
            EXPECT(w, kvhal_cache_manager_allocate(cm, 10 - have, pages + have) == KVHAL_OK, "allocate: %s",
                   kvhal_last_error());
            EXPECT(w, kvhal_cache_manager_cache_finished(cm, toks, 40, pages, h) == KVHAL_OK, "finished: %s",
                   kvhal_last_error());
            if (r > 0) EXPECT(w, cached >= 36, "request %d matched only %zu tokens", r, cached);
        }
        EXPECT(w, kvhal_cache_manager_check_integrity(cm) == KVHAL_OK, "integrity: %s", kvhal_last_error());
        kvhal_cache_manager_destroy(cm);
        cm = NULL;
    }
out:
    if (slots) kvhal_buffer_destroy(slots);
    if (pc) kvhal_paged_cache_destroy(pc);
    if (sc) kvhal_static_cache_destroy(sc);
    if (kv2) kvhal_kv_cache_destroy(kv2);
    if (kv) kvhal_kv_cache_destroy(kv);
    if (cm) kvhal_cache_manager_destroy(cm);
    return NULL;
}

static void test_concurrent_caches(void **state)
{
    (void)state;
    float host[TOKENS * HEADS * DIM];
    for (int t = 0; t < TOKENS; t++)
        for (int h = 0; h < HEADS; h++)
            for (int d = 0; d < DIM; d++) host[(t * HEADS + h) * DIM + d] = value(t, h, d);
    assert_int_equal(kvhal_buffer_create(cpu, sizeof host, &shared_in), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_h2d(shared_in, 0, host, sizeof host, NULL), KVHAL_OK);
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].index = i;
        assert_int_equal(pthread_create(&th[i], NULL, run, &w[i]), 0);
    }
    int errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        if (w[i].errors) print_error("thread %d: %s\n", i, w[i].what);
        errors += w[i].errors;
    }
    assert_int_equal(kvhal_buffer_destroy(shared_in), KVHAL_OK);
    assert_int_equal(errors, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent_caches)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_registry_threads.c — concurrent first use: eight threads released together make the very first kvhal calls of
 * the process (device count, buffer create, module list, default device), so backend discovery runs under contention
 * and everyone must see the same, complete registry. Then the live-handle set under concurrent create/destroy, and two
 * threads racing to destroy the same buffers: exactly one destroy of each succeeds. Also runs under TSan (suite
 * 'threads'). Outcomes are checked, never timings. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

/* cpu, cuda, hip, opencl: the built-in type ids 0-3 (kvhal.h has no public count). */
enum { BUILTIN_TYPES = KVHAL_DEVICE_OPENCL + 1 };

#define NTHREADS 8

#if defined(__SANITIZE_ADDRESS__)
#define KVHAL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVHAL_TEST_ASAN 1
#endif
#endif
#ifdef KVHAL_TEST_ASAN
/* Here a worker thread, not main, loads the OpenCL backend; PoCL's LLVM then installs a malloc'ed sigaltstack on that
 * thread, which ASan tries to munmap as its own when the thread exits ("unable to unmap" CHECK, abort). Not a kvhal
 * fault: keep ASan off the alternate signal stack in this one executable. ASAN_OPTIONS still overrides it. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "use_sigaltstack=0"; }
#endif

static const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};

typedef struct first_use {
    int index;
    pthread_barrier_t *start;
    /* results, checked by the main thread */
    kvhal_status st_count, st_create, st_h2d, st_d2h, st_destroy, st_modules, st_default, st_counts[BUILTIN_TYPES];
    int32_t cpu_count, module_count, counts[BUILTIN_TYPES];
    kvhal_device def;
    bool data_ok;
} first_use;

static void first_call(first_use *r)
{
    /* Each thread enters the library through a different door first. */
    switch (r->index % 4) {
    case 0: r->st_count = kvhal_device_count(KVHAL_DEVICE_CPU, &r->cpu_count); break;
    case 1: {
        kvhal_buffer *b = NULL;
        r->st_create = kvhal_buffer_create(cpu, 4096, &b);
        if (b) kvhal_buffer_destroy(b);
        break;
    }
    case 2: r->st_modules = kvhal_backend_module_count(&r->module_count); break;
    default: r->st_default = kvhal_device_default(&r->def); break;
    }
}

static void *first_use_thread(void *arg)
{
    first_use *r = arg;
    pthread_barrier_wait(r->start);
    first_call(r);
    /* Then everything, so all threads' views can be compared. */
    r->st_count = kvhal_device_count(KVHAL_DEVICE_CPU, &r->cpu_count);
    for (int t = 0; t < BUILTIN_TYPES; t++)
        r->st_counts[t] = kvhal_device_count((kvhal_device_type)t, &r->counts[t]);
    r->st_modules = kvhal_backend_module_count(&r->module_count);
    r->st_default = kvhal_device_default(&r->def);
    kvhal_buffer *b = NULL;
    r->st_create = kvhal_buffer_create(cpu, 4096 + (size_t)r->index, &b);
    uint8_t src[256], back[256];
    for (int i = 0; i < 256; i++) src[i] = (uint8_t)(i * 7 + r->index);
    memset(back, 0, sizeof back);
    r->st_h2d = b ? kvhal_memcpy_h2d(b, (size_t)r->index, src, sizeof src, NULL) : KVHAL_INTERNAL;
    r->st_d2h = b ? kvhal_memcpy_d2h(back, b, (size_t)r->index, sizeof back, NULL) : KVHAL_INTERNAL;
    r->data_ok = !memcmp(src, back, sizeof src);
    r->st_destroy = b ? kvhal_buffer_destroy(b) : KVHAL_INTERNAL;
    return NULL;
}

static void test_concurrent_first_use(void **state)
{
    (void)state;
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, NTHREADS);
    pthread_t th[NTHREADS];
    first_use r[NTHREADS];
    memset(r, 0, sizeof r);
    for (int i = 0; i < NTHREADS; i++) {
        r[i].index = i;
        r[i].start = &start;
        assert_int_equal(pthread_create(&th[i], NULL, first_use_thread, &r[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);

    /* The main thread's view, after the fact, is the reference. */
    int32_t modules;
    assert_int_equal(kvhal_backend_module_count(&modules), KVHAL_OK);
    int32_t counts[BUILTIN_TYPES];
    for (int t = 0; t < BUILTIN_TYPES; t++)
        assert_int_equal(kvhal_device_count((kvhal_device_type)t, &counts[t]), KVHAL_OK);
    assert_int_equal(counts[KVHAL_DEVICE_CPU], 1);
    for (int i = 0; i < NTHREADS; i++) {
        assert_int_equal(r[i].st_count, KVHAL_OK);
        assert_int_equal(r[i].cpu_count, 1);
        for (int t = 0; t < BUILTIN_TYPES; t++) {
            assert_int_equal(r[i].st_counts[t], KVHAL_OK);
            assert_int_equal(r[i].counts[t], counts[t]);
        }
        assert_int_equal(r[i].st_modules, KVHAL_OK);
        assert_int_equal(r[i].module_count, modules);
        assert_int_equal(r[i].st_default, KVHAL_OK);
        assert_int_equal(r[i].def.type, KVHAL_DEVICE_CPU);
        assert_int_equal(r[i].def.id, 0);
        assert_int_equal(r[i].st_create, KVHAL_OK);
        assert_int_equal(r[i].st_h2d, KVHAL_OK);
        assert_int_equal(r[i].st_d2h, KVHAL_OK);
        assert_true(r[i].data_ok);
        assert_int_equal(r[i].st_destroy, KVHAL_OK);
    }
}

/* ---- the live-handle set under load ---- */
#define ROUNDS 300
#define HELD 24

typedef struct churn {
    int index;
    int failures;
    char first_failure[256];
} churn;

static void churn_fail(churn *c, const char *what)
{
    if (c->failures++ == 0) snprintf(c->first_failure, sizeof c->first_failure, "%s: %s", what, kvhal_last_error());
}

static void *churn_thread(void *arg)
{
    churn *c = arg;
    kvhal_buffer *held[HELD] = {NULL};
    for (int r = 0; r < ROUNDS; r++) {
        int slot = r % HELD;
        if (held[slot]) {
            /* The byte written when the buffer was created is still ours. */
            uint8_t v = 0;
            if (kvhal_memcpy_d2h(&v, held[slot], 0, 1, NULL) != KVHAL_OK) churn_fail(c, "d2h");
            if (v != (uint8_t)(c->index * 31 + slot)) churn_fail(c, "content changed under another thread");
            /* (No double destroy here: another thread may already own a new buffer at the same address.) */
            if (kvhal_buffer_destroy(held[slot]) != KVHAL_OK) churn_fail(c, "destroy");
            held[slot] = NULL;
        }
        if (kvhal_buffer_create(cpu, 1 + (size_t)r, &held[slot]) != KVHAL_OK) {
            churn_fail(c, "create");
            continue;
        }
        uint8_t v = (uint8_t)(c->index * 31 + slot);
        if (kvhal_memcpy_h2d(held[slot], 0, &v, 1, NULL) != KVHAL_OK) churn_fail(c, "h2d");
        kvhal_stream *s;
        if (kvhal_stream_create(cpu, &s) != KVHAL_OK) {
            churn_fail(c, "stream create");
            continue;
        }
        if (kvhal_stream_synchronize(s) != KVHAL_OK) churn_fail(c, "stream synchronize");
        if (kvhal_stream_destroy(s) != KVHAL_OK) churn_fail(c, "stream destroy");
    }
    for (int i = 0; i < HELD; i++)
        if (held[i] && kvhal_buffer_destroy(held[i]) != KVHAL_OK) churn_fail(c, "final destroy");
    return NULL;
}

static void test_concurrent_create_destroy(void **state)
{
    (void)state;
    pthread_t th[NTHREADS];
    churn c[NTHREADS];
    memset(c, 0, sizeof c);
    for (int i = 0; i < NTHREADS; i++) {
        c[i].index = i;
        assert_int_equal(pthread_create(&th[i], NULL, churn_thread, &c[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++)
        if (c[i].failures) fail_msg("thread %d: %d failures, first: %s", i, c[i].failures, c[i].first_failure);
}

/* Two threads destroy the same buffers in the same order: each buffer is destroyed exactly once. */
#define RACED 500
typedef struct racer {
    kvhal_buffer **bufs;
    pthread_barrier_t *start;
    int ok, invalid, other;
} racer;

static void *racer_thread(void *arg)
{
    racer *r = arg;
    pthread_barrier_wait(r->start);
    for (int i = 0; i < RACED; i++) {
        kvhal_status st = kvhal_buffer_destroy(r->bufs[i]);
        if (st == KVHAL_OK) r->ok++;
        else if (st == KVHAL_INVALID_HANDLE) r->invalid++;
        else r->other++;
    }
    return NULL;
}

static void test_racing_destroy(void **state)
{
    (void)state;
    kvhal_buffer **bufs = calloc(RACED, sizeof *bufs);
    assert_non_null(bufs);
    for (int i = 0; i < RACED; i++) assert_int_equal(kvhal_buffer_create(cpu, 64, &bufs[i]), KVHAL_OK);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    racer r[2] = {{bufs, &start, 0, 0, 0}, {bufs, &start, 0, 0, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, racer_thread, &r[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    assert_int_equal(r[0].other + r[1].other, 0);
    assert_int_equal(r[0].ok + r[1].ok, RACED);
    assert_int_equal(r[0].invalid + r[1].invalid, RACED);
    free(bufs);
}

int main(void)
{
    /* No kvhal call may come before the first test: it is the concurrent first use. */
    unsetenv("KVHAL_DEVICE");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_first_use),
        cmocka_unit_test(test_concurrent_create_destroy),
        cmocka_unit_test(test_racing_destroy),
    };
    return cmocka_run_group_tests_name("registry_threads", tests, NULL, NULL);
}

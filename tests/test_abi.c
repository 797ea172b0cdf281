/* test_abi.c — the release-grade ABI pieces: the library's version against the header's macros and the project's
 * version; the extensible config structs (struct_size: what the initialisers set, what the library accepts and
 * what it refuses, naming the field); and the log callback (kvhal_log_set: which messages reach it, with which
 * level, and that removing it restores the default). */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

#ifndef KVHAL_PROJECT_VERSION
#error "tests/meson.build passes the project's version as KVHAL_PROJECT_VERSION"
#endif

typedef struct log_record {
    int calls;
    kvhal_log_level level;
    char message[1024];
    void *user;
} log_record;

static void record(kvhal_log_level level, const char *message, void *user)
{
    log_record *r = user;
    r->calls++;
    r->level = level;
    r->user = user;
    snprintf(r->message, sizeof r->message, "%s", message);
}

/* First test of the process: the descriptor cache reads KVHAL_DESC_CACHE_CAPACITY once, on first use, and warns
 * about a bad value; with a callback installed and KVHAL_LOG unset, warnings reach the callback. */
static void test_log_callback_gets_warnings(void **state)
{
    (void)state;
    unsetenv("KVHAL_LOG");
    setenv("KVHAL_DESC_CACHE_CAPACITY", "many", 1);
    log_record r = {0};
    assert_int_equal(kvhal_log_set(record, &r), KVHAL_OK);
    size_t cap = 0;
    kvhal_op_kind op;
    assert_int_equal(kvhal_desc_op_find("paged_caching", &op), KVHAL_OK);
    assert_int_equal(kvhal_desc_cache_get_capacity(op, &cap), KVHAL_OK);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.level, KVHAL_LOG_WARN);
    assert_ptr_equal(r.user, &r);
    assert_non_null(strstr(r.message, "KVHAL_DESC_CACHE_CAPACITY: 'many'"));
    /* Error messages are logged at debug level: not delivered unless KVHAL_LOG asks. */
    kvhal_device d;
    assert_int_equal(kvhal_device_parse("no_such_type:0", &d), KVHAL_PARSE_ERROR);
    assert_int_equal(r.calls, 1);
    assert_int_equal(kvhal_log_set(NULL, NULL), KVHAL_OK);
    unsetenv("KVHAL_DESC_CACHE_CAPACITY");
}

static void test_log_callback_follows_kvhal_log(void **state)
{
    (void)state;
    log_record r = {0};
    assert_int_equal(kvhal_log_set(record, &r), KVHAL_OK);
    setenv("KVHAL_LOG", "debug", 1);
    kvhal_device d;
    assert_int_equal(kvhal_device_parse("no_such_type:0", &d), KVHAL_PARSE_ERROR);
    assert_int_equal(r.calls, 1);
    assert_int_equal(r.level, KVHAL_LOG_DEBUG);
    assert_string_equal(r.message, kvhal_last_error()); /* the debug log carries each error message */
    setenv("KVHAL_LOG", "error", 1);
    assert_int_equal(kvhal_device_parse("no_such_type:0", &d), KVHAL_PARSE_ERROR);
    assert_int_equal(r.calls, 1);
    /* Removed: nothing reaches it any more (the default, stderr when KVHAL_LOG asks, takes over). */
    assert_int_equal(kvhal_log_set(NULL, &r), KVHAL_OK);
    setenv("KVHAL_LOG", "debug", 1);
    assert_int_equal(kvhal_device_parse("no_such_type:0", &d), KVHAL_PARSE_ERROR);
    assert_int_equal(r.calls, 1);
    unsetenv("KVHAL_LOG");
}

/* Threads log (each failing call logs its message at debug level) while the main thread swaps the callback and its
 * user pointer: every message reaches one of the two callbacks whole, with that callback's own user pointer (TSan
 * runs this in CI's threads stage). */
static atomic_int swaps_done;
static atomic_long delivered[2];
static void counter(kvhal_log_level level, const char *message, void *user)
{
    (void)level;
    long *which = user;
    if (!strstr(message, "no_such_type")) abort(); /* a torn or foreign message */
    atomic_fetch_add(&delivered[which == (long *)&delivered[1]], 1);
}
static void *log_thread(void *arg)
{
    (void)arg;
    kvhal_device d;
    while (!atomic_load(&swaps_done)) (void)kvhal_device_parse("no_such_type:1", &d);
    return NULL;
}
static void test_log_callback_threads(void **state)
{
    (void)state;
    setenv("KVHAL_LOG", "debug", 1);
    atomic_store(&swaps_done, 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&th[i], NULL, log_thread, NULL), 0);
    /* swap until both callbacks got messages and 2000 were delivered (bounded: the loggers always progress) */
    for (long i = 0; i < 100000000; i++) {
        assert_int_equal(kvhal_log_set(counter, (void *)&delivered[i & 1]), KVHAL_OK);
        if (atomic_load(&delivered[0]) > 0 && atomic_load(&delivered[1]) > 0 &&
            atomic_load(&delivered[0]) + atomic_load(&delivered[1]) >= 2000) break;
    }
    atomic_store(&swaps_done, 1);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    assert_int_equal(kvhal_log_set(NULL, NULL), KVHAL_OK);
    unsetenv("KVHAL_LOG");
    assert_true(atomic_load(&delivered[0]) > 0 && atomic_load(&delivered[1]) > 0);
}

static void test_version(void **state)
{
    (void)state;
    assert_non_null(kvhal_version());
    assert_string_equal(kvhal_version(), KVHAL_PROJECT_VERSION);
    assert_string_equal(KVHAL_VERSION_STRING, KVHAL_PROJECT_VERSION);
    char built[32];
    snprintf(built, sizeof built, "%d.%d.%d", KVHAL_VERSION_MAJOR, KVHAL_VERSION_MINOR, KVHAL_VERSION_PATCH);
    assert_string_equal(built, KVHAL_PROJECT_VERSION);
    assert_int_equal(KVHAL_VERSION_NUMBER,
                     KVHAL_VERSION_MAJOR * 10000 + KVHAL_VERSION_MINOR * 100 + KVHAL_VERSION_PATCH);
}

/* The initialisers set struct_size to the caller's sizeof and everything else to zero. */
static void test_config_initialisers(void **state)
{
    (void)state;
    kvhal_paged_cache_config p = KVHAL_PAGED_CACHE_CONFIG_INIT, pf;
    kvhal_static_cache_config s = KVHAL_STATIC_CACHE_CONFIG_INIT, sf;
    kvhal_kv_cache_config k = KVHAL_KV_CACHE_CONFIG_INIT, kf;
    memset(&pf, 0xff, sizeof pf);
    memset(&sf, 0xff, sizeof sf);
    memset(&kf, 0xff, sizeof kf);
    kvhal_paged_cache_config_init(&pf);
    kvhal_static_cache_config_init(&sf);
    kvhal_kv_cache_config_init(&kf);
    assert_int_equal(p.struct_size, sizeof p);
    assert_int_equal(s.struct_size, sizeof s);
    assert_int_equal(k.struct_size, sizeof k);
    assert_int_equal(pf.struct_size, sizeof pf);
    assert_int_equal(pf.num_layers, 0);
    assert_int_equal(pf.memory_budget, 0);
    assert_int_equal(sf.max_len, 0);
    assert_null(kf.devices);
}

static void expect_size_refused(kvhal_status st, const char *want)
{
    assert_int_equal(st, KVHAL_INVALID_ARGUMENT);
    if (!strstr(kvhal_last_error(), want)) fail_msg("message '%s' lacks '%s'", kvhal_last_error(), want);
}

/* Each create takes exactly the sizes it knows (one so far), names struct_size and the initialiser otherwise,
 * and leaves *out NULL. */
static void test_config_sizes(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache_config p = KVHAL_PAGED_CACHE_CONFIG_INIT;
    p.num_layers = 1, p.num_heads = 1, p.head_dim = 8, p.block_size = 4, p.dtype = KVHAL_F32;
    p.memory_budget = 1 << 16, p.device = cpu;
    kvhal_paged_cache *pc = (kvhal_paged_cache *)&p;
    assert_int_equal(kvhal_paged_cache_create(&p, &pc), KVHAL_OK);
    assert_int_equal(kvhal_paged_cache_destroy(pc), KVHAL_OK);
    const size_t bad[] = {0, sizeof p - 1, sizeof(size_t), sizeof p + 8, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.struct_size = bad[i];
        pc = (kvhal_paged_cache *)&p;
        expect_size_refused(kvhal_paged_cache_create(&p, &pc), "cfg->struct_size");
        assert_null(pc);
        assert_non_null(strstr(kvhal_last_error(), "KVHAL_PAGED_CACHE_CONFIG_INIT"));
    }
    p.struct_size = sizeof p + 8;
    expect_size_refused(kvhal_paged_cache_create(&p, &pc), "newer kvhal");

    kvhal_static_cache_config s = KVHAL_STATIC_CACHE_CONFIG_INIT;
    s.num_layers = 1, s.batch = 1, s.num_heads_k = s.num_heads_v = 1, s.head_dim_k = s.head_dim_v = 4;
    s.max_len = 8, s.dtype = KVHAL_F32, s.device = cpu;
    kvhal_static_cache *sc = NULL;
    assert_int_equal(kvhal_static_cache_create(&s, &sc), KVHAL_OK);
    assert_int_equal(kvhal_static_cache_destroy(sc), KVHAL_OK);
    s.struct_size = 0;
    expect_size_refused(kvhal_static_cache_create(&s, &sc), "KVHAL_STATIC_CACHE_CONFIG_INIT");
    assert_null(sc);

    kvhal_kv_cache_config k = KVHAL_KV_CACHE_CONFIG_INIT;
    k.num_layers = 1, k.num_kv_heads = 1, k.head_dim_k = k.head_dim_v = 4, k.max_len = 8, k.dtype = KVHAL_F32;
    k.num_devices = 1, k.devices = &cpu;
    kvhal_kv_cache *kc = NULL;
    assert_int_equal(kvhal_kv_cache_create(&k, &kc), KVHAL_OK);
    /* duplicate makes its own config from the source's: no struct_size of the caller's involved */
    kvhal_kv_cache *dup = NULL;
    assert_int_equal(kvhal_kv_cache_duplicate(kc, 4, &dup), KVHAL_OK);
    assert_int_equal(kvhal_kv_cache_destroy(dup), KVHAL_OK);
    assert_int_equal(kvhal_kv_cache_destroy(kc), KVHAL_OK);
    k.struct_size = sizeof k - sizeof(void *);
    kc = NULL;
    expect_size_refused(kvhal_kv_cache_create(&k, &kc), "KVHAL_KV_CACHE_CONFIG_INIT");
    assert_null(kc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_callback_gets_warnings), /* first: the descriptor cache reads its env once */
        cmocka_unit_test(test_log_callback_follows_kvhal_log),
        cmocka_unit_test(test_log_callback_threads),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_config_initialisers),
        cmocka_unit_test(test_config_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_registry.c — backend discovery with broken modules present: a module built for another ABI, one without the
 * entry symbol, one whose table lacks a required entry, and one whose init fails (tests/bad_plugins) are each listed,
 * not loaded, with a reason that says why, and never serve a device; the built-in cpu backend still works. Devices of
 * an unknown type, of a backend that is not loaded, or with an id out of range give errors, never a crash. White-box:
 * also checks the internal lookup. KVHAL_BACKEND_PATH is set to the test modules' folder before the first kvhal call
 * (discovery runs once per process). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "kvhal.h"

#ifndef KVHAL_TEST_BUILD_ROOT
#error "KVHAL_TEST_BUILD_ROOT must name the build folder"
#endif
#define BAD_PLUGIN_DIR KVHAL_TEST_BUILD_ROOT "/tests"

static void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

static int32_t module_count(void)
{
    int32_t n = -1;
    assert_int_equal(kvhal_backend_module_count(&n), KVHAL_OK);
    assert_true(n >= 1);
    return n;
}

/* The module named name (the file's libkvhal-<name>.so or its table's name); fails the test if absent. */
static kvhal_backend_module_info find_module(const char *name)
{
    int32_t n = module_count();
    for (int32_t i = 0; i < n; i++) {
        kvhal_backend_module_info mi;
        assert_int_equal(kvhal_backend_module_get(i, &mi), KVHAL_OK);
        if (!strcmp(mi.name, name)) return mi;
    }
    fail_msg("module \"%s\" is not listed (is %s/libkvhal-%s.so built?)", name, BAD_PLUGIN_DIR, name);
    kvhal_backend_module_info none;
    memset(&none, 0, sizeof none);
    return none;
}

static void check_bad_module(const char *name, const char *reason_part)
{
    kvhal_backend_module_info mi = find_module(name);
    assert_false(mi.loaded);
    assert_int_equal(mi.device_count, 0);
    assert_contains(mi.reason, reason_part);
    char want_path[1100];
    snprintf(want_path, sizeof want_path, "%s/libkvhal-%s.so", BAD_PLUGIN_DIR, name);
    assert_string_equal(mi.path, want_path);
}

static void test_cpu_builtin(void **state)
{
    (void)state;
    kvhal_backend_module_info mi;
    assert_int_equal(kvhal_backend_module_get(0, &mi), KVHAL_OK);
    assert_string_equal(mi.name, "cpu");
    assert_string_equal(mi.path, "(built in)");
    assert_true(mi.loaded);
    assert_int_equal(mi.abi_version, KVHAL_BACKEND_ABI_VERSION);
    assert_int_equal(mi.device_count, 1);
    int32_t n;
    assert_int_equal(kvhal_device_count(KVHAL_DEVICE_CPU, &n), KVHAL_OK);
    assert_int_equal(n, 1);
    /* And it serves buffers despite the broken modules around it. */
    kvhal_buffer *b;
    assert_int_equal(kvhal_buffer_create((kvhal_device){KVHAL_DEVICE_CPU, 0}, 100, &b), KVHAL_OK);
    const char msg[] = "registry";
    char back[sizeof msg];
    assert_int_equal(kvhal_memcpy_h2d(b, 50, msg, sizeof msg, NULL), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_d2h(back, b, 50, sizeof msg, NULL), KVHAL_OK);
    assert_string_equal(back, msg);
    assert_int_equal(kvhal_buffer_destroy(b), KVHAL_OK);
}

static void test_wrong_abi(void **state)
{
    (void)state;
    check_bad_module("wrongabi", "ABI version");
    kvhal_backend_module_info mi = find_module("wrongabi");
    assert_int_equal(mi.abi_version, KVHAL_BACKEND_ABI_VERSION + 1);
    char v[16];
    snprintf(v, sizeof v, "%d", KVHAL_BACKEND_ABI_VERSION + 1);
    assert_contains(mi.reason, v);
}

static void test_no_entry(void **state)
{
    (void)state;
    check_bad_module("noentry", "no 'kvhal_backend_entry'");
    assert_int_equal(find_module("noentry").abi_version, 0);
}

static void test_missing_required(void **state)
{
    (void)state;
    check_bad_module("missingreq", "required entry 'buffer_alloc'");
}

static void test_init_fails(void **state)
{
    (void)state;
    check_bad_module("initfail", "init failed");
    kvhal_backend_module_info mi = find_module("initfail");
    assert_contains(mi.reason, "simulated driver failure"); /* the module's own words */
    assert_contains(mi.reason, "KVHAL_BACKEND_ERROR");
}

/* A device type's count comes from the module that serves it, if any; never from a refused module (missingreq claims
 * 4 cuda devices, initfail 3 hip devices). */
static void test_counts_come_from_loaded_modules(void **state)
{
    (void)state;
    int32_t n = module_count();
    int32_t served[KVHAL_DEVICE_TYPE_COUNT] = {0};
    bool loaded_type[KVHAL_DEVICE_TYPE_COUNT] = {false};
    for (int32_t i = 0; i < n; i++) {
        kvhal_backend_module_info mi;
        assert_int_equal(kvhal_backend_module_get(i, &mi), KVHAL_OK);
        assert_non_null(memchr(mi.name, '\0', sizeof mi.name));
        assert_non_null(memchr(mi.path, '\0', sizeof mi.path));
        assert_non_null(memchr(mi.reason, '\0', sizeof mi.reason));
        /* Each file is listed once. */
        for (int32_t j = 0; j < i; j++) {
            kvhal_backend_module_info mj;
            assert_int_equal(kvhal_backend_module_get(j, &mj), KVHAL_OK);
            assert_string_not_equal(mi.path, mj.path);
        }
        if (!mi.loaded) {
            if (!mi.reason[0]) fail_msg("module %s (%s) is not loaded and gives no reason", mi.name, mi.path);
            assert_int_equal(mi.device_count, 0);
            continue;
        }
        kvhal_device d;
        if (kvhal_device_parse(mi.name, &d) != KVHAL_OK)
            fail_msg("loaded module \"%s\" is not named after a device type", mi.name);
        assert_false(loaded_type[d.type]); /* one module per type */
        loaded_type[d.type] = true;
        served[d.type] = mi.device_count;
        assert_in_range(mi.abi_version, KVHAL_BACKEND_ABI_MIN, KVHAL_BACKEND_ABI_VERSION);
        assert_in_range(mi.device_count, 0, KVHAL_MAX_DEVICES_PER_TYPE);
    }
    for (int t = 0; t < KVHAL_DEVICE_TYPE_COUNT; t++) {
        int32_t c = -1;
        assert_int_equal(kvhal_device_count((kvhal_device_type)t, &c), KVHAL_OK);
        assert_int_equal(c, served[t]);
    }
    assert_true(loaded_type[KVHAL_DEVICE_CPU]);
}

static void test_module_get_errors(void **state)
{
    (void)state;
    int32_t n = module_count();
    kvhal_backend_module_info mi;
    const int32_t bad[] = {-1, n, n + 1, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kvhal_backend_module_get(bad[i], &mi), KVHAL_OUT_OF_RANGE);
        assert_contains(kvhal_last_error(), "index");
    }
    assert_int_equal(kvhal_backend_module_get(0, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_backend_module_count(NULL), KVHAL_INVALID_ARGUMENT);
}

/* Every entry point that takes a device, on devices nobody serves. */
static void check_unserved(kvhal_device d, kvhal_status want)
{
    char what[64];
    snprintf(what, sizeof what, "{%d, %d}", (int)d.type, d.id);
    kvhal_status st;
#define EXPECT(call)                                                                                            \
    do {                                                                                                        \
        kvhal_clear_error();                                                                                    \
        st = (call);                                                                                            \
        if (st != want) fail_msg("%s on %s: %s, expected %s (%s)", #call, what, kvhal_status_name(st),         \
                                 kvhal_status_name(want), kvhal_last_error());                                  \
        if (!kvhal_last_error()[0]) fail_msg("%s on %s: no message", #call, what);                             \
    } while (0)
    kvhal_buffer *b = (kvhal_buffer *)&b;
    EXPECT(kvhal_buffer_create(d, 64, &b));
    assert_null(b);
    uint8_t host[8];
    b = (kvhal_buffer *)&b;
    EXPECT(kvhal_buffer_wrap(d, host, sizeof host, &b));
    assert_null(b);
    kvhal_stream *s = (kvhal_stream *)&s;
    EXPECT(kvhal_stream_create(d, &s));
    assert_null(s);
    EXPECT(kvhal_device_synchronize(d));
    EXPECT(kvhal_device_check_errors(d));
    kvhal_device_info info;
    EXPECT(kvhal_device_get_info(d, &info));
#undef EXPECT
    /* The internal lookup: NULL, with the caller's argument name in the message. */
    assert_null(kvhal__backend(d));
    const kvhal_backend *bk = (const kvhal_backend *)&bk;
    assert_int_equal(kvhal__lookup(d, "some_arg", &bk), want);
    assert_null(bk);
    assert_contains(kvhal_last_error(), "some_arg");
}

static void test_unserved_devices(void **state)
{
    (void)state;
    int32_t counts[KVHAL_DEVICE_TYPE_COUNT];
    for (int t = 0; t < KVHAL_DEVICE_TYPE_COUNT; t++)
        assert_int_equal(kvhal_device_count((kvhal_device_type)t, &counts[t]), KVHAL_OK);

    check_unserved((kvhal_device){(kvhal_device_type)99, 0}, KVHAL_INVALID_ARGUMENT);
    check_unserved((kvhal_device){(kvhal_device_type)-1, 0}, KVHAL_INVALID_ARGUMENT);
    check_unserved((kvhal_device){KVHAL_DEVICE_TYPE_COUNT, 0}, KVHAL_INVALID_ARGUMENT);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, 1}, KVHAL_NO_DEVICE);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, -1}, KVHAL_NO_DEVICE);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, INT32_MAX}, KVHAL_NO_DEVICE);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, INT32_MIN}, KVHAL_NO_DEVICE);
    for (int t = 1; t < KVHAL_DEVICE_TYPE_COUNT; t++) {
        int32_t ids[] = {counts[t], 5, KVHAL_MAX_DEVICES_PER_TYPE, -1};
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
            if (ids[i] >= 0 && ids[i] < counts[t]) continue; /* a real device on this machine */
            kvhal_backend_module_info mi;
            bool served = false;
            int32_t n = module_count();
            for (int32_t m = 0; m < n; m++) {
                assert_int_equal(kvhal_backend_module_get(m, &mi), KVHAL_OK);
                if (mi.loaded && !strcmp(mi.name, kvhal_device_type_name((kvhal_device_type)t))) served = true;
            }
            check_unserved((kvhal_device){(kvhal_device_type)t, ids[i]},
                           served ? KVHAL_NO_DEVICE : KVHAL_BACKEND_UNAVAILABLE);
        }
    }
}

static void test_lookup_present(void **state)
{
    (void)state;
    const kvhal_backend *bk = kvhal__backend((kvhal_device){KVHAL_DEVICE_CPU, 0});
    assert_non_null(bk);
    assert_string_equal(bk->name, "cpu");
    assert_int_equal(bk->type, KVHAL_DEVICE_CPU);
    assert_non_null(bk->buffer_alloc);
    /* The same table for every id of a type: lookups are by (type, id) but share the module. */
    for (int t = 0; t < KVHAL_DEVICE_TYPE_COUNT; t++) {
        int32_t n;
        assert_int_equal(kvhal_device_count((kvhal_device_type)t, &n), KVHAL_OK);
        const kvhal_backend *first = NULL;
        for (int32_t id = 0; id < n; id++) {
            const kvhal_backend *b = NULL;
            assert_int_equal(kvhal__lookup((kvhal_device){(kvhal_device_type)t, id}, "dev", &b), KVHAL_OK);
            assert_non_null(b);
            assert_int_equal(b->type, t);
            if (!first) first = b;
            assert_ptr_equal(b, first);
        }
    }
}

int main(void)
{
    /* Before any kvhal call: discovery reads these once. KVHAL_BACKEND_PATH points at the test modules; a
     * KVHAL_BACKENDS filter (valgrind runs limit modules to cpu) must still let them be tried. */
    if (setenv("KVHAL_BACKEND_PATH", BAD_PLUGIN_DIR, 1) != 0) return 1;
    const char *only = getenv("KVHAL_BACKENDS");
    if (only && *only) {
        char list[512];
        snprintf(list, sizeof list, "%s,wrongabi,noentry,missingreq,initfail", only);
        if (setenv("KVHAL_BACKENDS", list, 1) != 0) return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_builtin),
        cmocka_unit_test(test_wrong_abi),
        cmocka_unit_test(test_no_entry),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_init_fails),
        cmocka_unit_test(test_counts_come_from_loaded_modules),
        cmocka_unit_test(test_module_get_errors),
        cmocka_unit_test(test_unserved_devices),
        cmocka_unit_test(test_lookup_present),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}

/* test_registry.c — backend discovery with test modules present (tests/plugins): modules built for a future ABI and
 * for ABI 1, one without the entry symbol, one whose table lacks a required entry, one whose init fails, six with
 * invalid device-type names and a second module for a taken name are each listed, not loaded, with a reason that says
 * why, and never serve a device; the built-in cpu backend still works. Vendor types by name: a module's type is
 * parsed, formatted and counted like a built-in one, its supports() refusal reaches the caller, its extras come
 * through get_proc_address, a type named in KVHAL_DEVICE works once kvhal_backend_load loaded its module, and type
 * ids stop at KVHAL_MAX_DEVICE_TYPES. Devices of
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

/* cpu, cuda, hip, opencl: the built-in type ids 0-3 (kvhal.h has no public count). */
enum { BUILTIN_TYPES = KVHAL_DEVICE_OPENCL + 1 };

#ifndef KVHAL_TEST_BUILD_ROOT
#error "KVHAL_TEST_BUILD_ROOT must name the build folder"
#endif
#define BAD_PLUGIN_DIR KVHAL_TEST_BUILD_ROOT "/tests/plugins"
#define RT_PLUGIN_DIR KVHAL_TEST_BUILD_ROOT "/tests/plugins_rt"

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
    char v[32];
    snprintf(v, sizeof v, "built for plugin ABI %d", KVHAL_BACKEND_ABI_VERSION + 1);
    assert_contains(mi.reason, v);
    assert_contains(mi.reason, "newer kvhal");
}

/* A version-1 module (the table before device types had names) is refused with both versions named. */
static void test_abi_v1(void **state)
{
    (void)state;
    check_bad_module("abiv1", "built for plugin ABI 1");
    kvhal_backend_module_info mi = find_module("abiv1");
    char v[32];
    snprintf(v, sizeof v, "this core takes ABI %d", KVHAL_BACKEND_ABI_VERSION);
    assert_contains(mi.reason, v);
    assert_contains(mi.reason, "rebuild");
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
    check_bad_module("missingreq", "required entry 'device.buffer_alloc'");
}

static void test_init_fails(void **state)
{
    (void)state;
    check_bad_module("initfail", "init failed");
    kvhal_backend_module_info mi = find_module("initfail");
    assert_contains(mi.reason, "simulated driver failure"); /* the module's own words */
    assert_contains(mi.reason, "KVHAL_BACKEND_ERROR");
}

/* Two modules serving one name: the first (in name order) wins, the second is listed with the winner's path. */
static void test_duplicate_type_name(void **state)
{
    (void)state;
    kvhal_backend_module_info a = find_module("tpa1"), b = find_module("tpa2");
    assert_true(a.loaded);
    assert_string_equal(a.device_type, "tpa");
    assert_true(a.type_id >= BUILTIN_TYPES && a.type_id < KVHAL_MAX_DEVICE_TYPES);
    check_bad_module("tpa2", "tpa devices are already served by");
    assert_contains(b.reason, a.path);
    assert_int_equal(b.type_id, -1);
    kvhal_device_type t;
    assert_int_equal(kvhal_device_type_find("tpa", &t), KVHAL_OK);
    assert_int_equal((int)t, a.type_id);
    assert_string_equal(kvhal_device_type_name(t), "tpa");
    int32_t n = 0;
    assert_int_equal(kvhal_device_count(t, &n), KVHAL_OK);
    assert_int_equal(n, 2); /* tpa1's, not tpa2's 5 */
    kvhal_device d;
    assert_int_equal(kvhal_device_parse("tpa:1", &d), KVHAL_OK);
    assert_int_equal(d.type, t);
    assert_int_equal(d.id, 1);
    char text[32];
    assert_int_equal(kvhal_device_format(d, text, sizeof text), KVHAL_OK);
    assert_string_equal(text, "tpa:1");
    kvhal_device_info info;
    assert_int_equal(kvhal_device_get_info(d, &info), KVHAL_OK);
    assert_string_equal(info.backend, "tpa");
    assert_int_equal(kvhal_device_synchronize((kvhal_device){t, 2}), KVHAL_NO_DEVICE);
}

static void test_invalid_type_names(void **state)
{
    (void)state;
    check_bad_module("badupper", "does not start with a lowercase letter");
    check_bad_module("baddigit", "does not start with a lowercase letter");
    check_bad_module("badempty", "empty");
    check_bad_module("badnull", "NULL");
    check_bad_module("baddash", "not a lowercase identifier");
    check_bad_module("badlong", "longer than 15 characters");
    kvhal_device_type t;
    assert_int_equal(kvhal_device_type_find("Npu", &t), KVHAL_NOT_FOUND);
    assert_int_equal(kvhal_device_type_find("npu-x", &t), KVHAL_NOT_FOUND);
    assert_contains(kvhal_last_error(), "registered: cpu, cuda, hip, opencl");
}

/* A backend whose supports() refuses a call: KVHAL_UNSUPPORTED with its reason, nothing written; what it accepts
 * runs; an op without a slot is named. */
static void test_supports_refuses(void **state)
{
    (void)state;
    kvhal_device_type t;
    assert_int_equal(kvhal_device_type_find("tref", &t), KVHAL_OK);
    kvhal_device d = {t, 0};
    kvhal_buffer *b;
    assert_int_equal(kvhal_buffer_create(d, 64, &b), KVHAL_OK);
    uint8_t in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(kvhal_memcpy_h2d(b, 0, in, 64, NULL), KVHAL_OK);
    kvhal_tensor src, dst;
    int64_t shape[1] = {8};
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F32, 1, shape, NULL, &src), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(b, 32, KVHAL_F32, 1, shape, NULL, &dst), KVHAL_OK);
    assert_int_equal(kvhal_tensor_copy(&dst, &src, NULL), KVHAL_UNSUPPORTED);
    assert_contains(kvhal_last_error(), "tref");
    assert_contains(kvhal_last_error(), "tensor_copy");
    assert_contains(kvhal_last_error(), "copies 16-bit and 8-bit data only");
    assert_int_equal(kvhal_memcpy_d2h(out, b, 0, 64, NULL), KVHAL_OK);
    assert_memory_equal(out, in, 64); /* nothing written */
    /* The refusal is asked again, not cached as a descriptor. */
    assert_int_equal(kvhal_tensor_copy(&dst, &src, NULL), KVHAL_UNSUPPORTED);
    /* f16 is accepted and copies. */
    int64_t shape16[1] = {16};
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F16, 1, shape16, NULL, &src), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(b, 32, KVHAL_F16, 1, shape16, NULL, &dst), KVHAL_OK);
    assert_int_equal(kvhal_tensor_copy(&dst, &src, NULL), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_d2h(out, b, 0, 64, NULL), KVHAL_OK);
    assert_memory_equal(out + 32, in, 32);
    /* copy_blocks has no slot in this module. */
    kvhal_tensor cache;
    int64_t cshape[2] = {4, 4};
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F32, 2, cshape, NULL, &cache), KVHAL_OK);
    const int64_t pairs[2] = {0, 1};
    assert_int_equal(kvhal_copy_blocks(&cache, 1, pairs, 1, NULL), KVHAL_UNSUPPORTED);
    assert_contains(kvhal_last_error(), "does not implement copy_blocks");
    assert_int_equal(kvhal_buffer_destroy(b), KVHAL_OK);
}

static void test_get_proc_address(void **state)
{
    (void)state;
    kvhal_device_type t;
    assert_int_equal(kvhal_device_type_find("tref", &t), KVHAL_OK);
    void *p = NULL;
    assert_int_equal(kvhal_backend_get_proc_address(t, "tp_magic", &p), KVHAL_OK);
    assert_non_null(p);
    assert_int_equal(*(int *)p, 42);
    assert_int_equal(kvhal_backend_get_proc_address(t, "no_such_extra", &p), KVHAL_NOT_FOUND);
    assert_null(p);
    assert_contains(kvhal_last_error(), "no_such_extra");
    assert_int_equal(kvhal_backend_get_proc_address(KVHAL_DEVICE_CPU, "tp_magic", &p), KVHAL_NOT_FOUND);
    assert_int_equal(kvhal_backend_get_proc_address((kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, "x", &p),
                     KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_backend_get_proc_address(t, NULL, &p), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_backend_get_proc_address(t, "x", NULL), KVHAL_INVALID_ARGUMENT);
}

/* KVHAL_DEVICE naming a type before its module loads is an error that names the type; after
 * kvhal_backend_load, the same value selects the device. */
static void test_device_env_before_and_after_load(void **state)
{
    (void)state;
    assert_int_equal(setenv("KVHAL_DEVICE", "late:0", 1), 0);
    kvhal_device d;
    assert_int_equal(kvhal_device_default(&d), KVHAL_PARSE_ERROR);
    assert_contains(kvhal_last_error(), "KVHAL_DEVICE=\"late:0\"");
    assert_contains(kvhal_last_error(), "\"late\" is not a registered device type");
    assert_int_equal(kvhal_device_parse("late", &d), KVHAL_PARSE_ERROR);
    assert_int_equal(kvhal_backend_load(RT_PLUGIN_DIR "/libkvhal-late.so"), KVHAL_OK);
    assert_int_equal(kvhal_backend_load(RT_PLUGIN_DIR "/libkvhal-late.so"), KVHAL_OK); /* once only */
    assert_int_equal(kvhal_device_default(&d), KVHAL_OK);
    assert_string_equal(kvhal_device_type_name(d.type), "late");
    assert_int_equal(d.id, 0);
    kvhal_backend_module_info mi = find_module("late");
    assert_true(mi.loaded);
    assert_int_equal(mi.type_id, (int)d.type);
    assert_int_equal(setenv("KVHAL_DEVICE", "late:1", 1), 0);
    assert_int_equal(kvhal_device_default(&d), KVHAL_NO_DEVICE);
    assert_contains(kvhal_last_error(), "late:1");
    unsetenv("KVHAL_DEVICE");
    /* Loading errors: a path that is not there, a module refused at discovery. */
    assert_int_equal(kvhal_backend_load(NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_backend_load(RT_PLUGIN_DIR "/libkvhal-absent.so"), KVHAL_LOAD_FAILED);
    assert_contains(kvhal_last_error(), "No such file");
    assert_int_equal(kvhal_backend_load(BAD_PLUGIN_DIR "/libkvhal-initfail.so"), KVHAL_LOAD_FAILED);
    assert_contains(kvhal_last_error(), "simulated driver failure");
}

/* Type ids are bounded: modules past KVHAL_MAX_DEVICE_TYPES are refused with a reason naming the bound, and the
 * types registered before keep working. Runs last: it uses up the ids. */
static void test_type_bound(void **state)
{
    (void)state;
    int loaded = 0, refused = 0;
    for (int i = 0; i < 14; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/libkvhal-tb%d.so", RT_PLUGIN_DIR, i);
        kvhal_status st = kvhal_backend_load(path);
        if (st == KVHAL_OK) {
            assert_int_equal(refused, 0); /* no success after the first refusal */
            loaded++;
            continue;
        }
        assert_int_equal(st, KVHAL_LOAD_FAILED);
        assert_contains(kvhal_last_error(), "KVHAL_MAX_DEVICE_TYPES");
        refused++;
    }
    assert_true(loaded > 0);
    assert_true(refused > 0);
    kvhal_device_type t;
    char last[16];
    snprintf(last, sizeof last, "tb%d", loaded - 1);
    assert_int_equal(kvhal_device_type_find(last, &t), KVHAL_OK);
    assert_int_equal((int)t, KVHAL_MAX_DEVICE_TYPES - 1);
    assert_string_equal(kvhal_device_type_name((kvhal_device_type)(KVHAL_MAX_DEVICE_TYPES - 1)), last);
    snprintf(last, sizeof last, "tb%d", loaded);
    assert_int_equal(kvhal_device_type_find(last, &t), KVHAL_NOT_FOUND);
    kvhal_buffer *b;
    assert_int_equal(kvhal_buffer_create((kvhal_device){(kvhal_device_type)(KVHAL_MAX_DEVICE_TYPES - 1), 0}, 8, &b),
                     KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(b), KVHAL_OK);
}

/* A device type's count comes from the module that serves it, if any; never from a refused module (missingreq claims
 * 4 cuda devices, initfail 3 hip devices). */
static void test_counts_come_from_loaded_modules(void **state)
{
    (void)state;
    int32_t n = module_count();
    int32_t served[KVHAL_MAX_DEVICE_TYPES] = {0};
    bool loaded_type[KVHAL_MAX_DEVICE_TYPES] = {false};
    for (int32_t i = 0; i < n; i++) {
        kvhal_backend_module_info mi;
        assert_int_equal(kvhal_backend_module_get(i, &mi), KVHAL_OK);
        assert_non_null(memchr(mi.name, '\0', sizeof mi.name));
        assert_non_null(memchr(mi.device_type, '\0', sizeof mi.device_type));
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
            assert_int_equal(mi.type_id, -1);
            continue;
        }
        kvhal_device d;
        if (kvhal_device_parse(mi.device_type, &d) != KVHAL_OK)
            fail_msg("loaded module \"%s\" serves \"%s\", which does not parse", mi.name, mi.device_type);
        assert_int_equal((int)d.type, mi.type_id);
        assert_false(loaded_type[d.type]); /* one module per type */
        loaded_type[d.type] = true;
        served[d.type] = mi.device_count;
        assert_in_range(mi.abi_version, KVHAL_BACKEND_ABI_MIN, KVHAL_BACKEND_ABI_VERSION);
        assert_in_range(mi.device_count, 0, KVHAL_MAX_DEVICES_PER_TYPE);
    }
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        int32_t c = -1;
        if (!strcmp(kvhal_device_type_name((kvhal_device_type)t), "invalid")) {
            assert_int_equal(kvhal_device_count((kvhal_device_type)t, &c), KVHAL_INVALID_ARGUMENT);
            continue;
        }
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
    const kvhal__bk *bk = (const kvhal__bk *)&bk;
    assert_int_equal(kvhal__lookup(d, "some_arg", &bk), want);
    assert_null(bk);
    assert_contains(kvhal_last_error(), "some_arg");
}

static void test_unserved_devices(void **state)
{
    (void)state;
    int32_t counts[BUILTIN_TYPES];
    for (int t = 0; t < BUILTIN_TYPES; t++)
        assert_int_equal(kvhal_device_count((kvhal_device_type)t, &counts[t]), KVHAL_OK);

    check_unserved((kvhal_device){(kvhal_device_type)99, 0}, KVHAL_INVALID_ARGUMENT);
    check_unserved((kvhal_device){(kvhal_device_type)-1, 0}, KVHAL_INVALID_ARGUMENT);
    check_unserved((kvhal_device){(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, 0}, KVHAL_INVALID_ARGUMENT);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, 1}, KVHAL_NO_DEVICE);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, -1}, KVHAL_NO_DEVICE);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, INT32_MAX}, KVHAL_NO_DEVICE);
    check_unserved((kvhal_device){KVHAL_DEVICE_CPU, INT32_MIN}, KVHAL_NO_DEVICE);
    for (int t = 1; t < BUILTIN_TYPES; t++) {
        int32_t ids[] = {counts[t], 5, KVHAL_MAX_DEVICES_PER_TYPE, -1};
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
            if (ids[i] >= 0 && ids[i] < counts[t]) continue; /* a real device on this machine */
            kvhal_backend_module_info mi;
            bool served = false;
            int32_t n = module_count();
            for (int32_t m = 0; m < n; m++) {
                assert_int_equal(kvhal_backend_module_get(m, &mi), KVHAL_OK);
                if (mi.loaded && mi.type_id == t) served = true;
            }
            check_unserved((kvhal_device){(kvhal_device_type)t, ids[i]},
                           served ? KVHAL_NO_DEVICE : KVHAL_BACKEND_UNAVAILABLE);
        }
    }
}

static void test_lookup_present(void **state)
{
    (void)state;
    const kvhal__bk *bk = NULL;
    assert_int_equal(kvhal__lookup((kvhal_device){KVHAL_DEVICE_CPU, 0}, "dev", &bk), KVHAL_OK);
    assert_non_null(bk);
    assert_string_equal(bk->name, "cpu");
    assert_string_equal(bk->type_name, "cpu");
    assert_int_equal(bk->type, KVHAL_DEVICE_CPU);
    assert_non_null(bk->dev.buffer_alloc);
    /* The same backend for every id of a type: lookups are by (type, id) but share the module. */
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        int32_t n;
        if (kvhal_device_count((kvhal_device_type)t, &n) != KVHAL_OK) break;
        const kvhal__bk *first = NULL;
        for (int32_t id = 0; id < n; id++) {
            const kvhal__bk *b = NULL;
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
        snprintf(list, sizeof list, "%s,wrongabi,abiv1,noentry,missingreq,initfail,tpa1,tpa2,tref,badupper,badempty,"
                 "badnull,baddash,baddigit,badlong", only);
        if (setenv("KVHAL_BACKENDS", list, 1) != 0) return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_builtin),
        cmocka_unit_test(test_wrong_abi),
        cmocka_unit_test(test_abi_v1),
        cmocka_unit_test(test_no_entry),
        cmocka_unit_test(test_missing_required),
        cmocka_unit_test(test_init_fails),
        cmocka_unit_test(test_duplicate_type_name),
        cmocka_unit_test(test_invalid_type_names),
        cmocka_unit_test(test_supports_refuses),
        cmocka_unit_test(test_get_proc_address),
        cmocka_unit_test(test_counts_come_from_loaded_modules),
        cmocka_unit_test(test_module_get_errors),
        cmocka_unit_test(test_unserved_devices),
        cmocka_unit_test(test_lookup_present),
        cmocka_unit_test(test_device_env_before_and_after_load),
        cmocka_unit_test(test_type_bound),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}

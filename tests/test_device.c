/* test_device.c — device names (parse and format), the KVHAL_DEVICE default with no silent fallback, device count
 * and info for every device type, and synchronize / check_errors on present and missing devices. */
#include <limits.h>
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

static const char *type_names[BUILTIN_TYPES] = {"cpu", "cuda", "hip", "opencl"};

static void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

static int32_t count_of(kvhal_device_type t)
{
    int32_t n = -1;
    assert_int_equal(kvhal_device_count(t, &n), KVHAL_OK);
    return n;
}

/* ---- parse ---- */
static void test_parse_good(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        kvhal_device_type type;
        int32_t id;
    } cases[] = {
        {"cpu", KVHAL_DEVICE_CPU, 0},        {"cpu:0", KVHAL_DEVICE_CPU, 0},      {"cuda", KVHAL_DEVICE_CUDA, 0},
        {"cuda:1", KVHAL_DEVICE_CUDA, 1},    {"hip:0", KVHAL_DEVICE_HIP, 0},      {"opencl:2", KVHAL_DEVICE_OPENCL, 2},
        {"opencl:63", KVHAL_DEVICE_OPENCL, 63}, {"hip", KVHAL_DEVICE_HIP, 0},   {"opencl", KVHAL_DEVICE_OPENCL, 0},
        {"cuda:10", KVHAL_DEVICE_CUDA, 10},
        /* Only syntax is checked: a device that is not present still parses. */
        {"cpu:5", KVHAL_DEVICE_CPU, 5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvhal_device d = {(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, -99};
        kvhal_status st = kvhal_device_parse(cases[i].text, &d);
        if (st != KVHAL_OK) fail_msg("\"%s\": %s (%s)", cases[i].text, kvhal_status_name(st), kvhal_last_error());
        assert_int_equal(d.type, cases[i].type);
        assert_int_equal(d.id, cases[i].id);
    }
}

static void check_parse_bad(const char *text)
{
    kvhal_device d = {KVHAL_DEVICE_HIP, 42};
    kvhal_clear_error();
    kvhal_status st = kvhal_device_parse(text, &d);
    if (st != KVHAL_PARSE_ERROR)
        fail_msg("\"%.40s\" (length %zu): %s, expected KVHAL_PARSE_ERROR", text, strlen(text), kvhal_status_name(st));
    /* out untouched on failure */
    assert_int_equal(d.type, KVHAL_DEVICE_HIP);
    assert_int_equal(d.id, 42);
    assert_contains(kvhal_last_error(), "text");
}

static void test_parse_bad(void **state)
{
    (void)state;
    static const char *bad[] = {
        "",        "gpu",     "cuda:",    "cuda:x",   "cuda:1x",  "cuda:-1", "cuda:64",  " cpu",     "CPU",
        "cuda::1", "cpu ",    "cpu:",     ":0",       ":",        "cuda:+1", "cuda: 1",  "cuda:0x1", "cuda:1:2",
        "cuda1",   "opencl:64", "hip:100", "cu",      "cudaa:0",  "cpu\n",   "cuda:99999999999999999999999",
        "cuda:1.0", "Cuda:0", "cuda:-0",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) check_parse_bad(bad[i]);
    /* A short bad text is quoted back in the message. */
    kvhal_device d;
    assert_int_equal(kvhal_device_parse("cuda:1x", &d), KVHAL_PARSE_ERROR);
    assert_contains(kvhal_last_error(), "cuda:1x");
}

static void test_parse_long_strings(void **state)
{
    (void)state;
    enum { N = 10000 };
    static char s[N + 1];

    memset(s, 'a', N);
    s[N] = '\0';
    check_parse_bad(s);

    memcpy(s, "cuda:", 5); /* cuda: followed by thousands of digits: out of range, not wrapped around */
    memset(s + 5, '1', N - 5);
    check_parse_bad(s);

    memcpy(s, "cpu", 3); /* trailing spaces */
    memset(s + 3, ' ', N - 3);
    check_parse_bad(s);

    memcpy(s, "cuda:1", 6);
    memset(s + 6, 'x', N - 6);
    check_parse_bad(s);

    /* The message quotes a bounded prefix, never the whole text. */
    assert_true(strlen(kvhal_last_error()) < 2048);
}

static void test_parse_null(void **state)
{
    (void)state;
    kvhal_device d;
    assert_int_equal(kvhal_device_parse(NULL, &d), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "text");
    assert_int_equal(kvhal_device_parse("cpu", NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "out");
}

/* ---- format ---- */
static void test_format(void **state)
{
    (void)state;
    char buf[32];
    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_CUDA, 1}, buf, sizeof buf), KVHAL_OK);
    assert_string_equal(buf, "cuda:1");
    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_CPU, 0}, buf, sizeof buf), KVHAL_OK);
    assert_string_equal(buf, "cpu:0");
    /* Round trip for every type and id. */
    for (int t = 0; t < BUILTIN_TYPES; t++) {
        for (int32_t id = 0; id < KVHAL_MAX_DEVICES_PER_TYPE; id++) {
            kvhal_device d = {(kvhal_device_type)t, id}, back;
            assert_int_equal(kvhal_device_format(d, buf, sizeof buf), KVHAL_OK);
            char want[32];
            snprintf(want, sizeof want, "%s:%d", type_names[t], id);
            assert_string_equal(buf, want);
            assert_int_equal(kvhal_device_parse(buf, &back), KVHAL_OK);
            assert_int_equal(back.type, d.type);
            assert_int_equal(back.id, d.id);
        }
    }
    /* Exactly enough room, then one byte short: truncated but always terminated. */
    char small[9]; /* "opencl:2" and its terminator */
    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_OPENCL, 2}, small, 9), KVHAL_OK);
    assert_string_equal(small, "opencl:2");
    memset(small, '#', sizeof small);
    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_OPENCL, 2}, small, 8), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "buf_size");
    assert_true(memchr(small, '\0', 8) != NULL);
    assert_int_equal(small[8], '#'); /* nothing written past buf_size */
    memset(small, '#', sizeof small);
    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_CUDA, 1}, small, 1), KVHAL_OUT_OF_RANGE);
    assert_int_equal(small[0], '\0');
    assert_int_equal(small[1], '#');

    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_CPU, 0}, NULL, 16), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_device_format((kvhal_device){KVHAL_DEVICE_CPU, 0}, buf, 0), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "buf");
}

static void test_type_names(void **state)
{
    (void)state;
    for (int t = 0; t < BUILTIN_TYPES; t++)
        assert_string_equal(kvhal_device_type_name((kvhal_device_type)t), type_names[t]);
    const int bad[] = {-1, KVHAL_MAX_DEVICE_TYPES, 99, INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *n = kvhal_device_type_name((kvhal_device_type)bad[i]);
        assert_non_null(n);
        for (int t = 0; t < BUILTIN_TYPES; t++) assert_string_not_equal(n, type_names[t]);
    }
}

/* ---- KVHAL_DEVICE ---- */
static char *saved_env;

static int save_env(void **state)
{
    (void)state;
    const char *v = getenv("KVHAL_DEVICE");
    saved_env = v ? strdup(v) : NULL;
    return 0;
}

static int restore_env(void **state)
{
    (void)state;
    if (saved_env) setenv("KVHAL_DEVICE", saved_env, 1);
    else unsetenv("KVHAL_DEVICE");
    free(saved_env);
    saved_env = NULL;
    return 0;
}

static void expect_default(const char *env, kvhal_device_type type, int32_t id)
{
    if (env) setenv("KVHAL_DEVICE", env, 1);
    else unsetenv("KVHAL_DEVICE");
    kvhal_device d = {(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, -1};
    kvhal_status st = kvhal_device_default(&d);
    if (st != KVHAL_OK) fail_msg("KVHAL_DEVICE=%s: %s (%s)", env ? env : "(unset)", kvhal_status_name(st),
                                 kvhal_last_error());
    assert_int_equal(d.type, type);
    assert_int_equal(d.id, id);
}

static void expect_default_fails(const char *env, kvhal_status want)
{
    setenv("KVHAL_DEVICE", env, 1);
    kvhal_device d = {KVHAL_DEVICE_HIP, 33};
    kvhal_clear_error();
    kvhal_status st = kvhal_device_default(&d);
    if (st != want)
        fail_msg("KVHAL_DEVICE=%s: %s, expected %s", env, kvhal_status_name(st), kvhal_status_name(want));
    /* No fallback: the output is untouched. */
    assert_int_equal(d.type, KVHAL_DEVICE_HIP);
    assert_int_equal(d.id, 33);
    assert_contains(kvhal_last_error(), "KVHAL_DEVICE");
}

static void test_default_unset_or_empty(void **state)
{
    (void)state;
    expect_default(NULL, KVHAL_DEVICE_CPU, 0);
    expect_default("", KVHAL_DEVICE_CPU, 0);
    expect_default("cpu", KVHAL_DEVICE_CPU, 0);
    expect_default("cpu:0", KVHAL_DEVICE_CPU, 0);
    assert_int_equal(kvhal_device_default(NULL), KVHAL_INVALID_ARGUMENT);
}

static void test_default_every_present_device(void **state)
{
    (void)state;
    for (int t = 0; t < BUILTIN_TYPES; t++) {
        int32_t n = count_of((kvhal_device_type)t);
        for (int32_t id = 0; id < n; id++) {
            char text[32];
            snprintf(text, sizeof text, "%s:%d", type_names[t], id);
            expect_default(text, (kvhal_device_type)t, id);
        }
    }
}

static void test_default_malformed(void **state)
{
    (void)state;
    const char *bad[] = {"gpu", "cuda:", "cuda:x", " cpu", "CPU", "cuda::1", "opencl:64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        expect_default_fails(bad[i], KVHAL_PARSE_ERROR);
        assert_contains(kvhal_last_error(), bad[i]);
    }
}

static void test_default_missing_device(void **state)
{
    (void)state;
    /* hip:7 unless a machine really has 8 HIP devices; then the first id past the last one. */
    char text[32];
    int32_t nhip = count_of(KVHAL_DEVICE_HIP);
    snprintf(text, sizeof text, "hip:%d", nhip > 7 ? nhip : 7);
    if (nhip < KVHAL_MAX_DEVICES_PER_TYPE) {
        expect_default_fails(text, KVHAL_NO_DEVICE);
        assert_contains(kvhal_last_error(), text);
    }
    expect_default_fails("cpu:1", KVHAL_NO_DEVICE);
    assert_contains(kvhal_last_error(), "cpu:1");
    for (int t = 0; t < BUILTIN_TYPES; t++) {
        int32_t n = count_of((kvhal_device_type)t);
        if (n >= KVHAL_MAX_DEVICES_PER_TYPE) continue;
        snprintf(text, sizeof text, "%s:%d", type_names[t], n);
        expect_default_fails(text, KVHAL_NO_DEVICE);
        assert_contains(kvhal_last_error(), text);
    }
}

/* ---- count, info ---- */
static void test_count_and_info(void **state)
{
    (void)state;
    assert_int_equal(count_of(KVHAL_DEVICE_CPU), 1);
    for (int t = 0; t < BUILTIN_TYPES; t++) {
        int32_t n = count_of((kvhal_device_type)t);
        assert_in_range(n, 0, KVHAL_MAX_DEVICES_PER_TYPE);
        for (int32_t id = 0; id < n; id++) {
            kvhal_device_info info;
            memset(&info, 0x5a, sizeof info);
            kvhal_device d = {(kvhal_device_type)t, id};
            kvhal_status st = kvhal_device_get_info(d, &info);
            if (st != KVHAL_OK) fail_msg("%s:%d: %s (%s)", type_names[t], id, kvhal_status_name(st), kvhal_last_error());
            assert_int_equal(info.device.type, t);
            assert_int_equal(info.device.id, id);
            /* Every string field is a terminated string of its array. */
            assert_non_null(memchr(info.name, '\0', sizeof info.name));
            assert_non_null(memchr(info.backend, '\0', sizeof info.backend));
            assert_non_null(memchr(info.platform, '\0', sizeof info.platform));
            assert_string_equal(info.backend, type_names[t]);
            assert_true(strlen(info.name) > 0);
            assert_true(info.total_memory > 0);
            assert_true(info.free_memory <= info.total_memory);
            assert_true(info.compute_units >= 1);
        }
        /* One past the last device is an error, never a crash. */
        kvhal_device_info info;
        kvhal_status st = kvhal_device_get_info((kvhal_device){(kvhal_device_type)t, n}, &info);
        assert_true(st == KVHAL_NO_DEVICE || st == KVHAL_BACKEND_UNAVAILABLE);
        assert_true(strlen(kvhal_last_error()) > 0);
    }
    int32_t n;
    assert_int_equal(kvhal_device_count(KVHAL_DEVICE_CPU, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_device_count((kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, &n), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_device_count((kvhal_device_type)-1, &n), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_device_get_info((kvhal_device){KVHAL_DEVICE_CPU, 0}, NULL), KVHAL_INVALID_ARGUMENT);
}

static void test_cpu_info(void **state)
{
    (void)state;
    kvhal_device_info info;
    assert_int_equal(kvhal_device_get_info((kvhal_device){KVHAL_DEVICE_CPU, 0}, &info), KVHAL_OK);
    assert_string_equal(info.backend, "cpu");
    assert_true(strlen(info.name) > 0);
    assert_true(info.total_memory > 0);
    assert_true(info.compute_units >= 1);
}

/* ---- synchronize, check_errors ---- */
static void test_synchronize(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    assert_int_equal(kvhal_device_synchronize(cpu), KVHAL_OK);
    assert_int_equal(kvhal_device_check_errors(cpu), KVHAL_OK);
    for (int t = 0; t < BUILTIN_TYPES; t++) {
        int32_t n = count_of((kvhal_device_type)t);
        for (int32_t id = 0; id < n; id++) {
            kvhal_device d = {(kvhal_device_type)t, id};
            assert_int_equal(kvhal_device_synchronize(d), KVHAL_OK);
            assert_int_equal(kvhal_device_check_errors(d), KVHAL_OK);
        }
    }
}

static void test_synchronize_missing(void **state)
{
    (void)state;
    kvhal_device missing[4 + BUILTIN_TYPES] = {
        {KVHAL_DEVICE_CPU, 1}, {KVHAL_DEVICE_CPU, -1}, {(kvhal_device_type)99, 0}, {KVHAL_DEVICE_CPU, INT32_MIN},
    };
    int nm = 4;
    for (int t = 0; t < BUILTIN_TYPES; t++) missing[nm++] = (kvhal_device){(kvhal_device_type)t,
                                                                                    count_of((kvhal_device_type)t)};
    for (int i = 0; i < nm; i++) {
        kvhal_clear_error();
        kvhal_status st = kvhal_device_synchronize(missing[i]);
        if (st == KVHAL_OK) fail_msg("synchronize {%d, %d} succeeded", (int)missing[i].type, missing[i].id);
        assert_true(strlen(kvhal_last_error()) > 0);
        kvhal_clear_error();
        st = kvhal_device_check_errors(missing[i]);
        if (st == KVHAL_OK) fail_msg("check_errors {%d, %d} succeeded", (int)missing[i].type, missing[i].id);
        assert_true(strlen(kvhal_last_error()) > 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_good),
        cmocka_unit_test(test_parse_bad),
        cmocka_unit_test(test_parse_long_strings),
        cmocka_unit_test(test_parse_null),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test_setup_teardown(test_default_unset_or_empty, save_env, restore_env),
        cmocka_unit_test_setup_teardown(test_default_every_present_device, save_env, restore_env),
        cmocka_unit_test_setup_teardown(test_default_malformed, save_env, restore_env),
        cmocka_unit_test_setup_teardown(test_default_missing_device, save_env, restore_env),
        cmocka_unit_test(test_count_and_info),
        cmocka_unit_test(test_cpu_info),
        cmocka_unit_test(test_synchronize),
        cmocka_unit_test(test_synchronize_missing),
    };
    return cmocka_run_group_tests_name("device", tests, NULL, NULL);
}

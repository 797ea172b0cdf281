/* test_vendor_plugin.c — the example vendor module (examples/vendor-plugin, device type "npu") through the public
 * API, for what the conformance suite does not reach: its type registered by name, its extras through
 * kvhal_backend_get_proc_address, a supports() refusal reaching the caller with the module's reason, the device
 * memory bound, peer copies between npu:0 and npu:1, streams (created and wrapped), the error flag read by
 * check_errors on one device only, and loading the same file again by path. The ops themselves are checked
 * against the reference by kvhal-conformance. Skipped when KVHAL_BACKENDS leaves the module out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "device_buffer.h" /* OK() */
#include "kvhal.h"
#include "npu_extras.h"

/* cpu, cuda, hip, opencl: the built-in type ids 0-3 (kvhal.h has no public count). */
enum { BUILTIN_TYPES = KVHAL_DEVICE_OPENCL + 1 };

static kvhal_device_type npu;
static void *npu_ctx;
static example_npu_bytes_allocated_fn bytes_allocated;

static int setup(void **state)
{
    (void)state;
    int32_t n = 0;
    OK(kvhal_backend_module_count(&n));
    for (int32_t i = 0; i < n; i++) {
        kvhal_backend_module_info mi;
        OK(kvhal_backend_module_get(i, &mi));
        if (strcmp(mi.name, "example-npu")) continue;
        if (!mi.loaded) fail_msg("example-npu at %s not loaded: %s", mi.path, mi.reason);
        OK(kvhal_device_type_find("npu", &npu));
        assert_int_equal(mi.type_id, (int32_t)npu);
        assert_string_equal(mi.device_type, "npu");
        void *fn;
        OK(kvhal_backend_get_proc_address(npu, EXAMPLE_NPU_CONTEXT, &npu_ctx));
        OK(kvhal_backend_get_proc_address(npu, EXAMPLE_NPU_BYTES_ALLOCATED, &fn));
        memcpy(&bytes_allocated, &fn, sizeof fn);
        return 0;
    }
    return 0; /* not listed: KVHAL_BACKENDS left it out; every test skips */
}

static kvhal_device dev(int32_t id)
{
    if (!bytes_allocated) skip();
    return (kvhal_device){npu, id};
}

static void test_registration(void **state)
{
    (void)state;
    kvhal_device d0 = dev(0), parsed;
    assert_true((int)npu >= BUILTIN_TYPES && (int)npu < KVHAL_MAX_DEVICE_TYPES);
    assert_string_equal(kvhal_device_type_name(npu), "npu");
    int32_t count = 0;
    OK(kvhal_device_count(npu, &count));
    assert_int_equal(count, 2);
    OK(kvhal_device_parse("npu:1", &parsed));
    assert_int_equal(parsed.type, npu);
    assert_int_equal(parsed.id, 1);
    kvhal_device_info info;
    OK(kvhal_device_get_info(d0, &info));
    assert_string_equal(info.backend, "npu");
    assert_true(info.peer_access);
    void *p;
    assert_int_equal(kvhal_backend_get_proc_address(npu, "example_npu_no_such_extra", &p), KVHAL_NOT_FOUND);
    /* the same file by path: already loaded, OK without a second load */
    OK(kvhal_backend_load(KVHAL_TEST_BUILD_ROOT "/examples/vendor-plugin/libkvhal-npu.so"));
    int32_t again = 0;
    OK(kvhal_device_count(npu, &again));
    assert_int_equal(again, 2);
}

static void test_bytes_allocated(void **state)
{
    (void)state;
    kvhal_device d0 = dev(0), d1 = dev(1);
    const uint64_t base0 = bytes_allocated(npu_ctx, 0), base1 = bytes_allocated(npu_ctx, 1);
    kvhal_buffer *a, *b;
    OK(kvhal_buffer_create(d0, 1000, &a));
    OK(kvhal_buffer_create(d1, 24, &b));
    assert_int_equal(bytes_allocated(npu_ctx, 0), base0 + 1000);
    assert_int_equal(bytes_allocated(npu_ctx, 1), base1 + 24);
    /* beyond the device's memory: refused, nothing held */
    kvhal_buffer *huge = NULL;
    assert_int_equal(kvhal_buffer_create(d0, (size_t)3 << 30, &huge), KVHAL_OUT_OF_MEMORY);
    assert_non_null(strstr(kvhal_last_error(), "npu:0"));
    assert_null(huge);
    assert_int_equal(bytes_allocated(npu_ctx, 0), base0 + 1000);
    OK(kvhal_buffer_destroy(a));
    OK(kvhal_buffer_destroy(b));
    assert_int_equal(bytes_allocated(npu_ctx, 0), base0);
    assert_int_equal(bytes_allocated(npu_ctx, 1), base1);
    assert_int_equal(bytes_allocated(npu_ctx, 7), 0);
}

static void test_peer_copies_and_streams(void **state)
{
    (void)state;
    kvhal_device d0 = dev(0), d1 = dev(1);
    uint8_t src[256], got[256];
    for (int i = 0; i < 256; i++) src[i] = (uint8_t)(i * 7 + 1);
    kvhal_buffer *a, *b;
    OK(kvhal_buffer_create(d0, 256, &a));
    OK(kvhal_buffer_create(d1, 256, &b));
    kvhal_stream *s, *w;
    OK(kvhal_stream_create(d1, &s));
    int queue = 0; /* the application's queue handle: opaque to the example NPU */
    OK(kvhal_stream_wrap(d1, &queue, &w));
    OK(kvhal_memcpy_h2d(a, 0, src, 256, NULL));
    OK(kvhal_memset(b, 0, 0xab, 256, s));
    OK(kvhal_memcpy_d2d(b, 16, a, 32, 100, w)); /* npu:0 -> npu:1 */
    OK(kvhal_stream_synchronize(w));
    OK(kvhal_memcpy_d2h(got, b, 0, 256, s));
    OK(kvhal_stream_synchronize(s));
    for (int i = 0; i < 256; i++) assert_int_equal(got[i], i >= 16 && i < 116 ? src[i + 16] : 0xab);
    OK(kvhal_stream_destroy(w));
    OK(kvhal_stream_destroy(s));
    OK(kvhal_buffer_destroy(a));
    OK(kvhal_buffer_destroy(b));
}

/* One token of head dim hd, f32, into slot `slot` of a one-block cache of block size 2. */
static kvhal_status cache_one(kvhal_device d, int64_t hd, int64_t slot, kvhal_buffer **bufs)
{
    OK(kvhal_buffer_create(d, (size_t)(2 * hd * 4), &bufs[0]));
    OK(kvhal_buffer_create(d, (size_t)(hd * 4), &bufs[1]));
    OK(kvhal_buffer_create(d, 8, &bufs[2]));
    OK(kvhal_memset(bufs[0], 0, 0, (size_t)(2 * hd * 4), NULL));
    OK(kvhal_memset(bufs[1], 0, 0x3f, (size_t)(hd * 4), NULL));
    OK(kvhal_memcpy_h2d(bufs[2], 0, &slot, 8, NULL));
    int64_t cs[4] = {1, 2, 1, hd}, is[3] = {1, 1, hd}, ss[1] = {1};
    kvhal_tensor kc, k, sl;
    OK(kvhal_tensor_make(bufs[0], 0, KVHAL_F32, 4, cs, NULL, &kc));
    OK(kvhal_tensor_make(bufs[1], 0, KVHAL_F32, 3, is, NULL, &k));
    OK(kvhal_tensor_make(bufs[2], 0, KVHAL_I64, 1, ss, NULL, &sl));
    kvhal_clear_error();
    return kvhal_paged_caching(&kc, &kc, &k, &k, &sl, 1.0f, 1.0f, NULL);
}

static void free3(kvhal_buffer **bufs)
{
    for (int i = 0; i < 3; i++) OK(kvhal_buffer_destroy(bufs[i]));
}

static void test_supports_refusal(void **state)
{
    (void)state;
    kvhal_device d0 = dev(0);
    kvhal_buffer *bufs[3];
    /* the example NPU's row buffer holds 1024 elements: a longer head is refused with that reason */
    assert_int_equal(cache_one(d0, 1025, 1, bufs), KVHAL_UNSUPPORTED);
    if (!strstr(kvhal_last_error(), "row buffer holds 1024 elements") || !strstr(kvhal_last_error(), "1025"))
        fail_msg("the refusal does not carry the module's reason: %s", kvhal_last_error());
    float got = 1.0f;
    OK(kvhal_memcpy_d2h(&got, bufs[0], 4 * 1025, 4, NULL));
    assert_true(got == 0.0f); /* nothing written */
    free3(bufs);
    OK(cache_one(d0, 1024, 1, bufs));
    OK(kvhal_device_synchronize(d0));
    OK(kvhal_memcpy_d2h(&got, bufs[0], 4 * 1024, 4, NULL));
    assert_true(got != 0.0f); /* slot 1 written */
    free3(bufs);
}

static void test_fault_flag_per_device(void **state)
{
    (void)state;
    kvhal_device d0 = dev(0), d1 = dev(1);
    kvhal_buffer *bufs[3];
    OK(cache_one(d1, 4, 2, bufs)); /* slot 2 of a 2-slot cache: skipped, flag raised on npu:1 */
    OK(kvhal_device_check_errors(d0));
    assert_int_equal(kvhal_device_check_errors(d1), KVHAL_DEVICE_FAULT);
    assert_non_null(strstr(kvhal_last_error(), "npu:1"));
    OK(kvhal_device_check_errors(d1)); /* reported once */
    free3(bufs);
    /* a module without stream_check_errors: the core waits for the stream, then asks check_errors */
    kvhal_stream *w;
    OK(kvhal_stream_wrap(d1, KVHAL_STREAM_LEGACY, &w)); /* the default streams wrap on this module too */
    OK(cache_one(d1, 4, 2, bufs));
    assert_int_equal(kvhal_stream_check_errors(w), KVHAL_DEVICE_FAULT);
    OK(kvhal_stream_check_errors(w));
    OK(kvhal_stream_destroy(w));
    free3(bufs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration),       cmocka_unit_test(test_bytes_allocated),
        cmocka_unit_test(test_peer_copies_and_streams), cmocka_unit_test(test_supports_refusal),
        cmocka_unit_test(test_fault_flag_per_device),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

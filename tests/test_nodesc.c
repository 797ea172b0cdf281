/* test_nodesc.c — a module without desc_create (tests/npu_variants: npu_nodesc, the example module with its
 * descriptor functions removed and its supports() calls counted): the core caches a placeholder per key, so
 * supports() runs once per key and not on every call, the descriptor cache counts hits for it, and a clear or a
 * capacity of 0 asks again. kvhal-conformance --device=npu_nodesc:0 runs every op on it (suite ops). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

static kvhal_device dev;
static atomic_long *calls;

static bool left_out; /* KVHAL_BACKENDS (CI's valgrind stage: cpu) leaves the module out: the test skips */

static int setup(void **state)
{
    (void)state;
    int32_t n = 0;
    kvhal_backend_module_count(&n);
    const char *only = getenv("KVHAL_BACKENDS");
    if (only && *only && !strstr(only, "npu-nodesc")) {
        left_out = true;
        return 0;
    }
    if (kvhal_device_parse("npu_nodesc:0", &dev) != KVHAL_OK) return -1;
    void *p = NULL;
    if (kvhal_backend_get_proc_address(dev.type, "npu_variant_supports_calls", &p) != KVHAL_OK || !p) return -1;
    calls = p;
    return 0;
}

static void copy_once(kvhal_buffer *a, kvhal_buffer *b, int64_t n)
{
    kvhal_tensor d, s;
    const int64_t shape[1] = {n};
    assert_int_equal(kvhal_tensor_make(a, 0, KVHAL_F32, 1, shape, NULL, &d), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F32, 1, shape, NULL, &s), KVHAL_OK);
    assert_int_equal(kvhal_tensor_copy(&d, &s, NULL), KVHAL_OK);
}

static void test_supports_once_per_key(void **state)
{
    (void)state;
    if (left_out) skip();
    kvhal_buffer *a, *b;
    assert_int_equal(kvhal_buffer_create(dev, 4096, &a), KVHAL_OK);
    assert_int_equal(kvhal_buffer_create(dev, 4096, &b), KVHAL_OK);
    kvhal_op_kind op;
    assert_int_equal(kvhal_desc_op_find("tensor_copy", &op), KVHAL_OK);
    kvhal_desc_cache_stats st0, st1;
    assert_int_equal(kvhal_desc_cache_get_stats(dev, op, &st0), KVHAL_OK);
    const long c0 = atomic_load(calls);
    for (int i = 0; i < 50; i++) copy_once(a, b, 64); /* one key */
    assert_int_equal(atomic_load(calls) - c0, 1);
    for (int i = 0; i < 50; i++) copy_once(a, b, 32); /* a second key */
    assert_int_equal(atomic_load(calls) - c0, 2);
    assert_int_equal(kvhal_desc_cache_get_stats(dev, op, &st1), KVHAL_OK);
    assert_int_equal(st1.misses - st0.misses, 2);
    assert_int_equal(st1.hits - st0.hits, 98);
    /* cleared: asked again, once */
    assert_int_equal(kvhal_desc_cache_clear(dev), KVHAL_OK);
    for (int i = 0; i < 10; i++) copy_once(a, b, 64);
    assert_int_equal(atomic_load(calls) - c0, 3);
    /* caching off for the op: asked on every call, as the header says of a call it cannot cache */
    size_t cap;
    assert_int_equal(kvhal_desc_cache_get_capacity(op, &cap), KVHAL_OK);
    assert_int_equal(kvhal_desc_cache_set_capacity(op, 0), KVHAL_OK);
    for (int i = 0; i < 5; i++) copy_once(a, b, 64);
    assert_int_equal(atomic_load(calls) - c0, 8);
    assert_int_equal(kvhal_desc_cache_set_capacity(op, cap), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(a), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(b), KVHAL_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_supports_once_per_key)};
    return cmocka_run_group_tests_name("nodesc", tests, setup, NULL);
}

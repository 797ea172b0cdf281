/* test_buffer.c — buffers and streams on every device present: create/destroy, copies (h2d, d2h, d2d within and
 * between buffers and devices) at odd offsets and sizes, memset, range and argument errors that leave memory
 * unchanged, double destroy, wrapped memory, streams and their device checks. Each test runs once per present device;
 * a device type with no device contributes skipped tests, never passing ones. Every check compares the whole buffer
 * with a host mirror, so a write outside the requested range is caught too. */
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

/* cpu, cuda, hip, opencl: the built-in type ids 0-3 (kvhal.h has no public count). */
enum { BUILTIN_TYPES = KVHAL_DEVICE_OPENCL + 1 };

#define MIB ((size_t)1 << 20)

typedef struct dev_case {
    kvhal_device dev;
    bool present;
} dev_case;

static kvhal_device all_devs[BUILTIN_TYPES * KVHAL_MAX_DEVICES_PER_TYPE];
static int num_devs;

static void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

#define CHECK_OK(expr)                                                                                          \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());      \
    } while (0)

#define CHECK_ST(expr, want)                                                                                    \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != (want))                                                                                      \
            fail_msg("%s: %s, expected %s (%s)", #expr, kvhal_status_name(st_), kvhal_status_name(want),       \
                     kvhal_last_error());                                                                       \
    } while (0)

/* The device under test, or skip() when its type has no device. */
static kvhal_device device_of(void **state)
{
    const dev_case *c = *state;
    if (!c->present) skip();
    return c->dev;
}

static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s ? s : 0x9e3779b97f4a7c15ULL; }
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static void fill_random(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_next() >> 24);
}

static uint8_t *xmalloc(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* A device buffer with random contents and its host mirror. */
typedef struct mirrored {
    kvhal_buffer *buf;
    uint8_t *mirror;
    size_t size;
} mirrored;

static mirrored mirrored_create(kvhal_device dev, size_t size)
{
    mirrored m = {NULL, xmalloc(size), size};
    CHECK_OK(kvhal_buffer_create(dev, size, &m.buf));
    fill_random(m.mirror, size);
    CHECK_OK(kvhal_memcpy_h2d(m.buf, 0, m.mirror, size, NULL));
    return m;
}

/* The whole device buffer equals the mirror. */
static void mirrored_check(const mirrored *m, const char *what)
{
    uint8_t *back = xmalloc(m->size);
    memset(back, 0xee, m->size);
    CHECK_OK(kvhal_memcpy_d2h(back, m->buf, 0, m->size, NULL));
    for (size_t i = 0; i < m->size; i++) {
        if (back[i] != m->mirror[i]) {
            uint8_t got = back[i], want = m->mirror[i];
            free(back);
            fail_msg("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i, m->size, got, want);
        }
    }
    free(back);
}

static void mirrored_destroy(mirrored *m)
{
    CHECK_OK(kvhal_buffer_destroy(m->buf));
    free(m->mirror);
    m->buf = NULL;
    m->mirror = NULL;
}

/* ---- per-device tests ---- */
static void test_create_destroy(void **state)
{
    kvhal_device dev = device_of(state);
    const size_t sizes[] = {1, 3, 64, 4095, MIB + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kvhal_buffer *b = NULL;
        CHECK_OK(kvhal_buffer_create(dev, sizes[i], &b));
        assert_non_null(b);
        assert_int_equal(kvhal_buffer_size(b), sizes[i]);
        kvhal_device d = kvhal_buffer_device(b);
        assert_int_equal(d.type, dev.type);
        assert_int_equal(d.id, dev.id);
        assert_non_null(kvhal_buffer_native(b));
        CHECK_OK(kvhal_buffer_destroy(b));
    }
    kvhal_buffer *b = (kvhal_buffer *)&b;
    CHECK_ST(kvhal_buffer_create(dev, 0, &b), KVHAL_INVALID_ARGUMENT);
    assert_null(b);
    assert_contains(kvhal_last_error(), "bytes");
    CHECK_ST(kvhal_buffer_create(dev, 16, NULL), KVHAL_INVALID_ARGUMENT);

    /* Many live buffers at once are distinct and independent. */
    enum { N = 40 };
    mirrored ms[N];
    for (int i = 0; i < N; i++) ms[i] = mirrored_create(dev, 1 + (size_t)i * 37);
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < i; j++) assert_ptr_not_equal(ms[i].buf, ms[j].buf);
        mirrored_check(&ms[i], "one of many buffers");
    }
    for (int i = N - 1; i >= 0; i--) mirrored_destroy(&ms[i]);
}

static void test_create_alloc_failure(void **state)
{
    kvhal_device dev = device_of(state);
    /* The first allocation a create makes (its handle) fails: a clean OUT_OF_MEMORY and nothing leaked. */
    for (int64_t n = 1; n <= 3; n++) {
        kvhal_buffer *b = (kvhal_buffer *)&b;
        kvhal_fault_inject_alloc(n);
        kvhal_status st = kvhal_buffer_create(dev, 4096, &b);
        kvhal_fault_inject_alloc(0);
        if (n == 1) assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        if (st == KVHAL_OK) {
            CHECK_OK(kvhal_buffer_destroy(b));
        } else {
            assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
            assert_null(b);
            assert_true(strlen(kvhal_last_error()) > 0);
        }
    }
    /* And the device works normally afterwards. */
    mirrored m = mirrored_create(dev, 100);
    mirrored_check(&m, "after injected failures");
    mirrored_destroy(&m);
}

static void test_round_trip(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0x1234 + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    const size_t size = MIB + 3 + 17;
    mirrored m = mirrored_create(dev, size);
    mirrored_check(&m, "initial fill");
    static const struct {
        size_t off, n;
    } cases[] = {
        {0, 1}, {1, 1}, {7, 13}, {3, 4096 + 5}, {5, MIB + 3}, {MIB + 3 + 16, 1}, {0, MIB + 3 + 17}, {4093, 3},
        {11, 0},
    };
    uint8_t *src = xmalloc(size);
    uint8_t *back = xmalloc(size + 2);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t off = cases[i].off, n = cases[i].n;
        fill_random(src, n);
        CHECK_OK(kvhal_memcpy_h2d(m.buf, off, src, n, NULL));
        memcpy(m.mirror + off, src, n);
        /* Read back into an unaligned host address with guard bytes on both sides. */
        memset(back, 0xc3, n + 2);
        CHECK_OK(kvhal_memcpy_d2h(back + 1, m.buf, off, n, NULL));
        assert_int_equal(back[0], 0xc3);
        assert_int_equal(back[n + 1], 0xc3);
        if (n) assert_memory_equal(back + 1, src, n);
        mirrored_check(&m, "after h2d at an odd offset");
    }
    /* h2d from an unaligned host source. */
    fill_random(src, 1001);
    CHECK_OK(kvhal_memcpy_h2d(m.buf, 333, src + 1, 1000, NULL));
    memcpy(m.mirror + 333, src + 1, 1000);
    mirrored_check(&m, "after h2d from an unaligned source");
    free(src);
    free(back);
    mirrored_destroy(&m);
}

static void test_d2d_within(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0x777 + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    const size_t size = 2 * MIB + 101;
    mirrored m = mirrored_create(dev, size);
    static const struct {
        size_t dst, src, n;
    } cases[] = {
        {1, 5000, 1}, {0, 1, 1}, {100, 3, 97}, {7, 4096 + 1, 4096}, {MIB + 50, 1, MIB + 3}, {3, 2 * MIB + 100, 1},
        {size - 10, 0, 10}, {17, 29, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(kvhal_memcpy_d2d(m.buf, cases[i].dst, m.buf, cases[i].src, cases[i].n, NULL));
        memmove(m.mirror + cases[i].dst, m.mirror + cases[i].src, cases[i].n);
        mirrored_check(&m, "after d2d within one buffer");
    }
    mirrored_destroy(&m);
}

static void test_d2d_between(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0x999 + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    mirrored a = mirrored_create(dev, MIB + 3);
    mirrored b = mirrored_create(dev, MIB + 80);
    static const struct {
        size_t dst, src, n;
    } cases[] = {
        {0, 0, 1}, {5, 3, 1}, {1, 2, 4099}, {77, 0, MIB + 3}, {0, 1, MIB + 2}, {MIB + 79, MIB + 2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(kvhal_memcpy_d2d(b.buf, cases[i].dst, a.buf, cases[i].src, cases[i].n, NULL));
        memcpy(b.mirror + cases[i].dst, a.mirror + cases[i].src, cases[i].n);
        mirrored_check(&b, "destination of d2d between buffers");
        mirrored_check(&a, "source of d2d between buffers (must be unchanged)");
        /* Change the source so the next copy cannot pass by leftover contents. */
        fill_random(a.mirror, a.size);
        CHECK_OK(kvhal_memcpy_h2d(a.buf, 0, a.mirror, a.size, NULL));
    }
    /* And back the other way. */
    CHECK_OK(kvhal_memcpy_d2d(a.buf, 9, b.buf, 13, 5000, NULL));
    memcpy(a.mirror + 9, b.mirror + 13, 5000);
    mirrored_check(&a, "d2d back");
    mirrored_check(&b, "d2d back source");
    mirrored_destroy(&a);
    mirrored_destroy(&b);
}

static void test_memset(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0x4242 + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    mirrored m = mirrored_create(dev, MIB + 3 + 64);
    static const struct {
        size_t off, n;
        int value;
    } cases[] = {
        {3, 1000, 0xa5}, {0, 1, 0}, {1, 1, 255}, {5, MIB + 3, 0}, {17, 4096 + 3, 0x5a}, {MIB + 3 + 63, 1, 7},
        {0, MIB + 3 + 64, 0x11}, {9, 0, 0x22},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(kvhal_memset(m.buf, cases[i].off, cases[i].value, cases[i].n, NULL));
        memset(m.mirror + cases[i].off, cases[i].value, cases[i].n);
        mirrored_check(&m, "after memset");
        /* Fresh random contents so the next memset is checked against a non-uniform background. */
        fill_random(m.mirror, m.size);
        CHECK_OK(kvhal_memcpy_h2d(m.buf, 0, m.mirror, m.size, NULL));
    }
    /* Values outside a byte are rejected, and nothing is written. */
    const int bad[] = {-1, 256, 1000, -129};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ST(kvhal_memset(m.buf, 0, bad[i], 10, NULL), KVHAL_INVALID_ARGUMENT);
        assert_contains(kvhal_last_error(), "value");
    }
    mirrored_check(&m, "after rejected memsets");
    mirrored_destroy(&m);
}

static void test_range_errors(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0x5150 + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    const size_t size = 100;
    mirrored m = mirrored_create(dev, size);
    mirrored other = mirrored_create(dev, 50);
    static const struct {
        size_t off, n;
    } bad[] = {
        {100, 1}, {99, 2}, {101, 0}, {0, 101}, {1, SIZE_MAX}, {SIZE_MAX, 1}, {SIZE_MAX, 0}, {50, SIZE_MAX - 49},
        {0, SIZE_MAX},
    };
    uint8_t host[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t off = bad[i].off, n = bad[i].n;
        /* Host side: n may be huge, but kvhal must reject before touching host memory. */
        memset(host, 0x3c, sizeof host);
        CHECK_ST(kvhal_memcpy_h2d(m.buf, off, host, n, NULL), KVHAL_OUT_OF_RANGE);
        assert_contains(kvhal_last_error(), "dst");
        CHECK_ST(kvhal_memcpy_d2h(host, m.buf, off, n, NULL), KVHAL_OUT_OF_RANGE);
        assert_contains(kvhal_last_error(), "src");
        for (size_t k = 0; k < sizeof host; k++) assert_int_equal(host[k], 0x3c);
        CHECK_ST(kvhal_memset(m.buf, off, 0, n, NULL), KVHAL_OUT_OF_RANGE);
        /* d2d: the destination range is bad, then the source range is bad. */
        CHECK_ST(kvhal_memcpy_d2d(m.buf, off, other.buf, 0, n, NULL), KVHAL_OUT_OF_RANGE);
        CHECK_ST(kvhal_memcpy_d2d(other.buf, 0, m.buf, off, n, NULL), KVHAL_OUT_OF_RANGE);
        CHECK_ST(kvhal_memcpy_d2d(m.buf, 0, m.buf, off, n, NULL), KVHAL_OUT_OF_RANGE);
        mirrored_check(&m, "after rejected out-of-range calls");
        mirrored_check(&other, "other buffer after rejected out-of-range calls");
    }
    /* A source that fits but a destination that does not, and the reverse. */
    CHECK_ST(kvhal_memcpy_d2d(other.buf, 1, m.buf, 0, 50, NULL), KVHAL_OUT_OF_RANGE);
    CHECK_ST(kvhal_memcpy_d2d(m.buf, 0, other.buf, 1, 50, NULL), KVHAL_OUT_OF_RANGE);
    mirrored_check(&m, "after rejected d2d");
    mirrored_check(&other, "after rejected d2d");
    /* Empty ranges at the very end are fine and change nothing. */
    CHECK_OK(kvhal_memcpy_h2d(m.buf, size, host, 0, NULL));
    CHECK_OK(kvhal_memcpy_d2h(host, m.buf, size, 0, NULL));
    CHECK_OK(kvhal_memset(m.buf, size, 1, 0, NULL));
    CHECK_OK(kvhal_memcpy_d2d(m.buf, size, other.buf, 50, 0, NULL));
    /* The last byte exactly. */
    CHECK_OK(kvhal_memcpy_h2d(m.buf, size - 1, host, 1, NULL));
    m.mirror[size - 1] = host[0];
    mirrored_check(&m, "after the last-byte write");
    mirrored_destroy(&m);
    mirrored_destroy(&other);
}

static void test_null_args(void **state)
{
    kvhal_device dev = device_of(state);
    mirrored m = mirrored_create(dev, 64);
    uint8_t host[64];
    memset(host, 0x77, sizeof host);
    CHECK_ST(kvhal_memcpy_h2d(NULL, 0, host, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "dst");
    CHECK_ST(kvhal_memcpy_h2d(m.buf, 0, NULL, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "src");
    CHECK_ST(kvhal_memcpy_d2h(host, NULL, 0, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "src");
    CHECK_ST(kvhal_memcpy_d2h(NULL, m.buf, 0, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "dst");
    CHECK_ST(kvhal_memcpy_d2d(NULL, 0, m.buf, 0, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "dst");
    CHECK_ST(kvhal_memcpy_d2d(m.buf, 0, NULL, 0, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "src");
    CHECK_ST(kvhal_memset(NULL, 0, 0, 8, NULL), KVHAL_INVALID_ARGUMENT);
    CHECK_ST(kvhal_buffer_destroy(NULL), KVHAL_OK); /* like free(NULL) */
    kvhal_buffer *w = (kvhal_buffer *)&w;
    CHECK_ST(kvhal_buffer_wrap(dev, NULL, 16, &w), KVHAL_INVALID_ARGUMENT);
    assert_null(w);
    assert_contains(kvhal_last_error(), "native");
    /* Zero-byte copies may pass NULL host pointers. */
    CHECK_OK(kvhal_memcpy_h2d(m.buf, 0, NULL, 0, NULL));
    CHECK_OK(kvhal_memcpy_d2h(NULL, m.buf, 0, 0, NULL));
    /* Accessors on NULL. */
    assert_int_equal(kvhal_buffer_size(NULL), 0);
    assert_null(kvhal_buffer_native(NULL));
    assert_int_equal(kvhal_buffer_device(NULL).type, KVHAL_MAX_DEVICE_TYPES);
    assert_int_equal(kvhal_stream_device(NULL).type, KVHAL_MAX_DEVICE_TYPES);
    CHECK_ST(kvhal_stream_create(dev, NULL), KVHAL_INVALID_ARGUMENT);
    CHECK_ST(kvhal_stream_synchronize(NULL), KVHAL_INVALID_ARGUMENT);
    CHECK_ST(kvhal_stream_destroy(NULL), KVHAL_OK);
    CHECK_ST(kvhal_stream_wrap(dev, NULL, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "out");
    CHECK_ST(kvhal_stream_check_errors(NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "s: NULL");
    mirrored_check(&m, "after rejected NULL-argument calls");
    mirrored_destroy(&m);
}

static void test_double_destroy(void **state)
{
    kvhal_device dev = device_of(state);
    kvhal_buffer *b;
    CHECK_OK(kvhal_buffer_create(dev, 128, &b));
    CHECK_OK(kvhal_buffer_destroy(b));
    CHECK_ST(kvhal_buffer_destroy(b), KVHAL_INVALID_HANDLE);
    assert_contains(kvhal_last_error(), "buf");
    CHECK_ST(kvhal_buffer_destroy(b), KVHAL_INVALID_HANDLE);

    kvhal_stream *s;
    CHECK_OK(kvhal_stream_create(dev, &s));
    CHECK_OK(kvhal_stream_destroy(s));
    CHECK_ST(kvhal_stream_destroy(s), KVHAL_INVALID_HANDLE);

    /* Something that never was a kvhal handle. */
    uint64_t fake[16] = {0};
    CHECK_ST(kvhal_buffer_destroy((kvhal_buffer *)(void *)fake), KVHAL_INVALID_HANDLE);
    CHECK_ST(kvhal_stream_destroy((kvhal_stream *)(void *)fake), KVHAL_INVALID_HANDLE);
    CHECK_ST(kvhal_memcpy_h2d((kvhal_buffer *)(void *)fake, 0, fake, 8, NULL), KVHAL_INVALID_HANDLE);
    for (size_t i = 0; i < 16; i++) assert_int_equal(fake[i], 0);

    /* A live handle of the other kind: rejected, and both handles stay usable. */
    mirrored m = mirrored_create(dev, 256);
    CHECK_OK(kvhal_stream_create(dev, &s));
    CHECK_ST(kvhal_buffer_destroy((kvhal_buffer *)(void *)s), KVHAL_INVALID_HANDLE);
    CHECK_ST(kvhal_stream_destroy((kvhal_stream *)(void *)m.buf), KVHAL_INVALID_HANDLE);
    CHECK_ST(kvhal_memcpy_h2d((kvhal_buffer *)(void *)s, 0, fake, 8, NULL), KVHAL_INVALID_HANDLE);
    CHECK_ST(kvhal_stream_synchronize((kvhal_stream *)(void *)m.buf), KVHAL_INVALID_HANDLE);
    CHECK_ST(kvhal_memcpy_h2d(m.buf, 0, fake, 8, (kvhal_stream *)(void *)m.buf), KVHAL_INVALID_HANDLE);
    mirrored_check(&m, "after wrong-kind handles");
    CHECK_OK(kvhal_stream_synchronize(s));
    CHECK_OK(kvhal_stream_destroy(s));
    mirrored_destroy(&m);
}

/* cpu: a host array. Elsewhere: another buffer's native memory (device pointer or cl_mem), which is what a framework
 * hands over. Either way writes through the wrapper land in the original and destroy leaves it alive. */
static void test_wrap(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0xabc + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    enum { N = 4099 };
    if (dev.type == KVHAL_DEVICE_CPU) {
        /* On the stack: were kvhal to free() it, the allocator would abort the test. */
        uint8_t array[N];
        uint8_t ref[N];
        fill_random(array, N);
        memcpy(ref, array, N);
        kvhal_buffer *w;
        CHECK_OK(kvhal_buffer_wrap(dev, array, N, &w));
        assert_ptr_equal(kvhal_buffer_native(w), array);
        assert_int_equal(kvhal_buffer_size(w), N);
        uint8_t src[100], back[N];
        fill_random(src, sizeof src);
        CHECK_OK(kvhal_memcpy_h2d(w, 7, src, sizeof src, NULL));
        memcpy(ref + 7, src, sizeof src);
        assert_memory_equal(array, ref, N);
        CHECK_OK(kvhal_memset(w, 2000, 0x99, 33, NULL));
        memset(ref + 2000, 0x99, 33);
        assert_memory_equal(array, ref, N);
        CHECK_OK(kvhal_memcpy_d2d(w, 3000, w, 1, 500, NULL));
        memmove(ref + 3000, ref + 1, 500);
        assert_memory_equal(array, ref, N);
        /* Writes to the array are visible through kvhal. */
        array[N - 1] ^= 0xff;
        ref[N - 1] ^= 0xff;
        CHECK_OK(kvhal_memcpy_d2h(back, w, 0, N, NULL));
        assert_memory_equal(back, ref, N);
        CHECK_ST(kvhal_memcpy_h2d(w, N, src, 1, NULL), KVHAL_OUT_OF_RANGE);
        CHECK_OK(kvhal_buffer_destroy(w));
        /* Still ours, unchanged by the destroy. */
        assert_memory_equal(array, ref, N);
        array[0] = 1;
        /* Heap memory too: free it ourselves after the destroy (a double free would abort). */
        uint8_t *heap = xmalloc(N);
        memset(heap, 0, N);
        CHECK_OK(kvhal_buffer_wrap(dev, heap, N, &w));
        CHECK_OK(kvhal_memset(w, 0, 0xab, N, NULL));
        CHECK_OK(kvhal_buffer_destroy(w));
        for (size_t i = 0; i < N; i++) assert_int_equal(heap[i], 0xab);
        free(heap);
    } else {
        mirrored m = mirrored_create(dev, N);
        kvhal_buffer *w;
        CHECK_OK(kvhal_buffer_wrap(dev, kvhal_buffer_native(m.buf), N, &w));
        assert_ptr_equal(kvhal_buffer_native(w), kvhal_buffer_native(m.buf));
        uint8_t src[100];
        fill_random(src, sizeof src);
        CHECK_OK(kvhal_memcpy_h2d(w, 11, src, sizeof src, NULL));
        memcpy(m.mirror + 11, src, sizeof src);
        CHECK_OK(kvhal_memset(w, 1000, 0x42, 77, NULL));
        memset(m.mirror + 1000, 0x42, 77);
        CHECK_OK(kvhal_device_synchronize(dev));
        mirrored_check(&m, "original after writes through its wrapper");
        CHECK_OK(kvhal_buffer_destroy(w));
        /* The original still works after the wrapper is gone. */
        CHECK_OK(kvhal_memset(m.buf, 0, 0x17, 5, NULL));
        memset(m.mirror, 0x17, 5);
        mirrored_check(&m, "original after its wrapper was destroyed");
        mirrored_destroy(&m);
    }
    kvhal_buffer *w = (kvhal_buffer *)&w;
    uint8_t one;
    CHECK_ST(kvhal_buffer_wrap(dev, &one, 0, &w), KVHAL_INVALID_ARGUMENT);
    assert_null(w);
    assert_contains(kvhal_last_error(), "bytes");
    CHECK_ST(kvhal_buffer_wrap(dev, &one, 1, NULL), KVHAL_INVALID_ARGUMENT);
}

static void test_streams(void **state)
{
    kvhal_device dev = device_of(state);
    rng_seed(0x5eed + (uint64_t)dev.type * 64 + (uint64_t)dev.id);
    kvhal_stream *s1, *s2;
    CHECK_OK(kvhal_stream_create(dev, &s1));
    CHECK_OK(kvhal_stream_create(dev, &s2));
    assert_ptr_not_equal(s1, s2);
    kvhal_device d = kvhal_stream_device(s1);
    assert_int_equal(d.type, dev.type);
    assert_int_equal(d.id, dev.id);
    CHECK_OK(kvhal_stream_synchronize(s1));

    mirrored a = mirrored_create(dev, MIB + 3);
    mirrored b = mirrored_create(dev, MIB + 3);
    uint8_t *src = xmalloc(5000);
    fill_random(src, 5000);
    /* Work ordered on s1: h2d, memset, d2d into b, then read back on s1. */
    CHECK_OK(kvhal_memcpy_h2d(a.buf, 3, src, 5000, s1));
    memcpy(a.mirror + 3, src, 5000);
    CHECK_OK(kvhal_memset(a.buf, 4000, 0x81, 2000, s1));
    memset(a.mirror + 4000, 0x81, 2000);
    CHECK_OK(kvhal_memcpy_d2d(b.buf, 1, a.buf, 2, MIB, s1));
    memcpy(b.mirror + 1, a.mirror + 2, MIB);
    uint8_t *back = xmalloc(MIB);
    CHECK_OK(kvhal_memcpy_d2h(back, b.buf, 1, MIB, s1));
    assert_memory_equal(back, b.mirror + 1, MIB);
    CHECK_OK(kvhal_stream_synchronize(s1));
    /* Another stream of the same device sees s1's finished work. */
    CHECK_OK(kvhal_memcpy_d2d(a.buf, 0, b.buf, 100, 1000, s2));
    memcpy(a.mirror, b.mirror + 100, 1000);
    CHECK_OK(kvhal_stream_synchronize(s2));
    mirrored_check(&a, "a after stream work");
    mirrored_check(&b, "b after stream work");
    free(back);
    free(src);
    mirrored_destroy(&a);
    mirrored_destroy(&b);
    CHECK_OK(kvhal_stream_destroy(s2));
    CHECK_OK(kvhal_stream_destroy(s1));

    /* The default streams wrap (NULL = legacy, KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD); work on them is
     * ordered like work on NULL, and the per-stream check waits for it. */
    void *const defaults[3] = {NULL, KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD};
    for (int i = 0; i < 3; i++) {
        kvhal_stream *w = NULL;
        CHECK_OK(kvhal_stream_wrap(dev, defaults[i], &w));
        assert_non_null(w);
        assert_int_equal(kvhal_stream_device(w).id, dev.id);
        mirrored c = mirrored_create(dev, 4096 + i);
        CHECK_OK(kvhal_memset(c.buf, 7, 0x40 + i, 1000, w));
        memset(c.mirror + 7, 0x40 + i, 1000);
        CHECK_OK(kvhal_stream_check_errors(w));
        mirrored_check(&c, "after work on a wrapped default stream");
        /* a live handle of another kind is refused, not used */
        CHECK_ST(kvhal_stream_check_errors((kvhal_stream *)c.buf), KVHAL_INVALID_HANDLE);
        mirrored_destroy(&c);
        CHECK_OK(kvhal_stream_destroy(w));
    }

    /* Streams on missing devices. */
    kvhal_stream *s = (kvhal_stream *)&s;
    int32_t n;
    CHECK_OK(kvhal_device_count(dev.type, &n));
    assert_int_not_equal(kvhal_stream_create((kvhal_device){dev.type, n}, &s), KVHAL_OK);
    assert_null(s);
    assert_int_not_equal(kvhal_stream_create((kvhal_device){dev.type, -1}, &s), KVHAL_OK);
    assert_int_not_equal(kvhal_stream_create((kvhal_device){(kvhal_device_type)99, 0}, &s), KVHAL_OK);
}

/* ---- tests over pairs of devices ---- */
static void test_stream_device_mismatch(void **state)
{
    (void)state;
    if (num_devs < 2) skip();
    for (int i = 0; i < num_devs; i++) {
        for (int j = 0; j < num_devs; j++) {
            if (i == j) continue;
            kvhal_device a = all_devs[i], b = all_devs[j];
            rng_seed(0xdead + (uint64_t)i * 131 + (uint64_t)j);
            mirrored m = mirrored_create(a, 300);
            mirrored m2 = mirrored_create(a, 300);
            mirrored mb = mirrored_create(b, 300);
            kvhal_stream *sb;
            CHECK_OK(kvhal_stream_create(b, &sb));
            uint8_t host[64];
            memset(host, 0x21, sizeof host);
            CHECK_ST(kvhal_memcpy_h2d(m.buf, 0, host, 64, sb), KVHAL_DEVICE_MISMATCH);
            assert_contains(kvhal_last_error(), "stream");
            CHECK_ST(kvhal_memcpy_d2h(host, m.buf, 0, 64, sb), KVHAL_DEVICE_MISMATCH);
            for (size_t k = 0; k < sizeof host; k++) assert_int_equal(host[k], 0x21);
            CHECK_ST(kvhal_memset(m.buf, 0, 0, 64, sb), KVHAL_DEVICE_MISMATCH);
            CHECK_ST(kvhal_memcpy_d2d(m.buf, 0, m2.buf, 0, 64, sb), KVHAL_DEVICE_MISMATCH);
            mirrored_check(&m, "after device-mismatch rejections");
            mirrored_check(&m2, "after device-mismatch rejections");
            /* A stream of either side is fine for a copy between the two devices. */
            CHECK_OK(kvhal_memcpy_d2d(m.buf, 10, mb.buf, 20, 100, sb));
            memcpy(m.mirror + 10, mb.mirror + 20, 100);
            CHECK_OK(kvhal_stream_synchronize(sb));
            CHECK_OK(kvhal_device_synchronize(a));
            mirrored_check(&m, "after a copy from another device on its stream");
            CHECK_OK(kvhal_stream_destroy(sb));
            mirrored_destroy(&m);
            mirrored_destroy(&m2);
            mirrored_destroy(&mb);
        }
    }
}

static void test_cross_device_copies(void **state)
{
    (void)state;
    if (num_devs < 2) skip();
    for (int i = 0; i < num_devs; i++) {
        for (int j = 0; j < num_devs; j++) {
            if (i == j) continue;
            kvhal_device a = all_devs[i], b = all_devs[j];
            rng_seed(0xc0ffee + (uint64_t)i * 131 + (uint64_t)j);
            mirrored ma = mirrored_create(a, MIB + 3 + 8);
            mirrored mb = mirrored_create(b, MIB + 3 + 16);
            kvhal_stream *sa, *sb;
            CHECK_OK(kvhal_stream_create(a, &sa));
            CHECK_OK(kvhal_stream_create(b, &sb));
            static const struct {
                size_t dst, src, n;
            } cases[] = {{0, 0, 1}, {3, 5, 1}, {1, 7, 4097}, {13, 5, MIB + 3}, {MIB + 3 + 15, MIB + 3 + 7, 1}};
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                kvhal_stream *streams[3] = {NULL, sa, sb};
                for (int si = 0; si < 3; si++) {
                    CHECK_OK(kvhal_memcpy_d2d(mb.buf, cases[k].dst, ma.buf, cases[k].src, cases[k].n, streams[si]));
                    memcpy(mb.mirror + cases[k].dst, ma.mirror + cases[k].src, cases[k].n);
                    if (streams[si]) CHECK_OK(kvhal_stream_synchronize(streams[si]));
                    CHECK_OK(kvhal_device_synchronize(a));
                    CHECK_OK(kvhal_device_synchronize(b));
                    mirrored_check(&mb, "destination of a copy between devices");
                    mirrored_check(&ma, "source of a copy between devices");
                    fill_random(ma.mirror, ma.size);
                    CHECK_OK(kvhal_memcpy_h2d(ma.buf, 0, ma.mirror, ma.size, NULL));
                }
            }
            CHECK_ST(kvhal_memcpy_d2d(mb.buf, 16, ma.buf, 0, MIB + 3 + 1, NULL), KVHAL_OUT_OF_RANGE);
            mirrored_check(&mb, "after a rejected copy between devices");
            CHECK_OK(kvhal_stream_destroy(sa));
            CHECK_OK(kvhal_stream_destroy(sb));
            mirrored_destroy(&ma);
            mirrored_destroy(&mb);
        }
    }
}

/* ---- the table: each per-device test once per present device, or once per empty type (skipped) ---- */
typedef struct named_test {
    const char *name;
    CMUnitTestFunction fn;
} named_test;

static const named_test per_device[] = {
    {"create_destroy", test_create_destroy},   {"create_alloc_failure", test_create_alloc_failure},
    {"round_trip", test_round_trip},           {"d2d_within", test_d2d_within},
    {"d2d_between", test_d2d_between},         {"memset", test_memset},
    {"range_errors", test_range_errors},       {"null_args", test_null_args},
    {"double_destroy", test_double_destroy},   {"wrap", test_wrap},
    {"streams", test_streams},
};
#define NPER ((int)(sizeof per_device / sizeof per_device[0]))

int main(void)
{
    static dev_case cases[BUILTIN_TYPES * KVHAL_MAX_DEVICES_PER_TYPE];
    int ncases = 0;
    for (int t = 0; t < BUILTIN_TYPES; t++) {
        int32_t n = 0;
        if (kvhal_device_count((kvhal_device_type)t, &n) != KVHAL_OK) {
            fprintf(stderr, "kvhal_device_count(%d): %s\n", t, kvhal_last_error());
            return 1;
        }
        if (n == 0) cases[ncases++] = (dev_case){{(kvhal_device_type)t, 0}, false};
        for (int32_t id = 0; id < n; id++) {
            cases[ncases++] = (dev_case){{(kvhal_device_type)t, id}, true};
            all_devs[num_devs++] = (kvhal_device){(kvhal_device_type)t, id};
        }
    }
    size_t ntests = (size_t)ncases * NPER + 2;
    struct CMUnitTest *tests = calloc(ntests, sizeof *tests);
    char (*names)[96] = calloc(ntests, sizeof *names);
    if (!tests || !names) return 1;
    size_t k = 0;
    for (int c = 0; c < ncases; c++) {
        for (int i = 0; i < NPER; i++) {
            if (cases[c].present)
                snprintf(names[k], sizeof names[k], "%s on %s:%d", per_device[i].name,
                         kvhal_device_type_name(cases[c].dev.type), cases[c].dev.id);
            else
                snprintf(names[k], sizeof names[k], "%s on %s (no device)", per_device[i].name,
                         kvhal_device_type_name(cases[c].dev.type));
            tests[k] = (struct CMUnitTest){names[k], per_device[i].fn, NULL, NULL, &cases[c]};
            k++;
        }
    }
    tests[k++] = (struct CMUnitTest){"stream_device_mismatch (needs 2 devices)", test_stream_device_mismatch, NULL,
                                     NULL, NULL};
    tests[k++] = (struct CMUnitTest){"cross_device_copies (needs 2 devices)", test_cross_device_copies, NULL, NULL,
                                     NULL};
    int rc = _cmocka_run_group_tests("buffer", tests, k, NULL, NULL);
    free(tests);
    free(names);
    return rc;
}

/* test_tensor.c — tensor values: dtype sizes and names, kvhal_tensor_make (contiguous, strided, bounds, overflow,
 * bad arguments), validate, numel / span_bytes / is_contiguous (also against a brute-force reference over many small
 * random layouts), and the views narrow, select and permute: the values they address and their errors. A failing
 * call must leave its output untouched. Tensors live on cpu:0; the tensor code is device-agnostic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

/* The dtypes of kvhal.h (it has no public count): f32 .. i64. */
enum { NUM_DTYPES = KVHAL_FP8_E5M2FNUZ + 1 };

static const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};

/* needle NULL: any message will do (only that there is one). */
static void assert_contains(const char *haystack, const char *needle)
{
    if (!haystack[0]) fail_msg("%s", "no error message");
    if (needle && !strstr(haystack, needle)) fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

#define CHECK_OK(expr)                                                                                          \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());      \
    } while (0)

/* Expects status want, a message naming needle, and *out unchanged. */
#define CHECK_FAILS(expr, want, needle, out)                                                                    \
    do {                                                                                                        \
        kvhal_tensor saved_;                                                                                    \
        memset((out), 0xab, sizeof *(out));                                                                     \
        memcpy(&saved_, (out), sizeof saved_);                                                                  \
        kvhal_clear_error();                                                                                    \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != (want))                                                                                      \
            fail_msg("%s: %s, expected %s (%s)", #expr, kvhal_status_name(st_), kvhal_status_name(want),       \
                     kvhal_last_error());                                                                       \
        assert_contains(kvhal_last_error(), (needle));                                                          \
        assert_memory_equal(&saved_, (out), sizeof saved_);                                                    \
    } while (0)

static kvhal_buffer *new_buffer(size_t bytes)
{
    kvhal_buffer *b = NULL;
    CHECK_OK(kvhal_buffer_create(cpu, bytes, &b));
    return b;
}

/* A buffer of n f32 whose element i holds the value i. */
static kvhal_buffer *iota_buffer(size_t n)
{
    float *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    kvhal_buffer *b = new_buffer(n * sizeof *h);
    CHECK_OK(kvhal_memcpy_h2d(b, 0, h, n * sizeof *h, NULL));
    free(h);
    return b;
}

/* The f32 element of t at idx, read through kvhal. */
static float at(const kvhal_tensor *t, const int64_t *idx)
{
    size_t off = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        assert_in_range(idx[i], 0, t->shape[i] - 1);
        off += (size_t)idx[i] * (size_t)t->strides[i] * sizeof(float);
    }
    float v;
    CHECK_OK(kvhal_memcpy_d2h(&v, t->buffer, off, sizeof v, NULL));
    return v;
}

static void assert_shape(const kvhal_tensor *t, int ndim, const int64_t *shape, const int64_t *strides)
{
    assert_int_equal(t->ndim, ndim);
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] != shape[i]) fail_msg("shape[%d] = %lld, expected %lld", i, (long long)t->shape[i],
                                              (long long)shape[i]);
        if (strides && t->strides[i] != strides[i])
            fail_msg("strides[%d] = %lld, expected %lld", i, (long long)t->strides[i], (long long)strides[i]);
    }
}

/* ---- dtypes ---- */
static void test_dtypes(void **state)
{
    (void)state;
    static const struct {
        kvhal_dtype dt;
        size_t size;
        const char *name;
    } cases[] = {
        {KVHAL_F32, 4, "f32"},           {KVHAL_F16, 2, "f16"},           {KVHAL_BF16, 2, "bf16"},
        {KVHAL_FP8_E4M3, 1, "fp8_e4m3"}, {KVHAL_FP8_E5M2, 1, "fp8_e5m2"}, {KVHAL_I32, 4, "i32"},
        {KVHAL_I64, 8, "i64"},           {KVHAL_FP8_E4M3FNUZ, 1, "fp8_e4m3fnuz"},
        {KVHAL_FP8_E5M2FNUZ, 1, "fp8_e5m2fnuz"},
    };
    assert_int_equal(sizeof cases / sizeof cases[0], NUM_DTYPES);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(kvhal_dtype_size(cases[i].dt), cases[i].size);
        assert_string_equal(kvhal_dtype_name(cases[i].dt), cases[i].name);
    }
    const int bad[] = {-1, NUM_DTYPES, 100, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(kvhal_dtype_size((kvhal_dtype)bad[i]), 0);
        const char *n = kvhal_dtype_name((kvhal_dtype)bad[i]);
        assert_non_null(n);
        for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++) assert_string_not_equal(n, cases[j].name);
    }
}

/* ---- make ---- */
static void test_make_contiguous(void **state)
{
    (void)state;
    kvhal_buffer *b = new_buffer(96);
    kvhal_tensor t;
    const int64_t shape[3] = {2, 3, 4};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 3, shape, NULL, &t));
    assert_ptr_equal(t.buffer, b);
    assert_int_equal(t.offset, 0);
    assert_int_equal(t.dtype, KVHAL_F32);
    assert_shape(&t, 3, shape, (const int64_t[]){12, 4, 1});
    for (int i = 3; i < KVHAL_MAX_DIMS; i++) {
        assert_int_equal(t.shape[i], 1); /* padding dims are neutral */
        assert_int_equal(t.strides[i], 0);
    }
    assert_int_equal(kvhal_tensor_numel(&t), 24);
    assert_int_equal(kvhal_tensor_span_bytes(&t), 96);
    assert_true(kvhal_tensor_is_contiguous(&t));
    CHECK_OK(kvhal_tensor_validate(&t));

    /* Six dims with size-1 dims in between. */
    const int64_t s6[6] = {1, 2, 1, 3, 1, 4};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 6, s6, NULL, &t));
    assert_shape(&t, 6, s6, (const int64_t[]){24, 12, 12, 4, 4, 1});
    assert_int_equal(kvhal_tensor_numel(&t), 24);
    assert_true(kvhal_tensor_is_contiguous(&t));

    /* The view may end exactly at the buffer's end, not one byte later. */
    const int64_t s1[1] = {23};
    CHECK_OK(kvhal_tensor_make(b, 4, KVHAL_F32, 1, s1, NULL, &t));
    assert_int_equal(t.offset, 4);
    assert_int_equal(kvhal_tensor_span_bytes(&t), 92);
    CHECK_FAILS(kvhal_tensor_make(b, 8, KVHAL_F32, 1, s1, NULL, &t), KVHAL_OUT_OF_RANGE, "96", &t);
    const int64_t s25[1] = {25};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 1, s25, NULL, &t), KVHAL_OUT_OF_RANGE, "tensor", &t);
    const int64_t big3[3] = {2, 3, 5};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 3, big3, NULL, &t), KVHAL_OUT_OF_RANGE, "96", &t);
    /* Every dtype's element size counts: 96 bytes hold 12 i64, not 13. */
    const int64_t s12[1] = {12}, s13[1] = {13};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_I64, 1, s12, NULL, &t));
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_I64, 1, s13, NULL, &t), KVHAL_OUT_OF_RANGE, "96", &t);
    const int64_t s96[1] = {96}, s97[1] = {97};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_FP8_E4M3, 1, s96, NULL, &t));
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_FP8_E5M2, 1, s97, NULL, &t), KVHAL_OUT_OF_RANGE, "96", &t);
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_make_strided(void **state)
{
    (void)state;
    kvhal_buffer *b = new_buffer(52);
    kvhal_tensor t;
    const int64_t shape[2] = {2, 3}, strides[2] = {8, 2};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, strides, &t));
    assert_shape(&t, 2, shape, strides);
    assert_int_equal(kvhal_tensor_numel(&t), 6);
    assert_int_equal(kvhal_tensor_span_bytes(&t), (8 + 2 * 2 + 1) * 4); /* last element at 12 */
    assert_false(kvhal_tensor_is_contiguous(&t));
    /* Shifting by one element runs past the end. */
    CHECK_FAILS(kvhal_tensor_make(b, 4, KVHAL_F32, 2, shape, strides, &t), KVHAL_OUT_OF_RANGE, "52", &t);

    /* Broadcast (stride 0): five rows over the same 3 elements. */
    const int64_t bs[2] = {5, 3}, bst[2] = {0, 1};
    CHECK_OK(kvhal_tensor_make(b, 40, KVHAL_F32, 2, bs, bst, &t));
    assert_int_equal(kvhal_tensor_numel(&t), 15);
    assert_int_equal(kvhal_tensor_span_bytes(&t), 12);
    assert_false(kvhal_tensor_is_contiguous(&t));
    /* A size-1 dim's stride does not matter for contiguity. */
    const int64_t os[2] = {1, 5}, ost[2] = {999, 1};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, os, ost, &t));
    assert_true(kvhal_tensor_is_contiguous(&t));
    assert_int_equal(kvhal_tensor_span_bytes(&t), 20);
    /* Transposed layout. */
    const int64_t ts[2] = {3, 2}, tst[2] = {1, 3};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, ts, tst, &t));
    assert_false(kvhal_tensor_is_contiguous(&t));
    assert_int_equal(kvhal_tensor_span_bytes(&t), 24);
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_make_empty(void **state)
{
    (void)state;
    kvhal_buffer *b = new_buffer(64);
    kvhal_tensor t;
    const int64_t shape[2] = {0, 4};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, NULL, &t));
    assert_int_equal(kvhal_tensor_numel(&t), 0);
    assert_int_equal(kvhal_tensor_span_bytes(&t), 0);
    assert_true(kvhal_tensor_is_contiguous(&t)); /* NULL strides promise row-major contiguous */
    const int64_t inner0[3] = {2, 0, 3};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 3, inner0, NULL, &t));
    assert_true(kvhal_tensor_is_contiguous(&t));
    CHECK_OK(kvhal_tensor_make(b, 64, KVHAL_F32, 2, shape, NULL, &t)); /* empty at the very end */
    CHECK_FAILS(kvhal_tensor_make(b, 68, KVHAL_F32, 2, shape, NULL, &t), KVHAL_OUT_OF_RANGE, "offset", &t);
    /* With a zero dim, huge strides address nothing and are fine. */
    const int64_t s2[2] = {3, 0}, st2[2] = {INT64_MAX, INT64_MAX};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, s2, st2, &t));
    assert_int_equal(kvhal_tensor_numel(&t), 0);
    assert_int_equal(kvhal_tensor_span_bytes(&t), 0);
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_make_overflow(void **state)
{
    (void)state;
    kvhal_buffer *b = new_buffer(64);
    kvhal_tensor t;
    /* Element count past 64 bits, row-major. */
    const int64_t huge2[2] = {(int64_t)1 << 62, (int64_t)1 << 62};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 2, huge2, NULL, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    /* (shape - 1) * stride past 64 bits. */
    const int64_t s4[1] = {4}, smax[1] = {INT64_MAX};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 1, s4, smax, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    const int64_t s3[2] = {3, 1}, st3[2] = {INT64_MAX, 1};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 2, s3, st3, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    /* Sum of the per-dim extents past 64 bits. */
    const int64_t s22[2] = {2, 2}, st22[2] = {INT64_MAX, INT64_MAX};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 2, s22, st22, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    /* Elements fit in 64 bits, bytes do not. */
    const int64_t sbytes[1] = {(int64_t)1 << 61};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_I64, 1, sbytes, NULL, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    const int64_t smaxs[1] = {INT64_MAX};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 1, smaxs, NULL, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    /* Offset + extent wraps around. */
    const int64_t s1[1] = {1};
    CHECK_FAILS(kvhal_tensor_make(b, SIZE_MAX - 3, KVHAL_F32, 1, s1, NULL, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    CHECK_FAILS(kvhal_tensor_make(b, SIZE_MAX - 7, KVHAL_I64, 1, s1, NULL, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    /* A shape whose element count overflows while its extent looks small must not pass as empty. */
    const int64_t sq[2] = {(int64_t)1 << 40, (int64_t)1 << 40}, st11[2] = {1, 1};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 2, sq, st11, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    const int64_t sq2[2] = {(int64_t)1 << 32, (int64_t)1 << 32}, st00[2] = {0, 0};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 2, sq2, st00, &t), KVHAL_OUT_OF_RANGE, NULL, &t);
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_make_bad_args(void **state)
{
    (void)state;
    kvhal_buffer *b = new_buffer(256);
    kvhal_tensor t;
    const int64_t shape[3] = {2, 3, 4};
    int64_t neg[3] = {2, -1, 4};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 3, neg, NULL, &t), KVHAL_INVALID_ARGUMENT, "shape[1]", &t);
    neg[1] = INT64_MIN;
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 3, neg, NULL, &t), KVHAL_INVALID_ARGUMENT, "shape[1]", &t);
    const int64_t nst[3] = {-12, 4, 1};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 3, shape, nst, &t), KVHAL_INVALID_ARGUMENT, "strides[0]", &t);
    const int64_t nst2[3] = {12, 4, -1};
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 3, shape, nst2, &t), KVHAL_INVALID_ARGUMENT, "strides[2]", &t);
    const int bad_dt[] = {-1, NUM_DTYPES, 1000};
    for (size_t i = 0; i < sizeof bad_dt / sizeof bad_dt[0]; i++)
        CHECK_FAILS(kvhal_tensor_make(b, 0, (kvhal_dtype)bad_dt[i], 3, shape, NULL, &t), KVHAL_INVALID_ARGUMENT, "dt",
                    &t);
    const int32_t bad_ndim[] = {0, -1, KVHAL_MAX_DIMS + 1, INT32_MAX};
    for (size_t i = 0; i < sizeof bad_ndim / sizeof bad_ndim[0]; i++)
        CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, bad_ndim[i], shape, NULL, &t), KVHAL_INVALID_ARGUMENT, "ndim",
                    &t);
    CHECK_FAILS(kvhal_tensor_make(b, 0, KVHAL_F32, 3, NULL, NULL, &t), KVHAL_INVALID_ARGUMENT, "shape", &t);
    CHECK_FAILS(kvhal_tensor_make(NULL, 0, KVHAL_F32, 3, shape, NULL, &t), KVHAL_INVALID_ARGUMENT, "buf", &t);
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F32, 3, shape, NULL, NULL), KVHAL_INVALID_ARGUMENT);
    /* Misaligned offsets for multi-byte dtypes; any offset for one-byte dtypes. */
    const int64_t one[1] = {1};
    CHECK_FAILS(kvhal_tensor_make(b, 2, KVHAL_F32, 1, one, NULL, &t), KVHAL_INVALID_ARGUMENT, "offset", &t);
    CHECK_FAILS(kvhal_tensor_make(b, 1, KVHAL_F16, 1, one, NULL, &t), KVHAL_INVALID_ARGUMENT, "offset", &t);
    CHECK_FAILS(kvhal_tensor_make(b, 3, KVHAL_BF16, 1, one, NULL, &t), KVHAL_INVALID_ARGUMENT, "offset", &t);
    CHECK_FAILS(kvhal_tensor_make(b, 4, KVHAL_I64, 1, one, NULL, &t), KVHAL_INVALID_ARGUMENT, "offset", &t);
    CHECK_FAILS(kvhal_tensor_make(b, 6, KVHAL_I32, 1, one, NULL, &t), KVHAL_INVALID_ARGUMENT, "offset", &t);
    CHECK_OK(kvhal_tensor_make(b, 1, KVHAL_FP8_E4M3, 1, one, NULL, &t));
    CHECK_OK(kvhal_tensor_make(b, 2, KVHAL_BF16, 1, one, NULL, &t));
    CHECK_OK(kvhal_tensor_make(b, 8, KVHAL_I64, 1, one, NULL, &t));
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_validate(void **state)
{
    (void)state;
    kvhal_buffer *b = new_buffer(96);
    kvhal_tensor good;
    const int64_t shape[2] = {4, 6};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, NULL, &good));
    CHECK_OK(kvhal_tensor_validate(&good));
    assert_int_equal(kvhal_tensor_validate(NULL), KVHAL_INVALID_ARGUMENT);

    kvhal_tensor t = good;
    t.buffer = NULL;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    t = good;
    t.ndim = 0;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "ndim");
    t.ndim = KVHAL_MAX_DIMS + 1;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    t = good;
    t.dtype = (kvhal_dtype)77;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "dtype");
    t = good;
    t.shape[1] = -6;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "shape[1]");
    t = good;
    t.strides[0] = -1;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "strides[0]");
    t = good;
    t.offset = 4;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_OUT_OF_RANGE);
    t = good;
    t.offset = 1;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_INVALID_ARGUMENT);
    t = good;
    t.dtype = KVHAL_I64;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_OUT_OF_RANGE);
    t = good;
    t.shape[0] = (int64_t)1 << 40; /* element count overflows together with the next line */
    t.shape[1] = (int64_t)1 << 40;
    t.strides[0] = 1;
    t.strides[1] = 1;
    assert_int_equal(kvhal_tensor_validate(&t), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "overflow");
    /* Padding dims past ndim are ignored. */
    t = good;
    t.shape[4] = -5;
    t.strides[5] = -9;
    CHECK_OK(kvhal_tensor_validate(&t));

    /* Queries on NULL or malformed values do not crash. */
    assert_int_equal(kvhal_tensor_numel(NULL), 0);
    assert_int_equal(kvhal_tensor_span_bytes(NULL), 0);
    assert_false(kvhal_tensor_is_contiguous(NULL));
    t = good;
    t.ndim = 0;
    assert_int_equal(kvhal_tensor_numel(&t), 0);
    assert_false(kvhal_tensor_is_contiguous(&t));
    CHECK_OK(kvhal_buffer_destroy(b));
}

/* Brute force over small random layouts: validity, numel, span and contiguity against a direct computation. */
static void test_random_layouts(void **state)
{
    (void)state;
    const size_t bufsize = 200;
    kvhal_buffer *b = new_buffer(bufsize);
    uint64_t rng = 0x243f6a8885a308d3ULL;
#define NEXT() (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng)
    int ok_count = 0;
    for (int iter = 0; iter < 20000; iter++) {
        int32_t ndim = 1 + (int32_t)(NEXT() % 4);
        kvhal_dtype dt = (kvhal_dtype)(NEXT() % NUM_DTYPES);
        size_t es = kvhal_dtype_size(dt);
        int64_t shape[4], strides[4];
        for (int i = 0; i < ndim; i++) {
            shape[i] = (int64_t)(NEXT() % 5);
            if (NEXT() % 8 == 0) shape[i] = 1;
            strides[i] = (int64_t)(NEXT() % 9);
        }
        size_t offset = (size_t)(NEXT() % 50) * es;
        if (NEXT() % 10 == 0) offset += 1; /* sometimes misaligned */
        bool use_strides = NEXT() % 4 != 0;
        int64_t st[4];
        int64_t expect = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            st[i] = use_strides ? strides[i] : expect;
            expect *= shape[i] ? shape[i] : 1;
        }
        /* Reference. */
        int64_t numel = 1, last = 0;
        for (int i = 0; i < ndim; i++) numel *= shape[i];
        for (int i = 0; i < ndim; i++) last += (shape[i] > 0 ? shape[i] - 1 : 0) * st[i];
        kvhal_status want;
        if (offset % es) want = KVHAL_INVALID_ARGUMENT;
        else if (numel == 0) want = offset <= bufsize ? KVHAL_OK : KVHAL_OUT_OF_RANGE;
        else want = offset + (size_t)(last + 1) * es <= bufsize ? KVHAL_OK : KVHAL_OUT_OF_RANGE;
        bool contig = true; /* an empty tensor counts as contiguous */
        int64_t e = numel ? 1 : 0;
        for (int i = ndim - 1; i >= 0; i--) {
            if (numel && shape[i] != 1 && st[i] != e) contig = false;
            e *= shape[i];
        }

        kvhal_tensor t;
        kvhal_status got = kvhal_tensor_make(b, offset, dt, ndim, shape, use_strides ? strides : NULL, &t);
        if (got != want)
            fail_msg("iter %d: ndim %d dt %s offset %zu shape [%lld %lld %lld %lld] strides [%lld %lld %lld %lld]: "
                     "%s, expected %s (%s)", iter, ndim, kvhal_dtype_name(dt), offset, (long long)shape[0],
                     (long long)(ndim > 1 ? shape[1] : -1), (long long)(ndim > 2 ? shape[2] : -1),
                     (long long)(ndim > 3 ? shape[3] : -1), (long long)st[0], (long long)(ndim > 1 ? st[1] : -1),
                     (long long)(ndim > 2 ? st[2] : -1), (long long)(ndim > 3 ? st[3] : -1), kvhal_status_name(got),
                     kvhal_status_name(want), kvhal_last_error());
        if (got != KVHAL_OK) continue;
        ok_count++;
        assert_int_equal(kvhal_tensor_numel(&t), numel);
        assert_int_equal(kvhal_tensor_span_bytes(&t), numel ? (size_t)(last + 1) * es : 0);
        if (kvhal_tensor_is_contiguous(&t) != contig) fail_msg("iter %d: is_contiguous is %d, expected %d", iter,
                                                               !contig, contig);
        for (int i = 0; i < ndim; i++) assert_int_equal(t.strides[i], st[i]);
        CHECK_OK(kvhal_tensor_validate(&t));
    }
#undef NEXT
    /* Both outcomes must have been exercised plenty. */
    assert_true(ok_count > 2000);
    assert_true(ok_count < 18000);
    CHECK_OK(kvhal_buffer_destroy(b));
}

/* ---- views ---- */
static void test_narrow(void **state)
{
    (void)state;
    kvhal_buffer *b = iota_buffer(24);
    kvhal_tensor t, n, n2;
    const int64_t shape[2] = {4, 6};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, NULL, &t));

    CHECK_OK(kvhal_tensor_narrow(&t, 1, 2, 3, &n));
    assert_shape(&n, 2, (const int64_t[]){4, 3}, (const int64_t[]){6, 1});
    assert_int_equal(n.offset, 8);
    assert_false(kvhal_tensor_is_contiguous(&n));
    assert_int_equal(kvhal_tensor_numel(&n), 12);
    for (int64_t i = 0; i < 4; i++)
        for (int64_t j = 0; j < 3; j++) assert_true(at(&n, (int64_t[]){i, j}) == (float)(i * 6 + j + 2));
    /* Narrow of a narrow composes. */
    CHECK_OK(kvhal_tensor_narrow(&n, 1, 1, 2, &n2));
    for (int64_t i = 0; i < 4; i++)
        for (int64_t j = 0; j < 2; j++) assert_true(at(&n2, (int64_t[]){i, j}) == (float)(i * 6 + j + 3));
    CHECK_OK(kvhal_tensor_narrow(&n2, 0, 3, 1, &n2));
    assert_true(at(&n2, (int64_t[]){0, 1}) == 22.0f);

    CHECK_OK(kvhal_tensor_narrow(&t, 0, 1, 2, &n));
    assert_true(kvhal_tensor_is_contiguous(&n));
    assert_int_equal(n.offset, 24);
    assert_true(at(&n, (int64_t[]){1, 5}) == 17.0f);
    /* Whole dim, empty at either end. */
    CHECK_OK(kvhal_tensor_narrow(&t, 1, 0, 6, &n));
    assert_memory_equal(&n, &t, sizeof t);
    CHECK_OK(kvhal_tensor_narrow(&t, 1, 6, 0, &n));
    assert_int_equal(kvhal_tensor_numel(&n), 0);
    CHECK_OK(kvhal_tensor_validate(&n));
    CHECK_OK(kvhal_tensor_narrow(&t, 0, 0, 0, &n));
    assert_int_equal(kvhal_tensor_numel(&n), 0);

    CHECK_FAILS(kvhal_tensor_narrow(&t, -1, 0, 1, &n), KVHAL_INVALID_ARGUMENT, "dim", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 2, 0, 1, &n), KVHAL_INVALID_ARGUMENT, "dim", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 1, -1, 2, &n), KVHAL_OUT_OF_RANGE, "start", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 1, 0, -1, &n), KVHAL_OUT_OF_RANGE, "length", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 1, 5, 2, &n), KVHAL_OUT_OF_RANGE, "6", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 1, 7, 0, &n), KVHAL_OUT_OF_RANGE, "start", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 0, 0, 5, &n), KVHAL_OUT_OF_RANGE, "length", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 1, INT64_MAX, INT64_MAX, &n), KVHAL_OUT_OF_RANGE, "start", &n);
    CHECK_FAILS(kvhal_tensor_narrow(&t, 1, 1, INT64_MAX, &n), KVHAL_OUT_OF_RANGE, "length", &n);
    CHECK_FAILS(kvhal_tensor_narrow(NULL, 0, 0, 1, &n), KVHAL_INVALID_ARGUMENT, "t", &n);
    assert_int_equal(kvhal_tensor_narrow(&t, 0, 0, 1, NULL), KVHAL_INVALID_ARGUMENT);
    kvhal_tensor bad = t;
    bad.ndim = 9;
    CHECK_FAILS(kvhal_tensor_narrow(&bad, 0, 0, 1, &n), KVHAL_INVALID_ARGUMENT, "ndim", &n);
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_select(void **state)
{
    (void)state;
    kvhal_buffer *b = iota_buffer(60);
    kvhal_tensor t, s, s1;
    const int64_t shape[2] = {4, 6};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, NULL, &t));

    CHECK_OK(kvhal_tensor_select(&t, 0, 2, &s));
    assert_shape(&s, 1, (const int64_t[]){6}, (const int64_t[]){1});
    assert_int_equal(s.offset, 48);
    assert_true(kvhal_tensor_is_contiguous(&s));
    assert_int_equal(s.shape[1], 1);
    assert_int_equal(s.strides[1], 0);
    for (int64_t j = 0; j < 6; j++) assert_true(at(&s, (int64_t[]){j}) == (float)(12 + j));
    CHECK_OK(kvhal_tensor_validate(&s));

    CHECK_OK(kvhal_tensor_select(&t, 1, 5, &s));
    assert_shape(&s, 1, (const int64_t[]){4}, (const int64_t[]){6});
    assert_int_equal(s.offset, 20);
    assert_false(kvhal_tensor_is_contiguous(&s));
    for (int64_t i = 0; i < 4; i++) assert_true(at(&s, (int64_t[]){i}) == (float)(i * 6 + 5));

    /* 3-D, middle dim: [3, 4, 5] -> [3, 5]. */
    kvhal_tensor t3;
    const int64_t shape3[3] = {3, 4, 5};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 3, shape3, NULL, &t3));
    CHECK_OK(kvhal_tensor_select(&t3, 1, 3, &s));
    assert_shape(&s, 2, (const int64_t[]){3, 5}, (const int64_t[]){20, 1});
    for (int64_t i = 0; i < 3; i++)
        for (int64_t k = 0; k < 5; k++) assert_true(at(&s, (int64_t[]){i, k}) == (float)(i * 20 + 3 * 5 + k));
    /* Select twice down to 1-D, then a select on 1-D is refused. */
    CHECK_OK(kvhal_tensor_select(&s, 0, 2, &s1));
    assert_shape(&s1, 1, (const int64_t[]){5}, (const int64_t[]){1});
    assert_true(at(&s1, (int64_t[]){4}) == (float)(40 + 15 + 4));
    CHECK_FAILS(kvhal_tensor_select(&s1, 0, 0, &s), KVHAL_INVALID_ARGUMENT, "1-D", &s);

    CHECK_FAILS(kvhal_tensor_select(&t, 0, -1, &s), KVHAL_OUT_OF_RANGE, "index", &s);
    CHECK_FAILS(kvhal_tensor_select(&t, 0, 4, &s), KVHAL_OUT_OF_RANGE, "index", &s);
    CHECK_FAILS(kvhal_tensor_select(&t, 1, 6, &s), KVHAL_OUT_OF_RANGE, "index", &s);
    CHECK_FAILS(kvhal_tensor_select(&t, 1, INT64_MIN, &s), KVHAL_OUT_OF_RANGE, "index", &s);
    CHECK_FAILS(kvhal_tensor_select(&t, 2, 0, &s), KVHAL_INVALID_ARGUMENT, "dim", &s);
    CHECK_FAILS(kvhal_tensor_select(&t, -1, 0, &s), KVHAL_INVALID_ARGUMENT, "dim", &s);
    CHECK_FAILS(kvhal_tensor_select(NULL, 0, 0, &s), KVHAL_INVALID_ARGUMENT, "t", &s);
    assert_int_equal(kvhal_tensor_select(&t, 0, 0, NULL), KVHAL_INVALID_ARGUMENT);
    /* Selecting in an empty dim has no valid index. */
    kvhal_tensor e;
    CHECK_OK(kvhal_tensor_narrow(&t, 0, 0, 0, &e));
    CHECK_FAILS(kvhal_tensor_select(&e, 0, 0, &s), KVHAL_OUT_OF_RANGE, "index", &s);
    CHECK_OK(kvhal_buffer_destroy(b));
}

static void test_permute(void **state)
{
    (void)state;
    kvhal_buffer *b = iota_buffer(24);
    kvhal_tensor t, p, back;
    const int64_t shape[3] = {2, 3, 4};
    CHECK_OK(kvhal_tensor_make(b, 0, KVHAL_F32, 3, shape, NULL, &t));

    const int32_t perm[3] = {2, 0, 1};
    CHECK_OK(kvhal_tensor_permute(&t, perm, &p));
    assert_shape(&p, 3, (const int64_t[]){4, 2, 3}, (const int64_t[]){1, 12, 4});
    assert_int_equal(p.offset, 0);
    assert_false(kvhal_tensor_is_contiguous(&p));
    assert_int_equal(kvhal_tensor_numel(&p), 24);
    assert_int_equal(kvhal_tensor_span_bytes(&p), 96);
    for (int64_t a = 0; a < 4; a++)
        for (int64_t i = 0; i < 2; i++)
            for (int64_t j = 0; j < 3; j++) assert_true(at(&p, (int64_t[]){a, i, j}) == (float)(i * 12 + j * 4 + a));
    CHECK_OK(kvhal_tensor_validate(&p));
    /* The inverse permutation gives the original back. */
    const int32_t inv[3] = {1, 2, 0};
    CHECK_OK(kvhal_tensor_permute(&p, inv, &back));
    assert_memory_equal(&back, &t, sizeof t);
    assert_true(kvhal_tensor_is_contiguous(&back));
    const int32_t id[3] = {0, 1, 2};
    CHECK_OK(kvhal_tensor_permute(&t, id, &back));
    assert_memory_equal(&back, &t, sizeof t);
    /* Views of views: permute then narrow then select. */
    kvhal_tensor n, s;
    CHECK_OK(kvhal_tensor_narrow(&p, 0, 1, 2, &n)); /* a in {1, 2} */
    CHECK_OK(kvhal_tensor_select(&n, 1, 1, &s));     /* i = 1 */
    assert_shape(&s, 2, (const int64_t[]){2, 3}, (const int64_t[]){1, 4});
    for (int64_t a = 0; a < 2; a++)
        for (int64_t j = 0; j < 3; j++) assert_true(at(&s, (int64_t[]){a, j}) == (float)(12 + j * 4 + a + 1));

    const int32_t rep[3] = {0, 0, 1}, oob[3] = {0, 1, 3}, negp[3] = {-1, 0, 1};
    CHECK_FAILS(kvhal_tensor_permute(&t, rep, &p), KVHAL_INVALID_ARGUMENT, "perm[1]", &p);
    CHECK_FAILS(kvhal_tensor_permute(&t, oob, &p), KVHAL_INVALID_ARGUMENT, "perm[2]", &p);
    CHECK_FAILS(kvhal_tensor_permute(&t, negp, &p), KVHAL_INVALID_ARGUMENT, "perm[0]", &p);
    CHECK_FAILS(kvhal_tensor_permute(&t, NULL, &p), KVHAL_INVALID_ARGUMENT, "perm", &p);
    CHECK_FAILS(kvhal_tensor_permute(NULL, perm, &p), KVHAL_INVALID_ARGUMENT, "t", &p);
    assert_int_equal(kvhal_tensor_permute(&t, perm, NULL), KVHAL_INVALID_ARGUMENT);
    CHECK_OK(kvhal_buffer_destroy(b));
}

/* Regression of a fuzz_tensor finding: a view of an empty tensor moved its offset by index * stride, past the
 * buffer, and the (still empty) view no longer validated. Views of empty tensors keep their offset. */
static void test_empty_views_stay_valid(void **state)
{
    (void)state;
    kvhal_buffer *b;
    CHECK_OK(kvhal_buffer_create(cpu, 64, &b));
    kvhal_tensor t, v;
    const int64_t shape[2] = {0, 4}, strides[2] = {1, 1000};
    CHECK_OK(kvhal_tensor_make(b, 8, KVHAL_F32, 2, shape, strides, &t));
    CHECK_OK(kvhal_tensor_select(&t, 1, 3, &v));
    assert_int_equal(v.offset, 8);
    CHECK_OK(kvhal_tensor_validate(&v));
    CHECK_OK(kvhal_tensor_narrow(&t, 1, 3, 1, &v));
    assert_int_equal(v.offset, 8);
    CHECK_OK(kvhal_tensor_validate(&v));
    CHECK_OK(kvhal_buffer_destroy(b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_views_stay_valid),
        cmocka_unit_test(test_dtypes),         cmocka_unit_test(test_make_contiguous),
        cmocka_unit_test(test_make_strided),   cmocka_unit_test(test_make_empty),
        cmocka_unit_test(test_make_overflow),  cmocka_unit_test(test_make_bad_args),
        cmocka_unit_test(test_validate),       cmocka_unit_test(test_random_layouts),
        cmocka_unit_test(test_narrow),         cmocka_unit_test(test_select),
        cmocka_unit_test(test_permute),
    };
    return cmocka_run_group_tests_name("tensor", tests, NULL, NULL);
}

/* test_gpu_math.c — checks on the host, bit for bit, the arithmetic the CUDA and HIP kernels share with the library
 * (include/kvhal/kvhal_numerics.h, backends/gpu/kvhal_gpu_math.h): f32 -> fp8 in all four formats against an
 * independent rounding (the generic kvhal_num_round_magnitude, saturated and signed per format), through the
 * library's kvhal_f32_to_fp8 too; the fnuz conversion through the OCP code of twice the value; bf16 -> f32; the
 * power-of-two and reciprocal scale shortcuts against true division; and the fastdiv divisors against '/'. The same
 * headers are compiled into the kernels, so this is what makes GPU fp8 output equal kvhal_f32_to_fp8 without a GPU
 * in CI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../backends/gpu/kvhal_gpu_math.h"
#include "kvhal.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    /* xorshift64*: deterministic, so a failure reproduces */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* The reference: f32 bits u rounded by the generic rounding (a different method from the encoders' magic-number
 * addition), saturated to the format's largest finite code (max_code), with the format's NaN and zero rules. */
static uint32_t ref_fp8(uint32_t u, int m, int bias, uint32_t max_code, bool fnuz)
{
    const uint32_t a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
    if (a > 0x7f800000u) return fnuz ? 0x80u : sign | 0x7fu;
    uint32_t code = a == 0x7f800000u ? max_code : kvhal_num_round_magnitude(a, m, bias);
    if (code > max_code) code = max_code;
    return fnuz && code == 0 ? 0u : sign | code;
}

static void check_fp8_bits(uint32_t u)
{
    const float x = kvhal_num_bits_f32(u);
    const uint32_t e4 = kvhal_num_f32_to_e4m3fn(x), e5 = kvhal_num_f32_to_e5m2(x);
    const uint32_t r4 = ref_fp8(u, 3, 7, 0x7e, false), r5 = ref_fp8(u, 2, 15, 0x7b, false);
    const uint32_t z4 = kvhal_num_f32_to_e4m3fnuz(x), z5 = kvhal_num_f32_to_e5m2fnuz(x);
    const uint32_t q4 = ref_fp8(u, 3, 8, 0x7f, true), q5 = ref_fp8(u, 2, 16, 0x7f, true);
    /* fnuz through the OCP conversion of twice the value (the kernels' sm_89+ path; the OCP codes as the hardware
     * gives them, which the reference equals) */
    volatile float q2 = x * 2.0f;
    const uint32_t q2u = kvhal_num_f32_bits(q2);
    const uint32_t h4 = kvhal_num_fnuz_from_ocp(ref_fp8(q2u, 3, 7, 0x7e, false), q2, u, 1);
    const uint32_t h5 = kvhal_num_fnuz_from_ocp(ref_fp8(q2u, 2, 15, 0x7b, false), q2, u, 0);
    if (h4 != q4 || h5 != q5) {
        print_error("f32 bits 0x%08x: fnuz from the OCP code of 2x: e4m3fnuz 0x%02x ref 0x%02x, e5m2fnuz 0x%02x ref "
                    "0x%02x\n", (unsigned)u, (unsigned)h4, (unsigned)q4, (unsigned)h5, (unsigned)q5);
        fail();
    }
    if (z4 != q4 || z5 != q5) {
        print_error("f32 bits 0x%08x: e4m3fnuz 0x%02x ref 0x%02x, e5m2fnuz 0x%02x ref 0x%02x\n", (unsigned)u,
                    (unsigned)z4, (unsigned)q4, (unsigned)z5, (unsigned)q5);
        fail();
    }
    if (e4 != r4 || e5 != r5) {
        print_error("f32 bits 0x%08x: e4m3 0x%02x ref 0x%02x, e5m2 0x%02x ref 0x%02x\n", (unsigned)u,
                    (unsigned)e4, (unsigned)r4, (unsigned)e5, (unsigned)r5);
        fail();
    }
    /* the library's entry points are these conversions */
    if (kvhal_f32_to_fp8(x, KVHAL_FP8_E4M3) != r4 || kvhal_f32_to_fp8(x, KVHAL_FP8_E5M2) != r5 ||
        kvhal_f32_to_fp8(x, KVHAL_FP8_E4M3FNUZ) != q4 || kvhal_f32_to_fp8(x, KVHAL_FP8_E5M2FNUZ) != q5) {
        print_error("f32 bits 0x%08x: kvhal_f32_to_fp8 differs from the reference\n", (unsigned)u);
        fail();
    }
}

/* Every sign, exponent and top 15 mantissa bits, with low bytes at and around every rounding boundary: each fp8
 * rounding decision (normal and subnormal, both formats) is made by mantissa bits above bit 7. */
static void test_fp8_structured(void **state)
{
    (void)state;
    static const uint32_t lows[] = {0x00, 0x01, 0x80, 0xff};
    for (uint32_t hi = 0; hi < (1u << 24); hi++)
        for (size_t i = 0; i < sizeof lows / sizeof lows[0]; i++) check_fp8_bits(hi << 8 | lows[i]);
}

static void test_fp8_random(void **state)
{
    (void)state;
    for (int i = 0; i < (1 << 22); i++) check_fp8_bits((uint32_t)rnd());
    /* specials: zeros, infinities, NaNs, largest finite, f32 subnormals */
    static const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                  0x7f800001u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x807fffffu, 0x43e00000u,
                                  0x43f00000u, 0x47600000u, 0x47700000u, 0x3a800000u, 0x37800000u};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) check_fp8_bits(sp[i]);
}

/* (f16 inputs use the hardware conversion on the device, exact by definition.) */
static void test_bf16_to_f32(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        const uint32_t gb = kvhal_num_f32_bits(kvhal_num_bf16_to_f32((uint16_t)h));
        const uint32_t rb = kvhal_num_f32_bits(kvhal_bf16_to_f32((uint16_t)h));
        if (gb != rb) {
            print_error("bf16 0x%04x: gpu 0x%08x ref 0x%08x\n", (unsigned)h, (unsigned)gb, (unsigned)rb);
            fail();
        }
    }
}

/* The kernels multiply by 1/scale instead of dividing when the scale is a power of two: the fp8 codes must be
 * those of the true quotient. Other scales must not be taken for powers of two. */
static void test_pow2_scale(void **state)
{
    (void)state;
    assert_true(kvhal_num_scale_is_pow2(1.0f));
    assert_true(kvhal_num_scale_is_pow2(0.5f));
    assert_true(kvhal_num_scale_is_pow2(1024.0f));
    assert_true(kvhal_num_scale_is_pow2(-2.0f));
    assert_false(kvhal_num_scale_is_pow2(3.0f));
    assert_false(kvhal_num_scale_is_pow2(0.1f));
    assert_false(kvhal_num_scale_is_pow2(0.0f));
    assert_false(kvhal_num_scale_is_pow2(kvhal_num_bits_f32(0x7f800000u))); /* inf */
    assert_false(kvhal_num_scale_is_pow2(kvhal_num_bits_f32(0x7f000000u))); /* 2^127: 1/s is subnormal */
    assert_false(kvhal_num_scale_is_pow2(kvhal_num_bits_f32(0x00400000u))); /* subnormal */
    for (int k = -126; k <= 126; k++) {
        const float s = kvhal_num_bits_f32((uint32_t)(k + 127) << 23);
        assert_true(kvhal_num_scale_is_pow2(s));
        const float inv = 1.0f / s;
        for (int i = 0; i < 2000; i++) {
            const float x = kvhal_num_bits_f32((uint32_t)rnd());
            volatile float q = x / s, m = x * inv;
            if (q != q) continue; /* NaN in, NaN out: compared by the fp8 tests */
            if (kvhal_num_f32_bits(q) != kvhal_num_f32_bits(m)) {
                print_error("x 0x%08x / 2^%d: quotient 0x%08x, product 0x%08x\n", (unsigned)kvhal_num_f32_bits(x), k,
                            (unsigned)kvhal_num_f32_bits(q), (unsigned)kvhal_num_f32_bits(m));
                fail();
            }
        }
    }
}

/* The kernels' quotient for a scale mode (SM_MUL 0, SM_RCP 1, SM_DIV 2), with their mapping of a NaN quotient of a
 * non-NaN input to the saturated code (an infinity of the input's sign converts to it). */
static float kernel_quot(float x, float s, float inv, int mode)
{
    if (x != x) return x; /* the kernels take a NaN's sign and NaN-ness from the input */
    float q = mode == 0 ? x * inv : mode == 1 ? kvhal_num_quot_rcp(x, s, inv) : x / s;
    if (q != q) q = kvhal_num_bits_f32((kvhal_num_f32_bits(x) & 0x80000000u) | 0x7f800000u);
    return q;
}

/* One x at scale s: the fp8 codes of both formats must be those of x / s; returns whether the f32 quotients differ
 * where an fp8 format could tell them apart (|x / s| in [2^-20, 2^17)). */
static bool check_quot(float x, float s, int mode)
{
    const float inv = 1.0f / s;
    volatile float e = x / s;
    const float q = kernel_quot(x, s, inv, mode);
    static const kvhal_dtype fmts[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
    for (int f = 0; f < 4; f++) {
        const kvhal_dtype fmt = fmts[f];
        if (kvhal_f32_to_fp8(q, fmt) != kvhal_f32_to_fp8(e, fmt)) {
            print_error("%s: x 0x%08x / scale %a (mode %d): got 0x%02x, x / s gives 0x%02x\n", kvhal_dtype_name(fmt),
                        (unsigned)kvhal_num_f32_bits(x), (double)s, mode, kvhal_f32_to_fp8(q, fmt),
                        kvhal_f32_to_fp8(e, fmt));
            fail();
        }
    }
    const float ae = e < 0 ? -e : e;
    return kvhal_num_f32_bits(q) != kvhal_num_f32_bits(e) && ae >= 0x1p-20f && ae < 0x1p17f;
}

/* The scale modes: powers of two multiply, [2^-64, 2^64] takes the reciprocal, the rest divides. */
static void test_scale_mode(void **state)
{
    (void)state;
    assert_int_equal(kvhal_gpu_scale_mode(0.5f, 2.0f), 0);
    assert_int_equal(kvhal_gpu_scale_mode(0.5f, 0.37f), 1);
    assert_int_equal(kvhal_gpu_scale_mode(0.37f, 0.37f), 1);
    assert_int_equal(kvhal_gpu_scale_mode(0x1p-64f, 0x1p64f), 0);
    assert_int_equal(kvhal_gpu_scale_mode(0x1.8p-64f, 0x1.8p63f), 1);
    assert_int_equal(kvhal_gpu_scale_mode(0x1.8p-65f, 0.37f), 2);
    assert_int_equal(kvhal_gpu_scale_mode(0.37f, 0x1.8p64f), 2);
    assert_int_equal(kvhal_gpu_scale_mode(1e-30f, 1e-30f), 2);
    assert_int_equal(kvhal_gpu_scale_mode(0x1p-100f, 0.37f), 2);
}

/* Calibrated scales without a division: specials, saturation and exact rounding ties at fixed scales, then random
 * scales over the reciprocal's whole range with inputs drawn around their quotients' fp8 range. (The proof over all
 * 2^32 inputs per scale is tests/fp8_check --math.) The plain product x * (1/s) must differ somewhere, or
 * this test could not tell the correction from none. */
static void test_rcp_scale(void **state)
{
    (void)state;
    static const float scales[] = {0.37f, 0.1f, 1.0f / 3.0f, 0.7f, 1.7f, 17.3f, 1e-5f, 4567.89f, 0x1.5p-64f,
                                   0x1.fffffep63f, 0.99999994f, 1.00000012f};
    static const uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                  0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x807fffffu, 0x00800000u, 0x80800000u};
    uint64_t naive_diffs = 0;
    for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
        const float s = scales[i];
        assert_int_equal(kvhal_gpu_scale_mode(s, s), 1);
        for (size_t j = 0; j < sizeof sp / sizeof sp[0]; j++) assert_false(check_quot(kvhal_num_bits_f32(sp[j]), s, 1));
        /* x = fp8 midpoints and largest values times s: quotients on (or next to) rounding ties and saturation */
        for (int f = 0; f < 4; f++) {
            static const kvhal_dtype fmts[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
            const kvhal_dtype fmt = fmts[f];
            for (uint32_t c = 0; c < 0x7f; c++) {
                const float lo = kvhal_fp8_to_f32((uint8_t)c, fmt), hi = kvhal_fp8_to_f32((uint8_t)(c + 1), fmt);
                if (hi != hi || lo != lo) continue;
                const float mid = (lo + hi) * 0.5f;
                for (int d = -2; d <= 2; d++) {
                    const float x = kvhal_num_bits_f32(kvhal_num_f32_bits(mid * s) + (uint32_t)d);
                    assert_false(check_quot(x, s, 1));
                    assert_false(check_quot(-x, s, 1));
                    volatile float e = x / s, m = x * (1.0f / s);
                    if (kvhal_f32_to_fp8(e, fmt) != kvhal_f32_to_fp8(m, fmt)) naive_diffs++;
                }
            }
        }
    }
    /* exact ties: x / s lands exactly on a midpoint (0.5 * 2^-k scales keep the products exact) */
    assert_int_equal(kvhal_f32_to_fp8(kernel_quot(0.0625f * 3.0f, 3.0f, 1.0f / 3.0f, 1), KVHAL_FP8_E4M3),
                     kvhal_f32_to_fp8(0.0625f, KVHAL_FP8_E4M3));
    assert_int_equal(kvhal_f32_to_fp8(kernel_quot(1.0625f * 3.0f, 3.0f, 1.0f / 3.0f, 1), KVHAL_FP8_E4M3), 0x38);
    assert_int_equal(kvhal_f32_to_fp8(kernel_quot(1.1875f * 3.0f, 3.0f, 1.0f / 3.0f, 1), KVHAL_FP8_E4M3), 0x3a);
    /* saturation: far past the largest value, and an overflowing quotient */
    assert_int_equal(kvhal_f32_to_fp8(kernel_quot(1e38f, 1e-5f, 1e5f, 1), KVHAL_FP8_E4M3), 0x7e);
    assert_int_equal(kvhal_f32_to_fp8(kernel_quot(-1e38f, 1e-5f, 1e5f, 1), KVHAL_FP8_E5M2), 0xfb);
    assert_true(naive_diffs > 0);
    for (int i = 0; i < 512; i++) {
        const uint32_t sb = 0x1f800000u + (uint32_t)(rnd() % (0x5f800000u - 0x1f800000u + 1));
        const float s = kvhal_num_bits_f32(sb);
        const int mode = kvhal_gpu_scale_mode(s, s);
        assert_true(mode == 0 || mode == 1);
        for (int j = 0; j < 4096; j++) {
            /* |x / s| in about [2^-24, 2^20]: x's exponent is s's plus -24..20 */
            const int32_t ex = (int32_t)((sb >> 23) & 0xff) + (int32_t)(rnd() % 45) - 24;
            if (ex < 1 || ex > 254) continue;
            const float x = kvhal_num_bits_f32((uint32_t)(rnd() & 0x807fffffu) | (uint32_t)ex << 23);
            if (mode == 1) { /* the fnuz kernels' halved scale and doubled reciprocal give exactly twice the quotient */
                volatile float q1 = kvhal_num_quot_rcp(x, s, 1.0f / s), two = 2.0f * q1;
                const float q2 = kvhal_num_quot_rcp(x, s * 0.5f, 2.0f / s);
                if (two == two && two - two == 0 && kvhal_num_f32_bits(q2) != kvhal_num_f32_bits(two)) {
                    print_error("x 0x%08x, scale %a: rcp(x, s/2, 2/s) 0x%08x, 2 rcp(x, s, 1/s) 0x%08x\n",
                                (unsigned)kvhal_num_f32_bits(x), (double)s, (unsigned)kvhal_num_f32_bits(q2),
                                (unsigned)kvhal_num_f32_bits(two));
                    fail();
                }
            }
            if (check_quot(x, s, mode)) {
                print_error("x 0x%08x / scale %a: the f32 quotient differs from x / s\n",
                            (unsigned)kvhal_num_f32_bits(x), (double)s);
                fail();
            }
        }
    }
}

static void check_div32(uint32_t n, kvhal_fastdiv32 f)
{
    if (kvhal_fastdiv32_div(n, f) != n / f.d) {
        print_error("fastdiv32: %u / %u gave %u\n", (unsigned)n, (unsigned)f.d, (unsigned)kvhal_fastdiv32_div(n, f));
        fail();
    }
}

static void check_div64(uint64_t n, kvhal_fastdiv64 f)
{
    if (kvhal_fastdiv64_div(n, f) != n / f.d) {
        print_error("fastdiv64: %llu / %llu gave %llu\n", (unsigned long long)n, (unsigned long long)f.d,
                    (unsigned long long)kvhal_fastdiv64_div(n, f));
        fail();
    }
}

static void test_fastdiv(void **state)
{
    (void)state;
    uint64_t ds[4096];
    size_t nd = 0;
    for (uint64_t d = 1; d <= 1024; d++) ds[nd++] = d;
    for (int k = 1; k <= 31; k++) {
        ds[nd++] = (1ull << k) - 1;
        ds[nd++] = 1ull << k;
        ds[nd++] = (1ull << k) + 1;
    }
    while (nd < sizeof ds / sizeof ds[0]) ds[nd++] = 1 + rnd() % (1ull << 31);
    for (size_t i = 0; i < nd; i++) {
        const uint32_t d = (uint32_t)ds[i];
        const kvhal_fastdiv32 f = kvhal_fastdiv32_make(d);
        const kvhal_fastdiv64 g = kvhal_fastdiv64_make(d);
        const uint32_t edge[] = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, UINT32_MAX, UINT32_MAX - 1,
                                 UINT32_MAX / d * d, UINT32_MAX / d * d - 1};
        for (size_t j = 0; j < sizeof edge / sizeof edge[0]; j++) {
            check_div32(edge[j], f);
            check_div64(edge[j], g);
        }
        for (int j = 0; j < 200; j++) {
            check_div32((uint32_t)rnd(), f);
            check_div64(rnd(), g);
        }
    }
    /* 64-bit divisors up to 2^63 */
    for (int k = 32; k <= 63; k++) {
        const uint64_t cands[] = {(1ull << k) - 1, 1ull << k, (1ull << k) + 1, (1ull << k) + (rnd() >> (64 - k))};
        for (size_t c = 0; c < sizeof cands / sizeof cands[0]; c++) {
            const kvhal_fastdiv64 g = kvhal_fastdiv64_make(cands[c]);
            const uint64_t edge[] = {0, 1, cands[c] - 1, cands[c], cands[c] + 1, UINT64_MAX, UINT64_MAX - 1};
            for (size_t j = 0; j < sizeof edge / sizeof edge[0]; j++) check_div64(edge[j], g);
            for (int j = 0; j < 2000; j++) check_div64(rnd(), g);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_structured), cmocka_unit_test(test_fp8_random),
        cmocka_unit_test(test_bf16_to_f32),    cmocka_unit_test(test_pow2_scale),
        cmocka_unit_test(test_fastdiv),        cmocka_unit_test(test_scale_mode),
        cmocka_unit_test(test_rcp_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

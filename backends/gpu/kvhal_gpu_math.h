/* kvhal_gpu_math.h — the arithmetic the GPU kernels share with the host: exact conversions from bf16 to f32,
 * f32 to fp8 (e4m3fn, e5m2) rounding to nearest even and saturating, and division by a run-time constant through
 * a multiply (fastdiv). Written in plain integer/float code so that CUDA, HIP and a host C compiler all build the
 * same functions: tests/test_gpu_math.c checks them on the host against core/convert.c, bit for bit, which is what
 * makes the kernels' fp8 output match kvhal_f32_to_fp8 on every vendor. */
#ifndef KVHAL_GPU_MATH_H
#define KVHAL_GPU_MATH_H

#ifndef __HIPCC_RTC__ /* hiprtc defines the fixed-width types itself */
#include <stdint.h>
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KVHAL_HD __host__ __device__ inline __attribute__((always_inline))
#else
#include <math.h>
#include <string.h>
#define KVHAL_HD static inline
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define KVHAL_GPU_DEVICE_PASS 1
#endif

KVHAL_HD uint32_t kvhal_gpu_f32_bits(float x)
{
#ifdef KVHAL_GPU_DEVICE_PASS
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

KVHAL_HD float kvhal_gpu_bits_f32(uint32_t u)
{
#ifdef KVHAL_GPU_DEVICE_PASS
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

KVHAL_HD float kvhal_gpu_bf16_to_f32(uint32_t h) { return kvhal_gpu_bits_f32((h & 0xffffu) << 16); }

/* f32 -> fp8 magnitude code, round to nearest even, saturating (infinities too; NaN gives the largest finite
 * code, see below). The rounding is one f32 addition: |y| (clamped to the largest finite fp8 value) plus a magic
 * power of two whose ulp is the fp8 quantum of |y|'s binade (2^(e-3) for e4m3), or the subnormal step 2^-9 below
 * the normal range (the magic's floor). The FPU's round-to-nearest-even then rounds onto the fp8 grid, and the
 * code is the distance to the magic in ulps plus the binade's first code, read off the magic's exponent. Integer
 * work is two masks, two min/max, a shift and two adds: the kernels convert 8 values per 16-byte load, and on Hopper integer and
 * compare instructions issue at half the rate of f32 arithmetic, which otherwise bounds them below memory speed.
 * Normal codes: diff = 8 + m and (bits(magic) >> 20) = (e + 147) * 8, so code = diff + that - 1128 = (e + 7) * 8 + m;
 * subnormal: magic = 2^14, (bits >> 20) = 1128, code = diff = k steps. e5m2 alike with 2 mantissa bits. */
/* a: the bits of a non-negative float or of a positive NaN (NaN -> the largest finite code). The four formats
 * differ only in constants: max_bits the largest finite value's bits, to_magic 2^(23 - m) (y * to_magic has the
 * exponent of the magic), floor_bits the magic of the subnormal step, and the code offset read off the magic's
 * exponent bits (>> shift = 23 - m). */
KVHAL_HD uint32_t kvhal_gpu_fp8_mag(uint32_t a, uint32_t max_bits, float to_magic, uint32_t floor_bits,
                                    uint32_t shift, uint32_t offset)
{
    /* the clamp is an integer min on the magnitude's bits: float min's NaN rules differ between vendors (and for
     * signalling NaNs), while here every NaN deterministically becomes the largest value */
    a = a < max_bits ? a : max_bits;
    const float yc = kvhal_gpu_bits_f32(a);
    uint32_t mb = kvhal_gpu_f32_bits(yc * to_magic) & 0x7f800000u; /* 2^(e + 23 - m) */
    mb = mb > floor_bits ? mb : floor_bits;
    return kvhal_gpu_f32_bits(yc + kvhal_gpu_bits_f32(mb)) - mb + ((mb >> shift) - offset);
}

/* e4m3fn: 448, floor 2^14 (ulp 2^-9) */
KVHAL_HD uint32_t kvhal_gpu_e4m3_mag_bits(uint32_t a) { return kvhal_gpu_fp8_mag(a, 0x43e00000u, 1048576.0f, 0x46800000u, 20, 1128u); }
/* e5m2: 57344, floor 2^7 (ulp 2^-16) */
KVHAL_HD uint32_t kvhal_gpu_e5m2_mag_bits(uint32_t a) { return kvhal_gpu_fp8_mag(a, 0x47600000u, 2097152.0f, 0x43000000u, 21, 536u); }
/* AMD's fnuz formats: e4m3fnuz (bias 8, largest 240 = code 0x7f, subnormal step 2^-10: floor 2^13, offset 1120)
 * and e5m2fnuz (bias 16, largest 57344 = 0x7f, step 2^-17: floor 2^6, offset 532). */
KVHAL_HD uint32_t kvhal_gpu_e4m3fnuz_mag_bits(uint32_t a) { return kvhal_gpu_fp8_mag(a, 0x43700000u, 1048576.0f, 0x46000000u, 20, 1120u); }
KVHAL_HD uint32_t kvhal_gpu_e5m2fnuz_mag_bits(uint32_t a) { return kvhal_gpu_fp8_mag(a, 0x47600000u, 2097152.0f, 0x42800000u, 21, 532u); }

/* Whole fnuz conversions: NaN -> 0x80 (the one NaN), a zero magnitude -> 0x00 (no negative zero), else sign | mag.
 * Exactly kvhal_f32_to_fp8 with KVHAL_FP8_E4M3FNUZ / KVHAL_FP8_E5M2FNUZ. */
KVHAL_HD uint32_t kvhal_gpu_fnuz_finish(uint32_t u, uint32_t mag)
{
    return (u & 0x7fffffffu) > 0x7f800000u ? 0x80u : mag ? ((u >> 24) & 0x80u) | mag : 0u;
}

KVHAL_HD uint32_t kvhal_gpu_f32_to_e4m3fnuz(float x)
{
    const uint32_t u = kvhal_gpu_f32_bits(x);
    return kvhal_gpu_fnuz_finish(u, kvhal_gpu_e4m3fnuz_mag_bits(u & 0x7fffffffu));
}

KVHAL_HD uint32_t kvhal_gpu_f32_to_e5m2fnuz(float x)
{
    const uint32_t u = kvhal_gpu_f32_bits(x);
    return kvhal_gpu_fnuz_finish(u, kvhal_gpu_e5m2fnuz_mag_bits(u & 0x7fffffffu));
}

/* An fnuz code from the OCP code of twice the quotient: fnuz has the OCP format's bits with the exponent bias one
 * higher, so rounding q2 = 2q onto e4m3fn's (e5m2's) grid rounds q onto e4m3fnuz's (e5m2fnuz's), and the hardware's
 * OCP conversion serves fnuz too. Only these differ: an OCP code at or above the largest OCP magnitude (0x7e, 0x7b:
 * saturated, or q2 beyond it, or NaN) takes the software conversion of q2 / 2, and a negative zero loses its sign.
 * ocp: the OCP code of q2 (one byte, as cvt.rn.satfinite gives it); x_bits: the input (sign and NaN-ness); e4m3:
 * which pair. Exactly kvhal_f32_to_fp8(q2 / 2, fnuz format) for any q2 = 2 * (x / s) (tests/test_gpu_math.c). */
KVHAL_HD uint32_t kvhal_gpu_fnuz_from_ocp(uint32_t ocp, float q2, uint32_t x_bits, int e4m3)
{
    const uint32_t mag = ocp & 0x7fu;
    if (mag >= (e4m3 ? 0x7eu : 0x7bu)) {
        const uint32_t a = kvhal_gpu_f32_bits(q2 * 0.5f) & 0x7fffffffu;
        return kvhal_gpu_fnuz_finish(x_bits, e4m3 ? kvhal_gpu_e4m3fnuz_mag_bits(a) : kvhal_gpu_e5m2fnuz_mag_bits(a));
    }
    return mag ? ocp : 0u;
}

KVHAL_HD uint32_t kvhal_gpu_e4m3_mag(float y) { return kvhal_gpu_e4m3_mag_bits(kvhal_gpu_f32_bits(y) & 0x7fffffffu); }
KVHAL_HD uint32_t kvhal_gpu_e5m2_mag(float y) { return kvhal_gpu_e5m2_mag_bits(kvhal_gpu_f32_bits(y) & 0x7fffffffu); }

/* OR-ing these into a NaN's magnitude code (the largest finite) gives 0x7f, fp8's NaN. */
#define KVHAL_GPU_E4M3_NAN_BIT 0x01u
#define KVHAL_GPU_E5M2_NAN_BIT 0x04u

/* Whole conversions: sign | magnitude, NaN -> sign | 0x7f. Exactly kvhal_f32_to_fp8. */
KVHAL_HD uint32_t kvhal_gpu_f32_to_e4m3(float x)
{
    const uint32_t u = kvhal_gpu_f32_bits(x);
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u ? KVHAL_GPU_E4M3_NAN_BIT : 0u;
    return ((u >> 24) & 0x80u) | kvhal_gpu_e4m3_mag(x) | nan;
}

KVHAL_HD uint32_t kvhal_gpu_f32_to_e5m2(float x)
{
    const uint32_t u = kvhal_gpu_f32_bits(x);
    const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u ? KVHAL_GPU_E5M2_NAN_BIT : 0u;
    return ((u >> 24) & 0x80u) | kvhal_gpu_e5m2_mag(x) | nan;
}

/* True when dividing by s equals multiplying by 1/s for every x: s = +-2^k with 1/s a normal f32. */
KVHAL_HD int kvhal_gpu_scale_is_pow2(float s)
{
    const uint32_t u = kvhal_gpu_f32_bits(s);
    const uint32_t e = (u >> 23) & 0xffu;
    return (u & 0x7fffffu) == 0 && e >= 1u && e <= 253u;
}

/* ---- x / s for a calibrated (non power-of-two) scale, without a division ----
 * y = x * inv (inv = 1/s rounded to nearest by the host) is within 1.5 ulp of x / s; one Newton correction with the
 * exact fma residual r = y*s - x then gives the correctly rounded quotient, the same bits as the IEEE division
 * x / s (Markstein's correction), wherever no intermediate underflows. That holds for every x whose quotient
 * matters to fp8 when s lies in [2^-64, 2^64] (kvhal_gpu_scale_rcp_ok): a residual that underflows belongs to an
 * |x| below 2^-102, whose quotient (below 2^-38) rounds to a zero of either fp8 format either way. Proved on all
 * 2^32 inputs for a set of scales by tools/kvhal-fp8-check (the fp8 codes, against kvhal_f32_to_fp8(x / s)), and on
 * random scales by tests/test_gpu_math.c.
 * Specials: the residual is formed as y*s - x and subtracted (not x - y*s and added) so that x = -0 gives -0;
 * a y that is +-inf (x infinite, or the quotient overflows) gives NaN, which the callers map to the saturated code
 * (an input NaN stays NaN), so no select is needed on the common path. */
KVHAL_HD float kvhal_gpu_quot_rcp(float x, float s, float inv)
{
#ifdef KVHAL_GPU_DEVICE_PASS
    const float y = x * inv;
    const float r = __fmaf_rn(y, s, -x);
    return __fmaf_rn(-r, inv, y);
#else
    const float y = x * inv;
    const float r = fmaf(y, s, -x);
    return fmaf(-r, inv, y);
#endif
}

/* True when kvhal_gpu_quot_rcp is exact (for fp8) for scale s: 2^-64 <= s <= 2^64. */
KVHAL_HD int kvhal_gpu_scale_rcp_ok(float s)
{
    const uint32_t u = kvhal_gpu_f32_bits(s);
    return u >= 0x1f800000u && u <= 0x5f800000u;
}

/* How the kernels divide by the scales: 0 multiply by the exact 1/s (both scales powers of two), 1 the reciprocal
 * with its correction (both in rcp range), 2 the IEEE division. */
KVHAL_HD int kvhal_gpu_scale_mode(float k_scale, float v_scale)
{
    if (kvhal_gpu_scale_is_pow2(k_scale) && kvhal_gpu_scale_is_pow2(v_scale)) return 0;
    if (kvhal_gpu_scale_rcp_ok(k_scale) && kvhal_gpu_scale_rcp_ok(v_scale)) return 1;
    return 2;
}

/* ---- division by a run-time constant (Granlund-Montgomery, round-up variant with the 33rd/65th bit handled by
 * the two-shift form): q = (t + ((n - t) >> s1)) >> s2 with t = mulhi(n, m). Valid for every n and d >= 1. ---- */
typedef struct kvhal_fastdiv32 {
    uint32_t d, m, s1, s2;
} kvhal_fastdiv32;

typedef struct kvhal_fastdiv64 {
    uint64_t d, m;
    uint32_t s1, s2;
} kvhal_fastdiv64;

static inline uint32_t kvhal_gpu_ceil_log2_64(uint64_t d)
{
    uint32_t l = 0;
    while (l < 64 && ((uint64_t)1 << l) < d) l++;
    return l;
}

/* Host side. d in [1, 2^31]. */
static inline kvhal_fastdiv32 kvhal_fastdiv32_make(uint32_t d)
{
    kvhal_fastdiv32 f;
    const uint32_t l = kvhal_gpu_ceil_log2_64(d);
    f.d = d;
    f.m = (uint32_t)((((uint64_t)1 << 32) * ((((uint64_t)1) << l) - d)) / d + 1);
    f.s1 = l < 1 ? l : 1;
    f.s2 = l > 0 ? l - 1 : 0;
    return f;
}

/* Host side. d in [1, 2^63]. */
static inline kvhal_fastdiv64 kvhal_fastdiv64_make(uint64_t d)
{
    __extension__ typedef unsigned __int128 u128;
    kvhal_fastdiv64 f;
    const uint32_t l = kvhal_gpu_ceil_log2_64(d);
    f.d = d;
    f.m = (uint64_t)((((u128)1 << 64) * (((u128)1 << l) - d)) / d + 1);
    f.s1 = l < 1 ? l : 1;
    f.s2 = l > 0 ? l - 1 : 0;
    return f;
}

KVHAL_HD uint32_t kvhal_fastdiv32_div(uint32_t n, kvhal_fastdiv32 f)
{
#ifdef KVHAL_GPU_DEVICE_PASS
    const uint32_t t = __umulhi(n, f.m);
#else
    const uint32_t t = (uint32_t)(((uint64_t)n * f.m) >> 32);
#endif
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

KVHAL_HD uint64_t kvhal_fastdiv64_div(uint64_t n, kvhal_fastdiv64 f)
{
#ifdef KVHAL_GPU_DEVICE_PASS
    const uint64_t t = __umul64hi(n, f.m);
#else
    __extension__ typedef unsigned __int128 u128;
    const uint64_t t = (uint64_t)(((u128)n * f.m) >> 64);
#endif
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

#endif /* KVHAL_GPU_MATH_H */

/* kvhal_numerics.h — kvhal's number formats: exact conversions between f32 and the narrow formats a KV cache stores
 * (f16, bf16, fp8 e4m3fn / e5m2 and AMD's e4m3fnuz / e5m2fnuz), and the division of a value by its fp8 scale.
 *
 * Every function is static inline (KVHAL_NUM_HD: __host__ __device__ under CUDA and HIP), so one definition serves
 * the core's public conversions (kvhal_f32_to_fp8 & co.), the CPU backend's loops, the CUDA and HIP kernels (also
 * compiled at run time by hiprtc) and vendors' modules, which may include this header from an install
 * (<kvhal/kvhal_numerics.h>). The OpenCL kernels, compiled at run time from OpenCL C, carry their own copy
 * (backends/opencl/kv_common.cl), which tests/test_opencl_numerics.c checks against this header.
 *
 * Rounding is to nearest, ties to even, subnormals included, in every direction. fp8 saturates: a finite value or an
 * infinity beyond the largest finite code becomes that code (as CUDA's __NV_SATFINITE does), because a KV cache
 * must never turn a large activation into inf or NaN; NaN gives sign | 0x7f (OCP formats) or 0x80, the one NaN of
 * the fnuz formats, which also have no negative zero. f16 and bf16 follow IEEE 754 (overflow gives inf, a NaN stays a
 * quiet NaN of its sign). The f32 arithmetic used needs the default rounding mode and f32 evaluation
 * (FLT_EVAL_METHOD 0), which every target kvhal builds for has.
 *
 * Contract: pure functions of their arguments (no state, no allocation, no errors), so any thread may call them at
 * once, and device code that uses them may be captured in a CUDA/HIP graph. No input is invalid: every f32 bit
 * pattern (NaN, infinities, subnormals) and every 8- or 16-bit code has a defined result, as above. */
#ifndef KVHAL_NUMERICS_H
#define KVHAL_NUMERICS_H

#ifndef __HIPCC_RTC__ /* hiprtc defines the fixed-width types itself and has no C library headers */
#include <math.h>
#include <stdint.h>
#include <string.h>
#endif

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define KVHAL_NUM_HD __host__ __device__ inline __attribute__((always_inline))
#else
#define KVHAL_NUM_HD static inline
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define KVHAL_NUM_DEVICE_PASS 1
#endif

/* ---- bit patterns ---- */

KVHAL_NUM_HD uint32_t kvhal_num_f32_bits(float x)
{
#ifdef KVHAL_NUM_DEVICE_PASS
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

KVHAL_NUM_HD float kvhal_num_bits_f32(uint32_t u)
{
#ifdef KVHAL_NUM_DEVICE_PASS
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* Whether the f32 bits u are a NaN. */
KVHAL_NUM_HD int kvhal_num_bits_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* ---- generic rounding ----
 * a: the bits of a finite, non-negative f32, rounded to a binary format with m stored mantissa bits and the given
 * exponent bias. Returns the magnitude code (biased exponent << m | mantissa); a value that rounds past the format's
 * exponent range yields a code past its largest finite one, which the caller saturates or turns into inf. The carry
 * of a mantissa that rounds up runs into the exponent field, which is exactly the next binade. The f16 encoder's
 * rounding, and the independent reference the fp8 encoders below are tested against (tests/test_gpu_math.c). */
KVHAL_NUM_HD uint32_t kvhal_num_round_magnitude(uint32_t a, int m, int bias)
{
    const uint32_t e8 = a >> 23;
    const uint32_t sig = e8 == 0 ? (a & 0x7fffffu) : ((a & 0x7fffffu) | 0x800000u); /* f32 subnormal: no implicit bit */
    const int e = e8 == 0 ? -126 : (int)e8 - 127;
    const int emin = 1 - bias;
    uint32_t code;
    int shift;
    if (e >= emin) {
        shift = 23 - m;
        code = ((uint32_t)(e + bias) << m) | ((sig & 0x7fffffu) >> shift);
    } else {
        shift = 23 - m + (emin - e);
        if (shift >= 32) return 0; /* far below half the smallest subnormal */
        code = sig >> shift;
    }
    const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) code++;
    return code;
}

/* ---- f16 and bf16 ---- */

/* Branch-free (every path computed, one selected) so that conversion loops vectorize. */
KVHAL_NUM_HD float kvhal_num_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t m = (uint32_t)(h & 0x7fffu) << 13; /* exponent and fraction, aligned to f32 */
    const uint32_t e = m & 0x0f800000u;
    const uint32_t normal = m + ((127u - 15u) << 23);
    const uint32_t special = m + ((255u - 31u) << 23); /* inf / NaN: exponent all ones, payload kept */
    /* subnormal: as a normal one exponent step up, minus the implicit bit, subtracted as a float (exact) */
    const uint32_t sub =
        kvhal_num_f32_bits(kvhal_num_bits_f32(m + ((127u - 15u + 1u) << 23)) - kvhal_num_bits_f32(113u << 23));
    const uint32_t r = e == 0x0f800000u ? special : e == 0 ? sub : normal;
    return kvhal_num_bits_f32(r | sign);
}

/* NaN: a quiet NaN of its sign with the payload's top bits kept; overflow: inf. */
KVHAL_NUM_HD uint16_t kvhal_num_f32_to_f16(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu));
    if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    const uint32_t code = kvhal_num_round_magnitude(a, 10, 15);
    return (uint16_t)(sign | (code >= 0x7c00u ? 0x7c00u : code));
}

KVHAL_NUM_HD float kvhal_num_bf16_to_f32(uint16_t h) { return kvhal_num_bits_f32((uint32_t)h << 16); }

/* Adding 0x7fff (+1 when the kept lsb is odd) rounds to nearest even; overflow carries into inf. NaN: quiet. */
KVHAL_NUM_HD uint16_t kvhal_num_f32_to_bf16(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    if (kvhal_num_bits_nan(u)) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* ---- f32 -> fp8 ----
 * The magnitude code of a: the bits of a non-negative float, or of a positive NaN (which gives the largest finite
 * code: the callers add the NaN bit). The rounding is one f32 addition: |y| (clamped to the largest finite value)
 * plus a magic power of two whose ulp is the fp8 quantum of |y|'s binade (2^(e-3) for e4m3), or the subnormal step
 * below the normal range (the magic's floor). The FPU's round-to-nearest-even then rounds onto the fp8 grid, and the
 * code is the distance to the magic in ulps plus the binade's first code, read off the magic's exponent. Integer
 * work is two masks, two min/max, a shift and two adds (on GPUs integer and compare instructions issue at half the
 * rate of f32 arithmetic). For e4m3fn: diff = 8 + m and (bits(magic) >> 20) = (e + 147) * 8, so code = diff + that
 * - 1128 = (e + 7) * 8 + m; subnormal: magic = 2^14, (bits >> 20) = 1128, code = diff = k steps.
 * The formats differ only in constants: max_bits the largest finite value's bits, to_magic 2^(23 - m) (y * to_magic
 * has the exponent of the magic), floor_bits the magic of the subnormal step, and the code offset read off the
 * magic's exponent bits (>> shift = 23 - m). The clamp is an integer min on the bits: float min's NaN rules differ
 * between vendors (and for signalling NaNs), while here every NaN deterministically becomes the largest value. */
KVHAL_NUM_HD uint32_t kvhal_num_fp8_mag(uint32_t a, uint32_t max_bits, float to_magic, uint32_t floor_bits,
                                        uint32_t shift, uint32_t offset)
{
    a = a < max_bits ? a : max_bits;
    const float yc = kvhal_num_bits_f32(a);
    uint32_t mb = kvhal_num_f32_bits(yc * to_magic) & 0x7f800000u; /* 2^(e + 23 - m) */
    mb = mb > floor_bits ? mb : floor_bits;
    return kvhal_num_f32_bits(yc + kvhal_num_bits_f32(mb)) - mb + ((mb >> shift) - offset);
}

/* e4m3fn: largest 448, subnormal step 2^-9 (floor 2^14) */
KVHAL_NUM_HD uint32_t kvhal_num_e4m3fn_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x43e00000u, 1048576.0f, 0x46800000u, 20, 1128u);
}
/* e5m2: largest 57344, step 2^-16 (floor 2^7) */
KVHAL_NUM_HD uint32_t kvhal_num_e5m2_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x47600000u, 2097152.0f, 0x43000000u, 21, 536u);
}
/* e4m3fnuz: bias 8, largest 240 = code 0x7f, step 2^-10 (floor 2^13) */
KVHAL_NUM_HD uint32_t kvhal_num_e4m3fnuz_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x43700000u, 1048576.0f, 0x46000000u, 20, 1120u);
}
/* e5m2fnuz: bias 16, largest 57344 = code 0x7f, step 2^-17 (floor 2^6) */
KVHAL_NUM_HD uint32_t kvhal_num_e5m2fnuz_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x47600000u, 2097152.0f, 0x42800000u, 21, 532u);
}

/* OR-ing these into a NaN's magnitude code (the largest finite) gives 0x7f, the OCP formats' NaN. */
#define KVHAL_NUM_E4M3FN_NAN_BIT 0x01u
#define KVHAL_NUM_E5M2_NAN_BIT 0x04u

/* OCP formats: sign | magnitude, NaN -> sign | 0x7f. */
KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e4m3fn(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    const uint32_t nan = kvhal_num_bits_nan(u) ? KVHAL_NUM_E4M3FN_NAN_BIT : 0u;
    return (uint8_t)(((u >> 24) & 0x80u) | kvhal_num_e4m3fn_mag(u & 0x7fffffffu) | nan);
}

KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e5m2(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    const uint32_t nan = kvhal_num_bits_nan(u) ? KVHAL_NUM_E5M2_NAN_BIT : 0u;
    return (uint8_t)(((u >> 24) & 0x80u) | kvhal_num_e5m2_mag(u & 0x7fffffffu) | nan);
}

/* fnuz formats from the input's bits u and the magnitude code: NaN -> 0x80 (the one NaN), a zero magnitude -> 0x00
 * (no negative zero), else sign | mag. */
KVHAL_NUM_HD uint32_t kvhal_num_fnuz_finish(uint32_t u, uint32_t mag)
{
    return kvhal_num_bits_nan(u) ? 0x80u : mag ? ((u >> 24) & 0x80u) | mag : 0u;
}

KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e4m3fnuz(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    return (uint8_t)kvhal_num_fnuz_finish(u, kvhal_num_e4m3fnuz_mag(u & 0x7fffffffu));
}

KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e5m2fnuz(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    return (uint8_t)kvhal_num_fnuz_finish(u, kvhal_num_e5m2fnuz_mag(u & 0x7fffffffu));
}

/* An fnuz code from the OCP code of twice the quotient: fnuz has the OCP format's bits with the exponent bias one
 * higher, so rounding q2 = 2q onto e4m3fn's (e5m2's) grid rounds q onto e4m3fnuz's (e5m2fnuz's), and a hardware OCP
 * conversion serves fnuz too. Only these differ: an OCP code at or above the largest OCP magnitude (0x7e, 0x7b:
 * saturated, or q2 beyond it, or NaN) takes the software conversion of q2 / 2, and a negative zero loses its sign.
 * ocp: the OCP code of q2 (one byte); x_bits: the input (sign and NaN-ness); e4m3: which pair. Exactly the fnuz
 * conversion of q2 / 2 for any q2 = 2 * (x / s) (tests/test_gpu_math.c). */
KVHAL_NUM_HD uint32_t kvhal_num_fnuz_from_ocp(uint32_t ocp, float q2, uint32_t x_bits, int e4m3)
{
    const uint32_t mag = ocp & 0x7fu;
    if (mag >= (e4m3 ? 0x7eu : 0x7bu)) {
        const uint32_t a = kvhal_num_f32_bits(q2 * 0.5f) & 0x7fffffffu;
        return kvhal_num_fnuz_finish(x_bits, e4m3 ? kvhal_num_e4m3fnuz_mag(a) : kvhal_num_e5m2fnuz_mag(a));
    }
    return mag ? ocp : 0u;
}

/* ---- fp8 -> f32 (exact) ----
 * Magnitude code mag with m mantissa bits and the given bias, finite: its value's bits, without the sign. */
KVHAL_NUM_HD uint32_t kvhal_num_fp8_mag_bits(uint32_t mag, uint32_t m, int bias)
{
    const uint32_t e = mag >> m, f = mag & ((1u << m) - 1u);
    if (e == 0) /* subnormal: f steps of 2^(1 - bias - m), exact in f32 */
        return kvhal_num_f32_bits((float)f * kvhal_num_bits_f32((uint32_t)(127 + 1 - bias - (int)m) << 23));
    return ((e + (uint32_t)(127 - bias)) << 23) | (f << (23u - m));
}

KVHAL_NUM_HD float kvhal_num_e4m3fn_to_f32(uint8_t x)
{
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, mag = x & 0x7fu;
    return kvhal_num_bits_f32(sign | (mag == 0x7fu ? 0x7fc00000u : kvhal_num_fp8_mag_bits(mag, 3, 7)));
}

KVHAL_NUM_HD float kvhal_num_e5m2_to_f32(uint8_t x)
{
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, mag = x & 0x7fu;
    if (mag >= 0x7cu) return kvhal_num_bits_f32(sign | (mag > 0x7cu ? 0x7fc00000u : 0x7f800000u));
    return kvhal_num_bits_f32(sign | kvhal_num_fp8_mag_bits(mag, 2, 15));
}

/* fnuz: no infinities, 0x80 the one NaN (a positive quiet NaN) */
KVHAL_NUM_HD float kvhal_num_e4m3fnuz_to_f32(uint8_t x)
{
    if (x == 0x80u) return kvhal_num_bits_f32(0x7fc00000u);
    return kvhal_num_bits_f32(((uint32_t)(x & 0x80u) << 24) | kvhal_num_fp8_mag_bits(x & 0x7fu, 3, 8));
}

KVHAL_NUM_HD float kvhal_num_e5m2fnuz_to_f32(uint8_t x)
{
    if (x == 0x80u) return kvhal_num_bits_f32(0x7fc00000u);
    return kvhal_num_bits_f32(((uint32_t)(x & 0x80u) << 24) | kvhal_num_fp8_mag_bits(x & 0x7fu, 2, 16));
}

/* ---- x / s: the quotient kvhal stores the fp8 code of ----
 * kvhal stores the code of RN32(x / s), the f32 quotient, then the fp8 rounding. Backends may form that quotient
 * without a division where it gives the same bits:
 * - s = +-2^k with 1/s a normal f32 (kvhal_num_scale_is_pow2): x * (1/s) is the same real number as x / s;
 * - s in [2^-64, 2^64] (kvhal_num_scale_rcp_ok): kvhal_num_quot_rcp below. */
KVHAL_NUM_HD int kvhal_num_scale_is_pow2(float s)
{
    const uint32_t u = kvhal_num_f32_bits(s);
    const uint32_t e = (u >> 23) & 0xffu;
    return (u & 0x7fffffu) == 0 && e >= 1u && e <= 253u;
}

KVHAL_NUM_HD int kvhal_num_scale_rcp_ok(float s)
{
    const uint32_t u = kvhal_num_f32_bits(s);
    return u >= 0x1f800000u && u <= 0x5f800000u;
}

/* y = x * inv (inv = 1/s rounded to nearest) is within 1.5 ulp of x / s; one Newton correction with the exact fma
 * residual r = y*s - x then gives the correctly rounded quotient, the same bits as the IEEE division x / s
 * (Markstein's correction), wherever no intermediate underflows. That holds for every x whose quotient matters to
 * fp8 when s lies in [2^-64, 2^64]: a residual that underflows belongs to an |x| below 2^-102, whose quotient (below
 * 2^-38) rounds to a zero of either fp8 format either way. Proved on all 2^32 inputs for a set of scales by
 * tests/fp8_check.c (the fp8 codes, against kvhal_f32_to_fp8(x / s)), and on random scales by tests/test_gpu_math.c.
 * Specials: the residual is formed as y*s - x and subtracted (not x - y*s and added) so that x = -0 gives -0; a y
 * that is +-inf (x infinite, or the quotient overflows) gives NaN, which callers map to the saturated code (an input
 * NaN stays NaN). */
KVHAL_NUM_HD float kvhal_num_quot_rcp(float x, float s, float inv)
{
    const float y = x * inv;
#ifdef KVHAL_NUM_DEVICE_PASS
    const float r = __fmaf_rn(y, s, -x);
    return __fmaf_rn(-r, inv, y);
#else
    const float r = fmaf(y, s, -x);
    return fmaf(-r, inv, y);
#endif
}

#endif /* KVHAL_NUMERICS_H */

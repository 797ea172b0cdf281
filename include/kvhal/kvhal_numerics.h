/**
 * @file kvhal_numerics.h
 * @brief kvhal's number formats: exact conversions between f32 and the narrow formats a KV cache stores
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

/** How every function here is declared: static inline in C and C++, __host__ __device__ inline under CUDA and HIP. */
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define KVHAL_NUM_HD __host__ __device__ inline __attribute__((always_inline))
#else
/** See above. */
#define KVHAL_NUM_HD static inline
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
/** Defined in a device compilation pass (CUDA or HIP): the device intrinsics are used. */
#define KVHAL_NUM_DEVICE_PASS 1
#endif

/* ---- bit patterns ---- */

/** The bits of an f32.
 *  @param x any float.
 *  @return its IEEE 754 bit pattern. */
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

/** The f32 of a bit pattern.
 *  @param u any 32 bits.
 *  @return the float with those bits. */
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
/** Whether f32 bits are a NaN.
 *  @param u f32 bits.
 *  @return 1 for a NaN (any sign, any payload), 0 otherwise. */
KVHAL_NUM_HD int kvhal_num_bits_nan(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

/* ---- generic rounding ----
 * a: the bits of a finite, non-negative f32, rounded to a binary format with m stored mantissa bits and the given
 * exponent bias. Returns the magnitude code (biased exponent << m | mantissa); a value that rounds past the format's
 * exponent range yields a code past its largest finite one, which the caller saturates or turns into inf. The carry
 * of a mantissa that rounds up runs into the exponent field, which is exactly the next binade. The f16 encoder's
 * rounding, and the independent reference the fp8 encoders below are tested against (tests/test_gpu_math.c). */
/** Rounds a non-negative f32 to a binary format of m mantissa bits and the given bias (to nearest, ties to
 *  even, subnormals included): the f16 encoder's rounding and the tests' independent fp8 reference.
 *  @param a the bits of a finite, non-negative f32.
 *  @param m stored mantissa bits of the format.
 *  @param bias its exponent bias.
 *  @return the magnitude code (biased exponent << m | mantissa); past the largest finite code when a rounds beyond
 *  the format's range (the caller saturates or makes it inf). */
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
/** f16 to f32, exact (branch-free, so that loops vectorize).
 *  @param h an f16 code.
 *  @return its value; a NaN keeps its sign and payload. */
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
/** f32 to f16, to nearest, ties to even.
 *  @param x any float.
 *  @return the f16 code; overflow gives inf, a NaN a quiet NaN of its sign. */
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

/** bf16 to f32, exact.
 *  @param h a bf16 code.
 *  @return its value. */
KVHAL_NUM_HD float kvhal_num_bf16_to_f32(uint16_t h) { return kvhal_num_bits_f32((uint32_t)h << 16); }

/* Adding 0x7fff (+1 when the kept lsb is odd) rounds to nearest even; overflow carries into inf. NaN: quiet. */
/** f32 to bf16, to nearest, ties to even.
 *  @param x any float.
 *  @return the bf16 code; overflow gives inf, a NaN a quiet NaN. */
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
/** The fp8 magnitude code of a non-negative f32 (or positive NaN: the largest finite code), the formats'
 *  shared rounding (see the comment above): the parameters are the format's constants.
 *  @param a the bits of a non-negative f32 or NaN.
 *  @param max_bits the bits of the format's largest finite value.
 *  @param to_magic 2^(23 - m).
 *  @param floor_bits the bits of the magic of the subnormal step.
 *  @param shift 23 - m.
 *  @param offset the code offset read off the magic's exponent.
 *  @return the magnitude code, saturated at the largest finite one. */
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
/** The e4m3fn magnitude code (largest 448, subnormal step 2^-9).
 *  @param a the bits of a non-negative f32 or NaN.
 *  @return the code, 0..0x7e. */
KVHAL_NUM_HD uint32_t kvhal_num_e4m3fn_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x43e00000u, 1048576.0f, 0x46800000u, 20, 1128u);
}
/* e5m2: largest 57344, step 2^-16 (floor 2^7) */
/** The e5m2 magnitude code (largest 57344, step 2^-16).
 *  @param a the bits of a non-negative f32 or NaN.
 *  @return the code, 0..0x7b. */
KVHAL_NUM_HD uint32_t kvhal_num_e5m2_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x47600000u, 2097152.0f, 0x43000000u, 21, 536u);
}
/* e4m3fnuz: bias 8, largest 240 = code 0x7f, step 2^-10 (floor 2^13) */
/** The e4m3fnuz magnitude code (bias 8, largest 240, step 2^-10).
 *  @param a the bits of a non-negative f32 or NaN.
 *  @return the code, 0..0x7f. */
KVHAL_NUM_HD uint32_t kvhal_num_e4m3fnuz_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x43700000u, 1048576.0f, 0x46000000u, 20, 1120u);
}
/* e5m2fnuz: bias 16, largest 57344 = code 0x7f, step 2^-17 (floor 2^6) */
/** The e5m2fnuz magnitude code (bias 16, largest 57344, step 2^-17).
 *  @param a the bits of a non-negative f32 or NaN.
 *  @return the code, 0..0x7f. */
KVHAL_NUM_HD uint32_t kvhal_num_e5m2fnuz_mag(uint32_t a)
{
    return kvhal_num_fp8_mag(a, 0x47600000u, 2097152.0f, 0x42800000u, 21, 532u);
}

/** OR-ed into a NaN's e4m3fn magnitude code (the largest finite, 0x7e), gives 0x7f, the format's NaN. */
#define KVHAL_NUM_E4M3FN_NAN_BIT 0x01u
/** OR-ed into a NaN's e5m2 magnitude code (0x7b), gives 0x7f, a NaN. */
#define KVHAL_NUM_E5M2_NAN_BIT 0x04u

/* OCP formats: sign | magnitude, NaN -> sign | 0x7f. */
/** f32 to fp8 e4m3fn (OCP), to nearest, ties to even, saturating.
 *  @param x any float.
 *  @return the code: sign | magnitude; NaN gives sign | 0x7f. The same as kvhal_f32_to_fp8(x, KVHAL_FP8_E4M3). */
KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e4m3fn(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    const uint32_t nan = kvhal_num_bits_nan(u) ? KVHAL_NUM_E4M3FN_NAN_BIT : 0u;
    return (uint8_t)(((u >> 24) & 0x80u) | kvhal_num_e4m3fn_mag(u & 0x7fffffffu) | nan);
}

/** f32 to fp8 e5m2 (OCP), to nearest, ties to even, saturating (no inf is produced from a finite value or inf).
 *  @param x any float.
 *  @return the code: sign | magnitude; NaN gives sign | 0x7f. The same as kvhal_f32_to_fp8(x, KVHAL_FP8_E5M2). */
KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e5m2(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    const uint32_t nan = kvhal_num_bits_nan(u) ? KVHAL_NUM_E5M2_NAN_BIT : 0u;
    return (uint8_t)(((u >> 24) & 0x80u) | kvhal_num_e5m2_mag(u & 0x7fffffffu) | nan);
}

/* fnuz formats from the input's bits u and the magnitude code: NaN -> 0x80 (the one NaN), a zero magnitude -> 0x00
 * (no negative zero), else sign | mag. */
/** An fnuz code from the input's bits and its magnitude code.
 *  @param u the input's f32 bits (sign, NaN-ness).
 *  @param mag the magnitude code.
 *  @return 0x80 (the one NaN) for a NaN, 0x00 for a zero magnitude (no negative zero), sign | mag otherwise. */
KVHAL_NUM_HD uint32_t kvhal_num_fnuz_finish(uint32_t u, uint32_t mag)
{
    return kvhal_num_bits_nan(u) ? 0x80u : mag ? ((u >> 24) & 0x80u) | mag : 0u;
}

/** f32 to fp8 e4m3fnuz (AMD), to nearest, ties to even, saturating.
 *  @param x any float.
 *  @return the code; NaN gives 0x80, zero of either sign 0x00. The same as kvhal_f32_to_fp8(x, KVHAL_FP8_E4M3FNUZ). */
KVHAL_NUM_HD uint8_t kvhal_num_f32_to_e4m3fnuz(float x)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    return (uint8_t)kvhal_num_fnuz_finish(u, kvhal_num_e4m3fnuz_mag(u & 0x7fffffffu));
}

/** f32 to fp8 e5m2fnuz (AMD), to nearest, ties to even, saturating.
 *  @param x any float.
 *  @return the code; NaN gives 0x80, zero of either sign 0x00. The same as kvhal_f32_to_fp8(x, KVHAL_FP8_E5M2FNUZ). */
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
/** An fnuz code from the OCP code of twice the quotient (a hardware OCP conversion serving fnuz; see above).
 *  @param ocp the OCP code (e4m3fn or e5m2) of q2, one byte.
 *  @param q2 twice the quotient.
 *  @param x_bits the input's f32 bits (sign and NaN-ness).
 *  @param e4m3 nonzero: e4m3fn to e4m3fnuz; zero: e5m2 to e5m2fnuz.
 *  @return the fnuz code of q2 / 2. */
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
/** The f32 bits of a finite fp8 magnitude code (exact).
 *  @param mag the magnitude code (no sign bit).
 *  @param m the format's mantissa bits.
 *  @param bias its exponent bias.
 *  @return the value's bits, without sign. */
KVHAL_NUM_HD uint32_t kvhal_num_fp8_mag_bits(uint32_t mag, uint32_t m, int bias)
{
    const uint32_t e = mag >> m, f = mag & ((1u << m) - 1u);
    if (e == 0) /* subnormal: f steps of 2^(1 - bias - m), exact in f32 */
        return kvhal_num_f32_bits((float)f * kvhal_num_bits_f32((uint32_t)(127 + 1 - bias - (int)m) << 23));
    return ((e + (uint32_t)(127 - bias)) << 23) | (f << (23u - m));
}

/** fp8 e4m3fn to f32, exact.
 *  @param x the code.
 *  @return its value; 0x7f and 0xff are NaN. */
KVHAL_NUM_HD float kvhal_num_e4m3fn_to_f32(uint8_t x)
{
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, mag = x & 0x7fu;
    return kvhal_num_bits_f32(sign | (mag == 0x7fu ? 0x7fc00000u : kvhal_num_fp8_mag_bits(mag, 3, 7)));
}

/** fp8 e5m2 to f32, exact.
 *  @param x the code.
 *  @return its value; 0x7c is inf, above it NaN (either sign). */
KVHAL_NUM_HD float kvhal_num_e5m2_to_f32(uint8_t x)
{
    const uint32_t sign = (uint32_t)(x & 0x80u) << 24, mag = x & 0x7fu;
    if (mag >= 0x7cu) return kvhal_num_bits_f32(sign | (mag > 0x7cu ? 0x7fc00000u : 0x7f800000u));
    return kvhal_num_bits_f32(sign | kvhal_num_fp8_mag_bits(mag, 2, 15));
}

/* fnuz: no infinities, 0x80 the one NaN (a positive quiet NaN) */
/** fp8 e4m3fnuz to f32, exact.
 *  @param x the code.
 *  @return its value; 0x80 (the one NaN) gives a positive quiet NaN; no infinities. */
KVHAL_NUM_HD float kvhal_num_e4m3fnuz_to_f32(uint8_t x)
{
    if (x == 0x80u) return kvhal_num_bits_f32(0x7fc00000u);
    return kvhal_num_bits_f32(((uint32_t)(x & 0x80u) << 24) | kvhal_num_fp8_mag_bits(x & 0x7fu, 3, 8));
}

/** fp8 e5m2fnuz to f32, exact.
 *  @param x the code.
 *  @return its value; 0x80 (the one NaN) gives a positive quiet NaN; no infinities. */
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
/** Whether x * (1/s) equals x / s for every x: s = +-2^k with 1/s a normal f32.
 *  @param s the scale.
 *  @return 1 or 0. */
KVHAL_NUM_HD int kvhal_num_scale_is_pow2(float s)
{
    const uint32_t u = kvhal_num_f32_bits(s);
    const uint32_t e = (u >> 23) & 0xffu;
    return (u & 0x7fffffu) == 0 && e >= 1u && e <= 253u;
}

/** Whether kvhal_num_quot_rcp() gives x / s for every x that matters to fp8: s in [2^-64, 2^64].
 *  @param s the scale.
 *  @return 1 or 0. */
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
/** x / s without a division: the reciprocal product with one fma correction (see above).
 *  @param x the value.
 *  @param s the scale, kvhal_num_scale_rcp_ok(s).
 *  @param inv 1/s rounded to nearest.
 *  @return the bits of the IEEE division x / s wherever its fp8 code depends on them (an infinite y gives NaN). */
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

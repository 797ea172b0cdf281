/* cpu_convert.h — the inner-loop number conversions (f16/bf16 -> f32, f32 -> fp8) as static inline functions, so that
 * the core's public scalar functions (core/convert.c) and the CPU backend's conversion loops are one implementation.
 * FP8 encoding is round to nearest even, saturating to the largest finite value (inf too), NaN -> 0x7f | sign.
 * The rounding of normal values is integer arithmetic on the f32 bits (the carry of a rounded-up mantissa runs
 * into the exponent); subnormal results are rounded by the FPU itself: adding 2^k, whose ulp is the fp8 subnormal
 * quantum, leaves |x| rounded to nearest even in the low bits. This needs the default rounding mode, which kvhal
 * never changes. */
#ifndef KVHAL_CPU_CONVERT_H
#define KVHAL_CPU_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t kvhal__f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float kvhal__bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float kvhal__bf16_to_f32(uint16_t h) { return kvhal__bits_f32((uint32_t)h << 16); }

/* Branch-free (every path computed, one selected) so that conversion loops vectorize. */
static inline float kvhal__f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t m = (uint32_t)(h & 0x7fffu) << 13; /* exponent and fraction, aligned to f32 */
    const uint32_t e = m & 0x0f800000u;
    const uint32_t normal = m + ((127u - 15u) << 23);
    const uint32_t special = m + ((255u - 31u) << 23); /* inf / NaN: exponent all ones, payload kept */
    /* subnormal: as a normal one exponent step up, minus the implicit bit, subtracted as a float (exact) */
    const uint32_t sub = kvhal__f32_bits(kvhal__bits_f32(m + ((127u - 15u + 1u) << 23)) - kvhal__bits_f32(113u << 23));
    const uint32_t r = e == 0x0f800000u ? special : e == 0 ? sub : normal;
    return kvhal__bits_f32(r | sign);
}

/* m: stored mantissa bits (3 for e4m3, 2 for e5m2); bias: exponent bias (7, 15); max_bits: f32 bits of the
 * largest finite value (448, 57344); max_code: its code; magic: 2^k whose ulp is the subnormal quantum
 * (2^-9 -> 2^14, 2^-16 -> 2^7). */
static inline uint8_t kvhal__f32_to_fp8_impl(float x, int m, int bias, uint32_t max_bits, uint32_t max_code,
                                             float magic)
{
    const uint32_t u = kvhal__f32_bits(x);
    const uint32_t sign = (u >> 24) & 0x80u;
    const uint32_t a = u & 0x7fffffffu;
    const int shift = 23 - m;
    /* normal: round the f32 mantissa to m bits, nearest even, and rebias */
    const uint32_t r = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
    const uint32_t normal = (r >> shift) - ((uint32_t)(127 - bias) << m);
    /* subnormal: magic + |x| rounds |x| to the subnormal quantum; the low bits are the code (up to the smallest
     * normal's code 1 << m when it rounds up) */
    const uint32_t sub = kvhal__f32_bits(kvhal__bits_f32(a) + magic) - kvhal__f32_bits(magic);
    const uint32_t min_normal = (uint32_t)(127 + 1 - bias) << 23;
    uint32_t code = a < min_normal ? sub : normal;
    code = a >= max_bits ? max_code : code; /* inf, and everything that rounds to max or beyond */
    code = a > 0x7f800000u ? 0x7fu : code;  /* NaN */
    return (uint8_t)(sign | (code & 0x7fu));
}

static inline uint8_t kvhal__f32_to_fp8_e4m3(float x)
{
    return kvhal__f32_to_fp8_impl(x, 3, 7, 0x43e00000u /* 448 */, 0x7eu, 16384.0f);
}

static inline uint8_t kvhal__f32_to_fp8_e5m2(float x)
{
    return kvhal__f32_to_fp8_impl(x, 2, 15, 0x47600000u /* 57344 */, 0x7bu, 128.0f);
}

/* AMD's fnuz formats: bias one more, the largest finite code 0x7f, 0x80 is the one NaN and there is no negative
 * zero (a result that rounds to zero is 0x00). */
static inline uint8_t kvhal__f32_to_fp8_fnuz(float x, int m, int bias, uint32_t max_bits, float magic)
{
    const uint32_t a = kvhal__f32_bits(x) & 0x7fffffffu;
    const uint8_t c = kvhal__f32_to_fp8_impl(x, m, bias, max_bits, 0x7fu, magic);
    return a > 0x7f800000u ? 0x80u : (c & 0x7fu) == 0 ? 0u : c;
}

static inline uint8_t kvhal__f32_to_fp8_e4m3fnuz(float x)
{
    return kvhal__f32_to_fp8_fnuz(x, 3, 8, 0x43700000u /* 240 */, 8192.0f);
}

static inline uint8_t kvhal__f32_to_fp8_e5m2fnuz(float x)
{
    return kvhal__f32_to_fp8_fnuz(x, 2, 16, 0x47600000u /* 57344 */, 64.0f);
}

/* ---- value / scale: how the CPU divides by a scale ----
 * kvhal stores the fp8 code of RN32(x / s) (the f32 quotient, then the fp8 rounding). The CPU's conversion loops
 * form that quotient one of three ways, picked once per call from the scale (kvhal__scale_mode):
 * 0  s = 2^k with 1/s a normal float: x * (1/s), the same real number as x / s, so the same rounding.
 * 1  a calibrated s in [2^-64, 2^64], on a CPU with FMA: the method of the GPU kernels (backends/gpu/
 *    kvhal_gpu_math.h, kvhal_gpu_quot_rcp): y = x * inv, r = fma(y, s, -x), q = fma(-r, inv, y) with inv = RN(1/s),
 *    Markstein's correction, the correctly rounded quotient wherever fp8 can tell (the header says why). When y
 *    is infinite (x infinite, or the quotient overflows) q is NaN although x is not: the encoders here then take
 *    the sign and NaN-ness from x and the magnitude from q, so such a q saturates like the division's infinity.
 * 2  otherwise: the IEEE division x / s.
 * Checked on all 2^32 inputs for a set of scales through the CPU backend itself by tools/kvhal-fp8-check
 * --device=cpu (dense: the vector loop; --strided: the scalar loop). */
static inline int kvhal__scale_mode(float s, int has_fma)
{
    const uint32_t u = kvhal__f32_bits(s);
    const uint32_t e = (u >> 23) & 0xffu;
    if ((u & 0x7fffffu) == 0 && e >= 1u && e <= 253u) return 0;
    if (has_fma && u >= 0x1f800000u && u <= 0x5f800000u) return 1;
    return 2;
}

#endif

/* convert.c — scalar conversions between f32 and the narrow float formats kvhal stores (f16, bf16, fp8 e4m3fn,
 * fp8 e5m2). They are the host reference that every backend's kernels are tested against, so each is exact:
 * round to nearest, ties to even, subnormals included. FP8 saturates (a finite value or an infinity beyond the
 * largest finite code becomes that code, as CUDA's __NV_SATFINITE does) because a KV cache must never turn a large
 * activation into inf or NaN; f16 and bf16 follow IEEE (overflow gives inf). NaN stays NaN in every format.
 * The conversions that inner loops need live in backends/cpu/cpu_convert.h (the CPU backend's, self-contained); the generic rounding
 * below serves f16, and was used to check cpu_convert.h's fp8 encoder over all 2^32 floats. */
#include <math.h>
#include <string.h>

#include "cpu_convert.h"
#include "internal.h"

/* Rounds a finite, non-negative f32 (its bit pattern a) to a binary format with m stored mantissa bits and the
 * given exponent bias. Returns the magnitude code (biased exponent << m | mantissa); a value that rounds past the
 * format's exponent range yields a code past its largest finite one, which the caller saturates or turns into inf.
 * The carry of a mantissa that rounds up runs into the exponent field, which is exactly the next binade. */
static uint32_t round_magnitude(uint32_t a, int m, int bias)
{
    uint32_t e8 = a >> 23;
    uint32_t sig;
    int e;
    if (e8 == 0) {
        sig = a & 0x7fffffu; /* f32 subnormal: no implicit bit */
        e = -126;
    } else {
        sig = (a & 0x7fffffu) | 0x800000u;
        e = (int)e8 - 127;
    }
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
    uint32_t rem = sig & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) code++;
    return code;
}

uint8_t kvhal_f32_to_fp8(float x, kvhal_dtype fp8_type)
{
    switch (fp8_type) {
    case KVHAL_FP8_E5M2: return kvhal__f32_to_fp8_e5m2(x);
    case KVHAL_FP8_E4M3FNUZ: return kvhal__f32_to_fp8_e4m3fnuz(x);
    case KVHAL_FP8_E5M2FNUZ: return kvhal__f32_to_fp8_e5m2fnuz(x);
    default: return kvhal__f32_to_fp8_e4m3(x);
    }
}

float kvhal_fp8_to_f32(uint8_t x, kvhal_dtype fp8_type)
{
    if (fp8_type == KVHAL_FP8_E4M3FNUZ || fp8_type == KVHAL_FP8_E5M2FNUZ) {
        /* no infinities, 0x80 the one NaN; bias 8 (e4m3) or 16 (e5m2) */
        if (x == 0x80u) return NAN;
        const float sign = (x & 0x80u) ? -1.0f : 1.0f;
        const unsigned mag = x & 0x7fu, mb = fp8_type == KVHAL_FP8_E4M3FNUZ ? 3u : 2u;
        const int bias = fp8_type == KVHAL_FP8_E4M3FNUZ ? 8 : 16;
        const unsigned e = mag >> mb, f = mag & ((1u << mb) - 1u);
        if (e == 0) return sign * ldexpf((float)f, 1 - bias - (int)mb);
        return sign * ldexpf((float)((1u << mb) + f), (int)e - bias - (int)mb);
    }
    const float sign = (x & 0x80u) ? -1.0f : 1.0f;
    const unsigned mag = x & 0x7fu;
    if (fp8_type == KVHAL_FP8_E5M2) {
        unsigned e = mag >> 2, f = mag & 3u;
        if (e == 31) return f ? kvhal__bits_f32((x & 0x80u ? 0x80000000u : 0u) | 0x7fc00000u) : sign * INFINITY;
        if (e == 0) return sign * ldexpf((float)f, -16);          /* f * 2^-2 * 2^-14 */
        return sign * ldexpf((float)(4u + f), (int)e - 15 - 2);
    }
    unsigned e = mag >> 3, f = mag & 7u;
    if (mag == 0x7fu) return kvhal__bits_f32((x & 0x80u ? 0x80000000u : 0u) | 0x7fc00000u);
    if (e == 0) return sign * ldexpf((float)f, -9);                /* f * 2^-3 * 2^-6 */
    return sign * ldexpf((float)(8u + f), (int)e - 7 - 3);
}

uint16_t kvhal_f32_to_f16(float x)
{
    uint32_t u = kvhal__f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x1ffu)); /* quiet NaN, payload kept */
    if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
    uint32_t code = round_magnitude(a, 10, 15);
    if (code >= 0x7c00u) code = 0x7c00u; /* overflow: inf */
    return (uint16_t)(sign | code);
}

float kvhal_f16_to_f32(uint16_t h) { return kvhal__f16_to_f32(h); }

uint16_t kvhal_f32_to_bf16(float x)
{
    uint32_t u = kvhal__f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    /* Adding 0x7fff (+1 when the kept lsb is odd) rounds to nearest even; overflow carries into inf. */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float kvhal_bf16_to_f32(uint16_t x) { return kvhal__bf16_to_f32(x); }

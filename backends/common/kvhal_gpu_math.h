/* kvhal_gpu_math.h — the arithmetic the GPU kernels share with the host: exact conversions from f16/bf16 to f32,
 * f32 to fp8 (e4m3fn, e5m2) rounding to nearest even and saturating, and division by a run-time constant through
 * a multiply (fastdiv). Written in plain integer/float code so that CUDA, HIP and a host C compiler all build the
 * same functions: tests/test_gpu_math.c checks them on the host against core/convert.c, bit for bit, which is what
 * makes the kernels' fp8 output match kvhal_f32_to_fp8 on every vendor. */
#ifndef KVHAL_GPU_MATH_H
#define KVHAL_GPU_MATH_H

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KVHAL_HD __host__ __device__ inline __attribute__((always_inline))
#else
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

/* Exact. Subnormal halves go through an integer-to-float conversion so that no f32 denormal is ever formed (a
 * device that flushes denormals would zero them). */
KVHAL_HD float kvhal_gpu_f16_to_f32(uint32_t h)
{
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) return kvhal_gpu_bits_f32(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) return kvhal_gpu_bits_f32(sign | ((em << 13) + 0x38000000u));
    const float mag = (float)em * 5.9604644775390625e-8f; /* em * 2^-24, exact */
    return kvhal_gpu_bits_f32(sign | kvhal_gpu_f32_bits(mag));
}

/* f32 -> fp8, round to nearest even, saturating to the largest finite code (infinities too), NaN -> sign|0x7f.
 * Branch-free, since the kernels convert 8 values per 16-byte load and would otherwise be bound by instruction
 * issue rather than memory: both candidate codes are computed and one is selected.
 *  - normal results: the integer trick (add half-1 plus the kept lsb, carry into the exponent) with the exponent
 *    re-bias folded into the same add; it wraps around for inputs below the normal range, which then take
 *  - subnormal results: one f32 addition of 2^(23 + subnormal step exponent), whose ulp is exactly the fp8
 *    subnormal step, so the hardware's round-to-nearest-even does the rounding;
 *  - then saturation with a min (infinity lands far above the largest code) and NaN last. */
KVHAL_HD uint32_t kvhal_gpu_f32_to_e4m3(float x)
{
    const uint32_t u = kvhal_gpu_f32_bits(x);
    const uint32_t a = u & 0x7fffffffu;
    const uint32_t nrm = (a + (0x7ffffu - (120u << 23)) + ((a >> 20) & 1u)) >> 20;
    const uint32_t sub = kvhal_gpu_f32_bits(kvhal_gpu_bits_f32(a) + 16384.0f) - 0x46800000u; /* 2^14: ulp 2^-9 */
    uint32_t code = a < 0x3c800000u ? sub : nrm; /* 2^-6: smallest normal */
    code = code < 0x7eu ? code : 0x7eu;          /* 448 */
    code = a > 0x7f800000u ? 0x7fu : code;
    return ((u >> 24) & 0x80u) | code;
}

KVHAL_HD uint32_t kvhal_gpu_f32_to_e5m2(float x)
{
    const uint32_t u = kvhal_gpu_f32_bits(x);
    const uint32_t a = u & 0x7fffffffu;
    const uint32_t nrm = (a + (0xfffffu - (112u << 23)) + ((a >> 21) & 1u)) >> 21;
    const uint32_t sub = kvhal_gpu_f32_bits(kvhal_gpu_bits_f32(a) + 128.0f) - 0x43000000u; /* 2^7: ulp 2^-16 */
    uint32_t code = a < 0x38800000u ? sub : nrm; /* 2^-14: smallest normal */
    code = code < 0x7bu ? code : 0x7bu;          /* 57344 */
    code = a > 0x7f800000u ? 0x7fu : code;
    return ((u >> 24) & 0x80u) | code;
}

/* True when dividing by s equals multiplying by 1/s for every x: s = +-2^k with 1/s a normal f32. */
KVHAL_HD int kvhal_gpu_scale_is_pow2(float s)
{
    const uint32_t u = kvhal_gpu_f32_bits(s);
    const uint32_t e = (u >> 23) & 0xffu;
    return (u & 0x7fffffu) == 0 && e >= 1u && e <= 253u;
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

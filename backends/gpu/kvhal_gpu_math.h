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
/* a: the bits of a non-negative float or of a positive NaN (NaN -> the largest finite code). */
KVHAL_HD uint32_t kvhal_gpu_e4m3_mag_bits(uint32_t a)
{
    /* the clamp is an integer min on the magnitude's bits: float min's NaN rules differ between vendors (and for
     * signalling NaNs), while here every NaN deterministically becomes 448 */
    a = a < 0x43e00000u ? a : 0x43e00000u; /* 448 */
    const float yc = kvhal_gpu_bits_f32(a);
    uint32_t mb = kvhal_gpu_f32_bits(yc * 1048576.0f) & 0x7f800000u; /* 2^(e + 20) */
    mb = mb > 0x46800000u ? mb : 0x46800000u;                        /* floor 2^14: ulp 2^-9 */
    return kvhal_gpu_f32_bits(yc + kvhal_gpu_bits_f32(mb)) - mb + ((mb >> 20) - 1128u);
}

KVHAL_HD uint32_t kvhal_gpu_e5m2_mag_bits(uint32_t a)
{
    a = a < 0x47600000u ? a : 0x47600000u; /* 57344 */
    const float yc = kvhal_gpu_bits_f32(a);
    uint32_t mb = kvhal_gpu_f32_bits(yc * 2097152.0f) & 0x7f800000u; /* 2^(e + 21) */
    mb = mb > 0x43000000u ? mb : 0x43000000u;                        /* floor 2^7: ulp 2^-16 */
    return kvhal_gpu_f32_bits(yc + kvhal_gpu_bits_f32(mb)) - mb + ((mb >> 21) - 536u);
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

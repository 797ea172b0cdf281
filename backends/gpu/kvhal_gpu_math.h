/* kvhal_gpu_math.h — the arithmetic of the CUDA and HIP kernels beyond the number formats: how a call divides by
 * its two scales, and division by a run-time constant through a multiply (fastdiv). The conversions and the quotient
 * by a scale are kvhal's one implementation, kvhal_numerics.h (include/kvhal), which the core's kvhal_f32_to_fp8
 * uses too: so the kernels' fp8 output equals the library's on every vendor. Written in plain integer/float code so
 * that CUDA, HIP (hiprtc too) and a host C compiler all build the same functions: tests/test_gpu_math.c checks them
 * on the host. */
#ifndef KVHAL_GPU_MATH_H
#define KVHAL_GPU_MATH_H

#ifdef __HIPCC_RTC__ /* the run-time compiled source: its headers are given by name (gpu_codepath.cu) */
#include "kvhal_numerics.h"
#else
#include "../../include/kvhal/kvhal_numerics.h"
#endif

/* How the kernels divide by the scales: 0 multiply by the exact 1/s (both scales powers of two), 1 the reciprocal
 * with its correction (both in kvhal_num_quot_rcp's range), 2 the IEEE division. */
KVHAL_NUM_HD int kvhal_gpu_scale_mode(float k_scale, float v_scale)
{
    if (kvhal_num_scale_is_pow2(k_scale) && kvhal_num_scale_is_pow2(v_scale)) return 0;
    if (kvhal_num_scale_rcp_ok(k_scale) && kvhal_num_scale_rcp_ok(v_scale)) return 1;
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

KVHAL_NUM_HD uint32_t kvhal_fastdiv32_div(uint32_t n, kvhal_fastdiv32 f)
{
#ifdef KVHAL_NUM_DEVICE_PASS
    const uint32_t t = __umulhi(n, f.m);
#else
    const uint32_t t = (uint32_t)(((uint64_t)n * f.m) >> 32);
#endif
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

KVHAL_NUM_HD uint64_t kvhal_fastdiv64_div(uint64_t n, kvhal_fastdiv64 f)
{
#ifdef KVHAL_NUM_DEVICE_PASS
    const uint64_t t = __umul64hi(n, f.m);
#else
    __extension__ typedef unsigned __int128 u128;
    const uint64_t t = (uint64_t)(((u128)n * f.m) >> 64);
#endif
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

#endif /* KVHAL_GPU_MATH_H */

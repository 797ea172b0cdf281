/* convert.c — scalar conversions between f32 and the narrow float formats kvhal stores (f16, bf16, fp8 e4m3fn,
 * fp8 e5m2). They are the host reference that every backend's kernels are tested against, so each is exact:
 * round to nearest, ties to even, subnormals included. FP8 saturates (a finite value or an infinity beyond the
 * largest finite code becomes that code, as CUDA's __NV_SATFINITE does) because a KV cache must never turn a large
 * activation into inf or NaN; f16 and bf16 follow IEEE (overflow gives inf). NaN stays NaN in every format.
 * One implementation serves the library, its backends and the kernels: include/kvhal/kvhal_numerics.h. */
#include "internal.h"
#include "kvhal_numerics.h"

uint8_t kvhal_f32_to_fp8(float x, kvhal_dtype fp8_type)
{
    switch (fp8_type) {
    case KVHAL_FP8_E5M2: return kvhal_num_f32_to_e5m2(x);
    case KVHAL_FP8_E4M3FNUZ: return kvhal_num_f32_to_e4m3fnuz(x);
    case KVHAL_FP8_E5M2FNUZ: return kvhal_num_f32_to_e5m2fnuz(x);
    default: return kvhal_num_f32_to_e4m3fn(x);
    }
}

float kvhal_fp8_to_f32(uint8_t x, kvhal_dtype fp8_type)
{
    switch (fp8_type) {
    case KVHAL_FP8_E5M2: return kvhal_num_e5m2_to_f32(x);
    case KVHAL_FP8_E4M3FNUZ: return kvhal_num_e4m3fnuz_to_f32(x);
    case KVHAL_FP8_E5M2FNUZ: return kvhal_num_e5m2fnuz_to_f32(x);
    default: return kvhal_num_e4m3fn_to_f32(x);
    }
}

uint16_t kvhal_f32_to_f16(float x) { return kvhal_num_f32_to_f16(x); }

float kvhal_f16_to_f32(uint16_t h) { return kvhal_num_f16_to_f32(h); }

uint16_t kvhal_f32_to_bf16(float x) { return kvhal_num_f32_to_bf16(x); }

float kvhal_bf16_to_f32(uint16_t x) { return kvhal_num_bf16_to_f32(x); }

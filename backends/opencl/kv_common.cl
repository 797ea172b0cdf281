/* kv_common.cl — what every kvhal OpenCL program starts with: dtype codes and sizes, and the conversions between
 * f32 and the stored formats (f16, bf16, fp8 e4m3fn, fp8 e5m2) written with integer operations on the bit patterns,
 * so that no kernel needs cl_khr_fp16 and every OpenCL 1.2 device runs the same code. Each conversion is bit-exact
 * with kvhal_numerics.h, the library's (round to nearest even, subnormals kept, fp8 saturating, NaN kept):
 * tests/test_opencl_numerics.c runs them against it.
 * Helpers are plain functions, not C99 'inline' ones: an inline definition that a compiler decides not to inline
 * has no external definition to fall back on, and device compilers inline small functions anyway. */

#define KV_F32 0
#define KV_F16 1
#define KV_BF16 2
#define KV_E4M3 3
#define KV_E5M2 4
#define KV_E4M3FNUZ 7
#define KV_E5M2FNUZ 8

#define KV_DT_SIZE(dt) ((dt) == KV_F32 ? 4 : ((dt) == KV_F16 || (dt) == KV_BF16) ? 2 : 1)
#define KV_IS_FNUZ(dt) ((dt) == KV_E4M3FNUZ || (dt) == KV_E5M2FNUZ)
#define KV_IS_FP8(dt) ((dt) == KV_E4M3 || (dt) == KV_E5M2 || KV_IS_FNUZ(dt))

/* A finite, non-negative f32 bit pattern rounded to a format with m mantissa bits and the given bias: the magnitude
 * code (biased exponent << m | mantissa). A mantissa carry runs into the exponent, which is the next binade. */
uint kv_round_magnitude(uint a, int m, int bias)
{
    uint e8 = a >> 23;
    uint sig;
    int e;
    if (e8 == 0) {
        sig = a & 0x7fffffu;
        e = -126;
    } else {
        sig = (a & 0x7fffffu) | 0x800000u;
        e = (int)e8 - 127;
    }
    const int emin = 1 - bias;
    uint code;
    int shift;
    if (e >= emin) {
        shift = 23 - m;
        code = ((uint)(e + bias) << m) | ((sig & 0x7fffffu) >> shift);
    } else {
        shift = 23 - m + (emin - e);
        if (shift >= 32) return 0u;
        code = sig >> shift;
    }
    uint rem = sig & ((1u << shift) - 1u);
    uint halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (code & 1u))) code++;
    return code;
}

/* f32 -> fp8 (m mantissa bits, bias, largest finite code max_code), saturating. The same rounding as
 * kv_round_magnitude with fewer branches (this runs once per element): a normal result is rounded by adding half an
 * ulp minus one plus the kept lsb and truncating; a subnormal one by adding 2^(24 - bias - m), whose ulp is the
 * format's smallest subnormal, so that the (correctly rounded, ties to even) float addition does the rounding.
 * f32 subnormal inputs are far below half the smallest fp8 subnormal, so a device that flushes them still gets 0. */
uint kv_f32_to_fp8(float x, int m, int bias, uint max_code)
{
    uint u = as_uint(x);
    uint sign = (u >> 24) & 0x80u;
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    uint code;
    if (a >= (uint)(128 - bias) << 23) {
        code = (a + ((uint)(bias - 127) << 23) + ((1u << (22 - m)) - 1u) + ((a >> (23 - m)) & 1u)) >> (23 - m);
    } else {
        float magic = as_float((uint)(151 - bias - m) << 23);
        code = as_uint(as_float(a) + magic) - as_uint(magic);
    }
    return sign | min(code, max_code);
}

uint kv_f32_to_f16(float x)
{
    uint u = as_uint(x);
    uint sign = (u >> 16) & 0x8000u;
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u | ((a >> 13) & 0x1ffu);
    if (a == 0x7f800000u) return sign | 0x7c00u;
    return sign | min(kv_round_magnitude(a, 10, 15), 0x7c00u);
}

uint kv_f32_to_bf16(float x)
{
    uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
}

float kv_f16_to_f32(uint h)
{
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu, f = h & 0x3ffu;
    if (e == 31u) return as_float(sign | 0x7f800000u | (f << 13));
    if (e == 0u) return as_float(sign | as_uint((float)f * 0x1p-24f));
    return as_float(sign | ((e + 112u) << 23) | (f << 13));
}

float kv_bf16_to_f32(uint b) { return as_float(b << 16); }

float kv_e4m3_to_f32(uint x)
{
    uint sign = (x & 0x80u) << 24;
    uint mag = x & 0x7fu, e = mag >> 3, f = mag & 7u;
    if (mag == 0x7fu) return as_float(sign | 0x7fc00000u);
    if (e == 0u) return as_float(sign | as_uint((float)f * 0x1p-9f));
    return as_float(sign | ((e + 120u) << 23) | (f << 20));
}

float kv_e5m2_to_f32(uint x)
{
    uint sign = (x & 0x80u) << 24;
    uint mag = x & 0x7fu, e = mag >> 2, f = mag & 3u;
    if (e == 31u) return as_float(sign | (f ? 0x7fc00000u : 0x7f800000u));
    if (e == 0u) return as_float(sign | as_uint((float)f * 0x1p-16f));
    return as_float(sign | ((e + 112u) << 23) | (f << 21));
}

/* AMD's fnuz formats (m mantissa bits, bias 8 or 16): no infinities, 0x80 the one NaN, no negative zero. */
float kv_fnuz_to_f32(uint x, uint m, int bias)
{
    if (x == 0x80u) return as_float(0x7fc00000u);
    uint sign = (x & 0x80u) << 24;
    uint mag = x & 0x7fu, e = mag >> m, f = mag & ((1u << m) - 1u);
    if (e == 0u) return as_float(sign | as_uint((float)f * as_float((uint)(127 + 1 - bias - (int)m) << 23)));
    return as_float(sign | ((e + (uint)(127 - bias)) << 23) | (f << (23u - m)));
}

uint kv_f32_to_fp8(float x, int m, int bias, uint max_code);

uint kv_f32_to_fnuz(float x, int m, int bias)
{
    uint a = as_uint(x) & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x80u;
    uint c = kv_f32_to_fp8(x, m, bias, 0x7fu);
    return (c & 0x7fu) ? c : 0u;
}

/* Bits of one element of dtype dt (in the low bits of the result) -> f32, and back. */
float kv_decode(uint bits, int dt)
{
    switch (dt) {
    case KV_F16: return kv_f16_to_f32(bits);
    case KV_BF16: return kv_bf16_to_f32(bits);
    case KV_E4M3: return kv_e4m3_to_f32(bits);
    case KV_E5M2: return kv_e5m2_to_f32(bits);
    case KV_E4M3FNUZ: return kv_fnuz_to_f32(bits, 3u, 8);
    case KV_E5M2FNUZ: return kv_fnuz_to_f32(bits, 2u, 16);
    default: return as_float(bits);
    }
}

uint kv_encode(float x, int dt)
{
    switch (dt) {
    case KV_F16: return kv_f32_to_f16(x);
    case KV_BF16: return kv_f32_to_bf16(x);
    case KV_E4M3: return kv_f32_to_fp8(x, 3, 7, 0x7eu);
    case KV_E5M2: return kv_f32_to_fp8(x, 2, 15, 0x7bu);
    case KV_E4M3FNUZ: return kv_f32_to_fnuz(x, 3, 8);
    case KV_E5M2FNUZ: return kv_f32_to_fnuz(x, 2, 16);
    default: return as_uint(x);
    }
}

/* x / s rounded to nearest even, as the host's IEEE division gives it, for s > 0 and inv = 1 / s rounded by the
 * host. mode 0: s is 1. mode 1: s is a power of two, so x * inv is exact (or far below any fp8 value). mode 2: s in
 * [2^-64, 2^64]: one Markstein correction of x * inv with the exact fma residual q*s - x, the same bits as the
 * division wherever fp8 can tell quotients apart (kvhal_numerics.h's kvhal_num_quot_rcp, proved over all 2^32 inputs
 * per scale by tests/fp8_check); an infinite product is kept (it saturates; the correction would make it NaN).
 * mode 3 (other scales): a Newton step with exact fma residuals, then the neighbour on the residual's side wins if
 * its residual is smaller (a quotient is never exactly halfway between two floats, so there is no tie to break).
 * OpenCL's own '/' may be 2.5 ulp off and costs more than this. A NaN comes back as it came in: GPUs (NVIDIA's)
 * answer any arithmetic on a NaN with their canonical, positive NaN, and the reference keeps the input's sign. */
float kv_div(float x, float s, float inv, uint mode)
{
    if (mode == 0u || isnan(x)) return x;
    float q = x * inv;
    if (mode == 1u || !isfinite(q)) return q;
    if (mode == 2u) return fma(-fma(q, s, -x), inv, q);
    if (q == 0.0f) return q;
    float r = fma(-q, s, x);
    q = fma(r, inv, q);
    r = fma(-q, s, x);
    uint b = as_uint(q);
    float n = as_float((r > 0.0f) == (q > 0.0f) ? b + 1u : b - 1u);
    return fabs(fma(-n, s, x)) < fabs(r) ? n : q;
}

/* The same conversions on 8 elements at once, written with selects instead of branches, so that CPU devices run
 * them in SIMD registers (GPUs run them per lane all the same). Bit-for-bit equal to the scalar ones above. Eight,
 * not sixteen: 256-bit vectors are what AVX2 CPUs pass in registers. */
float8 kv_f16_to_f32_8(uint8 h)
{
    uint8 sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, f = h & 0x3ffu;
    uint8 normal = sign | ((e + 112u) << 23) | (f << 13);
    uint8 sub = sign | as_uint8(convert_float8(f) * 0x1p-24f);
    uint8 infnan = sign | 0x7f800000u | (f << 13);
    return as_float8(select(select(normal, sub, e == 0u), infnan, e == 31u));
}

float8 kv_div_8_any(float8 x, float s, float inv, uint mode)
{
    if (mode == 0u) return x;
    float8 q0 = x * inv;
    if (mode == 1u) return q0;
    float8 sv = (float8)s, iv = (float8)inv;
    if (mode == 2u) return select(fma(-fma(q0, sv, -x), iv, q0), q0, isinf(q0));
    float8 r = fma(-q0, sv, x);
    float8 q = fma(r, iv, q0);
    r = fma(-q, sv, x);
    uint8 b = as_uint8(q);
    float8 n = as_float8(select(b - 1u, b + 1u, (r > 0.0f) == (q > 0.0f)));
    q = select(q, n, fabs(fma(-n, sv, x)) < fabs(r));
    return select(q, q0, (q0 == 0.0f) | !isfinite(q0));
}

float8 kv_div_8(float8 x, float s, float inv, uint mode) /* NaN lanes as they came in, as kv_div */
{
    return select(kv_div_8_any(x, s, inv, mode), x, isnan(x));
}

uint8 kv_f32_to_fp8_8(float8 x, int m, int bias, uint max_code)
{
    uint8 u = as_uint8(x);
    uint8 sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    uint8 normal = (a + ((uint)(bias - 127) << 23) + ((1u << (22 - m)) - 1u) + ((a >> (23 - m)) & 1u)) >> (23 - m);
    float magic = as_float((uint)(151 - bias - m) << 23);
    uint8 sub = as_uint8(as_float8(a) + magic) - as_uint(magic);
    uint8 code = min(select(sub, normal, a >= (uint)(128 - bias) << 23), (uint8)max_code);
    return sign | select(code, (uint8)0x7fu, a > 0x7f800000u);
}

/* Chunk movement. N bytes (a power of two) at p, aligned to min(N, 16), into / out of private 32-bit words. N < 4
 * fills the low bits of w[0]. Devices are little-endian (checked at init), so element i of a chunk of s-byte
 * elements is bits [8*s*(i % (4/s)), ...) of w[i / (4/s)]. */
#define KV_WORDS(n) (((n) + 3) / 4)

void kv_load_chunk(uint *w, const global uchar *p, int n)
{
    if (n >= 16) {
        for (int i = 0; i < n / 16; i++) {
            uint4 v = ((const global uint4 *)p)[i];
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else if (n == 8) {
        uint2 v = *(const global uint2 *)p;
        w[0] = v.x;
        w[1] = v.y;
    } else if (n == 4) {
        w[0] = *(const global uint *)p;
    } else if (n == 2) {
        w[0] = *(const global ushort *)p;
    } else {
        w[0] = *p;
    }
}

void kv_store_chunk(global uchar *p, const uint *w, int n)
{
    if (n >= 16) {
        for (int i = 0; i < n / 16; i++)
            ((global uint4 *)p)[i] = (uint4)(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    } else if (n == 8) {
        *(global uint2 *)p = (uint2)(w[0], w[1]);
    } else if (n == 4) {
        *(global uint *)p = w[0];
    } else if (n == 2) {
        *(global ushort *)p = (ushort)w[0];
    } else {
        *p = (uchar)w[0];
    }
}

/* Byte-wise access for data of any alignment (the fallback kernels). */
uint kv_load_bytes(const global uchar *p, int n)
{
    uint v = 0;
    for (int i = 0; i < n; i++) v |= (uint)p[i] << (8 * i);
    return v;
}

void kv_store_bytes(global uchar *p, uint v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uchar)(v >> (8 * i));
}

uint kv_get_elem(const uint *w, int i, int size)
{
    if (size == 4) return w[i];
    if (size == 2) return (w[i >> 1] >> (16 * (i & 1))) & 0xffffu;
    return (w[i >> 2] >> (8 * (i & 3))) & 0xffu;
}

/* Element i of a chunk into words that start out zero (every element is put exactly once). */
void kv_put_elem(uint *w, int i, int size, uint v)
{
    if (size == 4) w[i] = v;
    else if (size == 2) w[i >> 1] |= v << (16 * (i & 1));
    else w[i >> 2] |= v << (8 * (i & 3));
}

/* kv_common.cl — what every kvhal OpenCL program starts with: dtype codes and sizes, and the conversions between
 * f32 and the stored formats (f16, bf16, fp8 e4m3fn, fp8 e5m2) written with integer operations on the bit patterns,
 * so that no kernel needs cl_khr_fp16 and every OpenCL 1.2 device runs the same code. Each conversion is bit-exact
 * with its host reference in core/convert.c (round to nearest even, subnormals kept, fp8 saturating, NaN kept).
 * Helpers are plain functions, not C99 'inline' ones: an inline definition that a compiler decides not to inline
 * has no external definition to fall back on, and device compilers inline small functions anyway. */

#define KV_F32 0
#define KV_F16 1
#define KV_BF16 2
#define KV_E4M3 3
#define KV_E5M2 4

#define KV_DT_SIZE(dt) ((dt) == KV_F32 ? 4 : ((dt) == KV_F16 || (dt) == KV_BF16) ? 2 : 1)
#define KV_IS_FP8(dt) ((dt) == KV_E4M3 || (dt) == KV_E5M2)

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

uint kv_f32_to_fp8(float x, int m, int bias, uint max_code)
{
    uint u = as_uint(x);
    uint sign = (u >> 24) & 0x80u;
    uint a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    if (a == 0x7f800000u) return sign | max_code;
    uint code = kv_round_magnitude(a, m, bias);
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

/* Bits of one element of dtype dt (in the low bits of the result) -> f32, and back. */
float kv_decode(uint bits, int dt)
{
    switch (dt) {
    case KV_F16: return kv_f16_to_f32(bits);
    case KV_BF16: return kv_bf16_to_f32(bits);
    case KV_E4M3: return kv_e4m3_to_f32(bits);
    case KV_E5M2: return kv_e5m2_to_f32(bits);
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
    default: return as_uint(x);
    }
}

/* x / s rounded to nearest even, as the host's IEEE division gives it. OpenCL's '/' may be off by 2.5 ulp unless
 * the device supports (and the build asks for) correctly rounded division, so the quotient is refined with exact
 * fma residuals: one Newton step, then the neighbour whose residual is smaller wins (a quotient is never exactly
 * halfway between two floats, so there is no tie to break). */
float kv_div(float x, float s)
{
    if (s == 1.0f) return x;
    float q = x / s;
    if (!isfinite(q) || q == 0.0f || !isfinite(x)) return q;
    float r = fma(-q, s, x);
    q = fma(r, 1.0f / s, q);
    r = fma(-q, s, x);
    if (r == 0.0f) return q;
    float n = ((r > 0.0f) == (s > 0.0f)) ? nextafter(q, INFINITY) : nextafter(q, -INFINITY);
    float rn = fma(-n, s, x);
    return fabs(rn) < fabs(r) ? n : q;
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

void kv_put_elem(uint *w, int i, int size, uint v)
{
    if (size == 4) {
        w[i] = v;
    } else if (size == 2) {
        int s = 16 * (i & 1);
        w[i >> 1] = (w[i >> 1] & ~(0xffffu << s)) | (v << s);
    } else {
        int s = 8 * (i & 3);
        w[i >> 2] = (w[i >> 2] & ~(0xffu << s)) | (v << s);
    }
}

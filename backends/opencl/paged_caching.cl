/* paged_caching.cl — the paged-caching op: token t of k and v goes to cache slot slot_mapping[t]. One work-item
 * moves GROUP chunks of VEC elements of one (token, head) row; rows of K come before those of V within a token, so
 * neighbouring work-items touch neighbouring bytes in both the input and an NHD cache. Built per descriptor with:
 *   IN_DT, OUT_DT   dtype codes of k/v and of the caches (kv_common.cl)
 *   SLOT_I64        1 for an i64 slot_mapping, 0 for i32
 *   HEADS, BLOCK_SIZE, HD_K, HD_V
 *   VEC_K, VEC_V    elements per chunk; > 1 only where dim is contiguous in both input and cache and every
 *                   stride keeps the chunk aligned to min(16, chunk bytes)
 *   KV_NV_HW        1 on NVIDIA devices of compute capability >= 8.9: fp8 conversion through PTX (see below), the
 *                   fnuz formats too (through the OCP conversion of twice the quotient)
 *   GROUP           chunks per work-item in paged_caching_vec, all loaded before any is stored
 *   INTERLEAVE      0: the GROUP chunks are neighbours (CPU devices, where per-item index math dominates);
 *                   1: they are HD / GROUP elements apart, so that on a GPU each load of a work-item is coalesced
 *                   with the same load of its neighbours
 * Offsets are bytes (ulong), strides elements (long4: block, offset, head, dim for a cache; token-outer,
 * token-inner, head, dim for an input; long2: outer, inner for the slots). fp8 scales come as (scale, 1 / scale)
 * with a kv_div mode each (modes: K in bits 0-1, V in bits 2-3). A negative slot is padding; a slot past
 * the cache is skipped and sets *err (read and cleared by the host at synchronize). paged_caching_vec needs every
 * base offset aligned to its chunk; paged_caching_any moves single elements byte by byte and takes any offset.
 * Where K and V chunks have the same width, one load and one store path serves both (pointers, strides and scales
 * selected per work-item), so that a warp holding work-items of both sides runs the conversion once.
 * A launch covers `items` work-items from token tok0 on (whole tokens, at most 2^30 items: 32-bit index math);
 * no work-item loops, which CPU devices (PoCL) run several times slower than straight-line work-items. */

#define IN_SIZE KV_DT_SIZE(IN_DT)
#define OUT_SIZE KV_DT_SIZE(OUT_DT)
#define SLOT_SIZE (SLOT_I64 ? 8 : 4)
#define SAME_DT (IN_DT == OUT_DT)
#define SCALED (KV_IS_FP8(OUT_DT) && !KV_IS_FP8(IN_DT))

uint pc_convert(uint bits, float2 sc, uint mode)
{
    if (SAME_DT) return bits;
    float x = kv_decode(bits, IN_DT);
    if (SCALED) x = kv_div(x, sc.x, sc.y, mode);
    return kv_encode(x, OUT_DT);
}

/* A chunk moves in two halves: NAME_load reads it into private words before the slot is known, so that the
 * latencies of the slot load and of the data loads overlap (a load after the slot test would wait for the slot
 * first: the compiler may not hoist a load above a branch); NAME_store converts and writes it once the slot is. */
#define PC_DEFINE_MOVE(NAME, VEC)                                                                              \
    void NAME##_load(uint *wi, const global uchar *src) { kv_load_chunk(wi, src, (VEC) * IN_SIZE); }          \
    void NAME##_store(global uchar *dst, const uint *wi, float2 sc, uint mode)                                 \
    {                                                                                                          \
        if (SAME_DT) {                                                                                         \
            kv_store_chunk(dst, wi, (VEC) * IN_SIZE);                                                          \
            return;                                                                                            \
        }                                                                                                      \
        uint wo[KV_WORDS((VEC) * OUT_SIZE)];                                                                   \
        for (int i = 0; i < KV_WORDS((VEC) * OUT_SIZE); i++) wo[i] = 0u;                                       \
        for (int i = 0; i < (VEC); i++)                                                                        \
            kv_put_elem(wo, i, OUT_SIZE, pc_convert(kv_get_elem(wi, i, IN_SIZE), sc, mode));                   \
        kv_store_chunk(dst, wo, (VEC) * OUT_SIZE);                                                             \
    }

/* The main fp8 case, 16 elements of f32, f16 or bf16 into 16 fp8 bytes: on NVIDIA sm_89+ one 32-bit word at a
 * time through PTX, elsewhere as two 8-wide vector conversions. The fnuz formats take it only on NVIDIA sm_89+
 * (through the OCP conversion, PC_FNUZ below); elsewhere they convert element by element. */
#define PC_FNUZ (KV_IS_FNUZ(OUT_DT) && !KV_IS_FP8(IN_DT) && KV_NV_HW)
#define PC_FAST16 (KV_IS_FP8(OUT_DT) && !KV_IS_FP8(IN_DT) && (!KV_IS_FNUZ(OUT_DT) || KV_NV_HW))
/* The OCP format the hardware converts to: OUT_DT, or for an fnuz cache the OCP format with its mantissa width. */
#if OUT_DT == KV_E4M3 || OUT_DT == KV_E4M3FNUZ
#define PC_OCP KV_E4M3
#else
#define PC_OCP KV_E5M2
#endif
#if PC_FAST16 && KV_NV_HW
/* NVIDIA devices of compute capability 8.9 and later (the host sets KV_NV_HW only there): f16 -> f32 and f32 -> fp8
 * in hardware through inline PTX, two fp8 values per instruction; the results are bit-identical to the integer
 * path's. */
float pc_nv_f16(uint h)
{
    float f;
    __asm__("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((ushort)h));
    return f;
}

uint pc_nv_prmt(uint a, uint b, uint sel)
{
    uint r;
    __asm__("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

/* Signed values straight into cvt.rn.satfinite, one 32-bit word of input at a time (as the CUDA kernels do): it
 * rounds to nearest even and saturates +-inf and out-of-range values to +-max with their sign, as the reference
 * does; only a NaN comes out differently (the canonical NaN code, whatever its sign), and pc_nv_fix_nan gives those
 * bytes sign | 0x7f from the input. No clamp and no separate sign: far fewer instructions than the 8-wide form
 * below, which is what bound this path (it ran out of instruction issue before memory ran out of bandwidth). */
uint pc_nv_sx2(float lo, float hi) /* lo -> byte 0, hi -> byte 1 */
{
    ushort r;
#if PC_OCP == KV_E4M3
    __asm__("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
#else
    __asm__("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

/* Bytes of the four codes c that are NaN (no finite result is above 0x7e in e4m3 or 0x7b in e5m2, and satfinite
 * never gives e5m2's inf, 0x7c) become sign | 0x7f; sign has the inputs' sign bits at bit 7 of each byte. */
uint pc_nv_fix_nan(uint c, uint sign)
{
    const uint m = ((c & 0x7f7f7f7fu) + (OUT_DT == KV_E4M3 ? 0x01010101u : 0x03030303u)) & 0x80808080u;
    if (!m) return c;
    const uint n = (m >> 7) * 0xffu;
    return (c & ~n) | (n & (0x7f7f7f7fu | sign));
}

#if PC_FNUZ
/* AMD's fnuz formats through the OCP conversion, as the CUDA kernels do (kvhal_num_fnuz_from_ocp in
 * kvhal_numerics.h): an fnuz format is its OCP namesake with the exponent bias one higher, so the OCP
 * code of q2 = 2 * (x / s) is the fnuz code of x / s, except where the OCP code's magnitude is at or above the
 * largest OCP finite one (0x7e e4m3, 0x7b e5m2: saturation, q2 past it, NaN) and for a negative zero, which loses
 * its sign. q2 comes from kv_div with (s / 2, 2 / s) (pc_fnuz_fold): every term of its multiply, correction or
 * Newton step is then scaled by a power of two, so it is exactly twice kv_div's quotient wherever that is a normal
 * f32 (below that both round to fnuz's zero; above, both saturate). */
#define PC_FNUZ_E4 (OUT_DT == KV_E4M3FNUZ)
#define PC_FNUZ_TOP (PC_FNUZ_E4 ? 0x02020202u : 0x05050505u) /* + magnitude sets bit 7 at the top OCP codes */

/* (s, 1 / s) and mode of the call -> those that give q2 = 2 * (x / s): false where halving s or doubling 1 / s is
 * not exact (s below 2^-125; the caller then converts element by element). Mode 0 becomes a multiply by 2. */
bool pc_fnuz_fold(float2 sc, uint mode, float2 *sc2, uint *mode2)
{
    *sc2 = (float2)(sc.x * 0.5f, sc.y * 2.0f);
    *mode2 = mode == 0u ? 1u : mode;
    return mode == 0u || (sc.x >= 0x1p-125f && sc.y <= 0x1p126f);
}

/* The bytes of top (0x80 each) whose OCP code c is at the top: the fnuz code of q = q2 / 2 from the OCP code of
 * q / 2 = q2 / 4, which lies two binades below q on the same grid (OCP value = 2 x fnuz value of a code): that code
 * plus two binades (16 codes in e4m3, 8 in e5m2), at most 0x7f, with q2's sign; a NaN byte (OCP 0x7f; e5m2 0x7d and
 * up) becomes 0x80. Integer work and two more conversions, no per-element branches: cheap even where the compiler
 * runs it for every word rather than branching around it. keep: the other bytes' codes. */
uint pc_nv_fnuz_top(uint keep, uint c, uint top, float q0, float q1, float q2, float q3)
{
    const uint d = pc_nv_prmt(pc_nv_sx2(q0 * 0.25f, q1 * 0.25f), pc_nv_sx2(q2 * 0.25f, q3 * 0.25f), 0x5410u);
    uint md = (d & 0x7f7f7f7fu) + (PC_FNUZ_E4 ? 0x10101010u : 0x08080808u); /* each byte <= 0x8f */
    const uint over = ((md & 0x80808080u) >> 7) * 0xffu;
    md = (md & ~over) | (over & 0x7f7f7f7fu);
    const uint tm = (top >> 7) * 0xffu;
    const uint nan = ((((c & 0x7f7f7f7fu) + (PC_FNUZ_E4 ? 0x01010101u : 0x03030303u)) & 0x80808080u) >> 7) * 0xffu;
    const uint r = (keep & ~tm) | (((c & 0x80808080u) | md) & tm);
    return (r & ~nan) | (nan & 0x80808080u);
}

/* Four q2 values -> four fnuz codes, byte i from the i-th. */
uint pc_nv_fnuz4(float q0, float q1, float q2, float q3)
{
    const uint c = pc_nv_prmt(pc_nv_sx2(q0, q1), pc_nv_sx2(q2, q3), 0x5410u);
    const uint m = c & 0x7f7f7f7fu;
    const uint keep = c & (0x7f7f7f7fu | ((m + 0x7f7f7f7fu) & 0x80808080u)); /* a zero magnitude drops its sign */
    const uint top = (m + PC_FNUZ_TOP) & 0x80808080u;
    return top ? pc_nv_fnuz_top(keep, c, top, q0, q1, q2, q3) : keep;
}

/* 16 elements element by element (the scales pc_fnuz_fold cannot take) */
void pc_fnuz16_sw(global uchar *dst, const uint *wi, float2 sc, uint mode)
{
    uint wo[4] = {0u, 0u, 0u, 0u};
    for (int i = 0; i < 16; i++) kv_put_elem(wo, i, 1, pc_convert(kv_get_elem(wi, i, IN_SIZE), sc, mode));
    *(global uint4 *)dst = (uint4)(wo[0], wo[1], wo[2], wo[3]);
}
#endif

#if IN_SIZE == 2
float pc_nv_lo(uint w) /* lane 0 of w */
{
#if IN_DT == KV_F16
    return pc_nv_f16(w & 0xffffu);
#else
    return as_float(w << 16);
#endif
}

float pc_nv_hi(uint w) /* lane 1 of w */
{
#if IN_DT == KV_F16
    return pc_nv_f16(w >> 16);
#else
    return as_float(w & 0xffff0000u);
#endif
}

uint pc_nv_word(uint w, float2 sc, uint mode) /* both lanes of w -> bytes 0, 1 */
{
    return pc_nv_sx2(kv_div(pc_nv_lo(w), sc.x, sc.y, mode), kv_div(pc_nv_hi(w), sc.x, sc.y, mode));
}

/* The codes c0, c1 (bytes 0 and 1 each) of the 16-bit words w0, w1 -> four code bytes; the high byte of each input
 * lane carries its sign for the NaN fix. */
uint pc_nv_pack(uint c0, uint c1, uint w0, uint w1)
{
    return pc_nv_fix_nan(pc_nv_prmt(c0, c1, 0x5410u), pc_nv_prmt(w0, w1, 0x7531u) & 0x80808080u);
}

uint pc_nv_quad(uint w0, uint w1, float2 sc, uint mode)
{
    return pc_nv_pack(pc_nv_word(w0, sc, mode), pc_nv_word(w1, sc, mode), w0, w1);
}

#if PC_FNUZ
uint pc_nv_fnuz_quad(uint w0, uint w1, float2 sc2, uint mode2)
{
    return pc_nv_fnuz4(kv_div(pc_nv_lo(w0), sc2.x, sc2.y, mode2), kv_div(pc_nv_hi(w0), sc2.x, sc2.y, mode2),
                       kv_div(pc_nv_lo(w1), sc2.x, sc2.y, mode2), kv_div(pc_nv_hi(w1), sc2.x, sc2.y, mode2));
}
#endif

#if IN_DT == KV_F16 && !PC_FNUZ
/* f16 straight to fp8, two lanes per cvt and no f32 at all: the f16 -> f32 decodes of the path above are what bound
 * it (it runs out of instruction issue before the memory runs out of bandwidth). Exact, because f16 -> f32 is exact
 * and so rounding the f16 to fp8 directly is the same rounding; a power-of-two scale (mode 1) is one f16x2
 * multiply, exact except where it overflows to inf, which saturates as the f32 value would (or, for e5m2 when
 * it scales down, may land on an f16 subnormal and round: that case, like mode 2, takes the f32 path). NaN lanes
 * are fixed by pc_nv_pack as on the f32 path. h2 is the f16 of 1/scale in both halves. */
uint pc_nv_word_h(uint w, uint h2, uint mode) /* both lanes of w -> bytes 0, 1 */
{
    uint x = w;
    if (mode == 1u) __asm__("mul.rn.f16x2 %0, %1, %2;" : "=r"(x) : "r"(w), "r"(h2));
    ushort r;
#if OUT_DT == KV_E4M3
    __asm__("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(r) : "r"(x));
#else
    __asm__("cvt.rn.satfinite.e5m2x2.f16x2 %0, %1;" : "=h"(r) : "r"(x));
#endif
    return r;
}

/* Whether pc_nv_word_h gives the reference's result for this scale mode and 1/scale; h2 gets the f16x2 of 1/scale. */
bool pc_nv_half_ok(float inv, uint mode, uint *h2)
{
    *h2 = 0u;
    if (mode == 0u) return true;
    if (mode != 1u || !(inv >= 0x1p-14f && inv <= 0x1p15f)) return false; /* a normal f16: a power of two is exact */
    if (OUT_DT == KV_E5M2 && inv < 1.0f) return false;
    ushort h;
    __asm__("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(inv));
    *h2 = (uint)h | ((uint)h << 16);
    return true;
}
#endif
#elif PC_FNUZ
/* f32: four words -> four fnuz code bytes. */
uint pc_nv_fnuz_quad32(uint4 w, float2 sc2, uint mode2)
{
    return pc_nv_fnuz4(kv_div(as_float(w.x), sc2.x, sc2.y, mode2), kv_div(as_float(w.y), sc2.x, sc2.y, mode2),
                       kv_div(as_float(w.z), sc2.x, sc2.y, mode2), kv_div(as_float(w.w), sc2.x, sc2.y, mode2));
}
#else
/* f32: four words -> four code bytes. */
uint pc_nv_quad32(uint4 w, float2 sc, uint mode)
{
    const uint c = pc_nv_prmt(pc_nv_sx2(kv_div(as_float(w.x), sc.x, sc.y, mode), kv_div(as_float(w.y), sc.x, sc.y, mode)),
                              pc_nv_sx2(kv_div(as_float(w.z), sc.x, sc.y, mode), kv_div(as_float(w.w), sc.x, sc.y, mode)),
                              0x5410u);
    return pc_nv_fix_nan(c, ((w.x >> 24) & 0x80u) | ((w.y >> 16) & 0x8000u) | ((w.z >> 8) & 0x800000u) |
                                (w.w & 0x80000000u));
}
#endif

#elif PC_FAST16
/* The integer path, every device. */
uint2 pc_convert8(uint8 bits, float2 sc, uint mode)
{
#if IN_DT == KV_F16
    float8 x = kv_f16_to_f32_8(bits);
#elif IN_DT == KV_BF16
    float8 x = as_float8(bits << 16);
#else
    float8 x = as_float8(bits);
#endif
    x = kv_div_8(x, sc.x, sc.y, mode);
#if OUT_DT == KV_E4M3
    return as_uint2(convert_uchar8(kv_f32_to_fp8_8(x, 3, 7, 0x7eu)));
#else
    return as_uint2(convert_uchar8(kv_f32_to_fp8_8(x, 2, 15, 0x7bu)));
#endif
}

#endif

#if PC_FAST16
/* 16 elements: IN_SIZE 16-byte words in (as 4 * IN_SIZE uints), one 16-byte word out. */
void pc_move16_load(uint *wi, const global uchar *src) { kv_load_chunk(wi, src, 16 * IN_SIZE); }

void pc_move16_store(global uchar *dst, const uint *wi, float2 sc, uint mode)
{
#if PC_FNUZ
    float2 sc2;
    uint mode2;
    if (!pc_fnuz_fold(sc, mode, &sc2, &mode2)) { /* uniform: the scale of the call */
        pc_fnuz16_sw(dst, wi, sc, mode);
        return;
    }
#if IN_SIZE == 2
    const uint4 a = vload4(0, wi), b = vload4(1, wi);
    *(global uint4 *)dst = (uint4)(pc_nv_fnuz_quad(a.x, a.y, sc2, mode2), pc_nv_fnuz_quad(a.z, a.w, sc2, mode2),
                                   pc_nv_fnuz_quad(b.x, b.y, sc2, mode2), pc_nv_fnuz_quad(b.z, b.w, sc2, mode2));
#else
    *(global uint4 *)dst = (uint4)(pc_nv_fnuz_quad32(vload4(0, wi), sc2, mode2),
                                   pc_nv_fnuz_quad32(vload4(1, wi), sc2, mode2),
                                   pc_nv_fnuz_quad32(vload4(2, wi), sc2, mode2),
                                   pc_nv_fnuz_quad32(vload4(3, wi), sc2, mode2));
#endif
#elif IN_SIZE == 2 && KV_NV_HW
    const uint4 a = vload4(0, wi), b = vload4(1, wi);
#if IN_DT == KV_F16
    uint h2;
    if (pc_nv_half_ok(sc.y, mode, &h2)) {
        *(global uint4 *)dst =
            (uint4)(pc_nv_pack(pc_nv_word_h(a.x, h2, mode), pc_nv_word_h(a.y, h2, mode), a.x, a.y),
                    pc_nv_pack(pc_nv_word_h(a.z, h2, mode), pc_nv_word_h(a.w, h2, mode), a.z, a.w),
                    pc_nv_pack(pc_nv_word_h(b.x, h2, mode), pc_nv_word_h(b.y, h2, mode), b.x, b.y),
                    pc_nv_pack(pc_nv_word_h(b.z, h2, mode), pc_nv_word_h(b.w, h2, mode), b.z, b.w));
        return;
    }
#endif
    *(global uint4 *)dst = (uint4)(pc_nv_quad(a.x, a.y, sc, mode), pc_nv_quad(a.z, a.w, sc, mode),
                                   pc_nv_quad(b.x, b.y, sc, mode), pc_nv_quad(b.z, b.w, sc, mode));
#elif KV_NV_HW
    *(global uint4 *)dst = (uint4)(pc_nv_quad32(vload4(0, wi), sc, mode), pc_nv_quad32(vload4(1, wi), sc, mode),
                                   pc_nv_quad32(vload4(2, wi), sc, mode), pc_nv_quad32(vload4(3, wi), sc, mode));
#elif IN_SIZE == 4
    uint2 lo = pc_convert8(vload8(0, wi), sc, mode), hi = pc_convert8(vload8(1, wi), sc, mode);
    *(global uint4 *)dst = (uint4)(lo, hi);
#else
    const uint8 order = (uint8)(0, 4, 1, 5, 2, 6, 3, 7); /* little-endian: the low half of a word comes first */
    uint4 a = vload4(0, wi), b = vload4(1, wi);
    uint2 lo = pc_convert8(shuffle2(a & 0xffffu, a >> 16, order), sc, mode);
    uint2 hi = pc_convert8(shuffle2(b & 0xffffu, b >> 16, order), sc, mode);
    *(global uint4 *)dst = (uint4)(lo, hi);
#endif
}
#endif

#if PC_FAST16 && VEC_K == 16
#define pc_move_k_load pc_move16_load
#define pc_move_k_store pc_move16_store
#else
PC_DEFINE_MOVE(pc_move_k, VEC_K)
#endif
#if PC_FAST16 && VEC_V == 16
#define pc_move_v_load pc_move16_load
#define pc_move_v_store pc_move16_store
#else
PC_DEFINE_MOVE(pc_move_v, VEC_V)
#endif

void pc_move_any_load(uint *wi, const global uchar *src) { wi[0] = kv_load_bytes(src, IN_SIZE); }

void pc_move_any_store(global uchar *dst, const uint *wi, float2 sc, uint mode)
{
    kv_store_bytes(dst, pc_convert(wi[0], sc, mode), OUT_SIZE);
}

long pc_slot_aligned(const global uchar *p)
{
    return SLOT_I64 ? *(const global long *)p : (long)*(const global int *)p;
}

long pc_slot_any(const global uchar *p)
{
    if (SLOT_I64) return (long)((ulong)kv_load_bytes(p, 4) | ((ulong)kv_load_bytes(p + 4, 4) << 32));
    return (long)(int)kv_load_bytes(p, 4);
}

#define PC_KERNEL(NAME, VK, VV, G, MOVE_K, MOVE_V, SLOT)                                                       \
    kernel void NAME(global uchar *kc, ulong kc_off, long4 kcs, const global uchar *ki, ulong ki_off, long4 kis, \
                     float2 k_sc, global uchar *vc, ulong vc_off, long4 vcs, const global uchar *vi,            \
                     ulong vi_off, long4 vis, float2 v_sc, const global uchar *slots, ulong slots_off,          \
                     long2 ss, volatile global int *err, ulong num_tokens, ulong seq_len, long num_slots,       \
                     uint modes, ulong tok0, uint items)                                                       \
    {                                                                                                          \
        const uint ck = HD_K / (VK) / (G), cv = HD_V / (VV) / (G);                                             \
        const int wk = KV_WORDS((VK) * IN_SIZE), wv = KV_WORDS((VV) * IN_SIZE);                                \
        const uint per_tok = HEADS * (ck + cv);                                                                \
        const uint i = (uint)get_global_id(0);                                                                 \
        if (i >= items) return;                                                                                \
        const ulong t = tok0 + i / per_tok;                                                                    \
        uint r = i % per_tok;                                                                                  \
        long to = 0, ti = (long)t;                                                                             \
        if (seq_len != num_tokens) {                                                                           \
            to = (long)(t / seq_len);                                                                          \
            ti = (long)(t - (ulong)to * seq_len);                                                              \
        }                                                                                                      \
        const long slot = SLOT(slots + slots_off + (to * ss.s0 + ti * ss.s1) * SLOT_SIZE);                     \
        const bool is_k = r < HEADS * ck;                                                                      \
        if (!is_k) r -= HEADS * ck;                                                                            \
        const long h = r / (is_k ? ck : cv), d = (long)(r % (is_k ? ck : cv)) * (is_k ? (VK) : (VV)) * (INTERLEAVE ? 1 : (G)); \
        const long gk = INTERLEAVE ? (long)ck * (VK) : (VK), gv = INTERLEAVE ? (long)cv * (VV) : (VV); /* elements */ \
        uint w[(G) * (KV_WORDS((VK) * IN_SIZE) > KV_WORDS((VV) * IN_SIZE) ? KV_WORDS((VK) * IN_SIZE)          \
                                                                           : KV_WORDS((VV) * IN_SIZE))];       \
        if ((VK) == (VV)) {                                                                                    \
            /* one load and one store path for K and V (operands selected): a warp that holds work-items of    \
             * both (an MLA row: 16 + 2 per token) then runs the conversion once, not once per side */         \
            const long4 is = is_k ? kis : vis;                                                                 \
            const long g_el = is_k ? gk : gv;                                                                  \
            const global uchar *sp = (is_k ? ki + ki_off : vi + vi_off) +                                      \
                                     (to * is.s0 + ti * is.s1 + h * is.s2 + d * is.s3) * IN_SIZE;              \
            for (int g = 0; g < (G); g++) MOVE_K##_load(w + g * wk, sp + g * g_el * IN_SIZE);                 \
            if (slot < 0) return;                                                                              \
            if (slot >= num_slots) {                                                                           \
                if (r == 0u && is_k) atomic_or(err, 1);                                                        \
                return;                                                                                        \
            }                                                                                                  \
            const long blk = (long)((ulong)slot / BLOCK_SIZE), off = slot - blk * BLOCK_SIZE;                  \
            const long4 cs = is_k ? kcs : vcs;                                                                 \
            global uchar *dp = (is_k ? kc + kc_off : vc + vc_off) +                                            \
                               (blk * cs.s0 + off * cs.s1 + h * cs.s2 + d * cs.s3) * OUT_SIZE;                 \
            const float2 sc = is_k ? k_sc : v_sc;                                                              \
            const uint mode = is_k ? (modes & 3u) : (modes >> 2);                                              \
            for (int g = 0; g < (G); g++) MOVE_K##_store(dp + g * g_el * OUT_SIZE, w + g * wk, sc, mode);      \
            return;                                                                                            \
        }                                                                                                      \
        if (is_k) {                                                                                            \
            const global uchar *sp = ki + ki_off + (to * kis.s0 + ti * kis.s1 + h * kis.s2 + d * kis.s3) * IN_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_K##_load(w + g * wk, sp + g * gk * IN_SIZE);                  \
        } else {                                                                                               \
            const global uchar *sp = vi + vi_off + (to * vis.s0 + ti * vis.s1 + h * vis.s2 + d * vis.s3) * IN_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_V##_load(w + g * wv, sp + g * gv * IN_SIZE);                  \
        }                                                                                                      \
        if (slot < 0) return;                                                                                  \
        if (slot >= num_slots) {                                                                               \
            if (r == 0u && is_k) atomic_or(err, 1);                                                            \
            return;                                                                                            \
        }                                                                                                      \
        const long blk = (long)((ulong)slot / BLOCK_SIZE), off = slot - blk * BLOCK_SIZE;                      \
        if (is_k) {                                                                                            \
            global uchar *dp = kc + kc_off + (blk * kcs.s0 + off * kcs.s1 + h * kcs.s2 + d * kcs.s3) * OUT_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_K##_store(dp + g * gk * OUT_SIZE, w + g * wk, k_sc, modes & 3u); \
        } else {                                                                                               \
            global uchar *dp = vc + vc_off + (blk * vcs.s0 + off * vcs.s1 + h * vcs.s2 + d * vcs.s3) * OUT_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_V##_store(dp + g * gv * OUT_SIZE, w + g * wv, v_sc, modes >> 2); \
        }                                                                                                      \
    }

PC_KERNEL(paged_caching_vec, VEC_K, VEC_V, GROUP, pc_move_k, pc_move_v, pc_slot_aligned)
PC_KERNEL(paged_caching_any, 1, 1, 1, pc_move_any, pc_move_any, pc_slot_any)

/* paged_caching.cl — the paged-caching op: token t of k and v goes to cache slot slot_mapping[t]. One work-item
 * moves GROUP chunks of VEC elements of one (token, head) row; rows of K come before those of V within a token, so
 * neighbouring work-items touch neighbouring bytes in both the input and an NHD cache. Built per descriptor with:
 *   IN_DT, OUT_DT   dtype codes of k/v and of the caches (kv_common.cl)
 *   SLOT_I64        1 for an i64 slot_mapping, 0 for i32
 *   HEADS, BLOCK_SIZE, HD_K, HD_V
 *   VEC_K, VEC_V    elements per chunk; > 1 only where dim is contiguous in both input and cache and every
 *                   stride keeps the chunk aligned to min(16, chunk bytes)
 *   KV_NV_HW        1 on NVIDIA devices of compute capability >= 8.9: fp8 conversion through PTX (see below)
 *   GROUP           consecutive chunks per work-item in paged_caching_vec (1 on GPUs, where neighbouring work-items
 *                   should touch neighbouring bytes; more on CPU devices, where per-item index math dominates)
 * Offsets are bytes (ulong), strides elements (long4: block, offset, head, dim for a cache; token-outer,
 * token-inner, head, dim for an input; long2: outer, inner for the slots). fp8 scales come as (scale, 1 / scale)
 * with a kv_div mode each (modes: K in bits 0-1, V in bits 2-3). A negative slot is padding; a slot past
 * the cache is skipped and sets *err (read and cleared by the host at synchronize). paged_caching_vec needs every
 * base offset aligned to its chunk; paged_caching_any moves single elements byte by byte and takes any offset.
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

#define PC_DEFINE_MOVE(NAME, VEC)                                                                              \
    void NAME(global uchar *dst, const global uchar *src, float2 sc, uint mode)                                \
    {                                                                                                          \
        uint wi[KV_WORDS((VEC) * IN_SIZE)];                                                                    \
        kv_load_chunk(wi, src, (VEC) * IN_SIZE);                                                               \
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

/* The main fp8 case, 16 elements of f32, f16 or bf16 into 16 fp8 bytes, as two 8-wide vector conversions. */
#define PC_FAST16 (KV_IS_FP8(OUT_DT) && !KV_IS_FP8(IN_DT))
#if PC_FAST16 && KV_NV_HW
/* NVIDIA devices of compute capability 8.9 and later (the host sets KV_NV_HW only there): f16 -> f32 and f32 -> fp8
 * in hardware through inline PTX, two fp8 values per instruction (cvt.rn.satfinite: round to nearest even,
 * saturating). Magnitudes are converted, clamped first so that infinities saturate and NaN gives the largest code,
 * and the sign and NaN bits come from the input as on the integer path: the results are bit-identical to it. */
float pc_nv_f16(uint h)
{
    float f;
    __asm__("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((ushort)h));
    return f;
}

uint pc_nv_fp8x2(float lo, float hi) /* lo -> byte 0, hi -> byte 1 */
{
    ushort r;
#if OUT_DT == KV_E4M3
    __asm__("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(fmin(hi, 448.0f)), "f"(fmin(lo, 448.0f)));
#else
    __asm__("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(fmin(hi, 57344.0f)), "f"(fmin(lo, 57344.0f)));
#endif
    return r;
}

uint2 pc_convert8(uint8 bits, float2 sc, uint mode)
{
#if IN_SIZE == 4
    float8 x = as_float8(bits & 0x7fffffffu);
    uint8 sign = (bits >> 24) & 0x80u;
#else
    uint8 m = bits & 0x7fffu;
#if IN_DT == KV_F16
    float8 x = (float8)(pc_nv_f16(m.s0), pc_nv_f16(m.s1), pc_nv_f16(m.s2), pc_nv_f16(m.s3), pc_nv_f16(m.s4),
                        pc_nv_f16(m.s5), pc_nv_f16(m.s6), pc_nv_f16(m.s7));
#else
    float8 x = as_float8(m << 16);
#endif
    uint8 sign = (bits >> 8) & 0x80u;
#endif
    x = kv_div_8(x, sc.x, sc.y, mode);
    uint c0 = pc_nv_fp8x2(x.s0, x.s1), c1 = pc_nv_fp8x2(x.s2, x.s3), c2 = pc_nv_fp8x2(x.s4, x.s5),
         c3 = pc_nv_fp8x2(x.s6, x.s7);
    uint8 code = (uint8)(c0 & 0xffu, c0 >> 8, c1 & 0xffu, c1 >> 8, c2 & 0xffu, c2 >> 8, c3 & 0xffu, c3 >> 8);
    return as_uint2(convert_uchar8(sign | select(code, (uint8)0x7fu, isnan(x))));
}
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
void pc_move16(global uchar *dst, const global uchar *src, float2 sc, uint mode)
{
    const global uint4 *p = (const global uint4 *)src;
#if IN_SIZE == 4
    uint2 lo = pc_convert8((uint8)(p[0], p[1]), sc, mode), hi = pc_convert8((uint8)(p[2], p[3]), sc, mode);
#else
    const uint8 order = (uint8)(0, 4, 1, 5, 2, 6, 3, 7); /* little-endian: the low half of a word comes first */
    uint4 a = p[0], b = p[1];
    uint2 lo = pc_convert8(shuffle2(a & 0xffffu, a >> 16, order), sc, mode);
    uint2 hi = pc_convert8(shuffle2(b & 0xffffu, b >> 16, order), sc, mode);
#endif
    *(global uint4 *)dst = (uint4)(lo, hi);
}
#endif

#if PC_FAST16 && VEC_K == 16
#define pc_move_k pc_move16
#else
PC_DEFINE_MOVE(pc_move_k, VEC_K)
#endif
#if PC_FAST16 && VEC_V == 16
#define pc_move_v pc_move16
#else
PC_DEFINE_MOVE(pc_move_v, VEC_V)
#endif

void pc_move_any(global uchar *dst, const global uchar *src, float2 sc, uint mode)
{
    kv_store_bytes(dst, pc_convert(kv_load_bytes(src, IN_SIZE), sc, mode), OUT_SIZE);
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
        long slot = SLOT(slots + slots_off + (to * ss.s0 + ti * ss.s1) * SLOT_SIZE);                           \
        if (slot < 0) return;                                                                                  \
        if (slot >= num_slots) {                                                                               \
            if (r == 0u) atomic_or(err, 1);                                                                    \
            return;                                                                                            \
        }                                                                                                      \
        long blk = (long)((ulong)slot / BLOCK_SIZE), off = slot - blk * BLOCK_SIZE;                            \
        if (r < HEADS * ck) {                                                                                  \
            long h = r / ck, d = (long)(r % ck) * (VK) * (G);                                                  \
            global uchar *dp = kc + kc_off + (blk * kcs.s0 + off * kcs.s1 + h * kcs.s2 + d * kcs.s3) * OUT_SIZE; \
            const global uchar *sp = ki + ki_off + (to * kis.s0 + ti * kis.s1 + h * kis.s2 + d * kis.s3) * IN_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_K(dp + g * (VK) * OUT_SIZE, sp + g * (VK) * IN_SIZE, k_sc, modes & 3u); \
        } else {                                                                                               \
            r -= HEADS * ck;                                                                                   \
            long h = r / cv, d = (long)(r % cv) * (VV) * (G);                                                  \
            global uchar *dp = vc + vc_off + (blk * vcs.s0 + off * vcs.s1 + h * vcs.s2 + d * vcs.s3) * OUT_SIZE; \
            const global uchar *sp = vi + vi_off + (to * vis.s0 + ti * vis.s1 + h * vis.s2 + d * vis.s3) * IN_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_V(dp + g * (VV) * OUT_SIZE, sp + g * (VV) * IN_SIZE, v_sc, modes >> 2); \
        }                                                                                                      \
    }

PC_KERNEL(paged_caching_vec, VEC_K, VEC_V, GROUP, pc_move_k, pc_move_v, pc_slot_aligned)
PC_KERNEL(paged_caching_any, 1, 1, 1, pc_move_any, pc_move_any, pc_slot_any)

/* paged_caching.cl — the paged-caching op: token t of k and v goes to cache slot slot_mapping[t]. One work-item
 * moves one chunk of VEC elements of one (token, head) row; rows of K come before those of V within a token, so
 * neighbouring work-items touch neighbouring bytes in both the input and an NHD cache. Built per descriptor with:
 *   IN_DT, OUT_DT   dtype codes of k/v and of the caches (kv_common.cl)
 *   SLOT_I64        1 for an i64 slot_mapping, 0 for i32
 *   HEADS, BLOCK_SIZE, HD_K, HD_V
 *   VEC_K, VEC_V    elements per chunk; > 1 only where dim is contiguous in both input and cache and every
 *                   stride keeps the chunk aligned to min(16, chunk bytes)
 *   GROUP           consecutive chunks per work-item in paged_caching_vec (1 on GPUs, where neighbouring work-items
 *                   should touch neighbouring bytes; more on CPU devices, where per-item index math dominates)
 * Offsets are bytes (ulong), strides elements (long4: block, offset, head, dim for a cache; token-outer,
 * token-inner, head, dim for an input; long2: outer, inner for the slots). A negative slot is padding; a slot past
 * the cache is skipped and sets *err (read and cleared by the host at synchronize). paged_caching_vec needs every
 * base offset aligned to its chunk; paged_caching_any moves single elements byte by byte and takes any offset.
 * A launch covers `items` work-items from token tok0 on (whole tokens, at most 2^30 items: 32-bit index math);
 * no work-item loops, which CPU devices (PoCL) run several times slower than straight-line work-items. */

#define IN_SIZE KV_DT_SIZE(IN_DT)
#define OUT_SIZE KV_DT_SIZE(OUT_DT)
#define SLOT_SIZE (SLOT_I64 ? 8 : 4)
#define SAME_DT (IN_DT == OUT_DT)
#define SCALED (KV_IS_FP8(OUT_DT) && !KV_IS_FP8(IN_DT))

uint pc_convert(uint bits, float scale)
{
    if (SAME_DT) return bits;
    float x = kv_decode(bits, IN_DT);
    if (SCALED) x = kv_div(x, scale);
    return kv_encode(x, OUT_DT);
}

#define PC_DEFINE_MOVE(NAME, VEC)                                                                              \
    void NAME(global uchar *dst, const global uchar *src, float scale)                                         \
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
            kv_put_elem(wo, i, OUT_SIZE, pc_convert(kv_get_elem(wi, i, IN_SIZE), scale));                      \
        kv_store_chunk(dst, wo, (VEC) * OUT_SIZE);                                                             \
    }

PC_DEFINE_MOVE(pc_move_k, VEC_K)
PC_DEFINE_MOVE(pc_move_v, VEC_V)

void pc_move_any(global uchar *dst, const global uchar *src, float scale)
{
    kv_store_bytes(dst, pc_convert(kv_load_bytes(src, IN_SIZE), scale), OUT_SIZE);
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
                     float k_scale, global uchar *vc, ulong vc_off, long4 vcs, const global uchar *vi,          \
                     ulong vi_off, long4 vis, float v_scale, const global uchar *slots, ulong slots_off,        \
                     long2 ss, volatile global int *err, ulong num_tokens, ulong seq_len, long num_slots,       \
                     ulong tok0, uint items)                                                                   \
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
            for (int g = 0; g < (G); g++) MOVE_K(dp + g * (VK) * OUT_SIZE, sp + g * (VK) * IN_SIZE, k_scale);    \
        } else {                                                                                               \
            r -= HEADS * ck;                                                                                   \
            long h = r / cv, d = (long)(r % cv) * (VV) * (G);                                                  \
            global uchar *dp = vc + vc_off + (blk * vcs.s0 + off * vcs.s1 + h * vcs.s2 + d * vcs.s3) * OUT_SIZE; \
            const global uchar *sp = vi + vi_off + (to * vis.s0 + ti * vis.s1 + h * vis.s2 + d * vis.s3) * IN_SIZE; \
            for (int g = 0; g < (G); g++) MOVE_V(dp + g * (VV) * OUT_SIZE, sp + g * (VV) * IN_SIZE, v_scale);    \
        }                                                                                                      \
    }

PC_KERNEL(paged_caching_vec, VEC_K, VEC_V, GROUP, pc_move_k, pc_move_v, pc_slot_aligned)
PC_KERNEL(paged_caching_any, 1, 1, 1, pc_move_any, pc_move_any, pc_slot_any)

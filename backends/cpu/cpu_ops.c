/* cpu_ops.c — the CPU backend's ops: paged caching, copy_blocks, tensor_copy and copy_batch on host memory.
 * Work is synchronous. Slots are host-readable here, so paged caching checks every slot before it writes anything:
 * an out-of-range slot fails the call with the cache untouched (GPU backends skip it and raise a device flag).
 * The descriptor records which copy loop fits the call's strides and dtypes, so a call does no planning. */
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "internal.h"

/* How one side (K or V) of a paged-caching call moves a token. */
typedef enum {
    MOVE_TOKEN,   /* same dtype, [heads, dim] dense on both sides: one memcpy per token */
    MOVE_ROW,     /* same dtype, dim contiguous on both sides: one memcpy per (token, head) */
    MOVE_CONVERT, /* fp8 cache, dim contiguous on both sides: a conversion loop per (token, head) */
    MOVE_GENERIC  /* anything else: element by element */
} move_kind;

typedef struct cpu_desc {
    kvhal_bk_op op;
    move_kind k_move, v_move;
} cpu_desc;

static move_kind plan_side(const kvhal_bk_paged_side *s, kvhal_dtype in, kvhal_dtype cache, int32_t heads)
{
    bool rows = s->in_dim_stride == 1 && s->cache_dim_stride == 1;
    if (in != cache) return rows ? MOVE_CONVERT : MOVE_GENERIC;
    if (!rows) return MOVE_GENERIC;
    if (heads == 1 || (s->in_head_stride == s->head_dim && s->cache_head_stride == s->head_dim)) return MOVE_TOKEN;
    return MOVE_ROW;
}

kvhal_status kvhal__cpu_desc_create(int32_t id, kvhal_bk_op op, const void *args, void **desc)
{
    cpu_desc *d = kvhal__malloc(sizeof *d);
    if (!d) return kvhal__err(KVHAL_OUT_OF_MEMORY, "cpu: cannot allocate a descriptor");
    d->op = op;
    d->k_move = d->v_move = MOVE_GENERIC;
    if (op == KVHAL_BK_OP_PAGED_CACHING) {
        const kvhal_bk_paged_caching *a = args;
        d->k_move = plan_side(&a->k, a->input_dtype, a->cache_dtype, a->num_heads);
        d->v_move = plan_side(&a->v, a->input_dtype, a->cache_dtype, a->num_heads);
    }
    *desc = d;
    return KVHAL_OK;
}

void kvhal__cpu_desc_destroy(int32_t id, kvhal_bk_op op, void *desc) { free(desc); }

/* ---- element conversion ---- */

static inline float load_float(const char *p, kvhal_dtype dt)
{
    switch (dt) {
    case KVHAL_F16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return kvhal_f16_to_f32(h);
    }
    case KVHAL_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return kvhal_bf16_to_f32(h);
    }
    default: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    }
}

/* n elements from src (input dtype, element stride ss) to fp8 dst (element stride ds), stored = value / scale. */
static void convert_row(uint8_t *dst, int64_t ds, const char *src, int64_t ss, kvhal_dtype in, kvhal_dtype out,
                        float scale, int64_t n)
{
    const size_t es = kvhal_dtype_size(in);
    for (int64_t i = 0; i < n; i++)
        dst[i * ds] = kvhal_f32_to_fp8(load_float(src + (size_t)(i * ss) * es, in) / scale, out);
}

static void copy_strided(char *dst, int64_t ds, const char *src, int64_t ss, size_t es, int64_t n)
{
    for (int64_t i = 0; i < n; i++) memcpy(dst + (size_t)(i * ds) * es, src + (size_t)(i * ss) * es, es);
}

/* ---- paged caching ---- */

static inline int64_t read_slot(const char *base, kvhal_dtype dt, int64_t index)
{
    if (dt == KVHAL_I32) {
        int32_t v;
        memcpy(&v, base + index * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, base + index * 8, 8);
    return v;
}

static void move_token(const kvhal_bk_paged_caching *a, const kvhal_bk_paged_side *s, move_kind kind, int64_t tok_elem,
                       int64_t slot)
{
    const size_t ies = kvhal_dtype_size(a->input_dtype), ces = kvhal_dtype_size(a->cache_dtype);
    const int64_t blk = slot / a->block_size, off = slot - blk * a->block_size;
    char *cache = (char *)s->cache + s->cache_offset + (size_t)(blk * s->block_stride + off * s->offset_stride) * ces;
    const char *in = (const char *)s->input + s->input_offset + (size_t)tok_elem * ies;
    const int32_t heads = a->num_heads, hd = s->head_dim;
    switch (kind) {
    case MOVE_TOKEN:
        memcpy(cache, in, (size_t)heads * (size_t)hd * ces);
        break;
    case MOVE_ROW:
        for (int32_t h = 0; h < heads; h++)
            memcpy(cache + (size_t)(h * s->cache_head_stride) * ces, in + (size_t)(h * s->in_head_stride) * ies,
                   (size_t)hd * ces);
        break;
    case MOVE_CONVERT:
    case MOVE_GENERIC:
        for (int32_t h = 0; h < heads; h++) {
            char *c = cache + (size_t)(h * s->cache_head_stride) * ces;
            const char *x = in + (size_t)(h * s->in_head_stride) * ies;
            if (a->input_dtype == a->cache_dtype)
                copy_strided(c, s->cache_dim_stride, x, s->in_dim_stride, ces, hd);
            else
                convert_row((uint8_t *)c, s->cache_dim_stride, x, s->in_dim_stride, a->input_dtype, a->cache_dtype,
                            s->scale, hd);
        }
        break;
    }
}

kvhal_status kvhal__cpu_paged_caching(int32_t id, void *desc, const kvhal_bk_paged_caching *a, void *stream)
{
    const cpu_desc *d = desc;
    move_kind km = d ? d->k_move : plan_side(&a->k, a->input_dtype, a->cache_dtype, a->num_heads);
    move_kind vm = d ? d->v_move : plan_side(&a->v, a->input_dtype, a->cache_dtype, a->num_heads);
    const char *slots = (const char *)a->slots + a->slots_offset;
    const int64_t max_slot = a->num_blocks * a->block_size;
    const int64_t seq = a->seq_len, outer = a->num_tokens / seq;

    /* Every slot first: a bad one must leave the cache as it was. */
    for (int64_t b = 0; b < outer; b++) {
        for (int64_t i = 0; i < seq; i++) {
            int64_t slot = read_slot(slots, a->slot_dtype, b * a->slot_stride_outer + i * a->slot_stride_inner);
            if (slot >= max_slot)
                return kvhal__err(KVHAL_OUT_OF_RANGE, "slot_mapping[%lld]: slot %lld is out of range [0, %lld) "
                                  "(%lld blocks of %d); nothing was written", (long long)(b * seq + i),
                                  (long long)slot, (long long)max_slot, (long long)a->num_blocks, (int)a->block_size);
        }
    }
    for (int64_t b = 0; b < outer; b++) {
        for (int64_t i = 0; i < seq; i++) {
            int64_t slot = read_slot(slots, a->slot_dtype, b * a->slot_stride_outer + i * a->slot_stride_inner);
            if (slot < 0) continue; /* padding */
            move_token(a, &a->k, km, b * a->k.tok_stride_outer + i * a->k.tok_stride_inner, slot);
            move_token(a, &a->v, vm, b * a->v.tok_stride_outer + i * a->v.tok_stride_inner, slot);
        }
    }
    return KVHAL_OK;
}

/* ---- copy_blocks ---- */

kvhal_status kvhal__cpu_copy_blocks(int32_t id, void *desc, const kvhal_bk_copy_blocks *a, void *stream)
{
    for (int32_t c = 0; c < a->num_caches; c++) {
        char *base = (char *)a->natives[c] + a->offsets[c];
        const int64_t stride = a->block_strides[c];
        const size_t bytes = (size_t)a->block_bytes[c];
        for (int32_t p = 0; p < a->num_pairs; p++) {
            const int64_t src = a->pairs[2 * p], dst = a->pairs[2 * p + 1];
            if (src == dst) continue;
            memcpy(base + dst * stride, base + src * stride, bytes);
        }
    }
    return KVHAL_OK;
}

/* ---- tensor_copy ---- */

/* Drops size-1 dims and merges dims that are contiguous in both tensors, so that a dense copy becomes one row. */
static int collapse(const kvhal_bk_tensor_copy *a, int64_t *shape, int64_t *ds, int64_t *ss)
{
    int n = 0;
    for (int i = 0; i < a->dst.ndim; i++) {
        if (a->dst.shape[i] == 1) continue;
        if (n > 0 && ds[n - 1] == a->dst.strides[i] * a->dst.shape[i] &&
            ss[n - 1] == a->src.strides[i] * a->dst.shape[i]) {
            shape[n - 1] *= a->dst.shape[i];
            ds[n - 1] = a->dst.strides[i];
            ss[n - 1] = a->src.strides[i];
            continue;
        }
        shape[n] = a->dst.shape[i];
        ds[n] = a->dst.strides[i];
        ss[n] = a->src.strides[i];
        n++;
    }
    if (n == 0) {
        shape[0] = 1;
        ds[0] = ss[0] = 1;
        n = 1;
    }
    return n;
}

kvhal_status kvhal__cpu_tensor_copy(int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    int64_t shape[KVHAL_MAX_DIMS], ds[KVHAL_MAX_DIMS], ss[KVHAL_MAX_DIMS];
    for (int i = 0; i < a->dst.ndim; i++)
        if (a->dst.shape[i] == 0) return KVHAL_OK;
    const int n = collapse(a, shape, ds, ss);
    const size_t es = kvhal_dtype_size(a->dst.dtype);
    char *dst = (char *)a->dst.native + a->dst.offset;
    const char *src = (const char *)a->src.native + a->src.offset;
    const int last = n - 1;
    const bool rows = ds[last] == 1 && ss[last] == 1;
    int64_t idx[KVHAL_MAX_DIMS] = {0};
    for (;;) {
        int64_t doff = 0, soff = 0;
        for (int i = 0; i < last; i++) {
            doff += idx[i] * ds[i];
            soff += idx[i] * ss[i];
        }
        if (rows) memmove(dst + (size_t)doff * es, src + (size_t)soff * es, (size_t)shape[last] * es);
        else copy_strided(dst + (size_t)doff * es, ds[last], src + (size_t)soff * es, ss[last], es, shape[last]);
        int i = last - 1;
        while (i >= 0 && ++idx[i] == shape[i]) idx[i--] = 0;
        if (i < 0) break;
    }
    return KVHAL_OK;
}

kvhal_status kvhal__cpu_copy_batch(int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    for (int32_t i = 0; i < a->count; i++)
        memmove((char *)a->dst[i] + a->dst_offsets[i], (const char *)a->src[i] + a->src_offsets[i], a->bytes[i]);
    return KVHAL_OK;
}

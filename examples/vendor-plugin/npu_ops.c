/* npu_ops.c — the example NPU's ops as plain C loops over host memory: paged_caching (f32/f16/bf16 input into a
 * cache of the same dtype, or into any fp8 format with a scale; i32/i64 slots), copy_blocks, tensor_copy over any
 * strides and copy_batch, with the number conversions of <kvhal/kvhal_numerics.h> (inline: the module links
 * nothing of kvhal). Arguments arrive validated and normalised by the core (kvhal_backend.h); what the core cannot see, a
 * slot past the cache's end in device memory, is skipped and raised in the device's error flag, as a GPU kernel
 * does. A head's row moves through a row buffer of NPU_ROW_MAX elements, the limit supports() reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal_numerics.h"
#include "npu.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Number formats: kvhal's own conversions, from the installed <kvhal/kvhal_numerics.h> (inline, nothing to link),  */
/* so that the fp8 codes this module stores are bit for bit those of kvhal_f32_to_fp8 and the built-in backends.  */
/* ------------------------------------------------------------------------------------------------------------ */
typedef uint8_t (*fp8_encoder)(float x);

static fp8_encoder fp8_encoder_of(kvhal_dtype dt)
{
    switch (dt) {
    case KVHAL_FP8_E5M2: return kvhal_num_f32_to_e5m2;
    case KVHAL_FP8_E4M3FNUZ: return kvhal_num_f32_to_e4m3fnuz;
    case KVHAL_FP8_E5M2FNUZ: return kvhal_num_f32_to_e5m2fnuz;
    default: return kvhal_num_f32_to_e4m3fn;
    }
}

static float load_float(const unsigned char *p, kvhal_dtype dt)
{
    if (dt == KVHAL_F32) {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return dt == KVHAL_F16 ? kvhal_num_f16_to_f32(h) : kvhal_num_bf16_to_f32(h);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Descriptors: what an op decides from metadata alone, once per distinct call shape.                           */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct paged_plan {
    kvhal_dtype in_dtype;
    size_t in_size, cache_size, slot_size;
    bool convert; /* fp8 cache from a wider input: value / scale, rounded; otherwise the bytes are copied */
    fp8_encoder fp8;
} paged_plan;

/* tensor_copy with its dims merged where both sides allow it and size-1 dims dropped (innermost last). */
typedef struct copy_plan {
    size_t elem;
    int32_t ndim;
    int64_t shape[KVHAL_MAX_DIMS], dst_strides[KVHAL_MAX_DIMS], src_strides[KVHAL_MAX_DIMS];
} copy_plan;

typedef struct npu_desc {
    kvhal_bk_op op;
    union {
        paged_plan paged;
        copy_plan copy;
    } u;
} npu_desc;

static void plan_paged(const kvhal_bk_paged_caching *a, paged_plan *p)
{
    p->in_dtype = a->input_dtype;
    p->in_size = kvhal_bk_dtype_size(a->input_dtype);
    p->cache_size = kvhal_bk_dtype_size(a->cache_dtype);
    p->slot_size = kvhal_bk_dtype_size(a->slot_dtype);
    p->convert = a->input_dtype != a->cache_dtype;
    p->fp8 = fp8_encoder_of(a->cache_dtype);
}

static void plan_copy(const kvhal_bk_tensor_copy *a, copy_plan *p)
{
    p->elem = kvhal_bk_dtype_size(a->dst.dtype);
    p->ndim = 0;
    for (int32_t i = 0; i < a->dst.ndim; i++) {
        const int64_t n = a->dst.shape[i], ds = a->dst.strides[i], ss = a->src.strides[i];
        if (n == 1) continue;
        const int32_t k = p->ndim - 1;
        if (k >= 0 && p->dst_strides[k] == n * ds && p->src_strides[k] == n * ss) {
            p->shape[k] *= n; /* dim i continues the previous one in both tensors */
            p->dst_strides[k] = ds;
            p->src_strides[k] = ss;
            continue;
        }
        p->shape[p->ndim] = n;
        p->dst_strides[p->ndim] = ds;
        p->src_strides[p->ndim] = ss;
        p->ndim++;
    }
    if (p->ndim == 0) { /* a single element */
        p->ndim = 1;
        p->shape[0] = 1;
        p->dst_strides[0] = p->src_strides[0] = 1;
    }
}

bool npu_supports(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t reason_size)
{
    (void)ctx, (void)id;
    if ((unsigned)op >= KVHAL_BK_OP_COUNT) {
        if (reason_size) snprintf(reason, reason_size, "example-npu does not know op %d", (int)op);
        return false;
    }
    if (op == KVHAL_BK_OP_PAGED_CACHING) {
        const kvhal_bk_paged_caching *a = args;
        const kvhal_bk_paged_side *longer = a->k.head_dim >= a->v.head_dim ? &a->k : &a->v;
        if (longer->head_dim > NPU_ROW_MAX) {
            if (reason_size)
                snprintf(reason, reason_size, "the example NPU's row buffer holds %d elements: %s head_dim %d is longer",
                         NPU_ROW_MAX, longer == &a->k ? "k" : "v", (int)longer->head_dim);
            return false;
        }
    }
    return true;
}

kvhal_status npu_desc_create(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc)
{
    npu_ctx *c = ctx;
    npu_desc *d = c->svc->alloc_should_fail() ? NULL : calloc(1, sizeof *d);
    if (!d) return NPU_FAIL(c, KVHAL_OUT_OF_MEMORY, "npu:%d: cannot allocate a descriptor", (int)id);
    d->op = op;
    if (op == KVHAL_BK_OP_PAGED_CACHING) plan_paged(args, &d->u.paged);
    else if (op == KVHAL_BK_OP_TENSOR_COPY) plan_copy(args, &d->u.copy);
    *desc = d; /* copy_blocks plans nothing: its descriptor records the op only */
    return KVHAL_OK;
}

void npu_desc_destroy(void *ctx, int32_t id, kvhal_bk_op op, void *desc)
{
    (void)ctx, (void)id, (void)op;
    free(desc);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Ops. desc is NULL when the core runs an op without a descriptor: the plan is then made for this call.        */
/* ------------------------------------------------------------------------------------------------------------ */
static int64_t load_slot(const unsigned char *base, size_t size, int64_t elem)
{
    if (size == 4) {
        int32_t v;
        memcpy(&v, base + elem * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, base + elem * 8, 8);
    return v;
}

/* One side (K or V) of one token: every head's row into the row buffer, then out into the cache slot. */
static void cache_token(const paged_plan *p, const kvhal_bk_paged_side *s, int32_t heads, int64_t batch,
                        int64_t pos, int64_t block, int64_t offset)
{
    const unsigned char *in = (const unsigned char *)s->input + s->input_offset;
    unsigned char *cache = (unsigned char *)s->cache + s->cache_offset;
    float row[NPU_ROW_MAX];
    unsigned char raw[NPU_ROW_MAX * sizeof(float)];
    for (int32_t h = 0; h < heads; h++) {
        const unsigned char *src =
            in + (batch * s->tok_stride_outer + pos * s->tok_stride_inner + h * s->in_head_stride) * (int64_t)p->in_size;
        unsigned char *dst = cache + (block * s->block_stride + offset * s->offset_stride + h * s->cache_head_stride) *
                                         (int64_t)p->cache_size;
        const int64_t in_step = s->in_dim_stride * (int64_t)p->in_size;
        const int64_t out_step = s->cache_dim_stride * (int64_t)p->cache_size;
        if (p->convert) {
            for (int32_t d = 0; d < s->head_dim; d++) row[d] = load_float(src + d * in_step, p->in_dtype);
            for (int32_t d = 0; d < s->head_dim; d++) dst[d * out_step] = p->fp8(row[d] / s->scale);
        } else {
            for (int32_t d = 0; d < s->head_dim; d++) memcpy(raw + d * p->in_size, src + d * in_step, p->in_size);
            for (int32_t d = 0; d < s->head_dim; d++) memcpy(dst + d * out_step, raw + d * p->in_size, p->in_size);
        }
    }
}

kvhal_status npu_paged_caching(void *ctx, int32_t id, void *desc, const kvhal_bk_paged_caching *a, void *stream)
{
    (void)stream;
    npu_ctx *c = ctx;
    /* The core never calls an op that supports() refused; the row buffers on the stack do not rely on it. */
    if (a->k.head_dim > NPU_ROW_MAX || a->v.head_dim > NPU_ROW_MAX)
        return NPU_FAIL(c, KVHAL_UNSUPPORTED, "npu:%d: head_dim %d / %d exceeds the row buffer (%d elements)", (int)id,
                        (int)a->k.head_dim, (int)a->v.head_dim, NPU_ROW_MAX);
    paged_plan local;
    const paged_plan *p = desc ? &((const npu_desc *)desc)->u.paged : &local;
    if (!desc) plan_paged(a, &local);
    const unsigned char *slots = (const unsigned char *)a->slots + a->slots_offset;
    bool fault = false;
    for (int64_t t = 0; t < a->num_tokens; t++) {
        const int64_t batch = t / a->seq_len, pos = t % a->seq_len;
        const int64_t slot =
            load_slot(slots, p->slot_size, batch * a->slot_stride_outer + pos * a->slot_stride_inner);
        if (slot < 0) continue; /* padding */
        if (slot >= a->num_slots) {
            fault = true; /* skipped; reported by synchronize / check_errors */
            continue;
        }
        const int64_t block = slot / a->block_size, offset = slot % a->block_size;
        cache_token(p, &a->k, a->num_heads, batch, pos, block, offset);
        cache_token(p, &a->v, a->num_heads, batch, pos, block, offset);
    }
    if (fault) atomic_store(&c->dev[id].slot_fault, true);
    return KVHAL_OK;
}

kvhal_status npu_copy_blocks(void *ctx, int32_t id, void *desc, const kvhal_bk_copy_blocks *a, void *stream)
{
    (void)desc, (void)stream;
    npu_ctx *c = ctx;
    for (int32_t i = 0; i < a->num_pairs; i++) {
        const int64_t src = a->pairs[2 * i], dst = a->pairs[2 * i + 1];
        /* The core has checked the pairs; one out of range here is skipped rather than written past a cache. */
        if (src < 0 || dst < 0 || src >= a->num_blocks_min || dst >= a->num_blocks_min) {
            atomic_store(&c->dev[id].block_fault, true);
            continue;
        }
        for (int32_t k = 0; k < a->num_caches; k++) {
            unsigned char *base = (unsigned char *)a->natives[k] + a->offsets[k];
            memmove(base + dst * a->block_strides[k], base + src * a->block_strides[k], (size_t)a->block_bytes[k]);
        }
    }
    return KVHAL_OK;
}

kvhal_status npu_tensor_copy(void *ctx, int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    (void)ctx, (void)id, (void)stream;
    copy_plan local;
    const copy_plan *p = desc ? &((const npu_desc *)desc)->u.copy : &local;
    if (!desc) plan_copy(a, &local);
    unsigned char *dst = (unsigned char *)a->dst.native + a->dst.offset;
    const unsigned char *src = (const unsigned char *)a->src.native + a->src.offset;
    const int32_t inner = p->ndim - 1;
    const int64_t n = p->shape[inner], es = (int64_t)p->elem;
    const bool dense = p->dst_strides[inner] == 1 && p->src_strides[inner] == 1;
    int64_t idx[KVHAL_MAX_DIMS] = {0};
    for (;;) {
        int64_t doff = 0, soff = 0;
        for (int32_t i = 0; i < inner; i++) {
            doff += idx[i] * p->dst_strides[i];
            soff += idx[i] * p->src_strides[i];
        }
        unsigned char *d = dst + doff * es;
        const unsigned char *s = src + soff * es;
        if (dense) {
            memmove(d, s, (size_t)(n * es)); /* memmove: a copy onto the same view is allowed */
        } else {
            for (int64_t j = 0; j < n; j++)
                memmove(d + j * p->dst_strides[inner] * es, s + j * p->src_strides[inner] * es, (size_t)es);
        }
        int32_t i = inner - 1; /* next index of the outer dims, last fastest */
        while (i >= 0 && ++idx[i] == p->shape[i]) idx[i--] = 0;
        if (i < 0) return KVHAL_OK;
    }
}

kvhal_status npu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    (void)ctx, (void)id, (void)stream;
    for (int32_t i = 0; i < a->count; i++)
        memmove((unsigned char *)a->dst[i] + a->dst_offsets[i], (const unsigned char *)a->src[i] + a->src_offsets[i],
                a->bytes[i]);
    return KVHAL_OK;
}

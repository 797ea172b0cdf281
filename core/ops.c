/* ops.c — the built-in ops (tensor_copy, paged_caching, copy_blocks): full validation of the caller's tensors,
 * normalisation into the backend's argument structs (kvhal_backend.h), then descriptor lookup and the backend call.
 * Every op names its backend's missing slot instead of calling through NULL. The per-call host cost is kept small:
 * the backend comes from the buffer (no lookup), the descriptor key is filled in one pass and hashed once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static const char *const op_names[KVHAL_BK_OP_COUNT] = {"paged_caching", "copy_blocks", "tensor_copy"};

static kvhal_status unsupported(const kvhal_backend *bk, kvhal_device dev, kvhal_bk_op op)
{
    return kvhal__err(KVHAL_UNSUPPORTED, "the %s backend (device %s:%d) does not implement %s",
                      bk->name ? bk->name : "unnamed", kvhal_device_type_name(dev.type), (int)dev.id, op_names[op]);
}

static kvhal_status device_mismatch(const char *arg, kvhal_device got, const char *ref, kvhal_device want)
{
    return kvhal__err(KVHAL_DEVICE_MISMATCH, "%s: is on %s:%d but %s is on %s:%d", arg, kvhal_device_type_name(got.type),
                      (int)got.id, ref, kvhal_device_type_name(want.type), (int)want.id);
}

static inline bool is_float_input(kvhal_dtype d) { return d == KVHAL_F32 || d == KVHAL_F16 || d == KVHAL_BF16; }
static inline bool is_fp8(kvhal_dtype d) { return d == KVHAL_FP8_E4M3 || d == KVHAL_FP8_E5M2; }

/* Looks the descriptor up (or creates it) and runs the op. A key that does not fit (copy_blocks over very many
 * differently shaped caches) bypasses the cache: the descriptor lives for this call only. */
typedef kvhal_status (*run_fn)(const kvhal_backend *bk, int32_t id, void *desc, const void *args, void *stream);

static kvhal_status run_paged(const kvhal_backend *bk, int32_t id, void *desc, const void *args, void *stream)
{
    return bk->paged_caching(id, desc, args, stream);
}
static kvhal_status run_copy_blocks(const kvhal_backend *bk, int32_t id, void *desc, const void *args, void *stream)
{
    return bk->copy_blocks(id, desc, args, stream);
}
static kvhal_status run_tensor_copy(const kvhal_backend *bk, int32_t id, void *desc, const void *args, void *stream)
{
    return bk->tensor_copy(id, desc, args, stream);
}

static kvhal_status dispatch(kvhal_device dev, const kvhal_backend *bk, kvhal_bk_op op, const kvhal_desc_key *key,
                             const void *args, const kvhal_stream *s, run_fn run)
{
    void *desc = NULL;
    if (key) {
        KVHAL_TRY(kvhal__desc_get_or_create(dev, bk, op, key, args, &desc));
        return run(bk, dev.id, desc, args, kvhal__bk_stream(s));
    }
    if (bk->desc_create) KVHAL_TRY(bk->desc_create(dev.id, op, args, &desc));
    kvhal_status st = run(bk, dev.id, desc, args, kvhal__bk_stream(s));
    if (bk->desc_create && bk->desc_destroy) bk->desc_destroy(dev.id, op, desc);
    return st;
}

/* ---- tensor_copy ---- */

/* Validates one copy and fills its backend arguments and key. *empty: nothing to copy (still a success). */
static kvhal_status prepare_copy(const kvhal_tensor *dst, const kvhal_tensor *src, const kvhal_stream *s,
                                 const char *dname, const char *sname, kvhal_bk_tensor_copy *args,
                                 kvhal_desc_key *key, bool *empty)
{
    KVHAL_TRY(kvhal__check_tensor(dst, dname));
    KVHAL_TRY(kvhal__check_tensor(src, sname));
    kvhal_device dev = dst->buffer->device;
    if (!kvhal__device_equal(src->buffer->device, dev)) return device_mismatch(sname, src->buffer->device, dname, dev);
    KVHAL_TRY(kvhal__check_stream(s, dev, "s"));
    if (src->dtype != dst->dtype)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "%s.dtype: %s differs from %s.dtype %s", sname,
                          kvhal_dtype_name(src->dtype), dname, kvhal_dtype_name(dst->dtype));
    if (src->ndim != dst->ndim)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.ndim: %d differs from %s.ndim %d", sname, src->ndim, dname,
                          dst->ndim);
    for (int i = 0; i < dst->ndim; i++)
        if (src->shape[i] != dst->shape[i])
            return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.shape[%d]: %lld differs from %s.shape[%d] %lld", sname, i,
                              (long long)src->shape[i], dname, i, (long long)dst->shape[i]);
    const kvhal_backend *bk = dst->buffer->backend;
    if (!bk->tensor_copy) return unsupported(bk, dev, KVHAL_BK_OP_TENSOR_COPY);
    *empty = kvhal_tensor_numel(dst) == 0;
    if (*empty) return KVHAL_OK;
    kvhal__to_bk_tensor(dst, &args->dst);
    kvhal__to_bk_tensor(src, &args->src);
    key->op = KVHAL_BK_OP_TENSOR_COPY;
    uint64_t *w = key->words;
    *w++ = (uint64_t)dst->dtype;
    *w++ = (uint64_t)dst->ndim;
    for (int i = 0; i < dst->ndim; i++) {
        *w++ = (uint64_t)dst->shape[i];
        *w++ = (uint64_t)dst->strides[i];
        *w++ = (uint64_t)src->strides[i];
    }
    key->nwords = (uint32_t)(w - key->words);
    kvhal__desc_key_rehash(key);
    return KVHAL_OK;
}

kvhal_status kvhal_tensor_copy(const kvhal_tensor *dst, const kvhal_tensor *src, kvhal_stream *s)
{
    kvhal_bk_tensor_copy args;
    kvhal_desc_key key;
    bool empty;
    KVHAL_TRY(prepare_copy(dst, src, s, "dst", "src", &args, &key, &empty));
    if (empty) return KVHAL_OK;
    return dispatch(dst->buffer->device, dst->buffer->backend, KVHAL_BK_OP_TENSOR_COPY, &key, &args, s,
                    run_tensor_copy);
}

kvhal_status kvhal__tensor_copy_pair(const kvhal_tensor *dst0, const kvhal_tensor *src0, const kvhal_tensor *dst1,
                                     const kvhal_tensor *src1, const char *const names[4], kvhal_stream *s)
{
    kvhal_bk_tensor_copy a0, a1;
    kvhal_desc_key k0, k1;
    bool e0, e1;
    KVHAL_TRY(prepare_copy(dst0, src0, s, names[0], names[1], &a0, &k0, &e0));
    KVHAL_TRY(prepare_copy(dst1, src1, s, names[2], names[3], &a1, &k1, &e1));
    if (e0 && e1) return KVHAL_OK;
    if (e0 || e1) {
        /* one real copy: nothing can fail after it starts */
        const kvhal_tensor *d = e0 ? dst1 : dst0;
        return dispatch(d->buffer->device, d->buffer->backend, KVHAL_BK_OP_TENSOR_COPY, e0 ? &k1 : &k0,
                        e0 ? (const void *)&a1 : (const void *)&a0, s, run_tensor_copy);
    }
    const kvhal_backend *b0 = dst0->buffer->backend, *b1 = dst1->buffer->backend;
    const kvhal_device v0 = dst0->buffer->device, v1 = dst1->buffer->device;
    /* Both descriptors first, so that an allocation failure leaves both destinations unwritten. The second lookup
     * may evict the first descriptor (tiny capacity): then both are made for this call only. */
    void *d0 = NULL, *d1 = NULL;
    KVHAL_TRY(kvhal__desc_get_or_create(v0, b0, KVHAL_BK_OP_TENSOR_COPY, &k0, &a0, &d0));
    bool same = kvhal__device_equal(v0, v1) && kvhal_desc_key_equal(&k0, &k1);
    if (same) {
        d1 = d0;
    } else {
        KVHAL_TRY(kvhal__desc_get_or_create(v1, b1, KVHAL_BK_OP_TENSOR_COPY, &k1, &a1, &d1));
        if (kvhal__desc_peek(v0, &k0) != d0 || d0 == NULL) {
            d0 = d1 = NULL;
            if (b0->desc_create) KVHAL_TRY(b0->desc_create(v0.id, KVHAL_BK_OP_TENSOR_COPY, &a0, &d0));
            if (b1->desc_create) {
                kvhal_status st = b1->desc_create(v1.id, KVHAL_BK_OP_TENSOR_COPY, &a1, &d1);
                if (st != KVHAL_OK) {
                    if (b0->desc_create && b0->desc_destroy) b0->desc_destroy(v0.id, KVHAL_BK_OP_TENSOR_COPY, d0);
                    return st;
                }
            }
            kvhal_status st = b0->tensor_copy(v0.id, d0, &a0, kvhal__bk_stream(s));
            if (st == KVHAL_OK) st = b1->tensor_copy(v1.id, d1, &a1, kvhal__bk_stream(s));
            if (b0->desc_create && b0->desc_destroy) b0->desc_destroy(v0.id, KVHAL_BK_OP_TENSOR_COPY, d0);
            if (b1->desc_create && b1->desc_destroy) b1->desc_destroy(v1.id, KVHAL_BK_OP_TENSOR_COPY, d1);
            return st;
        }
    }
    KVHAL_TRY(b0->tensor_copy(v0.id, d0, &a0, kvhal__bk_stream(s)));
    return b1->tensor_copy(v1.id, d1, &a1, kvhal__bk_stream(s));
}

/* ---- paged_caching ---- */

static kvhal_status check_dims_fit(const kvhal_tensor *t, const char *arg, int dim, const char *what)
{
    if (t->shape[dim] > INT32_MAX)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "%s.shape[%d]: %s %lld exceeds %d", arg, dim, what,
                          (long long)t->shape[dim], INT32_MAX);
    return KVHAL_OK;
}

kvhal_status kvhal_paged_caching(const kvhal_tensor *k_cache, const kvhal_tensor *v_cache, const kvhal_tensor *k,
                                 const kvhal_tensor *v, const kvhal_tensor *slot_mapping, float k_scale,
                                 float v_scale, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_tensor(k_cache, "k_cache"));
    KVHAL_TRY(kvhal__check_tensor(v_cache, "v_cache"));
    KVHAL_TRY(kvhal__check_tensor(k, "k"));
    KVHAL_TRY(kvhal__check_tensor(v, "v"));
    KVHAL_TRY(kvhal__check_tensor(slot_mapping, "slot_mapping"));
    const kvhal_device dev = k_cache->buffer->device;
    if (!kvhal__device_equal(v_cache->buffer->device, dev))
        return device_mismatch("v_cache", v_cache->buffer->device, "k_cache", dev);
    if (!kvhal__device_equal(k->buffer->device, dev)) return device_mismatch("k", k->buffer->device, "k_cache", dev);
    if (!kvhal__device_equal(v->buffer->device, dev)) return device_mismatch("v", v->buffer->device, "k_cache", dev);
    if (!kvhal__device_equal(slot_mapping->buffer->device, dev))
        return device_mismatch("slot_mapping", slot_mapping->buffer->device, "k_cache", dev);
    KVHAL_TRY(kvhal__check_stream(s, dev, "s"));

    /* ranks */
    if (k_cache->ndim != 4)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "k_cache.ndim: %d, expected 4 ([blocks, block_size, heads, dim])",
                          k_cache->ndim);
    if (v_cache->ndim != 4)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "v_cache.ndim: %d, expected 4 ([blocks, block_size, heads, dim])",
                          v_cache->ndim);
    if (k->ndim != 3 && k->ndim != 4)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "k.ndim: %d, expected 3 ([tokens, heads, dim]) or 4 ([batch, seq, "
                          "heads, dim])", k->ndim);
    if (v->ndim != k->ndim) return kvhal__err(KVHAL_INVALID_ARGUMENT, "v.ndim: %d differs from k.ndim %d", v->ndim, k->ndim);
    if (slot_mapping->ndim != 1 && slot_mapping->ndim != 2)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "slot_mapping.ndim: %d, expected 1 ([tokens]) or 2 ([batch, seq])",
                          slot_mapping->ndim);

    /* dtypes */
    const kvhal_dtype in_dt = k->dtype, cache_dt = k_cache->dtype;
    if (!is_float_input(in_dt))
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "k.dtype: %s is not an input dtype (f32, f16 or bf16)",
                          kvhal_dtype_name(in_dt));
    if (v->dtype != in_dt)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "v.dtype: %s differs from k.dtype %s", kvhal_dtype_name(v->dtype),
                          kvhal_dtype_name(in_dt));
    if (cache_dt != in_dt && !is_fp8(cache_dt))
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "k_cache.dtype: %s must be k's dtype %s or fp8_e4m3/fp8_e5m2",
                          kvhal_dtype_name(cache_dt), kvhal_dtype_name(in_dt));
    if (v_cache->dtype != cache_dt)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "v_cache.dtype: %s differs from k_cache.dtype %s",
                          kvhal_dtype_name(v_cache->dtype), kvhal_dtype_name(cache_dt));
    if (slot_mapping->dtype != KVHAL_I32 && slot_mapping->dtype != KVHAL_I64)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "slot_mapping.dtype: %s is not i32 or i64",
                          kvhal_dtype_name(slot_mapping->dtype));
    if (is_fp8(cache_dt)) {
        if (!(isfinite(k_scale) && k_scale > 0.0f))
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "k_scale: %g must be finite and > 0 for an fp8 cache",
                              (double)k_scale);
        if (!(isfinite(v_scale) && v_scale > 0.0f))
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "v_scale: %g must be finite and > 0 for an fp8 cache",
                              (double)v_scale);
    }

    /* shapes */
    const int64_t num_blocks = k_cache->shape[0], block_size = k_cache->shape[1], heads = k_cache->shape[2];
    if (v_cache->shape[0] != num_blocks)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "v_cache.shape[0]: %lld blocks differs from k_cache's %lld",
                          (long long)v_cache->shape[0], (long long)num_blocks);
    if (v_cache->shape[1] != block_size)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "v_cache.shape[1]: block size %lld differs from k_cache's %lld",
                          (long long)v_cache->shape[1], (long long)block_size);
    if (v_cache->shape[2] != heads)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "v_cache.shape[2]: %lld heads differs from k_cache's %lld",
                          (long long)v_cache->shape[2], (long long)heads);
    KVHAL_CHECK_ARG(block_size >= 1, "k_cache.shape[1]: block size %lld must be >= 1", (long long)block_size);
    KVHAL_TRY(check_dims_fit(k_cache, "k_cache", 1, "block size"));
    KVHAL_TRY(check_dims_fit(k_cache, "k_cache", 2, "head count"));
    KVHAL_TRY(check_dims_fit(k_cache, "k_cache", 3, "head dim"));
    KVHAL_TRY(check_dims_fit(v_cache, "v_cache", 3, "head dim"));
    int64_t max_slots;
    if (__builtin_mul_overflow(num_blocks, block_size, &max_slots))
        return kvhal__err(KVHAL_OUT_OF_RANGE, "k_cache: %lld blocks of %lld slots overflow 64 bits",
                          (long long)num_blocks, (long long)block_size);

    const int hd = k->ndim - 2; /* index of k's heads dim */
    if (k->shape[hd] != heads)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "k.shape[%d]: %lld heads differs from k_cache's %lld", hd,
                          (long long)k->shape[hd], (long long)heads);
    if (k->shape[hd + 1] != k_cache->shape[3])
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "k.shape[%d]: head dim %lld differs from k_cache's %lld", hd + 1,
                          (long long)k->shape[hd + 1], (long long)k_cache->shape[3]);
    if (v->shape[hd] != heads)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "v.shape[%d]: %lld heads differs from v_cache's %lld", hd,
                          (long long)v->shape[hd], (long long)heads);
    if (v->shape[hd + 1] != v_cache->shape[3])
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "v.shape[%d]: head dim %lld differs from v_cache's %lld", hd + 1,
                          (long long)v->shape[hd + 1], (long long)v_cache->shape[3]);
    for (int i = 0; i < hd; i++)
        if (v->shape[i] != k->shape[i])
            return kvhal__err(KVHAL_SHAPE_MISMATCH, "v.shape[%d]: %lld tokens differs from k.shape[%d] %lld", i,
                              (long long)v->shape[i], i, (long long)k->shape[i]);
    int64_t num_tokens = k->shape[0];
    if (k->ndim == 4 && __builtin_mul_overflow(k->shape[0], k->shape[1], &num_tokens))
        return kvhal__err(KVHAL_OUT_OF_RANGE, "k: batch * seq overflows 64 bits");
    const int64_t num_slots = kvhal_tensor_numel(slot_mapping);
    if (num_slots != num_tokens)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "slot_mapping: %lld slots for %lld tokens of k", (long long)num_slots,
                          (long long)num_tokens);
    if (k->ndim == 4 && slot_mapping->ndim == 2 &&
        (slot_mapping->shape[0] != k->shape[0] || slot_mapping->shape[1] != k->shape[1]))
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "slot_mapping.shape: [%lld, %lld] differs from k's [batch, seq] "
                          "[%lld, %lld]", (long long)slot_mapping->shape[0], (long long)slot_mapping->shape[1],
                          (long long)k->shape[0], (long long)k->shape[1]);

    const kvhal_backend *bk = k_cache->buffer->backend;
    if (!bk->paged_caching) return unsupported(bk, dev, KVHAL_BK_OP_PAGED_CACHING);
    if (num_tokens == 0 || heads == 0 || (k_cache->shape[3] == 0 && v_cache->shape[3] == 0)) return KVHAL_OK;
    /* One side without elements would need every backend to launch a half-empty kernel; no model stores that. */
    if (k_cache->shape[3] == 0 || v_cache->shape[3] == 0)
        return kvhal__err(KVHAL_UNSUPPORTED, "%s.shape[3]: head dim 0 beside %s head dim %lld (one side without "
                          "elements is not supported; skip the call or pass a non-empty side)",
                          k_cache->shape[3] == 0 ? "k_cache" : "v_cache", k_cache->shape[3] == 0 ? "v_cache's" :
                          "k_cache's", (long long)(k_cache->shape[3] == 0 ? v_cache->shape[3] : k_cache->shape[3]));

    /* normalise: tokens are (outer, inner) = (t / seq_len, t % seq_len) for the inputs and the slots alike */
    kvhal_bk_paged_caching a;
    int64_t seq_len;
    int64_t ktok_o, ktok_i, vtok_o, vtok_i, slot_o, slot_i;
    if (k->ndim == 4) {
        seq_len = k->shape[1];
        ktok_o = k->strides[0], ktok_i = k->strides[1];
        vtok_o = v->strides[0], vtok_i = v->strides[1];
    } else {
        seq_len = slot_mapping->ndim == 2 ? slot_mapping->shape[1] : num_tokens;
        ktok_i = k->strides[0], ktok_o = seq_len * k->strides[0];
        vtok_i = v->strides[0], vtok_o = seq_len * v->strides[0];
    }
    if (slot_mapping->ndim == 2) {
        slot_o = slot_mapping->strides[0], slot_i = slot_mapping->strides[1];
    } else {
        slot_i = slot_mapping->strides[0], slot_o = seq_len * slot_mapping->strides[0];
    }
    a.k = (kvhal_bk_paged_side){
        .cache = k_cache->buffer->native, .cache_offset = k_cache->offset,
        .block_stride = k_cache->strides[0], .offset_stride = k_cache->strides[1],
        .cache_head_stride = k_cache->strides[2], .cache_dim_stride = k_cache->strides[3],
        .input = k->buffer->native, .input_offset = k->offset,
        .tok_stride_outer = ktok_o, .tok_stride_inner = ktok_i,
        .in_head_stride = k->strides[hd], .in_dim_stride = k->strides[hd + 1],
        .head_dim = (int32_t)k_cache->shape[3], .scale = is_fp8(cache_dt) ? k_scale : 1.0f};
    a.v = (kvhal_bk_paged_side){
        .cache = v_cache->buffer->native, .cache_offset = v_cache->offset,
        .block_stride = v_cache->strides[0], .offset_stride = v_cache->strides[1],
        .cache_head_stride = v_cache->strides[2], .cache_dim_stride = v_cache->strides[3],
        .input = v->buffer->native, .input_offset = v->offset,
        .tok_stride_outer = vtok_o, .tok_stride_inner = vtok_i,
        .in_head_stride = v->strides[hd], .in_dim_stride = v->strides[hd + 1],
        .head_dim = (int32_t)v_cache->shape[3], .scale = is_fp8(cache_dt) ? v_scale : 1.0f};
    a.input_dtype = in_dt;
    a.cache_dtype = cache_dt;
    a.slot_dtype = slot_mapping->dtype;
    a.num_tokens = num_tokens;
    a.seq_len = seq_len;
    a.num_heads = (int32_t)heads;
    a.block_size = (int32_t)block_size;
    a.num_blocks = num_blocks;
    a.slots = slot_mapping->buffer->native;
    a.slots_offset = slot_mapping->offset;
    a.slot_stride_outer = slot_o;
    a.slot_stride_inner = slot_i;

    /* key: all the metadata of the normalised call (everything but memory and scales) */
    kvhal_desc_key key;
    key.op = KVHAL_BK_OP_PAGED_CACHING;
    uint64_t *w = key.words;
    *w++ = (uint64_t)in_dt | (uint64_t)cache_dt << 8 | (uint64_t)a.slot_dtype << 16;
    *w++ = (uint64_t)num_tokens;
    *w++ = (uint64_t)seq_len;
    *w++ = (uint64_t)heads | (uint64_t)block_size << 32;
    *w++ = (uint64_t)num_blocks;
    *w++ = (uint64_t)slot_o;
    *w++ = (uint64_t)slot_i;
    const kvhal_bk_paged_side *sides[2] = {&a.k, &a.v};
    for (int i = 0; i < 2; i++) {
        const kvhal_bk_paged_side *p = sides[i];
        *w++ = (uint64_t)p->head_dim;
        *w++ = (uint64_t)p->block_stride;
        *w++ = (uint64_t)p->offset_stride;
        *w++ = (uint64_t)p->cache_head_stride;
        *w++ = (uint64_t)p->cache_dim_stride;
        *w++ = (uint64_t)p->tok_stride_outer;
        *w++ = (uint64_t)p->tok_stride_inner;
        *w++ = (uint64_t)p->in_head_stride;
        *w++ = (uint64_t)p->in_dim_stride;
    }
    key.nwords = (uint32_t)(w - key.words);
    kvhal__desc_key_rehash(&key);
    return dispatch(dev, bk, KVHAL_BK_OP_PAGED_CACHING, &key, &a, s, run_paged);
}

/* ---- copy_blocks ---- */

#define STACK_CACHES 64
#define STACK_PAIRS 64

typedef struct dst_entry {
    int64_t block;
    int32_t pair;
} dst_entry;

static int cmp_dst(const void *a, const void *b)
{
    const dst_entry *x = a, *y = b;
    if (x->block != y->block) return x->block < y->block ? -1 : 1;
    return x->pair < y->pair ? -1 : x->pair > y->pair;
}

/* Devices copy the pairs in parallel and the CPU in order: a block that one pair writes must be neither read nor
 * written by another pair, or the result would depend on the backend. A pair that copies a block onto itself
 * writes nothing new, so only its use as a source is checked against the other pairs' destinations. */
static kvhal_status check_pairs_disjoint(const int64_t *pairs, int32_t num_pairs)
{
    dst_entry stack[STACK_PAIRS];
    dst_entry *d = stack;
    if (num_pairs > STACK_PAIRS) {
        d = kvhal__malloc((size_t)num_pairs * sizeof *d);
        if (!d)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "num_pairs: no host memory to check %d pairs for overlap",
                              (int)num_pairs);
    }
    size_t n = 0;
    for (int32_t p = 0; p < num_pairs; p++)
        if (pairs[2 * p] != pairs[2 * p + 1]) d[n++] = (dst_entry){pairs[2 * p + 1], p};
    qsort(d, n, sizeof *d, cmp_dst);
    kvhal_status st = KVHAL_OK;
    for (size_t i = 1; i < n && st == KVHAL_OK; i++)
        if (d[i].block == d[i - 1].block)
            st = kvhal__err(KVHAL_INVALID_ARGUMENT, "pairs[%d]: destination block %lld is also the destination of "
                            "pairs[%d]; pairs run in parallel on devices", 2 * (int)d[i].pair + 1,
                            (long long)d[i].block, 2 * (int)d[i - 1].pair + 1);
    for (int32_t p = 0; p < num_pairs && st == KVHAL_OK; p++) {
        dst_entry key = {pairs[2 * p], -1};
        /* the first destination entry of that block (entries of one block are ordered by pair, -1 sorts first) */
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (cmp_dst(&d[mid], &key) < 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo < n && d[lo].block == key.block && d[lo].pair != p)
            st = kvhal__err(KVHAL_INVALID_ARGUMENT, "pairs[%d]: source block %lld is the destination of pairs[%d]; "
                            "pairs run in parallel on devices", 2 * (int)p, (long long)key.block,
                            2 * (int)d[lo].pair + 1);
    }
    if (d != stack) free(d);
    return st;
}

/* Formats "caches[i]" only when a check fails, so the common path does no printf. */
static kvhal_status check_cache_tensor(const kvhal_tensor *t, int32_t i)
{
    if (kvhal__check_tensor(t, "caches[]") == KVHAL_OK) return KVHAL_OK;
    char name[32];
    snprintf(name, sizeof name, "caches[%d]", (int)i);
    return kvhal__check_tensor(t, name);
}

kvhal_status kvhal_copy_blocks(const kvhal_tensor *caches, int32_t num_caches, const int64_t *pairs,
                               int32_t num_pairs, kvhal_stream *s)
{
    KVHAL_CHECK_ARG(caches, "caches: NULL");
    KVHAL_CHECK_ARG(num_caches >= 1, "num_caches: %d must be >= 1", (int)num_caches);
    KVHAL_CHECK_ARG(num_pairs >= 0, "num_pairs: %d is negative", (int)num_pairs);
    KVHAL_CHECK_ARG(pairs || num_pairs == 0, "pairs: NULL with %d pairs", (int)num_pairs);
    KVHAL_TRY(check_cache_tensor(&caches[0], 0));
    const kvhal_device dev = caches[0].buffer->device;
    KVHAL_TRY(kvhal__check_stream(s, dev, "s"));

    int64_t min_blocks = INT64_MAX;
    int32_t min_cache = 0;
    for (int32_t c = 0; c < num_caches; c++) {
        const kvhal_tensor *t = &caches[c];
        if (c) KVHAL_TRY(check_cache_tensor(t, c));
        if (!kvhal__device_equal(t->buffer->device, dev))
            return kvhal__err(KVHAL_DEVICE_MISMATCH, "caches[%d]: is on %s:%d but caches[0] is on %s:%d", (int)c,
                              kvhal_device_type_name(t->buffer->device.type), (int)t->buffer->device.id,
                              kvhal_device_type_name(dev.type), (int)dev.id);
        int64_t expect = 1;
        for (int i = t->ndim - 1; i >= 1; i--) {
            if (t->shape[i] != 1 && t->strides[i] != expect)
                return kvhal__err(KVHAL_INVALID_ARGUMENT, "caches[%d].strides[%d]: %lld, a block must be dense "
                                  "row-major (expected %lld)", (int)c, i, (long long)t->strides[i], (long long)expect);
            expect *= t->shape[i];
        }
        if (t->shape[0] > 1 && t->strides[0] < expect)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "caches[%d].strides[0]: %lld makes blocks of %lld elements "
                              "overlap", (int)c, (long long)t->strides[0], (long long)expect);
        if (t->shape[0] < min_blocks) min_blocks = t->shape[0], min_cache = c;
    }
    for (int32_t p = 0; p < 2 * num_pairs; p++) {
        if (pairs[p] < 0 || pairs[p] >= min_blocks)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "pairs[%d]: %s block %lld is out of range [0, %lld) of caches[%d]",
                              (int)p, p % 2 ? "destination" : "source", (long long)pairs[p], (long long)min_blocks,
                              (int)min_cache);
    }
    KVHAL_TRY(check_pairs_disjoint(pairs, num_pairs));
    const kvhal_backend *bk = caches[0].buffer->backend;
    if (!bk->copy_blocks) return unsupported(bk, dev, KVHAL_BK_OP_COPY_BLOCKS);
    if (num_pairs == 0) return KVHAL_OK;

    void *stack_natives[STACK_CACHES];
    size_t stack_offsets[STACK_CACHES];
    int64_t stack_strides[STACK_CACHES], stack_bytes[STACK_CACHES];
    void **natives = stack_natives;
    size_t *offsets = stack_offsets;
    int64_t *strides = stack_strides, *bytes = stack_bytes;
    void *heap = NULL;
    if (num_caches > STACK_CACHES) {
        size_t n = (size_t)num_caches;
        heap = kvhal__malloc(n * (sizeof(void *) + sizeof(size_t) + 2 * sizeof(int64_t)));
        if (!heap)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "num_caches: no host memory for the arguments of %d caches",
                              (int)num_caches);
        strides = heap;
        bytes = strides + n;
        offsets = (size_t *)(bytes + n);
        natives = (void **)(offsets + n);
    }

    /* Key: runs of caches with equal (block stride, block bytes), so that K and V of every layer make one run. */
    kvhal_desc_key key;
    key.op = KVHAL_BK_OP_COPY_BLOCKS;
    key.nwords = 0;
    key.words[key.nwords++] = (uint64_t)num_caches;
    key.words[key.nwords++] = (uint64_t)num_pairs;
    key.words[key.nwords++] = (uint64_t)min_blocks;
    bool keyed = true;
    for (int32_t c = 0; c < num_caches; c++) {
        const kvhal_tensor *t = &caches[c];
        const int64_t es = (int64_t)kvhal_dtype_size(t->dtype);
        natives[c] = t->buffer->native;
        offsets[c] = t->offset;
        /* Only a non-empty cache of several blocks has its block stride bounded by the buffer; otherwise every
         * pair copies block 0 (or nothing), and an unbounded stride must not overflow here. */
        strides[c] = t->shape[0] > 1 && kvhal_tensor_numel(t) > 0 ? t->strides[0] * es : 0;
        int64_t elems = 1;
        for (int i = 1; i < t->ndim; i++) elems *= t->shape[i];
        bytes[c] = elems * es;
        if (!keyed) continue;
        if (c > 0 && strides[c] == strides[c - 1] && bytes[c] == bytes[c - 1]) {
            key.words[key.nwords - 3]++;
        } else if (key.nwords + 3 <= KVHAL_DESC_KEY_MAX_WORDS) {
            key.words[key.nwords++] = 1;
            key.words[key.nwords++] = (uint64_t)strides[c];
            key.words[key.nwords++] = (uint64_t)bytes[c];
        } else {
            keyed = false;
        }
    }
    kvhal__desc_key_rehash(&key);
    kvhal_bk_copy_blocks a = {
        .num_caches = num_caches, .natives = natives, .offsets = offsets, .block_strides = strides,
        .block_bytes = bytes, .pairs = pairs, .num_pairs = num_pairs, .num_blocks_min = min_blocks};
    kvhal_status st = dispatch(dev, bk, KVHAL_BK_OP_COPY_BLOCKS, keyed ? &key : NULL, &a, s, run_copy_blocks);
    free(heap);
    return st;
}

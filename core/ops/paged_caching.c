/* paged_caching.c — kvhal_paged_caching: new tokens' K and V written into a paged cache at their slots (vLLM's
 * reshape_and_cache_flash), with an fp8 cache quantised at the given scales. Four steps: validate every argument,
 * normalise each side (K, V) into the backend's strides, build the descriptor key, dispatch. */
#include <math.h>

#include "device.h"
#include "ops.h"
#include "tensor.h"


static kvhal_status check_dims_fit(const kvhal_tensor *t, const char *arg, int dim, const char *what)
{
    if (t->shape[dim] > INT32_MAX)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "%s.shape[%d]: %s %lld exceeds %d", arg, dim, what,
                          (long long)t->shape[dim], INT32_MAX);
    return KVHAL_OK;
}

/* Every check on the caller's tensors; *num_tokens_out: tokens in k (batch * seq for [batch, seq, heads, dim]). */
static kvhal_status validate(const kvhal_tensor *k_cache, const kvhal_tensor *v_cache, const kvhal_tensor *k,
                             const kvhal_tensor *v, const kvhal_tensor *slot_mapping, float k_scale, float v_scale,
                             const kvhal_stream *s, int64_t *num_tokens_out)
{
    KVHAL_TRY(kvhal__check_tensor(k_cache, "k_cache"));
    KVHAL_TRY(kvhal__check_tensor(v_cache, "v_cache"));
    KVHAL_TRY(kvhal__check_tensor(k, "k"));
    KVHAL_TRY(kvhal__check_tensor(v, "v"));
    KVHAL_TRY(kvhal__check_tensor(slot_mapping, "slot_mapping"));
    const kvhal_device dev = k_cache->buffer->device;
    if (!kvhal__device_equal(v_cache->buffer->device, dev))
        return kvhal__device_mismatch("v_cache", v_cache->buffer->device, "k_cache", dev);
    if (!kvhal__device_equal(k->buffer->device, dev)) return kvhal__device_mismatch("k", k->buffer->device, "k_cache", dev);
    if (!kvhal__device_equal(v->buffer->device, dev)) return kvhal__device_mismatch("v", v->buffer->device, "k_cache", dev);
    if (!kvhal__device_equal(slot_mapping->buffer->device, dev))
        return kvhal__device_mismatch("slot_mapping", slot_mapping->buffer->device, "k_cache", dev);
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
    if (!kvhal__is_float_input(in_dt))
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "k.dtype: %s is not an input dtype (f32, f16 or bf16)",
                          kvhal_dtype_name(in_dt));
    if (v->dtype != in_dt)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "v.dtype: %s differs from k.dtype %s", kvhal_dtype_name(v->dtype),
                          kvhal_dtype_name(in_dt));
    if (cache_dt != in_dt && !kvhal__is_fp8(cache_dt))
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "k_cache.dtype: %s must be k's dtype %s or an fp8 format (fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz, fp8_e5m2fnuz)",
                          kvhal_dtype_name(cache_dt), kvhal_dtype_name(in_dt));
    if (v_cache->dtype != cache_dt)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "v_cache.dtype: %s differs from k_cache.dtype %s",
                          kvhal_dtype_name(v_cache->dtype), kvhal_dtype_name(cache_dt));
    if (slot_mapping->dtype != KVHAL_I32 && slot_mapping->dtype != KVHAL_I64)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "slot_mapping.dtype: %s is not i32 or i64",
                          kvhal_dtype_name(slot_mapping->dtype));
    if (kvhal__is_fp8(cache_dt)) {
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
    *num_tokens_out = num_tokens;
    const int64_t num_slots = kvhal_tensor_numel(slot_mapping);
    if (num_slots != num_tokens)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "slot_mapping: %lld slots for %lld tokens of k", (long long)num_slots,
                          (long long)num_tokens);
    if (k->ndim == 4 && slot_mapping->ndim == 2 &&
        (slot_mapping->shape[0] != k->shape[0] || slot_mapping->shape[1] != k->shape[1]))
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "slot_mapping.shape: [%lld, %lld] differs from k's [batch, seq] "
                          "[%lld, %lld]", (long long)slot_mapping->shape[0], (long long)slot_mapping->shape[1],
                          (long long)k->shape[0], (long long)k->shape[1]);

    return KVHAL_OK;
}

/* One side (K or V) in the backend's terms: tokens are (outer, inner) = (t / seq_len, t % seq_len). */
static kvhal_bk_paged_side side_of(const kvhal_tensor *cache, const kvhal_tensor *in, int64_t seq_len, float scale)
{
    const int hd = in->ndim - 2; /* index of the input's heads dim */
    const bool batched_input = in->ndim == 4;
    return (kvhal_bk_paged_side){
        .cache = cache->buffer->native, .cache_offset = cache->offset,
        .block_stride = cache->strides[0], .offset_stride = cache->strides[1],
        .cache_head_stride = cache->strides[2], .cache_dim_stride = cache->strides[3],
        .input = in->buffer->native, .input_offset = in->offset,
        .tok_stride_outer = batched_input ? in->strides[0] : seq_len * in->strides[0],
        .tok_stride_inner = batched_input ? in->strides[1] : in->strides[0],
        .in_head_stride = in->strides[hd], .in_dim_stride = in->strides[hd + 1],
        .head_dim = (int32_t)cache->shape[3], .scale = scale};
}

/* The key: the call's shape class, all the metadata of the normalised call except memory, scales and counts. The
 * token count (and so the slot count) is a call argument, and so is the batch size of a [batch, seq] call: a serving
 * loop whose token count changes every step reuses one descriptor per (layout, dtypes, heads, head dims, strides).
 * Only a batched call's seq_len and outer strides (token-outer, slot-outer) are part of the class; a flat call's
 * outer strides (seq_len times the inner one) are not used by any backend. Backends make descriptors that hold for
 * every count (kvhal_backend.h, kvhal_bk_paged_caching). */
static void key_of(const kvhal_bk_paged_caching *a, kvhal_desc_key *key)
{
    key->op = KVHAL_BK_OP_PAGED_CACHING;
    uint64_t *w = key->words;
    *w++ = (uint64_t)a->input_dtype | (uint64_t)a->cache_dtype << 8 | (uint64_t)a->slot_dtype << 16 |
           (uint64_t)a->batched << 24;
    *w++ = a->batched ? (uint64_t)a->seq_len : 0;
    *w++ = (uint64_t)a->num_heads | (uint64_t)a->block_size << 32;
    *w++ = (uint64_t)a->num_blocks;
    *w++ = a->batched ? (uint64_t)a->slot_stride_outer : 0;
    *w++ = (uint64_t)a->slot_stride_inner;
    const kvhal_bk_paged_side *sides[2] = {&a->k, &a->v};
    for (int i = 0; i < 2; i++) {
        const kvhal_bk_paged_side *p = sides[i];
        *w++ = (uint64_t)p->head_dim;
        *w++ = (uint64_t)p->block_stride;
        *w++ = (uint64_t)p->offset_stride;
        *w++ = (uint64_t)p->cache_head_stride;
        *w++ = (uint64_t)p->cache_dim_stride;
        *w++ = a->batched ? (uint64_t)p->tok_stride_outer : 0;
        *w++ = (uint64_t)p->tok_stride_inner;
        *w++ = (uint64_t)p->in_head_stride;
        *w++ = (uint64_t)p->in_dim_stride;
    }
    key->nwords = (uint32_t)(w - key->words);
    kvhal__desc_key_rehash(key);
}

kvhal_status kvhal_paged_caching(const kvhal_tensor *k_cache, const kvhal_tensor *v_cache, const kvhal_tensor *k,
                                 const kvhal_tensor *v, const kvhal_tensor *slot_mapping, float k_scale,
                                 float v_scale, kvhal_stream *s)
{
    int64_t num_tokens = 0;
    KVHAL_TRY(validate(k_cache, v_cache, k, v, slot_mapping, k_scale, v_scale, s, &num_tokens));
    const kvhal_device dev = k_cache->buffer->device;
    const kvhal__bk *bk = k_cache->buffer->backend;
    if (!bk->ops.paged_caching) return kvhal__unsupported(bk, dev, KVHAL_BK_OP_PAGED_CACHING, NULL);
    const int64_t heads = k_cache->shape[2];
    if (num_tokens == 0 || heads == 0 || (k_cache->shape[3] == 0 && v_cache->shape[3] == 0)) return KVHAL_OK;
    /* One side without elements would need every backend to launch a half-empty kernel; no model stores that. */
    if (k_cache->shape[3] == 0 || v_cache->shape[3] == 0)
        return kvhal__err(KVHAL_UNSUPPORTED, "%s.shape[3]: head dim 0 beside %s head dim %lld (one side without "
                          "elements is not supported; skip the call or pass a non-empty side)",
                          k_cache->shape[3] == 0 ? "k_cache" : "v_cache", k_cache->shape[3] == 0 ? "v_cache's" :
                          "k_cache's", (long long)(k_cache->shape[3] == 0 ? v_cache->shape[3] : k_cache->shape[3]));

    const bool fp8 = kvhal__is_fp8(k_cache->dtype);
    const int64_t seq_len = k->ndim == 4 ? k->shape[1] : slot_mapping->ndim == 2 ? slot_mapping->shape[1] : num_tokens;
    kvhal_bk_paged_caching a;
    a.k = side_of(k_cache, k, seq_len, fp8 ? k_scale : 1.0f);
    a.v = side_of(v_cache, v, seq_len, fp8 ? v_scale : 1.0f);
    a.input_dtype = k->dtype;
    a.cache_dtype = k_cache->dtype;
    a.slot_dtype = slot_mapping->dtype;
    a.num_tokens = num_tokens;
    a.seq_len = seq_len;
    a.num_heads = (int32_t)heads;
    a.block_size = (int32_t)k_cache->shape[1];
    a.num_blocks = k_cache->shape[0];
    a.slots = slot_mapping->buffer->native;
    a.slots_offset = slot_mapping->offset;
    if (slot_mapping->ndim == 2) {
        a.slot_stride_outer = slot_mapping->strides[0];
        a.slot_stride_inner = slot_mapping->strides[1];
    } else {
        a.slot_stride_inner = slot_mapping->strides[0];
        a.slot_stride_outer = seq_len * slot_mapping->strides[0];
    }
    a.num_slots = a.num_blocks * a.block_size; /* checked not to overflow by validate */
    a.batched = seq_len < num_tokens;
    a.fp8 = fp8;

    kvhal_desc_key key;
    key_of(&a, &key);
    return kvhal__op_dispatch(dev, bk, KVHAL_BK_OP_PAGED_CACHING, &key, &a, s);
}

/* ---- MLA: one latent vector per token (DeepSeek's multi-head latent attention, vLLM's concat_and_cache_mla) ---- */

/* t as [tokens, 1, dim]: t is [tokens, dim] or [tokens, 1, dim]. */
static kvhal_status mla_input(const kvhal_tensor *t, const char *name, kvhal_tensor *out)
{
    KVHAL_TRY(kvhal__check_tensor(t, name));
    if (t->ndim == 3 && t->shape[1] != 1)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.shape[1]: %lld heads; an MLA input has one ([tokens, 1, dim])",
                          name, (long long)t->shape[1]);
    if (t->ndim != 2 && t->ndim != 3)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.ndim: %d, expected 2 ([tokens, dim]) or 3 ([tokens, 1, dim])",
                          name, t->ndim);
    *out = *t;
    if (t->ndim == 2) {
        out->ndim = 3;
        out->shape[2] = t->shape[1], out->strides[2] = t->strides[1];
        out->shape[1] = 1, out->strides[1] = t->shape[1] * t->strides[1];
    }
    return KVHAL_OK;
}

/* The MLA forms run as the paged-caching op on two column ranges of the one cache row: the two parts of the
 * vector (or, K-only, its two halves) are the op's K and V sides, written by one launch, in every backend. */
kvhal_status kvhal_paged_caching_mla(const kvhal_tensor *kv_cache, const kvhal_tensor *kv_c, const kvhal_tensor *k_pe,
                                     const kvhal_tensor *slot_mapping, float scale, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_tensor(kv_cache, "kv_cache"));
    if (kv_cache->ndim == 4 && kv_cache->shape[2] != 1)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "kv_cache.shape[2]: %lld heads; an MLA cache has one ([blocks, "
                          "block_size, 1, dim])", (long long)kv_cache->shape[2]);
    if (kv_cache->ndim != 3 && kv_cache->ndim != 4)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "kv_cache.ndim: %d, expected 3 ([blocks, block_size, dim]) or 4 "
                          "([blocks, block_size, 1, dim])", kv_cache->ndim);
    kvhal_tensor c4 = *kv_cache;
    if (kv_cache->ndim == 3) {
        c4.ndim = 4;
        c4.shape[3] = kv_cache->shape[2], c4.strides[3] = kv_cache->strides[2];
        c4.shape[2] = 1, c4.strides[2] = kv_cache->shape[2] * kv_cache->strides[2];
    }
    kvhal_tensor a, b;
    KVHAL_TRY(mla_input(kv_c, "kv_c", &a));
    const int64_t row = c4.shape[3], first = a.shape[2];
    int64_t split;
    if (k_pe) {
        KVHAL_TRY(mla_input(k_pe, "k_pe", &b));
        if (!kvhal__device_equal(k_pe->buffer->device, kv_c->buffer->device))
            return kvhal__device_mismatch("k_pe", k_pe->buffer->device, "kv_c", kv_c->buffer->device);
        if (b.dtype != a.dtype)
            return kvhal__err(KVHAL_DTYPE_MISMATCH, "k_pe.dtype: %s differs from kv_c.dtype %s",
                              kvhal_dtype_name(b.dtype), kvhal_dtype_name(a.dtype));
        if (b.shape[0] != a.shape[0])
            return kvhal__err(KVHAL_SHAPE_MISMATCH, "k_pe.shape[0]: %lld tokens differs from kv_c's %lld",
                              (long long)b.shape[0], (long long)a.shape[0]);
        if (first + b.shape[2] != row)
            return kvhal__err(KVHAL_SHAPE_MISMATCH, "kv_c and k_pe: %lld + %lld dims differ from kv_cache's row of "
                              "%lld", (long long)first, (long long)b.shape[2], (long long)row);
        if (first < 1 || b.shape[2] < 1)
            return kvhal__err(KVHAL_UNSUPPORTED, "%s: a part of 0 dims (pass the whole row as kv_c with k_pe NULL)",
                              first < 1 ? "kv_c" : "k_pe");
        split = first;
    } else {
        if (first != row)
            return kvhal__err(KVHAL_SHAPE_MISMATCH, "kv_c.shape[-1]: %lld dims differ from kv_cache's row of %lld",
                              (long long)first, (long long)row);
        if (row == 1)
            return kvhal__err(KVHAL_UNSUPPORTED, "kv_cache: a row of 1 element (the K-only form splits the row)");
        /* two halves, the first a multiple of 16 elements where the row allows (16-byte units for every dtype) */
        split = (row / 2) & ~(int64_t)15;
        if (split == 0) split = row / 2;
        b = a;
    }
    kvhal_tensor kc, vc, k, v;
    KVHAL_TRY(kvhal_tensor_narrow(&c4, 3, 0, split, &kc));
    KVHAL_TRY(kvhal_tensor_narrow(&c4, 3, split, row - split, &vc));
    if (k_pe) {
        k = a, v = b;
    } else {
        KVHAL_TRY(kvhal_tensor_narrow(&a, 2, 0, split, &k));
        KVHAL_TRY(kvhal_tensor_narrow(&a, 2, split, row - split, &v));
    }
    return kvhal_paged_caching(&kc, &vc, &k, &v, slot_mapping, scale, scale, s);
}

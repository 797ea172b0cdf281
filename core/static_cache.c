/* static_cache.c — the static (pre-allocated, position-indexed) KV cache of one rank: per layer K [batch, heads_k,
 * max_len, dk] and V [batch, heads_v, max_len, dv] in one buffer. update() writes a window of new tokens at
 * cache_pos and returns views of the whole history; K and V are written together or not at all. */
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "device.h"
#include "error.h"
#include "faults.h"
#include "handles.h"
#include "registry.h"
#include "tensor.h"
#include "tensor_copy.h"
#include "version.h"

#define STATIC_MAGIC 0x4b565343u /* KVSC */

struct kvhal_static_cache {
    uint32_t magic;
    kvhal_static_cache_config cfg;
    kvhal_buffer *buf;
    size_t k_bytes, v_bytes; /* per layer */
};

static kvhal_status check_cache(const kvhal_static_cache *c)
{
    if (!c) return kvhal__err(KVHAL_INVALID_ARGUMENT, "c: NULL");
    if (c->magic != STATIC_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "c: %p is not a live static cache", (const void *)c);
    return KVHAL_OK;
}

kvhal_status kvhal_static_cache_create(const kvhal_static_cache_config *cfg, kvhal_static_cache **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_static_cache_config local;
    static const size_t known[] = {sizeof(kvhal_static_cache_config)}; /* 0.1 */
    KVHAL_TRY(kvhal__config_in(cfg, &local, known, 1, "cfg", "KVHAL_STATIC_CACHE_CONFIG_INIT or kvhal_static_cache_config_init()"));
    cfg = &local;
    KVHAL_CHECK_ARG(cfg->num_layers >= 1, "cfg.num_layers: %d must be >= 1", (int)cfg->num_layers);
    KVHAL_CHECK_ARG(cfg->batch >= 1, "cfg.batch: %d must be >= 1", (int)cfg->batch);
    KVHAL_CHECK_ARG(cfg->num_heads_k >= 1, "cfg.num_heads_k: %d must be >= 1", (int)cfg->num_heads_k);
    KVHAL_CHECK_ARG(cfg->num_heads_v >= 1, "cfg.num_heads_v: %d must be >= 1", (int)cfg->num_heads_v);
    KVHAL_CHECK_ARG(cfg->head_dim_k >= 1, "cfg.head_dim_k: %d must be >= 1", (int)cfg->head_dim_k);
    KVHAL_CHECK_ARG(cfg->head_dim_v >= 1, "cfg.head_dim_v: %d must be >= 1", (int)cfg->head_dim_v);
    KVHAL_CHECK_ARG(cfg->max_len >= 1, "cfg.max_len: %lld must be >= 1", (long long)cfg->max_len);
    KVHAL_CHECK_ARG(cfg->dtype == KVHAL_F32 || cfg->dtype == KVHAL_F16 || cfg->dtype == KVHAL_BF16 ||
                        cfg->dtype == KVHAL_FP8_E4M3 || cfg->dtype == KVHAL_FP8_E5M2 ||
                            cfg->dtype == KVHAL_FP8_E4M3FNUZ || cfg->dtype == KVHAL_FP8_E5M2FNUZ,
                    "cfg.dtype: %s is not a cache dtype (f32, f16, bf16, fp8_e4m3, fp8_e5m2)",
                    kvhal_dtype_name(cfg->dtype));
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(cfg->device, "cfg.device", &bk));
    const uint64_t es = kvhal_dtype_size(cfg->dtype);
    uint64_t per_tok, kb, vb, total; /* per_tok: bytes of one (head, dim) element over the batch and max_len */
    if (__builtin_mul_overflow((uint64_t)cfg->batch, (uint64_t)cfg->max_len, &per_tok) ||
        __builtin_mul_overflow(per_tok, es, &per_tok) ||
        __builtin_mul_overflow(per_tok, (uint64_t)cfg->num_heads_k * (uint64_t)cfg->head_dim_k, &kb) ||
        __builtin_mul_overflow(per_tok, (uint64_t)cfg->num_heads_v * (uint64_t)cfg->head_dim_v, &vb) ||
        __builtin_add_overflow(kb, vb, &total) || __builtin_mul_overflow(total, (uint64_t)cfg->num_layers, &total) ||
        total > SIZE_MAX)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "cfg: the cache's size overflows the addressable size");

    kvhal_static_cache *c = kvhal__calloc(1, sizeof *c);
    if (!c) return kvhal__err(KVHAL_OUT_OF_MEMORY, "static cache: cannot allocate the handle");
    c->cfg = *cfg;
    c->k_bytes = (size_t)kb;
    c->v_bytes = (size_t)vb;
    kvhal_status st = kvhal_buffer_create(cfg->device, (size_t)total, &c->buf);
    if (st == KVHAL_OK) st = kvhal_memset(c->buf, 0, 0, (size_t)total, NULL);
    if (st == KVHAL_OK && !kvhal__handle_add(c))
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "static cache: cannot register the handle");
    if (st != KVHAL_OK) {
        if (c->buf) kvhal_buffer_destroy(c->buf);
        free(c);
        return st;
    }
    c->magic = STATIC_MAGIC;
    *out = c;
    return KVHAL_OK;
}

kvhal_status kvhal_static_cache_destroy(kvhal_static_cache *c)
{
    if (!c) return KVHAL_OK; /* like free(NULL) */
    if (!kvhal__handle_remove_kind(c, STATIC_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "c: %p is not a live static cache (destroyed twice?)", (void *)c);
    c->magic = KVHAL_MAGIC_DEAD;
    kvhal_status st = kvhal_buffer_destroy(c->buf);
    free(c);
    return st;
}

/* Layer view [batch, heads, len, dim] of positions [0, len) of K (side 0) or V (side 1). */
static kvhal_status layer_view(const kvhal_static_cache *c, int32_t layer, int side, int64_t start, int64_t len,
                               kvhal_tensor *out)
{
    const kvhal_static_cache_config *g = &c->cfg;
    const int64_t heads = side ? g->num_heads_v : g->num_heads_k, dim = side ? g->head_dim_v : g->head_dim_k;
    const size_t es = kvhal_dtype_size(g->dtype);
    int64_t shape[4] = {g->batch, heads, len, dim};
    int64_t strides[4] = {heads * g->max_len * dim, g->max_len * dim, dim, 1};
    size_t off = (size_t)layer * (c->k_bytes + c->v_bytes) + (side ? c->k_bytes : 0) + (size_t)(start * dim) * es;
    return kvhal_tensor_make(c->buf, off, g->dtype, 4, shape, strides, out);
}

static kvhal_status check_input(const kvhal_static_cache *c, const kvhal_tensor *t, const char *arg, int64_t heads,
                                int64_t dim)
{
    KVHAL_TRY(kvhal__check_tensor(t, arg));
    if (!kvhal__device_equal(t->buffer->device, c->cfg.device))
        return kvhal__err(KVHAL_DEVICE_MISMATCH, "%s: is on %s:%d but the cache is on %s:%d", arg,
                          kvhal_device_type_name(t->buffer->device.type), (int)t->buffer->device.id,
                          kvhal_device_type_name(c->cfg.device.type), (int)c->cfg.device.id);
    if (t->ndim != 4)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.ndim: %d, expected 4 ([batch, heads, seq, dim])", arg, t->ndim);
    if (t->dtype != c->cfg.dtype)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "%s.dtype: %s differs from the cache's %s", arg,
                          kvhal_dtype_name(t->dtype), kvhal_dtype_name(c->cfg.dtype));
    if (t->shape[0] != c->cfg.batch)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.shape[0]: batch %lld differs from the cache's %d", arg,
                          (long long)t->shape[0], (int)c->cfg.batch);
    if (t->shape[1] != heads)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.shape[1]: %lld heads differs from the cache's %lld", arg,
                          (long long)t->shape[1], (long long)heads);
    if (t->shape[3] != dim)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.shape[3]: head dim %lld differs from the cache's %lld", arg,
                          (long long)t->shape[3], (long long)dim);
    return KVHAL_OK;
}

kvhal_status kvhal_static_cache_update(kvhal_static_cache *c, int32_t layer, const kvhal_tensor *k,
                                       const kvhal_tensor *v, int64_t cache_pos, kvhal_tensor *k_hist,
                                       kvhal_tensor *v_hist, kvhal_stream *s)
{
    KVHAL_TRY(check_cache(c));
    if (layer < 0 || layer >= c->cfg.num_layers)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "layer: %d is out of range [0, %d)", (int)layer, (int)c->cfg.num_layers);
    KVHAL_TRY(check_input(c, k, "k", c->cfg.num_heads_k, c->cfg.head_dim_k));
    KVHAL_TRY(check_input(c, v, "v", c->cfg.num_heads_v, c->cfg.head_dim_v));
    const int64_t seq = k->shape[2];
    if (v->shape[2] != seq)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "v.shape[2]: %lld tokens differs from k's %lld", (long long)v->shape[2],
                          (long long)seq);
    if (cache_pos < 0 || cache_pos > c->cfg.max_len || seq > c->cfg.max_len - cache_pos)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "cache_pos: %lld + %lld new tokens is outside the cache's max_len %lld",
                          (long long)cache_pos, (long long)seq, (long long)c->cfg.max_len);
    KVHAL_TRY(kvhal__check_stream(s, c->cfg.device, "s"));
    kvhal_tensor kd, vd, kh, vh;
    KVHAL_TRY(layer_view(c, layer, 0, cache_pos, seq, &kd));
    KVHAL_TRY(layer_view(c, layer, 1, cache_pos, seq, &vd));
    KVHAL_TRY(layer_view(c, layer, 0, 0, cache_pos + seq, &kh));
    KVHAL_TRY(layer_view(c, layer, 1, 0, cache_pos + seq, &vh));
    static const char *const names[4] = {"k_cache", "k", "v_cache", "v"};
    KVHAL_TRY(kvhal__tensor_copy_pair(&kd, k, &vd, v, names, s));
    if (k_hist) *k_hist = kh;
    if (v_hist) *v_hist = vh;
    return KVHAL_OK;
}

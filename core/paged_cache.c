/* paged_cache.c — the paged KV cache: fixed-size blocks of block_size tokens, as many as a memory budget allows,
 * for every layer's K and V in one buffer. The block layout (NHD or HND) and the order (layer-first: each layer's
 * K and V are dense arrays of blocks; page-first: one block of every layer is contiguous) are only strides of the
 * layer views, so update() is the paged-caching op on those views and copy_blocks() is one copy_blocks op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "faults.h"
#include "handles.h"
#include "registry.h"
#include "version.h"

#define PAGED_MAGIC 0x4b565043u /* KVPC */

struct kvhal_paged_cache {
    uint32_t magic;
    kvhal_paged_cache_config cfg;
    kvhal_buffer *buf;
    int64_t num_blocks;
    int64_t block_elems; /* one block of one layer's K (or V) */
    float k_scale, v_scale;
};

static kvhal_status check_cache(const kvhal_paged_cache *c)
{
    if (!c) return kvhal__err(KVHAL_INVALID_ARGUMENT, "c: NULL");
    if (c->magic != PAGED_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "c: %p is not a live paged cache", (const void *)c);
    return KVHAL_OK;
}

static kvhal_status check_scale(float s, const char *arg)
{
    if (!isfinite(s) || s < 0.0f)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: %g must be finite and >= 0 (0 means 1)", arg, (double)s);
    return KVHAL_OK;
}

static kvhal_status paged_create(const kvhal_paged_cache_config *cfg, kvhal_paged_cache **out, bool shareable)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_paged_cache_config local;
    static const size_t known[] = {sizeof(kvhal_paged_cache_config)}; /* 0.1 */
    KVHAL_TRY(kvhal__config_in(cfg, &local, known, 1, "cfg", "KVHAL_PAGED_CACHE_CONFIG_INIT or kvhal_paged_cache_config_init()"));
    cfg = &local;
    KVHAL_CHECK_ARG(cfg->num_layers >= 1, "cfg.num_layers: %d must be >= 1", (int)cfg->num_layers);
    KVHAL_CHECK_ARG(cfg->num_heads >= 1, "cfg.num_heads: %d must be >= 1", (int)cfg->num_heads);
    KVHAL_CHECK_ARG(cfg->head_dim >= 1, "cfg.head_dim: %d must be >= 1", (int)cfg->head_dim);
    KVHAL_CHECK_ARG(cfg->block_size >= 1, "cfg.block_size: %d must be >= 1", (int)cfg->block_size);
    KVHAL_CHECK_ARG(cfg->dtype == KVHAL_F32 || cfg->dtype == KVHAL_F16 || cfg->dtype == KVHAL_BF16 ||
                        cfg->dtype == KVHAL_FP8_E4M3 || cfg->dtype == KVHAL_FP8_E5M2 ||
                            cfg->dtype == KVHAL_FP8_E4M3FNUZ || cfg->dtype == KVHAL_FP8_E5M2FNUZ,
                    "cfg.dtype: %s is not a cache dtype (f32, f16, bf16, fp8_e4m3, fp8_e5m2)",
                    kvhal_dtype_name(cfg->dtype));
    KVHAL_CHECK_ARG(cfg->layout == KVHAL_LAYOUT_NHD || cfg->layout == KVHAL_LAYOUT_HND,
                    "cfg.layout: %d is not KVHAL_LAYOUT_NHD or KVHAL_LAYOUT_HND", (int)cfg->layout);
    KVHAL_CHECK_ARG(cfg->order == KVHAL_LAYER_FIRST || cfg->order == KVHAL_PAGE_FIRST,
                    "cfg.order: %d is not KVHAL_LAYER_FIRST or KVHAL_PAGE_FIRST", (int)cfg->order);
    KVHAL_TRY(check_scale(cfg->k_scale, "cfg.k_scale"));
    KVHAL_TRY(check_scale(cfg->v_scale, "cfg.v_scale"));
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(cfg->device, "cfg.device", &bk));

    const uint64_t es = kvhal_dtype_size(cfg->dtype);
    /* Each product is checked: a wrapped block size could be 0 (a division by zero below) or far too small. */
    uint64_t block_elems, block_bytes, per_block; /* per_block: one block of K and V of every layer */
    if (__builtin_mul_overflow((uint64_t)cfg->block_size, (uint64_t)cfg->num_heads, &block_elems) ||
        __builtin_mul_overflow(block_elems, (uint64_t)cfg->head_dim, &block_elems) || block_elems > INT64_MAX ||
        __builtin_mul_overflow(block_elems, es, &block_bytes) ||
        __builtin_mul_overflow(block_bytes, 2u * (uint64_t)cfg->num_layers, &per_block))
        return kvhal__err(KVHAL_OUT_OF_RANGE, "cfg: a block of %d tokens x %d heads x %d dims for %d layers "
                          "overflows 64 bits", (int)cfg->block_size, (int)cfg->num_heads, (int)cfg->head_dim,
                          (int)cfg->num_layers);
    const uint64_t num_blocks = cfg->memory_budget / per_block;
    if (num_blocks == 0)
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "cfg.memory_budget: %llu bytes is not enough memory for one block "
                          "(one block of K and V for %d layers needs %llu bytes)",
                          (unsigned long long)cfg->memory_budget, (int)cfg->num_layers, (unsigned long long)per_block);
    const uint64_t total = num_blocks * per_block;
    if (total > SIZE_MAX - KVHAL_PAGED_CACHE_PROOF_BYTES || num_blocks > (uint64_t)INT64_MAX / ((uint64_t)cfg->block_size))
        return kvhal__err(KVHAL_OUT_OF_RANGE, "cfg.memory_budget: %llu bytes exceeds the addressable size",
                          (unsigned long long)cfg->memory_budget);

    kvhal_paged_cache *c = kvhal__calloc(1, sizeof *c);
    if (!c) return kvhal__err(KVHAL_OUT_OF_MEMORY, "paged cache: cannot allocate the handle");
    c->cfg = *cfg;
    c->num_blocks = (int64_t)num_blocks;
    c->block_elems = (int64_t)block_elems;
    c->k_scale = cfg->k_scale == 0.0f ? 1.0f : cfg->k_scale;
    c->v_scale = cfg->v_scale == 0.0f ? 1.0f : cfg->v_scale;
    /* a shareable cache: the transfer agent's proof area past the pages (kvhal.h) */
    const size_t bytes = (size_t)total + (shareable ? KVHAL_PAGED_CACHE_PROOF_BYTES : 0);
    kvhal_status st = shareable ? kvhal_buffer_create_shareable(cfg->device, bytes, &c->buf)
                                : kvhal_buffer_create(cfg->device, bytes, &c->buf);
    if (st == KVHAL_OK) st = kvhal_memset(c->buf, 0, 0, bytes, NULL);
    if (st == KVHAL_OK && !kvhal__handle_add(c))
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "paged cache: cannot register the handle");
    if (st != KVHAL_OK) {
        if (c->buf) kvhal_buffer_destroy(c->buf);
        free(c);
        return st;
    }
    c->magic = PAGED_MAGIC;
    *out = c;
    return KVHAL_OK;
}

kvhal_status kvhal_paged_cache_create(const kvhal_paged_cache_config *cfg, kvhal_paged_cache **out)
{
    return paged_create(cfg, out, false);
}

kvhal_status kvhal_paged_cache_create_shareable(const kvhal_paged_cache_config *cfg, kvhal_paged_cache **out)
{
    return paged_create(cfg, out, true);
}

kvhal_status kvhal_paged_cache_destroy(kvhal_paged_cache *c)
{
    if (!c) return KVHAL_OK; /* like free(NULL) */
    if (!kvhal__handle_remove_kind(c, PAGED_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "c: %p is not a live paged cache (destroyed twice?)", (void *)c);
    c->magic = KVHAL_MAGIC_DEAD;
    kvhal_status st = kvhal_buffer_destroy(c->buf);
    free(c);
    return st;
}

int64_t kvhal_paged_cache_num_blocks(const kvhal_paged_cache *c)
{
    return c && c->magic == PAGED_MAGIC ? c->num_blocks : 0;
}

/* Element offset of block 0 of layer's K (side 0) or V (side 1), and the distance between blocks. */
static void placement(const kvhal_paged_cache *c, int32_t layer, int side, int64_t *base, int64_t *block_stride)
{
    const int64_t arr = 2 * (int64_t)layer + side;
    if (c->cfg.order == KVHAL_LAYER_FIRST) {
        *base = arr * c->num_blocks * c->block_elems;
        *block_stride = c->block_elems;
    } else {
        *base = arr * c->block_elems;
        *block_stride = 2 * (int64_t)c->cfg.num_layers * c->block_elems;
    }
}

static kvhal_status view(const kvhal_paged_cache *c, int32_t layer, int side, kvhal_tensor *out)
{
    const kvhal_paged_cache_config *g = &c->cfg;
    int64_t base, bstride;
    placement(c, layer, side, &base, &bstride);
    int64_t shape[4] = {c->num_blocks, g->block_size, g->num_heads, g->head_dim};
    int64_t strides[4] = {bstride, 0, 0, 1};
    if (g->layout == KVHAL_LAYOUT_NHD) {
        strides[1] = (int64_t)g->num_heads * g->head_dim;
        strides[2] = g->head_dim;
    } else {
        strides[1] = g->head_dim;
        strides[2] = (int64_t)g->block_size * g->head_dim;
    }
    return kvhal_tensor_make(c->buf, (size_t)base * kvhal_dtype_size(g->dtype), g->dtype, 4, shape, strides, out);
}

kvhal_status kvhal_paged_cache_layer(const kvhal_paged_cache *c, int32_t layer, kvhal_tensor *k, kvhal_tensor *v)
{
    KVHAL_TRY(check_cache(c));
    if (layer < 0 || layer >= c->cfg.num_layers)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "layer: %d is out of range [0, %d)", (int)layer, (int)c->cfg.num_layers);
    KVHAL_CHECK_ARG(k || v, "k, v: both NULL");
    if (k) KVHAL_TRY(view(c, layer, 0, k));
    if (v) KVHAL_TRY(view(c, layer, 1, v));
    return KVHAL_OK;
}

kvhal_status kvhal_paged_cache_update(kvhal_paged_cache *c, int32_t layer, const kvhal_tensor *k,
                                      const kvhal_tensor *v, const kvhal_tensor *slot_mapping, kvhal_stream *s)
{
    KVHAL_TRY(check_cache(c));
    if (layer < 0 || layer >= c->cfg.num_layers)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "layer: %d is out of range [0, %d)", (int)layer, (int)c->cfg.num_layers);
    kvhal_tensor kc, vc;
    KVHAL_TRY(view(c, layer, 0, &kc));
    KVHAL_TRY(view(c, layer, 1, &vc));
    return kvhal_paged_caching(&kc, &vc, k, v, slot_mapping, c->k_scale, c->v_scale, s);
}

/* The caches of whole-block ops: page-first, one cache [blocks, 2 * layers * block] (a block of every layer's K and V
 * is one contiguous range, laid out as a host page is) in *one, *views = one; layer-first, 2 * layers caches
 * [blocks, block] in *views, allocated (the caller frees it when it is not one). */
static kvhal_status block_views(const kvhal_paged_cache *c, const char *what, kvhal_tensor *one, kvhal_tensor **views,
                                int32_t *n)
{
    const kvhal_dtype dt = c->cfg.dtype;
    const size_t es = kvhal_dtype_size(dt);
    if (c->cfg.order == KVHAL_PAGE_FIRST) {
        int64_t shape[2] = {c->num_blocks, 2 * (int64_t)c->cfg.num_layers * c->block_elems};
        KVHAL_TRY(kvhal_tensor_make(c->buf, 0, dt, 2, shape, NULL, one));
        *views = one;
        *n = 1;
        return KVHAL_OK;
    }
    const int32_t count = 2 * c->cfg.num_layers;
    kvhal_tensor *caches = kvhal__malloc((size_t)count * sizeof *caches);
    if (!caches) return kvhal__err(KVHAL_OUT_OF_MEMORY, "%s: cannot allocate %d cache views", what, (int)count);
    kvhal_status st = KVHAL_OK;
    int64_t shape[2] = {c->num_blocks, c->block_elems};
    for (int32_t i = 0; i < count && st == KVHAL_OK; i++)
        st = kvhal_tensor_make(c->buf, (size_t)(i * c->num_blocks * c->block_elems) * es, dt, 2, shape, NULL,
                               &caches[i]);
    if (st != KVHAL_OK) {
        free(caches);
        return st;
    }
    *views = caches;
    *n = count;
    return KVHAL_OK;
}

kvhal_status kvhal_paged_cache_copy_blocks(kvhal_paged_cache *c, const int64_t *pairs, int32_t num_pairs,
                                           kvhal_stream *s)
{
    KVHAL_TRY(check_cache(c));
    kvhal_tensor one, *caches;
    int32_t n;
    KVHAL_TRY(block_views(c, "copy_blocks", &one, &caches, &n));
    kvhal_status st = kvhal_copy_blocks(caches, n, pairs, num_pairs, s);
    if (caches != &one) free(caches);
    return st;
}

size_t kvhal_paged_cache_host_page_bytes(const kvhal_paged_cache *c)
{
    if (!c || c->magic != PAGED_MAGIC) return 0;
    return (size_t)(2 * (int64_t)c->cfg.num_layers * c->block_elems) * kvhal_dtype_size(c->cfg.dtype);
}

kvhal_status kvhal_paged_cache_transfer(kvhal_paged_cache *c, kvhal_host_memory *host, const int64_t *pairs,
                                        int32_t num_pairs, kvhal_transfer_dir dir, kvhal_stream *s)
{
    KVHAL_TRY(check_cache(c));
    kvhal_tensor one, *caches;
    int32_t n;
    KVHAL_TRY(block_views(c, "page transfer", &one, &caches, &n));
    kvhal_status st = kvhal_page_transfer(caches, n, host, kvhal_paged_cache_host_page_bytes(c), pairs, num_pairs,
                                          dir, s);
    if (caches != &one) free(caches);
    return st;
}

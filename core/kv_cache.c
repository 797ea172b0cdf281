/* kv_cache.c — the contiguous multi-device KV cache: the KV heads are split evenly over the devices (tensor
 * parallelism); each device holds, per layer, K [max_len, nkvh/ndev, dk] and V [max_len, nkvh/ndev, dv] in one
 * buffer. duplicate() copies the first seq_len tokens of every device and layer into a new cache, as one batched
 * copy per device when the backend has copy_batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "device.h"
#include "error.h"
#include "faults.h"
#include "handles.h"
#include "registry.h"
#include "version.h"

#define KV_MAGIC 0x4b564b43u /* KVKC */

struct kvhal_kv_cache {
    uint32_t magic;
    kvhal_kv_cache_config cfg; /* cfg.devices points at devices below */
    kvhal_device *devices;
    kvhal_buffer **bufs;       /* one per device: [layer][K then V] */
    int32_t heads;             /* per device */
    size_t k_bytes, v_bytes;   /* per layer and device */
};

static kvhal_status check_cache(const kvhal_kv_cache *c, const char *arg)
{
    if (!c) return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: NULL", arg);
    if (c->magic != KV_MAGIC) return kvhal__err(KVHAL_INVALID_HANDLE, "%s: %p is not a live kv cache", arg, (const void *)c);
    return KVHAL_OK;
}

static bool is_cache_dtype(kvhal_dtype d)
{
    return d == KVHAL_F32 || d == KVHAL_F16 || d == KVHAL_BF16 || d == KVHAL_FP8_E4M3 || d == KVHAL_FP8_E5M2 ||
           d == KVHAL_FP8_E4M3FNUZ || d == KVHAL_FP8_E5M2FNUZ;
}

static void free_cache(kvhal_kv_cache *c)
{
    if (!c) return;
    if (c->bufs)
        for (int32_t i = 0; i < c->cfg.num_devices; i++)
            if (c->bufs[i]) kvhal_buffer_destroy(c->bufs[i]);
    free(c->bufs);
    free(c->devices);
    free(c);
}

static kvhal_status validate(const kvhal_kv_cache_config *cfg, size_t *k_bytes, size_t *v_bytes)
{
    KVHAL_CHECK_ARG(cfg->num_layers >= 1, "cfg.num_layers: %d must be >= 1", (int)cfg->num_layers);
    KVHAL_CHECK_ARG(cfg->num_kv_heads >= 1, "cfg.num_kv_heads: %d must be >= 1", (int)cfg->num_kv_heads);
    KVHAL_CHECK_ARG(cfg->head_dim_k >= 1, "cfg.head_dim_k: %d must be >= 1", (int)cfg->head_dim_k);
    KVHAL_CHECK_ARG(cfg->head_dim_v >= 1, "cfg.head_dim_v: %d must be >= 1", (int)cfg->head_dim_v);
    KVHAL_CHECK_ARG(cfg->max_len >= 1, "cfg.max_len: %lld must be >= 1", (long long)cfg->max_len);
    KVHAL_CHECK_ARG(is_cache_dtype(cfg->dtype), "cfg.dtype: %s is not a cache dtype (f32, f16, bf16, fp8_e4m3, "
                    "fp8_e5m2)", kvhal_dtype_name(cfg->dtype));
    KVHAL_CHECK_ARG(cfg->num_devices >= 1, "cfg.num_devices: %d must be >= 1", (int)cfg->num_devices);
    KVHAL_CHECK_ARG(cfg->devices, "cfg.devices: NULL with %d devices", (int)cfg->num_devices);
    KVHAL_CHECK_ARG(cfg->num_kv_heads % cfg->num_devices == 0,
                    "cfg.num_kv_heads: %d heads cannot be split evenly over %d devices", (int)cfg->num_kv_heads,
                    (int)cfg->num_devices);
    for (int32_t i = 0; i < cfg->num_devices; i++) {
        char arg[32];
        const kvhal__bk *bk;
        snprintf(arg, sizeof arg, "cfg.devices[%d]", (int)i);
        KVHAL_TRY(kvhal__lookup(cfg->devices[i], arg, &bk));
        for (int32_t j = 0; j < i; j++)
            if (kvhal__device_equal(cfg->devices[i], cfg->devices[j]))
                return kvhal__err(KVHAL_INVALID_ARGUMENT, "cfg.devices[%d]: %s:%d is already cfg.devices[%d]", (int)i,
                                  kvhal_device_type_name(cfg->devices[i].type), (int)cfg->devices[i].id, (int)j);
    }
    const uint64_t es = kvhal_dtype_size(cfg->dtype), heads = (uint64_t)(cfg->num_kv_heads / cfg->num_devices);
    uint64_t kb, vb, layer, total;
    if (__builtin_mul_overflow((uint64_t)cfg->max_len, heads * (uint64_t)cfg->head_dim_k * es, &kb) ||
        __builtin_mul_overflow((uint64_t)cfg->max_len, heads * (uint64_t)cfg->head_dim_v * es, &vb) ||
        __builtin_add_overflow(kb, vb, &layer) || __builtin_mul_overflow(layer, (uint64_t)cfg->num_layers, &total) ||
        total > SIZE_MAX)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "cfg: %d layers of %lld tokens overflow the addressable size",
                          (int)cfg->num_layers, (long long)cfg->max_len);
    *k_bytes = (size_t)kb;
    *v_bytes = (size_t)vb;
    return KVHAL_OK;
}

static kvhal_status create(const kvhal_kv_cache_config *cfg, bool zero, kvhal_kv_cache **out)
{
    size_t kb = 0, vb = 0;
    KVHAL_TRY(validate(cfg, &kb, &vb));
    kvhal_kv_cache *c = kvhal__calloc(1, sizeof *c);
    if (!c) return kvhal__err(KVHAL_OUT_OF_MEMORY, "kv cache: cannot allocate the handle");
    c->cfg = *cfg;
    c->heads = cfg->num_kv_heads / cfg->num_devices;
    c->k_bytes = kb;
    c->v_bytes = vb;
    const size_t nd = (size_t)cfg->num_devices;
    c->devices = kvhal__malloc(nd * sizeof *c->devices);
    c->bufs = kvhal__calloc(nd, sizeof *c->bufs);
    kvhal_status st = KVHAL_OK;
    if (!c->devices || !c->bufs) {
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "kv cache: cannot allocate the per-device tables of %d devices",
                        (int)cfg->num_devices);
        goto fail;
    }
    memcpy(c->devices, cfg->devices, nd * sizeof *c->devices);
    c->cfg.devices = c->devices;
    const size_t bytes = (kb + vb) * (size_t)cfg->num_layers;
    for (size_t i = 0; i < nd; i++) {
        st = kvhal_buffer_create(c->devices[i], bytes, &c->bufs[i]);
        if (st != KVHAL_OK) goto fail;
        if (zero && (st = kvhal_memset(c->bufs[i], 0, 0, bytes, NULL)) != KVHAL_OK) goto fail;
    }
    if (!kvhal__handle_add(c)) {
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "kv cache: cannot register the handle");
        goto fail;
    }
    c->magic = KV_MAGIC;
    *out = c;
    return KVHAL_OK;
fail:
    free_cache(c);
    return st;
}

kvhal_status kvhal_kv_cache_create(const kvhal_kv_cache_config *cfg, kvhal_kv_cache **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_kv_cache_config local;
    static const size_t known[] = {sizeof(kvhal_kv_cache_config)}; /* 0.1 */
    KVHAL_TRY(kvhal__config_in(cfg, &local, known, 1, "cfg", "KVHAL_KV_CACHE_CONFIG_INIT or kvhal_kv_cache_config_init()"));
    cfg = &local;
    return create(cfg, true, out);
}

/* One device's copies: K and V of every layer, the first seq_len tokens (a prefix is one contiguous range). */
static kvhal_status duplicate_device(const kvhal_kv_cache *src, kvhal_kv_cache *dst, int32_t di, int64_t seq_len)
{
    const size_t es = kvhal_dtype_size(src->cfg.dtype), heads = (size_t)src->heads;
    const size_t kn = (size_t)seq_len * heads * (size_t)src->cfg.head_dim_k * es;
    const size_t vn = (size_t)seq_len * heads * (size_t)src->cfg.head_dim_v * es;
    const kvhal_buffer *sb = src->bufs[di];
    kvhal_buffer *db = dst->bufs[di];
    const kvhal__bk *bk = db->backend;
    const int32_t layers = src->cfg.num_layers, n = 2 * layers;
    if (!bk->ops.copy_batch) {
        for (int32_t l = 0; l < layers; l++) {
            size_t base = (size_t)l * (src->k_bytes + src->v_bytes);
            KVHAL_TRY(kvhal_memcpy_d2d(db, base, sb, base, kn, NULL));
            KVHAL_TRY(kvhal_memcpy_d2d(db, base + src->k_bytes, sb, base + src->k_bytes, vn, NULL));
        }
        return KVHAL_OK;
    }
    /* one allocation for the four arrays of the batch */
    void *mem = kvhal__malloc((size_t)n * (2 * sizeof(void *) + 3 * sizeof(size_t)));
    if (!mem) return kvhal__err(KVHAL_OUT_OF_MEMORY, "duplicate: cannot allocate a batch of %d copies", (int)n);
    void **dsts = mem, **srcs = dsts + n;
    size_t *doffs = (size_t *)(srcs + n), *soffs = doffs + n, *bytes = soffs + n;
    for (int32_t l = 0; l < layers; l++) {
        size_t base = (size_t)l * (src->k_bytes + src->v_bytes);
        for (int side = 0; side < 2; side++) {
            int32_t i = 2 * l + side;
            dsts[i] = db->native;
            srcs[i] = sb->native;
            doffs[i] = soffs[i] = base + (side ? src->k_bytes : 0);
            bytes[i] = side ? vn : kn;
        }
    }
    kvhal_bk_copy_batch batch = {.count = n, .dst = dsts, .dst_offsets = doffs, .src = srcs, .src_offsets = soffs,
                                 .bytes = bytes};
    kvhal_status st = bk->ops.copy_batch(bk->ctx, db->device.id, &batch, NULL);
    free(mem);
    return st;
}

static kvhal_status zero_tail(kvhal_kv_cache *c, int32_t di, int64_t seq_len)
{
    if (seq_len == c->cfg.max_len) return KVHAL_OK;
    const size_t es = kvhal_dtype_size(c->cfg.dtype), heads = (size_t)c->heads;
    const size_t kn = (size_t)seq_len * heads * (size_t)c->cfg.head_dim_k * es;
    const size_t vn = (size_t)seq_len * heads * (size_t)c->cfg.head_dim_v * es;
    for (int32_t l = 0; l < c->cfg.num_layers; l++) {
        size_t base = (size_t)l * (c->k_bytes + c->v_bytes);
        KVHAL_TRY(kvhal_memset(c->bufs[di], base + kn, 0, c->k_bytes - kn, NULL));
        KVHAL_TRY(kvhal_memset(c->bufs[di], base + c->k_bytes + vn, 0, c->v_bytes - vn, NULL));
    }
    return KVHAL_OK;
}

kvhal_status kvhal_kv_cache_duplicate(const kvhal_kv_cache *src, int64_t seq_len, kvhal_kv_cache **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_TRY(check_cache(src, "src"));
    if (seq_len < 0 || seq_len > src->cfg.max_len)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "seq_len: %lld is outside [0, %lld] (the cache's max_len)",
                          (long long)seq_len, (long long)src->cfg.max_len);
    kvhal_kv_cache *d;
    /* Not cleared at creation: the copies fill [0, seq_len) and only the tail past seq_len is zeroed. */
    KVHAL_TRY(create(&src->cfg, false, &d));
    for (int32_t i = 0; i < src->cfg.num_devices; i++) {
        kvhal_status st = seq_len > 0 ? duplicate_device(src, d, i, seq_len) : KVHAL_OK;
        if (st == KVHAL_OK) st = zero_tail(d, i, seq_len);
        if (st != KVHAL_OK) {
            kvhal_kv_cache_destroy(d);
            return st;
        }
    }
    *out = d;
    return KVHAL_OK;
}

kvhal_status kvhal_kv_cache_destroy(kvhal_kv_cache *c)
{
    if (!c) return KVHAL_OK; /* like free(NULL) */
    if (!kvhal__handle_remove_kind(c, KV_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "c: %p is not a live kv cache (destroyed twice?)", (void *)c);
    c->magic = KVHAL_MAGIC_DEAD;
    free_cache(c);
    return KVHAL_OK;
}

kvhal_status kvhal_kv_cache_layer(const kvhal_kv_cache *c, int32_t device_index, int32_t layer, kvhal_tensor *k,
                                  kvhal_tensor *v)
{
    KVHAL_TRY(check_cache(c, "c"));
    if (device_index < 0 || device_index >= c->cfg.num_devices)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "device_index: %d is out of range [0, %d)", (int)device_index,
                          (int)c->cfg.num_devices);
    if (layer < 0 || layer >= c->cfg.num_layers)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "layer: %d is out of range [0, %d)", (int)layer, (int)c->cfg.num_layers);
    KVHAL_CHECK_ARG(k || v, "k, v: both NULL");
    const size_t base = (size_t)layer * (c->k_bytes + c->v_bytes);
    int64_t kshape[3] = {c->cfg.max_len, c->heads, c->cfg.head_dim_k};
    int64_t vshape[3] = {c->cfg.max_len, c->heads, c->cfg.head_dim_v};
    if (k) KVHAL_TRY(kvhal_tensor_make(c->bufs[device_index], base, c->cfg.dtype, 3, kshape, NULL, k));
    if (v) KVHAL_TRY(kvhal_tensor_make(c->bufs[device_index], base + c->k_bytes, c->cfg.dtype, 3, vshape, NULL, v));
    return KVHAL_OK;
}

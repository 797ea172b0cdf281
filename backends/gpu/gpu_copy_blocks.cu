/* gpu_copy_blocks.cu — the copy_blocks op of the GPU backends and copy_batch, the batched byte-range copies behind
 * kv_cache_duplicate: both copy byte ranges on one device, with the kernels below (not templates, so they live in
 * the one file that launches them rather than in kvhal_gpu_kernels.cuh). */
#include "gpu_private.h"

namespace kvhal_gpu {

/* copy_blocks: one table entry per cache, uploaded with the pairs through the descriptor's staging buffer. */
struct CacheEntry {
    char *base;     /* block 0 */
    int64_t stride; /* bytes between blocks */
    int64_t bytes;  /* bytes of one block */
};

struct CopyBlocksParams {
    const CacheEntry *caches;
    const int64_t *pairs; /* (src, dst) */
    volatile uint8_t *err;
    int64_t num_blocks;
    int64_t chunks;      /* work items per (pair, cache): ceil(largest block / CHUNK) */
    int64_t total;       /* num_pairs * num_caches * chunks */
    int32_t num_caches;
};

__global__ void __launch_bounds__(KVHAL_GPU_THREADS) copy_blocks_kernel(const CopyBlocksParams p)
{
    for (int64_t w = blockIdx.x; w < p.total; w += gridDim.x) {
        const int64_t item = w / p.chunks, chunk = w - item * p.chunks;
        const int64_t pair = item / p.num_caches;
        const int32_t c = (int32_t)(item - pair * p.num_caches);
        const CacheEntry e = p.caches[c]; /* loaded together with the pair, not after its check */
        const int64_t src = p.pairs[2 * pair], dst = p.pairs[2 * pair + 1];
        if (src < 0 || src >= p.num_blocks || dst < 0 || dst >= p.num_blocks) {
            if (threadIdx.x == 0) p.err[KVHAL_GPU_ERR_BLOCK] = 1;
            continue;
        }
        const int64_t begin = chunk * KVHAL_GPU_CHUNK;
        if (begin >= e.bytes) continue;
        const int64_t len = e.bytes - begin < KVHAL_GPU_CHUNK ? e.bytes - begin : KVHAL_GPU_CHUNK;
        copy_range(e.base + dst * e.stride + begin, e.base + src * e.stride + begin, (uint64_t)len);
    }
}

/* copy_batch: up to KVHAL_GPU_BATCH_MAX ranges by value; range r owns chunks [first[r], first[r + 1]). */
struct CopyBatchParams {
    char *dst[KVHAL_GPU_BATCH_MAX];
    const char *src[KVHAL_GPU_BATCH_MAX];
    uint64_t bytes[KVHAL_GPU_BATCH_MAX];
    uint32_t first[KVHAL_GPU_BATCH_MAX + 1];
    int32_t count;
};

__global__ void __launch_bounds__(KVHAL_GPU_THREADS) copy_batch_kernel(const CopyBatchParams p)
{
    const uint32_t w = blockIdx.x;
    int lo = 0, hi = p.count - 1; /* last r with first[r] <= w */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (p.first[mid] <= w) lo = mid;
        else hi = mid - 1;
    }
    const uint64_t begin = (uint64_t)(w - p.first[lo]) * KVHAL_GPU_CHUNK;
    const uint64_t left = p.bytes[lo] - begin;
    copy_range(p.dst[lo] + begin, p.src[lo] + begin, left < KVHAL_GPU_CHUNK ? left : KVHAL_GPU_CHUNK);
}

namespace {

/* ------------------------------------------------------------------------------------------------------------ */
/* copy_blocks: the table of caches and the pairs go up through a ring of pinned staging slots, each guarded by  */
/* an event recorded after its kernel, so a call never waits unless it laps a slot still in use.                */
/* ------------------------------------------------------------------------------------------------------------ */
#define KVHAL_GPU_RING 4

struct StagingSlot {
    char *host; /* pinned */
    char *dev;
    size_t cap;
    gpuEvent_t ev;
    bool has_ev;
};

struct CopyBlocksDesc {
    int32_t id;
    int next;
    StagingSlot ring[KVHAL_GPU_RING];
};

void slot_release(StagingSlot *s)
{
    if (s->has_ev) {
        (void)gpuEventSynchronize(s->ev);
        (void)gpuEventDestroy(s->ev);
    }
    if (s->host) (void)gpuFreeHost(s->host);
    if (s->dev) (void)gpuFree(s->dev);
    memset(s, 0, sizeof *s);
}

void copy_blocks_destroy(CopyBlocksDesc *d)
{
    if (use_device(d->id) == gpuSuccess)
        for (int i = 0; i < KVHAL_GPU_RING; i++) slot_release(&d->ring[i]);
    (void)gpuGetLastError();
    free(d);
}

/* Grows a slot to hold bytes (the caller has waited for its event). On failure the slot is left empty. */
kvhal_status slot_reserve(const Ctx *c, int32_t id, StagingSlot *s, size_t bytes)
{
    if (s->cap >= bytes) return KVHAL_OK;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < bytes) cap *= 2;
    if (s->host) (void)gpuFreeHost(s->host);
    if (s->dev) (void)gpuFree(s->dev);
    s->host = s->dev = NULL;
    s->cap = 0;
    if (alloc_fail(c)) return injected(c, id, "copy_blocks staging");
    void *h = NULL, *dv = NULL;
    gpuError_t e = gpuMallocHost(&h, cap);
    if (e == gpuSuccess) {
        e = gpuMalloc(&dv, cap);
        if (e != gpuSuccess) (void)gpuFreeHost(h);
    }
    if (e != gpuSuccess) return rt_fail(c, e, id, "copy_blocks staging");
    s->host = static_cast<char *>(h);
    s->dev = static_cast<char *>(dv);
    s->cap = cap;
    return KVHAL_OK;
}

size_t copy_blocks_bytes(const kvhal_bk_copy_blocks *a)
{
    return (size_t)a->num_caches * sizeof(CacheEntry) + (size_t)a->num_pairs * 2 * sizeof(int64_t);
}

/* The caller has allocated the device's error flag. */
kvhal_status copy_blocks_create(const Ctx *c, int32_t id, const kvhal_bk_copy_blocks *a, CopyBlocksDesc **out)
{
    void *mem = NULL;
    kvhal_status st = host_alloc(c, id, sizeof(CopyBlocksDesc), "copy_blocks descriptor", &mem);
    if (st != KVHAL_OK) return st;
    CopyBlocksDesc *d = static_cast<CopyBlocksDesc *>(mem);
    d->id = id;
    gpuError_t e = use_device(id);
    for (int i = 0; i < KVHAL_GPU_RING && e == gpuSuccess; i++) {
        e = gpuEventCreateWithFlags(&d->ring[i].ev, gpuEventDisableTiming);
        d->ring[i].has_ev = e == gpuSuccess;
    }
    if (e != gpuSuccess) {
        st = rt_fail(c, e, id, "copy_blocks descriptor");
        copy_blocks_destroy(d);
        return st;
    }
    /* The first slot is sized now, so that the first call of a cached descriptor does not allocate. */
    st = slot_reserve(c, id, &d->ring[0], copy_blocks_bytes(a));
    if (st != KVHAL_OK) {
        copy_blocks_destroy(d);
        return st;
    }
    *out = d;
    return KVHAL_OK;
}

} // namespace

/* Any number of caches and pairs: block ids out of range are skipped on the device (and flagged). */
bool copy_blocks_supports(Ctx *c, int32_t id, const kvhal_bk_copy_blocks *a, char *reason, size_t reason_size)
{
    (void)c;
    (void)id;
    (void)a;
    (void)reason;
    (void)reason_size;
    return true;
}

kvhal_status copy_blocks_desc_create(Ctx *c, int32_t id, const kvhal_bk_copy_blocks *a, void **desc)
{
    kvhal_status st = ensure_flag(c, id);
    if (st != KVHAL_OK) return st;
    CopyBlocksDesc *d = NULL;
    st = copy_blocks_create(c, id, a, &d);
    if (st == KVHAL_OK) *desc = d;
    return st;
}

void copy_blocks_desc_destroy(Ctx *c, int32_t id, void *desc)
{
    (void)c;
    (void)id;
    copy_blocks_destroy(static_cast<CopyBlocksDesc *>(desc));
}

kvhal_status gpu_copy_blocks(void *ctx, int32_t id, void *desc, const kvhal_bk_copy_blocks *a, void *stream)
{
    Ctx *c = ctx_of(ctx);
    if (a->num_pairs <= 0 || a->num_caches <= 0) return KVHAL_OK;
    CopyBlocksDesc *d = static_cast<CopyBlocksDesc *>(desc);
    if (!d) { /* a one-off descriptor */
        kvhal_status st = check_id(c, id);
        if (st == KVHAL_OK) st = ensure_flag(c, id);
        if (st == KVHAL_OK) st = copy_blocks_create(c, id, a, &d);
        if (st != KVHAL_OK) return st;
        st = gpu_copy_blocks(ctx, id, d, a, stream);
        copy_blocks_destroy(d);
        return st;
    }
    KVHAL_GPU_SETDEV(c, id);
    StagingSlot *sl = &d->ring[d->next];
    const gpuError_t q = gpuEventQuery(sl->ev);
    if (q == gpuErrorNotReady) KVHAL_GPU_TRY(c, gpuEventSynchronize(sl->ev), id, "copy_blocks staging wait");
    else if (q != gpuSuccess) return rt_fail(c, q, id, "copy_blocks staging query");
    const size_t need = copy_blocks_bytes(a);
    kvhal_status st = slot_reserve(c, id, sl, need);
    if (st != KVHAL_OK) return st;

    CacheEntry *ents = reinterpret_cast<CacheEntry *>(sl->host);
    int64_t largest = 0;
    for (int32_t i = 0; i < a->num_caches; i++) {
        ents[i].base = static_cast<char *>(a->natives[i]) + a->offsets[i];
        ents[i].stride = a->block_strides[i];
        ents[i].bytes = a->block_bytes[i];
        if (a->block_bytes[i] > largest) largest = a->block_bytes[i];
    }
    memcpy(sl->host + (size_t)a->num_caches * sizeof(CacheEntry), a->pairs,
           (size_t)a->num_pairs * 2 * sizeof(int64_t));
    if (largest <= 0) return KVHAL_OK;

    const gpuStream_t s = native_stream(stream);
    KVHAL_GPU_TRY(c, gpuMemcpyAsync(sl->dev, sl->host, need, gpuMemcpyHostToDevice, s), id, "copy_blocks upload");
    CopyBlocksParams p;
    p.caches = reinterpret_cast<const CacheEntry *>(sl->dev);
    p.pairs = reinterpret_cast<const int64_t *>(sl->dev + (size_t)a->num_caches * sizeof(CacheEntry));
    p.err = c->dev[id].dflag;
    p.num_blocks = a->num_blocks_min;
    p.chunks = (largest + KVHAL_GPU_CHUNK - 1) / KVHAL_GPU_CHUNK;
    p.total = (int64_t)a->num_pairs * a->num_caches * p.chunks;
    p.num_caches = a->num_caches;
    const int64_t cap = (int64_t)c->dev[id].sm_count * 32;
    const uint32_t grid = (uint32_t)(p.total < cap ? p.total : cap);
    copy_blocks_kernel<<<grid, KVHAL_GPU_THREADS, 0, s>>>(p);
    KVHAL_GPU_TRY(c, gpuGetLastError(), id, "copy_blocks launch");
    KVHAL_GPU_TRY(c, gpuEventRecord(sl->ev, s), id, "copy_blocks staging event");
    d->next = (d->next + 1) % KVHAL_GPU_RING;
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* copy_batch: ranges travel as kernel parameters, KVHAL_GPU_BATCH_MAX per launch (one launch for a duplicate). */
/* ------------------------------------------------------------------------------------------------------------ */
kvhal_status gpu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (a->count <= 0) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    const gpuStream_t s = native_stream(stream);
    CopyBatchParams p;
    int32_t i = 0;
    while (i < a->count) {
        p.count = 0;
        uint64_t chunks = 0;
        for (; i < a->count && p.count < KVHAL_GPU_BATCH_MAX; i++) {
            const uint64_t n = a->bytes[i];
            if (!n) continue;
            const uint64_t k = (n + KVHAL_GPU_CHUNK - 1) / KVHAL_GPU_CHUNK;
            if (chunks + k > 0x7fffffffu) {
                if (p.count == 0) /* one range alone too large for a grid: let the copy engine have it */
                    KVHAL_GPU_TRY(c, gpuMemcpyAsync(static_cast<char *>(a->dst[i]) + a->dst_offsets[i],
                                                    static_cast<const char *>(a->src[i]) + a->src_offsets[i], n,
                                                    gpuMemcpyDeviceToDevice, s),
                                  id, "copy_batch memcpy");
                else
                    break;
                continue;
            }
            p.dst[p.count] = static_cast<char *>(a->dst[i]) + a->dst_offsets[i];
            p.src[p.count] = static_cast<const char *>(a->src[i]) + a->src_offsets[i];
            p.bytes[p.count] = n;
            p.first[p.count] = (uint32_t)chunks;
            chunks += k;
            p.count++;
        }
        if (!p.count) continue;
        p.first[p.count] = (uint32_t)chunks;
        copy_batch_kernel<<<(uint32_t)chunks, KVHAL_GPU_THREADS, 0, s>>>(p);
        KVHAL_GPU_TRY(c, gpuGetLastError(), id, "copy_batch launch");
    }
    return KVHAL_OK;
}

} // namespace kvhal_gpu

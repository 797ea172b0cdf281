/* gpu_copy_blocks.cu — the copy_blocks op of the GPU backends and copy_batch, the batched byte-range copies behind
 * kv_cache_duplicate: both copy byte ranges on one device, with the kernels of kvhal_gpu_copy_kernels.cuh (a header
 * of their own, not templates, so that the HIP module can also compile them at run time: gpu_codepath.cu). */
#include <stdlib.h>
#include <string.h>

#include "gpu_private.h"
#include "kvhal_gpu_copy_kernels.cuh"

namespace kvhal_gpu {

namespace {

/* ------------------------------------------------------------------------------------------------------------ */
/* copy_blocks: the table of caches and the pairs travel in the kernel's parameters while they fit (one launch per */
/* group of pairs), else through a ring of pinned staging slots, each guarded by an event recorded after its      */
/* kernel, so a call never waits unless it laps a slot still in use. The upload before the kernel cost 10% of a   */
/* 256 MiB copy on an H100.                                                                                     */
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
    void *fn; /* the run-time compiled kernel (kernel_fn), else NULL: launched with <<<>>> */
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
    const DeviceGuard guard;
    if (guard.select(d->id) == gpuSuccess)
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

/* Whether a call's cache table and pairs travel in the kernel parameters (at least 16 pairs per launch beside the
 * table), not through a host staging slot: such a call allocates nothing and reads nothing a later call changes, so
 * it may be recorded into a graph. */
static bool copy_blocks_inline(const kvhal_bk_copy_blocks *a, int64_t *fit)
{
    *fit = ((int64_t)KVHAL_GPU_CB_INLINE_WORDS - 3 * (int64_t)a->num_caches) / 2;
    return *fit >= 16;
}

/* The caller has allocated the device's error flag. */
kvhal_status copy_blocks_create(Ctx *c, int32_t id, const kvhal_bk_copy_blocks *a, CopyBlocksDesc **out)
{
    void *fn = NULL;
    kvhal_status st = kernel_fn(c, id, "kvhal_gpu::copy_blocks_kernel", &fn);
    if (st != KVHAL_OK) return st;
    void *mem = NULL;
    st = host_alloc(c, id, sizeof(CopyBlocksDesc), "copy_blocks descriptor", &mem);
    if (st != KVHAL_OK) return st;
    CopyBlocksDesc *d = static_cast<CopyBlocksDesc *>(mem);
    d->id = id;
    d->fn = fn;
    const DeviceGuard guard;
    gpuError_t e = guard.select(id);
    for (int i = 0; i < KVHAL_GPU_RING && e == gpuSuccess; i++) {
        e = gpuEventCreateWithFlags(&d->ring[i].ev, gpuEventDisableTiming);
        d->ring[i].has_ev = e == gpuSuccess;
    }
    if (e != gpuSuccess) {
        st = rt_fail(c, e, id, "copy_blocks descriptor");
        copy_blocks_destroy(d);
        return st;
    }
    /* A staged shape's first slot is sized now, so that the first call of a cached descriptor does not allocate;
     * a shape whose pairs travel in the parameters never uses the ring. */
    int64_t fit;
    if (!copy_blocks_inline(a, &fit)) st = slot_reserve(c, id, &d->ring[0], copy_blocks_bytes(a));
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
    kvhal_status st = open_device(c, id);
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
    int64_t fit;
    const bool inline_table = copy_blocks_inline(a, &fit);
    if (!inline_table) {
        /* the pairs travel through a ring of host staging buffers reused by later calls: a graph replaying this
         * call would read whatever a later call left there, so a capture is refused instead of recorded wrongly */
        gpuStreamCaptureStatus capturing = gpuStreamCaptureStatusNone;
        const gpuError_t qe = gpuStreamIsCapturing(native_stream(stream), &capturing);
        if (qe != gpuSuccess) return rt_fail(c, qe, id, "copy_blocks: stream capture query");
        if (capturing != gpuStreamCaptureStatusNone)
            return fail(c, KVHAL_UNSUPPORTED,
                        "s: this copy_blocks cannot be recorded into a graph: with %d caches (more than %d) its "
                        "pairs are staged through host memory per call; call it outside the capture",
                        (int)a->num_caches, (int)((KVHAL_GPU_CB_INLINE_WORDS - 32) / 3));
    }
    CopyBlocksDesc *d = static_cast<CopyBlocksDesc *>(desc);
    if (!d) { /* a one-off descriptor */
        kvhal_status st = check_id(c, id);
        if (st == KVHAL_OK) st = open_device(c, id);
        if (st == KVHAL_OK) st = copy_blocks_create(c, id, a, &d);
        if (st != KVHAL_OK) return st;
        st = gpu_copy_blocks(ctx, id, d, a, stream);
        copy_blocks_destroy(d);
        return st;
    }
    KVHAL_GPU_SETDEV(c, id);
    int64_t largest = 0;
    for (int32_t i = 0; i < a->num_caches; i++)
        if (a->block_bytes[i] > largest) largest = a->block_bytes[i];
    if (largest <= 0) return KVHAL_OK;
    const gpuStream_t s = native_stream(stream);
    CopyBlocksParams p;
    memset(&p, 0, sizeof p); /* the parameter words past this call's table and pairs travel too: zeros, not garbage */
    p.err = c->dev[id].dflag;
    p.num_blocks = a->num_blocks_min;
    p.num_caches = a->num_caches;
    p.chunks = (largest + KVHAL_GPU_CHUNK - 1) / KVHAL_GPU_CHUNK;
    p.inline_table = inline_table; /* pairs per launch that fit beside the table: at least 16, else staged */
    StagingSlot *sl = NULL;
    if (p.inline_table) {
        p.caches = NULL;
        p.pairs = NULL;
        for (int32_t i = 0; i < a->num_caches; i++) {
            p.words[3 * i] = (uint64_t)(uintptr_t)(static_cast<char *>(a->natives[i]) + a->offsets[i]);
            p.words[3 * i + 1] = (uint64_t)a->block_strides[i];
            p.words[3 * i + 2] = (uint64_t)a->block_bytes[i];
        }
    } else {
        sl = &d->ring[d->next];
        const gpuError_t q = gpuEventQuery(sl->ev);
        if (q == gpuErrorNotReady) KVHAL_GPU_TRY(c, gpuEventSynchronize(sl->ev), id, "copy_blocks staging wait");
        else if (q != gpuSuccess) return rt_fail(c, q, id, "copy_blocks staging query");
        const size_t need = copy_blocks_bytes(a);
        const kvhal_status rs = slot_reserve(c, id, sl, need);
        if (rs != KVHAL_OK) return rs;
        CacheEntry *ents = reinterpret_cast<CacheEntry *>(sl->host);
        for (int32_t i = 0; i < a->num_caches; i++) {
            ents[i].base = static_cast<char *>(a->natives[i]) + a->offsets[i];
            ents[i].stride = a->block_strides[i];
            ents[i].bytes = a->block_bytes[i];
        }
        memcpy(sl->host + (size_t)a->num_caches * sizeof(CacheEntry), a->pairs,
               (size_t)a->num_pairs * 2 * sizeof(int64_t));
        KVHAL_GPU_TRY(c, gpuMemcpyAsync(sl->dev, sl->host, need, gpuMemcpyHostToDevice, s), id, "copy_blocks upload");
        p.caches = reinterpret_cast<const CacheEntry *>(sl->dev);
        p.pairs = reinterpret_cast<const int64_t *>(sl->dev + (size_t)a->num_caches * sizeof(CacheEntry));
    }
    /* one launch, or (parameters) one per group of fit pairs */
    const int64_t group = p.inline_table ? fit : (int64_t)a->num_pairs;
    for (int64_t first = 0; first < a->num_pairs; first += group) {
        const int64_t np = a->num_pairs - first < group ? a->num_pairs - first : group;
        if (p.inline_table)
            memcpy(&p.words[3 * a->num_caches], a->pairs + 2 * first, (size_t)np * 2 * sizeof(int64_t));
        p.num_pairs = (int32_t)np;
        p.total = np * a->num_caches * p.chunks;
        p.fast32 = p.total <= (int64_t)UINT32_MAX;
        if (p.fast32) {
            p.div_chunks = kvhal_fastdiv32_make((uint32_t)p.chunks);
            p.div_pairs = kvhal_fastdiv32_make((uint32_t)np);
        }
        /* one block per work item, as many as a launch takes */
        const uint32_t grid = (uint32_t)(p.total < 0x7fffffff ? p.total : 0x7fffffff);
        if (d->fn) {
            const kvhal_status st = launch_fn(c, id, d->fn, grid, KVHAL_GPU_THREADS, &p, s, "copy_blocks launch");
            if (st != KVHAL_OK) return st;
        } else {
            copy_blocks_kernel<<<grid, KVHAL_GPU_THREADS, 0, s>>>(p);
            KVHAL_GPU_TRY(c, gpuGetLastError(), id, "copy_blocks launch");
        }
    }
    if (!sl) return KVHAL_OK;
    KVHAL_GPU_TRY(c, gpuEventRecord(sl->ev, s), id, "copy_blocks staging event");
    d->next = (d->next + 1) % KVHAL_GPU_RING;
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* copy_batch: ranges travel as kernel parameters, KVHAL_GPU_BATCH_MAX per launch, or KVHAL_GPU_BATCH_LARGE where */
/* the build and the driver take 32 KB of parameters (one launch for a duplicate, or for a batch of pages received */
/* over IPC); a launch of at most KVHAL_GPU_BATCH_SMALL, _MID or _MAX ranges carries a struct of only that many    */
/* slots, launched through the driver where it could be resolved. With CUDA 12.8+ a batch whose ranges average     */
/* KVHAL_GPU_BATCH_MIN_CHUNK or more goes to the copy engines in one cudaMemcpyBatchAsync instead (streams that    */
/* take batch copies only). KVHAL_GPU_COPY_BATCH=kernel or =engines forces one way (where the stream allows it).   */
/* ------------------------------------------------------------------------------------------------------------ */
#if defined(KVHAL_GPU_BATCH_LARGE)
#define KVHAL_GPU_BATCH_CAP KVHAL_GPU_BATCH_LARGE
#else
#define KVHAL_GPU_BATCH_CAP KVHAL_GPU_BATCH_MAX
#endif
typedef CopyBatchRanges<KVHAL_GPU_BATCH_CAP> CopyBatchAll; /* what one launch gathers at most */

/* The first p.count ranges of p in a struct of N slots. */
template <int N> static CopyBatchRanges<N> narrow(const CopyBatchAll &p)
{
    CopyBatchRanges<N> q;
    const size_t k = (size_t)p.count;
    memcpy(q.dst, p.dst, k * sizeof *q.dst);
    memcpy(q.src, p.src, k * sizeof *q.src);
    memcpy(q.bytes, p.bytes, k * sizeof *q.bytes);
    memcpy(q.first, p.first, (k + 1) * sizeof *q.first);
    q.count = p.count;
    return q;
}

/* One launch of q: through the driver (dfn: its kernel as a driver function), else the runtime. */
template <int N> static kvhal_status launch_ranges(const Ctx *c, int32_t id, const CopyBatchRanges<N> &q,
                                                   uint32_t grid, gpuStream_t s, void *dfn)
{
#if !defined(KVHAL_GPU_HIP)
    if (dfn) {
        const kvhal_status st = driver_launch(c, id, dfn, grid, KVHAL_GPU_THREADS,
                                              const_cast<CopyBatchRanges<N> *>(&q), s, "copy_batch launch");
        if (st != KVHAL_BUSY) return st;
    }
#else
    (void)dfn;
#endif
    if constexpr (N == KVHAL_GPU_BATCH_MAX) copy_batch_kernel<<<grid, KVHAL_GPU_THREADS, 0, s>>>(q);
    else copy_batch_small_kernel<N><<<grid, KVHAL_GPU_THREADS, 0, s>>>(q);
    KVHAL_GPU_TRY(c, gpuGetLastError(), id, "copy_batch launch");
    return KVHAL_OK;
}

/* copy_batch's kernels on device id, selected (KVHAL_GPU_BATCH_SMALL, _MID, _MAX, _LARGE slots) as driver functions,
 * NULL where not resolvable (the runtime launches), resolved on the first call (a racing first call stores the
 * same); the return: ranges one launch may take (KVHAL_GPU_BATCH_LARGE where the driver takes 32 KB of parameters:
 * CUDA 12.1 and later). */
static int32_t batch_fns(Ctx *c, int32_t id, void *out[4])
{
    out[0] = out[1] = out[2] = out[3] = NULL;
#if !defined(KVHAL_GPU_HIP)
    DevState *ds = &c->dev[id];
    if (!__atomic_load_n(&ds->batch_fn_state, __ATOMIC_ACQUIRE)) {
        const void *sym[4] = {reinterpret_cast<const void *>(&copy_batch_small_kernel<KVHAL_GPU_BATCH_SMALL>),
                              reinterpret_cast<const void *>(&copy_batch_small_kernel<KVHAL_GPU_BATCH_MID>),
                              reinterpret_cast<const void *>(&copy_batch_kernel), nullptr};
        int large = 0;
#if defined(KVHAL_GPU_BATCH_LARGE)
        int driver = 0;
        large = cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12010;
        if (large) /* an older driver is never asked for the kernel of 32 KB parameters */
            sym[3] = reinterpret_cast<const void *>(&copy_batch_small_kernel<KVHAL_GPU_BATCH_LARGE>);
#endif
        for (int k = 0; k < 4; k++) {
            cudaFunction_t f = nullptr;
            void *v = sym[k] && c->cu_launch && cudaGetFuncBySymbol(&f, sym[k]) == cudaSuccess ? static_cast<void *>(f)
                                                                                              : nullptr;
            __atomic_store_n(&ds->batch_fn[k], v, __ATOMIC_RELAXED);
        }
        (void)cudaGetLastError();
        __atomic_store_n(&ds->batch_large, large, __ATOMIC_RELAXED);
        __atomic_store_n(&ds->batch_fn_state, 1, __ATOMIC_RELEASE);
    }
    for (int k = 0; k < 4; k++) out[k] = __atomic_load_n(&ds->batch_fn[k], __ATOMIC_RELAXED);
    return __atomic_load_n(&ds->batch_large, __ATOMIC_RELAXED) ? KVHAL_GPU_BATCH_CAP : KVHAL_GPU_BATCH_MAX;
#else
    (void)c;
    (void)id;
    return KVHAL_GPU_BATCH_MAX;
#endif
}

#if defined(KVHAL_GPU_MEMCPY_BATCH)
enum { BATCH_AUTO, BATCH_KERNEL, BATCH_ENGINES };
static int batch_mode() /* read once (a racing first read stores the same value; no thread-safe statics here) */
{
    static int mode = -1;
    int m = __atomic_load_n(&mode, __ATOMIC_RELAXED);
    if (m >= 0) return m;
    const char *v = secure_getenv("KVHAL_GPU_COPY_BATCH");
    m = v && !strcmp(v, "kernel") ? BATCH_KERNEL : v && !strcmp(v, "engines") ? BATCH_ENGINES : BATCH_AUTO;
    __atomic_store_n(&mode, m, __ATOMIC_RELAXED);
    return m;
}

/* The copy engines, where chosen: *done false (nothing enqueued) otherwise. */
static kvhal_status copy_batch_engines(const Ctx *c, int32_t id, const kvhal_bk_copy_batch *a, gpuStream_t s,
                                       bool *done)
{
    *done = false;
    const int mode = batch_mode();
    if (mode == BATCH_KERNEL) return KVHAL_OK;
    size_t n = 0;
    uint64_t total = 0;
    for (int32_t i = 0; i < a->count; i++) {
        n += a->bytes[i] != 0;
        total += a->bytes[i];
    }
    if (!n || (mode == BATCH_AUTO && total < (uint64_t)n * KVHAL_GPU_BATCH_MIN_CHUNK)) return KVHAL_OK;
    cudaError_t qe = cudaSuccess;
    if (!batch_stream(s, &qe)) {
        KVHAL_GPU_TRY(c, qe, id, "copy_batch capture query");
        return KVHAL_OK;
    }
    const BatchLists b(n);
    if (!b.ok())
        return fail(c, KVHAL_OUT_OF_MEMORY, "%s:%d: copy_batch: no host memory for %zu copy chunks", KVHAL_GPU_NAME,
                    (int)id, n);
    size_t k = 0;
    for (int32_t i = 0; i < a->count; i++) {
        if (!a->bytes[i]) continue;
        b.dst[k] = static_cast<char *>(a->dst[i]) + a->dst_offsets[i];
        b.src[k] = static_cast<const char *>(a->src[i]) + a->src_offsets[i];
        b.len[k] = a->bytes[i];
        k++;
    }
    const cudaError_t e = b.copy(n, s);
    KVHAL_GPU_TRY(c, e, id, "copy_batch batch copy");
    *done = true;
    return KVHAL_OK;
}
#endif

kvhal_status gpu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (a->count <= 0) return KVHAL_OK;
    void *fn = NULL; /* the run-time compiled kernel (found in the device's list after its first use) */
    st = kernel_fn(c, id, "kvhal_gpu::copy_batch_kernel", &fn);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    const gpuStream_t s = native_stream(stream);
#if defined(KVHAL_GPU_MEMCPY_BATCH)
    {
        bool done = false;
        st = copy_batch_engines(c, id, a, s, &done);
        if (st != KVHAL_OK || done) return st;
    }
#endif
    void *dfn[4] = {NULL, NULL, NULL, NULL};
    const int32_t per = fn ? KVHAL_GPU_BATCH_MAX : batch_fns(c, id, dfn); /* ranges a launch takes */
    CopyBatchAll p;
    int32_t i = 0;
    while (i < a->count) {
        p.count = 0;
        uint64_t chunks = 0;
        for (; i < a->count && p.count < per; i++) {
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
        const uint32_t grid = (uint32_t)chunks;
        if (fn) { /* the run-time compiled kernel: copy_batch_kernel's struct */
            CopyBatchParams q = narrow<KVHAL_GPU_BATCH_MAX>(p);
            st = launch_fn(c, id, fn, grid, KVHAL_GPU_THREADS, &q, s, "copy_batch launch");
        } else if (p.count <= KVHAL_GPU_BATCH_SMALL) {
            st = launch_ranges(c, id, narrow<KVHAL_GPU_BATCH_SMALL>(p), grid, s, dfn[0]);
        } else if (p.count <= KVHAL_GPU_BATCH_MID) {
            st = launch_ranges(c, id, narrow<KVHAL_GPU_BATCH_MID>(p), grid, s, dfn[1]);
        } else if (p.count <= KVHAL_GPU_BATCH_MAX) {
            st = launch_ranges(c, id, narrow<KVHAL_GPU_BATCH_MAX>(p), grid, s, dfn[2]);
        } else {
#if defined(KVHAL_GPU_BATCH_LARGE)
            st = launch_ranges(c, id, p, grid, s, dfn[3]);
#endif
        }
        if (st != KVHAL_OK) return st;
    }
    return KVHAL_OK;
}

#if defined(KVHAL_GPU_RTC)
void copy_blocks_rtc_exprs(RtcExprFn add, void *user)
{
    add(user, "kvhal_gpu::copy_blocks_kernel");
    add(user, "kvhal_gpu::copy_batch_kernel"); /* kv_cache_duplicate's batched copy */
}
#endif

const void *copy_blocks_one_kernel(void) { return reinterpret_cast<const void *>(copy_blocks_kernel); }

} // namespace kvhal_gpu

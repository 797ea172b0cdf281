/* gpu_page_transfer.cu — page_transfer on the GPU backends: whole pages between the device caches and host pages.
 * Host memory from this module's host_alloc is mapped pinned memory, which a kernel reads and writes directly over
 * the bus: one launch moves every (page, cache) block of up to KVHAL_GPU_PT_PAIRS pages and KVHAL_GPU_PT_CACHES
 * caches, with the pages and caches travelling as kernel parameters (no staging copy, nothing to wait for, so the
 * call may be captured in a graph). Plain host memory goes through one runtime copy per block instead (pageable
 * copies, which the runtime stages). No descriptor.
 * CUDA 12.8+ (compile time): pinned host pages go through the copy engines instead, with cudaMemcpyBatchAsync (one
 * call for every (page, cache) block, adjacent blocks on both sides coalesced into one chunk), which reaches the
 * bandwidth of a plain pinned cudaMemcpy where the kernel's mapped-memory accesses do not. The kernel stays for
 * HIP, for chunks under 256 KiB on average (the copy engines' per-chunk cost), the legacy default stream (which batch copies refuse: a NULL stream here) and for a stream being
 * captured into a graph (nothing is assumed of batch copies in a graph), so the op stays capture-safe. */
#include <stdlib.h>

#include "gpu_private.h"
#include "kvhal_gpu_page_kernels.cuh"

#if defined(KVHAL_GPU_MEMCPY_BATCH)
#define KVHAL_GPU_PT_BATCH 1
#endif

namespace kvhal_gpu {

bool page_transfer_supports(Ctx *c, int32_t id, const kvhal_bk_page_transfer *a, char *reason, size_t reason_size)
{
    (void)c;
    (void)id;
    if (a->num_caches < 1 || a->num_pairs < 0 || a->block_bytes < 0)
        return kvhal_bk_refuse(reason, reason_size, "page_transfer of %d caches and %d pairs", (int)a->num_caches,
                               (int)a->num_pairs);
    return true;
}

kvhal_status page_transfer_desc_create(Ctx *c, int32_t id, const kvhal_bk_page_transfer *a, void **desc)
{
    (void)c;
    (void)id;
    (void)a;
    *desc = NULL; /* nothing depends on metadata alone */
    return KVHAL_OK;
}

void page_transfer_desc_destroy(Ctx *c, int32_t id, void *desc)
{
    (void)c;
    (void)id;
    (void)desc;
}

/* Plain host memory: one runtime copy per block. */
static kvhal_status transfer_pageable(const Ctx *c, int32_t id, const kvhal_bk_page_transfer *a, gpuStream_t s)
{
    const size_t bytes = (size_t)a->block_bytes;
    char *host = static_cast<char *>(a->host) + a->host_offset;
    for (int32_t p = 0; p < a->num_pairs; p++) {
        char *page = host + a->pairs[2 * p + 1] * a->host_page_bytes;
        for (int32_t k = 0; k < a->num_caches; k++) {
            char *dev = static_cast<char *>(a->natives[k]) + a->offsets[k] + a->pairs[2 * p] * a->block_strides[k];
            char *h = page + (size_t)k * bytes;
            KVHAL_GPU_TRY(c, gpuMemcpyAsync(a->to_host ? h : dev, a->to_host ? dev : h, bytes,
                                            a->to_host ? gpuMemcpyDeviceToHost : gpuMemcpyHostToDevice, s),
                          id, "page_transfer copy");
        }
    }
    return KVHAL_OK;
}

#if defined(KVHAL_GPU_PT_BATCH)
/* Below KVHAL_GPU_BATCH_MIN_CHUNK bytes per chunk (after coalescing) the copy engines' per-chunk cost dominates: the
 * kernel does better, and its one launch per 128 pages costs the host far less than a batch of thousands of small
 * chunks. Measured on an H100: llama3-8b layer-first 32 KiB chunks through the batch reached 0.43-0.45 of pinned
 * memcpy, page-first 2 MiB chunks 0.97-0.99; a chunk costs the copy engines about 0.8 us, so 0.85 of the bus needs
 * chunks of about 256 KiB. */
#define KVHAL_GPU_PT_BATCH_MIN_CHUNK KVHAL_GPU_BATCH_MIN_CHUNK

/* Pinned host pages through the copy engines: every (page, cache) block one chunk, merged with the previous one
 * when both its source and its destination follow it directly. *done false (nothing enqueued) when the chunks
 * are too small for the copy engines. */
static kvhal_status transfer_batch(const Ctx *c, int32_t id, const kvhal_bk_page_transfer *a, gpuStream_t s,
                                   bool *done)
{
    *done = false;
    const size_t bytes = (size_t)a->block_bytes, max = (size_t)a->num_pairs * (size_t)a->num_caches;
    if (bytes < KVHAL_GPU_PT_BATCH_MIN_CHUNK) { /* small blocks: only worth it where a page's blocks coalesce */
        size_t runs = 1;
        for (int32_t k = 1; k < a->num_caches; k++)
            runs += static_cast<const char *>(a->natives[k]) + a->offsets[k] !=
                    static_cast<const char *>(a->natives[k - 1]) + a->offsets[k - 1] + bytes;
        if ((size_t)a->num_caches * bytes < runs * (size_t)KVHAL_GPU_PT_BATCH_MIN_CHUNK) return KVHAL_OK;
    }
    const BatchLists b(max);
    if (!b.ok())
        return fail(c, KVHAL_OUT_OF_MEMORY, "%s:%d: page_transfer: no host memory for %zu copy chunks", KVHAL_GPU_NAME,
                    (int)id, max);
    char *host = static_cast<char *>(a->host) + a->host_offset;
    size_t n = 0;
    for (int32_t p = 0; p < a->num_pairs; p++) {
        char *page = host + a->pairs[2 * p + 1] * a->host_page_bytes;
        for (int32_t k = 0; k < a->num_caches; k++) {
            char *dev = static_cast<char *>(a->natives[k]) + a->offsets[k] + a->pairs[2 * p] * a->block_strides[k];
            char *h = page + (size_t)k * bytes;
            char *d = a->to_host ? h : dev;
            const char *sc = a->to_host ? dev : h;
            if (n && static_cast<char *>(b.dst[n - 1]) + b.len[n - 1] == d &&
                static_cast<const char *>(b.src[n - 1]) + b.len[n - 1] == sc) {
                b.len[n - 1] += bytes;
                continue;
            }
            b.dst[n] = d;
            b.src[n] = sc;
            b.len[n] = bytes;
            n++;
        }
    }
    if ((size_t)a->num_pairs * (size_t)a->num_caches * bytes < n * (size_t)KVHAL_GPU_PT_BATCH_MIN_CHUNK)
        return KVHAL_OK;
    const cudaError_t e = b.copy(n, s);
    KVHAL_GPU_TRY(c, e, id, "page_transfer batch copy");
    *done = true;
    return KVHAL_OK;
}
#endif

kvhal_status gpu_page_transfer(void *ctx, int32_t id, void *desc, const kvhal_bk_page_transfer *a, void *stream)
{
    (void)desc;
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (a->num_pairs <= 0 || a->block_bytes <= 0) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    const gpuStream_t s = native_stream(stream);
    if (!a->host_pinned) return transfer_pageable(c, id, a, s);
#if defined(KVHAL_GPU_PT_BATCH)
    /* batch copies refuse the legacy default stream (the device's default here): the kernel serves it */
    cudaError_t qe = cudaSuccess;
    if (batch_stream(s, &qe)) {
        bool done = false;
        st = transfer_batch(c, id, a, s, &done);
        if (st != KVHAL_OK || done) return st;
    }
    KVHAL_GPU_TRY(c, qe, id, "page_transfer capture query");
#endif
    void *fn = NULL; /* the run-time compiled kernel (kernel_fn), else NULL: launched with <<<>>> */
    st = kernel_fn(c, id, "kvhal_gpu::page_transfer_kernel", &fn);
    if (st != KVHAL_OK) return st;
    void *dhost = NULL;
    KVHAL_GPU_TRY(c, gpuHostGetDevicePointer(&dhost, a->host, 0), id, "page_transfer host mapping");
    PageTransferParams p;
    p.page_bytes = a->host_page_bytes;
    p.block_bytes = a->block_bytes;
    p.chunks = (a->block_bytes + KVHAL_GPU_CHUNK - 1) / KVHAL_GPU_CHUNK;
    p.to_host = a->to_host ? 1 : 0;
    const int64_t cap = (int64_t)c->dev[id].sm_count * 32;
    for (int32_t c0 = 0; c0 < a->num_caches; c0 += KVHAL_GPU_PT_CACHES) {
        p.num_caches = a->num_caches - c0 < KVHAL_GPU_PT_CACHES ? a->num_caches - c0 : KVHAL_GPU_PT_CACHES;
        for (int32_t k = 0; k < p.num_caches; k++) {
            p.base[k] = static_cast<char *>(a->natives[c0 + k]) + a->offsets[c0 + k];
            p.stride[k] = a->block_strides[c0 + k];
        }
        p.host = static_cast<char *>(dhost) + a->host_offset + (size_t)c0 * (size_t)a->block_bytes;
        for (int32_t p0 = 0; p0 < a->num_pairs; p0 += KVHAL_GPU_PT_PAIRS) {
            p.num_pairs = a->num_pairs - p0 < KVHAL_GPU_PT_PAIRS ? a->num_pairs - p0 : KVHAL_GPU_PT_PAIRS;
            for (int32_t i = 0; i < p.num_pairs; i++) {
                p.block[i] = a->pairs[2 * (p0 + i)];
                p.page[i] = a->pairs[2 * (p0 + i) + 1];
            }
            p.total = (int64_t)p.num_pairs * p.num_caches * p.chunks;
            const uint32_t grid = (uint32_t)(p.total < cap ? p.total : cap);
            if (fn) {
                st = launch_fn(c, id, fn, grid, KVHAL_GPU_THREADS, &p, s, "page_transfer launch");
                if (st != KVHAL_OK) return st;
                continue;
            }
            page_transfer_kernel<<<grid, KVHAL_GPU_THREADS, 0, s>>>(p);
            KVHAL_GPU_TRY(c, gpuGetLastError(), id, "page_transfer launch");
        }
    }
    return KVHAL_OK;
}

const void *page_transfer_one_kernel(void) { return reinterpret_cast<const void *>(page_transfer_kernel); }

} // namespace kvhal_gpu

#if defined(KVHAL_GPU_RTC)
namespace kvhal_gpu {
void page_transfer_rtc_exprs(RtcExprFn add, void *user) { add(user, "kvhal_gpu::page_transfer_kernel"); }
} // namespace kvhal_gpu
#endif

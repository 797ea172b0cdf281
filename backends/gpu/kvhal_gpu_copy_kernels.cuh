/* kvhal_gpu_copy_kernels.cuh — the byte-range copy kernels of copy_blocks and copy_batch (launched from
 * gpu_copy_blocks.cu). Not templates: this header is included by that one file only, and is part of the kernel
 * source the HIP module compiles at run time for a GPU that has no embedded code object (gpu_codepath.cu), so it
 * includes nothing but kvhal_gpu_kernels.cuh. */
#ifndef KVHAL_GPU_COPY_KERNELS_CUH
#define KVHAL_GPU_COPY_KERNELS_CUH

#include "kvhal_gpu_kernels.cuh"

namespace kvhal_gpu {

/* copy_units / copy_range (the widest unit dividing addresses and length) are in kvhal_gpu_kernels.cuh: the
 * page-transfer kernel uses them too. */

/* copy_blocks: one table entry per cache. The table and the pairs travel in the kernel's parameters (words), as many
 * pairs per launch as fit; with more caches than the parameters hold they are uploaded through the descriptor's
 * staging ring (caches, pairs). */
struct CacheEntry {
    char *base;     /* block 0 */
    int64_t stride; /* bytes between blocks */
    int64_t bytes;  /* bytes of one block */
};

#define KVHAL_GPU_CB_INLINE_WORDS 448 /* 3.5 KiB: the parameters stay within the 4 KiB every target accepts */

struct CopyBlocksParams {
    const CacheEntry *caches;
    const int64_t *pairs; /* (src, dst) */
    volatile uint8_t *err;
    int64_t num_blocks;
    int64_t chunks;      /* work items per (pair, cache) */
    int64_t total;       /* num_pairs * num_caches * chunks */
    int32_t num_caches;
    int32_t num_pairs;
    int32_t fast32;      /* total < 2^32: items split with div_chunks and div_pairs */
    kvhal_fastdiv32 div_chunks, div_pairs; /* by chunks; by num_pairs */
    int32_t inline_table; /* the table and this launch's pairs are in words (3 per cache: base, stride, bytes; then 2
                             per pair), not behind caches and pairs */
    uint64_t words[KVHAL_GPU_CB_INLINE_WORDS];
};

static_assert(sizeof(CopyBlocksParams) <= 4096, "copy_blocks parameters exceed 4 KiB");

/* Work item w is chunk w % chunks of job w / chunks, a job being one (cache, pair), caches major: consecutive blocks
 * copy one cache's blocks for consecutive pairs. The host launches one block per item (the loop runs once, unless a
 * launch has more items than a grid takes).
 * KVHAL_GPU_GRID_CONSTANT: the table in the parameters is indexed at run time, and read where it is. */
__global__ void __launch_bounds__(KVHAL_GPU_THREADS) copy_blocks_kernel(const KVHAL_GPU_GRID_CONSTANT CopyBlocksParams p)
{
    for (int64_t w = blockIdx.x; w < p.total; w += gridDim.x) {
        int64_t chunk, pair;
        int32_t c;
        if (p.fast32) {
            const uint32_t w32 = (uint32_t)w, j = kvhal_fastdiv32_div(w32, p.div_chunks);
            const uint32_t o = kvhal_fastdiv32_div(j, p.div_pairs);
            chunk = (int64_t)(w32 - j * p.div_chunks.d);
            c = (int32_t)o;
            pair = (int64_t)(j - o * p.div_pairs.d);
        } else {
            const int64_t job = w / p.chunks;
            chunk = w - job * p.chunks;
            c = (int32_t)(job / p.num_pairs);
            pair = job - (int64_t)c * p.num_pairs;
        }
        CacheEntry e; /* loaded together with the pair, not after its check */
        int64_t src, dst;
        if (p.inline_table) {
            e.base = reinterpret_cast<char *>(p.words[3 * c]);
            e.stride = (int64_t)p.words[3 * c + 1];
            e.bytes = (int64_t)p.words[3 * c + 2];
            src = (int64_t)p.words[3 * p.num_caches + 2 * pair];
            dst = (int64_t)p.words[3 * p.num_caches + 2 * pair + 1];
        } else {
            e = p.caches[c];
            src = p.pairs[2 * pair];
            dst = p.pairs[2 * pair + 1];
        }
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

/* copy_batch: up to N ranges by value; range r owns chunks [first[r], first[r + 1]). The launch carries the whole
 * struct whatever the count, so small batches go with a smaller N (the host's launch writes fewer parameter bytes). */
template <int N> struct CopyBatchRanges {
    char *dst[N];
    const char *src[N];
    uint64_t bytes[N];
    uint32_t first[N + 1];
    int32_t count;
};
typedef CopyBatchRanges<KVHAL_GPU_BATCH_MAX> CopyBatchParams;

template <class P> __device__ __forceinline__ void copy_batch_block(const P &p)
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

__global__ void __launch_bounds__(KVHAL_GPU_THREADS) copy_batch_kernel(const CopyBatchParams p)
{
    copy_batch_block(p);
}

/* The same for batches of at most N ranges (KVHAL_GPU_BATCH_SMALL): launched with <<<>>> only (the run-time
 * compiled path launches copy_batch_kernel). */
template <int N> __global__ void __launch_bounds__(KVHAL_GPU_THREADS) copy_batch_small_kernel(const CopyBatchRanges<N> p)
{
    copy_batch_block(p);
}

} // namespace kvhal_gpu

#endif /* KVHAL_GPU_COPY_KERNELS_CUH */

/* kvhal_gpu_page_kernels.cuh — the page-transfer kernel (launched from gpu_page_transfer.cu): whole device cache
 * blocks to and from host pages in mapped pinned memory. Not a template: this header is included by that one file
 * only, and is part of the kernel source the HIP module compiles at run time (gpu_codepath.cu), so it includes
 * nothing but kvhal_gpu_kernels.cuh. */
#ifndef KVHAL_GPU_PAGE_KERNELS_CUH
#define KVHAL_GPU_PAGE_KERNELS_CUH

#include "kvhal_gpu_kernels.cuh"

namespace kvhal_gpu {

#define KVHAL_GPU_PT_CACHES 64 /* caches per launch: 32 layers' K and V */
#define KVHAL_GPU_PT_PAIRS 128 /* pages per launch; with the caches, 3 KB of parameters (4 KB allowed) */

struct PageTransferParams {
    char *base[KVHAL_GPU_PT_CACHES];     /* block 0 of each cache */
    int64_t stride[KVHAL_GPU_PT_CACHES]; /* bytes between blocks */
    int64_t block[KVHAL_GPU_PT_PAIRS];   /* device block of each page */
    int64_t page[KVHAL_GPU_PT_PAIRS];    /* host page */
    char *host;                          /* device address of the host pages, at the group's first cache */
    int64_t page_bytes, block_bytes, chunks, total;
    int32_t num_caches, num_pairs, to_host;
};

__global__ void __launch_bounds__(KVHAL_GPU_THREADS) page_transfer_kernel(const PageTransferParams p)
{
    for (int64_t w = blockIdx.x; w < p.total; w += gridDim.x) {
        const int64_t item = w / p.chunks, chunk = w - item * p.chunks;
        const int64_t pair = item / p.num_caches;
        const int32_t c = (int32_t)(item - pair * p.num_caches);
        const int64_t begin = chunk * KVHAL_GPU_CHUNK;
        const int64_t len = p.block_bytes - begin < KVHAL_GPU_CHUNK ? p.block_bytes - begin : KVHAL_GPU_CHUNK;
        char *dev = p.base[c] + p.block[pair] * p.stride[c] + begin;
        char *host = p.host + p.page[pair] * p.page_bytes + (int64_t)c * p.block_bytes + begin;
        if (p.to_host) copy_range(host, dev, (uint64_t)len);
        else copy_range(dev, host, (uint64_t)len);
    }
}

} // namespace kvhal_gpu

#endif /* KVHAL_GPU_PAGE_KERNELS_CUH */

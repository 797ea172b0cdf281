// Session 10, issue 15: can a copy kernel reach the driver's cudaMemcpy on Hopper?  Standalone probe (not part of
// the library): scatters token rows (rows of R bytes, contiguous input) into slots drawn as a random permutation over
// a cache 4x the token count, cold (L2 flushed by a 256 MiB memset before every op), timed with events, against
// cudaMemcpyAsync of the same bytes in the same process, rounds interleaved.  Kernels:
//   ldst   : one warp per row, 16-byte loads/stores (what kvhal's row kernels do, without the paging arithmetic)
//   ldst_u : ldst with every lane's loads issued before its stores across UNROLL rows
//   tma    : Hopper bulk copies (cp.async.bulk global -> shared -> global), a ring of STAGES stages of ROWS rows per
//            block, one warp issuing; loads of stage i+STAGES-1 in flight while stage i is stored
//   tma_c  : tma over a contiguous destination (the memcpy's pattern, no scatter)
// Build: nvcc -O3 -arch=sm_90 -o tma_probe tma_probe.cu
// Usage: tma_probe ROW_BYTES TOKENS [SIDES]    (SIDES 2: K and V, each its own input and cache)
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <random>
#include <cstring>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void ldst(const uint4 *__restrict__ in, uint4 *__restrict__ cache, const int64_t *__restrict__ slots,
                     int tokens, int row16)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    int nw = (gridDim.x * blockDim.x) >> 5;
    for (int t = warp; t < tokens; t += nw) {
        const int64_t s = slots[t];
        const uint4 *src = in + (size_t)t * row16;
        uint4 *dst = cache + (size_t)s * row16;
        for (int i = lane; i < row16; i += 32) dst[i] = src[i];
    }
}

template <int U>
__global__ void ldst_u(const uint4 *__restrict__ in, uint4 *__restrict__ cache, const int64_t *__restrict__ slots,
                       int tokens, int row16)
{
    // one block of 128 threads handles U * 4 tokens' units as a flat list: unit u of the block's range
    const long total = (long)tokens * row16;
    const long per_block = (long)blockDim.x * U;
    for (long base = (long)blockIdx.x * per_block; base < total; base += (long)gridDim.x * per_block) {
        uint4 v[U];
        long idx[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            long u = base + threadIdx.x + (long)k * blockDim.x;
            idx[k] = u;
            if (u < total) v[k] = __ldcs(in + u);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            long u = idx[k];
            if (u < total) {
                long t = u / row16, r = u - t * row16;
                __stcs(cache + slots[t] * row16 + r, v[k]);
            }
        }
    }
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int STAGES>
__global__ void tma(const char *__restrict__ in, char *__restrict__ cache, const int64_t *__restrict__ slots,
                    int tokens, int row, int rows_per_stage, int contiguous)
{
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) char smem[];
    __shared__ __align__(8) uint64_t bar[STAGES];
    const int lane = threadIdx.x;
    const int stage_bytes = rows_per_stage * row;
    if (lane == 0)
        for (int s = 0; s < STAGES; s++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncwarp();
    const int nbatch = (tokens + rows_per_stage - 1) / rows_per_stage;
    // batches of this block: b = blockIdx.x + i * gridDim.x
    int my = 0;
    for (int b = blockIdx.x; b < nbatch; b += gridDim.x) my++;
    auto issue_load = [&](int i) {
        const int b = blockIdx.x + i * gridDim.x;
        const int s = i % STAGES;
        const int t0 = b * rows_per_stage;
        const int n = min(rows_per_stage, tokens - t0);
        if (lane == 0)
            asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(smem_u32(&bar[s])),
                         "r"(n * row) : "memory");
        __syncwarp();
        // one bulk load of the batch's rows (the input is contiguous)
        if (lane == 0)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
                             "r"(smem_u32(smem + s * stage_bytes)),
                         "l"(in + (size_t)t0 * row), "r"(n * row), "r"(smem_u32(&bar[s])) : "memory");
    };
    for (int i = 0; i < STAGES - 1 && i < my; i++) issue_load(i);
    for (int i = 0; i < my; i++) {
        const int s = i % STAGES;
        const uint32_t parity = (i / STAGES) & 1;
        uint32_t done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(smem_u32(&bar[s])), "r"(parity) : "memory");
        const int b = blockIdx.x + i * gridDim.x;
        const int t0 = b * rows_per_stage;
        const int n = min(rows_per_stage, tokens - t0);
        for (int r = lane; r < n; r += 32) {
            const int64_t dst = contiguous ? (int64_t)(t0 + r) : slots[t0 + r];
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(cache + dst * row),
                         "r"(smem_u32(smem + s * stage_bytes + r * row)), "r"(row) : "memory");
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        // the next load goes to stage (i + STAGES - 1) % STAGES = (i - 1) % STAGES: its stores (group of i - 1)
        // must have read shared memory; this one (group i) may still be in flight
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        __syncwarp();
        if (i + STAGES - 1 < my) issue_load(i + STAGES - 1);
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

int main(int argc, char **argv)
{
    const int row = argc > 1 ? atoi(argv[1]) : 2048;
    const int tokens = argc > 2 ? atoi(argv[2]) : 8192;
    const int sides = argc > 3 ? atoi(argv[3]) : 2;
    const int rounds = 7;
    const size_t in_bytes = (size_t)row * tokens, cache_bytes = in_bytes * 4;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    char *in[2], *cache[2], *dst[2], *flush;
    int64_t *slots;
    for (int k = 0; k < sides; k++) {
        CK(cudaMalloc(&in[k], in_bytes));
        CK(cudaMalloc(&cache[k], cache_bytes));
        CK(cudaMalloc(&dst[k], in_bytes));
        CK(cudaMemset(in[k], 1 + k, in_bytes));
    }
    CK(cudaMalloc(&flush, 256 << 20));
    CK(cudaMalloc(&slots, sizeof(int64_t) * tokens));
    std::vector<int64_t> perm((size_t)tokens * 4);
    for (size_t i = 0; i < perm.size(); i++) perm[i] = (int64_t)i;
    std::mt19937_64 rng(42);
    std::shuffle(perm.begin(), perm.end(), rng);
    CK(cudaMemcpy(slots, perm.data(), sizeof(int64_t) * tokens, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    struct Cfg { const char *name; int kind; int a, b; };
    // kind 0 memcpy, 1 ldst (a = blocks per SM), 2 ldst_u<4>, 3 ldst_u<8>, 4 tma<STAGES=a> rows b, 5 tma contiguous
    std::vector<Cfg> cfgs = {
        {"memcpy", 0, 0, 0},
        {"ldst", 1, 16, 0},
        {"ldst_u4", 2, 0, 0},
        {"ldst_u8", 3, 0, 0},
    };
    const int rows_opts[] = {4, 8, 16};
    const int stage_opts[] = {2, 3, 4};
    static char names[64][48];
    int nn = 0;
    for (int st : stage_opts)
        for (int rp : rows_opts) {
            if ((size_t)st * rp * row > 200 * 1024) continue;
            snprintf(names[nn], 48, "tma_s%d_r%d", st, rp);
            cfgs.push_back({names[nn++], 4, st, rp});
        }
    for (int st : {3, 4}) {
        int rp = std::max(1, 32768 / row);
        snprintf(names[nn], 48, "tma_c_s%d_r%d", st, rp);
        cfgs.push_back({names[nn++], 5, st, rp});
    }
    for (int st = 2; st <= 4; st++) {
        auto f = st == 2 ? (void *)tma<2> : st == 3 ? (void *)tma<3> : (void *)tma<4>;
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 210 * 1024));
    }
    std::vector<std::vector<float>> ms(cfgs.size());
    auto run = [&](const Cfg &c) {
        for (int k = 0; k < sides; k++) {
            switch (c.kind) {
            case 0: CK(cudaMemcpyAsync(dst[k], in[k], in_bytes, cudaMemcpyDeviceToDevice)); break;
            case 1: ldst<<<sms * c.a, 128>>>((const uint4 *)in[k], (uint4 *)cache[k], slots, tokens, row / 16); break;
            case 2: ldst_u<4><<<sms * 8, 128>>>((const uint4 *)in[k], (uint4 *)cache[k], slots, tokens, row / 16); break;
            case 3: ldst_u<8><<<sms * 8, 128>>>((const uint4 *)in[k], (uint4 *)cache[k], slots, tokens, row / 16); break;
            case 4:
            case 5: {
                const int st = c.a, rp = c.b;
                const size_t sm = (size_t)st * rp * row;
                const int per_sm = std::max(1, std::min(8, (int)(220 * 1024 / (sm + 1024))));
                const int grid = sms * per_sm;
                const int contiguous = c.kind == 5;
                char *d = contiguous ? dst[k] : cache[k];
                if (st == 2) tma<2><<<grid, 32, sm>>>(in[k], d, slots, tokens, row, rp, contiguous);
                else if (st == 3) tma<3><<<grid, 32, sm>>>(in[k], d, slots, tokens, row, rp, contiguous);
                else tma<4><<<grid, 32, sm>>>(in[k], d, slots, tokens, row, rp, contiguous);
                break;
            }
            }
        }
    };
    // correctness: each kernel's cache rows equal the input rows
    std::vector<char> h(in_bytes), hin(in_bytes);
    for (size_t ci = 1; ci < cfgs.size(); ci++) {
        for (int k = 0; k < sides; k++) {
            CK(cudaMemset(cache[k], 0, cache_bytes));
            CK(cudaMemset(dst[k], 0, in_bytes));
            std::vector<char> pat(in_bytes);
            for (size_t i = 0; i < in_bytes; i++) pat[i] = (char)(i * 131 + ci * 7 + k);
            CK(cudaMemcpy(in[k], pat.data(), in_bytes, cudaMemcpyHostToDevice));
        }
        run(cfgs[ci]);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        for (int k = 0; k < sides; k++) {
            CK(cudaMemcpy(hin.data(), in[k], in_bytes, cudaMemcpyDeviceToHost));
            bool bad = false;
            if (cfgs[ci].kind == 5) {
                CK(cudaMemcpy(h.data(), dst[k], in_bytes, cudaMemcpyDeviceToHost));
                bad = h != hin;
            } else {
                std::vector<char> c(cache_bytes);
                CK(cudaMemcpy(c.data(), cache[k], cache_bytes, cudaMemcpyDeviceToHost));
                for (int t = 0; t < tokens && !bad; t++)
                    bad = memcmp(c.data() + perm[t] * row, hin.data() + (size_t)t * row, row) != 0;
            }
            if (bad) printf("MISMATCH %s side %d\n", cfgs[ci].name, k);
        }
    }
    for (int r = 0; r < rounds; r++)
        for (size_t ci = 0; ci < cfgs.size(); ci++) {
            CK(cudaMemsetAsync(flush, r, 256 << 20));
            CK(cudaEventRecord(e0));
            run(cfgs[ci]);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms[ci].push_back(t);
        }
    CK(cudaGetLastError());
    std::vector<float> med(cfgs.size());
    for (size_t ci = 0; ci < cfgs.size(); ci++) {
        auto v = ms[ci];
        std::sort(v.begin(), v.end());
        med[ci] = v[v.size() / 2];
    }
    printf("# %s sms=%d row=%d tokens=%d sides=%d bytes/side=%zu rounds=%d (cold, median)\n", prop.name, sms, row,
           tokens, sides, in_bytes, rounds);
    for (size_t ci = 0; ci < cfgs.size(); ci++)
        printf("%-16s %8.1f us  %7.3f TB/s  ratio %.3f\n", cfgs[ci].name, med[ci] * 1e3,
               2.0 * sides * in_bytes / (med[ci] * 1e-3) / 1e12, med[0] / med[ci]);
    return 0;
}

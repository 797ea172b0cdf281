/* gpu_ceiling.cu — what the benchmarks measure against (the module's extras, kvhal_backend.h). "kvhal_gpu_scatter_rows", the copy ceiling: the
 * rows a paged-caching call moves, copied by the SMs with nothing else done (16-byte loads, the output's bytes kept
 * as wide stores), so that kvhal-bench can set each paged-caching row against what a copy of the same scattered rows
 * reaches on the same device, in the same run. "kvhal_gpu_spin": a kernel of a chosen duration (kvhal-xfer --stream's
 * simulated prefill). Not ops: no descriptor, no checks against buffers, no error flag. */
#include "gpu_private.h"

namespace kvhal_gpu {
namespace {

/* R = in_elem / out_elem: 16 input bytes become 16 / R output bytes (the last bytes of each element). */
template <int R, int IN> __device__ inline void narrow_store(char *dst, uint4 v)
{
    if constexpr (R == 1) {
        *reinterpret_cast<uint4 *>(dst) = v;
    } else if constexpr (R == 2 && IN == 2) { /* 8 elements of 2 bytes -> their high bytes */
        auto hi = [](uint32_t a, uint32_t b) {
            return ((a >> 8) & 0xffu) | ((a >> 16) & 0xff00u) | (((b >> 8) & 0xffu) << 16) | ((b & 0xff000000u));
        };
        *reinterpret_cast<uint2 *>(dst) = make_uint2(hi(v.x, v.y), hi(v.z, v.w));
    } else if constexpr (R == 2) { /* 4 elements of 4 bytes -> their high halves */
        *reinterpret_cast<uint2 *>(dst) = make_uint2((v.x >> 16) | (v.y & 0xffff0000u), (v.z >> 16) | (v.w & 0xffff0000u));
    } else { /* R == 4: 4 elements of 4 bytes -> their high bytes */
        *reinterpret_cast<uint32_t *>(dst) = (v.x >> 24) | ((v.y >> 24) << 8) | ((v.z >> 24) << 16) | (v.w & 0xff000000u);
    }
}

struct ScatterParams {
    const char *src[2];
    char *dst[2];
    const int64_t *slots;
    uint32_t rows;         /* tokens * sides */
    uint32_t vecs, pieces, sides;
    kvhal_fastdiv32 div_per, div_vecs, div_sides; /* by pieces * vecs (a row's vectors), by vecs, by sides */
    int64_t piece_in;      /* bytes */
    int64_t block_size, block_stride, piece_stride, token_stride;
};

/* A block takes TILE (token, side) rows at a time (32, or 8 for more blocks in a call of few rows): its first threads load the rows' slots and compute their
 * sources and destinations once (one load round trip per tile, kept in shared memory), then the block walks the
 * rows' 16-byte vectors as one flat range, U loads per thread issued before their stores (divisions by
 * multiplication, as the ops'), the loads plain or (NA) not allocated in L1, as the ops' one-wave form. */
template <int R, int IN, int U, int NA, uint32_t TILE>
__global__ void __launch_bounds__(KVHAL_GPU_THREADS) scatter_rows_kernel(const ScatterParams p)
{
    __shared__ const char *s_src[TILE];
    __shared__ char *s_dst[TILE];
    const uint32_t per = p.div_per.d;
    for (uint32_t row0 = blockIdx.x * TILE; row0 < p.rows; row0 += gridDim.x * TILE) {
        const uint32_t n = min(TILE, p.rows - row0);
        if (threadIdx.x < n) {
            const uint32_t row = row0 + threadIdx.x, t = kvhal_fastdiv32_div(row, p.div_sides), side = row - t * p.sides;
            const int64_t slot = p.slots[t];
            s_src[threadIdx.x] = p.src[side] + (int64_t)t * p.pieces * p.piece_in;
            s_dst[threadIdx.x] = slot < 0 ? nullptr
                                          : p.dst[side] + (slot / p.block_size) * p.block_stride +
                                                (slot % p.block_size) * p.token_stride;
        }
        __syncthreads();
        const uint32_t total = n * per;
        for (uint32_t f0 = threadIdx.x; f0 < total; f0 += blockDim.x * U) {
            uint4 x[U];
            char *d[U];
#pragma unroll
            for (int k = 0; k < U; k++) {
                const uint32_t f = f0 + blockDim.x * k, r = kvhal_fastdiv32_div(f, p.div_per), j = f - r * per,
                               pc = kvhal_fastdiv32_div(j, p.div_vecs);
                d[k] = f < total && s_dst[r] ? s_dst[r] + (int64_t)pc * p.piece_stride + (int64_t)(j - pc * p.vecs) * (16 / R)
                                             : nullptr;
                if (d[k]) x[k] = ld_in<NA ? KVHAL_GPU_HINT_NA : 0>(reinterpret_cast<const uint4 *>(s_src[r] + (int64_t)j * 16));
            }
#pragma unroll
            for (int k = 0; k < U; k++)
                if (d[k]) narrow_store<R, IN>(d[k], x[k]);
        }
        __syncthreads();
    }
}

__global__ void spin_kernel(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

template <int R, int IN, int U, int NA, uint32_t TILE> gpuError_t scatter_launch(const ScatterParams &p, gpuStream_t s)
{
    const uint32_t threads = KVHAL_GPU_THREADS;
    uint32_t grid = (p.rows + TILE - 1) / TILE;
    if (grid > 65535u * 16u) grid = 65535u * 16u;
    scatter_rows_kernel<R, IN, U, NA, TILE><<<grid, threads, 0, s>>>(p);
    return gpuGetLastError();
}

/* The form's kernel for in / out bytes per element: form bit 0, 8 loads in flight per thread (else 4); bit 1, NA
 * loads; bit 2, tiles of 8 rows (else 32). */
template <int R, int IN> gpuError_t scatter_form(const ScatterParams &p, int form, gpuStream_t s)
{
    switch (form) {
    case 0: return scatter_launch<R, IN, 4, 0, 32>(p, s);
    case 1: return scatter_launch<R, IN, 8, 0, 32>(p, s);
    case 2: return scatter_launch<R, IN, 4, 1, 32>(p, s);
    case 3: return scatter_launch<R, IN, 8, 1, 32>(p, s);
    case 4: return scatter_launch<R, IN, 4, 0, 8>(p, s);
    case 5: return scatter_launch<R, IN, 8, 0, 8>(p, s);
    case 6: return scatter_launch<R, IN, 4, 1, 8>(p, s);
    default: return scatter_launch<R, IN, 8, 1, 8>(p, s);
    }
}

} // namespace
const void *ceiling_one_kernel(void) { return reinterpret_cast<const void *>(scatter_rows_kernel<1, 2, 4, 0, 32>); }

} // namespace kvhal_gpu

extern "C" int kvhal_gpu_scatter_rows_form(const kvhal_gpu_scatter_args *a, int form, void *native_stream)
{
    using namespace kvhal_gpu;
    if (form < 0 || form >= KVHAL_GPU_SCATTER_FORMS) return -1;
    if (!a || a->sides < 1 || a->sides > 2 || a->pieces < 1 || a->tokens < 1 || a->piece_elems < 1 ||
        a->block_size < 1 || !a->slots)
        return -1;
    const int in = a->in_elem, out = a->out_elem;
    if ((in != 1 && in != 2 && in != 4) || (out != 1 && out != 2 && out != 4) || out > in) return -1;
    const int64_t piece_in = a->piece_elems * in;
    if (piece_in % 16) return -1;
    const uint64_t total = (uint64_t)a->tokens * (uint64_t)a->sides * (uint64_t)a->pieces * (uint64_t)(piece_in / 16);
    if (total >= (1ull << 32) || (uint64_t)a->pieces * (uint64_t)(piece_in / 16) >= (1ull << 26)) return -1;
    ScatterParams p;
    memset(&p, 0, sizeof p);
    for (int s = 0; s < a->sides; s++) {
        p.src[s] = static_cast<const char *>(a->src[s]);
        p.dst[s] = static_cast<char *>(a->dst[s]);
        if (!p.src[s] || !p.dst[s]) return -1;
    }
    p.slots = a->slots;
    p.rows = (uint32_t)(a->tokens * a->sides);
    p.vecs = (uint32_t)(piece_in / 16);
    p.pieces = (uint32_t)a->pieces;
    p.sides = (uint32_t)a->sides;
    p.div_per = kvhal_fastdiv32_make(p.pieces * p.vecs);
    p.div_vecs = kvhal_fastdiv32_make(p.vecs);
    p.div_sides = kvhal_fastdiv32_make(p.sides);
    p.piece_in = piece_in;
    p.block_size = a->block_size;
    p.block_stride = a->block_stride;
    p.piece_stride = a->piece_stride;
    p.token_stride = a->token_stride;
    int dev = -1, is_device = 0; /* launched on the device the output is on */
    if (gpuPointerDevice(a->dst[0], &dev, &is_device) != gpuSuccess || !is_device) {
        (void)gpuGetLastError();
        return -1;
    }
    const DeviceGuard guard;
    if (guard.select(dev) != gpuSuccess) {
        (void)gpuGetLastError();
        return -2;
    }
    const gpuStream_t s = static_cast<gpuStream_t>(native_stream);
    gpuError_t e;
    switch (in / out * 10 + in) {
    case 11: e = scatter_form<1, 1>(p, form, s); break;
    case 12: e = scatter_form<1, 2>(p, form, s); break;
    case 14: e = scatter_form<1, 4>(p, form, s); break;
    case 22: e = scatter_form<2, 2>(p, form, s); break;
    case 24: e = scatter_form<2, 4>(p, form, s); break;
    default: e = scatter_form<4, 4>(p, form, s); break;
    }
    return e == gpuSuccess ? 0 : -2;
}

extern "C" int kvhal_gpu_spin(int device, uint64_t cycles, void *native_stream)
{
    using namespace kvhal_gpu;
    int n = 0;
    if (gpuGetDeviceCount(&n) != gpuSuccess || device < 0 || device >= n || cycles > (1ull << 62)) {
        (void)gpuGetLastError();
        return -1;
    }
    const DeviceGuard guard;
    if (guard.select(device) != gpuSuccess) {
        (void)gpuGetLastError();
        return -2;
    }
    spin_kernel<<<1, 32, 0, static_cast<gpuStream_t>(native_stream)>>>((long long)cycles);
    return gpuGetLastError() == gpuSuccess ? 0 : -2;
}

extern "C" int kvhal_gpu_scatter_rows(const kvhal_gpu_scatter_args *a, void *native_stream)
{
    return kvhal_gpu_scatter_rows_form(a, 0, native_stream);
}

/* gpu_tensor_copy.cu — the tensor_copy op of the GPU backends: dims collapsed once per descriptor, then one
 * launch of tensor_copy_kernel (kvhal_gpu_kernels.cuh) in the widest unit the call's addresses allow, or one
 * device-to-device memcpy when both tensors are a single contiguous range. */
#include "gpu_private.h"

namespace kvhal_gpu {
namespace {

typedef void (*TensorCopyLaunch)(const TensorCopyParams &p, uint32_t grid, gpuStream_t s);

template <typename T> void launch_tensor_copy(const TensorCopyParams &p, uint32_t grid, gpuStream_t s)
{
    tensor_copy_kernel<T><<<grid, KVHAL_GPU_THREADS, 0, s>>>(p);
}

/* Unit sizes 1, 2, 4, 8, 16 bytes, by log2. */
const TensorCopyLaunch tc_launchers[5] = {launch_tensor_copy<uint8_t>, launch_tensor_copy<uint16_t>,
                                          launch_tensor_copy<uint32_t>, launch_tensor_copy<uint2>,
                                          launch_tensor_copy<uint4>};
#if defined(KVHAL_GPU_RTC)
/* The same units' C++ spellings, for the run-time compiled path (HIP on AMD, gpu_codepath.cu). */
const char *(*const tc_spellings[5])() = {type_spelling<uint8_t>, type_spelling<uint16_t>, type_spelling<uint32_t>,
                                          type_spelling<uint2>, type_spelling<uint4>};
#endif

struct TensorCopyDesc {
    TensorCopyParams p[5]; /* by log2(unit bytes); valid where (allowed >> k) & 1 */
    uint32_t allowed;
    uint32_t grid[5];
    void *fn[5];           /* run-time compiled kernels (kernel_fn), else NULL: launched with <<<>>> */
    size_t bytes;          /* total bytes, for the memcpy path */
    bool memcpy_path;      /* both tensors one contiguous range */
};

/* Drops extent-1 dims and merges neighbours that are contiguous in both tensors, outer to inner. a passed
 * tensor_copy_supports. Fails only where the device's kernels must be compiled at run time. */
kvhal_status tensor_copy_build(Ctx *c, int32_t id, const kvhal_bk_tensor_copy *a, TensorCopyDesc *d)
{
    const size_t es = kvhal_bk_dtype_size(a->dst.dtype);
    int64_t shape[KVHAL_GPU_MAX_DIMS], ds[KVHAL_GPU_MAX_DIMS], ss[KVHAL_GPU_MAX_DIMS];
    int nd = 0;
    int64_t numel = 1;
    for (int i = 0; i < a->dst.ndim; i++) {
        const int64_t n = a->dst.shape[i];
        numel *= n;
        if (n == 1) continue;
        if (nd > 0 && ds[nd - 1] == n * a->dst.strides[i] && ss[nd - 1] == n * a->src.strides[i]) {
            shape[nd - 1] *= n;
            ds[nd - 1] = a->dst.strides[i];
            ss[nd - 1] = a->src.strides[i];
        } else {
            shape[nd] = n;
            ds[nd] = a->dst.strides[i];
            ss[nd] = a->src.strides[i];
            nd++;
        }
    }
    if (nd == 0) {
        shape[0] = 1;
        ds[0] = ss[0] = 1;
        nd = 1;
    }
    memset(d, 0, sizeof *d);
    d->bytes = (size_t)numel * es;
    d->memcpy_path = nd == 1 && ds[0] == 1 && ss[0] == 1;
    const int64_t cap = (int64_t)c->dev[id].sm_count * 32;
    for (int k = 0; k < 5; k++) {
        const int64_t u = (int64_t)1 << k; /* unit bytes */
        if (u < (int64_t)es) continue;
        const int64_t per = u / (int64_t)es; /* elements per unit */
        const int in = nd - 1;
        if (per > 1) {
            if (ds[in] != 1 || ss[in] != 1 || shape[in] % per) continue;
            bool ok = true;
            for (int i = 0; i < in; i++) ok = ok && ds[i] % per == 0 && ss[i] % per == 0;
            if (!ok) continue;
        }
        TensorCopyParams *p = &d->p[k];
        p->nd = nd;
        p->n = numel / per;
        for (int i = 0; i < nd; i++) {
            const int64_t ext = i == in ? shape[i] / per : shape[i];
            p->dstride[i] = i == in && per > 1 ? 1 : ds[i] / per;
            p->sstride[i] = i == in && per > 1 ? 1 : ss[i] / per;
            p->div[i] = kvhal_fastdiv64_make((uint64_t)ext);
        }
        const int64_t blocks = (p->n + KVHAL_GPU_THREADS * KVHAL_GPU_UNROLL - 1) / (KVHAL_GPU_THREADS * KVHAL_GPU_UNROLL);
        d->grid[k] = (uint32_t)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
        d->allowed |= 1u << k;
    }
    if (d->memcpy_path || !d->bytes) return KVHAL_OK;
    for (int k = 0; k < 5; k++) {
        if (!((d->allowed >> k) & 1u)) continue;
        char expr[384] = "";
#if defined(KVHAL_GPU_RTC)
        kernel_expr(expr, sizeof expr, "kvhal_gpu::tensor_copy_kernel<%s>", tc_spellings[k]());
#endif
        const kvhal_status st = kernel_fn(c, id, expr, &d->fn[k]);
        if (st != KVHAL_OK) return st;
    }
    return KVHAL_OK;
}

} // namespace

#if defined(KVHAL_GPU_RTC)
void tensor_copy_rtc_exprs(RtcExprFn add, void *user)
{
    char expr[384];
    for (int k = 0; k < 5; k++) {
        kernel_expr(expr, sizeof expr, "kvhal_gpu::tensor_copy_kernel<%s>", tc_spellings[k]());
        add(user, expr);
    }
}
#endif

/* Elements of 1, 2, 4 or 8 bytes, the same dtype and rank on both sides, up to KVHAL_GPU_MAX_DIMS dims. */
bool tensor_copy_supports(Ctx *c, int32_t id, const kvhal_bk_tensor_copy *a, char *reason, size_t reason_size)
{
    (void)c;
    (void)id;
    if (!kvhal_bk_dtype_size(a->dst.dtype) || a->src.dtype != a->dst.dtype || a->src.ndim != a->dst.ndim || a->dst.ndim < 1 ||
        a->dst.ndim > KVHAL_GPU_MAX_DIMS)
        return kvhal_bk_refuse(reason, reason_size, "dtypes %s/%s, ndims %d/%d: the kernel copies one dtype with 1 to %d "
                      "dims on both sides", kvhal_bk_dtype_name(a->dst.dtype), kvhal_bk_dtype_name(a->src.dtype), (int)a->dst.ndim, (int)a->src.ndim,
                      KVHAL_GPU_MAX_DIMS);
    return true;
}

kvhal_status tensor_copy_desc_create(Ctx *c, int32_t id, const kvhal_bk_tensor_copy *a, void **desc)
{
    void *d = NULL;
    kvhal_status st = host_alloc(c, id, sizeof(TensorCopyDesc), "tensor_copy descriptor", &d);
    if (st != KVHAL_OK) return st;
    st = tensor_copy_build(c, id, a, static_cast<TensorCopyDesc *>(d));
    if (st != KVHAL_OK) {
        free(d);
        return st;
    }
    *desc = d;
    return KVHAL_OK;
}

void tensor_copy_desc_destroy(Ctx *c, int32_t id, void *desc)
{
    (void)c;
    (void)id;
    free(desc);
}

kvhal_status gpu_tensor_copy(void *ctx, int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    Ctx *c = ctx_of(ctx);
    TensorCopyDesc local;
    const TensorCopyDesc *d = static_cast<const TensorCopyDesc *>(desc);
    if (!d) {
        kvhal_status st = check_id(c, id);
        if (st == KVHAL_OK) st = tensor_copy_build(c, id, a, &local);
        if (st != KVHAL_OK) return st;
        d = &local;
    }
    if (!d->bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    char *dst = static_cast<char *>(a->dst.native) + a->dst.offset;
    const char *src = static_cast<const char *>(a->src.native) + a->src.offset;
    const gpuStream_t s = native_stream(stream);
    if (d->memcpy_path) {
        KVHAL_GPU_TRY(c, gpuMemcpyAsync(dst, src, d->bytes, gpuMemcpyDeviceToDevice, s), id, "tensor_copy memcpy");
        return KVHAL_OK;
    }
    const uintptr_t align = (uintptr_t)dst | (uintptr_t)src;
    int k = 4;
    while (k > 0 && (!((d->allowed >> k) & 1u) || (align & (((uintptr_t)1 << k) - 1)))) k--;
    if (!((d->allowed >> k) & 1u)) /* only possible for elements wider than their alignment */
        return fail(c, KVHAL_INVALID_ARGUMENT, "tensor_copy: dst %p / src %p are not aligned to their elements",
                    (void *)dst, (const void *)src);
    TensorCopyParams p = d->p[k];
    p.dst = dst;
    p.src = src;
    if (d->fn[k]) return launch_fn(c, id, d->fn[k], d->grid[k], KVHAL_GPU_THREADS, &p, s, "tensor_copy launch");
    tc_launchers[k](p, d->grid[k], s);
    KVHAL_GPU_TRY(c, gpuGetLastError(), id, "tensor_copy launch");
    return KVHAL_OK;
}

const void *tensor_copy_one_kernel(void) { return reinterpret_cast<const void *>(tensor_copy_kernel<uint4>); }

} // namespace kvhal_gpu

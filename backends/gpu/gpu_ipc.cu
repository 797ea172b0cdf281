/* gpu_ipc.cu — shareable buffers of the GPU backends and their IPC handles. The buffers of
 * gpu_buffer_alloc come from a stream-ordered pool created without a shareable handle type, which
 * cudaIpcGetMemHandle / hipIpcGetMemHandle cannot export; a shareable buffer is its own cudaMalloc / hipMalloc
 * allocation instead (so it is exported whole: the handle needs no offset), freed with cudaFree / hipFree.
 *
 * The module's part of a handle: a magic, the exporter's device ordinal and the runtime's 64-byte IPC handle. An import
 * opens it with cudaIpcOpenMemHandle (peer access enabled lazily: another GPU of the host reads it over
 * NVLink/PCIe) on the importing device, then checks that the allocation it got really holds the bytes the handle
 * claims (cuMemGetAddressRange through the driver entry point the module resolved, hipMemGetAddressRange on HIP),
 * so that a forged size cannot make later copies read past it, and that the importing device can reach the memory
 * (another GPU without peer access: refused, so the transfer agent falls back to its staged path instead of a copy
 * kernel faulting). Every entry selects its device through a
 * DeviceGuard and gives the caller's current device back. */
#include <dlfcn.h>
#include "gpu_private.h"

namespace kvhal_gpu {

namespace {

const uint32_t kBlobMagic = 0x4b564749u; /* KVGI */

struct GpuIpcBlob {
    uint32_t magic;
    int32_t exporter_device; /* informational: the exporter's ordinal in its own process */
    gpuIpcMemHandle_t handle;
};
static_assert(sizeof(GpuIpcBlob) <= KVHAL_BK_IPC_BLOB_MAX, "IPC blob too large");

/* The base and size of the allocation p lies in (on the current device). */
gpuError_t address_range(const Ctx *c, void *p, void **base, size_t *size)
{
#if defined(KVHAL_GPU_HIP) && defined(__HIP_PLATFORM_NVIDIA__)
    /* HIP's NVIDIA platform maps hipMemGetAddressRange to the driver's cuMemGetAddressRange, which this module does
     * not link (it links the static runtime only): take it from the loaded driver, as the CUDA module does */
    (void)c;
    typedef int (*RangeFn)(unsigned long long *, size_t *, unsigned long long);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *sym = h ? dlsym(h, "cuMemGetAddressRange_v2") : NULL;
    if (h) dlclose(h);
    if (!sym) return hipErrorNotSupported;
    RangeFn fn;
    memcpy(&fn, &sym, sizeof sym);
    unsigned long long b = 0;
    if (fn(&b, size, (unsigned long long)(uintptr_t)p) != 0) return hipErrorInvalidValue;
    *base = (void *)(uintptr_t)b;
    return hipSuccess;
#elif defined(KVHAL_GPU_HIP)
    (void)c;
    /* hipDeviceptr_t is void * on AMD and an integer (CUdeviceptr) on HIP's NVIDIA platform */
    hipDeviceptr_t b{};
    gpuError_t e = hipMemGetAddressRange(&b, size, (hipDeviceptr_t)(uintptr_t)p);
    *base = (void *)(uintptr_t)b;
    return e;
#else
    if (!c->cu_mem_range) return cudaErrorNotSupported;
    CUdeviceptr b = 0;
    if (c->cu_mem_range(&b, size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return cudaErrorInvalidValue;
    *base = (void *)(uintptr_t)b;
    return cudaSuccess;
#endif
}

} // namespace

kvhal_status gpu_buffer_alloc_shareable(void *ctx, int32_t id, size_t bytes, void **native)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!native) return fail(c, KVHAL_INVALID_ARGUMENT, "native: NULL");
    if (alloc_fail(c)) return injected(c, id, "shareable buffer");
    KVHAL_GPU_SETDEV(c, id);
    st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    void *p = NULL;
    const gpuError_t e = gpuMalloc(&p, bytes);
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        char d[160];
        describe(e, d, sizeof d);
        return fail(c, e == gpuErrorMemoryAllocation ? KVHAL_OUT_OF_MEMORY : KVHAL_BACKEND_ERROR,
                    "bytes: %zu of shareable memory on %s:%d: %s", bytes, KVHAL_GPU_NAME, (int)id, d);
    }
    *native = p;
    return KVHAL_OK;
}

kvhal_status gpu_buffer_free_shareable(void *ctx, int32_t id, void *native)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuFree(native), id, "free (shareable)");
    return KVHAL_OK;
}

kvhal_status gpu_ipc_export(void *ctx, int32_t id, void *native, void *blob, size_t cap, size_t *len)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!blob || !len) return fail(c, KVHAL_INVALID_ARGUMENT, "ipc_export: NULL %s", blob ? "len" : "blob");
    if (cap < sizeof(GpuIpcBlob))
        return fail(c, KVHAL_OUT_OF_RANGE, "cap: %zu bytes, a %s handle needs %zu", cap, KVHAL_GPU_NAME,
                    sizeof(GpuIpcBlob));
    KVHAL_GPU_SETDEV(c, id);
    GpuIpcBlob b;
    memset(&b, 0, sizeof b);
    b.magic = kBlobMagic;
    b.exporter_device = id;
    KVHAL_GPU_TRY(c, gpuIpcGetMemHandle(&b.handle, native), id, "ipc_export");
    memcpy(blob, &b, sizeof b);
    *len = sizeof b;
    return KVHAL_OK;
}

kvhal_status gpu_ipc_import(void *ctx, int32_t id, const void *blob, size_t len, size_t bytes, void **native)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!blob || !native) return fail(c, KVHAL_INVALID_ARGUMENT, "ipc_import: NULL %s", blob ? "native" : "blob");
    GpuIpcBlob b;
    if (len != sizeof b)
        return fail(c, KVHAL_INVALID_ARGUMENT, "blob: %zu bytes, a %s handle has %zu", len, KVHAL_GPU_NAME, sizeof b);
    memcpy(&b, blob, sizeof b);
    if (b.magic != kBlobMagic) return fail(c, KVHAL_INVALID_ARGUMENT, "blob: not a %s IPC handle", KVHAL_GPU_NAME);
#if !defined(KVHAL_GPU_HIP)
    if (!c->cu_mem_range) /* the size the handle claims could not be checked: refuse rather than trust it */
        return fail(c, KVHAL_UNSUPPORTED, "blob: cannot check an imported allocation's size (no "
                    "cuMemGetAddressRange_v2 in the loaded libcuda)");
#endif
    KVHAL_GPU_SETDEV(c, id);
    st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    void *p = NULL;
    KVHAL_GPU_TRY(c, gpuIpcOpenMemHandle(&p, b.handle), id, "ipc_import (open the peer's handle)");
    /* the handle's size is the peer's word: believe the runtime's */
    void *base = NULL;
    size_t size = 0;
    const gpuError_t e = address_range(c, p, &base, &size);
    if (e != gpuSuccess || base != p || size < bytes) {
        (void)gpuGetLastError();
        (void)gpuIpcCloseMemHandle(p);
        if (e != gpuSuccess) return rt_fail(c, e, id, "ipc_import (size of the imported allocation)");
        return fail(c, KVHAL_OUT_OF_RANGE, "blob: the imported allocation holds %zu bytes, the handle says %zu",
                    size, bytes);
    }
    /* memory of another GPU of this process's view that device id cannot reach peer to peer: refuse it here (the
     * caller then moves the bytes another way) rather than let a copy kernel fault on it */
    int where = -1, is_device = 0, can = 0;
    if (gpuPointerDevice(p, &where, &is_device) == gpuSuccess && is_device && where != id &&
        (gpuDeviceCanAccessPeer(&can, id, where) != gpuSuccess || !can)) {
        (void)gpuGetLastError();
        (void)gpuIpcCloseMemHandle(p);
        return fail(c, KVHAL_UNSUPPORTED, "blob: the memory lies on %s:%d, which %s:%d cannot access peer to peer",
                    KVHAL_GPU_NAME, where, KVHAL_GPU_NAME, (int)id);
    }
    (void)gpuGetLastError();
    *native = p;
    return KVHAL_OK;
}

kvhal_status gpu_ipc_close(void *ctx, int32_t id, void *native)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuIpcCloseMemHandle(native), id, "ipc_close");
    return KVHAL_OK;
}

} // namespace kvhal_gpu

/* gpu_private.h — what the sources of the CUDA and HIP backend modules share; private to backends/gpu.
 *
 * The host code is split by concern into compilation units, each compiled by nvcc for CUDA and by hipcc -x hip for
 * HIP from the same source (vendor names come from kvhal_gpu_runtime.h, kernels from kvhal_gpu_kernels.cuh):
 *   gpu_error.cu    error helpers: messages through the core, runtime errors, fault injection, host allocations
 *                   for descriptors, the device-id check (the bottom: every file uses it, it uses none)
 *   gpu_device.cu   init, shutdown, the context, device info, the device error flag
 *   gpu_memory.cu   buffers (and their pool), streams, copies (host, device, peer), memset, synchronize,
 *                   check_errors
 *   gpu_ipc.cu      shareable buffers (cudaMalloc / hipMalloc) and their IPC handles: export, import, close
 *   gpu_<op>.cu     one per entry of KVHAL_BK_OP_LIST: <op>_supports, <op>_desc_create, <op>_desc_destroy and
 *                   gpu_<op>, declared below from the list itself (gpu_copy_blocks.cu also holds copy_batch)
 *   gpu_codepath.cu which code a device runs (embedded code objects or, for HIP, hiprtc) and the kernel lookup
 *   gpu_ceiling.cu  the benchmarks' extras (not ops): the copy ceiling "kvhal_gpu_scatter_rows" (and _form), "kvhal_gpu_spin"
 *   gpu_table.cu    the plugin table, generated from the same list, get_proc_address (and the HIP module's
 *                   test hooks) and kvhal_backend_entry: the top, which names every file below it
 * So an op appended to KVHAL_BK_OP_LIST (and to kvhal_ops in the top-level meson.build) needs one new file,
 * gpu_<op>.cu, and nothing else in this backend. Helpers that only one file uses stay in that file's anonymous
 * namespace; kernels that are not templates live in the one file that launches them.
 *
 * State: the module keeps none of its own. init allocates a Ctx, the core passes it back to every entry, and
 * shutdown frees it; only constant tables are static.
 *
 * Hot-path rules: descriptors (<op>_desc_create) hold everything that depends on tensor metadata only (the kernel
 * instantiation, unit strides, divisors, launch geometry), so a call on a descriptor-cache hit fills pointers,
 * launches once and checks the launch; it never allocates, never synchronizes and never reads the device error
 * flag (synchronize / check_errors do). Every entry point selects its device through a DeviceGuard, which gives
 * the caller's current device back on return (a get per call; a set only where it differed).
 *
 * Graph capture: per-device state (the error flag) is made when the device is opened, i.e. by the first buffer or
 * stream made or wrapped on it (open_device), in the runtime's relaxed capture mode, so that no op allocates and
 * the process's first op may be recorded into a CUDA/HIP graph. */
#ifndef KVHAL_GPU_PRIVATE_H
#define KVHAL_GPU_PRIVATE_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal_backend.h"
#include "kvhal_gpu_kernels.cuh"

namespace kvhal_gpu {

/* ------------------------------------------------------------------------------------------------------------ */
/* The context                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */
struct DevState {
    uint8_t *flag;           /* error flag bytes (KVHAL_GPU_ERR_*), mapped pinned host memory */
    volatile uint8_t *dflag; /* the same bytes as the device addresses them */
    int ready;               /* flag allocated (atomic; written once under Ctx::lock) */
    int sm_count;
    int pool_state; /* buffer pool: 0 not tried, 1 in use, -1 unavailable (atomic; decided once under Ctx::lock) */
    gpuMemPool_t pool;
    int wrapped;    /* borrowed streams alive on this device (atomic) */
    signed char peer[KVHAL_MAX_DEVICES_PER_TYPE]; /* peer access to j: 0 not tried, 1 enabled, -1 unavailable */
    struct CodeState *code; /* which code this device runs (gpu_codepath.cu); NULL: not decided */
#if !defined(KVHAL_GPU_HIP)
    void *batch_fn[4];  /* copy_batch's kernels (small, middle, full, large) as driver functions, else NULL (atomic) */
    int batch_large;    /* the driver takes copy_batch's large launches (atomic) */
    int batch_fn_state; /* 0: not resolved yet, 1: batch_fn and batch_large are set (atomic) */
#endif
};

#if !defined(KVHAL_GPU_HIP)
/* The driver's launch and error-name entry points, taken from the libcuda the runtime has loaded (so the module
 * still links no libcuda); NULL when that fails, and launches then go through the runtime. */
typedef CUresult (*CuLaunchKernelFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     CUstream, void **, void **);
typedef CUresult (*CuGetErrorNameFn)(CUresult, const char **);
/* cuMemGetAddressRange_v2: the allocation an imported IPC pointer lies in, to check a peer's claimed size. */
typedef CUresult (*CuMemGetAddressRangeFn)(CUdeviceptr *, size_t *, CUdeviceptr);
/* cuFuncGetModule, cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuFuncLoad: a module's code loaded at once
 * when a device is opened (load_code, gpu_codepath.cu); NULL on a driver without them (before CUDA 12.4). */
typedef CUresult (*CuFuncGetModuleFn)(CUmodule *, CUfunction);
typedef CUresult (*CuModuleGetFunctionCountFn)(unsigned int *, CUmodule);
typedef CUresult (*CuModuleEnumerateFunctionsFn)(CUfunction *, unsigned int, CUmodule);
typedef CUresult (*CuFuncLoadFn)(CUfunction);
#endif

/* What init allocates and every entry gets back as its ctx. */
struct Ctx {
    const kvhal_core_services *svc;
    int32_t count;        /* devices in use */
    pthread_mutex_t lock; /* one-time set-ups: error flags, buffer pools, peer access */
#if !defined(KVHAL_GPU_HIP)
    CuLaunchKernelFn cu_launch;
    CuGetErrorNameFn cu_error_name;
    CuMemGetAddressRangeFn cu_mem_range;
    CuFuncGetModuleFn cu_func_module;
    CuModuleGetFunctionCountFn cu_module_count;
    CuModuleEnumerateFunctionsFn cu_module_functions;
    CuFuncLoadFn cu_func_load;
#endif
    DevState dev[KVHAL_MAX_DEVICES_PER_TYPE];
    /* Loads the ops' code on device id, selected (set by gpu_table.cu: the ops' files are above this one), called
     * when a device is opened (open_device), so that the process's first op does not load it. NULL: nothing. */
    void (*preload)(Ctx *c, int32_t id);
};

inline Ctx *ctx_of(void *ctx) { return static_cast<Ctx *>(ctx); }

/* ------------------------------------------------------------------------------------------------------------ */
/* Errors and shared helpers (gpu_error.cu)                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */
/* Sets the thread's error message through the core and returns st. */
kvhal_status fail(const Ctx *c, kvhal_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "out of memory (cudaErrorMemoryAllocation, code 2)"; HIP's string often is the name, which is then given once. */
void describe(gpuError_t e, char *buf, size_t size);
/* A runtime error of device id while doing what; also resets the runtime's last-error slot. */
kvhal_status rt_fail(const Ctx *c, gpuError_t e, int32_t id, const char *what);
/* Fault injection: whether the core wants the next allocation to fail, and the error to return then. */
bool alloc_fail(const Ctx *c);
kvhal_status injected(const Ctx *c, int32_t id, const char *what);
/* Zeroed host memory for what (a descriptor) on behalf of a caller: fault injection first, then the allocation. */
kvhal_status host_alloc(const Ctx *c, int32_t id, size_t bytes, const char *what, void **out);
kvhal_status check_id(const Ctx *c, int32_t id);
/* The per-device error flag: allocated when the device is opened (open_device, from the first buffer or stream made
 * or wrapped on it); ops only check that it is there. Read and cleared by synchronize, check_errors and
 * stream_check_errors once the work they wait for is done. */
kvhal_status ensure_flag(Ctx *c, int32_t id);
/* Opens device id: its per-device state, made once, in relaxed capture mode so that it also succeeds while a
 * stream of this thread is being captured into a graph. */
kvhal_status open_device(Ctx *c, int32_t id);
kvhal_status read_flag(const Ctx *c, int32_t id);

inline gpuError_t use_device(int32_t id)
{
    int cur = -1;
    if (gpuGetDevice(&cur) == gpuSuccess && cur == id) return gpuSuccess;
    return gpuSetDevice(id);
}

/* The caller's current device, saved when an entry point starts and set again when it returns if anything inside
 * changed it (so kvhal never moves the caller's, e.g. PyTorch's, current device). */
class DeviceGuard {
  public:
    DeviceGuard()
    {
        if (gpuGetDevice(&orig_) != gpuSuccess) {
            orig_ = -1;
            (void)gpuGetLastError();
        }
    }
    ~DeviceGuard()
    {
        int cur = -1;
        if (orig_ >= 0 && gpuGetDevice(&cur) == gpuSuccess && cur != orig_) (void)gpuSetDevice(orig_);
    }
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;
    gpuError_t select(int32_t id) const { return orig_ == id ? gpuSuccess : gpuSetDevice(id); }

  private:
    int orig_ = -1;
};

#define KVHAL_GPU_TRY(c, call, id, what)                                                                        \
    do {                                                                                                        \
        gpuError_t kvhal_e_ = (call);                                                                           \
        if (kvhal_e_ != gpuSuccess) return ::kvhal_gpu::rt_fail((c), kvhal_e_, (id), (what));                  \
    } while (0)

/* The calling thread in the runtime's relaxed capture mode for a scope: one-time set-ups (the error flag,
 * descriptors) may allocate even while this thread or another one captures a stream into a graph. */
class RelaxedCapture {
  public:
    RelaxedCapture() : ok_(gpuThreadExchangeStreamCaptureMode(&mode_) == gpuSuccess)
    {
        if (!ok_) (void)gpuGetLastError();
    }
    ~RelaxedCapture()
    {
        if (ok_) (void)gpuThreadExchangeStreamCaptureMode(&mode_);
    }
    RelaxedCapture(const RelaxedCapture &) = delete;
    RelaxedCapture &operator=(const RelaxedCapture &) = delete;

  private:
    gpuStreamCaptureMode_t mode_ = gpuStreamCaptureModeRelaxed;
    bool ok_;
};

/* Declares the scope's DeviceGuard and selects id (returns the runtime's error if it cannot). */
#define KVHAL_GPU_SETDEV(c, id)                                                                                 \
    const ::kvhal_gpu::DeviceGuard kvhal_dev_guard_;                                                            \
    KVHAL_GPU_TRY((c), kvhal_dev_guard_.select(id), (id), "select device")

/* What stream_create / stream_wrap hand out. */
struct Stream {
    gpuStream_t s;
    int32_t dev;
    bool owned;
    bool counted; /* a borrowed stream that is not a default stream: counted in DevState::wrapped */
};

inline gpuStream_t native_stream(void *stream) { return stream ? static_cast<Stream *>(stream)->s : (gpuStream_t)0; }

/* ------------------------------------------------------------------------------------------------------------ */
/* Entries of the table (gpu_table.cu)                                                                          */
/* ------------------------------------------------------------------------------------------------------------ */
/* gpu_device.cu (gpu_get_proc_address: gpu_table.cu) */
kvhal_status gpu_init(const kvhal_core_services *services, void **ctx, int32_t *device_count, char *reason,
                      size_t reason_size);
void gpu_shutdown(void *ctx);
void *gpu_get_proc_address(void *ctx, const char *name);
/* One kernel of the ceiling's file (gpu_ceiling.cu), for load_code. */
const void *ceiling_one_kernel(void);
/* "kvhal_gpu_scatter_rows", the benchmark's ceiling copy (gpu_ceiling.cu; kvhal_backend.h documents it). */
extern "C" int kvhal_gpu_scatter_rows(const ::kvhal_gpu_scatter_args *a, void *native_stream);
extern "C" int kvhal_gpu_scatter_rows_form(const ::kvhal_gpu_scatter_args *a, int form, void *native_stream);
/* "kvhal_gpu_spin", a kernel of a chosen duration (gpu_ceiling.cu; kvhal_backend.h). */
extern "C" int kvhal_gpu_spin(int device, uint64_t cycles, void *native_stream);
kvhal_status gpu_device_info(void *ctx, int32_t id, kvhal_device_info *out);

/* gpu_memory.cu */
kvhal_status gpu_buffer_alloc(void *ctx, int32_t id, size_t bytes, void **native);
kvhal_status gpu_buffer_free(void *ctx, int32_t id, void *native);
kvhal_status gpu_buffer_wrap(void *ctx, int32_t id, void *native, size_t bytes);
kvhal_status gpu_buffer_unwrap(void *ctx, int32_t id, void *native);
kvhal_status gpu_stream_create(void *ctx, int32_t id, void **stream);
kvhal_status gpu_stream_wrap(void *ctx, int32_t id, void *native, void **stream);
kvhal_status gpu_stream_destroy(void *ctx, int32_t id, void *stream);
kvhal_status gpu_stream_synchronize(void *ctx, int32_t id, void *stream);
kvhal_status gpu_stream_query(void *ctx, int32_t id, void *stream);
kvhal_status gpu_event_create(void *ctx, int32_t id, void **ev);
kvhal_status gpu_event_destroy(void *ctx, int32_t id, void *ev);
kvhal_status gpu_event_record(void *ctx, int32_t id, void *ev, void *stream);
kvhal_status gpu_event_query(void *ctx, int32_t id, void *ev);
kvhal_status gpu_event_synchronize(void *ctx, int32_t id, void *ev);
kvhal_status gpu_stream_wait_event(void *ctx, int32_t id, void *stream, void *ev);
kvhal_status gpu_host_alloc(void *ctx, int32_t id, size_t bytes, void **ptr);
kvhal_status gpu_host_free(void *ctx, int32_t id, void *ptr);
/* gpu_ipc.cu */
kvhal_status gpu_buffer_alloc_shareable(void *ctx, int32_t id, size_t bytes, void **native);
kvhal_status gpu_buffer_free_shareable(void *ctx, int32_t id, void *native);
kvhal_status gpu_ipc_export(void *ctx, int32_t id, void *native, void *blob, size_t cap, size_t *len);
kvhal_status gpu_ipc_import(void *ctx, int32_t id, const void *blob, size_t len, size_t bytes, void **native);
kvhal_status gpu_ipc_close(void *ctx, int32_t id, void *native);
kvhal_status gpu_memcpy_h2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes,
                            void *stream);
kvhal_status gpu_memcpy_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t src_off, size_t bytes,
                            void *stream);
kvhal_status gpu_memcpy_d2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off,
                            size_t bytes, void *stream);
kvhal_status gpu_memcpy_peer(void *ctx, int32_t dst_id, void *dst, size_t dst_off, int32_t src_id, const void *src,
                             size_t src_off, size_t bytes, void *stream);
kvhal_status gpu_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream);
kvhal_status gpu_synchronize(void *ctx, int32_t id);
kvhal_status gpu_check_errors(void *ctx, int32_t id);
kvhal_status gpu_stream_check_errors(void *ctx, int32_t id, void *stream);

/* gpu_<op>.cu, one per op. <op>_supports: whether the kernels can run these arguments (metadata only), else false
 * with the reason; the core asks before every descriptor it creates (cached or for one call), so neither
 * <op>_desc_create nor gpu_<op> checks again. gpu_<op> also accepts desc NULL (building a descriptor for that call
 * only), which the core passes only to modules without desc_create. */
#define KVHAL_GPU_X_OP_DECL(E, name, T)                                                                         \
    bool name##_supports(Ctx *c, int32_t id, const T *a, char *reason, size_t reason_size);                     \
    kvhal_status name##_desc_create(Ctx *c, int32_t id, const T *a, void **desc);                               \
    void name##_desc_destroy(Ctx *c, int32_t id, void *desc);                                                   \
    kvhal_status gpu_##name(void *ctx, int32_t id, void *desc, const T *a, void *stream);                     \
    const void *name##_one_kernel(void); /* one of the file's kernels: its module, for load_code */
KVHAL_BK_OP_LIST(KVHAL_GPU_X_OP_DECL)
#undef KVHAL_GPU_X_OP_DECL

/* gpu_copy_blocks.cu: the batched byte-range copies behind kv_cache_duplicate. */
kvhal_status gpu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream);

/* ------------------------------------------------------------------------------------------------------------ */
/* Which code a device runs (gpu_codepath.cu)                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
/* KVHAL_GPU_RTC: the HIP module on AMD GPUs, which compiles the kernel source with hiprtc at run time for a GPU
 * whose target ID no embedded code object matches (gpu_codepath.cu). CUDA (and HIP on NVIDIA) runs the embedded
 * cubins or lets the driver JIT-compile the embedded PTX. */
#if defined(KVHAL_GPU_HIP) && !defined(__HIP_PLATFORM_NVIDIA__)
#define KVHAL_GPU_RTC 1
#endif

/* Decides device id's path at init (target ID against the embedded targets, KVHAL_HIP_FORCE_RTC); never fails:
 * a device without usable code says why in its description and fails at its first descriptor. */
void code_path_init(Ctx *c, int32_t id);
void code_path_shutdown(Ctx *c);
/* "code: embedded gfx90a" / "code: run-time compiled for gfx942:sramecc+:xnack- (hiprtc), cache <dir>" /
 * "code: sm_90 cubin" / "code: PTX compute_90, JIT-compiled by the driver", for device info. */
void code_path_describe(const Ctx *c, int32_t id, char *buf, size_t size);
/* The function to launch for kernel expr (a C++ name expression, e.g. "kvhal_gpu::copy_batch_kernel") on device id:
 * *fn NULL when the device runs the embedded code (launch with <<<>>>), else the run-time compiled kernel (compiled
 * or read from the disk cache on first use, then kept per device). Fails with the compiler's message. */
kvhal_status kernel_fn(Ctx *c, int32_t id, const char *expr, void **fn);
/* Loads the code of the modules that hold kernels[0..n) on device id, selected, when it is opened (Ctx::preload):
 * the CUDA runtime loads a module's kernels lazily by default (CUDA_MODULE_LOADING=LAZY), each at its first use, which
 * the process's first op paid for (8.9-12.3 ms on an H200). On a device that runs the embedded cubins every function
 * of each module is loaded now (cuModuleEnumerateFunctions, cuFuncLoad; the driver's lazy loading stays as it is for
 * the rest of the process); on one that JIT-compiles the PTX, HIP's embedded code objects, or a driver without
 * those entry points, only kernels[i] themselves (their attributes asked); nothing on HIP's run-time compiled path
 * or with KVHAL_GPU_LAZY_LOAD=1. Never fails: what is not loaded now is loaded at its first use. */
void load_code(Ctx *c, int32_t id, const void *const *kernels, int n);
/* Launches fn (from kernel_fn) with one by-value parameter. */
kvhal_status launch_fn(const Ctx *c, int32_t id, void *fn, uint32_t grid, uint32_t threads, void *param,
                       gpuStream_t s, const char *what);
#if !defined(KVHAL_GPU_HIP)
/* Launches fn, a driver function of the device selected (cudaGetFuncBySymbol), with one by-value parameter through
 * cuLaunchKernel, which skips the runtime's per-launch lookup of the kernel. KVHAL_BUSY, nothing launched and no
 * error set: the thread has no current context yet (the runtime's launch makes one; launch with it). */
kvhal_status driver_launch(const Ctx *c, int32_t id, void *fn, uint32_t grid, uint32_t threads, void *param,
                           gpuStream_t s, const char *what);
#endif

/* The copy engines' batched copy (CUDA 12.8+, compile time; HIP has none): n chunks in stream order with one runtime
 * call, for the ops whose chunks are large enough (KVHAL_GPU_BATCH_MIN_CHUNK on average: a chunk costs the copy
 * engines about 0.8 us, so below it an SM copy in one launch does better). Batch copies refuse the legacy default
 * stream, and nothing is assumed of them in a graph: batch_stream says whether s takes them (*e: a failed query;
 * false on a driver older than 12.8). */
#if !defined(KVHAL_GPU_HIP) && defined(CUDART_VERSION) && CUDART_VERSION >= 12080
#define KVHAL_GPU_MEMCPY_BATCH 1
#define KVHAL_GPU_BATCH_MIN_CHUNK (256u << 10)
inline cudaError_t memcpy_batch(void *const *dst, const void *const *src, const size_t *len, size_t n, cudaStream_t s)
{
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(dst, src, len, n, &attr, &attr_idx, 1, s);
#else
    size_t fail_idx = 0;
    return cudaMemcpyBatchAsync(const_cast<void **>(dst), const_cast<void **>(src), const_cast<size_t *>(len), n,
                                &attr, &attr_idx, 1, &fail_idx, s);
#endif
}
/* The chunk lists of one batched copy (dst, src, len: cap entries each), freed when it goes out of scope; ok()
 * false: no host memory for them. */
struct BatchLists {
    void **dst;
    const void **src;
    size_t *len;
    explicit BatchLists(size_t cap)
        : dst(static_cast<void **>(malloc(cap * sizeof(void *)))),
          src(static_cast<const void **>(malloc(cap * sizeof(void *)))),
          len(static_cast<size_t *>(malloc(cap * sizeof(size_t))))
    {
    }
    ~BatchLists()
    {
        free(dst);
        free(src);
        free(len);
    }
    BatchLists(const BatchLists &) = delete;
    BatchLists &operator=(const BatchLists &) = delete;
    bool ok() const { return dst && src && len; }
    cudaError_t copy(size_t n, cudaStream_t s) const { return memcpy_batch(dst, src, len, n, s); }
};
/* Whether the driver runs batch copies: a module built with a 12.8+ runtime (linked statically) may meet an older
 * driver, which would answer cudaErrorCallRequiresNewerDriver; asked once per process. */
inline bool batch_driver(void)
{
    static int state; /* 0: not asked yet, 1: yes, 2: no (atomic; two first callers store the same answer) */
    int v = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (!v) {
        int driver = 0;
        v = cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12080 ? 1 : 2;
        (void)cudaGetLastError();
        __atomic_store_n(&state, v, __ATOMIC_RELAXED);
    }
    return v == 1;
}
inline bool batch_stream(cudaStream_t s, cudaError_t *e)
{
    *e = cudaSuccess;
    if (s == (cudaStream_t)0 || s == cudaStreamLegacy || !batch_driver()) return false;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    *e = cudaStreamIsCapturing(s, &cap);
    return *e == cudaSuccess && cap == cudaStreamCaptureStatusNone;
}
#endif

/* The name expression of kernel template instantiated with T, e.g. for T = XCopy<uint4>:
 * "kvhal_gpu::paged_caching_kernel<kvhal_gpu::XCopy<HIP_vector_type<unsigned int, 4>>, ...>" (from the compiler's
 * __PRETTY_FUNCTION__, which spells T as valid C++); fmt has one or two %s for T. Used on the run-time path only. */
template <class T> inline const char *type_spelling() { return __PRETTY_FUNCTION__; }
void kernel_expr(char *buf, size_t size, const char *fmt, const char *pretty);
/* An op's kernels, the same recipe for every op of KVHAL_BK_OP_LIST:
 *   - templates go in kvhal_gpu_kernels.cuh, other kernels in a header of the op's own (kvhal_gpu_copy_kernels.cuh,
 *     kvhal_gpu_page_kernels.cuh) that only its gpu_<op>.cu includes and that includes only kvhal_gpu_kernels.cuh;
 *     such a header is listed in KVHAL_GPU_RTC_SOURCES (gpu_codepath.cu) and in backends/hip/meson.build's
 *     embedded sources, so the run-time compiled source has it;
 *   - gpu_<op>.cu asks kernel_fn for each kernel by its name expression before it launches (a descriptor's, or the
 *     call's) and launches the function it gets with launch_fn, else with <<<>>>;
 *   - gpu_<op>.cu defines <op>_rtc_exprs: every name expression its descriptors may ask kernel_fn for, through add
 *     (the module's test hook "kvhal_hip_rtc_kernel_exprs" compiles them all with hiprtc in CI). */
#if defined(KVHAL_GPU_RTC)
/* "kvhal_gpu::paged_caching_kernel<...>" -> "20paged_caching_kernel": how a kernel is found in a code object. */
void kernel_needle(const char *expr, char *buf, size_t size);
typedef void (*RtcExprFn)(void *user, const char *expr);
#define KVHAL_GPU_X_RTC_DECL(E, name, T) void name##_rtc_exprs(RtcExprFn add, void *user);
KVHAL_BK_OP_LIST(KVHAL_GPU_X_RTC_DECL)
#undef KVHAL_GPU_X_RTC_DECL
#endif

} // namespace kvhal_gpu

#endif /* KVHAL_GPU_PRIVATE_H */

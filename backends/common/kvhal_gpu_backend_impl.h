/* kvhal_gpu_backend_impl.h — the host side of the CUDA and HIP backends, shared by both: cuda_backend.cu and
 * hip_backend.hip each include this file once (vendor names come from kvhal_gpu_runtime.h) and so build the whole
 * plugin table of api/kvhal_backend.h around the kernels of kvhal_gpu_kernels.cuh.
 *
 * Hot-path rules: descriptors (desc_create) hold everything that depends on tensor metadata only (the kernel
 * instantiation, unit strides, divisors, launch geometry), so a call on a descriptor-cache hit fills pointers,
 * launches once and checks the launch; it never allocates, never synchronizes and never reads the device error
 * flag (synchronize / check_errors do). Every entry point selects its device first (cheap when already current). */
#ifndef KVHAL_GPU_BACKEND_IMPL_H
#define KVHAL_GPU_BACKEND_IMPL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal_backend.h"
#include "kvhal_gpu_kernels.cuh"

namespace kvhal_gpu {
namespace {

/* ------------------------------------------------------------------------------------------------------------ */
/* State                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */
struct DevState {
    uint8_t *flag;           /* error flag bytes (KVHAL_GPU_ERR_*), mapped pinned host memory */
    volatile uint8_t *dflag; /* the same bytes as the device addresses them */
    int ready;               /* flag allocated (atomic; written once under g_lock) */
    int sm_count;
    int pool_state; /* buffer pool: 0 not tried, 1 in use, -1 unavailable (atomic; decided once under g_lock) */
    gpuMemPool_t pool;
    int wrapped;    /* borrowed streams alive on this device (atomic) */
    signed char peer[KVHAL_MAX_DEVICES_PER_TYPE]; /* peer access to j: 0 not tried, 1 enabled, -1 unavailable */
};

const kvhal_core_services *g_svc;
int32_t g_count;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
DevState g_dev[KVHAL_MAX_DEVICES_PER_TYPE];

/* ------------------------------------------------------------------------------------------------------------ */
/* Errors                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */
__attribute__((format(printf, 2, 3))) kvhal_status fail(kvhal_status st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (g_svc && g_svc->set_error) return g_svc->set_error(st, "%s", buf);
    return st;
}

/* "out of memory (cudaErrorMemoryAllocation, code 2)"; HIP's string often is the name, which is then given once. */
void describe(gpuError_t e, char *buf, size_t size)
{
    const char *str = gpuGetErrorString(e), *name = gpuGetErrorName(e);
    if (!str) str = "unknown error";
    if (!name || !strcmp(str, name)) snprintf(buf, size, "%s (code %d)", str, (int)e);
    else snprintf(buf, size, "%s (%s, code %d)", str, name, (int)e);
}

/* Also resets the runtime's last-error slot, so that a later launch check does not report this error again. */
kvhal_status rt_fail(gpuError_t e, int32_t id, const char *what)
{
    (void)gpuGetLastError();
    const kvhal_status st = e == gpuErrorMemoryAllocation ? KVHAL_OUT_OF_MEMORY : KVHAL_BACKEND_ERROR;
    char d[160];
    describe(e, d, sizeof d);
    return fail(st, "%s:%d: %s: %s", KVHAL_GPU_NAME, (int)id, what, d);
}

bool alloc_fail()
{
    return g_svc && g_svc->struct_size >= offsetof(kvhal_core_services, alloc_should_fail) + sizeof(void *) &&
           g_svc->alloc_should_fail && g_svc->alloc_should_fail();
}

kvhal_status injected(int32_t id, const char *what)
{
    return fail(KVHAL_OUT_OF_MEMORY, "%s:%d: %s: allocation failed (fault injection)", KVHAL_GPU_NAME, (int)id, what);
}

kvhal_status check_id(int32_t id)
{
    if (id < 0 || id >= g_count)
        return fail(KVHAL_NO_DEVICE, "id: %s:%d is not present (%d %s devices)", KVHAL_GPU_NAME, (int)id,
                    (int)g_count, KVHAL_GPU_NAME);
    return KVHAL_OK;
}

inline gpuError_t use_device(int32_t id)
{
    int cur = -1;
    if (gpuGetDevice(&cur) == gpuSuccess && cur == id) return gpuSuccess;
    return gpuSetDevice(id);
}

#define KVHAL_GPU_TRY(call, id, what)                                                                           \
    do {                                                                                                        \
        gpuError_t kvhal_e_ = (call);                                                                           \
        if (kvhal_e_ != gpuSuccess) return rt_fail(kvhal_e_, (id), (what));                                    \
    } while (0)

#define KVHAL_GPU_SETDEV(id) KVHAL_GPU_TRY(use_device(id), (id), "select device")

/* The per-device error flag, allocated at the first op that can raise it. */
kvhal_status ensure_flag(int32_t id)
{
    if (__atomic_load_n(&g_dev[id].ready, __ATOMIC_ACQUIRE)) return KVHAL_OK;
    kvhal_status st = KVHAL_OK;
    pthread_mutex_lock(&g_lock);
    if (!g_dev[id].ready) {
        void *h = NULL, *d = NULL;
        gpuError_t e = use_device(id);
        if (e == gpuSuccess && alloc_fail()) st = injected(id, "device error flag");
        else if (e == gpuSuccess && (e = gpuMallocHostMapped(&h, KVHAL_GPU_ERR_BYTES)) == gpuSuccess) {
            memset(h, 0, KVHAL_GPU_ERR_BYTES);
            e = gpuHostGetDevicePointer(&d, h, 0);
            if (e != gpuSuccess) (void)gpuFreeHost(h);
        }
        if (st == KVHAL_OK && e != gpuSuccess) st = rt_fail(e, id, "device error flag");
        if (st == KVHAL_OK) {
            g_dev[id].flag = static_cast<uint8_t *>(h);
            g_dev[id].dflag = static_cast<volatile uint8_t *>(d);
            __atomic_store_n(&g_dev[id].ready, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* Reads and clears the flag once the device's work is done (the caller waited). Each byte is exchanged on its own,
 * so a flag raised concurrently by another thread's kernel is reported now or at the next check, never lost. */
kvhal_status read_flag(int32_t id)
{
    if (!__atomic_load_n(&g_dev[id].ready, __ATOMIC_ACQUIRE)) return KVHAL_OK; /* no kernel could raise it */
    uint8_t *f = g_dev[id].flag;
    const bool slot = __atomic_exchange_n(&f[KVHAL_GPU_ERR_SLOT], 0, __ATOMIC_ACQ_REL) != 0;
    const bool block = __atomic_exchange_n(&f[KVHAL_GPU_ERR_BLOCK], 0, __ATOMIC_ACQ_REL) != 0;
    if (!slot && !block) return KVHAL_OK;
    return fail(KVHAL_DEVICE_FAULT, "%s:%d: a kernel skipped out-of-range indices, writing nothing for them:%s%s",
                KVHAL_GPU_NAME, (int)id,
                slot ? " paged_caching slot_mapping entries >= num_blocks * block_size;" : "",
                block ? " copy_blocks block ids out of range;" : "");
}

size_t dtype_size(kvhal_dtype d)
{
    switch (d) {
    case KVHAL_F32: case KVHAL_I32: return 4;
    case KVHAL_F16: case KVHAL_BF16: return 2;
    case KVHAL_FP8_E4M3: case KVHAL_FP8_E5M2: return 1;
    case KVHAL_I64: return 8;
    default: return 0;
    }
}

struct Stream {
    gpuStream_t s;
    int32_t dev;
    bool owned;
};

inline gpuStream_t native_stream(void *stream) { return stream ? static_cast<Stream *>(stream)->s : (gpuStream_t)0; }

/* ------------------------------------------------------------------------------------------------------------ */
/* Devices                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
#if !defined(KVHAL_GPU_HIP)
/* The driver's launch and error-name entry points, taken from the libcuda the runtime has loaded (so the module
 * still links no libcuda); NULL when that fails, and launches then go through the runtime. */
typedef CUresult (*CuLaunchKernelFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     CUstream, void **, void **);
typedef CUresult (*CuGetErrorNameFn)(CUresult, const char **);
CuLaunchKernelFn g_cu_launch;
CuGetErrorNameFn g_cu_error_name;

void resolve_driver_entry_points()
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return;
    void *launch = dlsym(h, "cuLaunchKernel"), *name = dlsym(h, "cuGetErrorName");
    memcpy(&g_cu_launch, &launch, sizeof launch);
    memcpy(&g_cu_error_name, &name, sizeof name);
}
#endif

kvhal_status gpu_init(const kvhal_core_services *services, int32_t *device_count, char *reason, size_t reason_size)
{
    g_svc = services;
    g_count = 0;
    if (!device_count) return fail(KVHAL_INVALID_ARGUMENT, "device_count: NULL");
    *device_count = 0;
    if (reason && reason_size) reason[0] = '\0';
    int n = 0;
    gpuError_t e = gpuGetDeviceCount(&n);
    if (e != gpuSuccess) {
        char d[160];
        describe(e, d, sizeof d);
        if (reason && reason_size) snprintf(reason, reason_size, "%sGetDeviceCount: %s", KVHAL_GPU_NAME, d);
        (void)gpuGetLastError();
        return KVHAL_OK;
    }
    if (n <= 0) {
        if (reason && reason_size) snprintf(reason, reason_size, "no %s device found", KVHAL_GPU_RUNTIME_NAME);
        return KVHAL_OK;
    }
    if (n > KVHAL_MAX_DEVICES_PER_TYPE) {
        if (reason && reason_size)
            snprintf(reason, reason_size, "%d devices present, the first %d are used", n, KVHAL_MAX_DEVICES_PER_TYPE);
        n = KVHAL_MAX_DEVICES_PER_TYPE;
    }
    for (int i = 0; i < n; i++) {
        int sm = 0;
        if (gpuDeviceGetAttribute(&sm, gpuDevAttrMultiProcessorCount, i) != gpuSuccess || sm < 1) sm = 1;
        g_dev[i].sm_count = sm;
    }
    (void)gpuGetLastError();
#if !defined(KVHAL_GPU_HIP)
    resolve_driver_entry_points();
#endif
    g_count = n;
    *device_count = n;
    return KVHAL_OK;
}

void gpu_shutdown()
{
    pthread_mutex_lock(&g_lock);
    for (int32_t i = 0; i < g_count; i++) {
        if (g_dev[i].ready) (void)gpuFreeHost(g_dev[i].flag);
        if (g_dev[i].pool_state > 0) (void)gpuMemPoolTrimTo(g_dev[i].pool, 0); /* buffers may still be alive */
        g_dev[i].flag = NULL;
        g_dev[i].dflag = NULL;
        __atomic_store_n(&g_dev[i].ready, 0, __ATOMIC_RELEASE);
    }
    (void)gpuGetLastError();
    pthread_mutex_unlock(&g_lock);
}

kvhal_status gpu_device_info(int32_t id, kvhal_device_info *out)
{
    if (!out) return fail(KVHAL_INVALID_ARGUMENT, "out: NULL");
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    gpuDeviceProp prop;
    KVHAL_GPU_TRY(gpuGetDeviceProperties(&prop, id), id, "device properties");
    out->device.type = KVHAL_GPU_DEVICE_TYPE;
    out->device.id = id;
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    snprintf(out->backend, sizeof out->backend, "%s", KVHAL_GPU_NAME);
    int rt = 0, drv = 0;
    (void)gpuRuntimeGetVersion(&rt);
    (void)gpuDriverGetVersion(&drv);
    snprintf(out->platform, sizeof out->platform, "%s runtime %d.%d, driver %d.%d", KVHAL_GPU_RUNTIME_NAME,
             rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10);
    out->total_memory = (uint64_t)prop.totalGlobalMem;
    out->free_memory = 0;
    KVHAL_GPU_SETDEV(id);
    size_t fr = 0, tot = 0;
    if (gpuMemGetInfo(&fr, &tot) == gpuSuccess) out->free_memory = (uint64_t)fr;
    out->compute_units = prop.multiProcessorCount;
    out->peer_access = false;
    for (int32_t j = 0; j < g_count; j++) {
        int can = 0;
        if (j != id && gpuDeviceCanAccessPeer(&can, id, j) == gpuSuccess && can) out->peer_access = true;
    }
    (void)gpuGetLastError();
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Buffers and streams                                                                                          */
/* ------------------------------------------------------------------------------------------------------------ */
/* Buffers come from a pool of stream-ordered allocations on the device's default stream: creating and destroying
 * one costs no device-wide synchronisation (cudaFree waits for the whole device) and a destroyed buffer's memory
 * is reused by the next create (a duplicate is an allocation plus a copy). Destroy is ordered after the work of
 * the default stream and of every stream kvhal created (they synchronise with it); while a borrowed stream is alive
 * on the device, which may not, create and destroy wait for the device instead. The pool keeps up to 1/16 of the
 * device's memory across synchronisations and returns the rest. Devices without pools use plain allocations. */
void grant_pool_access(int32_t owner, int32_t accessor)
{
    gpuMemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = gpuMemLocationTypeDevice;
    d.location.id = accessor;
    d.flags = gpuMemAccessFlagsProtReadWrite;
    (void)gpuMemPoolSetAccess(g_dev[owner].pool, &d, 1);
}

/* The caller has selected the device. */
bool pool_ready(int32_t id)
{
    const int st = __atomic_load_n(&g_dev[id].pool_state, __ATOMIC_ACQUIRE);
    if (st) return st > 0;
    pthread_mutex_lock(&g_lock);
    if (!g_dev[id].pool_state) {
        int supported = 0, state = -1;
        size_t fr = 0, total = 0;
        if (gpuDeviceGetAttribute(&supported, gpuDevAttrMemoryPoolsSupported, id) == gpuSuccess && supported &&
            gpuMemGetInfo(&fr, &total) == gpuSuccess) {
            gpuMemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = gpuMemAllocationTypePinned;
            props.handleTypes = gpuMemHandleTypeNone;
            props.location.type = gpuMemLocationTypeDevice;
            props.location.id = id;
            gpuMemPool_t pool;
            void *probe = NULL;
            /* a runtime may create pools and still refuse allocations from them: try one before committing */
            if (gpuMemPoolCreate(&pool, &props) == gpuSuccess &&
                gpuMallocFromPoolAsync(&probe, 256, pool, 0) == gpuSuccess && gpuFreeAsync(probe, 0) == gpuSuccess &&
                gpuStreamSynchronize(0) == gpuSuccess) {
                uint64_t keep = (uint64_t)total / 16;
                (void)gpuMemPoolSetAttribute(pool, gpuMemPoolAttrReleaseThreshold, &keep);
                g_dev[id].pool = pool;
                state = 1;
                for (int32_t j = 0; j < g_count; j++)
                    if (j != id && g_dev[j].peer[id] == 1) grant_pool_access(id, j);
            }
        }
        (void)gpuGetLastError();
        __atomic_store_n(&g_dev[id].pool_state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return __atomic_load_n(&g_dev[id].pool_state, __ATOMIC_ACQUIRE) > 0;
}

kvhal_status gpu_buffer_alloc(int32_t id, size_t bytes, void **native)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    if (!native) return fail(KVHAL_INVALID_ARGUMENT, "native: NULL");
    if (alloc_fail()) return injected(id, "buffer");
    KVHAL_GPU_SETDEV(id);
    void *p = NULL;
    gpuError_t e;
    if (pool_ready(id)) {
        e = gpuMallocFromPoolAsync(&p, bytes, g_dev[id].pool, 0);
        if (e == gpuSuccess && __atomic_load_n(&g_dev[id].wrapped, __ATOMIC_ACQUIRE) > 0) {
            e = gpuStreamSynchronize(0);
            if (e != gpuSuccess) (void)gpuFreeAsync(p, 0);
        }
    } else {
        e = gpuMalloc(&p, bytes);
    }
    if (e != gpuSuccess) {
        (void)gpuGetLastError();
        char d[160];
        describe(e, d, sizeof d);
        return fail(e == gpuErrorMemoryAllocation ? KVHAL_OUT_OF_MEMORY : KVHAL_BACKEND_ERROR,
                    "bytes: %zu on %s:%d: %s", bytes, KVHAL_GPU_NAME, (int)id, d);
    }
    *native = p;
    return KVHAL_OK;
}

kvhal_status gpu_buffer_free(int32_t id, void *native)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(id);
    if (__atomic_load_n(&g_dev[id].pool_state, __ATOMIC_ACQUIRE) > 0) {
        if (__atomic_load_n(&g_dev[id].wrapped, __ATOMIC_ACQUIRE) > 0)
            KVHAL_GPU_TRY(gpuDeviceSynchronize(), id, "free (wait for borrowed streams)");
        KVHAL_GPU_TRY(gpuFreeAsync(native, 0), id, "free");
    } else {
        KVHAL_GPU_TRY(gpuFree(native), id, "free");
    }
    return KVHAL_OK;
}

/* Borrowing checks what the pointer is, so that host memory handed to a GPU device fails here instead of as an
 * illegal address inside a later kernel. */
kvhal_status gpu_buffer_wrap(int32_t id, void *native, size_t bytes)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    int dev = -1, is_device = 0;
    gpuError_t e = gpuPointerDevice(native, &dev, &is_device);
    (void)gpuGetLastError();
    if (e != gpuSuccess || !is_device)
        return fail(KVHAL_INVALID_ARGUMENT, "native: %p (%zu bytes) is not %s device memory", native, bytes,
                    KVHAL_GPU_RUNTIME_NAME);
    if (dev != id)
        return fail(KVHAL_DEVICE_MISMATCH, "native: %p is memory of %s:%d, not of %s:%d", native, KVHAL_GPU_NAME, dev,
                    KVHAL_GPU_NAME, (int)id);
    return KVHAL_OK;
}

kvhal_status gpu_buffer_unwrap(int32_t id, void *native)
{
    (void)native;
    return check_id(id);
}

kvhal_status new_stream(int32_t id, gpuStream_t s, bool owned, void **out)
{
    Stream *w = static_cast<Stream *>(malloc(sizeof(Stream)));
    if (!w) return fail(KVHAL_OUT_OF_MEMORY, "%s:%d: stream wrapper: host allocation failed", KVHAL_GPU_NAME, (int)id);
    w->s = s;
    w->dev = id;
    w->owned = owned;
    *out = w;
    return KVHAL_OK;
}

kvhal_status gpu_stream_create(int32_t id, void **stream)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    if (!stream) return fail(KVHAL_INVALID_ARGUMENT, "stream: NULL");
    if (alloc_fail()) return injected(id, "stream");
    KVHAL_GPU_SETDEV(id);
    gpuStream_t s;
    KVHAL_GPU_TRY(gpuStreamCreate(&s), id, "stream create");
    st = new_stream(id, s, true, stream);
    if (st != KVHAL_OK) (void)gpuStreamDestroy(s);
    return st;
}

kvhal_status gpu_stream_wrap(int32_t id, void *native, void **stream)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    if (!stream) return fail(KVHAL_INVALID_ARGUMENT, "stream: NULL");
    if (alloc_fail()) return injected(id, "stream wrapper");
    st = new_stream(id, static_cast<gpuStream_t>(native), false, stream);
    if (st == KVHAL_OK) __atomic_add_fetch(&g_dev[id].wrapped, 1, __ATOMIC_ACQ_REL);
    return st;
}

kvhal_status gpu_stream_destroy(int32_t id, void *stream)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    Stream *w = static_cast<Stream *>(stream);
    if (!w) return KVHAL_OK;
    gpuError_t e = gpuSuccess;
    if (w->owned) {
        e = use_device(id);
        if (e == gpuSuccess) e = gpuStreamDestroy(w->s);
    } else {
        __atomic_sub_fetch(&g_dev[id].wrapped, 1, __ATOMIC_ACQ_REL);
    }
    free(w);
    if (e != gpuSuccess) return rt_fail(e, id, "stream destroy");
    return KVHAL_OK;
}

kvhal_status gpu_stream_synchronize(int32_t id, void *stream)
{
    KVHAL_GPU_SETDEV(id);
    KVHAL_GPU_TRY(gpuStreamSynchronize(native_stream(stream)), id, "stream synchronize");
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Copies                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */
/* Host copies wait for their stream: the caller may reuse (or free) host memory on return, pinned or not. */
kvhal_status gpu_memcpy_h2d(int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes, void *stream)
{
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    const gpuStream_t s = native_stream(stream);
    KVHAL_GPU_TRY(gpuMemcpyAsync(static_cast<char *>(dst) + dst_off, src, bytes, gpuMemcpyHostToDevice, s), id,
                  "memcpy host to device");
    KVHAL_GPU_TRY(gpuStreamSynchronize(s), id, "memcpy host to device (wait)");
    return KVHAL_OK;
}

kvhal_status gpu_memcpy_d2h(int32_t id, void *dst, const void *src, size_t src_off, size_t bytes, void *stream)
{
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    const gpuStream_t s = native_stream(stream);
    KVHAL_GPU_TRY(gpuMemcpyAsync(dst, static_cast<const char *>(src) + src_off, bytes, gpuMemcpyDeviceToHost, s), id,
                  "memcpy device to host");
    KVHAL_GPU_TRY(gpuStreamSynchronize(s), id, "memcpy device to host (wait)");
    return KVHAL_OK;
}

kvhal_status gpu_memcpy_d2d(int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off, size_t bytes,
                            void *stream)
{
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    KVHAL_GPU_TRY(gpuMemcpyAsync(static_cast<char *>(dst) + dst_off, static_cast<const char *>(src) + src_off, bytes,
                                 gpuMemcpyDeviceToDevice, native_stream(stream)),
                  id, "memcpy device to device");
    return KVHAL_OK;
}

/* Enables direct access between a and b in both directions, once per pair, where the hardware allows it. Without
 * it peer copies still work (the runtime stages them), only slower, so failure here is not an error. */
void enable_peer(int32_t a, int32_t b)
{
    if (__atomic_load_n(&g_dev[a].peer[b], __ATOMIC_ACQUIRE) != 0) return;
    pthread_mutex_lock(&g_lock);
    const int32_t pair[2][2] = {{a, b}, {b, a}};
    for (int k = 0; k < 2; k++) {
        const int32_t x = pair[k][0], y = pair[k][1];
        if (g_dev[x].peer[y] != 0) continue;
        int can = 0;
        signed char state = -1;
        if (gpuDeviceCanAccessPeer(&can, x, y) == gpuSuccess && can && use_device(x) == gpuSuccess) {
            gpuError_t e = gpuDeviceEnablePeerAccess(y, 0);
            if (e == gpuSuccess || e == gpuErrorPeerAccessAlreadyEnabled) state = 1;
            /* buffers of y's pool are mapped for x only on request */
            if (state == 1 && g_dev[y].pool_state > 0) grant_pool_access(y, x);
        }
        (void)gpuGetLastError();
        __atomic_store_n(&g_dev[x].peer[y], state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
}

/* Event ordering of one device's default stream after another's (peer copies on the default streams). */
gpuError_t order_after(int32_t waiter, int32_t signaler)
{
    gpuEvent_t ev;
    gpuError_t e = use_device(signaler);
    if (e != gpuSuccess) return e;
    if ((e = gpuEventCreateWithFlags(&ev, gpuEventDisableTiming)) != gpuSuccess) return e;
    e = gpuEventRecord(ev, 0);
    if (e == gpuSuccess && (e = use_device(waiter)) == gpuSuccess) e = gpuStreamWaitEvent(0, ev, 0);
    (void)gpuEventDestroy(ev); /* released once the wait is satisfied */
    return e;
}

/* stream: the caller's stream (on either device) or NULL: then the copy runs on the source's default stream,
 * ordered after work already queued on the destination's default stream and before work queued there later. */
kvhal_status gpu_memcpy_peer(int32_t dst_id, void *dst, size_t dst_off, int32_t src_id, const void *src,
                             size_t src_off, size_t bytes, void *stream)
{
    kvhal_status st = check_id(dst_id);
    if (st == KVHAL_OK) st = check_id(src_id);
    if (st != KVHAL_OK) return st;
    if (!bytes) return KVHAL_OK;
    if (dst_id == src_id) return gpu_memcpy_d2d(dst_id, dst, dst_off, src, src_off, bytes, stream);
    enable_peer(dst_id, src_id);
    char *d = static_cast<char *>(dst) + dst_off;
    const char *s = static_cast<const char *>(src) + src_off;
    if (stream) {
        Stream *w = static_cast<Stream *>(stream);
        KVHAL_GPU_SETDEV(w->dev);
        KVHAL_GPU_TRY(gpuMemcpyPeerAsync(d, dst_id, s, src_id, bytes, w->s), dst_id, "peer copy");
        return KVHAL_OK;
    }
    KVHAL_GPU_TRY(order_after(src_id, dst_id), dst_id, "peer copy (order after the destination)");
    KVHAL_GPU_SETDEV(src_id);
    KVHAL_GPU_TRY(gpuMemcpyPeerAsync(d, dst_id, s, src_id, bytes, 0), src_id, "peer copy");
    KVHAL_GPU_TRY(order_after(dst_id, src_id), dst_id, "peer copy (order the destination after it)");
    return KVHAL_OK;
}

kvhal_status gpu_memset(int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream)
{
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    KVHAL_GPU_TRY(gpuMemsetAsync(static_cast<char *>(dst) + off, value, bytes, native_stream(stream)), id, "memset");
    return KVHAL_OK;
}

kvhal_status gpu_synchronize(int32_t id)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(id);
    KVHAL_GPU_TRY(gpuDeviceSynchronize(), id, "device synchronize");
    return read_flag(id);
}

/* Waits for work queued on the default stream and, through it, on kvhal's streams; borrowed non-blocking streams
 * are the caller's to wait for. */
kvhal_status gpu_check_errors(int32_t id)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(id);
    KVHAL_GPU_TRY(gpuStreamSynchronize(0), id, "wait for queued work");
    return read_flag(id);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Paged caching                                                                                                */
/* ------------------------------------------------------------------------------------------------------------ */
template <class X> void launch_paged(const PagedParams &p, uint32_t grid, uint32_t threads, gpuStream_t s)
{
    paged_caching_kernel<X, X><<<grid, threads, 0, s>>>(p);
}

/* One instantiation of the paged kernel: its runtime launch, its symbol, and (CUDA, once resolved for the
 * descriptor's device) its driver function, launched through cuLaunchKernel: the runtime's launch path costs
 * about 0.3 us more per call on the H200 VM (docs/measurements/h200-launch-probe.txt). */
struct PagedLaunch {
    void (*run)(const PagedParams &p, uint32_t grid, uint32_t threads, gpuStream_t s);
    const void *sym;
    void *fn;
};

template <class X> PagedLaunch paged_launcher()
{
    PagedLaunch l = {launch_paged<X>, reinterpret_cast<const void *>(paged_caching_kernel<X, X>), nullptr};
    return l;
}

/* l->fn: the driver function of l's kernel on device id, or NULL (HIP, or not resolvable: the runtime launches). */
void resolve_driver_fn(int32_t id, PagedLaunch *l)
{
    l->fn = nullptr;
#if !defined(KVHAL_GPU_HIP)
    cudaFunction_t f;
    if (g_cu_launch && use_device(id) == cudaSuccess && cudaGetFuncBySymbol(&f, l->sym) == cudaSuccess)
        l->fn = static_cast<void *>(f);
    (void)cudaGetLastError();
#else
    (void)id;
#endif
}

struct PagedDesc {
    PagedParams pv, ps;                           /* vector and scalar templates (unit strides, divisors) */
    PagedLaunch vec_mul, vec_div, sc_mul, sc_div;
    uint32_t threads_v, threads_s;
    uint32_t out_align; /* bytes the cache bases need on the vector path (inputs need 16) */
    bool vec_ok, fp8;
};

int kdt(kvhal_dtype d)
{
    switch (d) {
    case KVHAL_F32: return DT_F32;
    case KVHAL_F16: return DT_F16;
    case KVHAL_BF16: return DT_BF16;
    case KVHAL_FP8_E4M3: return DT_E4M3;
    case KVHAL_FP8_E5M2: return DT_E5M2;
    default: return -1;
    }
}

template <int IN, int OUT, bool DIV> PagedLaunch fp8_launcher(bool vec)
{
    return vec ? paged_launcher<XFp8Vec<IN, OUT, DIV>>() : paged_launcher<XFp8Scalar<IN, OUT, DIV>>();
}

template <int IN, bool DIV> PagedLaunch fp8_launcher_out(int out, bool vec)
{
    return out == DT_E4M3 ? fp8_launcher<IN, DT_E4M3, DIV>(vec) : fp8_launcher<IN, DT_E5M2, DIV>(vec);
}

template <bool DIV> PagedLaunch fp8_launcher_in(int in, int out, bool vec)
{
    switch (in) {
    case DT_F32: return fp8_launcher_out<DT_F32, DIV>(out, vec);
    case DT_F16: return fp8_launcher_out<DT_F16, DIV>(out, vec);
    default: return fp8_launcher_out<DT_BF16, DIV>(out, vec);
    }
}

PagedLaunch copy_launcher(size_t es, bool vec)
{
    if (vec) return paged_launcher<XCopy<uint4>>();
    switch (es) {
    case 1: return paged_launcher<XCopy<uint8_t>>();
    case 2: return paged_launcher<XCopy<uint16_t>>();
    default: return paged_launcher<XCopy<uint32_t>>();
    }
}

/* One side in units of n elements (n = 1: scalar path). Strides that cannot matter for this call (a dim of extent
 * 1) are zeroed, so they neither block the vector path nor move an address. False when the vector path is
 * impossible for this side. */
bool build_side(const kvhal_bk_paged_side *s, const kvhal_bk_paged_caching *a, int64_t n, PagedSide *o)
{
    const int64_t heads = a->num_heads, hd = s->head_dim;
    const bool fold = heads == 1 || (s->in_head_stride == hd * s->in_dim_stride &&
                                     s->cache_head_stride == hd * s->cache_dim_stride);
    const int64_t eh = fold ? 1 : heads, ed = fold ? heads * hd : hd; /* heads and elements per head, as walked */
    int64_t tok_outer = a->num_tokens > a->seq_len ? s->tok_stride_outer : 0;
    int64_t tok_inner = (a->seq_len > 1 && a->num_tokens > 1) ? s->tok_stride_inner : 0;
    int64_t in_head = eh > 1 ? s->in_head_stride : 0, cache_head = eh > 1 ? s->cache_head_stride : 0;
    int64_t block_stride = a->num_blocks > 1 ? s->block_stride : 0;
    int64_t offset_stride = a->block_size > 1 ? s->offset_stride : 0;
    int64_t in_dim = ed > 1 ? s->in_dim_stride : 0, cache_dim = ed > 1 ? s->cache_dim_stride : 0;
    if (n > 1) {
        if (ed % n || in_dim != 1 || cache_dim != 1) return false;
        if (tok_outer % n || tok_inner % n || in_head % n || cache_head % n || block_stride % n || offset_stride % n)
            return false;
        tok_outer /= n, tok_inner /= n, in_head /= n, cache_head /= n, block_stride /= n, offset_stride /= n;
        in_dim = cache_dim = 1;
    }
    const int64_t uph = ed / n, row = eh * uph;
    if (uph < 1 || row > (int64_t)(1u << 31) / KVHAL_GPU_MAX_TPC) return false;
    o->cache = NULL;
    o->input = NULL;
    o->block_stride = block_stride;
    o->offset_stride = offset_stride;
    o->cache_head = cache_head;
    o->cache_dim = cache_dim;
    o->tok_outer = tok_outer;
    o->tok_inner = tok_inner;
    o->in_head = in_head;
    o->in_dim = in_dim;
    o->scale = 1.0f;
    o->row_units = (uint32_t)row;
    o->div_row = kvhal_fastdiv32_make((uint32_t)row);
    o->div_head = kvhal_fastdiv32_make((uint32_t)uph);
    return true;
}

/* Tokens per block: enough units per thread to keep KVHAL_GPU_PAGED_UNROLL loads in flight, fewer when the call is too
 * small to fill every multiprocessor several times over. */
void paged_geometry(PagedParams *p, int sm_count, uint32_t *threads)
{
    const uint32_t row = p->k.row_units > p->v.row_units ? p->k.row_units : p->v.row_units;
    int64_t tpc = (int64_t)(KVHAL_GPU_PAGED_THREADS * KVHAL_GPU_PAGED_UNROLL) / row;
    if (tpc < 1) tpc = 1;
    if (tpc > KVHAL_GPU_MAX_TPC) tpc = KVHAL_GPU_MAX_TPC;
    while (tpc > 1 && (p->num_tokens + tpc - 1) / tpc < 4 * (int64_t)sm_count) tpc >>= 1;
    if (tpc > p->num_tokens) tpc = p->num_tokens > 0 ? p->num_tokens : 1;
    p->tpc = (int32_t)tpc;
    const uint64_t work = (uint64_t)tpc * row;
    uint32_t t = KVHAL_GPU_PAGED_THREADS;
    if (work < KVHAL_GPU_PAGED_THREADS) t = (uint32_t)((work + 63) / 64 * 64);
    *threads = t;
}

kvhal_status paged_build(int32_t id, const kvhal_bk_paged_caching *a, PagedDesc *d)
{
    const int in = kdt(a->input_dtype), out = kdt(a->cache_dtype);
    const size_t es = dtype_size(a->input_dtype), out_es = dtype_size(a->cache_dtype);
    const bool same = a->input_dtype == a->cache_dtype;
    if (in < 0 || out < 0 || (!same && in > DT_BF16) || (!same && out < DT_E4M3))
        return fail(KVHAL_UNSUPPORTED, "k_cache.dtype: %s paged caching supports a cache of the input's dtype or "
                    "fp8 from f32/f16/bf16 (input dtype %d, cache dtype %d)", KVHAL_GPU_NAME,
                    (int)a->input_dtype, (int)a->cache_dtype);
    if (a->slot_dtype != KVHAL_I32 && a->slot_dtype != KVHAL_I64)
        return fail(KVHAL_UNSUPPORTED, "slot_mapping.dtype: %d is not i32 or i64", (int)a->slot_dtype);
    if (a->num_heads < 1 || a->k.head_dim < 1 || a->v.head_dim < 1 || a->block_size < 1 || a->seq_len < 1)
        return fail(KVHAL_INVALID_ARGUMENT, "paged caching: heads %d, head dims %d/%d, block size %d, seq_len %lld "
                    "must all be >= 1", (int)a->num_heads, (int)a->k.head_dim, (int)a->v.head_dim,
                    (int)a->block_size, (long long)a->seq_len);
    memset(d, 0, sizeof *d);
    d->fp8 = !same;
    PagedParams base;
    memset(&base, 0, sizeof base);
    base.slot_outer = a->num_tokens > a->seq_len ? a->slot_stride_outer : 0;
    base.slot_inner = a->slot_stride_inner;
    base.seq_len = a->seq_len;
    base.num_tokens = a->num_tokens;
    base.num_slots = a->num_blocks * (int64_t)a->block_size;
    base.block_size = a->block_size;
    base.slot64 = a->slot_dtype == KVHAL_I64;
    base.batched = a->num_tokens > a->seq_len;
    /* block_size is an int32_t, so within fastdiv32's divisor range (<= 2^31) */
    base.fast32 = base.num_slots <= (int64_t)UINT32_MAX && a->num_tokens <= (int64_t)UINT32_MAX &&
                  a->seq_len <= ((int64_t)1 << 31);
    if (base.fast32) {
        base.div_bs = kvhal_fastdiv32_make((uint32_t)a->block_size);
        base.div_seq = kvhal_fastdiv32_make((uint32_t)a->seq_len);
    }
    base.err = g_dev[id].dflag;
    const int sm = g_dev[id].sm_count;

    d->ps = base;
    if (!build_side(&a->k, a, 1, &d->ps.k) || !build_side(&a->v, a, 1, &d->ps.v))
        return fail(KVHAL_UNSUPPORTED, "paged caching: a token row of %d heads x %d/%d dims is too large",
                    (int)a->num_heads, (int)a->k.head_dim, (int)a->v.head_dim);
    paged_geometry(&d->ps, sm, &d->threads_s);

    const int64_t vec = 16 / (int64_t)es; /* elements per 16 input bytes */
    d->pv = base;
    d->vec_ok = build_side(&a->k, a, vec, &d->pv.k) && build_side(&a->v, a, vec, &d->pv.v);
    if (d->vec_ok) paged_geometry(&d->pv, sm, &d->threads_v);
    d->out_align = (uint32_t)(vec * (int64_t)out_es);

    if (same) {
        d->sc_mul = d->sc_div = copy_launcher(es, false);
        d->vec_mul = d->vec_div = copy_launcher(es, true);
    } else {
        d->sc_mul = fp8_launcher_in<false>(in, out, false);
        d->sc_div = fp8_launcher_in<true>(in, out, false);
        d->vec_mul = fp8_launcher_in<false>(in, out, true);
        d->vec_div = fp8_launcher_in<true>(in, out, true);
    }
    resolve_driver_fn(id, &d->vec_mul);
    resolve_driver_fn(id, &d->vec_div);
    resolve_driver_fn(id, &d->sc_mul);
    resolve_driver_fn(id, &d->sc_div);
    return KVHAL_OK;
}

kvhal_status gpu_paged_caching(int32_t id, void *desc, const kvhal_bk_paged_caching *a, void *stream)
{
    PagedDesc local;
    const PagedDesc *d = static_cast<const PagedDesc *>(desc);
    if (!d) {
        kvhal_status st = check_id(id);
        if (st == KVHAL_OK) st = ensure_flag(id);
        if (st == KVHAL_OK) st = paged_build(id, a, &local);
        if (st != KVHAL_OK) return st;
        d = &local;
    }
    if (a->num_tokens <= 0) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    char *kc = static_cast<char *>(a->k.cache) + a->k.cache_offset;
    char *vc = static_cast<char *>(a->v.cache) + a->v.cache_offset;
    const char *ki = static_cast<const char *>(a->k.input) + a->k.input_offset;
    const char *vi = static_cast<const char *>(a->v.input) + a->v.input_offset;
    const bool vec = d->vec_ok && (((uintptr_t)ki | (uintptr_t)vi) & 15u) == 0 &&
                     (((uintptr_t)kc | (uintptr_t)vc) % d->out_align) == 0;
    const bool div = d->fp8 && !(kvhal_gpu_scale_is_pow2(a->k.scale) && kvhal_gpu_scale_is_pow2(a->v.scale));
    PagedParams p = vec ? d->pv : d->ps;
    p.k.cache = kc;
    p.v.cache = vc;
    p.k.input = ki;
    p.v.input = vi;
    if (d->fp8) {
        p.k.scale = div ? a->k.scale : 1.0f / a->k.scale;
        p.v.scale = div ? a->v.scale : 1.0f / a->v.scale;
    }
    p.slots = static_cast<const char *>(a->slots) + a->slots_offset;
    p.num_tokens = a->num_tokens;
    const int64_t grid = (a->num_tokens + p.tpc - 1) / p.tpc;
    if (grid > 0x7fffffff) return fail(KVHAL_UNSUPPORTED, "num_tokens: %lld is too many for one launch",
                                       (long long)a->num_tokens);
    const PagedLaunch &run = vec ? (div ? d->vec_div : d->vec_mul) : (div ? d->sc_div : d->sc_mul);
    const uint32_t threads = vec ? d->threads_v : d->threads_s;
#if !defined(KVHAL_GPU_HIP)
    if (run.fn) {
        void *args[] = {static_cast<void *>(&p)};
        const CUresult r = g_cu_launch(static_cast<CUfunction>(run.fn), (unsigned)grid, 1, 1, threads, 1, 1, 0,
                                       native_stream(stream), args, nullptr);
        if (r == CUDA_SUCCESS) return KVHAL_OK;
        /* a thread that has not used the runtime yet has no current context: the runtime's launch makes one */
        if (r != CUDA_ERROR_INVALID_CONTEXT) {
            const char *name = nullptr;
            if (!g_cu_error_name || g_cu_error_name(r, &name) != CUDA_SUCCESS || !name) name = "unknown error";
            return fail(KVHAL_BACKEND_ERROR, "cuda:%d: paged caching launch: cuLaunchKernel: %s (%d)", (int)id, name,
                        (int)r);
        }
    }
#endif
    run.run(p, (uint32_t)grid, threads, native_stream(stream));
    KVHAL_GPU_TRY(gpuGetLastError(), id, "paged caching launch");
    return KVHAL_OK;
}

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
kvhal_status slot_reserve(int32_t id, StagingSlot *s, size_t bytes)
{
    if (s->cap >= bytes) return KVHAL_OK;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < bytes) cap *= 2;
    if (s->host) (void)gpuFreeHost(s->host);
    if (s->dev) (void)gpuFree(s->dev);
    s->host = s->dev = NULL;
    s->cap = 0;
    if (alloc_fail()) return injected(id, "copy_blocks staging");
    void *h = NULL, *dv = NULL;
    gpuError_t e = gpuMallocHost(&h, cap);
    if (e == gpuSuccess) {
        e = gpuMalloc(&dv, cap);
        if (e != gpuSuccess) (void)gpuFreeHost(h);
    }
    if (e != gpuSuccess) return rt_fail(e, id, "copy_blocks staging");
    s->host = static_cast<char *>(h);
    s->dev = static_cast<char *>(dv);
    s->cap = cap;
    return KVHAL_OK;
}

size_t copy_blocks_bytes(const kvhal_bk_copy_blocks *a)
{
    return (size_t)a->num_caches * sizeof(CacheEntry) + (size_t)a->num_pairs * 2 * sizeof(int64_t);
}

kvhal_status copy_blocks_create(int32_t id, const kvhal_bk_copy_blocks *a, CopyBlocksDesc **out)
{
    if (alloc_fail()) return injected(id, "copy_blocks descriptor");
    CopyBlocksDesc *d = static_cast<CopyBlocksDesc *>(calloc(1, sizeof(CopyBlocksDesc)));
    if (!d) return fail(KVHAL_OUT_OF_MEMORY, "%s:%d: copy_blocks descriptor: host allocation failed",
                        KVHAL_GPU_NAME, (int)id);
    d->id = id;
    gpuError_t e = use_device(id);
    for (int i = 0; i < KVHAL_GPU_RING && e == gpuSuccess; i++) {
        e = gpuEventCreateWithFlags(&d->ring[i].ev, gpuEventDisableTiming);
        d->ring[i].has_ev = e == gpuSuccess;
    }
    if (e != gpuSuccess) {
        kvhal_status st = rt_fail(e, id, "copy_blocks descriptor");
        copy_blocks_destroy(d);
        return st;
    }
    /* The first slot is sized now, so that the first call of a cached descriptor does not allocate. */
    kvhal_status st = slot_reserve(id, &d->ring[0], copy_blocks_bytes(a));
    if (st != KVHAL_OK) {
        copy_blocks_destroy(d);
        return st;
    }
    *out = d;
    return KVHAL_OK;
}

kvhal_status gpu_copy_blocks(int32_t id, void *desc, const kvhal_bk_copy_blocks *a, void *stream)
{
    if (a->num_pairs <= 0 || a->num_caches <= 0) return KVHAL_OK;
    CopyBlocksDesc *d = static_cast<CopyBlocksDesc *>(desc);
    if (!d) { /* a one-off descriptor */
        kvhal_status st = check_id(id);
        if (st == KVHAL_OK) st = ensure_flag(id);
        if (st == KVHAL_OK) st = copy_blocks_create(id, a, &d);
        if (st != KVHAL_OK) return st;
        st = gpu_copy_blocks(id, d, a, stream);
        copy_blocks_destroy(d);
        return st;
    }
    KVHAL_GPU_SETDEV(id);
    StagingSlot *sl = &d->ring[d->next];
    const gpuError_t q = gpuEventQuery(sl->ev);
    if (q == gpuErrorNotReady) KVHAL_GPU_TRY(gpuEventSynchronize(sl->ev), id, "copy_blocks staging wait");
    else if (q != gpuSuccess) return rt_fail(q, id, "copy_blocks staging query");
    const size_t need = copy_blocks_bytes(a);
    kvhal_status st = slot_reserve(id, sl, need);
    if (st != KVHAL_OK) return st;

    CacheEntry *ents = reinterpret_cast<CacheEntry *>(sl->host);
    int64_t largest = 0;
    for (int32_t c = 0; c < a->num_caches; c++) {
        ents[c].base = static_cast<char *>(a->natives[c]) + a->offsets[c];
        ents[c].stride = a->block_strides[c];
        ents[c].bytes = a->block_bytes[c];
        if (a->block_bytes[c] > largest) largest = a->block_bytes[c];
    }
    memcpy(sl->host + (size_t)a->num_caches * sizeof(CacheEntry), a->pairs,
           (size_t)a->num_pairs * 2 * sizeof(int64_t));
    if (largest <= 0) return KVHAL_OK;

    const gpuStream_t s = native_stream(stream);
    KVHAL_GPU_TRY(gpuMemcpyAsync(sl->dev, sl->host, need, gpuMemcpyHostToDevice, s), id, "copy_blocks upload");
    CopyBlocksParams p;
    p.caches = reinterpret_cast<const CacheEntry *>(sl->dev);
    p.pairs = reinterpret_cast<const int64_t *>(sl->dev + (size_t)a->num_caches * sizeof(CacheEntry));
    p.err = g_dev[id].dflag;
    p.num_blocks = a->num_blocks_min;
    p.chunks = (largest + KVHAL_GPU_CHUNK - 1) / KVHAL_GPU_CHUNK;
    p.total = (int64_t)a->num_pairs * a->num_caches * p.chunks;
    p.num_caches = a->num_caches;
    const int64_t cap = (int64_t)g_dev[id].sm_count * 32;
    const uint32_t grid = (uint32_t)(p.total < cap ? p.total : cap);
    copy_blocks_kernel<<<grid, KVHAL_GPU_THREADS, 0, s>>>(p);
    KVHAL_GPU_TRY(gpuGetLastError(), id, "copy_blocks launch");
    KVHAL_GPU_TRY(gpuEventRecord(sl->ev, s), id, "copy_blocks staging event");
    d->next = (d->next + 1) % KVHAL_GPU_RING;
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* copy_batch: ranges travel as kernel parameters, KVHAL_GPU_BATCH_MAX per launch (one launch for a duplicate). */
/* ------------------------------------------------------------------------------------------------------------ */
kvhal_status gpu_copy_batch(int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    if (a->count <= 0) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    const gpuStream_t s = native_stream(stream);
    CopyBatchParams p;
    int32_t i = 0;
    while (i < a->count) {
        p.count = 0;
        uint64_t chunks = 0;
        for (; i < a->count && p.count < KVHAL_GPU_BATCH_MAX; i++) {
            const uint64_t n = a->bytes[i];
            if (!n) continue;
            const uint64_t c = (n + KVHAL_GPU_CHUNK - 1) / KVHAL_GPU_CHUNK;
            if (chunks + c > 0x7fffffffu) {
                if (p.count == 0) /* one range alone too large for a grid: let the copy engine have it */
                    KVHAL_GPU_TRY(gpuMemcpyAsync(static_cast<char *>(a->dst[i]) + a->dst_offsets[i],
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
            chunks += c;
            p.count++;
        }
        if (!p.count) continue;
        p.first[p.count] = (uint32_t)chunks;
        copy_batch_kernel<<<(uint32_t)chunks, KVHAL_GPU_THREADS, 0, s>>>(p);
        KVHAL_GPU_TRY(gpuGetLastError(), id, "copy_batch launch");
    }
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* tensor_copy                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */
typedef void (*TensorCopyLaunch)(const TensorCopyParams &p, uint32_t grid, gpuStream_t s);

template <typename T> void launch_tensor_copy(const TensorCopyParams &p, uint32_t grid, gpuStream_t s)
{
    tensor_copy_kernel<T><<<grid, KVHAL_GPU_THREADS, 0, s>>>(p);
}

/* Unit sizes 1, 2, 4, 8, 16 bytes, by log2. */
const TensorCopyLaunch tc_launchers[5] = {launch_tensor_copy<uint8_t>, launch_tensor_copy<uint16_t>,
                                          launch_tensor_copy<uint32_t>, launch_tensor_copy<uint2>,
                                          launch_tensor_copy<uint4>};

struct TensorCopyDesc {
    TensorCopyParams p[5]; /* by log2(unit bytes); valid where (allowed >> k) & 1 */
    uint32_t allowed;
    uint32_t grid[5];
    size_t bytes;          /* total bytes, for the memcpy path */
    bool memcpy_path;      /* both tensors one contiguous range */
};

/* Drops extent-1 dims and merges neighbours that are contiguous in both tensors, outer to inner. */
kvhal_status tensor_copy_build(int32_t id, const kvhal_bk_tensor_copy *a, TensorCopyDesc *d)
{
    const size_t es = dtype_size(a->dst.dtype);
    if (!es || a->src.dtype != a->dst.dtype || a->src.ndim != a->dst.ndim || a->dst.ndim < 1 ||
        a->dst.ndim > KVHAL_GPU_MAX_DIMS)
        return fail(KVHAL_INVALID_ARGUMENT, "tensor_copy: dtypes %d/%d, ndims %d/%d", (int)a->dst.dtype,
                    (int)a->src.dtype, (int)a->dst.ndim, (int)a->src.ndim);
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
    const int64_t cap = (int64_t)g_dev[id].sm_count * 32;
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
    return KVHAL_OK;
}

kvhal_status gpu_tensor_copy(int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    TensorCopyDesc local;
    const TensorCopyDesc *d = static_cast<const TensorCopyDesc *>(desc);
    if (!d) {
        kvhal_status st = check_id(id);
        if (st == KVHAL_OK) st = tensor_copy_build(id, a, &local);
        if (st != KVHAL_OK) return st;
        d = &local;
    }
    if (!d->bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(id);
    char *dst = static_cast<char *>(a->dst.native) + a->dst.offset;
    const char *src = static_cast<const char *>(a->src.native) + a->src.offset;
    const gpuStream_t s = native_stream(stream);
    if (d->memcpy_path) {
        KVHAL_GPU_TRY(gpuMemcpyAsync(dst, src, d->bytes, gpuMemcpyDeviceToDevice, s), id, "tensor_copy memcpy");
        return KVHAL_OK;
    }
    const uintptr_t align = (uintptr_t)dst | (uintptr_t)src;
    int k = 4;
    while (k > 0 && (!((d->allowed >> k) & 1u) || (align & (((uintptr_t)1 << k) - 1)))) k--;
    if (!((d->allowed >> k) & 1u)) /* only possible for elements wider than their alignment */
        return fail(KVHAL_INVALID_ARGUMENT, "tensor_copy: dst %p / src %p are not aligned to their elements",
                    (void *)dst, (const void *)src);
    TensorCopyParams p = d->p[k];
    p.dst = dst;
    p.src = src;
    tc_launchers[k](p, d->grid[k], s);
    KVHAL_GPU_TRY(gpuGetLastError(), id, "tensor_copy launch");
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Descriptors                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */
kvhal_status gpu_desc_create(int32_t id, kvhal_bk_op op, const void *args, void **desc)
{
    kvhal_status st = check_id(id);
    if (st != KVHAL_OK) return st;
    if (!args || !desc) return fail(KVHAL_INVALID_ARGUMENT, "desc_create: NULL %s", args ? "desc" : "args");
    switch (op) {
    case KVHAL_BK_OP_PAGED_CACHING: {
        st = ensure_flag(id);
        if (st != KVHAL_OK) return st;
        PagedDesc tmp;
        st = paged_build(id, static_cast<const kvhal_bk_paged_caching *>(args), &tmp);
        if (st != KVHAL_OK) return st;
        if (alloc_fail()) return injected(id, "paged caching descriptor");
        PagedDesc *d = static_cast<PagedDesc *>(malloc(sizeof(PagedDesc)));
        if (!d) return fail(KVHAL_OUT_OF_MEMORY, "%s:%d: paged caching descriptor: host allocation failed",
                            KVHAL_GPU_NAME, (int)id);
        *d = tmp;
        *desc = d;
        return KVHAL_OK;
    }
    case KVHAL_BK_OP_COPY_BLOCKS: {
        st = ensure_flag(id);
        if (st != KVHAL_OK) return st;
        CopyBlocksDesc *d = NULL;
        st = copy_blocks_create(id, static_cast<const kvhal_bk_copy_blocks *>(args), &d);
        if (st == KVHAL_OK) *desc = d;
        return st;
    }
    case KVHAL_BK_OP_TENSOR_COPY: {
        TensorCopyDesc tmp;
        st = tensor_copy_build(id, static_cast<const kvhal_bk_tensor_copy *>(args), &tmp);
        if (st != KVHAL_OK) return st;
        if (alloc_fail()) return injected(id, "tensor_copy descriptor");
        TensorCopyDesc *d = static_cast<TensorCopyDesc *>(malloc(sizeof(TensorCopyDesc)));
        if (!d) return fail(KVHAL_OUT_OF_MEMORY, "%s:%d: tensor_copy descriptor: host allocation failed",
                            KVHAL_GPU_NAME, (int)id);
        *d = tmp;
        *desc = d;
        return KVHAL_OK;
    }
    default: return fail(KVHAL_UNSUPPORTED, "op: %d is not a %s op", (int)op, KVHAL_GPU_NAME);
    }
}

void gpu_desc_destroy(int32_t id, kvhal_bk_op op, void *desc)
{
    (void)id;
    if (!desc) return;
    if (op == KVHAL_BK_OP_COPY_BLOCKS) copy_blocks_destroy(static_cast<CopyBlocksDesc *>(desc));
    else free(desc);
}

const kvhal_backend g_table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = KVHAL_GPU_NAME,
    .type = KVHAL_GPU_DEVICE_TYPE,
    .init = gpu_init,
    .shutdown = gpu_shutdown,
    .device_info = gpu_device_info,
    .buffer_alloc = gpu_buffer_alloc,
    .buffer_free = gpu_buffer_free,
    .buffer_wrap = gpu_buffer_wrap,
    .buffer_unwrap = gpu_buffer_unwrap,
    .stream_create = gpu_stream_create,
    .stream_wrap = gpu_stream_wrap,
    .stream_destroy = gpu_stream_destroy,
    .stream_synchronize = gpu_stream_synchronize,
    .memcpy_h2d = gpu_memcpy_h2d,
    .memcpy_d2h = gpu_memcpy_d2h,
    .memcpy_d2d = gpu_memcpy_d2d,
    .memcpy_peer = gpu_memcpy_peer,
    .memset = gpu_memset,
    .synchronize = gpu_synchronize,
    .check_errors = gpu_check_errors,
    .desc_create = gpu_desc_create,
    .desc_destroy = gpu_desc_destroy,
    .paged_caching = gpu_paged_caching,
    .copy_blocks = gpu_copy_blocks,
    .tensor_copy = gpu_tensor_copy,
    .copy_batch = gpu_copy_batch,
};

} // namespace
} // namespace kvhal_gpu

/* The module's one exported symbol. */
extern "C" __attribute__((visibility("default"))) const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version; /* the core checks the table's version against its own range */
    return &kvhal_gpu::g_table;
}

#endif /* KVHAL_GPU_BACKEND_IMPL_H */

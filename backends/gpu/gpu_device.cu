/* gpu_device.cu — the GPU backends' devices: init (which allocates the context), shutdown (which frees it),
 * device info and the per-device error flag. */
#include "gpu_private.h"

namespace kvhal_gpu {

/* ------------------------------------------------------------------------------------------------------------ */
/* The device error flag                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */
kvhal_status ensure_flag(Ctx *c, int32_t id)
{
    DevState *ds = &c->dev[id];
    if (__atomic_load_n(&ds->ready, __ATOMIC_ACQUIRE)) return KVHAL_OK;
    kvhal_status st = KVHAL_OK;
    const DeviceGuard guard;
    pthread_mutex_lock(&c->lock);
    if (!ds->ready) {
        void *h = NULL, *d = NULL;
        gpuError_t e = guard.select(id);
        if (e == gpuSuccess && alloc_fail(c)) st = injected(c, id, "device error flag");
        else if (e == gpuSuccess && (e = gpuMallocHostMapped(&h, KVHAL_GPU_ERR_BYTES)) == gpuSuccess) {
            memset(h, 0, KVHAL_GPU_ERR_BYTES);
            e = gpuHostGetDevicePointer(&d, h, 0);
            if (e != gpuSuccess) (void)gpuFreeHost(h);
        }
        if (st == KVHAL_OK && e != gpuSuccess) st = rt_fail(c, e, id, "device error flag");
        if (st == KVHAL_OK) {
            ds->flag = static_cast<uint8_t *>(h);
            ds->dflag = static_cast<volatile uint8_t *>(d);
            if (c->preload) c->preload(c, id); /* the ops' code, now rather than at the first op (Ctx::preload) */
            __atomic_store_n(&ds->ready, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

kvhal_status open_device(Ctx *c, int32_t id)
{
    if (__atomic_load_n(&c->dev[id].ready, __ATOMIC_ACQUIRE)) return KVHAL_OK;
    /* Relaxed: this thread may be capturing (a caller's first kvhal call inside cudaStreamBeginCapture or
     * torch.cuda.graph); the pinned allocation enqueues nothing, so it is safe to make during a capture. */
    const RelaxedCapture relaxed;
    return ensure_flag(c, id);
}

/* The caller waited for the device's work. Each byte is exchanged on its own, so a flag raised concurrently by
 * another thread's kernel is reported now or at the next check, never lost. */
kvhal_status read_flag(const Ctx *c, int32_t id)
{
    const DevState *ds = &c->dev[id];
    if (!__atomic_load_n(&ds->ready, __ATOMIC_ACQUIRE)) return KVHAL_OK; /* no kernel could raise it */
    uint8_t *f = ds->flag;
    const bool slot = __atomic_exchange_n(&f[KVHAL_GPU_ERR_SLOT], 0, __ATOMIC_ACQ_REL) != 0;
    const bool block = __atomic_exchange_n(&f[KVHAL_GPU_ERR_BLOCK], 0, __ATOMIC_ACQ_REL) != 0;
    if (!slot && !block) return KVHAL_OK;
    return fail(c, KVHAL_DEVICE_FAULT, "%s:%d: a kernel skipped out-of-range indices, writing nothing for them:%s%s",
                KVHAL_GPU_NAME, (int)id,
                slot ? " paged_caching slot_mapping entries >= num_blocks * block_size;" : "",
                block ? " copy_blocks block ids out of range;" : "");
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Devices                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
namespace {

#if !defined(KVHAL_GPU_HIP)
void resolve_driver_entry_points(Ctx *c)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return;
    void *launch = dlsym(h, "cuLaunchKernel"), *name = dlsym(h, "cuGetErrorName");
    memcpy(&c->cu_launch, &launch, sizeof launch);
    memcpy(&c->cu_error_name, &name, sizeof name);
    void *range = dlsym(h, "cuMemGetAddressRange_v2");
    memcpy(&c->cu_mem_range, &range, sizeof range);
    void *fmod = dlsym(h, "cuFuncGetModule"), *count = dlsym(h, "cuModuleGetFunctionCount");
    void *fns = dlsym(h, "cuModuleEnumerateFunctions"), *load = dlsym(h, "cuFuncLoad");
    memcpy(&c->cu_func_module, &fmod, sizeof fmod);
    memcpy(&c->cu_module_count, &count, sizeof count);
    memcpy(&c->cu_module_functions, &fns, sizeof fns);
    memcpy(&c->cu_func_load, &load, sizeof load);
}
#endif

} // namespace

/* The context is allocated whatever the device count, so that every later entry has the core's services. */
kvhal_status gpu_init(const kvhal_core_services *services, void **ctx, int32_t *device_count, char *reason,
                      size_t reason_size)
{
    if (reason && reason_size) reason[0] = '\0';
    if (!ctx || !device_count) {
        const char *what = !ctx ? "ctx: NULL" : "device_count: NULL";
        if (reason && reason_size) snprintf(reason, reason_size, "%s", what);
        if (services && services->set_error) return services->set_error(KVHAL_INVALID_ARGUMENT, "%s", what);
        return KVHAL_INVALID_ARGUMENT;
    }
    *ctx = NULL;
    *device_count = 0;
    Ctx *c = static_cast<Ctx *>(calloc(1, sizeof(Ctx)));
    if (!c) {
        if (reason && reason_size) snprintf(reason, reason_size, "%s context: host allocation failed", KVHAL_GPU_NAME);
        return KVHAL_OUT_OF_MEMORY;
    }
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        if (reason && reason_size) snprintf(reason, reason_size, "%s context: mutex init failed", KVHAL_GPU_NAME);
        return KVHAL_BACKEND_ERROR;
    }
    c->svc = services;
    *ctx = c;
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
        c->dev[i].sm_count = sm;
    }
    (void)gpuGetLastError();
#if !defined(KVHAL_GPU_HIP)
    resolve_driver_entry_points(c);
#endif
    for (int i = 0; i < n; i++) code_path_init(c, i);
    c->count = n;
    *device_count = n;
    return KVHAL_OK;
}

/* Buffers may outlive the module's use (the core calls this at unload): pools are trimmed, not destroyed. */
void gpu_shutdown(void *ctx)
{
    Ctx *c = ctx_of(ctx);
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    for (int32_t i = 0; i < c->count; i++) {
        if (c->dev[i].ready) (void)gpuFreeHost(c->dev[i].flag);
        if (c->dev[i].pool_state > 0) (void)gpuMemPoolTrimTo(c->dev[i].pool, 0);
    }
    (void)gpuGetLastError();
    pthread_mutex_unlock(&c->lock);
    code_path_shutdown(c);
    pthread_mutex_destroy(&c->lock);
    free(c);
}


kvhal_status gpu_device_info(void *ctx, int32_t id, kvhal_device_info *out)
{
    const Ctx *c = ctx_of(ctx);
    if (!out) return fail(c, KVHAL_INVALID_ARGUMENT, "out: NULL");
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    gpuDeviceProp prop;
    KVHAL_GPU_TRY(c, gpuGetDeviceProperties(&prop, id), id, "device properties");
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    int rt = 0, drv = 0;
    (void)gpuRuntimeGetVersion(&rt);
    (void)gpuDriverGetVersion(&drv);
    snprintf(out->platform, sizeof out->platform, "%s runtime %d.%d, driver %d.%d; ", KVHAL_GPU_RUNTIME_NAME,
             rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10);
    const size_t used = strlen(out->platform); /* then which code the device runs (gpu_codepath.cu) */
    code_path_describe(c, id, out->platform + used, sizeof out->platform - used);
    const size_t used2 = strlen(out->platform); /* and the paged kernel's row-form hints: benchmarks print them */
    snprintf(out->platform + used2, sizeof out->platform - used2, "; kernels: %s", KVHAL_GPU_KERNELS_NOTE);
    out->total_memory = (uint64_t)prop.totalGlobalMem;
    out->free_memory = 0;
    KVHAL_GPU_SETDEV(c, id);
    size_t fr = 0, tot = 0;
    if (gpuMemGetInfo(&fr, &tot) == gpuSuccess) out->free_memory = (uint64_t)fr;
    out->compute_units = prop.multiProcessorCount;
    out->peer_access = false;
    for (int32_t j = 0; j < c->count; j++) {
        int can = 0;
        if (j != id && gpuDeviceCanAccessPeer(&can, id, j) == gpuSuccess && can) out->peer_access = true;
    }
    (void)gpuGetLastError();
    return KVHAL_OK;
}

} // namespace kvhal_gpu

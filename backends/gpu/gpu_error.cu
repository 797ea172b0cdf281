/* gpu_error.cu — the errors of the GPU backends, at the bottom of the module (every file uses them, they use no
 * other file): messages through the core, runtime errors, fault injection, host allocations for descriptors, the
 * device-id check. */
#include "gpu_private.h"

namespace kvhal_gpu {

kvhal_status fail(const Ctx *c, kvhal_status st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (c && c->svc && c->svc->set_error) return c->svc->set_error(st, "%s", buf);
    return st;
}

void describe(gpuError_t e, char *buf, size_t size)
{
    const char *str = gpuGetErrorString(e), *name = gpuGetErrorName(e);
    if (!str) str = "unknown error";
    if (!name || !strcmp(str, name)) snprintf(buf, size, "%s (code %d)", str, (int)e);
    else snprintf(buf, size, "%s (%s, code %d)", str, name, (int)e);
}

kvhal_status rt_fail(const Ctx *c, gpuError_t e, int32_t id, const char *what)
{
    (void)gpuGetLastError(); /* so that a later launch check does not report this error again */
    const kvhal_status st = e == gpuErrorMemoryAllocation ? KVHAL_OUT_OF_MEMORY : KVHAL_BACKEND_ERROR;
    char d[160];
    describe(e, d, sizeof d);
    return fail(c, st, "%s:%d: %s: %s", KVHAL_GPU_NAME, (int)id, what, d);
}

bool alloc_fail(const Ctx *c)
{
    const kvhal_core_services *svc = c->svc;
    return svc && svc->struct_size >= offsetof(kvhal_core_services, alloc_should_fail) + sizeof(void *) &&
           svc->alloc_should_fail && svc->alloc_should_fail();
}

kvhal_status injected(const Ctx *c, int32_t id, const char *what)
{
    return fail(c, KVHAL_OUT_OF_MEMORY, "%s:%d: %s: allocation failed (fault injection)", KVHAL_GPU_NAME, (int)id,
                what);
}

kvhal_status host_alloc(const Ctx *c, int32_t id, size_t bytes, const char *what, void **out)
{
    if (alloc_fail(c)) return injected(c, id, what);
    void *p = calloc(1, bytes);
    if (!p) return fail(c, KVHAL_OUT_OF_MEMORY, "%s:%d: %s: host allocation failed", KVHAL_GPU_NAME, (int)id, what);
    *out = p;
    return KVHAL_OK;
}

kvhal_status check_id(const Ctx *c, int32_t id)
{
    if (id < 0 || id >= c->count)
        return fail(c, KVHAL_NO_DEVICE, "id: %s:%d is not present (%d %s devices)", KVHAL_GPU_NAME, (int)id,
                    (int)c->count, KVHAL_GPU_NAME);
    return KVHAL_OK;
}

} // namespace kvhal_gpu

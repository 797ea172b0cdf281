/* init_fails.c — a test-only module with a complete table whose init fails, as a backend does when its driver is
 * missing: the registry must record "init failed: ..." with the module's own reason, register none of its devices,
 * and still let a later module serve the same device type. It claims the hip type, which no other test module does. */
#include <stdio.h>

#include "kvhal_backend.h"

KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version);

static kvhal_status if_init(const kvhal_core_services *services, int32_t *device_count, char *reason,
                            size_t reason_size)
{
    (void)services;
    *device_count = 3; /* must be ignored: init failed */
    snprintf(reason, reason_size, "initfail: simulated driver failure");
    return KVHAL_BACKEND_ERROR;
}

/* The entries below must never run (init failed); they fail loudly if they do. */
static kvhal_status if_info(int32_t id, kvhal_device_info *out)
{
    (void)id;
    (void)out;
    return KVHAL_INTERNAL;
}

static kvhal_status if_alloc(int32_t id, size_t bytes, void **native)
{
    (void)id;
    (void)bytes;
    (void)native;
    return KVHAL_INTERNAL;
}

static kvhal_status if_free(int32_t id, void *native)
{
    (void)id;
    (void)native;
    return KVHAL_INTERNAL;
}

static kvhal_status if_h2d(int32_t id, void *dst, size_t off, const void *src, size_t n, void *s)
{
    (void)id, (void)dst, (void)off, (void)src, (void)n, (void)s;
    return KVHAL_INTERNAL;
}

static kvhal_status if_d2h(int32_t id, void *dst, const void *src, size_t off, size_t n, void *s)
{
    (void)id, (void)dst, (void)off, (void)src, (void)n, (void)s;
    return KVHAL_INTERNAL;
}

static kvhal_status if_d2d(int32_t id, void *dst, size_t doff, const void *src, size_t soff, size_t n, void *s)
{
    (void)id, (void)dst, (void)doff, (void)src, (void)soff, (void)n, (void)s;
    return KVHAL_INTERNAL;
}

static kvhal_status if_sync(int32_t id)
{
    (void)id;
    return KVHAL_INTERNAL;
}

static const kvhal_backend table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "initfail",
    .type = KVHAL_DEVICE_HIP,
    .init = if_init,
    .device_info = if_info,
    .buffer_alloc = if_alloc,
    .buffer_free = if_free,
    .memcpy_h2d = if_h2d,
    .memcpy_d2h = if_d2h,
    .memcpy_d2d = if_d2d,
    .synchronize = if_sync,
};

const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version;
    return &table;
}

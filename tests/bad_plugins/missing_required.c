/* missing_required.c — a test-only module whose table has the right ABI but lacks buffer_alloc: the registry must
 * refuse it ("table lacks the required entry 'buffer_alloc'") before running its init. */
#include "kvhal_backend.h"

KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version);

/* If the registry ran init despite the missing entry, the module would claim 4 devices and the test would see them. */
static kvhal_status mr_init(const kvhal_core_services *services, int32_t *device_count, char *reason,
                            size_t reason_size)
{
    (void)services;
    (void)reason;
    (void)reason_size;
    *device_count = 4;
    return KVHAL_OK;
}

static kvhal_status mr_unsupported_info(int32_t id, kvhal_device_info *out)
{
    (void)id;
    (void)out;
    return KVHAL_UNSUPPORTED;
}

static kvhal_status mr_free(int32_t id, void *native)
{
    (void)id;
    (void)native;
    return KVHAL_UNSUPPORTED;
}

static kvhal_status mr_h2d(int32_t id, void *dst, size_t off, const void *src, size_t n, void *s)
{
    (void)id, (void)dst, (void)off, (void)src, (void)n, (void)s;
    return KVHAL_UNSUPPORTED;
}

static kvhal_status mr_d2h(int32_t id, void *dst, const void *src, size_t off, size_t n, void *s)
{
    (void)id, (void)dst, (void)off, (void)src, (void)n, (void)s;
    return KVHAL_UNSUPPORTED;
}

static kvhal_status mr_d2d(int32_t id, void *dst, size_t doff, const void *src, size_t soff, size_t n, void *s)
{
    (void)id, (void)dst, (void)doff, (void)src, (void)soff, (void)n, (void)s;
    return KVHAL_UNSUPPORTED;
}

static kvhal_status mr_sync(int32_t id)
{
    (void)id;
    return KVHAL_UNSUPPORTED;
}

static const kvhal_backend table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "missingreq",
    .type = KVHAL_DEVICE_CUDA,
    .init = mr_init,
    .device_info = mr_unsupported_info,
    .buffer_alloc = NULL, /* the point of this module */
    .buffer_free = mr_free,
    .memcpy_h2d = mr_h2d,
    .memcpy_d2h = mr_d2h,
    .memcpy_d2d = mr_d2d,
    .synchronize = mr_sync,
};

const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version;
    return &table;
}

/* wrong_abi.c — a test-only backend module built against a future ABI (KVHAL_BACKEND_ABI_VERSION + 1): the registry
 * must list it with the reason "ABI version ... not supported" and never call into its table. */
#include "kvhal_backend.h"

KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version);

/* Every slot is NULL on purpose: a core that looked past the version check would crash here, not pass. */
static const kvhal_backend table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION + 1,
    .struct_size = sizeof(kvhal_backend),
    .name = "wrongabi",
    .type = KVHAL_DEVICE_CUDA,
};

const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version;
    return &table;
}

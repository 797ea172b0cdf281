/* no_entry.c — a test-only module that exports no kvhal_backend_entry (only a misspelt look-alike): the registry must
 * list it with the reason "no 'kvhal_backend_entry' symbol" and keep going. */
#include "kvhal_backend.h"

KVHAL_API const kvhal_backend *kvhal_backend_entry_v2(uint32_t core_abi_version);

const kvhal_backend *kvhal_backend_entry_v2(uint32_t core_abi_version)
{
    (void)core_abi_version;
    return NULL;
}

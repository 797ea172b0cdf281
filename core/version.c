/* version.c — the library's version and the reading of the caller's extensible config structs (a leading
 * struct_size, docs/ABI.md). */
#include <string.h>

#include "error.h"
#include "version.h"

const char *kvhal_version(void) { return KVHAL_LIBRARY_VERSION; }

kvhal_status kvhal__config_in(const void *cfg, void *local, const size_t *known, size_t nknown, const char *arg,
                              const char *init)
{
    KVHAL_CHECK_ARG(cfg, "%s: NULL", arg);
    size_t given;
    memcpy(&given, cfg, sizeof given);
    const size_t current = known[nknown - 1];
    for (size_t i = 0; i < nknown; i++) {
        if (given == known[i]) {
            /* An older caller's struct: what its size covers, the fields added since stay zero (their defaults). */
            memset(local, 0, current);
            memcpy(local, cfg, given);
            return KVHAL_OK;
        }
    }
    if (given == 0)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s->struct_size: 0: initialise the struct with %s", arg, init);
    return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s->struct_size: %zu is not a size of this struct that kvhal %s knows "
                      "(%zu)%s; initialise it with %s", arg, given, KVHAL_LIBRARY_VERSION, current,
                      given > current ? ": the caller was built against a newer kvhal" : "", init);
}

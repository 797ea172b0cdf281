/* version.h — versioned config structs (version.c). */
#ifndef KVHAL_CORE_VERSION_H
#define KVHAL_CORE_VERSION_H

#include "common.h"

/* Copies the caller's config struct cfg (a leading size_t struct_size) into local, whose type is the current one:
 * struct_size must be one of known[0..nknown) (the sizes the struct has had in releases, oldest first, the last
 * = sizeof the current struct); fields past an older caller's size are zero. Otherwise KVHAL_INVALID_ARGUMENT
 * naming arg and the initialiser init ("KVHAL_PAGED_CACHE_CONFIG_INIT"); a NULL cfg too. */
KVHAL_HIDDEN kvhal_status kvhal__config_in(const void *cfg, void *local, const size_t *known, size_t nknown,
                                           const char *arg, const char *init);

#endif

/* common.h — what every core file shares and no file owns: the public headers, the visibility of the core's
 * internal functions, the counts the public enums do not carry, and the handle magics. Definitions only: nothing
 * here is implemented in a .c file. Backends never include it: they see kvhal_backend.h only. */
#ifndef KVHAL_CORE_COMMON_H
#define KVHAL_CORE_COMMON_H

#include <stdatomic.h>

#include "kvhal.h"
#include "kvhal_backend.h"

#define KVHAL_HIDDEN __attribute__((visibility("hidden")))

/* Counts the public enums do not carry (a public *_COUNT would change with every added value). */
#define KVHAL__X_ONE(name, code, msg) +1
enum { KVHAL__STATUS_COUNT = 0 KVHAL_STATUS_MAP(KVHAL__X_ONE) };
#undef KVHAL__X_ONE
enum { KVHAL__DTYPE_COUNT = KVHAL_FP8_E5M2FNUZ + 1, KVHAL__BUILTIN_TYPES = KVHAL_DEVICE_OPENCL + 1 };

/* Handle magics: checked on every use; cleared on destroy so that a double destroy is caught while the memory is
 * still ours (buffers, streams and caches are kept in the live-handle set, handles.h). */
enum {
    KVHAL_MAGIC_BUFFER = 0x4b564246,  /* KVBF */
    KVHAL_MAGIC_STREAM = 0x4b565354,  /* KVST */
    KVHAL_MAGIC_DEAD = 0x44454144,
    KVHAL_MAGIC_HOSTMEM = 0x4b56484d, /* KVHM */
    KVHAL_MAGIC_EVENT = 0x4b564556,   /* KVEV */
};

#endif

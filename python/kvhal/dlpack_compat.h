/* dlpack_compat.h — DLPack for the kvhal Python extension: Debian's libdlpack-dev header, plus the versioned
 * structures of DLPack 1.x where that header predates them (Debian 12 ships 0.6). The declarations below follow
 * the layout that the DLPack 1.0 specification fixes (dlpack.h, "DLManagedTensorVersioned"); they are only used
 * when the installed header does not declare them. */
#ifndef KVHAL_PY_DLPACK_COMPAT_H
#define KVHAL_PY_DLPACK_COMPAT_H

#include <dlpack/dlpack.h>
#include <stdint.h>

#if !defined(DLPACK_MAJOR_VERSION)
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#endif

/* The versioned protocol's major version this module speaks. */
#define KVHAL_PY_DLPACK_MAJOR 1
#define KVHAL_PY_DLPACK_MINOR 0
/* DLPack 1.x type codes for fp8 (kDLFloat8_e4m3fn = 10, kDLFloat8_e5m2 = 12 in dlpack.h 1.1). */
#define KVHAL_PY_DL_FLOAT8_E4M3FN 10
#define KVHAL_PY_DL_FLOAT8_E5M2 12

#endif

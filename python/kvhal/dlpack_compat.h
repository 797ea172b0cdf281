/* dlpack_compat.h — DLPack for the kvhal Python extension: Debian's libdlpack-dev header, plus the versioned
 * structures of DLPack 1.x where that header predates them (Debian 12 ships 0.6). The declarations below follow
 * the layout that the DLPack 1.0 specification fixes (dlpack.h, "DLManagedTensorVersioned"); they are only used
 * when the installed header does not declare them. */
#ifndef KVHAL_PY_DLPACK_COMPAT_H
#define KVHAL_PY_DLPACK_COMPAT_H

#include <stdint.h>

#if !defined(KVHAL_PY_OWN_DLPACK)
#include <dlpack/dlpack.h>
#else
/* No dlpack/dlpack.h on this machine (meson says so): the stable C ABI of the DLPack specification, declared here
 * (device and data-type codes, DLTensor, DLManagedTensor), as the specification lays them out. */
typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0U,
    kDLUInt = 1U,
    kDLFloat = 2U,
    kDLOpaqueHandle = 3U,
    kDLBfloat = 4U,
    kDLComplex = 5U,
} DLDataTypeCode;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
#endif

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

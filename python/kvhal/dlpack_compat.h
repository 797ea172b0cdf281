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

/* The DLPack C exchange API (added by DLPack 1.2): a table of C functions that a producer's *type* offers so that a
 * consumer in C reaches the tensor without calling __dlpack__ (no Python call, no capsule, no stream event). The
 * type attribute is __dlpack_c_exchange_api__ (first spelled __c_dlpack_exchange_api__) and holds either a
 * PyCapsule named "dlpack_exchange_api" whose pointer is the table (the current form; PyTorch's) or, in the first
 * revision, the table's address as a Python int. The table lives as long as the process.
 *
 * Declared under this module's own names (kvpy_*) from the layout the specification fixes, so the build is the same
 * with Debian's 0.6 header, a 1.x header, or a header that declares the table itself. Layout: a stable header (the
 * table's DLPack version, then a pointer to an older table of the same producer or NULL), then five function
 * pointers in this order. Each function returns 0 on success and -1 with a Python exception set (the allocator
 * reports through its callback instead). None of them synchronises streams: a consumer that launches on another
 * stream than current_work_stream's must order the two itself. */
typedef struct kvpy_xapi_header {
    DLPackVersion version;
    struct kvpy_xapi_header *prev_api;
} kvpy_xapi_header;

typedef struct {
    kvpy_xapi_header header;
    /* a new tensor of the producer shaped like the prototype (dtype, ndim, shape, device); unused here */
    int (*managed_tensor_allocator)(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                                    void (*set_error)(void *error_ctx, const char *kind, const char *message));
    /* an owning DLManagedTensorVersioned of the object (released by its deleter); must not be NULL */
    int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
    /* the reverse: a Python object of the producer owning the tensor; unused here */
    int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor, void **out_py_object);
    /* fills a caller-provided DLTensor that borrows the object's data, shape and strides (valid while the object
     * lives and is not resized; nothing to release); may be NULL */
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    /* the producer's current stream of a device (NULL for the default stream or a device without streams) */
    int (*current_work_stream)(DLDeviceType device_type, int32_t device_id, void **out_stream);
} kvpy_xapi;

#define KVPY_XAPI_CAPSULE "dlpack_exchange_api"

/* The versioned protocol's major version this module speaks. */
#define KVHAL_PY_DLPACK_MAJOR 1
#define KVHAL_PY_DLPACK_MINOR 0
/* DLPack's type codes of the fp8 formats (dlpack.h 1.1: kDLFloat8_e4m3fn = 10, kDLFloat8_e4m3fnuz = 11,
 * kDLFloat8_e5m2 = 12, kDLFloat8_e5m2fnuz = 13). Fixed by the specification, so accepted on import whatever the
 * header's age. KVHAL_PY_DL_HAS_FLOAT8: the header declares them (DLPack >= 1.1); exports use them only then, and
 * without them give fp8 tensors as their uint8 bits (consumers of an older DLPack know no float8 codes). */
#define KVHAL_PY_DL_FLOAT8_E4M3FN 10
#define KVHAL_PY_DL_FLOAT8_E4M3FNUZ 11
#define KVHAL_PY_DL_FLOAT8_E5M2 12
#define KVHAL_PY_DL_FLOAT8_E5M2FNUZ 13
#if defined(DLPACK_MAJOR_VERSION) && defined(DLPACK_MINOR_VERSION) &&                                           \
    (DLPACK_MAJOR_VERSION > 1 || (DLPACK_MAJOR_VERSION == 1 && DLPACK_MINOR_VERSION >= 1))
#define KVHAL_PY_DL_HAS_FLOAT8 1
_Static_assert(kDLFloat8_e4m3fn == KVHAL_PY_DL_FLOAT8_E4M3FN && kDLFloat8_e4m3fnuz == KVHAL_PY_DL_FLOAT8_E4M3FNUZ &&
                   kDLFloat8_e5m2 == KVHAL_PY_DL_FLOAT8_E5M2 && kDLFloat8_e5m2fnuz == KVHAL_PY_DL_FLOAT8_E5M2FNUZ,
               "DLPack's float8 codes");
#else
#define KVHAL_PY_DL_HAS_FLOAT8 0
#endif

#endif

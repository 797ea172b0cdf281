/* kvhal.h — the one public header of kvhal: devices, buffers, streams, tensors, errors, ops, KV caches,
 * block pool, prefix cache, cache manager and the descriptor cache. Users include this and nothing else
 * (backend authors also include kvhal_backend.h). */
#ifndef KVHAL_H
#define KVHAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVHAL_API __attribute__((visibility("default")))
#else
#define KVHAL_API
#endif

#define KVHAL_VERSION_MAJOR 0
#define KVHAL_VERSION_MINOR 1
#define KVHAL_VERSION_PATCH 0

/* ------------------------------------------------------------------------------------------------------------ */
/* Errors. One table generates the enum, kvhal_status_name() and kvhal_status_string().                          */
/* ------------------------------------------------------------------------------------------------------------ */
#define KVHAL_STATUS_MAP(X)                                                                                     \
    X(OK, 0, "success")                                                                                         \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                                                  \
    X(OUT_OF_RANGE, 2, "index, size or length out of range")                                                    \
    X(OUT_OF_MEMORY, 3, "out of memory")                                                                        \
    X(NO_DEVICE, 4, "no such device")                                                                           \
    X(BACKEND_UNAVAILABLE, 5, "backend not built or not loaded")                                                \
    X(UNSUPPORTED, 6, "not supported by this backend, dtype or layout")                                         \
    X(DEVICE_MISMATCH, 7, "arguments live on different devices")                                                \
    X(SHAPE_MISMATCH, 8, "tensor shapes do not match")                                                          \
    X(DTYPE_MISMATCH, 9, "tensor dtypes do not match")                                                          \
    X(BACKEND_ERROR, 10, "the device runtime reported an error")                                                \
    X(DEVICE_FAULT, 11, "a device-side check failed (out-of-range index skipped)")                             \
    X(NOT_FOUND, 12, "not found")                                                                               \
    X(BUSY, 13, "resource is locked or in use")                                                                 \
    X(ABI_MISMATCH, 14, "plugin ABI version not supported")                                                     \
    X(LOAD_FAILED, 15, "plugin could not be loaded")                                                            \
    X(INVALID_HANDLE, 16, "handle is NULL, destroyed or of the wrong kind")                                     \
    X(INTEGRITY, 17, "internal consistency check failed")                                                       \
    X(PARSE_ERROR, 18, "malformed input text")                                                                  \
    X(INTERNAL, 19, "internal error")

typedef enum kvhal_status {
#define KVHAL_X_ENUM(name, code, msg) KVHAL_##name = code,
    KVHAL_STATUS_MAP(KVHAL_X_ENUM)
#undef KVHAL_X_ENUM
    KVHAL_STATUS_COUNT
} kvhal_status;

/* "KVHAL_INVALID_ARGUMENT" */
KVHAL_API const char *kvhal_status_name(kvhal_status s);
/* "invalid argument" */
KVHAL_API const char *kvhal_status_string(kvhal_status s);
/* Thread-local message of the last failing call on this thread, naming the argument and value at fault.
 * Never NULL; "" when no call failed yet. Valid until the next kvhal call on this thread. */
KVHAL_API const char *kvhal_last_error(void);
KVHAL_API void kvhal_clear_error(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* Devices                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
/* The device and registry calls below (parse through get_proc_address):
 * - Threads: any of them may be called from several threads at once. Module discovery runs once, on the first call
 *   that needs it; kvhal_backend_load is serialised with it; lookups afterwards take no lock.
 * - GPU graphs: none of them enqueues device work, so none is recorded in a graph. The first call of the process
 *   initialises the device runtimes (discovery), so make it before a capture starts. kvhal_device_synchronize and
 *   kvhal_device_check_errors wait for the device and must not be called while one of its streams is captured.
 * - Ownership: they take nothing from the caller (strings are read during the call) and hand out no memory the
 *   caller frees. Registered names, module infos and extras stay valid for the life of the process (modules are
 *   never unloaded).
 * - Bad input: a NULL out pointer or string is KVHAL_INVALID_ARGUMENT naming the argument; an unregistered type
 *   is KVHAL_INVALID_ARGUMENT (by id) or KVHAL_PARSE_ERROR / KVHAL_NOT_FOUND (by name); a registered type that no
 *   loaded module serves is KVHAL_BACKEND_UNAVAILABLE; an id out of range is KVHAL_NO_DEVICE. */

/* Device types. The four built-in names keep these ids whether or not their module is loaded; a module serving
 * another name ("npu") is given the next free id when it loads (kvhal_device_type_find looks it up). */
typedef enum kvhal_device_type {
    KVHAL_DEVICE_CPU = 0,
    KVHAL_DEVICE_CUDA = 1,
    KVHAL_DEVICE_HIP = 2,
    KVHAL_DEVICE_OPENCL = 3,
    KVHAL_DEVICE_BUILTIN_TYPE_COUNT = 4
} kvhal_device_type;

/* Bounds: type ids are below KVHAL_MAX_DEVICE_TYPES (a module past it is listed as not loaded, with that reason),
 * device ids below KVHAL_MAX_DEVICES_PER_TYPE, type names shorter than KVHAL_DEVICE_TYPE_NAME_MAX. */
#define KVHAL_MAX_DEVICE_TYPES 16
#define KVHAL_MAX_DEVICES_PER_TYPE 64
#define KVHAL_DEVICE_TYPE_NAME_MAX 16

typedef struct kvhal_device {
    kvhal_device_type type;
    int32_t id;
} kvhal_device;

typedef struct kvhal_device_info {
    kvhal_device device;
    char name[256];       /* "NVIDIA H100 80GB HBM3", "pthread-AMD EPYC..." */
    char backend[KVHAL_DEVICE_TYPE_NAME_MAX]; /* the device type's name: "cpu", "cuda", "npu" */
    char platform[128];   /* OpenCL platform name; runtime name otherwise */
    uint64_t total_memory; /* bytes */
    uint64_t free_memory;  /* bytes, 0 when the runtime cannot tell */
    int32_t compute_units;
    bool peer_access;      /* can copy directly to other devices of its type */
} kvhal_device_info;

/* "cpu" | "cpu:0" | "cuda" | "cuda:1" | "opencl:2" | "npu:0": a registered device type name, optionally followed
 * by :<id> (a missing id means 0). The type must be registered (built in, or served by a loaded module); whether
 * the device is present is not checked (kvhal_device_count tells). Loads the backend modules on first use. */
KVHAL_API kvhal_status kvhal_device_parse(const char *text, kvhal_device *out);
/* Writes "cuda:1" into buf (always NUL-terminated). */
KVHAL_API kvhal_status kvhal_device_format(kvhal_device dev, char *buf, size_t buf_size);
/* "cuda"; the name a module registered for types past the built-in ones; "invalid" for an unregistered id. */
KVHAL_API const char *kvhal_device_type_name(kvhal_device_type t);
/* The id of a registered type name; KVHAL_NOT_FOUND (naming the registered ones) otherwise. */
KVHAL_API kvhal_status kvhal_device_type_find(const char *name, kvhal_device_type *out);
/* The device KVHAL_DEVICE names (unset or empty = cpu:0). A malformed value or a device that is not present
 * is an error; there is no silent fallback. */
KVHAL_API kvhal_status kvhal_device_default(kvhal_device *out);
/* Number of present devices of a type (0 when no loaded module serves it). */
KVHAL_API kvhal_status kvhal_device_count(kvhal_device_type type, int32_t *count);
KVHAL_API kvhal_status kvhal_device_get_info(kvhal_device dev, kvhal_device_info *out);
/* Waits for all work on the device and reports (and clears) its device-side error flag: KVHAL_DEVICE_FAULT
 * when a kernel skipped an out-of-range index since the last check. */
KVHAL_API kvhal_status kvhal_device_synchronize(kvhal_device dev);
/* Like synchronize, but only reads the device-side error flag (it waits for work already queued). */
KVHAL_API kvhal_status kvhal_device_check_errors(kvhal_device dev);

/* Backend modules the registry found (for kvhal-info). Index 0..count-1. The CPU backend is built in. */
typedef struct kvhal_backend_module_info {
    char name[32];        /* the module's own name ("cuda", "acme-npu"), else taken from its file name */
    char device_type[KVHAL_DEVICE_TYPE_NAME_MAX]; /* the type it serves ("" if it never said) */
    int32_t type_id;      /* the id that type was given; -1 when the module is not loaded */
    char path[1024];      /* file loaded, "(built in)" for cpu */
    uint32_t abi_version; /* the table's version, 0 if it never loaded */
    bool loaded;
    int32_t device_count;
    char reason[512];     /* why not loaded, or why zero devices ("no CUDA driver: ...") */
} kvhal_backend_module_info;
KVHAL_API kvhal_status kvhal_backend_module_count(int32_t *count);
KVHAL_API kvhal_status kvhal_backend_module_get(int32_t index, kvhal_backend_module_info *out);
/* Loads one more backend module by path after discovery (a vendor runtime registering its plugin itself); the
 * module stays loaded until the process exits. Not filtered by KVHAL_BACKENDS. OK when
 * it loaded; otherwise KVHAL_LOAD_FAILED (no such file, no entry symbol, bad table, init failed, its type name is
 * taken or the type bound is reached) or KVHAL_ABI_MISMATCH, with the reason, and the module is listed as not
 * loaded. Loading the same file twice returns OK the second time without loading it again. */
KVHAL_API kvhal_status kvhal_backend_load(const char *path);
/* A backend-specific extra that the module serving type exports by name (kvhal_backend.h, get_proc_address):
 * KVHAL_NOT_FOUND when it has none of that name, KVHAL_BACKEND_UNAVAILABLE when no module serves type. *out is
 * the module's (a function or object of the type its documentation gives), valid while the process runs. */
KVHAL_API kvhal_status kvhal_backend_get_proc_address(kvhal_device_type type, const char *name, void **out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams and buffers                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct kvhal_stream kvhal_stream; /* NULL everywhere means the device's default stream */
typedef struct kvhal_buffer kvhal_buffer;

KVHAL_API kvhal_status kvhal_stream_create(kvhal_device dev, kvhal_stream **out);
/* Borrows a native cudaStream_t / hipStream_t / cl_command_queue; never destroyed by kvhal. */
KVHAL_API kvhal_status kvhal_stream_wrap(kvhal_device dev, void *native, kvhal_stream **out);
KVHAL_API kvhal_status kvhal_stream_destroy(kvhal_stream *s);
KVHAL_API kvhal_status kvhal_stream_synchronize(kvhal_stream *s);
KVHAL_API kvhal_device kvhal_stream_device(const kvhal_stream *s);

KVHAL_API kvhal_status kvhal_buffer_create(kvhal_device dev, size_t bytes, kvhal_buffer **out);
/* Borrows memory the caller owns, without copying: a host pointer (cpu), a device pointer (cuda, hip) or a
 * cl_mem (opencl). kvhal never frees it. */
KVHAL_API kvhal_status kvhal_buffer_wrap(kvhal_device dev, void *native, size_t bytes, kvhal_buffer **out);
KVHAL_API kvhal_status kvhal_buffer_destroy(kvhal_buffer *buf);
KVHAL_API size_t kvhal_buffer_size(const kvhal_buffer *buf);
KVHAL_API kvhal_device kvhal_buffer_device(const kvhal_buffer *buf);
/* The host pointer, device pointer or cl_mem. */
KVHAL_API void *kvhal_buffer_native(const kvhal_buffer *buf);

/* Host<->device copies return once host memory may be reused (they are ordered after earlier work on s).
 * Device->device copies and memset are asynchronous on s; the two buffers may be on different devices
 * (peer copy; staged through the host where the devices cannot reach each other). */
KVHAL_API kvhal_status kvhal_memcpy_h2d(kvhal_buffer *dst, size_t dst_offset, const void *src, size_t bytes,
                                        kvhal_stream *s);
KVHAL_API kvhal_status kvhal_memcpy_d2h(void *dst, const kvhal_buffer *src, size_t src_offset, size_t bytes,
                                        kvhal_stream *s);
KVHAL_API kvhal_status kvhal_memcpy_d2d(kvhal_buffer *dst, size_t dst_offset, const kvhal_buffer *src,
                                        size_t src_offset, size_t bytes, kvhal_stream *s);
KVHAL_API kvhal_status kvhal_memset(kvhal_buffer *dst, size_t offset, int value, size_t bytes, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Tensors: plain values, views never allocate                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
/** Element types. Inputs of the ops are f32/f16/bf16; caches may also be any of the four fp8 formats (the OCP
 *  e4m3fn and e5m2, AMD's e4m3fnuz and e5m2fnuz); i32/i64 are slot and index types. */
typedef enum kvhal_dtype {
    KVHAL_F32 = 0,
    KVHAL_F16 = 1,
    KVHAL_BF16 = 2,
    KVHAL_FP8_E4M3 = 3,
    KVHAL_FP8_E5M2 = 4,
    KVHAL_I32 = 5,
    KVHAL_I64 = 6,
    /** AMD's fp8 e4m3 "fnuz" (MI300-class GPUs): exponent bias 8, largest finite 240, no infinities, no negative
     *  zero, one NaN (0x80). A cache dtype like the other fp8 formats. */
    KVHAL_FP8_E4M3FNUZ = 7,
    /** AMD's fp8 e5m2 "fnuz": exponent bias 16, largest finite 57344, no infinities, no negative zero, one NaN
     *  (0x80). */
    KVHAL_FP8_E5M2FNUZ = 8,
    KVHAL_DTYPE_COUNT
} kvhal_dtype;

#define KVHAL_MAX_DIMS 6

typedef struct kvhal_tensor {
    kvhal_buffer *buffer;
    size_t offset;                     /* bytes from the buffer's start */
    kvhal_dtype dtype;
    int32_t ndim;                      /* 1..KVHAL_MAX_DIMS */
    int64_t shape[KVHAL_MAX_DIMS];
    int64_t strides[KVHAL_MAX_DIMS];   /* in elements, >= 0 */
} kvhal_tensor;

KVHAL_API size_t kvhal_dtype_size(kvhal_dtype dt); /* 0 for an invalid dtype */
KVHAL_API const char *kvhal_dtype_name(kvhal_dtype dt);
/* strides NULL = row-major contiguous. Checks dtype, ndim, shape >= 0, strides >= 0 and that every element
 * lies inside the buffer. */
KVHAL_API kvhal_status kvhal_tensor_make(kvhal_buffer *buf, size_t offset, kvhal_dtype dt, int32_t ndim,
                                         const int64_t *shape, const int64_t *strides, kvhal_tensor *out);
/* Full validation of a tensor value built by hand. */
KVHAL_API kvhal_status kvhal_tensor_validate(const kvhal_tensor *t);
KVHAL_API int64_t kvhal_tensor_numel(const kvhal_tensor *t);
KVHAL_API bool kvhal_tensor_is_contiguous(const kvhal_tensor *t);
/* Bytes from the first to one past the last element (0 for an empty tensor). */
KVHAL_API size_t kvhal_tensor_span_bytes(const kvhal_tensor *t);
KVHAL_API kvhal_status kvhal_tensor_narrow(const kvhal_tensor *t, int32_t dim, int64_t start, int64_t length,
                                           kvhal_tensor *out);
KVHAL_API kvhal_status kvhal_tensor_select(const kvhal_tensor *t, int32_t dim, int64_t index, kvhal_tensor *out);
KVHAL_API kvhal_status kvhal_tensor_permute(const kvhal_tensor *t, const int32_t *perm, kvhal_tensor *out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Ops (validate -> the device's backend -> descriptor cache -> backend call). Asynchronous on GPU backends.     */
/* ------------------------------------------------------------------------------------------------------------ */
/* dst = src elementwise (same shape and dtype, same device, any strides). Elements are copied in parallel on
 * devices: dst must not overlap src (unless it is the same view) nor itself (a stride 0 of a dim longer than 1),
 * or the result differs between backends. */
KVHAL_API kvhal_status kvhal_tensor_copy(const kvhal_tensor *dst, const kvhal_tensor *src, kvhal_stream *s);

/* The paged-caching op. Caches are 4-D in logical order [blocks, block_size, heads, dim] with any strides
 * (NHD: contiguous; HND: a view permuted from [blocks, heads, block_size, dim]). k, v are [tokens, heads, dim]
 * or [batch, seq, heads, dim] with any strides. slot_mapping is i32 or i64 [tokens] (or [batch, seq]), on the
 * caches' device. Token t goes to block slot/block_size, offset slot%block_size; slot < 0 is padding.
 * A slot >= blocks*block_size is never written: with host-readable slots (cpu) the call fails before writing;
 * on GPUs the kernel skips it and sets the device error flag that kvhal_device_synchronize reports.
 * Cache dtype may be FP8 while k/v are f32/f16/bf16: value/scale is rounded to nearest even, saturating. */
KVHAL_API kvhal_status kvhal_paged_caching(const kvhal_tensor *k_cache, const kvhal_tensor *v_cache,
                                           const kvhal_tensor *k, const kvhal_tensor *v,
                                           const kvhal_tensor *slot_mapping, float k_scale, float v_scale,
                                           kvhal_stream *s);

/* Copies whole blocks src->dst in every cache of caches[0..num_caches) (e.g. K and V of every layer) in one
 * call. Each cache has the block index as dim 0 and its other dims dense row-major (one block = one contiguous
 * byte range). pairs holds num_pairs (src, dst) block ids on the host. All caches on one device. Devices copy
 * the pairs in parallel: a destination block must not be the source or destination of another pair (checked,
 * KVHAL_INVALID_ARGUMENT; a pair may copy a block onto itself, which writes nothing). */
KVHAL_API kvhal_status kvhal_copy_blocks(const kvhal_tensor *caches, int32_t num_caches, const int64_t *pairs,
                                         int32_t num_pairs, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* FP8 helpers (the host reference of the conversion the kernels do)                                            */
/* ------------------------------------------------------------------------------------------------------------ */
/** Rounds x to an fp8 code: round to nearest, ties to even, saturating (a finite value or infinity beyond the
 *  largest finite magnitude gives that magnitude with x's sign).
 *  @param x        any f32 (NaN included)
 *  @param fp8_type KVHAL_FP8_E4M3 (e4m3fn: NaN 0x7f|sign), KVHAL_FP8_E5M2 (NaN 0x7f|sign), KVHAL_FP8_E4M3FNUZ or
 *                  KVHAL_FP8_E5M2FNUZ (NaN 0x80; a result that rounds to zero is 0x00 whatever x's sign, since
 *                  0x80 is the NaN); any other value is taken as KVHAL_FP8_E4M3
 *  @return the code. Thread safety: pure function. Graph capture: host only, enqueues nothing. */
KVHAL_API uint8_t kvhal_f32_to_fp8(float x, kvhal_dtype fp8_type);
/** The value of an fp8 code (exact).
 *  @param x        the code
 *  @param fp8_type as for kvhal_f32_to_fp8 (an fnuz code 0x80 is NaN; e5m2's 0x7c/0xfc are +-inf)
 *  @return the value as f32. Thread safety: pure function. Graph capture: host only, enqueues nothing. */
KVHAL_API float kvhal_fp8_to_f32(uint8_t x, kvhal_dtype fp8_type);
KVHAL_API uint16_t kvhal_f32_to_f16(float x);
KVHAL_API float kvhal_f16_to_f32(uint16_t x);
KVHAL_API uint16_t kvhal_f32_to_bf16(float x);
KVHAL_API float kvhal_bf16_to_f32(uint16_t x);

/* ------------------------------------------------------------------------------------------------------------ */
/* Descriptor cache: per thread, per (device type, device id), per op kind, an LRU of descriptors keyed by exact */
/* tensor metadata. Public so that engines can cache their own descriptors (GEMM, RMSNorm, RoPE, ...).            */
/* ------------------------------------------------------------------------------------------------------------ */
#define KVHAL_DESC_KEY_MAX_WORDS 96
typedef struct kvhal_desc_key {
    uint64_t hash;     /* hash_combine over words, constant 0x9e3779b9 */
    uint32_t op;       /* op kind */
    uint32_t nwords;
    uint64_t words[KVHAL_DESC_KEY_MAX_WORDS];
} kvhal_desc_key;

typedef int32_t kvhal_op_kind;
/* Built-in op kinds are registered by the library; user kinds come after them. */
typedef void (*kvhal_desc_destroy_fn)(void *desc, kvhal_device dev, void *user);

KVHAL_API kvhal_status kvhal_desc_key_init(kvhal_desc_key *key, kvhal_op_kind op);
/* Appends dtype, ndim, shape and strides (not the buffer or offset). */
KVHAL_API kvhal_status kvhal_desc_key_add_tensor(kvhal_desc_key *key, const kvhal_tensor *t);
KVHAL_API kvhal_status kvhal_desc_key_add_u64(kvhal_desc_key *key, uint64_t v);
KVHAL_API bool kvhal_desc_key_equal(const kvhal_desc_key *a, const kvhal_desc_key *b);

/* Registers an op kind: name (copied) and the function that destroys its descriptors (called on eviction,
 * clear, thread exit and library unload, on the thread that owns the cache). */
KVHAL_API kvhal_status kvhal_desc_op_register(const char *name, kvhal_desc_destroy_fn destroy, void *user,
                                              kvhal_op_kind *out);
KVHAL_API kvhal_status kvhal_desc_op_find(const char *name, kvhal_op_kind *out);
/* Capacity of every LRU of this op kind (all threads, all devices). 0 disables caching for the op. */
KVHAL_API kvhal_status kvhal_desc_cache_set_capacity(kvhal_op_kind op, size_t capacity);
KVHAL_API kvhal_status kvhal_desc_cache_get_capacity(kvhal_op_kind op, size_t *capacity);
/* KVHAL_NOT_FOUND on a miss (no error message is set for a miss). */
KVHAL_API kvhal_status kvhal_desc_cache_get(kvhal_device dev, const kvhal_desc_key *key, void **desc);
/* Takes ownership of desc (on an error status the caller keeps it). Evicts the least recently used entry of that
 * (device, op) when full. Replacing an existing key destroys the old descriptor. With capacity 0 the descriptor
 * is destroyed at once. */
KVHAL_API kvhal_status kvhal_desc_cache_put(kvhal_device dev, const kvhal_desc_key *key, void *desc);
typedef struct kvhal_desc_cache_stats {
    uint64_t hits, misses, evictions, inserts;
    size_t size, capacity;
} kvhal_desc_cache_stats;
/* This thread's stats for (dev, op). */
KVHAL_API kvhal_status kvhal_desc_cache_get_stats(kvhal_device dev, kvhal_op_kind op, kvhal_desc_cache_stats *out);
/* Destroys this thread's descriptors of dev (all op kinds). */
KVHAL_API kvhal_status kvhal_desc_cache_clear(kvhal_device dev);

/* ------------------------------------------------------------------------------------------------------------ */
/* Contiguous multi-device cache: per device, per layer, K [max_len, nkvh/ndev, dk] and V [max_len, nkvh/ndev, dv] */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct kvhal_kv_cache kvhal_kv_cache;
typedef struct kvhal_kv_cache_config {
    int32_t num_layers, num_kv_heads, head_dim_k, head_dim_v;
    int64_t max_len;
    kvhal_dtype dtype;
    int32_t num_devices;
    const kvhal_device *devices; /* num_devices entries; heads are split evenly between them */
} kvhal_kv_cache_config;
KVHAL_API kvhal_status kvhal_kv_cache_create(const kvhal_kv_cache_config *cfg, kvhal_kv_cache **out);
/* A new cache of the same shape holding the first seq_len tokens of src (seq_len <= max_len). */
KVHAL_API kvhal_status kvhal_kv_cache_duplicate(const kvhal_kv_cache *src, int64_t seq_len, kvhal_kv_cache **out);
KVHAL_API kvhal_status kvhal_kv_cache_destroy(kvhal_kv_cache *c);
/* Views of device index di's K and V for a layer: [max_len, nkvh/ndev, dk|dv]. */
KVHAL_API kvhal_status kvhal_kv_cache_layer(const kvhal_kv_cache *c, int32_t device_index, int32_t layer,
                                            kvhal_tensor *k, kvhal_tensor *v);

/* ------------------------------------------------------------------------------------------------------------ */
/* Static cache: [layers, batch, heads, max_len, dim] per rank                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct kvhal_static_cache kvhal_static_cache;
typedef struct kvhal_static_cache_config {
    int32_t num_layers, batch, num_heads_k, num_heads_v, head_dim_k, head_dim_v;
    int64_t max_len;
    kvhal_dtype dtype;
    kvhal_device device;
} kvhal_static_cache_config;
KVHAL_API kvhal_status kvhal_static_cache_create(const kvhal_static_cache_config *cfg, kvhal_static_cache **out);
KVHAL_API kvhal_status kvhal_static_cache_destroy(kvhal_static_cache *c);
/* k: [batch, heads_k, seq, dk], v: [batch, heads_v, seq, dv] (any strides, cache's dtype, cache's device).
 * Writes positions [cache_pos, cache_pos+seq) and returns views of the history [batch, heads, cache_pos+seq, dim]. */
KVHAL_API kvhal_status kvhal_static_cache_update(kvhal_static_cache *c, int32_t layer, const kvhal_tensor *k,
                                                 const kvhal_tensor *v, int64_t cache_pos, kvhal_tensor *k_hist,
                                                 kvhal_tensor *v_hist, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Paged cache                                                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
typedef enum kvhal_paged_layout {
    KVHAL_LAYOUT_NHD = 0, /* a block is [block_size, heads, dim] */
    KVHAL_LAYOUT_HND = 1  /* a block is [heads, block_size, dim] */
} kvhal_paged_layout;
typedef enum kvhal_paged_order {
    KVHAL_LAYER_FIRST = 0, /* [layers][K|V][blocks][block]: each layer's K (and V) is one dense array */
    KVHAL_PAGE_FIRST = 1   /* [blocks][layers][K|V][block]: a block of all layers is contiguous */
} kvhal_paged_order;
typedef struct kvhal_paged_cache kvhal_paged_cache;
typedef struct kvhal_paged_cache_config {
    int32_t num_layers, num_heads, head_dim, block_size;
    kvhal_dtype dtype;           /* f32, f16, bf16, or an fp8 format (fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz, fp8_e5m2fnuz) */
    kvhal_paged_layout layout;
    kvhal_paged_order order;
    uint64_t memory_budget;      /* bytes for K and V of all layers; the block count follows */
    kvhal_device device;
    float k_scale, v_scale;      /* fp8 scales (0 means 1) */
} kvhal_paged_cache_config;
KVHAL_API kvhal_status kvhal_paged_cache_create(const kvhal_paged_cache_config *cfg, kvhal_paged_cache **out);
KVHAL_API kvhal_status kvhal_paged_cache_destroy(kvhal_paged_cache *c);
KVHAL_API int64_t kvhal_paged_cache_num_blocks(const kvhal_paged_cache *c);
/* Views [blocks, block_size, heads, dim] (logical order, layout in the strides). */
KVHAL_API kvhal_status kvhal_paged_cache_layer(const kvhal_paged_cache *c, int32_t layer, kvhal_tensor *k,
                                               kvhal_tensor *v);
KVHAL_API kvhal_status kvhal_paged_cache_update(kvhal_paged_cache *c, int32_t layer, const kvhal_tensor *k,
                                                const kvhal_tensor *v, const kvhal_tensor *slot_mapping,
                                                kvhal_stream *s);
/* copy_blocks over every layer's K and V. */
KVHAL_API kvhal_status kvhal_paged_cache_copy_blocks(kvhal_paged_cache *c, const int64_t *pairs, int32_t num_pairs,
                                                     kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Block pool: O(1) allocate/free of block ids with reference counts                                             */
/* ------------------------------------------------------------------------------------------------------------ */
/* For engines that keep their own block tables (vLLM-style): shared prefixes and copy-on-write by reference count.
 * The cache manager does not use it (it tracks page owners in bitmaps); it stands on its own. */
typedef struct kvhal_block_pool kvhal_block_pool;
KVHAL_API kvhal_status kvhal_block_pool_create(int32_t num_blocks, kvhal_block_pool **out);
KVHAL_API kvhal_status kvhal_block_pool_destroy(kvhal_block_pool *p);
/* All n or none (KVHAL_OUT_OF_MEMORY when fewer than n are free). Each gets ref count 1. */
KVHAL_API kvhal_status kvhal_block_pool_allocate(kvhal_block_pool *p, int32_t n, int32_t *blocks);
/* +1 reference (share, fork). */
KVHAL_API kvhal_status kvhal_block_pool_share(kvhal_block_pool *p, int32_t block);
/* -1 reference; the block is free again at 0. */
KVHAL_API kvhal_status kvhal_block_pool_release(kvhal_block_pool *p, int32_t block);
KVHAL_API int32_t kvhal_block_pool_num_free(const kvhal_block_pool *p);
KVHAL_API int32_t kvhal_block_pool_num_total(const kvhal_block_pool *p);
KVHAL_API int32_t kvhal_block_pool_ref_count(const kvhal_block_pool *p, int32_t block); /* -1 if out of range */
KVHAL_API kvhal_status kvhal_block_pool_check_integrity(const kvhal_block_pool *p);

/* ------------------------------------------------------------------------------------------------------------ */
/* Prefix cache: naive (never matches) or radix tree of token ids -> page indices                               */
/* ------------------------------------------------------------------------------------------------------------ */
/* Host memory: a radix cache keeps the token and page arrays of entries it evicts (or drops in reset) for reuse by
 * later inserts; it returns them to the system when it is destroyed. Its footprint is that of its fullest moment. */
typedef enum kvhal_prefix_kind { KVHAL_PREFIX_NAIVE = 0, KVHAL_PREFIX_RADIX = 1 } kvhal_prefix_kind;
typedef struct kvhal_prefix_cache kvhal_prefix_cache;
typedef struct kvhal_prefix_node *kvhal_prefix_handle; /* a node; NULL/root means "nothing matched" */
/* Receives freed page indices during evict/reset. */
typedef void (*kvhal_pages_fn)(const int32_t *pages, size_t n, void *user);

KVHAL_API kvhal_status kvhal_prefix_cache_create(kvhal_prefix_kind kind, int32_t page_size,
                                                 kvhal_prefix_cache **out);
KVHAL_API kvhal_status kvhal_prefix_cache_destroy(kvhal_prefix_cache *pc);
KVHAL_API int32_t kvhal_prefix_cache_page_size(const kvhal_prefix_cache *pc);
/* Longest cached prefix of tokens, aligned down to whole pages. Writes cached_len/page_size page indices to
 * pages (if pages_cap is too small: KVHAL_OUT_OF_RANGE, nothing written). handle = deepest matched node. */
KVHAL_API kvhal_status kvhal_prefix_match(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                          kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                          size_t pages_cap);
/* Protects the path from handle to the root from eviction (counted; unlock undoes one lock). */
KVHAL_API kvhal_status kvhal_prefix_lock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle);
KVHAL_API kvhal_status kvhal_prefix_unlock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle);
/* Inserts tokens[0..n) (n aligned down to pages) with their pages (n/page_size entries). already_cached = the
 * length that was present before; the tree keeps its own pages there, so the caller still owns its
 * pages[0..already_cached/page_size) and frees those that are not the tree's (the ones it did not get from
 * match). A naive cache keeps nothing: already_cached = n, every page stays the caller's. */
KVHAL_API kvhal_status kvhal_prefix_insert(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                           const int32_t *pages, size_t *already_cached);
/* Evicts unlocked leaves in LRU order until at least num_tokens tokens are freed (or nothing is evictable);
 * freed pages go to fn, one call per leaf (fn must not call back into the cache). evicted = tokens freed. */
KVHAL_API kvhal_status kvhal_prefix_evict(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                          size_t *evicted);
typedef struct kvhal_prefix_size_info {
    size_t evictable_tokens, protected_tokens, total_tokens, num_nodes;
} kvhal_prefix_size_info;
KVHAL_API kvhal_status kvhal_prefix_size_info_get(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out);
/* Drops everything (locks included); freed pages go to fn. */
KVHAL_API kvhal_status kvhal_prefix_reset(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user);
KVHAL_API kvhal_status kvhal_prefix_check_integrity(const kvhal_prefix_cache *pc);

/* ------------------------------------------------------------------------------------------------------------ */
/* Cache manager: free pages (a block pool) + a prefix cache                                                     */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct kvhal_cache_manager kvhal_cache_manager;
KVHAL_API kvhal_status kvhal_cache_manager_create(int32_t total_pages, int32_t page_size, kvhal_prefix_kind kind,
                                                  kvhal_cache_manager **out);
KVHAL_API kvhal_status kvhal_cache_manager_destroy(kvhal_cache_manager *cm);
KVHAL_API kvhal_prefix_cache *kvhal_cache_manager_prefix(kvhal_cache_manager *cm);
/* match + lock. The handle must be passed to cache_finished later (or, for a request that is dropped, to
 * kvhal_prefix_unlock on kvhal_cache_manager_prefix(cm), after kvhal_cache_manager_free of its own pages).
 * Use the prefix cache of a manager for queries and lock/unlock only: insert and evict go through the manager. */
KVHAL_API kvhal_status kvhal_cache_manager_match(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                                 kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                                 size_t pages_cap);
/* n pages, evicting when free pages run short; all or nothing (KVHAL_OUT_OF_MEMORY). */
KVHAL_API kvhal_status kvhal_cache_manager_allocate(kvhal_cache_manager *cm, int32_t n, int32_t *pages);
KVHAL_API kvhal_status kvhal_cache_manager_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n);
/* A request finished: tokens[0..n) with pages covering ceil(n/page_size) pages (the first ones from match).
 * Inserts the page-aligned part, frees duplicate pages and the partial tail page, unlocks handle. */
KVHAL_API kvhal_status kvhal_cache_manager_cache_finished(kvhal_cache_manager *cm, const int32_t *tokens,
                                                          size_t num_tokens, const int32_t *pages,
                                                          kvhal_prefix_handle handle);
/* The same, given only what follows the match: tokens[0..n) and their pages (ceil(n/page_size) of them) are the
 * request's tokens past the handle's cached length (0 for a NULL handle), inserted below the handle. The cached
 * prefix is the handle's by construction, so nothing of it is passed or compared again: what cache_finished
 * spends re-reading and checking the matched prefix (its tokens and pages), this one does not. Every page passed
 * is still checked as one the caller's requests hold. */
KVHAL_API kvhal_status kvhal_cache_manager_cache_finished_suffix(kvhal_cache_manager *cm,
                                                                 kvhal_prefix_handle handle, const int32_t *tokens,
                                                                 size_t num_tokens, const int32_t *pages);
/* free + evictable pages */
KVHAL_API int32_t kvhal_cache_manager_available(const kvhal_cache_manager *cm);
KVHAL_API int32_t kvhal_cache_manager_num_free(const kvhal_cache_manager *cm);
KVHAL_API uint64_t kvhal_cache_manager_pages_evicted(const kvhal_cache_manager *cm);
/* Evicts at least num_tokens tokens of unlocked cached prefixes (LRU leaves first) into the free pages, or all
 * there are; evicted = tokens freed (may be NULL). */
KVHAL_API kvhal_status kvhal_cache_manager_evict(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted);
/* free + evictable + protected + held by running requests == total */
KVHAL_API kvhal_status kvhal_cache_manager_check_integrity(const kvhal_cache_manager *cm);

/* ------------------------------------------------------------------------------------------------------------ */
/* Fault injection (for tests): the n-th host or device allocation from now on fails (n >= 1); 0 turns it off.  */
/* KVHAL_FAULT_ALLOC=n in the environment does the same at load.                                                 */
/* ------------------------------------------------------------------------------------------------------------ */
KVHAL_API void kvhal_fault_inject_alloc(int64_t n);
/* Allocations counted since the last kvhal_fault_inject_alloc call (to walk every allocation point). */
KVHAL_API int64_t kvhal_fault_alloc_count(void);

/* ------------------------------------------------------------------------------------------------------------ */
/* MLA caches (multi-head latent attention): one latent vector per token and no V side                           */
/* ------------------------------------------------------------------------------------------------------------ */
/** Paged caching of an MLA cache (DeepSeek-style multi-head latent attention, vLLM's concat_and_cache_mla): each
 *  token's row of kv_cache (e.g. 512 latent + 64 rotary dims) is written from kv_c and k_pe, or, K-only, from kv_c
 *  alone; there is no V cache. Token t goes to block slot / block_size, offset slot % block_size; a slot < 0 is
 *  padding; a slot past the cache is handled as in kvhal_paged_caching. An fp8 cache stores round(value / scale),
 *  nearest even, saturating, exactly as kvhal_paged_caching. Runs as one paged-caching launch on every device
 *  (the row's two column ranges are its two sides), with descriptors by shape class (token counts are call
 *  arguments).
 *  @param kv_cache     [blocks, block_size, dim] or [blocks, block_size, 1, dim], any strides; f32/f16/bf16 (the
 *                      input's dtype) or an fp8 dtype. Borrowed for the call; written on s.
 *  @param kv_c         [tokens, dim_c] or [tokens, 1, dim_c], f32/f16/bf16, any strides (a view into a fused
 *                      projection is fine); with k_pe NULL, dim_c is the whole row (the K-only form)
 *  @param k_pe         [tokens, dim_pe] or [tokens, 1, dim_pe] of kv_c's dtype, written after kv_c in the row
 *                      (dim_c + dim_pe = dim); NULL for the K-only form
 *  @param slot_mapping i32 or i64 [tokens], on the cache's device
 *  @param scale        fp8 caches: finite and > 0; ignored otherwise
 *  @param s            stream, NULL for the device's default
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL or invalid tensor, ranks, bad scale), KVHAL_SHAPE_MISMATCH (more
 *          than one head, dims that do not add up to the row, token counts), KVHAL_DTYPE_MISMATCH,
 *          KVHAL_DEVICE_MISMATCH, KVHAL_UNSUPPORTED (a part of 0 dims, a K-only row of 1 element, or the backend's
 *          refusal), KVHAL_OUT_OF_RANGE (a slot past the cache, host-readable slots), KVHAL_BACKEND_ERROR; the
 *          message names the argument.
 *  Thread safety: any thread; calls on one stream are ordered. Graph capture: may be captured like
 *  kvhal_paged_caching once its descriptor exists (the first call of a shape class creates it: make that call
 *  before capturing). Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_paged_caching_mla(const kvhal_tensor *kv_cache, const kvhal_tensor *kv_c,
                                               const kvhal_tensor *k_pe, const kvhal_tensor *slot_mapping,
                                               float scale, kvhal_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* KVHAL_H */

/**
 * @file kvhal_backend.h
 * @brief The plugin interface (ABI 2): what a backend module implements and what the core gives it.
 *
 * A module is a shared object named `libkvhal-<anything>.so` that exports exactly one symbol, kvhal_backend_entry,
 * and links nothing of the core. It serves one device type, which it names itself (device_type: "cuda", "npu"):
 * the registry assigns the type id at load (the built-in names keep cpu 0, cuda 1, hip 2, opencl 3), so a vendor
 * adds a device type without a kvhal release. Everything else a module offers comes through get_proc_address.
 *
 * Layout rules (ABI 2 and later): the table and each of its two groups (device and memory functions, op
 * functions) start with their own size and are only ever appended to, so a module built against an older
 * header of the same major ABI keeps loading: the core copies each group full-size and treats every slot past the
 * module's size as NULL. A NULL slot means "not supported" and the core says so (KVHAL_UNSUPPORTED) instead of
 * calling it. The op functions end with one slot per op of KVHAL_BK_OP_LIST, in its order: new ops are appended
 * to that list, and new non-op entries go to the device group (or a new group appended to the table).
 *
 * Every call gets back the context pointer the module's init returned, so a module keeps no global state of its
 * own (it may be loaded once per process only, but a vendor's runtime often wraps several instances).
 * Calls may come from any thread at once; a module makes its own entries thread-safe. */
#ifndef KVHAL_BACKEND_H
#define KVHAL_BACKEND_H

#include <stdarg.h>
#include <stdio.h>

#include "kvhal.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The plugin ABI version of this header: a module sets kvhal_backend::abi_version to it. Modules are installed in
 *  `<libdir>/kvhal-0/` (pkg-config --variable=moduledir kvhal). */
#define KVHAL_BACKEND_ABI_VERSION 2
/** Oldest table version this core accepts: ABI 2 changed the table's layout, so version 1 modules are refused. */
#define KVHAL_BACKEND_ABI_MIN 2

/* ------------------------------------------------------------------------------------------------------------ */
/* The op list: one entry per op a backend runs with a descriptor. Each entry is                                 */
/*   X(ENUM_SUFFIX, name, argument struct)                                                                       */
/* and generates the op enum, the op names, the descriptor-cache op kinds, the op slots of the table below and,   */
/* in the backends that use it, their kernel-source and function tables. Append only.                            */
/* ------------------------------------------------------------------------------------------------------------ */
/** The op list, X(ENUM_SUFFIX, name, argument struct) per op (see the banner above). Append only. */
#define KVHAL_BK_OP_LIST(X)                                                                                     \
    X(PAGED_CACHING, paged_caching, kvhal_bk_paged_caching)                                                     \
    X(COPY_BLOCKS, copy_blocks, kvhal_bk_copy_blocks)                                                           \
    X(TENSOR_COPY, tensor_copy, kvhal_bk_tensor_copy)                                                           \
    X(PAGE_TRANSFER, page_transfer, kvhal_bk_page_transfer)

/** The ops, one KVHAL_BK_OP_<ENUM_SUFFIX> per entry of KVHAL_BK_OP_LIST, in its order (KVHAL_BK_OP_PAGED_CACHING = 0,
 *  KVHAL_BK_OP_COPY_BLOCKS, KVHAL_BK_OP_TENSOR_COPY, KVHAL_BK_OP_PAGE_TRANSFER), then KVHAL_BK_OP_COUNT: the number of ops this header knows.
 *  KVHAL_BK_OP_COUNT grows when an op is appended; a module uses it only to size its own tables at compile time
 *  (the core never trusts a module's count: it reads the op slots the module's kvhal_backend_op_fns::struct_size
 *  covers). */
typedef enum kvhal_bk_op {
#define KVHAL_BK_X_ENUM(E, name, T) KVHAL_BK_OP_##E,
    KVHAL_BK_OP_LIST(KVHAL_BK_X_ENUM)
#undef KVHAL_BK_X_ENUM
    KVHAL_BK_OP_COUNT
} kvhal_bk_op;

/** Services the core hands a module at init. */
typedef struct kvhal_core_services {
    uint32_t abi_version; /**< the core's KVHAL_BACKEND_ABI_VERSION */
    uint32_t struct_size; /**< sizeof(kvhal_core_services) of the core: entries past it are absent */
    /** Sets this thread's kvhal_last_error() message (printf-style) and returns status. */
    kvhal_status (*set_error)(kvhal_status status, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    /** Writes to the log only when KVHAL_LOG asks for it. level: 0 error, 1 warn, 2 info, 3 debug. */
    void (*log)(int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    /** Test hook: returns true when the current allocation should fail (fault injection); modules call it before
     * every device or host allocation they make on behalf of a caller. */
    bool (*alloc_should_fail)(void);
} kvhal_core_services;

/* Header-only helpers for module authors (a module links nothing of the core, so these are inline). */

/** Bytes of one element of a dtype, for modules (which link nothing of the core).
 *  @param dt any value (the fnuz fp8 formats included)
 *  @return the same size as kvhal_dtype_size(): 1 for every fp8 format; 0 for a value that is not a dtype.
 *  Thread safety: pure function. Graph capture: host only. */
static inline size_t kvhal_bk_dtype_size(kvhal_dtype dt)
{
    switch (dt) {
    case KVHAL_F32: case KVHAL_I32: return 4;
    case KVHAL_F16: case KVHAL_BF16: return 2;
    case KVHAL_FP8_E4M3: case KVHAL_FP8_E5M2: case KVHAL_FP8_E4M3FNUZ: case KVHAL_FP8_E5M2FNUZ: return 1;
    case KVHAL_I64: return 8;
    default: return 0;
    }
}

/** The name of a dtype, for modules' messages.
 *  @param dt any value
 *  @return a static string, the same as kvhal_dtype_name(): "bf16", "fp8_e4m3fnuz", ...; "invalid" for a value
 *  that is not a dtype. Thread safety: pure function. Graph capture: host only. */
static inline const char *kvhal_bk_dtype_name(kvhal_dtype dt)
{
    switch (dt) {
    case KVHAL_F32: return "f32";
    case KVHAL_F16: return "f16";
    case KVHAL_BF16: return "bf16";
    case KVHAL_FP8_E4M3: return "fp8_e4m3";
    case KVHAL_FP8_E5M2: return "fp8_e5m2";
    case KVHAL_FP8_E4M3FNUZ: return "fp8_e4m3fnuz";
    case KVHAL_FP8_E5M2FNUZ: return "fp8_e5m2fnuz";
    case KVHAL_I32: return "i32";
    case KVHAL_I64: return "i64";
    default: return "invalid";
    }
}

/** For supports(): writes the reason (printf-style, truncated to fit) and returns false.
 *  @param reason the buffer supports() was given (may be NULL).
 *  @param reason_size its size.
 *  @param fmt printf format of the reason, then its arguments.
 *  @return false. */
static inline bool kvhal_bk_refuse(char *reason, size_t reason_size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static inline bool kvhal_bk_refuse(char *reason, size_t reason_size, const char *fmt, ...)
{
    if (reason && reason_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, reason_size, fmt, ap);
        va_end(ap);
    }
    return false;
}

/** A tensor as the backend sees it: native memory + byte offset + metadata. */
typedef struct kvhal_bk_tensor {
    void *native;                      /**< the buffer's native memory (pointer or cl_mem) */
    size_t offset;                     /**< bytes from native to element 0 */
    kvhal_dtype dtype;                 /**< element type */
    int32_t ndim;                      /**< 1..KVHAL_MAX_DIMS */
    int64_t shape[KVHAL_MAX_DIMS];     /**< extents */
    int64_t strides[KVHAL_MAX_DIMS];   /**< in elements */
} kvhal_bk_tensor;

/** The paged-caching op, validated and normalised by the core. Every stride is in elements of its tensor's dtype.
 * Input token t (0..num_tokens) lives at  (t / seq_len) * tok_stride_outer + (t % seq_len) * tok_stride_inner
 * + head * head_stride + d * dim_stride.  Cache slot s lives at  (s / block_size) * block_stride
 * + (s % block_size) * offset_stride + head * head_stride + d * dim_stride.  slot_mapping[t] lives at
 * (t / seq_len) * slot_stride_outer + (t % seq_len) * slot_stride_inner. A slot outside [0, num_slots) is skipped
 * (negative: padding; past the end: the backend raises its device-side error flag, see synchronize). */
typedef struct kvhal_bk_paged_side {
    void *cache;         /**< native memory of the cache */
    size_t cache_offset; /**< bytes */
    int64_t block_stride;      /**< elements between blocks */
    int64_t offset_stride;     /**< elements between slots of a block */
    int64_t cache_head_stride; /**< elements between heads in the cache */
    int64_t cache_dim_stride;  /**< elements between dims in the cache */
    void *input;               /**< native memory of the new tokens (k or v) */
    size_t input_offset;       /**< bytes */
    int64_t tok_stride_outer;  /**< elements between sequences of a batch */
    int64_t tok_stride_inner;  /**< elements between tokens of a sequence */
    int64_t in_head_stride;    /**< elements between heads of the input */
    int64_t in_dim_stride;     /**< elements between dims of the input */
    int32_t head_dim;    /**< >= 1 */
    float scale;         /**< fp8 caches: stored = round(value / scale); 1 otherwise */
} kvhal_bk_paged_side;

/** The paged-caching op's arguments, validated and normalised by the core (sides as kvhal_bk_paged_side).
 *  Descriptors by shape class: the core keys paged-caching descriptors by everything here except memory, offsets,
 *  scales, num_tokens and (for a flat call, batched false) seq_len and the outer token and slot strides; a batched
 *  call's batch size (num_tokens / seq_len) is not in the key either. So desc_create must make a descriptor that
 *  serves every token count: whatever depends on num_tokens is decided per call.
 *  fp8 caches (fp8 true: e4m3, e5m2, e4m3fnuz or e5m2fnuz) store kvhal_f32_to_fp8(value / scale) bit for bit.
 *  Ownership: the core's, valid for the call only. Stream: the op is enqueued on the call's stream. */
typedef struct kvhal_bk_paged_caching {
    kvhal_bk_paged_side k;        /**< the K side */
    kvhal_bk_paged_side v;        /**< the V side */
    kvhal_dtype input_dtype;      /**< f32, f16 or bf16 */
    kvhal_dtype cache_dtype;      /**< input_dtype, or fp8 */
    kvhal_dtype slot_dtype;       /**< i32 or i64 */
    int64_t num_tokens;           /**< tokens to write */
    int64_t seq_len;              /**< seq_len = num_tokens for [tokens, heads, dim] input */
    int32_t num_heads;            /**< heads per token */
    int32_t block_size;           /**< slots per block */
    int64_t num_blocks;           /**< blocks of the caches */
    void *slots;                  /**< native memory of slot_mapping */
    size_t slots_offset;          /**< bytes */
    int64_t slot_stride_outer;    /**< elements between sequences */
    int64_t slot_stride_inner;    /**< elements between tokens */
    /* Derived by the core; backends use them as given instead of deriving them again. */
    int64_t num_slots; /**< num_blocks * block_size (fits in 64 bits: checked) */
    bool batched;      /**< seq_len < num_tokens: tokens come as [batch, seq] */
    bool fp8;          /**< cache_dtype is an fp8 format (e4m3, e5m2, e4m3fnuz, e5m2fnuz) */
} kvhal_bk_paged_caching;

/** copy_blocks: for every cache c and pair p, copy block_bytes[c] from base[c] + pairs[p].src * block_strides[c] to
 * base[c] + pairs[p].dst * block_strides[c]. Strides and sizes in bytes; pairs on the host, in range and disjoint
 * (no block written by one pair is read or written by another: checked by the core). */
typedef struct kvhal_bk_copy_blocks {
    int32_t num_caches;         /**< caches to copy in */
    void *const *natives;       /**< cl_mem / device pointer per cache */
    const size_t *offsets;      /**< byte offset of block 0 of each cache */
    const int64_t *block_strides; /**< bytes between blocks, per cache */
    const int64_t *block_bytes;   /**< bytes of one block, per cache */
    const int64_t *pairs;       /**< 2 * num_pairs */
    int32_t num_pairs;          /**< (src, dst) pairs */
    int64_t num_blocks_min;     /**< smallest block count over the caches (validated) */
} kvhal_bk_copy_blocks;

/** Batched copies of byte ranges on one device (duplicate of the contiguous cache). */
typedef struct kvhal_bk_copy_batch {
    int32_t count;              /**< copies */
    void *const *dst;           /**< native destination per copy */
    const size_t *dst_offsets;  /**< byte offset per copy */
    void *const *src;           /**< native source per copy */
    const size_t *src_offsets;  /**< byte offset per copy */
    const size_t *bytes;        /**< bytes per copy */
} kvhal_bk_copy_batch;

/** tensor_copy: dst and src have the same shape and dtype, at least one element. */
typedef struct kvhal_bk_tensor_copy {
    kvhal_bk_tensor dst; /**< destination view */
    kvhal_bk_tensor src; /**< source view */
} kvhal_bk_tensor_copy;

/** page_transfer: whole pages between device caches (K and V of every layer: one block of each cache makes a page)
 * and host pages. Host page h starts at host + host_offset + h * host_page_bytes and holds the page's block of cache
 * c at byte c * block_bytes. For pair p: device block pairs[2p] of every cache <-> host page pairs[2p + 1]; to_host
 * picks the direction. Checked by the core: pairs in range, no device block or host page written twice, every
 * cache's block dense (block_bytes contiguous bytes at block_strides[c] apart), host pages inside host_bytes. host
 * is host memory: from host_alloc (pinned or mapped for this device) or plain memory; a backend may take a faster
 * path for the former. Asynchronous on stream: the host pages must stay valid (and unchanged, to device) until the
 * stream's work is done (stream_query / stream_synchronize). */
typedef struct kvhal_bk_page_transfer {
    int32_t num_caches;           /**< caches (K and V of every layer) */
    void *const *natives;         /**< cl_mem / device pointer per cache */
    const size_t *offsets;        /**< byte offset of block 0 of each cache */
    const int64_t *block_strides; /**< bytes between blocks, per cache */
    int64_t block_bytes;          /**< bytes of one block, the same in every cache */
    void *host;                   /**< the host memory of the pages */
    size_t host_offset;           /**< bytes before host page 0 */
    int64_t host_page_bytes;      /**< bytes of one host page, >= num_caches * block_bytes */
    const int64_t *pairs;         /**< 2 * num_pairs: (device block, host page) */
    int32_t num_pairs;            /**< pages to move */
    bool to_host;                 /**< true: device -> host; false: host -> device */
    bool host_pinned;             /**< host came from this module's host_alloc */
} kvhal_bk_page_transfer;

/** Largest module part of an IPC handle (kvhal_backend_device_fns::ipc_export); the core's kvhal_buffer_ipc_export
 *  adds its own header, KVHAL_IPC_HANDLE_MAX bytes in all. */
#define KVHAL_BK_IPC_BLOB_MAX 192

/* ------------------------------------------------------------------------------------------------------------ */
/* Device and memory functions. id: the device index within the module, 0 .. device_count-1 (checked by the     */
/* core). stream: NULL = the device's default stream; otherwise what stream_create/stream_wrap returned.        */
/* ------------------------------------------------------------------------------------------------------------ */
/** The device and memory functions of a module (see the banner above). Only appended to. */
typedef struct kvhal_backend_device_fns {
    uint32_t struct_size; /**< sizeof(kvhal_backend_device_fns) the module was built with */
    /** Required. The core fills out->device and out->backend. */
    kvhal_status (*device_info)(void *ctx, int32_t id, kvhal_device_info *out);
    /** Required. */
    kvhal_status (*buffer_alloc)(void *ctx, int32_t id, size_t bytes, void **native);
    /** Required. Frees what buffer_alloc returned. */
    kvhal_status (*buffer_free)(void *ctx, int32_t id, void *native);
    /** NULL: a wrapped native pointer is used as is. */
    kvhal_status (*buffer_wrap)(void *ctx, int32_t id, void *native, size_t bytes);
    /** Undoes buffer_wrap (the native memory stays the caller's). NULL: nothing to undo. */
    kvhal_status (*buffer_unwrap)(void *ctx, int32_t id, void *native);
    /** NULL stream_create / stream_wrap: kvhal_stream_create / _wrap return KVHAL_UNSUPPORTED. */
    kvhal_status (*stream_create)(void *ctx, int32_t id, void **stream);
    /** Wraps a native stream without taking it over. native may be NULL, KVHAL_STREAM_LEGACY or
     *  KVHAL_STREAM_PER_THREAD (the default streams, kvhal.h); a module without such streams serves them with its
     *  default stream. */
    kvhal_status (*stream_wrap)(void *ctx, int32_t id, void *native, void **stream);
    kvhal_status (*stream_destroy)(void *ctx, int32_t id, void *stream); /**< frees wrappers, destroys owned ones */
    /** Waits for the work queued on stream (NULL: the default stream). It does not read the device-side error flag
     *  (stream_check_errors and synchronize do), so kvhal_stream_synchronize() reports no KVHAL_DEVICE_FAULT from a
     *  module that sets it. NULL: the core calls synchronize(id), which waits for the whole device and does read
     *  (and clear) the flag. */
    kvhal_status (*stream_synchronize)(void *ctx, int32_t id, void *stream);
    /** Required. */
    kvhal_status (*memcpy_h2d)(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes,
                               void *stream);
    /** Required. Device to host; returns once dst holds the bytes. */
    kvhal_status (*memcpy_d2h)(void *ctx, int32_t id, void *dst, const void *src, size_t src_off, size_t bytes,
                               void *stream);
    /** Required. Within one device, asynchronous on stream. */
    kvhal_status (*memcpy_d2d)(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off,
                               size_t bytes, void *stream);
    /** Between two devices of this module. NULL: the core stages through the host. */
    kvhal_status (*memcpy_peer)(void *ctx, int32_t dst_id, void *dst, size_t dst_off, int32_t src_id,
                                const void *src, size_t src_off, size_t bytes, void *stream);
    /** Sets bytes, asynchronous on stream. NULL: kvhal_memset returns KVHAL_UNSUPPORTED. */
    kvhal_status (*memset)(void *ctx, int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream);
    /** Required. Waits for the device; returns KVHAL_DEVICE_FAULT (and clears the flag) if a kernel raised it. */
    kvhal_status (*synchronize)(void *ctx, int32_t id);
    /** Reads the device-side error flag after the work already queued. NULL: synchronize. */
    kvhal_status (*check_errors)(void *ctx, int32_t id);
    /** Waits for the work queued on one stream (NULL: the default stream) and nothing else, then reads and clears the
     *  device-side error flag (KVHAL_DEVICE_FAULT when set). NULL: the core calls stream_synchronize (or synchronize)
     *  and then check_errors. Never called while the stream is captured. */
    kvhal_status (*stream_check_errors)(void *ctx, int32_t id, void *stream);
    /** Host memory the device copies to and from fastest (pinned, mapped): host_alloc returns a host pointer of at
     *  least bytes, host_free gives it back. NULL host_alloc: the core uses plain (64-byte aligned) host memory. */
    kvhal_status (*host_alloc)(void *ctx, int32_t id, size_t bytes, void **ptr);
    /** Gives back what host_alloc returned. */
    kvhal_status (*host_free)(void *ctx, int32_t id, void *ptr);
    /** KVHAL_OK when all work queued on stream is done, KVHAL_BUSY while some is pending (never waits). NULL: the core
     *  waits (stream_synchronize) and reports its status, right for a backend whose work is synchronous. */
    kvhal_status (*stream_query)(void *ctx, int32_t id, void *stream);
    /** Memory another process of this host can import (ipc_export below): buffer_alloc's contract, from memory the
     *  device's IPC can share (CUDA/HIP: cudaMalloc'd, not a stream-ordered pool; CPU: POSIX shared memory). NULL:
     *  kvhal_buffer_create_shareable returns KVHAL_UNSUPPORTED. */
    kvhal_status (*buffer_alloc_shareable)(void *ctx, int32_t id, size_t bytes, void **native);
    /** Frees what buffer_alloc_shareable returned. */
    kvhal_status (*buffer_free_shareable)(void *ctx, int32_t id, void *native);
    /** Writes an opaque handle of the shareable allocation native (buffer_alloc_shareable's, all its bytes) into blob:
     *  at most cap (KVHAL_BK_IPC_BLOB_MAX) bytes, *len set to the bytes written. The blob means something to this
     *  module in another process of the same host only. NULL: no IPC. */
    kvhal_status (*ipc_export)(void *ctx, int32_t id, void *native, void *blob, size_t cap, size_t *len);
    /** Opens a peer's blob (len bytes, untrusted: a module checks every field and fails cleanly, never crashes, on a
     *  malformed or forged one) as memory device id can read (at least read access), and sets *native. bytes: how
     *  much of it the caller will address; the module fails (KVHAL_OUT_OF_RANGE) when the allocation it opened is
     *  smaller. */
    kvhal_status (*ipc_import)(void *ctx, int32_t id, const void *blob, size_t len, size_t bytes, void **native);
    /** Closes what ipc_import opened (the exporter's memory is not freed). */
    kvhal_status (*ipc_close)(void *ctx, int32_t id, void *native);
    /** Device events (kvhal_event), all six set or none. event_create makes an event of device id (counting as complete
     *  until recorded); event_destroy frees it (it may still be pending); event_record places it after the work queued
     *  on stream so far; event_query returns KVHAL_OK once that work is done and KVHAL_BUSY while it is pending, never
     *  waiting; event_synchronize waits for it; stream_wait_event makes the work queued on stream later wait for it.
     *  NULL event_create: the core records by waiting for the stream (stream_synchronize), so that its events are
     *  complete once recorded. */
    kvhal_status (*event_create)(void *ctx, int32_t id, void **ev);
    /** See event_create. */
    kvhal_status (*event_destroy)(void *ctx, int32_t id, void *ev);
    /** See event_create. */
    kvhal_status (*event_record)(void *ctx, int32_t id, void *ev, void *stream);
    /** See event_create. */
    kvhal_status (*event_query)(void *ctx, int32_t id, void *ev);
    /** See event_create. */
    kvhal_status (*event_synchronize)(void *ctx, int32_t id, void *ev);
    /** See event_create. */
    kvhal_status (*stream_wait_event)(void *ctx, int32_t id, void *stream, void *ev);
    /** Append new entries here only. */
} kvhal_backend_device_fns;

/* ------------------------------------------------------------------------------------------------------------ */
/* Op functions.                                                                                                 */
/* ------------------------------------------------------------------------------------------------------------ */
/** The op functions of a module (see the banner above). Only appended to: op slots at the end, one per op. */
typedef struct kvhal_backend_op_fns {
    uint32_t struct_size; /**< sizeof(kvhal_backend_op_fns) the module was built with */
    /** Capability query. NULL: every op whose slot is set runs for every valid argument. Otherwise returns true
     * when the op can run with these arguments (metadata only matters: memory pointers may be anything) and false
     * with a reason ("fp8_e5m2 caches are not supported") written into reason, which the core passes on in its
     * KVHAL_UNSUPPORTED message. The core asks once per descriptor (on a descriptor-cache miss) and before every
     * call it cannot cache, never on a hit; it never calls desc_create or the op after a refusal. A module without
     * desc_create is asked the same way: the core caches a placeholder (NULL) descriptor per key. */
    bool (*supports)(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t reason_size);
    /** Descriptors: created from the first call's arguments (metadata only matters), cached by the core per thread
     * and device under the exact metadata, destroyed on eviction. NULL desc_create: ops get desc NULL (and desc_destroy is never called). */
    kvhal_status (*desc_create)(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc);
    /** Destroys a descriptor desc_create made (on eviction, clear or thread exit, on the owning thread). */
    void (*desc_destroy)(void *ctx, int32_t id, kvhal_bk_op op, void *desc);
    /** Batched byte-range copies. NULL: the core issues count memcpy_d2d calls. */
    kvhal_status (*copy_batch)(void *ctx, int32_t id, const kvhal_bk_copy_batch *args, void *stream);
    /* One slot per op of KVHAL_BK_OP_LIST, in its order, e.g.
     *   kvhal_status (*paged_caching)(void *ctx, int32_t id, void *desc, const kvhal_bk_paged_caching *args,
     *                                 void *stream);
     * NULL: the op is not supported on this device type. */
#define KVHAL_BK_X_SLOT(E, name, T) \
    kvhal_status (*name)(void *ctx, int32_t id, void *desc, const T *args, void *stream);
    KVHAL_BK_OP_LIST(KVHAL_BK_X_SLOT)
#undef KVHAL_BK_X_SLOT
    /** Ops are appended to KVHAL_BK_OP_LIST, never inserted; nothing else follows the op slots. */
} kvhal_backend_op_fns;

/* ------------------------------------------------------------------------------------------------------------ */
/* The table a module's entry point returns.                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */
/** Device type names: a lowercase identifier, [a-z][a-z0-9_]*, 1 to KVHAL_DEVICE_TYPE_NAME_MAX - 1 characters. */
/** The table a module's entry point returns. */
typedef struct kvhal_backend kvhal_backend;
/** The table a module's entry point returns (see the banner above). Only appended to. */
struct kvhal_backend {
    uint32_t abi_version;    /**< KVHAL_BACKEND_ABI_VERSION the module was built with */
    uint32_t struct_size;    /**< sizeof(kvhal_backend) the module was built with */
    const char *name;        /**< the module's name, for kvhal-info and messages: "cuda", "acme-npu" */
    const char *device_type; /**< the device type it serves: "cuda", "npu" */
    /** Required. Called once after load. Sets *ctx (passed back to every call; may stay NULL) and *device_count
     * (possibly 0, with reason filled: "no CUDA driver") and returns OK, or returns an error with reason. */
    kvhal_status (*init)(const kvhal_core_services *services, void **ctx, int32_t *device_count, char *reason,
                         size_t reason_size);
    /** Frees the context. This core keeps modules loaded until the process exits and never calls it (a module's
     * runtime tears down through its own exit hooks); it is part of ABI 2 for a core or a test host that unloads
     * modules. May be NULL. */
    void (*shutdown)(void *ctx);
    /** Backend-specific extras by name (test hooks, native handles); NULL when the module has none of that name.
     * Reached through kvhal_backend_get_proc_address(). May be NULL. */
    void *(*get_proc_address)(void *ctx, const char *name);
    const kvhal_backend_device_fns *device; /**< required */
    const kvhal_backend_op_fns *ops;        /**< NULL: no ops (memory only) */
    /** Append new entries here only. */
};

/** The type of a module's one exported symbol, kvhal_backend_entry.
 *  @param core_abi_version the core's KVHAL_BACKEND_ABI_VERSION.
 *  @return the module's table (static storage, valid while the module is loaded), or NULL to refuse to load. */
typedef const kvhal_backend *(*kvhal_backend_entry_fn)(uint32_t core_abi_version);
/** The name of the entry symbol a module exports. */
#define KVHAL_BACKEND_ENTRY_SYMBOL "kvhal_backend_entry"

/* ---- An extra of the CUDA and HIP modules: the benchmark's copy ceiling ---- */
/** kvhal_backend_get_proc_address(KVHAL_DEVICE_CUDA or KVHAL_DEVICE_HIP, "kvhal_gpu_scatter_rows") gives a
 *  kvhal_gpu_scatter_rows_fn: a plain SM copy (16-byte loads, stores as wide as the output allows, no arithmetic) of
 *  the rows a paged-caching call moves, for kvhal-bench's reference rows: for each side s < sides, token t with
 *  slots[t] >= 0 and piece p < pieces, piece_elems elements of in_elem bytes at src[s] + (t * pieces + p) * piece_elems *
 *  in_elem are written, each as its last out_elem bytes (out_elem <= in_elem: an fp8 cache's traffic), to dst[s] +
 *  (slot / block_size) * block_stride + p * piece_stride + (slot % block_size) * token_stride (bytes). Pointers are
 *  device addresses of one device (the copy runs there); the stream is a native one of it (NULL: the default).
 *  Returns 0 when the copy was launched; -1 for arguments it does not take (a piece not a multiple of 16 bytes in,
 *  in_elem / out_elem not 1, 2 or 4 with out_elem <= in_elem); -2 when the launch failed (the device has no embedded
 *  code for it: the HIP module's run-time compiled path). Not an op: no checks against buffers, no error flag. */
typedef struct kvhal_gpu_scatter_args {
    const void *src[2];   /**< per side (K, V): the rows read, device addresses */
    void *dst[2];         /**< per side: the cache written, device addresses */
    const int64_t *slots; /**< tokens slots on the device; a negative slot skips its token */
    int64_t tokens;       /**< tokens (rows) to copy */
    int32_t sides;        /**< 1 or 2 (K only, K and V) */
    int32_t pieces;       /**< pieces per token (heads, or 1) */
    int32_t in_elem;      /**< bytes of an element read: 1, 2 or 4 */
    int32_t out_elem;     /**< bytes of an element written (<= in_elem) */
    int64_t piece_elems;  /**< elements per piece */
    int64_t block_size;   /**< tokens per cache block */
    int64_t block_stride; /**< bytes between cache blocks */
    int64_t piece_stride; /**< bytes between a token's pieces in the cache */
    int64_t token_stride; /**< bytes between tokens of a block in the cache */
} kvhal_gpu_scatter_args;
/** The copy-ceiling extra (see kvhal_gpu_scatter_args): 0 launched, -1 arguments it does not take, -2 launch
 *  failed. @param a the copy. @param native_stream a native stream of the device (NULL: its default). */
typedef int (*kvhal_gpu_scatter_rows_fn)(const kvhal_gpu_scatter_args *a, void *native_stream);
/** How many forms "kvhal_gpu_scatter_rows_form" takes (0 .. KVHAL_GPU_SCATTER_FORMS - 1). */
#define KVHAL_GPU_SCATTER_FORMS 8
/** kvhal_backend_get_proc_address(KVHAL_DEVICE_CUDA or KVHAL_DEVICE_HIP, "kvhal_gpu_scatter_rows_form") gives a
 *  kvhal_gpu_scatter_rows_form_fn: the same copy as kvhal_gpu_scatter_rows (form 0) in one of KVHAL_GPU_SCATTER_FORMS
 *  forms (form bit 0: 8 loads in flight per thread instead of 4; bit 1: loads not allocated in L1, on CUDA; bit 2: a
 *  block takes 8 rows at a time instead of 32), so that a benchmark can take the fastest copy of the rows as their
 *  ceiling. -1 also for a form out of range. Owns nothing (the caller's pointers are only read or written by the
 *  copy); callable from any thread; a kernel launch on the stream, so it may be captured in a graph like one.
 *  @param a the copy. @param form the form. @param native_stream a native stream of the device (NULL: its default). */
typedef int (*kvhal_gpu_scatter_rows_form_fn)(const kvhal_gpu_scatter_args *a, int form, void *native_stream);
/** kvhal_backend_get_proc_address(KVHAL_DEVICE_CUDA or KVHAL_DEVICE_HIP, "kvhal_gpu_spin") gives a kvhal_gpu_spin_fn:
 *  a kernel of one block that spins for `cycles` of the device's clock on device `device` (its index), queued on the
 *  native stream (NULL: the default), and nothing else: a stand-in for a kernel of a chosen duration in benchmarks
 *  (kvhal-xfer --stream). Returns 0 when launched, -1 for a device index that is not one, -2 when the launch failed. */
typedef int (*kvhal_gpu_spin_fn)(int device, uint64_t cycles, void *native_stream);

#ifdef __cplusplus
}
#endif
#endif /* KVHAL_BACKEND_H */

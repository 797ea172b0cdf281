/* kvhal_backend.h — the plugin interface: what a backend module implements and what the core gives it.
 * A module exports one symbol, kvhal_backend_entry, and links nothing of the core. The table starts with its ABI
 * version and size; entries are only ever appended, so a module built against an older header keeps loading:
 * the core treats every slot past the module's struct_size as NULL, and a NULL slot means "not supported". */
#ifndef KVHAL_BACKEND_H
#define KVHAL_BACKEND_H

#include "kvhal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVHAL_BACKEND_ABI_VERSION 1
/* Oldest table version this core accepts. */
#define KVHAL_BACKEND_ABI_MIN 1

/* Services the core hands a module at load. */
typedef struct kvhal_core_services {
    uint32_t abi_version;
    uint32_t struct_size;
    /* Sets this thread's kvhal_last_error() message (printf-style) and returns status. */
    kvhal_status (*set_error)(kvhal_status status, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    /* Writes to the log only when KVHAL_LOG asks for it. level: 0 error, 1 warn, 2 info, 3 debug. */
    void (*log)(int level, const char *fmt, ...)
#if defined(__GNUC__)
        __attribute__((format(printf, 2, 3)))
#endif
        ;
    /* Test hook: returns true when the current allocation should fail (fault injection); modules call it before
     * every device or host allocation they make on behalf of a caller. */
    bool (*alloc_should_fail)(void);
} kvhal_core_services;

/* A backend's native memory: host pointer, device pointer or cl_mem, plus its size. Offsets are in bytes. */
typedef struct kvhal_bk_mem {
    void *native;
    size_t size;
} kvhal_bk_mem;

/* A tensor as the backend sees it: native memory + byte offset + metadata. */
typedef struct kvhal_bk_tensor {
    void *native;
    size_t offset;
    kvhal_dtype dtype;
    int32_t ndim;
    int64_t shape[KVHAL_MAX_DIMS];
    int64_t strides[KVHAL_MAX_DIMS];
} kvhal_bk_tensor;

/* The paged-caching op, normalised by the core. Every stride is in elements of its tensor's dtype.
 * Input token t (0..num_tokens) lives at  (t / seq_len) * tok_stride_outer + (t % seq_len) * tok_stride_inner
 * + head * head_stride + d * dim_stride.  Cache slot s lives at  (s / block_size) * block_stride
 * + (s % block_size) * offset_stride + head * head_stride + d * dim_stride.  slot_mapping[t] lives at
 * (t / seq_len) * slot_stride_outer + (t % seq_len) * slot_stride_inner. */
typedef struct kvhal_bk_paged_side {
    void *cache;        /* native memory of the cache */
    size_t cache_offset; /* bytes */
    int64_t block_stride, offset_stride, cache_head_stride, cache_dim_stride;
    void *input;
    size_t input_offset;
    int64_t tok_stride_outer, tok_stride_inner, in_head_stride, in_dim_stride;
    int32_t head_dim;
    float scale;        /* fp8 only: stored = round(value / scale) */
} kvhal_bk_paged_side;

typedef struct kvhal_bk_paged_caching {
    kvhal_bk_paged_side k, v;
    kvhal_dtype input_dtype, cache_dtype, slot_dtype;
    int64_t num_tokens, seq_len; /* seq_len = num_tokens for [tokens, heads, dim] input */
    int32_t num_heads, block_size;
    int64_t num_blocks;
    void *slots;
    size_t slots_offset;
    int64_t slot_stride_outer, slot_stride_inner;
} kvhal_bk_paged_caching;

/* copy_blocks: for every cache c and pair p, copy block_bytes from base[c]+pairs[p].src*block_stride[c] to
 * base[c]+pairs[p].dst*block_stride[c]. Strides and sizes in bytes; pairs on the host. */
typedef struct kvhal_bk_copy_blocks {
    int32_t num_caches;
    void *const *natives;       /* cl_mem / device pointer per cache */
    const size_t *offsets;      /* byte offset of block 0 of each cache */
    const int64_t *block_strides;
    const int64_t *block_bytes;
    const int64_t *pairs;       /* 2 * num_pairs */
    int32_t num_pairs;
    int64_t num_blocks_min;     /* smallest block count over the caches (validated) */
} kvhal_bk_copy_blocks;

/* Batched copies of byte ranges on one device (duplicate of the contiguous cache). */
typedef struct kvhal_bk_copy_batch {
    int32_t count;
    void *const *dst;
    const size_t *dst_offsets;
    void *const *src;
    const size_t *src_offsets;
    const size_t *bytes;
} kvhal_bk_copy_batch;

/* tensor_copy: dst and src have the same shape and dtype. */
typedef struct kvhal_bk_tensor_copy {
    kvhal_bk_tensor dst, src;
} kvhal_bk_tensor_copy;

/* Ops with descriptors. */
typedef enum kvhal_bk_op {
    KVHAL_BK_OP_PAGED_CACHING = 0,
    KVHAL_BK_OP_COPY_BLOCKS = 1,
    KVHAL_BK_OP_TENSOR_COPY = 2,
    KVHAL_BK_OP_COUNT
} kvhal_bk_op;

typedef struct kvhal_backend kvhal_backend;
struct kvhal_backend {
    uint32_t abi_version; /* KVHAL_BACKEND_ABI_VERSION the module was built with */
    uint32_t struct_size; /* sizeof(kvhal_backend) the module was built with */
    const char *name;     /* "cuda" */
    kvhal_device_type type;

    /* Called once after load. Returns OK with *device_count (possibly 0, with reason filled) or an error. */
    kvhal_status (*init)(const kvhal_core_services *services, int32_t *device_count, char *reason,
                         size_t reason_size);
    void (*shutdown)(void);
    kvhal_status (*device_info)(int32_t id, kvhal_device_info *out);

    kvhal_status (*buffer_alloc)(int32_t id, size_t bytes, void **native);
    kvhal_status (*buffer_free)(int32_t id, void *native);
    /* NULL: the native pointer is used as is. */
    kvhal_status (*buffer_wrap)(int32_t id, void *native, size_t bytes);
    kvhal_status (*buffer_unwrap)(int32_t id, void *native);

    /* stream: NULL = default stream; otherwise a value from stream_create/stream_wrap. */
    kvhal_status (*stream_create)(int32_t id, void **stream);
    kvhal_status (*stream_wrap)(int32_t id, void *native, void **stream);
    kvhal_status (*stream_destroy)(int32_t id, void *stream); /* frees wrappers, destroys only owned ones */
    kvhal_status (*stream_synchronize)(int32_t id, void *stream);

    kvhal_status (*memcpy_h2d)(int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes, void *stream);
    kvhal_status (*memcpy_d2h)(int32_t id, void *dst, const void *src, size_t src_off, size_t bytes, void *stream);
    kvhal_status (*memcpy_d2d)(int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off, size_t bytes,
                               void *stream);
    /* Between two devices of this backend. NULL: the core stages through the host. */
    kvhal_status (*memcpy_peer)(int32_t dst_id, void *dst, size_t dst_off, int32_t src_id, const void *src,
                                size_t src_off, size_t bytes, void *stream);
    kvhal_status (*memset)(int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream);
    /* Waits for the device; returns KVHAL_DEVICE_FAULT (and clears the flag) if a kernel raised it. */
    kvhal_status (*synchronize)(int32_t id);
    kvhal_status (*check_errors)(int32_t id);

    /* Descriptors: created from the first call's arguments (metadata only matters), cached by the core per
     * thread and device under the exact tensor metadata, destroyed on eviction. */
    kvhal_status (*desc_create)(int32_t id, kvhal_bk_op op, const void *args, void **desc);
    void (*desc_destroy)(int32_t id, kvhal_bk_op op, void *desc);
    kvhal_status (*paged_caching)(int32_t id, void *desc, const kvhal_bk_paged_caching *args, void *stream);
    kvhal_status (*copy_blocks)(int32_t id, void *desc, const kvhal_bk_copy_blocks *args, void *stream);
    kvhal_status (*tensor_copy)(int32_t id, void *desc, const kvhal_bk_tensor_copy *args, void *stream);
    /* NULL: the core issues count memcpy_d2d calls. */
    kvhal_status (*copy_batch)(int32_t id, const kvhal_bk_copy_batch *args, void *stream);
    /* Append new entries here only. */
};

typedef const kvhal_backend *(*kvhal_backend_entry_fn)(uint32_t core_abi_version);
#define KVHAL_BACKEND_ENTRY_SYMBOL "kvhal_backend_entry"

#ifdef __cplusplus
}
#endif
#endif /* KVHAL_BACKEND_H */

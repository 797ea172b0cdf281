/* npu_backend.c — an example kvhal backend module, written as a device vendor would write one outside the kvhal
 * tree: libkvhal-npu.so serves a made-up device type "npu" with two devices (npu:0, npu:1). Its "device memory" is
 * host memory and its "kernels" are plain C loops (npu_ops.c), so it runs anywhere and shows every part of the
 * plugin interface (include/kvhal/kvhal_backend.h, ABI 2) without a vendor runtime: the entry point and table, init and
 * shutdown with a context instead of globals, device info, buffers, streams, copies (peer copies included),
 * memset, the device-side error flag read by synchronize and check_errors, a capability query that refuses what
 * the "hardware" cannot do, descriptors, and a backend-specific extra served by get_proc_address.
 *
 * Work runs to completion inside the call that queues it (the example has no command processor), so every stream
 * is always drained: stream_synchronize has nothing to wait for, and synchronize only reports the error flag.
 * The module links nothing of kvhal: it includes kvhal_backend.h and gets everything else from the core's services.
 * Exactly one symbol is exported (kvhal_backend_entry): build with -fvisibility=hidden. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_extras.h"

/* Buffers carry a header before the memory handed to the core, so that buffer_free knows their size. */
#define NPU_ALIGN 64
typedef struct npu_alloc_header {
    uint64_t bytes;
    int32_t device;
} npu_alloc_header;
_Static_assert(sizeof(npu_alloc_header) <= NPU_ALIGN, "the header fits in the alignment gap");

/* A stream: one the module created, or a wrapper around a queue handle the application owns (borrowed). */
typedef struct npu_stream {
    int32_t device;
    bool borrowed;
    void *queue; /* the borrowed handle; NULL for a created stream */
} npu_stream;

static npu_ctx *as_ctx(void *ctx) { return ctx; }

/* ---- lifetime ---- */

static kvhal_status npu_init(const kvhal_core_services *services, void **ctx, int32_t *device_count, char *reason,
                             size_t reason_size)
{
    *ctx = NULL;
    *device_count = 0;
    /* The services this module calls are in every version of the struct; a core that hands over less is broken. */
    if (!services || services->struct_size < offsetof(kvhal_core_services, alloc_should_fail) + sizeof(void *)) {
        snprintf(reason, reason_size, "example-npu: the core's services struct is too small");
        return KVHAL_ABI_MISMATCH;
    }
    npu_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(reason, reason_size, "example-npu: cannot allocate the module context");
        return KVHAL_OUT_OF_MEMORY;
    }
    c->svc = services;
    for (int i = 0; i < NPU_DEVICE_COUNT; i++) {
        atomic_init(&c->dev[i].bytes_allocated, 0);
        atomic_init(&c->dev[i].slot_fault, false);
        atomic_init(&c->dev[i].block_fault, false);
    }
    *ctx = c;
    *device_count = NPU_DEVICE_COUNT;
    if (reason_size) reason[0] = '\0';
    return KVHAL_OK;
}

static void npu_shutdown(void *ctx)
{
    npu_ctx *c = as_ctx(ctx);
    if (!c) return;
    for (int i = 0; i < NPU_DEVICE_COUNT; i++) {
        uint64_t live = atomic_load(&c->dev[i].bytes_allocated);
        if (live) c->svc->log(1, "example-npu: npu:%d: %llu bytes still allocated at shutdown", i,
                              (unsigned long long)live);
    }
    free(c);
}

/* ---- extras (npu_extras.h) ---- */

static uint64_t npu_bytes_allocated(void *ctx, int32_t id)
{
    npu_ctx *c = as_ctx(ctx);
    if (!c || id < 0 || id >= NPU_DEVICE_COUNT) return 0;
    return atomic_load(&c->dev[id].bytes_allocated);
}

static void *npu_get_proc_address(void *ctx, const char *name)
{
    if (!strcmp(name, EXAMPLE_NPU_CONTEXT)) return ctx;
    if (!strcmp(name, EXAMPLE_NPU_BYTES_ALLOCATED)) {
        example_npu_bytes_allocated_fn fn = npu_bytes_allocated;
        void *p;
        memcpy(&p, &fn, sizeof p); /* function pointer to object pointer without a pedantic cast */
        return p;
    }
    return NULL;
}

/* ---- devices ---- */

static kvhal_status npu_device_info(void *ctx, int32_t id, kvhal_device_info *out)
{
    npu_ctx *c = as_ctx(ctx);
    const uint64_t used = atomic_load(&c->dev[id].bytes_allocated);
    snprintf(out->name, sizeof out->name, "Example NPU %d (host memory, plain C)", (int)id);
    snprintf(out->platform, sizeof out->platform, "example-npu 1.0 (reference implementation on the host CPU)");
    out->total_memory = NPU_DEVICE_MEMORY;
    out->free_memory = used < NPU_DEVICE_MEMORY ? NPU_DEVICE_MEMORY - used : 0;
    out->compute_units = 1;
    out->peer_access = true; /* both devices live in one address space: memcpy_peer copies directly */
    return KVHAL_OK;
}

/* The device-side error flags, read and cleared: each is exchanged on its own, so a flag raised by another
 * thread's op meanwhile is reported now or at the next check, never lost. */
static kvhal_status npu_read_faults(void *ctx, int32_t id)
{
    npu_ctx *c = as_ctx(ctx);
    const bool slot = atomic_exchange(&c->dev[id].slot_fault, false);
    const bool block = atomic_exchange(&c->dev[id].block_fault, false);
    if (!slot && !block) return KVHAL_OK;
    return NPU_FAIL(c, KVHAL_DEVICE_FAULT, "npu:%d: an op skipped out-of-range indices, writing nothing for them:%s%s",
                    (int)id, slot ? " paged_caching slot_mapping entries >= num_blocks * block_size;" : "",
                    block ? " copy_blocks block ids out of range;" : "");
}

/* Work is complete when its call returns: waiting is reading the flag. */
static kvhal_status npu_synchronize(void *ctx, int32_t id) { return npu_read_faults(ctx, id); }

/* ---- memory ---- */

static kvhal_status npu_buffer_alloc(void *ctx, int32_t id, size_t bytes, void **native)
{
    npu_ctx *c = as_ctx(ctx);
    npu_device *d = &c->dev[id];
    /* Reserve the bytes against the device's capacity first, so concurrent allocations cannot overshoot it. */
    uint64_t used = atomic_load(&d->bytes_allocated);
    do {
        if (bytes > NPU_DEVICE_MEMORY - used)
            return NPU_FAIL(c, KVHAL_OUT_OF_MEMORY,
                            "bytes: npu:%d cannot allocate %zu bytes (%llu of %llu bytes of device memory in use)",
                            (int)id, bytes, (unsigned long long)used, (unsigned long long)NPU_DEVICE_MEMORY);
    } while (!atomic_compare_exchange_weak(&d->bytes_allocated, &used, used + bytes));
    /* aligned_alloc wants a multiple of the alignment; bytes <= NPU_DEVICE_MEMORY, so this cannot overflow. */
    const size_t total = NPU_ALIGN + (bytes + NPU_ALIGN - 1) / NPU_ALIGN * NPU_ALIGN;
    unsigned char *base = c->svc->alloc_should_fail() ? NULL : aligned_alloc(NPU_ALIGN, total);
    if (!base) {
        atomic_fetch_sub(&d->bytes_allocated, bytes);
        return NPU_FAIL(c, KVHAL_OUT_OF_MEMORY, "bytes: npu:%d: cannot allocate %zu bytes of host memory", (int)id,
                        bytes);
    }
    npu_alloc_header h = {.bytes = bytes, .device = id};
    memcpy(base, &h, sizeof h);
    *native = base + NPU_ALIGN;
    return KVHAL_OK;
}

static kvhal_status npu_buffer_free(void *ctx, int32_t id, void *native)
{
    npu_ctx *c = as_ctx(ctx);
    if (!native) return KVHAL_OK;
    unsigned char *base = (unsigned char *)native - NPU_ALIGN;
    npu_alloc_header h;
    memcpy(&h, base, sizeof h);
    if (h.device != id)
        return NPU_FAIL(c, KVHAL_INTERNAL, "npu:%d: buffer %p was allocated on npu:%d", (int)id, native,
                        (int)h.device);
    atomic_fetch_sub(&c->dev[id].bytes_allocated, h.bytes);
    free(base);
    return KVHAL_OK;
}

/* ---- streams ---- */

static kvhal_status new_stream(npu_ctx *c, int32_t id, void *queue, void **stream)
{
    npu_stream *s = c->svc->alloc_should_fail() ? NULL : malloc(sizeof *s);
    if (!s) return NPU_FAIL(c, KVHAL_OUT_OF_MEMORY, "npu:%d: cannot allocate a stream", (int)id);
    s->device = id;
    s->borrowed = queue != NULL;
    s->queue = queue;
    *stream = s;
    return KVHAL_OK;
}

static kvhal_status npu_stream_create(void *ctx, int32_t id, void **stream)
{
    return new_stream(as_ctx(ctx), id, NULL, stream);
}

/* native: the application's queue handle for this device (opaque to the example: any pointer), or one of the
 * default streams (NULL, KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD), which are the device's default queue here. */
static kvhal_status npu_stream_wrap(void *ctx, int32_t id, void *native, void **stream)
{
    npu_ctx *c = as_ctx(ctx);
    if (native == KVHAL_STREAM_LEGACY || native == KVHAL_STREAM_PER_THREAD) native = NULL;
    return new_stream(c, id, native, stream);
}

/* Frees the wrapper; a borrowed queue stays the application's. */
static kvhal_status npu_stream_destroy(void *ctx, int32_t id, void *stream)
{
    npu_stream *s = stream;
    if (s && s->device != id)
        return NPU_FAIL(as_ctx(ctx), KVHAL_INTERNAL, "npu:%d: stream %p belongs to npu:%d", (int)id, stream,
                        (int)s->device);
    free(s);
    return KVHAL_OK;
}

/* Work queued on a stream is done when its call returns: nothing to wait for. */
static kvhal_status npu_stream_synchronize(void *ctx, int32_t id, void *stream)
{
    (void)ctx, (void)id, (void)stream;
    return KVHAL_OK;
}

/* ---- copies ---- */

static kvhal_status npu_memcpy_h2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes,
                                   void *stream)
{
    (void)ctx, (void)id, (void)stream;
    memmove((unsigned char *)dst + dst_off, src, bytes);
    return KVHAL_OK;
}

static kvhal_status npu_memcpy_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t src_off, size_t bytes,
                                   void *stream)
{
    (void)ctx, (void)id, (void)stream;
    memmove(dst, (const unsigned char *)src + src_off, bytes);
    return KVHAL_OK;
}

static kvhal_status npu_memcpy_d2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src,
                                   size_t src_off, size_t bytes, void *stream)
{
    (void)ctx, (void)id, (void)stream;
    memmove((unsigned char *)dst + dst_off, (const unsigned char *)src + src_off, bytes);
    return KVHAL_OK;
}

static kvhal_status npu_memcpy_peer(void *ctx, int32_t dst_id, void *dst, size_t dst_off, int32_t src_id,
                                    const void *src, size_t src_off, size_t bytes, void *stream)
{
    (void)ctx, (void)dst_id, (void)src_id, (void)stream;
    memmove((unsigned char *)dst + dst_off, (const unsigned char *)src + src_off, bytes);
    return KVHAL_OK;
}

static kvhal_status npu_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream)
{
    (void)ctx, (void)id, (void)stream;
    memset((unsigned char *)dst + off, value, bytes);
    return KVHAL_OK;
}

/* ---- the table ---- */

static const kvhal_backend_device_fns npu_device_fns = {
    .struct_size = sizeof(kvhal_backend_device_fns),
    .device_info = npu_device_info,
    .buffer_alloc = npu_buffer_alloc,
    .buffer_free = npu_buffer_free,
    /* buffer_wrap / buffer_unwrap stay NULL: a wrapped pointer is host memory the core uses as is. */
    .stream_create = npu_stream_create,
    .stream_wrap = npu_stream_wrap,
    .stream_destroy = npu_stream_destroy,
    .stream_synchronize = npu_stream_synchronize,
    .memcpy_h2d = npu_memcpy_h2d,
    .memcpy_d2h = npu_memcpy_d2h,
    .memcpy_d2d = npu_memcpy_d2d,
    .memcpy_peer = npu_memcpy_peer,
    .memset = npu_memset,
    .synchronize = npu_synchronize,
    .check_errors = npu_read_faults, /* nothing is ever queued: the same as synchronize */
};

static const kvhal_backend_op_fns npu_op_fns = {
    .struct_size = sizeof(kvhal_backend_op_fns),
    .supports = npu_supports,
    .desc_create = npu_desc_create,
    .desc_destroy = npu_desc_destroy,
    .copy_batch = npu_copy_batch,
    .paged_caching = npu_paged_caching,
    .copy_blocks = npu_copy_blocks,
    .tensor_copy = npu_tensor_copy,
};

static const kvhal_backend npu_backend = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "example-npu",
    .device_type = "npu",
    .init = npu_init,
    .shutdown = npu_shutdown,
    .get_proc_address = npu_get_proc_address,
    .device = &npu_device_fns,
    .ops = &npu_op_fns,
};

/* The one exported symbol. A core older than the ABI this module was built for could not read its table. */
KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version);
KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    return core_abi_version >= KVHAL_BACKEND_ABI_VERSION ? &npu_backend : NULL;
}

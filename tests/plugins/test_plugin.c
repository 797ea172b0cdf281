/* test_plugin.c — one small backend module, compiled many times with different -D options into the test modules
 * of the registry suites (tests/plugins/meson.build lists them):
 *   TP_NAME "x"        the module's name (default: the device type)
 *   TP_TYPE "x"        the device type it serves (TP_TYPE_NULL: none at all)
 *   TP_ABI n           the ABI version its table claims (default: this header's)
 *   TP_NO_ENTRY        exports no kvhal_backend_entry
 *   TP_MISSING         its device group lacks buffer_alloc
 *   TP_INIT_FAIL       its init fails with a reason of its own
 *   TP_DEVICES n       devices it reports (default 1)
 *   TP_REFUSE          its supports() refuses tensor_copy of f32 tensors, with a reason
 *   TP_REASON_UNTERMINATED its init fails and fills the whole reason buffer with no terminating NUL
 *   TP_HALF_EVENTS     its device group sets event_create and event_query only (the registry refuses it)
 *   TP_COPY_FAIL       its copies between host and device fail while the mask that its extra "tp_copy_fail" points to
 *                      (an atomic_int: 1 device to host, 2 host to device) says so (test_xfer: a copy worker's
 *                      staging copy failing for real, through the core's error path); it has memset too, which
 *                      a paged cache's creation needs
 * A working module is host memory with tensor_copy as its one op (paged_caching and copy_blocks slots are NULL).
 * Entries that a refused module must never reach return KVHAL_INTERNAL, so a core that called them fails a test. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal_backend.h"

#ifndef TP_TYPE
#define TP_TYPE "tp"
#endif
#ifndef TP_NAME
#define TP_NAME TP_TYPE
#endif
#ifndef TP_ABI
#define TP_ABI KVHAL_BACKEND_ABI_VERSION
#endif
#ifndef TP_DEVICES
#define TP_DEVICES 1
#endif

typedef struct tp_ctx {
    const kvhal_core_services *svc;
    int32_t devices;
} tp_ctx;

static kvhal_status tp_init(const kvhal_core_services *svc, void **ctx, int32_t *count, char *reason,
                            size_t reason_size)
{
    *count = TP_DEVICES;
#if defined(TP_REASON_UNTERMINATED)
    memset(reason, 'x', reason_size);
    return KVHAL_BACKEND_ERROR;
#elif defined(TP_INIT_FAIL)
    snprintf(reason, reason_size, "%s: simulated driver failure", TP_NAME);
    return KVHAL_BACKEND_ERROR;
#else
    tp_ctx *c = malloc(sizeof *c);
    if (!c) return svc->set_error(KVHAL_OUT_OF_MEMORY, "tp: no memory for the context");
    c->svc = svc;
    c->devices = TP_DEVICES;
    *ctx = c;
    if (reason_size) reason[0] = '\0';
    return KVHAL_OK;
#endif
}

static void tp_shutdown(void *ctx) { free(ctx); }

static kvhal_status tp_info(void *ctx, int32_t id, kvhal_device_info *out)
{
    snprintf(out->name, sizeof out->name, "%s test device %d", TP_NAME, (int)id);
    snprintf(out->platform, sizeof out->platform, "host memory");
    out->compute_units = 1;
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}

__attribute__((unused)) static kvhal_status tp_alloc(void *ctx, int32_t id, size_t bytes, void **native)
{
    tp_ctx *c = ctx;
    if (!c) return KVHAL_INTERNAL;
    *native = bytes ? malloc(bytes) : malloc(1);
    return *native ? KVHAL_OK : c->svc->set_error(KVHAL_OUT_OF_MEMORY, "bytes: %zu do not fit", bytes);
}

static kvhal_status tp_free(void *ctx, int32_t id, void *native)
{
    free(native);
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}

#ifdef TP_COPY_FAIL
static atomic_int tp_copy_fail; /* TP_COPY_FAIL: which directions fail now */
#define TP_FAIL_IF(bit, what)                                                                                       \
    do {                                                                                                             \
        if (atomic_load(&tp_copy_fail) & (bit))                                                                      \
            return ((tp_ctx *)ctx)->svc->set_error(KVHAL_BACKEND_ERROR, "%s: simulated DMA failure copying %zu bytes " \
                                                   what, TP_NAME, n);                                               \
    } while (0)
#else
#define TP_FAIL_IF(bit, what) ((void)0)
#endif

static kvhal_status tp_h2d(void *ctx, int32_t id, void *dst, size_t off, const void *src, size_t n, void *s)
{
    TP_FAIL_IF(2, "to the device");
    memmove((char *)dst + off, src, n);
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}

static kvhal_status tp_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t off, size_t n, void *s)
{
    TP_FAIL_IF(1, "to the host");
    memmove(dst, (const char *)src + off, n);
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}

static kvhal_status tp_d2d(void *ctx, int32_t id, void *dst, size_t doff, const void *src, size_t soff, size_t n,
                           void *s)
{
    memmove((char *)dst + doff, (const char *)src + soff, n);
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}

#ifdef TP_COPY_FAIL
static kvhal_status tp_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t n, void *s)
{
    memset((char *)dst + off, value, n);
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}
#endif

static kvhal_status tp_sync(void *ctx, int32_t id) { return ctx ? KVHAL_OK : KVHAL_INTERNAL; }

static bool tp_supports(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t reason_size)
{
#ifdef TP_REFUSE
    if (op == KVHAL_BK_OP_TENSOR_COPY && ((const kvhal_bk_tensor_copy *)args)->dst.dtype == KVHAL_F32) {
        snprintf(reason, reason_size, "the %s device copies 16-bit and 8-bit data only", TP_TYPE);
        return false;
    }
#endif
    return true;
}

/* Element by element over any strides: the index is split into coordinates, last dimension fastest. */
static kvhal_status tp_tensor_copy(void *ctx, int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    const size_t es = kvhal_bk_dtype_size(a->dst.dtype);
    int64_t n = 1;
    for (int d = 0; d < a->dst.ndim; d++) n *= a->dst.shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t rest = i, doff = 0, soff = 0;
        for (int d = a->dst.ndim - 1; d >= 0; d--) {
            int64_t c = rest % a->dst.shape[d];
            rest /= a->dst.shape[d];
            doff += c * a->dst.strides[d];
            soff += c * a->src.strides[d];
        }
        memcpy((char *)a->dst.native + a->dst.offset + (size_t)doff * es,
               (const char *)a->src.native + a->src.offset + (size_t)soff * es, es);
    }
    return ctx ? KVHAL_OK : KVHAL_INTERNAL;
}

#ifdef TP_HALF_EVENTS
static kvhal_status tp_event_create(void *ctx, int32_t id, void **ev)
{
    (void)ctx;
    (void)id;
    *ev = NULL;
    return KVHAL_OK;
}
static kvhal_status tp_event_query(void *ctx, int32_t id, void *ev)
{
    (void)ctx;
    (void)id;
    (void)ev;
    return KVHAL_OK;
}
#endif

static int tp_magic = 42;
static void *tp_proc(void *ctx, const char *name)
{
#ifdef TP_COPY_FAIL
    if (!strcmp(name, "tp_copy_fail")) return &tp_copy_fail;
#endif
    return !strcmp(name, "tp_magic") ? &tp_magic : NULL;
}

static const kvhal_backend_device_fns tp_device = {
    .struct_size = sizeof(kvhal_backend_device_fns),
    .device_info = tp_info,
#ifndef TP_MISSING
    .buffer_alloc = tp_alloc,
#endif
    .buffer_free = tp_free,
    .memcpy_h2d = tp_h2d,
    .memcpy_d2h = tp_d2h,
    .memcpy_d2d = tp_d2d,
#ifdef TP_COPY_FAIL
    .memset = tp_memset,
#endif
    .synchronize = tp_sync,
#ifdef TP_HALF_EVENTS
    .event_create = tp_event_create,
    .event_query = tp_event_query,
#endif
};

static const kvhal_backend_op_fns tp_ops = {
    .struct_size = sizeof(kvhal_backend_op_fns),
    .supports = tp_supports,
    .tensor_copy = tp_tensor_copy,
};

static const kvhal_backend tp_table = {
    .abi_version = TP_ABI,
    .struct_size = sizeof(kvhal_backend),
    .name = TP_NAME,
#ifdef TP_TYPE_NULL
    .device_type = NULL,
#else
    .device_type = TP_TYPE,
#endif
    .init = tp_init,
    .shutdown = tp_shutdown,
    .get_proc_address = tp_proc,
    .device = &tp_device,
    .ops = &tp_ops,
};

#ifndef TP_NO_ENTRY
KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version);
const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version;
    return &tp_table;
}
#else
/* Without the entry nothing references the table; keep the compiler quiet about it. */
KVHAL_API const void *kvhal_not_the_entry(void);
const void *kvhal_not_the_entry(void) { return &tp_table; }
#endif

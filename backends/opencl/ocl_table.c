/* ocl_table.c — the OpenCL module's table (kvhal_backend.h, ABI 2) and its one exported symbol. The op slots and
 * the per-op dispatch of supports, desc_create and desc_destroy are generated from KVHAL_BK_OP_LIST: an op of the
 * list without its ocl_<name>.c fails to link. */
#include <stdio.h>

#include "ocl_internal.h"

#define OCL_EXPORT __attribute__((visibility("default")))

static bool ocl_supports(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t reason_size)
{
    const ocl_device *d = kvhal__ocl_device(ctx, id);
    if (!d) return kvhal_bk_refuse(reason, reason_size, "opencl:%d: no such device", (int)id);
    switch (op) {
#define OCL_X_SUPPORTS(E, name, T)                                                                              \
    case KVHAL_BK_OP_##E: return ocl_##name##_supports(d, (const T *)args, reason, reason_size);
        KVHAL_BK_OP_LIST(OCL_X_SUPPORTS)
#undef OCL_X_SUPPORTS
    default: return kvhal_bk_refuse(reason, reason_size, "op %d is not an op of this module", (int)op);
    }
}

static kvhal_status ocl_desc_create(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc)
{
    OCL_GET_DEVICE(ctx, id, d);
    if (!args || !desc)
        return OCL_SET_ERROR(d->m, KVHAL_INVALID_ARGUMENT, "opencl:%d: desc_create without arguments", (int)id);
    /* What supports() refuses, desc_create refuses too (the core asks first, but a caller of the table may not). */
    char reason[256];
    if (!ocl_supports(ctx, id, op, args, reason, sizeof reason))
        return OCL_SET_ERROR(d->m, KVHAL_UNSUPPORTED, "opencl:%d: %s", (int)id, reason);
    switch (op) {
#define OCL_X_CREATE(E, name, T)                                                                                \
    case KVHAL_BK_OP_##E: return ocl_##name##_desc_create(d, (const T *)args, desc);
        KVHAL_BK_OP_LIST(OCL_X_CREATE)
#undef OCL_X_CREATE
    default: return OCL_SET_ERROR(d->m, KVHAL_UNSUPPORTED, "opencl:%d: op %d has no descriptor", (int)id, (int)op);
    }
}

static void ocl_desc_destroy(void *ctx, int32_t id, kvhal_bk_op op, void *desc)
{
    ocl_device *d = kvhal__ocl_device(ctx, id);
    switch (op) {
#define OCL_X_DESTROY(E, name, T)                                                                               \
    case KVHAL_BK_OP_##E: ocl_##name##_desc_destroy(d, desc); break;
        KVHAL_BK_OP_LIST(OCL_X_DESTROY)
#undef OCL_X_DESTROY
    default: break;
    }
}

static const kvhal_backend_device_fns device_fns = {
    .struct_size = sizeof(kvhal_backend_device_fns),
    .device_info = kvhal__ocl_device_info,
    .buffer_alloc = kvhal__ocl_buffer_alloc,
    .buffer_free = kvhal__ocl_buffer_free,
    .buffer_wrap = kvhal__ocl_buffer_wrap,
    .buffer_unwrap = kvhal__ocl_buffer_unwrap,
    .stream_create = kvhal__ocl_stream_create,
    .stream_wrap = kvhal__ocl_stream_wrap,
    .stream_destroy = kvhal__ocl_stream_destroy,
    .stream_synchronize = kvhal__ocl_stream_synchronize,
    .memcpy_h2d = kvhal__ocl_memcpy_h2d,
    .memcpy_d2h = kvhal__ocl_memcpy_d2h,
    .memcpy_d2d = kvhal__ocl_memcpy_d2d,
    .memcpy_peer = kvhal__ocl_memcpy_peer,
    .memset = kvhal__ocl_memset,
    .synchronize = kvhal__ocl_synchronize,
    .check_errors = kvhal__ocl_check_errors,
    .stream_check_errors = kvhal__ocl_stream_check_errors,
    .host_alloc = NULL, /* plain host memory: no mapped-buffer pool yet */
    .host_free = NULL,
    .stream_query = kvhal__ocl_stream_query,
    .event_create = kvhal__ocl_event_create,
    .event_destroy = kvhal__ocl_event_destroy,
    .event_record = kvhal__ocl_event_record,
    .event_query = kvhal__ocl_event_query,
    .event_synchronize = kvhal__ocl_event_synchronize,
    .stream_wait_event = kvhal__ocl_stream_wait_event,
};

static const kvhal_backend_op_fns op_fns = {
    .struct_size = sizeof(kvhal_backend_op_fns),
    .supports = ocl_supports,
    .desc_create = ocl_desc_create,
    .desc_destroy = ocl_desc_destroy,
    .copy_batch = ocl_copy_batch,
#define OCL_X_SLOT(E, name, T) .name = ocl_##name,
    KVHAL_BK_OP_LIST(OCL_X_SLOT)
#undef OCL_X_SLOT
};

static const kvhal_backend table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "opencl",
    .device_type = "opencl",
    .init = kvhal__ocl_init,
    .shutdown = kvhal__ocl_shutdown,
    .get_proc_address = kvhal__ocl_get_proc_address,
    .device = &device_fns,
    .ops = &op_fns,
};

const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version) OCL_EXPORT;
const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    /* Within one major ABI the table only grows, so any core from ABI_MIN on can use it; the core checks our
     * version itself. */
    return core_abi_version >= KVHAL_BACKEND_ABI_MIN ? &table : NULL;
}

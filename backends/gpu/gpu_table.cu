/* gpu_table.cu — the plugin table of the CUDA and HIP backend modules (include/kvhal/kvhal_backend.h, ABI 2) and their one
 * exported symbol. The op slots and the supports / desc_create / desc_destroy dispatch come from KVHAL_BK_OP_LIST:
 * op <name> is served by gpu_<name>, <name>_supports, <name>_desc_create and <name>_desc_destroy of
 * gpu_<name>.cu. */
#include "gpu_private.h"

namespace kvhal_gpu {
namespace {

bool gpu_supports(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t reason_size)
{
    Ctx *c = ctx_of(ctx);
    switch (op) {
#define KVHAL_GPU_X_SUPPORTS(E, name, T)                                                                        \
    case KVHAL_BK_OP_##E: return name##_supports(c, id, static_cast<const T *>(args), reason, reason_size);
        KVHAL_BK_OP_LIST(KVHAL_GPU_X_SUPPORTS)
#undef KVHAL_GPU_X_SUPPORTS
    default: return kvhal_bk_refuse(reason, reason_size, "op %d is not a %s op", (int)op, KVHAL_GPU_NAME);
    }
}

kvhal_status gpu_desc_create(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!args || !desc) return fail(c, KVHAL_INVALID_ARGUMENT, "desc_create: NULL %s", args ? "desc" : "args");
    /* the first call of a shape may be inside a capture: resolving kernels (lazy module loading) and allocating
     * host memory for the descriptor must not invalidate it */
    const RelaxedCapture relaxed;
    switch (op) {
#define KVHAL_GPU_X_CREATE(E, name, T)                                                                          \
    case KVHAL_BK_OP_##E: return name##_desc_create(c, id, static_cast<const T *>(args), desc);
        KVHAL_BK_OP_LIST(KVHAL_GPU_X_CREATE)
#undef KVHAL_GPU_X_CREATE
    default: return fail(c, KVHAL_UNSUPPORTED, "op: %d is not a %s op", (int)op, KVHAL_GPU_NAME);
    }
}

void gpu_desc_destroy(void *ctx, int32_t id, kvhal_bk_op op, void *desc)
{
    if (!desc) return;
    Ctx *c = ctx_of(ctx);
    switch (op) {
#define KVHAL_GPU_X_DESTROY(E, name, T)                                                                         \
    case KVHAL_BK_OP_##E: name##_desc_destroy(c, id, desc); break;
        KVHAL_BK_OP_LIST(KVHAL_GPU_X_DESTROY)
#undef KVHAL_GPU_X_DESTROY
    default: break;
    }
}

const kvhal_backend_device_fns g_device = {
    .struct_size = sizeof(kvhal_backend_device_fns),
    .device_info = gpu_device_info,
    .buffer_alloc = gpu_buffer_alloc,
    .buffer_free = gpu_buffer_free,
    .buffer_wrap = gpu_buffer_wrap,
    .buffer_unwrap = gpu_buffer_unwrap,
    .stream_create = gpu_stream_create,
    .stream_wrap = gpu_stream_wrap,
    .stream_destroy = gpu_stream_destroy,
    .stream_synchronize = gpu_stream_synchronize,
    .memcpy_h2d = gpu_memcpy_h2d,
    .memcpy_d2h = gpu_memcpy_d2h,
    .memcpy_d2d = gpu_memcpy_d2d,
    .memcpy_peer = gpu_memcpy_peer,
    .memset = gpu_memset,
    .synchronize = gpu_synchronize,
    .check_errors = gpu_check_errors,
    .stream_check_errors = gpu_stream_check_errors,
    .host_alloc = gpu_host_alloc,
    .host_free = gpu_host_free,
    .stream_query = gpu_stream_query,
    .buffer_alloc_shareable = gpu_buffer_alloc_shareable,
    .buffer_free_shareable = gpu_buffer_free_shareable,
    .ipc_export = gpu_ipc_export,
    .ipc_import = gpu_ipc_import,
    .ipc_close = gpu_ipc_close,
    .event_create = gpu_event_create,
    .event_destroy = gpu_event_destroy,
    .event_record = gpu_event_record,
    .event_query = gpu_event_query,
    .event_synchronize = gpu_event_synchronize,
    .stream_wait_event = gpu_stream_wait_event,
};

const kvhal_backend_op_fns g_ops = {
    .struct_size = sizeof(kvhal_backend_op_fns),
    .supports = gpu_supports,
    .desc_create = gpu_desc_create,
    .desc_destroy = gpu_desc_destroy,
    .copy_batch = gpu_copy_batch,
#define KVHAL_GPU_X_SLOT(E, name, T) .name = gpu_##name,
    KVHAL_BK_OP_LIST(KVHAL_GPU_X_SLOT)
#undef KVHAL_GPU_X_SLOT
};

/* Every op's module (and the ceiling's) loaded when a device is opened (load_code). */
void preload_code(Ctx *c, int32_t id)
{
    const void *const kernels[] = {
#define KVHAL_GPU_X_ONE_KERNEL(E, name, T) name##_one_kernel(),
        KVHAL_BK_OP_LIST(KVHAL_GPU_X_ONE_KERNEL)
#undef KVHAL_GPU_X_ONE_KERNEL
            ceiling_one_kernel()};
    load_code(c, id, kernels, (int)(sizeof kernels / sizeof kernels[0]));
}

/* init, and the hook that loads the ops' code when a device is opened (Ctx::preload: the ops are above the device). */
kvhal_status table_init(const kvhal_core_services *services, void **ctx, int32_t *device_count, char *reason,
                        size_t reason_size)
{
    const kvhal_status st = gpu_init(services, ctx, device_count, reason, reason_size);
    if (st == KVHAL_OK && ctx && *ctx) ctx_of(*ctx)->preload = preload_code;
    return st;
}

const kvhal_backend g_table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = KVHAL_GPU_NAME,
    .device_type = KVHAL_GPU_NAME,
    .init = table_init,
    .shutdown = gpu_shutdown,
    .get_proc_address = gpu_get_proc_address,
    .device = &g_device,
    .ops = &g_ops,
};

} // namespace

#if defined(KVHAL_GPU_RTC)
/* Test hook "kvhal_hip_rtc_kernel_exprs": every name expression the module's ops may compile (with repeats), each
 * with the mangled-name fragment (needle) by which the module finds its kernel in the code object. */
extern "C" void kvhal_hip_rtc_kernel_exprs(void (*add)(void *user, const char *expr, const char *needle),
                                           void *user)
{
    if (!add) return;
    struct Fwd {
        void (*add)(void *, const char *, const char *);
        void *user;
        static void one(void *u, const char *expr)
        {
            Fwd *f = static_cast<Fwd *>(u);
            char needle[96];
            kernel_needle(expr, needle, sizeof needle);
            f->add(f->user, expr, needle);
        }
    } fwd = {add, user};
#define KVHAL_GPU_X_RTC_EXPRS(E, name, T) name##_rtc_exprs(Fwd::one, &fwd);
    KVHAL_BK_OP_LIST(KVHAL_GPU_X_RTC_EXPRS)
#undef KVHAL_GPU_X_RTC_EXPRS
}

extern "C" int kvhal_hip_rtc_compile(const char *target, const char *const *exprs, int n, void **code, size_t *size,
                                     char *err, size_t err_size);
extern "C" int kvhal_hip_rtc_code_object(const char *target, const char *expr, const char *dir, void **code,
                                         size_t *size, int *origin, char *note, size_t note_size);
#endif

/* "kvhal_gpu_scatter_rows", "kvhal_gpu_scatter_rows_form" and "kvhal_gpu_spin", the benchmarks' extras (gpu_ceiling.cu, kvhal_backend.h); HIP on
 * AMD, for tests:
 * "kvhal_hip_rtc_compile", the run-time compiler (gpu_codepath.cu), "kvhal_hip_rtc_kernel_exprs", every kernel name
 * expression the ops may compile with it (above), and "kvhal_hip_rtc_code_object", one kernel's code object through
 * the disk cache (gpu_codepath.cu). No other extras. */
void *gpu_get_proc_address(void *ctx, const char *name)
{
    (void)ctx;
    if (name && !strcmp(name, "kvhal_gpu_scatter_rows")) return reinterpret_cast<void *>(kvhal_gpu_scatter_rows);
    if (name && !strcmp(name, "kvhal_gpu_scatter_rows_form"))
        return reinterpret_cast<void *>(kvhal_gpu_scatter_rows_form);
    if (name && !strcmp(name, "kvhal_gpu_spin")) return reinterpret_cast<void *>(kvhal_gpu_spin);
#if defined(KVHAL_GPU_RTC)
    if (name && !strcmp(name, "kvhal_hip_rtc_compile")) return reinterpret_cast<void *>(kvhal_hip_rtc_compile);
    if (name && !strcmp(name, "kvhal_hip_rtc_kernel_exprs"))
        return reinterpret_cast<void *>(kvhal_hip_rtc_kernel_exprs);
    if (name && !strcmp(name, "kvhal_hip_rtc_code_object")) return reinterpret_cast<void *>(kvhal_hip_rtc_code_object);
#else
    (void)name;
#endif
    return NULL;
}

} // namespace kvhal_gpu

/* The module's one exported symbol. */
extern "C" __attribute__((visibility("default"))) const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version; /* the core checks the table's version against its own range */
    return &kvhal_gpu::g_table;
}

/* cpu_ops.h — what the two files of the CPU backend share: its context and its ops (cpu_ops.c), referenced from
 * its table in cpu_backend.c. Like any module, the CPU backend sees kvhal_backend.h and the services table only. */
#ifndef KVHAL_CPU_OPS_H
#define KVHAL_CPU_OPS_H
#include <pthread.h>

#include "kvhal_backend.h"

#define CPU_HIDDEN __attribute__((visibility("hidden")))

/* The module's context: what init was given. */
typedef struct cpu_ctx {
    const kvhal_core_services *svc;
    pthread_mutex_t ipc_mu; /* guards ipc_maps */
    struct cpu_map *ipc_maps; /* cpu_ipc.c: the shared-memory mappings made (exported and imported) */
} cpu_ctx;

CPU_HIDDEN kvhal_status cpu_desc_create(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc);
CPU_HIDDEN void cpu_desc_destroy(void *ctx, int32_t id, kvhal_bk_op op, void *desc);
/* cpu_ipc.c: shareable memory (POSIX shared memory) and its IPC handles. */
CPU_HIDDEN kvhal_status cpu_buffer_alloc_shareable(void *ctx, int32_t id, size_t bytes, void **native);
CPU_HIDDEN kvhal_status cpu_buffer_free_shareable(void *ctx, int32_t id, void *native);
CPU_HIDDEN kvhal_status cpu_ipc_export(void *ctx, int32_t id, void *native, void *blob, size_t cap, size_t *len);
CPU_HIDDEN kvhal_status cpu_ipc_import(void *ctx, int32_t id, const void *blob, size_t len, size_t bytes,
                                       void **native);
CPU_HIDDEN kvhal_status cpu_ipc_close(void *ctx, int32_t id, void *native);
CPU_HIDDEN kvhal_status cpu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *args, void *stream);
/* One function per op of KVHAL_BK_OP_LIST: cpu_paged_caching, cpu_copy_blocks, cpu_tensor_copy. */
#define X(E, name, T) CPU_HIDDEN kvhal_status cpu_##name(void *ctx, int32_t id, void *desc, const T *args, void *stream);
KVHAL_BK_OP_LIST(X)
#undef X
#endif

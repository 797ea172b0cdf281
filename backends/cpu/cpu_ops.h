/* cpu_ops.h — the CPU backend's ops (cpu_ops.c), referenced from its table in cpu_backend.c. */
#ifndef KVHAL_CPU_OPS_H
#define KVHAL_CPU_OPS_H
#include "kvhal_backend.h"

kvhal_status kvhal__cpu_desc_create(int32_t id, kvhal_bk_op op, const void *args, void **desc)
    __attribute__((visibility("hidden")));
void kvhal__cpu_desc_destroy(int32_t id, kvhal_bk_op op, void *desc) __attribute__((visibility("hidden")));
kvhal_status kvhal__cpu_paged_caching(int32_t id, void *desc, const kvhal_bk_paged_caching *args, void *stream)
    __attribute__((visibility("hidden")));
kvhal_status kvhal__cpu_copy_blocks(int32_t id, void *desc, const kvhal_bk_copy_blocks *args, void *stream)
    __attribute__((visibility("hidden")));
kvhal_status kvhal__cpu_tensor_copy(int32_t id, void *desc, const kvhal_bk_tensor_copy *args, void *stream)
    __attribute__((visibility("hidden")));
kvhal_status kvhal__cpu_copy_batch(int32_t id, const kvhal_bk_copy_batch *args, void *stream)
    __attribute__((visibility("hidden")));
#endif

/* npu.h — what the two source files of the example NPU module share: its context (everything the module keeps,
 * handed back by the core on every call), the device count and memory size, and the op entry points that
 * npu_backend.c puts into its table. Private to the module: applications see npu_extras.h only. */
#ifndef EXAMPLE_NPU_H
#define EXAMPLE_NPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvhal_backend.h"

#define NPU_DEVICE_COUNT 2
/* Memory each example device offers (it is host memory underneath; the bound makes it behave like a device's). */
#define NPU_DEVICE_MEMORY ((uint64_t)2 << 30)
/* The example NPU moves one head's row (head_dim elements) through an on-chip row buffer of this many elements:
 * paged_caching with a longer head is refused by npu_supports (npu_ops.c stages rows through such a buffer). */
#define NPU_ROW_MAX 1024

typedef struct npu_device {
    atomic_uint_least64_t bytes_allocated; /* live buffer_alloc bytes, bounded by NPU_DEVICE_MEMORY */
    atomic_bool slot_fault;                /* paged_caching skipped a slot >= num_slots since the last check */
    atomic_bool block_fault;               /* copy_blocks skipped a block id out of range (the core checks first) */
} npu_device;

/* The module's whole state: created by init, freed by shutdown. No globals. */
typedef struct npu_ctx {
    const kvhal_core_services *svc;
    npu_device dev[NPU_DEVICE_COUNT];
} npu_ctx;

/* Reports a failure through the core (this thread's kvhal_last_error) and returns status. */
#define NPU_FAIL(ctx, status, ...) ((ctx)->svc->set_error((status), __VA_ARGS__))

/* ---- npu_ops.c ---- */
bool npu_supports(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t reason_size);
kvhal_status npu_desc_create(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc);
void npu_desc_destroy(void *ctx, int32_t id, kvhal_bk_op op, void *desc);
kvhal_status npu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *args, void *stream);
kvhal_status npu_paged_caching(void *ctx, int32_t id, void *desc, const kvhal_bk_paged_caching *args, void *stream);
kvhal_status npu_copy_blocks(void *ctx, int32_t id, void *desc, const kvhal_bk_copy_blocks *args, void *stream);
kvhal_status npu_tensor_copy(void *ctx, int32_t id, void *desc, const kvhal_bk_tensor_copy *args, void *stream);

#endif

/* variant.c — modules for kvhal-conformance's own tests, made from the example vendor module
 * (examples/vendor-plugin, compiled with its entry point renamed npu_example_entry) with one thing changed:
 * - NPU_VARIANT_NODESC: device type npu_nodesc, no desc_create or desc_destroy (a module without descriptors must
 *   pass the same suite); it counts its supports() calls, read through get_proc_address("npu_variant_supports_calls").
 * - NPU_VARIANT_BAD: device type npu_bad, whose copy_blocks drops the last pair of every call (a plausible
 *   off-by-one): kvhal-conformance must fail, naming copy_blocks. */
/* the build renames the example's entry point with -Dkvhal_backend_entry=npu_example_entry: not this file's */
#undef kvhal_backend_entry
#include <stdatomic.h>
#include <string.h>

#include "kvhal_backend.h"

const kvhal_backend *npu_example_entry(uint32_t core_abi_version);

static kvhal_backend table;
static kvhal_backend_op_fns ops;
static const kvhal_backend *real;
static atomic_long supports_calls;

static bool counting_supports(void *ctx, int32_t id, kvhal_bk_op op, const void *args, char *reason, size_t size)
{
    atomic_fetch_add(&supports_calls, 1);
    return real->ops->supports(ctx, id, op, args, reason, size);
}

static void *variant_proc(void *ctx, const char *name)
{
    if (!strcmp(name, "npu_variant_supports_calls")) return &supports_calls;
    return real->get_proc_address ? real->get_proc_address(ctx, name) : NULL;
}

static kvhal_status bad_copy_blocks(void *ctx, int32_t id, void *desc, const kvhal_bk_copy_blocks *args,
                                    void *stream)
{
    kvhal_bk_copy_blocks a = *args;
    if (a.num_pairs > 1) a.num_pairs--;
    return real->ops->copy_blocks(ctx, id, desc, &a, stream);
}

KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version);
KVHAL_API const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    real = npu_example_entry(core_abi_version);
    if (!real) return NULL;
    table = *real;
    ops = *real->ops;
    table.ops = &ops;
    table.get_proc_address = variant_proc;
#if defined(NPU_VARIANT_NODESC)
    table.name = "npu-nodesc";
    table.device_type = "npu_nodesc";
    ops.desc_create = NULL;
    ops.desc_destroy = NULL;
    ops.supports = counting_supports;
    (void)bad_copy_blocks;
#elif defined(NPU_VARIANT_BAD)
    table.name = "npu-bad";
    table.device_type = "npu_bad";
    ops.copy_blocks = bad_copy_blocks;
    (void)counting_supports;
#else
#error "pick a variant"
#endif
    return &table;
}

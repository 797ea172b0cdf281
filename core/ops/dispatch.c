/* dispatch.c — the parts of op dispatch that are not inline (ops.h): descriptors made for one call, and the
 * shared error messages. Each op lives in a file of its own beside this one (<op>.c): full validation of the
 * caller's tensors, normalisation into the backend's argument struct (kvhal_backend.h), its descriptor key, then
 * kvhal__op_dispatch. */
#include "ops.h"

kvhal_status kvhal__op_desc_once(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, const void *args, void **desc)
{
    *desc = NULL;
    if (bk->ops.supports) {
        char reason[256] = "";
        if (!bk->ops.supports(bk->ctx, dev.id, op, args, reason, sizeof reason))
            return kvhal__unsupported(bk, dev, op, reason);
    }
    if (bk->ops.desc_create) KVHAL_TRY(bk->ops.desc_create(bk->ctx, dev.id, op, args, desc));
    return KVHAL_OK;
}

void kvhal__op_desc_release(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, void *desc)
{
    if (bk->ops.desc_create && bk->ops.desc_destroy) bk->ops.desc_destroy(bk->ctx, dev.id, op, desc);
}

kvhal_status kvhal__device_mismatch(const char *arg, kvhal_device got, const char *ref, kvhal_device want)
{
    return kvhal__err(KVHAL_DEVICE_MISMATCH, "%s: is on %s:%d but %s is on %s:%d", arg,
                      kvhal_device_type_name(got.type), (int)got.id, ref, kvhal_device_type_name(want.type),
                      (int)want.id);
}

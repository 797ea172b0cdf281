/* dispatch.c — the part of op dispatch that is not inline (ops.h): the shared error message. Each op lives in a file of its own beside this one (<op>.c): full validation of the
 * caller's tensors, normalisation into the backend's argument struct (kvhal_backend.h), its descriptor key, then
 * kvhal__op_dispatch. */
#include "ops.h"

kvhal_status kvhal__device_mismatch(const char *arg, kvhal_device got, const char *ref, kvhal_device want)
{
    return kvhal__err(KVHAL_DEVICE_MISMATCH, "%s: is on %s:%d but %s is on %s:%d", arg,
                      kvhal_device_type_name(got.type), (int)got.id, ref, kvhal_device_type_name(want.type),
                      (int)want.id);
}

/* dispatch.c — the part of op dispatch that is not inline (ops.h): the shared error message. Each op lives in a file of its own beside this one (<op>.c): full validation of the
 * caller's tensors, normalisation into the backend's argument struct (kvhal_backend.h), its descriptor key, then
 * kvhal__op_dispatch. */
#include <stdio.h>

#include "device.h"
#include "ops.h"
#include "tensor.h"

kvhal_status kvhal__device_mismatch(const char *arg, kvhal_device got, const char *ref, kvhal_device want)
{
    return kvhal__err(KVHAL_DEVICE_MISMATCH, "%s: is on %s:%d but %s is on %s:%d", arg,
                      kvhal_device_type_name(got.type), (int)got.id, ref, kvhal_device_type_name(want.type),
                      (int)want.id);
}

/* Formats "caches[i]" only when a check fails, so the common path does no printf. */
static kvhal_status check_cache_tensor(const kvhal_tensor *t, int32_t i)
{
    if (kvhal__check_tensor(t, "caches[]") == KVHAL_OK) return KVHAL_OK;
    char name[32];
    snprintf(name, sizeof name, "caches[%d]", (int)i);
    return kvhal__check_tensor(t, name);
}

kvhal_status kvhal__check_block_caches(const kvhal_tensor *caches, int32_t num_caches, kvhal_device *dev,
                                       int64_t *min_blocks, int32_t *min_cache)
{
    KVHAL_CHECK_ARG(caches, "caches: NULL");
    KVHAL_CHECK_ARG(num_caches >= 1, "num_caches: %d must be >= 1", (int)num_caches);
    KVHAL_TRY(check_cache_tensor(&caches[0], 0));
    const kvhal_device d0 = caches[0].buffer->device;
    int64_t mb = INT64_MAX;
    int32_t mc = 0;
    for (int32_t c = 0; c < num_caches; c++) {
        const kvhal_tensor *t = &caches[c];
        if (c) KVHAL_TRY(check_cache_tensor(t, c));
        if (!kvhal__device_equal(t->buffer->device, d0))
            return kvhal__err(KVHAL_DEVICE_MISMATCH, "caches[%d]: is on %s:%d but caches[0] is on %s:%d", (int)c,
                              kvhal_device_type_name(t->buffer->device.type), (int)t->buffer->device.id,
                              kvhal_device_type_name(d0.type), (int)d0.id);
        int64_t expect = 1;
        for (int i = t->ndim - 1; i >= 1; i--) {
            if (t->shape[i] != 1 && t->strides[i] != expect)
                return kvhal__err(KVHAL_INVALID_ARGUMENT, "caches[%d].strides[%d]: %lld, a block must be dense "
                                  "row-major (expected %lld)", (int)c, i, (long long)t->strides[i], (long long)expect);
            expect *= t->shape[i];
        }
        if (t->shape[0] > 1 && t->strides[0] < expect)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "caches[%d].strides[0]: %lld makes blocks of %lld elements "
                              "overlap", (int)c, (long long)t->strides[0], (long long)expect);
        if (t->shape[0] < mb) mb = t->shape[0], mc = c;
    }
    *dev = d0;
    *min_blocks = mb;
    *min_cache = mc;
    return KVHAL_OK;
}

int kvhal__cmp_pair_entry(const void *a, const void *b)
{
    const kvhal__pair_entry *x = a, *y = b;
    if (x->value != y->value) return x->value < y->value ? -1 : 1;
    return x->pair < y->pair ? -1 : x->pair > y->pair;
}

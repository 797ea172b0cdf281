/* tensor_copy.c — kvhal_tensor_copy (any strides, same shape and dtype) and the K/V pair copy of the static cache,
 * which either runs both copies or fails before writing either. */
#include "device.h"
#include "ops.h"
#include "tensor.h"
#include "tensor_copy.h"


/* Validates one copy and fills its backend arguments and key. *empty: nothing to copy (still a success). */
static kvhal_status prepare_copy(const kvhal_tensor *dst, const kvhal_tensor *src, const kvhal_stream *s,
                                 const char *dname, const char *sname, kvhal_bk_tensor_copy *args,
                                 kvhal_desc_key *key, bool *empty)
{
    KVHAL_TRY(kvhal__check_tensor(dst, dname));
    KVHAL_TRY(kvhal__check_tensor(src, sname));
    kvhal_device dev = dst->buffer->device;
    if (!kvhal__device_equal(src->buffer->device, dev)) return kvhal__device_mismatch(sname, src->buffer->device, dname, dev);
    KVHAL_TRY(kvhal__check_stream(s, dev, "s"));
    if (src->dtype != dst->dtype)
        return kvhal__err(KVHAL_DTYPE_MISMATCH, "%s.dtype: %s differs from %s.dtype %s", sname,
                          kvhal_dtype_name(src->dtype), dname, kvhal_dtype_name(dst->dtype));
    if (src->ndim != dst->ndim)
        return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.ndim: %d differs from %s.ndim %d", sname, src->ndim, dname,
                          dst->ndim);
    for (int i = 0; i < dst->ndim; i++)
        if (src->shape[i] != dst->shape[i])
            return kvhal__err(KVHAL_SHAPE_MISMATCH, "%s.shape[%d]: %lld differs from %s.shape[%d] %lld", sname, i,
                              (long long)src->shape[i], dname, i, (long long)dst->shape[i]);
    const kvhal__bk *bk = dst->buffer->backend;
    if (!bk->ops.tensor_copy) return kvhal__unsupported(bk, dev, KVHAL_BK_OP_TENSOR_COPY, NULL);
    *empty = kvhal_tensor_numel(dst) == 0;
    if (*empty) return KVHAL_OK;
    kvhal__to_bk_tensor(dst, &args->dst);
    kvhal__to_bk_tensor(src, &args->src);
    key->op = KVHAL_BK_OP_TENSOR_COPY;
    uint64_t *w = key->words;
    *w++ = (uint64_t)dst->dtype;
    *w++ = (uint64_t)dst->ndim;
    for (int i = 0; i < dst->ndim; i++) {
        *w++ = (uint64_t)dst->shape[i];
        *w++ = (uint64_t)dst->strides[i];
        *w++ = (uint64_t)src->strides[i];
    }
    key->nwords = (uint32_t)(w - key->words);
    kvhal__desc_key_rehash(key);
    return KVHAL_OK;
}

kvhal_status kvhal_tensor_copy(const kvhal_tensor *dst, const kvhal_tensor *src, kvhal_stream *s)
{
    kvhal_bk_tensor_copy args;
    kvhal_desc_key key;
    bool empty;
    KVHAL_TRY(prepare_copy(dst, src, s, "dst", "src", &args, &key, &empty));
    if (empty) return KVHAL_OK;
    return kvhal__op_dispatch(dst->buffer->device, dst->buffer->backend, KVHAL_BK_OP_TENSOR_COPY, &key, &args, s);
}

kvhal_status kvhal__tensor_copy_pair(const kvhal_tensor *dst0, const kvhal_tensor *src0, const kvhal_tensor *dst1,
                                     const kvhal_tensor *src1, const char *const names[4], kvhal_stream *s)
{
    kvhal_bk_tensor_copy a0, a1;
    kvhal_desc_key k0, k1;
    bool e0, e1;
    KVHAL_TRY(prepare_copy(dst0, src0, s, names[0], names[1], &a0, &k0, &e0));
    KVHAL_TRY(prepare_copy(dst1, src1, s, names[2], names[3], &a1, &k1, &e1));
    if (e0 && e1) return KVHAL_OK;
    if (e0 || e1) {
        /* one real copy: nothing can fail after it starts */
        const kvhal_tensor *d = e0 ? dst1 : dst0;
        return kvhal__op_dispatch(d->buffer->device, d->buffer->backend, KVHAL_BK_OP_TENSOR_COPY, e0 ? &k1 : &k0,
                                  e0 ? &a1 : &a0, s);
    }
    const kvhal__bk *b0 = dst0->buffer->backend, *b1 = dst1->buffer->backend;
    const kvhal_device v0 = dst0->buffer->device, v1 = dst1->buffer->device;
    void *const stream = kvhal__bk_stream(s);
    /* Both descriptors first, so that an allocation failure or a refusal leaves both destinations unwritten. The
     * second lookup may evict the first descriptor (tiny capacity): then both are made for this call only. */
    void *d0 = NULL, *d1 = NULL;
    KVHAL_TRY(kvhal__desc_get_or_create(v0, b0, KVHAL_BK_OP_TENSOR_COPY, &k0, &a0, &d0));
    bool same = kvhal__device_equal(v0, v1) && kvhal_desc_key_equal(&k0, &k1);
    if (same) {
        d1 = d0;
    } else {
        KVHAL_TRY(kvhal__desc_get_or_create(v1, b1, KVHAL_BK_OP_TENSOR_COPY, &k1, &a1, &d1));
        /* (a backend without desc_create has placeholders: nothing of it can be evicted from under the call) */
        if (b0->ops.desc_create && (kvhal__desc_peek(v0, &k0) != d0 || d0 == NULL)) {
            KVHAL_TRY(kvhal__desc_make(b0, v0, KVHAL_BK_OP_TENSOR_COPY, &a0, &d0));
            kvhal_status st = kvhal__desc_make(b1, v1, KVHAL_BK_OP_TENSOR_COPY, &a1, &d1);
            if (st == KVHAL_OK) {
                st = b0->ops.tensor_copy(b0->ctx, v0.id, d0, &a0, stream);
                if (st == KVHAL_OK) st = b1->ops.tensor_copy(b1->ctx, v1.id, d1, &a1, stream);
                kvhal__desc_release(b1, v1, KVHAL_BK_OP_TENSOR_COPY, d1);
            }
            kvhal__desc_release(b0, v0, KVHAL_BK_OP_TENSOR_COPY, d0);
            return st;
        }
    }
    KVHAL_TRY(b0->ops.tensor_copy(b0->ctx, v0.id, d0, &a0, stream));
    return b1->ops.tensor_copy(b1->ctx, v1.id, d1, &a1, stream);
}

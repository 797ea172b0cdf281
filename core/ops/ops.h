/* ops.h — what the op files of core/ops share: the dispatch from a validated, normalised call to its backend
 * (descriptor lookup, capability query, the op's slot) and the common argument checks. Inline, so that the op
 * each caller passes is a constant and the slot selection folds away. */
#ifndef KVHAL_CORE_OPS_H
#define KVHAL_CORE_OPS_H

#include "buffer.h"
#include "desc_cache.h"
#include "error.h"
#include "registry.h"

/* Whether bk's table has a slot for op. */
static inline bool kvhal__op_implemented(const kvhal__bk *bk, kvhal_bk_op op)
{
    switch (op) {
#define X(E, name, T) \
    case KVHAL_BK_OP_##E: return bk->ops.name != NULL;
        KVHAL_BK_OP_LIST(X)
#undef X
    default: return false;
    }
}

/* Calls op's slot with args of its struct type. */
static inline kvhal_status kvhal__op_run(const kvhal__bk *bk, int32_t id, kvhal_bk_op op, void *desc, const void *args,
                                         void *stream)
{
    switch (op) {
#define X(E, name, T) \
    case KVHAL_BK_OP_##E: return bk->ops.name(bk->ctx, id, desc, (const T *)args, stream);
        KVHAL_BK_OP_LIST(X)
#undef X
    default: return kvhal__err(KVHAL_INTERNAL, "op: %d is not an op", (int)op);
    }
}

/* Runs a validated, normalised call: the descriptor comes from this thread's cache under key (made on a miss, after
 * the backend's supports agreed), or, with key NULL (a key that does not fit), is made for this call only. */
static inline kvhal_status kvhal__op_dispatch(kvhal_device dev, const kvhal__bk *bk, kvhal_bk_op op,
                                              const kvhal_desc_key *key, const void *args, const kvhal_stream *s)
{
    KVHAL_TRY(kvhal__bk_here(bk, dev.id, "dev"));
    void *desc = NULL;
    if (key) {
        KVHAL_TRY(kvhal__desc_get_or_create(dev, bk, op, key, args, &desc));
        return kvhal__op_run(bk, dev.id, op, desc, args, kvhal__bk_stream(s));
    }
    KVHAL_TRY(kvhal__desc_make(bk, dev, op, args, &desc));
    kvhal_status st = kvhal__op_run(bk, dev.id, op, desc, args, kvhal__bk_stream(s));
    kvhal__desc_release(bk, dev, op, desc);
    return st;
}

/* "arg: is on cuda:1 but ref is on cuda:0" */
KVHAL_HIDDEN kvhal_status kvhal__device_mismatch(const char *arg, kvhal_device got, const char *ref, kvhal_device want);

/* The caches of copy_blocks and page_transfer: caches[0..num_caches) valid tensors on one device (*dev), each with
 * the block index as dim 0 and its other dims dense row-major (one block = one contiguous byte range), blocks not
 * overlapping; *min_blocks = the smallest block count, that of caches[*min_cache]. */
KVHAL_HIDDEN kvhal_status kvhal__check_block_caches(const kvhal_tensor *caches, int32_t num_caches, kvhal_device *dev,
                                                    int64_t *min_blocks, int32_t *min_cache);

/* A block id (or host page) with the index of the pair it comes from, sorted by value then pair: how copy_blocks
 * and page_transfer find ids that two pairs share. */
typedef struct kvhal__pair_entry {
    int64_t value;
    int32_t pair;
} kvhal__pair_entry;
KVHAL_HIDDEN int kvhal__cmp_pair_entry(const void *a, const void *b);

static inline bool kvhal__is_float_input(kvhal_dtype d) { return d == KVHAL_F32 || d == KVHAL_F16 || d == KVHAL_BF16; }
static inline bool kvhal__is_fp8(kvhal_dtype d)
{
    return d == KVHAL_FP8_E4M3 || d == KVHAL_FP8_E5M2 || d == KVHAL_FP8_E4M3FNUZ || d == KVHAL_FP8_E5M2FNUZ;
}

#endif

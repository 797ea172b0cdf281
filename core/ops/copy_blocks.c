/* copy_blocks.c — kvhal_copy_blocks: the same block pairs copied in every cache (K and V of every layer), with the
 * pairs checked in range and disjoint so that devices may copy them in parallel. */
#include <stdio.h>
#include <stdlib.h>

#include "faults.h"
#include "ops.h"


#define STACK_CACHES 64
#define STACK_PAIRS 64

typedef kvhal__pair_entry dst_entry; /* value: the destination block */
#define cmp_dst kvhal__cmp_pair_entry

/* Devices copy the pairs in parallel and the CPU in order: a block that one pair writes must be neither read nor
 * written by another pair, or the result would depend on the backend. A pair that copies a block onto itself
 * writes nothing new, so only its use as a source is checked against the other pairs' destinations. */
static kvhal_status check_pairs_disjoint(const int64_t *pairs, int32_t num_pairs)
{
    dst_entry stack[STACK_PAIRS];
    dst_entry *d = stack;
    if (num_pairs > STACK_PAIRS) {
        d = kvhal__malloc((size_t)num_pairs * sizeof *d);
        if (!d)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "num_pairs: no host memory to check %d pairs for overlap",
                              (int)num_pairs);
    }
    size_t n = 0;
    for (int32_t p = 0; p < num_pairs; p++)
        if (pairs[2 * p] != pairs[2 * p + 1]) d[n++] = (dst_entry){pairs[2 * p + 1], p};
    qsort(d, n, sizeof *d, cmp_dst);
    kvhal_status st = KVHAL_OK;
    for (size_t i = 1; i < n && st == KVHAL_OK; i++)
        if (d[i].value == d[i - 1].value)
            st = kvhal__err(KVHAL_INVALID_ARGUMENT, "pairs[%d]: destination block %lld is also the destination of "
                            "pairs[%d]; pairs run in parallel on devices", 2 * (int)d[i].pair + 1,
                            (long long)d[i].value, 2 * (int)d[i - 1].pair + 1);
    for (int32_t p = 0; p < num_pairs && st == KVHAL_OK; p++) {
        dst_entry key = {pairs[2 * p], -1};
        /* the first destination entry of that block (entries of one block are ordered by pair, -1 sorts first) */
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (cmp_dst(&d[mid], &key) < 0) lo = mid + 1;
            else hi = mid;
        }
        if (lo < n && d[lo].value == key.value && d[lo].pair != p)
            st = kvhal__err(KVHAL_INVALID_ARGUMENT, "pairs[%d]: source block %lld is the destination of pairs[%d]; "
                            "pairs run in parallel on devices", 2 * (int)p, (long long)key.value,
                            2 * (int)d[lo].pair + 1);
    }
    if (d != stack) free(d);
    return st;
}

kvhal_status kvhal_copy_blocks(const kvhal_tensor *caches, int32_t num_caches, const int64_t *pairs,
                               int32_t num_pairs, kvhal_stream *s)
{
    KVHAL_CHECK_ARG(caches, "caches: NULL");
    KVHAL_CHECK_ARG(num_caches >= 1, "num_caches: %d must be >= 1", (int)num_caches);
    KVHAL_CHECK_ARG(num_pairs >= 0, "num_pairs: %d is negative", (int)num_pairs);
    KVHAL_CHECK_ARG(pairs || num_pairs == 0, "pairs: NULL with %d pairs", (int)num_pairs);
    kvhal_device dev;
    int64_t min_blocks;
    int32_t min_cache;
    KVHAL_TRY(kvhal__check_block_caches(caches, num_caches, &dev, &min_blocks, &min_cache));
    KVHAL_TRY(kvhal__check_stream(s, dev, "s"));
    for (int32_t p = 0; p < 2 * num_pairs; p++) {
        if (pairs[p] < 0 || pairs[p] >= min_blocks)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "pairs[%d]: %s block %lld is out of range [0, %lld) of caches[%d]",
                              (int)p, p % 2 ? "destination" : "source", (long long)pairs[p], (long long)min_blocks,
                              (int)min_cache);
    }
    KVHAL_TRY(check_pairs_disjoint(pairs, num_pairs));
    const kvhal__bk *bk = caches[0].buffer->backend;
    if (!bk->ops.copy_blocks) return kvhal__unsupported(bk, dev, KVHAL_BK_OP_COPY_BLOCKS, NULL);
    if (num_pairs == 0) return KVHAL_OK;

    void *stack_natives[STACK_CACHES];
    size_t stack_offsets[STACK_CACHES];
    int64_t stack_strides[STACK_CACHES], stack_bytes[STACK_CACHES];
    void **natives = stack_natives;
    size_t *offsets = stack_offsets;
    int64_t *strides = stack_strides, *bytes = stack_bytes;
    void *heap = NULL;
    if (num_caches > STACK_CACHES) {
        size_t n = (size_t)num_caches;
        heap = kvhal__malloc(n * (sizeof(void *) + sizeof(size_t) + 2 * sizeof(int64_t)));
        if (!heap)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "num_caches: no host memory for the arguments of %d caches",
                              (int)num_caches);
        strides = heap;
        bytes = strides + n;
        offsets = (size_t *)(bytes + n);
        natives = (void **)(offsets + n);
    }

    /* Key: runs of caches with equal (block stride, block bytes), so that K and V of every layer make one run. */
    kvhal_desc_key key;
    key.op = KVHAL_BK_OP_COPY_BLOCKS;
    key.nwords = 0;
    key.words[key.nwords++] = (uint64_t)num_caches;
    key.words[key.nwords++] = (uint64_t)num_pairs;
    key.words[key.nwords++] = (uint64_t)min_blocks;
    bool keyed = true;
    for (int32_t c = 0; c < num_caches; c++) {
        const kvhal_tensor *t = &caches[c];
        const int64_t es = (int64_t)kvhal_dtype_size(t->dtype);
        natives[c] = t->buffer->native;
        offsets[c] = t->offset;
        /* Only a non-empty cache of several blocks has its block stride bounded by the buffer; otherwise every
         * pair copies block 0 (or nothing), and an unbounded stride must not overflow here. */
        strides[c] = t->shape[0] > 1 && kvhal_tensor_numel(t) > 0 ? t->strides[0] * es : 0;
        int64_t elems = 1;
        for (int i = 1; i < t->ndim; i++) elems *= t->shape[i];
        bytes[c] = elems * es;
        if (!keyed) continue;
        if (c > 0 && strides[c] == strides[c - 1] && bytes[c] == bytes[c - 1]) {
            key.words[key.nwords - 3]++;
        } else if (key.nwords + 3 <= KVHAL_DESC_KEY_MAX_WORDS) {
            key.words[key.nwords++] = 1;
            key.words[key.nwords++] = (uint64_t)strides[c];
            key.words[key.nwords++] = (uint64_t)bytes[c];
        } else {
            keyed = false;
        }
    }
    kvhal__desc_key_rehash(&key);
    kvhal_bk_copy_blocks a = {
        .num_caches = num_caches, .natives = natives, .offsets = offsets, .block_strides = strides,
        .block_bytes = bytes, .pairs = pairs, .num_pairs = num_pairs, .num_blocks_min = min_blocks};
    kvhal_status st = kvhal__op_dispatch(dev, bk, KVHAL_BK_OP_COPY_BLOCKS, keyed ? &key : NULL, &a, s);
    free(heap);
    return st;
}

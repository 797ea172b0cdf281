/* page_transfer.c — kvhal_page_transfer: whole pages (one block of every cache) between device caches and host
 * pages, the pairs checked in range and without a device block or host page written twice, so that devices may
 * copy them in parallel. */
#include <stdlib.h>

#include "faults.h"
#include "host_memory.h"
#include "ops.h"

#define STACK_CACHES 64
#define STACK_PAIRS 64

typedef kvhal__pair_entry col_entry;

/* No value of column col (0: device block, 1: host page) appears in two pairs. */
static kvhal_status check_unique(const int64_t *pairs, int32_t num_pairs, int col, col_entry *scratch)
{
    for (int32_t p = 0; p < num_pairs; p++) scratch[p] = (col_entry){pairs[2 * p + col], p};
    qsort(scratch, (size_t)num_pairs, sizeof *scratch, kvhal__cmp_pair_entry);
    for (int32_t i = 1; i < num_pairs; i++)
        if (scratch[i].value == scratch[i - 1].value)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "pairs[%d]: %s %lld is also in pairs[%d]; pages are copied in "
                              "parallel", 2 * (int)scratch[i].pair + col, col ? "host page" : "device block",
                              (long long)scratch[i].value, 2 * (int)scratch[i - 1].pair + col);
    return KVHAL_OK;
}

kvhal_status kvhal_page_transfer(const kvhal_tensor *caches, int32_t num_caches, kvhal_host_memory *host,
                                 size_t host_page_bytes, const int64_t *pairs, int32_t num_pairs,
                                 kvhal_transfer_dir dir, kvhal_stream *s)
{
    KVHAL_CHECK_ARG(caches, "caches: NULL");
    KVHAL_CHECK_ARG(num_caches >= 1, "num_caches: %d must be >= 1", (int)num_caches);
    KVHAL_CHECK_ARG(num_pairs >= 0, "num_pairs: %d is negative", (int)num_pairs);
    KVHAL_CHECK_ARG(pairs || num_pairs == 0, "pairs: NULL with %d pairs", (int)num_pairs);
    KVHAL_CHECK_ARG(dir == KVHAL_TO_HOST || dir == KVHAL_TO_DEVICE,
                    "dir: %d is not KVHAL_TO_HOST or KVHAL_TO_DEVICE", (int)dir);
    KVHAL_TRY(kvhal__check_host_memory(host, "host"));
    kvhal_device dev;
    int64_t min_blocks;
    int32_t min_cache;
    KVHAL_TRY(kvhal__check_block_caches(caches, num_caches, &dev, &min_blocks, &min_cache));
    KVHAL_TRY(kvhal__check_stream(s, dev, "s"));

    int64_t block_bytes = -1;
    for (int32_t c = 0; c < num_caches; c++) {
        const kvhal_tensor *t = &caches[c];
        int64_t elems = 1;
        for (int i = 1; i < t->ndim; i++) elems *= t->shape[i];
        const int64_t b = elems * (int64_t)kvhal_dtype_size(t->dtype);
        if (c == 0) block_bytes = b;
        else if (b != block_bytes)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "caches[%d]: a block of %lld bytes, but caches[0]'s has %lld; "
                              "every cache's block must have the same size", (int)c, (long long)b,
                              (long long)block_bytes);
    }
    if ((uint64_t)block_bytes > SIZE_MAX / (uint64_t)num_caches ||
        host_page_bytes < (size_t)block_bytes * (size_t)num_caches)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "host_page_bytes: %zu is less than a page of %d blocks of %lld "
                          "bytes", host_page_bytes, (int)num_caches, (long long)block_bytes);
    const size_t page_used = (size_t)block_bytes * (size_t)num_caches;
    const int64_t host_pages = host->size < page_used ? 0 : (int64_t)((host->size - page_used) / host_page_bytes) + 1;
    for (int32_t p = 0; p < num_pairs; p++) {
        const int64_t b = pairs[2 * p], h = pairs[2 * p + 1];
        if (b < 0 || b >= min_blocks)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "pairs[%d]: device block %lld is out of range [0, %lld) of "
                              "caches[%d]", 2 * (int)p, (long long)b, (long long)min_blocks, (int)min_cache);
        if (h < 0 || h >= host_pages)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "pairs[%d]: host page %lld is out of range [0, %lld) of host's %zu "
                              "bytes", 2 * (int)p + 1, (long long)h, (long long)host_pages, host->size);
    }
    const kvhal__bk *bk = caches[0].buffer->backend;
    if (!bk->ops.page_transfer) return kvhal__unsupported(bk, dev, KVHAL_BK_OP_PAGE_TRANSFER, NULL);
    if (num_pairs == 0) return KVHAL_OK;

    col_entry stack_col[STACK_PAIRS];
    void *stack_natives[STACK_CACHES];
    size_t stack_offsets[STACK_CACHES];
    int64_t stack_strides[STACK_CACHES];
    col_entry *col = stack_col;
    void **natives = stack_natives;
    size_t *offsets = stack_offsets;
    int64_t *strides = stack_strides;
    void *heap = NULL;
    const size_t np = num_pairs > STACK_PAIRS ? (size_t)num_pairs : 0;
    const size_t nc = num_caches > STACK_CACHES ? (size_t)num_caches : 0;
    if (np || nc) {
        heap = kvhal__malloc(np * sizeof *col + nc * (sizeof(void *) + sizeof(size_t) + sizeof(int64_t)));
        if (!heap)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "num_pairs: no host memory for the arguments of %d pairs and %d "
                              "caches", (int)num_pairs, (int)num_caches);
        char *q = heap;
        if (np) col = (col_entry *)q, q += np * sizeof *col;
        if (nc) {
            strides = (int64_t *)q, q += nc * sizeof(int64_t);
            offsets = (size_t *)q, q += nc * sizeof(size_t);
            natives = (void **)q;
        }
    }
    kvhal_status st = check_unique(pairs, num_pairs, 0, col);
    if (st == KVHAL_OK) st = check_unique(pairs, num_pairs, 1, col);
    if (st != KVHAL_OK) {
        free(heap);
        return st;
    }

    /* Key: the direction, the host page size, then runs of caches with equal block strides. */
    kvhal_desc_key key;
    key.op = KVHAL_BK_OP_PAGE_TRANSFER;
    key.nwords = 0;
    key.words[key.nwords++] = (uint64_t)dir | (uint64_t)host->pinned << 1;
    key.words[key.nwords++] = (uint64_t)num_caches;
    key.words[key.nwords++] = (uint64_t)block_bytes;
    key.words[key.nwords++] = (uint64_t)host_page_bytes;
    bool keyed = true;
    for (int32_t c = 0; c < num_caches; c++) {
        const kvhal_tensor *t = &caches[c];
        natives[c] = t->buffer->native;
        offsets[c] = t->offset;
        strides[c] = t->shape[0] > 1 && kvhal_tensor_numel(t) > 0
                         ? t->strides[0] * (int64_t)kvhal_dtype_size(t->dtype) : 0;
        if (!keyed) continue;
        if (c > 0 && strides[c] == strides[c - 1]) {
            key.words[key.nwords - 2]++;
        } else if (key.nwords + 2 <= KVHAL_DESC_KEY_MAX_WORDS) {
            key.words[key.nwords++] = 1;
            key.words[key.nwords++] = (uint64_t)strides[c];
        } else {
            keyed = false;
        }
    }
    kvhal__desc_key_rehash(&key);
    kvhal_bk_page_transfer a = {
        .num_caches = num_caches, .natives = natives, .offsets = offsets, .block_strides = strides,
        .block_bytes = block_bytes, .host = host->ptr, .host_offset = 0, .host_page_bytes = (int64_t)host_page_bytes,
        .pairs = pairs, .num_pairs = num_pairs, .to_host = dir == KVHAL_TO_HOST, .host_pinned = host->pinned};
    st = kvhal__op_dispatch(dev, bk, KVHAL_BK_OP_PAGE_TRANSFER, keyed ? &key : NULL, &a, s);
    free(heap);
    return st;
}

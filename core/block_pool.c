/* block_pool.c — O(1) allocation of block (page) ids with reference counts, so that one block can be shared by
 * several owners (a cached prefix, a forked sequence). Free ids live on a stack: allocate pops, the last release
 * pushes (a multi-release pushes its list last first, so that the list comes back in its own order).
 * Not thread-safe: the owner (a cache manager, an engine's scheduler) serialises calls. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "faults.h"
#include "handles.h"

#define POOL_MAGIC 0x4b56424cu /* KVBL */

struct kvhal_block_pool {
    uint32_t magic;
    int32_t num_blocks;
    int32_t num_free;   /* free ids are free_stack[0..num_free) */
    int32_t *free_stack;
    int32_t *ref;       /* per block; 0 = free */
};

static kvhal_status check_pool(const kvhal_block_pool *p)
{
    if (!p) return kvhal__err(KVHAL_INVALID_HANDLE, "pool: NULL");
    if (p->magic != POOL_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "pool: %p is not a live block pool", (const void *)p);
    return KVHAL_OK;
}

kvhal_status kvhal_block_pool_create(int32_t num_blocks, kvhal_block_pool **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    if (num_blocks < 1) return kvhal__err(KVHAL_INVALID_ARGUMENT, "num_blocks: %d must be >= 1", (int)num_blocks);
    kvhal_block_pool *p = kvhal__calloc(1, sizeof *p);
    if (!p) return kvhal__err(KVHAL_OUT_OF_MEMORY, "block pool of %d blocks: no memory for the pool", (int)num_blocks);
    p->free_stack = kvhal__malloc((size_t)num_blocks * sizeof(int32_t));
    /* malloc + memset rather than calloc: a large calloc maps zero pages that fault one by one on first use,
     * in the middle of allocation-heavy work; touching them here keeps that cost at create. */
    p->ref = kvhal__malloc((size_t)num_blocks * sizeof(int32_t));
    if (p->ref) memset(p->ref, 0, (size_t)num_blocks * sizeof(int32_t));
    if (!p->free_stack || !p->ref) {
        free(p->free_stack);
        free(p->ref);
        free(p);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "block pool of %d blocks: no memory for %zu bytes of bookkeeping",
                          (int)num_blocks, (size_t)num_blocks * 2 * sizeof(int32_t));
    }
    /* Stacked in reverse so that the first allocations hand out 0, 1, 2, ...: easier to read in traces. */
    for (int32_t i = 0; i < num_blocks; i++) p->free_stack[i] = num_blocks - 1 - i;
    p->num_blocks = num_blocks;
    p->num_free = num_blocks;
    p->magic = POOL_MAGIC;
    if (!kvhal__handle_add(p)) {
        free(p->free_stack);
        free(p->ref);
        free(p);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "block pool: no memory to register the handle");
    }
    *out = p;
    return KVHAL_OK;
}

kvhal_status kvhal_block_pool_destroy(kvhal_block_pool *p)
{
    if (!p) return KVHAL_OK;
    if (!kvhal__handle_remove_kind(p, POOL_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "p: %p is not a live block pool (destroyed twice?)", (void *)p);
    p->magic = KVHAL_MAGIC_DEAD;
    free(p->free_stack);
    free(p->ref);
    free(p);
    return KVHAL_OK;
}

kvhal_status kvhal_block_pool_allocate(kvhal_block_pool *p, int32_t n, int32_t *blocks)
{
    KVHAL_TRY(check_pool(p));
    if (n < 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "n: %d is negative", (int)n);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(blocks, "blocks: NULL for %d blocks", (int)n);
    if (n > p->num_free)
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "n: %d blocks requested, only %d of %d are free", (int)n,
                          (int)p->num_free, (int)p->num_blocks);
    /* restrict-qualified locals: without them every store to ref[] forces a reload of the other pointers */
    const int32_t *restrict top = p->free_stack + p->num_free - 1;
    int32_t *restrict ref = p->ref;
    int32_t *restrict out = blocks;
    /* A fresh pool hands out consecutive ids, and so does one refilled with a released run: then the ids and
     * counts are written as ranges (vector stores) instead of one scattered store per id. The ends say whether it
     * can be a run; one vectorized pass over the stack top (top[-i] == b0 + i) says whether it is. */
    const uint32_t b0 = (uint32_t)top[0];
    if ((uint32_t)top[-(n - 1)] == b0 + (uint32_t)(n - 1) && b0 + (uint32_t)(n - 1) < (uint32_t)p->num_blocks) {
        uint32_t diff = 0;
        for (int32_t i = 0; i < n; i++) diff |= (uint32_t)top[-i] ^ (b0 + (uint32_t)i);
        if (diff == 0) {
            for (int32_t i = 0; i < n; i++) out[i] = (int32_t)(b0 + (uint32_t)i);
            for (int32_t i = 0; i < n; i++) ref[b0 + (uint32_t)i] = 1;
            p->num_free -= n;
            return KVHAL_OK;
        }
    }
    /* unrolled by hand: the loop is store-bound and runs once per block */
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        int32_t c0 = top[-i], c1 = top[-i - 1], c2 = top[-i - 2], c3 = top[-i - 3];
        out[i] = c0;
        out[i + 1] = c1;
        out[i + 2] = c2;
        out[i + 3] = c3;
        ref[c0] = ref[c1] = ref[c2] = ref[c3] = 1;
    }
    for (; i < n; i++) {
        int32_t c = top[-i];
        out[i] = c;
        ref[c] = 1;
    }
    p->num_free -= n;
    return KVHAL_OK;
}

static kvhal_status check_block(const kvhal_block_pool *p, int32_t block)
{
    if (block < 0 || block >= p->num_blocks)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "block: %d is out of range [0, %d)", (int)block, (int)p->num_blocks);
    if (p->ref[block] == 0) return kvhal__err(KVHAL_INVALID_ARGUMENT, "block: %d is free (not allocated)", (int)block);
    return KVHAL_OK;
}

kvhal_status kvhal_block_pool_share(kvhal_block_pool *p, int32_t block)
{
    KVHAL_TRY(check_pool(p));
    KVHAL_TRY(check_block(p, block));
    if (p->ref[block] == INT32_MAX)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "block: %d already has the maximum reference count", (int)block);
    p->ref[block]++;
    return KVHAL_OK;
}

kvhal_status kvhal_block_pool_release(kvhal_block_pool *p, int32_t block)
{
    KVHAL_TRY(check_pool(p));
    KVHAL_TRY(check_block(p, block));
    if (--p->ref[block] == 0) p->free_stack[p->num_free++] = block;
    return KVHAL_OK;
}

int32_t kvhal_block_pool_num_free(const kvhal_block_pool *p)
{
    return (p && p->magic == POOL_MAGIC) ? p->num_free : 0;
}

int32_t kvhal_block_pool_num_total(const kvhal_block_pool *p)
{
    return (p && p->magic == POOL_MAGIC) ? p->num_blocks : 0;
}

int32_t kvhal_block_pool_ref_count(const kvhal_block_pool *p, int32_t block)
{
    if (!p || p->magic != POOL_MAGIC || block < 0 || block >= p->num_blocks) return -1;
    return p->ref[block];
}

kvhal_status kvhal_block_pool_check_integrity(const kvhal_block_pool *p)
{
    KVHAL_TRY(check_pool(p));
    if (p->num_free < 0 || p->num_free > p->num_blocks)
        return kvhal__err(KVHAL_INTEGRITY, "block pool: %d free of %d blocks", (int)p->num_free, (int)p->num_blocks);
    unsigned char *seen = kvhal__calloc((size_t)p->num_blocks, 1);
    if (!seen) return kvhal__err(KVHAL_OUT_OF_MEMORY, "block pool check: no memory for %d flags", (int)p->num_blocks);
    kvhal_status st = KVHAL_OK;
    for (int32_t i = 0; i < p->num_free && st == KVHAL_OK; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= p->num_blocks)
            st = kvhal__err(KVHAL_INTEGRITY, "block pool: free list entry %d holds %d, out of range [0, %d)", (int)i,
                            (int)b, (int)p->num_blocks);
        else if (seen[b])
            st = kvhal__err(KVHAL_INTEGRITY, "block pool: block %d is on the free list twice", (int)b);
        else if (p->ref[b] != 0)
            st = kvhal__err(KVHAL_INTEGRITY, "block pool: block %d is on the free list with %d references", (int)b,
                            (int)p->ref[b]);
        else
            seen[b] = 1;
    }
    for (int32_t b = 0; b < p->num_blocks && st == KVHAL_OK; b++) {
        if (p->ref[b] < 0)
            st = kvhal__err(KVHAL_INTEGRITY, "block pool: block %d has %d references", (int)b, (int)p->ref[b]);
        else if (p->ref[b] == 0 && !seen[b])
            st = kvhal__err(KVHAL_INTEGRITY, "block pool: block %d has no references but is not on the free list "
                            "(leaked)", (int)b);
    }
    free(seen);
    return st;
}

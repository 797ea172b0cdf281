/* prefix.c — the prefix cache: which token prefixes already have K/V pages, so that a new request reuses them.
 * Two kinds behind one handle: naive (remembers nothing) and radix (a compressed trie from token ids to page ids).
 *
 * The files: radix.h/radix.c (the tree and its primitives), match.c (match, insert), locks.c (locks, request
 * handles), evict.c (eviction, reset, the walk over every page), integrity.c (the invariants), and this one (the
 * cache's life). The cache manager reaches beyond the API through prefix_owned.h, its tiers through
 * prefix_pages.h. Not thread-safe: the owner serialises calls; every status-returning call detects a concurrent
 * one (KVHAL_BUSY). */
#include <stdlib.h>

#include "handles.h"
#include "prefix_owned.h"
#include "radix.h"

kvhal_status kvhal_prefix_cache_create(kvhal_prefix_kind kind, int32_t page_size, kvhal_prefix_cache **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    if (kind != KVHAL_PREFIX_NAIVE && kind != KVHAL_PREFIX_RADIX)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "kind: %d is not a prefix cache kind (0 naive, 1 radix)", (int)kind);
    if (page_size < 1) return kvhal__err(KVHAL_INVALID_ARGUMENT, "page_size: %d must be >= 1", (int)page_size);
    kvhal_prefix_cache *pc = kvhal__calloc(1, sizeof *pc);
    if (!pc) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory for the cache");
    pc->kind = kind;
    pc->page_size = page_size;
    pc->root.magic = NODE_MAGIC;
    pc->root.owner = pc;
    pc->root.heap_idx = -1;
    pc->root.id = ROOT_ID;
    /* generations start at a different place in every cache, so that another cache's handle rarely names a live
     * node here (it is refused unless slot and generation both happen to match) */
    static _Atomic uint32_t serial;
    pc->gen_base = (uint32_t)(mix64(++serial) & GEN_MASK);
    if (pc->gen_base == 0) pc->gen_base = 1;
    pc->magic = PC_MAGIC;
    if (!kvhal__handle_add(pc)) {
        free(pc);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory to register the handle");
    }
    *out = pc;
    return KVHAL_OK;
}

bool kvhal__prefix_set_manager_owned(kvhal_prefix_cache *pc, bool owned)
{
    if (!pc || pc->magic != PC_MAGIC) return false;
    pc->manager_owned = owned;
    return true;
}

kvhal_status kvhal_prefix_cache_destroy(kvhal_prefix_cache *pc)
{
    if (!pc) return KVHAL_OK;
    /* manager_owned is read only once the live set says the memory is a live prefix cache */
    if (kvhal__handle_live(pc, PC_MAGIC) && pc->manager_owned)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "pc: %p belongs to a cache manager; destroy the manager instead "
                          "(kvhal_cache_manager_destroy)", (void *)pc);
    if (!kvhal__handle_remove_kind(pc, PC_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "pc: %p is not a live prefix cache (destroyed twice?)", (void *)pc);
    kvhal__pfx_drop_all(pc, NULL, NULL);
    kvhal__pfx_edge_pool_free(pc);
    pc->magic = KVHAL_MAGIC_DEAD;
    pc->root.magic = KVHAL_MAGIC_DEAD;
    for (slab *s = pc->slabs, *nx; s; s = nx) {
        nx = s->next;
        free(s);
    }
    free(pc->slab_at);
    free(pc->tickets);
    free(pc->tab);
    free(pc->heap);
    free(pc);
    return KVHAL_OK;
}

int32_t kvhal_prefix_cache_page_size(const kvhal_prefix_cache *pc)
{
    return (pc && kvhal__handle_live(pc, PC_MAGIC)) ? pc->page_size : 0;
}

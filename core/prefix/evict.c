/* evict.c — eviction in LRU order, reset, the size counters, and the walk over every page of a prefix cache. */
#include "owner.h"
#include "prefix_owned.h"
#include "prefix_pages.h"
#include "radix.h"

static kvhal_status kvhal_prefix_evict__body(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                size_t *evicted)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    if (evicted) *evicted = 0;
    if (num_tokens == 0) return KVHAL_OK;
    if (pc->kind == KVHAL_PREFIX_NAIVE)
        return kvhal__err(KVHAL_UNSUPPORTED, "num_tokens: %zu, but a naive prefix cache holds nothing to evict",
                          num_tokens);
    size_t ps = (size_t)pc->page_size;
    size_t done = 0;
    while (done < num_tokens && pc->heap_n) {
        node *x = pc->heap[0].n;
        kvhal__pfx_heap_remove(pc, x);
        node *p = x->parent;
        if (fn) fn(x->pages, x->len / ps, user);
        done += x->len;
        pc->evictable_tokens -= x->len;
        kvhal__pfx_tab_erase_slot(pc, kvhal__pfx_tab_slot_of(pc, x));
        kvhal__pfx_node_release(pc, x);
        if (--p->nchild == 0 && p != &pc->root && p->lock_ref == 0) kvhal__pfx_heap_push(pc, p);
    }
    if (evicted) *evicted = done;
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_size_info_get__body(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    KVHAL_CHECK_ARG(out, "out: NULL");
    out->evictable_tokens = pc->evictable_tokens;
    out->protected_tokens = pc->protected_tokens;
    out->total_tokens = pc->evictable_tokens + pc->protected_tokens;
    out->num_nodes = pc->num_nodes;
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_reset__body(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    kvhal__pfx_drop_all(pc, fn, user);
    return KVHAL_OK;
}

static kvhal_status kvhal__prefix_for_each_page__body(const kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    size_t ps = (size_t)pc->page_size;
    for (const slab *s = pc->slabs; s; s = s->next)
        for (int i = 0; i < SLAB_NODES; i++) {
            const node *x = &s->nodes[i];
            if (x->magic == NODE_MAGIC && x->len) fn(x->pages, x->len / ps, user);
        }
    return KVHAL_OK;
}

/* ---- the entry points: the live-handle lookup, then the body under the owner flag (KVHAL_OWNER_ENTER) ---- */

kvhal_status kvhal_prefix_evict(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                size_t *evicted)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), pc, "pc", kvhal_prefix_evict__body(pc, num_tokens, fn, user, evicted));
}

kvhal_status kvhal_prefix_size_info_get(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), (kvhal_prefix_cache *)pc, "pc",
                     kvhal_prefix_size_info_get__body(pc, out));
}

kvhal_status kvhal_prefix_reset(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), pc, "pc", kvhal_prefix_reset__body(pc, fn, user));
}

kvhal_status kvhal__prefix_for_each_page(const kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = (kvhal_prefix_cache *)pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_for_each_page__body(pc, fn, user);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal__prefix_size_info_get_owned(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc_magic(pc), (kvhal_prefix_cache *)pc, "pc",
                     kvhal_prefix_size_info_get__body(pc, out));
}

kvhal_status kvhal__prefix_evict_owned(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                       size_t *evicted)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc_magic(pc), pc, "pc",
                     kvhal_prefix_evict__body(pc, num_tokens, fn, user, evicted));
}

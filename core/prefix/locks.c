/* locks.c — locks on a prefix cache's nodes (a caller's, by node handle) and request handles (tickets: a lock of
 * their own, one per request of a cache manager). */
#include "owner.h"
#include "prefix_owned.h"
#include "radix.h"

static kvhal_status kvhal_prefix_lock__body(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    if (!handle)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0 (match found nothing: there is nothing to lock)");
    node *x;
    KVHAL_TRY(kvhal__pfx_resolve(pc, handle, &x));
    if (x == &pc->root) return KVHAL_OK;
    return kvhal__pfx_lock_node(pc, x);
}

static kvhal_status kvhal_prefix_unlock__body(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    if (!handle)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0 (match found nothing: there is nothing to unlock)");
    node *x;
    KVHAL_TRY(kvhal__pfx_resolve(pc, handle, &x));
    if (handle & H_TICKET) {
        kvhal__pfx_ticket_release(pc, &pc->tickets[(uint32_t)handle - 1], x);
        return KVHAL_OK;
    }
    if (x == &pc->root) return KVHAL_OK;
    /* own_locks, not lock_ref: a lock through this node by a longer handle is not this handle's to give back */
    if (x->own_locks - x->ticket_locks <= 0)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0x%016llx is not locked (unlock without a matching lock%s)",
                          (unsigned long long)handle,
                          x->ticket_locks ? "; the locks it has are request handles', given back by those" : "");
    kvhal__pfx_unlock_path(pc, x);
    return KVHAL_OK;
}

static kvhal_status kvhal__prefix_ticket__body(kvhal_prefix_cache *pc, kvhal_prefix_handle node_h, size_t bound,
                                               kvhal_prefix_handle *out)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    node *x;
    KVHAL_TRY(kvhal__pfx_resolve(pc, node_h, &x));
    if (!pc->ticket_free) {
        if (pc->num_tickets == pc->tickets_cap) {
            if (pc->tickets_cap >= (UINT32_MAX >> 2))
                return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: %u request handles live, the most there can be",
                                  pc->tickets_live);
            uint32_t cap = pc->tickets_cap ? 2 * pc->tickets_cap : 64;
            ticket *t = kvhal__realloc(pc->tickets, (size_t)cap * sizeof *t);
            if (!t) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory for %u request handles", cap);
            pc->tickets = t;
            pc->tickets_cap = cap;
        }
        pc->tickets[pc->num_tickets] = (ticket){.gen = pc->gen_base};
        pc->ticket_free = ++pc->num_tickets;
    }
    if (x != &pc->root) {
        KVHAL_TRY(kvhal__pfx_lock_node(pc, x));
        x->ticket_locks++;
    }
    uint32_t slot = pc->ticket_free - 1;
    ticket *t = &pc->tickets[slot];
    pc->ticket_free = t->next_free;
    t->next_free = 0;
    t->live = true;
    t->node_id = x == &pc->root ? ROOT_ID : x->id;
    t->node_gen = x == &pc->root ? 0 : x->gen;
    t->bound = bound;
    pc->tickets_live++;
    *out = H_TICKET | ((uint64_t)t->gen << 32) | ((uint64_t)slot + 1);
    return KVHAL_OK;
}

static kvhal_status kvhal__prefix_handle_len__body(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle,
                                                   size_t *len)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    *len = 0;
    node *x;
    KVHAL_TRY(kvhal__pfx_resolve(pc, handle, &x));
    *len = x->end;
    return KVHAL_OK;
}

kvhal_status kvhal__prefix_handle_last_page(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle, int32_t *page)
{
    KVHAL_TRY(kvhal__pfx_check_pc(pc));
    *page = -1;
    node *x;
    KVHAL_TRY(kvhal__pfx_resolve(pc, handle, &x));
    const size_t n = x->len / (size_t)pc->page_size;
    if (n) *page = x->pages[n - 1];
    return KVHAL_OK;
}

/* ---- the entry points: the live-handle lookup, then the body under the owner flag (KVHAL_OWNER_ENTER) ---- */

kvhal_status kvhal_prefix_lock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), pc, "pc", kvhal_prefix_lock__body(pc, handle));
}

kvhal_status kvhal_prefix_unlock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), pc, "pc", kvhal_prefix_unlock__body(pc, handle));
}

kvhal_status kvhal__prefix_ticket(kvhal_prefix_cache *pc, kvhal_prefix_handle node_h, size_t bound,
                                  kvhal_prefix_handle *out)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_ticket__body(pc, node_h, bound, out);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal__prefix_ticket_bound(kvhal_prefix_cache *pc, kvhal_prefix_handle handle, const size_t *set,
                                        size_t *bound)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc)); /* called by the manager on its own live cache */
    *bound = 0;
    if (!(handle & H_TICKET))
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx is not a request handle (kvhal_cache_manager_match "
                          "gives one)", (unsigned long long)handle);
    ticket *t;
    KVHAL_TRY(kvhal__pfx_resolve_ticket(pc, handle, &t));
    if (set && *set < t->bound) t->bound = *set;
    *bound = t->bound;
    return KVHAL_OK;
}

kvhal_status kvhal__prefix_handle_len(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle, size_t *len)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = (kvhal_prefix_cache *)pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_handle_len__body(pc, handle, len);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

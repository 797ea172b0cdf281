/* integrity.c — the full check of a prefix cache's invariants (kvhal_prefix_check_integrity). */
#include <stdlib.h>

#include "owner.h"
#include "prefix_owned.h"
#include "radix.h"

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Every page id at most once: a bitmap when the ids are dense enough (the usual case: ids of one cache), a sort
 * otherwise. */
static kvhal_status check_unique(int32_t *pages, size_t n)
{
    int32_t max = 0;
    for (size_t i = 0; i < n; i++)
        if (pages[i] > max) max = pages[i];
    size_t words = ((size_t)max >> 6) + 1;
    if (words <= n + 4096) {
        /* plain calloc, not a fault-injection point: when it fails the sort below does the same check */
        uint64_t *bits = calloc(words, sizeof *bits);
        if (bits) {
            kvhal_status st = KVHAL_OK;
            for (size_t i = 0; i < n; i++) {
                uint32_t p = (uint32_t)pages[i];
                uint64_t m = 1ull << (p & 63);
                if (bits[p >> 6] & m) {
                    st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: page %d is held in two places", pages[i]);
                    break;
                }
                bits[p >> 6] |= m;
            }
            free(bits);
            return st;
        }
    }
    qsort(pages, n, sizeof *pages, cmp_i32);
    for (size_t i = 1; i < n; i++)
        if (pages[i] == pages[i - 1])
            return kvhal__err(KVHAL_INTEGRITY, "prefix cache: page %d is held in two places", pages[i]);
    return KVHAL_OK;
}

typedef struct scratch {
    uint32_t *children;  /* per slot id (+1 for the root at index num_slots) */
    int64_t *lock_sum;   /* sum of the children's lock counts */
    int32_t *pages;
    size_t npages;
} scratch;

static kvhal_status check_node(const kvhal_prefix_cache *pc, const node *x, scratch *sc, size_t *evictable,
                               size_t *protect, size_t *leaves)
{
    size_t ps = (size_t)pc->page_size;
    const node *p = x->parent;
    if (x->owner != pc) return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has another owner", x->id);
    if (!p || (p != &pc->root && (p->magic != NODE_MAGIC || p->owner != pc)))
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has a parent that is not a live node", x->id);
    if (x->len == 0 || x->len % ps)
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u holds %zu tokens, not a positive multiple of the "
                          "page size %zu", x->id, x->len, ps);
    if (x->end != p->end + x->len)
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u ends at %zu, its parent at %zu, its edge is %zu long",
                          x->id, x->end, p->end, x->len);
    if (x->tok < x->mem || x->pages < x->mem || (size_t)(x->tok - x->mem) + x->len > x->mem_words ||
        (size_t)(x->pages - x->mem) + x->len / ps > (size_t)(x->tok - x->mem))
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has its tokens or pages outside its buffer", x->id);
    if (x->fkey != page_key(x->tok, pc->page_size))
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has a stale first-page key", x->id);
    if (kvhal__pfx_tab_find(pc, p, x->tok) != x)
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u cannot be found from its parent (or a sibling "
                          "starts with the same page)", x->id);
    if (x->tick > pc->clock || (p != &pc->root && p->tick < x->tick))
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u was used at tick %llu, after its parent (%llu)",
                          x->id, (unsigned long long)x->tick, (unsigned long long)p->tick);
    if (x->lock_ref < 0 || x->own_locks < 0 || x->own_locks > x->lock_ref || x->ticket_locks < 0 ||
        x->ticket_locks > x->own_locks)
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has %d locks, %d of them its own, %d of those "
                          "request handles'", x->id, x->lock_ref, x->own_locks, x->ticket_locks);
    bool leaf_free = x->nchild == 0 && x->lock_ref == 0;
    if (leaf_free != (x->heap_idx >= 0))
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u (%u children, %d locks) is %s the LRU heap", x->id,
                          x->nchild, x->lock_ref, x->heap_idx >= 0 ? "in" : "missing from");
    if (x->heap_idx >= 0 && ((size_t)x->heap_idx >= pc->heap_n || pc->heap[x->heap_idx].n != x ||
                             pc->heap[x->heap_idx].tick != x->tick))
        return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has a wrong LRU heap entry", x->id);
    *leaves += leaf_free;
    if (x->lock_ref) *protect += x->len; else *evictable += x->len;
    size_t pi = p == &pc->root ? pc->num_slots : p->id;
    sc->children[pi]++;
    sc->lock_sum[pi] += x->lock_ref;
    for (size_t i = 0; i < x->len / ps; i++) {
        if (x->pages[i] < 0)
            return kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u holds a negative page %d", x->id, x->pages[i]);
        sc->pages[sc->npages++] = x->pages[i];
    }
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_check_integrity__body(const kvhal_prefix_cache *pc)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    if (pc->kind == KVHAL_PREFIX_NAIVE) {
        if (pc->num_nodes || pc->evictable_tokens || pc->protected_tokens)
            return kvhal__err(KVHAL_INTEGRITY, "naive prefix cache: holds nodes or tokens");
        return KVHAL_OK;
    }
    size_t ps = (size_t)pc->page_size;
    size_t total = pc->evictable_tokens + pc->protected_tokens;
    scratch sc = {0};
    sc.children = kvhal__calloc((size_t)pc->num_slots + 1, sizeof *sc.children);
    sc.lock_sum = kvhal__calloc((size_t)pc->num_slots + 1, sizeof *sc.lock_sum);
    sc.pages = kvhal__malloc((total / ps + 1) * sizeof *sc.pages);
    kvhal_status st = KVHAL_OK;
    if (!sc.children || !sc.lock_sum || !sc.pages) {
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache check: no memory for the scratch of %u nodes",
                        pc->num_slots);
        goto done;
    }
    size_t live = 0, evictable = 0, protect = 0, leaves = 0, free_seen = 0;
    for (const slab *s = pc->slabs; s && st == KVHAL_OK; s = s->next)
        for (int i = 0; i < SLAB_NODES && st == KVHAL_OK; i++) {
            const node *x = &s->nodes[i];
            if (x->magic != NODE_MAGIC) continue;
            if (++live > pc->num_nodes || (x->len / ps) > total / ps - sc.npages) {
                st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: more nodes or pages than the counts say (%zu nodes, "
                                "%zu tokens)", pc->num_nodes, total);
                break;
            }
            st = check_node(pc, x, &sc, &evictable, &protect, &leaves);
        }
    if (st != KVHAL_OK) goto done;
    for (const node *f = pc->free_nodes; f && free_seen <= pc->num_slots; f = f->parent) free_seen++;
    if (live != pc->num_nodes || free_seen != pc->free_count || live + free_seen + pc->retired != pc->num_slots) {
        st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: %zu live + %zu free + %u retired nodes, expected %zu + %zu of "
                        "%u slots", live, free_seen, pc->retired, pc->num_nodes, pc->free_count, pc->num_slots);
        goto done;
    }
    if (evictable != pc->evictable_tokens || protect != pc->protected_tokens) {
        st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: nodes hold %zu evictable + %zu protected tokens, counters say "
                        "%zu + %zu", evictable, protect, pc->evictable_tokens, pc->protected_tokens);
        goto done;
    }
    if (leaves != pc->heap_n || pc->tab_count != live) {
        st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: %zu unlocked leaves but %zu heap entries; %zu nodes but %zu "
                        "table entries", leaves, pc->heap_n, live, pc->tab_count);
        goto done;
    }
    for (size_t i = 1; i < pc->heap_n; i++)
        if (pc->heap[(i - 1) / 2].tick > pc->heap[i].tick) {
            st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: LRU heap order broken at entry %zu", i);
            goto done;
        }
    if (sc.children[pc->num_slots] != pc->root.nchild) {
        st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: root child count broken");
        goto done;
    }
    for (const slab *s = pc->slabs; s; s = s->next)
        for (int i = 0; i < SLAB_NODES; i++) {
            const node *x = &s->nodes[i];
            if (x->magic != NODE_MAGIC) continue;
            if (sc.children[x->id] != x->nchild) {
                st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u counts %u children, has %u", x->id, x->nchild,
                                sc.children[x->id]);
                goto done;
            }
            if (sc.lock_sum[x->id] + x->own_locks != x->lock_ref) {
                st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: node %u has %d locks, not its own %d plus its "
                                "children's %lld", x->id, x->lock_ref, x->own_locks, (long long)sc.lock_sum[x->id]);
                goto done;
            }
        }
    {
        /* every live request handle locks a live node (or the root), as many as the nodes count */
        size_t tickets_live = 0, node_tickets = 0, ticket_locks = 0;
        for (uint32_t i = 0; i < pc->num_tickets; i++) {
            const ticket *t = &pc->tickets[i];
            if (!t->live) continue;
            tickets_live++;
            if (t->node_id == ROOT_ID) continue;
            node_tickets++;
            const node *x = t->node_id < pc->num_slots ? node_at(pc, t->node_id) : NULL;
            if (!x || x->magic != NODE_MAGIC || x->gen != t->node_gen) {
                st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: request handle %u locks a node that is gone", i);
                goto done;
            }
        }
        for (const slab *s = pc->slabs; s; s = s->next)
            for (int i = 0; i < SLAB_NODES; i++)
                if (s->nodes[i].magic == NODE_MAGIC) ticket_locks += (size_t)s->nodes[i].ticket_locks;
        if (tickets_live != pc->tickets_live || node_tickets != ticket_locks) {
            st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: %zu live request handles (%zu on nodes), counted %u and "
                            "%zu", tickets_live, node_tickets, pc->tickets_live, ticket_locks);
            goto done;
        }
    }
    if (sc.npages != total / ps) {
        st = kvhal__err(KVHAL_INTEGRITY, "prefix cache: %zu pages for %zu tokens", sc.npages, total);
        goto done;
    }
    st = check_unique(sc.pages, sc.npages);
done:
    free(sc.children);
    free(sc.lock_sum);
    free(sc.pages);
    return st;
}

/* ---- the entry points: the live-handle lookup, then the body under the owner flag (KVHAL_OWNER_ENTER) ---- */

kvhal_status kvhal_prefix_check_integrity(const kvhal_prefix_cache *pc)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), (kvhal_prefix_cache *)pc, "pc", kvhal_prefix_check_integrity__body(pc));
}

kvhal_status kvhal__prefix_check_integrity_owned(const kvhal_prefix_cache *pc)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc_magic(pc), (kvhal_prefix_cache *)pc, "pc",
                     kvhal_prefix_check_integrity__body(pc));
}

/* radix.c — the radix tree of the prefix cache (radix.h): node slots and handles, the LRU heap of unlocked leaves,
 * the child table, edge buffers, splits, the walk along a token run, and the lock counts on a root path. The
 * operations (match.c, locks.c, evict.c, integrity.c) are built on these; nothing here calls them. */
#include <stdlib.h>
#include <string.h>

#include "handles.h"
#include "radix.h"

/* Length of the common prefix of a and b (at most n). The whole-run memcmp is the common case (a fully matched
 * edge); only the one diverging edge per operation pays for the finer search. */
static size_t common_len(const int32_t *a, const int32_t *b, size_t n)
{
    if (memcmp(a, b, n * sizeof(int32_t)) == 0) return n;
    size_t i = 0;
    while (i + 64 <= n && memcmp(a + i, b + i, 64 * sizeof(int32_t)) == 0) i += 64;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

kvhal_status kvhal__pfx_check_pc_magic(const kvhal_prefix_cache *pc)
{
    if (!pc) return kvhal__err(KVHAL_INVALID_HANDLE, "pc: NULL");
    if (pc->magic != PC_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "pc: %p is not a live prefix cache", (const void *)pc);
    return KVHAL_OK;
}

kvhal_status kvhal__pfx_check_pc(const kvhal_prefix_cache *pc)
{
    if (pc && !kvhal__handle_live(pc, PC_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "pc: %p is not a live prefix cache (destroyed?)", (const void *)pc);
    return kvhal__pfx_check_pc_magic(pc);
}

/* The live node a node handle names (never the root: 0 is the caller's to treat). */
static kvhal_status resolve_node(const kvhal_prefix_cache *pc, uint64_t h, node **out)
{
    uint32_t id = (uint32_t)h - 1, gen = (uint32_t)(h >> 32) & GEN_MASK;
    if ((uint32_t)h == 0 || id >= pc->num_slots)
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx names no node of this prefix cache",
                          (unsigned long long)h);
    node *x = node_at(pc, id);
    if (x->magic != NODE_MAGIC || x->gen != gen)
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx is stale (its node was evicted or reset) or "
                          "another prefix cache's", (unsigned long long)h);
    *out = x;
    return KVHAL_OK;
}

/* The live ticket a ticket handle names. */
kvhal_status kvhal__pfx_resolve_ticket(const kvhal_prefix_cache *pc, uint64_t h, ticket **out)
{
    uint32_t slot = (uint32_t)h - 1, gen = (uint32_t)(h >> 32) & GEN_MASK;
    if ((uint32_t)h == 0 || slot >= pc->num_tickets || !pc->tickets[slot].live || pc->tickets[slot].gen != gen)
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx is not a live request handle of this prefix cache "
                          "(finished or unlocked already, reset, or another cache's)", (unsigned long long)h);
    *out = &pc->tickets[slot];
    return KVHAL_OK;
}

kvhal_status kvhal__pfx_resolve(const kvhal_prefix_cache *pc, kvhal_prefix_handle h, node **out)
{
    if (h == 0) {
        *out = (node *)&pc->root;
        return KVHAL_OK;
    }
    if (h & H_TICKET) {
        ticket *t = NULL;
        KVHAL_TRY(kvhal__pfx_resolve_ticket(pc, h, &t));
        if (t->node_id == ROOT_ID) {
            *out = (node *)&pc->root;
            return KVHAL_OK;
        }
        return resolve_node(pc, ((uint64_t)t->node_gen << 32) | ((uint64_t)t->node_id + 1), out);
    }
    if (pc->kind == KVHAL_PREFIX_NAIVE)
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx, but a naive prefix cache only hands out 0 (and "
                          "request handles)", (unsigned long long)h);
    return resolve_node(pc, h, out);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* LRU heap of unlocked leaves                                                                                */
/* ---------------------------------------------------------------------------------------------------------- */

static inline void heap_set(kvhal_prefix_cache *pc, size_t i, heap_entry e)
{
    pc->heap[i] = e;
    e.n->heap_idx = (int32_t)i;
}

static void heap_sift_up(kvhal_prefix_cache *pc, size_t i)
{
    heap_entry e = pc->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (pc->heap[p].tick <= e.tick) break;
        heap_set(pc, i, pc->heap[p]);
        i = p;
    }
    heap_set(pc, i, e);
}

static void heap_sift_down(kvhal_prefix_cache *pc, size_t i)
{
    heap_entry e = pc->heap[i];
    size_t n = pc->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pc->heap[c + 1].tick < pc->heap[c].tick) c++;
        if (pc->heap[c].tick >= e.tick) break;
        heap_set(pc, i, pc->heap[c]);
        i = c;
    }
    heap_set(pc, i, e);
}

void kvhal__pfx_heap_push(kvhal_prefix_cache *pc, node *x)
{
    size_t i = pc->heap_n++;
    pc->heap[i] = (heap_entry){x->tick, x};
    heap_sift_up(pc, i);
}

void kvhal__pfx_heap_remove(kvhal_prefix_cache *pc, node *x)
{
    size_t i = (size_t)x->heap_idx;
    x->heap_idx = -1;
    size_t last = --pc->heap_n;
    if (i == last) return;
    heap_entry moved = pc->heap[last];
    heap_set(pc, i, moved);
    if (i > 0 && pc->heap[(i - 1) / 2].tick > moved.tick)
        heap_sift_up(pc, i);
    else
        heap_sift_down(pc, i);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* child table: (parent, first page) -> node, linear probing with backward-shift deletion                     */
/* ---------------------------------------------------------------------------------------------------------- */

node *kvhal__pfx_tab_find(const kvhal_prefix_cache *pc, const node *parent, const int32_t *page)
{
    int32_t ps = pc->page_size;
    uint64_t key = page_key(page, ps);
    uint64_t h = child_hash(parent, key);
    size_t mask = pc->tab_size - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const tab_entry *e = &pc->tab[i];
        if (!e->n) return NULL;
        if (e->h == h && e->n->parent == parent && e->n->fkey == key &&
            (ps == 1 || memcmp(e->n->tok, page, (size_t)ps * sizeof(int32_t)) == 0))
            return e->n;
    }
}

static void tab_put(tab_entry *tab, size_t size, uint64_t h, node *n)
{
    size_t mask = size - 1;
    size_t i = h & mask;
    while (tab[i].n) i = (i + 1) & mask;
    tab[i] = (tab_entry){h, n};
}

size_t kvhal__pfx_tab_slot_of(const kvhal_prefix_cache *pc, const node *n)
{
    uint64_t h = child_hash(n->parent, n->fkey);
    size_t mask = pc->tab_size - 1;
    size_t i = h & mask;
    while (pc->tab[i].n != n) i = (i + 1) & mask;
    return i;
}

void kvhal__pfx_tab_erase_slot(kvhal_prefix_cache *pc, size_t i)
{
    size_t mask = pc->tab_size - 1;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!pc->tab[j].n) break;
        size_t k = pc->tab[j].h & mask;
        /* The entry at j may fill the hole at i unless its home k lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        pc->tab[i] = pc->tab[j];
        i = j;
    }
    pc->tab[i].n = NULL;
    pc->tab_count--;
}

void kvhal__pfx_tab_insert_node(kvhal_prefix_cache *pc, node *n)
{
    tab_put(pc->tab, pc->tab_size, child_hash(n->parent, n->fkey), n);
    pc->tab_count++;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* capacity reservation: everything that can fail happens here, before the tree changes                       */
/* ---------------------------------------------------------------------------------------------------------- */

kvhal_status kvhal__pfx_reserve(kvhal_prefix_cache *pc, size_t extra_nodes)
{
    while (pc->free_count < extra_nodes) {
        if (pc->num_slots > UINT32_MAX - 2 * SLAB_NODES)
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: %u node slots, the most a handle can name",
                              pc->num_slots);
        size_t si = pc->num_slots / SLAB_NODES;
        if (si == pc->slab_at_cap) {
            size_t cap = pc->slab_at_cap ? 2 * pc->slab_at_cap : 16;
            slab **a = kvhal__realloc(pc->slab_at, cap * sizeof *a);
            if (!a) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory for %zu more nodes", extra_nodes);
            pc->slab_at = a;
            pc->slab_at_cap = cap;
        }
        slab *s = kvhal__malloc(sizeof *s);
        if (!s) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory for %zu more nodes", extra_nodes);
        memset(s, 0, sizeof *s);
        pc->slab_at[si] = s;
        for (int i = SLAB_NODES - 1; i >= 0; i--) {
            node *x = &s->nodes[i];
            x->magic = KVHAL_MAGIC_DEAD;
            x->gen = pc->gen_base;
            x->id = pc->num_slots + (uint32_t)i;
            x->heap_idx = -1;
            x->parent = pc->free_nodes;
            pc->free_nodes = x;
        }
        pc->num_slots += SLAB_NODES;
        pc->free_count += SLAB_NODES;
        s->next = pc->slabs;
        pc->slabs = s;
    }
    size_t want = pc->tab_count + extra_nodes;
    if (want * 2 > pc->tab_size) {
        size_t size = pc->tab_size ? pc->tab_size : 64;
        while (want * 2 > size) size *= 2;
        tab_entry *t = kvhal__calloc(size, sizeof *t);
        if (!t) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory for a child table of %zu slots", size);
        for (size_t i = 0; i < pc->tab_size; i++)
            if (pc->tab[i].n) tab_put(t, size, pc->tab[i].h, pc->tab[i].n);
        free(pc->tab);
        pc->tab = t;
        pc->tab_size = size;
    }
    if (pc->num_nodes + extra_nodes > pc->heap_cap) {
        size_t cap = pc->heap_cap ? pc->heap_cap * 2 : 64;
        while (cap < pc->num_nodes + extra_nodes) cap *= 2;
        heap_entry *h = kvhal__realloc(pc->heap, cap * sizeof *h);
        if (!h) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix cache: no memory for an LRU heap of %zu leaves", cap);
        pc->heap = h;
        pc->heap_cap = cap;
    }
    return KVHAL_OK;
}

node *kvhal__pfx_node_take(kvhal_prefix_cache *pc)
{
    node *x = pc->free_nodes;
    pc->free_nodes = x->parent;
    pc->free_count--;
    uint32_t id = x->id, gen = x->gen;
    memset(x, 0, sizeof *x);
    x->id = id;
    x->gen = gen;
    x->magic = NODE_MAGIC;
    x->owner = pc;
    x->heap_idx = -1;
    pc->num_nodes++;
    return x;
}

/* The class of a buffer of `words` and its size; EDGE_CLASSES when it is too large to pool. */
static size_t edge_class(size_t words, size_t *cap)
{
    if (words <= 16) {
        *cap = 16;
        return 0;
    }
    const size_t m = words - 1;
    const unsigned b = 63u - (unsigned)__builtin_clzll((unsigned long long)m); /* m in [2^b, 2^(b+1)), b >= 4 */
    if (b >= 32) {
        *cap = words;
        return EDGE_CLASSES;
    }
    const size_t q = m >> (b - 2); /* 4..7: the quarter of the power of two that m falls in */
    *cap = (q + 1) << (b - 2);
    return 1 + (size_t)(b - 4) * 4 + (q - 4);
}

/* A buffer no free stack takes waits on the spill list for destroy: a released buffer is never handed back to the
 * system while the cache lives, so that a match view that outlived its call (the Python binding's view objects)
 * reads memory of the cache, never freed memory. */
static void edge_spill(kvhal_prefix_cache *pc, int32_t *mem)
{
    memcpy(mem, &pc->edge_spill, sizeof pc->edge_spill); /* every buffer has room for a pointer (>= 16 words) */
    pc->edge_spill = mem;
}

static void edge_pool_put(kvhal_prefix_cache *pc, int32_t *mem, size_t words)
{
    size_t cap, c = edge_class(words, &cap);
    if (c >= EDGE_CLASSES || cap != words) { /* not a pooled buffer */
        edge_spill(pc, mem);
        return;
    }
    edge_stack *st = &pc->edge_free[c];
    if (st->n == st->cap) {
        /* plain realloc, not a fault-injection point: without room the buffer waits on the spill list */
        size_t room = st->cap ? 2 * st->cap : 16;
        void **v = room <= SIZE_MAX / sizeof *v ? realloc(st->v, room * sizeof *v) : NULL;
        if (!v) {
            edge_spill(pc, mem);
            return;
        }
        st->v = v;
        st->cap = room;
    }
    st->v[st->n++] = mem;
}

void kvhal__pfx_edge_release(kvhal_prefix_cache *pc, int32_t *mem, size_t words)
{
    if (!mem) return;
    if (mem == pc->view_mem) { /* a match view still points into it: kept aside until the next pin */
        pc->view_dead = true;
        pc->view_words = words;
        return;
    }
    edge_pool_put(pc, mem, words);
}

void kvhal__pfx_view_pin(kvhal_prefix_cache *pc, int32_t *mem)
{
    if (mem == pc->view_mem) return; /* a dead pinned buffer is no live node's: mem is the same live one */
    int32_t *old = pc->view_mem;
    const bool dead = pc->view_dead;
    pc->view_mem = mem;
    pc->view_dead = false;
    if (dead) edge_pool_put(pc, old, pc->view_words);
}

void kvhal__pfx_edge_pool_free(kvhal_prefix_cache *pc)
{
    for (size_t c = 0; c < EDGE_CLASSES; c++) {
        edge_stack *st = &pc->edge_free[c];
        while (st->n) free(st->v[--st->n]);
        free(st->v);
        *st = (edge_stack){0};
    }
    if (pc->view_dead) free(pc->view_mem);
    pc->view_mem = NULL;
    pc->view_dead = false;
    while (pc->edge_spill) {
        void *next;
        memcpy(&next, pc->edge_spill, sizeof next);
        free(pc->edge_spill);
        pc->edge_spill = next;
    }
}

void kvhal__pfx_node_release(kvhal_prefix_cache *pc, node *x)
{
    kvhal__pfx_edge_release(pc, x->mem, x->mem_words);
    x->mem = x->tok = x->pages = NULL;
    x->magic = KVHAL_MAGIC_DEAD;
    x->owner = NULL;
    x->parent = NULL;
    pc->num_nodes--;
    /* every handle to it is stale from now on; a slot whose generation came full circle is never reused */
    if (!gen_next(pc, &x->gen)) {
        pc->retired++;
        return;
    }
    x->parent = pc->free_nodes;
    pc->free_nodes = x;
    pc->free_count++;
}

/* A buffer of at least `need` words, from the pool when its class has one; *words gets its size. `optional`:
 * the caller copes with NULL by doing without (a shrink), so the allocation is not a fault-injection point. */
static int32_t *edge_get(kvhal_prefix_cache *pc, size_t need, size_t *words, bool optional)
{
    size_t cap, c = edge_class(need, &cap);
    if (c < EDGE_CLASSES && pc->edge_free[c].n) {
        *words = cap;
        return pc->edge_free[c].v[--pc->edge_free[c].n];
    }
    if (cap > SIZE_MAX / sizeof(int32_t)) return NULL;
    *words = cap;
    return optional ? malloc(cap * sizeof(int32_t)) : kvhal__malloc(cap * sizeof(int32_t));
}

int32_t *kvhal__pfx_edge_alloc(kvhal_prefix_cache *pc, size_t len, size_t *words)
{
    size_t np = len / (size_t)pc->page_size;
    if (len > (SIZE_MAX / sizeof(int32_t)) - np) return NULL;
    return edge_get(pc, np + len, words, false);
}

void kvhal__pfx_edge_fill(const kvhal_prefix_cache *pc, node *x, int32_t *mem, size_t words, const int32_t *tok,
                          const int32_t *pages, size_t len)
{
    size_t np = len / (size_t)pc->page_size;
    x->mem = mem;
    x->mem_words = words;
    x->pages = mem;
    x->tok = mem + np;
    x->len = len;
    memcpy(x->pages, pages, np * sizeof(int32_t));
    memcpy(x->tok, tok, len * sizeof(int32_t));
    x->fkey = page_key(x->tok, pc->page_size);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* tree surgery                                                                                               */
/* ---------------------------------------------------------------------------------------------------------- */

size_t kvhal__pfx_split_copy_len(const node *c, size_t m)
{
    return m <= c->len - m ? m : c->len - m;
}

/* A node that shares a buffer with dead parts (what a split gave away) moves to one of its size when the dead
 * part outgrows the live one (keeping the larger one when there is no memory for that is harmless). */
static void compact(kvhal_prefix_cache *pc, node *x)
{
    size_t np = x->len / (size_t)pc->page_size, live = np + x->len;
    size_t words;
    int32_t *smaller;
    if (x->mem_words - live <= live || (smaller = edge_get(pc, live, &words, true)) == NULL) return;
    memcpy(smaller, x->pages, np * sizeof(int32_t));
    memcpy(smaller + np, x->tok, x->len * sizeof(int32_t));
    kvhal__pfx_edge_release(pc, x->mem, x->mem_words);
    x->mem = smaller;
    x->mem_words = words;
    x->pages = smaller;
    x->tok = smaller + np;
}

node *kvhal__pfx_split(kvhal_prefix_cache *pc, node *c, size_t m, int32_t *mem, size_t words)
{
    size_t ps = (size_t)pc->page_size;
    const size_t slot = kvhal__pfx_tab_slot_of(pc, c), rest = c->len - m;
    node *p = kvhal__pfx_node_take(pc);
    if (m <= rest) {
        kvhal__pfx_edge_fill(pc, p, mem, words, c->tok, c->pages, m);
        c->tok += m;
        c->pages += m / ps;
        c->len = rest;
    } else {
        /* p takes the buffer with the upper part at its head; c's part moves out */
        p->mem = c->mem;
        p->mem_words = c->mem_words;
        p->pages = c->pages;
        p->tok = c->tok;
        p->len = m;
        p->fkey = c->fkey;
        kvhal__pfx_edge_fill(pc, c, mem, words, c->tok + m, c->pages + m / ps, rest);
    }
    p->parent = c->parent;
    p->end = c->end - rest;
    p->tick = c->tick;
    p->lock_ref = c->lock_ref;
    p->nchild = 1;
    /* p has c's (parent, first page): it takes c's slot in the table as is. */
    pc->tab[slot].n = p;
    c->parent = p;
    c->fkey = page_key(c->tok, pc->page_size);
    kvhal__pfx_tab_insert_node(pc, c);
    compact(pc, m <= rest ? c : p);
    return p;
}

void kvhal__pfx_touch(kvhal_prefix_cache *pc, node *x, uint64_t now)
{
    if (x == &pc->root) return;
    if (x->heap_idx >= 0) {
        x->tick = now;
        pc->heap[x->heap_idx].tick = now;
        heap_sift_down(pc, (size_t)x->heap_idx); /* now is the newest tick: the entry only sinks */
        x = x->parent;
    }
    for (; x != &pc->root; x = x->parent) x->tick = now;
}

void kvhal__pfx_walk_tokens(const kvhal_prefix_cache *pc, node *start, const int32_t *tokens, size_t n, walk *w)
{
    size_t ps = (size_t)pc->page_size;
    node *x = start;
    size_t pos = 0;
    w->partial = NULL;
    w->in_partial = 0;
    while (pos < n && pc->tab_count) {
        node *c = kvhal__pfx_tab_find(pc, x, tokens + pos);
        if (!c) break;
        size_t lim = c->len < n - pos ? c->len : n - pos;
        size_t m = common_len(c->tok, tokens + pos, lim);
        if (m == c->len) {
            pos += m;
            x = c;
            continue;
        }
        m -= m % ps; /* >= one page: the first page matched in the table */
        w->partial = c;
        w->in_partial = m;
        pos += m;
        break;
    }
    w->last = x;
    w->pos = pos;
}

void kvhal__pfx_drop_all(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    size_t ps = (size_t)pc->page_size;
    for (slab *s = pc->slabs; s; s = s->next)
        for (int i = 0; i < SLAB_NODES; i++) {
            node *x = &s->nodes[i];
            if (x->magic != NODE_MAGIC) continue;
            if (fn && x->len) fn(x->pages, x->len / ps, user);
            kvhal__pfx_node_release(pc, x);
        }
    if (pc->tab) memset(pc->tab, 0, pc->tab_size * sizeof *pc->tab);
    pc->tab_count = 0;
    pc->heap_n = 0;
    pc->root.nchild = 0;
    pc->evictable_tokens = pc->protected_tokens = 0;
    /* the locks are gone, and with them every request handle */
    for (uint32_t i = 0; i < pc->num_tickets; i++) {
        ticket *t = &pc->tickets[i];
        if (!t->live) continue;
        t->live = false;
        if (!gen_next(pc, &t->gen)) continue; /* retired: left off the free list */
        t->next_free = pc->ticket_free;
        pc->ticket_free = i + 1;
    }
    pc->tickets_live = 0;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* locks: counted on every node of a root path                                                                */
/* ---------------------------------------------------------------------------------------------------------- */

kvhal_status kvhal__pfx_lock_node(kvhal_prefix_cache *pc, node *handle)
{
    node *top = handle;
    while (top->parent != &pc->root) top = top->parent;
    if (top->lock_ref == INT32_MAX)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "handle: 0x%016llx, its path already holds %d locks",
                          (unsigned long long)node_handle(pc, handle), (int)INT32_MAX);
    handle->own_locks++; /* <= its lock_ref: no overflow past the check above */
    for (node *x = handle; x != &pc->root; x = x->parent) {
        if (x->lock_ref++ == 0) {
            pc->evictable_tokens -= x->len;
            pc->protected_tokens += x->len;
            if (x->heap_idx >= 0) kvhal__pfx_heap_remove(pc, x);
        }
    }
    return KVHAL_OK;
}

void kvhal__pfx_unlock_path(kvhal_prefix_cache *pc, node *handle)
{
    handle->own_locks--;
    for (node *x = handle; x != &pc->root; x = x->parent) {
        if (--x->lock_ref == 0) {
            pc->protected_tokens -= x->len;
            pc->evictable_tokens += x->len;
            if (x->nchild == 0) kvhal__pfx_heap_push(pc, x);
        }
    }
}

void kvhal__pfx_ticket_release(kvhal_prefix_cache *pc, ticket *t, node *x)
{
    if (x != &pc->root) {
        x->ticket_locks--;
        kvhal__pfx_unlock_path(pc, x);
    }
    uint32_t slot = (uint32_t)(t - pc->tickets);
    t->live = false;
    pc->tickets_live--;
    if (!gen_next(pc, &t->gen)) return; /* retired */
    t->next_free = pc->ticket_free;
    pc->ticket_free = slot + 1;
}

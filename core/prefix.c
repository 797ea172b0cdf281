/* prefix.c — the prefix cache: which token prefixes already have K/V pages, so that a new request reuses them.
 * Two kinds behind one handle: naive (remembers nothing) and radix (a compressed trie from token ids to page ids).
 *
 * Radix layout, chosen so that no operation scans the whole tree:
 *  - every edge is a node holding a run of tokens (a multiple of page_size) and one page id per page, both in one
 *    allocation; a split copies only the smaller part into a new buffer and leaves the larger one where it is
 *    (the node keeping the old buffer moves out when its dead part outgrows its live part, so memory stays
 *    bounded);
 *  - children are found through one open-addressing table keyed by (parent, first page), so a node with
 *    thousands of children (the root of a trace) costs the same as one with two;
 *  - unlocked leaves sit in a binary min-heap on their last-access tick: eviction pops in LRU order in
 *    O(log n) per leaf, and a parent joins the heap when it becomes an unlocked leaf;
 *  - nodes come from slabs, reached by slot id through an array of slabs; a handle is a 64-bit value (slot id and
 *    the slot's generation, bumped each time the slot dies), so a stale handle names a dead generation and is
 *    refused however the slot was reused since (a slot whose generation would wrap is retired, never reused);
 *  - a cache manager's match hands out a ticket instead (a lock of its own, one per request, consumed by the
 *    request's finish or unlock), so that a request finishing twice is refused even when its node still lives.
 * Ticks are a per-cache counter bumped by each match and insert (deterministic, unlike a clock); every access
 * touches a whole root path, so a parent's tick is never older than its children's.
 * Not thread-safe: the owner serialises calls; every status-returning call detects a concurrent one (KVHAL_BUSY). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PC_MAGIC 0x4b565058u   /* KVPX (KVPC is the paged cache) */
#define NODE_MAGIC 0x4b564e44u /* KVND */
#define SLAB_NODES 128
/* Edge buffers come in size classes (16 words, then four classes per power of two: at most 25% slack) and go back
 * to a per-cache free stack when their node dies, so that a cache in steady state (leaves evicted, new ones
 * inserted) reuses its memory instead of going through malloc, and through the page faults of memory malloc
 * has handed back to the system in between. The stacks hold pointers, not links inside the buffers: a released
 * buffer is cold (an evicted leaf is the least recently used memory of the cache), and neither its release nor
 * its reuse should wait for a cache miss on it before the copy into it starts. Buffers of 2^32 words and more are
 * plain allocations. */
#define EDGE_CLASSES (1 + 28 * 4)

typedef struct kvhal_prefix_node node;

struct kvhal_prefix_node {
    uint32_t magic;     /* NODE_MAGIC while live */
    int32_t lock_ref;   /* locks whose path runs through this node */
    int32_t heap_idx;   /* position in the LRU heap, -1 when not an unlocked leaf */
    uint32_t nchild;
    uint32_t id;        /* slot number, stable for the node's memory (integrity check scratch index) */
    uint32_t gen;       /* the slot's generation: part of every handle to it, bumped when the node dies */
    int32_t own_locks;  /* of those, the locks taken with this node as the handle: what unlock may give back */
    int32_t ticket_locks; /* of those, the ones request handles (tickets) hold: only the ticket gives them back */
    node *parent;       /* the free-list link while dead */
    kvhal_prefix_cache *owner;
    uint64_t tick;
    uint64_t fkey;      /* key of the first page (the token itself at page size 1) */
    size_t len;         /* tokens on this edge */
    size_t end;         /* tokens from the root through this node */
    int32_t *tok;       /* len tokens */
    int32_t *pages;     /* len / page_size page ids */
    int32_t *mem;       /* the allocation holding pages then tokens; tok/pages may start past its head */
    size_t mem_words;   /* its size in int32 (its class's size for a pooled buffer) */
};

typedef struct slab {
    struct slab *next;
    node nodes[SLAB_NODES];
} slab;

typedef struct tab_entry {
    uint64_t h;
    node *n; /* NULL = empty */
} tab_entry;

typedef struct edge_stack {
    void **v;
    size_t n, cap;
} edge_stack;

/* A lock taken for one request (kvhal__prefix_ticket): the node it locks (by slot id and generation; UINT32_MAX
 * for the root) and the ticket slot's own generation. */
typedef struct ticket {
    uint32_t node_id, node_gen;
    uint32_t gen;       /* bumped when the ticket is consumed */
    uint32_t next_free; /* free-list link (index + 1, 0 = end) while free */
    bool live;
} ticket;

typedef struct heap_entry {
    uint64_t tick;
    node *n;
} heap_entry;

struct kvhal_prefix_cache {
    uint32_t magic;
    atomic_bool in_use; /* KVHAL_OWNER_ENTER / LEAVE */
    kvhal_prefix_kind kind;
    int32_t page_size;
    uint64_t clock;
    node root;
    size_t num_nodes; /* live nodes, root excluded */
    size_t evictable_tokens, protected_tokens;
    slab *slabs;
    slab **slab_at;     /* slab_at[id / SLAB_NODES] holds slot id */
    size_t slab_at_cap;
    uint32_t num_slots;
    uint32_t retired;   /* slots whose generation ran out: never reused */
    uint32_t gen_base;  /* first generation of this cache's slots and tickets (differs between caches) */
    bool manager_owned; /* created by a cache manager: only the manager destroys it */
    ticket *tickets;
    uint32_t num_tickets, tickets_cap, ticket_free, tickets_live;
    node *free_nodes;
    size_t free_count;
    tab_entry *tab;
    size_t tab_size, tab_count; /* power of two; load kept <= 1/2 */
    heap_entry *heap;
    size_t heap_n, heap_cap;
    edge_stack edge_free[EDGE_CLASSES]; /* released edge buffers by size class */
};

/* ---------------------------------------------------------------------------------------------------------- */
/* small helpers                                                                                              */
/* ---------------------------------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* Key of a page of tokens for the child table. Four independent lanes, so that a 16-token page costs four
 * dependent multiplies, not sixteen (it is computed for every edge an operation walks into). */
static inline uint64_t page_key(const int32_t *t, int32_t ps)
{
    if (ps == 1) return (uint32_t)t[0];
    uint64_t h0 = 0xcbf29ce484222325ULL, h1 = 0x243f6a8885a308d3ULL, h2 = 0x13198a2e03707344ULL,
             h3 = 0xa4093822299f31d0ULL;
    int32_t i = 0;
    for (; i + 4 <= ps; i += 4) {
        h0 = (h0 ^ (uint32_t)t[i]) * 0x100000001b3ULL;
        h1 = (h1 ^ (uint32_t)t[i + 1]) * 0x100000001b3ULL;
        h2 = (h2 ^ (uint32_t)t[i + 2]) * 0x100000001b3ULL;
        h3 = (h3 ^ (uint32_t)t[i + 3]) * 0x100000001b3ULL;
    }
    for (; i < ps; i++) h0 = (h0 ^ (uint32_t)t[i]) * 0x100000001b3ULL;
    return mix64(h0 ^ h1 * 0x9e3779b97f4a7c15ULL ^ h2 * 0xc2b2ae3d27d4eb4fULL ^ h3 * 0x165667b19e3779f9ULL);
}

static inline uint64_t child_hash(const node *parent, uint64_t key)
{
    return mix64(((uint64_t)(uintptr_t)parent * 0x9e3779b97f4a7c15ULL) ^ key);
}

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

static kvhal_status check_pc_magic(const kvhal_prefix_cache *pc)
{
    if (!pc) return kvhal__err(KVHAL_INVALID_HANDLE, "pc: NULL");
    if (pc->magic != PC_MAGIC)
        return kvhal__err(KVHAL_INVALID_HANDLE, "pc: %p is not a live prefix cache", (const void *)pc);
    return KVHAL_OK;
}

/* The entry points' check: the live-handle set first, so that a destroyed prefix cache is refused without its memory
 * being read (unless a new object of this kind was created at the same address since: see kvhal.h); the calls
 * behind them use the magic check only. */
static kvhal_status check_pc(const kvhal_prefix_cache *pc)
{
    if (pc && !kvhal__handle_live(pc, PC_MAGIC))
        return kvhal__err(KVHAL_INVALID_HANDLE, "pc: %p is not a live prefix cache (destroyed?)", (const void *)pc);
    return check_pc_magic(pc);
}

/* ---- handles: (generation << 32) | (slot + 1), bit 63 set for a ticket; 0 = nothing matched (the root) ---- */
#define H_TICKET (1ull << 63)
#define GEN_MASK 0x7fffffffu
#define ROOT_ID UINT32_MAX

static inline kvhal_prefix_handle node_handle(const kvhal_prefix_cache *pc, const node *x)
{
    return x == &pc->root ? 0 : ((uint64_t)x->gen << 32) | ((uint64_t)x->id + 1);
}

static inline node *node_at(const kvhal_prefix_cache *pc, uint32_t id)
{
    return &pc->slab_at[id / SLAB_NODES]->nodes[id % SLAB_NODES];
}

/* The next generation of a slot; false when it would come back to the cache's first one (the slot is retired). */
static inline bool gen_next(const kvhal_prefix_cache *pc, uint32_t *gen)
{
    *gen = (*gen + 1) & GEN_MASK;
    if (*gen == 0) *gen = 1;
    return *gen != pc->gen_base;
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
static kvhal_status resolve_ticket(const kvhal_prefix_cache *pc, uint64_t h, ticket **out)
{
    uint32_t slot = (uint32_t)h - 1, gen = (uint32_t)(h >> 32) & GEN_MASK;
    if ((uint32_t)h == 0 || slot >= pc->num_tickets || !pc->tickets[slot].live || pc->tickets[slot].gen != gen)
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx is not a live request handle of this prefix cache "
                          "(finished or unlocked already, reset, or another cache's)", (unsigned long long)h);
    *out = &pc->tickets[slot];
    return KVHAL_OK;
}

/* The node a handle of either kind stands for: the root for 0 and for a ticket of an empty match. */
static kvhal_status resolve(const kvhal_prefix_cache *pc, kvhal_prefix_handle h, node **out)
{
    if (h == 0) {
        *out = (node *)&pc->root;
        return KVHAL_OK;
    }
    if (h & H_TICKET) {
        ticket *t = NULL;
        KVHAL_TRY(resolve_ticket(pc, h, &t));
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

/* Capacity is reserved whenever a node is created (heap entries <= nodes), so a push never allocates. */
static void heap_push(kvhal_prefix_cache *pc, node *x)
{
    size_t i = pc->heap_n++;
    pc->heap[i] = (heap_entry){x->tick, x};
    heap_sift_up(pc, i);
}

static void heap_remove(kvhal_prefix_cache *pc, node *x)
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
/* child table: (parent, first page) -> node, linear probing with backward-shift deletion                      */
/* ---------------------------------------------------------------------------------------------------------- */

static node *tab_find(const kvhal_prefix_cache *pc, const node *parent, const int32_t *page)
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

static size_t tab_slot_of(const kvhal_prefix_cache *pc, const node *n)
{
    uint64_t h = child_hash(n->parent, n->fkey);
    size_t mask = pc->tab_size - 1;
    size_t i = h & mask;
    while (pc->tab[i].n != n) i = (i + 1) & mask;
    return i;
}

static void tab_erase_slot(kvhal_prefix_cache *pc, size_t i)
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

static void tab_insert_node(kvhal_prefix_cache *pc, node *n)
{
    tab_put(pc->tab, pc->tab_size, child_hash(n->parent, n->fkey), n);
    pc->tab_count++;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* capacity reservation: everything that can fail happens here, before the tree changes                        */
/* ---------------------------------------------------------------------------------------------------------- */

static kvhal_status reserve(kvhal_prefix_cache *pc, size_t extra_nodes)
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

/* Takes a reserved node slot (reserve() guaranteed one) and makes it live. */
static node *node_take(kvhal_prefix_cache *pc)
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

static void edge_release(kvhal_prefix_cache *pc, int32_t *mem, size_t words)
{
    if (!mem) return;
    size_t cap, c = edge_class(words, &cap);
    if (c >= EDGE_CLASSES || cap != words) { /* not a pooled buffer */
        free(mem);
        return;
    }
    edge_stack *st = &pc->edge_free[c];
    if (st->n == st->cap) {
        /* plain realloc, not a fault-injection point: without room the buffer simply goes back to malloc */
        size_t room = st->cap ? 2 * st->cap : 16;
        void **v = room <= SIZE_MAX / sizeof *v ? realloc(st->v, room * sizeof *v) : NULL;
        if (!v) {
            free(mem);
            return;
        }
        st->v = v;
        st->cap = room;
    }
    st->v[st->n++] = mem;
}

static void edge_pool_free(kvhal_prefix_cache *pc)
{
    for (size_t c = 0; c < EDGE_CLASSES; c++) {
        edge_stack *st = &pc->edge_free[c];
        while (st->n) free(st->v[--st->n]);
        free(st->v);
        *st = (edge_stack){0};
    }
}

static void node_release(kvhal_prefix_cache *pc, node *x)
{
    edge_release(pc, x->mem, x->mem_words);
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

/* One buffer for len tokens and their pages. */
static int32_t *edge_alloc(kvhal_prefix_cache *pc, size_t len, size_t *words)
{
    size_t np = len / (size_t)pc->page_size;
    if (len > (SIZE_MAX / sizeof(int32_t)) - np) return NULL;
    return edge_get(pc, np + len, words, false);
}

static void edge_fill(const kvhal_prefix_cache *pc, node *x, int32_t *mem, size_t words, const int32_t *tok,
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

/* Tokens of the part of c that a split after m tokens copies into a new buffer: the smaller one. */
static size_t split_copy_len(const node *c, size_t m)
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
    edge_release(pc, x->mem, x->mem_words);
    x->mem = smaller;
    x->mem_words = words;
    x->pages = smaller;
    x->tok = smaller + np;
}

/* Splits c after m tokens (0 < m < c->len, page-aligned): a new node p takes the first m tokens and c's place
 * under its parent; c keeps the rest, its identity (handles stay valid: they now name the lower part, whose
 * root path covers the same tokens) and its tick. p inherits c's lock count: every lock through c runs through p.
 * mem holds room for split_copy_len(c, m) tokens and their pages: the smaller part is copied there, the larger
 * one stays in c's buffer, which goes to whichever node has it. */
static node *split(kvhal_prefix_cache *pc, node *c, size_t m, int32_t *mem, size_t words)
{
    size_t ps = (size_t)pc->page_size;
    const size_t slot = tab_slot_of(pc, c), rest = c->len - m;
    node *p = node_take(pc);
    if (m <= rest) {
        edge_fill(pc, p, mem, words, c->tok, c->pages, m);
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
        edge_fill(pc, c, mem, words, c->tok + m, c->pages + m / ps, rest);
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
    tab_insert_node(pc, c);
    compact(pc, m <= rest ? c : p);
    return p;
}

static void touch(kvhal_prefix_cache *pc, node *x, uint64_t now)
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

/* Where tokens[0..n), read from node `start` down, leave the tree: the deepest fully matched node, and the edge it
 * diverges in (if any) with the matched length inside it. Positions count from start. */
typedef struct walk {
    node *last;    /* deepest node whose whole edge matched (root if none) */
    node *partial; /* child of last matched only in part (NULL if none) */
    size_t in_partial; /* page-aligned tokens matched inside partial (> 0) */
    size_t pos;    /* total matched tokens, page-aligned */
} walk;

static void walk_tokens(const kvhal_prefix_cache *pc, node *start, const int32_t *tokens, size_t n, walk *w)
{
    size_t ps = (size_t)pc->page_size;
    node *x = start;
    size_t pos = 0;
    w->partial = NULL;
    w->in_partial = 0;
    while (pos < n && pc->tab_count) {
        node *c = tab_find(pc, x, tokens + pos);
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

/* ---------------------------------------------------------------------------------------------------------- */
/* public API                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

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

static void drop_all(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    size_t ps = (size_t)pc->page_size;
    for (slab *s = pc->slabs; s; s = s->next)
        for (int i = 0; i < SLAB_NODES; i++) {
            node *x = &s->nodes[i];
            if (x->magic != NODE_MAGIC) continue;
            if (fn && x->len) fn(x->pages, x->len / ps, user);
            node_release(pc, x);
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
    drop_all(pc, NULL, NULL);
    edge_pool_free(pc);
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

static kvhal_status kvhal_prefix_match__body(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages, size_t pages_cap)
{
    KVHAL_TRY(check_pc_magic(pc));
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || pages_cap == 0, "pages: NULL with pages_cap %zu", pages_cap);
    if (pc->kind == KVHAL_PREFIX_NAIVE) {
        if (handle) *handle = 0;
        if (cached_len) *cached_len = 0;
        return KVHAL_OK;
    }

    size_t ps = (size_t)pc->page_size;
    size_t n = num_tokens - num_tokens % ps;
    walk w;
    walk_tokens(pc, &pc->root, tokens, n, &w);
    if (w.pos / ps > pages_cap)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "pages_cap: %zu is too small for the %zu cached pages of %zu tokens",
                          pages_cap, w.pos / ps, w.pos);
    node *x = w.last;
    if (w.partial) {
        /* The handle must end exactly at the match so that lock() protects exactly what the caller uses. */
        size_t words;
        KVHAL_TRY(reserve(pc, 1));
        int32_t *mem = edge_alloc(pc, split_copy_len(w.partial, w.in_partial), &words);
        if (!mem) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix match: no memory to split a node at %zu tokens",
                                    w.in_partial);
        x = split(pc, w.partial, w.in_partial, mem, words);
    }
    touch(pc, x, ++pc->clock);
    for (node *y = x; y != &pc->root; y = y->parent)
        memcpy(pages + (y->end - y->len) / ps, y->pages, y->len / ps * sizeof(int32_t));
    if (handle) *handle = node_handle(pc, x);
    if (cached_len) *cached_len = w.pos;
    return KVHAL_OK;
}

static void unlock_path(kvhal_prefix_cache *pc, node *handle);
static kvhal_status insert_impl(kvhal_prefix_cache *pc, node *start, const int32_t *tokens, size_t num_tokens,
                                const int32_t *pages, node *must, bool pages_checked, size_t *already_cached);

static kvhal_status lock_node(kvhal_prefix_cache *pc, node *handle)
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
            if (x->heap_idx >= 0) heap_remove(pc, x);
        }
    }
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_lock__body(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_TRY(check_pc_magic(pc));
    if (!handle)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0 (match found nothing: there is nothing to lock)");
    node *x;
    KVHAL_TRY(resolve(pc, handle, &x));
    if (x == &pc->root) return KVHAL_OK;
    return lock_node(pc, x);
}

/* Consumes a live ticket: its lock goes back, the handle is stale from now on. */
static void ticket_release(kvhal_prefix_cache *pc, ticket *t, node *x)
{
    if (x != &pc->root) {
        x->ticket_locks--;
        unlock_path(pc, x);
    }
    uint32_t slot = (uint32_t)(t - pc->tickets);
    t->live = false;
    pc->tickets_live--;
    if (!gen_next(pc, &t->gen)) return; /* retired */
    t->next_free = pc->ticket_free;
    pc->ticket_free = slot + 1;
}

static kvhal_status kvhal_prefix_unlock__body(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_TRY(check_pc_magic(pc));
    if (!handle)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0 (match found nothing: there is nothing to unlock)");
    node *x;
    KVHAL_TRY(resolve(pc, handle, &x));
    if (handle & H_TICKET) {
        ticket_release(pc, &pc->tickets[(uint32_t)handle - 1], x);
        return KVHAL_OK;
    }
    if (x == &pc->root) return KVHAL_OK;
    /* own_locks, not lock_ref: a lock through this node by a longer handle is not this handle's to give back */
    if (x->own_locks - x->ticket_locks <= 0)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0x%016llx is not locked (unlock without a matching lock%s)",
                          (unsigned long long)handle,
                          x->ticket_locks ? "; the locks it has are request handles', given back by those" : "");
    unlock_path(pc, x);
    return KVHAL_OK;
}

static kvhal_status kvhal__prefix_ticket__body(kvhal_prefix_cache *pc, kvhal_prefix_handle node_h,
                                               kvhal_prefix_handle *out)
{
    KVHAL_TRY(check_pc_magic(pc));
    node *x;
    KVHAL_TRY(resolve(pc, node_h, &x));
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
        KVHAL_TRY(lock_node(pc, x));
        x->ticket_locks++;
    }
    uint32_t slot = pc->ticket_free - 1;
    ticket *t = &pc->tickets[slot];
    pc->ticket_free = t->next_free;
    t->next_free = 0;
    t->live = true;
    t->node_id = x == &pc->root ? ROOT_ID : x->id;
    t->node_gen = x == &pc->root ? 0 : x->gen;
    pc->tickets_live++;
    *out = H_TICKET | ((uint64_t)t->gen << 32) | ((uint64_t)slot + 1);
    return KVHAL_OK;
}

/* Inserts tokens[0..n) and their pages below node `start` (the root, or a locked handle whose cached prefix the
 * tokens continue). With start at the root, an optional check that `must` (a locked match of this request) lies on
 * the tokens' path and that pages[] repeats the cached pages up to it; the cache manager uses it so that a wrong
 * handle or page list can never put one page in two places. pages_checked: the caller has checked the pages past
 * `must`'s (the cache manager checks each as a page its request holds), so the sign check here would read them
 * again. *already_cached counts from start. */
static kvhal_status insert_impl(kvhal_prefix_cache *pc, node *start, const int32_t *tokens, size_t num_tokens,
                                const int32_t *pages, node *must, bool pages_checked, size_t *already_cached)
{
    size_t ps = (size_t)pc->page_size;
    size_t n = num_tokens - num_tokens % ps;
    walk w;
    walk_tokens(pc, start, tokens, n, &w);

    if (must) {
        size_t need = must->end;
        bool on_path = false;
        for (node *y = w.last; y != &pc->root; y = y->parent)
            if (y == must) {
                on_path = true;
                break;
            }
        if (!on_path)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: its %zu cached tokens are not a prefix of tokens "
                              "(they share %zu)", need, w.pos);
        for (node *y = must; y != &pc->root; y = y->parent) {
            const int32_t *mine = pages + (y->end - y->len) / ps;
            size_t np = y->len / ps;
            if (memcmp(mine, y->pages, np * sizeof(int32_t)) != 0) {
                size_t k = 0;
                while (mine[k] == y->pages[k]) k++;
                return kvhal__err(KVHAL_INVALID_ARGUMENT, "pages[%zu]: %d, but the matched prefix holds page %d "
                                  "there", (y->end - y->len) / ps + k, (int)mine[k], (int)y->pages[k]);
            }
        }
    }

    size_t fresh = n - w.pos; /* tokens that get a new leaf */
    int32_t any = 0; /* branch-free sign check: a page list is long at page size 1 */
    if (!pages_checked)
        for (size_t i = w.pos / ps; i < n / ps; i++) any |= pages[i];
    if (any < 0)
        for (size_t i = w.pos / ps; i < n / ps; i++)
            if (pages[i] < 0)
                return kvhal__err(KVHAL_INVALID_ARGUMENT, "pages[%zu]: %d is negative", i, (int)pages[i]);

    size_t need_nodes = (w.partial ? 1 : 0) + (fresh ? 1 : 0);
    int32_t *split_mem = NULL, *leaf_mem = NULL;
    size_t split_words = 0, leaf_words = 0;
    if (need_nodes) {
        KVHAL_TRY(reserve(pc, need_nodes));
        if (w.partial && !(split_mem = edge_alloc(pc, split_copy_len(w.partial, w.in_partial), &split_words)))
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix insert: no memory to split a node at %zu tokens",
                              w.in_partial);
        if (fresh && !(leaf_mem = edge_alloc(pc, fresh, &leaf_words))) {
            edge_release(pc, split_mem, split_words);
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix insert: no memory for %zu new tokens", fresh);
        }
    }

    uint64_t now = ++pc->clock;
    node *x = w.last;
    if (w.partial) x = split(pc, w.partial, w.in_partial, split_mem, split_words);
    if (fresh) {
        node *leaf = node_take(pc);
        edge_fill(pc, leaf, leaf_mem, leaf_words, tokens + w.pos, pages + w.pos / ps, fresh);
        leaf->parent = x;
        leaf->end = start->end + n;
        leaf->tick = now;
        tab_insert_node(pc, leaf);
        if (x->heap_idx >= 0) heap_remove(pc, x);
        x->nchild++;
        pc->evictable_tokens += fresh;
        heap_push(pc, leaf);
        x = leaf;
    }
    touch(pc, x, now);
    if (already_cached) *already_cached = w.pos;
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_insert__body(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                 const int32_t *pages, size_t *already_cached)
{
    KVHAL_TRY(check_pc_magic(pc));
    size_t ps = (size_t)pc->page_size;
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || num_tokens < ps, "pages: NULL for %zu pages", num_tokens / ps);
    if (pc->kind == KVHAL_PREFIX_NAIVE) {
        /* Keeps nothing: every page stays the caller's. */
        if (already_cached) *already_cached = num_tokens - num_tokens % ps;
        return KVHAL_OK;
    }
    return insert_impl(pc, &pc->root, tokens, num_tokens, pages, NULL, false, already_cached);
}

static void unlock_path(kvhal_prefix_cache *pc, node *handle)
{
    handle->own_locks--;
    for (node *x = handle; x != &pc->root; x = x->parent) {
        if (--x->lock_ref == 0) {
            pc->protected_tokens -= x->len;
            pc->evictable_tokens += x->len;
            if (x->nchild == 0) heap_push(pc, x);
        }
    }
}

static kvhal_status kvhal__prefix_insert_unlock__body(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                         const int32_t *pages, kvhal_prefix_handle handle, bool suffix,
                                         size_t *already_cached)
{
    KVHAL_TRY(check_pc_magic(pc));
    size_t ps = (size_t)pc->page_size;
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || num_tokens < ps, "pages: NULL for %zu pages", num_tokens / ps);
    node *x;
    KVHAL_TRY(resolve(pc, handle, &x));
    ticket *t = (handle & H_TICKET) ? &pc->tickets[(uint32_t)handle - 1] : NULL;
    if (!t && x != &pc->root && x->own_locks - x->ticket_locks <= 0)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "handle: 0x%016llx is not locked (finished twice?)",
                          (unsigned long long)handle);
    if (pc->kind == KVHAL_PREFIX_NAIVE) {
        if (already_cached) *already_cached = num_tokens - num_tokens % ps;
    } else if (suffix) {
        KVHAL_TRY(insert_impl(pc, x, tokens, num_tokens, pages, NULL, true, already_cached));
    } else {
        KVHAL_TRY(insert_impl(pc, &pc->root, tokens, num_tokens, pages, x == &pc->root ? NULL : x, true,
                              already_cached));
    }
    if (t) ticket_release(pc, t, x);
    else if (x != &pc->root) unlock_path(pc, x);
    return KVHAL_OK;
}

static kvhal_status kvhal__prefix_handle_len__body(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle,
                                                   size_t *len)
{
    KVHAL_TRY(check_pc_magic(pc));
    *len = 0;
    node *x;
    KVHAL_TRY(resolve(pc, handle, &x));
    *len = x->end;
    return KVHAL_OK;
}

kvhal_status kvhal__prefix_handle_last_page(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle, int32_t *page)
{
    KVHAL_TRY(check_pc(pc));
    *page = -1;
    node *x;
    KVHAL_TRY(resolve(pc, handle, &x));
    const size_t n = x->len / (size_t)pc->page_size;
    if (n) *page = x->pages[n - 1];
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_evict__body(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                size_t *evicted)
{
    KVHAL_TRY(check_pc_magic(pc));
    if (evicted) *evicted = 0;
    if (num_tokens == 0) return KVHAL_OK;
    if (pc->kind == KVHAL_PREFIX_NAIVE)
        return kvhal__err(KVHAL_UNSUPPORTED, "num_tokens: %zu, but a naive prefix cache holds nothing to evict",
                          num_tokens);
    size_t ps = (size_t)pc->page_size;
    size_t done = 0;
    while (done < num_tokens && pc->heap_n) {
        node *x = pc->heap[0].n;
        heap_remove(pc, x);
        node *p = x->parent;
        if (fn) fn(x->pages, x->len / ps, user);
        done += x->len;
        pc->evictable_tokens -= x->len;
        tab_erase_slot(pc, tab_slot_of(pc, x));
        node_release(pc, x);
        if (--p->nchild == 0 && p != &pc->root && p->lock_ref == 0) heap_push(pc, p);
    }
    if (evicted) *evicted = done;
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_size_info_get__body(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out)
{
    KVHAL_TRY(check_pc_magic(pc));
    KVHAL_CHECK_ARG(out, "out: NULL");
    out->evictable_tokens = pc->evictable_tokens;
    out->protected_tokens = pc->protected_tokens;
    out->total_tokens = pc->evictable_tokens + pc->protected_tokens;
    out->num_nodes = pc->num_nodes;
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_reset__body(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_TRY(check_pc_magic(pc));
    drop_all(pc, fn, user);
    return KVHAL_OK;
}

static kvhal_status kvhal__prefix_for_each_page__body(const kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_TRY(check_pc_magic(pc));
    size_t ps = (size_t)pc->page_size;
    for (const slab *s = pc->slabs; s; s = s->next)
        for (int i = 0; i < SLAB_NODES; i++) {
            const node *x = &s->nodes[i];
            if (x->magic == NODE_MAGIC && x->len) fn(x->pages, x->len / ps, user);
        }
    return KVHAL_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* integrity                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */

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
    if (tab_find(pc, p, x->tok) != x)
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
    KVHAL_TRY(check_pc_magic(pc));
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

kvhal_status kvhal_prefix_match(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages, size_t pages_cap)
{
    KVHAL_OWNED_CALL(check_pc(pc), pc, "pc",
                     kvhal_prefix_match__body(pc, tokens, num_tokens, handle, cached_len, pages, pages_cap));
}

kvhal_status kvhal_prefix_lock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_OWNED_CALL(check_pc(pc), pc, "pc", kvhal_prefix_lock__body(pc, handle));
}

kvhal_status kvhal_prefix_unlock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle)
{
    KVHAL_OWNED_CALL(check_pc(pc), pc, "pc", kvhal_prefix_unlock__body(pc, handle));
}

kvhal_status kvhal__prefix_ticket(kvhal_prefix_cache *pc, kvhal_prefix_handle node_h, kvhal_prefix_handle *out)
{
    KVHAL_TRY(check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_ticket__body(pc, node_h, out);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal_prefix_insert(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens, const int32_t *pages,
                                 size_t *already_cached)
{
    KVHAL_OWNED_CALL(check_pc(pc), pc, "pc", kvhal_prefix_insert__body(pc, tokens, num_tokens, pages, already_cached));
}

kvhal_status kvhal__prefix_insert_unlock(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                         const int32_t *pages, kvhal_prefix_handle handle, bool suffix,
                                         size_t *already_cached)
{
    KVHAL_TRY(check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_insert_unlock__body(pc, tokens, num_tokens, pages, handle, suffix, already_cached);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal__prefix_handle_len(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle, size_t *len)
{
    KVHAL_TRY(check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = (kvhal_prefix_cache *)pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_handle_len__body(pc, handle, len);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal_prefix_evict(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                size_t *evicted)
{
    KVHAL_OWNED_CALL(check_pc(pc), pc, "pc", kvhal_prefix_evict__body(pc, num_tokens, fn, user, evicted));
}

kvhal_status kvhal_prefix_size_info_get(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out)
{
    KVHAL_OWNED_CALL(check_pc(pc), (kvhal_prefix_cache *)pc, "pc", kvhal_prefix_size_info_get__body(pc, out));
}

kvhal_status kvhal_prefix_reset(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_OWNED_CALL(check_pc(pc), pc, "pc", kvhal_prefix_reset__body(pc, fn, user));
}

kvhal_status kvhal__prefix_for_each_page(const kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user)
{
    KVHAL_TRY(check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = (kvhal_prefix_cache *)pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_for_each_page__body(pc, fn, user);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal_prefix_check_integrity(const kvhal_prefix_cache *pc)
{
    KVHAL_OWNED_CALL(check_pc(pc), (kvhal_prefix_cache *)pc, "pc", kvhal_prefix_check_integrity__body(pc));
}

kvhal_status kvhal__prefix_match_owned(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                       kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages, size_t pages_cap)
{
    KVHAL_OWNED_CALL(check_pc_magic(pc), pc, "pc",
                     kvhal_prefix_match__body(pc, tokens, num_tokens, handle, cached_len, pages, pages_cap));
}

kvhal_status kvhal__prefix_size_info_get_owned(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out)
{
    KVHAL_OWNED_CALL(check_pc_magic(pc), (kvhal_prefix_cache *)pc, "pc", kvhal_prefix_size_info_get__body(pc, out));
}

kvhal_status kvhal__prefix_evict_owned(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                       size_t *evicted)
{
    KVHAL_OWNED_CALL(check_pc_magic(pc), pc, "pc", kvhal_prefix_evict__body(pc, num_tokens, fn, user, evicted));
}

kvhal_status kvhal__prefix_check_integrity_owned(const kvhal_prefix_cache *pc)
{
    KVHAL_OWNED_CALL(check_pc_magic(pc), (kvhal_prefix_cache *)pc, "pc", kvhal_prefix_check_integrity__body(pc));
}

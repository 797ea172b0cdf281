/* radix.h — what the files of the prefix cache share (radix.c implements it): the cache and node structs, handles,
 * and the tree primitives the operations are built on.
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
 *    request's finish or unlock), so that a request finishing twice is refused even when its node still lives;
 *  - its match_view hands a match within one edge under the root out as that edge's own page list: the buffer is
 *    pinned until the next such match (kept aside if its node dies or moves meanwhile), and no released buffer
 *    goes back to the system before destroy (the pools, or a spill list), so a view that outlived its call reads
 *    the cache's memory, never freed memory.
 * Ticks are a per-cache counter bumped by each match and insert (deterministic, unlike a clock); every access
 * touches a whole root path, so a parent's tick is never older than its children's.
 * Not thread-safe: the owner serialises calls; every status-returning call detects a concurrent one (KVHAL_BUSY). */
#ifndef KVHAL_CORE_RADIX_H
#define KVHAL_CORE_RADIX_H

#include "error.h"
#include "faults.h"

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
    size_t bound;       /* tokens its request's match reported on (the cache manager's load_back loads no further) */
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
    void *edge_spill;   /* released buffers no stack takes (no room to grow one, or too large to pool): a list
                         * linked through each buffer's first word, freed at destroy */
    /* The edge buffer a cache manager's match view points into (kvhal__pfx_view_pin): while pinned it is never
     * reused; when its node lets it go (eviction, a split's move) it is kept aside, dead, until the next pin. */
    int32_t *view_mem;
    size_t view_words;
    bool view_dead;
};

/* ---- handles: (generation << 32) | (slot + 1), bit 63 set for a ticket; 0 = nothing matched (the root) ---- */
#define H_TICKET (1ull << 63)
#define GEN_MASK 0x7fffffffu
#define ROOT_ID UINT32_MAX

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

/* Where tokens[0..n), read from node `start` down, leave the tree: the deepest fully matched node, and the edge it
 * diverges in (if any) with the matched length inside it. Positions count from start. */
typedef struct walk {
    node *last;    /* deepest node whose whole edge matched (root if none) */
    node *partial; /* child of last matched only in part (NULL if none) */
    size_t in_partial; /* page-aligned tokens matched inside partial (> 0) */
    size_t pos;    /* total matched tokens, page-aligned */
} walk;

/* pc is a prefix cache (its magic): the check of the calls a live entry point or the cache manager makes. */
KVHAL_HIDDEN kvhal_status kvhal__pfx_check_pc_magic(const kvhal_prefix_cache *pc);
/* The entry points' check: the live-handle set first, so that a destroyed prefix cache is refused without its memory
 * being read (unless a new object of this kind was created at the same address since: see kvhal.h); the calls
 * behind them use the magic check only. */
KVHAL_HIDDEN kvhal_status kvhal__pfx_check_pc(const kvhal_prefix_cache *pc);
/* The node a handle of either kind stands for: the root for 0 and for a ticket of an empty match. */
KVHAL_HIDDEN kvhal_status kvhal__pfx_resolve(const kvhal_prefix_cache *pc, kvhal_prefix_handle h, node **out);
/* The live ticket a request handle names; KVHAL_INVALID_HANDLE otherwise. */
KVHAL_HIDDEN kvhal_status kvhal__pfx_resolve_ticket(const kvhal_prefix_cache *pc, uint64_t h, ticket **out);
/* Capacity is reserved whenever a node is created (heap entries <= nodes), so a push never allocates. */
KVHAL_HIDDEN void kvhal__pfx_heap_push(kvhal_prefix_cache *pc, node *x);
KVHAL_HIDDEN void kvhal__pfx_heap_remove(kvhal_prefix_cache *pc, node *x);
/* The child of parent whose edge starts with page (page_size tokens), or NULL. */
KVHAL_HIDDEN node *kvhal__pfx_tab_find(const kvhal_prefix_cache *pc, const node *parent, const int32_t *page);
/* The child table's slot of n, and its removal (backward shift: no tombstones). */
KVHAL_HIDDEN size_t kvhal__pfx_tab_slot_of(const kvhal_prefix_cache *pc, const node *n);
KVHAL_HIDDEN void kvhal__pfx_tab_erase_slot(kvhal_prefix_cache *pc, size_t i);
KVHAL_HIDDEN void kvhal__pfx_tab_insert_node(kvhal_prefix_cache *pc, node *n);
/* Everything that can fail happens here, before the tree changes: node slots, child table and heap room for
 * extra_nodes more nodes. */
KVHAL_HIDDEN kvhal_status kvhal__pfx_reserve(kvhal_prefix_cache *pc, size_t extra_nodes);
/* Takes a reserved node slot (kvhal__pfx_reserve() guaranteed one) and makes it live. */
KVHAL_HIDDEN node *kvhal__pfx_node_take(kvhal_prefix_cache *pc);
/* Gives an edge buffer (mem, words of it; NULL: nothing) back to its size class's free stack, or to the spill
 * list; the pinned one is kept aside instead (kvhal__pfx_view_pin). */
KVHAL_HIDDEN void kvhal__pfx_edge_release(kvhal_prefix_cache *pc, int32_t *mem, size_t words);
/* Pins mem (a live node's buffer, or NULL for none) as the one a match view points into, and gives the buffer
 * pinned before back to the pool if its node let it go meanwhile. */
KVHAL_HIDDEN void kvhal__pfx_view_pin(kvhal_prefix_cache *pc, int32_t *mem);
/* Frees every pooled edge buffer, the spilled ones and a dead pinned one (destroy). */
KVHAL_HIDDEN void kvhal__pfx_edge_pool_free(kvhal_prefix_cache *pc);
/* Kills a live node: its buffer goes back, every handle to it is stale, its slot is free (or retired). */
KVHAL_HIDDEN void kvhal__pfx_node_release(kvhal_prefix_cache *pc, node *x);
/* One buffer for len tokens and their pages. */
KVHAL_HIDDEN int32_t *kvhal__pfx_edge_alloc(kvhal_prefix_cache *pc, size_t len, size_t *words);
/* Makes mem (words of it) x's buffer, holding len tokens tok and their pages. */
KVHAL_HIDDEN void kvhal__pfx_edge_fill(const kvhal_prefix_cache *pc, node *x, int32_t *mem, size_t words,
                                       const int32_t *tok, const int32_t *pages, size_t len);
/* Tokens of the part of c that a split after m tokens copies into a new buffer: the smaller one. */
KVHAL_HIDDEN size_t kvhal__pfx_split_copy_len(const node *c, size_t m);
/* Splits c after m tokens (0 < m < c->len, page-aligned): a new node p takes the first m tokens and c's place
 * under its parent; c keeps the rest, its identity (handles stay valid: they now name the lower part, whose
 * root path covers the same tokens) and its tick. p inherits c's lock count: every lock through c runs through p.
 * mem holds room for kvhal__pfx_split_copy_len(c, m) tokens and their pages: the smaller part is copied there,
 * the larger one stays in c's buffer, which goes to whichever node has it. */
KVHAL_HIDDEN node *kvhal__pfx_split(kvhal_prefix_cache *pc, node *c, size_t m, int32_t *mem, size_t words);
/* Marks x and its root path used at tick now (x's heap entry, if it has one, sinks). */
KVHAL_HIDDEN void kvhal__pfx_touch(kvhal_prefix_cache *pc, node *x, uint64_t now);
KVHAL_HIDDEN void kvhal__pfx_walk_tokens(const kvhal_prefix_cache *pc, node *start, const int32_t *tokens, size_t n,
                                         walk *w);
/* Drops every node (fn, if set, gets their pages) and every request handle: an empty tree. */
KVHAL_HIDDEN void kvhal__pfx_drop_all(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user);
/* One lock with handle as its node: counted on every node of its root path (locked nodes leave the LRU heap). */
KVHAL_HIDDEN kvhal_status kvhal__pfx_lock_node(kvhal_prefix_cache *pc, node *handle);
/* Consumes a live ticket: its lock goes back, the handle is stale from now on. */
KVHAL_HIDDEN void kvhal__pfx_ticket_release(kvhal_prefix_cache *pc, ticket *t, node *x);
/* Gives back one lock taken with handle as its node (unlocked leaves join the LRU heap). */
KVHAL_HIDDEN void kvhal__pfx_unlock_path(kvhal_prefix_cache *pc, node *handle);

#endif

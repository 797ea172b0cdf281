/* match.c — matching a request's tokens against a prefix cache and inserting its pages. */
#include <string.h>

#include "owner.h"
#include "prefix_owned.h"
#include "radix.h"

/* view: NULL, or where the matched pages are handed out without a copy when they are one node's (the node hangs
 * from the root): a pointer into its buffer, pinned (kvhal__pfx_view_pin) until the next view; else they are
 * copied into pages and *view points there. */
static kvhal_status kvhal_prefix_match__body(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages, size_t pages_cap,
                                const int32_t **view)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || pages_cap == 0, "pages: NULL with pages_cap %zu", pages_cap);
    if (pc->kind == KVHAL_PREFIX_NAIVE) {
        if (handle) *handle = 0;
        if (cached_len) *cached_len = 0;
        if (view) *view = pages;
        return KVHAL_OK;
    }

    size_t ps = (size_t)pc->page_size;
    size_t n = num_tokens - num_tokens % ps;
    walk w;
    kvhal__pfx_walk_tokens(pc, &pc->root, tokens, n, &w);
    if (w.pos / ps > pages_cap)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "pages_cap: %zu is too small for the %zu cached pages of %zu tokens",
                          pages_cap, w.pos / ps, w.pos);
    node *x = w.last;
    if (w.partial) {
        /* The handle must end exactly at the match so that lock() protects exactly what the caller uses. */
        size_t words;
        KVHAL_TRY(kvhal__pfx_reserve(pc, 1));
        int32_t *mem = kvhal__pfx_edge_alloc(pc, kvhal__pfx_split_copy_len(w.partial, w.in_partial), &words);
        if (!mem) return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix match: no memory to split a node at %zu tokens",
                                    w.in_partial);
        x = kvhal__pfx_split(pc, w.partial, w.in_partial, mem, words);
    }
    kvhal__pfx_touch(pc, x, ++pc->clock);
    if (view && x != &pc->root && x->parent == &pc->root) {
        kvhal__pfx_view_pin(pc, x->mem);
        *view = x->pages;
    } else {
        if (view) {
            kvhal__pfx_view_pin(pc, NULL);
            *view = pages;
        }
        for (node *y = x; y != &pc->root; y = y->parent)
            memcpy(pages + (y->end - y->len) / ps, y->pages, y->len / ps * sizeof(int32_t));
    }
    if (handle) *handle = node_handle(pc, x);
    if (cached_len) *cached_len = w.pos;
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
    kvhal__pfx_walk_tokens(pc, start, tokens, n, &w);

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
        KVHAL_TRY(kvhal__pfx_reserve(pc, need_nodes));
        if (w.partial &&
            !(split_mem = kvhal__pfx_edge_alloc(pc, kvhal__pfx_split_copy_len(w.partial, w.in_partial), &split_words)))
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix insert: no memory to split a node at %zu tokens",
                              w.in_partial);
        if (fresh && !(leaf_mem = kvhal__pfx_edge_alloc(pc, fresh, &leaf_words))) {
            kvhal__pfx_edge_release(pc, split_mem, split_words);
            return kvhal__err(KVHAL_OUT_OF_MEMORY, "prefix insert: no memory for %zu new tokens", fresh);
        }
    }

    uint64_t now = ++pc->clock;
    node *x = w.last;
    if (w.partial) x = kvhal__pfx_split(pc, w.partial, w.in_partial, split_mem, split_words);
    if (fresh) {
        node *leaf = kvhal__pfx_node_take(pc);
        kvhal__pfx_edge_fill(pc, leaf, leaf_mem, leaf_words, tokens + w.pos, pages + w.pos / ps, fresh);
        leaf->parent = x;
        leaf->end = start->end + n;
        leaf->tick = now;
        kvhal__pfx_tab_insert_node(pc, leaf);
        if (x->heap_idx >= 0) kvhal__pfx_heap_remove(pc, x);
        x->nchild++;
        pc->evictable_tokens += fresh;
        kvhal__pfx_heap_push(pc, leaf);
        x = leaf;
    }
    kvhal__pfx_touch(pc, x, now);
    if (already_cached) *already_cached = w.pos;
    return KVHAL_OK;
}

static kvhal_status kvhal_prefix_insert__body(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                 const int32_t *pages, size_t *already_cached)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
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

static kvhal_status kvhal__prefix_insert_unlock__body(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                         const int32_t *pages, kvhal_prefix_handle handle, bool suffix,
                                         size_t *already_cached)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc));
    size_t ps = (size_t)pc->page_size;
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    KVHAL_CHECK_ARG(pages || num_tokens < ps, "pages: NULL for %zu pages", num_tokens / ps);
    node *x;
    KVHAL_TRY(kvhal__pfx_resolve(pc, handle, &x));
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
    if (t) kvhal__pfx_ticket_release(pc, t, x);
    else if (x != &pc->root) kvhal__pfx_unlock_path(pc, x);
    return KVHAL_OK;
}

/* ---- the entry points: the live-handle lookup, then the body under the owner flag (KVHAL_OWNER_ENTER) ---- */

kvhal_status kvhal_prefix_match(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages, size_t pages_cap)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), pc, "pc",
                     kvhal_prefix_match__body(pc, tokens, num_tokens, handle, cached_len, pages, pages_cap, NULL));
}

kvhal_status kvhal_prefix_insert(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens, const int32_t *pages,
                                 size_t *already_cached)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc(pc), pc, "pc",
                     kvhal_prefix_insert__body(pc, tokens, num_tokens, pages, already_cached));
}

kvhal_status kvhal__prefix_insert_unlock(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                         const int32_t *pages, kvhal_prefix_handle handle, bool suffix,
                                         size_t *already_cached)
{
    KVHAL_TRY(kvhal__pfx_check_pc_magic(pc)); /* called by the manager on its own live cache */
    kvhal_prefix_cache *o = pc;
    KVHAL_OWNER_ENTER(o, "pc");
    kvhal_status st = kvhal__prefix_insert_unlock__body(pc, tokens, num_tokens, pages, handle, suffix, already_cached);
    KVHAL_OWNER_LEAVE(o);
    return st;
}

kvhal_status kvhal__prefix_match_owned(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                       kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                       size_t pages_cap, const int32_t **view)
{
    KVHAL_OWNED_CALL(kvhal__pfx_check_pc_magic(pc), pc, "pc",
                     kvhal_prefix_match__body(pc, tokens, num_tokens, handle, cached_len, pages, pages_cap, view));
}

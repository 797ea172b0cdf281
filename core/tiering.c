/* tiering.c — a tiered cache manager's side of the tiers (tier.h): the map from every device page of the prefix
 * tree to its chain hash, parent hash and tokens, the write policy, the event queue, and the host-run lookup
 * behind match_tiered and load_back. The radix tree knows nothing of it: pages enter the map when a finished
 * request's pages enter the tree and leave it when eviction hands them back. */
#include <stdlib.h>
#include <string.h>

#include "tier.h"

struct kvhal__tiering {
    kvhal_write_policy policy;
    int32_t total, page_size;
    uint64_t root;
    /* per device page, valid while the page is the tree's (the manager's cached bit says so: no flag of our own, so
     * that eviction without events or write-back costs nothing per page) */
    uint64_t *hash, *parent;
    int32_t *tokens;         /* page_size per device page */
    /* write-back: pages evicted by the current eviction, written to the tier when it is done */
    int32_t *wb_pages;
    uint64_t *wb_hash, *wb_parent;
    int32_t *wb_tokens;
    size_t wb_n;
    kvhal__tier *tier;       /* NULL: no host tier (events only) */
    kvhal__kv_events *ev;
};

kvhal__tier *kvhal__tiering_tier(kvhal__tiering *t) { return t->tier; }
kvhal__kv_events *kvhal__tiering_events(kvhal__tiering *t) { return t->ev; }
uint64_t kvhal__tiering_root(const kvhal__tiering *t) { return t->root; }
uint64_t kvhal__tiering_page_hash(const kvhal__tiering *t, int32_t page) { return t->hash[page]; }

void kvhal__tiering_destroy(kvhal__tiering *t)
{
    if (!t) return;
    if (t->tier) t->tier->ops->destroy(t->tier);
    kvhal__kv_events_destroy(t->ev);
    free(t->hash);
    free(t->parent);
    free(t->tokens);
    free(t->wb_pages);
    free(t->wb_hash);
    free(t->wb_parent);
    free(t->wb_tokens);
    free(t);
}

kvhal_status kvhal__tiering_create(const kvhal_host_tier_config *cfg, int32_t total_pages, int32_t page_size,
                                   kvhal__tiering **out)
{
    *out = NULL;
    kvhal__tiering *t = kvhal__calloc(1, sizeof *t);
    if (!t) return kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory for the tiers");
    t->policy = cfg->policy;
    t->total = total_pages;
    t->page_size = page_size;
    t->root = kvhal_kv_root_hash(page_size);
    const size_t n = (size_t)total_pages, ps = (size_t)page_size;
    t->hash = kvhal__malloc(n * sizeof *t->hash);
    t->parent = kvhal__malloc(n * sizeof *t->parent);
    t->tokens = kvhal__malloc(n * ps * sizeof *t->tokens);
    t->wb_pages = kvhal__malloc(n * sizeof *t->wb_pages);
    t->wb_hash = kvhal__malloc(n * sizeof *t->wb_hash);
    t->wb_parent = kvhal__malloc(n * sizeof *t->wb_parent);
    t->wb_tokens = kvhal__malloc(n * ps * sizeof *t->wb_tokens);
    kvhal_status st = KVHAL_OK;
    if (!t->hash || !t->parent || !t->tokens || !t->wb_pages || !t->wb_hash || !t->wb_parent ||
        !t->wb_tokens)
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "cache manager: no memory for the page map of %d pages",
                        (int)total_pages);
    if (st == KVHAL_OK) { /* written now, so that eviction never pays for first-touch page faults */
        memset(t->hash, 0, n * sizeof *t->hash);
        memset(t->parent, 0, n * sizeof *t->parent);
        memset(t->tokens, 0, n * ps * sizeof *t->tokens);
        memset(t->wb_pages, 0, n * sizeof *t->wb_pages);
        memset(t->wb_hash, 0, n * sizeof *t->wb_hash);
        memset(t->wb_parent, 0, n * sizeof *t->wb_parent);
        memset(t->wb_tokens, 0, n * ps * sizeof *t->wb_tokens);
    }
    if (st == KVHAL_OK && cfg->event_capacity) st = kvhal__kv_events_create(cfg->event_capacity, page_size, &t->ev);
    if (st == KVHAL_OK)
        st = kvhal__host_tier_create(cfg->cache, cfg->host_budget, cfg->stream, page_size, t->ev, &t->tier);
    if (st != KVHAL_OK) {
        kvhal__tiering_destroy(t);
        return st;
    }
    *out = t;
    return KVHAL_OK;
}

kvhal_status kvhal__tiering_inserted(kvhal__tiering *t, const int32_t *tokens, const int32_t *pages, size_t first,
                                     size_t aligned, uint64_t parent)
{
    const size_t ps = (size_t)t->page_size;
    uint64_t h = parent;
    size_t nw = 0;
    for (size_t i = 0; i < aligned; i++) {
        const uint64_t ph = h;
        h = kvhal_kv_page_hash(ph, tokens + i * ps, t->page_size);
        if (i < first) continue;
        const int32_t p = pages[i];
        t->hash[p] = h;
        t->parent[p] = ph;
        memcpy(t->tokens + (size_t)p * ps, tokens + i * ps, ps * sizeof *tokens);
        kvhal__kv_event_push(t->ev, KVHAL_KV_STORED, KVHAL_TIER_DEVICE, h, ph, p, tokens + i * ps);
        if (t->tier && t->policy == KVHAL_WRITE_THROUGH) { /* the write-back buffer is free between evictions */
            t->wb_pages[nw] = p;
            t->wb_hash[nw] = h;
            t->wb_parent[nw] = ph;
            memcpy(t->wb_tokens + nw * ps, tokens + i * ps, ps * sizeof *tokens);
            nw++;
        }
    }
    if (!nw) return KVHAL_OK;
    size_t stored;
    return t->tier->ops->store(t->tier, nw, t->wb_pages, t->wb_hash, t->wb_parent, t->wb_tokens, &stored);
}

void kvhal__tiering_evicted(kvhal__tiering *t, const int32_t *pages, size_t n)
{
    if (!t->ev && !(t->tier && t->policy == KVHAL_WRITE_BACK)) return; /* nothing to say or copy */
    const size_t ps = (size_t)t->page_size;
    for (size_t i = 0; i < n; i++) {
        const int32_t p = pages[i];
        if (p < 0 || p >= t->total) continue; /* the manager reports a bad page itself */
        kvhal__kv_event_push(t->ev, KVHAL_KV_REMOVED, KVHAL_TIER_DEVICE, t->hash[p], t->parent[p], p, NULL);
        if (!t->tier || t->policy != KVHAL_WRITE_BACK) continue;
        if (t->tier->ops->find(t->tier, t->hash[p], t->tokens + (size_t)p * ps) >= 0) continue;
        t->wb_pages[t->wb_n] = p;
        t->wb_hash[t->wb_n] = t->hash[p];
        t->wb_parent[t->wb_n] = t->parent[p];
        memcpy(t->wb_tokens + t->wb_n * ps, t->tokens + (size_t)p * ps, ps * sizeof *t->tokens);
        t->wb_n++;
    }
}

kvhal_status kvhal__tiering_evict_done(kvhal__tiering *t)
{
    const size_t n = t->wb_n;
    t->wb_n = 0;
    if (!n) return KVHAL_OK;
    size_t stored;
    /* On a failed copy the pages are lost to the host tier only: they were evicted from the device either way. */
    KVHAL_TRY(t->tier->ops->store(t->tier, n, t->wb_pages, t->wb_hash, t->wb_parent, t->wb_tokens, &stored));
    /* the freed pages go back to requests once the copies out of them are done */
    return stored ? t->tier->ops->wait(t->tier) : KVHAL_OK;
}

size_t kvhal__tiering_host_run(kvhal__tiering *t, const int32_t *tokens, size_t num_tokens, size_t first,
                               uint64_t parent, int32_t *slots, size_t cap)
{
    if (!t->tier) return 0;
    const size_t ps = (size_t)t->page_size;
    size_t n = 0;
    uint64_t h = parent;
    for (size_t i = first; (i + 1) * ps <= num_tokens; i++) {
        h = kvhal_kv_page_hash(h, tokens + i * ps, t->page_size);
        const int32_t s = t->tier->ops->find(t->tier, h, tokens + i * ps);
        if (s < 0) break;
        if (slots) {
            if (n == cap) break;
            slots[n] = s;
        }
        n++;
    }
    return n;
}

typedef struct map_check {
    const kvhal__tiering *t;
    size_t pages;
    int32_t bad;
} map_check;

/* A tree page's entry must be the one its insert wrote: its hash follows from its parent hash and tokens. */
static void check_tree_page(const int32_t *pages, size_t n, void *user)
{
    map_check *mc = user;
    const kvhal__tiering *t = mc->t;
    for (size_t i = 0; i < n && mc->bad < 0; i++) {
        const int32_t p = pages[i];
        if (p < 0 || p >= t->total ||
            kvhal_kv_page_hash(t->parent[p], t->tokens + (size_t)p * (size_t)t->page_size, t->page_size) != t->hash[p])
            mc->bad = p;
    }
    mc->pages += n;
}

kvhal_status kvhal__tiering_check(const kvhal__tiering *t, const kvhal_prefix_cache *pc)
{
    map_check mc = {t, 0, -1};
    KVHAL_TRY(kvhal__prefix_for_each_page(pc, check_tree_page, &mc));
    if (mc.bad >= 0)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: tree page %d has no consistent entry in the tier page map "
                          "(its hash does not follow from its parent hash and tokens)", (int)mc.bad);
    if (t->wb_n) return kvhal__err(KVHAL_INTEGRITY, "cache manager: %zu write-backs left pending", t->wb_n);
    return t->tier ? t->tier->ops->check(t->tier) : KVHAL_OK;
}

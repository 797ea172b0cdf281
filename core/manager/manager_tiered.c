/* manager_tiered.c — a cache manager with tiers below its device pages (kvhal_cache_manager_create_tiered): the
 * host tier's matches, load-back, the wait for its copies, its statistics and the KV events. */
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "cache_manager.h"
#include "faults.h"
#include "kv_events.h"
#include "owner.h"
#include "prefix_owned.h"
#include "tier.h"

kvhal_status kvhal_cache_manager_create_tiered(int32_t total_pages, int32_t page_size, kvhal_prefix_kind kind,
                                               const kvhal_host_tier_config *cfg, kvhal_cache_manager **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_CHECK_ARG(cfg, "cfg: NULL");
    kvhal_tensor k0;
    if (!cfg->cache) return kvhal__err(KVHAL_INVALID_ARGUMENT, "cfg.cache: NULL");
    KVHAL_TRY(kvhal_paged_cache_layer(cfg->cache, 0, &k0, NULL));
    if (k0.shape[1] != page_size)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "page_size: %d, but cfg.cache's blocks hold %lld tokens",
                          (int)page_size, (long long)k0.shape[1]);
    if (total_pages > kvhal_paged_cache_num_blocks(cfg->cache))
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "total_pages: %d, more than cfg.cache's %lld blocks",
                          (int)total_pages, (long long)kvhal_paged_cache_num_blocks(cfg->cache));
    KVHAL_CHECK_ARG(cfg->policy == KVHAL_WRITE_THROUGH || cfg->policy == KVHAL_WRITE_BACK,
                    "cfg.policy: %d is not KVHAL_WRITE_THROUGH or KVHAL_WRITE_BACK", (int)cfg->policy);
    KVHAL_CHECK_ARG(cfg->event_capacity != 1, "cfg.event_capacity: 1, must be 0 (no events) or >= 2");
    if (cfg->stream) KVHAL_TRY(kvhal__check_stream(cfg->stream, kvhal_buffer_device(k0.buffer), "cfg.stream"));
    kvhal_cache_manager *cm;
    KVHAL_TRY(kvhal_cache_manager_create(total_pages, page_size, kind, &cm));
    kvhal_status st = kvhal__tiering_create(cfg, total_pages, page_size, &cm->tiering);
    if (st != KVHAL_OK) {
        kvhal_cache_manager_destroy(cm);
        return st;
    }
    *out = cm;
    return KVHAL_OK;
}

static kvhal_status check_tiered(const kvhal_cache_manager *cm, bool need_host)
{
    KVHAL_TRY(kvhal__cm_check(cm));
    if (!cm->tiering)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "cm: not a tiered manager (kvhal_cache_manager_create_tiered)");
    if (need_host && !kvhal__tiering_tier(cm->tiering))
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "cm: has no host tier (cfg.host_budget held no page)");
    return KVHAL_OK;
}

/* Every entry point below holds cm for its whole call (owner.h): a second thread's call, or one that would run while
 * another thread's load_back holds host slots pinned, is refused with KVHAL_BUSY instead of racing. */
static kvhal_status match_tiered_body(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                      kvhal_prefix_handle *handle, size_t *device_len, size_t *host_len,
                                      int32_t *pages, size_t pages_cap)
{
    size_t len = 0;
    /* host entries whose copies completed become hits: a query, no wait */
    if (host_len) KVHAL_TRY(kvhal__cm_reap(cm, false, false));
    KVHAL_TRY(kvhal__cm_match(cm, tokens, num_tokens, handle, &len, pages, pages_cap));
    if (device_len) *device_len = len;
    if (host_len) *host_len = 0;
    if (!host_len || !cm->tiering) return KVHAL_OK;
    const size_t ps = (size_t)cm->page_size, np = len / ps;
    const uint64_t parent = np ? kvhal__tiering_page_hash(cm->tiering, pages[np - 1]) : kvhal__tiering_root(cm->tiering);
    *host_len = kvhal__tiering_host_run(cm->tiering, tokens, num_tokens, np, parent, NULL, 0) * ps;
    /* what was reported is what load_back may load: never a page past device_len + host_len */
    const size_t reported = len + *host_len;
    size_t bound;
    return kvhal__prefix_ticket_bound(cm->pc, *handle, &reported, &bound);
}

kvhal_status kvhal_cache_manager_match_tiered(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                              kvhal_prefix_handle *handle, size_t *device_len, size_t *host_len,
                                              int32_t *pages, size_t pages_cap)
{
    KVHAL_OWNED_CALL(kvhal__cm_check(cm), cm, "cm",
                     match_tiered_body(cm, tokens, num_tokens, handle, device_len, host_len, pages, pages_cap));
}

static kvhal_status load_back_body(kvhal_cache_manager *cm, kvhal_prefix_handle handle, const int32_t *tokens,
                                   size_t num_tokens, int32_t *pages, size_t pages_cap, size_t *loaded_len)
{
    KVHAL_CHECK_ARG(loaded_len, "loaded_len: NULL");
    *loaded_len = 0;
    KVHAL_CHECK_ARG(tokens || num_tokens == 0, "tokens: NULL for %zu tokens", num_tokens);
    if (!(handle >> 63))
        return kvhal__err(KVHAL_INVALID_HANDLE, "handle: 0x%016llx is not a request handle (kvhal_cache_manager_match "
                          "gives one)", (unsigned long long)handle);
    size_t matched, bound;
    int32_t last;
    KVHAL_TRY(kvhal__prefix_handle_len(cm->pc, handle, &matched));
    KVHAL_TRY(kvhal__prefix_handle_last_page(cm->pc, handle, &last));
    KVHAL_TRY(kvhal__prefix_ticket_bound(cm->pc, handle, NULL, &bound));
    if (matched > num_tokens)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "num_tokens: %zu, fewer than the %zu the handle matched",
                          num_tokens, matched);
    /* never past what the match reported (match_tiered: device_len + host_len; match: the tokens it was given),
     * whatever num_tokens: a caller may pass the whole prompt after matching all but its last token */
    if (num_tokens > bound) num_tokens = bound;
    kvhal__tiering *t = cm->tiering;
    kvhal__tier *tier = kvhal__tiering_tier(t);
    const size_t ps = (size_t)cm->page_size;
    const uint64_t parent = last >= 0 ? kvhal__tiering_page_hash(t, last) : kvhal__tiering_root(t);
    const size_t n = kvhal__tiering_host_run(t, tokens, num_tokens, matched / ps, parent, NULL, 0);
    if (n == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(pages, "pages: NULL for %zu pages", n);
    if (n > pages_cap)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "pages_cap: %zu, the host tier holds %zu pages to load", pages_cap, n);
    int32_t *slots = kvhal__malloc(n * sizeof *slots);
    if (!slots) return kvhal__err(KVHAL_OUT_OF_MEMORY, "load_back: no memory for %zu host page ids", n);
    kvhal__tiering_host_run(t, tokens, num_tokens, matched / ps, parent, slots, n);
    /* pinned: the eviction that allocation may do (and its write-backs) must not drop what is about to be read */
    for (size_t i = 0; i < n; i++) {
        tier->ops->pin(tier, slots[i], 1);
        tier->ops->touch(tier, slots[i]);
    }
    kvhal_status st = kvhal__cm_allocate(cm, (int32_t)n, pages);
    if (st == KVHAL_OK) {
        st = tier->ops->load(tier, n, slots, pages);
        if (st != KVHAL_OK) (void)kvhal__cm_free(cm, pages, (int32_t)n); /* keeps the copy's error */
    }
    for (size_t i = 0; i < n; i++) tier->ops->pin(tier, slots[i], -1);
    free(slots);
    KVHAL_TRY(st);
    *loaded_len = n * ps;
    /* loaded once: a second load_back of this request finds nothing more to load */
    return kvhal__prefix_ticket_bound(cm->pc, handle, &matched, &bound);
}

kvhal_status kvhal_cache_manager_load_back(kvhal_cache_manager *cm, kvhal_prefix_handle handle, const int32_t *tokens,
                                           size_t num_tokens, int32_t *pages, size_t pages_cap, size_t *loaded_len)
{
    KVHAL_OWNED_CALL(check_tiered(cm, true), cm, "cm",
                     load_back_body(cm, handle, tokens, num_tokens, pages, pages_cap, loaded_len));
}

static kvhal_status transfer_wait_body(kvhal_cache_manager *cm)
{
    kvhal__tier *tier = kvhal__tiering_tier(cm->tiering);
    if (!tier) return KVHAL_OK;
    /* copies out pending: the wait also frees the drained pages and validates the host entries */
    if (kvhal__tiering_busy(cm->tiering)) return kvhal__cm_reap(cm, true, true);
    return tier->ops->wait(tier);
}

kvhal_status kvhal_cache_manager_transfer_wait(kvhal_cache_manager *cm)
{
    KVHAL_OWNED_CALL(check_tiered(cm, false), cm, "cm", transfer_wait_body(cm));
}

static kvhal_status transfer_query_body(kvhal_cache_manager *cm)
{
    kvhal__tier *tier = kvhal__tiering_tier(cm->tiering);
    if (!tier) return KVHAL_OK;
    if (kvhal__tiering_busy(cm->tiering)) {
        KVHAL_TRY(kvhal__cm_reap(cm, false, true));
        if (kvhal__tiering_busy(cm->tiering)) return KVHAL_BUSY;
    }
    return tier->ops->query(tier);
}

kvhal_status kvhal_cache_manager_transfer_query(kvhal_cache_manager *cm)
{
    KVHAL_OWNED_CALL(check_tiered(cm, false), cm, "cm", transfer_query_body(cm));
}

static kvhal_status tier_stats_body(const kvhal_cache_manager *cm, kvhal_host_tier_stats *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    memset(out, 0, sizeof *out);
    kvhal__tier *tier = kvhal__tiering_tier(cm->tiering);
    if (tier) tier->ops->stats(tier, out);
    out->events_dropped = kvhal__kv_events_dropped(kvhal__tiering_events(cm->tiering));
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_tier_stats(const kvhal_cache_manager *cm, kvhal_host_tier_stats *out)
{
    KVHAL_OWNED_CALL(check_tiered(cm, false), (kvhal_cache_manager *)cm, "cm", tier_stats_body(cm, out));
}

static kvhal_status write_failures_body(const kvhal_cache_manager *cm, uint64_t *pages)
{
    KVHAL_CHECK_ARG(pages, "pages: NULL");
    *pages = kvhal__tiering_write_failures(cm->tiering);
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_tier_write_failures(const kvhal_cache_manager *cm, uint64_t *pages)
{
    KVHAL_OWNED_CALL(check_tiered(cm, false), (kvhal_cache_manager *)cm, "cm", write_failures_body(cm, pages));
}

static kvhal_status events_read_body(kvhal_cache_manager *cm, kvhal_kv_event *out, int32_t *tokens, size_t cap,
                                     size_t *n)
{
    KVHAL_CHECK_ARG(n, "n: NULL");
    *n = 0;
    kvhal__kv_events *ev = kvhal__tiering_events(cm->tiering);
    if (!ev) return kvhal__err(KVHAL_INVALID_ARGUMENT, "cm: created without events (cfg.event_capacity 0)");
    KVHAL_CHECK_ARG(cap == 0 || (out && tokens), "out, tokens: NULL with cap %zu", cap);
    *n = kvhal__kv_events_read(ev, out, tokens, cap);
    return KVHAL_OK;
}

kvhal_status kvhal_cache_manager_events_read(kvhal_cache_manager *cm, kvhal_kv_event *out, int32_t *tokens,
                                             size_t cap, size_t *n)
{
    KVHAL_OWNED_CALL(check_tiered(cm, false), cm, "cm", events_read_body(cm, out, tokens, cap, n));
}

static kvhal_status host_tier_clear_body(kvhal_cache_manager *cm)
{
    kvhal__tier *tier = kvhal__tiering_tier(cm->tiering);
    KVHAL_TRY(kvhal__cm_reap(cm, true, true)); /* the drained pages go free; every entry valid, then dropped */
    return tier->ops->clear(tier);
}

kvhal_status kvhal_cache_manager_host_tier_clear(kvhal_cache_manager *cm)
{
    KVHAL_OWNED_CALL(check_tiered(cm, true), cm, "cm", host_tier_clear_body(cm));
}

/* tiering.c — a tiered cache manager's side of the tiers (tier.h): the map from every device page of the prefix
 * tree to its chain hash, parent hash and tokens, the write policy, the event queue, and the host-run lookup
 * behind match_tiered and load_back. The radix tree knows nothing of it: pages enter the map when a finished
 * request's pages enter the tree and leave it when eviction hands them back. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "faults.h"
#include "host_tier.h"
#include "kv_events.h"
#include "prefix_pages.h"
#include "tier.h"
#include "tiering.h"

typedef struct kvhal__page_run {
    int32_t first, step, len; /* pages first, first + step, ... (len of them; step >= 1) */
} kvhal__page_run;

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
    /* copies out of device pages in flight (or complete but not reaped yet): a bit per page and the list of those
     * pages. Eviction reads the bits a word at a time (kvhal__tiering_copy_bits): the pages it evicts that are
     * flagged drain (the manager keeps them from requests until a reap hands them back) */
    uint64_t *copying;
    int32_t *out_list;
    size_t out_n;
    bool busy;               /* copies enqueued since the last reap */
    /* write-back: evicted pages queued for their copy (draining already; their page-map entries stay valid, as
     * the pages are nobody's until reaped), as runs (first, step, length: a leaf's pages are few runs, a page size 1
     * leaf of thousands of pages often one), in eviction order; the next reap stores them (flush), so eviction
     * costs a run append per run */
    uint64_t *queued;        /* scratch of check_drain: a bit per queued page */
    kvhal__page_run *q_runs; /* up to one per page */
    int32_t *done;
    size_t q_n, q_pages;
    kvhal__tier *tier;       /* NULL: no host tier (events only) */
    kvhal__kv_events *ev;
    uint64_t write_failures; /* pages whose copy to the tier failed: device-only, as if the tier had no room */
};

kvhal__tier *kvhal__tiering_tier(kvhal__tiering *t) { return t->tier; }
kvhal__kv_events *kvhal__tiering_events(kvhal__tiering *t) { return t->ev; }
uint64_t kvhal__tiering_root(const kvhal__tiering *t) { return t->root; }
uint64_t kvhal__tiering_page_hash(const kvhal__tiering *t, int32_t page) { return t->hash[page]; }
uint64_t kvhal__tiering_write_failures(const kvhal__tiering *t) { return t->write_failures; }

/* A store of n pages failed (its status st; the tier kept nothing of it): the pages stay device-only. */
static void store_failed(kvhal__tiering *t, size_t n, kvhal_status st, const char *why)
{
    t->write_failures += n;
    kvhal__log(KVHAL_LOG_WARN, "host tier: the %s copy of %zu device pages failed (%s: %s); they stay on the device "
               "only", why, n, kvhal_status_name(st), kvhal_last_error());
}

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
    free(t->copying);
    free(t->out_list);
    free(t->queued);
    free(t->q_runs);
    free(t->done);
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
    t->copying = kvhal__malloc((n + 63) / 64 * sizeof *t->copying);
    t->out_list = kvhal__malloc(n * sizeof *t->out_list);
    t->queued = kvhal__calloc((n + 63) / 64, sizeof *t->queued);
    t->q_runs = kvhal__malloc(n * sizeof *t->q_runs);
    t->done = kvhal__malloc(n * sizeof *t->done);
    kvhal_status st = KVHAL_OK;
    if (!t->hash || !t->parent || !t->tokens || !t->wb_pages || !t->wb_hash || !t->wb_parent ||
        !t->wb_tokens || !t->copying || !t->out_list ||
        !t->queued || !t->q_runs || !t->done)
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
        memset(t->copying, 0, (n + 63) / 64 * sizeof *t->copying); /* eviction reads it */
        memset(t->out_list, 0, n * sizeof *t->out_list);
        memset(t->q_runs, 0, n * sizeof *t->q_runs);
        memset(t->done, 0, n * sizeof *t->done);
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

static inline bool copying(const kvhal__tiering *t, int32_t p) { return (t->copying[p >> 6] >> (p & 63)) & 1; }

bool kvhal__tiering_copying(const kvhal__tiering *t, int32_t p)
{
    return p >= 0 && p < t->total && copying(t, p);
}

bool kvhal__tiering_busy(const kvhal__tiering *t) { return t->busy || t->q_n; }

bool kvhal__tiering_queues_all(const kvhal__tiering *t) { return t->tier && t->policy == KVHAL_WRITE_BACK; }

kvhal_status kvhal__tiering_check_drain(const kvhal__tiering *t, const uint64_t *drain_bits)
{
    const size_t nw = ((size_t)t->total + 63) / 64;
    uint64_t *q = t->queued;
    memset(q, 0, nw * sizeof *q);
    size_t seen = 0;
    for (size_t r = 0; r < t->q_n; r++) {
        const kvhal__page_run run = t->q_runs[r];
        if (run.len < 1 || run.step < 1)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: write-back run %zu has length %d, step %d", r,
                              (int)run.len, (int)run.step);
        for (int64_t i = 0, p = run.first; i < run.len; i++, p += run.step, seen++)
            if (p < 0 || p >= t->total || ((q[p >> 6] >> (p & 63)) & 1) || !((drain_bits[p >> 6] >> (p & 63)) & 1) ||
                copying(t, (int32_t)p))
                return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %lld queued for write-back is out of range, "
                                  "queued twice, not draining or already copying", (long long)p);
            else
                q[p >> 6] |= 1ull << (p & 63);
    }
    if (seen != t->q_pages)
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %zu pages in the write-back runs, a count of %zu", seen,
                          t->q_pages);
    for (size_t w = 0; w < nw; w++) {
        const uint64_t lost = drain_bits[w] & ~(q[w] | t->copying[w]);
        if (lost)
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %zu is draining with no copy out of it in flight "
                              "or queued", (w << 6) + (size_t)__builtin_ctzll(lost));
    }
    return KVHAL_OK;
}

const uint64_t *kvhal__tiering_copy_bits(const kvhal__tiering *t) { return t->out_n ? t->copying : NULL; }

/* The tier enqueued copies out of pages[0..n): each is copying until the next reap. */
static void note_copies(kvhal__tiering *t, const int32_t *pages, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const int32_t p = pages[i];
        if (!copying(t, p)) {
            t->copying[p >> 6] |= 1ull << (p & 63);
            t->out_list[t->out_n++] = p;
        }
    }
    if (n) t->busy = true;
}

void kvhal__tiering_inserted(kvhal__tiering *t, const int32_t *tokens, const int32_t *pages, size_t first,
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
    if (!nw) return;
    size_t stored = 0;
    /* the copied pages' ids land in wb_hash's memory, free between evictions like the rest of the buffer */
    int32_t *copied = (int32_t *)t->wb_hash;
    const kvhal_status st =
        t->tier->ops->store(t->tier, nw, t->wb_pages, t->wb_hash, t->wb_parent, t->wb_tokens, &stored, copied);
    if (st != KVHAL_OK) { /* the request's pages are the tree's already: the finish stands without host copies */
        store_failed(t, nw, st, "write-through");
        return;
    }
    note_copies(t, copied, stored);
}

void kvhal__tiering_evicted(kvhal__tiering *t, const int32_t *pages, size_t n)
{
    /* write-back queues its pages through kvhal__tiering_queue (the manager knows the runs); write-through pages
     * whose copy out is flagged drain (the manager reads kvhal__tiering_copy_bits by words) */
    /* pages past the map are skipped: the manager reports a bad page itself */
    kvhal__kv_events_push_removed(t->ev, KVHAL_TIER_DEVICE, pages, n, t->hash, t->parent, (uint32_t)t->total);
}

void kvhal__tiering_queue(kvhal__tiering *t, int32_t first, int32_t step, int32_t len)
{
    t->q_pages += (size_t)len;
    if (t->q_n) { /* a run that continues the last one (the next leaf's pages, allocated after it) extends it */
        kvhal__page_run *last = &t->q_runs[t->q_n - 1];
        const int64_t s = last->len > 1 ? last->step : len > 1 ? step : (int64_t)first - last->first;
        if (s >= 1 && (len == 1 || step == s) && (int64_t)last->first + (int64_t)last->len * s == first) {
            last->step = (int32_t)s;
            last->len += len;
            return;
        }
    }
    t->q_runs[t->q_n++] = (kvhal__page_run){first, step, len};
}

/* The queued write-backs go to the tier (one lookup each: pages it holds are touched, not copied): the pages
 * copied start copying; the others (held already, no room, or a failed store: lost to the host tier only, as
 * they left the device either way; counted in write_failures) are done at once, appended to done[*nd]. */
static void flush(kvhal__tiering *t, const uint64_t *drain_bits, size_t *nd)
{
    const size_t ps = (size_t)t->page_size;
    size_t n = 0;
    for (size_t r = 0; r < t->q_n; r++) {
        const kvhal__page_run run = t->q_runs[r];
        for (int32_t j = 0, p = run.first; j < run.len; j++, p += run.step) {
            /* the manager drained every queued page: a page that does not drain has nothing to write back */
            if (!((drain_bits[p >> 6] >> (p & 63)) & 1)) continue;
            const size_t i = n++;
            t->wb_pages[i] = p;
            t->wb_hash[i] = t->hash[p];
            t->wb_parent[i] = t->parent[p];
            memcpy(t->wb_tokens + i * ps, t->tokens + (size_t)p * ps, ps * sizeof *t->tokens);
        }
    }
    t->q_n = t->q_pages = 0;
    size_t stored = 0;
    int32_t *copied = (int32_t *)t->q_runs; /* free now (n int32 fit); store writes it after reading its inputs */
    const kvhal_status st =
        t->tier->ops->store(t->tier, n, t->wb_pages, t->wb_hash, t->wb_parent, t->wb_tokens, &stored, copied);
    if (st != KVHAL_OK) {
        stored = 0;
        store_failed(t, n, st, "write-back");
    }
    note_copies(t, copied, stored);
    for (size_t i = 0; i < n; i++)
        if (!copying(t, t->wb_pages[i])) t->done[(*nd)++] = t->wb_pages[i];
}

kvhal_status kvhal__tiering_reap(kvhal__tiering *t, bool wait, bool store, const uint64_t *drain_bits,
                                 int32_t ndrain, const int32_t **done, size_t *n)
{
    *done = t->done;
    *n = 0;
    if (t->q_n && store) flush(t, drain_bits, n);
    /* no copy out in flight (the stores copied nothing: every page held already, or a store that failed): a wait
     * still covers the tier's other copies, load_back's among them */
    if (!t->busy) return wait ? t->tier->ops->wait(t->tier) : KVHAL_OK;
    const kvhal_status q = wait ? t->tier->ops->wait(t->tier) : t->tier->ops->query(t->tier);
    if (q == KVHAL_BUSY) return KVHAL_OK;
    if (q != KVHAL_OK) return q;
    t->tier->ops->complete(t->tier);
    /* write-through copies of a whole batch of requests complete together: their pages are listed only where some
     * drain (ndrain: the manager's count), and the bits cleared by words once there are many */
    const size_t nw = ((size_t)t->total + 63) / 64;
    if (t->out_n > nw) memset(t->copying, 0, nw * sizeof *t->copying);
    else
        for (size_t i = 0; i < t->out_n; i++) t->copying[t->out_list[i] >> 6] &= ~(1ull << (t->out_list[i] & 63));
    if (ndrain)
        for (size_t i = 0; i < t->out_n; i++) {
            const int32_t p = t->out_list[i];
            if ((drain_bits[p >> 6] >> (p & 63)) & 1) t->done[(*n)++] = p;
        }
    t->out_n = 0;
    t->busy = false;
    return KVHAL_OK;
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
        const int32_t s = t->tier->ops->find(t->tier, h, tokens + i * ps, false);
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
    size_t nbits = 0;
    for (size_t w = 0; w < ((size_t)t->total + 63) / 64; w++) nbits += (size_t)__builtin_popcountll(t->copying[w]);
    if (nbits != t->out_n || (t->out_n && !t->busy))
        return kvhal__err(KVHAL_INTEGRITY, "cache manager: %zu pages flagged as copied out, %zu listed%s", nbits,
                          t->out_n, t->busy ? "" : " with no copy in flight");
    for (size_t i = 0; i < t->out_n; i++)
        if (!kvhal__tiering_copying(t, t->out_list[i]))
            return kvhal__err(KVHAL_INTEGRITY, "cache manager: page %d listed as copied out but not flagged",
                              (int)t->out_list[i]);
    return t->tier ? t->tier->ops->check(t->tier) : KVHAL_OK;
}

/* host_tier.c — the host tier: a pool of host pages (kvhal_host_memory of the cache's device: pinned where the
 * backend pins) each holding one whole device page, found by chain hash through an open-addressing table, kept in
 * LRU order (a doubly linked list, most recent at the head), filled and read with kvhal_paged_cache_transfer on
 * one stream. Implements the tier interface of tier.h.
 * An entry is pending from the store that enqueues its copy until complete() (the manager saw the stream finish):
 * pending entries are found for deduplication (find with any) but never as hits, and their stored event is queued
 * when they become valid. A pending entry may still be dropped to make room: its slot is rewritten by a later copy
 * on the same stream, after the one in flight. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "faults.h"
#include "host_tier.h"
#include "kv_events.h"
#include "tier.h"

typedef struct host_tier {
    kvhal__tier base;
    kvhal_paged_cache *cache;
    kvhal_host_memory *mem;
    kvhal_stream *stream; /* NULL: the device's default stream */
    kvhal_device dev;
    bool own_stream;
    kvhal__kv_events *ev;
    int32_t cap, used, page_size;
    uint64_t *hash, *parent;
    int32_t *tokens;     /* page_size per slot */
    int32_t *prev, *next; /* LRU list of used slots (head: most recent); next links the free slots */
    int32_t *pins;
    uint8_t *pending;    /* 1: the copy into this slot is not known complete */
    int32_t *pend, *pend_pos; /* the pending slots (pend_n of them) and each one's index there */
    int32_t pend_n;
    int32_t head, tail, free_head;
    int32_t npinned;     /* slots with pins > 0 */
    int32_t *table;      /* slot + 1 per bucket, 0 empty; linear probing, deletion by backward shift */
    size_t tmask;
    int64_t *pairs;      /* 2 * cap: one transfer's (device page, host page) */
    kvhal_host_tier_stats st;
} host_tier;

static size_t bucket_of(const host_tier *h, uint64_t hash) { return (size_t)(hash ^ (hash >> 29)) & h->tmask; }

static void lru_unlink(host_tier *h, int32_t s)
{
    if (h->prev[s] >= 0) h->next[h->prev[s]] = h->next[s];
    else h->head = h->next[s];
    if (h->next[s] >= 0) h->prev[h->next[s]] = h->prev[s];
    else h->tail = h->prev[s];
}

static void lru_push_front(host_tier *h, int32_t s)
{
    h->prev[s] = -1;
    h->next[s] = h->head;
    if (h->head >= 0) h->prev[h->head] = s;
    h->head = s;
    if (h->tail < 0) h->tail = s;
}

static int32_t ht_find(kvhal__tier *t, uint64_t hash, const int32_t *tokens, bool any)
{
    host_tier *h = (host_tier *)t;
    for (size_t b = bucket_of(h, hash);; b = (b + 1) & h->tmask) {
        const int32_t e = h->table[b];
        if (!e) return -1;
        const int32_t s = e - 1;
        if (h->hash[s] == hash &&
            !memcmp(h->tokens + (size_t)s * (size_t)h->page_size, tokens, (size_t)h->page_size * sizeof *tokens))
            return any || !h->pending[s] ? s : -1;
    }
}

static void pend_remove(host_tier *h, int32_t s)
{
    const int32_t i = h->pend_pos[s], last = h->pend[--h->pend_n];
    h->pend[i] = last;
    h->pend_pos[last] = i;
    h->pending[s] = 0;
}

static void ht_touch(kvhal__tier *t, int32_t s)
{
    host_tier *h = (host_tier *)t;
    if (h->head == s) return;
    lru_unlink(h, s);
    lru_push_front(h, s);
}

static void table_insert(host_tier *h, int32_t s)
{
    size_t b = bucket_of(h, h->hash[s]);
    while (h->table[b]) b = (b + 1) & h->tmask;
    h->table[b] = s + 1;
}

static void table_erase(host_tier *h, int32_t s)
{
    size_t b = bucket_of(h, h->hash[s]);
    while (h->table[b] != s + 1) b = (b + 1) & h->tmask;
    /* backward shift: move later entries of the cluster up into the hole when their home allows it */
    size_t hole = b;
    for (size_t j = (b + 1) & h->tmask; h->table[j]; j = (j + 1) & h->tmask) {
        const size_t home = bucket_of(h, h->hash[h->table[j] - 1]);
        /* j's entry may move to hole when home is not in (hole, j] cyclically */
        const bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            h->table[hole] = h->table[j];
            hole = j;
        }
    }
    h->table[hole] = 0;
}

/* Takes used slot s out of the table and the LRU list onto the free list. */
static void release_slot(host_tier *h, int32_t s)
{
    table_erase(h, s);
    lru_unlink(h, s);
    h->next[s] = h->free_head;
    h->prev[s] = -2;
    h->free_head = s;
    h->used--;
}

/* Drops slot s: a removed event (none for a pending entry: its stored event never went out), then the slot is
 * free. */
static void drop_slot(host_tier *h, int32_t s)
{
    if (h->pending[s]) pend_remove(h, s);
    else kvhal__kv_event_push(h->ev, KVHAL_KV_REMOVED, KVHAL_TIER_HOST, h->hash[s], 0, s, NULL);
    release_slot(h, s);
}

static kvhal_status ht_store(kvhal__tier *t, size_t n, const int32_t *dev_pages, const uint64_t *hashes,
                             const uint64_t *parents, const int32_t *tokens, size_t *stored, int32_t *copied)
{
    host_tier *h = (host_tier *)t;
    const size_t ps = (size_t)h->page_size;
    size_t np = 0;
    *stored = 0;
    /* the last cap pages at most (earlier ones of a longer batch would be dropped again by later ones) */
    size_t from = 0, room = (size_t)(h->cap - h->npinned);
    if (n > room) from = n - room;
    for (size_t i = from; i < n; i++) {
        const int32_t have = ht_find(t, hashes[i], tokens + i * ps, true);
        if (have >= 0) {
            ht_touch(t, have);
            continue;
        }
        int32_t s = h->free_head;
        if (s < 0) { /* the least recently used unpinned entry goes */
            s = h->tail;
            while (s >= 0 && h->pins[s] > 0) s = h->prev[s];
            if (s < 0) break; /* everything pinned: the rest stays uncached */
            drop_slot(h, s);
            h->st.host_evictions++;
            s = h->free_head;
        }
        h->free_head = h->next[s];
        h->hash[s] = hashes[i];
        h->parent[s] = parents[i];
        memcpy(h->tokens + (size_t)s * ps, tokens + i * ps, ps * sizeof *tokens);
        table_insert(h, s);
        lru_push_front(h, s);
        h->used++;
        h->pending[s] = 1;
        h->pend_pos[s] = h->pend_n;
        h->pend[h->pend_n++] = s;
        h->pairs[2 * np] = dev_pages[i];
        h->pairs[2 * np + 1] = s;
        np++;
    }
    if (!np) return KVHAL_OK;
    kvhal_status st = kvhal_paged_cache_transfer(h->cache, h->mem, h->pairs, (int32_t)np, KVHAL_TO_HOST, h->stream);
    if (st != KVHAL_OK) { /* nothing of this call is kept: the new entries go again */
        for (size_t i = 0; i < np; i++) drop_slot(h, (int32_t)h->pairs[2 * i + 1]);
        return st;
    }
    h->st.pages_written += np;
    for (size_t i = 0; i < np; i++) copied[i] = (int32_t)h->pairs[2 * i];
    *stored = np;
    return KVHAL_OK;
}

static kvhal_status ht_load(kvhal__tier *t, size_t n, const int32_t *slots, const int32_t *dev_pages)
{
    host_tier *h = (host_tier *)t;
    if (!n) return KVHAL_OK;
    for (size_t i = 0; i < n; i++) {
        h->pairs[2 * i] = dev_pages[i];
        h->pairs[2 * i + 1] = slots[i];
    }
    KVHAL_TRY(kvhal_paged_cache_transfer(h->cache, h->mem, h->pairs, (int32_t)n, KVHAL_TO_DEVICE, h->stream));
    h->st.pages_loaded += n;
    return KVHAL_OK;
}

static void ht_pin(kvhal__tier *t, int32_t s, int delta)
{
    host_tier *h = (host_tier *)t;
    const bool was = h->pins[s] > 0;
    h->pins[s] += delta;
    h->npinned += (h->pins[s] > 0) - was;
}

static kvhal_status ht_wait(kvhal__tier *t)
{
    host_tier *h = (host_tier *)t;
    if (h->stream) return kvhal_stream_synchronize(h->stream);
    return kvhal_device_synchronize(h->dev);
}

/* The copies enqueued so far are complete: every pending entry becomes valid (a stored event each). */
static void ht_complete(kvhal__tier *t)
{
    host_tier *h = (host_tier *)t;
    const size_t ps = (size_t)h->page_size;
    for (int32_t i = 0; i < h->pend_n; i++) h->pending[h->pend[i]] = 0;
    if (h->ev)
        for (int32_t i = 0; i < h->pend_n; i++) {
            const int32_t s = h->pend[i];
            kvhal__kv_event_push(h->ev, KVHAL_KV_STORED, KVHAL_TIER_HOST, h->hash[s], h->parent[s], s,
                                 h->tokens + (size_t)s * ps);
        }
    h->pend_n = 0;
}

static kvhal_status ht_query(kvhal__tier *t)
{
    host_tier *h = (host_tier *)t;
    if (kvhal__streams_held()) return KVHAL_BUSY; /* test hook (also where there is no stream to poll) */
    if (h->stream) return kvhal_stream_query(h->stream);
    return kvhal_device_synchronize(h->dev); /* no stream to poll: wait */
}

static kvhal_status ht_clear(kvhal__tier *t)
{
    host_tier *h = (host_tier *)t;
    KVHAL_TRY(ht_wait(t));
    while (h->head >= 0) {
        if (h->pending[h->head]) pend_remove(h, h->head);
        release_slot(h, h->head);
    }
    kvhal__kv_event_push(h->ev, KVHAL_KV_CLEARED, KVHAL_TIER_HOST, 0, 0, -1, NULL);
    return KVHAL_OK;
}

static kvhal_status ht_check(const kvhal__tier *t)
{
    const host_tier *h = (const host_tier *)t;
    int32_t n = 0, last = -1;
    for (int32_t s = h->head; s >= 0; s = h->next[s]) {
        if (s >= h->cap || h->prev[s] != last || ++n > h->cap)
            return kvhal__err(KVHAL_INTEGRITY, "host tier: LRU list broken at slot %d", (int)s);
        if (ht_find((kvhal__tier *)t, h->hash[s], h->tokens + (size_t)s * (size_t)h->page_size, true) != s)
            return kvhal__err(KVHAL_INTEGRITY, "host tier: slot %d is not found under its hash", (int)s);
        if (h->pins[s] != 0) return kvhal__err(KVHAL_INTEGRITY, "host tier: slot %d pinned between calls", (int)s);
        last = s;
    }
    int32_t npend = 0;
    for (int32_t s = 0; s < h->cap; s++) npend += h->pending[s] != 0;
    if (npend != h->pend_n || h->pend_n > h->used)
        return kvhal__err(KVHAL_INTEGRITY, "host tier: %d slots flagged pending, %d listed", (int)npend, (int)h->pend_n);
    for (int32_t i = 0; i < h->pend_n; i++)
        if (h->pend[i] < 0 || h->pend[i] >= h->cap || !h->pending[h->pend[i]] || h->pend_pos[h->pend[i]] != i ||
            h->prev[h->pend[i]] == -2)
            return kvhal__err(KVHAL_INTEGRITY, "host tier: pending list entry %d (slot %d) is not a pending used slot",
                              (int)i, (int)h->pend[i]);
    if (h->npinned != 0) return kvhal__err(KVHAL_INTEGRITY, "host tier: %d slots pinned between calls", (int)h->npinned);
    if (last != h->tail || n != h->used)
        return kvhal__err(KVHAL_INTEGRITY, "host tier: %d entries listed, %d counted", (int)n, (int)h->used);
    int32_t nfree = 0;
    for (int32_t s = h->free_head; s >= 0 && nfree <= h->cap; s = h->next[s]) nfree++;
    size_t in_table = 0;
    for (size_t b = 0; b <= h->tmask; b++) in_table += h->table[b] != 0;
    if (nfree + h->used != h->cap || in_table != (size_t)h->used)
        return kvhal__err(KVHAL_INTEGRITY, "host tier: %d free + %d used != %d slots (%zu in the table)", (int)nfree,
                          (int)h->used, (int)h->cap, in_table);
    return KVHAL_OK;
}

static void ht_stats(const kvhal__tier *t, kvhal_host_tier_stats *out)
{
    const host_tier *h = (const host_tier *)t;
    *out = h->st;
    out->host_pages_total = h->cap;
    out->host_pages_used = h->used - h->pend_n; /* valid entries: pending ones are not hits yet */
}

static void ht_destroy(kvhal__tier *t)
{
    host_tier *h = (host_tier *)t;
    if (!h) return;
    if (h->stream) (void)kvhal_stream_synchronize(h->stream);
    if (h->own_stream) kvhal_stream_destroy(h->stream);
    kvhal_host_memory_destroy(h->mem);
    free(h->hash);
    free(h->parent);
    free(h->tokens);
    free(h->prev);
    free(h->next);
    free(h->pins);
    free(h->pending);
    free(h->pend);
    free(h->pend_pos);
    free(h->table);
    free(h->pairs);
    free(h);
}

static const kvhal__tier_ops host_tier_ops = {
    .name = "host",
    .find = ht_find,
    .touch = ht_touch,
    .store = ht_store,
    .load = ht_load,
    .pin = ht_pin,
    .clear = ht_clear,
    .wait = ht_wait,
    .query = ht_query,
    .complete = ht_complete,
    .check = ht_check,
    .stats = ht_stats,
    .destroy = ht_destroy,
};

kvhal_status kvhal__host_tier_create(kvhal_paged_cache *cache, uint64_t host_budget, kvhal_stream *stream,
                                     int32_t page_size, kvhal__kv_events *ev, kvhal__tier **out)
{
    *out = NULL;
    const size_t page = kvhal_paged_cache_host_page_bytes(cache);
    const uint64_t pages = page ? host_budget / page : 0;
    if (pages == 0) return KVHAL_OK;
    if (pages > INT32_MAX / 2)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "cfg.host_budget: %llu bytes make %llu host pages, more than %d",
                          (unsigned long long)host_budget, (unsigned long long)pages, INT32_MAX / 2);
    host_tier *h = kvhal__calloc(1, sizeof *h);
    if (!h) return kvhal__err(KVHAL_OUT_OF_MEMORY, "host tier: no memory for the tier");
    h->base.ops = &host_tier_ops;
    h->cache = cache;
    h->ev = ev;
    h->cap = (int32_t)pages;
    h->page_size = page_size;
    size_t tsize = 16;
    while (tsize < 2 * (size_t)pages) tsize *= 2;
    h->tmask = tsize - 1;
    const size_t n = (size_t)pages;
    h->hash = kvhal__malloc(n * sizeof *h->hash);
    h->parent = kvhal__malloc(n * sizeof *h->parent);
    h->tokens = kvhal__malloc(n * (size_t)page_size * sizeof *h->tokens);
    h->prev = kvhal__malloc(n * sizeof *h->prev);
    h->next = kvhal__malloc(n * sizeof *h->next);
    h->pins = kvhal__calloc(n, sizeof *h->pins);
    h->pending = kvhal__calloc(n, sizeof *h->pending);
    h->pend = kvhal__calloc(n, sizeof *h->pend);
    h->pend_pos = kvhal__calloc(n, sizeof *h->pend_pos);
    h->table = kvhal__calloc(tsize, sizeof *h->table);
    h->pairs = kvhal__malloc(2 * n * sizeof *h->pairs);
    kvhal_status st = KVHAL_OK;
    if (!h->hash || !h->parent || !h->tokens || !h->prev || !h->next || !h->pins || !h->pending || !h->pend || !h->pend_pos || !h->table || !h->pairs)
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "cfg.host_budget: no memory for the bookkeeping of %d host pages",
                        (int)h->cap);
    if (st == KVHAL_OK) { /* written now, so that no later call pays for first-touch page faults */
        memset(h->hash, 0, n * sizeof *h->hash);
        memset(h->parent, 0, n * sizeof *h->parent);
        memset(h->tokens, 0, n * (size_t)page_size * sizeof *h->tokens);
        memset(h->pins, 0, n * sizeof *h->pins);
        memset(h->table, 0, tsize * sizeof *h->table);
        memset(h->pairs, 0, 2 * n * sizeof *h->pairs);
    }
    kvhal_tensor k0;
    if (st == KVHAL_OK) st = kvhal_paged_cache_layer(cache, 0, &k0, NULL);
    const kvhal_device dev = st == KVHAL_OK ? kvhal_buffer_device(k0.buffer) : (kvhal_device){KVHAL_DEVICE_CPU, 0};
    h->dev = dev;
    if (st == KVHAL_OK) st = kvhal_host_memory_create(dev, (size_t)pages * page, &h->mem);
    /* the host pages touched now, so that the copies of eviction never pay for first-touch page faults (plain
     * memory of the cpu and opencl devices; pinned memory is resident already and this costs one pass over it) */
    if (st == KVHAL_OK) memset(kvhal_host_memory_ptr(h->mem), 0, (size_t)pages * page);
    if (st == KVHAL_OK && stream) {
        h->stream = stream;
    } else if (st == KVHAL_OK) {
        kvhal_status s2 = kvhal_stream_create(dev, &h->stream);
        if (s2 == KVHAL_OK) h->own_stream = true;
        else if (s2 == KVHAL_UNSUPPORTED) h->stream = NULL; /* the default stream */
        else st = s2;
    }
    if (st != KVHAL_OK) {
        ht_destroy(&h->base);
        return st;
    }
    h->head = h->tail = -1;
    h->free_head = 0;
    for (int32_t s = 0; s < h->cap; s++) {
        h->next[s] = s + 1 < h->cap ? s + 1 : -1;
        h->prev[s] = -2;
    }
    *out = &h->base;
    return KVHAL_OK;
}

/* kv_events.c — the page hash chain and the bounded KV event queue. The queue is a ring of events with page_size
 * tokens each; when it fills, its last entry becomes an overflow event that counts every event lost after it, so a
 * consumer always learns that it missed something (and must resynchronise) instead of silently diverging. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "faults.h"
#include "kv_events.h"

static inline uint64_t splitmix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t kvhal_kv_root_hash(int32_t page_size)
{
    return splitmix64(KVHAL_KV_HASH_SEED ^ (uint64_t)(uint32_t)page_size);
}

uint64_t kvhal_kv_page_hash(uint64_t parent, const int32_t *tokens, int32_t page_size)
{
    uint64_t h = parent;
    for (int32_t i = 0; tokens && i < page_size; i++) h = splitmix64(h ^ (uint64_t)(uint32_t)tokens[i]);
    return splitmix64(h ^ ((uint64_t)(uint32_t)page_size << 32));
}

struct kvhal__kv_events {
    kvhal_kv_event *ring;
    int32_t *tokens; /* page_size per ring entry */
    uint32_t cap, head, count;
    int32_t page_size;
    uint64_t dropped;
};

kvhal_status kvhal__kv_events_create(uint32_t capacity, int32_t page_size, kvhal__kv_events **out)
{
    *out = NULL;
    kvhal__kv_events *ev = kvhal__calloc(1, sizeof *ev);
    if (ev) {
        ev->ring = kvhal__malloc((size_t)capacity * sizeof *ev->ring);
        ev->tokens = kvhal__malloc((size_t)capacity * (size_t)page_size * sizeof *ev->tokens);
    }
    if (!ev || !ev->ring || !ev->tokens) {
        kvhal__kv_events_destroy(ev);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "cfg.event_capacity: no host memory for %u events", capacity);
    }
    /* written now, so that the events of an eviction (thousands at page size 1) never pay for first-touch page
     * faults of the ring as it advances */
    memset(ev->ring, 0, (size_t)capacity * sizeof *ev->ring);
    memset(ev->tokens, 0, (size_t)capacity * (size_t)page_size * sizeof *ev->tokens);
    ev->cap = capacity;
    ev->page_size = page_size;
    *out = ev;
    return KVHAL_OK;
}

void kvhal__kv_events_destroy(kvhal__kv_events *ev)
{
    if (!ev) return;
    free(ev->ring);
    free(ev->tokens);
    free(ev);
}

void kvhal__kv_event_push(kvhal__kv_events *ev, kvhal_kv_event_type type, kvhal_kv_tier tier, uint64_t hash,
                          uint64_t parent, int32_t page, const int32_t *tokens)
{
    if (!ev) return;
    if (ev->count == ev->cap) { /* the last entry is the overflow event */
        ev->ring[(ev->head + ev->count - 1) % ev->cap].dropped++;
        ev->dropped++;
        return;
    }
    const uint32_t at = (ev->head + ev->count) % ev->cap;
    kvhal_kv_event *e = &ev->ring[at];
    ev->count++;
    if (ev->count == ev->cap) { /* this one is lost: the slot announces the loss instead */
        *e = (kvhal_kv_event){.type = KVHAL_KV_OVERFLOW, .tier = tier, .page = -1, .dropped = 1};
        ev->dropped++;
        return;
    }
    *e = (kvhal_kv_event){.type = type, .tier = tier, .hash = hash, .parent_hash = parent, .page = page};
    if (type == KVHAL_KV_STORED && tokens) {
        memcpy(ev->tokens + (size_t)at * (size_t)ev->page_size, tokens, (size_t)ev->page_size * sizeof *tokens);
        e->num_tokens = ev->page_size;
    }
}

void kvhal__kv_events_push_removed(kvhal__kv_events *ev, kvhal_kv_tier tier, const int32_t *pages, size_t n,
                                   const uint64_t *hash, const uint64_t *parent, uint32_t total)
{
    if (!ev) return;
    size_t i = 0;
    /* while there is room before the entry kept for an overflow event: straight runs of the ring, no division */
    while (i < n && ev->count + 1 < ev->cap) {
        size_t at = (size_t)ev->head + ev->count;
        if (at >= ev->cap) at -= ev->cap;
        const size_t room = (size_t)(ev->cap - 1 - ev->count), run = (size_t)ev->cap - at;
        const size_t lim = room < run ? room : run;
        kvhal_kv_event *restrict e = ev->ring + at;
        size_t k = 0;
        for (; i < n && k < lim; i++) {
            const int32_t p = pages[i];
            if ((uint32_t)p >= total) continue; /* the caller reports a bad page itself */
            e[k++] = (kvhal_kv_event){.type = KVHAL_KV_REMOVED, .tier = tier, .hash = hash[p],
                                      .parent_hash = parent[p], .page = p};
        }
        ev->count += (uint32_t)k;
    }
    for (; i < n; i++) /* the ring is full: the overflow event counts them */
        if ((uint32_t)pages[i] < total)
            kvhal__kv_event_push(ev, KVHAL_KV_REMOVED, tier, hash[pages[i]], parent[pages[i]], pages[i], NULL);
}

size_t kvhal__kv_events_read(kvhal__kv_events *ev, kvhal_kv_event *out, int32_t *tokens, size_t cap)
{
    size_t n = 0;
    while (n < cap && ev->count) {
        const kvhal_kv_event *e = &ev->ring[ev->head];
        out[n] = *e;
        if (e->num_tokens)
            memcpy(tokens + n * (size_t)ev->page_size, ev->tokens + (size_t)ev->head * (size_t)ev->page_size,
                   (size_t)ev->page_size * sizeof *tokens);
        ev->head = (ev->head + 1) % ev->cap;
        ev->count--;
        n++;
    }
    return n;
}

uint64_t kvhal__kv_events_dropped(const kvhal__kv_events *ev) { return ev ? ev->dropped : 0; }

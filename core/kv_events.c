/* kv_events.c — the page hash chain and the bounded KV event queue. The queue is a ring of events with page_size
 * tokens each; when it fills, its last entry becomes an overflow event that counts every event lost after it, so a
 * consumer always learns that it missed something (and must resynchronise) instead of silently diverging. */
#include <stdlib.h>
#include <string.h>

#include "tier.h"

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

/* fuzz_tiers.c — libFuzzer target over the tiered cache manager. The input picks the page size, device
 * and host page counts, the write policy and the event queue size, then a stream of operations: requests over a
 * small token alphabet (so prefixes are shared) that match, load back, allocate, write and finish (whole or
 * suffix) or are dropped; evictions; host-tier clears; event reads; injected allocation failures in load_back and
 * allocation. Each page written holds bytes derived from its chain hash, so a device hit or a loaded-back page
 * with other content aborts, as does any check_integrity failure, any stored event whose hash does not follow
 * from its parent and tokens, and a count of pages per tier that the events do not reproduce. Streams are held at
 * times (kvhal_fault_hold_streams), so the copies out stay in flight and evicted pages drain: check_integrity
 * covers the draining pages, an eviction must never wait, and the host counts the events give (stored once a copy
 * completed) must match. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"
#include "kvhal_test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXTOK 32
#define MAXEV 4096

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static unsigned next(input *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

#define REQUIRE(c)                                                                                              \
    do {                                                                                                        \
        if (!(c)) abort();                                                                                      \
    } while (0)

typedef struct ctx {
    kvhal_paged_cache *pc;
    kvhal_cache_manager *cm;
    kvhal_tensor k;
    int32_t ps;
    size_t block;
    int64_t dev_pages, host_pages; /* what the events say each tier holds */
} ctx;

static uint8_t fill(uint64_t h, size_t i) { return (uint8_t)((h >> ((i % 8) * 8)) ^ (uint8_t)(i * 131u)); }

static void write_page(ctx *c, int32_t page, uint64_t h)
{
    uint8_t buf[64];
    for (size_t i = 0; i < c->block; i++) buf[i] = fill(h, i);
    REQUIRE(kvhal_memcpy_h2d(c->k.buffer, c->k.offset + (size_t)page * c->block, buf, c->block, NULL) == KVHAL_OK);
}

static void check_page(ctx *c, int32_t page, uint64_t h)
{
    uint8_t buf[64];
    REQUIRE(kvhal_memcpy_d2h(buf, c->k.buffer, c->k.offset + (size_t)page * c->block, c->block, NULL) == KVHAL_OK);
    for (size_t i = 0; i < c->block; i++) REQUIRE(buf[i] == fill(h, i));
}

static void drain(ctx *c)
{
    static kvhal_kv_event ev[64];
    static int32_t tok[64 * 4];
    size_t n;
    do {
        if (kvhal_cache_manager_events_read(c->cm, ev, tok, 64, &n) != KVHAL_OK) return; /* no events */
        for (size_t i = 0; i < n; i++) {
            int64_t *count = ev[i].tier == KVHAL_TIER_HOST ? &c->host_pages : &c->dev_pages;
            if (ev[i].type == KVHAL_KV_STORED) {
                REQUIRE(kvhal_kv_page_hash(ev[i].parent_hash, tok + i * (size_t)c->ps, c->ps) == ev[i].hash);
                (*count)++;
            } else if (ev[i].type == KVHAL_KV_REMOVED) {
                (*count)--;
            } else if (ev[i].type == KVHAL_KV_CLEARED) {
                *count = 0;
            } else {
                c->dev_pages = c->host_pages = -1; /* overflow: counts unknown from here on */
                return;
            }
        }
    } while (n == 64);
}

static void request(ctx *c, input *in)
{
    const size_t ps = (size_t)c->ps;
    int32_t tok[MAXTOK], pages[MAXTOK];
    uint64_t hs[MAXTOK];
    const size_t n = 1 + next(in) % MAXTOK;
    const unsigned alpha = 1 + next(in) % 3;
    for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(next(in) % alpha);
    uint64_t h = kvhal_kv_root_hash(c->ps);
    for (size_t i = 0; (i + 1) * ps <= n; i++) hs[i] = h = kvhal_kv_page_hash(h, tok + i * ps, c->ps);
    kvhal_prefix_handle hd;
    size_t dl = 0, hl = 0, loaded = 0;
    REQUIRE(kvhal_cache_manager_match_tiered(c->cm, tok, n, &hd, &dl, &hl, pages, MAXTOK) == KVHAL_OK);
    for (size_t i = 0; i < dl / ps; i++) check_page(c, pages[i], hs[i]);
    const unsigned mode = next(in);
    if (hl) {
        if (mode & 1) kvhal_fault_inject_alloc(1 + (mode >> 1) % 3);
        kvhal_status st = kvhal_cache_manager_load_back(c->cm, hd, tok, n, pages + dl / ps, MAXTOK, &loaded);
        kvhal_fault_inject_alloc(0);
        REQUIRE(st == KVHAL_OK || st == KVHAL_OUT_OF_MEMORY);
        REQUIRE(st == KVHAL_OK ? loaded == hl : loaded == 0);
        REQUIRE(kvhal_cache_manager_transfer_wait(c->cm) == KVHAL_OK);
        for (size_t i = dl / ps; i < (dl + loaded) / ps; i++) check_page(c, pages[i], hs[i]);
    }
    const size_t have = (dl + loaded) / ps, np = (n + ps - 1) / ps;
    kvhal_status st = kvhal_cache_manager_allocate(c->cm, (int32_t)(np - have), pages + have);
    if (st != KVHAL_OK || (mode & 6) == 6) { /* no room, or dropped: the loaded pages go back, the lock too */
        if (st == KVHAL_OK) REQUIRE(kvhal_cache_manager_free(c->cm, pages + have, (int32_t)(np - have)) == KVHAL_OK);
        REQUIRE(kvhal_cache_manager_free(c->cm, pages + dl / ps, (int32_t)(have - dl / ps)) == KVHAL_OK);
        REQUIRE(kvhal_prefix_unlock(kvhal_cache_manager_prefix(c->cm), hd) == KVHAL_OK);
        return;
    }
    for (size_t i = have; i < n / ps; i++) write_page(c, pages[i], hs[i]);
    if (mode & 8)
        st = kvhal_cache_manager_cache_finished_suffix(c->cm, hd, tok + dl, n - dl, pages + dl / ps);
    else
        st = kvhal_cache_manager_cache_finished(c->cm, tok, n, pages, hd);
    REQUIRE(st == KVHAL_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size};
    ctx c = {.ps = 1 + (int32_t)(next(&in) % 4)};
    const int32_t total = 4 + (int32_t)(next(&in) % 29), host = (int32_t)(next(&in) % 65);
    const unsigned flags = next(&in);
    c.block = (size_t)c.ps * 4 * 4; /* 1 layer, 1 head, dim 4, f32 */
    kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 1, .num_heads = 1, .head_dim = 4, .block_size = c.ps,
                                    .dtype = KVHAL_F32, .memory_budget = (uint64_t)total * 2 * c.block,
                                    .device = {KVHAL_DEVICE_CPU, 0}};
    if (kvhal_paged_cache_create(&cfg, &c.pc) != KVHAL_OK) return 0;
    REQUIRE(kvhal_paged_cache_layer(c.pc, 0, &c.k, NULL) == KVHAL_OK);
    kvhal_host_tier_config tc = {.cache = c.pc, .host_budget = (uint64_t)host * kvhal_paged_cache_host_page_bytes(c.pc),
                                 .policy = (flags & 1) ? KVHAL_WRITE_BACK : KVHAL_WRITE_THROUGH,
                                 .event_capacity = (flags & 2) ? 8 : MAXEV};
    if (kvhal_cache_manager_create_tiered(total, c.ps, KVHAL_PREFIX_RADIX, &tc, &c.cm) != KVHAL_OK) {
        kvhal_paged_cache_destroy(c.pc);
        return 0;
    }
    kvhal_fault_hold_streams((flags & 4) != 0);
    while (in.n) {
        const unsigned op = next(&in) % 8;
        if (op < 5) {
            request(&c, &in);
        } else if (op == 5) {
            const int64_t w = kvhal_fault_stream_waits();
            REQUIRE(kvhal_cache_manager_evict(c.cm, next(&in) % 16, NULL) == KVHAL_OK);
            REQUIRE(kvhal_fault_stream_waits() == w); /* eviction enqueues copies, never waits for them */
        } else if (op == 6 && host) {
            REQUIRE(kvhal_cache_manager_host_tier_clear(c.cm) == KVHAL_OK);
        } else if (op == 7) {
            const unsigned x = next(&in);
            if (x & 1) kvhal_fault_hold_streams((x & 2) != 0);
            const kvhal_status q = kvhal_cache_manager_transfer_query(c.cm);
            REQUIRE(q == KVHAL_OK || q == KVHAL_BUSY);
        }
        if (op == 7 || !(flags & 2)) drain(&c);
        REQUIRE(kvhal_cache_manager_check_integrity(c.cm) == KVHAL_OK);
        kvhal_host_tier_stats s;
        REQUIRE(kvhal_cache_manager_tier_stats(c.cm, &s) == KVHAL_OK);
        if (!(flags & 2) && c.dev_pages >= 0) { /* a queue drained every step never overflows here */
            kvhal_prefix_size_info si;
            REQUIRE(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(c.cm), &si) == KVHAL_OK);
            REQUIRE((size_t)c.dev_pages == si.total_tokens / (size_t)c.ps && c.host_pages == s.host_pages_used);
        }
    }
    kvhal_fault_hold_streams(0);
    REQUIRE(kvhal_cache_manager_transfer_wait(c.cm) == KVHAL_OK);
    REQUIRE(kvhal_cache_manager_check_integrity(c.cm) == KVHAL_OK);
    REQUIRE(kvhal_cache_manager_available(c.cm) == total); /* every drained page came back */
    REQUIRE(kvhal_cache_manager_destroy(c.cm) == KVHAL_OK);
    REQUIRE(kvhal_paged_cache_destroy(c.pc) == KVHAL_OK);
    return 0;
}

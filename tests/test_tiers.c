/* test_tiers.c — the hierarchical cache: a cache manager with a host tier over a real paged cache on
 * cpu:0 (and the device KVHAL_TEST_DEVICE names), where every page's content is derived from its chain hash, so a
 * page that a device match or a load-back returns is verified byte for byte against what its tokens must hold.
 *   tiers_offload_and_load_back   write-back and write-through: evicted prefixes come back from host, verified
 *   tiers_model_random            a random serving workload (10^6 operations with KVHAL_TIERS_OPS unset) checked
 *                                 against a model rebuilt from the KV events alone: every query's device and host
 *                                 lengths equal the model's, every page's content is right, integrity holds
 *                                 (streams held at random, kvhal_fault_hold_streams: copies stay "in flight" and
 *                                 the model tracks the pages that drain; none is ever handed out)
 *   tiers_drain                   write-back eviction only enqueues: the pages copied out drain, are not handed out
 *                                 and their host copies are no hits until the copies complete
 *   tiers_drain_through           write-through eviction completes no copies (no host stored events, no wait):
 *                                 pages whose copy is not reaped drain; the next allocation short of pages reaps
 *   tiers_events_overflow         a full queue turns into an overflow event counting what was lost
 *   tiers_events_evict_overflow   eviction's removed events wrap around the ring in order, then overflow
 *   tiers_hash_stable             the documented hash chain, fixed values
 *   tiers_alloc_faults            every allocation of create_tiered and load_back failing: a clear error, no change
 *   tiers_finish_alloc_faults     every allocation of a whole workload failing, write-through and write-back: each
 *                                 refusal has a last error and changes nothing (a refused finish keeps its handle);
 *                                 a finish whose host copy failed is OK and counted (tier_write_failures)
 *   tiers_load_back_bounded       load_back never loads past what the match reported, whatever num_tokens
 *   tiers_bad_inputs              refusals name the argument */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"
#include "kvhal_test.h"

#define OKS(expr)                                                                                               \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());       \
    } while (0)

typedef struct rig {
    kvhal_device dev;
    kvhal_paged_cache *pc;
    kvhal_cache_manager *cm;
    int32_t ps, layers, total;
    size_t block_bytes;
    kvhal_tensor k[4], v[4];
    uint8_t *scratch;
} rig;

static kvhal_device test_device(void)
{
    kvhal_device d = {KVHAL_DEVICE_CPU, 0};
    const char *e = getenv("KVHAL_TEST_DEVICE");
    if (e && *e && kvhal_device_parse(e, &d) != KVHAL_OK) fail_msg("KVHAL_TEST_DEVICE=%s: %s", e, kvhal_last_error());
    return d;
}

/* total device pages, host pages, policy; layers and head_dim small so that a million operations stay quick */
static void rig_make_on(rig *r, kvhal_device dev, int32_t total, int32_t host_pages, int32_t ps,
                        kvhal_write_policy pol, uint32_t events)
{
    memset(r, 0, sizeof *r);
    r->dev = dev;
    r->ps = ps;
    r->layers = 2;
    r->total = total;
    kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 2, .num_heads = 1, .head_dim = 2, .block_size = ps,
                                    .dtype = KVHAL_F32, .layout = KVHAL_LAYOUT_NHD, .order = KVHAL_LAYER_FIRST,
                                    .device = r->dev};
    r->block_bytes = (size_t)ps * 2 * 4;
    cfg.memory_budget = (uint64_t)total * 2 * 2 * r->block_bytes;
    OKS(kvhal_paged_cache_create(&cfg, &r->pc));
    for (int32_t l = 0; l < 2; l++) OKS(kvhal_paged_cache_layer(r->pc, l, &r->k[l], &r->v[l]));
    kvhal_host_tier_config tc = {.cache = r->pc, .host_budget = (uint64_t)host_pages * kvhal_paged_cache_host_page_bytes(r->pc),
                                 .policy = pol, .event_capacity = events};
    OKS(kvhal_cache_manager_create_tiered(total, ps, KVHAL_PREFIX_RADIX, &tc, &r->cm));
    r->scratch = malloc(r->block_bytes);
    assert_non_null(r->scratch);
}

static void rig_make(rig *r, int32_t total, int32_t host_pages, int32_t ps, kvhal_write_policy pol, uint32_t events)
{
    rig_make_on(r, test_device(), total, host_pages, ps, pol, events);
}

static void rig_free(rig *r)
{
    OKS(kvhal_cache_manager_destroy(r->cm));
    OKS(kvhal_paged_cache_destroy(r->pc));
    free(r->scratch);
}

/* The content a page of hash h holds in layer l, side s. */
static void content(const rig *r, uint64_t h, int l, int s, uint8_t *out)
{
    uint64_t x = h ^ (0x9e3779b97f4a7c15ull * (uint64_t)(2 * l + s + 1));
    for (size_t i = 0; i < r->block_bytes; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        out[i] = (uint8_t)((x * 0x2545f4914f6cdd1dull) >> 56);
    }
}

static size_t block_off(const kvhal_tensor *t, int32_t page)
{
    return t->offset + (size_t)page * (size_t)t->strides[0] * 4;
}

static void write_page(rig *r, int32_t page, uint64_t h)
{
    for (int l = 0; l < r->layers; l++)
        for (int s = 0; s < 2; s++) {
            const kvhal_tensor *t = s ? &r->v[l] : &r->k[l];
            content(r, h, l, s, r->scratch);
            OKS(kvhal_memcpy_h2d(t->buffer, block_off(t, page), r->scratch, r->block_bytes, NULL));
        }
}

static void expect_page(rig *r, int32_t page, uint64_t h, const char *what)
{
    uint8_t *want = malloc(r->block_bytes);
    assert_non_null(want);
    for (int l = 0; l < r->layers; l++)
        for (int s = 0; s < 2; s++) {
            const kvhal_tensor *t = s ? &r->v[l] : &r->k[l];
            content(r, h, l, s, want);
            OKS(kvhal_memcpy_d2h(r->scratch, t->buffer, block_off(t, page), r->block_bytes, NULL));
            if (memcmp(want, r->scratch, r->block_bytes))
                fail_msg("%s: page %d (hash %016llx) layer %d %s holds other content", what, (int)page,
                         (unsigned long long)h, l, s ? "V" : "K");
        }
    free(want);
}

static void chain(int32_t ps, const int32_t *tokens, size_t n, uint64_t *hashes)
{
    uint64_t h = kvhal_kv_root_hash(ps);
    for (size_t i = 0; i * (size_t)ps + (size_t)ps <= n; i++) hashes[i] = h = kvhal_kv_page_hash(h, tokens + i * (size_t)ps, ps);
}

/* Pages that allocate and load_back handed out during the current request (the model test checks them against
 * the pages it knows to be draining). */
static int32_t g_out[64];
static size_t g_nout;

static void note_out(const int32_t *pages, size_t n)
{
    for (size_t i = 0; i < n && g_nout < 64; i++) g_out[g_nout++] = pages[i];
}

static void integrity(const rig *r)
{
    kvhal_status st = kvhal_cache_manager_check_integrity(r->cm);
    if (st != KVHAL_OK) fail_msg("check_integrity: %s", kvhal_last_error());
}

/* Runs one request start to finish: match (device + host), load back, verify every reused page, write the new
 * pages, finish. Returns the device and host lengths it saw. */
static void run_request(rig *r, const int32_t *tokens, size_t n, size_t *dev_len, size_t *host_len, bool suffix)
{
    const size_t ps = (size_t)r->ps, np = (n + ps - 1) / ps;
    int32_t *pages = malloc((np + 1) * sizeof *pages);
    uint64_t *hs = malloc((np + 1) * sizeof *hs);
    assert_non_null(pages);
    assert_non_null(hs);
    chain(r->ps, tokens, n, hs);
    kvhal_prefix_handle h;
    size_t dl, hl, loaded = 0;
    OKS(kvhal_cache_manager_match_tiered(r->cm, tokens, n, &h, &dl, &hl, pages, np + 1));
    for (size_t i = 0; i < dl / ps; i++) expect_page(r, pages[i], hs[i], "device hit");
    if (hl) {
        OKS(kvhal_cache_manager_load_back(r->cm, h, tokens, n, pages + dl / ps, np - dl / ps, &loaded));
        assert_int_equal(loaded, hl);
        note_out(pages + dl / ps, loaded / ps);
        OKS(kvhal_cache_manager_transfer_wait(r->cm));
        for (size_t i = dl / ps; i < (dl + hl) / ps; i++) expect_page(r, pages[i], hs[i], "loaded back");
    }
    const size_t have = (dl + loaded) / ps;
    kvhal_status st = kvhal_cache_manager_allocate(r->cm, (int32_t)(np - have), pages + have);
    if (st != KVHAL_OK) { /* everything is locked by running requests: drop this one */
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        OKS(kvhal_cache_manager_free(r->cm, pages + dl / ps, (int32_t)(have - dl / ps)));
        OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r->cm), h));
    } else {
        note_out(pages + have, np - have);
        for (size_t i = have; i < n / ps; i++) write_page(r, pages[i], hs[i]);
        if (suffix)
            OKS(kvhal_cache_manager_cache_finished_suffix(r->cm, h, tokens + dl, n - dl, pages + dl / ps));
        else
            OKS(kvhal_cache_manager_cache_finished(r->cm, tokens, n, pages, h));
    }
    if (dev_len) *dev_len = dl;
    if (host_len) *host_len = hl;
    free(pages);
    free(hs);
}

static void offload_case(kvhal_write_policy pol)
{
    rig r;
    rig_make(&r, 8, 32, 4, pol, 0);
    int32_t a[32], b[32];
    for (int i = 0; i < 32; i++) a[i] = 100 + i, b[i] = 500 + i;
    size_t dl, hl;
    run_request(&r, a, 32, &dl, &hl, false);
    assert_int_equal(dl + hl, 0);
    kvhal_host_tier_stats s;
    OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
    assert_int_equal(s.pages_written, pol == KVHAL_WRITE_THROUGH ? 8 : 0);
    run_request(&r, b, 32, &dl, &hl, false); /* evicts a (8 device pages in all) */
    OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
    assert_int_equal(s.pages_written, pol == KVHAL_WRITE_THROUGH ? 16 : 8);
    integrity(&r);
    run_request(&r, a, 32, &dl, &hl, false); /* back from host, verified inside */
    assert_int_equal(dl, 0);
    assert_int_equal(hl, 32);
    OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
    assert_int_equal(s.pages_loaded, 8);
    /* a longer request on a: device hit (a is back), then b's pages were evicted to host */
    int32_t a2[40];
    memcpy(a2, a, sizeof a);
    for (int i = 32; i < 40; i++) a2[i] = 7;
    run_request(&r, b, 32, &dl, &hl, true);
    assert_int_equal(dl, 0);
    assert_int_equal(hl, 32);
    integrity(&r);
    OKS(kvhal_cache_manager_host_tier_clear(r.cm));
    OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
    assert_int_equal(s.host_pages_used, 0);
    integrity(&r);
    rig_free(&r);
}

static void test_offload_and_load_back(void **state)
{
    (void)state;
    offload_case(KVHAL_WRITE_BACK);
    offload_case(KVHAL_WRITE_THROUGH);
}

/* Write-back eviction with the copies held in flight (kvhal_fault_hold_streams): evict enqueues and returns without
 * a wait; the pages copied out drain: never handed out (free pages are, first), refused by free, not counted free;
 * their host copies are no hits; allocation waits only when the free pages cannot cover it; then all is usable. */
static void test_drain(void **state)
{
    (void)state;
    rig r;
    rig_make(&r, 8, 32, 2, KVHAL_WRITE_BACK, 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[4] = {9, 10, 11, 12};
    run_request(&r, a, 8, NULL, NULL, false);
    run_request(&r, b, 4, NULL, NULL, false);
    kvhal_prefix_handle h;
    size_t dl, hl;
    int32_t apages[4], pages[4];
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 8, &h, &dl, &hl, apages, 4));
    assert_int_equal(dl, 8);
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    OKS(kvhal_cache_manager_match_tiered(r.cm, b, 4, &h, &dl, &hl, pages, 4)); /* b most recent: a goes first */
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    assert_int_equal(kvhal_cache_manager_num_free(r.cm), 2);
    kvhal_fault_hold_streams(1);
    size_t ev = 0;
    OKS(kvhal_cache_manager_evict(r.cm, 8, &ev));
    assert_int_equal(ev, 8);
    assert_int_equal(kvhal_fault_stream_waits(), 0); /* eviction only enqueued the copies */
    assert_int_equal(kvhal_cache_manager_num_free(r.cm), 2); /* a's 4 pages drain */
    assert_int_equal(kvhal_cache_manager_available(r.cm), 8);
    integrity(&r);
    kvhal_host_tier_stats st;
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.pages_written, 0); /* queued: the next call that polls or allocates starts the copies */
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 8, &h, &dl, &hl, pages, 4));
    assert_int_equal(dl + hl, 0); /* queued: no host hit */
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    assert_int_equal(kvhal_cache_manager_transfer_query(r.cm), KVHAL_BUSY); /* copies enqueued, held in flight */
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.pages_written, 4);
    assert_int_equal(st.host_pages_used, 0); /* pending: not a prefix the host holds yet */
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 8, &h, &dl, &hl, pages, 4));
    assert_int_equal(dl + hl, 0); /* the copies are in flight: no host hit */
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    integrity(&r);
    /* a draining page is nobody's to free */
    assert_int_equal(kvhal_cache_manager_free(r.cm, apages, 1), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "draining"));
    /* two free pages: those are handed out, not a's, and nothing waits */
    OKS(kvhal_cache_manager_allocate(r.cm, 2, pages));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            if (pages[i] == apages[j]) fail_msg("page %d handed out while the copy out of it is in flight", (int)pages[i]);
    assert_int_equal(kvhal_fault_stream_waits(), 0);
    integrity(&r);
    OKS(kvhal_cache_manager_free(r.cm, pages, 2));
    /* three: the free pages cannot cover it, b stays cached (the drains will), so allocation waits for the copies */
    OKS(kvhal_cache_manager_allocate(r.cm, 3, pages));
    assert_int_equal(kvhal_fault_stream_waits(), 1);
    assert_int_equal(kvhal_cache_manager_pages_evicted(r.cm), 4); /* only a's */
    integrity(&r);
    OKS(kvhal_cache_manager_free(r.cm, pages, 3));
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.host_pages_used, 4);
    kvhal_fault_hold_streams(0);
    run_request(&r, a, 8, &dl, &hl, false); /* a back from the host, verified inside */
    assert_int_equal(dl, 0);
    assert_int_equal(hl, 8);
    integrity(&r);
    rig_free(&r);
}

/* Pages of the device stored events among ev[0..n) whose first token is one of first[0..nf), in event order. */
static size_t stored_pages(const kvhal_kv_event *ev, const int32_t *tok, size_t n, int32_t ps, const int32_t *first,
                           size_t nf, int32_t *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < nf; j++)
            if (ev[i].type == KVHAL_KV_STORED && ev[i].tier == KVHAL_TIER_DEVICE && tok[i * (size_t)ps] == first[j])
                out[k++] = ev[i].page;
    return k;
}

static void expect_events(const kvhal_kv_event *ev, size_t n, size_t want, kvhal_kv_event_type type, int tier,
                          const char *when)
{
    if (n != want) fail_msg("%s: %zu events, %zu expected", when, n, want);
    for (size_t i = 0; i < n; i++)
        if (ev[i].type != type || (int)ev[i].tier != tier)
            fail_msg("%s: event %zu has type %d tier %d, %d and %d expected", when, i, (int)ev[i].type,
                     (int)ev[i].tier, (int)type, tier);
}

/* Write-through eviction completes no other work: with the copies of the last finished request done on cpu:0 but
 * not reaped (nothing polled since), evict emits only the device's removed events (no host stored event: the batch
 * is not completed there), frees the pages whose copies were reaped and makes the others drain (not free, not
 * handed out, refused by free), and never waits; the next allocation short of free pages reaps with a query: the
 * host entries become valid (stored events), the drained pages go free, no wait (on cpu:0; a GPU's copies may
 * still be running, and it waits). With the copies held in flight,
 * the allocation that needs the draining pages waits, once. */
static void test_drain_through(void **state)
{
    (void)state;
    rig r;
    rig_make(&r, 8, 32, 2, KVHAL_WRITE_THROUGH, 256);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, c[4] = {21, 22, 23, 24}, d[4] = {31, 32, 33, 34};
    kvhal_kv_event ev[64];
    int32_t tok[128], pages[8], cpages[2], dpages[2];
    size_t n, dl, hl, evicted = 0;
    kvhal_host_tier_stats st;
    run_request(&r, a, 8, NULL, NULL, false);
    OKS(kvhal_cache_manager_transfer_wait(r.cm)); /* a's copies reaped */
    run_request(&r, c, 4, &dl, &hl, false);         /* c's copies done on cpu:0 (maybe not on a GPU), not reaped */
    assert_int_equal(dl + hl, 0);
    const int64_t waits0 = kvhal_fault_stream_waits();
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 64, &n)); /* a: 4 device + 4 host stored; c: 2 device */
    assert_int_equal(n, 10);
    const int32_t cfirst[2] = {21, 23};
    assert_int_equal(stored_pages(ev, tok, n, 2, cfirst, 2, cpages), 2);
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.host_pages_used, 4); /* c's entries pending: not yet a prefix the host holds */
    assert_int_equal(kvhal_cache_manager_num_free(r.cm), 2);
    integrity(&r);
    OKS(kvhal_cache_manager_evict(r.cm, SIZE_MAX, &evicted));
    assert_int_equal(evicted, 12);
    assert_int_equal(kvhal_fault_stream_waits(), waits0);
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 64, &n));
    expect_events(ev, n, 6, KVHAL_KV_REMOVED, KVHAL_TIER_DEVICE, "after evict");
    assert_int_equal(kvhal_cache_manager_num_free(r.cm), 6); /* a's 4 pages free, c's 2 drain */
    assert_int_equal(kvhal_cache_manager_available(r.cm), 8);
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.host_pages_used, 4);
    integrity(&r);
    assert_int_equal(kvhal_cache_manager_free(r.cm, cpages, 1), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "draining"));
    /* six free pages: handed out as they are, none of c's */
    OKS(kvhal_cache_manager_allocate(r.cm, 6, pages));
    for (int i = 0; i < 6; i++)
        if (pages[i] == cpages[0] || pages[i] == cpages[1])
            fail_msg("page %d handed out while it drains", (int)pages[i]);
    OKS(kvhal_cache_manager_free(r.cm, pages, 6));
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.host_pages_used, 4);
    /* eight: the allocation reaps (a query; cpu:0's copies are complete, a GPU's may still run: then a wait): c's
     * entries valid, its pages free */
    OKS(kvhal_cache_manager_allocate(r.cm, 8, pages));
    if (r.dev.type == KVHAL_DEVICE_CPU) assert_int_equal(kvhal_fault_stream_waits(), waits0);
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.host_pages_used, 6);
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 64, &n));
    expect_events(ev, n, 2, KVHAL_KV_STORED, KVHAL_TIER_HOST, "after the reaping allocation");
    integrity(&r);
    OKS(kvhal_cache_manager_free(r.cm, pages, 8));
    /* held in flight: d's copies stay in flight; evicted, its pages drain; allocating all eight waits once */
    kvhal_fault_hold_streams(1);
    run_request(&r, d, 4, &dl, &hl, false);
    assert_int_equal(dl + hl, 0);
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 64, &n));
    const int32_t dfirst[2] = {31, 33};
    assert_int_equal(stored_pages(ev, tok, n, 2, dfirst, 2, dpages), 2);
    const int64_t waits1 = kvhal_fault_stream_waits();
    OKS(kvhal_cache_manager_evict(r.cm, SIZE_MAX, &evicted));
    assert_int_equal(evicted, 4);
    assert_int_equal(kvhal_fault_stream_waits(), waits1);
    assert_int_equal(kvhal_cache_manager_num_free(r.cm), 6);
    integrity(&r);
    assert_int_equal(kvhal_cache_manager_transfer_query(r.cm), KVHAL_BUSY);
    OKS(kvhal_cache_manager_allocate(r.cm, 6, pages));
    for (int i = 0; i < 6; i++)
        if (pages[i] == dpages[0] || pages[i] == dpages[1])
            fail_msg("page %d handed out while the copy out of it is in flight", (int)pages[i]);
    assert_int_equal(kvhal_fault_stream_waits(), waits1);
    OKS(kvhal_cache_manager_free(r.cm, pages, 6));
    OKS(kvhal_cache_manager_allocate(r.cm, 8, pages));
    assert_int_equal(kvhal_fault_stream_waits(), waits1 + 1);
    integrity(&r);
    OKS(kvhal_cache_manager_free(r.cm, pages, 8));
    kvhal_fault_hold_streams(0);
    OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
    assert_int_equal(st.host_pages_used, 8);
    integrity(&r);
    rig_free(&r);
}

/* ---- the model: what the events say each tier holds ---- */
typedef struct mentry {
    uint64_t hash, parent;
    int32_t page;
    bool used;
} mentry;

/* tab[0] device, tab[1] host (valid), tab[2] host copies the model knows to be pending (a subset: an entry dropped
 * while pending says nothing). copying/draining: device pages with a copy out in flight, and those of them that
 * left the tree (a subset of the manager's, exact while no copy completed). */
typedef struct model {
    mentry *tab[3];
    size_t cap, n[3];
    bool write_back;
    uint64_t copying, draining; /* bit per device page (48) */
} model;

static mentry *m_slot(model *m, int tier, uint64_t h)
{
    size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull) & (m->cap - 1);
    while (m->tab[tier][i].used && m->tab[tier][i].hash != h) i = (i + 1) & (m->cap - 1);
    return &m->tab[tier][i];
}

static void m_erase(model *m, int tier, uint64_t h)
{
    mentry *e = m_slot(m, tier, h);
    if (!e->used) fail_msg("event: removed %016llx from tier %d, which the events never stored", (unsigned long long)h, tier);
    /* rebuild the cluster after the hole (simple and correct) */
    size_t i = (size_t)(e - m->tab[tier]);
    e->used = false;
    m->n[tier]--;
    for (size_t j = (i + 1) & (m->cap - 1); m->tab[tier][j].used; j = (j + 1) & (m->cap - 1)) {
        mentry x = m->tab[tier][j];
        m->tab[tier][j].used = false;
        *m_slot(m, tier, x.hash) = x;
    }
}

static void m_apply(model *m, rig *r)
{
    kvhal_kv_event ev[256];
    int32_t *tok = malloc(256 * (size_t)r->ps * sizeof *tok);
    assert_non_null(tok);
    size_t n;
    do {
        OKS(kvhal_cache_manager_events_read(r->cm, ev, tok, 256, &n));
        for (size_t i = 0; i < n; i++) {
            const int tier = ev[i].tier;
            const uint64_t h = ev[i].hash;
            const int32_t pg = ev[i].page;
            /* a copy out of device page pg starts unless the host holds h or has its copy pending */
            const bool copies = !m_slot(m, 1, h)->used && !m_slot(m, 2, h)->used;
            switch (ev[i].type) {
            case KVHAL_KV_STORED: {
                if (kvhal_kv_page_hash(ev[i].parent_hash, tok + i * (size_t)r->ps, r->ps) != h)
                    fail_msg("%s", "stored event: hash does not follow from its parent and tokens");
                if (tier == 0 && !m->write_back && copies) { /* write-through: copied out when it enters */
                    *m_slot(m, 2, h) = (mentry){h, ev[i].parent_hash, pg, true};
                    m->n[2]++;
                    m->copying |= 1ull << pg;
                }
                if (tier == 1 && m_slot(m, 2, h)->used) m_erase(m, 2, h); /* its copy completed */
                mentry *e = m_slot(m, tier, h);
                if (e->used) fail_msg("stored event: %016llx stored twice in tier %d", (unsigned long long)h, tier);
                *e = (mentry){h, ev[i].parent_hash, pg, true};
                m->n[tier]++;
                break;
            }
            case KVHAL_KV_REMOVED:
                if (tier == 0 && ((m->copying >> pg) & 1)) {
                    m->draining |= 1ull << pg;
                } else if (tier == 0 && m->write_back && copies) { /* write-back: copied out as it leaves */
                    *m_slot(m, 2, h) = (mentry){h, ev[i].parent_hash, pg, true};
                    m->n[2]++;
                    m->copying |= 1ull << pg;
                    m->draining |= 1ull << pg;
                }
                m_erase(m, tier, h);
                break;
            case KVHAL_KV_CLEARED:
                memset(m->tab[tier], 0, m->cap * sizeof *m->tab[tier]);
                m->n[tier] = 0;
                break;
            default: fail_msg("event type %d (overflow) in a queue that is drained every step", (int)ev[i].type);
            }
        }
    } while (n == 256);
    free(tok);
}

/* Every copy completed (a wait, or a query that said so): nothing copies out or drains, nothing is pending. */
static void m_completed(model *m)
{
    memset(m->tab[2], 0, m->cap * sizeof *m->tab[2]);
    m->n[2] = 0;
    m->copying = m->draining = 0;
}

/* The model's answer for a query: device pages while the device has the chain, host pages after. */
static void m_predict(model *m, int32_t ps, const uint64_t *hs, size_t np, size_t *dl, size_t *hl)
{
    size_t i = 0;
    while (i < np && m_slot(m, 0, hs[i])->used) i++;
    *dl = i * (size_t)ps;
    size_t j = i;
    while (j < np && m_slot(m, 1, hs[j])->used) j++;
    *hl = (j - i) * (size_t)ps;
}

static void test_model_random(void **state)
{
    (void)state;
    const char *env = getenv("KVHAL_TIERS_OPS");
    const long ops = env && *env ? atol(env) : 1000000L;
    for (int pol = 0; pol < 2; pol++) {
        rig r;
        const int32_t ps = 2;
        /* 24 groups x (system prompt 6 pages + 2 pages of question) ~ 190 pages working set; device 48 pages,
         * host 128 */
        rig_make(&r, 48, 128, ps, (kvhal_write_policy)pol, 4096);
        model m = {.cap = 1024, .write_back = pol == KVHAL_WRITE_BACK};
        for (int t = 0; t < 3; t++) {
            m.tab[t] = calloc(m.cap, sizeof(mentry));
            assert_non_null(m.tab[t]);
        }
        bool held = false;
        size_t drain_checked = 0;
        uint64_t rng = 0x1234 + (uint64_t)pol;
        int32_t tokens[24];
        uint64_t hs[12];
        size_t host_hits = 0, dev_hits = 0;
        for (long op = 0; op < ops / 2; op++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            const int g = (int)(rng % 24), q = (int)((rng >> 8) % 3);
            const size_t n = 12 + (size_t)((rng >> 16) % 5) * 2 + (size_t)((rng >> 24) % 2);
            for (int i = 0; i < 12; i++) tokens[i] = g * 1000 + i;
            for (size_t i = 12; i < n; i++) tokens[i] = g * 1000 + 100 * (q + 1) + (int)i;
            chain(ps, tokens, n, hs);
            /* streams held at times: copies stay in flight until a wait; not held, a wait completes them (stored
             * events for the host) before the prediction, and again after a change */
            for (int k = 0; k < 2; k++) {
                if (!held) {
                    OKS(kvhal_cache_manager_transfer_wait(r.cm));
                    m_apply(&m, &r);
                    m_completed(&m);
                }
                if (k == 1 || (rng >> 32) % 64 != 0) break;
                held = !held;
                kvhal_fault_hold_streams(held);
            }
            const int64_t waits0 = kvhal_fault_stream_waits();
            g_nout = 0;
            size_t pdl, phl, dl, hl;
            m_predict(&m, ps, hs, n / (size_t)ps, &pdl, &phl);
            if ((rng >> 40) % 16 == 0) { /* a query only: lengths as the model says, then released */
                kvhal_prefix_handle h;
                int32_t pages[12];
                OKS(kvhal_cache_manager_match_tiered(r.cm, tokens, n, &h, &dl, &hl, pages, 12));
                OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
            } else {
                run_request(&r, tokens, n, &dl, &hl, (rng >> 44) & 1);
            }
            if (dl != pdl || hl != phl)
                fail_msg("op %ld: the cache says device %zu + host %zu tokens, the events say %zu + %zu", op, dl, hl,
                         pdl, phl);
            dev_hits += dl, host_hits += hl;
            m_apply(&m, &r);
            if (held && kvhal_fault_stream_waits() == waits0) {
                /* no copy completed during the request: no page it got may be one the model knows drains */
                for (size_t i = 0; i < g_nout; i++)
                    if ((m.draining >> g_out[i]) & 1)
                        fail_msg("op %ld: page %d handed out while the copy out of it is in flight", op, (int)g_out[i]);
                drain_checked += g_nout && m.draining;
            } else if (held) {
                m_completed(&m); /* a wait inside the request completed every copy queued before it */
            }
            if ((rng >> 50) % 64 == 0) {
                OKS(kvhal_cache_manager_evict(r.cm, (rng >> 56) % 16, NULL));
                m_apply(&m, &r);
            }
            kvhal_prefix_size_info si;
            OKS(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(r.cm), &si));
            kvhal_host_tier_stats st;
            OKS(kvhal_cache_manager_tier_stats(r.cm, &st));
            if (m.n[0] != si.total_tokens / (size_t)ps || (int64_t)m.n[1] != st.host_pages_used)
                fail_msg("op %ld: events rebuild %zu device + %zu host pages, the cache has %zu + %lld", op, m.n[0],
                         m.n[1], si.total_tokens / (size_t)ps, (long long)st.host_pages_used);
            if (op % 1024 == 0) integrity(&r);
        }
        integrity(&r);
        kvhal_fault_hold_streams(0);
        print_message("policy %s: %ld requests, %zu device-hit tokens, %zu loaded-back tokens, %zu requests checked "
                      "against draining pages\n", pol ? "write-back" : "write-through", ops / 2, dev_hits, host_hits,
                      drain_checked);
        assert_true(host_hits > 0);
        assert_true(drain_checked > 0);
        for (int t = 0; t < 3; t++) free(m.tab[t]);
        rig_free(&r);
    }
}

static void test_events_overflow(void **state)
{
    (void)state;
    rig r;
    rig_make(&r, 16, 16, 2, KVHAL_WRITE_THROUGH, 4);
    int32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    run_request(&r, t, 8, NULL, NULL, false); /* 4 device stored + 4 host stored: 8 events into 4 places */
    OKS(kvhal_cache_manager_transfer_wait(r.cm)); /* the host entries' stored events go out when copies complete */
    kvhal_kv_event ev[8];
    int32_t tok[16];
    size_t n;
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 8, &n));
    assert_int_equal(n, 4);
    assert_int_equal(ev[0].type, KVHAL_KV_STORED);
    assert_int_equal(ev[2].type, KVHAL_KV_STORED);
    assert_int_equal(ev[3].type, KVHAL_KV_OVERFLOW);
    assert_int_equal(ev[3].dropped, 5);
    assert_memory_equal(tok, t, 2 * sizeof *t);
    kvhal_host_tier_stats s;
    OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
    assert_int_equal(s.events_dropped, 5);
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 8, &n));
    assert_int_equal(n, 0);
    rig_free(&r);
}

/* Eviction's removed events (queued a leaf at a time): they wrap around the ring in order, each with the hash and
 * page its stored event gave, and a full ring turns into one overflow event counting every event lost. */
static void test_events_evict_overflow(void **state)
{
    (void)state;
    rig r;
    rig_make(&r, 16, 16, 2, KVHAL_WRITE_BACK, 8);
    int32_t a[12], b[16];
    for (int i = 0; i < 12; i++) a[i] = 40 + i;
    for (int i = 0; i < 16; i++) b[i] = 70 + i;
    kvhal_kv_event ev[8], rm[8];
    int32_t tok[16];
    size_t n;
    run_request(&r, a, 12, NULL, NULL, false); /* 6 device stored events */
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 8, &n));
    assert_int_equal(n, 6);
    OKS(kvhal_cache_manager_evict(r.cm, SIZE_MAX, NULL)); /* 6 removed events: 2 at the ring's end, 4 at its start */
    OKS(kvhal_cache_manager_events_read(r.cm, rm, tok, 8, &n));
    assert_int_equal(n, 6);
    for (size_t i = 0; i < 6; i++) {
        bool found = false;
        for (size_t k = 0; k < 6; k++)
            found |= ev[k].hash == rm[i].hash && ev[k].page == rm[i].page && ev[k].parent_hash == rm[i].parent_hash;
        if (rm[i].type != KVHAL_KV_REMOVED || rm[i].tier != KVHAL_TIER_DEVICE || !found)
            fail_msg("removed event %zu: type %d tier %d page %d, not a removal of a stored page", i, (int)rm[i].type,
                     (int)rm[i].tier, (int)rm[i].page);
    }
    run_request(&r, b, 16, NULL, NULL, false); /* 8 stored into 8 places: 7 and an overflow counting 1 */
    OKS(kvhal_cache_manager_evict(r.cm, SIZE_MAX, NULL)); /* 8 removed: all lost */
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 8, &n));
    assert_int_equal(n, 8);
    for (size_t i = 0; i < 7; i++) assert_int_equal(ev[i].type, KVHAL_KV_STORED);
    assert_int_equal(ev[7].type, KVHAL_KV_OVERFLOW);
    assert_int_equal(ev[7].dropped, 9);
    kvhal_host_tier_stats s;
    OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
    assert_int_equal(s.events_dropped, 9);
    /* room again: a partly full ring takes removals up to its last place, then overflows */
    run_request(&r, a, 12, NULL, NULL, false); /* host hits or not, a's pages enter the tree: stored events */
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 8, &n));
    const size_t before = n;
    OKS(kvhal_cache_manager_evict(r.cm, SIZE_MAX, NULL));
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    OKS(kvhal_cache_manager_events_read(r.cm, ev, tok, 8, &n));
    size_t removed = 0;
    for (size_t i = 0; i < n; i++) removed += ev[i].type == KVHAL_KV_REMOVED && ev[i].tier == KVHAL_TIER_DEVICE;
    assert_true(before > 0);
    assert_int_equal(removed, 6);
    integrity(&r);
    rig_free(&r);
}

static void test_hash_stable(void **state)
{
    (void)state;
    /* the documented definition, computed here independently */
    const int32_t t[4] = {1, 2, 3, -4};
    uint64_t z = KVHAL_KV_HASH_SEED ^ 2u;
#define SM(v) ((v) = ((v) ^ ((v) >> 30)) * 0xbf58476d1ce4e5b9ull, (v) = ((v) ^ ((v) >> 27)) * 0x94d049bb133111ebull, (v) ^= (v) >> 31)
    SM(z);
    assert_true(kvhal_kv_root_hash(2) == z);
    uint64_t h = z;
    h ^= 1u, SM(h), h ^= 2u, SM(h);
    h ^= (uint64_t)2 << 32, SM(h);
    assert_true(kvhal_kv_page_hash(z, t, 2) == h);
    uint64_t h2 = h;
    h2 ^= 3u, SM(h2), h2 ^= (uint32_t)-4, SM(h2);
    h2 ^= (uint64_t)2 << 32, SM(h2);
    assert_true(kvhal_kv_page_hash(h, t + 2, 2) == h2);
#undef SM
    /* a different page size or order changes it */
    assert_true(kvhal_kv_page_hash(z, t, 1) != kvhal_kv_page_hash(z, t, 2));
    assert_true(kvhal_kv_root_hash(1) != kvhal_kv_root_hash(2));
}

static void test_alloc_faults(void **state)
{
    (void)state;
    kvhal_device dev = test_device();
    kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 2, .num_heads = 1, .head_dim = 2, .block_size = 2,
                                    .dtype = KVHAL_F32, .memory_budget = 16 * 2 * 2 * 16, .device = dev};
    kvhal_paged_cache *pc;
    OKS(kvhal_paged_cache_create(&cfg, &pc));
    kvhal_host_tier_config tc = {.cache = pc, .host_budget = 8 * kvhal_paged_cache_host_page_bytes(pc),
                                 .policy = KVHAL_WRITE_BACK, .event_capacity = 64};
    int failures = 0;
    for (int64_t k = 1;; k++) {
        kvhal_cache_manager *cm = NULL;
        kvhal_fault_inject_alloc(k);
        kvhal_status st = kvhal_cache_manager_create_tiered(16, 2, KVHAL_PREFIX_RADIX, &tc, &cm);
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) {
            OKS(kvhal_cache_manager_destroy(cm));
            break;
        }
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_null(cm);
        assert_true(strlen(kvhal_last_error()) > 0);
        failures++;
        assert_true(k < 1000);
    }
    assert_true(failures >= 10); /* every allocation of the tiers was walked */
    /* load_back's allocations failing: nothing changes */
    rig r;
    rig_make(&r, 4, 8, 2, KVHAL_WRITE_BACK, 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {9, 10, 11, 12, 13, 14, 15, 16};
    run_request(&r, a, 8, NULL, NULL, false);
    run_request(&r, b, 8, NULL, NULL, false); /* a goes to host */
    kvhal_prefix_handle h;
    size_t dl, hl, loaded = 99;
    int32_t pages[4];
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 8, &h, &dl, &hl, pages, 4));
    assert_int_equal(hl, 8);
    for (int64_t k = 1; k < 4; k++) {
        kvhal_fault_inject_alloc(k);
        kvhal_status st = kvhal_cache_manager_load_back(r.cm, h, a, 8, pages, 4, &loaded);
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) {
            OKS(kvhal_cache_manager_free(r.cm, pages, 4));
            break;
        }
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_int_equal(loaded, 0);
        integrity(&r);
        kvhal_host_tier_stats s;
        OKS(kvhal_cache_manager_tier_stats(r.cm, &s));
        assert_int_equal(s.pages_loaded, 0);
    }
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    integrity(&r);
    rig_free(&r);
    OKS(kvhal_paged_cache_destroy(pc));
}

/* ---- the finish (and every other call of a whole workload) under each injected allocation failure ----
 * The workload runs from a fresh manager once per allocation point k, the k-th allocation failing: every refusal
 * must be KVHAL_OUT_OF_MEMORY with a last error, and the same call again must succeed (the fault fires once). A
 * refused finish must have changed nothing (counts, tree, host tier; the handle still live: the retry consumes it);
 * a finish whose write-through copy failed returns OK and counts the pages in tier_write_failures. The checks
 * between calls run with the injection paused, so that only the workload's own allocations are walked. */
typedef struct fault_run {
    int64_t fail_at, used; /* the allocation that fails (0: none), allocations counted before the current arming */
    int refusals, finish_refusals, copy_failures;
    bool lost_copies; /* some copy to the host tier failed (and was counted) during the run */
} fault_run;

static fault_run *g_fr;

static void faults_pause(void)
{
    if (!g_fr || !g_fr->fail_at) return;
    g_fr->used += kvhal_fault_alloc_count();
    kvhal_fault_inject_alloc(0);
}

static void faults_resume(void)
{
    if (!g_fr || !g_fr->fail_at) return;
    /* the counter restarts at every arming: the fault keeps its place in the workload's own allocations */
    kvhal_fault_inject_alloc(g_fr->used < g_fr->fail_at ? g_fr->fail_at - g_fr->used : 0);
}

static void refusal(kvhal_status st, const char *what)
{
    if (st != KVHAL_OUT_OF_MEMORY)
        fail_msg("%s at allocation %lld: %s (%s)", what, (long long)g_fr->fail_at, kvhal_status_name(st),
                 kvhal_last_error());
    if (!kvhal_last_error()[0])
        fail_msg("%s at allocation %lld: refused with no last error", what, (long long)g_fr->fail_at);
    g_fr->refusals++;
}

/* A workload call: refused only with a message, and then done again. */
#define FALLIBLE(call)                                                                                          \
    do {                                                                                                        \
        kvhal_clear_error();                                                                                    \
        kvhal_status s_ = (call);                                                                               \
        if (s_ != KVHAL_OK) {                                                                                   \
            refusal(s_, #call);                                                                                 \
            OKS(call);                                                                                          \
        }                                                                                                       \
    } while (0)

typedef struct cm_state {
    int32_t nfree, available;
    kvhal_prefix_size_info si;
    kvhal_host_tier_stats ts;
    uint64_t write_failures;
} cm_state;

static void state_of(const rig *r, cm_state *s)
{
    memset(s, 0, sizeof *s);
    s->nfree = kvhal_cache_manager_num_free(r->cm);
    s->available = kvhal_cache_manager_available(r->cm);
    OKS(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(r->cm), &s->si));
    OKS(kvhal_cache_manager_tier_stats(r->cm, &s->ts));
    OKS(kvhal_cache_manager_tier_write_failures(r->cm, &s->write_failures));
}

static void finish_checked(rig *r, const int32_t *tokens, size_t n, const int32_t *pages, kvhal_prefix_handle h,
                           size_t dl, bool suffix)
{
    faults_pause();
    cm_state before, after;
    state_of(r, &before);
    faults_resume();
    kvhal_clear_error();
    kvhal_status st = suffix ? kvhal_cache_manager_cache_finished_suffix(r->cm, h, tokens + dl, n - dl,
                                                                         pages + dl / (size_t)r->ps)
                             : kvhal_cache_manager_cache_finished(r->cm, tokens, n, pages, h);
    faults_pause();
    state_of(r, &after);
    if (st != KVHAL_OK) {
        refusal(st, suffix ? "cache_finished_suffix" : "cache_finished");
        g_fr->finish_refusals++;
        if (memcmp(&before, &after, sizeof before))
            fail_msg("a refused finish (allocation %lld) changed the manager: free %d -> %d, available %d -> %d, "
                     "cached tokens %zu -> %zu, host pages %lld -> %lld, written %llu -> %llu",
                     (long long)g_fr->fail_at, before.nfree, after.nfree, before.available, after.available,
                     before.si.total_tokens, after.si.total_tokens, (long long)before.ts.host_pages_used,
                     (long long)after.ts.host_pages_used, (unsigned long long)before.ts.pages_written,
                     (unsigned long long)after.ts.pages_written);
        integrity(r);
        /* the handle is still the request's: the finish goes through now */
        if (suffix) OKS(kvhal_cache_manager_cache_finished_suffix(r->cm, h, tokens + dl, n - dl, pages + dl / (size_t)r->ps));
        else OKS(kvhal_cache_manager_cache_finished(r->cm, tokens, n, pages, h));
    } else if (after.write_failures != before.write_failures) {
        /* the pages are cached on the device; their host copies are missing and counted, none written */
        g_fr->copy_failures++;
        assert_true(after.write_failures > before.write_failures);
        assert_int_equal(after.ts.pages_written, before.ts.pages_written);
        assert_true(after.si.total_tokens >= before.si.total_tokens);
    }
    /* consumed either way now */
    assert_int_equal(kvhal_cache_manager_cache_finished(r->cm, tokens, n, pages, h), KVHAL_INVALID_HANDLE);
    integrity(r);
    faults_resume();
}

/* A request in flight: matched, loaded back, its pages allocated and written. */
typedef struct fault_req {
    const int32_t *tokens;
    size_t n, dl;
    kvhal_prefix_handle h;
    int32_t pages[32];
} fault_req;

static void fault_begin(rig *r, fault_req *q, const int32_t *tokens, size_t n)
{
    const size_t ps = (size_t)r->ps, np = (n + ps - 1) / ps;
    int32_t *pages = q->pages;
    uint64_t hs[32];
    assert_true(np < 32);
    q->tokens = tokens;
    q->n = n;
    chain(r->ps, tokens, n, hs);
    kvhal_prefix_handle h;
    size_t dl = 0, hl = 0, loaded = 0;
    /* the engine's way: all but the last token matched, the whole prompt given to load_back */
    FALLIBLE(kvhal_cache_manager_match_tiered(r->cm, tokens, n - 1, &h, &dl, &hl, pages, np + 1));
    q->h = h;
    q->dl = dl;
    faults_pause();
    for (size_t i = 0; i < dl / ps; i++) expect_page(r, pages[i], hs[i], "device hit");
    faults_resume();
    if (hl) {
        kvhal_clear_error();
        kvhal_status st = kvhal_cache_manager_load_back(r->cm, h, tokens, n, pages + dl / ps, np - dl / ps, &loaded);
        if (st != KVHAL_OK) {
            refusal(st, "load_back");
            assert_int_equal(loaded, 0);
            OKS(kvhal_cache_manager_load_back(r->cm, h, tokens, n, pages + dl / ps, np - dl / ps, &loaded));
        }
        assert_int_equal(loaded, hl);
        FALLIBLE(kvhal_cache_manager_transfer_wait(r->cm));
        faults_pause();
        for (size_t i = dl / ps; i < (dl + hl) / ps; i++) expect_page(r, pages[i], hs[i], "loaded back");
        faults_resume();
    }
    const size_t have = (dl + loaded) / ps;
    FALLIBLE(kvhal_cache_manager_allocate(r->cm, (int32_t)(np - have), pages + have));
    faults_pause();
    for (size_t i = have; i < n / ps; i++) write_page(r, pages[i], hs[i]);
    /* the writes are in before the manager's own stream copies the pages to the host tier (kvhal.h: a page's K/V
     * writes must be complete when its request finishes, unless they ran on the tier's stream) */
    OKS(kvhal_device_synchronize(r->dev));
    faults_resume();
}

static void fault_end(rig *r, fault_req *q, bool suffix)
{
    finish_checked(r, q->tokens, q->n, q->pages, q->h, q->dl, suffix);
}

static void fault_request(rig *r, const int32_t *tokens, size_t n, bool suffix)
{
    fault_req q;
    fault_begin(r, &q, tokens, n);
    fault_end(r, &q, suffix);
}

/* Requests over 10 device pages and 6 host pages of 2 tokens: shared prefixes, eviction to host, load-back (all but
 * the last token matched, the whole prompt loaded), suffix finishes, a request whose pages are all cached already,
 * two requests in flight at once finishing in the other order, an explicit eviction and a host-tier clear. */
static void fault_workload(kvhal_device dev, kvhal_write_policy pol, fault_run *fr)
{
    rig r;
    rig_make_on(&r, dev, 10, 6, 2, pol, 256);
    g_fr = fr;
    int32_t a[12], b[8], c[8], d[9], e[10];
    for (int i = 0; i < 12; i++) a[i] = 100 + i;
    for (int i = 0; i < 8; i++) b[i] = 200 + i, c[i] = 300 + i;
    for (int i = 0; i < 9; i++) d[i] = 400 + i;
    for (int i = 0; i < 10; i++) e[i] = 500 + i;
    memcpy(b, a, 2 * sizeof *b); /* b shares a's first page */
    memcpy(e, d, 4 * sizeof *e); /* e shares d's first two */
    if (fr->fail_at) kvhal_fault_inject_alloc(fr->fail_at);
    fault_request(&r, a, 9, false);
    fault_request(&r, b, 8, false);
    fault_request(&r, c, 8, false);  /* evicts: a's pages go to the host tier (or are there already) */
    fault_request(&r, a, 12, true);  /* a back from host or device, then more pages below it */
    fault_request(&r, c, 7, false);  /* all cached: duplicates and a partial page freed */
    fault_req qd, qe;
    fault_begin(&r, &qd, d, 9);       /* two in flight: e inserts d's shared pages first */
    fault_begin(&r, &qe, e, 10);
    fault_end(&r, &qe, false);
    fault_end(&r, &qd, true);
    FALLIBLE(kvhal_cache_manager_evict(r.cm, 8, NULL));
    fault_request(&r, b, 8, true);
    FALLIBLE(kvhal_cache_manager_transfer_wait(r.cm));
    FALLIBLE(kvhal_cache_manager_host_tier_clear(r.cm));
    fault_request(&r, a, 12, false);
    faults_pause();
    kvhal_fault_inject_alloc(0);
    g_fr = NULL;
    integrity(&r);
    uint64_t wf = 0;
    OKS(kvhal_cache_manager_tier_write_failures(r.cm, &wf));
    fr->lost_copies = wf > 0;
    rig_free(&r);
}

static void finish_faults_case(kvhal_device dev, kvhal_write_policy pol)
{
    fault_run clean = {0};
    /* a clean run: how many allocations the workload makes */
    kvhal_fault_inject_alloc(0);
    clean.fail_at = INT64_MAX;
    fault_workload(dev, pol, &clean);
    const int64_t total = clean.used;
    assert_int_equal(clean.refusals, 0);
    assert_true(total > 0);
    int refusals = 0, finish_refusals = 0, copy_failures = 0, lost = 0;
    for (int64_t k = 1; k <= total; k++) {
        fault_run fr = {.fail_at = k};
        fault_workload(dev, pol, &fr);
        refusals += fr.refusals;
        finish_refusals += fr.finish_refusals;
        copy_failures += fr.copy_failures;
        lost += fr.lost_copies;
    }
    char name[32];
    OKS(kvhal_device_format(dev, name, sizeof name));
    printf("[ faults   ] %s %s: %lld allocation points: %d refused a call (%d a finish), %d failed a host copy (%d "
           "of them in a finish that went on), %lld absorbed\n", name,
           pol == KVHAL_WRITE_THROUGH ? "write-through" : "write-back", (long long)total, refusals, finish_refusals,
           lost, copy_failures, (long long)total - refusals - lost);
    assert_true(refusals + lost <= (int)total); /* the fault fires once per run */
    assert_true(finish_refusals > 0);
    if (pol == KVHAL_WRITE_THROUGH) assert_true(copy_failures > 0);
}

/* on cpu:0 and the first OpenCL device when there is one (its module's allocations are walked too) */
static void test_finish_alloc_faults(void **state)
{
    (void)state;
    kvhal_device devs[2] = {{KVHAL_DEVICE_CPU, 0}, {KVHAL_DEVICE_OPENCL, 0}};
    int32_t ncl = 0;
    const int n = kvhal_device_count(KVHAL_DEVICE_OPENCL, &ncl) == KVHAL_OK && ncl > 0 ? 2 : 1;
    for (int i = 0; i < n; i++) {
        finish_faults_case(devs[i], KVHAL_WRITE_THROUGH);
        finish_faults_case(devs[i], KVHAL_WRITE_BACK);
    }
}

/* transfer_wait waits for load_back's copies also when the write-backs it stores copy nothing (every evicted page
 * held by the host tier already): the wait is counted with the copies held in flight, and the pages loaded back are
 * read after it. */
static void wait_covers_loads_on(kvhal_device dev)
{
    rig r;
    rig_make_on(&r, dev, 8, 32, 2, KVHAL_WRITE_BACK, 0);
    int32_t a[4] = {31, 32, 33, 34}, b[4] = {41, 42, 43, 44};
    uint64_t hb[2];
    chain(2, b, 4, hb);
    run_request(&r, a, 4, NULL, NULL, false);
    run_request(&r, b, 4, NULL, NULL, false);
    size_t ev = 0, dl, hl, loaded = 0;
    OKS(kvhal_cache_manager_evict(r.cm, 8, &ev)); /* a and b to the host tier */
    assert_int_equal(ev, 8);
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    run_request(&r, a, 4, &dl, &hl, false); /* a back on the device; the host tier still holds it */
    assert_int_equal(hl, 4);
    OKS(kvhal_cache_manager_evict(r.cm, 4, &ev)); /* a queued again: its store will copy nothing */
    assert_int_equal(ev, 4);
    kvhal_fault_hold_streams(1);
    kvhal_prefix_handle h;
    int32_t pages[2];
    OKS(kvhal_cache_manager_match_tiered(r.cm, b, 4, &h, &dl, &hl, pages, 2));
    assert_int_equal(dl, 0);
    assert_int_equal(hl, 4);
    OKS(kvhal_cache_manager_load_back(r.cm, h, b, 4, pages, 2, &loaded));
    assert_int_equal(loaded, 4);
    assert_int_equal(kvhal_fault_stream_waits(), 0); /* free pages covered it: nothing stored or waited for yet */
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    assert_true(kvhal_fault_stream_waits() >= 1);
    kvhal_fault_hold_streams(0);
    for (int i = 0; i < 2; i++) expect_page(&r, pages[i], hb[i], "loaded back");
    OKS(kvhal_cache_manager_cache_finished(r.cm, b, 4, pages, h));
    integrity(&r);
    rig_free(&r);
}

/* on cpu:0 and the first OpenCL device when there is one */
static void test_wait_covers_loads(void **state)
{
    (void)state;
    int32_t ncl = 0;
    wait_covers_loads_on((kvhal_device){KVHAL_DEVICE_CPU, 0});
    if (kvhal_device_count(KVHAL_DEVICE_OPENCL, &ncl) == KVHAL_OK && ncl > 0)
        wait_covers_loads_on((kvhal_device){KVHAL_DEVICE_OPENCL, 0});
}

/* load_back never loads past what the match reported: an engine that matched all but the last token passes the
 * whole prompt; a shorter match bounds it; a plain match bounds it by its tokens; a second load_back loads
 * nothing. */
static void test_load_back_bounded(void **state)
{
    (void)state;
    rig r;
    rig_make(&r, 8, 16, 4, KVHAL_WRITE_THROUGH, 0);
    int32_t a[32], b[32];
    for (int i = 0; i < 32; i++) a[i] = 700 + i, b[i] = 900 + i;
    uint64_t hs[8];
    chain(4, a, 32, hs);
    run_request(&r, a, 32, NULL, NULL, false);
    run_request(&r, b, 32, NULL, NULL, false); /* a: host only now */
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    kvhal_prefix_handle h;
    size_t dl, hl, loaded = 99;
    int32_t pages[8];
    /* 31 tokens matched: 7 whole pages reported; the whole prompt (32) given to load_back with room for 7 */
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 31, &h, &dl, &hl, pages, 8));
    assert_int_equal(dl, 0);
    assert_int_equal(hl, 28);
    OKS(kvhal_cache_manager_load_back(r.cm, h, a, 32, pages, 7, &loaded));
    assert_int_equal(loaded, 28);
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    for (int i = 0; i < 7; i++) expect_page(&r, pages[i], hs[i], "loaded back");
    size_t again = 99;
    OKS(kvhal_cache_manager_load_back(r.cm, h, a, 32, pages + 7, 1, &again)); /* once per request */
    assert_int_equal(again, 0);
    OKS(kvhal_cache_manager_free(r.cm, pages, 7));
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    /* a shorter match (16 tokens: 4 pages) bounds a load_back given all 32 */
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 16, &h, &dl, &hl, pages, 8));
    assert_int_equal(dl + hl, 16);
    OKS(kvhal_cache_manager_load_back(r.cm, h, a, 32, pages + dl / 4, 8, &loaded));
    assert_int_equal(loaded, hl);
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    OKS(kvhal_cache_manager_free(r.cm, pages + dl / 4, (int32_t)(loaded / 4)));
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    /* match_tiered without host_len, and a plain match: bounded by the tokens they were given */
    run_request(&r, b, 32, NULL, NULL, false); /* a to host again where it came back */
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    OKS(kvhal_cache_manager_match_tiered(r.cm, a, 13, &h, &dl, NULL, pages, 8));
    OKS(kvhal_cache_manager_load_back(r.cm, h, a, 32, pages + dl / 4, 8, &loaded));
    assert_true(dl + loaded <= 12);
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    if (loaded) OKS(kvhal_cache_manager_free(r.cm, pages + dl / 4, (int32_t)(loaded / 4)));
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    OKS(kvhal_cache_manager_match(r.cm, a, 9, &h, &dl, pages, 8));
    OKS(kvhal_cache_manager_load_back(r.cm, h, a, 32, pages + dl / 4, 8, &loaded));
    assert_true(dl + loaded <= 8);
    OKS(kvhal_cache_manager_transfer_wait(r.cm));
    if (loaded) OKS(kvhal_cache_manager_free(r.cm, pages + dl / 4, (int32_t)(loaded / 4)));
    OKS(kvhal_prefix_unlock(kvhal_cache_manager_prefix(r.cm), h));
    integrity(&r);
    rig_free(&r);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = NULL;
    assert_int_equal(kvhal_cache_manager_create_tiered(8, 2, KVHAL_PREFIX_RADIX, NULL, &cm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "cfg"));
    kvhal_host_tier_config tc = {0};
    assert_int_equal(kvhal_cache_manager_create_tiered(8, 2, KVHAL_PREFIX_RADIX, &tc, &cm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "cfg.cache"));
    rig r;
    rig_make(&r, 8, 8, 2, KVHAL_WRITE_BACK, 0);
    tc.cache = r.pc;
    assert_int_equal(kvhal_cache_manager_create_tiered(8, 4, KVHAL_PREFIX_RADIX, &tc, &cm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "page_size"));
    assert_int_equal(kvhal_cache_manager_create_tiered(9, 2, KVHAL_PREFIX_RADIX, &tc, &cm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "total_pages"));
    tc.policy = (kvhal_write_policy)5;
    assert_int_equal(kvhal_cache_manager_create_tiered(8, 2, KVHAL_PREFIX_RADIX, &tc, &cm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "cfg.policy"));
    tc.policy = KVHAL_WRITE_BACK;
    tc.event_capacity = 1;
    assert_int_equal(kvhal_cache_manager_create_tiered(8, 2, KVHAL_PREFIX_RADIX, &tc, &cm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "cfg.event_capacity"));
    assert_null(cm);
    size_t n;
    kvhal_kv_event ev;
    int32_t tok[2];
    assert_int_equal(kvhal_cache_manager_events_read(r.cm, &ev, tok, 1, &n), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "event_capacity"));
    kvhal_cache_manager *plain;
    OKS(kvhal_cache_manager_create(8, 2, KVHAL_PREFIX_RADIX, &plain));
    assert_int_equal(kvhal_cache_manager_transfer_wait(plain), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "tiered"));
    size_t loaded;
    int32_t pages[2];
    assert_int_equal(kvhal_cache_manager_load_back(r.cm, 0, tok, 2, pages, 2, &loaded), KVHAL_INVALID_HANDLE);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    OKS(kvhal_cache_manager_destroy(plain));
    /* host memory and stream polling */
    kvhal_host_memory *hm = NULL;
    assert_int_equal(kvhal_host_memory_create(r.dev, 0, &hm), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "bytes"));
    assert_int_equal(kvhal_host_memory_create(r.dev, 64, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "out"));
    OKS(kvhal_host_memory_create(r.dev, 64, &hm));
    assert_int_equal(kvhal_host_memory_size(hm), 64);
    assert_non_null(kvhal_host_memory_ptr(hm));
    OKS(kvhal_host_memory_destroy(hm));
    assert_int_equal(kvhal_host_memory_destroy(hm), KVHAL_INVALID_HANDLE);
    assert_null(kvhal_host_memory_ptr(hm));
    OKS(kvhal_host_memory_destroy(NULL));
    assert_int_equal(kvhal_stream_query(NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "s:"));
    kvhal_stream *s = NULL;
    if (kvhal_stream_create(r.dev, &s) == KVHAL_OK) {
        OKS(kvhal_stream_synchronize(s));
        OKS(kvhal_stream_query(s)); /* nothing queued: done */
        OKS(kvhal_stream_destroy(s));
    }
    /* a page transfer with a buffer of another paged cache's host memory that is too small: out of range */
    OKS(kvhal_host_memory_create(r.dev, kvhal_paged_cache_host_page_bytes(r.pc), &hm));
    assert_int_equal(kvhal_paged_cache_transfer(r.pc, hm, (int64_t[]){0, 1}, 1, KVHAL_TO_HOST, NULL),
                     KVHAL_OUT_OF_RANGE);
    assert_non_null(strstr(kvhal_last_error(), "host page 1"));
    OKS(kvhal_paged_cache_transfer(r.pc, hm, (int64_t[]){0, 0}, 1, KVHAL_TO_HOST, NULL));
    OKS(kvhal_host_memory_destroy(hm));
    rig_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_and_load_back), cmocka_unit_test(test_model_random),
        cmocka_unit_test(test_drain),                 cmocka_unit_test(test_drain_through),
        cmocka_unit_test(test_events_overflow),       cmocka_unit_test(test_events_evict_overflow),       cmocka_unit_test(test_hash_stable),
        cmocka_unit_test(test_alloc_faults),          cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_finish_alloc_faults),   cmocka_unit_test(test_load_back_bounded),
        cmocka_unit_test(test_wait_covers_loads),
    };
    return cmocka_run_group_tests_name("tiers", tests, NULL, NULL);
}

/* fuzz_xfer.c — libFuzzer target over the transfer agent's handling of what remote peers send. An
 * agent (UCX "self" transport, made once) with a small CPU paged cache registered has three peers attached (A, B
 * and C, sessions of fuzz_xfer.h): a pending receive from A and from B into pages it chose from a cache manager,
 * and, once C grants pages for request C, a send of its own pages to C. The input is a stream of frames (HELLO,
 * HELLO_ACK, AUTH, GRANT, DATA, ACK, BYE, IPC_MAP, IPC_MAP_ACK, DATA_IPC or any other bytes) handed to the agent's
 * active-message handler through kvhal__xfer_recv_frame (xfer_internal.h), interleaved with progress
 * (acknowledgements, IPC imports and copies, HELLOs accepted over an endpoint to itself), local cancels and
 * disconnects. Record format: fuzz_xfer.h.
 *
 * Checked (abort on failure): after every record, the cache manager's free pages are exactly those of no receive
 * that is pending or completed (a failed or cancelled receive gave its pages back, nothing else did) and a
 * completed receive has every byte; one RECV_DONE event per finished receive, none for another; the send's
 * acknowledged bytes never exceed its total, it completes only with every byte acknowledged, and says so in one
 * SEND_DONE event; send_pages takes whatever pages a GRANT event names or refuses them with a status; after the
 * input, once every transfer is released and every peer disconnected, the agent holds nothing
 * (kvhal__xfer_agent_held), every page is free again, the manager's integrity holds, and every byte of the cache
 * outside the granted pages is the pattern written before. ASan catches a write past the cache buffer, LeakSanitizer
 * anything the input leaked. */
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_xfer.h"
#include "kvhal.h"
#include "kvhal_xfer.h"
#include "xfer_internal.h"
#include "xfer_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(c)                                                                                              \
    do {                                                                                                        \
        if (!(c)) abort();                                                                                      \
    } while (0)

#define MAX_ACCEPTED 64

typedef struct rig {           /* one receiver, made on first use and kept (UCX starts once per process) */
    kvhal_xfer_agent *ag;
    kvhal_paged_cache *cache;
    kvhal_buffer *buf;
    size_t bytes;
    uint8_t *pattern;          /* what the cache holds before each input */
    uint8_t *granted;          /* per byte of the cache: 1 inside a granted page (may change) */
    uint8_t self_addr[XW_MAX_ADDR];
    size_t self_addr_len;
} rig;

static rig rigs[2];
static kvhal_paged_cache *sender; /* the peers' cache as the IPC path imports it (shareable) */
static uint8_t send_blob[XW_IPC_BLOB_MAX];
static size_t send_blob_len;

static void mark_granted(rig *r, const int32_t *pages, int32_t n)
{
    for (int32_t l = 0; l < FX_LAYERS; l++) {
        kvhal_tensor k, v;
        REQUIRE(kvhal_paged_cache_layer(r->cache, l, &k, &v) == KVHAL_OK);
        for (int32_t i = 0; i < n; i++)
            for (int kv = 0; kv < 2; kv++) {
                const kvhal_tensor *t = kv ? &v : &k;
                const size_t o = t->offset + (size_t)pages[i] * (size_t)t->strides[0] * 2u;
                REQUIRE(o + FX_CHUNK <= r->bytes);
                memset(r->granted + o, 1, FX_CHUNK);
            }
    }
}

/* At exit: the shareable cache's segment would outlive the process otherwise. */
static void teardown(void)
{
    for (int i = 0; i < 2; i++) {
        kvhal_xfer_agent_destroy(rigs[i].ag);
        kvhal_paged_cache_destroy(rigs[i].cache);
        free(rigs[i].pattern);
        free(rigs[i].granted);
    }
    memset(rigs, 0, sizeof rigs);
    kvhal_paged_cache_destroy(sender);
    sender = NULL;
}

static rig *get_rig(int which)
{
    rig *r = &rigs[which];
    if (r->ag) return r;
    if (!sender) {
        atexit(teardown);
        kvhal_paged_cache_config c = fx_cache_config(FX_SEND_PAGES, KVHAL_LAYER_FIRST);
        REQUIRE(kvhal_paged_cache_create_shareable(&c, &sender) == KVHAL_OK);
        kvhal_tensor k, v;
        REQUIRE(kvhal_paged_cache_layer(sender, 0, &k, &v) == KVHAL_OK);
        REQUIRE(kvhal_buffer_ipc_export(k.buffer, send_blob, sizeof send_blob, &send_blob_len) == KVHAL_OK);
    }
    kvhal_paged_cache_config c = fx_cache_config(FX_PAGES, which ? KVHAL_PAGE_FIRST : KVHAL_LAYER_FIRST);
    REQUIRE(kvhal_paged_cache_create(&c, &r->cache) == KVHAL_OK);
    REQUIRE(kvhal_paged_cache_num_blocks(r->cache) == FX_PAGES);
    kvhal_tensor k, v;
    REQUIRE(kvhal_paged_cache_layer(r->cache, 0, &k, &v) == KVHAL_OK);
    r->buf = k.buffer;
    r->bytes = kvhal_buffer_size(r->buf);
    r->pattern = malloc(r->bytes);
    r->granted = calloc(1, r->bytes);
    REQUIRE(r->pattern && r->granted);
    for (size_t i = 0; i < r->bytes; i++) r->pattern[i] = (uint8_t)(0xa5u ^ (i * 29u) ^ (i >> 8));
    mark_granted(r, FX_GRANT_A, FX_GRANT_A_N);
    mark_granted(r, FX_GRANT_B, FX_GRANT_B_N);
    /* a timeout no input reaches: deadlines would make a run depend on the clock */
    kvhal_xfer_config cfg = {.name = "fuzz", .token = FX_TOKEN, .timeout_ms = 3600000, .transports = "self",
                             .max_peers = 8};
    REQUIRE(kvhal_xfer_agent_create(&cfg, &r->ag) == KVHAL_OK);
    REQUIRE(kvhal_xfer_register_paged_cache(r->ag, r->cache) == KVHAL_OK);
    uint8_t blob[sizeof(xw_blob) + XW_MAX_ADDR];
    size_t len = 0;
    REQUIRE(kvhal_xfer_local_address(r->ag, blob, sizeof blob, &len) == KVHAL_OK);
    REQUIRE(len > sizeof(xw_blob) && len - sizeof(xw_blob) <= sizeof r->self_addr);
    r->self_addr_len = len - sizeof(xw_blob);
    memcpy(r->self_addr, blob + sizeof(xw_blob), r->self_addr_len);
    return r;
}

typedef struct recv_state {
    kvhal_xfer *x;
    const int32_t *pages;
    int32_t n;
    int done_events; /* RECV_DONE events seen for it: one once it finished, never two */
} recv_state;

typedef struct send_state {
    kvhal_xfer *x;   /* made on C's first GRANT for request C */
    int done_events; /* SEND_DONE events seen for it */
} send_state;

typedef struct run {
    rig *r;
    kvhal_cache_manager *cm;
    kvhal_xfer_peer *peer[3];     /* A, B, C (NULL once disconnected) */
    recv_state rx[2];
    send_state tx;
    kvhal_xfer_peer *accepted[MAX_ACCEPTED]; /* peers made by HELLOs */
    int n_accepted;
} run;

/* C's GRANT for request C: sends the first pages of FX_SEND_SRC into what it granted, once. The pages are
 * checked by the handler (inside C's page count); send_pages may still refuse them (a peer failed meanwhile). */
static void on_grant(run *u, const kvhal_xfer_event *ev)
{
    if (!u->peer[2] || ev->peer != u->peer[2] || ev->request_id != FX_REQUEST_C || u->tx.x) return;
    REQUIRE(ev->num_pages >= 1 && ev->pages);
    for (int32_t i = 0; i < ev->num_pages; i++) REQUIRE(ev->pages[i] >= 0 && ev->pages[i] < FX_SEND_PAGES);
    const int32_t n = ev->num_pages < FX_SEND_MAX ? ev->num_pages : FX_SEND_MAX;
    int32_t src[FX_SEND_MAX];
    for (int32_t i = 0; i < n; i++) src[i] = FX_SEND_SRC[i % FX_SEND_SRC_N];
    const kvhal_status st = kvhal_xfer_send_pages(u->peer[2], FX_REQUEST_C, src, ev->pages, n, 0, FX_LAYERS, &u->tx.x);
    REQUIRE((st == KVHAL_OK) == (u->tx.x != NULL));
    /* the pages a GRANT event names are always ones send_pages takes; a peer that failed meanwhile is refused */
    REQUIRE(st != KVHAL_INVALID_ARGUMENT && st != KVHAL_OUT_OF_RANGE && st != KVHAL_INVALID_HANDLE);
    kvhal_clear_error();
}

/* Progress until no event is left; keeps the peers HELLOs made (to disconnect them at the end). */
static void pump(run *u)
{
    for (;;) { /* progress pumps whenever no event is queued: events are finite */
        kvhal_xfer_event ev;
        REQUIRE(kvhal_xfer_progress(u->r->ag, 0, &ev) == KVHAL_OK);
        if (ev.type == KVHAL_XFER_EVENT_NONE) return;
        if (ev.type == KVHAL_XFER_EVENT_PEER_CONNECTED) {
            REQUIRE(ev.peer && u->n_accepted < MAX_ACCEPTED); /* max_peers keeps it far below */
            u->accepted[u->n_accepted++] = ev.peer;
        }
        if (ev.type == KVHAL_XFER_EVENT_RECV_DONE) { /* only ours are posted */
            REQUIRE(ev.xfer == u->rx[0].x || ev.xfer == u->rx[1].x);
            REQUIRE(++u->rx[ev.xfer == u->rx[1].x].done_events == 1);
        }
        if (ev.type == KVHAL_XFER_EVENT_SEND_DONE) {
            REQUIRE(ev.xfer && ev.xfer == u->tx.x && ++u->tx.done_events == 1);
            kvhal_xfer_info info;
            REQUIRE(kvhal_xfer_get_info(ev.xfer, &info) == KVHAL_OK);
            REQUIRE(info.status == ev.status && info.status != KVHAL_BUSY);
        }
        if (ev.type == KVHAL_XFER_EVENT_GRANT) on_grant(u, &ev);
    }
}

/* A receive pending or completed holds its pages; a failed or cancelled one gave them back. */
static void check_pages(run *u)
{
    int32_t held = 0;
    for (int i = 0; i < 2; i++) {
        kvhal_xfer_info info;
        REQUIRE(kvhal_xfer_get_info(u->rx[i].x, &info) == KVHAL_OK);
        REQUIRE(info.is_receive && info.bytes_done <= info.bytes_total);
        REQUIRE(info.status != KVHAL_OK || info.bytes_done == info.bytes_total); /* complete: every byte written */
        if (info.status == KVHAL_BUSY || info.status == KVHAL_OK) held += u->rx[i].n;
    }
    kvhal_clear_error();
    REQUIRE(kvhal_cache_manager_num_free(u->cm) == FX_PAGES - held);
    if (u->tx.x) { /* acknowledged bytes: never past the total; complete only with all of them */
        kvhal_xfer_info info;
        REQUIRE(kvhal_xfer_get_info(u->tx.x, &info) == KVHAL_OK);
        REQUIRE(!info.is_receive && info.request_id == FX_REQUEST_C && info.bytes_done <= info.bytes_total);
        REQUIRE(info.status != KVHAL_OK || info.bytes_done == info.bytes_total);
    }
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* Hands one frame to the agent, in buffers of its exact size (ASan sees a read past either), after putting in
 * what only exists at run time (fuzz_xfer.h). */
static void deliver(run *u, const uint8_t *hdr, size_t hlen, const uint8_t *dat, size_t dlen, bool rndv)
{
    uint8_t *h = malloc(hlen ? hlen : 1), *d = NULL;
    REQUIRE(h);
    if (hlen) memcpy(h, hdr, hlen);
    xw_common c = {0};
    if (hlen >= sizeof c) memcpy(&c, h, sizeof c);
    if (c.type == XW_HELLO && hlen == sizeof(xw_hello)) {
        xw_hello hl;
        memcpy(&hl, h, sizeof hl);
        if (hl.addr_len == dlen) hl.addr_len = (uint32_t)u->r->self_addr_len;
        memcpy(h, &hl, sizeof hl);
        dat = u->r->self_addr;
        dlen = u->r->self_addr_len;
    } else if (c.type == XW_IPC_MAP && hlen == sizeof(xw_ipc_map) && dlen >= 8 && !memcmp(dat, FX_SENDBLOB, 8)) {
        xw_ipc_map m;
        memcpy(&m, h, sizeof m);
        if (m.blob_len == 8) {
            m.blob_len = (uint32_t)send_blob_len;
            memcpy(h, &m, sizeof m);
            d = malloc(send_blob_len + dlen - 8);
            REQUIRE(d);
            memcpy(d, send_blob, send_blob_len);
            memcpy(d + send_blob_len, dat + 8, dlen - 8);
            dlen = send_blob_len + dlen - 8;
        }
    }
    if (c.type == XW_IPC_PROOF && hlen == sizeof(xw_ipc_proof) && !memcmp(h + offsetof(xw_ipc_proof, reason),
                                                                          FX_PROVE, 7)) {
        xw_ipc_proof f;
        memcpy(&f, h, sizeof f);
        uint8_t nonce[XW_NONCE];
        kvhal_tensor k, v;
        REQUIRE(kvhal_paged_cache_layer(sender, 0, &k, &v) == KVHAL_OK);
        const uint64_t size = kvhal_buffer_size(k.buffer);
        if (kvhal__xfer_ipc_nonce(u->r->ag, c.dest_session, nonce) && f.offset <= size && size - f.offset >= XW_NONCE)
            REQUIRE(kvhal_memcpy_h2d(k.buffer, (size_t)f.offset, nonce, XW_NONCE, NULL) == KVHAL_OK);
        kvhal_clear_error();
    }
    if (c.type == XW_ACK && hlen == sizeof(xw_ack) && u->tx.x) {
        xw_ack k;
        memcpy(&k, h, sizeof k);
        if (k.xfer_id == FX_XFER_SEND) k.xfer_id = kvhal__xfer_id(u->tx.x);
        memcpy(h, &k, sizeof k);
    }
    if (!d) {
        d = malloc(dlen ? dlen : 1);
        REQUIRE(d);
        if (dlen) memcpy(d, dat, dlen);
    }
    if (c.type == XW_AUTH && hlen == sizeof(xw_auth) && !memcmp(h + offsetof(xw_auth, proof), FX_PROVE, 7)) {
        kvhal__xfer_prove_pending(u->r->ag);
        free(h);
        free(d);
        kvhal_clear_error();
        return;
    }
    if (c.type == XW_DATA) rndv = false;
    const ucs_status_t st = kvhal__xfer_recv_frame(u->r->ag, h, hlen, d, dlen, rndv);
    /* UCX takes an error from the handler only for a rendezvous frame, and INPROGRESS only for an accepted one */
    REQUIRE(st != UCS_INPROGRESS && (rndv || st == UCS_OK));
    free(h);
    free(d);
    kvhal_clear_error();
}

static void disconnect(kvhal_xfer_peer **p)
{
    if (!*p) return;
    REQUIRE(kvhal_xfer_disconnect(*p) == KVHAL_OK);
    *p = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    run u;
    memset(&u, 0, sizeof u);
    u.r = get_rig(data[0] & 1);
    data++;
    size--;
    rig *r = u.r;
    REQUIRE(kvhal_memcpy_h2d(r->buf, 0, r->pattern, r->bytes, NULL) == KVHAL_OK);

    /* the receiver's pages: all allocated, then those not granted freed again (the grants are fixed page ids) */
    REQUIRE(kvhal_cache_manager_create(FX_PAGES, FX_BLOCK, KVHAL_PREFIX_RADIX, &u.cm) == KVHAL_OK);
    int32_t all[FX_PAGES];
    uint8_t keep[FX_PAGES] = {0};
    REQUIRE(kvhal_cache_manager_allocate(u.cm, FX_PAGES, all) == KVHAL_OK);
    for (int i = 0; i < FX_GRANT_A_N; i++) keep[FX_GRANT_A[i]] = 1;
    for (int i = 0; i < FX_GRANT_B_N; i++) keep[FX_GRANT_B[i]] = 1;
    for (int32_t p = 0; p < FX_PAGES; p++)
        if (!keep[p]) REQUIRE(kvhal_cache_manager_free(u.cm, &p, 1) == KVHAL_OK);

    const xw_geometry g = fx_geometry();
    REQUIRE(kvhal__xfer_attach_peer(r->ag, FX_SESSION_A, &g, &u.peer[0]) == KVHAL_OK);
    REQUIRE(kvhal__xfer_attach_peer(r->ag, FX_SESSION_B, &g, &u.peer[1]) == KVHAL_OK);
    REQUIRE(kvhal__xfer_attach_peer(r->ag, FX_SESSION_C, &g, &u.peer[2]) == KVHAL_OK);
    u.rx[0] = (recv_state){NULL, FX_GRANT_A, FX_GRANT_A_N, 0};
    u.rx[1] = (recv_state){NULL, FX_GRANT_B, FX_GRANT_B_N, 0};
    REQUIRE(kvhal_xfer_post_receive(u.peer[0], FX_REQUEST_A, FX_GRANT_A, FX_GRANT_A_N, u.cm, &u.rx[0].x) == KVHAL_OK);
    REQUIRE(kvhal_xfer_post_receive(u.peer[1], FX_REQUEST_B, FX_GRANT_B, FX_GRANT_B_N, u.cm, &u.rx[1].x) == KVHAL_OK);
    check_pages(&u);

    while (size > 0) {
        const unsigned op = data[0];
        size_t hlen = size >= 3 ? rd16(data + 1) : 0, dlen = size >= 5 ? rd16(data + 3) : 0;
        const size_t skip = size < 5 ? size : 5;
        data += skip;
        size -= skip;
        if (hlen > size) hlen = size;
        const uint8_t *hdr = data;
        data += hlen;
        size -= hlen;
        if (dlen > size) dlen = size;
        const uint8_t *dat = data;
        data += dlen;
        size -= dlen;
        const int which = (op & FX_THIRD) ? 2 : (op & FX_SECOND) ? 1 : 0;
        switch (op & 7) {
        case FX_FRAME: deliver(&u, hdr, hlen, dat, dlen, op & FX_RNDV); break;
        case FX_FRAME_PUMP:
            deliver(&u, hdr, hlen, dat, dlen, op & FX_RNDV);
            pump(&u);
            break;
        case FX_CANCEL:
            if (which < 2) REQUIRE(kvhal_xfer_cancel(u.rx[which].x) == KVHAL_OK);
            else if (u.tx.x) REQUIRE(kvhal_xfer_cancel(u.tx.x) == KVHAL_OK);
            break;
        case FX_DISCONNECT: disconnect(&u.peer[which]); break;
        default: pump(&u); break;
        }
        check_pages(&u);
    }
    for (int i = 0; i < 3; i++) { /* connections still waiting for a proof become peers, disconnected below (a
                                   * HELLO queued becomes one in a pump) */
        pump(&u);
        kvhal__xfer_prove_pending(r->ag);
    }
    pump(&u);
    check_pages(&u);
    for (int i = 0; i < 2; i++) { /* a finished receive said so once */
        kvhal_xfer_info info;
        REQUIRE(kvhal_xfer_get_info(u.rx[i].x, &info) == KVHAL_OK);
        REQUIRE(u.rx[i].done_events == (info.status != KVHAL_BUSY));
    }
    if (u.tx.x) {
        kvhal_xfer_info info;
        REQUIRE(kvhal_xfer_get_info(u.tx.x, &info) == KVHAL_OK);
        REQUIRE(u.tx.done_events == (info.status != KVHAL_BUSY));
    }

    /* the end: completed receives' pages are ours to free; the rest go back as the receives are released */
    for (int i = 0; i < 2; i++) {
        kvhal_xfer_info info;
        REQUIRE(kvhal_xfer_get_info(u.rx[i].x, &info) == KVHAL_OK);
        if (info.status == KVHAL_OK) REQUIRE(kvhal_cache_manager_free(u.cm, u.rx[i].pages, u.rx[i].n) == KVHAL_OK);
        REQUIRE(kvhal_xfer_release(u.rx[i].x) == KVHAL_OK);
    }
    if (u.tx.x) REQUIRE(kvhal_xfer_release(u.tx.x) == KVHAL_OK);
    for (int i = 0; i < 3; i++) disconnect(&u.peer[i]);
    for (int i = 0; i < u.n_accepted; i++) disconnect(&u.accepted[i]);
    for (int i = 0; i < 1000 && kvhal__xfer_agent_held(r->ag); i++) {
        kvhal_xfer_event ev;
        REQUIRE(kvhal_xfer_progress(r->ag, 0, &ev) == KVHAL_OK);
    }
    REQUIRE(kvhal__xfer_agent_held(r->ag) == 0);
    REQUIRE(kvhal_cache_manager_num_free(u.cm) == FX_PAGES);
    REQUIRE(kvhal_cache_manager_check_integrity(u.cm) == KVHAL_OK);
    kvhal_cache_manager_destroy(u.cm);

    uint8_t *now = malloc(r->bytes);
    REQUIRE(now);
    REQUIRE(kvhal_memcpy_d2h(now, r->buf, 0, r->bytes, NULL) == KVHAL_OK);
    for (size_t i = 0; i < r->bytes; i++) REQUIRE(r->granted[i] || now[i] == r->pattern[i]);
    free(now);
    kvhal_clear_error();
    return 0;
}

/* basic.c — a transfer byte by byte on every device, refused connections, hostile frames, stalled and killed
 * peers, cancel, bad arguments, destroy in flight. */
#include "xfer_test.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* a transfer verified byte by byte, on every device present                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
static void transfer_on(kvhal_device rdev, kvhal_device sdev)
{
    server s;
    server_start(&s, rdev, 5000);
    kvhal_paged_cache *sc = make_cache(sdev, HEADS, 40, KVHAL_LAYER_FIRST);
    kvhal_buffer *sb = cache_buffer(sc);
    kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    kvhal_xfer_peer *pa;
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &pa), KVHAL_OK);
    assert_string_equal(kvhal_xfer_peer_name(pa), "decode");
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    kvhal_xfer_peer *pb = s.evs[e].peer;
    assert_string_equal(kvhal_xfer_peer_name(pb), "prefill");

    /* scattered source pages written with a pattern; scattered destination pages from the cache manager */
    enum { N = 7 };
    const int32_t src[N] = {33, 2, 17, 39, 5, 0, 21};
    int32_t dst[N];
    uint8_t want[CHUNK], got[CHUNK];
    for (int i = 0; i < N; i++)
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                fill_pattern(want, CHUNK, (uint64_t)(i * 100 + l * 10 + kv));
                assert_int_equal(kvhal_memcpy_h2d(sb, chunk_at(sc, l, kv, src[i]), want, CHUNK, NULL), KVHAL_OK);
            }
    pthread_mutex_lock(&s.mu);
    int32_t hole[10];
    assert_int_equal(kvhal_cache_manager_allocate(s.cm, 10, hole), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(s.cm, hole + 3, 4), KVHAL_OK); /* pages 3..6 come back first */
    pthread_mutex_unlock(&s.mu);
    kvhal_xfer *rx;
    assert_int_equal(grant(&s, pb, 77, N, dst, &rx), KVHAL_OK);
    /* the sender learns the grant */
    kvhal_xfer_event ev;
    sender_grant(a, &ev);
    assert_int_equal(ev.request_id, 77);
    assert_int_equal(ev.num_pages, N);
    assert_memory_equal(ev.pages, dst, sizeof dst);
    /* layer 0 alone, then layers 1..2: two transfers for one request */
    kvhal_xfer *tx0, *tx1;
    const int frames0 = atomic_load(&data_frames), threads0 = atomic_load(&xfer_threads);
    assert_int_equal(kvhal_xfer_send_pages(pa, 77, src, ev.pages, N, 0, 1, &tx0), KVHAL_OK);
    assert_int_equal(kvhal_xfer_send_pages(pa, 77, src, ev.pages, N, 1, L - 1, &tx1), KVHAL_OK);
    assert_int_equal(kvhal_xfer_wait(tx0, 5000), KVHAL_OK);
    assert_int_equal(kvhal_xfer_wait(tx1, 5000), KVHAL_OK);
    if (sdev.type == KVHAL_DEVICE_CPU && strcmp(tls, "tcp") == 0) {
        /* host pages over TCP are gathered: frames of TRANSFER_GATHER_FRAME_KIB at most (one page at least), by
         * the copy workers where there are any, in a transfer of several frames, if large enough
         * (TRANSFER_GATHER_KIB) */
        const char *fk = getenv("TRANSFER_GATHER_FRAME_KIB"), *gk = getenv("TRANSFER_GATHER_KIB"),
                   *wk = getenv("KVHAL_XFER_THREADS");
        const size_t cap = (fk ? (size_t)atol(fk) : 1024) * 1024;
        int frames = 0;
        for (int nl = 1; nl <= 2; nl++) {
            const size_t fit = cap / ((size_t)nl * 2 * CHUNK), per = fit ? fit : 1;
            frames += (int)((N + per - 1) / per);
        }
        assert_int_equal(atomic_load(&data_frames) - frames0, frames);
        if (wk && atoi(wk) == 0) assert_int_equal(atomic_load(&xfer_threads) - threads0, 0);
        /* and a receiver of a device cache starts its own, for the copies to the device */
        else if (wk && gk && atoi(gk) == 0)
            assert_int_equal(atomic_load(&xfer_threads) - threads0, atoi(wk) * (rdev.type == KVHAL_DEVICE_CPU ? 1 : 2));
    }
    /* plain (not shareable) caches: through UCX, in place on the host, else staged; host to host where the
     * transports include CMA (shm): read by the receiver from the sender's process (the CMA path) */
    const bool cma_offered = sdev.type == KVHAL_DEVICE_CPU && tls_cma(tls);
    const bool cma = cma_offered && rdev.type == KVHAL_DEVICE_CPU;
    assert_string_equal(kvhal_xfer_path(tx0), cma ? "cma" : sdev.type == KVHAL_DEVICE_CPU ? "host" : "staged");
    if (cma) assert_string_equal(kvhal_xfer_peer_ipc(pa), "cma");
    else if (cma_offered) assert_contains(kvhal_xfer_peer_ipc(pa), "not in host memory");
    else assert_string_equal(kvhal_xfer_peer_ipc(pa), "same host, no shareable cache");
    char msg[512];
    assert_int_equal(wait_recv(&s, rx, 5, msg, sizeof msg), KVHAL_OK);
    kvhal_xfer_info info;
    assert_int_equal(kvhal_xfer_get_info(rx, &info), KVHAL_OK);
    assert_int_equal(info.bytes_done, (uint64_t)N * L * 2 * CHUNK);
    assert_int_equal(info.bytes_total, info.bytes_done);
    assert_true(info.is_receive);
    pthread_mutex_lock(&s.mu);
    assert_string_equal(kvhal_xfer_path(rx), cma ? "cma" : rdev.type == KVHAL_DEVICE_CPU ? "host" : "staged");
    pthread_mutex_unlock(&s.mu);
    for (int i = 0; i < N; i++)
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                fill_pattern(want, CHUNK, (uint64_t)(i * 100 + l * 10 + kv));
                assert_int_equal(kvhal_memcpy_d2h(got, s.buf, chunk_at(s.cache, l, kv, dst[i]), CHUNK, NULL), KVHAL_OK);
                if (memcmp(got, want, CHUNK)) fail_msg("page %d (dst %d) layer %d %c differs", i, dst[i], l, kv ? 'V' : 'K');
            }
    check_cache(&s, dst, N);
    int d = wait_event(&s, KVHAL_XFER_EVENT_RECV_DONE, 0, 5);
    assert_ptr_equal(s.evs[d].xfer, rx);
    assert_int_equal(s.evs[d].status, KVHAL_OK);
    /* the pages are the caller's now: give them back with the hole pages */
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(s.cm, dst, N), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(s.cm, hole, 3), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(s.cm, hole + 7, 3), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    all_pages_free(&s);
    kvhal_xfer_release(tx0);
    kvhal_xfer_release(tx1);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(sc);
    server_stop(&s);
}

void test_transfer_every_device(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    transfer_on(cpu, cpu);
    int ran = 0;
    const kvhal_device_type types[] = {KVHAL_DEVICE_OPENCL, KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    for (int t = 0; t < 3; t++) {
        int32_t n = 0;
        kvhal_device_count(types[t], &n);
        if (n <= 0) continue;
        /* staged through host memory on one side, on both, and between two devices of the type */
        kvhal_device d0 = {types[t], 0}, d1 = {types[t], n > 1 ? 1 : 0};
        transfer_on(d0, d0);
        transfer_on(cpu, d0);
        transfer_on(d1, cpu);
        transfer_on(d1, d0);
        printf("# %s: %d device(s), staged transfers verified\n", kvhal_device_type_name(types[t]), (int)n);
        ran++;
    }
    if (!ran) printf("# no device besides the CPU: the staged path ran on none here\n");
}

/* ---------------------------------------------------------------------------------------------------------- */
/* refused connections                                                                                         */
/* ---------------------------------------------------------------------------------------------------------- */
void test_wrong_token_and_geometry(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 2000);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    kvhal_paged_cache *sc = make_cache(cpu, HEADS, 8, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "intruder", .token = "something", .timeout_ms = 2000, .transports = tls};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    kvhal_xfer_peer *p = (kvhal_xfer_peer *)1;
    /* no cache registered yet */
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_INVALID_ARGUMENT);
    assert_null(p);
    assert_contains(kvhal_last_error(), "register a paged cache");
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_INVALID_ARGUMENT);
    /* another token: the listener's proof does not check at the connector, which sends nothing more (no proof of
     * its own) and fails at once; the listener's event names the connector */
    const int ep_before = created_agent_eps();
    assert_int_equal(kvhal_xfer_connect(a, blob, len, "wrong-token", &p), KVHAL_PEER_FAILED);
    assert_null(p);
    assert_contains(kvhal_last_error(), "did not prove that it holds the token");
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_REJECTED, 0, 5);
    assert_contains(s.evs[e].message, "intruder");
    assert_contains(s.evs[e].message, "refused");
    /* the connector's own, and the listener's for its challenge (closed with the handshake) */
    assert_int_equal(created_agent_eps(), ep_before + 2);
    /* a malformed blob */
    uint8_t bad[4096];
    memcpy(bad, blob, len);
    bad[0] ^= 1;
    assert_int_equal(kvhal_xfer_connect(a, bad, len, TOKEN, &p), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "blob");
    assert_int_equal(kvhal_xfer_connect(a, blob, len - 1, TOKEN, &p), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "len");
    assert_int_equal(kvhal_xfer_connect(a, blob, 3, TOKEN, &p), KVHAL_INVALID_ARGUMENT);
    /* an address of another wire version */
    memcpy(bad, blob, len);
    const uint16_t old_version = XW_VERSION - 1;
    memcpy(bad + offsetof(xw_blob, version), &old_version, sizeof old_version);
    assert_int_equal(kvhal_xfer_connect(a, bad, len, TOKEN, &p), KVHAL_INVALID_ARGUMENT);
    char want[64];
    snprintf(want, sizeof want, "wire version %u, this agent speaks %u", (unsigned)old_version, (unsigned)XW_VERSION);
    assert_contains(kvhal_last_error(), want);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(sc);
    /* another geometry (heads) */
    sc = make_cache(cpu, HEADS * 2, 8, KVHAL_LAYER_FIRST);
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_PEER_FAILED);
    assert_contains(kvhal_last_error(), "geometry");
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(sc);
    check_cache(&s, NULL, 0);
    all_pages_free(&s);
    server_stop(&s);
}

/* Connectors the listener refuses before anything else, with a reason naming both sides: another wire version
 * (version 3 changed HELLO and HELLO_ACK), and over TCP other UCX receive segments (UCX 1.13 cannot mix them: a
 * fragment larger than the receiver's segment breaks it). Nothing written, no page taken. */
void test_wire_version(void **state)
{
    (void)state;
    server s;
    uint8_t blob[4096];
    const size_t len = cpu_server(&s, 2000, blob, sizeof blob);
    const struct {
        uint16_t version;
        const char *seg; /* TCP only */
    } cases[] = {{XW_VERSION - 1, ""}, {XW_VERSION + 1, ""}, {XW_VERSION, "1m"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].seg[0] && !strstr(tls, "tcp")) continue;
        char want[80];
        if (cases[i].seg[0]) snprintf(want, sizeof want, "receive segments differ");
        else snprintf(want, sizeof want, "wire version %u, this agent speaks %u", (unsigned)cases[i].version,
                      (unsigned)XW_VERSION);
        const int ev0 = server_nev(&s);
        raw r;
        raw_tcp_seg = cases[i].seg;
        raw_open_v(&r, blob, len, TOKEN, cases[i].version);
        raw_tcp_seg = "";
        if (cases[i].seg[0]) assert_int_not_equal(r.hello_status, 0); /* authenticated: refused with an answer */
        int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_REJECTED, ev0, 5);
        assert_contains(s.evs[e].message, want);
        if (!cases[i].seg[0]) assert_contains(s.evs[e].message, "without an answer");
        raw_close(&r);
    }
    check_cache(&s, NULL, 0);
    all_pages_free(&s);
    server_stop(&s);
}

typedef struct hostile_case {
    const char *name, *expect;
    int32_t first, nl, n;
    int32_t pages[4]; /* -1 = the granted page of that index */
    int64_t dlen;     /* -1 = the right size */
    size_t hcut;      /* header cut to this many bytes (0 = whole) */
    uint64_t chunk;   /* 0 = the right one */
} hostile_case;

void test_hostile_frames(void **state)
{
    (void)state;
    const hostile_case cases[] = {
        {"page past the end", "out of range", 0, L, 2, {-1, PAGES + 5}, -1, 0, 0},
        {"negative page", "out of range", 0, L, 1, {-7}, -1, 0, 0},
        {"page not granted", "not granted", 0, L, 1, {-2}, -1, 0, 0},
        {"layer past the end", "layers", 1, L, 1, {-1}, -1, 0, 0},
        {"negative layer", "layers", -1, 1, 1, {-1}, -1, 0, 0},
        {"size too small", "data bytes", 0, L, 1, {-1}, (int64_t)(L * 2 * CHUNK - 1), 0, 0},
        {"size too large", "data bytes", 0, L, 1, {-1}, (int64_t)(L * 2 * CHUNK * 8), 0, 0},
        {"truncated header", "truncated", 0, L, 1, {-1}, -1, 20, 0},
        {"header shorter than its pages", "malformed", 0, L, 2, {-1, -1}, -1, sizeof(xw_data) + 4, 0},
        {"page sent twice in a frame", "already sent", 0, L, 2, {-1, -1}, -1, 0, 0},
        {"wrong chunk size", "chunk_bytes", 0, L, 1, {-1}, -1, 0, CHUNK * 2},
    };
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 3000);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const hostile_case *hc = &cases[c];
        for (int rndv = 0; rndv < 2; rndv++) {
            const int ev0 = server_nev(&s);
            raw r;
            raw_open(&r, blob, len, TOKEN);
            assert_int_equal(r.hello_status, 0);
            int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
            kvhal_xfer_peer *pb = s.evs[e].peer;
            int32_t granted[2];
            kvhal_xfer *rx;
            assert_int_equal(grant(&s, pb, 5, 2, granted, &rx), KVHAL_OK);
            int32_t pages[4];
            for (int i = 0; i < hc->n; i++) {
                pages[i] = hc->pages[i];
                if (pages[i] == -1) pages[i] = granted[0];
                if (pages[i] == -2) pages[i] = (granted[0] + 20) % PAGES; /* free, not granted */
            }
            const size_t dlen = hc->dlen >= 0 ? (size_t)hc->dlen
                                              : (size_t)hc->n * (size_t)(hc->nl > 0 ? hc->nl : 1) * 2 * CHUNK;
            raw_data(&r, r.their_session, 5, hc->first, hc->nl, pages, hc->n, hc->hcut, dlen,
                     hc->chunk ? hc->chunk : CHUNK, rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
            char msg[512];
            kvhal_status st = wait_recv(&s, rx, 5, msg, sizeof msg);
            if (st != KVHAL_PEER_FAILED) fail_msg("%s (%s): status %s", hc->name, rndv ? "rndv" : "eager", kvhal_status_name(st));
            assert_contains(msg, hc->expect);
            int f = wait_event(&s, KVHAL_XFER_EVENT_PEER_FAILED, ev0, 5);
            assert_contains(s.evs[f].message, hc->expect);
            assert_contains(s.evs[f].message, "hostile");
            pthread_mutex_lock(&s.mu);
            kvhal_xfer_release(rx);
            assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
            raw_close(&r);
            check_cache(&s, NULL, 0); /* not one byte written */
            all_pages_free(&s);       /* the grant's pages are back */
        }
    }
    /* frames naming no live session, bad magic, unknown types from an unauthenticated peer: dropped */
    {
        raw r;
        raw_open(&r, blob, len, "not-the-token"); /* no answer (checked there) */
        int32_t p = 0;
        raw_data(&r, 0x42, 5, 0, L, &p, 1, 0, L * 2 * CHUNK, CHUNK, UCP_AM_SEND_FLAG_EAGER);
        raw_data(&r, 0x42, 5, 0, L, &p, 1, 0, L * 2 * CHUNK, CHUNK, UCP_AM_SEND_FLAG_RNDV);
        xw_common junk = {0xdeadbeef, 7, 99, 0};
        raw_send(&r, &junk, sizeof junk, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
        raw_send(&r, &junk, 3, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
        raw_progress(&r, 0.1);
        raw_close(&r);
        check_cache(&s, NULL, 0);
        all_pages_free(&s);
    }
    server_stop(&s);
}

/* A frame for a grant that was canceled is refused with a NACK (not the peer's fault: it stays connected); one for
 * the right pages is written and acknowledged; a second one for the same (page, layer) drops the peer. */
void test_cancel_and_duplicates(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 3000);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    raw r;
    raw_open(&r, blob, len, TOKEN);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    kvhal_xfer_peer *pb = s.evs[e].peer;
    int32_t g1[2], g2[2];
    kvhal_xfer *x1, *x2;
    assert_int_equal(grant(&s, pb, 1, 2, g1, &x1), KVHAL_OK);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_post_receive(pb, 1, g1, 2, NULL, &x2), KVHAL_INVALID_ARGUMENT); /* pending id */
    assert_contains(kvhal_last_error(), "request_id");
    assert_int_equal(kvhal_xfer_cancel(x1), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    char msg[512];
    assert_int_equal(wait_recv(&s, x1, 5, msg, sizeof msg), KVHAL_CANCELED);
    all_pages_free(&s); /* canceled: pages back */
    raw_data(&r, r.their_session, 1, 0, L, g1, 1, 0, L * 2 * CHUNK, CHUNK, UCP_AM_SEND_FLAG_EAGER);
    const double until = now_s() + 5;
    while (r.nacks < 1 && now_s() < until) raw_progress(&r, 0.002);
    assert_int_equal(r.nacks, 1);
    assert_int_equal(r.last_ack.status, KVHAL_NOT_FOUND);
    check_cache(&s, NULL, 0);
    /* a live grant: layer 0 of page 0 arrives (rendezvous), then the same again */
    assert_int_equal(grant(&s, pb, 2, 2, g2, &x2), KVHAL_OK);
    raw_data(&r, r.their_session, 2, 0, 1, g2, 1, 0, 2 * CHUNK, CHUNK, UCP_AM_SEND_FLAG_RNDV);
    while (r.nacks < 2 && now_s() < until + 5) raw_progress(&r, 0.002);
    assert_int_equal(r.nacks, 2);
    assert_int_equal(r.last_ack.status, KVHAL_OK);
    assert_int_equal(r.last_ack.bytes, 2 * CHUNK);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_info info;
    assert_int_equal(kvhal_xfer_get_info(x2, &info), KVHAL_OK);
    assert_int_equal(info.status, KVHAL_BUSY);
    assert_int_equal(info.bytes_done, 2 * CHUNK);
    pthread_mutex_unlock(&s.mu);
    raw_data(&r, r.their_session, 2, 0, 1, g2, 1, 0, 2 * CHUNK, CHUNK, UCP_AM_SEND_FLAG_EAGER);
    assert_int_equal(wait_recv(&s, x2, 5, msg, sizeof msg), KVHAL_PEER_FAILED);
    assert_contains(msg, "already sent");
    all_pages_free(&s);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(x1);
    kvhal_xfer_release(x2);
    pthread_mutex_unlock(&s.mu);
    raw_close(&r);
    /* layer 0 of g2[0] was delivered (0x5A) before the peer was dropped; nothing else changed */
    check_cache(&s, g2, 1);
    server_stop(&s);
}

/* A peer that connects and then sends nothing: the grant fails with KVHAL_TIMEOUT within the agent's timeout. */
void test_stalled_peer(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, TIMEOUT_MS);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    raw r;
    raw_open(&r, blob, len, TOKEN);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    int32_t g[3];
    kvhal_xfer *x;
    const double t0 = now_s();
    assert_int_equal(grant(&s, s.evs[e].peer, 3, 3, g, &x), KVHAL_OK);
    char msg[512];
    assert_int_equal(wait_recv(&s, x, 10, msg, sizeof msg), KVHAL_TIMEOUT);
    const double waited = now_s() - t0;
    assert_true(waited >= TIMEOUT_MS / 1000.0 * 0.9);
    assert_true(waited < TIMEOUT_MS / 1000.0 + 2.0);
    assert_contains(msg, "no data");
    assert_contains(msg, "hostile");
    all_pages_free(&s);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(x);
    pthread_mutex_unlock(&s.mu);
    /* the other way: the server sends to the raw peer, which never acknowledges; the send fails with
     * KVHAL_TIMEOUT and the peer is dropped (its endpoint force-closed, which releases the source pages) */
    const int32_t src[2] = {1, 2}, dst[2] = {0, 1};
    kvhal_xfer *tx;
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_send_pages(s.evs[e].peer, 8, src, dst, 2, 0, L, &tx), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    const double t1 = now_s();
    raw_progress(&r, 0.05); /* take the frame, say nothing */
    assert_int_equal(wait_recv(&s, tx, 10, msg, sizeof msg), KVHAL_TIMEOUT);
    assert_true(now_s() - t1 < TIMEOUT_MS / 1000.0 + 2.0);
    assert_contains(msg, "stalled");
    int f = wait_event(&s, KVHAL_XFER_EVENT_PEER_FAILED, e, 5);
    assert_contains(s.evs[f].message, "stalled");
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(tx);
    pthread_mutex_unlock(&s.mu);
    raw_close(&r);
    check_cache(&s, NULL, 0);
    server_stop(&s);
}

/* Several senders into one receiver at once, each with its own requests in flight; then a connection past
 * cfg.max_peers is refused. */
void test_many_peers(void **state)
{
    (void)state;
    enum { NP = 3, NR = 2 };
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    memset(&s, 0, sizeof s);
    /* a server that takes NP peers at most */
    s.cache = make_cache(cpu, HEADS, PAGES, KVHAL_PAGE_FIRST);
    s.buf = cache_buffer(s.cache);
    s.bytes = kvhal_buffer_size(s.buf);
    s.canary = malloc(s.bytes);
    assert_non_null(s.canary);
    fill_pattern(s.canary, s.bytes, 99);
    assert_int_equal(kvhal_memcpy_h2d(s.buf, 0, s.canary, s.bytes, NULL), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_create(PAGES, BLOCK, KVHAL_PREFIX_RADIX, &s.cm), KVHAL_OK);
    kvhal_xfer_config cfg = {.name = "decode", .token = TOKEN, .timeout_ms = 5000, .transports = tls,
                             .max_peers = NP};
    assert_int_equal(agent_create(&cfg, &s.ag), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(s.ag, s.cache), KVHAL_OK);
    pthread_mutex_init(&s.mu, NULL);
    assert_int_equal(pthread_create(&s.th, NULL, serve, &s), 0);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);

    kvhal_paged_cache *sc[NP];
    kvhal_xfer_agent *a[NP];
    kvhal_xfer_peer *pa[NP], *pb[NP];
    for (int i = 0; i < NP; i++) {
        char name[16];
        snprintf(name, sizeof name, "prefill%d", i);
        sc[i] = make_cache(cpu, HEADS, 16, KVHAL_LAYER_FIRST);
        kvhal_xfer_config c = {.name = name, .token = TOKEN, .timeout_ms = 5000, .transports = tls};
        assert_int_equal(agent_create(&c, &a[i]), KVHAL_OK);
        assert_int_equal(kvhal_xfer_register_paged_cache(a[i], sc[i]), KVHAL_OK);
        /* each sender's pages: its index in every byte of layer l's K (l*2) and V (l*2+1) */
        for (int32_t p = 0; p < 16; p++)
            for (int32_t l = 0; l < L; l++)
                for (int kv = 0; kv < 2; kv++) {
                    uint8_t v[CHUNK];
                    memset(v, 0x10 * (i + 1) + l * 2 + kv, CHUNK);
                    assert_int_equal(kvhal_memcpy_h2d(cache_buffer(sc[i]), chunk_at(sc[i], l, kv, p), v, CHUNK, NULL),
                                     KVHAL_OK);
                }
        assert_int_equal(kvhal_xfer_connect(a[i], blob, len, TOKEN, &pa[i]), KVHAL_OK);
    }
    for (int i = 0, from = 0; i < NP; i++) {
        int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, from, 5);
        from = e + 1;
        const char *nm = kvhal_xfer_peer_name(s.evs[e].peer);
        assert_true(nm[0] == 'p');
        pb[nm[7] - '0'] = s.evs[e].peer;
    }
    /* one more: refused, too many peers */
    {
        kvhal_paged_cache *xc = make_cache(cpu, HEADS, 4, KVHAL_LAYER_FIRST);
        kvhal_xfer_config c = {.name = "extra", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
        kvhal_xfer_agent *xa;
        kvhal_xfer_peer *xp;
        assert_int_equal(agent_create(&c, &xa), KVHAL_OK);
        assert_int_equal(kvhal_xfer_register_paged_cache(xa, xc), KVHAL_OK);
        assert_int_equal(kvhal_xfer_connect(xa, blob, len, TOKEN, &xp), KVHAL_PEER_FAILED);
        assert_contains(kvhal_last_error(), "too many peers");
        assert_int_equal(kvhal_xfer_agent_destroy(xa), KVHAL_OK);
        kvhal_paged_cache_destroy(xc);
    }
    /* NR requests per peer, all granted before any is sent (request ids repeat across peers: they are per peer) */
    int32_t pages[NP][NR][3];
    kvhal_xfer *rx[NP][NR];
    for (int i = 0; i < NP; i++)
        for (int r = 0; r < NR; r++) assert_int_equal(grant(&s, pb[i], (uint64_t)r, 3, pages[i][r], &rx[i][r]), KVHAL_OK);
    kvhal_xfer *tx[NP][NR] = {{0}};
    int got = 0;
    const double until = now_s() + 10;
    while (got < NP * NR && now_s() < until)
        for (int i = 0; i < NP; i++) {
            kvhal_xfer_event ev;
            assert_int_equal(kvhal_xfer_progress(a[i], 1, &ev), KVHAL_OK);
            if (ev.type != KVHAL_XFER_EVENT_GRANT) continue;
            const int32_t src[3] = {(int32_t)ev.request_id * 3, (int32_t)ev.request_id * 3 + 1, 15};
            assert_int_equal(kvhal_xfer_send_pages(pa[i], ev.request_id, src, ev.pages, 3, 0, L, &tx[i][ev.request_id]),
                             KVHAL_OK);
            got++;
        }
    assert_int_equal(got, NP * NR);
    for (int i = 0; i < NP; i++)
        for (int r = 0; r < NR; r++) {
            assert_int_equal(kvhal_xfer_wait(tx[i][r], 5000), KVHAL_OK);
            char msg[512];
            assert_int_equal(wait_recv(&s, rx[i][r], 5, msg, sizeof msg), KVHAL_OK);
            for (int k = 0; k < 3; k++)
                for (int32_t l = 0; l < L; l++)
                    for (int kv = 0; kv < 2; kv++) {
                        uint8_t v[CHUNK], w[CHUNK];
                        memset(w, 0x10 * (i + 1) + l * 2 + kv, CHUNK);
                        assert_int_equal(kvhal_memcpy_d2h(v, s.buf, chunk_at(s.cache, l, kv, pages[i][r][k]), CHUNK, NULL),
                                         KVHAL_OK);
                        assert_memory_equal(v, w, CHUNK);
                    }
            pthread_mutex_lock(&s.mu);
            kvhal_xfer_release(rx[i][r]);
            assert_int_equal(kvhal_cache_manager_free(s.cm, pages[i][r], 3), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
            kvhal_xfer_release(tx[i][r]);
        }
    all_pages_free(&s);
    for (int i = 0; i < NP; i++) {
        assert_int_equal(kvhal_xfer_agent_destroy(a[i]), KVHAL_OK);
        kvhal_paged_cache_destroy(sc[i]);
    }
    server_stop(&s);
}

/* A prefill process killed after the first layer of a request arrived: the receiver's grant fails within the
 * timeout (peer failure where the transport reports it, else the timeout), its pages go back. */
void test_peer_killed_mid_transfer(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) { /* the prefill side: connect, send layer 0 of the grant, then hang until killed */
        close(fds[1]);
        uint32_t l32;
        uint8_t blob[4096];
        if (read(fds[0], &l32, 4) != 4 || l32 > sizeof blob || read(fds[0], blob, l32) != (ssize_t)l32) _exit(3);
        kvhal_paged_cache *sc = make_cache(cpu, HEADS, 16, KVHAL_LAYER_FIRST);
        kvhal_xfer_config cfg = {.name = "doomed", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
        kvhal_xfer_agent *a;
        kvhal_xfer_peer *p;
        if (agent_create(&cfg, &a) || kvhal_xfer_register_paged_cache(a, sc) ||
            kvhal_xfer_connect(a, blob, l32, TOKEN, &p))
            _exit(4);
        kvhal_xfer_event ev;
        do kvhal_xfer_progress(a, 100, &ev);
        while (ev.type != KVHAL_XFER_EVENT_GRANT);
        int32_t src[4] = {0, 1, 2, 3};
        kvhal_xfer *x;
        if (kvhal_xfer_send_pages(p, ev.request_id, src, ev.pages, ev.num_pages, 0, 1, &x)) _exit(5);
        for (;;) kvhal_xfer_progress(a, 100, &ev);
    }
    close(fds[0]);
    server s;
    server_start(&s, cpu, 1500);
    uint8_t blob[4096];
    uint32_t l32 = (uint32_t)server_blob(&s, blob, sizeof blob);
    assert_int_equal(write(fds[1], &l32, 4), 4);
    assert_int_equal(write(fds[1], blob, l32), (ssize_t)l32);
    close(fds[1]);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 10);
    int32_t g[4];
    kvhal_xfer *x;
    assert_int_equal(grant(&s, s.evs[e].peer, 11, 4, g, &x), KVHAL_OK);
    /* wait for layer 0 to land: mid-transfer */
    kvhal_xfer_info info = {0};
    const double until = now_s() + 10;
    do {
        usleep(1000);
        pthread_mutex_lock(&s.mu);
        kvhal_xfer_get_info(x, &info);
        pthread_mutex_unlock(&s.mu);
    } while (info.bytes_done == 0 && now_s() < until);
    assert_int_equal(info.bytes_done, 4 * 2 * CHUNK);
    assert_int_equal(info.status, KVHAL_BUSY);
    kill(child, SIGKILL);
    int status;
    waitpid(child, &status, 0);
    const double t0 = now_s();
    char msg[512];
    kvhal_status st = wait_recv(&s, x, 10, msg, sizeof msg);
    const double waited = now_s() - t0;
    if (st != KVHAL_PEER_FAILED && st != KVHAL_TIMEOUT) fail_msg("status %s: %s", kvhal_status_name(st), msg);
    printf("# %s: killed peer reported as %s after %.2f s: %s\n", tls, kvhal_status_name(st), waited, msg);
    assert_true(waited < 1.5 + 2.0);
    assert_contains(msg, "doomed");
    all_pages_free(&s);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(x);
    pthread_mutex_unlock(&s.mu);
    check_cache(&s, g, 4); /* the layer-0 pages were written; nothing else */
    server_stop(&s);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* arguments                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */
void test_bad_arguments(void **state)
{
    (void)state;
    kvhal_xfer_agent *a = (kvhal_xfer_agent *)1;
    kvhal_xfer_config cfg = {.token = TOKEN, .transports = tls};
    assert_int_equal(agent_create(NULL, &a), KVHAL_INVALID_ARGUMENT);
    assert_null(a);
    assert_int_equal(agent_create(&cfg, NULL), KVHAL_INVALID_ARGUMENT);
    kvhal_xfer_config c2 = cfg;
    c2.token = "";
    assert_int_equal(agent_create(&c2, &a), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "cfg.token");
    char longtok[100];
    memset(longtok, 'x', 99);
    longtok[99] = 0;
    c2.token = longtok;
    assert_int_equal(agent_create(&c2, &a), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "cfg.token");
    c2 = cfg;
    c2.max_peers = -1;
    assert_int_equal(agent_create(&c2, &a), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "cfg.max_peers");
    c2 = cfg;
    c2.transports = "no-such-transport";
    kvhal_status st = agent_create(&c2, &a);
    assert_true(st == KVHAL_BACKEND_ERROR);
    assert_contains(kvhal_last_error(), "UCX");
    assert_int_equal(kvhal_xfer_agent_destroy(NULL), KVHAL_OK);
    assert_int_equal(kvhal_xfer_release(NULL), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(NULL), KVHAL_OK);
    assert_int_equal(kvhal_xfer_wait(NULL, 0), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_xfer_test(NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_xfer_cancel(NULL), KVHAL_INVALID_ARGUMENT);
    assert_string_equal(kvhal_xfer_peer_name(NULL), "");

    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 3000);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    size_t need = 0;
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_local_address(s.ag, blob, 4, &need), KVHAL_OUT_OF_RANGE);
    assert_int_equal(need, len);
    assert_int_equal(kvhal_xfer_progress(s.ag, 0, NULL), KVHAL_INVALID_ARGUMENT);
    pthread_mutex_unlock(&s.mu);
    kvhal_paged_cache *sc = make_cache(cpu, HEADS, 8, KVHAL_LAYER_FIRST);
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    kvhal_xfer_peer *p;
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_OK);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    kvhal_xfer_peer *pb = s.evs[e].peer;
    kvhal_xfer *x = (kvhal_xfer *)1;
    const int32_t ok2[2] = {0, 1}, past[2] = {0, 8}, neg[1] = {-1}, dup[2] = {3, 3};
    assert_int_equal(kvhal_xfer_send_pages(p, 1, past, ok2, 2, 0, L, &x), KVHAL_OUT_OF_RANGE);
    assert_null(x);
    assert_contains(kvhal_last_error(), "src_pages[1]");
    assert_int_equal(kvhal_xfer_send_pages(p, 1, ok2, (const int32_t[]){0, PAGES}, 2, 0, L, &x), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "dst_pages[1]");
    assert_int_equal(kvhal_xfer_send_pages(p, 1, ok2, ok2, 2, 1, L, &x), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "first_layer");
    assert_int_equal(kvhal_xfer_send_pages(p, 1, ok2, ok2, 0, 0, L, &x), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "n:");
    assert_int_equal(kvhal_xfer_send_pages(p, 1, NULL, ok2, 2, 0, L, &x), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "src_pages");
    assert_int_equal(kvhal_xfer_send_pages(NULL, 1, ok2, ok2, 2, 0, L, &x), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "peer");
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_post_receive(pb, 1, neg, 1, s.cm, &x), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "pages[0]");
    assert_int_equal(kvhal_xfer_post_receive(pb, 1, dup, 2, s.cm, &x), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "twice");
    assert_int_equal(kvhal_xfer_post_receive(pb, 1, ok2, 0, s.cm, &x), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_xfer_post_receive(pb, 1, NULL, 2, s.cm, &x), KVHAL_INVALID_ARGUMENT);
    pthread_mutex_unlock(&s.mu);
    /* after the sender disconnects, the receiver's peer is failed and refuses new grants with the reason */
    assert_int_equal(kvhal_xfer_disconnect(p), KVHAL_OK);
    int f = wait_event(&s, KVHAL_XFER_EVENT_PEER_FAILED, 0, 5);
    assert_contains(s.evs[f].message, "closed");
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_post_receive(pb, 1, ok2, 2, s.cm, &x), KVHAL_PEER_FAILED);
    assert_contains(kvhal_last_error(), "closed");
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(sc);
    server_stop(&s);
}

/* Destroying agents with transfers in flight on both sides: the receiver's pages go back, nothing leaks. */
void test_destroy_in_flight(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 3000);
    uint8_t blob[4096];
    size_t len = server_blob(&s, blob, sizeof blob);
    kvhal_paged_cache *sc = make_cache(cpu, HEADS, 8, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .transports = tls};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    kvhal_xfer_peer *p;
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_OK);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    int32_t g[4], g2[4];
    kvhal_xfer *rx, *rx2;
    assert_int_equal(grant(&s, s.evs[e].peer, 1, 4, g, &rx), KVHAL_OK);
    assert_int_equal(grant(&s, s.evs[e].peer, 2, 4, g2, &rx2), KVHAL_OK);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(rx2); /* released while in flight: freed by the agent */
    pthread_mutex_unlock(&s.mu);
    const int32_t src[4] = {0, 1, 2, 3};
    kvhal_xfer *tx;
    assert_int_equal(kvhal_xfer_send_pages(p, 1, src, g, 2, 0, 1, &tx), KVHAL_OK); /* part of it */
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);                      /* tx freed with it */
    kvhal_paged_cache_destroy(sc);
    char msg[512];
    kvhal_status st = wait_recv(&s, rx, 10, msg, sizeof msg);
    assert_true(st == KVHAL_PEER_FAILED || st == KVHAL_TIMEOUT);
    all_pages_free(&s);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(rx);
    pthread_mutex_unlock(&s.mu);
    server_stop(&s);
}

/* A connect to an agent that never answers (nobody progresses it) returns KVHAL_TIMEOUT within the timeout; a
 * receiver destroyed with grants pending gives their pages back to the cache manager. */
void test_silent_agent_and_destroy_with_grants(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache *bc = make_cache(cpu, HEADS, PAGES, KVHAL_PAGE_FIRST), *ac = make_cache(cpu, HEADS, 8,
                                                                                               KVHAL_LAYER_FIRST);
    kvhal_xfer_config cb = {.name = "silent", .token = TOKEN, .timeout_ms = TIMEOUT_MS, .transports = tls};
    kvhal_xfer_config ca = {.name = "prefill", .token = TOKEN, .timeout_ms = TIMEOUT_MS, .transports = tls};
    kvhal_xfer_agent *b, *a;
    assert_int_equal(agent_create(&cb, &b), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(b, bc), KVHAL_OK);
    assert_int_equal(agent_create(&ca, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, ac), KVHAL_OK);
    uint8_t blob[4096];
    size_t len = 0;
    assert_int_equal(kvhal_xfer_local_address(b, blob, sizeof blob, &len), KVHAL_OK);
    kvhal_xfer_peer *p;
    const double t0 = now_s();
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_TIMEOUT);
    const double waited = now_s() - t0;
    assert_true(waited >= TIMEOUT_MS / 1000.0 * 0.9 && waited < TIMEOUT_MS / 1000.0 + 2.0);
    assert_contains(kvhal_last_error(), "no answer");
    assert_int_equal(kvhal_xfer_agent_destroy(b), KVHAL_OK);
    kvhal_paged_cache_destroy(bc);

    /* a receiver destroyed with two grants pending (one of them released in flight) */
    server srv;
    server_start(&srv, cpu, 5000);
    len = server_blob(&srv, blob, sizeof blob);
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_OK);
    int e = wait_event(&srv, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    int32_t g1[5], g2[7];
    kvhal_xfer *x1, *x2;
    assert_int_equal(grant(&srv, srv.evs[e].peer, 1, 5, g1, &x1), KVHAL_OK);
    assert_int_equal(grant(&srv, srv.evs[e].peer, 2, 7, g2, &x2), KVHAL_OK);
    srv.stop = 1;
    pthread_join(srv.th, NULL);
    assert_int_equal(kvhal_cache_manager_num_free(srv.cm), PAGES - 12);
    /* released in flight with nothing being written: canceled, its pages back at once */
    assert_int_equal(kvhal_xfer_release(x2), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_num_free(srv.cm), PAGES - 5);
    assert_int_equal(kvhal_xfer_agent_destroy(srv.ag), KVHAL_OK); /* x1 freed with it */
    assert_int_equal(kvhal_cache_manager_num_free(srv.cm), PAGES);
    assert_int_equal(kvhal_cache_manager_check_integrity(srv.cm), KVHAL_OK);
    kvhal_cache_manager_destroy(srv.cm);
    kvhal_paged_cache_destroy(srv.cache);
    pthread_mutex_destroy(&srv.mu);
    free(srv.canary);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(ac);
}

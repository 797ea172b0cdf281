/* workers.c — the copy workers: CMA copies, gathers and staging copies held in flight, endpoints of dropped peers,
 * a copy that fails, threads that do not start, a fork while they hold frames. */
#include "xfer_test.h"

/* test_cma_copies_in_flight, scenario sc (name) once its copies are let go: the receive rx ends as the scenario
 * says (the pages come back; a frame nothing got in the way of is copied, read after read, and acknowledged once). */
static void cma_held_finish(server *s, raw *r, kvhal_xfer *rx, int sc, const char *name, const int32_t *granted,
                            const int32_t *pairs, kvhal_paged_cache *hc, const uint8_t *hpat)
{
    enum { N = 8 };
    char msg[512];
    gate_set(false);
    if (sc == 1) { /* no handle left: the pages come back once the copies are over */
        const double u2 = now_s() + 5;
        for (;;) {
            pthread_mutex_lock(&s->mu);
            const int32_t f = kvhal_cache_manager_num_free(s->cm);
            pthread_mutex_unlock(&s->mu);
            if (f == PAGES || now_s() > u2) break;
            usleep(1000);
        }
    } else {
        const kvhal_status st = wait_recv(s, rx, 5, msg, sizeof msg);
        if (sc < 3 && st != KVHAL_CANCELED) fail_msg("%s: status %s (%s)", name, kvhal_status_name(st), msg);
        if (sc >= 3) { /* nothing in the way: the frame is copied, read after read, and acknowledged */
            pthread_mutex_lock(&gate_mu);
            vm_read_cap = 0;
            pthread_mutex_unlock(&gate_mu);
            if (st != KVHAL_OK) fail_msg("%s: status %s (%s)", name, kvhal_status_name(st), msg);
            uint8_t got[CHUNK];
            for (int i = 0; i < N; i++)
                for (int l = 0; l < L; l++)
                    for (int kv = 0; kv < 2; kv++) {
                        assert_int_equal(kvhal_memcpy_d2h(got, s->buf, chunk_at(s->cache, l, kv, granted[i]), CHUNK,
                                                          NULL), KVHAL_OK);
                        assert_memory_equal(got, hpat + chunk_at(hc, l, kv, pairs[2 * i]), CHUNK);
                    }
            pthread_mutex_lock(&s->mu);
            assert_int_equal(kvhal_cache_manager_free(s->cm, granted, N), KVHAL_OK);
            pthread_mutex_unlock(&s->mu);
            const double u3 = now_s() + 5;
            while (r->nacks == 0 && now_s() < u3) raw_progress(r, 0.001);
            assert_int_equal(r->nacks, 1); /* the parent's, and no other */
            assert_int_equal(r->last_ack.status, KVHAL_OK);
        }
        pthread_mutex_lock(&s->mu);
        assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
        pthread_mutex_unlock(&s->mu);
    }
}

/* The CMA path's copy workers with copies in flight (held at process_vm_readv by the gate of common.c): a transfer
 * canceled or released, its peer disconnected, or the agent destroyed while workers still read into its pages.
 * Cancel and release leave the pages out of the pool until the copies are over, then give them back (the transfer
 * ends CANCELED); disconnect does not wait for the copies (they read the peer's process by pid) and the transfer
 * ends once they are over; destroy waits for them. A child forked meanwhile fails the frame at once (pages back in
 * its own copy of the cache manager) and acknowledges nothing: the parent's copy completes and is the only ACK the
 * peer gets. Under ASan/TSan: no use after free, no leak, no race. */
static void *open_gate_later(void *arg)
{
    (void)arg;
    usleep(300000);
    gate_set(false);
    return NULL;
}

void test_cma_copies_in_flight(void **state)
{
    (void)state;
    if (!tls_cma(tls)) {
        printf("# %s: no CMA among the transports, skipped\n", tls);
        return;
    }
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    char old_threads[32] = "", old_piece[32] = "";
    const char *ot = getenv("KVHAL_XFER_THREADS"), *op = getenv("TRANSFER_CMA_PIECE_KIB");
    if (ot) snprintf(old_threads, sizeof old_threads, "%s", ot);
    if (op) snprintf(old_piece, sizeof old_piece, "%s", op);
    setenv("KVHAL_XFER_THREADS", "2", 1);
    setenv("TRANSFER_CMA_PIECE_KIB", "1", 1); /* frames of a few KiB split across both workers */
    server s;
    server_start(&s, cpu, 3000);
    if (ot) setenv("KVHAL_XFER_THREADS", old_threads, 1);
    else unsetenv("KVHAL_XFER_THREADS");
    if (op) setenv("TRANSFER_CMA_PIECE_KIB", old_piece, 1);
    else unsetenv("TRANSFER_CMA_PIECE_KIB");
    uint8_t blob[4096];
    const size_t len = server_blob(&s, blob, sizeof blob);
    /* the sender's pages: a pattern in this process, laid out as a 16-page layer-first cache */
    kvhal_paged_cache *hc = make_cache(cpu, HEADS, 16, KVHAL_LAYER_FIRST);
    const size_t hbytes = kvhal_buffer_size(cache_buffer(hc));
    uint8_t *hpat = malloc(hbytes);
    assert_non_null(hpat);
    fill_pattern(hpat, hbytes, 4242);
    uint64_t off[2 * L];
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) off[2 * l + kv] = chunk_at(hc, l, kv, 0);
    const uint64_t stride = chunk_at(hc, 0, 0, 1) - chunk_at(hc, 0, 0, 0);
    static uint8_t probe[XW_CMA_PROBE];
    const xw_cma_blob b = cma_blob((uint32_t)getpid(), hpat, hbytes, probe);
    enum { N = 8 };
    const char *names[] = {"cancel", "release", "disconnect", "none (short reads)", "fork", "destroy"};
    for (int sc = 0; sc < 6; sc++) {
        const int ev0 = server_nev(&s);
        raw r;
        raw_open(&r, blob, len, TOKEN);
        const int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
        kvhal_xfer_peer *pb = s.evs[e].peer;
        raw_map_kind(&r, XW_IPC_CMA, (const uint8_t *)&b, sizeof b, off, stride, 16, true);
        if (r.map_ack.status != 0) fail_msg("CMA map refused: %s", r.map_ack.reason);
        int32_t granted[N], pairs[2 * N];
        kvhal_xfer *rx;
        assert_int_equal(grant(&s, pb, 50 + (uint64_t)sc, N, granted, &rx), KVHAL_OK);
        for (int i = 0; i < N; i++) {
            pairs[2 * i] = 15 - 2 * i; /* scattered, both sides */
            pairs[2 * i + 1] = granted[i];
        }
        int reads0 = 0;
        gate_count(&reads0);
        gate_set(true);
        raw_data_ipc(&r, 50 + (uint64_t)sc, 0, L, pairs, N, N * 8, UCP_AM_SEND_FLAG_EAGER);
        /* both workers hold a piece of the frame at the gate (the pump is free: it keeps progressing) */
        const double until = now_s() + 5;
        while (gate_count(NULL) < 2 && now_s() < until) raw_progress(&r, 0.001);
        if (gate_count(NULL) < 2) fail_msg("%s: %d copy worker(s) at the gate, 2 expected", names[sc], gate_count(NULL));
        kvhal_xfer_info info;
        if (sc == 5) { /* destroy: waits for the copies (the gate opens 0.3 s later), then frees everything */
            pthread_t opener;
            assert_int_equal(pthread_create(&opener, NULL, open_gate_later, NULL), 0);
            const double t0 = now_s();
            server_stop(&s);
            if (now_s() - t0 < 0.25) fail_msg("destroy returned after %.3f s, before the copies were over", now_s() - t0);
            pthread_join(opener, NULL);
            raw_close(&r);
            printf("# %s: CMA copies in flight, %s: ok\n", tls, names[sc]);
            break;
        }
        if (sc == 4) { /* a child forked now fails the frame at once, acknowledging nothing: the copy is the parent's */
            fork_fails_held(&s, rx, s.cm, NULL, names[sc]);
            fork_fails_held(&s, rx, s.cm, pb, names[sc]); /* and one that disconnects the peer first */
            raw_progress(&r, 0.05);
            assert_int_equal(r.nacks, 0);
        }
        pthread_mutex_lock(&s.mu);
        if (sc == 0) assert_int_equal(kvhal_xfer_cancel(rx), KVHAL_OK);
        if (sc == 1) assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
        if (sc == 2) assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK); /* does not wait for the copies */
        assert_int_equal(gate_count(NULL), 2);
        assert_true(kvhal_cache_manager_num_free(s.cm) <= PAGES - N); /* the pages are still being written */
        if (sc != 1) {
            assert_int_equal(kvhal_xfer_get_info(rx, &info), KVHAL_OK);
            assert_int_equal(info.status, KVHAL_BUSY);
        }
        pthread_mutex_unlock(&s.mu);
        usleep(20000); /* the server keeps pumping: nothing completes while the copies are held */
        pthread_mutex_lock(&s.mu);
        assert_true(kvhal_cache_manager_num_free(s.cm) <= PAGES - N);
        pthread_mutex_unlock(&s.mu);
        if (sc == 3) { /* and every read short: 1000 bytes a call, less than a chunk, never on a run's boundary */
            pthread_mutex_lock(&gate_mu);
            vm_read_cap = 1000;
            pthread_mutex_unlock(&gate_mu);
        }
        cma_held_finish(&s, &r, rx, sc, names[sc], granted, pairs, hc, hpat);
        if (sc != 2) {
            pthread_mutex_lock(&s.mu);
            assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
        }
        raw_close(&r);
        all_pages_free(&s);
        int reads = 0;
        gate_count(&reads);
        assert_true(reads - reads0 >= 2); /* the frame went through process_vm_readv, split in two pieces at least */
        printf("# %s: CMA copies in flight, %s: ok\n", tls, names[sc]);
    }
    kvhal_paged_cache_destroy(hc);
    free(hpat);
}

/* TCP frames gathered by the copy workers (and a device cache's frames staged by them), held before the workers run
 * (worker_gate): the sender's transfer canceled, released, its peer disconnected, or its agent destroyed while its
 * frames are queued for gathering (staging).
 * The transfer ends (CANCELED, or failed: the peer gone), destroy waits for the workers, the receiver's grant fails
 * and its pages come back. Under ASan/TSan/valgrind: no use after free, no leak, no race. */
static void *open_worker_gate_later(void *arg)
{
    (void)arg;
    usleep(300000);
    atomic_store(&worker_gate, false);
    return NULL;
}

/* The sender's agent a (cache c) connected to the server; *pb: the sender as the server's peer. */
kvhal_xfer_peer *connect_to(server *s, kvhal_xfer_agent *a, kvhal_paged_cache *c, kvhal_xfer_peer **pb)
{
    assert_int_equal(kvhal_xfer_register_paged_cache(a, c), KVHAL_OK);
    uint8_t blob[4096];
    const size_t len = server_blob(s, blob, sizeof blob);
    kvhal_xfer_peer *pa;
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &pa), KVHAL_OK);
    const int e = wait_event(s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 5);
    pthread_mutex_lock(&s->mu);
    *pb = s->evs[e].peer;
    pthread_mutex_unlock(&s->mu);
    return pa;
}

/* The server grants request req (n pages, into dst; rx its receive) to its peer pb, agent a's connection; ev: the
 * GRANT as a saw it. */
static void grant_seen(server *s, kvhal_xfer_peer *pb, kvhal_xfer_agent *a, uint64_t req, int32_t n, int32_t *dst,
                       kvhal_xfer **rx, kvhal_xfer_event *ev)
{
    assert_int_equal(grant(s, pb, req, n, dst, rx), KVHAL_OK);
    sender_grant(a, ev);
}

/* The sender's agent a (cache c) connected to the server, which grants request req (n pages, into dst; rx its
 * receive); ev: the GRANT as the sender saw it. */
static kvhal_xfer_peer *connect_granted(server *s, kvhal_xfer_agent *a, kvhal_paged_cache *c, uint64_t req, int32_t n,
                                        int32_t *dst, kvhal_xfer **rx, kvhal_xfer_event *ev)
{
    kvhal_xfer_peer *pb;
    kvhal_xfer_peer *pa = connect_to(s, a, c, &pb);
    grant_seen(s, pb, a, req, n, dst, rx, ev);
    return pa;
}

static void frames_held(kvhal_device sdev)
{
    const char *names[] = {"cancel", "release", "disconnect", "destroy"};
    const char *vars[] = {"KVHAL_XFER_THREADS", "TRANSFER_GATHER_KIB", "TRANSFER_GATHER_FRAME_KIB"};
    const char *vals[] = {"2", "0", "1"}; /* 2 workers, every frame theirs, one page a frame */
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    const char *what = sdev.type == KVHAL_DEVICE_CPU ? "gathers" : "staging copies";
    for (int sc = 0; sc < 4; sc++) {
        char old[3][32];
        bool had[3];
        for (int v = 0; v < 3; v++) {
            const char *o = getenv(vars[v]);
            had[v] = o != NULL;
            snprintf(old[v], sizeof old[v], "%s", o ? o : "");
            setenv(vars[v], vals[v], 1);
        }
        server s;
        server_start(&s, cpu, 1500);
        kvhal_paged_cache *sc_cache = make_cache(sdev, HEADS, 16, KVHAL_LAYER_FIRST);
        kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 1500, .transports = tls};
        kvhal_xfer_agent *a;
        assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
        for (int v = 0; v < 3; v++)
            if (had[v]) setenv(vars[v], old[v], 1);
            else unsetenv(vars[v]);
        enum { N = 6 };
        int32_t dst[N];
        const int32_t src[N] = {11, 3, 7, 0, 14, 5};
        kvhal_xfer *rx;
        kvhal_xfer_event ev;
        kvhal_xfer_peer *pa = connect_granted(&s, a, sc_cache, 90, N, dst, &rx, &ev);
        atomic_store(&worker_gate, true);
        kvhal_xfer *tx;
        assert_int_equal(kvhal_xfer_send_pages(pa, 90, src, ev.pages, N, 0, L, &tx), KVHAL_OK);
        const double u1 = now_s() + 5;
        while (atomic_load(&workers_held) < 2 && now_s() < u1) kvhal_xfer_progress(a, 1, &ev);
        if (atomic_load(&workers_held) < 2)
            fail_msg("%s: %d copy worker(s) held, 2 expected", names[sc], atomic_load(&workers_held));
        kvhal_xfer_info info;
        assert_int_equal(kvhal_xfer_get_info(tx, &info), KVHAL_OK);
        assert_int_equal(info.status, KVHAL_BUSY); /* every frame waits to be gathered (staged) */
        if (sc == 3) { /* destroy: waits for the workers (the gate opens 0.3 s later), then frees everything */
            pthread_t opener;
            assert_int_equal(pthread_create(&opener, NULL, open_worker_gate_later, NULL), 0);
            const double t0 = now_s();
            assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
            if (now_s() - t0 < 0.25)
                fail_msg("destroy returned after %.3f s, before the %s were over", now_s() - t0, what);
            pthread_join(opener, NULL);
        } else {
            if (sc == 0) assert_int_equal(kvhal_xfer_cancel(tx), KVHAL_OK);
            if (sc == 1) assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
            if (sc == 2) assert_int_equal(kvhal_xfer_disconnect(pa), KVHAL_OK);
            for (int i = 0; i < 20; i++) kvhal_xfer_progress(a, 1, &ev); /* nothing completes while the gate is shut */
            if (sc != 1) {
                assert_int_equal(kvhal_xfer_get_info(tx, &info), KVHAL_OK);
                assert_int_equal(info.status, KVHAL_BUSY);
            }
            atomic_store(&worker_gate, false);
            if (sc != 1) {
                const kvhal_status st = kvhal_xfer_wait(tx, 5000);
                if (st == KVHAL_OK || st == KVHAL_BUSY)
                    fail_msg("%s: the transfer ended %s", names[sc], kvhal_status_name(st));
                assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
            }
            if (sc != 2) assert_int_equal(kvhal_xfer_disconnect(pa), KVHAL_OK);
            assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
        }
        char msg[512];
        const kvhal_status rst = wait_recv(&s, rx, 5, msg, sizeof msg);
        if (rst == KVHAL_OK || rst == KVHAL_BUSY) fail_msg("%s: the receive ended %s", names[sc], kvhal_status_name(rst));
        pthread_mutex_lock(&s.mu);
        assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
        pthread_mutex_unlock(&s.mu);
        all_pages_free(&s);
        server_stop(&s);
        kvhal_paged_cache_destroy(sc_cache);
        printf("# %s: %s of %s held, %s: ok (receiver: %s)\n", tls, what, kvhal_device_type_name(sdev.type),
               names[sc], kvhal_status_name(rst));
    }
}

/* Frames the copy workers hold while the transfer is canceled, released, disconnected or the agent destroyed:
 * host pages gathered for TCP, and device pages staged to host memory (any transport) on every other device type
 * present. */
void test_gathers_in_flight(void **state)
{
    (void)state;
    if (strcmp(tls, "tcp") == 0) frames_held((kvhal_device){KVHAL_DEVICE_CPU, 0});
    else printf("# %s: host pages are gathered for TCP frames only\n", tls);
    const kvhal_device_type types[] = {KVHAL_DEVICE_OPENCL, KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    for (int t = 0; t < 3; t++) {
        int32_t n = 0;
        kvhal_device_count(types[t], &n);
        if (n > 0) frames_held((kvhal_device){types[t], 0});
    }
}

/* A receiver of a device cache copies each frame from its staging to the device on a copy worker (so that pump
 * goes on receiving): with the receiver's workers held (worker_gate), its grant canceled, or its agent destroyed,
 * while a frame waits for the copy. The grant ends (not OK), destroy waits for the worker, every page comes back.
 * The sender keeps no workers (its frames go from pump), so only the receiver's are held. */
static void recv_staging_held(kvhal_device rdev)
{
    const char *names[] = {"cancel", "destroy"};
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    for (int sc = 0; sc < 2; sc++) {
        const char *o = getenv("KVHAL_XFER_THREADS");
        char old[32];
        snprintf(old, sizeof old, "%s", o ? o : "");
        setenv("KVHAL_XFER_THREADS", "2", 1);
        server s;
        server_start(&s, rdev, 1500);
        setenv("KVHAL_XFER_THREADS", "0", 1);
        kvhal_paged_cache *sc_cache = make_cache(cpu, HEADS, 16, KVHAL_LAYER_FIRST);
        /* the sender's timeout: the held frame is never acknowledged while the test looks (slow under valgrind) */
        kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
        kvhal_xfer_agent *a;
        assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
        if (o) setenv("KVHAL_XFER_THREADS", old, 1);
        else unsetenv("KVHAL_XFER_THREADS");
        enum { N = 6 };
        int32_t dst[N];
        const int32_t src[N] = {11, 3, 7, 0, 14, 5};
        kvhal_xfer *rx;
        kvhal_xfer_event ev;
        kvhal_xfer_peer *pa = connect_granted(&s, a, sc_cache, 91, N, dst, &rx, &ev);
        const int held0 = atomic_load(&workers_held);
        atomic_store(&worker_gate, true);
        kvhal_xfer *tx;
        assert_int_equal(kvhal_xfer_send_pages(pa, 91, src, ev.pages, N, 0, L, &tx), KVHAL_OK);
        const double u1 = now_s() + 5;
        while (atomic_load(&workers_held) - held0 < 2 && now_s() < u1) kvhal_xfer_progress(a, 1, &ev);
        if (atomic_load(&workers_held) - held0 < 2)
            fail_msg("%s: %d receiving copy worker(s) held, 2 expected", names[sc], atomic_load(&workers_held) - held0);
        for (int i = 0; i < 20; i++) kvhal_xfer_progress(a, 1, &ev); /* the sender waits for the receiver's ACKs */
        kvhal_xfer_info info;
        pthread_mutex_lock(&s.mu);
        assert_int_equal(kvhal_xfer_get_info(rx, &info), KVHAL_OK);
        pthread_mutex_unlock(&s.mu);
        assert_int_equal(info.status, KVHAL_BUSY); /* a frame waits for its copy to the device */
        assert_int_equal(kvhal_xfer_get_info(tx, &info), KVHAL_OK);
        assert_int_equal(info.status, KVHAL_BUSY); /* not acknowledged before its copy is done */
        if (sc == 0) {
            pthread_mutex_lock(&s.mu);
            const int32_t free0 = kvhal_cache_manager_num_free(s.cm);
            assert_int_equal(kvhal_xfer_cancel(rx), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
            usleep(20000); /* the server progresses: the canceled grant keeps its pages while the copy is held */
            pthread_mutex_lock(&s.mu);
            assert_int_equal(kvhal_cache_manager_num_free(s.cm), free0);
            assert_int_equal(kvhal_xfer_get_info(rx, &info), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
            assert_int_equal(info.status, KVHAL_BUSY);
            atomic_store(&worker_gate, false);
            char msg[512];
            const kvhal_status rst = wait_recv(&s, rx, 5, msg, sizeof msg);
            if (rst == KVHAL_OK || rst == KVHAL_BUSY) fail_msg("%s: the receive ended %s", names[sc], kvhal_status_name(rst));
            pthread_mutex_lock(&s.mu);
            assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
            const kvhal_status tst = kvhal_xfer_wait(tx, 5000);
            if (tst == KVHAL_BUSY) fail_msg("%s: the send did not end", names[sc]);
            all_pages_free(&s);
            server_stop(&s);
        } else { /* the receiver's agent destroyed while the worker is held: destroy waits for it */
            pthread_t opener;
            atomic_store(&s.stop, 1);
            pthread_join(s.th, NULL);
            atomic_store(&s.stop, 0);
            assert_int_equal(pthread_create(&opener, NULL, open_worker_gate_later, NULL), 0);
            const double t0 = now_s();
            assert_int_equal(kvhal_xfer_agent_destroy(s.ag), KVHAL_OK);
            if (now_s() - t0 < 0.25) fail_msg("destroy returned after %.3f s, before the copy was over", now_s() - t0);
            pthread_join(opener, NULL);
            assert_int_equal(kvhal_cache_manager_check_integrity(s.cm), KVHAL_OK);
            assert_int_equal(kvhal_cache_manager_num_free(s.cm), PAGES);
            kvhal_cache_manager_destroy(s.cm);
            kvhal_paged_cache_destroy(s.cache);
            pthread_mutex_destroy(&s.mu);
            free(s.canary);
            const kvhal_status tst = kvhal_xfer_wait(tx, 5000);
            if (tst == KVHAL_OK || tst == KVHAL_BUSY) fail_msg("%s: the send ended %s", names[sc], kvhal_status_name(tst));
        }
        assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
        assert_int_equal(kvhal_xfer_disconnect(pa), KVHAL_OK);
        assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
        kvhal_paged_cache_destroy(sc_cache);
        printf("# %s: copies to %s held, %s: ok\n", tls, kvhal_device_type_name(rdev.type), names[sc]);
    }
}

void test_recv_staging_in_flight(void **state)
{
    (void)state;
    int ran = 0;
    const kvhal_device_type types[] = {KVHAL_DEVICE_OPENCL, KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    for (int t = 0; t < 3; t++) {
        int32_t n = 0;
        kvhal_device_count(types[t], &n);
        if (n > 0) {
            recv_staging_held((kvhal_device){types[t], 0});
            ran++;
        }
    }
    if (!ran) printf("# no device besides the CPU: no staged receive to hold here\n");
}

/* Dropping a peer closes its endpoint (found by fuzz_xfer): UCX force-closes only endpoints with peer-failure
 * handling, which shared-memory transports lack, and the agent, refused, used to leave the endpoint open until
 * it was destroyed. Peers that connect, are dropped (a BYE, an unknown frame type) and disconnected leave no
 * endpoint of the receiver open, whatever the transport. */
void test_dropped_peers_close_endpoints(void **state)
{
    (void)state;
    server s;
    uint8_t blob[4096];
    const size_t len = cpu_server(&s, 2000, blob, sizeof blob);
    const int before = open_agent_eps();
    for (int round = 0, from = 0; round < 4; round++) {
        raw r;
        raw_open(&r, blob, len, TOKEN);
        assert_int_equal(r.hello_status, 0);
        const int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, from, 5);
        assert_int_equal(open_agent_eps(), before + 1);
        xw_common c = {XW_MAGIC, XW_VERSION, round % 2 ? XW_BYE : 77, r.their_session};
        raw_send(&r, &c, sizeof c, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
        from = wait_event(&s, KVHAL_XFER_EVENT_PEER_FAILED, e + 1, 5) + 1;
        pthread_mutex_lock(&s.mu);
        assert_int_equal(kvhal_xfer_disconnect(s.evs[e].peer), KVHAL_OK);
        pthread_mutex_unlock(&s.mu);
        raw_close(&r);
        if (open_agent_eps() != before)
            fail_msg("round %d: the receiver left %d endpoint(s) of dropped peers open", round, open_agent_eps() - before);
    }
    all_pages_free(&s);
    server_stop(&s);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the copy workers failing: a copy that fails, threads that do not start, a fork while they hold frames       */
/* ---------------------------------------------------------------------------------------------------------- */
/* A device whose copies to and from the host fail on demand: tests/plugins_rt's copyfail module (host memory behind
 * a backend module, so that its caches are staged like a GPU's), loaded explicitly (KVHAL_BACKENDS does not filter
 * it: valgrind's CPU-only runs have it too). While *copyfail_mask has bit 1 its copies to the host fail, with bit 2
 * those to the device, with the module's own error and before a byte is written. */
static atomic_int *copyfail_mask;

static kvhal_device copyfail_device(void)
{
    static kvhal_device dev;
    if (!copyfail_mask) {
        assert_int_equal(kvhal_backend_load(KVHAL_TEST_BUILD_ROOT "/tests/plugins_rt/libkvhal-copyfail.so"), KVHAL_OK);
        assert_int_equal(kvhal_device_type_find("copyfail", &dev.type), KVHAL_OK);
        void *p = NULL;
        assert_int_equal(kvhal_backend_get_proc_address(dev.type, "tp_copy_fail", &p), KVHAL_OK);
        copyfail_mask = p;
    }
    return dev;
}

/* A receiver (the server: a cache on rdev, rworkers copy workers, timeout rtimeout ms) and a sender connected to it
 * (agent a, a 16-page cache on sdev, sworkers copy workers); pb: the sender as the server's peer. */
typedef struct pair {
    server s;
    kvhal_xfer_agent *a;
    kvhal_paged_cache *sc;
    kvhal_xfer_peer *pa, *pb;
} pair;

static void pair_start(pair *p, kvhal_device rdev, const char *rworkers, uint32_t rtimeout, kvhal_device sdev,
                       const char *sworkers)
{
    const char *o = getenv("KVHAL_XFER_THREADS");
    char old[32];
    snprintf(old, sizeof old, "%s", o ? o : "");
    setenv("KVHAL_XFER_THREADS", rworkers, 1);
    server_start(&p->s, rdev, rtimeout);
    setenv("KVHAL_XFER_THREADS", sworkers, 1);
    p->sc = make_cache(sdev, HEADS, 16, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
    assert_int_equal(agent_create(&cfg, &p->a), KVHAL_OK);
    if (o) setenv("KVHAL_XFER_THREADS", old, 1);
    else unsetenv("KVHAL_XFER_THREADS");
    p->pa = connect_to(&p->s, p->a, p->sc, &p->pb);
}

static void pair_stop(pair *p)
{
    assert_int_equal(kvhal_xfer_disconnect(p->pa), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_destroy(p->a), KVHAL_OK);
    kvhal_paged_cache_destroy(p->sc);
    all_pages_free(&p->s);
    server_stop(&p->s);
}

enum { PN = 6 }; /* pages of a request in the tests below */
static const int32_t pair_src[PN] = {11, 3, 7, 0, 14, 5};

/* Pattern seed's data written to the sender's pages pair_src, or checked in the receiver's pages dst. */
static void pair_pattern(pair *p, const int32_t *dst, uint64_t seed)
{
    uint8_t want[CHUNK], got[CHUNK];
    for (int i = 0; i < PN; i++)
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                fill_pattern(want, CHUNK, seed * 1000 + (uint64_t)(i * 100 + l * 10 + kv));
                if (!dst) {
                    assert_int_equal(kvhal_memcpy_h2d(cache_buffer(p->sc), chunk_at(p->sc, l, kv, pair_src[i]), want,
                                                      CHUNK, NULL), KVHAL_OK);
                    continue;
                }
                assert_int_equal(kvhal_memcpy_d2h(got, p->s.buf, chunk_at(p->s.cache, l, kv, dst[i]), CHUNK, NULL),
                                 KVHAL_OK);
                if (memcmp(got, want, CHUNK))
                    fail_msg("page %d (dst %d) layer %d %c differs", i, dst[i], l, kv ? 'V' : 'K');
            }
}

/* The sender's request req granted (dst, rx) and sent (tx), its pages written with pattern seed first. */
static void pair_send(pair *p, uint64_t req, uint64_t seed, int32_t *dst, kvhal_xfer **rx, kvhal_xfer **tx)
{
    kvhal_xfer_event ev;
    pair_pattern(p, NULL, seed);
    grant_seen(&p->s, p->pb, p->a, req, PN, dst, rx, &ev);
    assert_int_equal(kvhal_xfer_send_pages(p->pa, req, pair_src, ev.pages, PN, 0, L, tx), KVHAL_OK);
}

/* Both ends of a request waited for: returns the receive's status (its message in msg); the send's in *tst and
 * tmsg. */
static kvhal_status pair_wait(pair *p, kvhal_xfer *rx, kvhal_xfer *tx, kvhal_status *tst, char *tmsg, char *msg,
                              size_t cap)
{
    *tst = kvhal_xfer_wait(tx, 5000);
    snprintf(tmsg, cap, "%s", kvhal_last_error());
    return wait_recv(&p->s, rx, 5, msg, cap);
}

/* Request req sent and received whole, every byte checked, then its pages given back. */
static void pair_round_trip(pair *p, uint64_t req, uint64_t seed)
{
    int32_t dst[PN];
    kvhal_xfer *rx, *tx;
    pair_send(p, req, seed, dst, &rx, &tx);
    char tmsg[512], msg[512];
    kvhal_status tst;
    const kvhal_status rst = pair_wait(p, rx, tx, &tst, tmsg, msg, sizeof msg);
    if (tst != KVHAL_OK || rst != KVHAL_OK)
        fail_msg("request %llu: sent %s (%s), received %s (%s)", (unsigned long long)req, kvhal_status_name(tst), tmsg,
                 kvhal_status_name(rst), msg);
    pair_pattern(p, dst, seed);
    pthread_mutex_lock(&p->s.mu);
    assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(p->s.cm, dst, PN), KVHAL_OK);
    pthread_mutex_unlock(&p->s.mu);
    assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
}

/* A copy worker's copy fails for real (the copyfail device's DMA error): the sender's staging of a frame to host
 * memory, then the receiver's copy of a frame to its device. The transfer ends with the device's error named on the
 * side(s) that see it (a receiver never told times out), not a byte of the receiver's cache changes, every granted
 * page comes back, and the next request on the same agents arrives whole. */
void test_worker_copy_fails(void **state)
{
    (void)state;
    const kvhal_device cf = copyfail_device(), cpu = {KVHAL_DEVICE_CPU, 0};
    for (int side = 0; side < 2; side++) { /* 0: the sender's workers, 1: the receiver's */
        pair p;
        const int threads0 = atomic_load(&xfer_threads);
        if (side == 0) pair_start(&p, cpu, "0", 1500, cf, "2");
        else pair_start(&p, cf, "2", 5000, cpu, "0");
        int32_t dst[PN];
        kvhal_xfer *rx, *tx;
        atomic_store(copyfail_mask, side == 0 ? 1 : 2);
        pair_send(&p, 60, 60, dst, &rx, &tx);
        char tmsg[512], msg[512];
        kvhal_status tst;
        const kvhal_status rst = pair_wait(&p, rx, tx, &tst, tmsg, msg, sizeof msg);
        atomic_store(copyfail_mask, 0);
        assert_int_equal(atomic_load(&xfer_threads) - threads0, 2); /* the failing side's workers copied */
        if (tst != KVHAL_BACKEND_ERROR) fail_msg("side %d: the send ended %s (%s)", side, kvhal_status_name(tst), tmsg);
        assert_contains(tmsg, "simulated DMA failure");
        if (side == 0) {
            assert_contains(tmsg, "to host memory failed"); /* frame 0, or another if frames are cut small */
            if (rst != KVHAL_TIMEOUT) fail_msg("the receive ended %s (%s)", kvhal_status_name(rst), msg);
            assert_contains(msg, "no data from peer prefill");
        } else {
            assert_contains(tmsg, "copy to the device failed");
            if (rst != KVHAL_BACKEND_ERROR) fail_msg("the receive ended %s (%s)", kvhal_status_name(rst), msg);
            assert_contains(msg, "copy to the device failed");
            assert_contains(msg, "simulated DMA failure");
        }
        check_cache(&p.s, NULL, 0);
        pthread_mutex_lock(&p.s.mu);
        assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
        pthread_mutex_unlock(&p.s.mu);
        assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
        all_pages_free(&p.s);
        pair_round_trip(&p, 61, 61); /* the agents, and their workers, go on */
        pair_stop(&p);
        printf("# %s: %s's copy worker failing: ok (%s)\n", tls, side == 0 ? "sender" : "receiver", side ? msg : tmsg);
    }
}

/* The copy workers' threads refused (EAGAIN from pthread_create): every start, or the second of each agent (each
 * runs with one worker). Staged caches both sides, so that both agents start workers: the requests arrive whole,
 * copied by pump where no worker started. */
void test_worker_threads_refused(void **state)
{
    (void)state;
    const kvhal_device cf = copyfail_device();
    const char *names[] = {"every start", "the second start of each agent"};
    const unsigned refuse[] = {~0u, 1u << 1 | 1u << 3};
    const int tried[] = {2, 4}; /* a refusal ends the agent's starts; the receiver's come after the sender's */
    for (int sc = 0; sc < 2; sc++) {
        pair p;
        pair_start(&p, cf, "2", 5000, cf, "2");
        atomic_store(&threads_refused, 0);
        atomic_store(&refuse_base, atomic_load(&xfer_threads));
        atomic_store(&threads_refuse, refuse[sc]);
        pair_round_trip(&p, 70, 70);
        pair_round_trip(&p, 71, 71); /* a pool that started short stays so */
        atomic_store(&threads_refuse, 0);
        assert_int_equal(atomic_load(&xfer_threads) - atomic_load(&refuse_base), tried[sc]);
        assert_int_equal(atomic_load(&threads_refused), 2);
        pair_stop(&p);
        printf("# %s: copy worker threads refused, %s: ok\n", tls, names[sc]);
    }
}

/* A child forked while the parent's copy workers hold a frame (worker_gate): the sender's staging to host memory,
 * then the receiver's copy to its device. The child, calling into the agent, gets the frame failed at once, saying
 * so, with no hang on the workers it does not have (an alarm would end it) and, on the receiver, every granted page
 * back in its cache manager; it tells the peer nothing, so the parent's request completes, every byte checked. */
void test_fork_with_frames_held(void **state)
{
    (void)state;
    const kvhal_device cf = copyfail_device(), cpu = {KVHAL_DEVICE_CPU, 0};
    for (int side = 0; side < 2; side++) { /* 0: the sender's workers hold it, 1: the receiver's */
        pair p;
        if (side == 0) pair_start(&p, cpu, "0", 5000, cf, "2");
        else pair_start(&p, cf, "2", 5000, cpu, "0");
        int32_t dst[PN];
        kvhal_xfer *rx, *tx;
        const int held0 = atomic_load(&workers_held);
        atomic_store(&worker_gate, true);
        pair_send(&p, 80, 80, dst, &rx, &tx);
        kvhal_xfer_event ev;
        const double until = now_s() + 5;
        while (atomic_load(&workers_held) - held0 < 2 && now_s() < until) kvhal_xfer_progress(p.a, 1, &ev);
        if (atomic_load(&workers_held) - held0 < 2)
            fail_msg("side %d: %d copy worker(s) held", side, atomic_load(&workers_held) - held0);
        /* the receiver's frame is with its workers: they started in the server's call that handed it to them,
         * which the lock fork_fails_held takes waits for */
        fork_fails_held(&p.s, side == 0 ? tx : rx, side == 0 ? NULL : p.s.cm, NULL, side == 0 ? "sender" : "receiver");
        atomic_store(&worker_gate, false);
        char tmsg[512], msg[512];
        kvhal_status tst;
        const kvhal_status rst = pair_wait(&p, rx, tx, &tst, tmsg, msg, sizeof msg);
        if (tst != KVHAL_OK || rst != KVHAL_OK)
            fail_msg("side %d: the parent's request: sent %s (%s), received %s (%s)", side, kvhal_status_name(tst),
                     tmsg, kvhal_status_name(rst), msg);
        pair_pattern(&p, dst, 80);
        pthread_mutex_lock(&p.s.mu);
        assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
        assert_int_equal(kvhal_cache_manager_free(p.s.cm, dst, PN), KVHAL_OK);
        pthread_mutex_unlock(&p.s.mu);
        assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
        pair_stop(&p);
        printf("# %s: fork while the %s's copy workers hold a frame: ok\n", tls, side == 0 ? "sender" : "receiver");
    }
}

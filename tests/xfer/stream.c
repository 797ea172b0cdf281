/* stream.c — layer-by-layer streaming (kvhal_xfer_stream_open / _layer, kvhal_xfer_post_receive_layers): a prefill
 * process streams a request layer by layer and the receiver checks each layer's bytes as its LAYER_DONE event
 * comes (the next layer provably not there yet); a prefill process killed mid-stream; a receiver that stops
 * progressing while every layer is handed, then catches up; a receiver that drops the connection mid-stream; a
 * layer held back by its event until the event completes; bad arguments. */
#include <fcntl.h>

#include "kvhal_test.h" /* kvhal_fault_hold_streams */
#include "xfer_test.h"


#define SN 6 /* pages of a streamed request */

static uint64_t seed_of(int32_t i, int32_t l, int kv) { return (uint64_t)(7000 + i * 100 + l * 10 + kv); }

/* The sender's "prefill" of layer l: its K and V chunks of pages src[0..SN) get their pattern. */
static bool write_layer(kvhal_paged_cache *sc, const int32_t *src, int32_t l)
{
    uint8_t chunk[CHUNK];
    kvhal_buffer *b = cache_buffer(sc);
    for (int32_t i = 0; i < SN; i++)
        for (int kv = 0; kv < 2; kv++) {
            fill_pattern(chunk, CHUNK, seed_of(i, l, kv));
            if (kvhal_memcpy_h2d(b, chunk_at(sc, l, kv, src[i]), chunk, CHUNK, NULL) != KVHAL_OK) return false;
        }
    return true;
}

/* Receiver: layer l of pages dst[0..SN) holds the sender's pattern (want) or is still the canary (!want). */
static void check_layer(server *s, const int32_t *dst, int32_t l, bool want)
{
    uint8_t got[CHUNK], exp[CHUNK];
    for (int32_t i = 0; i < SN; i++)
        for (int kv = 0; kv < 2; kv++) {
            const size_t o = chunk_at(s->cache, l, kv, dst[i]);
            if (want) fill_pattern(exp, CHUNK, seed_of(i, l, kv));
            else memcpy(exp, s->canary + o, CHUNK);
            assert_int_equal(kvhal_memcpy_d2h(got, s->buf, o, CHUNK, NULL), KVHAL_OK);
            if (memcmp(got, exp, CHUNK))
                fail_msg("page %d layer %d %c: %s", (int)i, (int)l, kv ? 'V' : 'K',
                         want ? "not the sender's bytes" : "written before its layer was sent");
        }
}

/* The index of the LAYER_DONE event of layer l of request req from `from` on, waiting up to 10 s. */
static int wait_layer(server *s, uint64_t req, int32_t l, int from)
{
    for (;;) {
        const int e = wait_event(s, KVHAL_XFER_EVENT_LAYER_DONE, from, 10);
        if (s->evs[e].request_id == req && s->evs[e].num_pages == l) return e;
        from = e + 1;
    }
}

/* The prefill process: connects to the blob read from rfd, streams layers [0, upto) of the GRANT's request, each
 * written just before it is handed (with a device event), and (go) waits for a byte on rfd after each layer before
 * writing the next; then waits for the stream's completion. Exit status: 0 when it completed, else which step
 * failed; with upto < L it hangs after its layers (to be killed). */
static int stream_child(int rfd, int32_t upto, bool go)
{
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    uint32_t l32;
    uint8_t blob[4096];
    if (read(rfd, &l32, 4) != 4 || l32 > sizeof blob || read(rfd, blob, l32) != (ssize_t)l32) return 3;
    if (fcntl(rfd, F_SETFL, O_NONBLOCK) != 0) return 3; /* the go bytes are polled between progress calls */
    kvhal_paged_cache *sc = make_cache(cpu, HEADS, 16, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
    kvhal_xfer_agent *a;
    kvhal_xfer_peer *p;
    if (agent_create(&cfg, &a) || kvhal_xfer_register_paged_cache(a, sc) ||
        kvhal_xfer_connect(a, blob, l32, TOKEN, &p))
        return 4;
    kvhal_xfer_event ev;
    do kvhal_xfer_progress(a, 100, &ev);
    while (ev.type != KVHAL_XFER_EVENT_GRANT);
    const int32_t src[SN] = {9, 2, 14, 5, 0, 11};
    kvhal_xfer *x;
    if (ev.num_pages != SN || kvhal_xfer_stream_open(p, ev.request_id, src, ev.pages, SN, &x)) return 5;
    kvhal_event *done[L];
    for (int32_t l = 0; l < upto; l++) {
        if (!write_layer(sc, src, l) || kvhal_event_create(cpu, &done[l]) || kvhal_event_record(done[l], NULL) ||
            kvhal_xfer_stream_layer(x, l, done[l]))
            return 6;
        if (kvhal_xfer_stream_layer(x, l, NULL) != KVHAL_INVALID_ARGUMENT) return 7; /* handed twice */
        if (!go) continue;
        char b;
        for (;;) { /* progress while the receiver checks the layer */
            const ssize_t r = read(rfd, &b, 1);
            if (r == 1) break;
            if (r == 0 || (r < 0 && errno != EAGAIN)) return 8;
            kvhal_xfer_progress(a, 1, &ev);
        }
    }
    if (upto < L)
        for (;;) kvhal_xfer_progress(a, 100, &ev);
    if (kvhal_xfer_stream_layer(x, L, NULL) != KVHAL_OUT_OF_RANGE) return 9;
    if (kvhal_xfer_wait(x, 5000) != KVHAL_OK) return 10;
    kvhal_xfer_info info;
    if (kvhal_xfer_get_info(x, &info) || info.bytes_done != (uint64_t)SN * L * 2 * CHUNK ||
        info.bytes_done != info.bytes_total)
        return 11;
    kvhal_xfer_release(x);
    for (int32_t l = 0; l < upto; l++) kvhal_event_destroy(done[l]);
    kvhal_xfer_agent_destroy(a);
    kvhal_paged_cache_destroy(sc);
    return 0;
}

/* Starts the prefill process on the server's blob; *wfd: the pipe to it (the go bytes); *rfd: the pipe its result
 * comes back on (one byte: stream_child's; not the exit status, which a checker such as valgrind may replace). */
/* The prefill side of these tests is a forked child that starts threads (its agent's): ThreadSanitizer cannot run
 * that (it ends such a child), so under TSan they are skipped; the plain, ASan and valgrind runs cover them. */
#if defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_TSAN() skip()
#else
#define SKIP_UNDER_TSAN() (void)0
#endif

static pid_t start_child(server *s, int32_t upto, bool go, int *wfd, int *rfd)
{
    int fds[2], back[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(pipe(back), 0);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(fds[1]);
        close(back[0]);
        alarm(60);
        const uint8_t rc = (uint8_t)stream_child(fds[0], upto, go);
        _exit(write(back[1], &rc, 1) == 1 ? 0 : 1);
    }
    close(fds[0]);
    close(back[1]);
    *rfd = back[0];
    uint8_t blob[4096];
    uint32_t l32 = (uint32_t)server_blob(s, blob, sizeof blob);
    assert_int_equal(write(fds[1], &l32, 4), 4);
    assert_int_equal(write(fds[1], blob, l32), (ssize_t)l32);
    *wfd = fds[1];
    return child;
}

static kvhal_status grant_layers(server *s, kvhal_xfer_peer *peer, uint64_t req, int32_t *pages, kvhal_xfer **x)
{
    pthread_mutex_lock(&s->mu);
    kvhal_status st = kvhal_cache_manager_allocate(s->cm, SN, pages);
    if (st == KVHAL_OK) st = kvhal_xfer_post_receive_layers(peer, req, pages, SN, s->cm, x);
    pthread_mutex_unlock(&s->mu);
    return st;
}

static kvhal_status layer_ready(server *s, kvhal_xfer *x, int32_t l)
{
    pthread_mutex_lock(&s->mu);
    const kvhal_status st = kvhal_xfer_layer_ready(x, l);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Two processes: each layer checked when its event comes, the next one provably not sent yet (the sender waits for
 * the receiver's go before writing it). */
void test_stream_two_processes(void **state)
{
    (void)state;
    SKIP_UNDER_TSAN();
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 2000);
    int wfd, rfd;
    const pid_t child = start_child(&s, L, true, &wfd, &rfd);
    const int c = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 10);
    int32_t dst[SN];
    kvhal_xfer *rx;
    assert_int_equal(grant_layers(&s, s.evs[c].peer, 51, dst, &rx), KVHAL_OK);
    int from = c + 1;
    for (int32_t l = 0; l < L; l++) {
        const int e = wait_layer(&s, 51, l, from);
        assert_ptr_equal(s.evs[e].xfer, rx);
        assert_int_equal(s.evs[e].status, KVHAL_OK);
        assert_int_equal(layer_ready(&s, rx, l), KVHAL_OK);
        check_layer(&s, dst, l, true);
        if (l + 1 < L) {
            assert_int_equal(layer_ready(&s, rx, l + 1), KVHAL_BUSY);
            check_layer(&s, dst, l + 1, false);
        }
        char b = 1;
        assert_int_equal(write(wfd, &b, 1), 1);
        from = e + 1;
    }
    char msg[512];
    assert_int_equal(wait_recv(&s, rx, 10, msg, sizeof msg), KVHAL_OK);
    const int d = wait_event(&s, KVHAL_XFER_EVENT_RECV_DONE, 0, 5);
    assert_true(d > wait_layer(&s, 51, L - 1, c + 1)); /* after the last layer's */
    uint8_t rc = 255;
    const ssize_t got = read(rfd, &rc, 1);
    int wst = 0;
    assert_int_equal(waitpid(child, &wst, 0), child);
    close(wfd);
    close(rfd);
    if (got != 1 || rc) fail_msg("the prefill process failed at step %d", got == 1 ? (int)rc : -1);
    check_cache(&s, dst, SN);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_layer_ready(rx, L), KVHAL_OUT_OF_RANGE);
    assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(s.cm, dst, SN), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    all_pages_free(&s);
    printf("# %s: %d layers streamed between two processes, each checked as it came\n", tls, L);
    server_stop(&s);
}

/* A prefill process killed after its first layer: the receive fails (peer failure, or the timeout where the
 * transport does not report it), no later layer is reported, and every page goes back. */
void test_stream_peer_killed(void **state)
{
    (void)state;
    SKIP_UNDER_TSAN();
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 1500);
    int wfd, rfd;
    const pid_t child = start_child(&s, 1, false, &wfd, &rfd);
    close(wfd);
    close(rfd);
    const int c = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 10);
    int32_t dst[SN];
    kvhal_xfer *rx;
    assert_int_equal(grant_layers(&s, s.evs[c].peer, 52, dst, &rx), KVHAL_OK);
    wait_layer(&s, 52, 0, c + 1);
    check_layer(&s, dst, 0, true);
    kill(child, SIGKILL);
    int wst;
    waitpid(child, &wst, 0);
    char msg[512];
    const kvhal_status st = wait_recv(&s, rx, 10, msg, sizeof msg);
    if (st != KVHAL_PEER_FAILED && st != KVHAL_TIMEOUT) fail_msg("status %s: %s", kvhal_status_name(st), msg);
    assert_contains(msg, "prefill");
    pthread_mutex_lock(&s.mu);
    for (int i = c + 1; i < s.nev; i++)
        if (s.evs[i].type == KVHAL_XFER_EVENT_LAYER_DONE && s.evs[i].num_pages > 0)
            fail_msg("layer %d reported after the peer died", (int)s.evs[i].num_pages);
    assert_int_equal(kvhal_xfer_layer_ready(rx, 0), KVHAL_OK);
    assert_int_equal(kvhal_xfer_layer_ready(rx, 1), st);
    pthread_mutex_unlock(&s.mu);
    all_pages_free(&s);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(rx);
    pthread_mutex_unlock(&s.mu);
    printf("# %s: prefill killed mid-stream: %s (%s)\n", tls, kvhal_status_name(st), msg);
    server_stop(&s);
}

/* Progresses the sender until its SEND_DONE for x; returns its status. */
static kvhal_status sender_done(kvhal_xfer_agent *a, kvhal_xfer *x, double seconds)
{
    const double until = now_s() + seconds;
    kvhal_xfer_event ev;
    for (;;) {
        assert_int_equal(kvhal_xfer_progress(a, 10, &ev), KVHAL_OK);
        if (ev.type == KVHAL_XFER_EVENT_SEND_DONE && ev.xfer == x) return ev.status;
        if (now_s() > until) fail_msg("%s", "no SEND_DONE for the stream");
    }
}

/* One process, the receiver progressed by the server thread: a layer held back by its event; a receiver that stops
 * progressing while every layer is handed, then catches up (every layer reported once, in order, then RECV_DONE);
 * a receiver that drops the connection mid-stream (the stream fails with an event, the pages go back); bad
 * arguments. */
static void slow_receiver(bool shareable)
{
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 3000);
    uint8_t blob[4096];
    const size_t blen = server_blob(&s, blob, sizeof blob);
    uint8_t *hpat = NULL;
    kvhal_paged_cache *sc = shareable ? shareable_cpu_cache(5, &hpat) : make_cache(cpu, HEADS, 16, KVHAL_PAGE_FIRST);
    free(hpat);
    kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 3000, .transports = tls};
    kvhal_xfer_agent *a;
    kvhal_xfer_peer *p;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    assert_int_equal(kvhal_xfer_connect(a, blob, blen, TOKEN, &p), KVHAL_OK);
    const int c = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 10);
    kvhal_xfer_peer *rp = s.evs[c].peer;
    kvhal_xfer_event ev;
    for (const double t = now_s() + 5; shareable && strcmp(kvhal_xfer_peer_ipc(p), "ipc");) { /* imported */
        kvhal_xfer_progress(a, 2, &ev);
        if (now_s() > t) fail_msg("the receiver did not import the cache: %s", kvhal_xfer_peer_ipc(p));
    }
    const int32_t src[SN] = {3, 8, 1, 12, 6, 15};
    for (int32_t l = 0; l < L; l++) assert_true(write_layer(sc, src, l));

    /* bad arguments */
    kvhal_xfer *bad = NULL;
    assert_int_equal(kvhal_xfer_stream_open(NULL, 1, src, src, SN, &bad), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_xfer_stream_open(p, 1, NULL, src, SN, &bad), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "src_pages");
    assert_int_equal(kvhal_xfer_stream_open(p, 1, src, src, 0, &bad), KVHAL_INVALID_ARGUMENT);
    const int32_t far[1] = {PAGES};
    assert_int_equal(kvhal_xfer_stream_open(p, 1, src, far, 1, &bad), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "dst_pages");
    assert_int_equal(kvhal_xfer_stream_open(p, 1, src, src, SN, NULL), KVHAL_INVALID_ARGUMENT);
    assert_null(bad);
    assert_int_equal(kvhal_xfer_stream_layer(NULL, 0, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_xfer_layer_ready(NULL, 0), KVHAL_INVALID_ARGUMENT);

    /* the receiver falls behind: its thread is held while every layer is handed */
    int32_t dst[SN];
    kvhal_xfer *rx, *tx;
    assert_int_equal(grant_layers(&s, rp, 61, dst, &rx), KVHAL_OK);
    sender_grant(a, &ev);
    assert_int_equal(kvhal_xfer_stream_open(p, 61, src, ev.pages, SN, &tx), KVHAL_OK);
    const char *path = shareable ? "ipc" : tls_cma(tls) ? "cma" : "host";
    assert_string_equal(kvhal_xfer_path(tx), path);
    assert_int_equal(kvhal_xfer_stream_layer(tx, -1, NULL), KVHAL_OUT_OF_RANGE);
    assert_int_equal(kvhal_xfer_layer_ready(tx, 0), KVHAL_INVALID_ARGUMENT); /* not a receive */
    kvhal_event *e0;
    assert_int_equal(kvhal_event_create(cpu, &e0), KVHAL_OK);
    assert_int_equal(kvhal_event_record(e0, NULL), KVHAL_OK);
    kvhal_fault_hold_streams(1); /* layer 0's event reads as pending: held back */
    assert_int_equal(kvhal_xfer_stream_layer(tx, 0, e0), KVHAL_OK);
    for (int i = 0; i < 20; i++) kvhal_xfer_progress(a, 2, &ev);
    assert_int_equal(layer_ready(&s, rx, 0), KVHAL_BUSY);
    kvhal_xfer_info info;
    assert_int_equal(kvhal_xfer_get_info(tx, &info), KVHAL_OK);
    assert_int_equal(info.bytes_done, 0);
    assert_int_equal(info.bytes_total, (uint64_t)SN * L * 2 * CHUNK);
    pthread_mutex_lock(&s.mu); /* the receiver stops progressing */
    const int nev0 = s.nev;
    kvhal_fault_hold_streams(0);
    for (int32_t l = 1; l < L; l++) {
        assert_int_equal(kvhal_xfer_stream_layer(tx, l, NULL), KVHAL_OK);
        for (int i = 0; i < 10; i++) kvhal_xfer_progress(a, 2, &ev);
    }
    assert_int_equal(kvhal_xfer_test(tx), KVHAL_BUSY); /* nothing acknowledged: the receiver is behind */
    assert_int_equal(kvhal_xfer_stream_layer(tx, 1, NULL), KVHAL_INVALID_ARGUMENT);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(sender_done(a, tx, 10), KVHAL_OK);
    char msg[512];
    assert_int_equal(wait_recv(&s, rx, 10, msg, sizeof msg), KVHAL_OK);
    const int d = wait_event(&s, KVHAL_XFER_EVENT_RECV_DONE, nev0, 5);
    pthread_mutex_lock(&s.mu);
    int seen[L] = {0}, next = 0; /* every layer once, before RECV_DONE (frames landing in one round: any order) */
    for (int i = nev0; i < d; i++)
        if (s.evs[i].type == KVHAL_XFER_EVENT_LAYER_DONE) {
            assert_ptr_equal(s.evs[i].xfer, rx);
            assert_in_range(s.evs[i].num_pages, 0, L - 1);
            assert_int_equal(seen[s.evs[i].num_pages]++, 0);
            next++;
        }
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(next, L);
    for (int32_t l = 0; l < L; l++) check_layer(&s, dst, l, true);
    check_cache(&s, dst, SN);
    pthread_mutex_lock(&s.mu);
    assert_string_equal(kvhal_xfer_path(rx), path);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(kvhal_xfer_get_info(tx, &info), KVHAL_OK);
    assert_int_equal(info.bytes_done, info.bytes_total);
    assert_int_equal(kvhal_xfer_stream_layer(tx, 0, NULL), KVHAL_INVALID_ARGUMENT); /* finished */
    kvhal_xfer_release(tx);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(rx);
    assert_int_equal(kvhal_cache_manager_free(s.cm, dst, SN), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);

    /* a stream released with layers in flight (the receiver held): it and its layers go once UCX lets go */
    const size_t held0 = kvhal__xfer_agent_held(a); /* the peer */
    assert_int_equal(grant_layers(&s, rp, 63, dst, &rx), KVHAL_OK);
    sender_grant(a, &ev);
    assert_int_equal(kvhal_xfer_stream_open(p, 63, src, ev.pages, SN, &tx), KVHAL_OK);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_stream_layer(tx, 0, NULL), KVHAL_OK);
    assert_int_equal(kvhal_xfer_stream_layer(tx, 2, NULL), KVHAL_OK);
    assert_int_equal(kvhal_xfer_release(tx), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    assert_true(kvhal__xfer_agent_held(a) > held0);
    for (const double t = now_s() + 10; kvhal__xfer_agent_held(a) != held0;) {
        kvhal_xfer_progress(a, 2, &ev);
        if (now_s() > t) fail_msg("the released stream is still held (%zu records)", kvhal__xfer_agent_held(a));
    }
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_layer_ready(rx, 1), KVHAL_BUSY); /* never sent */
    assert_int_equal(kvhal_xfer_cancel(rx), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    assert_int_equal(wait_recv(&s, rx, 5, msg, sizeof msg), KVHAL_CANCELED);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(rx);
    pthread_mutex_unlock(&s.mu);
    all_pages_free(&s);

    /* the receiver drops the connection after the first layer */
    assert_int_equal(grant_layers(&s, rp, 62, dst, &rx), KVHAL_OK);
    sender_grant(a, &ev);
    assert_int_equal(kvhal_xfer_stream_open(p, 62, src, ev.pages, SN, &tx), KVHAL_OK);
    const int nev1 = server_nev(&s);
    assert_int_equal(kvhal_xfer_stream_layer(tx, 0, e0), KVHAL_OK);
    const double until = now_s() + 10;
    while (layer_ready(&s, rx, 0) != KVHAL_OK) {
        kvhal_xfer_progress(a, 2, &ev);
        if (now_s() > until) fail_msg("%s", "layer 0 did not arrive");
    }
    wait_layer(&s, 62, 0, nev1);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_disconnect(rp), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    const kvhal_status st = sender_done(a, tx, 10);
    assert_true(st != KVHAL_OK);
    assert_true(kvhal_xfer_stream_layer(tx, 1, NULL) != KVHAL_OK);
    assert_int_equal(wait_recv(&s, rx, 5, msg, sizeof msg), KVHAL_CANCELED);
    all_pages_free(&s);
    printf("# %s, %s path: receiver behind, then gone mid-stream: the stream ended %s\n", tls, path,
           kvhal_status_name(st));
    kvhal_xfer_release(tx);
    pthread_mutex_lock(&s.mu);
    kvhal_xfer_release(rx);
    pthread_mutex_unlock(&s.mu);
    kvhal_event_destroy(e0);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(sc);
    server_stop(&s);
}

void test_stream_slow_receiver(void **state)
{
    (void)state;
    SKIP_UNDER_TSAN();
    slow_receiver(false);
    slow_receiver(true); /* a shareable cache: the IPC path (POSIX shared memory on the CPU) */
}

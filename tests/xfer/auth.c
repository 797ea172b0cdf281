/* auth.c — the network face: an impostor listener (another token) learns nothing and is sent nothing; a replayed
 * handshake is refused; a peer naming a bystander process is refused by name and the bystander is never read; a
 * grant flood fails its peer within the bound while the agent goes on; a destroyed agent is refused, not read. */
#include "xfer_test.h"

/* the bounds of kvhal_xfer.h (KVHAL_XFER_PEER_EVENTS_MAX, KVHAL_XFER_PEER_GRANT_PAGES_MAX) */
#define PEER_EVENTS_MAX KVHAL_XFER_PEER_EVENTS_MAX
#define PEER_GRANT_PAGES_MAX KVHAL_XFER_PEER_GRANT_PAGES_MAX

/* An agent listening with another token: the connect fails naming the proof, before anything is sent to it (no
 * GRANT, no K/V, no PEER_CONNECTED there); the impostor's side refuses too. The HELLO carries no token field
 * (xw_hello), and no proof of the connector's is sent to a listener whose own proof did not check. */
void test_impostor_listener(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server imp;
    server_token = "impostor"; /* an agent the blob could name, without the token */
    server_start(&imp, cpu, 1500);
    server_token = NULL;
    uint8_t blob[4096];
    const size_t len = server_blob(&imp, blob, sizeof blob);
    kvhal_paged_cache *sc = make_cache(cpu, HEADS, 8, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "prefill", .token = TOKEN, .timeout_ms = 1500, .transports = tls};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, sc), KVHAL_OK);
    kvhal_xfer_peer *p = (kvhal_xfer_peer *)1;
    const int ev0 = server_nev(&imp);
    assert_int_equal(kvhal_xfer_connect(a, blob, len, TOKEN, &p), KVHAL_PEER_FAILED);
    assert_null(p);
    assert_contains(kvhal_last_error(), "did not prove that it holds the token");
    const int e = wait_event(&imp, KVHAL_XFER_EVENT_PEER_REJECTED, ev0, 5);
    assert_contains(imp.evs[e].message, "prefill");
    for (int i = ev0; i < server_nev(&imp); i++) assert_int_not_equal(imp.evs[i].type, KVHAL_XFER_EVENT_PEER_CONNECTED);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(sc);
    check_cache(&imp, NULL, 0);
    all_pages_free(&imp);
    server_stop(&imp);
}

/* A captured HELLO and AUTH sent again, byte for byte, from another endpoint (the attacker's, so that it sees the
 * challenge): the listener answers the HELLO with a fresh nonce, the recorded proof does not check against it, so
 * the replay is refused and makes no peer; the recorded AUTH sent again to the connected session changes nothing.
 * A connector with the wrong token is refused naming the token; a lying chunk_bytes naming it. */
void test_replayed_hello(void **state)
{
    (void)state;
    server s;
    uint8_t blob[4096];
    const size_t len = cpu_server(&s, 1500, blob, sizeof blob);
    int ev0 = server_nev(&s);
    raw r;
    raw_open(&r, blob, len, TOKEN);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
    kvhal_xfer_peer *pb = s.evs[e].peer;
    ev0 = server_nev(&s);
    raw r2;
    raw_replay = &r;
    raw_open(&r2, blob, len, TOKEN);
    raw_replay = NULL;
    assert_int_equal(r2.hello_status, 0); /* challenged like anyone */
    assert_memory_not_equal(r2.ack.nonce, r.ack.nonce, XW_NONCE);
    e = wait_event(&s, KVHAL_XFER_EVENT_PEER_REJECTED, ev0, 5);
    assert_contains(s.evs[e].message, "wrong token: its proof does not check");
    raw_send(&r, &r.auth, sizeof r.auth, NULL, 0, UCP_AM_SEND_FLAG_EAGER); /* to the connected session: ignored */
    raw rc; /* a geometry equal but for chunk_bytes: refused naming it, with both values */
    raw_chunk = 2 * CHUNK;
    raw_open(&rc, blob, len, TOKEN);
    raw_chunk = 0;
    assert_int_not_equal(rc.hello_status, 0);
    char want[64];
    snprintf(want, sizeof want, "chunk_bytes %llu/%llu", (unsigned long long)(2 * CHUNK), (unsigned long long)CHUNK);
    assert_contains(rc.ack.reason, want);
    raw_close(&rc);
    ev0 = server_nev(&s);
    raw r3;
    raw_open(&r3, blob, len, "not-the-token"); /* its own proof, with another token: refused */
    e = wait_event(&s, KVHAL_XFER_EVENT_PEER_REJECTED, ev0, 5);
    assert_contains(s.evs[e].message, "wrong token");
    raw_progress(&r, 0.2);
    int connected = 0;
    for (int i = 0; i < server_nev(&s); i++) connected += s.evs[i].type == KVHAL_XFER_EVENT_PEER_CONNECTED;
    assert_int_equal(connected, 1); /* r alone */
    pthread_mutex_lock(&s.mu);
    assert_string_equal(kvhal_xfer_peer_name(pb), "hostile"); /* still connected */
    assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    raw_close(&r);
    raw_close(&r2);
    raw_close(&r3);
    check_cache(&s, NULL, 0);
    all_pages_free(&s);
    server_stop(&s);
}

/* A bystander process holding a secret: an authenticated peer sends a CMA map naming it (its pid, the secret's
 * address as cache and probe). The receiver's challenge is answered from the peer's own process, so the map is
 * refused naming both processes, and the bystander is never read (process_vm_readv is counted by pid). */
static uint8_t bystander_secret[4096] __attribute__((aligned(64)));
void test_cma_bystander(void **state)
{
    (void)state;
    if (!tls_cma(tls)) skip();
    memset(bystander_secret, 0, sizeof bystander_secret);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    const pid_t child = fork();
    if (child == 0) {
        alarm(30);
        snprintf((char *)bystander_secret, sizeof bystander_secret, "TENANT-B-SECRET: sk-live-0123456789");
        char c;
        close(pfd[1]);
        (void)!read(pfd[0], &c, 1); /* until the parent closes the pipe */
        _exit(0);
    }
    close(pfd[0]);
    server s;
    uint8_t blob[4096];
    const size_t len = cpu_server(&s, 1500, blob, sizeof blob);
    const int ev0 = server_nev(&s);
    raw r;
    raw_open(&r, blob, len, TOKEN);
    const int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
    kvhal_xfer_peer *pb = s.evs[e].peer;
    uint64_t off[2 * L];
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) off[2 * l + kv] = (uint64_t)(2 * l + kv) * CHUNK;
    static uint8_t probe[XW_CMA_PROBE];
    const xw_cma_blob b = cma_blob((uint32_t)child, bystander_secret, sizeof bystander_secret, probe);
    vm_watch_pid = child;
    vm_watch_reads = 0;
    raw_map_kind(&r, XW_IPC_CMA, (const uint8_t *)&b, sizeof b, off, CHUNK, 16, true);
    assert_int_not_equal(r.map_ack.status, 0);
    char want[64];
    snprintf(want, sizeof want, "names process %u", (unsigned)child);
    assert_contains(r.map_ack.reason, want);
    assert_contains(r.map_ack.reason, "answered the challenge: refused");
    assert_int_equal(r.cma_challenges, 1);
    assert_int_equal(vm_watch_reads, 0);
    vm_watch_pid = 0;
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    raw_close(&r);
    close(pfd[1]);
    waitpid(child, NULL, 0);
    check_cache(&s, NULL, 0);
    all_pages_free(&s);
    server_stop(&s);
}

/* GRANT frames nobody takes (kvhal_xfer_progress not called): the peer fails once its queued events or page ids
 * pass the bound (PEER_EVENTS_MAX, PEER_GRANT_PAGES_MAX), the agent goes on and holds no more than the bound. */
void test_grant_flood(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache *c = make_cache(cpu, HEADS, PAGES, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "flooded", .token = TOKEN, .timeout_ms = 5000, .transports = "self"};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, c), KVHAL_OK);
    const xw_geometry g = {L, HEADS, DIM, BLOCK, KVHAL_F16, KVHAL_LAYOUT_NHD, PAGES, CHUNK};
    for (int round = 0; round < 2; round++) { /* many small grants, then few large ones */
        kvhal_xfer_peer *p;
        const uint64_t session = 0x5eed0000ull + (uint64_t)round;
        assert_int_equal(kvhal__xfer_attach_peer(a, session, &g, &p), KVHAL_OK);
        const int32_t n = round == 0 ? 1 : XW_MAX_GRANT / 64; /* 1024 pages (of 64: ids repeat, as a peer may) */
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        assert_non_null(ids);
        for (int32_t i = 0; i < n; i++) ids[i] = i % PAGES;
        const int frames = round == 0 ? PEER_EVENTS_MAX + 100 : PEER_GRANT_PAGES_MAX / n + 100;
        for (int f = 0; f < frames; f++) {
            xw_grant gr = {.c = {XW_MAGIC, XW_VERSION, XW_GRANT, session}, .request_id = (uint64_t)f, .n_pages = n};
            kvhal__xfer_recv_frame(a, &gr, sizeof gr, ids, (size_t)n * sizeof *ids, false);
        }
        free(ids);
        assert_true(kvhal__xfer_agent_held(a) <= (size_t)PEER_EVENTS_MAX + 16);
        kvhal_xfer_event ev;
        int grants = 0;
        bool failed = false;
        for (;;) {
            assert_int_equal(kvhal_xfer_progress(a, 0, &ev), KVHAL_OK);
            if (ev.type == KVHAL_XFER_EVENT_NONE) break;
            grants += ev.type == KVHAL_XFER_EVENT_GRANT;
            if (ev.type == KVHAL_XFER_EVENT_PEER_FAILED) {
                failed = true;
                assert_contains(ev.message, "grant flood");
            }
        }
        assert_true(failed);
        assert_true(grants <= PEER_EVENTS_MAX);
        assert_true((int64_t)grants * n <= PEER_GRANT_PAGES_MAX);
        assert_int_equal(kvhal_xfer_disconnect(p), KVHAL_OK);
    }
    assert_int_equal(kvhal__xfer_agent_held(a), 0);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(c);
}

/* Destroyed handles are refused by the live set before their memory is read (ASan and valgrind see no read). */
void test_double_destroy(void **state)
{
    (void)state;
    kvhal_xfer_config cfg = {.name = "once", .token = TOKEN, .transports = "self"};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    kvhal_paged_cache *c = make_cache((kvhal_device){KVHAL_DEVICE_CPU, 0}, HEADS, 8, KVHAL_LAYER_FIRST);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, c), KVHAL_OK);
    kvhal_xfer_peer *p;
    const xw_geometry g = {L, HEADS, DIM, BLOCK, KVHAL_F16, KVHAL_LAYOUT_NHD, 8, CHUNK};
    assert_int_equal(kvhal__xfer_attach_peer(a, 77, &g, &p), KVHAL_OK);
    const int32_t pages[2] = {1, 2};
    kvhal_xfer *x;
    assert_int_equal(kvhal_xfer_post_receive(p, 5, pages, 2, NULL, &x), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_INVALID_HANDLE);
    kvhal_xfer_event ev;
    assert_int_equal(kvhal_xfer_progress(a, 0, &ev), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_xfer_disconnect(p), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_xfer_test(x), KVHAL_INVALID_HANDLE);
    assert_string_equal(kvhal_xfer_peer_name(p), "");
    assert_string_equal(kvhal_xfer_path(x), "");
    kvhal_paged_cache_destroy(c);
}

/* A peer's refusal reason reaches the application's message printable only (terminal escapes become '?'). */
void test_peer_reason_printable(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache *c = make_cache(cpu, HEADS, 8, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "sender", .token = TOKEN, .timeout_ms = 5000, .transports = "self"};
    kvhal_xfer_agent *a;
    assert_int_equal(agent_create(&cfg, &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(a, c), KVHAL_OK);
    const xw_geometry g = {L, HEADS, DIM, BLOCK, KVHAL_F16, KVHAL_LAYOUT_NHD, 8, CHUNK};
    kvhal_xfer_peer *p;
    assert_int_equal(kvhal__xfer_attach_peer(a, 99, &g, &p), KVHAL_OK);
    const int32_t src[1] = {1}, dst[1] = {2};
    kvhal_xfer *x;
    assert_int_equal(kvhal_xfer_send_pages(p, 3, src, dst, 1, 0, L, &x), KVHAL_OK);
    for (int i = 0; i < 10; i++) (void)kvhal_xfer_test(x); /* posted */
    xw_ack k;
    memset(&k, 0, sizeof k);
    k.c = (xw_common){XW_MAGIC, XW_VERSION, XW_ACK, 99};
    k.xfer_id = kvhal__xfer_id(x);
    k.status = KVHAL_OUT_OF_RANGE;
    snprintf(k.reason, sizeof k.reason, "\x1b]0;owned\x07 \x1b[2Jpage refused");
    kvhal__xfer_recv_frame(a, &k, sizeof k, NULL, 0, false);
    assert_int_equal(kvhal_xfer_wait(x, 2000), KVHAL_OUT_OF_RANGE);
    const char *m = kvhal_last_error();
    assert_contains(m, "?]0;owned? ?[2Jpage refused");
    for (const char *q = m; *q; q++) assert_true((unsigned char)*q >= 0x20 && (unsigned char)*q <= 0x7e);
    assert_int_equal(kvhal_xfer_release(x), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(p), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    kvhal_paged_cache_destroy(c);
}

/* The listener side of test_listener_after_fd_exhaustion, in a process of its own (this program run with
 * --listener-fds WFD, under a low RLIMIT_NOFILE): an agent over TCP writes its listening port to WFD, uses up every
 * file descriptor, pumps while the other side connects, gives the descriptors back, and exits 0 once LISTENER_LOST
 * came (3 if it never did, 4 if an event said otherwise). */
int listener_fds_main(int argc, char **argv)
{
    if (argc < 3) return 2;
    const int wfd = atoi(argv[2]);
    struct rlimit rl = {256, 256}; /* here, not before the exec: valgrind (running the test) keeps its own */
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 5;
    kvhal_paged_cache *c = make_cache((kvhal_device){KVHAL_DEVICE_CPU, 0}, HEADS, 8, KVHAL_LAYER_FIRST);
    kvhal_xfer_config cfg = {.name = "starved", .token = TOKEN, .timeout_ms = 600, .transports = "tcp"};
    kvhal_xfer_agent *a;
    if (!c || kvhal_xfer_agent_create(&cfg, &a) != KVHAL_OK || kvhal_xfer_register_paged_cache(a, c) != KVHAL_OK)
        return 5;
    uint16_t port = 0;
    if (kvhal__xfer_listen_ports(a, &port, 1) != 1) return 5;
    if (write(wfd, &port, sizeof port) != (ssize_t)sizeof port) return 5;
    close(wfd);
    enum { MAXFILL = 4096 };
    static int fill[MAXFILL];
    int nfill = 0;
    while (nfill < MAXFILL && (fill[nfill] = dup(0)) >= 0) nfill++;
    const double t0 = now_s();
    bool freed = false, lost = false;
    while (!lost && now_s() < t0 + 10) {
        kvhal_xfer_event ev;
        if (kvhal_xfer_progress(a, 10, &ev) != KVHAL_OK) return 4;
        if (ev.type == KVHAL_XFER_EVENT_LISTENER_LOST) {
            lost = ev.status == KVHAL_BACKEND_ERROR && strstr(ev.message, "RLIMIT_NOFILE");
            if (!lost) return 4;
        }
        if (!freed && now_s() > t0 + 2) { /* the connection came and failed to be accepted: descriptors back */
            for (int i = 0; i < nfill; i++) close(fill[i]);
            freed = true;
        }
    }
    kvhal_xfer_agent_destroy(a);
    kvhal_paged_cache_destroy(c);
    return lost ? 0 : 3;
}

/* A listener that ran out of file descriptors (UCX 1.13 drops its listening socket on EMFILE for good) reports
 * LISTENER_LOST instead of going deaf in silence. The connection that finds it out of descriptors is a plain TCP
 * one (as the half-open connections of a flood; a UCX connector there trips an assertion of UCX's own). */
void test_listener_after_fd_exhaustion(void **state)
{
    (void)state;
#if defined(__SANITIZE_THREAD__) /* its listener is a forked child whose agent starts threads: not under TSan */
    skip();
#endif
    if (strcmp(tls, "tcp") != 0) skip();
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    const pid_t child = fork();
    if (child == 0) {
        close(pfd[0]);
        alarm(30);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", pfd[1]);
        char *args[] = {(char *)self_path, "--listener-fds", fd, NULL};
        if (strchr(self_path, '/')) execv(self_path, args);
        else execvp(self_path, args);
        _exit(6);
    }
    close(pfd[1]);
    uint16_t port = 0;
    assert_int_equal(read(pfd[0], &port, sizeof port), (ssize_t)sizeof port);
    close(pfd[0]);
    usleep(200000); /* its descriptors used up */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    const int s1 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s1 >= 0);
    assert_int_equal(connect(s1, (struct sockaddr *)&sa, sizeof sa), 0); /* the kernel's backlog takes it */
    int wst = 0;
    assert_int_equal(waitpid(child, &wst, 0), child);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0)
        fail_msg("listener process: %s %d", WIFEXITED(wst) ? "exit" : "signal",
                 WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
    close(s1);
}

/* Where an agent listens: loopback by default; a device named; one that does not exist is refused. */
void test_net_devices(void **state)
{
    (void)state;
    if (strcmp(tls, "tcp") != 0) skip();
    kvhal_xfer_config cfg = {.name = "where", .token = TOKEN, .transports = "tcp"};
    kvhal_xfer_agent *a = NULL;
    assert_int_equal(kvhal_xfer_agent_create_on(&cfg, "no-such-device0", &a), KVHAL_BACKEND_ERROR);
    assert_null(a);
    assert_contains(kvhal_last_error(), "UCX");
    assert_int_equal(kvhal_xfer_agent_create_on(&cfg, "lo", &a), KVHAL_OK);
    uint16_t ports[8];
    assert_true(kvhal__xfer_listen_ports(a, ports, 8) >= 1);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_create_on(&cfg, "all", &a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_destroy(a), KVHAL_OK);
    assert_int_equal(kvhal_xfer_agent_create_on(NULL, "lo", &a), KVHAL_INVALID_ARGUMENT);
}

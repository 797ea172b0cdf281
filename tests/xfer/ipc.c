/* ipc.c — the IPC path: a sender process with a shareable cache on this host, hostile IPC frames and handles,
 * launch groups chained. */
#include "xfer_test.h"
#include "kvhal_test.h"

/* ---------------------------------------------------------------------------------------------------------- */
/* the IPC path: a sender process with a shareable cache on this host; the receiver imports it and copies       */
/* ---------------------------------------------------------------------------------------------------------- */
const char *self_path = "/proc/self/exe"; /* argv[0] */
#define IPC_N 9
static const int32_t ipc_src[IPC_N] = {33, 2, 17, 39, 5, 0, 21, 22, 23}; /* 21..23 adjacent: merged copies */

static uint64_t ipc_seed(int i, int l, int kv) { return (uint64_t)(5000 + i * 100 + l * 10 + kv); }

/* The sender, exec'd as "test_xfer --ipc-sender <type> <id> <fd>" (a fresh process: a GPU runtime does not survive
 * fork). Exit status: 0 when every page went by IPC and was acknowledged, else the failing step. */
int ipc_sender_main(int argc, char **argv)
{
    if (argc != 6) return 2;
    const bool expect_ipc = atoi(argv[5]) != 0; /* 0: the receiver must refuse our handle (another device type) */
    kvhal_device dev = {(kvhal_device_type)atoi(argv[2]), atoi(argv[3])};
    const int fd = atoi(argv[4]);
    uint32_t l32;
    uint8_t blob[4096];
    if (read(fd, &l32, 4) != 4 || l32 > sizeof blob || read(fd, blob, l32) != (ssize_t)l32) return 3;
    kvhal_paged_cache_config c = KVHAL_PAGED_CACHE_CONFIG_INIT;
    c.num_layers = L;
    c.num_heads = HEADS;
    c.head_dim = DIM;
    c.block_size = BLOCK;
    c.dtype = KVHAL_F16;
    c.order = KVHAL_LAYER_FIRST;
    c.memory_budget = (uint64_t)40 * 2 * L * CHUNK;
    c.device = dev;
    kvhal_paged_cache *sc;
    if (kvhal_paged_cache_create_shareable(&c, &sc) != KVHAL_OK) return 4;
    kvhal_tensor k, v;
    kvhal_paged_cache_layer(sc, 0, &k, &v);
    kvhal_buffer *sb = k.buffer;
    uint8_t want[CHUNK];
    for (int i = 0; i < IPC_N; i++)
        for (int l = 0; l < L; l++) {
            kvhal_paged_cache_layer(sc, l, &k, &v);
            for (int kv = 0; kv < 2; kv++) {
                const kvhal_tensor *t = kv ? &v : &k;
                fill_pattern(want, CHUNK, ipc_seed(i, l, kv));
                if (kvhal_memcpy_h2d(sb, t->offset + (size_t)ipc_src[i] * (size_t)t->strides[0] * 2, want, CHUNK,
                                     NULL) != KVHAL_OK)
                    return 5;
            }
        }
    kvhal_xfer_config cfg = {.name = "ipc-prefill", .token = TOKEN, .timeout_ms = 5000, .transports = tls};
    kvhal_xfer_agent *a;
    kvhal_xfer_peer *p;
    if (agent_create(&cfg, &a) || kvhal_xfer_register_paged_cache(a, sc) ||
        kvhal_xfer_connect(a, blob, l32, TOKEN, &p))
        return 6;
    if ((strcmp(kvhal_xfer_peer_ipc(p), "ipc") == 0) != expect_ipc) {
        fprintf(stderr, "ipc sender: peer IPC state \"%s\"\n", kvhal_xfer_peer_ipc(p));
        return 7;
    }
    kvhal_xfer_event ev;
    const double until = now_s() + 10;
    do {
        if (kvhal_xfer_progress(a, 10, &ev) != KVHAL_OK || now_s() > until) return 8;
    } while (ev.type != KVHAL_XFER_EVENT_GRANT);
    if (ev.num_pages != IPC_N) return 9;
    int32_t dst[IPC_N];
    memcpy(dst, ev.pages, sizeof dst);
    kvhal_xfer *tx0, *tx1;
    if (kvhal_xfer_send_pages(p, ev.request_id, ipc_src, dst, IPC_N, 0, 1, &tx0) ||
        kvhal_xfer_send_pages(p, ev.request_id, ipc_src, dst, IPC_N, 1, L - 1, &tx1))
        return 10;
    if (kvhal_xfer_wait(tx0, 5000) || kvhal_xfer_wait(tx1, 5000)) {
        fprintf(stderr, "ipc sender: %s\n", kvhal_last_error());
        return 11;
    }
    if ((strcmp(kvhal_xfer_path(tx0), "ipc") == 0) != expect_ipc || (strcmp(kvhal_xfer_path(tx1), "ipc") == 0) != expect_ipc)
        return 12;
    /* the receiver may still read our pages until it closes the connection */
    do {
        if (kvhal_xfer_progress(a, 10, &ev) != KVHAL_OK || now_s() > until + 10) return 13;
    } while (ev.type != KVHAL_XFER_EVENT_PEER_FAILED);
    kvhal_xfer_release(tx0);
    kvhal_xfer_release(tx1);
    kvhal_xfer_agent_destroy(a);
    kvhal_paged_cache_destroy(sc);
    return 0;
}

static void ipc_on(kvhal_device rdev, kvhal_device sdev, bool expect_ipc)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char type[16], id[16], fd[16];
    snprintf(type, sizeof type, "%d", (int)sdev.type);
    snprintf(id, sizeof id, "%d", (int)sdev.id);
    snprintf(fd, sizeof fd, "%d", fds[0]);
    char *expect = expect_ipc ? "1" : "0";
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(fds[1]);
        char *args[] = {(char *)self_path, "--ipc-sender", type, id, fd, expect, NULL};
        /* this program again: argv[0] (under valgrind /proc/self/exe is valgrind's own tool) */
        if (strchr(self_path, '/')) execv(self_path, args);
        else execvp(self_path, args);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(fds[0]);
    server s;
    server_start(&s, rdev, 5000);
    uint8_t blob[4096];
    uint32_t l32 = (uint32_t)server_blob(&s, blob, sizeof blob);
    assert_int_equal(write(fds[1], &l32, 4), 4);
    assert_int_equal(write(fds[1], blob, l32), (ssize_t)l32);
    close(fds[1]);
    int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, 0, 20);
    kvhal_xfer_peer *pb = s.evs[e].peer;
    int32_t dst[IPC_N];
    kvhal_xfer *rx;
    assert_int_equal(grant(&s, pb, 88, IPC_N, dst, &rx), KVHAL_OK);
    char msg[512];
    kvhal_status st = wait_recv(&s, rx, 20, msg, sizeof msg);
    if (st != KVHAL_OK) fail_msg("IPC receive: %s: %s", kvhal_status_name(st), msg);
    pthread_mutex_lock(&s.mu);
    assert_string_equal(kvhal_xfer_path(rx), expect_ipc ? "ipc" : rdev.type == KVHAL_DEVICE_CPU ? "host" : "staged");
    pthread_mutex_unlock(&s.mu);
    uint8_t want[CHUNK], got[CHUNK];
    for (int i = 0; i < IPC_N; i++)
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                fill_pattern(want, CHUNK, ipc_seed(i, l, kv));
                assert_int_equal(kvhal_memcpy_d2h(got, s.buf, chunk_at(s.cache, l, kv, dst[i]), CHUNK, NULL), KVHAL_OK);
                if (memcmp(got, want, CHUNK)) fail_msg("IPC: page %d (dst %d) layer %d %c differs", i, dst[i], l, kv ? 'V' : 'K');
            }
    check_cache(&s, dst, IPC_N);
    pthread_mutex_lock(&s.mu);
    assert_int_equal(kvhal_xfer_release(rx), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(s.cm, dst, IPC_N), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
    pthread_mutex_unlock(&s.mu);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("IPC sender process: exit %d (signal %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                 WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    all_pages_free(&s);
    server_stop(&s);
}

void test_ipc_two_processes(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    ipc_on(cpu, cpu, true);
    printf("# %s: cpu -> cpu over the IPC path (shared memory), verified\n", tls);
    int32_t nocl = 0;
    if (kvhal_device_count(KVHAL_DEVICE_OPENCL, &nocl) == KVHAL_OK && nocl > 0) {
        /* a shareable cpu cache to an OpenCL receiver: the handle is refused (another device type), staged instead */
        kvhal_device ocl = {KVHAL_DEVICE_OPENCL, 0};
        ipc_on(ocl, cpu, false);
        printf("# %s: cpu -> opencl: IPC refused, fell back to the staged path, verified\n", tls);
    }
    const kvhal_device_type types[] = {KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    for (int t = 0; t < 2; t++) {
        int32_t n = 0;
        kvhal_device_count(types[t], &n);
        if (n <= 0) continue;
        kvhal_device d0 = {types[t], 0}, d1 = {types[t], n > 1 ? 1 : 0};
        ipc_on(d0, d0, true);
        ipc_on(d1, d0, true); /* two GPUs when there are two: the receiver reads peer to peer */
        ipc_on(cpu, d0, false); /* a GPU handle is no good to a cpu receiver: staged */
        printf("# %s: %d device(s), IPC transfers between processes verified\n", kvhal_device_type_name(types[t]),
               (int)n);
    }
}

/* A hostile sender's IPC frames: a handle that does not import, offsets past the imported memory, source pages
 * past its cache, destination pages not granted, layers out of range, malformed sizes, rendezvous, a second map. */
void raw_keep(raw *r, void *p)
{
    if (r->nkeep + 1 > (int)(sizeof r->keep / sizeof r->keep[0])) fail_msg("%s", "raw: more frames than kept");
    r->keep[r->nkeep++] = p;
}

/* The shareable cache shareable_cpu_cache made last: the hand-made sender's own, whose proof area answers the IPC
 * challenge of a map that names no other (raw.ipc_own). */
static kvhal_buffer *raw_own_buf;

void raw_map_kind(raw *r, uint32_t kind, const uint8_t *blob, size_t blen, const uint64_t *off,
                         uint64_t stride, int64_t blocks, bool wait_ack)
{
    xw_ipc_map *m = calloc(1, sizeof *m);
    const size_t dlen = blen + 2u * L * sizeof(uint64_t);
    uint8_t *d = malloc(dlen);
    assert_non_null(m);
    assert_non_null(d);
    *m = (xw_ipc_map){.c = {XW_MAGIC, XW_VERSION, XW_IPC_MAP, r->their_session}, .blob_len = (uint32_t)blen,
                      .num_layers = L, .block_stride = stride, .num_blocks = blocks, .kind = kind};
    memcpy(d, blob, blen);
    memcpy(d + blen, off, 2u * L * sizeof(uint64_t));
    r->got_map_ack = false;
    r->got_ipc_challenge = false;
    if (kind == XW_IPC_HANDLE && !r->ipc_own && raw_own_buf) { /* its own cache's proof area, by default */
        r->ipc_own = raw_own_buf;
        r->ipc_proof_at = kvhal_buffer_size(raw_own_buf) - KVHAL_PAGED_CACHE_PROOF_BYTES;
    }
    if (kind == XW_IPC_CMA && blen == sizeof(xw_cma_blob)) {
        xw_cma_blob cb;
        memcpy(&cb, blob, sizeof cb);
        r->cma_probe_at = (uint8_t *)(uintptr_t)cb.probe_addr;
    }
    raw_send(r, m, sizeof *m, d, dlen, UCP_AM_SEND_FLAG_EAGER);
    raw_keep(r, m);
    raw_keep(r, d);
    const double until = now_s() + 5;
    while (wait_ack && !r->got_map_ack && now_s() < until) {
        raw_progress(r, 0.001);
        if (r->got_ipc_challenge && r->ipc_own) raw_ipc_prove(r);
    }
    if (wait_ack) assert_true(r->got_map_ack);
}

/* The answer to the receiver's IPC_CHALLENGE (as the library's sender): its nonce written into r->ipc_own at
 * r->ipc_proof_at, then IPC_PROOF naming that offset. */
void raw_ipc_prove(raw *r)
{
    r->got_ipc_challenge = false;
    assert_int_equal(kvhal_memcpy_h2d(r->ipc_own, (size_t)r->ipc_proof_at, r->ipc_nonce, XW_NONCE, NULL), KVHAL_OK);
    xw_ipc_proof *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_PROOF, r->their_session};
    f->offset = r->ipc_proof_at;
    raw_send(r, f, sizeof *f, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    raw_keep(r, f);
}

static void raw_map(raw *r, const uint8_t *blob, size_t blen, const uint64_t *off, uint64_t stride, int64_t blocks,
                    bool wait_ack)
{
    raw_map_kind(r, XW_IPC_HANDLE, blob, blen, off, stride, blocks, wait_ack);
}

/* The CMA kind of IPC_MAP: "read my pages from process pid at base" (here: this process, the pattern buffer). */
xw_cma_blob cma_blob(uint32_t pid, const void *base, uint64_t size, uint8_t *probe)
{
    xw_cma_blob b;
    memset(&b, 0, sizeof b);
    b.pid = pid;
    b.base = (uint64_t)(uintptr_t)base;
    b.size = size;
    b.probe_addr = (uint64_t)(uintptr_t)probe; /* where the receiver's nonce goes (raw_am answers it) */
    return b;
}

void raw_data_ipc(raw *r, uint64_t req, int32_t first, int32_t nl, const int32_t *pairs, int32_t n,
                         size_t dlen, uint32_t flags)
{
    xw_data_ipc *h = calloc(1, sizeof *h);
    uint8_t *d = calloc(1, dlen + 8);
    assert_non_null(h);
    assert_non_null(d);
    *h = (xw_data_ipc){.c = {XW_MAGIC, XW_VERSION, XW_DATA_IPC, r->their_session}, .request_id = req, .xfer_id = 9,
                       .frame = 0, .first_layer = first, .num_layers = nl, .n_pages = n};
    memcpy(d, pairs, dlen < (size_t)n * 8 ? dlen : (size_t)n * 8);
    raw_send(r, h, sizeof *h, d, dlen, flags);
    raw_keep(r, h);
    raw_keep(r, d);
}

typedef struct ipc_case {
    const char *name, *expect;
    int32_t first, nl, n;
    int32_t src[2], dst[2]; /* dst -1: granted[0], -2: granted[1], -3: a free page not granted */
    int dlen_delta;         /* data bytes off by this much */
    bool rndv, second_map, no_map;
} ipc_case;

/* Grants two pages for req and sends one DATA_IPC frame of source pages 15 and 3 into them (pairs: what it sent);
 * returns how the receive ended (msg: why). */
static kvhal_status ipc_two_pages(server *s, raw *r, kvhal_xfer_peer *pb, uint64_t req, int32_t granted[2],
                                  int32_t pairs[4], kvhal_xfer **rx, char *msg, size_t cap)
{
    assert_int_equal(grant(s, pb, req, 2, granted, rx), KVHAL_OK);
    const int32_t p[4] = {15, granted[0], 3, granted[1]};
    memcpy(pairs, p, sizeof p);
    raw_data_ipc(r, req, 0, L, pairs, 2, 16, UCP_AM_SEND_FLAG_EAGER);
    return wait_recv(s, *rx, 5, msg, cap);
}

/* A hand-made peer connected to s that mapped the shareable cache hblob (its ACK a success); returns s's peer. */
kvhal_xfer_peer *raw_mapped(server *s, raw *r, const uint8_t *blob, size_t len, const uint8_t *hblob,
                                   size_t hlen, const uint64_t *off, uint64_t stride)
{
    const int ev0 = server_nev(s);
    raw_open(r, blob, len, TOKEN);
    int e = wait_event(s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
    raw_map(r, hblob, hlen, off, stride, 16, true);
    assert_int_equal(r->map_ack.status, 0);
    return s->evs[e].peer;
}

/* Every layer's K and V of the receiver's pages dst[i] equal the sender's pages src[i] (of hpat, its cache hc). */
void check_ipc_pages(server *s, kvhal_paged_cache *hc, const uint8_t *hpat, const int32_t *src,
                            const int32_t *dst, int n)
{
    uint8_t got[CHUNK];
    for (int i = 0; i < n; i++)
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                assert_int_equal(kvhal_memcpy_d2h(got, s->buf, chunk_at(s->cache, l, kv, dst[i]), CHUNK, NULL),
                                 KVHAL_OK);
                assert_memory_equal(got, hpat + chunk_at(hc, l, kv, src[i]), CHUNK);
            }
}

/* One DATA_IPC frame of one page: the sender's page src into the granted page dst of request req. */
static void raw_ipc_one(raw *r, uint64_t req, int32_t src, int32_t dst)
{
    const int32_t pr[2] = {src, dst};
    raw_data_ipc(r, req, 0, L, pr, 1, 8, UCP_AM_SEND_FLAG_EAGER);
}

/* Holds every stream (kvhal_fault_hold_streams: queries report busy), sends one frame (as raw_ipc_one) and waits
 * until the receiver launched its copy, which then stays "in flight"; returns the batched calls counted before. */
static int hold_first_copy(raw *r, uint64_t req, int32_t src, int32_t dst)
{
    kvhal_fault_hold_streams(1);
    const int calls0 = atomic_load(&d2d_batches);
    raw_ipc_one(r, req, src, dst);
    const double until = now_s() + 5;
    while (atomic_load(&d2d_batches) == calls0 && now_s() < until) usleep(1000);
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 1);
    return calls0;
}

/* A shareable CPU cache of 16 pages, layer-first (a sender's on the IPC path), filled with the pattern of seed;
 * *hpat: a copy of its bytes (free it). */
kvhal_paged_cache *shareable_cpu_cache(uint64_t seed, uint8_t **hpat)
{
    kvhal_paged_cache_config c = KVHAL_PAGED_CACHE_CONFIG_INIT;
    c.num_layers = L;
    c.num_heads = HEADS;
    c.head_dim = DIM;
    c.block_size = BLOCK;
    c.dtype = KVHAL_F16;
    c.order = KVHAL_LAYER_FIRST;
    c.memory_budget = (uint64_t)16 * 2 * L * CHUNK;
    c.device = (kvhal_device){KVHAL_DEVICE_CPU, 0};
    kvhal_paged_cache *hc;
    assert_int_equal(kvhal_paged_cache_create_shareable(&c, &hc), KVHAL_OK);
    kvhal_buffer *hb = cache_buffer(hc);
    const size_t hbytes = kvhal_buffer_size(hb);
    *hpat = malloc(hbytes);
    assert_non_null(*hpat);
    fill_pattern(*hpat, hbytes, seed);
    assert_int_equal(kvhal_memcpy_h2d(hb, 0, *hpat, hbytes, NULL), KVHAL_OK);
    raw_own_buf = hb;
    return hc;
}

/* test_hostile_ipc's receiver and hostile sender: the server (chaining off), its address blob, the sender's shareable
 * 16-page cache (its pattern, buffer, IPC handle, each layer's K/V offsets of page 0 and its page stride). */
typedef struct hostile_ipc {
    server s;
    uint8_t blob[4096];
    size_t len;
    uint8_t *hpat;
    kvhal_paged_cache *hc;
    kvhal_buffer *hb;
    size_t hbytes;
    uint8_t hblob[KVHAL_IPC_HANDLE_MAX];
    size_t hlen;
    uint64_t off[2 * L];
    uint64_t stride;
} hostile_ipc;

/* 1. handles that do not import, offsets past the memory: refused (the peer may still send through host memory) */
static void hostile_ipc_1(hostile_ipc *c)
{
    {
        const int ev0 = server_nev(&c->s);
        raw r;
        raw_open(&r, c->blob, c->len, TOKEN);
        int e = wait_event(&c->s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
        kvhal_xfer_peer *pb = c->s.evs[e].peer;
        uint8_t junk[KVHAL_IPC_HANDLE_MAX];
        memcpy(junk, c->hblob, c->hlen);
        junk[40] ^= 0x3c; /* the token */
        raw_map(&r, junk, c->hlen, c->off, c->stride, 16, true);
        assert_int_not_equal(r.map_ack.status, 0);
        assert_contains(r.map_ack.reason, "import failed");
        raw_close(&r);
        pthread_mutex_lock(&c->s.mu);
        assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
        pthread_mutex_unlock(&c->s.mu);
    }
    {
        const int ev0 = server_nev(&c->s);
        raw r;
        raw_open(&r, c->blob, c->len, TOKEN);
        int e = wait_event(&c->s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
        kvhal_xfer_peer *pb = c->s.evs[e].peer;
        uint64_t far[2 * L];
        memcpy(far, c->off, sizeof far);
        far[2 * L - 1] = c->hbytes - CHUNK; /* V of the last layer: page 15 lies past the end */
        raw_map(&r, c->hblob, c->hlen, far, c->stride, 16, true);
        assert_int_not_equal(r.map_ack.status, 0);
        assert_contains(r.map_ack.reason, "past the");
        /* no handle imported: a DATA_IPC drops the peer */
        int32_t granted[2];
        kvhal_xfer *rx;
        assert_int_equal(grant(&c->s, pb, 6, 2, granted, &rx), KVHAL_OK);
        int32_t pairs[2] = {0, granted[0]};
        raw_data_ipc(&r, 6, 0, L, pairs, 1, 8, UCP_AM_SEND_FLAG_EAGER);
        char msg[512];
        assert_int_equal(wait_recv(&c->s, rx, 5, msg, sizeof msg), KVHAL_PEER_FAILED);
        assert_contains(msg, "without an imported IPC handle");
        pthread_mutex_lock(&c->s.mu);
        kvhal_xfer_release(rx);
        assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
        pthread_mutex_unlock(&c->s.mu);
        raw_close(&r);
        check_cache(&c->s, NULL, 0);
        all_pages_free(&c->s);
    }
}

/* 2. a good handle, then hostile DATA_IPC frames: each drops the peer, nothing written, pages back */
static void hostile_ipc_2(hostile_ipc *c)
{
    const ipc_case cases[] = {
        {"source page past the end", "source page 16", 0, L, 1, {16}, {-1}, 0, false, false, false},
        {"negative source page", "source page -1", 0, L, 1, {-1}, {-1}, 0, false, false, false},
        {"destination past the end", "out of range", 0, L, 1, {0}, {PAGES + 1}, 0, false, false, false},
        {"destination not granted", "not granted", 0, L, 1, {0}, {-3}, 0, false, false, false},
        {"layers past the end", "layers", 1, L, 1, {0}, {-1}, 0, false, false, false},
        {"negative layer", "layers", -1, 1, 1, {0}, {-1}, 0, false, false, false},
        {"a page twice", "already sent", 0, L, 2, {0, 1}, {-1, -1}, 0, false, false, false},
        {"data short", "malformed DATA_IPC", 0, L, 2, {0, 1}, {-1, -2}, -4, false, false, false},
        {"data long", "malformed DATA_IPC", 0, L, 1, {0}, {-1}, 8, false, false, false},
        {"rendezvous", "malformed DATA_IPC", 0, L, 1, {0}, {-1}, 0, true, false, false},
        {"a second handle", "repeated", 0, L, 1, {0}, {-1}, 0, false, true, false},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const ipc_case *k = &cases[ci];
        const int ev0 = server_nev(&c->s);
        raw r;
        raw_open(&r, c->blob, c->len, TOKEN);
        int e = wait_event(&c->s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
        kvhal_xfer_peer *pb = c->s.evs[e].peer;
        raw_map(&r, c->hblob, c->hlen, c->off, c->stride, 16, true);
        if (r.map_ack.status != 0) fail_msg("%s: good handle refused: %s", k->name, r.map_ack.reason);
        int32_t granted[2];
        kvhal_xfer *rx;
        assert_int_equal(grant(&c->s, pb, 7, 2, granted, &rx), KVHAL_OK);
        if (k->second_map) raw_map(&r, c->hblob, c->hlen, c->off, c->stride, 16, false);
        int32_t pairs[4];
        for (int i = 0; i < k->n; i++) {
            pairs[2 * i] = k->src[i];
            const int32_t d = k->dst[i];
            pairs[2 * i + 1] = d == -1 ? granted[0] : d == -2 ? granted[1] : d == -3 ? (granted[0] + 20) % PAGES : d;
        }
        if (!k->second_map)
            raw_data_ipc(&r, 7, k->first, k->nl, pairs, k->n, (size_t)((int)(k->n * 8) + k->dlen_delta),
                         k->rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER);
        char msg[512];
        kvhal_status st = wait_recv(&c->s, rx, 5, msg, sizeof msg);
        if (st != KVHAL_PEER_FAILED) fail_msg("%s: status %s", k->name, kvhal_status_name(st));
        assert_contains(msg, k->expect);
        pthread_mutex_lock(&c->s.mu);
        kvhal_xfer_release(rx);
        assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
        pthread_mutex_unlock(&c->s.mu);
        raw_close(&r);
        check_cache(&c->s, NULL, 0);
        all_pages_free(&c->s);
    }
}

/* 3. a good handle and a good frame: the receiver copies the named pages itself and acknowledges */
static void hostile_ipc_3(hostile_ipc *c)
{
    raw r;
    kvhal_xfer_peer *pb = raw_mapped(&c->s, &r, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    int32_t granted[2], pairs[4];
    kvhal_xfer *rx;
    char msg[512];
    assert_int_equal(ipc_two_pages(&c->s, &r, pb, 8, granted, pairs, &rx, msg, sizeof msg), KVHAL_OK);
    const double until = now_s() + 5;
    while (r.nacks == 0 && now_s() < until) raw_progress(&r, 0.001);
    assert_int_equal(r.nacks, 1);
    assert_int_equal(r.last_ack.status, 0);
    assert_int_equal(r.last_ack.bytes, 2 * L * 2 * CHUNK);
    const int32_t src[2] = {pairs[0], pairs[2]};
    check_ipc_pages(&c->s, c->hc, c->hpat, src, granted, 2);
    check_cache(&c->s, granted, 2);
    pthread_mutex_lock(&c->s.mu);
    assert_string_equal(kvhal_xfer_path(rx), "ipc");
    kvhal_xfer_release(rx);
    assert_int_equal(kvhal_cache_manager_free(c->s.cm, granted, 2), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
    pthread_mutex_unlock(&c->s.mu);
    raw_close(&r);
    all_pages_free(&c->s);
}

/* 3b. frames that land together share one batched copy: twelve one-page requests' frames sent while the
 * server's thread is held off its agent, then let go. Every request completes with its page (and only its
 * page) written, each frame is acknowledged, and the receiver copied them in one batched call (two at most, if
 * UCX delivered them in two rounds of its progress) */
static void hostile_ipc_3b(hostile_ipc *c)
{
    enum { NG = 12 };
    raw r;
    kvhal_xfer_peer *pb = raw_mapped(&c->s, &r, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    int32_t gp[NG], src[NG];
    kvhal_xfer *grx[NG];
    for (int i = 0; i < NG; i++) {
        assert_int_equal(grant(&c->s, pb, 100 + (uint64_t)i, 1, &gp[i], &grx[i]), KVHAL_OK);
        src[i] = (i * 5 + 1) % 16;
    }
    pthread_mutex_lock(&c->s.mu);
    const int calls0 = atomic_load(&d2d_batches);
    for (int i = 0; i < NG; i++) raw_ipc_one(&r, 100 + (uint64_t)i, src[i], gp[i]);
    pthread_mutex_unlock(&c->s.mu);
    char msg[512];
    for (int i = 0; i < NG; i++)
        if (wait_recv(&c->s, grx[i], 5, msg, sizeof msg) != KVHAL_OK) fail_msg("request %d: %s", 100 + i, msg);
    const int calls = atomic_load(&d2d_batches) - calls0;
    const double until = now_s() + 5;
    while (r.nacks < NG && now_s() < until) raw_progress(&r, 0.001);
    assert_int_equal(r.nacks, NG);
    printf("# %s: %d IPC frames landed together, copied in %d batched call(s)\n", tls, NG, calls);
    if (calls < 1 || calls > 2) fail_msg("%d frames copied in %d batched calls", NG, calls);
    check_ipc_pages(&c->s, c->hc, c->hpat, src, gp, NG);
    check_cache(&c->s, gp, NG);
    pthread_mutex_lock(&c->s.mu);
    for (int i = 0; i < NG; i++) {
        assert_string_equal(kvhal_xfer_path(grx[i]), "ipc");
        kvhal_xfer_release(grx[i]);
    }
    assert_int_equal(kvhal_cache_manager_free(c->s.cm, gp, NG), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
    pthread_mutex_unlock(&c->s.mu);
    raw_close(&r);
    all_pages_free(&c->s);
}

/* 3c. frames that wait for a running copy: two peers' frames interleaved in the queue while the first group is
 * held in flight (kvhal_fault_hold_streams: its stream reports busy); they wait (groups not full), peer 1 is
 * disconnected while its frames sit in the middle and at the end of the queue, a transfer of peer 2 is
 * released while its frame waits, and a frame of peer 2 lands after (appended at the queue's tail). Once the
 * streams are let go, peer 2's three remaining frames go in one batched call and arrive whole; peer 1's
 * transfers fail; every page comes back */
static void hostile_ipc_3c(hostile_ipc *c)
{
    raw r1, r2;
    kvhal_xfer_peer *p1 = raw_mapped(&c->s, &r1, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    kvhal_xfer_peer *p2 = raw_mapped(&c->s, &r2, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    int32_t g1[3], g2[4];
    kvhal_xfer *x1[3], *x2[4];
    for (int i = 0; i < 3; i++) assert_int_equal(grant(&c->s, p1, 200 + (uint64_t)i, 1, &g1[i], &x1[i]), KVHAL_OK);
    for (int i = 0; i < 4; i++) assert_int_equal(grant(&c->s, p2, 300 + (uint64_t)i, 1, &g2[i], &x2[i]), KVHAL_OK);
    const int calls0 = hold_first_copy(&r1, 200, 1, g1[0]);
    pthread_mutex_lock(&c->s.mu);
    const struct {
        raw *r;
        uint64_t req;
        int32_t src, dst;
    } q[] = {{&r2, 300, 2, g2[0]}, {&r1, 201, 3, g1[1]}, {&r2, 301, 4, g2[1]}, {&r2, 303, 6, g2[3]},
             {&r1, 202, 5, g1[2]}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) raw_ipc_one(q[i].r, q[i].req, q[i].src, q[i].dst);
    pthread_mutex_unlock(&c->s.mu);
    usleep(200000);
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 1); /* the small groups wait */
    pthread_mutex_lock(&c->s.mu);
    kvhal_xfer_release(x2[3]); /* its frame waits in the queue */
    assert_int_equal(kvhal_xfer_disconnect(p1), KVHAL_OK);
    raw_ipc_one(&r2, 302, 7, g2[2]);
    pthread_mutex_unlock(&c->s.mu);
    double until = now_s() + 5;
    while (atomic_load(&d2d_batches) < calls0 + 2 && now_s() < until) usleep(1000);
    usleep(100000);
    kvhal_fault_hold_streams(0);
    char msg[512];
    for (int i = 0; i < 3; i++)
        if (wait_recv(&c->s, x2[i], 5, msg, sizeof msg) != KVHAL_OK) fail_msg("request %d: %s", 300 + i, msg);
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 2);
    until = now_s() + 5;
    while (r2.nacks < 4 && now_s() < until) raw_progress(&r2, 0.001);
    assert_int_equal(r2.nacks, 4); /* three copied, one refused (released) */
    const int32_t src2[3] = {2, 4, 7};
    check_ipc_pages(&c->s, c->hc, c->hpat, src2, g2, 3);
    check_cache(&c->s, g2, 3);
    pthread_mutex_lock(&c->s.mu);
    for (int i = 0; i < 3; i++) {
        kvhal_xfer_info info;
        assert_int_equal(kvhal_xfer_get_info(x1[i], &info), KVHAL_OK);
        assert_int_not_equal(info.status, KVHAL_OK);
        assert_int_not_equal(info.status, KVHAL_BUSY);
        kvhal_xfer_release(x1[i]);
        kvhal_xfer_release(x2[i]);
    }
    assert_int_equal(kvhal_cache_manager_free(c->s.cm, g2, 3), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(p2), KVHAL_OK);
    pthread_mutex_unlock(&c->s.mu);
    raw_close(&r1);
    raw_close(&r2);
    all_pages_free(&c->s);
}

/* 3d. a process forked while one frame is on the (held) streams and another waits for it: the child fails both
 * naming the fork, acknowledges nothing, and has every page back in its copy of the cache manager; the parent
 * copies both once the streams are let go */
static void hostile_ipc_3d(hostile_ipc *c)
{
    raw r;
    kvhal_xfer_peer *pb = raw_mapped(&c->s, &r, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    int32_t g[2];
    kvhal_xfer *x[2];
    for (int i = 0; i < 2; i++) assert_int_equal(grant(&c->s, pb, 400 + (uint64_t)i, 1, &g[i], &x[i]), KVHAL_OK);
    const int32_t src[2] = {8, 9};
    const int calls0 = hold_first_copy(&r, 400, src[0], g[0]);
    raw_ipc_one(&r, 401, src[1], g[1]);
    usleep(100000); /* the server takes it in; it waits for the held copy */
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 1);
    fork_fails_held(&c->s, x[1], c->s.cm, NULL, "IPC frames copied and waiting");
    kvhal_fault_hold_streams(0);
    char msg[512];
    for (int i = 0; i < 2; i++)
        if (wait_recv(&c->s, x[i], 5, msg, sizeof msg) != KVHAL_OK) fail_msg("request %d: %s", 400 + i, msg);
    double until = now_s() + 5;
    while (r.nacks < 2 && now_s() < until) raw_progress(&r, 0.001);
    assert_int_equal(r.nacks, 2); /* the parent's only: the child acknowledged nothing */
    assert_int_equal(r.last_ack.status, 0);
    check_ipc_pages(&c->s, c->hc, c->hpat, src, g, 2);
    check_cache(&c->s, g, 2);
    pthread_mutex_lock(&c->s.mu);
    for (int i = 0; i < 2; i++) kvhal_xfer_release(x[i]);
    assert_int_equal(kvhal_cache_manager_free(c->s.cm, g, 2), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
    pthread_mutex_unlock(&c->s.mu);
    raw_close(&r);
    all_pages_free(&c->s);
}

/* 3e. a full group is not held back by a smaller one ahead of it: while one frame is on the (held) streams and
 * another, small, of peer 1 waits for it, peer 2's frame of 32 pages (192 chunks: a full group) lands and is
 * launched at once; the small one goes when the streams are let go */
static void hostile_ipc_3e(hostile_ipc *c)
{
    enum { NP = 32 };
    raw r1, r2;
    kvhal_xfer_peer *p1 = raw_mapped(&c->s, &r1, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    kvhal_xfer_peer *p2 = raw_mapped(&c->s, &r2, c->blob, c->len, c->hblob, c->hlen, c->off, c->stride);
    int32_t g1[2], g2[NP], src2[NP], pairs2[2 * NP];
    kvhal_xfer *x1[2], *x2;
    for (int i = 0; i < 2; i++) assert_int_equal(grant(&c->s, p1, 500 + (uint64_t)i, 1, &g1[i], &x1[i]), KVHAL_OK);
    assert_int_equal(grant(&c->s, p2, 600, NP, g2, &x2), KVHAL_OK);
    for (int i = 0; i < NP; i++) {
        src2[i] = (i * 7 + 3) % 16;
        pairs2[2 * i] = src2[i];
        pairs2[2 * i + 1] = g2[i];
    }
    const int32_t src1[2] = {10, 11};
    const int calls0 = hold_first_copy(&r1, 500, src1[0], g1[0]);
    raw_ipc_one(&r1, 501, src1[1], g1[1]);
    usleep(100000); /* it waits for the held copy */
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 1);
    raw_data_ipc(&r2, 600, 0, L, pairs2, NP, sizeof pairs2, UCP_AM_SEND_FLAG_EAGER);
    double until = now_s() + 5;
    while (atomic_load(&d2d_batches) < calls0 + 2 && now_s() < until) usleep(1000);
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 2); /* the full group, past the small one */
    kvhal_fault_hold_streams(0);
    char msg[512];
    for (int i = 0; i < 2; i++)
        if (wait_recv(&c->s, x1[i], 5, msg, sizeof msg) != KVHAL_OK) fail_msg("request %d: %s", 500 + i, msg);
    if (wait_recv(&c->s, x2, 5, msg, sizeof msg) != KVHAL_OK) fail_msg("request 600: %s", msg);
    assert_int_equal(atomic_load(&d2d_batches), calls0 + 3);
    check_ipc_pages(&c->s, c->hc, c->hpat, src1, g1, 2);
    check_ipc_pages(&c->s, c->hc, c->hpat, src2, g2, NP);
    int32_t all[2 + NP];
    memcpy(all, g1, sizeof g1);
    memcpy(all + 2, g2, sizeof g2);
    check_cache(&c->s, all, 2 + NP);
    pthread_mutex_lock(&c->s.mu);
    for (int i = 0; i < 2; i++) kvhal_xfer_release(x1[i]);
    kvhal_xfer_release(x2);
    assert_int_equal(kvhal_cache_manager_free(c->s.cm, all, 2 + NP), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(p1), KVHAL_OK);
    assert_int_equal(kvhal_xfer_disconnect(p2), KVHAL_OK);
    pthread_mutex_unlock(&c->s.mu);
    raw_close(&r1);
    raw_close(&r2);
    all_pages_free(&c->s);
}

/* 4. the CMA kind (read the sender's host pages from its process): refused without CMA among the transports,
 * a probe that is not there, a process that is gone, pages past the declared size; a malformed map drops the
 * peer; memory that is no longer mapped fails the frame (nothing written, pages back); a good one is copied */
static void hostile_ipc_4(hostile_ipc *c)
{
    static uint8_t probe[XW_CMA_PROBE], elsewhere[XW_CMA_PROBE];
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0);
    void *unmapped = mmap(NULL, c->hbytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* unreadable */
    assert_true(unmapped != MAP_FAILED);
    const uint32_t me = (uint32_t)getpid();
    struct {
        const char *name, *expect;
        xw_cma_blob b;
        size_t blen;
        int data; /* 0: map refused or peer dropped; 1: frame fails (unmapped); 2: frame copied */
    } cc[] = {
        {"nonce elsewhere", "does not hold the challenge's nonce", cma_blob(me, c->hpat, c->hbytes, probe),
         sizeof(xw_cma_blob), 0},
        {"process gone", "answered the challenge: refused", cma_blob((uint32_t)gone, c->hpat, c->hbytes, probe),
         sizeof(xw_cma_blob), 0},
        {"pages past the size", "past the", cma_blob(me, c->hpat, c->hbytes / 2, probe), sizeof(xw_cma_blob), 0},
        {"short blob", "malformed IPC_MAP", cma_blob(me, c->hpat, c->hbytes, probe), sizeof(xw_cma_blob) - 1, 0},
        {"unmapped pages", "reading the peer's pages", cma_blob(me, unmapped, c->hbytes, probe), sizeof(xw_cma_blob), 1},
        {"good", "", cma_blob(me, c->hpat, c->hbytes, probe), sizeof(xw_cma_blob), 2},
    };
    for (size_t ci = 0; ci < sizeof cc / sizeof cc[0]; ci++) {
        const bool allowed = tls_cma(tls);
        const bool malformed = cc[ci].blen != sizeof(xw_cma_blob);
        const int ev0 = server_nev(&c->s);
        raw r;
        raw_open(&r, c->blob, c->len, TOKEN);
        int e = wait_event(&c->s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
        kvhal_xfer_peer *pb = c->s.evs[e].peer;
        if (ci == 0) r.cma_write_to = elsewhere; /* the nonce is not where the map says */
        raw_map_kind(&r, XW_IPC_CMA, (const uint8_t *)&cc[ci].b, cc[ci].blen, c->off, c->stride, 16, !malformed);
        if (malformed) { /* this peer's failure (the previous one's may come late) */
            int f = ev0 - 1;
            do f = wait_event(&c->s, KVHAL_XFER_EVENT_PEER_FAILED, f + 1, 5);
            while (c->s.evs[f].peer != pb);
            assert_contains(c->s.evs[f].message, cc[ci].expect);
        } else if (!allowed) {
            assert_int_not_equal(r.map_ack.status, 0);
            assert_contains(r.map_ack.reason, "CMA is not among");
        } else if (cc[ci].data == 0) {
            assert_int_not_equal(r.map_ack.status, 0);
            assert_contains(r.map_ack.reason, cc[ci].expect);
        } else {
            if (r.map_ack.status != 0) fail_msg("%s: CMA map refused: %s", cc[ci].name, r.map_ack.reason);
            int32_t granted[2], pairs[4];
            kvhal_xfer *rx;
            char msg[512];
            kvhal_status st = ipc_two_pages(&c->s, &r, pb, 9, granted, pairs, &rx, msg, sizeof msg);
            if (cc[ci].data == 1) {
                if (st != KVHAL_PEER_FAILED) fail_msg("%s: status %s", cc[ci].name, kvhal_status_name(st));
                assert_contains(msg, cc[ci].expect);
            } else {
                assert_int_equal(st, KVHAL_OK);
                const int32_t src[2] = {pairs[0], pairs[2]};
                check_ipc_pages(&c->s, c->hc, c->hpat, src, granted, 2);
                check_cache(&c->s, granted, 2);
                pthread_mutex_lock(&c->s.mu);
                assert_string_equal(kvhal_xfer_path(rx), "cma");
                pthread_mutex_unlock(&c->s.mu);
                assert_int_equal(kvhal_cache_manager_free(c->s.cm, granted, 2), KVHAL_OK);
            }
            pthread_mutex_lock(&c->s.mu);
            kvhal_xfer_release(rx);
            pthread_mutex_unlock(&c->s.mu);
        }
        pthread_mutex_lock(&c->s.mu);
        assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
        pthread_mutex_unlock(&c->s.mu);
        raw_close(&r);
        if (cc[ci].data != 2) check_cache(&c->s, NULL, 0);
        all_pages_free(&c->s);
    }
    munmap(unmapped, c->hbytes);
}

void test_hostile_ipc(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    hostile_ipc c;
    /* launch groups not full wait for the running one here (sections 3c-3e count the launches): no chaining
     * (test_ipc_chain tests that) */
    setenv("TRANSFER_IPC_CHAIN_KIB", "0", 1);
    server_start(&c.s, cpu, 3000);
    unsetenv("TRANSFER_IPC_CHAIN_KIB");
    c.len = server_blob(&c.s, c.blob, sizeof c.blob);
    /* the hostile sender's own cache: shareable, 16 pages (what its HELLO says) */
    c.hc = shareable_cpu_cache(99, &c.hpat);
    c.hb = cache_buffer(c.hc);
    c.hbytes = kvhal_buffer_size(c.hb);
    c.hlen = 0;
    assert_int_equal(kvhal_buffer_ipc_export(c.hb, c.hblob, sizeof c.hblob, &c.hlen), KVHAL_OK);
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) c.off[2 * l + kv] = chunk_at(c.hc, l, kv, 0);
    c.stride = chunk_at(c.hc, 0, 0, 1) - chunk_at(c.hc, 0, 0, 0);
    hostile_ipc_1(&c);
    hostile_ipc_2(&c);
    hostile_ipc_3(&c);
    hostile_ipc_3b(&c);
    hostile_ipc_3c(&c);
    hostile_ipc_3d(&c);
    hostile_ipc_3e(&c);
    hostile_ipc_4(&c);
    server_stop(&c.s);
    kvhal_paged_cache_destroy(c.hc);
    free(c.hpat);
}

/* Chaining (TRANSFER_IPC_CHAIN_KIB=1024): while one launch group is held in flight, the next frame to land is queued
 * behind it on its stream at once (a second launch; the first group is then reaped by its stream's event), a third
 * waits for them (groups not full: no third launch while two run), and once the streams are let go every frame
 * arrives whole, each acknowledged, every page back. Then the same with chaining off: the second frame waits. */
void test_ipc_chain(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    for (int chain = 1; chain >= 0; chain--) {
        server s;
        setenv("TRANSFER_IPC_CHAIN_KIB", chain ? "1024" : "0", 1);
        server_start(&s, cpu, 3000);
        unsetenv("TRANSFER_IPC_CHAIN_KIB");
        uint8_t blob[4096];
        size_t len = server_blob(&s, blob, sizeof blob);
        uint8_t *hpat;
        kvhal_paged_cache *hc = shareable_cpu_cache(77, &hpat);
        uint8_t hblob[KVHAL_IPC_HANDLE_MAX];
        size_t hlen = 0;
        assert_int_equal(kvhal_buffer_ipc_export(cache_buffer(hc), hblob, sizeof hblob, &hlen), KVHAL_OK);
        uint64_t off[2 * L];
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) off[2 * l + kv] = chunk_at(hc, l, kv, 0);
        const uint64_t stride = chunk_at(hc, 0, 0, 1) - chunk_at(hc, 0, 0, 0);
        raw r;
        kvhal_xfer_peer *pb = raw_mapped(&s, &r, blob, len, hblob, hlen, off, stride);
        enum { N = 3 };
        int32_t g[N];
        kvhal_xfer *x[N];
        const int32_t src[N] = {12, 3, 9};
        for (int i = 0; i < N; i++) assert_int_equal(grant(&s, pb, 700 + (uint64_t)i, 1, &g[i], &x[i]), KVHAL_OK);
        const int calls0 = hold_first_copy(&r, 700, src[0], g[0]);
        raw_ipc_one(&r, 701, src[1], g[1]);
        double until = now_s() + 5;
        while (chain && atomic_load(&d2d_batches) < calls0 + 2 && now_s() < until) usleep(1000);
        usleep(100000);
        assert_int_equal(atomic_load(&d2d_batches), calls0 + 1 + chain); /* chained, or waiting */
        raw_ipc_one(&r, 702, src[2], g[2]);
        usleep(100000);
        assert_int_equal(atomic_load(&d2d_batches), calls0 + 1 + chain); /* the third waits either way */
        pthread_mutex_lock(&s.mu);
        for (int i = 0; i < N; i++) {
            kvhal_xfer_info info;
            assert_int_equal(kvhal_xfer_get_info(x[i], &info), KVHAL_OK);
            assert_int_equal(info.status, KVHAL_BUSY); /* nothing is visible before its copy is done */
        }
        pthread_mutex_unlock(&s.mu);
        kvhal_fault_hold_streams(0);
        char msg[512];
        for (int i = 0; i < N; i++)
            if (wait_recv(&s, x[i], 5, msg, sizeof msg) != KVHAL_OK) fail_msg("request %d: %s", 700 + i, msg);
        until = now_s() + 5;
        while (r.nacks < N && now_s() < until) raw_progress(&r, 0.001);
        assert_int_equal(r.nacks, N);
        assert_int_equal(r.last_ack.status, 0);
        const int calls = atomic_load(&d2d_batches) - calls0;
        printf("# chain=%d: %d frames copied in %d batched calls\n", chain, N, calls);
        if (calls < 2 || calls > 3) fail_msg("%d frames copied in %d batched calls", N, calls);
        check_ipc_pages(&s, hc, hpat, src, g, N);
        check_cache(&s, g, N);
        pthread_mutex_lock(&s.mu);
        for (int i = 0; i < N; i++) {
            assert_string_equal(kvhal_xfer_path(x[i]), "ipc");
            kvhal_xfer_release(x[i]);
        }
        assert_int_equal(kvhal_cache_manager_free(s.cm, g, N), KVHAL_OK);
        assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
        pthread_mutex_unlock(&s.mu);
        raw_close(&r);
        all_pages_free(&s);
        server_stop(&s);
        kvhal_paged_cache_destroy(hc);
        free(hpat);
    }
}

/* A peer that names a buffer it does not own: another process's shareable cache (a bystander's handle, here one
 * this process exported), its offsets and page count all valid. The receiver imports it, challenges, and reads the
 * nonce back through that mapping: the hostile peer wrote it into its own cache (where it can write), so the
 * bystander's memory does not hold it: the peer fails, by name, before a page is read (no batched copy, the grant
 * fails, the receiver's cache and the bystander's memory unchanged). Then: a DATA_IPC frame sent before the proof
 * fails the peer too; a peer that never answers has its map refused after the timeout; a proof that points into
 * the pages fails the peer; and the same handle proven by its owner's memory is accepted (the control). */
void test_ipc_bystander(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server s;
    server_start(&s, cpu, 800);
    uint8_t blob[4096];
    const size_t len = server_blob(&s, blob, sizeof blob);
    uint8_t *mine_pat, *by_pat;
    kvhal_paged_cache *mine = shareable_cpu_cache(11, &mine_pat);
    kvhal_paged_cache *by = shareable_cpu_cache(12, &by_pat);
    kvhal_buffer *mb = cache_buffer(mine), *bb = cache_buffer(by);
    const size_t bbytes = kvhal_buffer_size(bb);
    uint8_t hblob[KVHAL_IPC_HANDLE_MAX];
    size_t hlen = 0;
    assert_int_equal(kvhal_buffer_ipc_export(bb, hblob, sizeof hblob, &hlen), KVHAL_OK);
    uint64_t off[2 * L];
    for (int l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) off[2 * l + kv] = chunk_at(by, l, kv, 0);
    const uint64_t stride = chunk_at(by, 0, 0, 1) - chunk_at(by, 0, 0, 0);
    const uint64_t area = bbytes - KVHAL_PAGED_CACHE_PROOF_BYTES;
    enum { LIE, DATA_FIRST, SILENT, IN_PAGES, OWNER };
    for (int k = LIE; k <= OWNER; k++) {
        const int ev0 = server_nev(&s);
        raw r;
        raw_open(&r, blob, len, TOKEN);
        int e = wait_event(&s, KVHAL_XFER_EVENT_PEER_CONNECTED, ev0, 5);
        kvhal_xfer_peer *pb = s.evs[e].peer;
        int32_t granted[2];
        kvhal_xfer *rx;
        assert_int_equal(grant(&s, pb, 30 + (uint64_t)k, 2, granted, &rx), KVHAL_OK);
        const int calls0 = atomic_load(&d2d_batches);
        r.ipc_own = k == OWNER ? bb : mb; /* where the nonce goes: the hostile peer's own cache, or the owner's */
        r.ipc_proof_at = k == IN_PAGES ? 0 : area + 64;
        raw_map(&r, hblob, hlen, off, stride, 16, false);
        if (k == DATA_FIRST) { /* pages named before the proof: nothing is read */
            const int32_t pr[2] = {3, granted[0]};
            raw_data_ipc(&r, 30 + (uint64_t)k, 0, L, pr, 1, 8, UCP_AM_SEND_FLAG_EAGER);
        }
        double until = now_s() + 5;
        while (!r.got_map_ack && now_s() < until) {
            raw_progress(&r, 0.001);
            if (r.got_ipc_challenge && k != SILENT && k != DATA_FIRST) raw_ipc_prove(&r);
            pthread_mutex_lock(&s.mu);
            kvhal_xfer_info info;
            assert_int_equal(kvhal_xfer_get_info(rx, &info), KVHAL_OK);
            pthread_mutex_unlock(&s.mu);
            if (info.status != KVHAL_BUSY && k != SILENT) break; /* the peer failed */
        }
        char msg[512];
        const kvhal_status st = k == SILENT || k == OWNER ? KVHAL_BUSY : wait_recv(&s, rx, 5, msg, sizeof msg);
        if (k == OWNER) {
            if (!r.got_map_ack || r.map_ack.status != 0) fail_msg("owner's proof refused: %s", r.map_ack.reason);
            const int32_t pairs[4] = {5, granted[0], 9, granted[1]};
            raw_data_ipc(&r, 30 + (uint64_t)k, 0, L, pairs, 2, 16, UCP_AM_SEND_FLAG_EAGER);
            assert_int_equal(wait_recv(&s, rx, 5, msg, sizeof msg), KVHAL_OK);
            const int32_t src[2] = {5, 9};
            check_ipc_pages(&s, by, by_pat, src, granted, 2);
            check_cache(&s, granted, 2);
            assert_int_equal(kvhal_cache_manager_free(s.cm, granted, 2), KVHAL_OK);
        } else if (k == SILENT) {
            assert_true(r.got_map_ack);
            assert_int_not_equal(r.map_ack.status, 0);
            assert_contains(r.map_ack.reason, "no proof of the IPC handle within"); /* the peer stays (UCX) */
        } else {
            if (st != KVHAL_PEER_FAILED) fail_msg("case %d: receive %s (%s)", k, kvhal_status_name(st), msg);
            int f = ev0 - 1;
            do f = wait_event(&s, KVHAL_XFER_EVENT_PEER_FAILED, f + 1, 5);
            while (s.evs[f].peer != pb);
            const char *want = k == LIE ? "does not hold this agent's challenge nonce"
                             : k == IN_PAGES ? "outside the proof area" : "without an imported IPC handle";
            assert_contains(s.evs[f].message, want);
            if (k != DATA_FIRST) assert_contains(s.evs[f].message, "peer hostile");
            assert_true(!r.got_map_ack || r.map_ack.status != 0);
        }
        if (k != OWNER) assert_int_equal(atomic_load(&d2d_batches), calls0); /* not a page read */
        else assert_true(atomic_load(&d2d_batches) > calls0);
        pthread_mutex_lock(&s.mu);
        kvhal_xfer_release(rx);
        assert_int_equal(kvhal_xfer_disconnect(pb), KVHAL_OK);
        pthread_mutex_unlock(&s.mu);
        raw_close(&r);
        if (k != OWNER) check_cache(&s, NULL, 0); /* a failed receive gives its pages back */
        all_pages_free(&s);
        /* the bystander's pages untouched; its proof area holds the owner's nonce only in the control case */
        uint8_t *now = malloc(bbytes);
        assert_non_null(now);
        assert_int_equal(kvhal_memcpy_d2h(now, bb, 0, bbytes, NULL), KVHAL_OK);
        assert_memory_equal(now, by_pat, area);
        free(now);
    }
    server_stop(&s);
    kvhal_paged_cache_destroy(by);
    kvhal_paged_cache_destroy(mine);
    free(by_pat);
    free(mine_pat);
}

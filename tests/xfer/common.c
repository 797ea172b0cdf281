/* common.c — the suite's shared helpers: the calls it puts itself between (UCX endpoints, DATA frames, copy
 * workers, process_vm_readv), the receiver (a server thread), the hand-made hostile peer, and main. */
#include "xfer_test.h"

const char *tls = "tcp"; /* TRANSFER_TLS */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A size in KiB from the environment, or def (unset, or not a number). */
static long env_kib(const char *name, long def)
{
    const char *v = getenv(name);
    char *end = NULL;
    const long n = v && *v ? strtol(v, &end, 10) : def;
    return end && *end ? def : n;
}

/* Agents with the test's sizes (xfer_internal.h), so that its small caches take the paths of large transfers:
 * TRANSFER_GATHER_FRAME_KIB (TCP frames cut to this many KiB; one page a frame at 1), TRANSFER_GATHER_KIB (frames
 * of this many KiB and more gathered by the copy workers; default half the former when it is set),
 * TRANSFER_CMA_PIECE_KIB (CMA frames split across the workers in pieces of this many KiB), TRANSFER_IPC_CHAIN_KIB
 * (launch groups of at most this many KiB chained; 0: never), set by tests/meson.build or around an agent's
 * creation by a test; unset: the library's. */
kvhal_status agent_create(const kvhal_xfer_config *cfg, kvhal_xfer_agent **out)
{
    const kvhal_status st = kvhal_xfer_agent_create(cfg, out);
    if (st != KVHAL_OK) return st;
    const long frame = env_kib("TRANSFER_GATHER_FRAME_KIB", 0);
    const kvhal__xfer_tuning t = {
        .cma_piece = (size_t)env_kib("TRANSFER_CMA_PIECE_KIB", 0) << 10,
        .gather_frame = (size_t)frame << 10,
        .gather_min = env_kib("TRANSFER_GATHER_KIB", frame ? frame / 2 : -1) * 1024,
        .ipc_chain = env_kib("TRANSFER_IPC_CHAIN_KIB", -1) * 1024,
    };
    kvhal__xfer_tune(*out, &t);
    return st;
}

void assert_contains(const char *s, const char *needle)
{
    if (!strstr(s, needle)) fail_msg("\"%s\" does not contain \"%s\"", s, needle);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the agents' endpoints, counted: libkvhal-xfer's objects are linked into this program, whose definitions of  */
/* ucp_ep_create and ucp_ep_close_nbx their calls land in first; these go on to UCX's                           */
/* ---------------------------------------------------------------------------------------------------------- */
static pthread_mutex_t eps_mu = PTHREAD_MUTEX_INITIALIZER;
static ucp_ep_h agent_eps[1024]; /* created by an agent and not closed (a close UCX refused leaves it here) */
static int n_agent_eps;
static int n_created_eps; /* every endpoint an agent created */
static _Thread_local bool raw_call; /* set around the hand-made peer's own calls, which are not counted */

ucs_status_t ucp_ep_create(ucp_worker_h worker, const ucp_ep_params_t *params, ucp_ep_h *ep_p)
{
    ucs_status_t (*real)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
    void *sym = dlsym(RTLD_NEXT, "ucp_ep_create");
    memcpy(&real, &sym, sizeof real);
    const ucs_status_t st = real(worker, params, ep_p);
    pthread_mutex_lock(&eps_mu);
    if (st == UCS_OK && !raw_call) n_created_eps++;
    if (st == UCS_OK && !raw_call && n_agent_eps < (int)(sizeof agent_eps / sizeof agent_eps[0]))
        agent_eps[n_agent_eps++] = *ep_p;
    pthread_mutex_unlock(&eps_mu);
    return st;
}

ucs_status_ptr_t ucp_ep_close_nbx(ucp_ep_h ep, const ucp_request_param_t *param)
{
    ucs_status_ptr_t (*real)(ucp_ep_h, const ucp_request_param_t *);
    void *sym = dlsym(RTLD_NEXT, "ucp_ep_close_nbx");
    memcpy(&real, &sym, sizeof real);
    const ucs_status_ptr_t r = real(ep, param);
    pthread_mutex_lock(&eps_mu);
    if (!UCS_PTR_IS_ERR(r))
        for (int i = 0; i < n_agent_eps; i++)
            if (agent_eps[i] == ep) {
                agent_eps[i] = agent_eps[--n_agent_eps];
                break;
            }
    pthread_mutex_unlock(&eps_mu);
    return r;
}

/* DATA frames posted by the agents (ucp_am_send_nbx with a DATA header), and copy workers started by
 * libkvhal-xfer (pthread_create of its pool's xfer_pool_worker): how the TCP path cut and gathered a transfer */
atomic_int data_frames, xfer_threads;

ucs_status_ptr_t ucp_am_send_nbx(ucp_ep_h ep, unsigned id, const void *header, size_t header_length,
                                 const void *buffer, size_t count, const ucp_request_param_t *param)
{
    ucs_status_ptr_t (*real)(ucp_ep_h, unsigned, const void *, size_t, const void *, size_t,
                             const ucp_request_param_t *);
    void *sym = dlsym(RTLD_NEXT, "ucp_am_send_nbx");
    memcpy(&real, &sym, sizeof real);
    xw_common c;
    if (header_length >= sizeof c) {
        memcpy(&c, header, sizeof c);
        if (c.magic == XW_MAGIC && c.type == XW_DATA) atomic_fetch_add(&data_frames, 1);
    }
    return real(ep, id, header, header_length, buffer, count, param);
}

/* The receiver's batched device copies (libkvhal-xfer's calls of kvhal_memcpy_d2d_batch: the IPC path's launch
 * groups), counted: test_hostile_ipc's frames that land together */
atomic_int d2d_batches;

kvhal_status kvhal_memcpy_d2d_batch(kvhal_buffer *dst, const kvhal_buffer *src, const size_t *dst_offsets,
                                    const size_t *src_offsets, const size_t *bytes, int32_t count, kvhal_stream *s)
{
    kvhal_status (*real)(kvhal_buffer *, const kvhal_buffer *, const size_t *, const size_t *, const size_t *, int32_t,
                         kvhal_stream *);
    void *sym = dlsym(RTLD_NEXT, "kvhal_memcpy_d2d_batch");
    memcpy(&real, &sym, sizeof real);
    atomic_fetch_add(&d2d_batches, 1);
    return real(dst, src, dst_offsets, src_offsets, bytes, count, s);
}

/* While worker_gate is closed, copy workers started by libkvhal-xfer wait before they run (test_gathers_in_flight:
 * frames stay queued, not gathered, while the test cancels, disconnects or destroys) */
atomic_bool worker_gate;
atomic_int workers_held;
/* Bit k of threads_refuse refuses (EAGAIN, as a process out of threads gets) libkvhal-xfer's k-th thread start
 * counted from refuse_base (xfer_threads when the test set it): test_worker_threads_refused */
atomic_uint threads_refuse;
atomic_int refuse_base, threads_refused;
typedef struct held_start {
    void *(*start)(void *);
    void *arg;
} held_start;

static void *held_worker(void *p)
{
    held_start h = *(held_start *)p;
    free(p);
    atomic_fetch_add(&workers_held, 1);
    while (atomic_load(&worker_gate)) usleep(1000);
    atomic_fetch_sub(&workers_held, 1);
    return h.start(h.arg);
}

int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*start)(void *), void *arg)
{
    int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    void *sym = dlsym(RTLD_NEXT, "pthread_create");
    memcpy(&real, &sym, sizeof real);
    if (start == xfer_pool_worker) { /* a copy worker of libkvhal-xfer (linked in) */
        const int k = atomic_fetch_add(&xfer_threads, 1) - atomic_load(&refuse_base);
        if (k >= 0 && k < 32 && (atomic_load(&threads_refuse) >> k & 1u)) {
            atomic_fetch_add(&threads_refused, 1);
            return EAGAIN;
        }
        held_start *h = atomic_load(&worker_gate) ? malloc(sizeof *h) : NULL;
        if (h) {
            *h = (held_start){start, arg};
            const int rc = real(th, attr, held_worker, h);
            if (rc) free(h);
            return rc;
        }
    }
    return real(th, attr, start, arg);
}

/* The CMA path's reads, counted and, while the gate is closed, held (test_cma_copies_in_flight): a copy worker
 * that reaches process_vm_readv waits here, so that the test can cancel, release, disconnect or destroy while
 * copies are in flight. With vm_read_cap set, a call reads that many bytes at most and says so, as the kernel does
 * past MAX_RW_COUNT (about 2 GiB a call): the reader must go on from where it stopped. */
pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_closed;
static int gate_held; /* reads waiting at the gate now */
static int vm_reads;  /* every process_vm_readv call */
size_t vm_read_cap; /* 0: whole reads */
const char *server_token; /* the token server_start's agent is made with (NULL: TOKEN) */
uint64_t raw_chunk;       /* the chunk_bytes raw_open's HELLO claims (0: CHUNK) */
const raw *raw_replay;    /* raw_open replays this connection's HELLO and AUTH (NULL: its own) */
pid_t vm_watch_pid;   /* reads of this process are counted in vm_watch_reads */
int vm_watch_reads;

/* The first cap bytes of an iovec list (into out, up to 1024 entries). */
static unsigned long iov_cut(const struct iovec *v, unsigned long n, size_t cap, struct iovec *out)
{
    unsigned long k = 0;
    for (unsigned long i = 0; i < n && cap > 0 && k < 1024; i++) {
        const size_t take = v[i].iov_len < cap ? v[i].iov_len : cap;
        out[k++] = (struct iovec){v[i].iov_base, take};
        cap -= take;
    }
    return k;
}

ssize_t process_vm_readv(pid_t pid, const struct iovec *lv, unsigned long lc, const struct iovec *rv, unsigned long rc,
                         unsigned long flags)
{
    ssize_t (*real)(pid_t, const struct iovec *, unsigned long, const struct iovec *, unsigned long, unsigned long);
    void *sym = dlsym(RTLD_NEXT, "process_vm_readv");
    memcpy(&real, &sym, sizeof real);
    pthread_mutex_lock(&gate_mu);
    vm_reads++;
    if (pid == vm_watch_pid) vm_watch_reads++;
    if (gate_closed) {
        gate_held++;
        pthread_cond_broadcast(&gate_cv);
        while (gate_closed) pthread_cond_wait(&gate_cv, &gate_mu);
        gate_held--;
    }
    const size_t cap = vm_read_cap;
    pthread_mutex_unlock(&gate_mu);
    if (cap) {
        struct iovec l2[1024], r2[1024];
        const unsigned long nl = iov_cut(lv, lc, cap, l2), nr = iov_cut(rv, rc, cap, r2);
        return real(pid, l2, nl, r2, nr, flags);
    }
    return real(pid, lv, lc, rv, rc, flags);
}

void gate_set(bool closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

int gate_count(int *reads)
{
    pthread_mutex_lock(&gate_mu);
    const int n = gate_held;
    if (reads) *reads = vm_reads;
    pthread_mutex_unlock(&gate_mu);
    return n;
}

int created_agent_eps(void)
{
    pthread_mutex_lock(&eps_mu);
    const int n = n_created_eps;
    pthread_mutex_unlock(&eps_mu);
    return n;
}

int open_agent_eps(void)
{
    pthread_mutex_lock(&eps_mu);
    const int n = n_agent_eps;
    pthread_mutex_unlock(&eps_mu);
    return n;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the receiver: an agent, a paged cache, a cache manager, a server thread                                      */

void *serve(void *arg)
{
    server *s = arg;
    while (!atomic_load(&s->stop)) {
        pthread_mutex_lock(&s->mu);
        kvhal_xfer_event ev;
        if (kvhal_xfer_progress(s->ag, 2, &ev) == KVHAL_OK && ev.type != KVHAL_XFER_EVENT_NONE && s->nev < 1024) {
            if (ev.type == KVHAL_XFER_EVENT_GRANT)
                memcpy(s->grant_pages[s->nev], ev.pages, (size_t)(ev.num_pages < 8 ? ev.num_pages : 8) * 4);
            ev.pages = NULL;
            s->evs[s->nev++] = ev;
        }
        pthread_mutex_unlock(&s->mu);
        usleep(100);
    }
    return NULL;
}

/* Whether the agent's transports let it take the CMA path (host caches on one host): as transfer/xfer_agent.c decides. */
bool tls_cma(const char *t)
{
    return !t || strstr(t, "shm") || strstr(t, "cma") || !strcmp(t, "sm") || strstr(t, "all");
}

kvhal_paged_cache *make_cache(kvhal_device dev, int32_t heads, int64_t pages, kvhal_paged_order order)
{
    kvhal_paged_cache_config c = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = L, .num_heads = heads, .head_dim = DIM, .block_size = BLOCK,
                                  .dtype = KVHAL_F16, .layout = KVHAL_LAYOUT_NHD, .order = order,
                                  .memory_budget = (uint64_t)pages * 2 * L * BLOCK * (uint64_t)heads * DIM * 2,
                                  .device = dev};
    kvhal_paged_cache *pc = NULL;
    assert_int_equal(kvhal_paged_cache_create(&c, &pc), KVHAL_OK);
    assert_int_equal(kvhal_paged_cache_num_blocks(pc), pages);
    return pc;
}

kvhal_buffer *cache_buffer(kvhal_paged_cache *pc)
{
    kvhal_tensor k, v;
    assert_int_equal(kvhal_paged_cache_layer(pc, 0, &k, &v), KVHAL_OK);
    return k.buffer;
}

/* Byte offset of (layer, K|V, page) in a cache made by make_cache. */
size_t chunk_at(kvhal_paged_cache *pc, int32_t l, int kv, int32_t page)
{
    kvhal_tensor k, v;
    assert_int_equal(kvhal_paged_cache_layer(pc, l, &k, &v), KVHAL_OK);
    const kvhal_tensor *t = kv ? &v : &k;
    return t->offset + (size_t)page * (size_t)t->strides[0] * 2;
}

void fill_pattern(uint8_t *out, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[i] = (uint8_t)(x >> 29);
    }
}

void server_start(server *s, kvhal_device dev, uint32_t timeout_ms)
{
    memset(s, 0, sizeof *s);
    s->cache = make_cache(dev, HEADS, PAGES, KVHAL_PAGE_FIRST);
    s->buf = cache_buffer(s->cache);
    s->bytes = kvhal_buffer_size(s->buf);
    s->canary = malloc(s->bytes);
    assert_non_null(s->canary);
    fill_pattern(s->canary, s->bytes, 1234);
    assert_int_equal(kvhal_memcpy_h2d(s->buf, 0, s->canary, s->bytes, NULL), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_create(PAGES, BLOCK, KVHAL_PREFIX_RADIX, &s->cm), KVHAL_OK);
    kvhal_xfer_config cfg = {.name = "decode", .token = server_token ? server_token : TOKEN,
                             .timeout_ms = timeout_ms, .transports = tls};
    assert_int_equal(agent_create(&cfg, &s->ag), KVHAL_OK);
    assert_int_equal(kvhal_xfer_register_paged_cache(s->ag, s->cache), KVHAL_OK);
    pthread_mutex_init(&s->mu, NULL);
    assert_int_equal(pthread_create(&s->th, NULL, serve, s), 0);
}

void server_stop(server *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->th, NULL);
    assert_int_equal(kvhal_xfer_agent_destroy(s->ag), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_check_integrity(s->cm), KVHAL_OK);
    kvhal_cache_manager_destroy(s->cm);
    kvhal_paged_cache_destroy(s->cache);
    pthread_mutex_destroy(&s->mu);
    free(s->canary);
}

size_t server_blob(server *s, uint8_t *blob, size_t cap)
{
    size_t len = 0;
    pthread_mutex_lock(&s->mu);
    assert_int_equal(kvhal_xfer_local_address(s->ag, blob, cap, &len), KVHAL_OK);
    pthread_mutex_unlock(&s->mu);
    return len;
}

/* The server's event count now (under its lock: the server thread appends). */
int server_nev(server *s)
{
    pthread_mutex_lock(&s->mu);
    const int n = s->nev;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Waits for an event of type on the server; returns its index or fails. */
int wait_event(server *s, kvhal_xfer_event_type type, int from, double seconds)
{
    const double until = now_s() + seconds;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        for (int i = from; i < s->nev; i++)
            if (s->evs[i].type == type) {
                pthread_mutex_unlock(&s->mu);
                return i;
            }
        pthread_mutex_unlock(&s->mu);
        if (now_s() > until) fail_msg("no event of type %d within %.1f s", (int)type, seconds);
        usleep(1000);
    }
}

/* The whole cache equals the canary except the given pages (every layer, K and V), which equal want (if set). */
void check_cache(server *s, const int32_t *pages, int32_t n)
{
    uint8_t *now = malloc(s->bytes);
    assert_non_null(now);
    assert_int_equal(kvhal_memcpy_d2h(now, s->buf, 0, s->bytes, NULL), KVHAL_OK);
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++) {
                const size_t o = chunk_at(s->cache, l, kv, pages[i]);
                memcpy(s->canary + o, now + o, CHUNK); /* delivered pages: checked by the caller */
            }
    for (size_t o = 0; o < s->bytes; o++)
        if (now[o] != s->canary[o]) fail_msg("byte %zu of the receiver's cache changed outside the pages", o);
    free(now);
}

void all_pages_free(server *s)
{
    pthread_mutex_lock(&s->mu);
    int32_t f = kvhal_cache_manager_num_free(s->cm);
    assert_int_equal(kvhal_cache_manager_check_integrity(s->cm), KVHAL_OK);
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(f, PAGES);
}

kvhal_status grant(server *s, kvhal_xfer_peer *peer, uint64_t req, int32_t n, int32_t *pages, kvhal_xfer **x)
{
    pthread_mutex_lock(&s->mu);
    kvhal_status st = kvhal_cache_manager_allocate(s->cm, n, pages);
    if (st == KVHAL_OK) st = kvhal_xfer_post_receive(peer, req, pages, n, s->cm, x);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Waits for a server-side transfer (progressed by the thread). */
kvhal_status wait_recv(server *s, kvhal_xfer *x, double seconds, char *msg, size_t cap)
{
    const double until = now_s() + seconds;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        kvhal_xfer_info info;
        assert_int_equal(kvhal_xfer_get_info(x, &info), KVHAL_OK);
        kvhal_status st = info.status;
        if (st != KVHAL_BUSY) {
            kvhal_xfer_test(x);
            snprintf(msg, cap, "%s", kvhal_last_error());
        }
        pthread_mutex_unlock(&s->mu);
        if (st != KVHAL_BUSY) return st;
        if (now_s() > until) return KVHAL_BUSY;
        usleep(1000);
    }
}

/* Progresses the sender's agent until the receiver's GRANT arrives (ev: it), failing the test after 5 s. */
void sender_grant(kvhal_xfer_agent *a, kvhal_xfer_event *ev)
{
    const double until = now_s() + 5;
    do {
        assert_int_equal(kvhal_xfer_progress(a, 10, ev), KVHAL_OK);
        if (now_s() > until) fail_msg("%s", "no GRANT on the sender");
    } while (ev->type != KVHAL_XFER_EVENT_GRANT);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* a hostile peer: hand-made frames over raw UCX                                                               */

static ucs_status_t raw_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                           const ucp_am_recv_param_t *param)
{
    (void)data;
    (void)length;
    (void)param;
    raw *r = arg;
    xw_common c;
    if (header_length < sizeof c) return UCS_OK;
    memcpy(&c, header, sizeof c);
    if (c.type == XW_HELLO_ACK && header_length == sizeof(xw_hello_ack)) {
        xw_hello_ack k;
        memcpy(&k, header, sizeof k);
        r->got_hello_ack = true;
        r->ack = k;
        r->hello_status = k.status;
        r->their_session = k.src_session;
    } else if (c.type == XW_IPC_MAP_ACK && header_length == sizeof(xw_ipc_map_ack)) {
        memcpy(&r->map_ack, header, sizeof r->map_ack);
        r->map_ack.reason[sizeof r->map_ack.reason - 1] = '\0';
        r->got_map_ack = true;
    } else if (c.type == XW_ACK && header_length == sizeof(xw_ack)) {
        memcpy(&r->last_ack, header, sizeof r->last_ack);
        r->nacks++;
    } else if (c.type == XW_GRANT) {
        r->ngrants++;
    } else if (c.type == XW_IPC_CHALLENGE && header_length == sizeof(xw_ipc_challenge)) {
        xw_ipc_challenge ch;
        memcpy(&ch, header, sizeof ch);
        memcpy(r->ipc_nonce, ch.nonce, sizeof r->ipc_nonce);
        r->got_ipc_challenge = true;
    } else if (c.type == XW_CMA_CHALLENGE && header_length == sizeof(xw_cma_challenge)) {
        /* as the library's sender: the nonce at the probe address, then {session, nonce} on the socket */
        xw_cma_challenge ch;
        memcpy(&ch, header, sizeof ch);
        uint8_t *to = r->cma_write_to ? r->cma_write_to : r->cma_probe_at;
        if (to) memcpy(to, ch.nonce, XW_CMA_PROBE);
        xw_cma_sock_msg m = {.session = r->their_session};
        memcpy(m.nonce, ch.nonce, sizeof m.nonce);
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        const size_t n = strnlen(ch.sock, sizeof ch.sock - 1);
        memcpy(sa.sun_path + 1, ch.sock, n);
        const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) == 0)
            (void)send(fd, &m, sizeof m, MSG_NOSIGNAL);
        if (fd >= 0) close(fd);
        r->cma_challenges++;
    }
    return UCS_OK;
}

void raw_progress(raw *r, double seconds)
{
    const double until = now_s() + seconds;
    while (now_s() < until) {
        ucp_worker_progress(r->w);
        usleep(200);
    }
}

void raw_send(raw *r, const void *hdr, size_t hlen, const void *data, size_t dlen, uint32_t flags)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
    void *q = ucp_am_send_nbx(r->ep, XW_AM_ID, hdr, hlen, data, dlen, &prm);
    assert_false(UCS_PTR_IS_ERR(q));
    const double until = now_s() + 3;
    if (q) {
        while (ucp_request_check_status(q) == UCS_INPROGRESS && now_s() < until) ucp_worker_progress(r->w);
        if (ucp_request_check_status(q) == UCS_INPROGRESS) ucp_request_cancel(r->w, q);
        ucp_request_free(q);
    }
}

const char *raw_tcp_seg = ""; /* the TCP receive segments the raw peer's HELLO claims ("": no TCP) */

/* Connects as an agent of wire version `version` would (its HELLO in our layout) and waits for the answer. */
void raw_open_v(raw *r, const uint8_t *blob, size_t len, const char *token, uint16_t version)
{
    memset(r, 0, sizeof *r);
    ucp_config_t *uc;
    assert_int_equal(ucp_config_read(NULL, NULL, &uc), UCS_OK);
    assert_int_equal(ucp_config_modify(uc, "TLS", tls), UCS_OK);
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    assert_int_equal(ucp_init(&pp, uc, &r->ctx), UCS_OK);
    ucp_config_release(uc);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    assert_int_equal(ucp_worker_create(r->ctx, &wp, &r->w), UCS_OK);
    assert_int_equal(ucp_worker_get_address(r->w, &r->addr, &r->alen), UCS_OK);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = XW_AM_ID, .cb = raw_am, .arg = r};
    assert_int_equal(ucp_worker_set_am_recv_handler(r->w, &hp), UCS_OK);
    xw_blob b;
    memcpy(&b, blob, sizeof b);
    assert_int_equal(len, sizeof b + b.addr_len);
    /* the agent's error handling (peer where the transport has it: tcp), or UCX refuses the endpoint */
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = (const ucp_address_t *)(blob + sizeof b),
                          .err_mode = strstr(tls, "tcp") ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE};
    raw_call = true;
    assert_int_equal(ucp_ep_create(r->w, &ep, &r->ep), UCS_OK);
    raw_call = false;
    xw_hello h;
    memset(&h, 0, sizeof h);
    h.c = (xw_common){XW_MAGIC, version, XW_HELLO, 0};
    r->my_session = 0x1234567890abcdefull;
    h.src_session = r->my_session;
    snprintf(h.name, sizeof h.name, "hostile");
    for (size_t i = 0; i < sizeof h.nonce; i++) h.nonce[i] = (uint8_t)rand();
    h.g = (xw_geometry){L, HEADS, DIM, BLOCK, KVHAL_F16, KVHAL_LAYOUT_NHD, 16, raw_chunk ? raw_chunk : CHUNK};
    h.addr_len = (uint32_t)r->alen;
    snprintf(h.tcp_seg, sizeof h.tcp_seg, "%s", raw_tcp_seg);
    if (raw_replay) { /* another connection's HELLO, byte for byte (but for the address the answer comes to) */
        h = raw_replay->hello;
        h.addr_len = (uint32_t)r->alen;
    }
    raw_send(r, &h, sizeof h, r->addr, r->alen, UCP_AM_SEND_FLAG_EAGER);
    r->hello = h;
    /* a HELLO of another wire version gets no answer; ours gets the challenge (or a refusal) */
    const bool answered = version == XW_VERSION;
    const double until = now_s() + (answered ? 5 : 0.5);
    while (!r->got_hello_ack && now_s() < until) raw_progress(r, 0.001);
    assert_int_equal(r->got_hello_ack, answered);
    if (!answered || r->hello_status != 0) return;
    /* the listener proved the token (ours, TOKEN); our proof is made with the token given */
    xw_transcript t = raw_transcript(r);
    uint8_t want[XW_PROOF];
    kvhal__xfer_proof(TOKEN, &t, XW_LABEL_LISTENER, want);
    assert_memory_equal(want, r->ack.proof, XW_PROOF);
    xw_auth au;
    memset(&au, 0, sizeof au);
    au.c = (xw_common){XW_MAGIC, XW_VERSION, XW_AUTH, r->their_session};
    kvhal__xfer_proof(token, &t, XW_LABEL_CONNECTOR, au.proof);
    if (raw_replay) memcpy(au.proof, raw_replay->auth.proof, XW_PROOF); /* its recorded proof */
    raw_send(r, &au, sizeof au, NULL, 0, UCP_AM_SEND_FLAG_EAGER);
    r->auth = au;
}

/* The handshake's transcript as the hand-made connector and the listener both see it. */
xw_transcript raw_transcript(const raw *r)
{
    xw_transcript t;
    memset(&t, 0, sizeof t);
    memcpy(t.nonce_c, r->hello.nonce, XW_NONCE);
    memcpy(t.nonce_l, r->ack.nonce, XW_NONCE);
    t.session_c = r->hello.src_session;
    t.session_l = r->ack.src_session;
    memcpy(t.name_c, r->hello.name, XW_NAME_LEN);
    memcpy(t.name_l, r->ack.name, XW_NAME_LEN);
    memcpy(t.host_c, r->hello.host, XW_HOST_LEN);
    memcpy(t.host_l, r->ack.host, XW_HOST_LEN);
    t.g_c = r->hello.g;
    t.g_l = r->ack.g;
    return t;
}

void raw_open(raw *r, const uint8_t *blob, size_t len, const char *token)
{
    raw_open_v(r, blob, len, token, XW_VERSION);
}

void raw_close(raw *r)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *q = ucp_ep_close_nbx(r->ep, &prm);
    if (q && UCS_PTR_IS_PTR(q)) {
        while (ucp_request_check_status(q) == UCS_INPROGRESS) ucp_worker_progress(r->w);
        ucp_request_free(q);
    }
    ucp_worker_release_address(r->w, r->addr);
    ucp_worker_destroy(r->w);
    ucp_cleanup(r->ctx);
    for (int i = 0; i < r->nkeep; i++) free(r->keep[i]);
    r->nkeep = 0;
}

/* A DATA frame: header with n pages, data of dlen bytes (the frame's content is 0x5A). */
void raw_data(raw *r, uint64_t session, uint64_t req, int32_t first, int32_t nl, const int32_t *pages,
                     int32_t n, size_t hlen_cut, size_t dlen, uint64_t chunk, uint32_t flags)
{
    size_t hlen = sizeof(xw_data) + (size_t)n * 4;
    uint8_t *hdr = calloc(1, hlen + 16);
    uint8_t *data = malloc(dlen ? dlen : 1);
    assert_non_null(hdr);
    assert_non_null(data);
    memset(data, 0x5A, dlen);
    xw_data h = {.c = {XW_MAGIC, XW_VERSION, XW_DATA, session}, .request_id = req, .xfer_id = 9, .frame = 0,
                 .first_layer = first, .num_layers = nl, .n_pages = n, .chunk_bytes = chunk};
    memcpy(hdr, &h, sizeof h);
    memcpy(hdr + sizeof h, pages, (size_t)n * 4);
    raw_send(r, hdr, hlen_cut ? hlen_cut : hlen, data, dlen, flags);
    if (r->nkeep + 2 <= (int)(sizeof r->keep / sizeof r->keep[0])) {
        r->keep[r->nkeep++] = hdr;
        r->keep[r->nkeep++] = data;
    } else {
        fail_msg("%s", "raw_data: more frames than the peer keeps");
    }
}

/* A CPU server (the decode side) and its address blob; returns the blob's length. */
size_t cpu_server(server *s, uint32_t timeout_ms, uint8_t *blob, size_t cap)
{
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    server_start(s, cpu, timeout_ms);
    return server_blob(s, blob, cap);
}

/* A child forked while the server's copy workers (or the sender's) hold a frame of x waits for x on its own: it
 * must fail at once naming the fork (an alarm ends a child that hangs) and, with cm, leave every page of cm free
 * in its copy of it. With drop, the child first disconnects that peer (its held copies are forgotten without the
 * workers' lock, which a worker may have held when the process forked): x then fails as disconnected or forked.
 * The server's lock is held across the fork: its agent is not in use when the child takes it. */
void fork_fails_held(server *s, kvhal_xfer *x, kvhal_cache_manager *cm, kvhal_xfer_peer *drop,
                            const char *what)
{
    pthread_mutex_lock(&s->mu);
    const pid_t child = fork();
    if (child == 0) {
        alarm(20);
        if (drop && kvhal_xfer_disconnect(drop) != KVHAL_OK) _exit(5);
        const kvhal_status st = kvhal_xfer_wait(x, 3000);
        int bad = st == KVHAL_OK || st == KVHAL_BUSY ? 1 : !drop && !strstr(kvhal_last_error(), "forked") ? 2 : 0;
        if (!bad && cm && (kvhal_cache_manager_num_free(cm) != PAGES || kvhal_cache_manager_check_integrity(cm)))
            bad = 3;
        if (bad) fprintf(stderr, "child: %s (%s)\n", kvhal_status_name(st), kvhal_last_error());
        if (!bad && kvhal_xfer_release(x) != KVHAL_OK) bad = 4;
        _exit(bad);
    }
    pthread_mutex_unlock(&s->mu);
    assert_true(child > 0);
    int wst = 0;
    assert_int_equal(waitpid(child, &wst, 0), child);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst))
        fail_msg("%s: the child %s %d", what, WIFEXITED(wst) ? "exited" : "was killed by signal",
                 WIFEXITED(wst) ? WEXITSTATUS(wst) : WTERMSIG(wst));
}

int main(int argc, char **argv)
{
    const char *t = getenv("TRANSFER_TLS");
    if (t && *t) tls = t;
    if (argc > 0 && argv[0] && argv[0][0]) self_path = argv[0];
    if (argc > 1 && strcmp(argv[1], "--ipc-sender") == 0) return ipc_sender_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--listener-fds") == 0) return listener_fds_main(argc, argv);
    printf("# transports: %s\n", tls);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transfer_every_device),
        cmocka_unit_test(test_wrong_token_and_geometry),
        cmocka_unit_test(test_hostile_frames),
        cmocka_unit_test(test_wire_version),
        cmocka_unit_test(test_cancel_and_duplicates),
        cmocka_unit_test(test_stalled_peer),
        cmocka_unit_test(test_peer_killed_mid_transfer),
        cmocka_unit_test(test_many_peers),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_destroy_in_flight),
        cmocka_unit_test(test_silent_agent_and_destroy_with_grants),
        cmocka_unit_test(test_ipc_two_processes),
        cmocka_unit_test(test_hostile_ipc),
        cmocka_unit_test(test_ipc_chain),
        cmocka_unit_test(test_ipc_bystander),
        cmocka_unit_test(test_dropped_peers_close_endpoints),
        cmocka_unit_test(test_cma_copies_in_flight),
        cmocka_unit_test(test_gathers_in_flight),
        cmocka_unit_test(test_recv_staging_in_flight),
        cmocka_unit_test(test_worker_copy_fails),
        cmocka_unit_test(test_worker_threads_refused),
        cmocka_unit_test(test_fork_with_frames_held),
        cmocka_unit_test(test_offers),
        cmocka_unit_test(test_stream_two_processes),
        cmocka_unit_test(test_stream_peer_killed),
        cmocka_unit_test(test_stream_slow_receiver),
        cmocka_unit_test(test_impostor_listener),
        cmocka_unit_test(test_replayed_hello),
        cmocka_unit_test(test_cma_bystander),
        cmocka_unit_test(test_grant_flood),
        cmocka_unit_test(test_double_destroy),
        cmocka_unit_test(test_peer_reason_printable),
        cmocka_unit_test(test_listener_after_fd_exhaustion),
        cmocka_unit_test(test_net_devices),
    };
    const char *only = getenv("XFER_TESTS"); /* a cmocka name pattern ("test_offers"), to run those alone */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

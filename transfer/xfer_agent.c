/* xfer_agent.c — the transfer agent (include/kvhal/kvhal_xfer.h): one UCX context and worker per agent, active
 * messages for everything (xfer_wire.h), so that the receiver itself writes every byte into its pages after checking
 * the frame against its own grant. This room, the top one (xfer_rooms.h), holds the agent's life (create, register
 * the cache, destroy), its progress loop (pump, kvhal_xfer_progress and the waits), connect's wait for the answer
 * and disconnect, and the dispatch of incoming frames to the rooms that handle them; how pages move is the data
 * paths' (xfer_types.h, struct xfer_path). */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "xfer_internal.h"
#include "xfer_rooms.h"

const xfer_path *const xfer_paths[XFER_PATHS] = {&xfer_path_host, &xfer_path_staged, &xfer_path_ipc, &xfer_path_cma};

static ucs_status_t am_handler(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param);
static void peer_ipc_free(kvhal_xfer_peer *p);

/* Whether a UCX_TLS-style list lets UCX use CMA (cma, or shm / sm / all, which include it; NULL: UCX's choice):
 * then on one host the peer may read our host cache itself with process_vm_readv (offer_ipc), which is what UCX's
 * CMA transport does, for scattered pages too. "^list" excludes. */
static bool transports_name(const char *t, const char *want)
{
    if (!t) return true;
    const bool exclude = t[0] == '^';
    bool named = false;
    for (const char *q = t + exclude; *q;) {
        const size_t n = strcspn(q, ",");
        if ((n == strlen(want) && !strncmp(q, want, n)) || (n == 3 && !strncmp(q, "all", 3))) named = true;
        q += n + (q[n] == ',');
    }
    return exclude ? !named : named;
}

static bool transports_allow_cma(const char *t)
{
    if (t && t[0] == '^') return transports_name(t, "cma") && transports_name(t, "shm") && transports_name(t, "sm");
    return transports_name(t, "cma") || transports_name(t, "shm") || transports_name(t, "sm");
}

/* An environment variable holding a whole number in [lo, hi]; else def (a value that is not one is ignored). */
static long env_long(const char *name, long lo, long hi, long def)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    errno = 0;
    const long n = strtol(v, &end, 10);
    if (errno || !end || *end || n < lo || n > hi) return def;
    return n;
}

static void stream_free(void *s) { kvhal_stream_destroy(s); }

/* The process's listening TCP sockets (up to cap of them): out gets their fds; returns how many. */
static int listening_tcp(int *out, int cap)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && n < cap;) {
        char *end;
        const long fd = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || fd == dirfd(d)) continue;
        int v = 0, proto = 0;
        socklen_t l = sizeof v, lp = sizeof proto;
        if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) == 0 && v &&
            getsockopt((int)fd, SOL_SOCKET, SO_PROTOCOL, &proto, &lp) == 0 && proto == IPPROTO_TCP)
            out[n++] = (int)fd;
    }
    closedir(d);
    return n;
}

/* The listening sockets the worker's creation added (those listening before it are another's). */
static void listen_watch_init(kvhal_xfer_agent *a, const int *before, int nb)
{
    int now[64];
    const int n = listening_tcp(now, 64);
    for (int i = 0; i < n && a->n_listen_fds < (int)(sizeof a->listen_fds / sizeof a->listen_fds[0]); i++) {
        bool old = false;
        for (int j = 0; j < nb; j++) old |= before[j] == now[i];
        struct stat sb;
        if (!old && fstat(now[i], &sb) == 0) {
            a->listen_ino[a->n_listen_fds] = (uint64_t)sb.st_ino;
            a->listen_fds[a->n_listen_fds++] = now[i];
        }
    }
}

/* UCX accepts connections as they come (its progress, which pump runs). UCX 1.13 closes its listening socket for
 * good when accept fails with EMFILE; a socket that is gone (or no longer listens), or a connection that waits in
 * its queue for the whole timeout across pumps (UCX no longer accepting there), is LISTENER_LOST, once. Looked at
 * four times a timeout. */
static void listen_watch(kvhal_xfer_agent *a, uint64_t now)
{
    if (!a->n_listen_fds || a->listener_lost || now < a->listen_check_ns) return;
    a->listen_check_ns = now + (uint64_t)a->timeout_ms * 250000ull;
    uint32_t waiting = 0;
    bool gone = false;
    for (int i = 0; i < a->n_listen_fds; i++) {
        struct tcp_info ti;
        struct stat sb;
        socklen_t l = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (fstat(a->listen_fds[i], &sb) != 0 || (uint64_t)sb.st_ino != a->listen_ino[i] ||
            getsockopt(a->listen_fds[i], IPPROTO_TCP, TCP_INFO, &ti, &l) != 0 || ti.tcpi_state != 10 /* LISTEN */)
            gone = true;
        else waiting += ti.tcpi_unacked; /* a listening socket's accept queue */
    }
    if (gone) {
        a->listener_lost = true;
        push_event(a, KVHAL_XFER_EVENT_LISTENER_LOST, NULL, NULL, 0, KVHAL_BACKEND_ERROR, NULL, 0,
                   "agent %s: UCX closed its listening socket (the process ran out of file descriptors? raise "
                   "RLIMIT_NOFILE); existing peers go on, new ones cannot connect", a->name);
        return;
    }
    if (!waiting) {
        a->listen_stuck_ns = 0;
        return;
    }
    if (!a->listen_stuck_ns) {
        a->listen_stuck_ns = now;
        return;
    }
    if (now - a->listen_stuck_ns < (uint64_t)a->timeout_ms * 1000000ull) return;
    a->listener_lost = true;
    push_event(a, KVHAL_XFER_EVENT_LISTENER_LOST, NULL, NULL, 0, KVHAL_BACKEND_ERROR, NULL, 0,
               "agent %s: UCX no longer accepts connections (%u waiting unaccepted for %u ms: the process ran out of "
               "file descriptors? raise RLIMIT_NOFILE); existing peers go on, new ones cannot connect",
               a->name, (unsigned)waiting, (unsigned)a->timeout_ms);
}

/* The copy workers: KVHAL_XFER_THREADS (0 .. XFER_WORKERS_MAX; 0: pump copies each frame itself), else
 * min(4, online cores / 2), each with a stream of its own for a device cache's staging copies. CMA frames are split
 * across them in pieces of CMA_PIECE_BYTES at least; TCP frames carry GATHER_FRAME_BYTES (KVHAL_XFER_FRAME_KIB) at most (one page at
 * least), and those of half that and more (a frame is cut to whole pages, so a full one may fall short of the cut
 * itself) of a transfer of several frames are gathered by the workers while pump sends the frames before them (a
 * transfer of one frame, or a small frame, is gathered by pump: there is nothing to overlap, and the hand-over
 * measured slower at 256 KiB-1 MiB). */
static void agent_config(kvhal_xfer_agent *a)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    const long def = cores / 2 < WORKERS_DEFAULT ? cores / 2 : WORKERS_DEFAULT;
    xfer_pool_init(&a->workers, (int)env_long("KVHAL_XFER_THREADS", 0, XFER_WORKERS_MAX, def), stream_free);
    a->cma_piece = CMA_PIECE_BYTES;
    a->gather_frame = (size_t)env_long("KVHAL_XFER_FRAME_KIB", 64, 64 << 10, GATHER_FRAME_BYTES >> 10) << 10;
    a->gather_min = a->gather_frame / 2;
    a->ipc_chain = IPC_CHAIN_BYTES;
}

kvhal_status kvhal_xfer_agent_create(const kvhal_xfer_config *cfg, kvhal_xfer_agent **out)
{
    return kvhal_xfer_agent_create_on(cfg, NULL, out);
}

kvhal_status kvhal_xfer_agent_create_on(const kvhal_xfer_config *cfg, const char *net_devices, kvhal_xfer_agent **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    CHECK_ARG(cfg, "cfg: NULL");
    CHECK_ARG(cfg->token && cfg->token[0], "cfg.token: NULL or empty (a peer must present a token)");
    CHECK_ARG(strlen(cfg->token) <= KVHAL_XFER_TOKEN_MAX, "cfg.token: %zu characters, at most %d",
              strlen(cfg->token), KVHAL_XFER_TOKEN_MAX);
    CHECK_ARG(!cfg->name || strlen(cfg->name) <= KVHAL_XFER_NAME_MAX, "cfg.name: longer than %d characters",
              KVHAL_XFER_NAME_MAX);
    CHECK_ARG(cfg->max_peers >= 0 && cfg->max_peers <= 65536, "cfg.max_peers: %d is outside [0, 65536]",
              (int)cfg->max_peers);
    kvhal_xfer_agent *a = calloc(1, sizeof *a);
    if (!a) return ERR(KVHAL_OUT_OF_MEMORY, "transfer agent: cannot allocate it");
    copy_name(a->name, sizeof a->name, cfg->name ? cfg->name : "kvhal");
    memcpy(a->token, cfg->token, strlen(cfg->token));
    a->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 10000;
    a->max_peers = cfg->max_peers ? cfg->max_peers : 64;
    a->pid = getpid();
    a->next_xfer_id = random_session() & 0xffffffffull;
    host_identity(a->host_id, sizeof a->host_id);
    /* shared memory alone (shm, sm, posix, sysv, cma, self): no peer-failure handling in UCX 1.13 (see ep_create) */
    if (cfg->transports && !strstr(cfg->transports, "tcp") && !strstr(cfg->transports, "all") &&
        !strstr(cfg->transports, "ib") && !strstr(cfg->transports, "rc") && !strstr(cfg->transports, "ud") &&
        !strstr(cfg->transports, "dc") && !strstr(cfg->transports, "cuda") && !strstr(cfg->transports, "rocm"))
        a->no_peer_errors = true;

    a->cma_ok = transports_allow_cma(cfg->transports);
    a->cma_sock = -1;
    for (int i = 0; i < CMA_CONNS_MAX; i++) a->cma_conns[i] = -1;
    agent_config(a);

    ucp_config_t *uc = NULL;
    ucs_status_t us = ucp_config_read(NULL, NULL, &uc);
    if (us == UCS_OK && cfg->transports) us = ucp_config_modify(uc, "TLS", cfg->transports);
    /* where the agent listens (and connects from): the network devices named, else UCX_NET_DEVICES, else loopback */
    const char *devs = net_devices ? net_devices : getenv("UCX_NET_DEVICES") ? NULL : "lo";
    if (us == UCS_OK && devs) {
        us = ucp_config_modify(uc, "NET_DEVICES", devs);
        if (us != UCS_OK) {
            if (uc) ucp_config_release(uc);
            free(a);
            return ERR(KVHAL_INVALID_ARGUMENT, "net_devices: UCX refused \"%s\": %s", devs, ucs_status_string(us));
        }
    }
    /* TCP: 256 KiB receive segments instead of UCX 1.13's 64 KiB, unless the environment sets them: a rendezvous
     * frame then goes in 256 KiB zero-copy fragments (a quarter of the sendmsg calls, of the receiver's handler
     * rounds); measured with UCX_TCP_RX_SEG_SIZE=256k on the 16-core host: 0.64-0.74 -> 0.69-0.87 of
     * ucx_perftest -e. Only where TCP may be used (else UCX warns of an unused key). */
    if (us == UCS_OK && transports_name(cfg->transports, "tcp")) {
        const char *env = getenv("UCX_TCP_RX_SEG_SIZE");
        if (env) copy_name(a->tcp_seg, sizeof a->tcp_seg, env);
        else if (ucp_config_modify(uc, "RX_SEG_SIZE", "256k") == UCS_OK) copy_name(a->tcp_seg, sizeof a->tcp_seg, "256k");
        else copy_name(a->tcp_seg, sizeof a->tcp_seg, "64k"); /* UCX 1.13's default */
    }
    if (us != UCS_OK) {
        if (uc) ucp_config_release(uc);
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "cfg.transports: UCX refused \"%s\": %s",
                   cfg->transports ? cfg->transports : "(default)", ucs_status_string(us));
    }
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                       .features = UCP_FEATURE_AM, .name = "kvhal-xfer"};
    us = ucp_init(&pp, uc, &a->ctx);
    ucp_config_release(uc);
    if (us != UCS_OK) {
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "transfer agent: UCX could not start (transports %s): %s",
                   cfg->transports ? cfg->transports : "default", ucs_status_string(us));
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    int before[64];
    const int nb = listening_tcp(before, 64);
    us = ucp_worker_create(a->ctx, &wp, &a->worker);
    if (us == UCS_OK) listen_watch_init(a, before, nb);
    if (us == UCS_OK) us = ucp_worker_get_address(a->worker, &a->addr, &a->addr_len);
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    if (us == UCS_OK) us = ucp_worker_query(a->worker, &wa);
    if (us == UCS_OK) {
        a->max_am_header = wa.max_am_header;
        ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                                                   UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                     .id = XW_AM_ID, .cb = am_handler, .arg = a};
        us = ucp_worker_set_am_recv_handler(a->worker, &hp);
    }
    if (us != UCS_OK) {
        if (a->addr) ucp_worker_release_address(a->worker, a->addr);
        if (a->worker) ucp_worker_destroy(a->worker);
        ucp_cleanup(a->ctx);
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "transfer agent: UCX worker: %s", ucs_status_string(us));
    }
    if (a->addr_len > XW_MAX_ADDR) {
        const size_t alen = a->addr_len;
        ucp_worker_release_address(a->worker, a->addr);
        ucp_worker_destroy(a->worker);
        ucp_cleanup(a->ctx);
        free(a);
        return ERR(KVHAL_BACKEND_ERROR, "transfer agent: UCX worker address of %zu bytes is too large", alen);
    }
    a->magic = AGENT_MAGIC;
    if (!kvhal__handle_add(a)) {
        ucp_worker_release_address(a->worker, a->addr);
        ucp_worker_destroy(a->worker);
        ucp_cleanup(a->ctx);
        free(a);
        return ERR(KVHAL_OUT_OF_MEMORY, "transfer agent: cannot record it");
    }
    *out = a;
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_agent_destroy(kvhal_xfer_agent *a)
{
    if (!a) return KVHAL_OK;
    /* out of the live set first: a second destroy, or a call after this one, is refused before a is read */
    if (!kvhal__handle_remove_kind(a, AGENT_MAGIC))
        return ERR(KVHAL_INVALID_HANDLE, "agent: %p is not a live transfer agent", (void *)a);
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state != P_FAILED) peer_fail(p, KVHAL_CANCELED, true, "the agent was destroyed");
    /* let UCX finish or cancel what it holds (bounded: force-closed endpoints complete their requests) */
    const uint64_t until = now_ns() + 2000000000ull;
    pump(a); /* the BYEs */
    while ((a->rframes || a->closing || a->msgs || a->sent || a->ipc_running || xfer_pool_out(&a->workers)) &&
           now_ns() < until)
        pump(a);
    /* copies still writing our pages (or bounce buffers: nothing is posted, the peers failed) wait here, before the
     * transfers go */
    for (int k = 0; k < XFER_PATHS; k++)
        if (xfer_paths[k]->drain) xfer_paths[k]->drain(a);
    xfer_pool_stop(&a->workers);
    for (kvhal_xfer *x = a->xfers, *nx; x; x = nx) { /* whatever is left: UCX is going away, give pages back */
        nx = x->next;
        if (!x->finished) {
            x->inflight = 0;
            x->sends_inflight = 0;
            if (!x->failing) xfer_finish(x, KVHAL_CANCELED, "the agent was destroyed");
            else xfer_settle(x);
        }
    }
    while (a->xfers) xfer_free(a->xfers);
    while (a->rframes) {
        recv_frame *f = a->rframes;
        a->rframes = f->next;
        recv_frame_free(a, f);
    }
    while (a->hellos) {
        pending_hello *ph = a->hellos;
        a->hellos = ph->next;
        free(ph->addr);
        free(ph);
    }
    /* frames never sent or never completed (a peer that stopped progressing): UCX drops their requests with the
     * worker below; their buffers go after it */
    pending_msg *left = a->msgs;
    a->msgs = a->msgs_tail = NULL;
    for (pending_msg *m = a->sent, *nx; m; m = nx) {
        nx = m->next;
        m->next = left;
        left = m;
    }
    a->sent = NULL;
    while (a->closing) {
        closing_ep *c = a->closing;
        a->closing = c->next;
        ucp_request_cancel(a->worker, c->req);
        ucp_request_free(c->req);
        free(c);
    }
    /* started by the pumps above; none is left unless UCX delivered one since */
    for (ipc_job *j = a->ipc_jobs, *nx; j; j = nx) {
        nx = j->next;
        ipc_job_free(j);
    }
    for (ipc_job *j = a->cma_jobs, *nx; j; j = nx) {
        nx = j->next;
        ipc_job_free(j);
    }
    a->ipc_jobs = a->ipc_jobs_tail = a->cma_jobs = a->cma_jobs_tail = NULL;
    while (a->peers) {
        kvhal_xfer_peer *p = a->peers;
        a->peers = p->next;
        peer_ipc_free(p);
        kvhal__handle_remove_kind(p, PEER_MAGIC);
        p->magic = DEAD_MAGIC;
        free(p);
    }
    for (size_t i = 0; i < a->ev_count; i++) free(a->events[(a->ev_head + i) % a->ev_cap].pages_owned);
    free(a->events);
    free(a->last_pages);
    if (a->memh) ucp_mem_unmap(a->ctx, a->memh);
    for (int k = 0; k < IPC_STREAMS; k++) {
        kvhal_stream_destroy(a->ipc_streams[k]);
        kvhal_event_destroy(a->ipc_events[k]);
    }
    free(a->ipc_ranges);
    free(a->k_off);
    free(a->v_off);
    ucp_worker_release_address(a->worker, a->addr);
    ucp_worker_destroy(a->worker);
    ucp_cleanup(a->ctx);
    while (left) {
        pending_msg *m = left;
        left = m->next;
        free(m->buf);
        free(m->data_owned);
        free(m);
    }
    bounce_pool_free(a);
    stage_pool_free(a);
    cma_sock_close(a);
    explicit_bzero(a->token, sizeof a->token);
    a->magic = DEAD_MAGIC;
    free(a);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_register_paged_cache(kvhal_xfer_agent *a, kvhal_paged_cache *cache)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(cache, "cache: NULL");
    CHECK_ARG(!a->cache, "cache: agent %s already has a paged cache registered (one per agent)", a->name);
    kvhal_tensor k0, v0;
    st = kvhal_paged_cache_layer(cache, 0, &k0, &v0);
    if (st != KVHAL_OK) return st;
    xw_geometry g = {0};
    g.num_blocks = k0.shape[0];
    g.block_size = (int32_t)k0.shape[1];
    g.num_heads = (int32_t)k0.shape[2];
    g.head_dim = (int32_t)k0.shape[3];
    g.dtype = (int32_t)k0.dtype;
    g.layout = k0.strides[1] == k0.shape[2] * k0.shape[3] ? KVHAL_LAYOUT_NHD : KVHAL_LAYOUT_HND;
    const size_t es = kvhal_dtype_size(k0.dtype);
    g.chunk_bytes = (uint64_t)k0.shape[1] * (uint64_t)k0.shape[2] * (uint64_t)k0.shape[3] * es;
    int32_t L = 0;
    kvhal_tensor kt, vt;
    while (kvhal_paged_cache_layer(cache, L, &kt, &vt) == KVHAL_OK) L++;
    kvhal_clear_error();
    g.num_layers = L;
    size_t *ko = malloc((size_t)L * sizeof *ko), *vo = malloc((size_t)L * sizeof *vo);
    if (!ko || !vo) {
        free(ko);
        free(vo);
        return ERR(KVHAL_OUT_OF_MEMORY, "cache: cannot allocate %d layer offsets", (int)L);
    }
    for (int32_t l = 0; l < L; l++) {
        kvhal_paged_cache_layer(cache, l, &kt, &vt);
        ko[l] = kt.offset;
        vo[l] = vt.offset;
    }
    kvhal_buffer *buf = k0.buffer;
    const kvhal_device dev = kvhal_buffer_device(buf);
    const bool host = dev.type == KVHAL_DEVICE_CPU;
    if (host) {
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = kvhal_buffer_native(buf), .length = kvhal_buffer_size(buf)};
        ucs_status_t us = ucp_mem_map(a->ctx, &mp, &a->memh);
        if (us != UCS_OK) {
            free(ko);
            free(vo);
            a->memh = NULL;
            return ERR(KVHAL_BACKEND_ERROR, "cache: UCX could not register its %zu bytes: %s",
                       kvhal_buffer_size(buf), ucs_status_string(us));
        }
        a->host_base = kvhal_buffer_native(buf);
    }
    a->cache = cache;
    a->cache_buf = buf;
    a->host = host;
    a->data_path = host ? &xfer_path_host : &xfer_path_staged;
    a->g = g;
    a->k_off = ko;
    a->v_off = vo;
    a->block_stride = (size_t)k0.strides[0] * es;

    /* a shareable cache: its handle for peers on this host (the IPC path), and a stream for our copies from theirs;
     * offered only with a proof area, the buffer's tail past every page (kvhal_paged_cache_create_shareable's) */
    if (kvhal_buffer_is_shareable(buf) &&
        kvhal_buffer_ipc_export(buf, a->ipc_blob, sizeof a->ipc_blob, &a->ipc_blob_len) != KVHAL_OK)
        a->ipc_blob_len = 0;
    kvhal_clear_error();
    uint64_t extent = 0;
    for (int32_t l = 0; l < L; l++) {
        const uint64_t last = (uint64_t)(g.num_blocks - 1) * a->block_stride + g.chunk_bytes;
        if (ko[l] + last > extent) extent = ko[l] + last;
        if (vo[l] + last > extent) extent = vo[l] + last;
    }
    extent = (extent + XW_IPC_SLOT - 1) / XW_IPC_SLOT * XW_IPC_SLOT;
    const uint64_t bsize = kvhal_buffer_size(buf);
    a->proof_off = extent;
    a->proof_slots = 0;
    if (bsize > extent) {
        const uint64_t n = (bsize - extent) / XW_IPC_SLOT;
        a->proof_slots = n > PROOF_SLOTS_MAX ? PROOF_SLOTS_MAX : (int)n;
    }
    if (!a->proof_slots) a->ipc_blob_len = 0; /* no proof area: no handle offered (CMA or UCX instead) */
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_local_address(kvhal_xfer_agent *a, void *blob, size_t cap, size_t *len)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(len, "len: NULL");
    *len = sizeof(xw_blob) + a->addr_len;
    if (cap < *len)
        return ERR(KVHAL_OUT_OF_RANGE, "cap: %zu bytes, the address blob needs %zu", cap, *len);
    CHECK_ARG(blob, "blob: NULL");
    xw_blob b;
    memset(&b, 0, sizeof b);
    b.magic = XW_BLOB_MAGIC;
    b.version = XW_VERSION;
    b.addr_len = (uint32_t)a->addr_len;
    copy_name(b.name, sizeof b.name, a->name);
    memcpy(blob, &b, sizeof b);
    memcpy((uint8_t *)blob + sizeof b, a->addr, a->addr_len);
    return KVHAL_OK;
}

static ucs_status_t am_handler(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    kvhal_xfer_agent *a = arg;
    const bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    xw_common c;
    if (header_length < sizeof c) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK; /* nobody to blame: dropped */
    memcpy(&c, header, sizeof c);
    if (c.magic != XW_MAGIC) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    if (c.version != XW_VERSION) { /* a connection attempt or its answer gets a clear error; the rest is dropped */
        if (c.type == XW_HELLO && !rndv && length > 0 && length <= XW_MAX_ADDR &&
            header_length >= offsetof(xw_hello, name)) {
            /* the common header and src_session sit at the same offsets in every version; the rest may not */
            queue_hello(a, header, offsetof(xw_hello, name), data, length, c.version ? c.version : UINT16_MAX);
        } else if (c.type == XW_HELLO && !rndv) {
            push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                       "malformed HELLO of wire version %u (this agent speaks %u)", (unsigned)c.version,
                       (unsigned)XW_VERSION);
        } else if (c.type == XW_HELLO_ACK && !rndv) {
            on_hello_ack(a, header, header_length, c.dest_session, c.version);
        }
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (c.type == XW_HELLO) {
        xw_hello h;
        if (header_length != sizeof h || rndv) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
        memcpy(&h, header, sizeof h);
        if (h.addr_len == 0 || h.addr_len > XW_MAX_ADDR || h.addr_len != length) {
            push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                       "malformed HELLO: address of %u bytes with %zu data bytes", (unsigned)h.addr_len, length);
            return UCS_OK;
        }
        queue_hello(a, &h, sizeof h, data, length, 0);
        return UCS_OK;
    }
    if (c.type == XW_HELLO_ACK) {
        if (!rndv) on_hello_ack(a, header, header_length, c.dest_session, c.version);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    kvhal_xfer_peer *p = find_session(a, c.dest_session);
    if (p && p->state == P_AUTH) { /* a handshake waiting for the connector's proof: AUTH, or BYE, nothing else */
        if (c.type == XW_AUTH && !rndv) on_auth(a, p, header, header_length);
        else if (c.type == XW_BYE) auth_refuse(p, "the connector gave up: this agent's proof did not check there "
                                                  "(another token)");
        else auth_refuse(p, "frame of type %u before its proof of the token", (unsigned)c.type);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (p && p->state == P_CONNECTING && p->auth_sent && c.type == XW_AUTH_OK && !rndv) {
        on_auth_ok(a, p, header_length);
        return UCS_OK;
    }
    if (p && p->state == P_CONNECTING && c.type == XW_BYE) { /* the listener refused our proof */
        peer_fail(p, KVHAL_PEER_FAILED, false, "closed the connection during the handshake");
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (!p || p->state != P_CONNECTED) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK; /* unknown session: dropped */
    switch (c.type) {
    case XW_DATA: { /* an eager frame's handler must return OK: UCX takes an error only for rendezvous */
        ucs_status_t r = on_data(a, p, header, header_length, data, length, rndv);
        return rndv ? r : UCS_OK;
    }
    case XW_GRANT: on_grant(a, p, header, header_length, data, length, rndv); break;
    case XW_ACK:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "ACK frame with rendezvous data");
        else on_ack(a, p, header, header_length);
        break;
    case XW_BYE: peer_fail(p, KVHAL_PEER_FAILED, false, "closed the connection"); break;
    case XW_IPC_MAP: /* kept for pump, which imports it */
        if (rndv || header_length != sizeof(xw_ipc_map) || length > XW_IPC_BLOB_MAX + 2u * 65536u * 8u ||
            p->map_frame || p->rx_path || p->cma_challenged || p->ipc_claim) {
            peer_fail(p, KVHAL_PEER_FAILED, true, "malformed or repeated IPC_MAP frame");
        } else if ((p->map_frame = malloc(header_length + length)) != NULL) {
            memcpy(p->map_frame, header, header_length);
            if (length) memcpy((uint8_t *)p->map_frame + header_length, data, length);
            p->map_len = header_length + length;
        }
        break;
    case XW_IPC_MAP_ACK:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "IPC_MAP_ACK frame with rendezvous data");
        else on_ipc_map_ack(p, header, header_length);
        break;
    case XW_DATA_IPC: on_data_ipc(a, p, header, header_length, data, length, rndv); break;
    case XW_OFFER: on_offer(a, p, header, header_length, data, length, rndv); break;
    case XW_WITHDRAW: on_withdraw(a, p, header, header_length); break;
    case XW_AUTH:    /* a replayed or late AUTH to a connection already authenticated: nothing to do */
    case XW_AUTH_OK: break;
    case XW_CMA_CHALLENGE:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "CMA_CHALLENGE frame with rendezvous data");
        else on_cma_challenge(a, p, header, header_length);
        break;
    case XW_IPC_CHALLENGE:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "IPC_CHALLENGE frame with rendezvous data");
        else on_ipc_challenge(p, header, header_length);
        break;
    case XW_IPC_PROOF:
        if (rndv) peer_fail(p, KVHAL_PEER_FAILED, true, "IPC_PROOF frame with rendezvous data");
        else on_ipc_proof(p, header, header_length);
        break;
    default: peer_fail(p, KVHAL_PEER_FAILED, true, "unknown frame type %u", (unsigned)c.type); break;
    }
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
}

/* Returns how much UCX progressed (0: nothing moved; the caller may back off). */
unsigned pump(kvhal_xfer_agent *a)
{
    unsigned work = 0;
    for (int i = 0; i < 64; i++) {
        const unsigned n = ucp_worker_progress(a->worker);
        if (!n) break;
        work += n;
    }
    const uint64_t t_map = now_ns();
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next) {
        if (p->map_frame && p->state == P_CONNECTED) process_ipc_map(a, p);
        if (p->ipc_claim) ipc_proof_check(a, p, t_map);
        if (p->ipc_chal_pending) ipc_answer(a, p);
    }
    if (a->cma_sock >= 0) {
        cma_sock_poll(a);
        const uint64_t t = now_ns();
        for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
            if (p->cma_claim) cma_claim_check(a, p, t);
    }
    /* copies completed, and copies still with the workers or on the device, count as work: the loops do not nap
     * (20 us, which the kernel's timer slack makes ~70) while frames land, and see a copy's end at once (a device
     * copy's end frees a stream for the frames waiting, and a nap there left the streams idle). What the workers
     * hand back goes first: gathered frames posted (before post_pending), received frames acknowledged. */
    work += xfer_pool_poll(&a->workers, false);
    for (int k = 0; k < XFER_PATHS; k++)
        if (xfer_paths[k]->progress) work += xfer_paths[k]->progress(a);
    work += xfer_pool_out(&a->workers) != 0;
    while (a->hellos) {
        pending_hello *ph = a->hellos;
        a->hellos = ph->next;
        accept_hello(a, ph);
        free(ph->addr);
        free(ph);
    }
    for (recv_frame **pp = &a->rframes; *pp;) {
        recv_frame *f = *pp;
        if (f->done) {
            *pp = f->next;
            recv_frame_done(a, f);
        } else {
            pp = &f->next;
        }
    }
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->ep_error && p->state != P_FAILED) {
            peer_fail(p, KVHAL_PEER_FAILED, false, "unreachable: %s", ucs_status_string(p->ep_status));
        }
    flush_msgs(a);
    work += streams_progress(a);
    post_pending(a);
    const uint64_t now = now_ns();
    listen_watch(a, now);
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state == P_CONNECTED && p->offers) offers_expire(a, p, now);
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state == P_AUTH && now > p->deadline_ns)
            auth_refuse(p, "no proof of the token within %u ms (a replayed HELLO, a connector with another token, "
                        "or one that died)", (unsigned)a->timeout_ms);
reap: /* handshakes that failed: the application never saw them */
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->reap && p->state == P_FAILED) {
            kvhal_xfer_disconnect(p);
            goto reap;
        }
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state == P_CONNECTING && now > p->deadline_ns)
            peer_fail(p, KVHAL_TIMEOUT, false,
                      "no answer to the connection within %u ms (unreachable, or the receiver refused it without an "
                      "answer: a wrong token or another wire version; its PEER_REJECTED event says which)",
                      (unsigned)a->timeout_ms);
again: /* failing one transfer may free others (released ones of the same peer): start over after each */
    for (kvhal_xfer *x = a->xfers; x; x = x->next) {
        if (x->offer && x->withdrawn && x->failing && !x->finished && !x->abandoned && now > x->deadline_ns) {
            x->abandoned = true; /* withdrawn, and the peer did not answer every frame: settled regardless */
            snprintf(x->message + strlen(x->message), sizeof x->message - strlen(x->message),
                     " (peer %s did not confirm the withdrawal within %u ms)", x->peer ? x->peer->name : "?",
                     (unsigned)a->timeout_ms);
            xfer_settle(x); /* may free x */
            goto again;
        }
        if (x->failing || x->finished || now <= x->deadline_ns) continue;
        if (x->offer) { /* not taken, or taken and not acknowledged, within the timeout: withdrawn, the peer stays */
            xfer_finish(x, KVHAL_TIMEOUT, "request %llu: peer %s did not take the offer within %u ms",
                        (unsigned long long)x->request_id, x->peer ? x->peer->name : "?", (unsigned)a->timeout_ms);
            goto again;
        }
        if (x->is_recv && x->inflight == 0) {
            xfer_finish(x, KVHAL_TIMEOUT, "request %llu: no data from peer %s within %u ms",
                        (unsigned long long)x->request_id, x->peer ? x->peer->name : "?", (unsigned)a->timeout_ms);
            goto again;
        }
        if (x->peer) { /* a stalled peer holds our buffers: drop it, which releases them */
            peer_fail(x->peer, KVHAL_TIMEOUT, false, "stalled: request %llu made no progress within %u ms",
                      (unsigned long long)x->request_id, (unsigned)a->timeout_ms);
            goto again;
        }
        x->deadline_ns = UINT64_MAX; /* no peer left to blame: it settles when UCX lets go */
    }
    for (closing_ep **pp = &a->closing; *pp;) {
        closing_ep *c = *pp;
        if (ucp_request_check_status(c->req) != UCS_INPROGRESS) {
            ucp_request_free(c->req);
            *pp = c->next;
            free(c);
        } else {
            pp = &c->next;
        }
    }
    return work;
}

kvhal_status kvhal_xfer_progress(kvhal_xfer_agent *a, uint32_t timeout_ms, kvhal_xfer_event *ev)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(ev, "ev: NULL");
    memset(ev, 0, sizeof *ev);
    free(a->last_pages);
    a->last_pages = NULL;
    const uint64_t until = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    idle_state spins = {0, 0};
    for (;;) {
        /* On a device cache's agent (either side), and wherever device copies run, an event already queued is
         * returned without a pump first: there a pump (a round of UCX and of the copies) may wait for the oldest
         * copy, and a pump per event held 16 and 64 transfers in flight on the IPC path at half their rate
         * (returning queued events at once: 256 KiB batches 0.28 -> 0.62 and 0.43 -> 0.97 of cudaMemcpyPeer, 2 x
         * H200). Returning them at once only while this agent's copies run (the IPC sender has none)
         * measured 0.94 of cudaMemcpyPeer where this rule has 1.09 (256 KiB) and 1.03 (1 MiB) with 64 grants in
         * flight, though 1.03 where this has 0.91 at 4 MiB with 16 (ABBA rounds, 2 x H100). On a host
         * cache's agent a pump per event is cheap and keeps UCX moving: host caches over TCP and shared memory
         * were 4-13% slower by median without it at 256 KiB-1 MiB. */
        const unsigned work = (a->ev_count && ((a->cache_buf && !a->host) || a->ipc_running)) ? 1 : pump(a);
        if (a->ev_count) {
            event_item *it = &a->events[a->ev_head];
            a->ev_head = (a->ev_head + 1) % a->ev_cap;
            a->ev_count--;
            *ev = it->ev;
            if (it->ev.peer) {
                it->ev.peer->ev_queued--;
                it->ev.peer->ev_pages -= it->pages_owned ? it->ev.num_pages : 0;
            }
            ev->pages = it->pages_owned;
            a->last_pages = it->pages_owned;
            return KVHAL_OK;
        }
        if (now_ns() >= until) return KVHAL_OK;
        idle_wait(&spins, work);
    }
}

kvhal_status kvhal_xfer_test(kvhal_xfer *x)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    pump(x->agent);
    if (!x->finished) return KVHAL_BUSY;
    if (x->status != KVHAL_OK) return ERR(x->status, "%s", x->message);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_wait(kvhal_xfer *x, uint32_t timeout_ms)
{
    kvhal_status st = check_xfer(x);
    if (st != KVHAL_OK) return st;
    const uint64_t until = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    idle_state spins = {0, 0};
    for (;;) {
        const unsigned work = pump(x->agent);
        if (x->finished) return x->status == KVHAL_OK ? KVHAL_OK : ERR(x->status, "%s", x->message);
        if (now_ns() >= until)
            return ERR(KVHAL_BUSY, "xfer: request %llu still in flight after %u ms", (unsigned long long)x->request_id,
                       (unsigned)timeout_ms);
        idle_wait(&spins, work);
    }
}

/* internal: the receive side without a connection (xfer_internal.h; fuzz/fuzz_xfer.c)                         */
ucs_status_t kvhal__xfer_recv_frame(kvhal_xfer_agent *a, const void *header, size_t header_length, void *data,
                                    size_t length, bool rndv)
{
    const ucp_am_recv_param_t prm = {.recv_attr = rndv ? UCP_AM_RECV_ATTR_FLAG_RNDV : 0};
    return am_handler(a, header, header_length, data, length, &prm);
}

void kvhal__xfer_tune(kvhal_xfer_agent *a, const kvhal__xfer_tuning *t)
{
    if (check_agent(a) != KVHAL_OK || !t) return;
    if (t->cma_piece) a->cma_piece = t->cma_piece;
    if (t->gather_frame) a->gather_frame = t->gather_frame;
    if (t->gather_min >= 0) a->gather_min = (size_t)t->gather_min;
    if (t->ipc_chain >= 0) a->ipc_chain = (uint64_t)t->ipc_chain;
}

uint64_t kvhal__xfer_id(const kvhal_xfer *x) { return x ? x->xfer_id : 0; }

int kvhal__xfer_listen_ports(const kvhal_xfer_agent *a, uint16_t *ports, int cap)
{
    int n = 0;
    for (int i = 0; check_agent(a) == KVHAL_OK && i < a->n_listen_fds && n < cap; i++) {
        struct sockaddr_storage ss;
        socklen_t l = sizeof ss;
        if (getsockname(a->listen_fds[i], (struct sockaddr *)&ss, &l) != 0) continue;
        if (ss.ss_family == AF_INET) ports[n++] = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6) ports[n++] = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return n;
}

void kvhal__xfer_prove_pending(kvhal_xfer_agent *a)
{
    if (check_agent(a) != KVHAL_OK) return;
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->state == P_AUTH) {
            xw_auth au;
            memset(&au, 0, sizeof au);
            au.c = (xw_common){XW_MAGIC, XW_VERSION, XW_AUTH, p->my_session};
            kvhal__xfer_proof(a->token, &p->tr, XW_LABEL_CONNECTOR, au.proof);
            kvhal__xfer_recv_frame(a, &au, sizeof au, NULL, 0, false);
        }
}

bool kvhal__xfer_ipc_nonce(const kvhal_xfer_agent *a, uint64_t session, uint8_t out[XW_NONCE])
{
    if (check_agent(a) != KVHAL_OK) return false;
    for (const kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->my_session == session && p->ipc_claim && !p->ipc_proof_in) {
            memcpy(out, p->ipc_nonce, XW_NONCE);
            return true;
        }
    return false;
}

size_t kvhal__xfer_agent_held(const kvhal_xfer_agent *a)
{
    size_t n = a->ev_count;
    for (const kvhal_xfer *x = a->xfers; x; x = x->next) n++;
    for (const kvhal_xfer_peer *p = a->peers; p; p = p->next) n++;
    for (const recv_frame *f = a->rframes; f; f = f->next) n++;
    for (const pending_msg *m = a->msgs; m; m = m->next) n++;
    for (const pending_msg *m = a->sent; m; m = m->next) n++;
    for (const pending_hello *h = a->hellos; h; h = h->next) n++;
    for (int k = 0; k < XFER_PATHS; k++)
        if (xfer_paths[k]->held) n += xfer_paths[k]->held(a);
    n += xfer_pool_out(&a->workers); /* gathers and staging copies, CMA frames' pieces */
    for (const closing_ep *c = a->closing; c; c = c->next) n++;
    return n;
}

/* A peer's receive state: its offers, its imported cache and map. */
static void peer_ipc_free(kvhal_xfer_peer *p)
{
    offers_free(p);
    if (p->ipc_buf) kvhal_buffer_destroy(p->ipc_buf);
    p->ipc_buf = NULL;
    if (p->ipc_claim) kvhal_buffer_destroy(p->ipc_claim);
    p->ipc_claim = NULL;
    ipc_slot_release(p);
    p->cma = false;
    p->rx_path = NULL;
    free(p->cma_claim);
    p->cma_claim = NULL;
    free(p->ipc_off);
    p->ipc_off = NULL;
    free(p->map_frame);
    p->map_frame = NULL;
}

kvhal_status kvhal_xfer_disconnect(kvhal_xfer_peer *p)
{
    if (!p) return KVHAL_OK;
    if (!kvhal__handle_live(p, PEER_MAGIC))
        return ERR(KVHAL_INVALID_HANDLE, "peer: %p is not a live transfer peer", (void *)p);
    kvhal_xfer_agent *a = p->agent;
    if (p->state != P_FAILED) peer_fail(p, KVHAL_CANCELED, true, "disconnected by %s", a->name);
    /* frames accepted but not started: refused now (the peer failed); then the copies still reading the peer's
     * imported cache finish (it is closed below), and those reading its process by pid go on without it */
    for (int k = 0; k < XFER_PATHS; k++) {
        if (xfer_paths[k]->progress) xfer_paths[k]->progress(a);
        if (xfer_paths[k]->peer_lost) xfer_paths[k]->peer_lost(a, p);
    }
    flush_msgs(a); /* the BYE, and the endpoint's close */
    for (kvhal_xfer *x = a->xfers; x; x = x->next)
        if (x->peer == p) x->peer = NULL;
    scrub_events(a, p, NULL);
    for (kvhal_xfer_peer **pp = &a->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (pending_msg *m = a->msgs; m; m = m->next)
        if (m->peer == p) m->peer = NULL;
    for (pending_msg *m = a->sent; m; m = m->next)
        if (m->peer == p) m->peer = NULL;
    peer_ipc_free(p);
    kvhal__handle_remove_kind(p, PEER_MAGIC);
    p->magic = DEAD_MAGIC;
    free(p);
    return KVHAL_OK;
}

kvhal_status kvhal_xfer_connect(kvhal_xfer_agent *a, const void *blob, size_t len, const char *token,
                                kvhal_xfer_peer **out)
{
    kvhal_status st = peer_connect(a, blob, len, token, out); /* *out: NULL, or the peer */
    if (st != KVHAL_OK) return st;
    kvhal_xfer_peer *p = *out;
    *out = NULL; /* until it connected */
    idle_state spins = {0, 0};
    /* and, on the same host with a shareable cache, for the peer's answer to our IPC handle (bounded by the
     * timeout: without an answer the transfers go through host memory) */
    while (p->state == P_CONNECTING || (p->state == P_CONNECTED && p->ipc_state == IPC_OFFERED &&
                                        now_ns() < p->deadline_ns)) {
        idle_wait(&spins, pump(a));
    }
    if (p->state == P_FAILED) {
        st = ERR(p->fail_status, "connect to %s: %s", p->name, p->fail_msg);
        kvhal_xfer_disconnect(p);
        return st;
    }
    *out = p;
    return KVHAL_OK;
}

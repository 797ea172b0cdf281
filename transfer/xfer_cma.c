/* xfer_cma.c — the CMA path: same host, the sender's cache in host memory; the receiver reads the pages a frame
 * names from the sender's process with process_vm_readv, on the copy workers (a frame split in pieces) or in pump. */
#define _GNU_SOURCE /* process_vm_readv */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <nettle/memops.h>

#include "xfer_internal.h"
#include "xfer_rooms.h"

/* Receiver: may we read a peer's host cache with process_vm_readv (the XW_IPC_CMA kind of IPC_MAP)? Our cache in
 * host memory, CMA among our transports, a map that makes sense. Else why says why not. What proves the process is
 * the peer's comes after (the challenge: cma_challenge, cma_readback). */
void cma_precheck(const kvhal_xfer_agent *a, const xw_cma_blob *cb, char *why, size_t cap)
{
    uint64_t end;
    if (!a->host) snprintf(why, cap, "this cache is not in host memory");
    else if (!a->cma_ok) snprintf(why, cap, "CMA is not among this agent's transports");
    else if (cb->pid == 0 || cb->pid > INT32_MAX || cb->base == 0 || __builtin_add_overflow(cb->base, cb->size, &end))
        snprintf(why, cap, "bad CMA map (pid %u, %llu bytes)", (unsigned)cb->pid, (unsigned long long)cb->size);
}

/* The receiver's abstract Unix socket (this network namespace only), made on first use. */
static bool cma_sock_open(kvhal_xfer_agent *a, char *why, size_t cap)
{
    if (a->cma_sock >= 0) return true;
    uint8_t r[8];
    if (!auth_nonce(r, sizeof r)) {
        snprintf(why, cap, "no random numbers for the challenge");
        return false;
    }
    snprintf(a->cma_sock_name, sizeof a->cma_sock_name, "kvhal-xfer-%d-%02x%02x%02x%02x%02x%02x%02x%02x", (int)getpid(),
             r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    const size_t n = strlen(a->cma_sock_name);
    memcpy(sa.sun_path + 1, a->cma_sock_name, n);
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) != 0 ||
        listen(fd, CMA_CONNS_MAX) != 0) {
        snprintf(why, cap, "cannot open the challenge socket: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return false;
    }
    a->cma_sock = fd;
    return true;
}

void cma_sock_close(kvhal_xfer_agent *a)
{
    for (int i = 0; i < CMA_CONNS_MAX; i++)
        if (a->cma_conns[i] >= 0) close(a->cma_conns[i]);
    for (int i = 0; i < CMA_CONNS_MAX; i++) a->cma_conns[i] = -1;
    if (a->cma_sock >= 0) close(a->cma_sock);
    a->cma_sock = -1;
}

/* Receiver: the challenge for a CMA map: a nonce of ours, the socket to answer on. False: why says why not. */
bool cma_challenge(kvhal_xfer_agent *a, kvhal_xfer_peer *p, char *why, size_t cap)
{
    if (!cma_sock_open(a, why, cap)) return false;
    if (!auth_nonce(p->cma_nonce, sizeof p->cma_nonce)) {
        snprintf(why, cap, "no random numbers for the challenge");
        return false;
    }
    xw_cma_challenge ch;
    memset(&ch, 0, sizeof ch);
    ch.c = (xw_common){XW_MAGIC, XW_VERSION, XW_CMA_CHALLENGE, p->their_session};
    memcpy(ch.nonce, p->cma_nonce, sizeof ch.nonce);
    memcpy(ch.sock, a->cma_sock_name, sizeof ch.sock);
    queue_msg(a, p, NULL, &ch, sizeof ch, NULL, 0, false);
    p->cma_challenged = true;
    p->cma_deadline_ns = deadline_from_now(a);
    return true;
}

/* One answer on an accepted connection: {session, nonce}; the kernel's SO_PEERCRED pid recorded on the peer whose
 * session and nonce it names. False: nothing there yet. */
static bool cma_conn_read(kvhal_xfer_agent *a, int fd)
{
    xw_cma_sock_msg m;
    const ssize_t n = recv(fd, &m, sizeof m, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    struct ucred cr;
    socklen_t cl = sizeof cr;
    if (n == (ssize_t)sizeof m && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0 && cr.pid > 0) {
        kvhal_xfer_peer *p = find_session(a, m.session);
        if (p && p->state == P_CONNECTED && p->cma_challenged && !p->cma_cred_pid &&
            memeql_sec(m.nonce, p->cma_nonce, sizeof m.nonce))
            p->cma_cred_pid = (int32_t)cr.pid;
    }
    return true;
}

/* Receiver (from pump, while a challenge is out): answers taken from the socket (a few connections at once, each
 * closed after its one message or when the connections are all taken). */
void cma_sock_poll(kvhal_xfer_agent *a)
{
    if (a->cma_sock < 0) return;
    for (int i = 0; i < CMA_CONNS_MAX; i++)
        if (a->cma_conns[i] >= 0 && cma_conn_read(a, a->cma_conns[i])) {
            close(a->cma_conns[i]);
            a->cma_conns[i] = -1;
        }
    for (int k = 0; k < CMA_CONNS_MAX; k++) {
        const int fd = accept4(a->cma_sock, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (cma_conn_read(a, fd)) {
            close(fd);
            continue;
        }
        int slot = -1;
        for (int i = 0; i < CMA_CONNS_MAX && slot < 0; i++)
            if (a->cma_conns[i] < 0) slot = i;
        if (slot < 0) { /* full: the oldest goes (its sender may answer again with a new challenge) */
            slot = a->cma_next_conn++ % CMA_CONNS_MAX;
            close(a->cma_conns[slot]);
        }
        a->cma_conns[slot] = fd;
    }
}

/* Receiver: the challenge's end. The process that answered on the socket must be the one the map names, and it
 * must hold our nonce at the probe address, read through the CMA path itself. Else why says why not. */
void cma_readback(kvhal_xfer_agent *a, const kvhal_xfer_peer *p, const xw_cma_blob *cb, char *why, size_t cap)
{
    if (!p->cma_cred_pid) {
        snprintf(why, cap, "no answer to the CMA challenge within %u ms (another network namespace?)",
                 (unsigned)a->timeout_ms);
        return;
    }
    if ((uint32_t)p->cma_cred_pid != cb->pid) {
        snprintf(why, cap, "the map names process %u, but process %d answered the challenge: refused",
                 (unsigned)cb->pid, (int)p->cma_cred_pid);
        return;
    }
    uint8_t got[XW_CMA_PROBE];
    struct iovec l = {got, sizeof got}, r = {(void *)(uintptr_t)cb->probe_addr, sizeof got};
    const ssize_t n = process_vm_readv((pid_t)cb->pid, &l, 1, &r, 1, 0);
    if (n < 0) snprintf(why, cap, "cannot read process %u: %s", (unsigned)cb->pid, strerror(errno));
    else if ((size_t)n != sizeof got || !memeql_sec(got, p->cma_nonce, sizeof got))
        snprintf(why, cap, "process %u does not hold the challenge's nonce at the probe address", (unsigned)cb->pid);
}

/* Sender (from the handler): the receiver's challenge. Its nonce goes where our map's probe address points, then
 * {its session, the nonce} on its socket, from this process (the kernel tells it our pid). A challenge we did not
 * ask for (no CMA map offered) breaks the protocol. */
void on_cma_challenge(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    (void)a;
    xw_cma_challenge ch;
    if (header_length != sizeof ch || p->ipc_state != IPC_OFFERED || p->ipc_kind != XW_IPC_CMA) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "unexpected or malformed CMA_CHALLENGE (%zu bytes)", header_length);
        return;
    }
    memcpy(&ch, header, sizeof ch);
    memcpy(p->cma_probe, ch.nonce, sizeof p->cma_probe);
    const size_t n = strnlen(ch.sock, sizeof ch.sock - 1);
    if (strncmp(ch.sock, "kvhal-xfer-", 11) != 0) return; /* only a transfer agent's socket is written to */
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path + 1, ch.sock, n);
    xw_cma_sock_msg m;
    memset(&m, 0, sizeof m);
    m.session = p->their_session;
    memcpy(m.nonce, ch.nonce, sizeof m.nonce);
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return; /* the receiver's challenge times out: it refuses the map, we send through UCX */
    if (connect(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) == 0)
        (void)send(fd, &m, sizeof m, MSG_NOSIGNAL);
    close(fd);
}

/* Receiver (from pump), the CMA kind: every (page, layer, K/V) chunk of a DATA_IPC frame read from the peer's
 * process straight into our granted pages with process_vm_readv (chunks adjacent on both sides merged, up to 1024
 * of them a call), then acknowledged. The source addresses are the peer's map, checked against its size when it
 * came; whatever the peer's process no longer holds fails the frame. */
static bool cma_read(uint32_t pid, struct iovec *lv, struct iovec *rv, size_t c, char *why, size_t cap)
{
    /* One call moves at most MAX_RW_COUNT (about 2 GiB) and returns that much: the rest is read by the next call,
     * from where it stopped (the runs moved past are not given back: both lists are the caller's scratch). */
    while (c > 0) {
        ssize_t n;
        do n = process_vm_readv((pid_t)pid, lv, (unsigned long)c, rv, (unsigned long)c, 0);
        while (n < 0 && errno == EINTR);
        if (n <= 0) {
            char buf[128];
            snprintf(why, cap, "reading the peer's pages (process %u) failed: %s", (unsigned)pid,
                     n < 0 ? strerror_r(errno, buf, sizeof buf) : "nothing read");
            return false;
        }
        size_t done = (size_t)n;
        while (c > 0 && done >= lv->iov_len) { /* local and remote runs have the same lengths */
            done -= lv->iov_len;
            lv++;
            rv++;
            c--;
        }
        if (c > 0 && done) {
            lv->iov_base = (uint8_t *)lv->iov_base + done;
            lv->iov_len -= done;
            rv->iov_base = (uint8_t *)rv->iov_base + done;
            rv->iov_len -= done;
        }
    }
    return true;
}

static void cma_copy(kvhal_xfer_agent *a, ipc_job *j)
{
    kvhal_xfer_peer *p = j->p;
    const uint64_t cb = a->g.chunk_bytes;
    enum { BATCH = 1024 };
    struct iovec lv[BATCH], rv[BATCH];
    size_t c = 0;
    bool ok = true;
    char why[XW_REASON_LEN] = "";
    for (int32_t i = 0; i < j->n && ok; i++)
        for (int32_t l = j->l0; l < j->l0 + j->nl && ok; l++)
            for (int sd = 0; sd < 2 && ok; sd++) {
                uint8_t *d = a->host_base + chunk_off(a, l, sd, j->pairs[2 * i + 1]);
                uint8_t *s = (uint8_t *)(uintptr_t)(p->cma_base + p->ipc_off[2 * l + sd] +
                                                    (uint64_t)j->pairs[2 * i] * p->ipc_stride);
                if (c && (uint8_t *)lv[c - 1].iov_base + lv[c - 1].iov_len == d &&
                    (uint8_t *)rv[c - 1].iov_base + rv[c - 1].iov_len == s) {
                    lv[c - 1].iov_len += cb;
                    rv[c - 1].iov_len += cb;
                    continue;
                }
                if (c == BATCH) {
                    ok = cma_read(p->cma_pid, lv, rv, c, why, sizeof why);
                    c = 0;
                }
                lv[c] = (struct iovec){d, cb};
                rv[c] = (struct iovec){s, cb};
                c++;
            }
    if (ok && c) ok = cma_read(p->cma_pid, lv, rv, c, why, sizeof why);
    ipc_job_complete(a, j, ok ? KVHAL_OK : KVHAL_PEER_FAILED, why);
}

/* Reads runs [0, c) of lv/rv from the peer's process, CMA_IOV_MAX a call. */
static bool cma_read_runs(uint32_t pid, struct iovec *lv, struct iovec *rv, size_t c, char *why, size_t cap)
{
    for (size_t k = 0; k < c; k += CMA_IOV_MAX)
        if (!cma_read(pid, lv + k, rv + k, c - k < CMA_IOV_MAX ? c - k : CMA_IOV_MAX, why, cap)) return false;
    return true;
}

/* A share of a CMA frame's runs for one copy worker: runs [first, first + count) of its job. */
typedef struct cma_piece {
    xfer_work work;
    ipc_job *j;
    size_t first, count;
    bool failed;            /* the worker's: its read failed (why says how) */
    bool skipped;           /* the worker's: another piece had failed, this one was not read */
    char why[XW_REASON_LEN];
} cma_piece;

/* On a worker: the piece's runs read from the peer's process, unless another piece of the frame failed already. */
static void piece_work(xfer_work *w, void **local)
{
    (void)local;
    cma_piece *pc = XFER_WORK_OWNER(w, cma_piece, work);
    ipc_job *j = pc->j;
    if (atomic_load_explicit(&j->abort, memory_order_relaxed)) {
        pc->skipped = true;
        return;
    }
    pc->failed = !cma_read_runs(j->pid, j->lv + pc->first, j->rv + pc->first, pc->count, pc->why, sizeof pc->why);
    if (pc->failed) atomic_store_explicit(&j->abort, true, memory_order_relaxed);
}

/* While a piece is out: a receive whose frames our workers still copy is not stalled by its peer; the pieces of a
 * transfer that failed meanwhile, or of a peer gone, are not started. */
static bool piece_pending(xfer_work *w)
{
    ipc_job *j = XFER_WORK_OWNER(w, cma_piece, work)->j;
    j->x->deadline_ns = deadline_from_now(j->x->agent);
    return !j->x->failing && j->p;
}

static void cma_running_unlink(kvhal_xfer_agent *a, ipc_job *j)
{
    for (ipc_job **pp = &a->cma_running; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
}

/* A piece handed back: once every piece of its frame is, the frame completes (acknowledged unless its peer went). */
static void piece_done(xfer_work *w, xfer_work_status st)
{
    cma_piece *pc = XFER_WORK_OWNER(w, cma_piece, work);
    ipc_job *j = pc->j;
    kvhal_xfer_agent *a = j->x->agent;
    if (st == XFER_WORK_ORPHANED) { /* no ACK from here: the connection is the parent's, whose workers copy it */
        j->p = NULL;
        if (!j->failed) snprintf(j->why, sizeof j->why, "the process forked while the frame was being copied");
        j->failed = true;
    } else if (st == XFER_WORK_CANCELED || pc->skipped) {
        j->skipped = true;
    } else if (pc->failed && !j->failed) {
        j->failed = true;
        memcpy(j->why, pc->why, sizeof j->why);
    }
    if (--j->pieces_left > 0) return;
    cma_running_unlink(a, j);
    kvhal_status s = KVHAL_OK;
    char why[XW_REASON_LEN] = "";
    if (j->failed) {
        s = KVHAL_PEER_FAILED;
        memcpy(why, j->why, sizeof why);
    } else if (j->skipped) {
        s = KVHAL_CANCELED;
        snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)j->x->request_id);
    }
    ipc_job_complete(a, j, s, why);
}

/* The frame's runs (as cma_copy merges them, but no longer than per bytes); returns how many. */
static size_t cma_runs(const kvhal_xfer_agent *a, ipc_job *j, size_t per)
{
    const kvhal_xfer_peer *p = j->p;
    const uint64_t cb = a->g.chunk_bytes;
    size_t c = 0;
    for (int32_t i = 0; i < j->n; i++)
        for (int32_t l = j->l0; l < j->l0 + j->nl; l++)
            for (int sd = 0; sd < 2; sd++) {
                uint8_t *d = a->host_base + chunk_off(a, l, sd, j->pairs[2 * i + 1]);
                uint8_t *src = (uint8_t *)(uintptr_t)(p->cma_base + p->ipc_off[2 * l + sd] +
                                                      (uint64_t)j->pairs[2 * i] * p->ipc_stride);
                if (c && (uint8_t *)j->lv[c - 1].iov_base + j->lv[c - 1].iov_len == d &&
                    (uint8_t *)j->rv[c - 1].iov_base + j->rv[c - 1].iov_len == src && j->lv[c - 1].iov_len + cb <= per) {
                    j->lv[c - 1].iov_len += cb;
                    j->rv[c - 1].iov_len += cb;
                    continue;
                }
                j->lv[c] = (struct iovec){d, cb};
                j->rv[c] = (struct iovec){src, cb};
                c++;
            }
    return c;
}

/* Receiver (from pump), with copy workers: the frame's runs are built here, cut into up to one piece per worker
 * (a->cma_piece bytes at least each) and handed to the pool; the frame completes once every piece is back
 * (piece_done). false: not handed over (no workers, or no memory for the runs): the caller copies it itself. */
static bool cma_submit(kvhal_xfer_agent *a, ipc_job *j)
{
    const int workers = xfer_pool_start(&a->workers);
    if (!workers) return false;
    const size_t max = (size_t)j->n * (size_t)j->nl * 2u;
    const uint64_t total = (uint64_t)max * a->g.chunk_bytes;
    size_t per = a->cma_piece; /* bytes of a piece: the frame shared by the workers, a piece's worth at least */
    if (total / (uint64_t)workers > per) per = (size_t)((total + (uint64_t)workers - 1) / (uint64_t)workers);
    j->lv = malloc(max * sizeof *j->lv);
    j->rv = malloc(max * sizeof *j->rv);
    j->pieces = calloc((size_t)workers, sizeof *j->pieces);
    if (!j->lv || !j->rv || !j->pieces) {
        free(j->lv);
        free(j->rv);
        free(j->pieces);
        j->lv = j->rv = NULL;
        j->pieces = NULL;
        return false;
    }
    const size_t c = cma_runs(a, j, per);
    /* pieces: consecutive runs of about per bytes each, the last one taking what is left */
    xfer_work *ws[XFER_WORKERS_MAX];
    int np = 0;
    for (size_t k = 0; k < c;) {
        cma_piece *pc = &j->pieces[np];
        *pc = (cma_piece){.work = {.work = piece_work, .done = piece_done, .pending = piece_pending}, .j = j};
        pc->first = k;
        size_t bytes = 0;
        if (np == workers - 1) k = c;
        else
            while (k < c && bytes < per) bytes += j->rv[k++].iov_len;
        pc->count = k - pc->first;
        ws[np] = &pc->work;
        np++;
    }
    j->pid = j->p->cma_pid;
    atomic_init(&j->abort, false);
    j->pieces_left = np;
    j->next = a->cma_running;
    a->cma_running = j;
    xfer_pool_submit(&a->workers, ws, np);
    return true;
}

/* Receiver (from pump): the accepted frames of the CMA path, settled in order: those of a transfer no longer
 * received or of a peer gone refused, the others handed to the copy workers, or read here where none runs. In a
 * process forked from the agent's they fail, unacknowledged (the connection is the parent's). */
static unsigned cma_progress(kvhal_xfer_agent *a)
{
    const bool forked = a->cma_jobs && a->pid != getpid();
    while (a->cma_jobs) {
        ipc_job *j = a->cma_jobs;
        a->cma_jobs = j->next;
        if (!a->cma_jobs) a->cma_jobs_tail = NULL;
        j->next = NULL;
        kvhal_xfer *x = j->x;
        kvhal_xfer_peer *p = j->p;
        if (forked) {
            j->p = NULL;
            ipc_job_complete(a, j, KVHAL_PEER_FAILED, "the process forked while the frame was being copied");
        } else if (x->failing) {
            char why[XW_REASON_LEN];
            snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)x->request_id);
            ipc_job_complete(a, j, KVHAL_CANCELED, why);
        } else if (p->state != P_CONNECTED || !p->cma) {
            ipc_job_complete(a, j, KVHAL_PEER_FAILED, "peer gone");
        } else if (!cma_submit(a, j)) {
            cma_copy(a, j); /* no workers: copied here, now */
        }
    }
    return a->cma_running != NULL;
}

static void cma_queue(kvhal_xfer_agent *a, ipc_job *j)
{
    if (a->cma_jobs_tail) a->cma_jobs_tail->next = j;
    else a->cma_jobs = j;
    a->cma_jobs_tail = j;
}

/* A peer going away (kvhal_xfer_disconnect): its frames still with the workers forget it (they read its process
 * by pid, and complete without an acknowledgement); what is not started yet is skipped. */
static void cma_peer_lost(kvhal_xfer_agent *a, const kvhal_xfer_peer *p)
{
    bool any = false;
    for (ipc_job *j = a->cma_running; j; j = j->next)
        if (j->p == p) {
            j->p = NULL;
            any = true;
        }
    if (any) xfer_pool_sweep(&a->workers);
}

static size_t cma_held(const kvhal_xfer_agent *a)
{
    size_t n = 0;
    for (const ipc_job *j = a->cma_jobs; j; j = j->next) n++;
    for (const ipc_job *j = a->cma_running; j; j = j->next) n++;
    return n;
}

/* The CMA path: same host, the sender's cache in host memory; the receiver reads its pages with process_vm_readv.
 * Sent as the IPC path sends (DATA_IPC and OFFER frames); the workers are drained with the agent's pool. */
const xfer_path xfer_path_cma = {
    .name = "cma",
    .send = send_pages_ipc,
    .job_queue = cma_queue,
    .progress = cma_progress,
    .peer_lost = cma_peer_lost,
    .held = cma_held,
};

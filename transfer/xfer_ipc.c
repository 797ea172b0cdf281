/* xfer_ipc.c — the IPC path (same host, the sender's cache shareable): the receiver imported the sender's cache
 * (xfer_map.c) and copies the pages of the frames it accepted (xfer_jobs.c) from it on its device, in launch groups
 * on its streams. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xfer_rooms.h"


static void ipc_queue(kvhal_xfer_agent *a, ipc_job *j)
{
    j->p->ipc_queued += ipc_job_chunks(j);
    if (a->ipc_jobs_tail) a->ipc_jobs_tail->next = j;
    else a->ipc_jobs = j;
    a->ipc_jobs_tail = j;
}

/* Takes the oldest running launch group off the list once its stream is done (wait: block for it), and completes
 * its frames. */
static bool ipc_job_reap(kvhal_xfer_agent *a, bool wait)
{
    ipc_job *j = a->ipc_running;
    if (!j) return false;
    kvhal_stream *sm = a->ipc_streams[j->slot];
    kvhal_event *ev = j->marked ? a->ipc_events[j->slot] : NULL;
    kvhal_status st = ev ? (wait ? kvhal_event_synchronize(ev) : kvhal_event_query(ev))
                         : (wait ? kvhal_stream_synchronize(sm) : kvhal_stream_query(sm));
    if (st == KVHAL_BUSY) return false;
    char why[XW_REASON_LEN] = "";
    if (st != KVHAL_OK) snprintf(why, sizeof why, "device copy failed: %s", kvhal_last_error());
    a->ipc_stream_groups[j->slot]--;
    a->ipc_groups_running--;
    const uint64_t launch = j->launch;
    do {
        a->ipc_running = j->next;
        ipc_job_complete(a, j, st, why);
    } while ((j = a->ipc_running) && j->launch == launch);
    return true;
}

/* Receiver (from pump): the accepted frames of the IPC path. Frames that need no device copy are settled first
 * (their transfer no longer received, their peer gone: refused). The
 * frames to copy from an imported cache go out in launch groups: queued frames of one peer become one batched copy
 * of all their (page, layer, K/V) chunks (adjacent ones merged) on a free stream, and pump acknowledges each frame
 * of the group once that stream is done. A group is full at IPC_GROUP_FULL ranges (a frame of 24 or more pages of
 * a 4-layer cache fills one alone; frames are added whole, up to IPC_GROUP_RANGES): a full group takes the next
 * free stream, so large copies overlap on up to IPC_STREAMS streams, and when every stream is busy pump waits for
 * the oldest copy (it ends within a copy's time). A group not full goes at once only when no other copy runs, else
 * it waits, gathering the frames that arrive meanwhile, until it fills or the running copy ends: a lone frame on an
 * idle receiver is copied at once, and under load the copies of many small transfers share one launch, whose cost
 * on the host is of the order of a 256 KiB transfer's copy over NVLink. Measured on 2 x H200 (
 * kvhal-xfer cuda:0 -> cuda:1 against cudaMemcpyPeer): with 16 transfers in flight 0.23 -> 0.56 at 256 KiB,
 * 0.40 -> 0.85 at 1 MiB, 0.71 -> 1.00 at 4 MiB against a launch per frame; waiting for the oldest copy rather than
 * going round pump when every stream is busy: 0.94 -> 1.25 at 16 MiB with 64 in flight. */
#define IPC_GROUP_FULL 192     /* ranges of a full launch group: two launches of 96 (HIP), one on CUDA where 512 go at once */
#define IPC_SMALL_GROUPS 1     /* launch groups running beyond which a group not full waits */
#define IPC_GROUP_RANGES 4096  /* ranges of a launch group at most, unless its first frame alone has more */
/* Chaining (see ipc_chain_slot): a group not full whose copy is shorter than the launch and the
 * detection of its end (a few us each) gains from going at once behind the running one; a larger one gains from
 * gathering the frames that land meanwhile into one launch. Measured with ABBA rounds on 2 x H100 (
 * cuda:0 -> cuda:1, 4-layer pages of 256 KiB; ratio to cudaMemcpyPeer, no chaining -> chaining): offers of 256 KiB
 * with 4 in flight 0.33 -> 0.39 and 0.31 -> 0.38, with 16 in flight 0.56 -> 0.64 and 0.54 -> 0.63 (two calls of
 * 10 rounds; bounded at 512 KiB 0.35 and 0.61); chaining groups of any size moved larger batches by -12% to +14%
 * either way, as much as rounds of one setting differ, and 64 offers of 256 KiB in flight 1.23 -> 1.01 in one call
 * (0.94 -> 0.93 in the other). So only groups of at most 512 KiB are chained by default; 13 rounds on a quieter
 * machine, none -> this bound: 256 KiB offers 0.37 -> 0.45 (4 in flight), 0.75 -> 0.81 (16), 1.42 -> 1.44 (64),
 * grants 0.31 -> 0.34, 0.77 -> 0.73, 1.22 -> 1.22, larger batches unchanged (IPC_CHAIN_BYTES). */

static bool ipc_job_needs_stream(const ipc_job *j)
{
    return !j->x->failing && j->p->state == P_CONNECTED && j->p->ipc_buf;
}

/* Settles a frame that needs no copy (see above): refused. */
static void ipc_job_settle(kvhal_xfer_agent *a, ipc_job *j)
{
    kvhal_xfer *x = j->x;
    if (x->failing) {
        char why[XW_REASON_LEN];
        snprintf(why, sizeof why, "request %llu is no longer received", (unsigned long long)x->request_id);
        ipc_job_complete(a, j, KVHAL_CANCELED, why);
    } else {
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, "peer gone");
    }
}

/* A stream with no group running, made if need be. The first copy makes every stream (those it cannot make are made
 * when wanted): a stream made when the load rises (a large group while others run) delayed that group by the
 * stream's creation, which on a GPU is of the order of a small batch's whole transfer. */
static int ipc_free_stream(kvhal_xfer_agent *a)
{
    if (!a->ipc_streams[0])
        for (int k = 0; k < IPC_STREAMS; k++)
            if (kvhal_stream_create(kvhal_buffer_device(a->cache_buf), &a->ipc_streams[k]) != KVHAL_OK) break;
    for (int k = 0; k < IPC_STREAMS; k++)
        if (!a->ipc_stream_groups[k] &&
            (a->ipc_streams[k] || kvhal_stream_create(kvhal_buffer_device(a->cache_buf), &a->ipc_streams[k]) == KVHAL_OK))
            return k;
    return -1;
}

/* Appends a frame's chunks to the group's ranges (merging adjacent ones); false, with nothing appended, when that
 * would pass cap ranges. */
static bool ipc_job_ranges(const kvhal_xfer_agent *a, const ipc_job *j, size_t *dof, size_t *sof, size_t *len,
                           size_t *count, size_t cap)
{
    const kvhal_xfer_peer *p = j->p;
    const uint64_t cb = a->g.chunk_bytes;
    size_t c = *count;
    for (int32_t i = 0; i < j->n; i++)
        for (int32_t l = j->l0; l < j->l0 + j->nl; l++)
            for (int sd = 0; sd < 2; sd++) {
                const size_t so = (size_t)(p->ipc_off[2 * l + sd] + (uint64_t)j->pairs[2 * i] * p->ipc_stride);
                const size_t d = chunk_off(a, l, sd, j->pairs[2 * i + 1]);
                if (c && sof[c - 1] + len[c - 1] == so && dof[c - 1] + len[c - 1] == d && c > *count) {
                    len[c - 1] += cb;
                } else {
                    if (c == cap) return false;
                    sof[c] = so;
                    dof[c] = d;
                    len[c] = cb;
                    c++;
                }
            }
    *count = c;
    return true;
}

/* The first peer in the queue whose queued frames hold IPC_GROUP_FULL chunks, or NULL. */
static kvhal_xfer_peer *ipc_full_peer(const kvhal_xfer_agent *a)
{
    for (const ipc_job *j = a->ipc_jobs; j; j = j->next)
        if (j->p->ipc_queued >= IPC_GROUP_FULL) return j->p;
    return NULL;
}

/* Takes j, which follows prev (NULL: j is the head), off the queue of accepted frames. */
static void ipc_jobs_unlink(kvhal_xfer_agent *a, ipc_job *prev, ipc_job *j)
{
    *(prev ? &prev->next : &a->ipc_jobs) = j->next;
    if (a->ipc_jobs_tail == j) a->ipc_jobs_tail = prev;
    j->p->ipc_queued -= ipc_job_chunks(j);
    j->next = NULL;
}

/* Where a group not full may go while another runs: behind the one running, on its stream, when that is the only
 * group running, alone on its stream, and the head's peer's waiting chunks hold at most a->ipc_chain bytes. The end of the running group
 * is marked first with its stream's event, so that it is acknowledged when it is done and not when the group behind
 * it is. -1: the group waits (no chaining, the load is not light, or the event cannot be made or recorded). */
static int ipc_chain_slot(kvhal_xfer_agent *a)
{
    ipc_job *r = a->ipc_running;
    if (!a->ipc_chain || a->ipc_groups_running != 1 || !r ||
        (uint64_t)a->ipc_jobs->p->ipc_queued * a->g.chunk_bytes > a->ipc_chain)
        return -1;
    const int slot = r->slot;
    if (a->ipc_stream_groups[slot] != 1) return -1;
    if (!a->ipc_events[slot] && kvhal_event_create(kvhal_buffer_device(a->cache_buf), &a->ipc_events[slot]) != KVHAL_OK)
        return -1;
    if (kvhal_event_record(a->ipc_events[slot], a->ipc_streams[slot]) != KVHAL_OK) return -1;
    for (ipc_job *j = r; j && j->launch == r->launch; j = j->next) j->marked = true;
    return slot;
}

static void ipc_jobs_launch(kvhal_xfer_agent *a)
{
    for (;;) {
        for (ipc_job **pp = &a->ipc_jobs, *prev = NULL; *pp;) { /* first, the frames that need no stream */
            ipc_job *j = *pp;
            if (ipc_job_needs_stream(j)) {
                prev = j;
                pp = &j->next;
                continue;
            }
            ipc_jobs_unlink(a, prev, j);
            ipc_job_settle(a, j);
        }
        if (!a->ipc_jobs) return;
        /* the group: a peer's queued frames, in order, until they hold IPC_GROUP_FULL ranges (its first frame
         * always goes, however many it has): the first peer in the queue whose frames fill a group; none full, the
         * head's peer, unless another group runs (see above) */
        kvhal_xfer_peer *p = ipc_full_peer(a);
        int slot = -1;
        if (!p) {
            if (a->ipc_groups_running >= IPC_SMALL_GROUPS) {
                slot = ipc_chain_slot(a);
                if (slot < 0) return;
            }
            p = a->ipc_jobs->p;
        }
        if (slot < 0) slot = ipc_free_stream(a);
        if (slot < 0) {
            if (a->ipc_running) {
                if (!ipc_job_reap(a, true)) return;
                continue;
            }
            ipc_job *j = a->ipc_jobs; /* no stream can be made at all: the frames fail */
            ipc_jobs_unlink(a, NULL, j);
            char why[XW_REASON_LEN];
            snprintf(why, sizeof why, "no stream for the copy: %s", kvhal_last_error());
            ipc_job_complete(a, j, KVHAL_BACKEND_ERROR, why);
            continue;
        }
        const ipc_job *first = a->ipc_jobs;
        while (first->p != p) first = first->next;
        /* the ranges: at most the peer's queued chunks (merging only lowers it), in the agent's arrays (grown when a
         * group needs more, else reused) */
        const size_t head = ipc_job_chunks(first), queued = p->ipc_queued;
        const size_t cap = head > IPC_GROUP_RANGES ? head : queued < IPC_GROUP_RANGES ? queued : IPC_GROUP_RANGES;
        if (cap > a->ipc_ranges_cap) {
            size_t *r = realloc(a->ipc_ranges, 3 * cap * sizeof *r);
            if (r) {
                a->ipc_ranges = r;
                a->ipc_ranges_cap = cap;
            }
        }
        const bool mem = cap <= a->ipc_ranges_cap;
        size_t *dof = mem ? a->ipc_ranges : NULL, *sof = mem ? dof + cap : NULL, *len = mem ? dof + 2 * cap : NULL;
        ipc_job *group = NULL, **gtail = &group;
        size_t c = 0;
        for (ipc_job **pp = &a->ipc_jobs, *prev = NULL; *pp && c < IPC_GROUP_FULL;) {
            ipc_job *j = *pp;
            if (j->p != p) {
                prev = j;
                pp = &j->next;
                continue;
            }
            if (mem && !ipc_job_ranges(a, j, dof, sof, len, &c, cap)) break; /* the next group's */
            ipc_jobs_unlink(a, prev, j);
            *gtail = j;
            gtail = &j->next;
            if (!mem) break; /* the head alone, to fail */
        }
        kvhal_status st = KVHAL_OUT_OF_MEMORY;
        char why[XW_REASON_LEN] = "receiver out of host memory";
        if (mem) {
            st = kvhal_memcpy_d2d_batch(a->cache_buf, p->ipc_buf, dof, sof, len, (int32_t)c, a->ipc_streams[slot]);
            if (st != KVHAL_OK) snprintf(why, sizeof why, "device copy failed: %s", kvhal_last_error());
        }
        if (st != KVHAL_OK) {
            /* a batch cut in several launches may have started some: they finish before the pages go back */
            if (mem) kvhal_stream_synchronize(a->ipc_streams[slot]);
            while (group) {
                ipc_job *j = group;
                group = j->next;
                ipc_job_complete(a, j, st, why);
            }
            continue;
        }
        const uint64_t launch = ++a->ipc_launches;
        a->ipc_groups_running++;
        a->ipc_stream_groups[slot]++;
        ipc_job **tail = &a->ipc_running;
        while (*tail) tail = &(*tail)->next;
        *tail = group;
        for (ipc_job *j = group; j; j = j->next) {
            j->slot = slot;
            j->launch = launch;
        }
    }
}

/* In a process forked from the agent's: the copies queued or on the parent's streams fail here, unacknowledged
 * (the connection is the parent's, which copies and acknowledges them itself), and their pages go back. */
static void ipc_jobs_forget_forked(kvhal_xfer_agent *a)
{
    static const char why[] = "the process forked while the frame was being copied";
    while (a->ipc_running) {
        ipc_job *j = a->ipc_running;
        a->ipc_running = j->next;
        j->p = NULL;
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, why);
    }
    while (a->ipc_jobs) {
        ipc_job *j = a->ipc_jobs;
        ipc_jobs_unlink(a, NULL, j);
        j->p = NULL;
        ipc_job_complete(a, j, KVHAL_PEER_FAILED, why);
    }
    a->ipc_groups_running = 0;
    memset(a->ipc_stream_groups, 0, sizeof a->ipc_stream_groups);
}

/* Launches the accepted frames, completes the copies that are over; returns how many groups completed, and one
 * more while copies run (pump's work: copies on the device count as work, so that the progress loops do not nap
 * while frames land and see a copy's end at once, which frees a stream for the frames waiting). A transfer whose
 * frames wait or are being copied here is not stalled: its deadline moves on. */
static unsigned ipc_progress(kvhal_xfer_agent *a)
{
    unsigned n = 0;
    if (!a->ipc_jobs && !a->ipc_running) return 0;
    if (a->pid != getpid()) {
        ipc_jobs_forget_forked(a);
        return n;
    }
    while (ipc_job_reap(a, false)) n++; /* first: their streams take the frames waiting */
    ipc_jobs_launch(a);
    const uint64_t deadline = deadline_from_now(a);
    for (ipc_job *j = a->ipc_jobs; j; j = j->next) j->x->deadline_ns = deadline;
    for (ipc_job *j = a->ipc_running; j; j = j->next) j->x->deadline_ns = deadline;
    return n + (a->ipc_running != NULL);
}

/* Waits for every running copy (they read a peer's imported memory and write our pages) and completes them. */
static void ipc_drain(kvhal_xfer_agent *a)
{
    while (ipc_job_reap(a, true)) {
    }
}

/* A peer going away: the device copies may still read its imported cache (closed when it is freed). */
static void ipc_peer_lost(kvhal_xfer_agent *a, const kvhal_xfer_peer *p)
{
    (void)p;
    ipc_drain(a);
}

static size_t ipc_held(const kvhal_xfer_agent *a)
{
    size_t n = 0;
    for (const ipc_job *j = a->ipc_jobs; j; j = j->next) n++;
    for (const ipc_job *j = a->ipc_running; j; j = j->next) n++;
    return n;
}

/* The IPC path: same host, the sender's cache shareable; the receiver imports its handle and copies the pages
 * itself on its device, in launch groups. */
const xfer_path xfer_path_ipc = {
    .name = "ipc",
    .send = send_pages_ipc,
    .job_queue = ipc_queue,
    .progress = ipc_progress,
    .peer_lost = ipc_peer_lost,
    .drain = ipc_drain,
    .held = ipc_held,
};

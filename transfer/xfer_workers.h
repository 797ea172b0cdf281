/* xfer_workers.h — a pool of worker threads for copies that would hold up the progress loop (reads of a peer's
 * process, gathers into bounce buffers, copies between a device cache and its staging). In the manner of libuv's
 * thread pool: the progress loop submits a work item (work, done); a worker runs work; the progress loop runs done
 * when it polls the pool. The pool knows nothing of what the work is: its users embed an xfer_work in their own
 * record and find the record again from it (XFER_WORK_OWNER).
 *
 * Threading: only the progress loop calls the functions below. work runs on a worker and touches nothing but its
 * record (and what stays fixed while it is out); done and pending run on the progress loop. A record is handed back
 * in done: until then the pool holds it, and its user must not free it. */
#ifndef KVHAL_XFER_WORKERS_H
#define KVHAL_XFER_WORKERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define XFER_WORKERS_MAX 64 /* threads of one pool at most */

typedef enum {
    XFER_WORK_DONE = 0,     /* work ran */
    XFER_WORK_CANCELED = 1, /* pending said no before a worker took it: work did not run */
    XFER_WORK_ORPHANED = 2, /* the process forked while it was out: its worker is the parent's, work may not have run */
} xfer_work_status;

typedef struct xfer_work xfer_work;
struct xfer_work {
    /* on a worker; *local: the worker's own slot (NULL at first, freed by the pool's local_free when it stops) */
    void (*work)(xfer_work *w, void **local);
    /* on the progress loop, once, when the pool hands the item back */
    void (*done)(xfer_work *w, xfer_work_status st);
    /* optional, on the progress loop while the item is out (from xfer_pool_poll and xfer_pool_sweep): false cancels
     * it unless a worker took it already. It may not call the pool. */
    bool (*pending)(xfer_work *w);
    /* the pool's */
    bool canceled, taken, finished; /* taken: a worker has it (canceled is then final: it ran or it did not) */
    xfer_work *next;     /* in the queue */
    xfer_work *out_next; /* in the items out */
};

#define XFER_WORK_OWNER(w, type, member) ((type *)(void *)((char *)(w) - offsetof(type, member)))

typedef struct xfer_pool {
    int threads;            /* wanted (0: none, the users do the work themselves) */
    int started;            /* running */
    pid_t pid;              /* the process that started them (a forked child has none of them) */
    void (*local_free)(void *);
    pthread_t th[XFER_WORKERS_MAX];
    pthread_mutex_t mu;     /* guards the queue, stop and every item's canceled, taken and finished */
    pthread_cond_t work_cv, done_cv;
    bool sync;              /* mu and the conditions are initialized */
    bool stop;
    atomic_int queued;      /* items in the queue (read without the lock by spinning workers) */
    xfer_work *head, *tail; /* queued, not yet taken */
    xfer_work *out;         /* the progress loop's: submitted and not yet handed back */
} xfer_pool;

/* A pool of threads workers at most (clamped to XFER_WORKERS_MAX), started on first use. */
void xfer_pool_init(xfer_pool *p, int threads, void (*local_free)(void *));
/* Starts the workers if they are not running; returns how many run (0: none, the caller does the work). */
int xfer_pool_start(xfer_pool *p);
/* Queues n items (after xfer_pool_start returned workers) and wakes as many workers. */
void xfer_pool_submit(xfer_pool *p, xfer_work *const *w, int n);
/* Hands back the items whose work is over (done called for each), asks pending of the others; wait: blocks until
 * one is over, unless none is out. Returns how many were handed back. */
unsigned xfer_pool_poll(xfer_pool *p, bool wait);
/* Asks pending of every item out now (an item's owner changed: cancel what need not run). */
void xfer_pool_sweep(xfer_pool *p);
/* Items out: submitted and not yet handed back. */
size_t xfer_pool_out(const xfer_pool *p);
/* Hands back every item (waiting for the workers), then stops and joins them. */
void xfer_pool_stop(xfer_pool *p);
/* What the pool's threads run (arg: the pool); tests tell its threads from others by it. */
void *xfer_pool_worker(void *arg);

#endif

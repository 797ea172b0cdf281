/* xfer_workers.c — the worker pool (xfer_workers.h). */
#include "xfer_workers.h"

#include <signal.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>


#define SPIN_NS 50000ull /* an idle worker polls the queue this long for the next item before it sleeps */

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void xfer_pool_init(xfer_pool *p, int threads, void (*local_free)(void *))
{
    p->threads = threads < 0 ? 0 : threads > XFER_WORKERS_MAX ? XFER_WORKERS_MAX : threads;
    p->local_free = local_free;
}

/* Waits for the next item (polling the queue for SPIN_NS first: the next frame usually follows within
 * microseconds); NULL once stopped with nothing left. Called and returns with mu held. */
static xfer_work *take(xfer_pool *p)
{
    if (!p->head && !p->stop) {
        pthread_mutex_unlock(&p->mu);
        const uint64_t until = mono_ns() + SPIN_NS;
        unsigned spins = 0;
        while (atomic_load_explicit(&p->queued, memory_order_relaxed) == 0 && mono_ns() < until)
            if ((++spins & 63) == 0) sched_yield();
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->stop) pthread_cond_wait(&p->work_cv, &p->mu);
    }
    xfer_work *w = p->head;
    if (!w) return NULL;
    p->head = w->next;
    if (!p->head) p->tail = NULL;
    w->taken = true;
    atomic_fetch_sub_explicit(&p->queued, 1, memory_order_relaxed);
    return w;
}

void *xfer_pool_worker(void *arg)
{
    xfer_pool *p = arg;
    void *local = NULL;
    pthread_mutex_lock(&p->mu);
    for (xfer_work *w; (w = take(p)) != NULL;) {
        const bool canceled = w->canceled;
        pthread_mutex_unlock(&p->mu);
        if (!canceled) w->work(w, &local);
        pthread_mutex_lock(&p->mu);
        w->finished = true;
        pthread_cond_broadcast(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (local && p->local_free) p->local_free(local);
    return NULL;
}

/* A forked child of the process that started the workers: none of them runs here, and their mutex may be held for
 * ever (taken by a worker when the process forked). */
static bool orphaned(const xfer_pool *p) { return p->pid && p->pid != getpid(); }

/* In such a child: forget the threads and the mutex (nothing to join or destroy there); no workers from now on. */
static void forget_if_forked(xfer_pool *p)
{
    if ((p->started || p->sync) && orphaned(p)) {
        p->started = 0;
        p->sync = false;
        p->threads = 0;
    }
}

static bool sync_init(xfer_pool *p)
{
    if (pthread_mutex_init(&p->mu, NULL)) return false;
    if (pthread_cond_init(&p->work_cv, NULL)) {
        pthread_mutex_destroy(&p->mu);
        return false;
    }
    if (pthread_cond_init(&p->done_cv, NULL)) {
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
        return false;
    }
    p->sync = true;
    p->pid = getpid();
    return true;
}

/* The workers' signals are blocked: the application's handlers run on its own threads. A thread that does not start
 * leaves fewer workers; none at all, and the pool has none from now on. */
int xfer_pool_start(xfer_pool *p)
{
    if (p->started && !orphaned(p)) return p->started;
    forget_if_forked(p);
    if (p->threads <= 0) return 0;
    if (!p->sync && !sync_init(p)) {
        p->threads = 0;
        return 0;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (p->started < p->threads && pthread_create(&p->th[p->started], NULL, xfer_pool_worker, p) == 0) p->started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!p->started) p->threads = 0;
    return p->started;
}

void xfer_pool_submit(xfer_pool *p, xfer_work *const *w, int n)
{
    for (int k = 0; k < n; k++) {
        w[k]->canceled = w[k]->taken = w[k]->finished = false;
        w[k]->out_next = p->out;
        p->out = w[k];
    }
    pthread_mutex_lock(&p->mu);
    for (int k = 0; k < n; k++) {
        w[k]->next = NULL;
        if (p->tail) p->tail->next = w[k];
        else p->head = w[k];
        p->tail = w[k];
    }
    atomic_fetch_add_explicit(&p->queued, n, memory_order_relaxed);
    if (n > 1) pthread_cond_broadcast(&p->work_cv);
    else pthread_cond_signal(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
}

/* With mu held: the items over move from p->out to *done; the others are asked whether they are still wanted. */
static void collect(xfer_pool *p, xfer_work **done)
{
    for (xfer_work **pp = &p->out; *pp;) {
        xfer_work *w = *pp;
        if (w->finished) {
            *pp = w->out_next;
            w->out_next = *done;
            *done = w;
        } else {
            if (!w->taken && !w->canceled && w->pending && !w->pending(w)) w->canceled = true;
            pp = &w->out_next;
        }
    }
}

unsigned xfer_pool_poll(xfer_pool *p, bool wait)
{
    if (!p->out) return 0;
    xfer_work *done = NULL;
    xfer_work_status st = XFER_WORK_DONE;
    if (orphaned(p)) { /* a forked child: the parent's workers will never finish these */
        done = p->out;
        for (xfer_work *w = done; w; w = w->out_next) w->canceled = false;
        p->out = NULL;
        st = XFER_WORK_ORPHANED;
        forget_if_forked(p);
    } else {
        pthread_mutex_lock(&p->mu);
        for (;;) {
            collect(p, &done);
            if (!wait || done || !p->out) break;
            pthread_cond_wait(&p->done_cv, &p->mu);
        }
        pthread_mutex_unlock(&p->mu);
    }
    unsigned n = 0;
    while (done) { /* the workers are done with these: the progress loop's alone now */
        xfer_work *w = done;
        done = w->out_next;
        w->out_next = NULL;
        w->done(w, st == XFER_WORK_DONE && w->canceled ? XFER_WORK_CANCELED : st);
        n++;
    }
    return n;
}

void xfer_pool_sweep(xfer_pool *p)
{
    if (!p->out || orphaned(p)) return; /* a forked child: poll fails them all */
    pthread_mutex_lock(&p->mu);
    for (xfer_work *w = p->out; w; w = w->out_next)
        if (!w->taken && !w->canceled && w->pending && !w->pending(w)) w->canceled = true;
    pthread_mutex_unlock(&p->mu);
}

size_t xfer_pool_out(const xfer_pool *p)
{
    size_t n = 0;
    for (const xfer_work *w = p->out; w; w = w->out_next) n++;
    return n;
}

void xfer_pool_stop(xfer_pool *p)
{
    while (p->out) xfer_pool_poll(p, true); /* in a forked child: fails them at once */
    forget_if_forked(p);
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
        for (int k = 0; k < p->started; k++) pthread_join(p->th[k], NULL);
        p->started = 0;
    }
    if (p->sync) {
        pthread_cond_destroy(&p->done_cv);
        pthread_cond_destroy(&p->work_cv);
        pthread_mutex_destroy(&p->mu);
        p->sync = false;
    }
}

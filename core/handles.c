/* handles.c — the live-handle set that turns a double destroy into KVHAL_INVALID_HANDLE instead of a double free,
 * and a destroyed handle into a refusal before its memory is read. */
#include <pthread.h>
#include <stdlib.h>

#include "handles.h"

/* Open addressing over pointers, under one mutex (create/destroy are not hot paths). */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static const void **live;
static size_t live_cap, live_count, live_tomb;
#define TOMB ((const void *)(uintptr_t)1)

static size_t hash_ptr(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

#define LIVE_MIN_CAP 256

/* Rehashes into a table sized for what is live (tombstones dropped): load at most 1/4 after, so that the table
 * follows the live count both ways instead of doubling whenever tombstones pile up. */
static bool live_rehash(size_t live_now)
{
    size_t ncap = LIVE_MIN_CAP;
    while (ncap < 4 * (live_now + 1)) ncap *= 2;
    const void **n = calloc(ncap, sizeof *n); /* not kvhal__calloc: bookkeeping must not be a fault point */
    if (!n) return false;
    for (size_t i = 0; i < live_cap; i++) {
        if (live[i] && live[i] != TOMB) {
            size_t j = hash_ptr(live[i]) & (ncap - 1);
            while (n[j]) j = (j + 1) & (ncap - 1);
            n[j] = live[i];
        }
    }
    free(live);
    live = n;
    live_cap = ncap;
    live_tomb = 0;
    return true;
}

bool kvhal__handle_add(const void *p)
{
    pthread_mutex_lock(&live_mu);
    bool ok = true;
    if ((live_count + live_tomb + 1) * 2 > live_cap) ok = live_rehash(live_count + 1);
    if (ok) {
        size_t j = hash_ptr(p) & (live_cap - 1);
        while (live[j] && live[j] != TOMB) j = (j + 1) & (live_cap - 1);
        if (live[j] == TOMB) live_tomb--;
        live[j] = p;
        live_count++;
    }
    pthread_mutex_unlock(&live_mu);
    return ok;
}

bool kvhal__handle_remove_kind(const void *p, uint32_t magic)
{
    bool found = false;
    pthread_mutex_lock(&live_mu);
    if (live_cap) {
        size_t j = hash_ptr(p) & (live_cap - 1);
        while (live[j]) {
            if (live[j] == p) {
                /* Live, so its first word is readable; a handle of another kind stays live and untouched. */
                if (*(const uint32_t *)p == magic) {
                    live[j] = TOMB;
                    live_count--;
                    live_tomb++;
                    found = true;
                }
                break;
            }
            j = (j + 1) & (live_cap - 1);
        }
        /* shrinks when at most 1/16 is live (a failed shrink keeps the larger table: still correct) */
        if (found && live_cap > LIVE_MIN_CAP && live_count * 16 <= live_cap) (void)live_rehash(live_count);
    }
    pthread_mutex_unlock(&live_mu);
    return found;
}

size_t kvhal__handle_table_slots(void)
{
    pthread_mutex_lock(&live_mu);
    size_t n = live_cap;
    pthread_mutex_unlock(&live_mu);
    return n;
}

bool kvhal__handle_live(const void *p, uint32_t magic)
{
    bool found = false;
    pthread_mutex_lock(&live_mu);
    if (live_cap) {
        for (size_t j = hash_ptr(p) & (live_cap - 1); live[j]; j = (j + 1) & (live_cap - 1))
            if (live[j] == p) {
                found = *(const uint32_t *)p == magic;
                break;
            }
    }
    pthread_mutex_unlock(&live_mu);
    return found;
}

/* fork() while another thread holds the mutex would leave it held for ever in the child: it is taken around fork */
static void fork_prepare(void) { pthread_mutex_lock(&live_mu); }
static void fork_done(void) { pthread_mutex_unlock(&live_mu); }
__attribute__((constructor)) static void live_init(void) { (void)pthread_atfork(fork_prepare, fork_done, fork_done); }

__attribute__((destructor)) static void live_free(void)
{
    free(live);
    live = NULL;
    live_cap = live_count = live_tomb = 0;
}

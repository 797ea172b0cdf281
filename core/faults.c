/* faults.c — host allocations of the core, counted so that a test can make the N-th one fail
 * (kvhal_fault_inject_alloc or KVHAL_FAULT_ALLOC=N) and walk every allocation point of a create/update path.
 * Plugins ask kvhal__alloc_should_fail() before their own allocations, so device allocations are covered too. */
#define _GNU_SOURCE /* secure_getenv: a set-user-id program ignores KVHAL_FAULT_ALLOC */
#include <stdatomic.h>
#include <stdlib.h>

#include "faults.h"
#include "kvhal_test.h"

static atomic_llong fail_at;  /* 0 = off; else the count at which allocation fails */
static atomic_llong counter;
static atomic_int env_read;

static void read_env(void)
{
    if (atomic_exchange(&env_read, 1)) return;
    const char *v = secure_getenv("KVHAL_FAULT_ALLOC");
    if (v && *v) {
        char *end;
        long long n = strtoll(v, &end, 10);
        if (*end == '\0' && n > 0) atomic_store(&fail_at, n);
    }
}

void kvhal_fault_inject_alloc(int64_t n)
{
    atomic_store(&env_read, 1);
    atomic_store(&counter, 0);
    atomic_store(&fail_at, n > 0 ? n : 0);
}

int64_t kvhal_fault_alloc_count(void) { return atomic_load(&counter); }

bool kvhal__alloc_should_fail(void)
{
    read_env();
    long long c = atomic_fetch_add(&counter, 1) + 1;
    long long f = atomic_load(&fail_at);
    return f > 0 && c == f;
}

void *kvhal__malloc(size_t n)
{
    if (kvhal__alloc_should_fail()) return NULL;
    return malloc(n ? n : 1);
}

void *kvhal__calloc(size_t n, size_t size)
{
    if (kvhal__alloc_should_fail()) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *kvhal__realloc(void *p, size_t n)
{
    if (kvhal__alloc_should_fail()) return NULL;
    return realloc(p, n ? n : 1);
}

/* Held streams (kvhal_fault_hold_streams): queries report BUSY; waits are counted. */
static atomic_int streams_held;
static atomic_llong stream_waits;

void kvhal_fault_hold_streams(int hold)
{
    atomic_store(&stream_waits, 0);
    atomic_store(&streams_held, hold != 0);
}

int64_t kvhal_fault_stream_waits(void) { return atomic_load(&stream_waits); }

bool kvhal__streams_held(void) { return atomic_load_explicit(&streams_held, memory_order_relaxed) != 0; }

void kvhal__stream_waited(void) { atomic_fetch_add_explicit(&stream_waits, 1, memory_order_relaxed); }

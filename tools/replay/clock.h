/* clock.h — kvhal-replay's clocks: wall and CPU seconds, and the ticks of the per-request timings.
 *
 * Timestamps for the per-request timings inside the engine loop (match, cache_finished, the stretches that are
 * not engine work), several per request: clock_gettime costs ~30 ns on a VM, which would be a tenth of a
 * request's time at page size 1. Where the kernel itself keeps time with the TSC (so it runs at a constant rate
 * on every core), tick() reads it directly (between two lfences), and run_once converts ticks to seconds per pass
 * against CLOCK_MONOTONIC; elsewhere a tick is a nanosecond of CLOCK_MONOTONIC. */
#ifndef KVHAL_REPLAY_CLOCK_H
#define KVHAL_REPLAY_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in seconds. */
double now_s(void);
/* CPU time of the process: on a shared machine the wall clock also counts other programs' turns. */
double cpu_s(void);
/* Chooses the tick source: the TSC where the kernel's clock source is the TSC. */
void tick_init(void);

extern bool replay_use_tsc; /* set by tick_init */

static inline uint64_t tick(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (replay_use_tsc) {
        /* ordered: the work before it has finished before the counter is read, and the work after it starts
         * after */
        __builtin_ia32_lfence();
        const uint64_t t = __builtin_ia32_rdtsc();
        __builtin_ia32_lfence();
        return t;
    }
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif

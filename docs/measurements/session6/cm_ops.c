/* cm_ops.c — bench_prefix.py's cache-manager loop (match -> allocate -> cache_finished_suffix) from C, each call
 * timed: what the same requests cost without Python (here-cache-manager-profile.txt). The workload has
 * bench_prefix's shape (64 groups x 16 prompts, 2048 + 128 + 256 tokens, page size 1, 1<<20 pages), its own token
 * ids, each request's tokens in arrays of their own made up front (cold, as the Python loop has them).
 *   cc -O2 -Iapi -o /tmp/cm_ops docs/measurements/session6/cm_ops.c -L<build>/core -Wl,-rpath,<build>/core -lkvhal
 *   /tmp/cm_ops [passes] [h]   (h: read each request's tokens just before it, as a tokenizer leaves them)
 * p (instead of h): a fresh output buffer per call, as the Python binding has. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvhal.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int fail(const char *what)
{
    fprintf(stderr, "cm_ops: %s: %s\n", what, kvhal_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    enum { G = 64, P = 16, S = 2048, Q = 128, O = 256, N = G * P };
    const int passes = argc > 1 ? atoi(argv[1]) : 5;
    const int hot = argc > 2 && argv[2][0] == 'h', fresh = argc > 2 && argv[2][0] == 'p';
    unsigned s = 14;
    static int32_t sys[G][S];
    for (int g = 0; g < G; g++)
        for (int i = 0; i < S; i++) sys[g][i] = (int32_t)(((s = s * 1103515245u + 12345u) >> 8) % 128256u);
    int32_t **pr = malloc(N * sizeof *pr), **sq = malloc(N * sizeof *sq);
    for (int p = 0, r = 0; p < P; p++)
        for (int g = 0; g < G; g++, r++) {
            pr[r] = malloc((S + Q) * sizeof(int32_t));
            sq[r] = malloc((S + Q + O) * sizeof(int32_t));
            memcpy(sq[r], sys[g], sizeof sys[g]);
            for (int i = S; i < S + Q + O; i++) sq[r][i] = (int32_t)(((s = s * 1103515245u + 12345u) >> 8) % 128256u);
            memcpy(pr[r], sq[r], (S + Q) * sizeof(int32_t));
        }
    int32_t *pages = malloc((S + Q) * sizeof(int32_t)), *own = malloc((S + Q + O) * sizeof(int32_t));
    for (int ps = 0; ps < passes; ps++) {
        kvhal_cache_manager *cm;
        if (kvhal_cache_manager_create(1 << 20, 1, KVHAL_PREFIX_RADIX, &cm) != KVHAL_OK) return fail("create");
        double tm = 0, ta = 0, tf = 0, t00 = now_ns();
        int32_t *prev_pg = NULL, *prev_own = NULL;
        for (int r = 0; r < N; r++) {
            if (hot) {
                volatile int32_t x = 0;
                for (int i = 0; i < S + Q + O; i++) x += sq[r][i];
                for (int i = 0; i < S + Q; i++) x += pr[r][i];
            }
            kvhal_prefix_handle h;
            size_t n;
            int32_t *pg = pages, *ow = own;
            double t0 = now_ns();
            if (fresh) pg = malloc((S + Q) * sizeof(int32_t));
            if (kvhal_cache_manager_match(cm, pr[r], S + Q, &h, &n, pg, S + Q) != KVHAL_OK) return fail("match");
            double t1 = now_ns();
            const int na = (int)(S + Q - n + O);
            if (fresh) {
                free(prev_pg);
                prev_pg = pg;
                free(prev_own);
                prev_own = ow = malloc((size_t)na * sizeof(int32_t));
            }
            if (kvhal_cache_manager_allocate(cm, na, ow) != KVHAL_OK) return fail("allocate");
            double t2 = now_ns();
            if (kvhal_cache_manager_cache_finished_suffix(cm, h, sq[r] + n, S + Q + O - n, ow) != KVHAL_OK)
                return fail("cache_finished_suffix");
            double t3 = now_ns();
            tm += t1 - t0;
            ta += t2 - t1;
            tf += t3 - t2;
        }
        double tt = now_ns() - t00;
        free(prev_pg);
        free(prev_own);
        if (ps == passes - 1 && kvhal_cache_manager_check_integrity(cm) != KVHAL_OK) return fail("check_integrity");
        printf("pass %d: match %.3f alloc %.3f finish %.3f us/req (sum %.3f; loop %.3f)\n", ps, tm / N / 1e3,
               ta / N / 1e3, tf / N / 1e3, (tm + ta + tf) / N / 1e3, tt / N / 1e3);
        kvhal_cache_manager_destroy(cm);
    }
    return 0;
}

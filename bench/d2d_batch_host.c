/* d2d_batch_host.c: the probe of bench/d2d-batch-host.sh, the host's cost of one kvhal_memcpy_d2d_batch as the IPC
 * path's receiver pays it per launch group: COUNT ranges of 32 KiB (a (page, layer, K|V) chunk of the transfer
 * benchmark's geometry) at scattered offsets of one buffer into scattered offsets of another, on one stream of the
 * device.
 * Build: cc -O2 -Iinclude bench/d2d_batch_host.c -o PROBE -LBUILD/core -lkvhal.   Run: PROBE DEVICE [ITERS]
 * Output, one line per count (8, 32, 192 and 512 ranges: 256 KiB, 1 MiB, 6 MiB and 16 MiB):
 *   "batch <ranges> <bytes> call_us <p50> <p90> latency_us <p50> <p90> gbps <GB/s>"
 * call_us: the call alone (host time until it returns, the device idle before it); latency_us: from the call to the
 * first kvhal_stream_query that reports the copy done (the receiver's launch and its notice of the end, without the
 * messages); gbps: ITERS calls queued back to back, bytes over the time to the stream's end. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <kvhal/kvhal.h>

#define CHUNK (32u << 10)
#define SLOTS 1024u /* 32 MiB per buffer */

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what, kvhal_status st)
{
    fprintf(stderr, "d2d_batch_host: %s: %s: %s\n", what, kvhal_status_string(st), kvhal_last_error());
    return 1;
}

#define TRY(what, call)                                                                                         \
    do {                                                                                                        \
        const kvhal_status st_ = (call);                                                                        \
        if (st_ != KVHAL_OK) return fail(what, st_);                                                            \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: d2d_batch_host DEVICE [ITERS]\n");
        return 2;
    }
    const int iters = argc > 2 ? atoi(argv[2]) : 200;
    if (iters < 10 || iters > 100000) {
        fprintf(stderr, "d2d_batch_host: ITERS %d: 10..100000\n", iters);
        return 2;
    }
    kvhal_device dev;
    TRY("device", kvhal_device_parse(argv[1], &dev));
    kvhal_buffer *src = NULL, *dst = NULL;
    kvhal_stream *s = NULL;
    TRY("src buffer", kvhal_buffer_create(dev, (size_t)SLOTS * CHUNK, &src));
    TRY("dst buffer", kvhal_buffer_create(dev, (size_t)SLOTS * CHUNK, &dst));
    TRY("stream", kvhal_stream_create(dev, &s));
    size_t *so = malloc(SLOTS * sizeof *so), *doff = malloc(SLOTS * sizeof *doff), *by = malloc(SLOTS * sizeof *by);
    double *call = malloc((size_t)iters * sizeof *call), *lat = malloc((size_t)iters * sizeof *lat);
    if (!so || !doff || !by || !call || !lat) return fail("host memory", KVHAL_OUT_OF_MEMORY);
    /* scattered, no two ranges adjacent on both sides (nothing merges): a fixed permutation of the slots */
    for (uint32_t i = 0; i < SLOTS; i++) {
        so[i] = (size_t)((i * 389u + 17u) % SLOTS) * CHUNK;
        doff[i] = (size_t)((i * 661u + 5u) % SLOTS) * CHUNK;
        by[i] = CHUNK;
    }
    const int32_t counts[] = {8, 32, 192, 512};
    for (int c = 0; c < 4; c++) {
        const int32_t n = counts[c];
        for (int w = 0; w < 20; w++) TRY("warm-up", kvhal_memcpy_d2d_batch(dst, src, doff, so, by, n, s));
        TRY("synchronize", kvhal_stream_synchronize(s));
        for (int i = 0; i < iters; i++) {
            const size_t first = (size_t)(i * 7) % (SLOTS - (size_t)n); /* another set of ranges each time */
            const double t0 = now_us();
            TRY("batch", kvhal_memcpy_d2d_batch(dst, src, doff + first, so + first, by + first, n, s));
            const double t1 = now_us();
            kvhal_status q;
            while ((q = kvhal_stream_query(s)) == KVHAL_BUSY) {
            }
            if (q != KVHAL_OK) return fail("query", q);
            call[i] = t1 - t0;
            lat[i] = now_us() - t0;
        }
        const double t0 = now_us();
        for (int i = 0; i < iters; i++) TRY("batch", kvhal_memcpy_d2d_batch(dst, src, doff, so, by, n, s));
        TRY("synchronize", kvhal_stream_synchronize(s));
        const double span = now_us() - t0;
        qsort(call, (size_t)iters, sizeof *call, cmp);
        qsort(lat, (size_t)iters, sizeof *lat, cmp);
        const double bytes = (double)n * CHUNK;
        printf("batch %d %.0f call_us %.2f %.2f latency_us %.2f %.2f gbps %.1f\n", (int)n, bytes, call[iters / 2],
               call[iters * 9 / 10], lat[iters / 2], lat[iters * 9 / 10], bytes * iters / span / 1e3);
    }
    kvhal_stream_destroy(s);
    kvhal_buffer_destroy(dst);
    kvhal_buffer_destroy(src);
    free(so);
    free(doff);
    free(by);
    free(call);
    free(lat);
    return 0;
}

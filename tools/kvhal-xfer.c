/* kvhal-xfer — prefill/decode disaggregation over libkvhal-xfer: a decode process (the receiver) and a prefill
 * process (the sender, exec'd by it, or started apart: --listen / --connect) each hold a paged cache; the decode side grants pages (scattered, from its cache
 * manager) for each request, the prefill side writes the prompt's K/V into its own scattered pages and sends them,
 * the decode side verifies every byte, publishes the pages to its cache manager (cache_finished) and goes on.
 *
 *   --self-test   both sides on loopback over TCP and over shared memory with CPU caches: eager and rendezvous
 *                 frames, a request split into frames, layer-by-layer sends, many requests in flight; every byte
 *                 verified, pages never granted untouched, no page left in use. Exit 0 only if all of it holds.
 *   (default)     the benchmark: batches of 16-token pages of --sizes bytes, a window of transfers in flight;
 *                 bandwidth, time per transfer (p50/p99), content verified.
 * The two sides may sit on other devices (--send-device cuda:0 --recv-device cuda:1): their pages are then staged
 * through host memory, or, with --ipc (the prefill cache shareable, both processes on one host), copied device to
 * device by the decode side from the prefill cache it imported. Every result names the path its transfers took
 * ("path": "host" in place, "staged", "ipc", or "cma": host caches on one host read by the decode side from the
 * prefill process with process_vm_readv). */
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvhal.h"
#include "kvhal_backend.h" /* the GPU modules' spin kernel (kvhal_gpu_spin) */
#include "kvhal_xfer.h"
#include "tool_common.h"

#define TOOL "kvhal-xfer"

static int g_argc;
static char **g_argv;

static struct {
    bool self_test, json, quiet;
    bool ipc;                               /* the prefill cache shareable: the IPC path on one host */
    bool offer;                             /* benchmark: the prefill offers its pages ahead (no grants) */
    const char *transports[8];
    int ntransports;
    const char *send_dev, *recv_dev;
    int32_t layers, heads, dim, block;
    kvhal_dtype dtype;
    uint64_t sizes[16];
    int nsizes;
    int iters, window;
    uint32_t timeout_ms;
    const char *listen_file, *connect_file; /* the two sides as separate processes (other namespaces or hosts) */
    bool child;                             /* started by a decode process: no JSON of its own */
    bool stream;                            /* benchmark: requests streamed layer by layer against a simulated prefill */
    int32_t tokens;                         /* --stream: a request's tokens */
    int32_t layer_us;                       /* --stream: the simulated prefill's time per layer */
    const char *prefill_mode;               /* --stream: sleep, busy or device */
    int report_fd;                          /* --stream, the prefill process: where its rounds' times go */
} opt = {.tokens = 4096, .layer_us = 1000, .prefill_mode = "busy", .report_fd = -1, .send_dev = "cpu", .recv_dev = "cpu", .layers = 4, .heads = 8, .dim = 128, .block = 16, .dtype = KVHAL_BF16,
         .iters = 40, .window = 4, .timeout_ms = 10000};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool json_error_done;
static FILE *json_results; /* the benchmark's rows, printed only when the whole run succeeded */

static void fail_json(const char *status, const char *msg)
{
    if (!opt.json || json_error_done) return;
    json_error_done = true;
    tool_json_failure(stdout, TOOL, status, msg);
}

/* Prints the failing call and returns 1 (the exit code of a failed run). */
static int failed(const char *what, kvhal_status st)
{
    char msg[1400];
    snprintf(msg, sizeof msg, "%s: %s (%s)", what, kvhal_status_name(st), kvhal_last_error());
    fprintf(stderr, TOOL ": error: %s\n", msg);
    fail_json(kvhal_status_name(st), msg);
    return 1;
}

#define TRY(what, expr)                                                                                         \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) return failed(what, st_);                                                          \
    } while (0)

/* ---- the content of a request's pages: a byte stream per (request, page index, layer, K|V) ---- */
static void pattern(uint8_t *out, size_t n, uint64_t req, int32_t i, int32_t l, int s)
{
    uint64_t x = (req + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)i << 20) ^ ((uint64_t)l << 8) ^ (uint64_t)s;
    for (size_t o = 0; o < n; o++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[o] = (uint8_t)(x >> 24);
    }
}

typedef struct side {
    kvhal_paged_cache *cache;
    kvhal_buffer *buf;
    size_t chunk;           /* bytes of one block of one layer's K or V */
    size_t *koff, *voff, stride;
    int64_t blocks;
} side;

static kvhal_status side_open(side *s, const char *devname, uint64_t budget, kvhal_paged_order order, bool shareable)
{
    kvhal_device dev;
    kvhal_status st = kvhal_device_parse(devname, &dev);
    if (st != KVHAL_OK) return st;
    kvhal_paged_cache_config c = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = opt.layers, .num_heads = opt.heads, .head_dim = opt.dim,
                                  .block_size = opt.block, .dtype = opt.dtype, .layout = KVHAL_LAYOUT_NHD,
                                  .order = order, .memory_budget = budget, .device = dev};
    if ((st = shareable ? kvhal_paged_cache_create_shareable(&c, &s->cache) : kvhal_paged_cache_create(&c, &s->cache)) !=
        KVHAL_OK)
        return st;
    s->blocks = kvhal_paged_cache_num_blocks(s->cache);
    s->koff = calloc((size_t)opt.layers, sizeof *s->koff);
    s->voff = calloc((size_t)opt.layers, sizeof *s->voff);
    if (!s->koff || !s->voff) return KVHAL_OUT_OF_MEMORY;
    for (int32_t l = 0; l < opt.layers; l++) {
        kvhal_tensor k, v;
        if ((st = kvhal_paged_cache_layer(s->cache, l, &k, &v)) != KVHAL_OK) return st;
        s->koff[l] = k.offset;
        s->voff[l] = v.offset;
        s->buf = k.buffer;
        s->stride = (size_t)k.strides[0] * kvhal_dtype_size(opt.dtype);
    }
    s->chunk = (size_t)opt.block * (size_t)opt.heads * (size_t)opt.dim * kvhal_dtype_size(opt.dtype);
    return KVHAL_OK;
}

static void side_close(side *s)
{
    kvhal_paged_cache_destroy(s->cache);
    free(s->koff);
    free(s->voff);
}

static size_t chunk_at(const side *s, int32_t l, int k_or_v, int32_t page)
{
    return (k_or_v ? s->voff[l] : s->koff[l]) + (size_t)page * s->stride;
}

/* Untimed transfers of each size before the timed ones: as many as are in flight (at least 4), so that no transfer
 * of the first window, posted while the paths warm up (streams, kernels, UCX's lanes made on first use), is timed. */
static int bench_warm(void)
{
    return opt.window > 4 ? opt.window : 4;
}

/* The largest --sizes entry (the list need not be sorted): the caches hold a window of it. */
static uint64_t max_size(void)
{
    uint64_t m = 0;
    for (int i = 0; i < opt.nsizes; i++)
        if (opt.sizes[i] > m) m = opt.sizes[i];
    return m;
}

static uint64_t page_bytes(void)
{
    return 2ull * (uint64_t)opt.layers * (uint64_t)opt.block * (uint64_t)opt.heads * (uint64_t)opt.dim *
           kvhal_dtype_size(opt.dtype);
}

static void shuffle(int32_t *a, int32_t n, uint64_t *seed)
{
    for (int32_t i = n - 1; i > 0; i--) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        int32_t j = (int32_t)((*seed >> 33) % (uint64_t)(i + 1));
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static bool write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w <= 0) return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

static bool read_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r <= 0) return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* ================================ the prefill side (the sender) ======================================== */
/* The benchmark with --offer: the prefill offers every request's pages as a prefill would once its K/V is written
 * (kvhal_xfer_offer_pages), up to four windows (at least 32 requests) ahead of the decode side, which takes them
 * with its receives (no grants); sizes in order, request ids from 0 for each, as the decode side posts them (the
 * last, verified one when the others are done). GRANT events (a receive posted before its offer came) need no
 * answer: the offer that follows is taken by that receive. */
static int prefill_offers(kvhal_xfer_agent *ag, kvhal_xfer_peer *peer, side *s, int32_t *order, uint8_t *host)
{
    /* ahead: a prefill runs on its own (its offers do not wait for the decode side's pace); twice the window left
     * the decode side's receives without an offer half the time (offers come back in bursts, as launch groups end) */
    const int per_size = opt.iters + bench_warm() + 1, ahead = 4 * opt.window < 32 ? 32 : 4 * opt.window;
    uint64_t seed = 7;
    int32_t cursor = (int32_t)s->blocks;
    kvhal_xfer **xs = calloc((size_t)ahead, sizeof *xs);
    if (!xs) return failed("prefill", KVHAL_OUT_OF_MEMORY);
    int rc = 0;
    for (int si = 0; si < opt.nsizes && !rc; si++) {
        const int32_t n = (int32_t)(opt.sizes[si] / page_bytes());
        if (n < 1 || n > (int32_t)s->blocks) break; /* the decode side reports it */
        int offered = 0, done = 0;
        while (done < per_size && !rc) {
            for (int w = 0; w < ahead && offered < per_size; w++) {
                if (xs[w]) continue;
                /* the last request (verified) after every other is done, as the decode side posts it: its K/V is
                 * written through kvhal first, thousands of small copies during which this process does not
                 * progress UCX, and offers still queued in UCX then reach the decode side late */
                if (offered == per_size - 1 && done < per_size - 1) break;
                if (cursor + n > (int32_t)s->blocks) {
                    shuffle(order, (int32_t)s->blocks, &seed);
                    cursor = 0;
                }
                const int32_t *src = order + cursor;
                cursor += n;
                if (offered == per_size - 1) /* the untimed last request, which the decode side verifies */
                    for (int32_t i = 0; i < n; i++)
                        for (int32_t l = 0; l < opt.layers; l++)
                            for (int kv = 0; kv < 2; kv++) {
                                pattern(host, s->chunk, (uint64_t)offered, i, l, kv);
                                TRY("prefill: write K/V", kvhal_memcpy_h2d(s->buf, chunk_at(s, l, kv, src[i]), host,
                                                                           s->chunk, NULL));
                            }
                TRY("prefill: offer", kvhal_xfer_offer_pages(peer, (uint64_t)offered, src, n, 0, opt.layers, &xs[w]));
                offered++;
            }
            kvhal_xfer_event ev;
            TRY("prefill: progress", kvhal_xfer_progress(ag, 1000, &ev));
            if (ev.type == KVHAL_XFER_EVENT_PEER_FAILED) {
                fprintf(stderr, TOOL ": error: prefill: %s\n", ev.message);
                rc = 1;
            }
            if (ev.type != KVHAL_XFER_EVENT_SEND_DONE) continue;
            if (ev.status != KVHAL_OK) {
                fprintf(stderr, TOOL ": error: prefill: offer of request %llu: %s\n", (unsigned long long)ev.request_id,
                        ev.message);
                rc = 1;
            }
            for (int w = 0; w < ahead; w++)
                if (xs[w] == ev.xfer) {
                    kvhal_xfer_release(xs[w]);
                    xs[w] = NULL;
                    done++;
                }
        }
    }
    for (int w = 0; w < ahead; w++) kvhal_xfer_release(xs[w]);
    free(xs);
    /* until the decode side closes the connection */
    for (kvhal_xfer_event ev = {0}; !rc && ev.type != KVHAL_XFER_EVENT_PEER_FAILED;)
        TRY("prefill: progress", kvhal_xfer_progress(ag, 1000, &ev));
    return rc;
}


/* ---- --stream: a request streamed layer by layer while a simulated prefill computes the next layer ---- */
/* One round's times as the prefill process measured them (its clock), sent to the decode process on a pipe. */
typedef struct stream_round {
    double prefill_s; /* the first layer's start to the last layer's end */
    double exposed_s; /* the last layer's end to the stream's completion (every layer acknowledged) */
    char path[8];
} stream_round;

typedef struct prefill_sim {
    kvhal_stream *stream;   /* device: the simulated layers' work, and the events after each (NULL with spin) */
    kvhal_gpu_spin_fn spin; /* CUDA, HIP: a kernel that spins for a number of cycles, on the default stream */
    int device;
    uint64_t cycles;        /* spin: cycles per layer, calibrated to --layer-us */
    kvhal_buffer *scratch;  /* other devices: copied within itself (halves), a stand-in for a layer's kernel */
    size_t half;
    int copies;             /* copies per layer, calibrated to --layer-us */
    kvhal_event **done;     /* device: per layer */
} prefill_sim;

/* One simulated layer queued: the spin kernel, else the scratch copies. */
static kvhal_status sim_layer(const prefill_sim *ps)
{
    if (ps->spin) return ps->spin(ps->device, ps->cycles, NULL) == 0 ? KVHAL_OK : KVHAL_BACKEND_ERROR;
    kvhal_status e = KVHAL_OK;
    for (int i = 0; i < ps->copies && e == KVHAL_OK; i++)
        e = kvhal_memcpy_d2d(ps->scratch, ps->half, ps->scratch, 0, ps->half, ps->stream);
    return e;
}

/* One round of the agent for a stream x: *fin set at x's SEND_DONE (its status in *st). */
static int stream_pump(kvhal_xfer_agent *ag, kvhal_xfer *x, uint32_t ms, bool *fin, kvhal_status *st)
{
    kvhal_xfer_event ev;
    TRY("prefill: progress", kvhal_xfer_progress(ag, ms, &ev));
    if (ev.type == KVHAL_XFER_EVENT_PEER_FAILED) {
        fprintf(stderr, TOOL ": error: prefill: %s\n", ev.message);
        return 1;
    }
    if (ev.type == KVHAL_XFER_EVENT_SEND_DONE && ev.xfer == x) {
        *fin = true;
        *st = ev.status;
    }
    return 0;
}

/* The device mode: on CUDA and HIP a spin kernel of --layer-us per layer on the device's default stream (the GPU
 * module's extra kvhal_gpu_spin: compute, no memory traffic), else copies within a 16 MiB scratch buffer on a stream
 * of the cache's device, as many per layer as take --layer-us; calibrated here (timed, the first pass a warm-up). */
static int sim_open(prefill_sim *ps, const side *s)
{
    const kvhal_device dev = kvhal_buffer_device(s->buf);
    void *f = NULL;
    if ((dev.type == KVHAL_DEVICE_CUDA || dev.type == KVHAL_DEVICE_HIP) &&
        kvhal_backend_get_proc_address(dev.type, "kvhal_gpu_spin", &f) == KVHAL_OK)
        memcpy(&ps->spin, &f, sizeof ps->spin); /* a function pointer from void * (ISO C has no cast for it) */
    kvhal_clear_error();
    ps->device = dev.id;
    if (!ps->spin) {
        ps->half = 8u << 20; /* 16 MiB in all: L2-resident on the large GPUs, so that the stand-in takes little HBM */
        TRY("prefill: stream", kvhal_stream_create(dev, &ps->stream));
        TRY("prefill: scratch", kvhal_buffer_create(dev, 2 * ps->half, &ps->scratch));
    }
    if (!(ps->done = calloc((size_t)opt.layers, sizeof *ps->done))) return failed("prefill", KVHAL_OUT_OF_MEMORY);
    for (int32_t l = 0; l < opt.layers; l++) TRY("prefill: event", kvhal_event_create(dev, &ps->done[l]));
    const int n = 32;
    ps->copies = 1;
    ps->cycles = 1u << 20;
    for (int pass = 0; pass < 2; pass++) {
        const double t0 = now_s();
        for (int i = 0; i < n; i++) TRY("prefill: the simulated layer", sim_layer(ps));
        TRY("prefill: sync", ps->spin ? kvhal_device_synchronize(dev) : kvhal_stream_synchronize(ps->stream));
        const double per = (now_s() - t0) / n, want = opt.layer_us * 1e-6;
        if (ps->spin) { /* cycles per second from this pass, for the next one (the first is a warm-up) */
            const double rate = (double)ps->cycles / per;
            ps->cycles = (uint64_t)(want * rate) > 0 ? (uint64_t)(want * rate) : 1;
            continue;
        }
        ps->copies = (int)(want / per + 0.5);
        if (ps->copies < 1) ps->copies = 1;
    }
    return 0;
}

static void sim_close(prefill_sim *ps)
{
    for (int32_t l = 0; ps->done && l < opt.layers; l++) kvhal_event_destroy(ps->done[l]);
    free(ps->done);
    if (ps->scratch) kvhal_buffer_destroy(ps->scratch);
    if (ps->stream) kvhal_stream_destroy(ps->stream);
}

/* One request: opened as a stream into the GRANT's pages, each layer "computed" (--prefill) and handed to it as it
 * is done; the round's times go to the decode process. */
static int stream_round_run(kvhal_xfer_agent *ag, kvhal_xfer_peer *peer, prefill_sim *ps, const kvhal_xfer_event *g,
                            const int32_t *src)
{
    kvhal_xfer *x;
    TRY("prefill: stream_open", kvhal_xfer_stream_open(peer, g->request_id, src, g->pages, g->num_pages, &x));
    const bool device = !strcmp(opt.prefill_mode, "device"), busy = !strcmp(opt.prefill_mode, "busy");
    bool fin = false;
    kvhal_status st = KVHAL_OK;
    int rc = 0;
    const double t0 = now_s();
    double t_end = 0;
    for (int32_t l = 0; l < opt.layers && !rc; l++) {
        if (device) { /* the layer's work queued, its event after it: the agent sends the layer once it fires */
            kvhal_status e = sim_layer(ps);
            if (e == KVHAL_OK) e = kvhal_event_record(ps->done[l], ps->stream);
            if (e != KVHAL_OK) {
                rc = failed("prefill: the simulated layer", e);
                break;
            }
            if ((e = kvhal_xfer_stream_layer(x, l, ps->done[l])) != KVHAL_OK) rc = failed("prefill: stream_layer", e);
            continue;
        }
        const double until = t0 + (l + 1) * opt.layer_us * 1e-6;
        if (busy) { /* the thread computes and progresses the agent between steps */
            while (now_s() < until && !rc) rc = stream_pump(ag, x, 0, &fin, &st);
        } else { /* the thread is away for the layer: nothing progresses the agent meanwhile */
            const double left = until - now_s();
            if (left > 0) {
                struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
                nanosleep(&ts, NULL);
            }
        }
        kvhal_status e = rc ? KVHAL_OK : kvhal_xfer_stream_layer(x, l, NULL);
        if (e != KVHAL_OK) rc = failed("prefill: stream_layer", e);
    }
    if (!device) t_end = now_s();
    while (!rc && !fin) {
        if (device && !t_end && kvhal_event_query(ps->done[opt.layers - 1]) == KVHAL_OK) t_end = now_s();
        rc = stream_pump(ag, x, device && !t_end ? 0 : 1, &fin, &st);
    }
    if (device && !t_end) t_end = now_s(); /* the stream completed first: its last layer's event had fired */
    const double t_done = now_s();
    if (!rc && st != KVHAL_OK) {
        fprintf(stderr, TOOL ": error: prefill: stream of request %llu: %s\n", (unsigned long long)g->request_id,
                kvhal_last_error());
        rc = 1;
    }
    stream_round r = {.prefill_s = t_end - t0, .exposed_s = t_done - t_end};
    snprintf(r.path, sizeof r.path, "%s", kvhal_xfer_path(x));
    kvhal_xfer_release(x);
    if (!rc && !write_all(opt.report_fd, &r, sizeof r)) rc = failed("prefill: the report pipe", KVHAL_INTERNAL);
    return rc;
}

/* The prefill process of --stream: a round per GRANT (the decode side posts one request at a time), its source
 * pages scattered anew each time, the K/V of the last (verified) request written first, untimed. */
static int prefill_stream(kvhal_xfer_agent *ag, kvhal_xfer_peer *peer, side *s, int32_t *order, uint8_t *host)
{
    if (opt.report_fd < 0) {
        fprintf(stderr, TOOL ": error: --stream: the prefill process reports to the decode process that started it\n");
        return 1;
    }
    prefill_sim ps = {0};
    int rc = !strcmp(opt.prefill_mode, "device") ? sim_open(&ps, s) : 0;
    uint64_t seed = 11;
    const uint64_t last = (uint64_t)opt.iters + 2; /* 2 warm-up rounds, then the timed ones, then the verified one */
    for (kvhal_xfer_event ev = {0}; !rc && ev.type != KVHAL_XFER_EVENT_PEER_FAILED;) {
        TRY("prefill: progress", kvhal_xfer_progress(ag, 1000, &ev));
        if (ev.type != KVHAL_XFER_EVENT_GRANT) continue;
        const int32_t n = ev.num_pages;
        if (n > (int32_t)s->blocks) return failed("prefill: grant larger than the cache", KVHAL_OUT_OF_RANGE);
        shuffle(order, (int32_t)s->blocks, &seed);
        if (ev.request_id == last)
            for (int32_t i = 0; i < n; i++)
                for (int32_t l = 0; l < opt.layers; l++)
                    for (int kv = 0; kv < 2; kv++) {
                        pattern(host, s->chunk, ev.request_id, i, l, kv);
                        TRY("prefill: write K/V", kvhal_memcpy_h2d(s->buf, chunk_at(s, l, kv, order[i]), host,
                                                                   s->chunk, NULL));
                    }
        kvhal_xfer_event g = ev;
        int32_t *pages = malloc((size_t)n * sizeof *pages); /* the event's pages last until the next progress */
        if (!pages) return failed("prefill", KVHAL_OUT_OF_MEMORY);
        memcpy(pages, ev.pages, (size_t)n * sizeof *pages);
        g.pages = pages;
        rc = stream_round_run(ag, peer, &ps, &g, order);
        free(pages);
    }
    sim_close(&ps);
    return rc;
}

/* Connects, then for every GRANT picks its own scattered source pages, writes the request's K/V into them and
 * sends them (odd requests layer by layer), until the decode side closes the connection. */
static int prefill(const char *transports, int fd, bool bench)
{
    uint32_t len = 0;
    static uint8_t blob[70000];
    if (!read_all(fd, &len, sizeof len) || len > sizeof blob || !read_all(fd, blob, len)) {
        fprintf(stderr, TOOL ": error: prefill: no address from the decode side\n");
        return 1;
    }
    side s = {0};
    const uint64_t budget = bench ? (uint64_t)opt.window * max_size() + 4 * page_bytes() :
                                    1100 * page_bytes();
    TRY("prefill: paged cache", side_open(&s, opt.send_dev, budget, KVHAL_LAYER_FIRST, opt.ipc));
    kvhal_xfer_config cfg = {.name = "prefill", .token = "kvhal-xfer-selftest", .timeout_ms = opt.timeout_ms,
                             .transports = transports};
    kvhal_xfer_agent *ag;
    TRY("prefill: agent", kvhal_xfer_agent_create(&cfg, &ag));
    TRY("prefill: register", kvhal_xfer_register_paged_cache(ag, s.cache));
    kvhal_xfer_peer *peer;
    TRY("prefill: connect", kvhal_xfer_connect(ag, blob, len, "kvhal-xfer-selftest", &peer));
    if (opt.ipc && strcmp(kvhal_xfer_peer_ipc(peer), "ipc") != 0)
        fprintf(stderr, TOOL ": warning: prefill: --ipc, but the IPC path is not available (%s): sending through UCX\n",
                kvhal_xfer_peer_ipc(peer));
    int32_t *order = malloc((size_t)s.blocks * sizeof *order);
    uint8_t *host = malloc(s.chunk);
    enum { MAXQ = 4096 };
    kvhal_xfer **inflight = calloc(MAXQ, sizeof *inflight);
    if (!order || !host || !inflight) return failed("prefill", KVHAL_OUT_OF_MEMORY);
    for (int32_t i = 0; i < (int32_t)s.blocks; i++) order[i] = i;
    uint64_t seed = 7;
    int32_t cursor = (int32_t)s.blocks; /* next unused source page in order[] */
    int rc = 0;
    if (bench && opt.offer) rc = prefill_offers(ag, peer, &s, order, host);
    if (bench && opt.stream) rc = prefill_stream(ag, peer, &s, order, host);
    while (!(bench && (opt.offer || opt.stream))) {
        kvhal_xfer_event ev;
        TRY("prefill: progress", kvhal_xfer_progress(ag, 1000, &ev));
        if (ev.type == KVHAL_XFER_EVENT_PEER_FAILED) break; /* the decode side closed: done */
        if (ev.type == KVHAL_XFER_EVENT_SEND_DONE) {
            if (ev.status != KVHAL_OK) {
                fprintf(stderr, TOOL ": error: prefill: request %llu: %s\n", (unsigned long long)ev.request_id,
                        ev.message);
                rc = 1;
            }
            for (int q = 0; q < MAXQ; q++)
                if (inflight[q] == ev.xfer) {
                    kvhal_xfer_release(ev.xfer);
                    inflight[q] = NULL;
                    break;
                }
            continue;
        }
        if (ev.type != KVHAL_XFER_EVENT_GRANT) continue;
        const int32_t n = ev.num_pages;
        if (n > (int32_t)s.blocks) return failed("prefill: grant larger than the cache", KVHAL_OUT_OF_RANGE);
        if (cursor + n > (int32_t)s.blocks) { /* new scattered source pages */
            shuffle(order, (int32_t)s.blocks, &seed);
            cursor = 0;
        }
        const int32_t *src = order + cursor;
        cursor += n;
        if (!bench || ev.request_id == (uint64_t)(opt.iters + bench_warm())) /* the prompt's K/V (bench: the untimed last transfer's), written through kvhal into the scattered source pages */
            for (int32_t i = 0; i < n; i++)
                for (int32_t l = 0; l < opt.layers; l++)
                    for (int kv = 0; kv < 2; kv++) {
                        pattern(host, s.chunk, ev.request_id, i, l, kv);
                        TRY("prefill: write K/V", kvhal_memcpy_h2d(s.buf, chunk_at(&s, l, kv, src[i]), host, s.chunk,
                                                                   NULL));
                    }
        const bool by_layer = !bench && (ev.request_id & 1);
        for (int32_t l0 = 0; l0 < opt.layers; l0 += by_layer ? 1 : opt.layers) {
            kvhal_xfer *x;
            TRY("prefill: send", kvhal_xfer_send_pages(peer, ev.request_id, src, ev.pages, n, l0,
                                                       by_layer ? 1 : opt.layers, &x));
            int q = 0;
            while (q < MAXQ && inflight[q]) q++;
            if (q == MAXQ) return failed("prefill: too many transfers in flight", KVHAL_OUT_OF_RANGE);
            inflight[q] = x;
        }
    }
    for (int q = 0; q < MAXQ; q++) kvhal_xfer_release(inflight[q]);
    free(inflight);
    free(order);
    free(host);
    kvhal_xfer_agent_destroy(ag);
    side_close(&s);
    return rc;
}

/* ================================ the decode side (this process) ======================================= */
typedef struct decode {
    side s;
    kvhal_xfer_agent *ag;
    kvhal_xfer_peer *peer;
    kvhal_cache_manager *cm;
    pid_t child;
    uint8_t *host, *want;
    char blob_path[256];
    int report_fd;          /* --stream: the prefill process's rounds (read end; -1 without) */
} decode;

static int decode_start(decode *d, const char *transports, bool bench)
{
    const uint64_t budget = bench ? (uint64_t)opt.window * max_size() + 4 * page_bytes() :
                                    1024 * page_bytes();
    TRY("decode: paged cache", side_open(&d->s, opt.recv_dev, budget, KVHAL_PAGE_FIRST, false));
    TRY("decode: cache manager", kvhal_cache_manager_create((int32_t)d->s.blocks, opt.block, KVHAL_PREFIX_RADIX, &d->cm));
    /* The prefill side is a new process: this one (kvhal-xfer --connect=FILE, exec'd, so that no UCX context or
     * device runtime crosses a fork), or one the user started (--listen). The address blob goes through FILE. */
    const char *file = opt.listen_file;
    d->child = -1;
    d->report_fd = -1;
    int report[2] = {-1, -1};
    if (opt.stream && !opt.self_test && pipe(report) != 0) return failed("decode: pipe", KVHAL_INTERNAL);
    if (!file) {
        snprintf(d->blob_path, sizeof d->blob_path, "/tmp/kvhal-xfer-%d-%s.blob", (int)getpid(), transports);
        unlink(d->blob_path);
        file = d->blob_path;
        fflush(stdout);
        fflush(stderr);
        d->child = fork();
        if (d->child < 0) return failed("decode: fork", KVHAL_INTERNAL);
        if (d->child == 0) {
            char conn[300], tls[200], child[] = "--child", rep[40];
            snprintf(conn, sizeof conn, "--connect=%s", d->blob_path);
            snprintf(tls, sizeof tls, "--transport=%s", transports);
            snprintf(rep, sizeof rep, "--stream-report=%d", report[1]);
            char **av = calloc((size_t)g_argc + 5, sizeof *av);
            if (!av) _exit(1);
            for (int i = 0; i < g_argc; i++) av[i] = g_argv[i];
            av[g_argc] = conn;
            av[g_argc + 1] = tls;
            av[g_argc + 2] = child; /* its errors go to stderr only: the JSON on stdout is this process's */
            if (report[1] >= 0) {
                close(report[0]);
                av[g_argc + 3] = rep; /* --stream: its rounds' times come back on this pipe */
            }
            /* this program again: argv[0] (a path, or a name on PATH), else /proc/self/exe (which under valgrind
             * is valgrind's own tool) */
            if (strchr(g_argv[0], '/')) execv(g_argv[0], av);
            else execvp(g_argv[0], av);
            execv("/proc/self/exe", av);
            fprintf(stderr, TOOL ": error: cannot start the prefill process\n");
            _exit(1);
        }
    }
    if (report[1] >= 0) {
        close(report[1]);
        d->report_fd = report[0];
        if (fcntl(d->report_fd, F_SETFL, O_NONBLOCK) != 0) return failed("decode: pipe", KVHAL_INTERNAL);
    }
    int fds[2] = {-1, -1};
    {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", file);
        fds[1] = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fds[1] < 0) return failed("decode: the address file", KVHAL_INVALID_ARGUMENT);
    }
    kvhal_xfer_config cfg = {.name = "decode", .token = "kvhal-xfer-selftest", .timeout_ms = opt.timeout_ms,
                             .transports = transports};
    TRY("decode: agent", kvhal_xfer_agent_create(&cfg, &d->ag));
    TRY("decode: register", kvhal_xfer_register_paged_cache(d->ag, d->s.cache));
    size_t len = 0;
    kvhal_xfer_local_address(d->ag, NULL, 0, &len); /* the size (KVHAL_OUT_OF_RANGE by design) */
    kvhal_clear_error();
    uint8_t *blob = malloc(len);
    if (!blob) return failed("decode", KVHAL_OUT_OF_MEMORY);
    TRY("decode: address", kvhal_xfer_local_address(d->ag, blob, len, &len));
    uint32_t l32 = (uint32_t)len;
    bool ok = write_all(fds[1], &l32, sizeof l32) && write_all(fds[1], blob, len);
    close(fds[1]);
    free(blob);
    if (!ok) return failed("decode: handing the address to the prefill process", KVHAL_INTERNAL);
    {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", file);
        if (rename(tmp, file) != 0) return failed("decode: the address file", KVHAL_INVALID_ARGUMENT);
    }
    const double until = now_s() + opt.timeout_ms / 1000.0;
    while (!d->peer) {
        kvhal_xfer_event ev;
        TRY("decode: progress", kvhal_xfer_progress(d->ag, 100, &ev));
        if (ev.type == KVHAL_XFER_EVENT_PEER_CONNECTED) d->peer = ev.peer;
        else if (ev.type == KVHAL_XFER_EVENT_PEER_REJECTED) {
            fprintf(stderr, TOOL ": error: %s\n", ev.message);
            return 1;
        }
        if (now_s() > until) return failed("decode: the prefill process did not connect", KVHAL_TIMEOUT);
    }
    d->host = malloc(d->s.chunk);
    d->want = malloc(d->s.chunk);
    if (!d->host || !d->want) return failed("decode", KVHAL_OUT_OF_MEMORY);
    return 0;
}

/* Closes the connection (the prefill side then exits) and reaps the prefill process: 1 if it failed. */
static int decode_finish(decode *d)
{
    int rc = 0;
    if (d->peer) kvhal_xfer_disconnect(d->peer);
    d->peer = NULL;
    if (d->child > 0) {
        int status = 0;
        const double until = now_s() + opt.timeout_ms / 1000.0 + 5;
        pid_t w;
        while ((w = waitpid(d->child, &status, WNOHANG)) == 0 && now_s() < until) {
            kvhal_xfer_event ev;
            kvhal_xfer_progress(d->ag, 10, &ev);
        }
        if (w == 0) {
            kill(d->child, SIGKILL);
            waitpid(d->child, &status, 0);
            fprintf(stderr, TOOL ": error: the prefill process did not exit\n");
            rc = 1;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, TOOL ": error: the prefill process failed (status %d)\n", status);
            rc = 1;
        }
    }
    if (d->blob_path[0]) unlink(d->blob_path);
    if (d->report_fd >= 0) close(d->report_fd);
    kvhal_xfer_agent_destroy(d->ag);
    kvhal_cache_manager_destroy(d->cm);
    side_close(&d->s);
    free(d->host);
    free(d->want);
    return rc;
}

/* Every byte of a received request against the pattern the prefill side wrote. */
static int verify(decode *d, uint64_t req, const int32_t *pages, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = 0; l < opt.layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                TRY("decode: read back", kvhal_memcpy_d2h(d->host, d->s.buf, chunk_at(&d->s, l, kv, pages[i]),
                                                          d->s.chunk, NULL));
                pattern(d->want, d->s.chunk, req, i, l, kv);
                if (memcmp(d->host, d->want, d->s.chunk) != 0) {
                    fprintf(stderr, TOOL ": error: request %llu page %d (index %d) layer %d %s differs from what "
                            "the prefill side wrote\n", (unsigned long long)req, (int)pages[i], (int)i, (int)l,
                            kv ? "V" : "K");
                    fail_json("KVHAL_INTEGRITY", "received K/V differs from what was sent");
                    return 1;
                }
            }
    return 0;
}

/* Decoding goes on from received pages: one new token's K/V of every layer written into page (slot 0) with
 * kvhal_paged_cache_update, then read back. */
static int decode_step(decode *d, int32_t page, uint64_t seed)
{
    kvhal_device dev = kvhal_buffer_device(d->s.buf);
    const size_t tok = (size_t)opt.heads * (size_t)opt.dim * kvhal_dtype_size(opt.dtype);
    kvhal_buffer *kb = NULL, *vb = NULL, *sb = NULL;
    kvhal_tensor k, v, sm;
    const int64_t shape[3] = {1, opt.heads, opt.dim}, one = 1;
    const int64_t slot = (int64_t)page * opt.block;
    int rc = 0;
    kvhal_status st = kvhal_buffer_create(dev, tok, &kb);
    if (st == KVHAL_OK) st = kvhal_buffer_create(dev, tok, &vb);
    if (st == KVHAL_OK) st = kvhal_buffer_create(dev, sizeof slot, &sb);
    if (st == KVHAL_OK) st = kvhal_tensor_make(kb, 0, opt.dtype, 3, shape, NULL, &k);
    if (st == KVHAL_OK) st = kvhal_tensor_make(vb, 0, opt.dtype, 3, shape, NULL, &v);
    if (st == KVHAL_OK) st = kvhal_tensor_make(sb, 0, KVHAL_I64, 1, &one, NULL, &sm);
    if (st == KVHAL_OK) st = kvhal_memcpy_h2d(sb, 0, &slot, sizeof slot, NULL);
    for (int32_t l = 0; l < opt.layers && st == KVHAL_OK && !rc; l++) {
        pattern(d->want, tok, seed, -1, l, 0);
        pattern(d->want + tok, tok, seed, -1, l, 1);
        st = kvhal_memcpy_h2d(kb, 0, d->want, tok, NULL);
        if (st == KVHAL_OK) st = kvhal_memcpy_h2d(vb, 0, d->want + tok, tok, NULL);
        if (st == KVHAL_OK) st = kvhal_paged_cache_update(d->s.cache, l, &k, &v, &sm, NULL);
        for (int kv = 0; kv < 2 && st == KVHAL_OK; kv++) { /* NHD: token 0 is the block's first heads x dim */
            st = kvhal_memcpy_d2h(d->host, d->s.buf, chunk_at(&d->s, l, kv, page), tok, NULL);
            if (st == KVHAL_OK && memcmp(d->host, d->want + (size_t)kv * tok, tok)) {
                fprintf(stderr, TOOL ": error: decode step: layer %d %s of page %d reads back wrong\n", (int)l,
                        kv ? "V" : "K", (int)page);
                rc = 1;
            }
        }
    }
    if (st != KVHAL_OK) rc = failed("decode step", st);
    kvhal_buffer_destroy(kb);
    kvhal_buffer_destroy(vb);
    kvhal_buffer_destroy(sb);
    return rc;
}

/* ---- --self-test on one transport ---- */
static int self_test_one(const char *transports)
{
    decode d = {0};
    int rc = decode_start(&d, transports, false);
    if (rc) {
        if (d.child > 0) kill(d.child, SIGKILL);
        decode_finish(&d);
        return rc;
    }
    const int32_t total = (int32_t)d.s.blocks;
    /* canary in every page; scattered free pages: take all, give back a shuffled half */
    memset(d.host, 0xA5, d.s.chunk);
    for (int32_t p = 0; p < total; p++)
        for (int32_t l = 0; l < opt.layers; l++)
            for (int kv = 0; kv < 2; kv++)
                TRY("decode: canary", kvhal_memcpy_h2d(d.s.buf, chunk_at(&d.s, l, kv, p), d.host, d.s.chunk, NULL));
    int32_t *all = malloc((size_t)total * sizeof *all);
    bool *granted = calloc((size_t)total, sizeof *granted);
    if (!all || !granted) return failed("decode", KVHAL_OUT_OF_MEMORY);
    TRY("decode: allocate", kvhal_cache_manager_allocate(d.cm, total, all));
    uint64_t seed = 42;
    shuffle(all, total, &seed);
    TRY("decode: free", kvhal_cache_manager_free(d.cm, all, total / 2 + 100));
    /* requests: small ones (eager frames), one past a frame's 256 pages (rendezvous, two frames), layer-by-layer
     * ones (odd ids); all granted before any arrives */
    enum { NREQ = 13 };
    int32_t sizes[NREQ] = {1, 3, 7, 16, 2, 33, 5, 300, 9, 12, 1, 24, 40};
    int32_t *pages[NREQ];
    kvhal_xfer *x[NREQ];
    for (int r = 0; r < NREQ; r++) {
        pages[r] = malloc((size_t)sizes[r] * sizeof(int32_t));
        if (!pages[r]) return failed("decode", KVHAL_OUT_OF_MEMORY);
        TRY("decode: allocate request pages", kvhal_cache_manager_allocate(d.cm, sizes[r], pages[r]));
        for (int32_t i = 0; i < sizes[r]; i++) granted[pages[r][i]] = true;
        TRY("decode: post_receive", kvhal_xfer_post_receive(d.peer, (uint64_t)r, pages[r], sizes[r], d.cm, &x[r]));
    }
    int64_t bytes = 0;
    const char *path = "";
    for (int r = 0; r < NREQ && !rc; r++) {
        kvhal_status st = kvhal_xfer_wait(x[r], opt.timeout_ms * 2);
        if (st != KVHAL_OK) {
            rc = failed("decode: receive", st);
            break;
        }
        kvhal_xfer_info info;
        kvhal_xfer_get_info(x[r], &info);
        if (info.bytes_done != info.bytes_total || info.bytes_total != (uint64_t)sizes[r] * page_bytes()) {
            fprintf(stderr, TOOL ": error: request %d: %llu of %llu bytes\n", r, (unsigned long long)info.bytes_done,
                    (unsigned long long)info.bytes_total);
            rc = 1;
        }
        bytes += (int64_t)info.bytes_done;
        path = kvhal_xfer_path(x[r]);
        if (opt.ipc && strcmp(path, "ipc") != 0) { /* --ipc promises the IPC path: one host, a shareable cache */
            fprintf(stderr, TOOL ": error: request %d went through \"%s\", not the IPC path\n", r, path);
            rc = 1;
        }
        rc = rc ? rc : verify(&d, (uint64_t)r, pages[r], sizes[r]);
        /* decode goes on: the request's pages are the cache manager's now (published through the prefix cache) */
        int32_t *toks = malloc((size_t)sizes[r] * (size_t)opt.block * sizeof *toks);
        if (!toks) return failed("decode", KVHAL_OUT_OF_MEMORY);
        for (int32_t t = 0; t < sizes[r] * opt.block; t++) toks[t] = r * 1000003 + t;
        /* a request handle of its own (a match of nothing: every page is the request's), consumed by the finish */
        kvhal_prefix_handle h = 0;
        int32_t none[1];
        if (!rc) TRY("decode: match", kvhal_cache_manager_match(d.cm, toks, 0, &h, NULL, none, 0));
        if (!rc) TRY("decode: cache_finished", kvhal_cache_manager_cache_finished(d.cm, toks, (size_t)sizes[r] * (size_t)opt.block,
                                                                              pages[r], h));
        free(toks);
        kvhal_xfer_release(x[r]);
        if (!rc) { /* the next token goes into a new page */
            int32_t np;
            TRY("decode: allocate", kvhal_cache_manager_allocate(d.cm, 1, &np));
            granted[np] = true;
            rc = decode_step(&d, np, (uint64_t)r + 1000);
            TRY("decode: free", kvhal_cache_manager_free(d.cm, &np, 1));
        }
    }
    /* pages never granted still hold the canary */
    memset(d.want, 0xA5, d.s.chunk);
    for (int32_t p = 0; p < total && !rc; p++)
        if (!granted[p])
            for (int32_t l = 0; l < opt.layers && !rc; l++)
                for (int kv = 0; kv < 2 && !rc; kv++) {
                    TRY("decode: read back", kvhal_memcpy_d2h(d.host, d.s.buf, chunk_at(&d.s, l, kv, p), d.s.chunk, NULL));
                    if (memcmp(d.host, d.want, d.s.chunk)) {
                        fprintf(stderr, TOOL ": error: page %d was never granted but was written\n", (int)p);
                        rc = 1;
                    }
                }
    /* nothing left in use: free what the test still holds, evict the rest, every page free */
    TRY("decode: free", kvhal_cache_manager_free(d.cm, all + total / 2 + 100, total - (total / 2 + 100)));
    kvhal_cache_manager_evict(d.cm, SIZE_MAX, NULL);
    TRY("decode: integrity", kvhal_cache_manager_check_integrity(d.cm));
    if (!rc && kvhal_cache_manager_num_free(d.cm) != total) {
        fprintf(stderr, TOOL ": error: %d of %d pages free at the end\n", (int)kvhal_cache_manager_num_free(d.cm),
                (int)total);
        rc = 1;
    }
    for (int r = 0; r < NREQ; r++) free(pages[r]);
    free(all);
    free(granted);
    rc |= decode_finish(&d);
    if (!opt.quiet && !opt.json)
        printf("self-test %-4s: %s (%d requests, %lld bytes verified, scattered pages on both sides, a decode step after each; "
               "path %s)\n", transports, rc ? "FAILED" : "ok", NREQ, (long long)bytes, path);
    return rc;
}

/* ---- the benchmark on one transport ---- */
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_one(const char *transports, bool *first)
{
    decode d = {0};
    int rc = decode_start(&d, transports, true);
    if (rc) {
        if (d.child > 0) kill(d.child, SIGKILL);
        decode_finish(&d);
        return rc;
    }
    const uint64_t pb = page_bytes();
    for (int si = 0; si < opt.nsizes && !rc; si++) {
        const int32_t n = (int32_t)(opt.sizes[si] / pb);
        if (n < 1) {
            fprintf(stderr, TOOL ": error: --sizes %llu is smaller than one page (%llu bytes)\n",
                    (unsigned long long)opt.sizes[si], (unsigned long long)pb);
            rc = 2;
            break;
        }
        const int W = opt.window;
        int32_t *pg = malloc((size_t)W * (size_t)n * sizeof *pg);
        double *lat = malloc((size_t)opt.iters * sizeof *lat);
        kvhal_xfer **xs = calloc((size_t)W, sizeof *xs);
        double *t0 = calloc((size_t)W, sizeof *t0);
        if (!pg || !lat || !xs || !t0) return failed("bench", KVHAL_OUT_OF_MEMORY);
        /* W disjoint scattered page sets */
        int32_t total = (int32_t)d.s.blocks;
        int32_t *all = malloc((size_t)total * sizeof *all);
        if (!all) return failed("bench", KVHAL_OUT_OF_MEMORY);
        for (int32_t i = 0; i < total; i++) all[i] = i;
        uint64_t seed = 99 + (uint64_t)si;
        shuffle(all, total, &seed);
        memcpy(pg, all, (size_t)W * (size_t)n * sizeof *pg);
        free(all);
        /* warm-up transfers (requests [0, warm)), then the timed ones, W in flight; then one more, untimed, whose
         * content the prefill side writes through kvhal first (thousands of small host->device writes, the
         * prefill's work, not the transfer's) and this side verifies. Latencies are those of requests
         * [warm, timed_end), whatever order they complete in; the bandwidth counts the iters completions after the
         * warm-th. */
        const int warm = bench_warm(), timed_end = opt.iters + warm, last = timed_end;
        int posted = 0, done = 0;
        double start = 0, stop = 0;
        const char *path = "";
        while (done < timed_end + 1 && !rc) {
            for (int w = 0; w < W && (posted < timed_end || (posted == last && done == timed_end)); w++)
                if (!xs[w]) {
                    t0[w] = now_s();
                    kvhal_status st = kvhal_xfer_post_receive(d.peer, (uint64_t)posted, pg + (size_t)w * n, n, NULL, &xs[w]);
                    if (st != KVHAL_OK) return failed("bench: post_receive", st);
                    posted++;
                }
            kvhal_xfer_event ev;
            TRY("bench: progress", kvhal_xfer_progress(d.ag, 1000, &ev));
            if (ev.type == KVHAL_XFER_EVENT_PEER_FAILED) return failed("bench: peer", ev.status);
            if (ev.type != KVHAL_XFER_EVENT_RECV_DONE) continue;
            int w = 0;
            while (w < W && xs[w] != ev.xfer) w++;
            if (w == W) continue;
            if (ev.status != KVHAL_OK) {
                fprintf(stderr, TOOL ": error: bench: %s\n", ev.message);
                rc = 1;
                break;
            }
            const double t = now_s();
            if (ev.request_id == (uint64_t)last) {
                if ((rc = verify(&d, ev.request_id, pg + (size_t)w * n, n))) break;
            } else if (ev.request_id >= (uint64_t)warm) {
                lat[ev.request_id - (uint64_t)warm] = t - t0[w];
            }
            path = kvhal_xfer_path(xs[w]);
            if (done == warm - 1) start = t;
            done++;
            if (done == timed_end) stop = t;
            kvhal_xfer_release(xs[w]);
            xs[w] = NULL;
        }
        const double elapsed = stop - start;
        for (int w = 0; w < W; w++) kvhal_xfer_release(xs[w]);
        if (!rc) {
            qsort(lat, (size_t)opt.iters, sizeof *lat, cmp_double);
            const double bytes = (double)n * (double)pb;
            /* iters transfers completed after the warm-up ones, W at a time */
            const double gbps = bytes * opt.iters / elapsed / 1e9;
            const double p50 = lat[opt.iters / 2] * 1e6, p99 = lat[(opt.iters * 99) / 100 < opt.iters ? (opt.iters * 99) / 100 : opt.iters - 1] * 1e6;
            const double p10 = lat[opt.iters / 10] * 1e6, p90 = lat[(opt.iters * 9) / 10] * 1e6, pmax = lat[opt.iters - 1] * 1e6;
            if (opt.json)
                fprintf(json_results, "%s\n  {\"transport\": \"%s\", \"bytes\": %.0f, \"pages\": %d, \"page_bytes\": %llu, "
                       "\"window\": %d, \"iters\": %d, \"gbps\": %.3f, \"us_per_transfer\": %.1f, \"p50_us\": %.1f, "
                       "\"p99_us\": %.1f, \"p10_us\": %.1f, \"p90_us\": %.1f, \"max_us\": %.1f, \"send_device\": \"%s\", "
                       "\"recv_device\": \"%s\", \"path\": \"%s\", \"offer\": %s}",
                       *first ? "" : ",", transports, bytes, (int)n, (unsigned long long)pb, W, opt.iters, gbps,
                       elapsed / opt.iters * 1e6, p50, p99, p10, p90, pmax, opt.send_dev, opt.recv_dev, path,
                       opt.offer ? "true" : "false");
            else
                printf("%-8s %9.0f KiB  %4d pages  %8.3f GB/s  %9.1f us/transfer  p50 %9.1f us  p99 %9.1f us  path %s%s\n",
                       transports, bytes / 1024, (int)n, gbps, elapsed / opt.iters * 1e6, p50, p99, path,
                       opt.offer ? " (offered)" : "");
            *first = false;
        }
        free(pg);
        free(lat);
        free(xs);
        free(t0);
    }
    rc |= decode_finish(&d);
    return rc;
}

/* ---- --stream: the decode side, one request at a time ---- */
/* The decode side's wait for the prefill process's times of the round just received (progressing meanwhile: the
 * acknowledgements of the last frames are still to go out). */
static int stream_report(decode *d, stream_round *r)
{
    size_t got = 0;
    const double until = now_s() + opt.timeout_ms / 1000.0;
    while (got < sizeof *r) {
        const ssize_t n = read(d->report_fd, (uint8_t *)r + got, sizeof *r - got);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0) return failed("bench: the prefill process closed its report pipe", KVHAL_PEER_FAILED);
        kvhal_xfer_event ev;
        TRY("bench: progress", kvhal_xfer_progress(d->ag, 1, &ev));
        if (now_s() > until) return failed("bench: no report from the prefill process", KVHAL_TIMEOUT);
    }
    r->path[sizeof r->path - 1] = '\0';
    return 0;
}

static int bench_stream(const char *transports, bool *first)
{
    decode d = {0};
    int rc = decode_start(&d, transports, true);
    const int32_t n = opt.tokens / opt.block, warm = 2, last = opt.iters + warm;
    int32_t *pg = rc ? NULL : malloc((size_t)d.s.blocks * sizeof *pg);
    double *pre = calloc((size_t)opt.iters, sizeof *pre), *exp = calloc((size_t)opt.iters, sizeof *exp);
    double *first_layer = calloc((size_t)opt.iters, sizeof *first_layer);
    if (!rc && (!pg || !pre || !exp || !first_layer)) rc = failed("bench", KVHAL_OUT_OF_MEMORY);
    if (!rc && n > (int32_t)d.s.blocks) rc = failed("bench: --tokens past the cache", KVHAL_OUT_OF_RANGE);
    uint64_t seed = 5;
    char path[8] = "";
    for (int32_t r = 0; r <= last && !rc; r++) {
        for (int32_t i = 0; i < (int32_t)d.s.blocks; i++) pg[i] = i;
        shuffle(pg, (int32_t)d.s.blocks, &seed);
        kvhal_xfer *rx;
        const double t_post = now_s();
        TRY("bench: post_receive_layers", kvhal_xfer_post_receive_layers(d.peer, (uint64_t)r, pg, n, NULL, &rx));
        int32_t layers = 0;
        double t_first = 0;
        for (bool done = false; !done && !rc;) {
            kvhal_xfer_event ev;
            TRY("bench: progress", kvhal_xfer_progress(d.ag, 1000, &ev));
            if (ev.type == KVHAL_XFER_EVENT_PEER_FAILED) rc = failed("bench: peer", ev.status);
            if (ev.xfer != rx) continue;
            if (ev.type == KVHAL_XFER_EVENT_LAYER_DONE && !layers++) t_first = now_s();
            if (ev.type != KVHAL_XFER_EVENT_RECV_DONE) continue;
            done = true;
            if (ev.status != KVHAL_OK) {
                fprintf(stderr, TOOL ": error: bench: %s\n", ev.message);
                rc = 1;
            } else if (layers != opt.layers) {
                fprintf(stderr, TOOL ": error: bench: %d layer events for %d layers\n", (int)layers, (int)opt.layers);
                rc = 1;
            }
        }
        if (!rc && r == last) rc = verify(&d, (uint64_t)r, pg, n);
        kvhal_xfer_release(rx);
        stream_round sr;
        if (!rc) rc = stream_report(&d, &sr);
        if (!rc && r >= warm && r < last) {
            pre[r - warm] = sr.prefill_s;
            exp[r - warm] = sr.exposed_s;
            first_layer[r - warm] = t_first - t_post;
        }
        if (!rc) memcpy(path, sr.path, sizeof path);
    }
    if (!rc) {
        qsort(pre, (size_t)opt.iters, sizeof *pre, cmp_double);
        qsort(exp, (size_t)opt.iters, sizeof *exp, cmp_double);
        qsort(first_layer, (size_t)opt.iters, sizeof *first_layer, cmp_double);
        const int it = opt.iters, p90 = (it * 9) / 10 < it ? (it * 9) / 10 : it - 1;
        const double bytes = (double)n * (double)page_bytes(), pre50 = pre[it / 2], exp50 = exp[it / 2];
        if (opt.json)
            fprintf(json_results, "%s\n  {\"transport\": \"%s\", \"mode\": \"stream\", \"prefill\": \"%s\", "
                    "\"layers\": %d, \"tokens\": %d, \"pages\": %d, \"bytes\": %.0f, \"layer_us\": %d, "
                    "\"iters\": %d, \"prefill_ms_p50\": %.3f, \"exposed_ms_p50\": %.3f, \"exposed_ms_p90\": %.3f, "
                    "\"exposed_ms_max\": %.3f, \"exposed_of_prefill_p50\": %.4f, \"first_layer_ms_p50\": %.3f, "
                    "\"send_device\": \"%s\", \"recv_device\": \"%s\", \"path\": \"%s\"}",
                    *first ? "" : ",", transports, opt.prefill_mode, (int)opt.layers, (int)opt.tokens, (int)n, bytes,
                    (int)opt.layer_us, it, pre50 * 1e3, exp50 * 1e3, exp[p90] * 1e3, exp[it - 1] * 1e3,
                    exp50 / pre50, first_layer[it / 2] * 1e3, opt.send_dev, opt.recv_dev, path);
        else
            printf("%-8s stream %6.1f MiB  %d layers x %d us (%s)  prefill %8.3f ms  exposed p50 %7.3f ms "
                   "p90 %7.3f ms (%.1f%% of prefill)  first layer %7.3f ms  path %s\n",
                   transports, bytes / (1 << 20), (int)opt.layers, (int)opt.layer_us, opt.prefill_mode, pre50 * 1e3,
                   exp50 * 1e3, exp[p90] * 1e3, 100 * exp50 / pre50, first_layer[it / 2] * 1e3, path);
        *first = false;
    }
    free(pg);
    free(pre);
    free(exp);
    free(first_layer);
    rc |= decode_finish(&d);
    return rc;
}

static void usage(void)
{
    printf("usage: " TOOL " [--self-test] [options]\n"
           "Runs a decode process and a prefill process that sends it requests' K/V pages over UCX.\n"
           "  --self-test            loopback over tcp and shm, CPU caches, every byte verified; exit 0 only if all holds\n"
           "  --transport=LIST       UCX transports, repeatable (default: tcp and shm; any UCX_TLS value)\n"
           "  --sizes=LIST           benchmark batch sizes (default 256KiB,1MiB,4MiB,16MiB)\n"
           "  --iters=N              timed transfers per size (default 40), --window=N in flight (default 4);\n"
           "                         first as many untimed ones as are in flight (at least 4)\n"
           "  --layers=N --heads=N --dim=N --block=N   cache geometry (default 4 x 8 x 128, 16-token pages, bf16)\n"
           "  --send-device=DEV --recv-device=DEV      the two caches' devices (default cpu)\n"
           "  --ipc                  the prefill cache shareable (kvhal_paged_cache_create_shareable): on one host the\n"
           "                         decode side imports it and copies pages device to device (CUDA/HIP IPC; POSIX\n"
           "                         shared memory for cpu); the self-test then fails unless every request took that path\n"
           "  --offer                benchmark on the IPC or CMA path: the prefill offers each request's pages ahead\n"
           "                         (kvhal_xfer_offer_pages), the decode side's receives take them without a grant\n"
           "  --stream               benchmark: one request at a time streamed layer by layer (kvhal_xfer_stream_open)\n"
           "                         while the prefill process simulates each layer's compute; reports the transfer\n"
           "                         time left after the last layer (exposed) against the prefill time\n"
           "  --tokens=N             --stream: tokens of a request (default 4096)\n"
           "  --layer-us=N           --stream: simulated prefill time per layer (default 1000)\n"
           "  --prefill=MODE         --stream: busy (the thread spins, progressing the agent; default), sleep (the\n"
           "                         thread sleeps: nothing progresses meanwhile), device (work on the cache's device\n"
           "                         calibrated to --layer-us, an event per layer handed with it: the device computes\n"
           "                         while the agent sends; CUDA/HIP: a spin kernel on the default stream, other\n"
           "                         devices: copies within a 16 MiB scratch buffer)\n"
           "  --timeout-ms=N         agent timeout (default 10000)\n"
           "  --listen=FILE          decode side only: write the address to FILE, wait for a --connect process\n"
           "  --connect=FILE         prefill side only: connect to the decode process whose address is in FILE\n"
           "                         (same --self-test, sizes, geometry and --transport on both sides; the agents\n"
           "                         listen on loopback: for two hosts set UCX_NET_DEVICES, e.g. to a private\n"
           "                         interface, on both)\n"
           "  -j, --json             one JSON object on stdout;  -q, --quiet: no progress\n"
           "  -h, --help             this text;  -V, --version: \"kvhal-xfer <kvhal version>\"\n"
           "Exit: 0 success, 1 a run or a verification failed or output was lost (a full disk, a closed stdout),\n"
           "2 usage error.\n");
}

static bool parse_size(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return false;
    if (!strcmp(end, "KiB") || !strcmp(end, "K")) v <<= 10;
    else if (!strcmp(end, "MiB") || !strcmp(end, "M")) v <<= 20;
    else if (!strcmp(end, "GiB") || !strcmp(end, "G")) v <<= 30;
    else if (*end) return false;
    *out = v;
    return v > 0;
}

static int usage_error(const char *msg, const char *arg)
{
    return tool_usage_error(TOOL, "%s '%s'", msg, arg ? arg : "");
}

/* Reads the command line into opt; returns -1 to go on, else the exit status (--help, --version, an error). */
static int parse_options(int argc, char **argv)
{
    static const struct option lo[] = {
        {"self-test", no_argument, 0, 's'}, {"transport", required_argument, 0, 't'},
        {"sizes", required_argument, 0, 'z'}, {"iters", required_argument, 0, 'i'},
        {"window", required_argument, 0, 'w'}, {"layers", required_argument, 0, 'L'},
        {"heads", required_argument, 0, 'H'}, {"dim", required_argument, 0, 'D'},
        {"block", required_argument, 0, 'B'}, {"send-device", required_argument, 0, 'S'},
        {"recv-device", required_argument, 0, 'R'}, {"timeout-ms", required_argument, 0, 'T'},
        {"json", no_argument, 0, 'j'}, {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'}, {"listen", required_argument, 0, 'l'},
        {"connect", required_argument, 0, 'c'}, {"child", no_argument, 0, 'C'}, {"ipc", no_argument, 0, 'I'}, {"offer", no_argument, 0, 'O'},
        {"stream", no_argument, 0, 'M'}, {"tokens", required_argument, 0, 'K'}, {"layer-us", required_argument, 0, 'U'},
        {"prefill", required_argument, 0, 'P'}, {"stream-report", required_argument, 0, 'r'},
        {0, 0, 0, 0}};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hVjq", lo, NULL)) != -1) {
        long v = 0;
        char *end = NULL;
        if (strchr("iwLHDBTKUr", c)) {
            v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 100000000) return usage_error("not a positive number:", optarg);
        }
        switch (c) {
        case 's': opt.self_test = true; break;
        case 't':
            if (opt.ntransports == 8) return usage_error("at most 8 --transport values", optarg);
            opt.transports[opt.ntransports++] = optarg;
            break;
        case 'z': {
            opt.nsizes = 0;
            char *dup = strdup(optarg), *save = NULL;
            for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (opt.nsizes == 16 || !parse_size(tok, &opt.sizes[opt.nsizes])) {
                    free(dup);
                    return usage_error("bad --sizes entry", tok);
                }
                opt.nsizes++;
            }
            free(dup);
            break;
        }
        case 'i': opt.iters = (int)v; break;
        case 'w': opt.window = v > 64 ? 64 : (int)v; break;
        case 'L': opt.layers = (int32_t)v; break;
        case 'H': opt.heads = (int32_t)v; break;
        case 'D': opt.dim = (int32_t)v; break;
        case 'B': opt.block = (int32_t)v; break;
        case 'S': opt.send_dev = optarg; break;
        case 'R': opt.recv_dev = optarg; break;
        case 'T': opt.timeout_ms = (uint32_t)v; break;
        case 'j': opt.json = true; break;
        case 'l': opt.listen_file = optarg; break;
        case 'c': opt.connect_file = optarg; break;
        case 'C': opt.child = true; break;
        case 'I': opt.ipc = true; break;
        case 'O': opt.offer = true; break;
        case 'M': opt.stream = true; break;
        case 'K': opt.tokens = (int32_t)v; break;
        case 'U': opt.layer_us = (int32_t)v; break;
        case 'r': opt.report_fd = (int)v; break;
        case 'P':
            if (strcmp(optarg, "busy") && strcmp(optarg, "sleep") && strcmp(optarg, "device"))
                return usage_error("--prefill is busy, sleep or device:", optarg);
            opt.prefill_mode = optarg;
            break;
        case 'q': opt.quiet = true; break;
        case 'h': usage(); return 0;
        case 'V': tool_print_version(TOOL); return 0;
        default: return usage_error("unknown or incomplete option", argv[optind - 1]);
        }
    }
    if (optind < argc) return usage_error("unexpected argument", argv[optind]);
    return -1;
}

static int run(int argc, char **argv);

int main(int argc, char **argv)
{
    tool_stdout_guard();
    return tool_exit(TOOL, run(argc, argv));
}

static int run(int argc, char **argv)
{
    g_argc = argc;
    g_argv = argv;
    const int prc = parse_options(argc, argv);
    if (prc >= 0) return prc;
    if (!opt.ntransports) {
        opt.transports[0] = "tcp";
        opt.transports[1] = "shm";
        opt.ntransports = 2;
    }
    if (!opt.nsizes) {
        const uint64_t d[] = {256 << 10, 1 << 20, 4 << 20, 16 << 20};
        memcpy(opt.sizes, d, sizeof d);
        opt.nsizes = 4;
    }
    signal(SIGPIPE, SIG_IGN);
    if (opt.listen_file && opt.connect_file) return usage_error("--listen and --connect are the two sides:", "both");
    if (opt.stream && opt.listen_file)
        return usage_error("--stream: the prefill process is started by this one (its times come back on a pipe):",
                           "--listen");
    if (opt.stream && opt.offer) return usage_error("--stream streams into granted pages:", "--offer");
    if (opt.stream && !opt.self_test) { /* one request of --tokens: the caches hold it */
        if (opt.tokens % opt.block) return usage_error("--tokens is not a multiple of --block:", "--tokens");
        opt.sizes[0] = (uint64_t)(opt.tokens / opt.block) * page_bytes();
        opt.nsizes = 1;
        opt.window = 1;
    }
    if (opt.child) opt.json = false;
    if (!opt.self_test)
        for (int i = 0; i < opt.nsizes; i++)
            if (opt.sizes[i] < page_bytes()) {
                char b[64];
                snprintf(b, sizeof b, "%llu < %llu", (unsigned long long)opt.sizes[i], (unsigned long long)page_bytes());
                return usage_error("a --sizes entry is smaller than one page of the cache geometry:", b);
            }
    if (opt.listen_file && opt.ntransports > 1) opt.ntransports = 1; /* one run with a separately started process */
    int rc = 0;
    if (opt.self_test) /* small pages: 3 layers x 2 heads x 16 dims x 16 tokens f16 = 6 KiB a page */
        opt.layers = 3, opt.heads = 2, opt.dim = 16, opt.dtype = KVHAL_F16;
    if (opt.connect_file) { /* the prefill side of a --listen decode process: wait for its address file */
        int fd = -1;
        const double until = now_s() + opt.timeout_ms / 1000.0;
        while ((fd = open(opt.connect_file, O_RDONLY)) < 0 && now_s() < until) usleep(10000);
        if (fd < 0) return failed("--connect: no address file", KVHAL_TIMEOUT);
        rc = prefill(opt.transports[opt.ntransports - 1], fd, !opt.self_test); /* the last one given */
        close(fd);
        return rc ? 1 : 0;
    }
    if (opt.self_test) {
        for (int t = 0; t < opt.ntransports; t++) rc |= self_test_one(opt.transports[t]);
        if (opt.json && !rc) {
            tool_json j;
            tool_json_init(&j, stdout);
            tool_json_head(&j, TOOL, true);
            tool_json_key_str(&j, "self_test", "passed");
            tool_json_close(&j);
        }
        if (rc) fail_json("KVHAL_INTEGRITY", "the self-test failed (see stderr)");
        return rc ? 1 : 0;
    }
    char *rows = NULL;
    size_t rows_len = 0;
    if (opt.json && !(json_results = open_memstream(&rows, &rows_len))) return failed("json", KVHAL_OUT_OF_MEMORY);
    bool first = true;
    for (int t = 0; t < opt.ntransports && !rc; t++)
        rc |= opt.stream ? bench_stream(opt.transports[t], &first) : bench_one(opt.transports[t], &first);
    if (opt.json) {
        fclose(json_results);
        if (!rc) {
            tool_json j;
            tool_json_init(&j, stdout);
            tool_json_head(&j, TOOL, true);
            tool_json_open_array(&j, "results");
            fprintf(stdout, "%s\n", rows ? rows : "");
            tool_json_close_array(&j);
            tool_json_close(&j);
        } else
            fail_json(rc == 2 ? "KVHAL_INVALID_ARGUMENT" : "KVHAL_INTEGRITY", "the benchmark failed (see stderr)");
        free(rows);
    }
    return rc == 2 ? 2 : rc ? 1 : 0;
}

/* kvhal-bench — bandwidth of kvhal's ops on the device KVHAL_DEVICE (or --device) selects, each next to the same
 * device's own memcpy_d2d of the same bytes measured in the same rounds: paged caching (model presets, token
 * counts, NHD/HND, same-dtype caches and every fp8 format at a power-of-two and a calibrated scale), MLA caching
 * (576-dim latent rows), a serving loop whose token count changes on every call (host time per call, descriptors
 * created) beside a fixed-count loop, decode-sized calls (host time per call and GPU time per call separately),
 * kv-cache duplicate, copy_blocks, the descriptor cache (ns per hit), the host time of a call on a descriptor hit,
 * and the first call of a process next to a cached one. Public API only, so it runs on cpu, cuda:N, hip:N,
 * opencl:N and any vendor's device.
 *
 * How it measures (as an outside harness would):
 * - cold (the headline column on devices other than the CPU): the L2 is flushed before every timed op by a memset
 *   of a buffer larger than any GPU's L2 (256 MiB), and paged-caching slots are a random permutation of the slots
 *   of a cache --cache-factor (4) times the token count, so the writes scatter over a large cache. The public API
 *   has no device events, so the time of an op is measured as the difference of two back-to-back sequences on
 *   the device's stream, N x (flush, op) and N x (flush), each closed by one synchronize: launch costs overlap
 *   with the device's work as they do in a serving loop, and the flush's own time cancels. The memcpy reference
 *   is measured the same way in the same rounds. An op no longer than twice the flush's own variation cannot be
 *   told from noise that way: it is measured again with more ops per sequence, and if still unresolved reported
 *   as not measured (null, "-").
 * - warm: the same op repeated back to back (inputs and cache in L2 where they fit), timed over many calls.
 * - samples: every figure is the median (p50) of repeated samples, with p90, p99 and the spread (p90 - p10) / p50;
 *   ops shorter than 20 us take more samples until the median moves by less than 0.5% (at most 101).
 * Bandwidth = (bytes read + bytes written) / time; the memcpy of the same device moves the same total.
 *
 * Output: a table, or with --json one object {"ok", "tool", "version", "device", "records": [...]} where every
 * figure not measured is null; on failure {"ok": false, "error": {"status", "message"}} (exit status 1); with
 * --csv FILE also one CSV row per record (empty for what was not measured). Progress (steps done, rows, elapsed
 * time and ETA) on stderr unless --quiet or --json. */
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvhal.h"
#include "tool_common.h"
#include "kvhal_backend.h" /* the GPU modules' copy ceiling (kvhal_gpu_scatter_rows) */
#define TOOL "kvhal-bench"

/* ---- options and output ---- */

typedef struct preset {
    const char *name;
    int32_t heads, dim;
    kvhal_dtype dtype;
} preset;

static const preset presets[] = {
    {"llama3-8b", 8, 128, KVHAL_BF16},
    {"llama2-7b", 32, 128, KVHAL_F16},
    {"small", 2, 64, KVHAL_F32},
};
#define NUM_PRESETS (int)(sizeof presets / sizeof presets[0])

static struct {
    bool quick, json, no_cold, warm_only_set, quiet;
    const char *csv_path; /* --csv */
    const char *preset; /* NULL = all */
    const char *op;     /* NULL = all */
    const char *device; /* NULL = KVHAL_DEVICE */
    int64_t tokens[8];
    int ntokens;
    int cache_factor;
    bool block_slots; /* --slots=blocks: whole blocks in random order, filled from their start (an engine's usual
                         assignment) instead of a permutation of single slots */
    float scale; /* the calibrated scale of the fp8 rows */
    bool tokens_given;
} opt = {.cache_factor = 4, .scale = 0.37f};

static kvhal_device dev;
static char dev_name[32];
static bool cold_on; /* cold rows are measured (not on the CPU device, not with --no-cold) */

/* JSON records accumulate in memory (jmem) and are printed at the end, so that a failure prints one error object
 * instead. */
static char *jbuf;
static size_t jlen;
static FILE *jmem;
static tool_json jrec;
static int nrecords;
static FILE *csv;

/* A failed call: the message on stderr, the error object on stdout with --json, exit status 1. */
static void fail_run(kvhal_status st, const char *what, const char *msg)
{
    tool_error(TOOL, "%s: %s (%s)", what, msg, kvhal_status_name(st));
    if (opt.json) {
        char m[2048];
        snprintf(m, sizeof m, "%s: %s", what, msg);
        tool_json_failure(stdout, TOOL, kvhal_status_name(st), m);
    }
    fflush(stdout);
    exit(TOOL_EXIT_FAILED);
}

#define CHECK(expr)                                                                                             \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_run(st_, #expr, kvhal_last_error());                                          \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) fail_run(KVHAL_OUT_OF_MEMORY, "malloc", "out of host memory");
    return p;
}

/* One measured column: p50 / p90 / p99 seconds per call, spread, GB/s and the memcpy's GB/s. */
typedef struct meas {
    bool valid;
    double p50, p90, p99, spread, gbps, memcpy_gbps, ratio;
} meas;

typedef struct record {
    const char *op, *preset, *layout;
    int64_t tokens;
    kvhal_dtype dtype, cache_dtype;
    float scale;   /* fp8 scale; 0 = not fp8 (null) */
    double bytes;  /* read + written per call; 0 for per-call figures */
    meas cold, warm;
    double host_us, gpu_us, ns; /* < 0: not measured (null) */
    double of_ceiling;          /* the row's cold (else warm) ratio to memcpy over its ceiling row's; < 0: null */
    int64_t descriptors_created; /* < 0: null */
    int form;                    /* a ceiling row's copy form (kvhal_gpu_scatter_rows_form); < 0: null */
} record;

static record rec_init(const char *op, const char *preset_name, const char *layout, int64_t tokens, kvhal_dtype dt,
                       kvhal_dtype cdt)
{
    record r = {.op = op, .preset = preset_name, .layout = layout, .tokens = tokens, .dtype = dt, .cache_dtype = cdt,
                .host_us = -1, .gpu_us = -1, .ns = -1, .of_ceiling = -1, .descriptors_created = -1, .form = -1};
    return r;
}

static void jmeas(const char *key, const meas *m)
{
    if (!m->valid) {
        tool_json_key_str(&jrec, key, NULL);
        return;
    }
    tool_json_open(&jrec, key);
    tool_json_key_num(&jrec, "us_p50", m->p50 * 1e6, true);
    tool_json_key_num(&jrec, "us_p90", m->p90 * 1e6, true);
    tool_json_key_num(&jrec, "us_p99", m->p99 * 1e6, true);
    tool_json_key_num(&jrec, "spread", m->spread, true);
    tool_json_key_num(&jrec, "gbps", m->gbps, m->gbps > 0);
    tool_json_key_num(&jrec, "memcpy_gbps", m->memcpy_gbps, m->memcpy_gbps > 0);
    tool_json_key_num(&jrec, "ratio_to_memcpy", m->ratio, m->ratio > 0);
    tool_json_close(&jrec);
}

/* A CSV field: the number, or nothing when not measured. */
static void cnum(double v, bool valid)
{
    fputc(',', csv);
    if (valid && isfinite(v)) fprintf(csv, "%.9g", v);
}

static void csv_meas(const meas *m)
{
    cnum(m->p50 * 1e6, m->valid);
    cnum(m->p90 * 1e6, m->valid);
    cnum(m->p99 * 1e6, m->valid);
    cnum(m->spread, m->valid);
    cnum(m->gbps, m->valid && m->gbps > 0);
    cnum(m->memcpy_gbps, m->valid && m->memcpy_gbps > 0);
    cnum(m->ratio, m->valid && m->ratio > 0);
}

static void csv_row(const record *r)
{
    if (nrecords == 0)
        fprintf(csv, "op,preset,tokens,layout,dtype,cache_dtype,scale,bytes,cold_us_p50,cold_us_p90,cold_us_p99,"
                "cold_spread,cold_gbps,cold_memcpy_gbps,cold_ratio,warm_us_p50,warm_us_p90,warm_us_p99,warm_spread,"
                "warm_gbps,warm_memcpy_gbps,warm_ratio,host_us,gpu_us,ns,descriptors_created\n");
    fprintf(csv, "%s,%s,%lld,%s,%s,%s", r->op, r->preset, (long long)r->tokens, r->layout, kvhal_dtype_name(r->dtype),
            kvhal_dtype_name(r->cache_dtype));
    cnum(r->scale, r->scale > 0);
    cnum(r->bytes, r->bytes > 0);
    csv_meas(&r->cold);
    csv_meas(&r->warm);
    cnum(r->host_us, r->host_us >= 0);
    cnum(r->gpu_us, r->gpu_us >= 0);
    cnum(r->ns, r->ns >= 0);
    cnum((double)r->descriptors_created, r->descriptors_created >= 0);
    fputc('\n', csv);
}

static void fill_bw(meas *m, double bytes)
{
    if (!m->valid || bytes <= 0) return;
    m->gbps = bytes / m->p50 / 1e9;
    m->ratio = m->memcpy_gbps > 0 ? m->gbps / m->memcpy_gbps : 0;
}

static void table_meas(const meas *m)
{
    if (!m->valid) {
        printf(" %10s %8s %6s", "-", "-", "-");
        return;
    }
    printf(" %8.1fus", m->p50 * 1e6);
    if (m->gbps > 0) printf(" %8.1f", m->gbps);
    else printf(" %8s", "-");
    if (m->ratio > 0) printf(" %6.3f", m->ratio); /* 0: the copy beside it was not resolved */
    else printf(" %6s", "-");
}

static void emit(record *r)
{
    fill_bw(&r->cold, r->bytes);
    fill_bw(&r->warm, r->bytes);
    if (csv) csv_row(r);
    if (opt.json) {
        tool_json_open(&jrec, NULL);
        tool_json_key_str(&jrec, "op", r->op);
        tool_json_key_str(&jrec, "preset", r->preset);
        tool_json_key_int(&jrec, "tokens", (long long)r->tokens);
        tool_json_key_str(&jrec, "layout", r->layout);
        tool_json_key_str(&jrec, "dtype", kvhal_dtype_name(r->dtype));
        tool_json_key_str(&jrec, "cache_dtype", kvhal_dtype_name(r->cache_dtype));
        tool_json_key_num(&jrec, "scale", r->scale, r->scale > 0);
        tool_json_key_num(&jrec, "bytes", r->bytes, r->bytes > 0);
        jmeas("cold", &r->cold);
        jmeas("warm", &r->warm);
        tool_json_key_num(&jrec, "host_us", r->host_us, r->host_us >= 0);
        tool_json_key_num(&jrec, "gpu_us", r->gpu_us, r->gpu_us >= 0);
        tool_json_key_num(&jrec, "ns", r->ns, r->ns >= 0);
        tool_json_key_num(&jrec, "ratio_to_ceiling", r->of_ceiling, r->of_ceiling > 0);
        tool_json_key_num(&jrec, "descriptors_created", (double)r->descriptors_created, r->descriptors_created >= 0);
        tool_json_key_num(&jrec, "ceiling_form", r->form, r->form >= 0);
        tool_json_close(&jrec);
    } else {
        if (nrecords == 0)
            printf("%-17s %-11s %7s %-6s %-5s %-12s %6s | %10s %8s %6s | %10s %8s %6s %7s | %s\n", "op", "preset",
                   "tokens", "layout", "dtype", "cache", "scale", "cold p50", "GB/s", "ratio", "warm p50", "GB/s",
                   "ratio", "spread", "other");
        char sc[16] = "-";
        if (r->scale > 0) snprintf(sc, sizeof sc, "%g", (double)r->scale);
        printf("%-17s %-11s %7lld %-6s %-5s %-12s %6s |", r->op, r->preset, (long long)r->tokens, r->layout,
               kvhal_dtype_name(r->dtype), kvhal_dtype_name(r->cache_dtype), sc);
        table_meas(&r->cold);
        printf(" |");
        table_meas(&r->warm);
        if (r->warm.valid) printf(" %7.3f", r->warm.spread);
        else printf(" %7s", "-");
        printf(" |");
        if (r->host_us >= 0) printf(" host %.2f us", r->host_us);
        if (r->gpu_us >= 0) printf(" gpu %.2f us", r->gpu_us);
        if (r->ns >= 0) printf(" %.1f ns", r->ns);
        if (r->of_ceiling > 0) printf(" of ceiling %.3f", r->of_ceiling);
        if (r->descriptors_created >= 0) printf(" descriptors %lld", (long long)r->descriptors_created);
        if (r->form >= 0) printf(" form %d", r->form);
        printf("\n");
        fflush(stdout);
    }
    nrecords++;
}

/* ---- timing ---- */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*op_fn)(void *ctx);

#define MAX_SAMPLES 101

/* p50 / p90 / p99 and (p90 - p10) / p50 of n samples (sorted here). */
static meas stats_of(double *v, int n)
{
    meas m = {.valid = n > 0};
    if (n <= 0) return m;
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    const int i10 = (int)floor(0.1 * (n - 1)), i90 = (int)ceil(0.9 * (n - 1)), i99 = (int)ceil(0.99 * (n - 1));
    m.p50 = v[n / 2];
    m.p90 = v[i90];
    m.p99 = v[i99];
    m.spread = m.p50 > 0 ? (v[i90] - v[i10]) / m.p50 : 0;
    return m;
}

static double median_of(const double *v, int n)
{
    double tmp[MAX_SAMPLES];
    memcpy(tmp, v, (size_t)n * sizeof *v);
    qsort(tmp, (size_t)n, sizeof tmp[0], cmp_double);
    return tmp[n / 2];
}

/* A timed function and how many back-to-back calls make one sample of it. */
typedef struct timed {
    op_fn fn;
    void *ctx;
    double one; /* seconds of the warmup call */
    long inner;
    double samples[MAX_SAMPLES];
} timed;

static double sample(timed *t)
{
    double t0 = now();
    for (long i = 0; i < t->inner; i++) t->fn(t->ctx);
    CHECK(kvhal_device_synchronize(dev));
    return (now() - t0) / (double)t->inner;
}

/* Warm: seconds per call of a (and of b), samples of the two alternating so that on a shared machine both see the
 * same interference. Short ops run several calls per sample; ops under 20 us take samples until the median is
 * stable (moves < 0.5% over five more samples). */
static void measure_warm_pair(op_fn a, void *actx, op_fn b, void *bctx, meas *ma, meas *mb)
{
    const double sample_target = opt.quick ? 2e-4 : 2e-3, total_target = opt.quick ? 0.03 : 0.2;
    static timed t[2];
    t[0] = (timed){.fn = a, .ctx = actx};
    t[1] = (timed){.fn = b, .ctx = bctx};
    const int n = b ? 2 : 1;
    double per_rep = 0, longest = 0, shortest = 1e30;
    for (int i = 0; i < n; i++) {
        /* an untimed first call absorbs one-time costs (descriptor creation, an OpenCL program build, lazy
         * allocation by the driver) */
        t[i].fn(t[i].ctx);
        CHECK(kvhal_device_synchronize(dev));
        double t0 = now();
        t[i].fn(t[i].ctx);
        CHECK(kvhal_device_synchronize(dev));
        t[i].one = now() - t0;
        if (t[i].one < 1e-7) t[i].one = 1e-7;
        t[i].inner = (long)(sample_target / t[i].one) + 1;
        per_rep += t[i].one * (double)t[i].inner;
        if (t[i].one > longest) longest = t[i].one;
        if (t[i].one < shortest) shortest = t[i].one;
    }
    int reps = (int)(total_target / per_rep), first = 0;
    if (reps < 5) reps = 5;
    if (reps > 31) reps = 31;
    if (longest > total_target) {
        /* long ops: the warmup calls count as samples; past half a second three samples are all the run affords */
        for (int i = 0; i < n; i++) t[i].samples[0] = t[i].one;
        first = 1;
        reps = 3;
    }
    for (int r = first; r < reps; r++)
        for (int i = 0; i < n; i++) t[i].samples[r] = sample(&t[i]);
    if (shortest < 20e-6) {
        double prev = median_of(t[0].samples, reps);
        while (reps + 5 <= MAX_SAMPLES) {
            for (int r = reps; r < reps + 5; r++)
                for (int i = 0; i < n; i++) t[i].samples[r] = sample(&t[i]);
            reps += 5;
            const double cur = median_of(t[0].samples, reps);
            if (fabs(cur - prev) <= 0.005 * cur) break;
            prev = cur;
        }
    }
    *ma = stats_of(t[0].samples, reps);
    if (b) *mb = stats_of(t[1].samples, reps);
}

/* ---- cold: the L2 flushed before every timed op ---- */

#define FLUSH_BYTES ((size_t)256 << 20)
static kvhal_buffer *flush_buf;
static unsigned flush_value;

static void run_flush(void)
{
    CHECK(kvhal_memset(flush_buf, 0, (int)(++flush_value & 0xff), FLUSH_BYTES, NULL));
}

/* Seconds of n x (flush, fn) back to back, one synchronize at the end (fn NULL: n flushes). */
static double flushed_run(op_fn fn, void *ctx, long n)
{
    CHECK(kvhal_device_synchronize(dev));
    double t0 = now();
    for (long i = 0; i < n; i++) {
        run_flush();
        if (fn) fn(ctx);
    }
    CHECK(kvhal_device_synchronize(dev));
    return now() - t0;
}

/* One cold measurement of a (and b) at n calls per sequence, over `rounds` rounds; a result that the flush's own
 * variation could hide comes back not valid. */
static void cold_rounds(op_fn a, void *actx, op_fn b, void *bctx, long n, int rounds, meas *ma, meas *mb)
{
    double sa[MAX_SAMPLES], sb[MAX_SAMPLES], sf[MAX_SAMPLES];
    for (int r = 0; r < rounds; r++) {
        const double xa = flushed_run(a, actx, n), xf = flushed_run(NULL, NULL, n);
        const double xb = b ? flushed_run(b, bctx, n) : 0;
        sa[r] = (xa - xf) / (double)n;
        sb[r] = (xb - xf) / (double)n;
        sf[r] = xf / (double)n;
        if (sa[r] < 1e-9) sa[r] = 1e-9; /* noise larger than the op: a floor rather than a negative time */
        if (sb[r] < 1e-9) sb[r] = 1e-9;
    }
    *ma = stats_of(sa, rounds);
    if (b) *mb = stats_of(sb, rounds);
    /* An op that the flush's own variation (p90 - p10 of the flush-only sequences) could hide is not resolved by
     * the difference: reported as not measured (null) rather than as a number made of noise. */
    const meas f = stats_of(sf, rounds);
    const double noise = f.spread * f.p50;
    if (ma->p50 <= 2 * noise) ma->valid = false;
    if (b && mb->p50 <= 2 * noise) mb->valid = false;
}

/* Cold: per round, N x (flush, a), N x (flush), N x (flush, b); an op's sample is its sequence minus the flushes',
 * over N. N makes a sequence last about a millisecond (at least 1, at most 64). Part of a sequence's variation does
 * not grow with N (the host's side: the enqueues, the wake-up from the closing synchronize), and at 1 ms it did not
 * always stay under a 10-30 us op (on NVIDIA's OpenCL, rows of 8192 tokens and MLA rows came out unresolved,
 * "-", or with a ratio of 0.000 where only the copy beside them was). An unresolved result is measured again with
 * 4x, then 16x the calls per sequence (a sequence of at most about 25 ms), which divides that part per op by as
 * much; one still unresolved stays null. */
static void measure_cold_pair(op_fn a, void *actx, op_fn b, void *bctx, meas *ma, meas *mb)
{
    if (!flush_buf) {
        CHECK(kvhal_buffer_create(dev, FLUSH_BYTES, &flush_buf));
        run_flush();
    }
    a(actx);
    if (b) b(bctx);
    const double tf = flushed_run(NULL, NULL, 1), ta = flushed_run(a, actx, 1) - tf;
    double tb = b ? flushed_run(b, bctx, 1) - tf : 0;
    double per = tf + (ta > tb ? ta : tb);
    long n = (long)(1e-3 / (per > 1e-7 ? per : 1e-7));
    if (n < 1) n = 1;
    if (n > 64) n = 64;
    const int rounds = opt.quick ? 5 : (per > 0.05 ? 5 : 15);
    cold_rounds(a, actx, b, bctx, n, rounds, ma, mb);
    for (int retry = 0; retry < 2 && (!ma->valid || (b && !mb->valid)); retry++) {
        const long n2 = n * 4 > 1024 ? 1024 : n * 4;
        if (n2 == n || (double)n2 * per > 0.025) break;
        n = n2;
        cold_rounds(a, actx, b, bctx, n, rounds, ma, mb);
    }
}

/* ---- memcpy reference ---- */

typedef struct copy_ctx {
    kvhal_buffer *dst, *src;
    size_t bytes;
} copy_ctx;

static void run_memcpy(void *p)
{
    copy_ctx *c = p;
    CHECK(kvhal_memcpy_d2d(c->dst, 0, c->src, 0, c->bytes, NULL));
}

static kvhal_buffer *scratch_a, *scratch_b;
static size_t scratch_size;

static void release_scratch(void)
{
    if (scratch_a) CHECK(kvhal_buffer_destroy(scratch_a));
    if (scratch_b) CHECK(kvhal_buffer_destroy(scratch_b));
    scratch_a = scratch_b = NULL;
    scratch_size = 0;
}

/* r->cold and r->warm of fn, each beside a d2d copy of half of r->bytes (read + written = r->bytes) measured in the
 * same rounds the same way. */
static void measure_vs_memcpy(op_fn fn, void *ctx, record *r)
{
    const size_t bytes = (size_t)(r->bytes / 2);
    if (bytes > scratch_size) {
        release_scratch();
        CHECK(kvhal_buffer_create(dev, bytes, &scratch_a));
        CHECK(kvhal_buffer_create(dev, bytes, &scratch_b));
        CHECK(kvhal_memset(scratch_a, 0, 0x3c, bytes, NULL));
        CHECK(kvhal_memset(scratch_b, 0, 0, bytes, NULL));
        scratch_size = bytes;
    }
    copy_ctx c = {scratch_b, scratch_a, bytes};
    meas ref;
    if (cold_on) {
        measure_cold_pair(fn, ctx, run_memcpy, &c, &r->cold, &ref);
        r->cold.memcpy_gbps = ref.valid ? 2.0 * (double)bytes / ref.p50 / 1e9 : 0;
    }
    measure_warm_pair(fn, ctx, run_memcpy, &c, &r->warm, &ref);
    r->warm.memcpy_gbps = 2.0 * (double)bytes / ref.p50 / 1e9;
}

/* ---- paged caching ---- */

#define BLOCK 16

typedef struct pc_ctx {
    kvhal_tensor kc, vc, k, v, s;
    float scale;
    bool mla; /* kvhal_paged_caching_mla(kc, k, v, s): k = kv_c, v = k_pe */
} pc_ctx;

static void run_paged(void *p)
{
    pc_ctx *c = p;
    if (c->mla) CHECK(kvhal_paged_caching_mla(&c->kc, &c->k, &c->v, &c->s, c->scale, NULL));
    else CHECK(kvhal_paged_caching(&c->kc, &c->vc, &c->k, &c->v, &c->s, c->scale, c->scale, NULL));
}

static bool want_op(const char *name) { return !opt.op || !strcmp(opt.op, name); }

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* i64 slots for `tokens` tokens: a random permutation of all num_slots slots of the cache, its first `tokens`
 * (an outside harness's worst case: every token lands somewhere else in a large cache); all -1 with padding. */
static kvhal_buffer *make_slots(int64_t tokens, int64_t num_slots, bool padding)
{
    int64_t *all = xmalloc((size_t)num_slots * sizeof *all);
    for (int64_t i = 0; i < num_slots; i++) all[i] = i;
    for (int64_t i = num_slots - 1; i > 0; i--) {
        int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1)), t = all[i];
        all[i] = all[j], all[j] = t;
    }
    if (opt.block_slots) { /* the blocks in a random order, each filled from its start */
        const int64_t nb = num_slots / BLOCK;
        for (int64_t i = 0; i < nb; i++) all[i] = i;
        for (int64_t i = nb - 1; i > 0; i--) {
            int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1)), t = all[i];
            all[i] = all[j], all[j] = t;
        }
        for (int64_t t = tokens - 1; t >= 0; t--) all[t] = all[t / BLOCK] * BLOCK + t % BLOCK;
    }
    if (padding)
        for (int64_t t = 0; t < tokens; t++) all[t] = -1;
    kvhal_buffer *b;
    CHECK(kvhal_buffer_create(dev, (size_t)tokens * sizeof *all, &b));
    CHECK(kvhal_memcpy_h2d(b, 0, all, (size_t)tokens * sizeof *all, NULL));
    free(all);
    return b;
}

/* The cache dtypes and scales of a preset's rows: its own dtype, then every fp8 format at the calibrated scale,
 * and e4m3 at a power of two too (the fast case of a multiply). */
typedef struct cache_case {
    kvhal_dtype dt;
    float scale; /* 0: the input's dtype */
} cache_case;

static int cache_cases(kvhal_dtype in, cache_case *out)
{
    int n = 0;
    out[n++] = (cache_case){in, 0};
    out[n++] = (cache_case){KVHAL_FP8_E4M3, 0.5f};
    out[n++] = (cache_case){KVHAL_FP8_E4M3, opt.scale};
    if (!opt.quick) {
        out[n++] = (cache_case){KVHAL_FP8_E5M2, opt.scale};
        out[n++] = (cache_case){KVHAL_FP8_E4M3FNUZ, opt.scale};
        out[n++] = (cache_case){KVHAL_FP8_E5M2FNUZ, opt.scale};
    }
    return n;
}

/* ---- the copy ceiling: the same scattered rows copied by the GPU modules' plain SM copy, its fastest form ---- */

typedef struct ceil_ctx {
    kvhal_gpu_scatter_rows_fn fn;           /* NULL: no ceiling rows */
    kvhal_gpu_scatter_rows_form_fn form_fn; /* NULL: only fn's form */
    int form;                               /* the form run_ceiling runs (form_fn) */
    kvhal_gpu_scatter_args a;
} ceil_ctx;

static int ceiling_copy(ceil_ctx *c)
{
    return c->form_fn ? c->form_fn(&c->a, c->form, NULL) : c->fn(&c->a, NULL);
}

static void run_ceiling(void *p)
{
    if (ceiling_copy(p) != 0) fail_run(KVHAL_BACKEND_ERROR, "kvhal_gpu_scatter_rows", "the ceiling copy failed");
}

/* A GPU module's extra (CUDA and HIP), else NULL. */
static void *gpu_extra(const char *name)
{
    void *f = NULL;
    if ((dev.type != KVHAL_DEVICE_CUDA && dev.type != KVHAL_DEVICE_HIP) ||
        kvhal_backend_get_proc_address(dev.type, name, &f) != KVHAL_OK) {
        kvhal_clear_error();
        return NULL;
    }
    return f;
}

/* The device's copy ceiling and its forms: c->fn NULL where the device has none. */
static void ceiling_fns(ceil_ctx *c)
{
    void *f = gpu_extra("kvhal_gpu_scatter_rows"), *ff = gpu_extra("kvhal_gpu_scatter_rows_form");
    /* function pointers from void * (ISO C has no cast for it) */
    memcpy(&c->fn, &f, sizeof c->fn);
    memcpy(&c->form_fn, &ff, sizeof c->form_fn);
}

/* A "ceiling" row (op: the row's op + "_ceiling") for the rows c->a describes: every form of the copy measured like
 * the op beside memcpy, the fastest (cold ratio, else warm) kept as the row, and the op's row r told its ratio to
 * it. Nothing when the device has no ceiling copy or refuses these rows. */
static void ceiling_row(ceil_ctx *c, record *r)
{
    ceiling_fns(c);
    if (!c->fn || c->fn(&c->a, NULL) != 0) return;
    CHECK(kvhal_device_synchronize(dev));
    static char op[48];
    snprintf(op, sizeof op, "%s_ceiling", r->op);
    record best = {0};
    bool have = false;
    const int forms = c->form_fn ? KVHAL_GPU_SCATTER_FORMS : 1;
    for (c->form = 0; c->form < forms; c->form++) {
        if (c->form_fn && c->form_fn(&c->a, c->form, NULL) != 0) continue;
        record cr = rec_init(op, r->preset, r->layout, r->tokens, r->dtype, r->cache_dtype);
        cr.scale = r->scale;
        cr.bytes = r->bytes;
        cr.form = c->form_fn ? c->form : -1;
        measure_vs_memcpy(run_ceiling, c, &cr);
        fill_bw(&cr.cold, cr.bytes);
        fill_bw(&cr.warm, cr.bytes);
        const double q = cr.cold.ratio > 0 ? cr.cold.ratio : cr.warm.ratio,
                     qb = best.cold.ratio > 0 ? best.cold.ratio : best.warm.ratio;
        if (!have || q > qb) best = cr;
        have = true;
    }
    if (!have) return;
    emit(&best);
    fill_bw(&r->cold, r->bytes);
    fill_bw(&r->warm, r->bytes);
    const bool cold = r->cold.ratio > 0 && best.cold.ratio > 0;
    if (cold) r->of_ceiling = r->cold.ratio / best.cold.ratio;
    else if (r->warm.ratio > 0 && best.warm.ratio > 0) r->of_ceiling = r->warm.ratio / best.warm.ratio;
}

static void bench_paged(const preset *p, int64_t tokens)
{
    const int64_t H = p->heads, D = p->dim, nb = (tokens + BLOCK - 1) / BLOCK * opt.cache_factor;
    const size_t ies = kvhal_dtype_size(p->dtype), elems = (size_t)(tokens * H * D);
    kvhal_buffer *in, *cache, *slots = make_slots(tokens, nb * BLOCK, false);
    CHECK(kvhal_buffer_create(dev, 2 * elems * ies, &in));
    CHECK(kvhal_memset(in, 0, 0x3c, 2 * elems * ies, NULL)); /* finite normal values in every float format */
    const size_t cache_elems = (size_t)(nb * BLOCK * H * D);
    CHECK(kvhal_buffer_create(dev, 2 * cache_elems * ies, &cache));
    CHECK(kvhal_memset(cache, 0, 0, 2 * cache_elems * ies, NULL));
    pc_ctx c = {0};
    int64_t ish[3] = {tokens, H, D}, ssh[1] = {tokens};
    CHECK(kvhal_tensor_make(in, 0, p->dtype, 3, ish, NULL, &c.k));
    CHECK(kvhal_tensor_make(in, elems * ies, p->dtype, 3, ish, NULL, &c.v));
    CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
    cache_case cc[8];
    const int ncc = cache_cases(p->dtype, cc);
    for (int ci = 0; ci < ncc; ci++) {
        const kvhal_dtype cdt = cc[ci].dt;
        const size_t ces = kvhal_dtype_size(cdt);
        const double written = 2.0 * (double)elems * (double)ces;
        const double read = 2.0 * (double)elems * (double)ies + (double)tokens * 8;
        for (int layout = 0; layout < 2; layout++) {
            int64_t nhd[4] = {nb, BLOCK, H, D}, hnd[4] = {nb, H, BLOCK, D};
            kvhal_tensor phys_k, phys_v;
            CHECK(kvhal_tensor_make(cache, 0, cdt, 4, layout ? hnd : nhd, NULL, &phys_k));
            CHECK(kvhal_tensor_make(cache, cache_elems * ces, cdt, 4, layout ? hnd : nhd, NULL, &phys_v));
            if (layout) {
                const int32_t perm[4] = {0, 2, 1, 3};
                CHECK(kvhal_tensor_permute(&phys_k, perm, &c.kc));
                CHECK(kvhal_tensor_permute(&phys_v, perm, &c.vc));
            } else {
                c.kc = phys_k, c.vc = phys_v;
            }
            c.scale = cc[ci].scale > 0 ? cc[ci].scale : 1.0f;
            record r = rec_init("paged_caching", p->name, layout ? "HND" : "NHD", tokens, p->dtype, cdt);
            r.scale = cc[ci].scale;
            r.bytes = read + written;
            measure_vs_memcpy(run_paged, &c, &r);
            const size_t hd = (size_t)(H * D);
            ceil_ctx cl = {
                           .a = {.src = {kvhal_buffer_native(in), (char *)kvhal_buffer_native(in) + elems * ies},
                                 .dst = {kvhal_buffer_native(cache),
                                         (char *)kvhal_buffer_native(cache) + cache_elems * ces},
                                 .slots = kvhal_buffer_native(slots), .tokens = tokens, .sides = 2,
                                 .pieces = layout ? (int32_t)H : 1, .in_elem = (int32_t)ies, .out_elem = (int32_t)ces,
                                 .piece_elems = layout ? D : (int64_t)hd, .block_size = BLOCK,
                                 .block_stride = (int64_t)(BLOCK * hd * ces),
                                 .piece_stride = layout ? (int64_t)(BLOCK * (size_t)D * ces) : 0,
                                 .token_stride = (int64_t)((layout ? (size_t)D : hd) * ces)}};
            ceiling_row(&cl, &r);
            emit(&r);
        }
    }
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
    CHECK(kvhal_buffer_destroy(slots));
}

/* MLA rows: 512 latent + 64 rotary dims per token (DeepSeek-V3), bf16 input, kv_c and k_pe as two tensors, into a
 * bf16 cache and an fp8 e4m3 cache at the calibrated scale. */
static void bench_mla(int64_t tokens)
{
    const int64_t lat = 512, pe = 64, row = lat + pe, nb = (tokens + BLOCK - 1) / BLOCK * opt.cache_factor;
    kvhal_buffer *in, *cache, *slots = make_slots(tokens, nb * BLOCK, false);
    CHECK(kvhal_buffer_create(dev, (size_t)(tokens * row) * 2, &in));
    CHECK(kvhal_memset(in, 0, 0x3c, (size_t)(tokens * row) * 2, NULL));
    CHECK(kvhal_buffer_create(dev, (size_t)(nb * BLOCK * row) * 2, &cache));
    CHECK(kvhal_memset(cache, 0, 0, (size_t)(nb * BLOCK * row) * 2, NULL));
    pc_ctx c = {.mla = true};
    const int64_t csh[2] = {tokens, lat}, psh[2] = {tokens, pe}, ssh[1] = {tokens}, ksh[3] = {nb, BLOCK, row};
    CHECK(kvhal_tensor_make(in, 0, KVHAL_BF16, 2, csh, NULL, &c.k));
    CHECK(kvhal_tensor_make(in, (size_t)(tokens * lat) * 2, KVHAL_BF16, 2, psh, NULL, &c.v));
    CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
    const cache_case cc[2] = {{KVHAL_BF16, 0}, {KVHAL_FP8_E4M3, opt.scale}};
    for (int ci = 0; ci < 2; ci++) {
        CHECK(kvhal_tensor_make(cache, 0, cc[ci].dt, 3, ksh, NULL, &c.kc));
        c.scale = cc[ci].scale > 0 ? cc[ci].scale : 1.0f;
        record r = rec_init("paged_caching_mla", "deepseek-mla", "NHD", tokens, KVHAL_BF16, cc[ci].dt);
        r.scale = cc[ci].scale;
        r.bytes = (double)(tokens * row) * (2.0 + (double)kvhal_dtype_size(cc[ci].dt)) + (double)tokens * 8;
        measure_vs_memcpy(run_paged, &c, &r);
        const int64_t ces = (int64_t)kvhal_dtype_size(cc[ci].dt);
        ceil_ctx cl = { /* the rows' bytes read as one contiguous input */
                       .a = {.src = {kvhal_buffer_native(in)}, .dst = {kvhal_buffer_native(cache)},
                             .slots = kvhal_buffer_native(slots), .tokens = tokens, .sides = 1, .pieces = 1,
                             .in_elem = 2, .out_elem = (int32_t)ces, .piece_elems = row, .block_size = BLOCK,
                             .block_stride = BLOCK * row * ces, .token_stride = row * ces}};
        ceiling_row(&cl, &r);
        emit(&r);
    }
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
    CHECK(kvhal_buffer_destroy(slots));
}

/* A decode-sized call (256 tokens of the first preset, NHD) for the per-call measurements; slots set by the caller. */
#define SMALL_TOKENS 256

static void small_call_setup(pc_ctx *c, kvhal_buffer **in, kvhal_buffer **cache, int64_t tokens, int64_t nb)
{
    const preset *p = &presets[0];
    const int64_t H = p->heads, D = p->dim;
    const size_t es = kvhal_dtype_size(p->dtype), elems = (size_t)(tokens * H * D), celems = (size_t)(nb * BLOCK * H * D);
    CHECK(kvhal_buffer_create(dev, 2 * elems * es, in));
    CHECK(kvhal_memset(*in, 0, 0x3c, 2 * elems * es, NULL));
    CHECK(kvhal_buffer_create(dev, 2 * celems * es, cache));
    *c = (pc_ctx){.scale = 1.0f};
    int64_t ish[3] = {tokens, H, D}, csh[4] = {nb, BLOCK, H, D};
    CHECK(kvhal_tensor_make(*in, 0, p->dtype, 3, ish, NULL, &c->k));
    CHECK(kvhal_tensor_make(*in, elems * es, p->dtype, 3, ish, NULL, &c->v));
    CHECK(kvhal_tensor_make(*cache, 0, p->dtype, 4, csh, NULL, &c->kc));
    CHECK(kvhal_tensor_make(*cache, celems * es, p->dtype, 4, csh, NULL, &c->vc));
}

/* Decode-sized calls: host time per call (the enqueue, no synchronisation in the loop) and GPU time per call (a
 * long back-to-back run closed by one synchronize, minus nothing: on a GPU the launches overlap the kernels, so
 * this is the device's time per call once the queue is full), with real slots; then the host time with all-padding
 * slots (validation + dispatch + launch + the slot scan). */
static void bench_host_overhead(void)
{
    const preset *p = &presets[0];
    const int64_t tokens = SMALL_TOKENS, nb = tokens / BLOCK * opt.cache_factor, ssh[1] = {tokens};
    kvhal_buffer *in, *cache;
    pc_ctx c;
    small_call_setup(&c, &in, &cache, tokens, nb);
    for (int pad = 0; pad < 2; pad++) {
        kvhal_buffer *slots = make_slots(tokens, nb * BLOCK, pad);
        CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
        run_paged(&c); /* the descriptor is now cached */
        CHECK(kvhal_device_synchronize(dev));
        const int n = 100, reps = opt.quick ? 11 : 101;
        double host[MAX_SAMPLES], gpu[MAX_SAMPLES];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (int i = 0; i < n; i++) run_paged(&c);
            host[r] = (now() - t0) / n;
            CHECK(kvhal_device_synchronize(dev));
            gpu[r] = (now() - t0) / n;
        }
        record rec = rec_init(pad ? "host_overhead" : "decode", p->name, "NHD", tokens, p->dtype, p->dtype);
        const meas h = stats_of(host, reps), g = stats_of(gpu, reps);
        rec.host_us = h.p50 * 1e6;
        if (!pad && dev.type != KVHAL_DEVICE_CPU) rec.gpu_us = g.p50 * 1e6;
        emit(&rec);
        CHECK(kvhal_buffer_destroy(slots));
    }
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
}

/* The serving loop: 512 calls whose token count changes on every call (uniform in 1..512, a fixed sequence) on one
 * cache, against 512 calls of a fixed count (256): host time per call (enqueue only) and the descriptors the loop
 * created (descriptor-cache misses of this thread). With descriptors by shape class the changing loop creates one
 * (its first call) and costs the same per call as the fixed one. */
static void bench_serving_loop(void)
{
    const preset *p = &presets[0];
    const int64_t maxt = 512, nb = maxt / BLOCK * opt.cache_factor;
    kvhal_buffer *in, *cache, *slots = make_slots(maxt, nb * BLOCK, false);
    pc_ctx base;
    small_call_setup(&base, &in, &cache, maxt, nb);
    kvhal_op_kind op;
    CHECK(kvhal_desc_op_find("paged_caching", &op));
    const int calls = 512, rounds = opt.quick ? 3 : 11;
    int64_t counts[512];
    for (int i = 0; i < calls; i++) counts[i] = 1 + (int64_t)(rnd() % (uint64_t)maxt);
    const preset *pr = p;
    const size_t es = kvhal_dtype_size(pr->dtype), half = (size_t)(maxt * pr->heads * pr->dim) * es;
    for (int fixed = 0; fixed < 2; fixed++) {
        double host[MAX_SAMPLES];
        kvhal_desc_cache_stats s0, s1;
        CHECK(kvhal_desc_cache_clear(dev));
        CHECK(kvhal_device_synchronize(dev));
        CHECK(kvhal_desc_cache_get_stats(dev, op, &s0));
        for (int r = 0; r < rounds; r++) {
            double t = 0;
            for (int i = 0; i < calls; i++) {
                const int64_t n = fixed ? 256 : counts[i], ish[3] = {n, pr->heads, pr->dim}, ssh[1] = {n};
                pc_ctx c = base;
                double t0 = now();
                CHECK(kvhal_tensor_make(in, 0, pr->dtype, 3, ish, NULL, &c.k));
                CHECK(kvhal_tensor_make(in, half, pr->dtype, 3, ish, NULL, &c.v));
                CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
                run_paged(&c);
                t += now() - t0;
            }
            CHECK(kvhal_device_synchronize(dev));
            host[r] = t / calls;
        }
        CHECK(kvhal_desc_cache_get_stats(dev, op, &s1));
        record rec = rec_init(fixed ? "fixed_loop" : "serving_loop", pr->name, "NHD", fixed ? 256 : maxt, pr->dtype,
                              pr->dtype);
        rec.host_us = stats_of(host, rounds).p50 * 1e6;
        rec.descriptors_created = (int64_t)(s1.misses - s0.misses);
        emit(&rec);
    }
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
    CHECK(kvhal_buffer_destroy(slots));
}
/* ---- first call versus cached call ---- */

/* Time to completion of the very first paged-caching call of the process (descriptor creation: on OpenCL that
 * includes building the program) and of a call that finds its descriptor cached. Runs before anything else, so
 * that no earlier call has built this metadata already. */
static void bench_first_call(void)
{
    const preset *p = &presets[0];
    const int64_t tokens = SMALL_TOKENS, ssh[1] = {tokens};
    /* the device's opening as kvhal does it, at its first buffer: on CUDA and HIP the error flag and the load of the
     * paged-caching kernels' module (which the first call below then does not pay) */
    kvhal_buffer *first_buf;
    double t_open = now();
    CHECK(kvhal_buffer_create(dev, 256, &first_buf));
    record open = rec_init("device_open", p->name, "-", 0, p->dtype, p->dtype);
    open.host_us = (now() - t_open) * 1e6;
    emit(&open);
    CHECK(kvhal_buffer_destroy(first_buf));
    kvhal_buffer *in, *cache, *slots = make_slots(tokens, tokens, false);
    pc_ctx c;
    small_call_setup(&c, &in, &cache, tokens, tokens / BLOCK);
    CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
    CHECK(kvhal_device_synchronize(dev));
    double t0 = now();
    run_paged(&c);
    CHECK(kvhal_device_synchronize(dev));
    record first = rec_init("first_call", p->name, "NHD", tokens, p->dtype, p->dtype);
    first.host_us = (now() - t0) * 1e6; /* to completion */
    emit(&first);
    record cached = rec_init("cached_call", p->name, "NHD", tokens, p->dtype, p->dtype);
    measure_warm_pair(run_paged, &c, NULL, NULL, &cached.warm, NULL);
    emit(&cached);
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
    CHECK(kvhal_buffer_destroy(slots));
}

/* ---- duplicate ---- */

typedef struct dup_ctx {
    kvhal_kv_cache *src;
    int64_t len;
} dup_ctx;

static void run_duplicate(void *p)
{
    dup_ctx *c = p;
    kvhal_kv_cache *d;
    CHECK(kvhal_kv_cache_duplicate(c->src, c->len, &d));
    CHECK(kvhal_kv_cache_destroy(d));
}

static void bench_duplicate(void)
{
    const int32_t layers = 32, heads = 8, dim = 128;
    const int64_t len = 2048;
    kvhal_kv_cache_config cfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = layers, .num_kv_heads = heads, .head_dim_k = dim,
                                 .head_dim_v = dim, .max_len = len, .dtype = KVHAL_F16, .num_devices = 1,
                                 .devices = &dev};
    dup_ctx c = {.len = len};
    CHECK(kvhal_kv_cache_create(&cfg, &c.src));
    const double bytes = 2.0 * layers * (double)len * heads * dim * 2; /* K and V of every layer */
    record r = rec_init("duplicate", "32x8x128", "-", len, KVHAL_F16, KVHAL_F16);
    r.bytes = 2 * bytes;
    measure_vs_memcpy(run_duplicate, &c, &r);
    emit(&r);
    CHECK(kvhal_kv_cache_destroy(c.src));
}

/* ---- copy_blocks ---- */

typedef struct cb_ctx {
    kvhal_paged_cache *c;
    int64_t pairs[2 * 64];
    int32_t n;
} cb_ctx;

static void run_copy_blocks(void *p)
{
    cb_ctx *c = p;
    CHECK(kvhal_paged_cache_copy_blocks(c->c, c->pairs, c->n, NULL));
}

static void bench_copy_blocks(void)
{
    const int32_t layers = 32, heads = 8, dim = 128, pairs = opt.quick ? 16 : 64;
    const double block_all = 2.0 * layers * BLOCK * heads * dim * 2; /* one block of K and V of every layer */
    for (int order = 0; order < 2; order++) {
        kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = layers, .num_heads = heads, .head_dim = dim,
                                        .block_size = BLOCK, .dtype = KVHAL_BF16, .layout = KVHAL_LAYOUT_NHD,
                                        .order = (kvhal_paged_order)order,
                                        .memory_budget = (uint64_t)(block_all * 2 * pairs), .device = dev};
        cb_ctx c = {.n = pairs};
        CHECK(kvhal_paged_cache_create(&cfg, &c.c));
        for (int32_t i = 0; i < pairs; i++) c.pairs[2 * i] = 2 * i, c.pairs[2 * i + 1] = 2 * i + 1;
        const double bytes = block_all * pairs;
        record r = rec_init("copy_blocks", order ? "page-first" : "layer-first", "NHD", (int64_t)pairs * BLOCK,
                            KVHAL_BF16, KVHAL_BF16);
        r.bytes = 2 * bytes;
        measure_vs_memcpy(run_copy_blocks, &c, &r);
        emit(&r);
        CHECK(kvhal_paged_cache_destroy(c.c));
    }
}

/* ---- page_transfer: llama3-8b pages of 16 tokens (one block of K and V of 32 layers, 2 MiB) between a paged
 * cache and pinned host pages, both page lists scattered, on a stream of its own (as the host tier copies: CUDA
 * then takes its batch-copy path), against the backend's own copy of the same bytes between the cache's buffer
 * and the same pinned host memory (one contiguous kvhal_memcpy_d2h / _h2d), in the same run ---- */

typedef struct pt_ctx {
    kvhal_paged_cache *c;
    kvhal_host_memory *host;
    kvhal_buffer *buf;
    int64_t *pairs;
    int32_t n;
    kvhal_transfer_dir dir;
    size_t bytes;
    kvhal_stream *s; /* a stream of its own, as the host tier uses (NULL where the device has none) */
} pt_ctx;

static void run_page_transfer(void *p)
{
    pt_ctx *c = p;
    CHECK(kvhal_paged_cache_transfer(c->c, c->host, c->pairs, c->n, c->dir, c->s));
    CHECK(c->s ? kvhal_stream_synchronize(c->s) : kvhal_device_synchronize(dev));
}

static void run_pinned_memcpy(void *p)
{
    pt_ctx *c = p;
    void *h = kvhal_host_memory_ptr(c->host);
    if (c->dir == KVHAL_TO_HOST) CHECK(kvhal_memcpy_d2h(h, c->buf, 0, c->bytes, NULL));
    else CHECK(kvhal_memcpy_h2d(c->buf, 0, h, c->bytes, NULL));
}

static void bench_page_transfer(void)
{
    /* --tokens N: the first count gives the pages (N / 16) */
    const int32_t layers = 32, heads = 8, dim = 128,
                  pages = opt.tokens_given ? (int32_t)((opt.tokens[0] + BLOCK - 1) / BLOCK) : opt.quick ? 32 : 128;
    const size_t page_bytes = (size_t)2 * layers * BLOCK * heads * dim * 2;
    for (int order = 0; order < 2; order++) {
        kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = layers,
                                        .num_heads = heads, .head_dim = dim, .block_size = BLOCK, .dtype = KVHAL_BF16, .layout = KVHAL_LAYOUT_NHD,
                                        .order = (kvhal_paged_order)order,
                                        .memory_budget = (uint64_t)page_bytes * 4 * (uint64_t)pages, .device = dev};
        pt_ctx c = {.n = pages, .bytes = page_bytes * (size_t)pages};
        CHECK(kvhal_paged_cache_create(&cfg, &c.c));
        CHECK(kvhal_host_memory_create(dev, page_bytes * 4 * (size_t)pages, &c.host));
        if (kvhal_stream_create(dev, &c.s) != KVHAL_OK) c.s = NULL; /* the default stream */
        kvhal_tensor k0;
        CHECK(kvhal_paged_cache_layer(c.c, 0, &k0, NULL));
        c.buf = k0.buffer;
        c.pairs = malloc(2 * (size_t)pages * sizeof *c.pairs);
        int64_t *perm = malloc(4 * (size_t)pages * sizeof *perm);
        if (!c.pairs || !perm) {
            fprintf(stderr, "kvhal-bench: out of host memory\n");
            exit(1);
        }
        /* scattered: a random choice of pages out of 4x as many, on both sides */
        for (int side = 0; side < 2; side++) {
            for (int64_t i = 0; i < 4 * (int64_t)pages; i++) perm[i] = i;
            for (int64_t i = 4 * (int64_t)pages - 1; i > 0; i--) {
                int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1)), t = perm[i];
                perm[i] = perm[j], perm[j] = t;
            }
            for (int32_t i = 0; i < pages; i++) c.pairs[2 * i + side] = perm[i];
        }
        for (int dir = 0; dir < 2; dir++) {
            c.dir = (kvhal_transfer_dir)dir;
            record r = rec_init(dir ? "transfer_h2d" : "transfer_d2h", order ? "page-first" : "layer-first", "NHD",
                                (int64_t)pages * BLOCK, KVHAL_BF16, KVHAL_BF16);
            r.bytes = (double)c.bytes; /* each byte read once and written once, as by the pinned memcpy */
            meas ref;
            measure_warm_pair(run_page_transfer, &c, run_pinned_memcpy, &c, &r.warm, &ref);
            r.warm.memcpy_gbps = (double)c.bytes / ref.p50 / 1e9;
            emit(&r);
        }
        free(perm);
        free(c.pairs);
        if (c.s) CHECK(kvhal_stream_destroy(c.s));
        CHECK(kvhal_host_memory_destroy(c.host));
        CHECK(kvhal_paged_cache_destroy(c.c));
    }
}

/* ---- descriptor cache ---- */

static void destroy_nothing(void *d, kvhal_device dv, void *u)
{
    (void)d, (void)dv, (void)u;
}

static void bench_desc_cache(void)
{
    kvhal_op_kind op;
    CHECK(kvhal_desc_op_register("kvhal-bench", destroy_nothing, NULL, &op));
    static int token;
    const int sizes[2] = {8, 32}; /* words: a small key, and one the size of a paged-caching key */
    for (int s = 0; s < 2; s++) {
        kvhal_desc_key key;
        CHECK(kvhal_desc_key_init(&key, op));
        for (int i = 0; i < sizes[s]; i++) CHECK(kvhal_desc_key_add_u64(&key, (uint64_t)i * 7919u));
        CHECK(kvhal_desc_cache_put(dev, &key, &token));
        /* some other entries so the lookup is not into an empty table */
        for (int j = 0; j < 50; j++) {
            kvhal_desc_key other = key;
            other.words[0] = 1000000u + (uint64_t)j;
            kvhal_desc_key k2;
            CHECK(kvhal_desc_key_init(&k2, op));
            for (uint32_t i = 0; i < other.nwords; i++) CHECK(kvhal_desc_key_add_u64(&k2, other.words[i]));
            CHECK(kvhal_desc_cache_put(dev, &k2, &token));
        }
        /* many short samples: on a shared machine most of them run without being preempted */
        const long n = 20000;
        const int reps = opt.quick ? 21 : 201;
        double samples[201];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            void *d = NULL;
            for (long i = 0; i < n; i++) {
                if (kvhal_desc_cache_get(dev, &key, &d) != KVHAL_OK || d != &token) {
                    fail_run(KVHAL_INTERNAL, "kvhal_desc_cache_get", "a miss on a cached key");
                }
            }
            samples[r] = (now() - t0) / (double)n;
        }
        record rec = rec_init("desc_cache_hit", s ? "32 words" : "8 words", "-", 0, KVHAL_I64, KVHAL_I64);
        rec.ns = stats_of(samples, reps).p50 * 1e9;
        emit(&rec);
    }
    CHECK(kvhal_desc_cache_clear(dev));
}

/* ---- main ---- */

static void usage(void)
{
    printf("usage: " TOOL " [options]\n"
           "Bandwidth of kvhal's ops against the same device's memcpy, on the device KVHAL_DEVICE (or --device)\n"
           "selects (default cpu:0).\n"
           "  --device=DEV          cpu, cuda:0, opencl:1, ... (default: KVHAL_DEVICE)\n"
           "  --op=NAME             paged_caching | mla | serving_loop | decode | duplicate | copy_blocks |\n"
           "                        desc_cache | first_call | page_transfer (host<->device pages against the\n"
           "                        backend's pinned memcpy of the same bytes; --tokens: the tokens moved) (default: all)\n"
           "  --preset=NAME         llama3-8b (8 kv heads x 128, bf16), llama2-7b (32 x 128, f16), small (2 x 64, f32)\n"
           "  --tokens=N[,N...]     paged-caching token counts (default 256,8192,65536; --quick: 256,8192)\n"
           "  --scale=S             the calibrated fp8 scale of the fp8 rows (default 0.37; 0.5 rows always run)\n"
           "  --cache-factor=N      cache slots per token of the paged rows, slots a random permutation (default 4)\n"
           "  --slots=KIND          permutation (default: single slots drawn over the whole cache) or blocks\n"
           "                        (whole blocks in random order, each filled from its start)\n"
           "  --no-cold             skip the cold column (L2 flushed before each op; never measured on the CPU)\n"
           "  --quick               fewer sizes, formats and samples (CI smoke run)\n"
           "  -j, --json            one JSON object (figures not measured are null)\n"
           "  --csv=FILE            also one CSV row per record (empty fields for what was not measured;\n"
           "                        bench/plot.py draws it)\n"
           "  -q, --quiet           no progress on stderr (steps done, rows, elapsed time and ETA; none with\n"
           "                        --json either)\n"
           "  -h, --help            this text;  -V, --version: \"kvhal-bench <kvhal version>\"\n"
           "Exit status: 0 done, 1 a call failed or output was lost (a full disk, a closed stdout), 2 usage error.\n");
}

#define USAGE_ERROR(fmt, arg) tool_usage_error(TOOL, fmt, arg)

/* Progress: a step is one bench_* call; rows are the records printed so far. */
static size_t steps_total, steps_done;
static double t_start;

static void step(const char *what)
{
    if (!opt.quiet && !opt.json) tool_progress(TOOL, steps_done, steps_total, "steps", t_start, what);
    steps_done++;
}

static int run(int argc, char **argv);

int main(int argc, char **argv)
{
    tool_stdout_guard();
    return tool_exit(TOOL, run(argc, argv));
}

static int run(int argc, char **argv)
{
    enum { O_QUICK = 256, O_JSON, O_PRESET, O_OP, O_TOKENS, O_DEVICE, O_SCALE, O_FACTOR, O_SLOTS, O_NO_COLD, O_HELP,
           O_VERSION, O_CSV, O_QUIET };
    static const struct option longs[] = {
        {"csv", required_argument, NULL, O_CSV},       {"quiet", no_argument, NULL, O_QUIET},
        {"quick", no_argument, NULL, O_QUICK},         {"json", no_argument, NULL, O_JSON},
        {"preset", required_argument, NULL, O_PRESET}, {"op", required_argument, NULL, O_OP},
        {"tokens", required_argument, NULL, O_TOKENS}, {"device", required_argument, NULL, O_DEVICE},
        {"scale", required_argument, NULL, O_SCALE},   {"cache-factor", required_argument, NULL, O_FACTOR},
        {"no-cold", no_argument, NULL, O_NO_COLD},     {"slots", required_argument, NULL, O_SLOTS},     {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, O_VERSION},     {NULL, 0, NULL, 0}};
    static const char *ops[] = {"paged_caching", "mla", "serving_loop", "decode", "duplicate", "copy_blocks",
                                "desc_cache", "first_call", "page_transfer"};
    int c;
    char *end;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hVjq", longs, NULL)) != -1) {
        switch (c) {
        case 'h': c = O_HELP; break;
        case 'V': c = O_VERSION; break;
        case 'j': c = O_JSON; break;
        case 'q': c = O_QUIET; break;
        default: break;
        }
        switch (c) {
        case O_CSV: opt.csv_path = optarg; break;
        case O_QUIET: opt.quiet = true; break;
        case O_QUICK: opt.quick = true; break;
        case O_JSON: opt.json = true; break;
        case O_NO_COLD: opt.no_cold = true; break;
        case O_DEVICE: opt.device = optarg; break;
        case O_PRESET: {
            bool ok = false;
            for (int i = 0; i < NUM_PRESETS; i++) ok |= !strcmp(optarg, presets[i].name);
            if (!ok) return USAGE_ERROR("--preset: unknown preset '%s'", optarg);
            opt.preset = optarg;
            break;
        }
        case O_OP: {
            bool ok = false;
            for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) ok |= !strcmp(optarg, ops[i]);
            if (!ok) return USAGE_ERROR("--op: unknown op '%s'", optarg);
            opt.op = optarg;
            break;
        }
        case O_SCALE: {
            const float s = strtof(optarg, &end);
            if (*end || !(s > 0.0f) || !isfinite(s)) return USAGE_ERROR("--scale: '%s' is not a finite scale > 0", optarg);
            opt.scale = s;
            break;
        }
        case O_FACTOR: {
            const long f = strtol(optarg, &end, 10);
            if (*end || f < 1 || f > 64) return USAGE_ERROR("--cache-factor: '%s' is not in 1..64", optarg);
            opt.cache_factor = (int)f;
            break;
        }
        case O_SLOTS:
            if (strcmp(optarg, "permutation") && strcmp(optarg, "blocks"))
                return USAGE_ERROR("--slots: '%s' is not permutation or blocks", optarg);
            opt.block_slots = !strcmp(optarg, "blocks");
            break;
        case O_TOKENS: {
            const char *s = optarg;
            opt.ntokens = 0;
            while (*s) {
                long long v = strtoll(s, &end, 10);
                if (end == s || v < 1 || v > ((int64_t)1 << 30) || opt.ntokens == 8 || (*end && *end != ','))
                    return USAGE_ERROR("--tokens: '%s' is not a list of up to 8 counts in [1, 2^30]", optarg);
                opt.tokens[opt.ntokens++] = v;
                s = *end == ',' ? end + 1 : end;
            }
            if (opt.ntokens == 0) return USAGE_ERROR("--tokens: '%s' is empty", optarg);
            break;
        }
        case O_HELP: usage(); return 0;
        case O_VERSION: tool_print_version(TOOL); return 0;
        default: return USAGE_ERROR("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return USAGE_ERROR("unexpected argument '%s'", argv[optind]);
    opt.tokens_given = opt.ntokens > 0;
    if (opt.ntokens == 0) {
        opt.tokens[opt.ntokens++] = 256;
        opt.tokens[opt.ntokens++] = 8192;
        if (!opt.quick) opt.tokens[opt.ntokens++] = 65536;
    }
    if (opt.device) CHECK(kvhal_device_parse(opt.device, &dev));
    else CHECK(kvhal_device_default(&dev));
    CHECK(kvhal_device_format(dev, dev_name, sizeof dev_name));
    kvhal_device_info info;
    CHECK(kvhal_device_get_info(dev, &info));
    cold_on = !opt.no_cold && dev.type != KVHAL_DEVICE_CPU;
    if (!opt.json) printf(TOOL " %s on %s: %s (%s)\n", kvhal_version(), dev_name, info.name, info.platform);
    if (opt.json && !(jmem = open_memstream(&jbuf, &jlen))) fail_run(KVHAL_OUT_OF_MEMORY, "json", "out of memory");
    if (jmem) tool_json_init(&jrec, jmem);
    if (opt.csv_path && !(csv = fopen(opt.csv_path, "w"))) {
        tool_error(TOOL, "--csv: cannot write %s", opt.csv_path);
        return TOOL_EXIT_FAILED;
    }

    int npresets = 0;
    for (int p = 0; p < NUM_PRESETS; p++) npresets += !opt.preset || !strcmp(opt.preset, presets[p].name);
    steps_total = (size_t)want_op("first_call") + (size_t)want_op("paged_caching") * (size_t)(npresets * opt.ntokens) +
                  (size_t)want_op("mla") * (size_t)opt.ntokens + (size_t)want_op("serving_loop") +
                  (size_t)want_op("decode") + (size_t)want_op("duplicate") + (size_t)want_op("copy_blocks") +
                  (size_t)want_op("desc_cache") + (size_t)want_op("page_transfer");
    t_start = tool_now_s();
    char what[96];
    if (want_op("first_call")) step("first_call"), bench_first_call(); /* first: nothing may have built its metadata */
    if (want_op("paged_caching"))
        for (int p = 0; p < NUM_PRESETS; p++)
            if (!opt.preset || !strcmp(opt.preset, presets[p].name))
                for (int t = 0; t < opt.ntokens; t++) {
                    snprintf(what, sizeof what, "paged_caching %s, %lld tokens (%d rows so far)", presets[p].name,
                             (long long)opt.tokens[t], nrecords);
                    step(what);
                    bench_paged(&presets[p], opt.tokens[t]);
                }
    if (want_op("mla"))
        for (int t = 0; t < opt.ntokens; t++) {
            snprintf(what, sizeof what, "mla, %lld tokens (%d rows so far)", (long long)opt.tokens[t], nrecords);
            step(what);
            bench_mla(opt.tokens[t]);
        }
    static const struct { const char *name; void (*fn)(void); } rest[] = {
        {"serving_loop", bench_serving_loop}, {"decode", bench_host_overhead}, {"duplicate", bench_duplicate},
        {"copy_blocks", bench_copy_blocks},   {"desc_cache", bench_desc_cache}, {"page_transfer", bench_page_transfer},
    };
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
        if (want_op(rest[i].name)) {
            snprintf(what, sizeof what, "%s (%d rows so far)", rest[i].name, nrecords);
            step(what);
            rest[i].fn();
        }
    if (!opt.quiet && !opt.json) {
        snprintf(what, sizeof what, "%d rows", nrecords);
        tool_progress(TOOL, steps_done, steps_total, "steps", t_start, what);
    }
    release_scratch();
    if (flush_buf) CHECK(kvhal_buffer_destroy(flush_buf));
    /* the code path again, the device now opened: the GPU modules add how many functions they loaded when it was */
    char before[sizeof info.platform];
    memcpy(before, info.platform, sizeof before);
    CHECK(kvhal_device_get_info(dev, &info));
    if (!opt.json && strcmp(before, info.platform)) printf("%s once opened: %s\n", dev_name, info.platform);
    int rc = TOOL_EXIT_OK;
    if (csv && !tool_close_output(TOOL, csv, "--csv")) rc = TOOL_EXIT_FAILED;
    if (opt.json) {
        fclose(jmem); /* jbuf holds the records */
        tool_json j;
        tool_json_init(&j, stdout);
        tool_json_head(&j, TOOL, rc == TOOL_EXIT_OK);
        if (rc != TOOL_EXIT_OK) tool_json_error(&j, "IO_ERROR", "--csv: the output was lost");
        tool_json_key_str(&j, "device", dev_name);
        tool_json_key_str(&j, "device_name", info.name);
        tool_json_key_str(&j, "platform", info.platform); /* runtime, code path and (GPU modules) the kernels' form */
        tool_json_key_bool(&j, "cold_measured", cold_on);
        tool_json_open_array(&j, "records");
        fputs(jbuf ? jbuf : "", stdout);
        tool_json_close_array(&j);
        tool_json_close(&j);
    }
    free(jbuf);
    return rc;
}

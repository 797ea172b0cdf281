/* kvhal-bench — bandwidth of kvhal's ops on the device KVHAL_DEVICE selects, each next to the same device's own
 * memcpy_d2d of the same bytes measured in the same run: paged caching (model presets, token counts, NHD/HND,
 * same-dtype and fp8 e4m3 caches), kv-cache duplicate, copy_blocks over a paged cache, the descriptor cache (ns per
 * hit), the host time of one paged-caching call on a descriptor hit, and the first call of a process (descriptor
 * creation, an OpenCL program build) next to a cached one. Uses the public API only, so it runs
 * unchanged on cpu, cuda:N, hip:N and opencl:N.
 *
 * Bandwidth = (bytes read + bytes written) / time. The memcpy reference moves the same bytes: it copies half of
 * (read + written), counted twice (read + write); for a same-dtype op that is the bytes the op writes, for an fp8
 * cache (2-4 bytes read per byte written) a larger copy, so that both sides touch the same amount of memory. Every figure is the median of repeated timed samples after a warmup (the
 * best of two for calls over half a second), each sample ending with kvhal_device_synchronize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvhal.h"

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
    bool quick, json;
    const char *preset; /* NULL = all */
    const char *op;     /* NULL = all */
    int64_t tokens[8];
    int ntokens;
    bool tokens_given;
} opt;

static kvhal_device dev;
static char dev_name[32];
static int nrecords;

typedef struct record {
    const char *op, *preset, *layout;
    int64_t tokens;
    kvhal_dtype dtype, cache_dtype;
    double seconds, bytes, memcpy_gbps; /* bytes moved per call; memcpy_gbps 0 = no reference */
    double ns;                          /* for per-call figures, else 0 */
} record;

static void emit(const record *r)
{
    double gbps = r->bytes > 0 ? r->bytes / r->seconds / 1e9 : 0;
    double ratio = r->memcpy_gbps > 0 ? gbps / r->memcpy_gbps : 0;
    if (opt.json) {
        printf("%s\n  {\"device\": \"%s\", \"op\": \"%s\", \"preset\": \"%s\", \"tokens\": %lld, \"layout\": \"%s\", "
               "\"dtype\": \"%s\", \"cache_dtype\": \"%s\", \"us\": %.3f, \"gbps\": %.3f, \"memcpy_gbps\": %.3f, "
               "\"ratio_to_memcpy\": %.4f, \"ns\": %.2f}",
               nrecords ? "," : "[", dev_name, r->op, r->preset, (long long)r->tokens, r->layout,
               kvhal_dtype_name(r->dtype), kvhal_dtype_name(r->cache_dtype), r->seconds * 1e6, gbps, r->memcpy_gbps,
               ratio, r->ns);
    } else {
        if (nrecords == 0)
            printf("%-14s %-10s %7s %-6s %-5s %-9s %12s %9s %9s %7s\n", "op", "preset", "tokens", "layout", "dtype",
                   "cache", "time", "GB/s", "memcpy", "ratio");
        char t[32];
        if (r->ns > 0) snprintf(t, sizeof t, "%.1f ns", r->ns);
        else snprintf(t, sizeof t, "%.1f us", r->seconds * 1e6);
        printf("%-14s %-10s %7lld %-6s %-5s %-9s %12s", r->op, r->preset, (long long)r->tokens, r->layout,
               kvhal_dtype_name(r->dtype), kvhal_dtype_name(r->cache_dtype), t);
        if (r->bytes > 0) printf(" %9.2f %9.2f %7.3f", gbps, r->memcpy_gbps, ratio);
        printf("\n");
    }
    fflush(stdout);
    nrecords++;
}

#define CHECK(expr)                                                                                             \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) {                                                                                  \
            fprintf(stderr, "kvhal-bench: %s failed: %s\n", #expr, kvhal_last_error());                         \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)

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

/* A timed function and how many calls make one sample of it. */
typedef struct timed {
    op_fn fn;
    void *ctx;
    double one; /* seconds of the warmup call */
    long inner;
    double samples[31];
} timed;

static double sample(timed *t)
{
    double t0 = now();
    for (long i = 0; i < t->inner; i++) t->fn(t->ctx);
    CHECK(kvhal_device_synchronize(dev));
    return (now() - t0) / (double)t->inner;
}

/* Seconds per call of a (and of b, when given), the median of repeated samples. The samples of a and b alternate,
 * so that on a shared machine both see the same interference and their ratio stays meaningful. Small ops run
 * several calls per sample so that a sample is long enough to time; the number of samples shrinks for large ops so
 * that the whole run stays short. */
static void measure_pair(op_fn a, void *actx, op_fn b, void *bctx, double *ta, double *tb)
{
    const double sample_target = opt.quick ? 2e-4 : 2e-3, total_target = opt.quick ? 0.03 : 0.2;
    timed t[2] = {{.fn = a, .ctx = actx}, {.fn = b, .ctx = bctx}};
    const int n = b ? 2 : 1;
    double per_rep = 0, longest = 0;
    for (int i = 0; i < n; i++) {
        /* an untimed first call absorbs one-time costs (descriptor creation, an OpenCL program build, lazy
         * allocation by the driver), which would otherwise make a fast op look like a long one */
        t[i].fn(t[i].ctx);
        CHECK(kvhal_device_synchronize(dev));
        double t0 = now();
        t[i].fn(t[i].ctx);
        CHECK(kvhal_device_synchronize(dev));
        t[i].one = now() - t0; /* warmup, also the estimate */
        if (t[i].one < 1e-7) t[i].one = 1e-7;
        t[i].inner = (long)(sample_target / t[i].one) + 1;
        per_rep += t[i].one * (double)t[i].inner;
        if (t[i].one > longest) longest = t[i].one;
    }
    int reps = (int)(total_target / per_rep), first = 0;
    if (reps < 3) reps = 3;
    if (reps > 31) reps = 31;
    if (longest > total_target) {
        /* long ops: the warmup calls count as samples (caches cannot be warm for them anyway); past half a second
         * two samples are all the run can afford, and the faster one is the less disturbed */
        for (int i = 0; i < n; i++) t[i].samples[0] = t[i].one;
        first = 1;
        reps = longest > 0.5 ? 2 : 3;
    }
    for (int r = first; r < reps; r++)
        for (int i = 0; i < n; i++) t[i].samples[r] = sample(&t[i]);
    for (int i = 0; i < n; i++) qsort(t[i].samples, (size_t)reps, sizeof t[i].samples[0], cmp_double);
    *ta = reps == 2 ? t[0].samples[0] : t[0].samples[reps / 2];
    if (b) *tb = reps == 2 ? t[1].samples[0] : t[1].samples[reps / 2];
}

static double measure(op_fn fn, void *ctx)
{
    double t;
    measure_pair(fn, ctx, NULL, NULL, &t, NULL);
    return t;
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

static void release_memcpy_scratch(void)
{
    if (scratch_a) CHECK(kvhal_buffer_destroy(scratch_a));
    if (scratch_b) CHECK(kvhal_buffer_destroy(scratch_b));
    scratch_a = scratch_b = NULL;
    scratch_size = 0;
}

/* Seconds per call of fn, and the GB/s of a d2d copy of bytes (counted as 2 * bytes moved) measured alongside it,
 * with scratch buffers kept between calls. */
static void measure_vs_memcpy(op_fn fn, void *ctx, size_t bytes, double *seconds, double *ref_gbps)
{
    kvhal_buffer *a = scratch_a, *b = scratch_b;
    if (bytes > scratch_size) {
        release_memcpy_scratch();
        CHECK(kvhal_buffer_create(dev, bytes, &a));
        CHECK(kvhal_buffer_create(dev, bytes, &b));
        CHECK(kvhal_memset(a, 0, 0x3c, bytes, NULL));
        CHECK(kvhal_memset(b, 0, 0, bytes, NULL));
        scratch_a = a, scratch_b = b, scratch_size = bytes;
    }
    copy_ctx c = {b, a, bytes};
    double ref;
    measure_pair(fn, ctx, run_memcpy, &c, seconds, &ref);
    *ref_gbps = 2.0 * (double)bytes / ref / 1e9;
}

/* ---- paged caching ---- */

#define BLOCK 16

typedef struct pc_ctx {
    kvhal_tensor kc, vc, k, v, s;
    float scale;
} pc_ctx;

static void run_paged(void *p)
{
    pc_ctx *c = p;
    CHECK(kvhal_paged_caching(&c->kc, &c->vc, &c->k, &c->v, &c->s, c->scale, c->scale, NULL));
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

/* Slots: the blocks in a random order, each filled from its start, as a serving engine assigns them. */
static kvhal_buffer *make_slots(int64_t tokens, int64_t num_blocks, bool padding)
{
    int64_t *blocks = malloc((size_t)num_blocks * sizeof *blocks), *slots = malloc((size_t)tokens * sizeof *slots);
    if (!blocks || !slots) {
        fprintf(stderr, "kvhal-bench: out of host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < num_blocks; i++) blocks[i] = i;
    for (int64_t i = num_blocks - 1; i > 0; i--) {
        int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1)), t = blocks[i];
        blocks[i] = blocks[j], blocks[j] = t;
    }
    for (int64_t t = 0; t < tokens; t++) slots[t] = padding ? -1 : blocks[t / BLOCK] * BLOCK + t % BLOCK;
    kvhal_buffer *b;
    CHECK(kvhal_buffer_create(dev, (size_t)tokens * sizeof *slots, &b));
    CHECK(kvhal_memcpy_h2d(b, 0, slots, (size_t)tokens * sizeof *slots, NULL));
    free(blocks);
    free(slots);
    return b;
}

static void bench_paged(const preset *p, int64_t tokens)
{
    const int64_t H = p->heads, D = p->dim, nb = (tokens + BLOCK - 1) / BLOCK;
    const size_t ies = kvhal_dtype_size(p->dtype), elems = (size_t)(tokens * H * D);
    kvhal_buffer *in, *cache, *slots = make_slots(tokens, nb, false);
    CHECK(kvhal_buffer_create(dev, 2 * elems * ies, &in));
    CHECK(kvhal_memset(in, 0, 0x3c, 2 * elems * ies, NULL)); /* finite normal values in every float format */
    const size_t cache_elems = (size_t)(nb * BLOCK * H * D);
    CHECK(kvhal_buffer_create(dev, 2 * cache_elems * ies, &cache));
    CHECK(kvhal_memset(cache, 0, 0, 2 * cache_elems * ies, NULL));
    pc_ctx c;
    int64_t ish[3] = {tokens, H, D}, ssh[1] = {tokens};
    CHECK(kvhal_tensor_make(in, 0, p->dtype, 3, ish, NULL, &c.k));
    CHECK(kvhal_tensor_make(in, elems * ies, p->dtype, 3, ish, NULL, &c.v));
    CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
    const kvhal_dtype cdts[2] = {p->dtype, KVHAL_FP8_E4M3};
    for (int ci = 0; ci < 2; ci++) {
        const kvhal_dtype cdt = cdts[ci];
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
            c.scale = ci ? 0.5f : 1.0f;
            record r = {.op = "paged_caching", .preset = p->name, .layout = layout ? "HND" : "NHD",
                        .tokens = tokens, .dtype = p->dtype, .cache_dtype = cdt, .bytes = read + written};
            measure_vs_memcpy(run_paged, &c, (size_t)((read + written) / 2), &r.seconds, &r.memcpy_gbps);
            emit(&r);
        }
    }
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
    CHECK(kvhal_buffer_destroy(slots));
}

/* A decode-sized call (256 tokens of the first preset, NHD) for the per-call measurements; slots set by the caller. */
#define SMALL_TOKENS 256

static void small_call_setup(pc_ctx *c, kvhal_buffer **in, kvhal_buffer **cache)
{
    const preset *p = &presets[0];
    const int64_t H = p->heads, D = p->dim, nb = SMALL_TOKENS / BLOCK;
    const size_t es = kvhal_dtype_size(p->dtype), elems = (size_t)(SMALL_TOKENS * H * D);
    CHECK(kvhal_buffer_create(dev, 2 * elems * es, in));
    CHECK(kvhal_memset(*in, 0, 0x3c, 2 * elems * es, NULL));
    CHECK(kvhal_buffer_create(dev, 2 * elems * es, cache));
    *c = (pc_ctx){.scale = 1.0f};
    int64_t ish[3] = {SMALL_TOKENS, H, D}, csh[4] = {nb, BLOCK, H, D};
    CHECK(kvhal_tensor_make(*in, 0, p->dtype, 3, ish, NULL, &c->k));
    CHECK(kvhal_tensor_make(*in, elems * es, p->dtype, 3, ish, NULL, &c->v));
    CHECK(kvhal_tensor_make(*cache, 0, p->dtype, 4, csh, NULL, &c->kc));
    CHECK(kvhal_tensor_make(*cache, elems * es, p->dtype, 4, csh, NULL, &c->vc));
}

/* Host time of one call at 256 tokens with the descriptor cached: with real slots (on the CPU that includes the
 * copy) and with all-padding slots (validation + dispatch + launch + the slot scan). No synchronisation inside
 * the loop: on a GPU this is the launch cost. */
static void bench_host_overhead(void)
{
    const preset *p = &presets[0];
    const int64_t tokens = SMALL_TOKENS, nb = tokens / BLOCK, ssh[1] = {tokens};
    kvhal_buffer *in, *cache;
    pc_ctx c;
    small_call_setup(&c, &in, &cache);
    for (int pad = 0; pad < 2; pad++) {
        kvhal_buffer *slots = make_slots(tokens, nb, pad);
        CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
        run_paged(&c); /* the descriptor is now cached */
        CHECK(kvhal_device_synchronize(dev));
        const int n = 100, reps = opt.quick ? 11 : 101;
        double samples[101];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            for (int i = 0; i < n; i++) run_paged(&c);
            samples[r] = (now() - t0) / n;
            CHECK(kvhal_device_synchronize(dev));
        }
        qsort(samples, (size_t)reps, sizeof samples[0], cmp_double);
        record rec = {.op = pad ? "host_overhead" : "host_call", .preset = p->name, .layout = "NHD",
                      .tokens = tokens, .dtype = p->dtype, .cache_dtype = p->dtype, .seconds = samples[reps / 2]};
        rec.ns = rec.seconds * 1e9;
        emit(&rec);
        CHECK(kvhal_buffer_destroy(slots));
    }
    CHECK(kvhal_buffer_destroy(in));
    CHECK(kvhal_buffer_destroy(cache));
}

/* ---- first call versus cached call ---- */

/* Time to completion of the very first paged-caching call of the process (descriptor creation: on OpenCL that
 * includes building the program) and of a call that finds its descriptor cached. Runs before anything else, so
 * that no earlier call has built this metadata already. */
static void bench_first_call(void)
{
    const preset *p = &presets[0];
    const int64_t tokens = SMALL_TOKENS, ssh[1] = {tokens};
    kvhal_buffer *in, *cache, *slots = make_slots(tokens, tokens / BLOCK, false);
    pc_ctx c;
    small_call_setup(&c, &in, &cache);
    CHECK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &c.s));
    CHECK(kvhal_device_synchronize(dev));
    double t0 = now();
    run_paged(&c);
    CHECK(kvhal_device_synchronize(dev));
    record first = {.op = "first_call", .preset = p->name, .layout = "NHD", .tokens = tokens, .dtype = p->dtype,
                    .cache_dtype = p->dtype, .seconds = now() - t0};
    emit(&first);
    record cached = first;
    cached.op = "cached_call";
    cached.seconds = measure(run_paged, &c);
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
    kvhal_kv_cache_config cfg = {.num_layers = layers, .num_kv_heads = heads, .head_dim_k = dim,
                                 .head_dim_v = dim, .max_len = len, .dtype = KVHAL_F16, .num_devices = 1,
                                 .devices = &dev};
    dup_ctx c = {.len = len};
    CHECK(kvhal_kv_cache_create(&cfg, &c.src));
    const double bytes = 2.0 * layers * (double)len * heads * dim * 2; /* K and V of every layer */
    record r = {.op = "duplicate", .preset = "32x8x128", .layout = "-", .tokens = len, .dtype = KVHAL_F16,
                .cache_dtype = KVHAL_F16, .bytes = 2 * bytes};
    measure_vs_memcpy(run_duplicate, &c, (size_t)bytes, &r.seconds, &r.memcpy_gbps);
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
        kvhal_paged_cache_config cfg = {.num_layers = layers, .num_heads = heads, .head_dim = dim,
                                        .block_size = BLOCK, .dtype = KVHAL_BF16, .layout = KVHAL_LAYOUT_NHD,
                                        .order = (kvhal_paged_order)order,
                                        .memory_budget = (uint64_t)(block_all * 2 * pairs), .device = dev};
        cb_ctx c = {.n = pairs};
        CHECK(kvhal_paged_cache_create(&cfg, &c.c));
        for (int32_t i = 0; i < pairs; i++) c.pairs[2 * i] = 2 * i, c.pairs[2 * i + 1] = 2 * i + 1;
        const double bytes = block_all * pairs;
        record r = {.op = "copy_blocks", .preset = order ? "page-first" : "layer-first", .layout = "NHD",
                    .tokens = (int64_t)pairs * BLOCK, .dtype = KVHAL_BF16, .cache_dtype = KVHAL_BF16,
                    .bytes = 2 * bytes};
        measure_vs_memcpy(run_copy_blocks, &c, (size_t)bytes, &r.seconds, &r.memcpy_gbps);
        emit(&r);
        CHECK(kvhal_paged_cache_destroy(c.c));
    }
}

/* ---- page_transfer: llama3-8b pages of 16 tokens (one block of K and V of 32 layers, 2 MiB) between a paged
 * cache and pinned host pages, both page lists scattered, against the backend's own copy of the same bytes between
 * the cache's buffer and the same pinned host memory (one contiguous kvhal_memcpy_d2h / _h2d) ---- */

typedef struct pt_ctx {
    kvhal_paged_cache *c;
    kvhal_host_memory *host;
    kvhal_buffer *buf;
    int64_t *pairs;
    int32_t n;
    kvhal_transfer_dir dir;
    size_t bytes;
} pt_ctx;

static void run_page_transfer(void *p)
{
    pt_ctx *c = p;
    CHECK(kvhal_paged_cache_transfer(c->c, c->host, c->pairs, c->n, c->dir, NULL));
    CHECK(kvhal_device_synchronize(dev));
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
        kvhal_paged_cache_config cfg = {.num_layers = layers, .num_heads = heads, .head_dim = dim,
                                        .block_size = BLOCK, .dtype = KVHAL_BF16, .layout = KVHAL_LAYOUT_NHD,
                                        .order = (kvhal_paged_order)order,
                                        .memory_budget = (uint64_t)page_bytes * 4 * (uint64_t)pages, .device = dev};
        pt_ctx c = {.n = pages, .bytes = page_bytes * (size_t)pages};
        CHECK(kvhal_paged_cache_create(&cfg, &c.c));
        CHECK(kvhal_host_memory_create(dev, page_bytes * 4 * (size_t)pages, &c.host));
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
            record r = {.op = dir ? "transfer_h2d" : "transfer_d2h", .preset = order ? "page-first" : "layer-first",
                        .layout = "NHD", .tokens = (int64_t)pages * BLOCK, .dtype = KVHAL_BF16,
                        .cache_dtype = KVHAL_BF16, .bytes = (double)c.bytes};
            double ref;
            measure_pair(run_page_transfer, &c, run_pinned_memcpy, &c, &r.seconds, &ref);
            r.memcpy_gbps = (double)c.bytes / ref / 1e9;
            emit(&r);
        }
        free(perm);
        free(c.pairs);
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
                    fprintf(stderr, "kvhal-bench: descriptor cache miss on a cached key\n");
                    exit(1);
                }
            }
            samples[r] = (now() - t0) / (double)n;
        }
        qsort(samples, (size_t)reps, sizeof samples[0], cmp_double);
        record rec = {.op = "desc_cache_hit", .preset = s ? "32 words" : "8 words", .layout = "-",
                      .dtype = KVHAL_I64, .cache_dtype = KVHAL_I64, .seconds = samples[reps / 2],
                      .ns = samples[reps / 2] * 1e9};
        emit(&rec);
    }
    CHECK(kvhal_desc_cache_clear(dev));
}

/* ---- main ---- */

static void usage(void)
{
    printf("usage: kvhal-bench [--quick] [--json] [--preset NAME] [--tokens N[,N...]] [--op NAME]\n"
           "  --preset   llama3-8b (8 kv heads x 128, bf16), llama2-7b (32 x 128, f16), small (2 x 64, f32)\n"
           "  --tokens   paged-caching token counts (default 256,8192,65536; --quick: 256,8192); page_transfer:\n"
           "             the first one is the tokens transferred (default 2048; --quick: 512)\n"
           "  --op       paged_caching | duplicate | copy_blocks | desc_cache | host_overhead | first_call |\n"
           "             page_transfer (host<->device pages vs the backend's pinned memcpy of the same bytes)\n"
           "  --quick    fewer sizes and samples (CI smoke run)\n"
           "  --json     a JSON list of records instead of the table\n"
           "Runs on the device KVHAL_DEVICE selects (default cpu:0).\n");
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--quick")) opt.quick = true;
        else if (!strcmp(a, "--json")) opt.json = true;
        else if (!strcmp(a, "--preset") && i + 1 < argc) opt.preset = argv[++i];
        else if (!strcmp(a, "--op") && i + 1 < argc) opt.op = argv[++i];
        else if (!strcmp(a, "--tokens") && i + 1 < argc) {
            char *s = argv[++i], *end;
            while (*s && opt.ntokens < 8) {
                long long v = strtoll(s, &end, 10);
                if (end == s || v < 1 || v > ((int64_t)1 << 30)) {
                    fprintf(stderr, "kvhal-bench: --tokens: '%s' is not a list of counts in [1, 2^30]\n", argv[i]);
                    return 2;
                }
                opt.tokens[opt.ntokens++] = v;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') {
                    fprintf(stderr, "kvhal-bench: --tokens: unexpected '%s'\n", end);
                    return 2;
                }
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "kvhal-bench: unknown or incomplete argument '%s'\n", a);
            usage();
            return 2;
        }
    }
    static const char *ops[] = {"paged_caching", "duplicate", "copy_blocks", "desc_cache", "host_overhead",
                                "first_call", "page_transfer"};
    if (opt.op) {
        bool ok = false;
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) ok |= !strcmp(opt.op, ops[i]);
        if (!ok) {
            fprintf(stderr, "kvhal-bench: --op: unknown op '%s'\n", opt.op);
            return 2;
        }
    }
    if (opt.preset) {
        bool ok = false;
        for (int i = 0; i < NUM_PRESETS; i++) ok |= !strcmp(opt.preset, presets[i].name);
        if (!ok) {
            fprintf(stderr, "kvhal-bench: --preset: unknown preset '%s'\n", opt.preset);
            return 2;
        }
    }
    opt.tokens_given = opt.ntokens > 0;
    if (opt.ntokens == 0) {
        opt.tokens[opt.ntokens++] = 256;
        opt.tokens[opt.ntokens++] = 8192;
        if (!opt.quick) opt.tokens[opt.ntokens++] = 65536;
    }
    if (kvhal_device_default(&dev) != KVHAL_OK) {
        fprintf(stderr, "kvhal-bench: KVHAL_DEVICE: %s\n", kvhal_last_error());
        return 1;
    }
    CHECK(kvhal_device_format(dev, dev_name, sizeof dev_name));
    kvhal_device_info info;
    CHECK(kvhal_device_get_info(dev, &info));
    if (!opt.json) printf("kvhal-bench on %s: %s (%s)\n", dev_name, info.name, info.platform);

    if (want_op("first_call")) bench_first_call(); /* first: nothing may have built its metadata yet */
    if (want_op("paged_caching"))
        for (int p = 0; p < NUM_PRESETS; p++)
            if (!opt.preset || !strcmp(opt.preset, presets[p].name))
                for (int t = 0; t < opt.ntokens; t++) bench_paged(&presets[p], opt.tokens[t]);
    if (want_op("host_overhead")) bench_host_overhead();
    if (want_op("duplicate")) bench_duplicate();
    if (want_op("copy_blocks")) bench_copy_blocks();
    if (want_op("desc_cache")) bench_desc_cache();
    if (want_op("page_transfer")) bench_page_transfer();
    release_memcpy_scratch();
    if (opt.json) printf("%s\n", nrecords ? "\n]" : "[]");
    return 0;
}

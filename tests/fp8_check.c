/* fp8_check — the exhaustive proof of kvhal's fp8 quantisation at any scale: for every one of the 2^32 f32 bit
 * patterns x and each scale s and fp8 format asked for, the code kvhal stores must be kvhal_f32_to_fp8(x / s), the
 * documented result (x / s the IEEE f32 division, then round to nearest even, saturating). A test program: the
 * suites run slices of the input range (tests/meson.build, suites ops and long); the whole proof runs by hand,
 * e.g. build/tests/fp8_check --math, or KVHAL_DEVICE=cuda:0 build/tests/fp8_check.
 *
 * Two checks, each over all 2^32 inputs:
 * - math (--math): the arithmetic the GPU kernels use instead of the division (backends/gpu/kvhal_gpu_math.h:
 *   a multiply by 1/s for a power-of-two s, the reciprocal with one fma correction for a calibrated s), compiled
 *   for the host, with the kernels' mapping of a NaN quotient of a non-NaN input to the saturated code; for the
 *   fnuz formats the sm_89+ path (twice the quotient through the OCP code, kvhal_num_fnuz_from_ocp).
 * - device (default): the paged-caching op itself on the device KVHAL_DEVICE (or --device) selects: chunks of f32
 *   inputs are cached into fp8 K and V caches through kvhal_paged_caching and read back. On cpu:0 this checks the
 *   CPU backend's conversion loops (cpu_ops.c and its quotient, cpu_scale_mode): the vector loop with
 *   the inputs dense, the scalar loop with --strided (the inputs read through a transposed [tokens, 128, 8] view,
 *   so the head dim has stride 8; every input is still cached exactly once).
 * Exit status: 0 every code matched, 1 a mismatch or a failed call, 2 a usage error. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../backends/gpu/kvhal_gpu_math.h"
#include "kvhal.h"

#ifndef KVHAL_PROJECT_VERSION
#define KVHAL_PROJECT_VERSION "unknown"
#endif

#define TOOL "fp8_check"
#define MAX_SCALES 64
#define MAX_FORMATS 8

static struct {
    float scales[MAX_SCALES];
    int nscales;
    kvhal_dtype formats[MAX_FORMATS];
    int nformats;
    bool math, naive, strided;
    int threads;
    int chunk_log2;
    uint64_t limit; /* inputs checked: 2^32 unless --limit (a quick run) */
    uint64_t start; /* the first input's bits (--start; 0) */
    const char *device;
} opt;

/* The default set: calibrated scales (0.37 and others with long mantissas), the extremes of the reciprocal's range
 * and beyond it (the division), scales that make most inputs saturate (tiny) or vanish (huge), and powers of two. */
static const float default_scales[] = {0.37f, 0.1f, 1.0f / 3.0f, 0.7f, 1.7f, 3.14159265f, 17.3f, 0.99999994f,
                                       1.00000012f, 1e-5f, 4567.89f, 0x1.5p-64f, 0x1.fffffep63f, 1e-30f, 3e30f,
                                       0.5f, 0x1p-60f};

/* A usage error: the message on stderr, exit status 2. fmt is a literal with one %s. */
#define USAGE_ERROR(fmt, arg) (fprintf(stderr, TOOL ": error: " fmt " (see --help)\n", arg), 2)

static void usage(void)
{
    printf("usage: " TOOL " [options]\n"
           "Checks kvhal's fp8 codes against kvhal_f32_to_fp8(x / scale) for all 2^32 f32 inputs x.\n"
           "  --math               check the kernels' arithmetic on the host instead of a device\n"
           "  --naive              (with --math) multiply by 1/s at every scale: shows the differences the\n"
           "                       correction removes (this check then fails)\n"
           "  --device=DEV         the device of the device check (default: KVHAL_DEVICE, else cpu)\n"
           "  --strided            (device check) inputs with head-dim stride 8 instead of dense: the backends'\n"
           "                       strided conversion paths (the CPU's scalar loop)\n"
           "  --scales=S,S,...     scales (default: a set of %d, calibrated, extreme and power-of-two)\n"
           "  --formats=F,F,...    fp8 formats by dtype name (default: every fp8 format)\n"
           "  --threads=N          host threads (default: the online CPUs)\n"
           "  --chunk-log2=N       inputs per device call, as a power of two (default 24)\n"
           "  --limit=N            check only N inputs of the 2^32 (a quick run; not a proof)\n"
           "  --start=BITS         the first input's f32 bits with --limit (decimal or 0x...; default 0)\n"
           "  --help, --version\n",
           (int)(sizeof default_scales / sizeof default_scales[0]));
}

/* ---- the reference and the kernels' arithmetic ---- */

static uint8_t ref_code(float x, float s, kvhal_dtype fmt) { return kvhal_f32_to_fp8(x / s, fmt); }

/* The kernels' quotient for scale mode m, with their treatment of a NaN quotient from a non-NaN input. */
static float kernel_quot(float x, float s, float inv, int m)
{
    if (isnan(x)) return x; /* the kernels take a NaN's sign and NaN-ness from the input */
    float q = m == 0 ? x * inv : m == 1 ? kvhal_num_quot_rcp(x, s, inv) : x / s;
    if (isnan(q)) q = copysignf(INFINITY, x);
    return q;
}

static bool fnuz(kvhal_dtype f) { return f == KVHAL_FP8_E4M3FNUZ || f == KVHAL_FP8_E5M2FNUZ; }

typedef struct job {
    uint64_t begin, end;
    float s, inv;
    int mode;
    kvhal_dtype fmt;
    const uint8_t *got_k, *got_v; /* device check: codes read back for inputs [begin, end) (index - base) */
    uint64_t base;
    bool strided; /* got_k/got_v hold the inputs' codes in the transposed order of --strided */
    uint64_t bad, f32_diff;
    uint32_t first_bad;
    uint8_t first_got, first_ref;
} job;

static void *run_job(void *p)
{
    job *j = p;
    for (uint64_t i = j->begin; i < j->end; i++) {
        const uint32_t u = (uint32_t)i;
        float x;
        memcpy(&x, &u, 4);
        const uint8_t want = ref_code(x, j->s, j->fmt);
        uint8_t got, got2;
        if (j->got_k) {
            uint64_t r = i - j->base;
            if (j->strided) /* input (t, d, h) of the [tokens, 128, 8] chunk sits at cache (t, h, d) */
                r = (r & ~(uint64_t)1023) | ((r & 7) << 7) | ((r >> 3) & 127);
            got = j->got_k[r];
            got2 = j->got_v[r];
            if (got == want && got2 != want) got = got2;
        } else if (fnuz(j->fmt)) {
            /* the fnuz kernels of sm_89+: twice the quotient (s / 2 and 2 / s; the division doubled), its OCP code
             * as the hardware gives it (kvhal_f32_to_fp8 of the OCP format equals it), mapped to fnuz */
            const int e4 = j->fmt == KVHAL_FP8_E4M3FNUZ;
            const float q2 = j->mode == 2 ? 2.0f * (x / j->s) : kernel_quot(x, j->s * 0.5f, 2.0f / j->s, j->mode);
            got = (uint8_t)kvhal_num_fnuz_from_ocp(kvhal_f32_to_fp8(q2, e4 ? KVHAL_FP8_E4M3 : KVHAL_FP8_E5M2), q2, u,
                                                   e4);
        } else {
            const float q = kernel_quot(x, j->s, j->inv, j->mode), e = x / j->s;
            /* inside [2^-20, 2^17) every fp8 format rounds the f32 quotient; outside it all give 0 or saturate */
            if (memcmp(&q, &e, 4) != 0 && fabsf(e) >= 0x1p-20f && fabsf(e) < 0x1p17f) j->f32_diff++;
            got = kvhal_f32_to_fp8(q, j->fmt);
        }
        if (got != want) {
            if (!j->bad) {
                j->first_bad = u;
                j->first_got = got;
                j->first_ref = want;
            }
            j->bad++;
        }
    }
    return NULL;
}

/* Runs [begin, end) over opt.threads threads; returns false on a mismatch (printed). */
static bool run_range(job proto, uint64_t begin, uint64_t end, uint64_t *bad, uint64_t *f32_diff)
{
    job jobs[256];
    pthread_t th[256];
    const int n = opt.threads;
    const uint64_t per = (end - begin + (uint64_t)n - 1) / (uint64_t)n;
    for (int t = 0; t < n; t++) {
        jobs[t] = proto;
        jobs[t].begin = begin + per * (uint64_t)t < end ? begin + per * (uint64_t)t : end;
        jobs[t].end = jobs[t].begin + per < end ? jobs[t].begin + per : end;
        if (pthread_create(&th[t], NULL, run_job, &jobs[t]) != 0) run_job(&jobs[t]), th[t] = 0;
    }
    bool ok = true;
    for (int t = 0; t < n; t++) {
        if (th[t]) pthread_join(th[t], NULL);
        *f32_diff += jobs[t].f32_diff;
        if (jobs[t].bad) {
            if (ok && *bad == 0) {
                float x;
                memcpy(&x, &jobs[t].first_bad, 4);
                printf("  MISMATCH %s scale %a: x = 0x%08x (%a): got 0x%02x, kvhal_f32_to_fp8(x / scale) = 0x%02x\n",
                       kvhal_dtype_name(proto.fmt), (double)proto.s, (unsigned)jobs[t].first_bad, (double)x,
                       jobs[t].first_got, jobs[t].first_ref);
            }
            *bad += jobs[t].bad;
            ok = false;
        }
    }
    return ok;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *mode_name(int m) { return m == 0 ? "multiply by 1/s" : m == 1 ? "reciprocal + fma" : "division"; }

static int check_math(void)
{
    int failed = 0;
    for (int f = 0; f < opt.nformats; f++) {
        for (int i = 0; i < opt.nscales; i++) {
            const float s = opt.scales[i];
            job proto = {0};
            proto.s = s;
            proto.inv = 1.0f / s;
            proto.mode = opt.naive ? 0 : kvhal_gpu_scale_mode(s, s);
            proto.fmt = opt.formats[f];
            uint64_t bad = 0, diff = 0;
            const double t0 = now_s();
            run_range(proto, opt.start, opt.start + opt.limit, &bad, &diff);
            char f32[96] = " (the sm_89+ fnuz path: twice the quotient through the OCP code)";
            if (!fnuz(proto.fmt))
                snprintf(f32, sizeof f32, " (%llu f32 quotients differ from x / s where |x / s| is in [2^-20, 2^17))",
                         (unsigned long long)diff);
            printf("math %-12s scale %-14a (%-10g) %-16s: %llu inputs, %llu fp8 mismatches%s, %.1f s\n",
                   kvhal_dtype_name(proto.fmt), (double)s, (double)s, mode_name(proto.mode),
                   (unsigned long long)opt.limit, (unsigned long long)bad, f32, now_s() - t0);
            fflush(stdout);
            if (bad) failed = 1;
        }
    }
    return failed;
}

#define TRY(call)                                                                                              \
    do {                                                                                                       \
        kvhal_status st_ = (call);                                                                             \
        if (st_ != KVHAL_OK) {                                                                                 \
            fprintf(stderr, TOOL ": error: %s: %s (%s)\n", #call, kvhal_last_error(), kvhal_status_name(st_)); \
            rc = 1;                                                                                            \
            goto out;                                                                                          \
        }                                                                                                      \
    } while (0)

/* Device check: inputs [c, c + chunk) as a [tokens, 8, 128] f32 tensor, cached with slot t = t into fp8 caches
 * [blocks, 16, 8, 128] of each format, at each scale (K and V alike), read back and compared. */
static int check_device(void)
{
    int rc = 0;
    kvhal_device dev;
    kvhal_buffer *in = NULL, *slots = NULL, *kc = NULL, *vc = NULL;
    uint32_t *host_in = NULL;
    int32_t *host_slots = NULL;
    uint8_t *got_k = NULL, *got_v = NULL;
    const int64_t heads = 8, dim = 128, bs = 16, row = heads * dim;
    const uint64_t chunk = (uint64_t)1 << opt.chunk_log2;
    const int64_t tokens = (int64_t)(chunk / (uint64_t)row), blocks = tokens / bs;
    uint64_t bad[MAX_FORMATS][MAX_SCALES] = {{0}};
    double t0 = now_s();
    if (opt.device) TRY(kvhal_device_parse(opt.device, &dev));
    else TRY(kvhal_device_default(&dev));
    char name[32];
    kvhal_device_format(dev, name, sizeof name);
    host_in = malloc(chunk * 4);
    host_slots = malloc((size_t)tokens * 4);
    got_k = malloc(chunk);
    got_v = malloc(chunk);
    if (!host_in || !host_slots || !got_k || !got_v) {
        fprintf(stderr, TOOL ": error: out of host memory for a chunk of %llu inputs\n", (unsigned long long)chunk);
        rc = 1;
        goto out;
    }
    for (int64_t t = 0; t < tokens; t++) host_slots[t] = (int32_t)t;
    TRY(kvhal_buffer_create(dev, chunk * 4, &in));
    TRY(kvhal_buffer_create(dev, (size_t)tokens * 4, &slots));
    TRY(kvhal_buffer_create(dev, chunk, &kc));
    TRY(kvhal_buffer_create(dev, chunk, &vc));
    TRY(kvhal_memcpy_h2d(slots, 0, host_slots, (size_t)tokens * 4, NULL));
    const int64_t in_shape[3] = {tokens, heads, dim}, cache_shape[4] = {blocks, bs, heads, dim};
    const int64_t slot_shape[1] = {tokens};
    /* --strided: element (t, h, d) at t * 1024 + d * 8 + h */
    const int64_t in_strides[3] = {row, 1, heads};
    kvhal_tensor tin, tslots;
    TRY(kvhal_tensor_make(in, 0, KVHAL_F32, 3, in_shape, opt.strided ? in_strides : NULL, &tin));
    TRY(kvhal_tensor_make(slots, 0, KVHAL_I32, 1, slot_shape, NULL, &tslots));
    for (uint64_t c = opt.start; c < opt.start + opt.limit; c += chunk) {
        for (uint64_t i = 0; i < chunk; i++) host_in[i] = (uint32_t)(c + i);
        TRY(kvhal_memcpy_h2d(in, 0, host_in, chunk * 4, NULL));
        for (int f = 0; f < opt.nformats; f++) {
            kvhal_tensor tk, tv;
            TRY(kvhal_tensor_make(kc, 0, opt.formats[f], 4, cache_shape, NULL, &tk));
            TRY(kvhal_tensor_make(vc, 0, opt.formats[f], 4, cache_shape, NULL, &tv));
            for (int i = 0; i < opt.nscales; i++) {
                const float s = opt.scales[i];
                TRY(kvhal_memset(kc, 0, 0x55, chunk, NULL));
                TRY(kvhal_memset(vc, 0, 0x55, chunk, NULL));
                TRY(kvhal_paged_caching(&tk, &tv, &tin, &tin, &tslots, s, s, NULL));
                TRY(kvhal_device_synchronize(dev));
                TRY(kvhal_memcpy_d2h(got_k, kc, 0, chunk, NULL));
                TRY(kvhal_memcpy_d2h(got_v, vc, 0, chunk, NULL));
                job proto = {0};
                proto.s = s;
                proto.fmt = opt.formats[f];
                proto.got_k = got_k;
                proto.got_v = got_v;
                proto.base = c;
                proto.strided = opt.strided;
                uint64_t diff = 0;
                const uint64_t last = opt.start + opt.limit, end = c + chunk < last ? c + chunk : last;
                run_range(proto, c, end, &bad[f][i], &diff);
            }
        }
    }
    /* the CPU backend picks its quotient like the kernels, except that its SSE2 loops (a CPU without AVX2, FMA and
     * F16C, or KVHAL_CPU_WIDE=0) divide by a calibrated scale (cpu_ops.c, cpu_scale_mode) */
    const bool cpu = dev.type == KVHAL_DEVICE_CPU;
    if (cpu)
        printf("%s: the modes below are the wide loops'; the SSE2 loops (no AVX2/FMA/F16C, or KVHAL_CPU_WIDE=0) "
               "divide where they say reciprocal + fma\n",
               name);
    for (int f = 0; f < opt.nformats; f++)
        for (int i = 0; i < opt.nscales; i++) {
            printf("%s %-12s scale %-14a (%-10g) %s %-16s %s: %llu inputs, %llu fp8 mismatches\n", name,
                   kvhal_dtype_name(opt.formats[f]), (double)opt.scales[i], (double)opt.scales[i],
                   cpu ? "CPU mode" : "GPU/OpenCL mode",
                   mode_name(kvhal_gpu_scale_mode(opt.scales[i], opt.scales[i])),
                   opt.strided ? "strided" : "dense", (unsigned long long)opt.limit, (unsigned long long)bad[f][i]);
            if (bad[f][i]) rc = 1;
        }
    printf("%s: %.1f s\n", name, now_s() - t0);
out:
    kvhal_buffer_destroy(in);
    kvhal_buffer_destroy(slots);
    kvhal_buffer_destroy(kc);
    kvhal_buffer_destroy(vc);
    free(host_in);
    free(host_slots);
    free(got_k);
    free(got_v);
    return rc;
}

static bool parse_list(const char *text, bool scales)
{
    char buf[2048];
    if (strlen(text) >= sizeof buf) return false;
    strcpy(buf, text);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (scales) {
            char *end;
            errno = 0;
            const float s = strtof(tok, &end);
            if (*end || errno || !(s > 0.0f) || !isfinite(s) || opt.nscales == MAX_SCALES) return false;
            opt.scales[opt.nscales++] = s;
        } else {
            kvhal_dtype dt = (kvhal_dtype)-1;
            for (int d = 0; d < 32; d++)
                if (kvhal_dtype_size((kvhal_dtype)d) == 1 && !strcmp(kvhal_dtype_name((kvhal_dtype)d), tok))
                    dt = (kvhal_dtype)d;
            if ((int)dt < 0 || opt.nformats == MAX_FORMATS) return false;
            opt.formats[opt.nformats++] = dt;
        }
    }
    return scales ? opt.nscales > 0 : opt.nformats > 0;
}

int main(int argc, char **argv)
{
    enum {
        O_MATH = 256, O_NAIVE, O_STRIDED, O_DEVICE, O_SCALES, O_FORMATS, O_THREADS, O_CHUNK, O_LIMIT, O_START, O_HELP,
        O_VERSION
    };
    static const struct option longs[] = {
        {"math", no_argument, NULL, O_MATH},             {"naive", no_argument, NULL, O_NAIVE},
        {"strided", no_argument, NULL, O_STRIDED},       {"device", required_argument, NULL, O_DEVICE},
        {"scales", required_argument, NULL, O_SCALES},   {"formats", required_argument, NULL, O_FORMATS},
        {"threads", required_argument, NULL, O_THREADS}, {"chunk-log2", required_argument, NULL, O_CHUNK},
        {"limit", required_argument, NULL, O_LIMIT},     {"start", required_argument, NULL, O_START},
        {"help", no_argument, NULL, O_HELP},             {"version", no_argument, NULL, O_VERSION},
        {NULL, 0, NULL, 0}};
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    opt.threads = n > 0 ? (n > 256 ? 256 : (int)n) : 1;
    opt.chunk_log2 = 24;
    opt.limit = (uint64_t)1 << 32;
    int c;
    char *end;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case O_MATH: opt.math = true; break;
        case O_NAIVE: opt.naive = true; break;
        case O_STRIDED: opt.strided = true; break;
        case O_DEVICE: opt.device = optarg; break;
        case O_SCALES:
            if (!parse_list(optarg, true))
                return USAGE_ERROR("--scales: '%s' is not a list of finite scales > 0", optarg);
            break;
        case O_FORMATS:
            if (!parse_list(optarg, false))
                return USAGE_ERROR("--formats: '%s' is not a list of fp8 dtype names", optarg);
            break;
        case O_THREADS:
            n = strtol(optarg, &end, 10);
            if (*end || n < 1 || n > 256) return USAGE_ERROR("--threads: '%s' is not in 1..256", optarg);
            opt.threads = (int)n;
            break;
        case O_CHUNK:
            n = strtol(optarg, &end, 10);
            if (*end || n < 14 || n > 30) return USAGE_ERROR("--chunk-log2: '%s' is not in 14..30", optarg);
            opt.chunk_log2 = (int)n;
            break;
        case O_LIMIT: {
            unsigned long long v = strtoull(optarg, &end, 10);
            if (*end || v < 1 || v > (1ull << 32)) return USAGE_ERROR("--limit: '%s' is not in 1..4294967296", optarg);
            opt.limit = v;
            break;
        }
        case O_START: {
            unsigned long long v = strtoull(optarg, &end, 0);
            if (*end || v >= (1ull << 32)) return USAGE_ERROR("--start: '%s' is not a 32-bit pattern", optarg);
            opt.start = v;
            break;
        }
        case O_HELP: usage(); return 0;
        case O_VERSION: printf(TOOL " %s\n", KVHAL_PROJECT_VERSION); return 0;
        default: return USAGE_ERROR("unknown option or missing value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return USAGE_ERROR("unexpected argument '%s'", argv[optind]);
    if (!opt.nscales)
        for (size_t i = 0; i < sizeof default_scales / sizeof default_scales[0]; i++)
            opt.scales[opt.nscales++] = default_scales[i];
    if (!opt.nformats)
        for (int d = 0; d < 32; d++)
            if (kvhal_dtype_size((kvhal_dtype)d) == 1 && opt.nformats < MAX_FORMATS)
                opt.formats[opt.nformats++] = (kvhal_dtype)d;
    if (opt.start + opt.limit > (1ull << 32))
        return USAGE_ERROR("--start + --limit: past the last f32 pattern (start %s)", "");
    if (!opt.math && opt.start % ((uint64_t)1 << opt.chunk_log2))
        return USAGE_ERROR("--start: must be a multiple of the chunk for the device check%s", "");
    if (opt.naive && !opt.math) return USAGE_ERROR("--naive needs --math%s", "");
    if (opt.strided && opt.math) return USAGE_ERROR("--strided is for the device check, not --math%s", "");
    if (!opt.math && opt.limit % ((uint64_t)1 << opt.chunk_log2))
        return USAGE_ERROR("--limit: must be a multiple of the chunk (2^--chunk-log2) for the device check%s", "");
    const int rc = opt.math ? check_math() : check_device();
    printf("%s\n", rc ? "FAILED" : "all fp8 codes match kvhal_f32_to_fp8(x / scale)");
    return rc;
}

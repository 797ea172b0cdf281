/* kvhal-replay — drives a serving workload through the cache manager (block pool + prefix cache) and the paged
 * cache, the way an inference engine would: per request match + lock, allocate, write K and V of every new token
 * in every layer with the paged-caching op, decode steps appending one token at a time, cache_finished. Every
 * prefix hit is verified by reading back sampled rows of the matched prefix: the content written for a token is
 * a function of a rolling hash of the token ids up to it (and of layer, head and K/V), so a wrong page returned by
 * the prefix cache is detected, not just a wrong position. --no-kv keeps only the page bookkeeping (the radix
 * benchmark) and checks hits against a per-page shadow of the prefix hash instead.
 * Workloads: the generated shared-prefix shape (groups x prompts, system prompt, question, output; optional zipf
 * group popularity) or a JSONL trace {timestamp, input_length, output_length, hash_ids}. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <getopt.h>

#include "kvhal.h"
#include "replay_trace.h"
#include "tool_common.h"

static const char *const tool = "kvhal-replay";

/* The first failure of the run: printed as "kvhal-replay: error: ..." when it happens, and the error object of the
 * JSON output (tool conventions, README "Tools"). */
static char failure_status[64], failure_message[1024];
static void fail(const char *status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(const char *status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: error: %s\n", tool, msg);
    if (!failure_status[0]) {
        snprintf(failure_status, sizeof failure_status, "%s", status);
        snprintf(failure_message, sizeof failure_message, "%s", msg);
    }
}

/* ---------------------------------------------------------------------------------------------------------- */
/* options                                                                                                    */
/* ---------------------------------------------------------------------------------------------------------- */

typedef struct model_preset {
    const char *name;
    int32_t layers, kv_heads, head_dim;
    kvhal_dtype dtype;
} model_preset;

static const model_preset presets[] = {
    {"tiny", 2, 2, 32, KVHAL_F16}, /* 512 bytes of K+V per token: the whole default run fits the CPU in seconds */
    {"llama3-8b", 32, 8, 128, KVHAL_BF16},
    {"llama3-70b", 80, 8, 128, KVHAL_BF16},
    {"mistral-7b", 32, 8, 128, KVHAL_BF16},
    {"qwen2.5-7b", 28, 4, 128, KVHAL_BF16},
};

typedef struct options {
    bool trace_mode;
    const char *trace_path;
    int64_t trace_block, max_requests, vocab;
    int64_t groups, prompts, system_len, question_len, output_len;
    double zipf;
    const char *model;
    int32_t layers, kv_heads, head_dim;
    kvhal_dtype dtype;
    uint64_t budget;
    int32_t page_size;
    kvhal_prefix_kind kind;
    kvhal_paged_layout layout;
    kvhal_paged_order order;
    int32_t batch, samples, chunk;
    bool no_kv, json, quiet, cold_tokens, finish_whole;
    bool trace_by_time;      /* --trace-order timestamp */
    double arrival_scale;    /* --arrival-gaps S: seconds per trace timestamp unit, 0 = as fast as the cache allows */
    int64_t repeat, check_every;
    uint64_t seed;
    /* issue 17: a host tier under the device pages, and KV events */
    uint64_t host_tier;       /* bytes of host pages; 0: none */
    kvhal_write_policy write_policy;
    const char *events_path;  /* JSON lines of KV events; NULL: none */
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvhal-replay [options]        (--opt=value and --opt value alike)\n"
            "Replays a serving workload through kvhal's cache manager, prefix cache and paged cache, verifying\n"
            "every prefix hit. KVHAL_DEVICE=cuda:0 (hip:0, opencl:0) runs it on that device (default cpu).\n"
            "\nworkload (default: generated shared prefix)\n"
            "  --groups N          groups sharing a system prompt (64)\n"
            "  --prompts N         prompts per group (16)\n"
            "  --system-len N      system prompt tokens (2048)\n"
            "  --question-len N    question tokens (128)\n"
            "  --output-len N      output tokens, decoded one at a time (256)\n"
            "  --zipf S            draw each request's group with popularity 1/rank^S\n"
            "                      (0: every group exactly --prompts times)\n"
            "  --trace FILE        JSONL trace {timestamp, input_length, output_length, hash_ids} instead\n"
            "  --trace-block N     tokens per hash id of the trace (512); a line must carry ceil(input_length / N)\n"
            "  --trace-order O     file (default) or timestamp (a stable sort by timestamp)\n"
            "  --arrival-gaps S    admit each trace request no earlier than S seconds per timestamp unit after the\n"
            "                      first (0.001: a trace in milliseconds, in real time); idle waits are not\n"
            "                      engine time\n"
            "  --max-requests N    replay only the first N requests (0: all)\n"
            "  --vocab N           token ids are drawn from [0, N) (128256)\n"
            "\nmodel and cache\n"
            "  --model NAME        tiny (default), llama3-8b, llama3-70b, mistral-7b, qwen2.5-7b\n"
            "  --layers N --kv-heads N --head-dim N   override the model's shape\n"
            "  --dtype T           f32, f16, bf16, fp8_e4m3, fp8_e5m2 (the model's)\n"
            "  --kv-budget SIZE    bytes of K and V for all layers, e.g. 2GiB, 512MiB (512MiB)\n"
            "  --page-size N       tokens per page (16)\n"
            "  --prefix KIND       radix (default) or naive\n"
            "  --layout L          nhd (default) or hnd;  --order O: layer (default) or page\n"
            "\nrun\n"
            "  --batch N           requests decoding together (8)\n"
            "  --no-kv             page bookkeeping only, no paged cache or K/V writes (radix benchmark)\n"
            "  --cold-tokens       leave each request's tokens where the pre-generated workload has them (by default\n"
            "                      they are read once ahead of the request, unmeasured, as a tokenizer leaves them)\n"
            "  --finish-whole      finish requests with cache_finished (the whole request's tokens and pages, the\n"
            "                      matched prefix compared again) instead of cache_finished_suffix (what follows it)\n"
            "  --repeat N          replay the workload N times, each on a fresh cache, for a stable figure (1)\n"
            "  --seed S            workload seed (1)\n"
            "  --check-every N     check_integrity every N finished requests (0: only at the end)\n"
            "  --verify-samples N  rows (pages with --no-kv) read back per prefix hit (4; 0: off)\n"
            "  --prefill-chunk N   tokens per paged-caching call in prefill (512)\n"
            "  -j, --json          print one JSON summary object on stdout (percentiles of the per-call\n"
            "                      times, null for what was not measured, an error object on failure)\n"
            "  --quiet             no progress output\n"
            "  --soak              a fixed set of runs under eviction pressure with frequent integrity checks\n"
            "\nhost tier and KV events\n"
            "  --host-tier SIZE    host pages under the device cache (e.g. 4GiB): evicted prefixes are kept in host\n"
            "                      memory and loaded back on a hit (every loaded page verified); 0: none (default)\n"
            "  --write-policy P    through (copy to host when a request finishes, default) or back (when evicted)\n"
            "  --events FILE       write the KV events (stored/removed/cleared per tier, hash chain, tokens) as JSON\n"
            "                      lines\n"
            "  -h, --help          this text;  -V, --version: \"kvhal-replay <kvhal version>\"\n"
            "\nexit status: 0 every run passed, 1 a run or a verification failed, 2 usage error\n");
}

static int opt_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int opt_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tool_usage_error(tool, "%s", msg);
    return -1;
}

static int parse_size(const char *flag, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !(x >= 0)) return opt_error("%s: '%s' is not a size (e.g. 2GiB, 512MiB, 1e9)", flag, v);
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1},           {"B", 1},          {"K", 1024.0},     {"KiB", 1024.0},   {"KB", 1e3},
        {"M", 1048576.0},  {"MiB", 1048576.0}, {"MB", 1e6},       {"G", 1073741824.0}, {"GiB", 1073741824.0},
        {"GB", 1e9},       {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix)) {
            double b = x * units[i].mult;
            if (b > 1.8e19) return opt_error("%s: '%s' is too large", flag, v);
            *out = (uint64_t)b;
            return 0;
        }
    return opt_error("%s: unknown unit '%s' in '%s' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", flag, end, v);
}

static int parse_dtype(const char *v, kvhal_dtype *out)
{
    static const struct { const char *name; kvhal_dtype dt; } names[] = {
        {"f32", KVHAL_F32}, {"f16", KVHAL_F16}, {"bf16", KVHAL_BF16}, {"fp8_e4m3", KVHAL_FP8_E4M3},
        {"fp8_e5m2", KVHAL_FP8_E5M2},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(v, names[i].name)) {
            *out = names[i].dt;
            return 0;
        }
    return opt_error("--dtype: '%s' is not f32, f16, bf16, fp8_e4m3 or fp8_e5m2", v);
}

/* --host-tier, --write-policy, --events: 1 when a consumed a value, 0 when a is not one of them, -1 on error. */
static int tier_option(const char *a, const char *v, options *o)
{
    if (strcmp(a, "--host-tier") && strcmp(a, "--write-policy") && strcmp(a, "--events")) return 0;
    if (!v) return opt_error("%s needs a value", a);
    if (!strcmp(a, "--host-tier")) return parse_size(a, v, &o->host_tier) ? -1 : 1;
    if (!strcmp(a, "--events")) {
        o->events_path = v;
        return 1;
    }
    if (!strcmp(v, "through")) o->write_policy = KVHAL_WRITE_THROUGH;
    else if (!strcmp(v, "back")) o->write_policy = KVHAL_WRITE_BACK;
    else return opt_error("--write-policy: '%s' is not through or back", v);
    return 1;
}

static void default_options(options *o)
{
    memset(o, 0, sizeof *o);
    o->trace_block = 512;
    o->vocab = 128256;
    o->groups = 64;
    o->prompts = 16;
    o->system_len = 2048;
    o->question_len = 128;
    o->output_len = 256;
    o->model = "tiny";
    o->layers = o->kv_heads = o->head_dim = 0;
    o->dtype = (kvhal_dtype)-1; /* the model's */
    o->budget = 512ull << 20;
    o->page_size = 16;
    o->kind = KVHAL_PREFIX_RADIX;
    o->layout = KVHAL_LAYOUT_NHD;
    o->order = KVHAL_LAYER_FIRST;
    o->batch = 8;
    o->samples = 4;
    o->chunk = 512;
    o->repeat = 1;
    o->seed = 1;
}

#define INT_OPTIONS(X)                                                                                          \
    X("groups", O_GROUPS, 1, 1 << 20, groups)                                                                   \
    X("prompts", O_PROMPTS, 1, 1 << 20, prompts)                                                                \
    X("system-len", O_SYSTEM_LEN, 0, 1 << 22, system_len)                                                       \
    X("question-len", O_QUESTION_LEN, 0, 1 << 22, question_len)                                                 \
    X("output-len", O_OUTPUT_LEN, 0, 1 << 22, output_len)                                                       \
    X("trace-block", O_TRACE_BLOCK, 1, 1 << 20, trace_block)                                                    \
    X("max-requests", O_MAX_REQUESTS, 0, INT64_MAX, max_requests)                                               \
    X("vocab", O_VOCAB, 2, INT32_MAX, vocab)                                                                    \
    X("layers", O_LAYERS, 1, 1024, layers)                                                                      \
    X("kv-heads", O_KV_HEADS, 1, 1024, kv_heads)                                                                \
    X("head-dim", O_HEAD_DIM, 1, 4096, head_dim)                                                                \
    X("page-size", O_PAGE_SIZE, 1, 1 << 16, page_size)                                                          \
    X("batch", O_BATCH, 1, 4096, batch)                                                                         \
    X("repeat", O_REPEAT, 1, 1 << 20, repeat)                                                                   \
    X("check-every", O_CHECK_EVERY, 0, INT64_MAX, check_every)                                                  \
    X("verify-samples", O_VERIFY_SAMPLES, 0, 1 << 16, samples)                                                  \
    X("prefill-chunk", O_PREFILL_CHUNK, 1, 1 << 16, chunk)

enum {
    O_NO_KV = 256, O_COLD_TOKENS, O_FINISH_WHOLE, O_QUIET, O_SOAK, O_SEED, O_ZIPF, O_TRACE, O_MODEL, O_DTYPE,
    O_KV_BUDGET, O_PREFIX, O_LAYOUT, O_ORDER, O_TRACE_ORDER, O_ARRIVAL_GAPS, O_HOST_TIER, O_WRITE_POLICY, O_EVENTS,
#define X_ENUM(name, E, lo, hi, field) E,
    INT_OPTIONS(X_ENUM)
#undef X_ENUM
};

/* Returns 0, 1 for --help, 2 for --soak, 3 for --version, -1 on a bad option (the message printed). getopt_long:
 * --opt=value and --opt value alike. */
static int parse_options(int argc, char **argv, options *o)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"json", no_argument, NULL, 'j'},
        {"no-kv", no_argument, NULL, O_NO_KV},
        {"cold-tokens", no_argument, NULL, O_COLD_TOKENS},
        {"finish-whole", no_argument, NULL, O_FINISH_WHOLE},
        {"quiet", no_argument, NULL, O_QUIET},
        {"soak", no_argument, NULL, O_SOAK},
        {"seed", required_argument, NULL, O_SEED},
        {"zipf", required_argument, NULL, O_ZIPF},
        {"trace", required_argument, NULL, O_TRACE},
        {"trace-order", required_argument, NULL, O_TRACE_ORDER},
        {"arrival-gaps", required_argument, NULL, O_ARRIVAL_GAPS},
        {"host-tier", required_argument, NULL, O_HOST_TIER},
        {"write-policy", required_argument, NULL, O_WRITE_POLICY},
        {"events", required_argument, NULL, O_EVENTS},
        {"model", required_argument, NULL, O_MODEL},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"kv-budget", required_argument, NULL, O_KV_BUDGET},
        {"prefix", required_argument, NULL, O_PREFIX},
        {"layout", required_argument, NULL, O_LAYOUT},
        {"order", required_argument, NULL, O_ORDER},
#define X_LONG(name, E, lo, hi, field) {name, required_argument, NULL, E},
        INT_OPTIONS(X_LONG)
#undef X_LONG
        {NULL, 0, NULL, 0},
    };
    bool soak = false;
    int64_t x;
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, ":hVj", longopts, NULL)) != -1;) {
        const char *v = optarg;
        switch (c) {
        case 'h': return 1;
        case 'V': return 3;
        case 'j': o->json = true; break;
        case O_NO_KV: o->no_kv = true; break;
        case O_COLD_TOKENS: o->cold_tokens = true; break;
        case O_FINISH_WHOLE: o->finish_whole = true; break;
        case O_QUIET: o->quiet = true; break;
        case O_SOAK: soak = true; break;
        case O_HOST_TIER: case O_WRITE_POLICY: case O_EVENTS: {
            const char *flag = c == O_HOST_TIER ? "--host-tier" : c == O_WRITE_POLICY ? "--write-policy" : "--events";
            if (tier_option(flag, v, o) < 0) return -1;
            break;
        }
#define X_CASE(name, E, lo, hi, field)                                                                          \
        case E:                                                                                                 \
            if (!tool_parse_i64(tool, name, v, lo, hi, &x)) return -1;                                          \
            o->field = x;                                                                                       \
            break;
        INT_OPTIONS(X_CASE)
#undef X_CASE
        case O_SEED:
            if (!tool_parse_i64(tool, "seed", v, 0, INT64_MAX, &x)) return -1;
            o->seed = (uint64_t)x;
            break;
        case O_ZIPF:
            if (!tool_parse_f64(tool, "zipf", v, 0, 100, &o->zipf)) return -1;
            break;
        case O_TRACE:
            o->trace_mode = true;
            o->trace_path = v;
            break;
        case O_ARRIVAL_GAPS:
            if (!tool_parse_f64(tool, "arrival-gaps", v, 0, 1e3, &o->arrival_scale)) return -1;
            break;
        case O_TRACE_ORDER:
            if (!strcmp(v, "timestamp")) o->trace_by_time = true;
            else if (!strcmp(v, "file")) o->trace_by_time = false;
            else {
                tool_usage_error(tool, "--trace-order: '%s' is not file or timestamp", v);
                return -1;
            }
            break;
        case O_MODEL: o->model = v; break;
        case O_DTYPE:
            if (parse_dtype(v, &o->dtype)) return -1;
            break;
        case O_KV_BUDGET:
            if (parse_size("--kv-budget", v, &o->budget)) return -1;
            break;
        case O_PREFIX:
            if (!strcmp(v, "radix")) o->kind = KVHAL_PREFIX_RADIX;
            else if (!strcmp(v, "naive")) o->kind = KVHAL_PREFIX_NAIVE;
            else return opt_error("--prefix: '%s' is not radix or naive", v);
            break;
        case O_LAYOUT:
            if (!strcmp(v, "nhd")) o->layout = KVHAL_LAYOUT_NHD;
            else if (!strcmp(v, "hnd")) o->layout = KVHAL_LAYOUT_HND;
            else return opt_error("--layout: '%s' is not nhd or hnd", v);
            break;
        case O_ORDER:
            if (!strcmp(v, "layer")) o->order = KVHAL_LAYER_FIRST;
            else if (!strcmp(v, "page")) o->order = KVHAL_PAGE_FIRST;
            else return opt_error("--order: '%s' is not layer or page", v);
            break;
        case ':': return opt_error("%s needs a value", argv[optind - 1]);
        default: return opt_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) return opt_error("unexpected argument '%s'", argv[optind]);
    const model_preset *m = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (!strcmp(o->model, presets[i].name)) m = &presets[i];
    if (!m) return opt_error("--model: '%s' is not tiny, llama3-8b, llama3-70b, mistral-7b or qwen2.5-7b", o->model);
    if (!o->layers) o->layers = m->layers;
    if (!o->kv_heads) o->kv_heads = m->kv_heads;
    if (!o->head_dim) o->head_dim = m->head_dim;
    if ((int)o->dtype == -1) o->dtype = m->dtype;
    if ((o->host_tier || o->events_path) && o->no_kv)
        return opt_error("--host-tier and --events need the paged cache: not with --no-kv");
    return soak ? 2 : 0;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* workload                                                                                                   */
/* ---------------------------------------------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The rolling hash that names a token's prefix: equal hashes <=> (almost surely) equal token prefixes. */
static inline uint64_t hash_step(uint64_t h, int32_t tok) { return mix64(h + 0x9e3779b97f4a7c15ULL + (uint32_t)tok); }
#define HASH_START 0x6b7668616c2d7270ULL

typedef struct wreq {
    uint32_t in_len, out_len;
    int32_t group;   /* shared prefix: the group; trace: -1 */
    uint32_t index;  /* shared prefix: index in the group; trace: index in the trace */
} wreq;

typedef struct workload {
    bool trace;
    wreq *reqs;
    size_t n;
    size_t max_len;
    uint64_t total_in, total_out;
    /* materialized tokens and prefix hashes of every request when they fit. hash[k] names the prefix through
     * token (k+1)*hstride-1: every token (hstride 1) for K/V content, every page end with --no-kv */
    int32_t *tok;
    uint64_t *hash; /* K/V mode */
    uint32_t *tag;  /* --no-kv: the 32 bits of each hash that the shadow keeps; half the memory to stream */
    size_t *toff, *hoff;
    size_t hstride;
    replay_trace tr;
    int64_t block, vocab;
    uint64_t seed;
    int64_t system_len, question_len;
    char name[256];
} workload;

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    return mix64(*s);
}

/* Tokens of request i, and its prefix hashes (hash) or their low 32 bits (tag), whichever is not NULL. */
static void gen_tokens(const workload *w, size_t i, int32_t *tok, uint64_t *hash, uint32_t *tag)
{
    size_t hs = w->hstride;
    const wreq *r = &w->reqs[i];
    size_t n = (size_t)r->in_len + r->out_len;
    uint64_t salt = mix64(w->seed * 0x2545f4914f6cdd1dULL + 17);
    uint64_t req_key = mix64(salt ^ (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ULL);
    for (size_t j = 0; j < n; j++) {
        uint64_t k;
        if (!w->trace) {
            if (j < (size_t)w->system_len)
                k = mix64(salt + (uint64_t)r->group * 0x100000001b3ULL + j * 0x9e3779b97f4a7c15ULL);
            else
                k = mix64(req_key + j);
        } else {
            const replay_trace_request *t = &w->tr.reqs[r->index];
            size_t b = j / (size_t)w->block;
            if (j < (size_t)r->in_len && b < t->num_ids)
                k = mix64(mix64(w->tr.ids[t->first_id + b] + salt) + (j % (size_t)w->block));
            else
                k = mix64(req_key + j);
        }
        tok[j] = (int32_t)(k % (uint64_t)w->vocab);
    }
    uint64_t h = HASH_START;
    for (size_t j = 0; j < n; j++) {
        h = hash_step(h, tok[j]);
        if ((j + 1) % hs == 0) {
            if (hash) hash[j / hs] = h;
            else tag[j / hs] = (uint32_t)h;
        }
    }
}

static int workload_init(workload *w, const options *o)
{
    memset(w, 0, sizeof *w);
    w->seed = o->seed;
    w->vocab = o->vocab;
    w->block = o->trace_block;
    w->system_len = o->system_len;
    w->question_len = o->question_len;
    w->hstride = o->no_kv ? (size_t)o->page_size : 1;
    uint64_t rng = mix64(o->seed ^ 0x7265706c6179ULL);
    if (o->trace_mode) {
        char err[1024];
        if (replay_trace_load_block(o->trace_path, o->trace_block, &w->tr, err, sizeof err) != 0) {
            fail("TRACE_INVALID", "%s", err);
            return -1;
        }
        if (w->tr.empty)
            fprintf(stderr, "kvhal-replay: %zu zero-length requests in the trace are not requests: left out "
                    "(counted as skipped_empty)\n", w->tr.empty);
        if (w->tr.ts_regressions)
            fprintf(stderr, "kvhal-replay: warning: timestamps go back %zu times (first at line %zu); replayed in %s "
                    "order\n", w->tr.ts_regressions, w->tr.first_regression_line,
                    o->trace_by_time ? "timestamp" : "file (--trace-order timestamp sorts them)");
        if (o->trace_by_time) replay_trace_sort_by_time(&w->tr);
        w->trace = true;
        w->n = w->tr.count;
        if (o->max_requests && (size_t)o->max_requests < w->n) w->n = (size_t)o->max_requests;
        w->reqs = calloc(w->n, sizeof *w->reqs);
        if (!w->reqs) return -1;
        for (size_t i = 0; i < w->n; i++) {
            w->reqs[i].in_len = (uint32_t)w->tr.reqs[i].input_length;
            w->reqs[i].out_len = (uint32_t)w->tr.reqs[i].output_length;
            w->reqs[i].group = -1;
            w->reqs[i].index = (uint32_t)i;
        }
        snprintf(w->name, sizeof w->name, "trace %s (%zu requests, block %lld)", o->trace_path, w->n,
                 (long long)o->trace_block);
    } else {
        w->n = (size_t)(o->groups * o->prompts);
        if (o->max_requests && (size_t)o->max_requests < w->n) w->n = (size_t)o->max_requests;
        size_t all = (size_t)(o->groups * o->prompts);
        w->reqs = calloc(all, sizeof *w->reqs);
        double *cdf = o->zipf > 0 ? calloc((size_t)o->groups, sizeof *cdf) : NULL;
        if (!w->reqs || (o->zipf > 0 && !cdf)) {
            free(cdf);
            return -1;
        }
        if (cdf) {
            double sum = 0;
            for (int64_t g = 0; g < o->groups; g++) cdf[g] = sum += 1.0 / pow((double)(g + 1), o->zipf);
            for (int64_t g = 0; g < o->groups; g++) cdf[g] /= sum;
        }
        for (size_t i = 0; i < all; i++) {
            wreq *r = &w->reqs[i];
            if (cdf) {
                double u = (double)(rng_next(&rng) >> 11) * 0x1p-53;
                size_t lo = 0, hi = (size_t)o->groups - 1;
                while (lo < hi) {
                    size_t mid = (lo + hi) / 2;
                    if (cdf[mid] < u) lo = mid + 1; else hi = mid;
                }
                r->group = (int32_t)lo;
            } else {
                r->group = (int32_t)(i / (size_t)o->prompts);
            }
            r->index = (uint32_t)i;
            r->in_len = (uint32_t)(o->system_len + o->question_len);
            r->out_len = (uint32_t)o->output_len;
        }
        free(cdf);
        /* arrival order: shuffled, as a serving benchmark sends them */
        for (size_t i = all; i > 1; i--) {
            size_t j = (size_t)(rng_next(&rng) % i);
            wreq t = w->reqs[i - 1];
            w->reqs[i - 1] = w->reqs[j];
            w->reqs[j] = t;
        }
        snprintf(w->name, sizeof w->name, "shared prefix: %lld groups x %lld prompts%s, system %lld, question %lld, "
                 "output %lld", (long long)o->groups, (long long)o->prompts, o->zipf > 0 ? " (zipf)" : "",
                 (long long)o->system_len, (long long)o->question_len, (long long)o->output_len);
        if (o->zipf > 0) {
            size_t len = strlen(w->name);
            snprintf(w->name + len, sizeof w->name - len, ", zipf %g", o->zipf);
        }
    }
    size_t total = 0, htotal = 0;
    for (size_t i = 0; i < w->n; i++) {
        size_t len = (size_t)w->reqs[i].in_len + w->reqs[i].out_len;
        if (len > w->max_len) w->max_len = len;
        w->total_in += w->reqs[i].in_len;
        w->total_out += w->reqs[i].out_len;
        total += len;
        htotal += len / w->hstride;
    }
    /* Materialize up to 32M tokens (384 MiB) so that generation stays out of the measured loop; bigger traces
     * are generated per request, with that time taken out of the figures. */
    if (total <= ((size_t)32 << 20)) {
        w->tok = malloc((total + 1) * sizeof *w->tok);
        if (o->no_kv) w->tag = malloc((htotal + 1) * sizeof *w->tag);
        else w->hash = malloc((htotal + 1) * sizeof *w->hash);
        w->toff = malloc((w->n + 1) * sizeof *w->toff);
        w->hoff = malloc((w->n + 1) * sizeof *w->hoff);
        if (!w->tok || (!w->hash && !w->tag) || !w->toff || !w->hoff) {
            free(w->tok);
            free(w->hash);
            free(w->tag);
            free(w->toff);
            free(w->hoff);
            w->tok = NULL;
            w->hash = NULL;
            w->tag = NULL;
            w->toff = w->hoff = NULL;
        } else {
            size_t off = 0, hoff = 0;
            for (size_t i = 0; i < w->n; i++) {
                size_t len = (size_t)w->reqs[i].in_len + w->reqs[i].out_len;
                w->toff[i] = off;
                w->hoff[i] = hoff;
                gen_tokens(w, i, w->tok + off, w->hash ? w->hash + hoff : NULL, w->tag ? w->tag + hoff : NULL);
                off += len;
                hoff += len / w->hstride;
            }
        }
    }
    return 0;
}

static void workload_free(workload *w)
{
    free(w->reqs);
    free(w->tok);
    free(w->hash);
    free(w->tag);
    free(w->toff);
    free(w->hoff);
    if (w->trace) replay_trace_free(&w->tr);
    memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* K/V content and the paged cache                                                                            */
/* ---------------------------------------------------------------------------------------------------------- */

/* The row of a token (all heads x dim of one layer, K or V) is a slice of a fixed random table, starting at an
 * offset drawn from (prefix hash, layer, K/V): generating it is a memcpy, and any other prefix, layer or side
 * lands elsewhere in the table. Values are small integers, exact in every cache dtype including fp8. */
#define TABLE_N (1u << 16)

typedef struct kvstate {
    kvhal_device dev;
    kvhal_paged_cache *cache;
    kvhal_dtype cdt, idt;
    size_t ces, ies;
    int32_t layers, heads, dim, ps;
    size_t row;               /* heads * dim elements */
    uint8_t *tab_in, *tab_cache;
    size_t chunk;
    kvhal_buffer *kbuf, *vbuf, *sbuf;
    uint8_t *khost, *vhost;
    int64_t *shost;
    kvhal_tensor *layer_k, *layer_v; /* views for read-back */
    uint8_t *readbuf;
} kvstate;

static inline size_t row_offset(uint64_t hash, int32_t layer, int side)
{
    return (size_t)(mix64(hash ^ ((uint64_t)(layer + 1) * 0xd6e8feb86659fd93ULL) ^ ((uint64_t)(side + 1) << 56)) &
                    (TABLE_N - 1));
}

static const char *status_msg(kvhal_status st)
{
    const char *m = kvhal_last_error();
    return *m ? m : kvhal_status_name(st);
}

static int kv_init(kvstate *kv, const options *o, int64_t *num_pages)
{
    memset(kv, 0, sizeof *kv);
    kvhal_status st = kvhal_device_default(&kv->dev);
    if (st != KVHAL_OK) {
        fail(kvhal_status_name(st), "KVHAL_DEVICE: %s", status_msg(st));
        return -1;
    }
    kvhal_paged_cache_config cfg = KVHAL_PAGED_CACHE_CONFIG_INIT;
    cfg.num_layers = o->layers;
    cfg.num_heads = o->kv_heads;
    cfg.head_dim = o->head_dim;
    cfg.block_size = o->page_size;
    cfg.dtype = o->dtype;
    cfg.layout = o->layout;
    cfg.order = o->order;
    cfg.memory_budget = o->budget;
    cfg.device = kv->dev;
    st = kvhal_paged_cache_create(&cfg, &kv->cache);
    if (st != KVHAL_OK) {
        fail(kvhal_status_name(st), "paged cache: %s", status_msg(st));
        return -1;
    }
    *num_pages = kvhal_paged_cache_num_blocks(kv->cache);
    kv->cdt = o->dtype;
    kv->idt = (o->dtype == KVHAL_FP8_E4M3 || o->dtype == KVHAL_FP8_E5M2) ? KVHAL_F16 : o->dtype;
    kv->ces = kvhal_dtype_size(kv->cdt);
    kv->ies = kvhal_dtype_size(kv->idt);
    kv->layers = o->layers;
    kv->heads = o->kv_heads;
    kv->dim = o->head_dim;
    kv->ps = o->page_size;
    kv->row = (size_t)o->kv_heads * (size_t)o->head_dim;
    kv->chunk = (size_t)o->chunk;
    size_t tab = TABLE_N + kv->row;
    kv->tab_in = malloc(tab * kv->ies);
    kv->tab_cache = malloc(tab * kv->ces);
    kv->khost = malloc(kv->chunk * kv->row * kv->ies);
    kv->vhost = malloc(kv->chunk * kv->row * kv->ies);
    kv->shost = malloc(kv->chunk * sizeof(int64_t));
    kv->layer_k = calloc((size_t)kv->layers, sizeof(kvhal_tensor));
    kv->layer_v = calloc((size_t)kv->layers, sizeof(kvhal_tensor));
    kv->readbuf = malloc(kv->row * kv->ces);
    if (!kv->tab_in || !kv->tab_cache || !kv->khost || !kv->vhost || !kv->shost || !kv->layer_k || !kv->layer_v ||
        !kv->readbuf) {
        fail("KVHAL_OUT_OF_MEMORY", "out of host memory for the K/V staging buffers");
        return -1;
    }
    uint64_t rng = 0x7461626c65ULL;
    for (size_t i = 0; i < tab; i++) {
        float v = (float)((int)(rng_next(&rng) % 15) - 7);
        uint8_t *in = kv->tab_in + i * kv->ies, *ca = kv->tab_cache + i * kv->ces;
        uint16_t h16;
        switch (kv->idt) {
        case KVHAL_F32: memcpy(in, &v, 4); break;
        case KVHAL_BF16: h16 = kvhal_f32_to_bf16(v); memcpy(in, &h16, 2); break;
        default: h16 = kvhal_f32_to_f16(v); memcpy(in, &h16, 2); break;
        }
        if (kv->cdt == KVHAL_FP8_E4M3 || kv->cdt == KVHAL_FP8_E5M2) *ca = kvhal_f32_to_fp8(v, kv->cdt);
        else memcpy(ca, in, kv->ces);
    }
    size_t kvbytes = kv->chunk * kv->row * kv->ies;
    if ((st = kvhal_buffer_create(kv->dev, kvbytes, &kv->kbuf)) != KVHAL_OK ||
        (st = kvhal_buffer_create(kv->dev, kvbytes, &kv->vbuf)) != KVHAL_OK ||
        (st = kvhal_buffer_create(kv->dev, kv->chunk * sizeof(int64_t), &kv->sbuf)) != KVHAL_OK) {
        fail(kvhal_status_name(st), "staging buffers: %s", status_msg(st));
        return -1;
    }
    for (int32_t l = 0; l < kv->layers; l++)
        if ((st = kvhal_paged_cache_layer(kv->cache, l, &kv->layer_k[l], &kv->layer_v[l])) != KVHAL_OK) {
            fail(kvhal_status_name(st), "paged cache layer %d: %s", (int)l, status_msg(st));
            return -1;
        }
    return 0;
}

static void kv_free(kvstate *kv)
{
    if (kv->kbuf) kvhal_buffer_destroy(kv->kbuf);
    if (kv->vbuf) kvhal_buffer_destroy(kv->vbuf);
    if (kv->sbuf) kvhal_buffer_destroy(kv->sbuf);
    if (kv->cache) kvhal_paged_cache_destroy(kv->cache);
    free(kv->tab_in);
    free(kv->tab_cache);
    free(kv->khost);
    free(kv->vhost);
    free(kv->shost);
    free(kv->layer_k);
    free(kv->layer_v);
    free(kv->readbuf);
    memset(kv, 0, sizeof *kv);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* the replay                                                                                                 */
/* ---------------------------------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Timestamps for the per-request timings inside the engine loop (match, cache_finished, the stretches that are
 * not engine work), several per request: clock_gettime costs ~30 ns on a VM, which would be a tenth of a
 * request's time at page size 1. Where the kernel itself keeps time with the TSC (so it runs at a constant rate
 * on every core), tick() reads it directly (between two lfences), and run_once converts ticks to seconds per pass
 * against CLOCK_MONOTONIC; elsewhere a tick is a nanosecond of CLOCK_MONOTONIC. */
static bool use_tsc;

static void tick_init(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    char cs[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f) {
        if (!fgets(cs, sizeof cs, f)) cs[0] = '\0';
        fclose(f);
    }
    use_tsc = strcmp(cs, "tsc\n") == 0;
#endif
}

static inline uint64_t tick(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (use_tsc) {
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

/* CPU time of the process: on a shared machine the wall clock also counts other programs' turns. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct slot {
    bool active;
    size_t req;
    const int32_t *tok;
    const uint64_t *hash; /* K/V mode */
    const uint32_t *tag;  /* --no-kv */
    int32_t *tokbuf;
    uint64_t *hashbuf;
    uint32_t *tagbuf;
    int32_t *pages;
    size_t in_len, total, len, matched;
    size_t dev_matched; /* of matched, what the device had (the rest was loaded back from the host tier) */
    size_t npages, in_page; /* pages held; tokens in the last page (len % page size), kept to avoid divisions */
    kvhal_prefix_handle h;
    int64_t reserve; /* pages its decode will still allocate */
} slot;

typedef struct stats {
    uint64_t requests, skipped, in_tokens, out_tokens, hit_tokens, hit_requests;
    uint64_t match_calls, finish_calls, bytes_written, pages_evicted, verified, mismatches;
    uint64_t integrity_checks, integrity_failures, errors, evict_calls;
    uint64_t host_hit_tokens, host_hit_requests, loaded_verified, events_written;
    double t_engine, t_engine_cpu, t_match, t_finish, t_write, t_wall, evict_s;
    double best_pass_rps; /* the least disturbed pass: on a shared machine the others include other programs */
    int64_t peak_in_use, total_pages;
    size_t evict_cached_min;
    uint64_t ideal_hit_tokens; /* what a cache that never evicts would have hit on this run's schedule */
    /* per-call times in microseconds over all passes, for the percentiles */
    double *match_us, *finish_us, *evict_us;
    size_t n_match_us, n_finish_us, n_evict_us, cap_us, cap_evict_us;
} stats;

typedef struct replay {
    const options *o;
    workload *w;
    kvstate *kv; /* NULL with --no-kv */
    kvhal_cache_manager *cm;
    /* the unbounded reference on this run's own schedule: the chain hash (kvhal_kv_page_hash) of every page any
     * finished request handed to the cache in this pass, an open-addressing set (0 = empty slot) */
    uint64_t *ideal;
    size_t ideal_cap, ideal_n;
    bool tiered;   /* --host-tier or --events */
    FILE *events;  /* --events */
    int32_t *evtok;
    kvhal_kv_event *evbuf;
    int64_t total_pages;
    int32_t ps;
    slot *slots;
    int32_t nslots;
    int64_t reserved;
    uint32_t *shadow;   /* --no-kv: per page, 32 bits of the prefix hash of its last token (half the memory
                         * traffic of 64; a wrong page still fails each check with probability 1 - 2^-32) */
    uint64_t rng;
    stats st;
    /* decode batch scratch */
    uint64_t *bhash;
    int64_t *bslot;
    int32_t *newpages;
    size_t newpages_cap;
    slot **dec;   /* running requests still decoding, in admission order */
    slot **fin;   /* requests done with their tokens, waiting for cache_finished */
    int32_t ndec, nfin;
    /* progress */
    bool tty;
    double last_progress, t_start;
    size_t done_total, work_total;
    int last_decile;
    int64_t repeat_index;
    uint64_t excluded; /* ticks of generation, verification and checks inside the pass, not engine work */
    uint64_t match_ticks, finish_ticks; /* in the pass */
    uint64_t *match_samples, *finish_samples; /* per call, in ticks, in the pass (converted at its end) */
    size_t n_match_samples, n_finish_samples;
    size_t samples_cap; /* room in each array: a request may be matched again after a refusal, so calls past it
                           are timed but not kept as samples */
    uint32_t sink;   /* what reading a request's tokens ahead of it summed up (kept so that the read stays) */
} replay;

static void fatal_status(replay *r, const char *what, kvhal_status st)
{
    fail(kvhal_status_name(st), "%s: %s", what, status_msg(st));
    r->st.errors++;
}

static void progress(replay *r, bool force)
{
    if (r->o->quiet || r->o->json) return;
    double t = now_s();
    if (r->tty) {
        if (!force && t - r->last_progress < 0.1) return;
        r->last_progress = t;
        double frac = r->work_total ? (double)r->done_total / (double)r->work_total : 1;
        int width = 30, fill = (int)(frac * width);
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        double el = t - r->t_start;
        double hit = r->st.in_tokens ? 100.0 * (double)r->st.hit_tokens / (double)r->st.in_tokens : 0;
        fprintf(stderr, "\r[%s] %3.0f%%  %zu/%zu requests  %.0f req/s  hit %.1f%%  ", bar, 100 * frac, r->done_total,
                r->work_total, el > 0 ? (double)r->done_total / el : 0, hit);
        if (force) fputc('\n', stderr);
        fflush(stderr);
    } else {
        int decile = r->work_total ? (int)(10 * r->done_total / r->work_total) : 10;
        if (decile == r->last_decile) return;
        r->last_decile = decile;
        fprintf(stderr, "kvhal-replay: %d%% (%zu/%zu requests, %.1f s)\n", decile * 10, r->done_total, r->work_total,
                t - r->t_start);
    }
}

/* Writes K and V of n tokens (prefix hashes hash[i], cache slots slots[i]) in every layer. */
static int write_kv(replay *r, const uint64_t *hash, const int64_t *slots, size_t n)
{
    kvstate *kv = r->kv;
    for (size_t base = 0; base < n; base += kv->chunk) {
        size_t m = n - base < kv->chunk ? n - base : kv->chunk;
        kvhal_status st = kvhal_memcpy_h2d(kv->sbuf, 0, slots + base, m * sizeof(int64_t), NULL);
        if (st != KVHAL_OK) return fatal_status(r, "slot mapping upload", st), -1;
        int64_t kshape[3] = {(int64_t)m, kv->heads, kv->dim}, sshape[1] = {(int64_t)m};
        kvhal_tensor kt, vt, s;
        if ((st = kvhal_tensor_make(kv->kbuf, 0, kv->idt, 3, kshape, NULL, &kt)) != KVHAL_OK ||
            (st = kvhal_tensor_make(kv->vbuf, 0, kv->idt, 3, kshape, NULL, &vt)) != KVHAL_OK ||
            (st = kvhal_tensor_make(kv->sbuf, 0, KVHAL_I64, 1, sshape, NULL, &s)) != KVHAL_OK)
            return fatal_status(r, "tensor", st), -1;
        size_t rb = kv->row * kv->ies;
        for (int32_t l = 0; l < kv->layers; l++) {
            for (size_t i = 0; i < m; i++) {
                memcpy(kv->khost + i * rb, kv->tab_in + row_offset(hash[base + i], l, 0) * kv->ies, rb);
                memcpy(kv->vhost + i * rb, kv->tab_in + row_offset(hash[base + i], l, 1) * kv->ies, rb);
            }
            if ((st = kvhal_memcpy_h2d(kv->kbuf, 0, kv->khost, m * rb, NULL)) != KVHAL_OK ||
                (st = kvhal_memcpy_h2d(kv->vbuf, 0, kv->vhost, m * rb, NULL)) != KVHAL_OK)
                return fatal_status(r, "K/V upload", st), -1;
            double t0 = now_s();
            st = kvhal_paged_cache_update(kv->cache, l, &kt, &vt, &s, NULL);
            if (st == KVHAL_OK) st = kvhal_device_synchronize(kv->dev);
            r->st.t_write += now_s() - t0;
            if (st != KVHAL_OK) return fatal_status(r, "paged caching", st), -1;
        }
        r->st.bytes_written += (uint64_t)m * kv->row * kv->ces * 2 * (uint64_t)kv->layers;
    }
    return 0;
}

static void report_mismatch(replay *r, const slot *s, size_t pos, int32_t layer, int side, int32_t head)
{
    r->st.mismatches++;
    if (r->st.mismatches <= 10) {
        char where[48] = ""; /* K/V mode: which row of which layer */
        if (layer >= 0)
            snprintf(where, sizeof where, ", layer %d, %s%s", (int)layer, side ? "V" : "K",
                     head >= 0 ? " (a head differs)" : "");
        fail("VERIFICATION_FAILED", "MISMATCH: request %zu, token %zu of its %zu-token cached prefix (page %d, "
                "offset %zu)%s: the cache holds another prefix's data", s->req, pos, s->matched,
                (int)s->pages[pos / (size_t)r->ps], pos % (size_t)r->ps, where);
    }
}

/* Reads back the row of token pos of s's matched prefix (--no-kv: its page's shadow) in a random layer. */
static void verify_row(replay *r, slot *s, size_t pos)
{
    size_t ps = (size_t)r->ps;
    if (!r->kv) {
        size_t pi = pos / ps;
        if (r->shadow[s->pages[pi]] != s->tag[pi]) report_mismatch(r, s, pi * ps, -1, -1, -1);
        r->st.verified++;
        return;
    }
    kvstate *kv = r->kv;
    int32_t layer = (int32_t)(rng_next(&r->rng) % (uint64_t)kv->layers);
    for (int side = 0; side < 2; side++) {
        const kvhal_tensor *t = side ? &kv->layer_v[layer] : &kv->layer_k[layer];
        int64_t page = s->pages[pos / ps], off = (int64_t)(pos % ps);
        const uint8_t *expect = kv->tab_cache + row_offset(s->hash[pos], layer, side) * kv->ces;
        for (int32_t h = 0; h < kv->heads; h++) {
            uint8_t *dst = kv->readbuf + (size_t)h * (size_t)kv->dim * kv->ces;
            size_t el = (size_t)(page * t->strides[0] + off * t->strides[1] + h * t->strides[2]);
            kvhal_status st;
            if (t->strides[3] == 1) {
                st = kvhal_memcpy_d2h(dst, t->buffer, t->offset + el * kv->ces, (size_t)kv->dim * kv->ces, NULL);
            } else {
                st = KVHAL_OK;
                for (int32_t d = 0; d < kv->dim && st == KVHAL_OK; d++)
                    st = kvhal_memcpy_d2h(dst + (size_t)d * kv->ces, t->buffer,
                                          t->offset + (el + (size_t)(d * t->strides[3])) * kv->ces, kv->ces, NULL);
            }
            if (st != KVHAL_OK) {
                fatal_status(r, "read back", st);
                return;
            }
        }
        r->st.verified++;
        if (memcmp(kv->readbuf, expect, kv->row * kv->ces) != 0) {
            int32_t bad = 0;
            while (memcmp(kv->readbuf + (size_t)bad * (size_t)kv->dim * kv->ces,
                          expect + (size_t)bad * (size_t)kv->dim * kv->ces, (size_t)kv->dim * kv->ces) == 0)
                bad++;
            report_mismatch(r, s, pos, layer, side, bad);
        }
    }
}

/* Reads back sampled rows of the matched prefix (first token, last token, random ones). */
static void verify_hit(replay *r, slot *s)
{
    size_t n = (size_t)r->o->samples;
    for (size_t k = 0; k < n; k++)
        verify_row(r, s, k == 0 ? 0 : k == 1 ? s->matched - 1 : (size_t)(rng_next(&r->rng) % s->matched));
}

/* --events: the queue's events as JSON lines (hashes as hex strings: JSON numbers lose 64-bit precision). */
#define EV_BATCH 1024
static void drain_events(replay *r)
{
    if (!r->events) return;
    uint64_t t0 = tick();
    static const char *const types[] = {"stored", "removed", "cleared", "overflow"};
    size_t n;
    do {
        kvhal_status st = kvhal_cache_manager_events_read(r->cm, r->evbuf, r->evtok, EV_BATCH, &n);
        if (st != KVHAL_OK) {
            fatal_status(r, "events", st);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            const kvhal_kv_event *e = &r->evbuf[i];
            fprintf(r->events, "{\"type\": \"%s\", \"tier\": \"%s\"", types[e->type & 3],
                    e->tier == KVHAL_TIER_HOST ? "host" : "device");
            if (e->type == KVHAL_KV_OVERFLOW) {
                fprintf(r->events, ", \"dropped\": %llu}\n", (unsigned long long)e->dropped);
                continue;
            }
            if (e->type != KVHAL_KV_CLEARED)
                fprintf(r->events, ", \"hash\": \"%016llx\", \"page\": %d", (unsigned long long)e->hash, (int)e->page);
            if (e->type == KVHAL_KV_STORED) {
                fprintf(r->events, ", \"parent_hash\": \"%016llx\", \"tokens\": [", (unsigned long long)e->parent_hash);
                for (int32_t k = 0; k < e->num_tokens; k++)
                    fprintf(r->events, "%s%d", k ? ", " : "", (int)r->evtok[i * (size_t)r->ps + (size_t)k]);
                fputc(']', r->events);
            }
            fputs("}\n", r->events);
        }
        r->st.events_written += n;
    } while (n == EV_BATCH);
    r->excluded += tick() - t0;
}

static void note_in_use(replay *r)
{
    int64_t used = r->total_pages - kvhal_cache_manager_num_free(r->cm);
    if (used > r->st.peak_in_use) r->st.peak_in_use = used;
}

static void check_integrity(replay *r)
{
    uint64_t t0 = tick();
    kvhal_status st = kvhal_cache_manager_check_integrity(r->cm);
    r->st.integrity_checks++;
    if (st != KVHAL_OK) {
        r->st.integrity_failures++;
        fail(kvhal_status_name(st), "INTEGRITY: %s", status_msg(st));
    }
    r->excluded += tick() - t0;
}

static inline size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

/* admit, decode_step and finish stay out of line (one call per request or step) so that a profile shows the
 * three phases apart. */
#define PHASE __attribute__((noinline))

/* A server's request arrives from its tokenizer, in cache; here it was generated long before, into a workload
 * array far larger than the caches. Reading request req's tokens once before it is admitted, outside the measured
 * time (as the per-request generation path of large workloads is), stands for the tokenizer. Called for the next
 * request inside the excluded stretch of the one before it, so that it costs no extra clock readings. */
static void stage_tokens(replay *r, size_t req)
{
    if (!r->w->tok || r->o->cold_tokens || req >= r->w->n) return;
    const int32_t *tok = r->w->tok + r->w->toff[req];
    const wreq *q = &r->w->reqs[req];
    size_t total = (size_t)q->in_len + q->out_len;
    uint32_t sink = 0;
    for (size_t j = 0; j < total; j += 16) sink += (uint32_t)tok[j];
    r->sink += sink;
}

/* The unbounded reference: pages (chain hashes) of finished requests, never evicted. */
static bool ideal_has(const replay *r, uint64_t h)
{
    if (!r->ideal_cap) return false;
    h |= 1; /* 0 marks an empty slot */
    for (size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull) & (r->ideal_cap - 1);; i = (i + 1) & (r->ideal_cap - 1)) {
        if (!r->ideal[i]) return false;
        if (r->ideal[i] == h) return true;
    }
}

static int ideal_add(replay *r, uint64_t h)
{
    h |= 1;
    if (2 * (r->ideal_n + 1) > r->ideal_cap) {
        const size_t cap = r->ideal_cap ? 2 * r->ideal_cap : 4096;
        uint64_t *t = calloc(cap, sizeof *t), *old = r->ideal;
        if (!t) return -1;
        const size_t ocap = r->ideal_cap;
        r->ideal = t;
        r->ideal_cap = cap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i])
                for (size_t j = (size_t)(old[i] * 0x9e3779b97f4a7c15ull) & (cap - 1);; j = (j + 1) & (cap - 1))
                    if (!t[j]) {
                        t[j] = old[i];
                        break;
                    }
        free(old);
    }
    for (size_t i = (size_t)(h * 0x9e3779b97f4a7c15ull) & (r->ideal_cap - 1);; i = (i + 1) & (r->ideal_cap - 1)) {
        if (r->ideal[i] == h) return 0;
        if (!r->ideal[i]) {
            r->ideal[i] = h;
            r->ideal_n++;
            return 0;
        }
    }
}

/* Tokens of tok[0..n) an unbounded cache would match: whole pages, as the manager matches. */
static size_t ideal_match(const replay *r, const int32_t *tok, size_t n)
{
    const size_t ps = (size_t)r->ps;
    uint64_t h = kvhal_kv_root_hash(r->ps);
    size_t i = 0;
    for (; (i + 1) * ps <= n; i++) {
        h = kvhal_kv_page_hash(h, tok + i * ps, r->ps);
        if (!ideal_has(r, h)) break;
    }
    return i * ps;
}

/* 1 admitted, 0 no room now, -1 can never fit (skipped), -2 error. */
PHASE static int admit(replay *r, slot *s, size_t req, int32_t running)
{
    const wreq *q = &r->w->reqs[req];
    size_t ps = (size_t)r->ps;
    s->req = req;
    s->in_len = q->in_len;
    s->total = (size_t)q->in_len + q->out_len;
    if (r->w->tok) {
        /* read ahead of the request by stage_tokens (unless --cold-tokens) */
        s->tok = r->w->tok + r->w->toff[req];
        s->hash = r->w->hash ? r->w->hash + r->w->hoff[req] : NULL;
        s->tag = r->w->tag ? r->w->tag + r->w->hoff[req] : NULL;
    } else {
        uint64_t t0 = tick();
        gen_tokens(r->w, req, s->tokbuf, s->hashbuf, s->tagbuf);
        s->tok = s->tokbuf;
        s->hash = s->hashbuf;
        s->tag = s->tagbuf;
        r->excluded += tick() - t0;
    }
    size_t cached = 0, host_len = 0;
    uint64_t t0 = tick();
    /* at most all but the last prompt token, as engines match (replay_match_len) */
    const size_t mlen = replay_match_len(s->in_len);
    kvhal_status st = r->tiered ? kvhal_cache_manager_match_tiered(r->cm, s->tok, mlen, &s->h, &cached,
                                                                   &host_len, s->pages, div_up(r->w->max_len, ps))
                                : kvhal_cache_manager_match(r->cm, s->tok, mlen, &s->h, &cached, s->pages,
                                                            div_up(r->w->max_len, ps));
    const uint64_t dt = tick() - t0;
    r->match_ticks += dt;
    if (r->n_match_samples < r->samples_cap) r->match_samples[r->n_match_samples++] = dt;
    r->st.match_calls++;
    if (st != KVHAL_OK) return fatal_status(r, "match", st), -2;
    int64_t have = (int64_t)(cached / ps);
    int64_t need_now = (int64_t)div_up(s->in_len, ps) - have;
    int64_t need_decode = (int64_t)div_up(s->total, ps) - (int64_t)div_up(s->in_len, ps);
    if ((int64_t)kvhal_cache_manager_available(r->cm) < need_now + need_decode + r->reserved) {
        if (s->h && (st = kvhal_prefix_unlock(kvhal_cache_manager_prefix(r->cm), s->h)) != KVHAL_OK)
            return fatal_status(r, "unlock", st), -2;
        s->h = 0;
        if (running == 0) {
            if (r->st.skipped < 5)
                fprintf(stderr, "kvhal-replay: warning: request %zu needs %lld pages, more than the cache's %lld: skipped\n",
                        req, (long long)(need_now + need_decode + have), (long long)r->total_pages);
            r->st.skipped++;
            return -1;
        }
        return 0;
    }
    s->matched = s->dev_matched = cached;
    size_t loaded = 0;
    if (host_len) { /* the host tier continues the match: load those pages back and wait for the copies */
        uint64_t tl = tick();
        st = kvhal_cache_manager_load_back(r->cm, s->h, s->tok, s->in_len, s->pages + have,
                                           div_up(r->w->max_len, ps) - (size_t)have, &loaded);
        if (st == KVHAL_OK) st = kvhal_cache_manager_transfer_wait(r->cm);
        r->match_ticks += tick() - tl;
        if (st != KVHAL_OK) return fatal_status(r, "load back", st), -2;
        have += (int64_t)(loaded / ps);
        need_now -= (int64_t)(loaded / ps);
        cached += loaded;
        s->matched = cached;
        r->st.host_hit_tokens += loaded;
        r->st.host_hit_requests += loaded > 0;
        /* every loaded page is read back (one row of each), outside the measured time */
        uint64_t tv = tick();
        for (size_t p = s->dev_matched; p < cached; p += ps) verify_row(r, s, p);
        r->st.loaded_verified += loaded / ps;
        r->excluded += tick() - tv;
    }
    st = kvhal_cache_manager_allocate(r->cm, (int32_t)need_now, s->pages + have);
    if (st != KVHAL_OK) return fatal_status(r, "allocate", st), -2;
    note_in_use(r);
    /* not engine work: the shadow of the prompt's full pages (--no-kv), the check of the hit, the next request's
     * tokens */
    uint64_t tv = tick();
    if (!r->kv)
        for (size_t pi = (size_t)have; pi < s->in_len / ps; pi++) r->shadow[s->pages[pi]] = s->tag[pi];
    if (cached && r->o->samples) verify_hit(r, s);
    stage_tokens(r, req + 1);
    r->excluded += tick() - tv;
    if (r->kv) {
        size_t n = s->in_len - cached;
        for (size_t base = 0; base < n; base += (size_t)r->kv->chunk) {
            size_t m = n - base < (size_t)r->kv->chunk ? n - base : (size_t)r->kv->chunk;
            for (size_t i = 0; i < m; i++) {
                size_t p = cached + base + i;
                r->bslot[i] = (int64_t)s->pages[p / ps] * (int64_t)ps + (int64_t)(p % ps);
            }
            if (write_kv(r, s->hash + cached + base, r->bslot, m) != 0) return -2;
        }
    }
    s->len = s->in_len;
    s->npages = div_up(s->in_len, ps);
    s->in_page = s->in_len % ps;
    if (s->len < s->total) r->dec[r->ndec++] = s;
    else r->fin[r->nfin++] = s;
    s->reserve = need_decode;
    r->reserved += need_decode;
    /* the unbounded reference for this request, outside the measured time: no cache can hit more, and one that has
     * never evicted (nor lost anything to a tier) hits exactly that */
    uint64_t ti = tick();
    const size_t ideal = ideal_match(r, s->tok, mlen);
    r->excluded += tick() - ti;
    if (s->matched > ideal) {
        fail("VERIFICATION_FAILED", "request %zu: %zu tokens matched (%zu device + %zu loaded back), more than the "
             "%zu an unbounded cache holds on this schedule", req, s->matched, s->dev_matched,
             s->matched - s->dev_matched, ideal);
        r->st.errors++;
        return -2;
    }
    /* exact for the radix cache (the naive one keys whole inserted sequences, so it may match less) */
    if (r->o->kind == KVHAL_PREFIX_RADIX && kvhal_cache_manager_pages_evicted(r->cm) == 0 && s->dev_matched != ideal) {
        fail("VERIFICATION_FAILED", "request %zu: %zu tokens matched with nothing ever evicted, but an unbounded "
             "cache holds %zu on this schedule", req, s->dev_matched, ideal);
        r->st.errors++;
        return -2;
    }
    r->st.ideal_hit_tokens += ideal;
    r->st.in_tokens += s->in_len;
    r->st.hit_tokens += s->dev_matched;
    r->st.hit_requests += s->dev_matched > 0;
    s->active = true;
    return 1;
}

static int decode_window(replay *r);

/* One decode step: every running request appends a token; the step's new pages come from one allocation for the
 * whole batch, as an engine's scheduler does. With --no-kv nothing happens between page boundaries, so a step
 * advances every request to the next event of any of them (a page boundary or a finish): the allocations and
 * finishes happen at the same token times and in the same order as one token at a time, without the idle loop.
 * Better still, when the free pages cover them, all steps up to the next finish go at once (decode_window). */
PHASE static int decode_step(replay *r)
{
    const size_t ps = (size_t)r->ps;
    const bool kv = r->kv != NULL;
    const int32_t nd = r->ndec;
    slot **dec = r->dec;
    if (nd == 0) return 0;
    if (!kv) {
        int wr = decode_window(r);
        if (wr != 0) return wr < 0 ? -1 : 0;
    }
    size_t adv = SIZE_MAX;
    int32_t need = 0;
    for (int32_t i = 0; i < nd; i++) {
        const slot *s = dec[i];
        size_t room = ps - s->in_page, left = s->total - s->len;
        size_t d = room < left ? room : left;
        if (d < adv) adv = d;
        need += s->in_page == 0;
    }
    if (kv) adv = 1;
    if (need) {
        kvhal_status st = kvhal_cache_manager_allocate(r->cm, need, r->newpages);
        if (st != KVHAL_OK) return fatal_status(r, "decode allocate (the reservation should have kept room)", st), -1;
        r->reserved -= need;
        note_in_use(r);
    }
    /* locals, so that the stores into the slots do not force reloads of r's fields */
    const int32_t *newpages = r->newpages;
    uint64_t *bhash = r->bhash;
    int64_t *bslot = r->bslot;
    slot **fin = r->fin;
    int32_t nfin = r->nfin, k = 0, kept = 0;
    for (int32_t i = 0; i < nd; i++) {
        slot *s = dec[i];
        size_t np = s->npages, in_page = s->in_page, len = s->len;
        if (in_page == 0) {
            s->pages[np++] = newpages[k++];
            s->npages = np;
            s->reserve--;
        }
        int32_t page = s->pages[np - 1];
        if (kv) {
            bhash[i] = s->hash[len];
            bslot[i] = (int64_t)page * (int64_t)ps + (int64_t)in_page;
        }
        len += adv;
        in_page += adv;
        if (in_page == ps) in_page = 0;
        s->len = len;
        s->in_page = in_page;
        if (len < s->total) dec[kept++] = s;
        else fin[nfin++] = s;
    }
    r->ndec = kept;
    r->nfin = nfin;
    r->st.out_tokens += adv * (uint64_t)nd;
    if (kv && write_kv(r, bhash, bslot, (size_t)nd) != 0) return -1;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* --no-kv: all the steps up to the next finish at once, when the pool holds every page they allocate. Then no
 * step would evict, so one allocation of the window's pages pops the same ids in the same order as the step by
 * step calls, and each request gets the pages it would have got: step t hands out its pages to the requests that
 * start a page at t, in batch order. A request starts a page every page_size steps from step o = (ps - in_page)
 * % ps: with the batch sorted by (o, batch order), the q-th request's k-th page is the window's page k * nd + q
 * (only the last round can leave requests out, and those come last in the order). Returns 1 when done, 0 when
 * the steps must go one by one (the pool is short: they may evict), -1 on an error. */
static int decode_window(replay *r)
{
    const size_t ps = (size_t)r->ps;
    const int32_t nd = r->ndec;
    slot **dec = r->dec;
    size_t w = SIZE_MAX;
    for (int32_t i = 0; i < nd; i++) {
        size_t left = dec[i]->total - dec[i]->len;
        if (left < w) w = left;
    }
    size_t need = 0;
    for (int32_t i = 0; i < nd; i++) need += div_up(dec[i]->len + w, ps) - dec[i]->npages;
    if (need > (size_t)kvhal_cache_manager_num_free(r->cm)) return 0;
    if (need > r->newpages_cap) {
        int32_t *np = realloc(r->newpages, need * sizeof *np);
        if (!np) return 0;
        r->newpages = np;
        r->newpages_cap = need;
    }
    if (need) {
        kvhal_status st = kvhal_cache_manager_allocate(r->cm, (int32_t)need, r->newpages);
        if (st != KVHAL_OK) return fatal_status(r, "decode allocate (the reservation should have kept room)", st), -1;
        r->reserved -= (int64_t)need;
        note_in_use(r);
    }
    /* keys (offset, batch index) are distinct, so the sort is stable; at page size 1 every offset is 0 */
    uint64_t *ord = r->bhash;
    for (int32_t i = 0; i < nd; i++) ord[i] = (uint64_t)((ps - dec[i]->in_page) % ps) << 32 | (uint32_t)i;
    if (ps > 1) qsort(ord, (size_t)nd, sizeof *ord, cmp_u64);
    const int32_t *restrict newpages = r->newpages;
    for (int32_t q = 0; q < nd && ps == 1; q++) {
        /* page size 1: every step fills the page it allocates */
        slot *s = dec[q];
        size_t np = s->npages;
        int32_t *restrict pages = s->pages + np;
        const int32_t *restrict from = newpages + q;
        for (size_t k = 0; k < w; k++) pages[k] = from[k * (size_t)nd];
        s->npages = np + w;
        s->reserve -= (int64_t)w;
        s->len += w;
    }
    for (int32_t q = 0; q < nd && ps > 1; q++) {
        slot *s = dec[(uint32_t)ord[q]];
        size_t np = s->npages, len = s->len;
        size_t k_end = div_up(len + w, ps) - np;
        int32_t *restrict pages = s->pages + np;
        for (size_t k = 0; k < k_end; k++) pages[k] = newpages[k * (size_t)nd + (size_t)q];
        s->npages = np + k_end;
        s->reserve -= (int64_t)k_end;
        s->len = len + w;
        s->in_page = (s->in_page + w) % ps;
    }
    int32_t kept = 0, nfin = r->nfin;
    for (int32_t i = 0; i < nd; i++) {
        slot *s = dec[i];
        if (s->len < s->total) dec[kept++] = s;
        else r->fin[nfin++] = s;
    }
    r->ndec = kept;
    r->nfin = nfin;
    r->st.out_tokens += w * (uint64_t)nd;
    return 1;
}

PHASE static int finish(replay *r, slot *s)
{
    const size_t ps = (size_t)r->ps;
    /* what an engine knows at the end of a request: its handle and what it generated after the match */
    const size_t own = s->dev_matched / ps;
    uint64_t t1 = tick();
    kvhal_status st = r->o->finish_whole
                          ? kvhal_cache_manager_cache_finished(r->cm, s->tok, s->total, s->pages, s->h)
                          : kvhal_cache_manager_cache_finished_suffix(r->cm, s->h, s->tok + s->dev_matched,
                                                                      s->total - s->dev_matched, s->pages + own);
    /* the call's stores are its cost: drained before its time is read */
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t t2 = tick();
    r->finish_ticks += t2 - t1;
    if (r->n_finish_samples < r->samples_cap) r->finish_samples[r->n_finish_samples++] = t2 - t1;
    r->st.finish_calls++;
    if (st != KVHAL_OK) return fatal_status(r, "cache_finished", st), -1;
    { /* the unbounded reference learns every whole page the request handed over (outside the measured time) */
        uint64_t ti = tick(), h = kvhal_kv_root_hash(r->ps);
        for (size_t i = 0; (i + 1) * ps <= s->total; i++) {
            h = kvhal_kv_page_hash(h, s->tok + i * ps, r->ps);
            if (ideal_add(r, h) != 0) return fatal_status(r, "unbounded reference (no memory)", KVHAL_OUT_OF_MEMORY), -1;
        }
        const uint64_t te = tick();
        r->excluded += te - ti;
        t2 = te; /* the shadow's stretch below starts here: counted once */
    }
    if (!r->kv) {
        /* --no-kv: the shadow learns what the pages filled while decoding hold (the prefix hash of each one's last
         * token; the prompt's full pages were recorded at admission), before any later request can match them.
         * Verification, not engine work: outside the measured time, its store misses drained here too. */
        const int32_t *restrict pages = s->pages;
        const uint32_t *restrict tag = s->tag;
        uint32_t *restrict shadow = r->shadow;
        for (size_t pi = s->in_len / ps, full = s->total / ps; pi < full; pi++) shadow[pages[pi]] = tag[pi];
        atomic_thread_fence(memory_order_seq_cst);
        r->excluded += tick() - t2;
    }
    s->active = false;
    s->h = 0;
    r->reserved -= s->reserve;
    s->reserve = 0;
    r->st.requests++;
    return 0;
}

/* evict(4096) timings on the full cache: a few calls while it stays within 3% of its size. */
static void evict_bench(replay *r)
{
    kvhal_prefix_size_info si;
    if (kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(r->cm), &si) != KVHAL_OK) return;
    size_t start = si.total_tokens;
    for (int i = 0; i < 16; i++) {
        kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(r->cm), &si);
        if (si.evictable_tokens < 2 * 4096 || si.total_tokens < start - start / 32) break;
        size_t ev;
        double t0 = now_s();
        kvhal_status st = kvhal_cache_manager_evict(r->cm, 4096, &ev);
        const double dt = now_s() - t0;
        r->st.evict_s += dt;
        if (r->st.n_evict_us < r->st.cap_evict_us) r->st.evict_us[r->st.n_evict_us++] = 1e6 * dt;
        if (st != KVHAL_OK) {
            fatal_status(r, "evict", st);
            return;
        }
        if (r->st.evict_calls == 0 || si.total_tokens < r->st.evict_cached_min)
            r->st.evict_cached_min = si.total_tokens;
        r->st.evict_calls++;
    }
}

/* One pass over the workload, starting from an empty prefix cache. */
static int run_once(replay *r)
{
    uint64_t evicted_before = kvhal_cache_manager_pages_evicted(r->cm), requests_before = r->st.requests;
    size_t n = r->w->n, next = 0, done = 0;
    int32_t running = 0;
    r->reserved = 0;
    if (r->ideal_cap) memset(r->ideal, 0, r->ideal_cap * sizeof *r->ideal); /* the pass starts from empty */
    r->ideal_n = 0;
    r->excluded = r->match_ticks = r->finish_ticks = 0;
    r->n_match_samples = r->n_finish_samples = 0;
    r->ndec = r->nfin = 0;
    int rc = 0;
    stage_tokens(r, 0);
    double t0 = now_s(), c0 = cpu_s();
    uint64_t k0 = tick();
    while (done < n && rc == 0) {
        while (running < r->nslots && next < n) {
            if (r->o->arrival_scale > 0 && r->w->trace) {
                /* --arrival-gaps: not before its arrival; wait idle (outside engine time) when nothing runs */
                double due = (r->w->tr.reqs[next].timestamp - r->w->tr.reqs[0].timestamp) * r->o->arrival_scale;
                double early = due - (now_s() - t0);
                if (early > 0 && running > 0) break;
                if (early > 0) {
                    uint64_t tw = tick();
                    struct timespec ts = {(time_t)early, (long)((early - (double)(time_t)early) * 1e9)};
                    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
                    r->excluded += tick() - tw;
                }
            }
            slot *s = NULL;
            for (int32_t i = 0; i < r->nslots; i++)
                if (!r->slots[i].active) {
                    s = &r->slots[i];
                    break;
                }
            int a = admit(r, s, next, running);
            if (a == 0) break;
            if (a == -2) {
                rc = -1;
                break;
            }
            next++;
            if (a == -1) {
                done++;
                r->done_total++;
                uint64_t t = tick();
                stage_tokens(r, next); /* admit stages the next request only for one it admits */
                r->excluded += tick() - t;
                continue;
            }
            running++;
        }
        if (rc) break;
        if (decode_step(r) != 0) {
            rc = -1;
            break;
        }
        for (int32_t i = 0; i < r->nfin && rc == 0; i++) {
            slot *s = r->fin[i];
            if (finish(r, s) != 0) {
                rc = -1;
                break;
            }
            running--;
            done++;
            r->done_total++;
            if (r->o->check_every && r->st.requests % (uint64_t)r->o->check_every == 0) check_integrity(r);
            if ((r->done_total & 15) == 0) progress(r, false);
        }
        r->nfin = 0;
        drain_events(r);
    }
    uint64_t kel = tick() - k0;
    double el = now_s() - t0, cel = cpu_s() - c0;
    const double spt = kel ? el / (double)kel : 0; /* seconds per tick, in this pass */
    const double excluded = (double)r->excluded * spt;
    r->st.t_match += (double)r->match_ticks * spt;
    r->st.t_finish += (double)r->finish_ticks * spt;
    for (size_t i = 0; i < r->n_match_samples && r->st.n_match_us < r->st.cap_us; i++)
        r->st.match_us[r->st.n_match_us++] = 1e6 * (double)r->match_samples[i] * spt;
    for (size_t i = 0; i < r->n_finish_samples && r->st.n_finish_us < r->st.cap_us; i++)
        r->st.finish_us[r->st.n_finish_us++] = 1e6 * (double)r->finish_samples[i] * spt;
    r->st.t_engine += el - excluded;
    if (rc == 0 && el - excluded > 0) {
        double pass_rps = (double)(r->st.requests - requests_before) / (el - excluded);
        if (pass_rps > r->st.best_pass_rps) r->st.best_pass_rps = pass_rps;
    }
    /* the excluded parts were timed on the wall clock: an upper bound of their CPU time */
    r->st.t_engine_cpu += cel - excluded > 0 ? cel - excluded : 0;
    r->st.pages_evicted += kvhal_cache_manager_pages_evicted(r->cm) - evicted_before;
    check_integrity(r);
    if (rc == 0 && r->o->kind == KVHAL_PREFIX_RADIX) evict_bench(r);
    /* empty the prefix cache for the next pass (the manager and its memory stay, as in a long-running server) */
    size_t ev;
    kvhal_status st = kvhal_cache_manager_evict(r->cm, SIZE_MAX, &ev);
    if (st != KVHAL_OK) return fatal_status(r, "evict all", st), -1;
    /* the next pass starts from empty tiers too */
    if (r->tiered && r->o->host_tier && (st = kvhal_cache_manager_host_tier_clear(r->cm)) != KVHAL_OK)
        return fatal_status(r, "host tier clear", st), -1;
    drain_events(r);
    if (rc == 0 && kvhal_cache_manager_available(r->cm) != r->total_pages) {
        fail("VERIFICATION_FAILED", "%d of %lld pages available after the pass",
                (int)kvhal_cache_manager_available(r->cm), (long long)r->total_pages);
        r->st.errors++;
        rc = -1;
    }
    return rc;
}

static void print_summary(const replay *r, const workload *w, const char *device)
{
    const stats *s = &r->st;
    const options *o = r->o;
    double eng = s->t_engine > 0 ? s->t_engine : 1e-9;
    double rps = (double)s->requests / eng;
    double rps_cpu = s->t_engine_cpu > 0 ? (double)s->requests / s->t_engine_cpu : 0;
    double tps = (double)(s->in_tokens + s->out_tokens) / eng;
    double hit = s->in_tokens ? (double)s->hit_tokens / (double)s->in_tokens : 0;
    double match_us = s->match_calls ? 1e6 * s->t_match / (double)s->match_calls : 0;
    double insert_us = s->finish_calls ? 1e6 * s->t_finish / (double)s->finish_calls : 0;
    double evict_us = s->evict_calls ? 1e6 * s->evict_s / (double)s->evict_calls : 0;
    double gbps = s->t_write > 0 ? (double)s->bytes_written / s->t_write / 1e9 : 0;
    /* a run that skipped requests (each larger than the whole cache) did not replay the workload: not ok */
    bool ok = s->mismatches == 0 && s->integrity_failures == 0 && s->errors == 0 && s->skipped == 0;
    const char *kind = o->kind == KVHAL_PREFIX_RADIX ? "radix" : "naive";
    /* the host tier: hits loaded back, and what moved (null in JSON where there is no tier) */
    kvhal_host_tier_stats ts = {0};
    const bool host = r->tiered && o->host_tier && kvhal_cache_manager_tier_stats(r->cm, &ts) == KVHAL_OK &&
                      ts.host_pages_total > 0;
    double host_hit = s->in_tokens ? (double)s->host_hit_tokens / (double)s->in_tokens : 0;
    char tier_json[512];
    if (host)
        snprintf(tier_json, sizeof tier_json, "\"host_hit_rate\": %.6f, \"miss_rate\": %.6f, \"host_hit_requests\": %llu, "
                 "\"host_pages\": %lld, \"write_policy\": \"%s\", \"pages_written_to_host\": %llu, "
                 "\"pages_loaded_back\": %llu, \"loaded_pages_verified\": %llu, \"host_evictions\": %llu, ",
                 host_hit, 1 - hit - host_hit, (unsigned long long)s->host_hit_requests, (long long)ts.host_pages_total,
                 o->write_policy == KVHAL_WRITE_BACK ? "back" : "through", (unsigned long long)ts.pages_written,
                 (unsigned long long)ts.pages_loaded, (unsigned long long)s->loaded_verified,
                 (unsigned long long)ts.host_evictions);
    else
        snprintf(tier_json, sizeof tier_json, "\"host_hit_rate\": null, \"miss_rate\": %.6f, \"host_pages\": null, ",
                 1 - hit);
    /* percentiles sort the sample arrays in place: they are not used after the summary */
    tool_percentiles pm = tool_percentiles_of(s->match_us, s->n_match_us);
    tool_percentiles pf = tool_percentiles_of(s->finish_us, s->n_finish_us);
    tool_percentiles pe = tool_percentiles_of(s->evict_us, s->n_evict_us);
    if (o->json) {
        FILE *f = stdout;
        fprintf(f, "{\"ok\": %s, \"version\": ", ok ? "true" : "false");
        tool_json_str(f, kvhal_version());
        if (!ok) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%llu mismatches, %llu integrity failures, %llu errors, %llu requests skipped%s%s",
                     (unsigned long long)s->mismatches, (unsigned long long)s->integrity_failures,
                     (unsigned long long)s->errors, (unsigned long long)s->skipped, failure_message[0] ? "; first: " : "", failure_message);
            fprintf(f, ", \"error\": {\"status\": ");
            tool_json_str(f, failure_status[0] ? failure_status : "VERIFICATION_FAILED");
            fprintf(f, ", \"message\": ");
            tool_json_str(f, msg);
            fprintf(f, "}");
        }
        fprintf(f, ", \"requests\": %llu, \"skipped\": %llu, \"skipped_empty\": %zu, \"repeat\": %lld, \"requests_per_s\": ",
                (unsigned long long)s->requests, (unsigned long long)s->skipped, w->tr.empty, (long long)o->repeat);
        tool_json_num(f, rps, s->t_engine > 0);
        fprintf(f, ", %s\"events_written\": %llu", tier_json, (unsigned long long)s->events_written);
        fprintf(f, ", \"requests_per_cpu_s\": ");
        tool_json_num(f, rps_cpu, s->t_engine_cpu > 0);
        fprintf(f, ", \"requests_per_s_best_pass\": ");
        tool_json_num(f, s->best_pass_rps, s->best_pass_rps > 0);
        fprintf(f, ", \"tokens_per_s\": ");
        tool_json_num(f, tps, s->t_engine > 0);
        fprintf(f, ", \"hit_rate\": ");
        tool_json_num(f, hit, s->in_tokens > 0);
        fprintf(f, ", \"hit_requests\": %llu, \"pages_evicted\": %llu, \"peak_pages_in_use\": %lld, "
                "\"pages_total\": %lld, \"page_size\": %d, \"bytes_written\": ",
                (unsigned long long)s->hit_requests, (unsigned long long)s->pages_evicted, (long long)s->peak_in_use,
                (long long)s->total_pages, (int)o->page_size);
        tool_json_num(f, (double)s->bytes_written, !o->no_kv);
        fprintf(f, ", \"write_gb_per_s\": ");
        tool_json_num(f, gbps, !o->no_kv && s->t_write > 0);
        /* means, kept under their earlier names; the percentiles are in latency_us */
        fprintf(f, ", \"match_us\": ");
        tool_json_num(f, match_us, s->match_calls > 0);
        fprintf(f, ", \"insert_us\": ");
        tool_json_num(f, insert_us, s->finish_calls > 0);
        fprintf(f, ", \"evict_4096_us\": ");
        tool_json_num(f, evict_us, s->evict_calls > 0);
        fprintf(f, ", \"latency_us\": {\"match\": {");
        tool_json_percentiles(f, &pm);
        fprintf(f, "}, \"finish\": {");
        tool_json_percentiles(f, &pf);
        fprintf(f, "}, \"evict_4096\": {");
        tool_json_percentiles(f, &pe);
        fprintf(f, "}}, \"evict_calls\": %llu, \"evict_cached_tokens\": ", (unsigned long long)s->evict_calls);
        tool_json_num(f, (double)s->evict_cached_min, s->evict_calls > 0);
        fprintf(f, ", \"verified\": %llu, \"mismatches\": %llu, \"integrity_checks\": %llu, "
                "\"integrity_failures\": %llu, \"errors\": %llu, \"engine_s\": %.6f, \"wall_s\": %.3f, "
                "\"mode\": \"%s\", \"prefix\": \"%s\", \"device\": ",
                (unsigned long long)s->verified, (unsigned long long)s->mismatches,
                (unsigned long long)s->integrity_checks, (unsigned long long)s->integrity_failures,
                (unsigned long long)s->errors, s->t_engine, s->t_wall, o->no_kv ? "no-kv" : "kv", kind);
        if (o->no_kv) fprintf(f, "null");
        else tool_json_str(f, device);
        fprintf(f, ", \"model\": ");
        tool_json_str(f, o->model);
        fprintf(f, ", \"layers\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"dtype\": \"%s\", \"batch\": %d, "
                "\"finish\": \"%s\", \"seed\": %llu}\n", (int)o->layers, (int)o->kv_heads, (int)o->head_dim,
                kvhal_dtype_name(o->dtype), (int)o->batch, o->finish_whole ? "whole" : "suffix",
                (unsigned long long)o->seed);
        return;
    }
    printf("kvhal-replay: %s\n", w->name);
    printf("  cache        %s, %s prefix cache, page size %d, %lld pages (%s %d layers x %d kv heads x %d, %s)\n",
           o->no_kv ? "no K/V (bookkeeping only)" : device, kind, (int)o->page_size, (long long)s->total_pages,
           o->model, (int)o->layers, (int)o->kv_heads, (int)o->head_dim, kvhal_dtype_name(o->dtype));
    printf("  requests     %llu in %.3f s of engine time (%lld x %zu, batch %d)%s\n", (unsigned long long)s->requests,
           s->t_engine, (long long)o->repeat, w->n, (int)o->batch, s->skipped ? ", some skipped" : "");
    if (s->skipped)
        printf("  skipped      %llu (larger than the whole cache): the run FAILS, the workload was not replayed\n",
               (unsigned long long)s->skipped);
    if (w->tr.empty) printf("  skipped      %zu zero-length lines of the trace (not requests)\n", w->tr.empty);
    printf("  throughput   %.0f requests/s, %.0f tokens/s (%.0f requests per CPU second", rps, tps, rps_cpu);
    if (o->repeat > 1) printf("; best pass %.0f requests/s", s->best_pass_rps);
    printf(")\n");
    printf("  prefix hits  %.2f%% of prompt tokens (%llu of %llu requests hit)\n", 100 * hit,
           (unsigned long long)s->hit_requests, (unsigned long long)s->requests);
    printf("  unbounded    %.2f%% of prompt tokens: what a cache that never evicts hits on this run's schedule (the "
           "requests running together); device + host hits never exceed it\n",
           s->in_tokens ? 100.0 * (double)s->ideal_hit_tokens / (double)s->in_tokens : 0);
    if (host)
        printf("  host tier    %lld pages, write-%s: %.2f%% of prompt tokens loaded back (%llu requests), %.2f%% "
               "missed; %llu pages written to host, %llu loaded back (each verified), %llu host evictions\n",
               (long long)ts.host_pages_total, o->write_policy == KVHAL_WRITE_BACK ? "back" : "through",
               100 * host_hit, (unsigned long long)s->host_hit_requests, 100 * (1 - hit - host_hit),
               (unsigned long long)ts.pages_written, (unsigned long long)ts.pages_loaded,
               (unsigned long long)ts.host_evictions);
    if (o->events_path) printf("  KV events    %llu written to %s\n", (unsigned long long)s->events_written, o->events_path);
    printf("  pages        %llu evicted, peak %lld of %lld in use\n", (unsigned long long)s->pages_evicted,
           (long long)s->peak_in_use, (long long)s->total_pages);
    printf("  cache ops    match %.3f us (p50 %.3f, p90 %.3f, p99 %.3f), %s (insert) %.3f us (p50 %.3f, p90 %.3f, "
           "p99 %.3f)", match_us, pm.p50, pm.p90, pm.p99, o->finish_whole ? "cache_finished" : "cache_finished_suffix",
           insert_us, pf.p50, pf.p90, pf.p99);
    if (s->evict_calls)
        printf(", evict(4096) %.2f us (p50 %.2f, p99 %.2f; %llu calls, >= %zu tokens cached)", evict_us, pe.p50, pe.p99,
               (unsigned long long)s->evict_calls,
               s->evict_cached_min);
    printf("\n");
    if (!o->no_kv)
        printf("  K/V written  %.3f GB, paged caching %.2f GB/s\n", (double)s->bytes_written / 1e9, gbps);
    printf("  verification %llu %s checked, %llu mismatches; %llu integrity checks, %llu failed: %s\n",
           (unsigned long long)s->verified, o->no_kv ? "pages" : "rows", (unsigned long long)s->mismatches,
           (unsigned long long)s->integrity_checks, (unsigned long long)s->integrity_failures, ok ? "PASS" : "FAIL");
}

static bool summary_printed; /* by the current run (with --json: its object, ok or not) */

static int run_replay_once(const options *o);

/* One run; with --json a run that failed before its summary prints the failure object instead. */
static int run_replay(const options *o)
{
    summary_printed = false;
    failure_status[0] = failure_message[0] = '\0';
    int rc = run_replay_once(o);
    if (rc && o->json && !summary_printed)
        tool_json_failure(stdout, failure_status[0] ? failure_status : "FAILED",
                          failure_message[0] ? failure_message : "the run failed");
    return rc;
}

static int run_replay_once(const options *o)
{
    double t_wall = now_s();
    tick_init();
    workload w;
    if (workload_init(&w, o) != 0) {
        fail("WORKLOAD", "could not build the workload");
        workload_free(&w);
        return 1;
    }
    replay r;
    memset(&r, 0, sizeof r);
    r.o = o;
    r.w = &w;
    r.ps = o->page_size;
    r.nslots = o->batch;
    r.rng = mix64(o->seed + 99);
    r.tty = isatty(2);
    r.last_decile = -1;
    kvstate kv;
    char device[32] = "none";
    int64_t pages = 0;
    int rc = 1;
    if (o->no_kv) {
        uint64_t per_token = (uint64_t)o->layers * 2 * (uint64_t)o->kv_heads * (uint64_t)o->head_dim *
                             kvhal_dtype_size(o->dtype);
        pages = (int64_t)(o->budget / (per_token * (uint64_t)o->page_size));
    } else {
        if (kv_init(&kv, o, &pages) != 0) {
            kv_free(&kv);
            workload_free(&w);
            return 1;
        }
        r.kv = &kv;
        kvhal_device_format(kv.dev, device, sizeof device);
    }
    if (pages < 1 || pages > INT32_MAX) {
        fail("KVHAL_OUT_OF_RANGE", "--kv-budget gives %lld pages; need 1 to %d (raise --page-size or change the "
             "budget)", (long long)pages, INT32_MAX);
        goto out;
    }
    r.total_pages = pages;
    r.st.total_pages = pages;
    size_t maxp = div_up(w.max_len, (size_t)o->page_size) + 1;
    r.slots = calloc((size_t)r.nslots, sizeof *r.slots);
    r.bhash = malloc(((size_t)r.nslots + (size_t)o->chunk) * sizeof *r.bhash);
    r.bslot = malloc(((size_t)r.nslots + (size_t)o->chunk) * sizeof *r.bslot);
    r.newpages = malloc((size_t)r.nslots * sizeof *r.newpages);
    r.newpages_cap = (size_t)r.nslots;
    r.dec = malloc((size_t)r.nslots * sizeof *r.dec);
    /* one match and at most one finish per request and pass; evict_bench makes at most 16 calls a pass */
    r.samples_cap = w.n + 1;
    r.match_samples = malloc((w.n + 1) * sizeof *r.match_samples);
    r.finish_samples = malloc((w.n + 1) * sizeof *r.finish_samples);
    r.st.cap_us = (w.n + 1) * (size_t)o->repeat;
    r.st.cap_evict_us = 16 * (size_t)o->repeat;
    r.st.match_us = malloc(r.st.cap_us * sizeof(double));
    r.st.finish_us = malloc(r.st.cap_us * sizeof(double));
    r.st.evict_us = malloc(r.st.cap_evict_us * sizeof(double));
    if (!r.match_samples || !r.finish_samples || !r.st.match_us || !r.st.finish_us || !r.st.evict_us) goto oom;
    r.fin = malloc((size_t)r.nslots * sizeof *r.fin);
    if (o->no_kv) r.shadow = calloc((size_t)pages, sizeof *r.shadow);
    if (!r.slots || !r.bhash || !r.bslot || !r.newpages || !r.dec || !r.fin || (o->no_kv && !r.shadow)) goto oom;
    for (int32_t i = 0; i < r.nslots; i++) {
        slot *s = &r.slots[i];
        s->pages = malloc(maxp * sizeof *s->pages);
        if (!s->pages) goto oom;
        if (!w.tok) {
            s->tokbuf = malloc((w.max_len + 1) * sizeof *s->tokbuf);
            if (o->no_kv) s->tagbuf = malloc((w.max_len / w.hstride + 1) * sizeof *s->tagbuf);
            else s->hashbuf = malloc((w.max_len / w.hstride + 1) * sizeof *s->hashbuf);
            if (!s->tokbuf || (!s->hashbuf && !s->tagbuf)) goto oom;
        }
    }
    r.tiered = o->host_tier || o->events_path;
    if (o->events_path) {
        r.events = fopen(o->events_path, "w");
        r.evbuf = malloc(EV_BATCH * sizeof *r.evbuf);
        r.evtok = malloc(EV_BATCH * (size_t)o->page_size * sizeof *r.evtok);
        if (!r.events) {
            fprintf(stderr, "kvhal-replay: --events: cannot write %s\n", o->events_path);
            goto out;
        }
        if (!r.evbuf || !r.evtok) goto oom;
    }
    kvhal_host_tier_config tcfg = {.cache = r.tiered ? kv.cache : NULL, .host_budget = o->host_tier,
                                   .policy = o->write_policy, .event_capacity = o->events_path ? 1u << 20 : 0};
    kvhal_status cst = r.tiered ? kvhal_cache_manager_create_tiered((int32_t)pages, r.ps, o->kind, &tcfg, &r.cm)
                                : kvhal_cache_manager_create((int32_t)pages, r.ps, o->kind, &r.cm);
    if (cst != KVHAL_OK) {
        fail(kvhal_status_name(cst), "cache manager: %s", status_msg(cst));
        goto out;
    }
    r.work_total = w.n * (size_t)o->repeat;
    r.t_start = now_s();
    rc = 0;
    for (int64_t i = 0; i < o->repeat && rc == 0; i++) {
        r.repeat_index = i;
        if (run_once(&r) != 0) rc = 1;
    }
    progress(&r, true);
    r.st.t_wall = now_s() - t_wall;
    print_summary(&r, &w, device);
    summary_printed = true;
    if (r.st.mismatches || r.st.integrity_failures || r.st.errors || r.st.skipped) rc = 1;
    goto out;
oom:
    fail("KVHAL_OUT_OF_MEMORY", "out of host memory");
    rc = 1;
out:
    if (r.events) fclose(r.events);
    free(r.evbuf);
    free(r.evtok);
    if (r.slots)
        for (int32_t i = 0; i < r.nslots; i++) {
            free(r.slots[i].pages);
            free(r.slots[i].tokbuf);
            free(r.slots[i].hashbuf);
            free(r.slots[i].tagbuf);
        }
    free(r.slots);
    if (r.cm) kvhal_cache_manager_destroy(r.cm);
    free(r.bhash);
    free(r.bslot);
    free(r.newpages);
    free(r.dec);
    free(r.fin);
    free(r.match_samples);
    free(r.finish_samples);
    free(r.st.match_us);
    free(r.st.finish_us);
    free(r.st.evict_us);
    free(r.shadow);
    free(r.ideal);
    if (r.kv) kv_free(&kv);
    workload_free(&w);
    return rc;
}

/* The CI soak: eviction pressure (the cache holds a fraction of the workload), locks held by a large batch,
 * integrity checked every few requests, at page sizes 1, 4 and 16 and with the naive cache, three workload seeds
 * each. */
static int run_soak(const options *base)
{
    static const struct {
        int32_t ps, batch;
        kvhal_prefix_kind kind;
        double zipf;
        const char *budget;
        kvhal_paged_layout layout;
    } runs[] = {
        {16, 16, KVHAL_PREFIX_RADIX, 1.1, "12MiB", KVHAL_LAYOUT_NHD},
        {1, 8, KVHAL_PREFIX_RADIX, 0.8, "8MiB", KVHAL_LAYOUT_NHD},
        {4, 32, KVHAL_PREFIX_RADIX, 1.3, "10MiB", KVHAL_LAYOUT_HND},
        {4, 8, KVHAL_PREFIX_NAIVE, 0, "8MiB", KVHAL_LAYOUT_NHD},
    };
    int failed = 0;
    size_t nruns = sizeof runs / sizeof runs[0];
    for (size_t j = 0; j < 3 * nruns; j++) {
        size_t i = j % nruns;
        options o = *base;
        o.page_size = runs[i].ps;
        o.batch = runs[i].batch;
        o.kind = runs[i].kind;
        o.zipf = runs[i].zipf;
        o.layout = runs[i].layout;
        parse_size("--kv-budget", runs[i].budget, &o.budget);
        o.groups = 32;
        o.prompts = 24;
        o.system_len = 1000;
        o.question_len = 100;
        o.output_len = 60;
        o.check_every = 16;
        o.samples = 16;
        o.repeat = 1;
        o.seed = base->seed + j;
        o.finish_whole = j / nruns == 1; /* the second round finishes requests the other way */
        if (!o.json)
            printf("== soak %zu/%zu: page size %d, batch %d, %s, budget %s, %s, seed %llu\n", j + 1, 3 * nruns,
                   (int)o.page_size, (int)o.batch, o.kind == KVHAL_PREFIX_RADIX ? "radix" : "naive", runs[i].budget,
                   o.finish_whole ? "cache_finished" : "cache_finished_suffix", (unsigned long long)o.seed);
        fflush(stdout);
        if (run_replay(&o) != 0) failed++;
    }
    if (!base->json) printf("soak: %s\n", failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    options o;
    default_options(&o);
    int p = parse_options(argc, argv, &o);
    if (p < 0) return TOOL_EXIT_USAGE;
    if (p == 1) {
        usage(stdout);
        return TOOL_EXIT_OK;
    }
    if (p == 3) {
        tool_print_version(tool);
        return TOOL_EXIT_OK;
    }
    if (p == 2) return run_soak(&o);
    return run_replay(&o);
}

/* options.c — see options.h. */
#include "options.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <getopt.h>

#include "failure.h"
#include "tool_common.h"

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

void usage(FILE *f)
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
            "  --lazy-tokens       generate each request's tokens when it is first admitted (outside the measured\n"
            "                      time), as workloads of more than 32M tokens always do, instead of ahead of the run\n"
            "  --finish-whole      finish requests with cache_finished (the whole request's tokens and pages, the\n"
            "                      matched prefix compared again) instead of cache_finished_suffix (what follows it)\n"
            "  --repeat N          replay the workload N times, each on a fresh cache, for a stable figure (1)\n"
            "  --seed S            workload seed (1)\n"
            "  --check-every N     check_integrity every N finished requests (0: only at the end)\n"
            "  --verify-samples N  rows (pages with --no-kv) read back per prefix hit (4; 0: off)\n"
            "  --prefill-chunk N   tokens per paged-caching call in prefill (512)\n"
            "  -j, --json          print one JSON summary object on stdout (percentiles of the per-call\n"
            "                      times, null for what was not measured, an error object on failure)\n"
            "  -q, --quiet         no progress output\n"
            "  --soak              a fixed set of runs under eviction pressure with frequent integrity checks\n");
    fprintf(f,
            "\nhost tier and KV events\n"
            "  --host-tier SIZE    host pages under the device cache (e.g. 4GiB): evicted prefixes are kept in host\n"
            "                      memory and loaded back on a hit (every loaded page verified); 0: none (default)\n"
            "  --write-policy P    through (copy to host when a request finishes, default) or back (when evicted)\n"
            "  --events FILE       write the KV events (stored/removed/cleared per tier, hash chain, tokens) as JSON\n"
            "                      lines; events the ring dropped fail the run\n"
            "  --event-ring N      events the manager's ring holds between two reads (1048576)\n"
            "  --events-drop-ok    dropped events (an \"overflow\" line says how many) are not an error\n"
            "\npictures\n"
            "  --timeline FILE     CSV, one row per window of finished requests: prompt tokens, device and host\n"
            "                      hits, hit rates, pages evicted from the device and host tiers (bench/plot.py\n"
            "                      draws it)\n"
            "  --timeline-window N finished requests per row (0, default: a hundredth of the run, at least 1)\n"
            "\n"
            "  -h, --help          this text;  -V, --version: \"kvhal-replay <kvhal version>\"\n"
            "\nexit status: 0 every run passed, 1 a run or a verification failed or output was lost (a full disk, a\n"
            "closed stdout), 2 usage error\n");
}

static int opt_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int opt_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tool_usage_error(REPLAY_TOOL, "%s", msg);
    return -1;
}

int parse_size(const char *flag, const char *v, uint64_t *out)
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

void default_options(options *o)
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
    o->event_ring = 1 << 20;
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
    X("prefill-chunk", O_PREFILL_CHUNK, 1, 1 << 16, chunk)                                                      \
    X("timeline-window", O_TIMELINE_WINDOW, 0, INT32_MAX, timeline_window)                                      \
    X("event-ring", O_EVENT_RING, 2, 1 << 26, event_ring)

enum {
    O_NO_KV = 256, O_COLD_TOKENS, O_FINISH_WHOLE, O_QUIET, O_SOAK, O_SEED, O_ZIPF, O_TRACE, O_MODEL, O_DTYPE,
    O_KV_BUDGET, O_PREFIX, O_LAYOUT, O_ORDER, O_TRACE_ORDER, O_ARRIVAL_GAPS, O_HOST_TIER, O_WRITE_POLICY, O_EVENTS,
    O_EVENTS_DROP_OK, O_TIMELINE, O_LAZY_TOKENS,
#define X_ENUM(name, E, lo, hi, field) E,
    INT_OPTIONS(X_ENUM)
#undef X_ENUM
};

static const struct option longopts[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"json", no_argument, NULL, 'j'},
    {"no-kv", no_argument, NULL, O_NO_KV},
    {"cold-tokens", no_argument, NULL, O_COLD_TOKENS},
    {"finish-whole", no_argument, NULL, O_FINISH_WHOLE},
    {"quiet", no_argument, NULL, 'q'},
    {"events-drop-ok", no_argument, NULL, O_EVENTS_DROP_OK},
    {"lazy-tokens", no_argument, NULL, O_LAZY_TOKENS},
    {"timeline", required_argument, NULL, O_TIMELINE},
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

/* The options that take a name or a number that is not one of INT_OPTIONS: 0 when done, -1 on a bad value (the
 * message printed), 1 when c is none of them. */
static int value_option(int c, const char *v, options *o)
{
    int64_t x;
    switch (c) {
    case O_HOST_TIER: case O_WRITE_POLICY: case O_EVENTS: {
        const char *flag = c == O_HOST_TIER ? "--host-tier" : c == O_WRITE_POLICY ? "--write-policy" : "--events";
        return tier_option(flag, v, o) < 0 ? -1 : 0;
    }
    case O_SEED:
        if (!tool_parse_i64(REPLAY_TOOL, "seed", v, 0, INT64_MAX, &x)) return -1;
        o->seed = (uint64_t)x;
        return 0;
    case O_ZIPF: return tool_parse_f64(REPLAY_TOOL, "zipf", v, 0, 100, &o->zipf) ? 0 : -1;
    case O_TRACE:
        o->trace_mode = true;
        o->trace_path = v;
        return 0;
    case O_ARRIVAL_GAPS: return tool_parse_f64(REPLAY_TOOL, "arrival-gaps", v, 0, 1e3, &o->arrival_scale) ? 0 : -1;
    case O_TRACE_ORDER:
        if (!strcmp(v, "timestamp")) o->trace_by_time = true;
        else if (!strcmp(v, "file")) o->trace_by_time = false;
        else {
            tool_usage_error(REPLAY_TOOL, "--trace-order: '%s' is not file or timestamp", v);
            return -1;
        }
        return 0;
    case O_MODEL: o->model = v; return 0;
    case O_DTYPE: return parse_dtype(v, &o->dtype) ? -1 : 0;
    case O_KV_BUDGET: return parse_size("--kv-budget", v, &o->budget) ? -1 : 0;
    case O_PREFIX:
        if (!strcmp(v, "radix")) o->kind = KVHAL_PREFIX_RADIX;
        else if (!strcmp(v, "naive")) o->kind = KVHAL_PREFIX_NAIVE;
        else return opt_error("--prefix: '%s' is not radix or naive", v);
        return 0;
    case O_LAYOUT:
        if (!strcmp(v, "nhd")) o->layout = KVHAL_LAYOUT_NHD;
        else if (!strcmp(v, "hnd")) o->layout = KVHAL_LAYOUT_HND;
        else return opt_error("--layout: '%s' is not nhd or hnd", v);
        return 0;
    case O_ORDER:
        if (!strcmp(v, "layer")) o->order = KVHAL_LAYER_FIRST;
        else if (!strcmp(v, "page")) o->order = KVHAL_PAGE_FIRST;
        else return opt_error("--order: '%s' is not layer or page", v);
        return 0;
    default: return 1;
    }
}

/* The model's shape and dtype where no option overrode them, and the checks across options. */
static int resolve_model(options *o)
{
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
    /* checked before the run: a tier that holds no page would only show after the whole replay */
    const uint64_t page_bytes = (uint64_t)o->layers * 2 * (uint64_t)o->kv_heads * (uint64_t)o->head_dim *
                                kvhal_dtype_size(o->dtype) * (uint64_t)o->page_size;
    if (o->host_tier && o->host_tier < page_bytes)
        return opt_error("--host-tier: %llu bytes hold no page (a page of %d tokens is %llu bytes here)",
                         (unsigned long long)o->host_tier, (int)o->page_size, (unsigned long long)page_bytes);
    return 0;
}

int parse_options(int argc, char **argv, options *o)
{
    bool soak = false;
    int64_t x;
    opterr = 0;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, ":hVjq", longopts, NULL)) != -1;) {
        const char *v = optarg;
        switch (c) {
        case 'h': return 1;
        case 'V': return 3;
        case 'j': o->json = true; break;
        case O_NO_KV: o->no_kv = true; break;
        case O_COLD_TOKENS: o->cold_tokens = true; break;
        case O_FINISH_WHOLE: o->finish_whole = true; break;
        case 'q': o->quiet = true; break;
        case O_EVENTS_DROP_OK: o->events_drop_ok = true; break;
        case O_LAZY_TOKENS: o->lazy_tokens = true; break;
        case O_TIMELINE: o->timeline_path = v; break;
        case O_SOAK: soak = true; break;
#define X_CASE(name, E, lo, hi, field)                                                                          \
        case E:                                                                                                 \
            if (!tool_parse_i64(REPLAY_TOOL, name, v, lo, hi, &x)) return -1;                                   \
            o->field = x;                                                                                       \
            break;
        INT_OPTIONS(X_CASE)
#undef X_CASE
        case ':': return opt_error("%s needs a value", argv[optind - 1]);
        default: {
            const int rc = value_option(c, v, o);
            if (rc < 0) return -1;
            if (rc > 0) return opt_error("unknown option '%s'", argv[optind - 1]);
            break;
        }
        }
    }
    if (optind < argc) return opt_error("unexpected argument '%s'", argv[optind]);
    if (soak && o->timeline_path) return opt_error("--timeline is for one run, not with --soak (twelve runs)");
    if (resolve_model(o) != 0) return -1;
    return soak ? 2 : 0;
}

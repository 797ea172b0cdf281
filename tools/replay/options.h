/* options.h — kvhal-replay's command line: the options of a run, their defaults, the model presets, --help. */
#ifndef KVHAL_REPLAY_OPTIONS_H
#define KVHAL_REPLAY_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvhal.h"

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
    bool lazy_tokens;        /* --lazy-tokens: each request's tokens generated when it is admitted */
    bool trace_by_time;      /* --trace-order timestamp */
    double arrival_scale;    /* --arrival-gaps S: seconds per trace timestamp unit, 0 = as fast as the cache allows */
    int64_t repeat, check_every;
    uint64_t seed;
    /* a host tier under the device pages, and KV events */
    uint64_t host_tier;       /* bytes of host pages; 0: none */
    kvhal_write_policy write_policy;
    const char *events_path;  /* JSON lines of KV events; NULL: none */
    bool events_drop_ok;      /* events the ring dropped are not an error */
    int64_t event_ring;       /* events the manager's ring holds (kvhal_host_tier_config.event_capacity) */
    const char *timeline_path; /* CSV of hit rates and evictions per window of finished requests; NULL: none */
    int64_t timeline_window;  /* finished requests per timeline row; 0: a hundredth of the run */
} options;

/* The defaults of every option (the model's shape and dtype are filled in by parse_options). */
void default_options(options *o);
/* Returns 0, 1 for --help, 2 for --soak, 3 for --version, -1 on a bad option (the message printed). getopt_long:
 * --opt=value and --opt value alike. */
int parse_options(int argc, char **argv, options *o);
/* --help. */
void usage(FILE *f);
/* A size with an optional unit (2GiB, 512MiB, 1e9) into *out: 0, or -1 with a usage error naming flag. */
int parse_size(const char *flag, const char *v, uint64_t *out);

#endif

/* replay.h — the state of a kvhal-replay run: the requests in flight (slots), the counters and timings (stats),
 * and the run itself (replay), shared by the engine, the checks, the KV events and the report. */
#ifndef KVHAL_REPLAY_REPLAY_H
#define KVHAL_REPLAY_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "failure.h"
#include "kv.h"
#include "kvhal.h"
#include "options.h"
#include "workload.h"

typedef struct slot {
    bool active;
    size_t req;
    const int32_t *tok;
    const uint64_t *hash; /* K/V mode */
    const uint32_t *tag;  /* --no-kv */
    size_t gen_req; /* the request whose tokens tokbuf holds (SIZE_MAX: none): generated once, kept on a retry */
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

/* One line of a pass's schedule: request req admitted (matched tokens of mlen looked up, dev_matched of them on
 * the device; nothing evicted yet when fresh) or finished (total tokens handed to the cache). */
typedef struct sched_entry {
    uint32_t req;
    bool finish, fresh;
    uint32_t mlen, matched, dev_matched, total;
} sched_entry;

typedef struct stats {
    uint64_t requests, skipped, in_tokens, out_tokens, hit_tokens, hit_requests;
    uint64_t match_calls, finish_calls, bytes_written, pages_evicted, verified, mismatches;
    uint64_t integrity_checks, integrity_failures, errors, evict_calls;
    uint64_t host_hit_tokens, host_hit_requests, loaded_verified, events_written, events_dropped;
    uint64_t generated; /* requests whose tokens were generated during the passes (--lazy-tokens, large workloads) */
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
    /* the unbounded reference on this run's own schedule, computed after each pass from its log (sched: every
     * admission and finish, in order), so that its memory traffic stays out of the timed calls: the chain hash
     * (kvhal_kv_page_hash) of every page any finished request handed to the cache, an open-addressing set (0 =
     * empty slot) */
    uint64_t *ideal;
    size_t ideal_cap, ideal_n;
    struct sched_entry *sched;
    size_t nsched, sched_cap;
    int32_t *reftok;   /* a request's tokens regenerated for the reference (workloads generated per request) */
    uint64_t *refhash;
    FILE *timeline;    /* --timeline */
    size_t tl_window, tl_row, tl_last_requests;
    uint64_t tl_in, tl_hit, tl_host_hit;        /* of the requests finished in the current window */
    uint64_t tl_evicted, tl_host_evicted;       /* the tiers' eviction counters at the last row */
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

/* A failed call: reported (the first failure of the run is kept) and counted as an error. */
static inline void fatal_status(replay *r, const char *what, kvhal_status st)
{
    replay_fail(kvhal_status_name(st), "%s: %s", what, replay_status_msg(st));
    r->st.errors++;
}

#endif

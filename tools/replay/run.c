/* run.c — see run.h. */
#include "run.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "engine.h"
#include "events.h"
#include "failure.h"
#include "kv.h"
#include "mix.h"
#include "replay.h"
#include "report.h"
#include "tool_common.h"
#include "workload.h"

static bool summary_printed; /* by the current run (with --json: its object, ok or not) */

/* The run's buffers: the slots and their pages (and tokens, where the workload is generated per request), the
 * decode batch's scratch, the per-call samples, the --no-kv shadow. 0, or -1 out of memory (free_run frees what
 * was allocated). */
static int alloc_run(replay *r, const workload *w, int64_t pages)
{
    const options *o = r->o;
    size_t maxp = div_up(w->max_len, (size_t)o->page_size) + 1;
    r->slots = calloc((size_t)r->nslots, sizeof *r->slots);
    r->bhash = malloc(((size_t)r->nslots + (size_t)o->chunk) * sizeof *r->bhash);
    r->bslot = malloc(((size_t)r->nslots + (size_t)o->chunk) * sizeof *r->bslot);
    r->newpages = malloc((size_t)r->nslots * sizeof *r->newpages);
    r->newpages_cap = (size_t)r->nslots;
    r->dec = malloc((size_t)r->nslots * sizeof *r->dec);
    /* one match and at most one finish per request and pass; evict_bench makes at most 16 calls a pass */
    r->samples_cap = w->n + 1;
    r->match_samples = malloc((w->n + 1) * sizeof *r->match_samples);
    r->finish_samples = malloc((w->n + 1) * sizeof *r->finish_samples);
    r->st.cap_us = (w->n + 1) * (size_t)o->repeat;
    r->st.cap_evict_us = 16 * (size_t)o->repeat;
    r->st.match_us = malloc(r->st.cap_us * sizeof(double));
    r->st.finish_us = malloc(r->st.cap_us * sizeof(double));
    r->st.evict_us = malloc(r->st.cap_evict_us * sizeof(double));
    if (!r->match_samples || !r->finish_samples || !r->st.match_us || !r->st.finish_us || !r->st.evict_us) return -1;
    r->fin = malloc((size_t)r->nslots * sizeof *r->fin);
    r->sched_cap = 2 * w->n + 2; /* an admission and a finish per request and pass */
    r->sched = malloc(r->sched_cap * sizeof *r->sched);
    if (!r->sched) return -1;
    if (!w->tok) {
        r->reftok = malloc((w->max_len + 1) * sizeof *r->reftok);
        r->refhash = malloc((w->max_len + 1) * sizeof *r->refhash);
        if (!r->reftok || !r->refhash) return -1;
    }
    if (o->no_kv) r->shadow = calloc((size_t)pages, sizeof *r->shadow);
    if (!r->slots || !r->bhash || !r->bslot || !r->newpages || !r->dec || !r->fin || (o->no_kv && !r->shadow))
        return -1;
    for (int32_t i = 0; i < r->nslots; i++) {
        slot *s = &r->slots[i];
        s->gen_req = SIZE_MAX;
        s->pages = malloc(maxp * sizeof *s->pages);
        if (!s->pages) return -1;
        if (!w->tok) {
            s->tokbuf = malloc((w->max_len + 1) * sizeof *s->tokbuf);
            if (o->no_kv) s->tagbuf = malloc((w->max_len / w->hstride + 1) * sizeof *s->tagbuf);
            else s->hashbuf = malloc((w->max_len / w->hstride + 1) * sizeof *s->hashbuf);
            if (!s->tokbuf || (!s->hashbuf && !s->tagbuf)) return -1;
        }
    }
    return 0;
}

/* --events: the file and the read buffers. 0, -1 when the file cannot be written (said on stderr), -2 out of
 * memory. */
static int open_events(replay *r)
{
    const options *o = r->o;
    r->events = fopen(o->events_path, "w");
    r->evbuf = malloc(EV_BATCH * sizeof *r->evbuf);
    r->evtok = malloc(EV_BATCH * (size_t)o->page_size * sizeof *r->evtok);
    if (!r->events) {
        replay_fail("IO_ERROR", "--events: cannot write %s", o->events_path);
        return -1;
    }
    if (!r->evbuf || !r->evtok) return -2;
    return 0;
}

/* --timeline: the file and its header. 0, or -1 when it cannot be written (reported). */
static int open_timeline(replay *r, const workload *w)
{
    const options *o = r->o;
    r->timeline = fopen(o->timeline_path, "w");
    if (!r->timeline) {
        replay_fail("IO_ERROR", "--timeline: cannot write %s", o->timeline_path);
        return -1;
    }
    r->tl_window = o->timeline_window ? (size_t)o->timeline_window : (w->n + 99) / 100;
    if (r->tl_window == 0) r->tl_window = 1;
    timeline_header(r);
    return 0;
}

/* Closes an output file of the run (--events, --timeline): false when what was written to it was lost (the run
 * fails with the reason). */
static bool close_output(replay *r, FILE **f, const char *flag, const char *path)
{
    if (!*f) return true;
    char reason[128];
    const bool ok = tool_close_file(*f, reason, sizeof reason);
    *f = NULL;
    if (!ok) {
        replay_fail("IO_ERROR", "%s %s: the output was lost (%s)", flag, path, reason);
        r->st.errors++;
    }
    return ok;
}

static void free_run(replay *r)
{
    if (r->events) fclose(r->events);
    if (r->timeline) fclose(r->timeline);
    free(r->sched);
    free(r->reftok);
    free(r->refhash);
    free(r->evbuf);
    free(r->evtok);
    if (r->slots)
        for (int32_t i = 0; i < r->nslots; i++) {
            free(r->slots[i].pages);
            free(r->slots[i].tokbuf);
            free(r->slots[i].hashbuf);
            free(r->slots[i].tagbuf);
        }
    free(r->slots);
    if (r->cm) kvhal_cache_manager_destroy(r->cm);
    free(r->bhash);
    free(r->bslot);
    free(r->newpages);
    free(r->dec);
    free(r->fin);
    free(r->match_samples);
    free(r->finish_samples);
    free(r->st.match_us);
    free(r->st.finish_us);
    free(r->st.evict_us);
    free(r->shadow);
    free(r->ideal);
}

static int out_of_memory(void)
{
    replay_fail("KVHAL_OUT_OF_MEMORY", "out of host memory");
    return 1;
}

/* The run once the workload and the paged cache are there: the cache manager of pages pages, the passes, the
 * summary. 0 when every check passed, 1 otherwise. */
static int replay_passes(replay *r, const workload *w, int64_t pages, const char *device, double t_wall)
{
    const options *o = r->o;
    if (pages < 1 || pages > INT32_MAX) {
        replay_fail("KVHAL_OUT_OF_RANGE", "--kv-budget gives %lld pages; need 1 to %d (raise --page-size or change "
                    "the budget)", (long long)pages, INT32_MAX);
        return 1;
    }
    r->total_pages = pages;
    r->st.total_pages = pages;
    if (alloc_run(r, w, pages) != 0) return out_of_memory();
    r->tiered = o->host_tier || o->events_path;
    if (o->events_path) {
        const int e = open_events(r);
        if (e == -1) return 1;
        if (e == -2) return out_of_memory();
    }
    if (o->timeline_path && open_timeline(r, w) != 0) return 1;
    kvhal_host_tier_config tcfg = {.cache = r->tiered ? r->kv->cache : NULL, .host_budget = o->host_tier,
                                   .policy = o->write_policy, .event_capacity = o->events_path ? (uint32_t)o->event_ring : 0};
    kvhal_status cst = r->tiered ? kvhal_cache_manager_create_tiered((int32_t)pages, r->ps, o->kind, &tcfg, &r->cm)
                                 : kvhal_cache_manager_create((int32_t)pages, r->ps, o->kind, &r->cm);
    if (cst != KVHAL_OK) {
        replay_fail(kvhal_status_name(cst), "cache manager: %s", replay_status_msg(cst));
        return 1;
    }
    r->work_total = w->n * (size_t)o->repeat;
    r->t_start = now_s();
    int rc = 0;
    for (int64_t i = 0; i < o->repeat && rc == 0; i++) {
        r->repeat_index = i;
        if (run_once(r) != 0) rc = 1;
    }
    progress(r, true);
    if (r->st.events_dropped && !o->events_drop_ok) {
        replay_fail("EVENTS_DROPPED", "%llu KV events dropped: the event ring (%u events) overflowed between two "
                    "reads (raise --event-ring, or --events-drop-ok accepts that)", (unsigned long long)r->st.events_dropped,
                    (unsigned)o->event_ring);
        r->st.errors++;
    }
    close_output(r, &r->events, "--events", o->events_path);
    close_output(r, &r->timeline, "--timeline", o->timeline_path);
    r->st.t_wall = now_s() - t_wall;
    print_summary(r, w, device);
    summary_printed = true;
    if (r->st.mismatches || r->st.integrity_failures || r->st.errors || r->st.skipped) rc = 1;
    return rc;
}

static int run_replay_once(const options *o)
{
    double t_wall = now_s();
    tick_init();
    workload w;
    if (workload_init(&w, o) != 0) {
        replay_fail("WORKLOAD", "could not build the workload");
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
    int rc = replay_passes(&r, &w, pages, device, t_wall);
    free_run(&r);
    if (r.kv) kv_free(&kv);
    workload_free(&w);
    return rc;
}

int run_replay(const options *o)
{
    summary_printed = false;
    replay_failure_reset();
    int rc = run_replay_once(o);
    if (rc && o->json && !summary_printed)
        tool_json_failure(stdout, REPLAY_TOOL, replay_failure_status()[0] ? replay_failure_status() : "FAILED",
                          replay_failure_message()[0] ? replay_failure_message() : "the run failed");
    return rc;
}

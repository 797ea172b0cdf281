/* report.c — see report.h. */
#include "report.h"

#include <stdio.h>

#include "clock.h"
#include "tool_common.h"

void progress(replay *r, bool force)
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
        fprintf(stderr, "\r[%s] %3.0f%%  %zu/%zu requests  %.0f req/s  hit %.1f%%  ETA %.0f s  ", bar, 100 * frac,
                r->done_total, r->work_total, el > 0 ? (double)r->done_total / el : 0, hit,
                r->done_total ? el / (double)r->done_total * (double)(r->work_total - r->done_total) : 0);
        if (force) fputc('\n', stderr);
        fflush(stderr);
    } else {
        int decile = r->work_total ? (int)(10 * r->done_total / r->work_total) : 10;
        if (decile == r->last_decile) return;
        r->last_decile = decile;
        tool_progress(REPLAY_TOOL, r->done_total, r->work_total, "requests", r->t_start, NULL);
    }
}

/* The figures of the summary, computed once for either form. */
typedef struct figures {
    double rps, rps_cpu, tps, hit, match_us, insert_us, evict_us, gbps, host_hit, unbounded;
    bool ok, host;
    const char *kind;
    kvhal_host_tier_stats ts; /* the host tier: hits loaded back, and what moved (host: there is a tier) */
    tool_percentiles pm, pf, pe;
} figures;

static figures compute_figures(const replay *r)
{
    const stats *s = &r->st;
    const options *o = r->o;
    figures g = {0};
    double eng = s->t_engine > 0 ? s->t_engine : 1e-9;
    g.rps = (double)s->requests / eng;
    /* 0 (not measured) when the process got less CPU time than the wall time of the stretches taken out (a busy
     * machine): the engine's CPU time cannot be told apart then */
    g.rps_cpu = s->t_engine_cpu > 0 ? (double)s->requests / s->t_engine_cpu : 0;
    g.unbounded = s->in_tokens ? (double)s->ideal_hit_tokens / (double)s->in_tokens : 0;
    g.tps = (double)(s->in_tokens + s->out_tokens) / eng;
    g.hit = s->in_tokens ? (double)s->hit_tokens / (double)s->in_tokens : 0;
    g.match_us = s->match_calls ? 1e6 * s->t_match / (double)s->match_calls : 0;
    g.insert_us = s->finish_calls ? 1e6 * s->t_finish / (double)s->finish_calls : 0;
    g.evict_us = s->evict_calls ? 1e6 * s->evict_s / (double)s->evict_calls : 0;
    g.gbps = s->t_write > 0 ? (double)s->bytes_written / s->t_write / 1e9 : 0;
    /* a run that skipped requests (each larger than the whole cache) did not replay the workload: not ok */
    g.ok = s->mismatches == 0 && s->integrity_failures == 0 && s->errors == 0 && s->skipped == 0;
    g.kind = o->kind == KVHAL_PREFIX_RADIX ? "radix" : "naive";
    g.host = r->tiered && o->host_tier && kvhal_cache_manager_tier_stats(r->cm, &g.ts) == KVHAL_OK &&
             g.ts.host_pages_total > 0;
    g.host_hit = s->in_tokens ? (double)s->host_hit_tokens / (double)s->in_tokens : 0;
    /* percentiles sort the sample arrays in place: they are not used after the summary */
    g.pm = tool_percentiles_of(s->match_us, s->n_match_us);
    g.pf = tool_percentiles_of(s->finish_us, s->n_finish_us);
    g.pe = tool_percentiles_of(s->evict_us, s->n_evict_us);
    return g;
}

static void print_json(const replay *r, const workload *w, const char *device, const figures *g)
{
    const stats *s = &r->st;
    const options *o = r->o;
    tool_json j;
    tool_json_init(&j, stdout);
    tool_json_head(&j, REPLAY_TOOL, g->ok);
    if (!g->ok) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%llu mismatches, %llu integrity failures, %llu errors, %llu requests skipped%s%s",
                 (unsigned long long)s->mismatches, (unsigned long long)s->integrity_failures,
                 (unsigned long long)s->errors, (unsigned long long)s->skipped,
                 replay_failure_message()[0] ? "; first: " : "", replay_failure_message());
        tool_json_error(&j, replay_failure_status()[0] ? replay_failure_status() : "VERIFICATION_FAILED", msg);
    }
    tool_json_key_int(&j, "requests", (long long)s->requests);
    tool_json_key_int(&j, "skipped", (long long)s->skipped);
    tool_json_key_int(&j, "skipped_empty", (long long)w->tr.empty);
    tool_json_key_int(&j, "repeat", (long long)o->repeat);
    tool_json_key_num(&j, "requests_per_s", g->rps, s->t_engine > 0);
    tool_json_key_num(&j, "host_hit_rate", g->host_hit, g->host);
    tool_json_key_num(&j, "miss_rate", 1 - g->hit - (g->host ? g->host_hit : 0), s->in_tokens > 0);
    if (g->host) {
        tool_json_key_int(&j, "host_hit_requests", (long long)s->host_hit_requests);
        tool_json_key_int(&j, "host_pages", (long long)g->ts.host_pages_total);
        tool_json_key_str(&j, "write_policy", o->write_policy == KVHAL_WRITE_BACK ? "back" : "through");
        tool_json_key_int(&j, "pages_written_to_host", (long long)g->ts.pages_written);
        tool_json_key_int(&j, "pages_loaded_back", (long long)g->ts.pages_loaded);
        tool_json_key_int(&j, "loaded_pages_verified", (long long)s->loaded_verified);
        tool_json_key_int(&j, "host_evictions", (long long)g->ts.host_evictions);
    } else {
        tool_json_key_str(&j, "host_pages", NULL);
    }
    tool_json_key_int(&j, "events_written", (long long)s->events_written);
    tool_json_key_int(&j, "events_dropped", (long long)s->events_dropped);
    tool_json_key_int(&j, "requests_generated", (long long)s->generated);
    tool_json_key_int(&j, "match_calls", (long long)s->match_calls); /* more than requests: some waited for room */
    tool_json_key_num(&j, "requests_per_cpu_s", g->rps_cpu, g->rps_cpu > 0);
    tool_json_key_num(&j, "requests_per_s_best_pass", s->best_pass_rps, s->best_pass_rps > 0);
    tool_json_key_num(&j, "tokens_per_s", g->tps, s->t_engine > 0);
    tool_json_key_num(&j, "hit_rate", g->hit, s->in_tokens > 0);
    tool_json_key_num(&j, "unbounded_hit_rate", g->unbounded, s->in_tokens > 0);
    tool_json_key_int(&j, "hit_requests", (long long)s->hit_requests);
    tool_json_key_int(&j, "pages_evicted", (long long)s->pages_evicted);
    tool_json_key_int(&j, "peak_pages_in_use", (long long)s->peak_in_use);
    tool_json_key_int(&j, "pages_total", (long long)s->total_pages);
    tool_json_key_int(&j, "page_size", (long long)o->page_size);
    tool_json_key_num(&j, "bytes_written", (double)s->bytes_written, !o->no_kv);
    tool_json_key_num(&j, "write_gb_per_s", g->gbps, !o->no_kv && s->t_write > 0);
    /* means (match_us, insert_us, evict_4096_us); the percentiles are in latency_us */
    tool_json_key_num(&j, "match_us", g->match_us, s->match_calls > 0);
    tool_json_key_num(&j, "insert_us", g->insert_us, s->finish_calls > 0);
    tool_json_key_num(&j, "evict_4096_us", g->evict_us, s->evict_calls > 0);
    tool_json_open(&j, "latency_us");
    tool_json_open(&j, "match");
    tool_json_percentiles(j.f, &g->pm);
    tool_json_close(&j);
    tool_json_open(&j, "finish");
    tool_json_percentiles(j.f, &g->pf);
    tool_json_close(&j);
    tool_json_open(&j, "evict_4096");
    tool_json_percentiles(j.f, &g->pe);
    tool_json_close(&j);
    tool_json_close(&j);
    tool_json_key_int(&j, "evict_calls", (long long)s->evict_calls);
    tool_json_key_num(&j, "evict_cached_tokens", (double)s->evict_cached_min, s->evict_calls > 0);
    tool_json_key_int(&j, "verified", (long long)s->verified);
    tool_json_key_int(&j, "mismatches", (long long)s->mismatches);
    tool_json_key_int(&j, "integrity_checks", (long long)s->integrity_checks);
    tool_json_key_int(&j, "integrity_failures", (long long)s->integrity_failures);
    tool_json_key_int(&j, "errors", (long long)s->errors);
    tool_json_key_num(&j, "engine_s", s->t_engine, true);
    tool_json_key_num(&j, "wall_s", s->t_wall, true);
    tool_json_key_str(&j, "mode", o->no_kv ? "no-kv" : "kv");
    tool_json_key_str(&j, "prefix", g->kind);
    tool_json_key_str(&j, "device", o->no_kv ? NULL : device);
    tool_json_key_str(&j, "model", o->model);
    tool_json_key_int(&j, "layers", o->layers);
    tool_json_key_int(&j, "kv_heads", o->kv_heads);
    tool_json_key_int(&j, "head_dim", o->head_dim);
    tool_json_key_str(&j, "dtype", kvhal_dtype_name(o->dtype));
    tool_json_key_num(&j, "kv_budget", (double)o->budget, true);
    tool_json_key_num(&j, "host_tier", (double)o->host_tier, true);
    tool_json_key_int(&j, "batch", o->batch);
    tool_json_key_str(&j, "finish", o->finish_whole ? "whole" : "suffix");
    tool_json_key_num(&j, "seed", (double)o->seed, true);
    tool_json_close(&j);
}

static void print_text(const replay *r, const workload *w, const char *device, const figures *g)
{
    const stats *s = &r->st;
    const options *o = r->o;
    printf("kvhal-replay: %s\n", w->name);
    printf("  cache        %s, %s prefix cache, page size %d, %lld pages (%s %d layers x %d kv heads x %d, %s)\n",
           o->no_kv ? "no K/V (bookkeeping only)" : device, g->kind, (int)o->page_size, (long long)s->total_pages,
           o->model, (int)o->layers, (int)o->kv_heads, (int)o->head_dim, kvhal_dtype_name(o->dtype));
    printf("  requests     %llu in %.3f s of engine time (%lld x %zu, batch %d)%s\n", (unsigned long long)s->requests,
           s->t_engine, (long long)o->repeat, w->n, (int)o->batch, s->skipped ? ", some skipped" : "");
    if (s->skipped)
        printf("  skipped      %llu (larger than the whole cache): the run FAILS, the workload was not replayed\n",
               (unsigned long long)s->skipped);
    if (w->tr.empty) printf("  skipped      %zu zero-length lines of the trace (not requests)\n", w->tr.empty);
    printf("  throughput   %.0f requests/s, %.0f tokens/s (", g->rps, g->tps);
    if (g->rps_cpu > 0) printf("%.0f requests per CPU second", g->rps_cpu);
    else printf("requests per CPU second not measured: the unmeasured stretches took more wall time than the CPU "
                "time the process got");
    if (o->repeat > 1) printf("; best pass %.0f requests/s", s->best_pass_rps);
    printf(")\n");
    printf("  prefix hits  %.2f%% of prompt tokens (%llu of %llu requests hit)\n", 100 * g->hit,
           (unsigned long long)s->hit_requests, (unsigned long long)s->requests);
    printf("  unbounded    %.2f%% of prompt tokens: what a cache that never evicts hits on this run's schedule (the "
           "requests running together); device + host hits never exceed it\n",
           100 * g->unbounded);
    if (g->host)
        printf("  host tier    %lld pages, write-%s: %.2f%% of prompt tokens loaded back (%llu requests), %.2f%% "
               "missed; %llu pages written to host, %llu loaded back (each verified), %llu host evictions\n",
               (long long)g->ts.host_pages_total, o->write_policy == KVHAL_WRITE_BACK ? "back" : "through",
               100 * g->host_hit, (unsigned long long)s->host_hit_requests, 100 * (1 - g->hit - g->host_hit),
               (unsigned long long)g->ts.pages_written, (unsigned long long)g->ts.pages_loaded,
               (unsigned long long)g->ts.host_evictions);
    if (o->events_path)
        printf("  KV events    %llu written to %s, %llu dropped%s\n", (unsigned long long)s->events_written,
               o->events_path, (unsigned long long)s->events_dropped,
               s->events_dropped ? (o->events_drop_ok ? " (--events-drop-ok)" : ": the run FAILS") : "");
    printf("  pages        %llu evicted, peak %lld of %lld in use\n", (unsigned long long)s->pages_evicted,
           (long long)s->peak_in_use, (long long)s->total_pages);
    printf("  cache ops    match %.3f us (p50 %.3f, p90 %.3f, p99 %.3f), %s (insert) %.3f us (p50 %.3f, p90 %.3f, "
           "p99 %.3f)", g->match_us, g->pm.p50, g->pm.p90, g->pm.p99,
           o->finish_whole ? "cache_finished" : "cache_finished_suffix",
           g->insert_us, g->pf.p50, g->pf.p90, g->pf.p99);
    if (s->evict_calls)
        printf(", evict(4096) %.2f us (p50 %.2f, p99 %.2f; %llu calls, >= %zu tokens cached)", g->evict_us,
               g->pe.p50, g->pe.p99, (unsigned long long)s->evict_calls, s->evict_cached_min);
    printf("\n");
    if (!o->no_kv)
        printf("  K/V written  %.3f GB, paged caching %.2f GB/s\n", (double)s->bytes_written / 1e9, g->gbps);
    printf("  verification %llu %s checked, %llu mismatches; %llu integrity checks, %llu failed: %s\n",
           (unsigned long long)s->verified, o->no_kv ? "pages" : "rows", (unsigned long long)s->mismatches,
           (unsigned long long)s->integrity_checks, (unsigned long long)s->integrity_failures, g->ok ? "PASS" : "FAIL");
}

void print_summary(const replay *r, const workload *w, const char *device)
{
    const figures g = compute_figures(r);
    if (r->o->json) print_json(r, w, device, &g);
    else print_text(r, w, device, &g);
}

void timeline_header(replay *r)
{
    fprintf(r->timeline, "pass,requests,prompt_tokens,device_hit_tokens,host_hit_tokens,hit_rate,host_hit_rate,"
            "pages_evicted,host_pages_evicted\n");
}

/* The tiers' eviction counters now. */
static void evictions(const replay *r, uint64_t *device, uint64_t *host)
{
    kvhal_host_tier_stats ts;
    *device = kvhal_cache_manager_pages_evicted(r->cm);
    *host = r->tiered && r->o->host_tier && kvhal_cache_manager_tier_stats(r->cm, &ts) == KVHAL_OK
                ? ts.host_evictions : 0;
}

void timeline_pass_start(replay *r)
{
    r->tl_last_requests = r->st.requests;
    r->tl_in = r->tl_hit = r->tl_host_hit = 0;
    evictions(r, &r->tl_evicted, &r->tl_host_evicted); /* the previous pass's emptying is no window's */
}

void timeline_row(replay *r, bool end_of_pass)
{
    const stats *s = &r->st;
    if (end_of_pass && s->requests == r->tl_last_requests) return; /* the last window was written already */
    uint64_t evicted, host_evicted;
    evictions(r, &evicted, &host_evicted);
    const uint64_t in = r->tl_in, hit = r->tl_hit, host = r->tl_host_hit;
    fprintf(r->timeline, "%lld,%llu,%llu,%llu,%llu,%.6f,%.6f,%llu,%llu\n", (long long)r->repeat_index + 1,
            (unsigned long long)s->requests, (unsigned long long)in, (unsigned long long)hit,
            (unsigned long long)host, in ? (double)hit / (double)in : 0, in ? (double)host / (double)in : 0,
            (unsigned long long)(evicted - r->tl_evicted), (unsigned long long)(host_evicted - r->tl_host_evicted));
    r->tl_in = r->tl_hit = r->tl_host_hit = 0;
    r->tl_evicted = evicted;
    r->tl_host_evicted = host_evicted;
    r->tl_last_requests = s->requests;
}

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

/* The figures of the summary, computed once for either form. */
typedef struct figures {
    double rps, rps_cpu, tps, hit, match_us, insert_us, evict_us, gbps, host_hit;
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
    g.rps_cpu = s->t_engine_cpu > 0 ? (double)s->requests / s->t_engine_cpu : 0;
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
    char tier_json[512];
    if (g->host)
        snprintf(tier_json, sizeof tier_json,
                 "\"host_hit_rate\": %.6f, \"miss_rate\": %.6f, \"host_hit_requests\": %llu, "
                 "\"host_pages\": %lld, \"write_policy\": \"%s\", \"pages_written_to_host\": %llu, "
                 "\"pages_loaded_back\": %llu, \"loaded_pages_verified\": %llu, \"host_evictions\": %llu, ",
                 g->host_hit, 1 - g->hit - g->host_hit, (unsigned long long)s->host_hit_requests,
                 (long long)g->ts.host_pages_total,
                 o->write_policy == KVHAL_WRITE_BACK ? "back" : "through", (unsigned long long)g->ts.pages_written,
                 (unsigned long long)g->ts.pages_loaded, (unsigned long long)s->loaded_verified,
                 (unsigned long long)g->ts.host_evictions);
    else
        snprintf(tier_json, sizeof tier_json, "\"host_hit_rate\": null, \"miss_rate\": %.6f, \"host_pages\": null, ",
                 1 - g->hit);
    FILE *f = stdout;
    fprintf(f, "{\"ok\": %s, \"version\": ", g->ok ? "true" : "false");
    tool_json_str(f, kvhal_version());
    if (!g->ok) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%llu mismatches, %llu integrity failures, %llu errors, %llu requests skipped%s%s",
                 (unsigned long long)s->mismatches, (unsigned long long)s->integrity_failures,
                 (unsigned long long)s->errors, (unsigned long long)s->skipped,
                 replay_failure_message()[0] ? "; first: " : "",
                 replay_failure_message());
        fprintf(f, ", \"error\": {\"status\": ");
        tool_json_str(f, replay_failure_status()[0] ? replay_failure_status() : "VERIFICATION_FAILED");
        fprintf(f, ", \"message\": ");
        tool_json_str(f, msg);
        fprintf(f, "}");
    }
    fprintf(f, ", \"requests\": %llu, \"skipped\": %llu, \"skipped_empty\": %zu, \"repeat\": %lld, "
            "\"requests_per_s\": ",
            (unsigned long long)s->requests, (unsigned long long)s->skipped, w->tr.empty, (long long)o->repeat);
    tool_json_num(f, g->rps, s->t_engine > 0);
    fprintf(f, ", %s\"events_written\": %llu", tier_json, (unsigned long long)s->events_written);
    fprintf(f, ", \"requests_per_cpu_s\": ");
    tool_json_num(f, g->rps_cpu, s->t_engine_cpu > 0);
    fprintf(f, ", \"requests_per_s_best_pass\": ");
    tool_json_num(f, s->best_pass_rps, s->best_pass_rps > 0);
    fprintf(f, ", \"tokens_per_s\": ");
    tool_json_num(f, g->tps, s->t_engine > 0);
    fprintf(f, ", \"hit_rate\": ");
    tool_json_num(f, g->hit, s->in_tokens > 0);
    fprintf(f, ", \"hit_requests\": %llu, \"pages_evicted\": %llu, \"peak_pages_in_use\": %lld, "
            "\"pages_total\": %lld, \"page_size\": %d, \"bytes_written\": ",
            (unsigned long long)s->hit_requests, (unsigned long long)s->pages_evicted, (long long)s->peak_in_use,
            (long long)s->total_pages, (int)o->page_size);
    tool_json_num(f, (double)s->bytes_written, !o->no_kv);
    fprintf(f, ", \"write_gb_per_s\": ");
    tool_json_num(f, g->gbps, !o->no_kv && s->t_write > 0);
    /* means (match_us, insert_us, evict_4096_us); the percentiles are in latency_us */
    fprintf(f, ", \"match_us\": ");
    tool_json_num(f, g->match_us, s->match_calls > 0);
    fprintf(f, ", \"insert_us\": ");
    tool_json_num(f, g->insert_us, s->finish_calls > 0);
    fprintf(f, ", \"evict_4096_us\": ");
    tool_json_num(f, g->evict_us, s->evict_calls > 0);
    fprintf(f, ", \"latency_us\": {\"match\": {");
    tool_json_percentiles(f, &g->pm);
    fprintf(f, "}, \"finish\": {");
    tool_json_percentiles(f, &g->pf);
    fprintf(f, "}, \"evict_4096\": {");
    tool_json_percentiles(f, &g->pe);
    fprintf(f, "}}, \"evict_calls\": %llu, \"evict_cached_tokens\": ", (unsigned long long)s->evict_calls);
    tool_json_num(f, (double)s->evict_cached_min, s->evict_calls > 0);
    fprintf(f, ", \"verified\": %llu, \"mismatches\": %llu, \"integrity_checks\": %llu, "
            "\"integrity_failures\": %llu, \"errors\": %llu, \"engine_s\": %.6f, \"wall_s\": %.3f, "
            "\"mode\": \"%s\", \"prefix\": \"%s\", \"device\": ",
            (unsigned long long)s->verified, (unsigned long long)s->mismatches,
            (unsigned long long)s->integrity_checks, (unsigned long long)s->integrity_failures,
            (unsigned long long)s->errors, s->t_engine, s->t_wall, o->no_kv ? "no-kv" : "kv", g->kind);
    if (o->no_kv) fprintf(f, "null");
    else tool_json_str(f, device);
    fprintf(f, ", \"model\": ");
    tool_json_str(f, o->model);
    fprintf(f, ", \"layers\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"dtype\": \"%s\", \"batch\": %d, "
            "\"finish\": \"%s\", \"seed\": %llu}\n", (int)o->layers, (int)o->kv_heads, (int)o->head_dim,
            kvhal_dtype_name(o->dtype), (int)o->batch, o->finish_whole ? "whole" : "suffix",
            (unsigned long long)o->seed);
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
    printf("  throughput   %.0f requests/s, %.0f tokens/s (%.0f requests per CPU second", g->rps, g->tps, g->rps_cpu);
    if (o->repeat > 1) printf("; best pass %.0f requests/s", s->best_pass_rps);
    printf(")\n");
    printf("  prefix hits  %.2f%% of prompt tokens (%llu of %llu requests hit)\n", 100 * g->hit,
           (unsigned long long)s->hit_requests, (unsigned long long)s->requests);
    printf("  unbounded    %.2f%% of prompt tokens: what a cache that never evicts hits on this run's schedule (the "
           "requests running together); device + host hits never exceed it\n",
           s->in_tokens ? 100.0 * (double)s->ideal_hit_tokens / (double)s->in_tokens : 0);
    if (g->host)
        printf("  host tier    %lld pages, write-%s: %.2f%% of prompt tokens loaded back (%llu requests), %.2f%% "
               "missed; %llu pages written to host, %llu loaded back (each verified), %llu host evictions\n",
               (long long)g->ts.host_pages_total, o->write_policy == KVHAL_WRITE_BACK ? "back" : "through",
               100 * g->host_hit, (unsigned long long)s->host_hit_requests, 100 * (1 - g->hit - g->host_hit),
               (unsigned long long)g->ts.pages_written, (unsigned long long)g->ts.pages_loaded,
               (unsigned long long)g->ts.host_evictions);
    if (o->events_path)
        printf("  KV events    %llu written to %s\n", (unsigned long long)s->events_written, o->events_path);
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

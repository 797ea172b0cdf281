/* workload.c — see workload.h. */
#include "workload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "failure.h"
#include "mix.h"

void gen_tokens(const workload *w, size_t i, int32_t *tok, uint64_t *hash, uint32_t *tag)
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

/* The requests of a trace, in file order or (--trace-order timestamp) by timestamp. */
static int load_trace(workload *w, const options *o)
{
    char err[1024];
    if (replay_trace_load_block(o->trace_path, o->trace_block, &w->tr, err, sizeof err) != 0) {
        replay_fail("TRACE_INVALID", "%s", err);
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
    return 0;
}

/* The shared-prefix requests: each group --prompts times, or groups drawn with popularity 1/rank^zipf; then
 * shuffled, as a serving benchmark sends them. */
static int generate_shared_prefix(workload *w, const options *o, uint64_t *rng)
{
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
            double u = (double)(rng_next(rng) >> 11) * 0x1p-53;
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
        size_t j = (size_t)(rng_next(rng) % i);
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
    return 0;
}

/* Materializes the tokens and hashes of every request when they fit (total tokens, htotal hashes); otherwise, or
 * without the memory, they are generated per request. */
static void materialize(workload *w, const options *o, size_t total, size_t htotal)
{
    /* Up to 32M tokens (384 MiB), so that generation stays out of the measured loop; bigger traces are generated
     * per request, with that time taken out of the figures. */
    if (total > ((size_t)32 << 20) || o->lazy_tokens) return;
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
        return;
    }
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

int workload_init(workload *w, const options *o)
{
    memset(w, 0, sizeof *w);
    w->seed = o->seed;
    w->vocab = o->vocab;
    w->block = o->trace_block;
    w->system_len = o->system_len;
    w->question_len = o->question_len;
    w->hstride = o->no_kv ? (size_t)o->page_size : 1;
    uint64_t rng = mix64(o->seed ^ 0x7265706c6179ULL);
    if ((o->trace_mode ? load_trace(w, o) : generate_shared_prefix(w, o, &rng)) != 0) return -1;
    size_t total = 0, htotal = 0;
    for (size_t i = 0; i < w->n; i++) {
        size_t len = (size_t)w->reqs[i].in_len + w->reqs[i].out_len;
        if (len > w->max_len) w->max_len = len;
        w->total_in += w->reqs[i].in_len;
        w->total_out += w->reqs[i].out_len;
        total += len;
        htotal += len / w->hstride;
    }
    materialize(w, o, total, htotal);
    return 0;
}

void workload_free(workload *w)
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

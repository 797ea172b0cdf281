/* engine.c — see engine.h. */
#include "engine.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "clock.h"
#include "events.h"
#include "mix.h"
#include "report.h"

/* admit, decode_step and finish stay out of line (one call per request or step) so that a profile shows the
 * three phases apart. */
#define PHASE __attribute__((noinline))

/* Writes K and V of n tokens (prefix hashes hash[i], cache slots slots[i]) in every layer. */
static int write_kv(replay *r, const uint64_t *hash, const int64_t *slots, size_t n)
{
    const char *what = NULL;
    kvhal_status st = kv_write(r->kv, hash, slots, n, &r->st.t_write, &r->st.bytes_written, &what);
    if (st != KVHAL_OK) return fatal_status(r, what, st), -1;
    return 0;
}

static void note_in_use(replay *r)
{
    int64_t used = r->total_pages - kvhal_cache_manager_num_free(r->cm);
    if (used > r->st.peak_in_use) r->st.peak_in_use = used;
}

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

/* The request's tokens and hashes: from the workload (read ahead by stage_tokens unless --cold-tokens), or
 * generated now, outside the measured time. */
static void take_tokens(replay *r, slot *s, size_t req)
{
    if (r->w->tok) {
        s->tok = r->w->tok + r->w->toff[req];
        s->hash = r->w->hash ? r->w->hash + r->w->hoff[req] : NULL;
        s->tag = r->w->tag ? r->w->tag + r->w->hoff[req] : NULL;
    } else {
        uint64_t t0 = tick();
        if (s->gen_req != req) { /* a request that waited for room keeps what was generated for it */
            gen_tokens(r->w, req, s->tokbuf, s->hashbuf, s->tagbuf);
            s->gen_req = req;
            r->st.generated++;
        }
        s->tok = s->tokbuf;
        s->hash = s->hashbuf;
        s->tag = s->tagbuf;
        r->excluded += tick() - t0;
    }
}

/* The host tier continues the match (host_len tokens): those pages are loaded back after the *have device pages
 * and the copies waited for; every loaded page is read back (one row of each), outside the measured time. Only
 * the tokens the tiered match reported (device + host) are passed: the prompt's last token is never matched (an
 * engine computes its logits), so a host page holding it must not be loaded. */
static int load_back(replay *r, slot *s, size_t host_len, int64_t *have, int64_t *need_now, size_t *cached)
{
    const size_t ps = (size_t)r->ps;
    size_t loaded = 0;
    uint64_t tl = tick();
    kvhal_status st = kvhal_cache_manager_load_back(r->cm, s->h, s->tok, *cached + host_len, s->pages + *have,
                                                    div_up(r->w->max_len, ps) - (size_t)*have, &loaded);
    if (st == KVHAL_OK) st = kvhal_cache_manager_transfer_wait(r->cm);
    r->match_ticks += tick() - tl;
    if (st != KVHAL_OK) return fatal_status(r, "load back", st), -2;
    if (loaded > host_len) {
        replay_fail("VERIFICATION_FAILED", "request %zu: load_back loaded %zu tokens, past the %zu the tiered match "
                    "reported", s->req, loaded, host_len);
        r->st.errors++;
        return -2;
    }
    *have += (int64_t)(loaded / ps);
    *need_now -= (int64_t)(loaded / ps);
    *cached += loaded;
    s->matched = *cached;
    r->st.host_hit_tokens += loaded;
    r->st.host_hit_requests += loaded > 0;
    uint64_t tv = tick();
    for (size_t p = s->dev_matched; p < *cached; p += ps) verify_row(r, s, p);
    r->st.loaded_verified += loaded / ps;
    r->excluded += tick() - tv;
    return 0;
}

/* K and V of the prompt's tokens after the cached ones, in chunks of --prefill-chunk. */
static int prefill(replay *r, const slot *s, size_t cached)
{
    const size_t ps = (size_t)r->ps, n = s->in_len - cached;
    for (size_t base = 0; base < n; base += (size_t)r->kv->chunk) {
        size_t m = n - base < (size_t)r->kv->chunk ? n - base : (size_t)r->kv->chunk;
        for (size_t i = 0; i < m; i++) {
            size_t p = cached + base + i;
            r->bslot[i] = (int64_t)s->pages[p / ps] * (int64_t)ps + (int64_t)(p % ps);
        }
        if (write_kv(r, s->hash + cached + base, r->bslot, m) != 0) return -2;
    }
    return 0;
}

/* 1 admitted, 0 no room now, -1 can never fit (skipped), -2 error. */
PHASE static int admit(replay *r, slot *s, size_t req, int32_t running)
{
    const wreq *q = &r->w->reqs[req];
    size_t ps = (size_t)r->ps;
    s->req = req;
    s->in_len = q->in_len;
    s->total = (size_t)q->in_len + q->out_len;
    take_tokens(r, s, req);
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
                fprintf(stderr, "kvhal-replay: warning: request %zu needs %lld pages, more than the cache's %lld: "
                        "skipped\n", req, (long long)(need_now + need_decode + have), (long long)r->total_pages);
            r->st.skipped++;
            return -1;
        }
        return 0;
    }
    s->matched = s->dev_matched = cached;
    if (host_len && load_back(r, s, host_len, &have, &need_now, &cached) != 0) return -2;
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
    if (r->kv && prefill(r, s, cached) != 0) return -2;
    s->len = s->in_len;
    s->npages = div_up(s->in_len, ps);
    s->in_page = s->in_len % ps;
    if (s->len < s->total) r->dec[r->ndec++] = s;
    else r->fin[r->nfin++] = s;
    s->reserve = need_decode;
    r->reserved += need_decode;
    sched_log(r, s, false);
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
    sched_log(r, s, true); /* the unbounded reference learns the request's pages after the pass */
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

/* --arrival-gaps: request next is not admitted before its arrival (t0: the pass's start). false when it is not
 * due yet and requests run; with none running, waits idle for it (outside engine time) and returns true. */
static bool arrived(replay *r, size_t next, int32_t running, double t0)
{
    double due = (r->w->tr.reqs[next].timestamp - r->w->tr.reqs[0].timestamp) * r->o->arrival_scale;
    double early = due - (now_s() - t0);
    if (early > 0 && running > 0) return false;
    if (early > 0) {
        uint64_t tw = tick();
        struct timespec ts = {(time_t)early, (long)((early - (double)(time_t)early) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        r->excluded += tick() - tw;
    }
    return true;
}

/* One pass over the workload, starting from an empty prefix cache. */
int run_once(replay *r)
{
    uint64_t evicted_before = kvhal_cache_manager_pages_evicted(r->cm), requests_before = r->st.requests;
    size_t n = r->w->n, next = 0, done = 0;
    int32_t running = 0;
    r->reserved = 0;
    r->nsched = 0;
    if (r->timeline) timeline_pass_start(r);
    r->excluded = r->match_ticks = r->finish_ticks = 0;
    r->n_match_samples = r->n_finish_samples = 0;
    r->ndec = r->nfin = 0;
    int rc = 0;
    stage_tokens(r, 0);
    double t0 = now_s(), c0 = cpu_s();
    uint64_t k0 = tick();
    while (done < n && rc == 0) {
        while (running < r->nslots && next < n) {
            if (r->o->arrival_scale > 0 && r->w->trace && !arrived(r, next, running, t0)) break;
            /* a free slot; the one that already holds this request's generated tokens (it waited for room) first */
            slot *s = NULL;
            for (int32_t i = 0; i < r->nslots; i++)
                if (!r->slots[i].active && (!s || r->slots[i].gen_req == next)) {
                    s = &r->slots[i];
                    if (s->gen_req == next) break;
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
            if (r->timeline) {
                r->tl_in += s->in_len;
                r->tl_hit += s->dev_matched;
                r->tl_host_hit += s->matched - s->dev_matched;
                if ((r->st.requests - r->tl_last_requests) % r->tl_window == 0) {
                    uint64_t t = tick();
                    timeline_row(r, false);
                    r->excluded += tick() - t;
                }
            }
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
    if (r->timeline) timeline_row(r, true);
    if (check_reference(r) != 0) rc = -1;
    check_integrity(r);
    if (rc == 0 && r->o->kind == KVHAL_PREFIX_RADIX) evict_bench(r);
    /* empty the prefix cache for the next pass (the manager and its memory stay, as in a long-running server); with
     * --events a quarter of the event ring at a time, drained in between, so that the ring never overflows */
    const size_t step = r->events ? ((size_t)r->o->event_ring / 4 + 1) * (size_t)r->ps : SIZE_MAX;
    kvhal_status st;
    for (size_t ev = 1; ev;) {
        if ((st = kvhal_cache_manager_evict(r->cm, step, &ev)) != KVHAL_OK)
            return fatal_status(r, "evict all", st), -1;
        drain_events(r);
        if (step == SIZE_MAX) break;
    }
    /* the next pass starts from empty tiers too */
    if (r->tiered && r->o->host_tier && (st = kvhal_cache_manager_host_tier_clear(r->cm)) != KVHAL_OK)
        return fatal_status(r, "host tier clear", st), -1;
    drain_events(r);
    if (rc == 0 && kvhal_cache_manager_available(r->cm) != r->total_pages) {
        replay_fail("VERIFICATION_FAILED", "%d of %lld pages available after the pass",
                (int)kvhal_cache_manager_available(r->cm), (long long)r->total_pages);
        r->st.errors++;
        rc = -1;
    }
    return rc;
}

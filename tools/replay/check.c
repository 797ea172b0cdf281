/* check.c — see check.h. */
#include "check.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "mix.h"
#include "workload.h"

static void report_mismatch(replay *r, const slot *s, size_t pos, int32_t layer, int side, int32_t head)
{
    r->st.mismatches++;
    if (r->st.mismatches <= 10) {
        char where[48] = ""; /* K/V mode: which row of which layer */
        if (layer >= 0)
            snprintf(where, sizeof where, ", layer %d, %s%s", (int)layer, side ? "V" : "K",
                     head >= 0 ? " (a head differs)" : "");
        replay_fail("VERIFICATION_FAILED", "MISMATCH: request %zu, token %zu of its %zu-token cached prefix (page %d, "
                "offset %zu)%s: the cache holds another prefix's data", s->req, pos, s->matched,
                (int)s->pages[pos / (size_t)r->ps], pos % (size_t)r->ps, where);
    }
}

void verify_row(replay *r, slot *s, size_t pos)
{
    size_t ps = (size_t)r->ps;
    if (!r->kv) {
        size_t pi = pos / ps;
        if (r->shadow[s->pages[pi]] != s->tag[pi]) report_mismatch(r, s, pi * ps, -1, -1, -1);
        r->st.verified++;
        return;
    }
    int32_t layer = (int32_t)(rng_next(&r->rng) % (uint64_t)r->kv->layers);
    for (int side = 0; side < 2; side++) {
        int32_t bad;
        kvhal_status st = kv_check_row(r->kv, s->hash[pos], layer, side, s->pages[pos / ps], (int64_t)(pos % ps),
                                       &bad);
        if (st != KVHAL_OK) {
            fatal_status(r, "read back", st);
            return;
        }
        r->st.verified++;
        if (bad >= 0) report_mismatch(r, s, pos, layer, side, bad);
    }
}

void verify_hit(replay *r, slot *s)
{
    size_t n = (size_t)r->o->samples;
    for (size_t k = 0; k < n; k++)
        verify_row(r, s, k == 0 ? 0 : k == 1 ? s->matched - 1 : (size_t)(rng_next(&r->rng) % s->matched));
}

void check_integrity(replay *r)
{
    uint64_t t0 = tick();
    kvhal_status st = kvhal_cache_manager_check_integrity(r->cm);
    r->st.integrity_checks++;
    if (st != KVHAL_OK) {
        r->st.integrity_failures++;
        replay_fail(kvhal_status_name(st), "INTEGRITY: %s", replay_status_msg(st));
    }
    r->excluded += tick() - t0;
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

void sched_log(replay *r, const slot *s, bool finish)
{
    if (r->nsched >= r->sched_cap) return; /* cannot happen: one admission and one finish per request and pass */
    sched_entry *e = &r->sched[r->nsched++];
    e->req = (uint32_t)s->req;
    e->finish = finish;
    e->fresh = !finish && kvhal_cache_manager_pages_evicted(r->cm) == 0;
    e->mlen = (uint32_t)replay_match_len(s->in_len);
    e->matched = (uint32_t)s->matched;
    e->dev_matched = (uint32_t)s->dev_matched;
    e->total = (uint32_t)s->total;
}

/* The tokens of request req: the workload's, or generated again into the reference's own buffer. */
static const int32_t *ref_tokens(replay *r, size_t req)
{
    if (r->w->tok) return r->w->tok + r->w->toff[req];
    gen_tokens(r->w, req, r->reftok, r->refhash, NULL);
    return r->reftok;
}

int check_reference(replay *r)
{
    if (r->ideal_cap) memset(r->ideal, 0, r->ideal_cap * sizeof *r->ideal); /* each pass starts from empty */
    r->ideal_n = 0;
    int rc = 0;
    for (size_t i = 0; i < r->nsched; i++) {
        const sched_entry *e = &r->sched[i];
        const int32_t *tok = ref_tokens(r, e->req);
        if (e->finish) { /* the reference learns every whole page the request handed over */
            uint64_t h = kvhal_kv_root_hash(r->ps);
            for (size_t k = 0; (k + 1) * (size_t)r->ps <= e->total; k++) {
                h = kvhal_kv_page_hash(h, tok + k * (size_t)r->ps, r->ps);
                if (ideal_add(r, h) != 0) {
                    fatal_status(r, "unbounded reference (no memory)", KVHAL_OUT_OF_MEMORY);
                    return -1;
                }
            }
            continue;
        }
        const size_t ideal = ideal_match(r, tok, e->mlen);
        r->st.ideal_hit_tokens += ideal;
        if (e->matched > ideal) {
            replay_fail("VERIFICATION_FAILED", "request %u: %u tokens matched (%u device + %u loaded back), more "
                        "than the %zu an unbounded cache holds on this schedule", e->req, e->matched,
                        e->dev_matched, e->matched - e->dev_matched, ideal);
            r->st.errors++;
            rc = -1;
        } else if (r->o->kind == KVHAL_PREFIX_RADIX && e->fresh && e->dev_matched != ideal) {
            /* exact for the radix cache (the naive one keys whole inserted sequences, so it may match less) */
            replay_fail("VERIFICATION_FAILED", "request %u: %u tokens matched with nothing ever evicted, but an "
                        "unbounded cache holds %zu on this schedule", e->req, e->dev_matched, ideal);
            r->st.errors++;
            rc = -1;
        }
    }
    r->nsched = 0;
    return rc;
}

/* fuzz_prefix.c — libFuzzer target over operation sequences on the prefix cache and the cache manager.
 * The input picks a page size, a cache size and the prefix kind, then a stream of operations: requests that match,
 * allocate, decode, finish or are dropped; direct insert/match/lock/unlock/evict/reset on a second, standalone
 * radix cache; deliberate misuse (a wrong page list, a stale or unlocked handle) that must be refused without
 * change; stale handles (a request finishing again after its finish or drop, while its pages may be another
 * request's by now; node handles of a standalone cache that was reset since) that must be refused with
 * KVHAL_INVALID_HANDLE and change nothing; and injected allocation failures. After every operation both caches
 * must pass check_integrity, and every prefix hit must return pages whose shadow content (the hash of the token
 * prefix written there) is exactly the requester's: a wrong page, not just a wrong count, aborts. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"
#include "kvhal_test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXTOK 48
#define SLOTS 4
#define MAXPAGES 128
#define MAXPS 8
#define HELD 8

typedef struct input {
    const uint8_t *p;
    size_t n;
} input;

static unsigned next(input *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

typedef struct req {
    int active;
    int32_t tok[MAXTOK];
    uint64_t hash[MAXTOK];
    size_t len, matched;
    int32_t pages[MAXTOK];
    size_t npages;
    kvhal_prefix_handle h;
    kvhal_prefix_handle done_h; /* the handle of its last finish or drop: stale for ever */
} req;

static int fault_active; /* an allocation failure is injected into the current operation */

static void check(kvhal_status st)
{
    if (st != KVHAL_OK) abort();
}

/* OK, or an out-of-memory that an injected fault explains (returns 0 then). */
static int ok_or_fault(kvhal_status st)
{
    if (st == KVHAL_OK) return 1;
    if (st == KVHAL_OUT_OF_MEMORY && fault_active) return 0;
    abort();
}

static uint64_t step_hash(uint64_t h, int32_t t)
{
    h ^= (uint32_t)t + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdULL;
}

/* Tokens from a tiny alphabet, so that prefixes are shared and edges split everywhere. */
static size_t gen_tokens(input *in, int32_t *t, uint64_t *h, size_t max)
{
    size_t n = next(in) % (max + 1);
    unsigned base = next(in) % 3;
    for (size_t i = 0; i < n; i++) {
        unsigned b = (i % 5 == 4) ? next(in) : 0;
        t[i] = (int32_t)((base + (b % 3) + (i * 7 % 3 == 0)) % 3);
        h[i] = step_hash(i ? h[i - 1] : 0, t[i]);
    }
    return n;
}

typedef struct state {
    int32_t ps, total;
    kvhal_cache_manager *cm;
    kvhal_prefix_cache *pc;   /* the standalone one */
    uint64_t shadow[MAXPAGES * MAXPS];
    req r[SLOTS];
    kvhal_prefix_handle held[HELD];
    int nheld;
    kvhal_prefix_handle dead[HELD]; /* node handles of the standalone cache from before its last reset */
    int ndead;
    int32_t next_page;       /* ids for the standalone cache */
} state;

static void write_shadow(state *s, req *q, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        s->shadow[(size_t)q->pages[i / (size_t)s->ps] * (size_t)s->ps + i % (size_t)s->ps] = q->hash[i];
}

static void drop(state *s, req *q)
{
    size_t own = q->matched / (size_t)s->ps;
    check(kvhal_cache_manager_free(s->cm, q->pages + own, (int32_t)(q->npages - own)));
    if (q->h) check(kvhal_prefix_unlock(kvhal_cache_manager_prefix(s->cm), q->h));
    q->done_h = q->h;
    q->active = 0;
}

static void op_start(state *s, input *in, req *q)
{
    if (q->active) return;
    q->len = gen_tokens(in, q->tok, q->hash, MAXTOK - 8);
    size_t cached = 0;
    kvhal_status st = kvhal_cache_manager_match(s->cm, q->tok, q->len, &q->h, &cached, q->pages, MAXTOK);
    if (!ok_or_fault(st)) return; /* only an injected fault may stop a match */
    if (cached % (size_t)s->ps || cached > q->len) abort();
    for (size_t i = 0; i < cached; i++)
        if (s->shadow[(size_t)q->pages[i / (size_t)s->ps] * (size_t)s->ps + i % (size_t)s->ps] != q->hash[i])
            abort(); /* the cache returned a page holding another prefix */
    q->matched = cached;
    size_t have = cached / (size_t)s->ps, need = (q->len + (size_t)s->ps - 1) / (size_t)s->ps;
    int32_t avail = kvhal_cache_manager_available(s->cm);
    st = kvhal_cache_manager_allocate(s->cm, (int32_t)(need - have), q->pages + have);
    if (st != KVHAL_OK) {
        /* refused only when free + evictable pages are short (allocation itself needs no memory) */
        if (st != KVHAL_OUT_OF_MEMORY || (size_t)avail >= need - have) abort();
        if (q->h) check(kvhal_prefix_unlock(kvhal_cache_manager_prefix(s->cm), q->h));
        return;
    }
    q->npages = need;
    write_shadow(s, q, cached, q->len);
    q->active = 1;
}

static void op_decode(state *s, input *in, req *q)
{
    if (!q->active || q->len >= MAXTOK) return;
    if (q->len % (size_t)s->ps == 0) {
        kvhal_status st = kvhal_cache_manager_allocate(s->cm, 1, q->pages + q->npages);
        if (st != KVHAL_OK) {
            if (st != KVHAL_OUT_OF_MEMORY) abort();
            drop(s, q); /* preempted */
            return;
        }
        q->npages++;
    }
    q->tok[q->len] = (int32_t)(next(in) % 3);
    q->hash[q->len] = step_hash(q->len ? q->hash[q->len - 1] : 0, q->tok[q->len]);
    write_shadow(s, q, q->len, q->len + 1);
    q->len++;
}

/* Finishes the request whole or by what follows its match (cache_finished_suffix), as the input says. */
static kvhal_status finish_with(state *s, const req *q, const int32_t *pages, bool suffix, kvhal_prefix_handle h)
{
    if (!suffix) return kvhal_cache_manager_cache_finished(s->cm, q->tok, q->len, pages, h);
    const size_t own = q->matched / (size_t)s->ps;
    return kvhal_cache_manager_cache_finished_suffix(s->cm, h, q->tok + q->matched, q->len - q->matched,
                                                      pages + own);
}

static kvhal_status finish_req(state *s, const req *q, const int32_t *pages, bool suffix)
{
    return finish_with(s, q, pages, suffix, q->h);
}

static void op_finish(state *s, input *in, req *q)
{
    if (!q->active) return;
    kvhal_status st = finish_req(s, q, q->pages, next(in) & 1);
    if (!ok_or_fault(st)) return; /* nothing changed, the request still runs */
    q->done_h = q->h;
    q->active = 0;
}

/* Stale handles: the request finishes again with the handle of its last finish or drop (its pages may be held by
 * another request by now, or cached, or free), or a node handle from before a reset of the standalone cache is
 * locked or unlocked. Each must be KVHAL_INVALID_HANDLE and change nothing. */
static void op_stale(state *s, input *in, req *q)
{
    if (q->done_h && q->npages) {
        int32_t before = kvhal_cache_manager_num_free(s->cm);
        kvhal_prefix_size_info si0, si1;
        check(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(s->cm), &si0));
        if (finish_with(s, q, q->pages, next(in) & 1, q->done_h) != KVHAL_INVALID_HANDLE) abort();
        if (kvhal_prefix_unlock(kvhal_cache_manager_prefix(s->cm), q->done_h) != KVHAL_INVALID_HANDLE) abort();
        check(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(s->cm), &si1));
        if (kvhal_cache_manager_num_free(s->cm) != before || si0.total_tokens != si1.total_tokens ||
            si0.protected_tokens != si1.protected_tokens)
            abort();
    }
    if (s->ndead) {
        kvhal_prefix_handle d = s->dead[next(in) % (unsigned)s->ndead];
        kvhal_prefix_size_info si0, si1;
        check(kvhal_prefix_size_info_get(s->pc, &si0));
        if (kvhal_prefix_lock(s->pc, d) != KVHAL_INVALID_HANDLE) abort();
        if (kvhal_prefix_unlock(s->pc, d) != KVHAL_INVALID_HANDLE) abort();
        check(kvhal_prefix_size_info_get(s->pc, &si1));
        if (si0.protected_tokens != si1.protected_tokens) abort();
    }
}

/* Misuse: a page list with one page swapped for one the request does not own (free, cached, or its own listed
 * twice) must be refused and change nothing. A page held by another running request is not tried: the manager
 * knows pages are held, not by whom. */
static void op_misuse(state *s, input *in, req *q)
{
    if (!q->active || q->npages == 0) return;
    const bool suffix = next(in) & 1;
    const size_t own = q->matched / (size_t)s->ps;
    if (suffix && own == q->npages) return; /* nothing of its own to get wrong */
    int32_t wrong[MAXTOK];
    memcpy(wrong, q->pages, q->npages * sizeof(int32_t));
    /* the suffix form is given only the request's own pages */
    size_t i = suffix ? own + next(in) % (q->npages - own) : next(in) % q->npages;
    wrong[i] = (int32_t)(next(in) % (unsigned)s->total);
    if (wrong[i] == q->pages[i]) return;
    for (int k = 0; k < SLOTS; k++) {
        const req *o = &s->r[k];
        if (o == q || !o->active) continue;
        for (size_t j = o->matched / (size_t)s->ps; j < o->npages; j++)
            if (o->pages[j] == wrong[i]) return;
    }
    int32_t before = kvhal_cache_manager_num_free(s->cm);
    kvhal_prefix_size_info si0, si1;
    check(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(s->cm), &si0));
    kvhal_status st = finish_req(s, q, wrong, suffix);
    if (st == KVHAL_OK || (st == KVHAL_OUT_OF_MEMORY && !fault_active)) abort();
    check(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(s->cm), &si1));
    if (kvhal_cache_manager_num_free(s->cm) != before || si0.total_tokens != si1.total_tokens ||
        si0.protected_tokens != si1.protected_tokens)
        abort();
    /* a page the request holds freed twice in one call */
    if (q->npages > (q->matched / (size_t)s->ps) + 0) {
        int32_t twice[2] = {q->pages[q->npages - 1], q->pages[q->npages - 1]};
        if (kvhal_cache_manager_free(s->cm, twice, 2) == KVHAL_OK) abort();
    }
}

static void collect(const int32_t *pages, size_t n, void *user)
{
    size_t *count = user;
    for (size_t i = 0; i < n; i++)
        if (pages[i] < 0) abort();
    *count += n;
}

static void op_standalone(state *s, input *in)
{
    int32_t t[MAXTOK];
    uint64_t h[MAXTOK];
    unsigned what = next(in) % 6;
    size_t n = gen_tokens(in, t, h, MAXTOK);
    kvhal_prefix_handle hd = 0;
    size_t got = 0;
    int32_t pages[MAXTOK];
    kvhal_prefix_size_info si;
    check(kvhal_prefix_size_info_get(s->pc, &si));
    switch (what) {
    case 0: { /* insert with fresh page ids; a match right after sees all of it */
        int32_t fresh[MAXTOK];
        for (size_t i = 0; i < n / (size_t)s->ps; i++) fresh[i] = s->next_page++;
        size_t already = 0;
        if (!ok_or_fault(kvhal_prefix_insert(s->pc, t, n, fresh, &already))) return;
        if (already > n) abort();
        if (!ok_or_fault(kvhal_prefix_match(s->pc, t, n, NULL, &got, pages, MAXTOK))) return;
        if (got != n - n % (size_t)s->ps) abort();
        break;
    }
    case 1: /* match + lock */
        if (!ok_or_fault(kvhal_prefix_match(s->pc, t, n, &hd, &got, pages, MAXTOK))) return;
        if (hd && s->nheld < HELD) {
            check(kvhal_prefix_lock(s->pc, hd));
            s->held[s->nheld++] = hd;
        }
        break;
    case 2: /* unlock one */
        if (s->nheld) {
            size_t k = next(in) % (unsigned)s->nheld;
            check(kvhal_prefix_unlock(s->pc, s->held[k]));
            s->held[k] = s->held[--s->nheld];
        }
        break;
    case 3: { /* evict: never more than the evictable tokens, and the locked ones stay */
        size_t count = 0, ev = 0;
        size_t want = next(in) * (size_t)s->ps;
        check(kvhal_prefix_evict(s->pc, want, collect, &count, &ev));
        if (ev != count * (size_t)s->ps || ev > si.evictable_tokens) abort();
        if (ev < want && ev != si.evictable_tokens) abort();
        kvhal_prefix_size_info after;
        check(kvhal_prefix_size_info_get(s->pc, &after));
        if (after.protected_tokens != si.protected_tokens) abort();
        break;
    }
    case 4: /* reset now and then: locks go too */
        if (next(in) < 16) {
            size_t count = 0;
            check(kvhal_prefix_reset(s->pc, collect, &count));
            if (count * (size_t)s->ps != si.total_tokens) abort();
            /* every handle from before is stale now, the held ones first */
            for (int k = 0; k < s->nheld && s->ndead < HELD; k++) s->dead[s->ndead++] = s->held[k];
            s->nheld = 0;
        }
        break;
    default: /* a query with too small a page buffer: refused, nothing written */
        {
            kvhal_status st = kvhal_prefix_match(s->pc, t, n, &hd, &got, pages, 0);
            if (st == KVHAL_OK ? got != 0 : st != KVHAL_OUT_OF_RANGE) abort();
        }
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size};
    state *s = calloc(1, sizeof *s);
    if (!s) return 0;
    unsigned cfg = next(&in);
    s->ps = 1 << (cfg & 3);
    s->total = 4 + (int32_t)(next(&in) % (MAXPAGES - 4));
    kvhal_prefix_kind kind = (cfg & 0x80) ? KVHAL_PREFIX_NAIVE : KVHAL_PREFIX_RADIX;
    if (kvhal_cache_manager_create(s->total, s->ps, kind, &s->cm) != KVHAL_OK ||
        kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, s->ps, &s->pc) != KVHAL_OK)
        abort();
    int fault = 0;
    for (int steps = 0; in.n && steps < 400; steps++) {
        unsigned op = next(&in);
        req *q = &s->r[(op >> 4) % SLOTS];
        fault_active = fault != 0;
        if (fault) kvhal_fault_inject_alloc(fault);
        switch (op % 10) {
        case 0: case 1: op_start(s, &in, q); break;
        case 2: case 3: op_decode(s, &in, q); break;
        case 4: op_finish(s, &in, q); break;
        case 5: if (q->active) drop(s, q); break;
        case 6: {
            size_t ev;
            check(kvhal_cache_manager_evict(s->cm, next(&in) * (size_t)s->ps, &ev));
            break;
        }
        case 7: op_misuse(s, &in, q); break;
        case 9: op_stale(s, &in, q); break;
        default: op_standalone(s, &in); break;
        }
        kvhal_fault_inject_alloc(0);
        fault_active = 0;
        fault = (op % 10 == 8 && (op & 0x40)) ? 1 + (int)(next(&in) % 4) : 0;
        check(kvhal_cache_manager_check_integrity(s->cm));
        check(kvhal_prefix_check_integrity(s->pc));
        kvhal_prefix_size_info si;
        check(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(s->cm), &si));
        if (kvhal_cache_manager_available(s->cm) !=
            kvhal_cache_manager_num_free(s->cm) + (int32_t)(si.evictable_tokens / (size_t)s->ps))
            abort();
    }
    for (int i = 0; i < SLOTS; i++)
        if (s->r[i].active) check(kvhal_cache_manager_cache_finished(s->cm, s->r[i].tok, s->r[i].len, s->r[i].pages,
                                                                     s->r[i].h));
    check(kvhal_cache_manager_check_integrity(s->cm));
    if (kvhal_cache_manager_available(s->cm) != s->total) abort(); /* nothing locked or held once all finished */
    kvhal_cache_manager_destroy(s->cm);
    kvhal_prefix_cache_destroy(s->pc);
    free(s);
    return 0;
}

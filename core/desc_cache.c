/* desc_cache.c — the descriptor cache: per thread, per (device type, device id), per op kind, an LRU of backend
 * descriptors keyed by exact tensor metadata (kvhal_desc_key).
 *
 * Why per thread: a hit is on the path of every op call, so it must take no lock; each thread owns its caches and
 * destroys its descriptors itself (on eviction, clear, or at thread exit through a pthread key destructor). The
 * library keeps a list of all thread caches only so that its unload hook (a library destructor) can destroy
 * what the still-running threads hold; that list is touched only when a thread cache is born or dies.
 *
 * Each (thread, device, op) LRU is a chained hash table of individually allocated entries threaded on an intrusive
 * doubly linked recency list: entries never move, so growth of the bucket array invalidates nothing. The 64-bit key
 * hash only picks the bucket; the full key (op, word count, words) is compared, so a collision cannot return
 * another key's descriptor. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "desc_cache.h"
#include "error.h"
#include "faults.h"
#include "registry.h"

#define MAX_OP_KINDS 256
#define OP_NAME_MAX 64
#define MAX_CAPACITY ((size_t)1 << 24)
#define HASH_CONSTANT 0x9e3779b9u

/* ---- op kind registry ---- */

struct op_kind {
    char name[OP_NAME_MAX];
    kvhal_desc_destroy_fn destroy;
    void *user;
    _Atomic size_t capacity;
};

static struct op_kind op_kinds[MAX_OP_KINDS];
/* Kinds [0, op_count) are fully written before op_count is raised (release), so readers need no lock. */
static atomic_int op_count;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;
static size_t default_capacity = 100;

static void registry_init(void)
{
    const char *env = getenv("KVHAL_DESC_CACHE_CAPACITY");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 10);
        if (*end == '\0' && env[0] != '-' && v <= MAX_CAPACITY) default_capacity = (size_t)v;
        else kvhal__log(1, "KVHAL_DESC_CACHE_CAPACITY: '%s' is not a count in [0, %zu]; using %zu", env,
                        MAX_CAPACITY, default_capacity);
    }
    /* The built-in kinds: one per op of KVHAL_BK_OP_LIST, under its id. Their descriptors go back to the backend
     * that made them (struct lru's owner), so they need no destroy function here. */
    for (int i = 0; i < KVHAL_BK_OP_COUNT; i++) {
        snprintf(op_kinds[i].name, sizeof op_kinds[i].name, "%s", kvhal__op_name((kvhal_bk_op)i));
        atomic_store_explicit(&op_kinds[i].capacity, default_capacity, memory_order_relaxed);
    }
    atomic_store_explicit(&op_count, KVHAL_BK_OP_COUNT, memory_order_release);
}

static inline void registry_ready(void) { pthread_once(&registry_once, registry_init); }

static inline bool op_valid(uint32_t op)
{
    return op < (uint32_t)atomic_load_explicit(&op_count, memory_order_acquire);
}

static kvhal_status check_op(kvhal_op_kind op, const char *arg)
{
    registry_ready();
    int n = atomic_load_explicit(&op_count, memory_order_acquire);
    if (op < 0 || op >= n)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: op kind %d is not registered (registered: [0, %d))", arg,
                          (int)op, n);
    return KVHAL_OK;
}

kvhal_status kvhal_desc_op_register(const char *name, kvhal_desc_destroy_fn destroy, void *user,
                                    kvhal_op_kind *out)
{
    KVHAL_CHECK_ARG(name, "name: NULL");
    KVHAL_CHECK_ARG(out, "out: NULL");
    size_t len = strlen(name);
    KVHAL_CHECK_ARG(len > 0 && len < OP_NAME_MAX, "name: '%.80s' must be 1 to %d characters long", name,
                    OP_NAME_MAX - 1);
    registry_ready();
    pthread_mutex_lock(&registry_lock);
    int n = atomic_load_explicit(&op_count, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        if (!strcmp(op_kinds[i].name, name)) {
            pthread_mutex_unlock(&registry_lock);
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "name: '%s' is already registered as op kind %d", name, i);
        }
    }
    if (n >= MAX_OP_KINDS) {
        pthread_mutex_unlock(&registry_lock);
        return kvhal__err(KVHAL_OUT_OF_RANGE, "name: cannot register '%s': all %d op kinds are taken", name,
                          MAX_OP_KINDS);
    }
    memcpy(op_kinds[n].name, name, len + 1);
    op_kinds[n].destroy = destroy;
    op_kinds[n].user = user;
    atomic_store_explicit(&op_kinds[n].capacity, default_capacity, memory_order_relaxed);
    atomic_store_explicit(&op_count, n + 1, memory_order_release);
    pthread_mutex_unlock(&registry_lock);
    *out = n;
    return KVHAL_OK;
}

kvhal_status kvhal_desc_op_find(const char *name, kvhal_op_kind *out)
{
    KVHAL_CHECK_ARG(name, "name: NULL");
    KVHAL_CHECK_ARG(out, "out: NULL");
    registry_ready();
    int n = atomic_load_explicit(&op_count, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        if (!strcmp(op_kinds[i].name, name)) {
            *out = i;
            return KVHAL_OK;
        }
    }
    return kvhal__err(KVHAL_NOT_FOUND, "name: no op kind named '%.80s'", name);
}

/* ---- keys ---- */

static inline uint64_t hash_combine(uint64_t seed, uint64_t v)
{
    return seed ^ (v + HASH_CONSTANT + (seed << 6) + (seed >> 2));
}

kvhal_status kvhal_desc_key_init(kvhal_desc_key *key, kvhal_op_kind op)
{
    KVHAL_CHECK_ARG(key, "key: NULL");
    KVHAL_TRY(check_op(op, "op"));
    key->op = (uint32_t)op;
    key->nwords = 0;
    key->hash = hash_combine(0, (uint64_t)op);
    return KVHAL_OK;
}

kvhal_status kvhal_desc_key_add_u64(kvhal_desc_key *key, uint64_t v)
{
    KVHAL_CHECK_ARG(key, "key: NULL");
    if (key->nwords >= KVHAL_DESC_KEY_MAX_WORDS)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "key: already holds %u words, the most a key can hold (%d)",
                          key->nwords, KVHAL_DESC_KEY_MAX_WORDS);
    key->words[key->nwords++] = v;
    key->hash = hash_combine(key->hash, v);
    return KVHAL_OK;
}

kvhal_status kvhal_desc_key_add_tensor(kvhal_desc_key *key, const kvhal_tensor *t)
{
    KVHAL_CHECK_ARG(key, "key: NULL");
    KVHAL_CHECK_ARG(t, "t: NULL");
    KVHAL_CHECK_ARG(t->ndim >= 1 && t->ndim <= KVHAL_MAX_DIMS, "t.ndim: %d is outside [1, %d]", t->ndim,
                    KVHAL_MAX_DIMS);
    uint32_t need = 2u + 2u * (uint32_t)t->ndim;
    if (key->nwords > KVHAL_DESC_KEY_MAX_WORDS || KVHAL_DESC_KEY_MAX_WORDS - key->nwords < need)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "key: %u words plus this tensor's %u exceed the limit of %d",
                          key->nwords, need, KVHAL_DESC_KEY_MAX_WORDS);
    uint64_t h = key->hash;
    uint64_t *w = key->words + key->nwords;
    *w++ = (uint64_t)t->dtype;
    *w++ = (uint64_t)t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        *w++ = (uint64_t)t->shape[i];
        *w++ = (uint64_t)t->strides[i];
    }
    for (uint32_t i = 0; i < need; i++) h = hash_combine(h, key->words[key->nwords + i]);
    key->hash = h;
    key->nwords += need;
    return KVHAL_OK;
}

void kvhal__desc_key_rehash(kvhal_desc_key *key)
{
    uint64_t h = hash_combine(0, key->op);
    for (uint32_t i = 0; i < key->nwords; i++) h = hash_combine(h, key->words[i]);
    key->hash = h;
}

bool kvhal_desc_key_equal(const kvhal_desc_key *a, const kvhal_desc_key *b)
{
    if (!a || !b) return a == b;
    if (a->hash != b->hash || a->op != b->op || a->nwords != b->nwords || a->nwords > KVHAL_DESC_KEY_MAX_WORDS)
        return false;
    return memcmp(a->words, b->words, a->nwords * sizeof(uint64_t)) == 0;
}

static inline size_t op_capacity(uint32_t op);

/* ---- per-thread caches ---- */

struct entry {
    struct entry *hnext;      /* bucket chain */
    struct entry *prev, *next; /* recency list: prev is more recent */
    void *desc;
    uint64_t hash;
    uint32_t nwords;
    uint64_t words[];         /* nwords of them; the op is implied by the LRU the entry is in */
};

struct lru {
    struct entry **buckets;
    size_t mask;              /* bucket count - 1 (a power of two) */
    struct entry *head, *tail; /* most / least recently used */
    size_t size;
    void *transient;          /* capacity 0: the last created descriptor, destroyed at the next miss or clear */
    const kvhal__bk *owner;   /* built-in op kinds: the backend whose desc_create made the descriptors */
    bool has_transient;
    int32_t in_destroy;       /* destroy functions of this LRU running: their puts never evict */
    size_t room;              /* while in_destroy: the size up to which their puts are cached */
    uint64_t hits, misses, evictions, inserts;
};

struct dev_cache {
    struct lru *ops[MAX_OP_KINDS];
};

struct thread_cache {
    struct dev_cache *devs[KVHAL_MAX_DEVICE_TYPES][KVHAL_MAX_DEVICES_PER_TYPE];
    struct thread_cache *prev, *next; /* all_caches list, under list_lock */
};

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct thread_cache *all_caches;
static pthread_key_t exit_key;
static bool exit_key_made;
/* Bumped by shutdown: a thread whose cache predates it must not touch the (freed) cache again. */
static atomic_uint generation = 1;

/* One thread-local object, so the hot path resolves one TLS address. */
static _Thread_local struct {
    struct thread_cache *cache;
    unsigned generation;
    bool tearing_down; /* this thread destroys a whole thread cache (its exit, or shutdown): puts are refused */
} tls;

/* Each LRU destroys its own descriptors: a built-in op's go back to the backend that made them (the LRU's owner,
 * so no registry lookup happens here), a registered kind's to the function it was registered with. */
/* room: the LRU size up to which a put from the destroy function is cached (what its caller leaves free). */
static void destroy_desc(struct lru *l, uint32_t op, kvhal_device dev, void *desc, size_t room)
{
    if (op < KVHAL_BK_OP_COUNT) {
        const kvhal__bk *bk = l->owner;
        /* a placeholder of a backend without desc_create has nothing to destroy; a forked child leaves the
         * parent's descriptors alone (kvhal__bk_usable) */
        if (bk && bk->ops.desc_create && bk->ops.desc_destroy && kvhal__bk_usable(bk))
            bk->ops.desc_destroy(bk->ctx, dev.id, (kvhal_bk_op)op, desc);
        return;
    }
    kvhal_desc_destroy_fn fn = op_kinds[op].destroy;
    if (!fn) return;
    /* re-entry is allowed, but a put from fn never evicts (evicting would run fn again, and a fn that puts once per
     * call would never let the chain end): it is cached while there is room, refused with KVHAL_BUSY otherwise */
    size_t saved = l->room;
    l->room = room;
    l->in_destroy++;
    fn(desc, dev, op_kinds[op].user);
    l->in_destroy--;
    l->room = saved;
}

static inline size_t bucket_of(const struct lru *l, uint64_t hash)
{
    /* hash_combine's low bits mix poorly for small words; a multiplicative step spreads them. */
    return (size_t)((hash * 0x9e3779b97f4a7c15ull) >> 32) & l->mask;
}

static inline struct entry *lru_find(const struct lru *l, const kvhal_desc_key *key)
{
    for (struct entry *e = l->buckets[bucket_of(l, key->hash)]; e; e = e->hnext) {
        if (e->hash == key->hash && e->nwords == key->nwords &&
            memcmp(e->words, key->words, key->nwords * sizeof(uint64_t)) == 0)
            return e;
    }
    return NULL;
}

static inline void list_unlink(struct lru *l, struct entry *e)
{
    if (e->prev) e->prev->next = e->next;
    else l->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else l->tail = e->prev;
}

static inline void list_push_front(struct lru *l, struct entry *e)
{
    e->prev = NULL;
    e->next = l->head;
    if (l->head) l->head->prev = e;
    else l->tail = e;
    l->head = e;
}

static inline void touch(struct lru *l, struct entry *e)
{
    if (l->head == e) return;
    list_unlink(l, e);
    list_push_front(l, e);
}

static void bucket_remove(struct lru *l, struct entry *e)
{
    struct entry **p = &l->buckets[bucket_of(l, e->hash)];
    while (*p != e) p = &(*p)->hnext;
    *p = e->hnext;
}

/* Unlinks the entry and returns its descriptor; the caller destroys it once the LRU is consistent again (a destroy
 * function may call back into the cache). */
static void *lru_remove(struct lru *l, struct entry *e)
{
    void *desc = e->desc;
    bucket_remove(l, e);
    list_unlink(l, e);
    l->size--;
    free(e);
    return desc;
}

/* Evicts what is over keep now, and no more: a destroy function that puts a descriptor back (re-entry is allowed)
 * cannot keep the loop going. */
static void lru_trim(struct lru *l, uint32_t op, kvhal_device dev, size_t keep)
{
    for (size_t over = l->size > keep ? l->size - keep : 0; over > 0 && l->tail; over--) {
        void *d = lru_remove(l, l->tail);
        l->evictions++;
        destroy_desc(l, op, dev, d, keep);
    }
}

static void lru_drop_transient(struct lru *l, uint32_t op, kvhal_device dev)
{
    if (!l->has_transient) return;
    void *d = l->transient;
    l->transient = NULL;
    l->has_transient = false;
    destroy_desc(l, op, dev, d, 0);
}

/* Detaches every entry first, then destroys them: what a destroy function puts back meanwhile stays cached (a
 * clear) or is refused (teardown, tls.tearing_down), so the loop ends. */
static void lru_clear(struct lru *l, uint32_t op, kvhal_device dev)
{
    struct entry *e = l->head;
    l->head = l->tail = NULL;
    l->size = 0;
    memset(l->buckets, 0, (l->mask + 1) * sizeof *l->buckets);
    while (e) {
        struct entry *next = e->next;
        void *d = e->desc;
        free(e);
        destroy_desc(l, op, dev, d, op_capacity(op));
        e = next;
    }
    lru_drop_transient(l, op, dev);
}

static void lru_grow(struct lru *l)
{
    size_t n = (l->mask + 1) * 2;
    struct entry **b = kvhal__calloc(n, sizeof *b);
    if (!b) return; /* longer chains, still correct */
    struct lru tmp = *l;
    tmp.buckets = b;
    tmp.mask = n - 1;
    for (struct entry *e = l->head; e; e = e->next) {
        size_t i = bucket_of(&tmp, e->hash);
        e->hnext = b[i];
        b[i] = e;
    }
    free(l->buckets);
    l->buckets = b;
    l->mask = n - 1;
}

/* Inserts a new key (known absent). On allocation failure nothing changes and the caller keeps desc. */
static kvhal_status lru_insert(struct lru *l, uint32_t op, kvhal_device dev, const kvhal_desc_key *key, void *desc,
                               size_t capacity)
{
    struct entry *e = kvhal__malloc(sizeof *e + key->nwords * sizeof(uint64_t));
    if (!e) return kvhal__err(KVHAL_OUT_OF_MEMORY, "desc cache: cannot allocate an entry of %u words", key->nwords);
    e->desc = desc;
    e->hash = key->hash;
    e->nwords = key->nwords;
    memcpy(e->words, key->words, key->nwords * sizeof(uint64_t));
    lru_trim(l, op, dev, capacity - 1);
    /* a destroy function run by the trim may have put this very key: replace its descriptor */
    struct entry *dup = lru_find(l, key);
    if (dup) {
        free(e);
        void *old = dup->desc;
        dup->desc = desc;
        touch(l, dup);
        l->inserts++;
        if (old != desc) destroy_desc(l, op, dev, old, capacity);
        return KVHAL_OK;
    }
    size_t i = bucket_of(l, e->hash);
    e->hnext = l->buckets[i];
    l->buckets[i] = e;
    list_push_front(l, e);
    l->size++;
    l->inserts++;
    if (l->size > l->mask) lru_grow(l); /* load factor <= 1 */
    return KVHAL_OK;
}

static void thread_cache_destroy_all(struct thread_cache *tc, kvhal_device_type only_type, int32_t only_id)
{
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        for (int id = 0; id < KVHAL_MAX_DEVICES_PER_TYPE; id++) {
            if (only_id >= 0 && (t != (int)only_type || id != only_id)) continue;
            struct dev_cache *dc = tc->devs[t][id];
            if (!dc) continue;
            kvhal_device dev = {(kvhal_device_type)t, id};
            for (uint32_t op = 0; op < MAX_OP_KINDS; op++)
                if (dc->ops[op]) lru_clear(dc->ops[op], op, dev);
        }
    }
}

static void thread_cache_free(struct thread_cache *tc)
{
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        for (int id = 0; id < KVHAL_MAX_DEVICES_PER_TYPE; id++) {
            struct dev_cache *dc = tc->devs[t][id];
            if (!dc) continue;
            for (int op = 0; op < MAX_OP_KINDS; op++) {
                if (dc->ops[op]) free(dc->ops[op]->buckets);
                free(dc->ops[op]);
            }
            free(dc);
        }
    }
    free(tc);
}

static void thread_exit(void *p)
{
    struct thread_cache *tc = p;
    pthread_mutex_lock(&list_lock);
    if (tc->prev) tc->prev->next = tc->next;
    else all_caches = tc->next;
    if (tc->next) tc->next->prev = tc->prev;
    pthread_mutex_unlock(&list_lock);
    /* A destroy function that calls back into the cache does not reach this one; its puts are refused. */
    if (tls.cache == tc) tls.cache = NULL;
    bool was = tls.tearing_down;
    tls.tearing_down = true;
    thread_cache_destroy_all(tc, KVHAL_DEVICE_CPU, -1);
    tls.tearing_down = was;
    thread_cache_free(tc);
}

static inline struct thread_cache *thread_cache_current(void)
{
    struct thread_cache *tc = tls.cache;
    if (tc && tls.generation == atomic_load_explicit(&generation, memory_order_relaxed)) return tc;
    return NULL;
}

static struct thread_cache *thread_cache_create(void)
{
    registry_ready();
    struct thread_cache *tc = kvhal__calloc(1, sizeof *tc);
    if (!tc) {
        kvhal__err(KVHAL_OUT_OF_MEMORY, "desc cache: cannot allocate this thread's cache");
        return NULL;
    }
    pthread_mutex_lock(&list_lock);
    if (!exit_key_made) {
        if (pthread_key_create(&exit_key, thread_exit) != 0) {
            pthread_mutex_unlock(&list_lock);
            free(tc);
            kvhal__err(KVHAL_INTERNAL, "desc cache: pthread_key_create failed");
            return NULL;
        }
        exit_key_made = true;
    }
    if (pthread_setspecific(exit_key, tc) != 0) {
        pthread_mutex_unlock(&list_lock);
        free(tc);
        kvhal__err(KVHAL_OUT_OF_MEMORY, "desc cache: pthread_setspecific failed");
        return NULL;
    }
    tc->next = all_caches;
    if (all_caches) all_caches->prev = tc;
    all_caches = tc;
    tls.generation = atomic_load_explicit(&generation, memory_order_relaxed);
    pthread_mutex_unlock(&list_lock);
    tls.cache = tc;
    return tc;
}

static inline bool device_in_range(kvhal_device dev)
{
    return (unsigned)dev.type < KVHAL_MAX_DEVICE_TYPES && (unsigned)dev.id < KVHAL_MAX_DEVICES_PER_TYPE;
}

static struct lru *lru_create_slow(kvhal_device dev, uint32_t op)
{
    struct thread_cache *tc = thread_cache_current();
    if (!tc && !(tc = thread_cache_create())) return NULL;
    struct dev_cache **dcp = &tc->devs[dev.type][dev.id];
    if (!*dcp && !(*dcp = kvhal__calloc(1, sizeof **dcp))) {
        kvhal__err(KVHAL_OUT_OF_MEMORY, "desc cache: cannot allocate a device cache");
        return NULL;
    }
    struct lru *l = kvhal__calloc(1, sizeof *l);
    if (!l) {
        kvhal__err(KVHAL_OUT_OF_MEMORY, "desc cache: cannot allocate an LRU");
        return NULL;
    }
    l->buckets = kvhal__calloc(16, sizeof *l->buckets);
    if (!l->buckets) {
        free(l);
        kvhal__err(KVHAL_OUT_OF_MEMORY, "desc cache: cannot allocate an LRU's buckets");
        return NULL;
    }
    l->mask = 15;
    (*dcp)->ops[op] = l;
    return l;
}

/* The LRU of (this thread, dev, op); created on first use. NULL with an error set on allocation failure. */
static inline struct lru *lru_get(kvhal_device dev, uint32_t op)
{
    struct thread_cache *tc = thread_cache_current();
    if (tc) {
        struct dev_cache *dc = tc->devs[dev.type][dev.id];
        if (dc && dc->ops[op]) return dc->ops[op];
    }
    return lru_create_slow(dev, op);
}

static inline size_t op_capacity(uint32_t op)
{
    return atomic_load_explicit(&op_kinds[op].capacity, memory_order_relaxed);
}

static kvhal_status check_key_dev(kvhal_device dev, const kvhal_desc_key *key)
{
    if (!key) return kvhal__err(KVHAL_INVALID_ARGUMENT, "key: NULL");
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    if (!device_in_range(dev))
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "dev: type %d id %d is not a device", (int)dev.type, (int)dev.id);
    if (key->nwords > KVHAL_DESC_KEY_MAX_WORDS)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "key.nwords: %u exceeds %d", key->nwords, KVHAL_DESC_KEY_MAX_WORDS);
    if (!op_valid(key->op)) return check_op((kvhal_op_kind)key->op, "key.op");
    return KVHAL_OK;
}

kvhal_status kvhal_desc_cache_get(kvhal_device dev, const kvhal_desc_key *key, void **desc)
{
    if (__builtin_expect(!desc, 0)) return kvhal__err(KVHAL_INVALID_ARGUMENT, "desc: NULL");
    KVHAL_TRY(check_key_dev(dev, key));
    struct lru *l = lru_get(dev, key->op);
    if (!l) return KVHAL_OUT_OF_MEMORY;
    struct entry *e = lru_find(l, key);
    if (!e) {
        l->misses++;
        return KVHAL_NOT_FOUND;
    }
    touch(l, e);
    l->hits++;
    *desc = e->desc;
    return KVHAL_OK;
}

kvhal_status kvhal_desc_cache_put(kvhal_device dev, const kvhal_desc_key *key, void *desc)
{
    KVHAL_TRY(check_key_dev(dev, key));
    if (key->op < KVHAL_BK_OP_COUNT)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "key.op: %u (%s) is a built-in op kind, whose descriptors only its "
                          "backend makes; register a kind of your own with kvhal_desc_op_register", key->op,
                          op_kinds[key->op].name);
    if (tls.tearing_down)
        return kvhal__err(KVHAL_BUSY, "desc: not cached, the caller keeps it: this thread's descriptor caches are "
                          "being destroyed (a destroy function putting a descriptor at thread exit or unload)");
    struct lru *l = lru_get(dev, key->op);
    if (!l) return KVHAL_OUT_OF_MEMORY;
    struct entry *e = lru_find(l, key);
    if (e) {
        void *old = e->desc;
        e->desc = desc;
        touch(l, e);
        l->inserts++;
        if (old != desc) destroy_desc(l, key->op, dev, old, op_capacity(key->op));
        return KVHAL_OK;
    }
    size_t cap = op_capacity(key->op);
    if (l->in_destroy && l->size >= (l->room < cap ? l->room : cap))
        return kvhal__err(KVHAL_BUSY, "desc: not cached, the caller keeps it: put from a destroy function of the same "
                          "op kind while its LRU has no room (%zu of %zu); evicting would run the destroy function "
                          "again", l->size, cap);
    if (cap == 0) {
        /* Caching is off for this op: the cache owns desc and has nowhere to keep it. */
        lru_trim(l, key->op, dev, 0);
        destroy_desc(l, key->op, dev, desc, 0);
        return KVHAL_OK;
    }
    return lru_insert(l, key->op, dev, key, desc, cap);
}

kvhal_status kvhal__desc_make(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, const void *args, void **desc)
{
    *desc = NULL;
    if (bk->ops.supports) {
        char reason[256] = "";
        if (!bk->ops.supports(bk->ctx, dev.id, op, args, reason, sizeof reason))
            return kvhal__unsupported(bk, dev, op, reason);
    }
    if (bk->ops.desc_create) KVHAL_TRY(bk->ops.desc_create(bk->ctx, dev.id, op, args, desc));
    return KVHAL_OK;
}

void kvhal__desc_release(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, void *desc)
{
    if (bk->ops.desc_create && bk->ops.desc_destroy) bk->ops.desc_destroy(bk->ctx, dev.id, op, desc);
}

kvhal_status kvhal__desc_get_or_create(kvhal_device dev, const kvhal__bk *bk, kvhal_bk_op op,
                                       const kvhal_desc_key *key, const void *args, void **desc)
{
    /* dev comes from a validated buffer and op from the core, so only the LRU lookup remains on a hit. */
    struct lru *l = lru_get(dev, (uint32_t)op);
    if (__builtin_expect(!l, 0)) return KVHAL_OUT_OF_MEMORY;
    struct entry *e = lru_find(l, key);
    if (__builtin_expect(e != NULL, 1)) {
        touch(l, e);
        l->hits++;
        *desc = e->desc;
        return KVHAL_OK;
    }
    l->misses++;
    l->owner = bk;
    void *d = NULL;
    KVHAL_TRY(kvhal__desc_make(bk, dev, op, args, &d));
    /* A backend without desc_create gets a placeholder entry (desc NULL, nothing to destroy): its supports() answer
     * is cached under the key like a descriptor, so supports runs once per key, not on every call. */
    size_t cap = op_capacity((uint32_t)op);
    if (cap == 0) {
        /* Not cached, but it must outlive this call's launch: keep it until the next miss (or clear/exit). */
        lru_trim(l, (uint32_t)op, dev, 0);
        lru_drop_transient(l, (uint32_t)op, dev);
        l->transient = d;
        l->has_transient = true;
        *desc = d;
        return KVHAL_OK;
    }
    kvhal_status st = lru_insert(l, (uint32_t)op, dev, key, d, cap);
    if (st != KVHAL_OK) {
        destroy_desc(l, (uint32_t)op, dev, d, 0);
        return st;
    }
    *desc = d;
    return KVHAL_OK;
}

void *kvhal__desc_peek(kvhal_device dev, const kvhal_desc_key *key)
{
    struct thread_cache *tc = thread_cache_current();
    if (!tc || !device_in_range(dev) || key->op >= MAX_OP_KINDS) return NULL;
    struct dev_cache *dc = tc->devs[dev.type][dev.id];
    struct lru *l = dc ? dc->ops[key->op] : NULL;
    struct entry *e = l ? lru_find(l, key) : NULL;
    return e ? e->desc : NULL;
}

kvhal_status kvhal_desc_cache_set_capacity(kvhal_op_kind op, size_t capacity)
{
    KVHAL_TRY(check_op(op, "op"));
    if (capacity > MAX_CAPACITY)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "capacity: %zu exceeds the limit of %zu", capacity, MAX_CAPACITY);
    atomic_store_explicit(&op_kinds[op].capacity, capacity, memory_order_relaxed);
    /* This thread's LRUs shrink now; other threads' shrink at their next insert (their entries are theirs to
     * destroy, and the hot path takes no lock). */
    struct thread_cache *tc = thread_cache_current();
    if (!tc) return KVHAL_OK;
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES; t++) {
        for (int id = 0; id < KVHAL_MAX_DEVICES_PER_TYPE; id++) {
            struct dev_cache *dc = tc->devs[t][id];
            if (dc && dc->ops[op]) lru_trim(dc->ops[op], (uint32_t)op, (kvhal_device){(kvhal_device_type)t, id},
                                            capacity);
        }
    }
    return KVHAL_OK;
}

kvhal_status kvhal_desc_cache_get_capacity(kvhal_op_kind op, size_t *capacity)
{
    KVHAL_CHECK_ARG(capacity, "capacity: NULL");
    KVHAL_TRY(check_op(op, "op"));
    *capacity = op_capacity((uint32_t)op);
    return KVHAL_OK;
}

kvhal_status kvhal_desc_cache_get_stats(kvhal_device dev, kvhal_op_kind op, kvhal_desc_cache_stats *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    KVHAL_CHECK_ARG(device_in_range(dev), "dev: type %d id %d is not a device", (int)dev.type, (int)dev.id);
    KVHAL_TRY(check_op(op, "op"));
    memset(out, 0, sizeof *out);
    out->capacity = op_capacity((uint32_t)op);
    struct thread_cache *tc = thread_cache_current();
    struct dev_cache *dc = tc ? tc->devs[dev.type][dev.id] : NULL;
    struct lru *l = dc ? dc->ops[op] : NULL;
    if (l) {
        out->hits = l->hits;
        out->misses = l->misses;
        out->evictions = l->evictions;
        out->inserts = l->inserts;
        out->size = l->size;
    }
    return KVHAL_OK;
}

kvhal_status kvhal_desc_cache_clear(kvhal_device dev)
{
    KVHAL_CHECK_ARG(device_in_range(dev), "dev: type %d id %d is not a device", (int)dev.type, (int)dev.id);
    struct thread_cache *tc = thread_cache_current();
    if (tc) thread_cache_destroy_all(tc, dev.type, dev.id);
    return KVHAL_OK;
}

/* Library unload: the descriptors of the unloading thread and of threads still alive go back to their backends
 * while the modules are still mapped. Modules stay mapped: their runtimes tear down through their own atexit
 * hooks. */
__attribute__((destructor)) static void desc_cache_unload(void)
{
    pthread_mutex_lock(&list_lock);
    /* Threads still running lose their caches: their next call sees a new generation and starts afresh. The key
     * goes so that no destructor of this (possibly unloaded) library runs at their exit. */
    atomic_fetch_add_explicit(&generation, 1, memory_order_relaxed);
    if (exit_key_made) {
        pthread_key_delete(exit_key);
        exit_key_made = false;
    }
    struct thread_cache *list = all_caches;
    all_caches = NULL;
    pthread_mutex_unlock(&list_lock);
    tls.tearing_down = true;
    while (list) {
        struct thread_cache *next = list->next;
        thread_cache_destroy_all(list, KVHAL_DEVICE_CPU, -1);
        thread_cache_free(list);
        list = next;
    }
    tls.tearing_down = false;
}

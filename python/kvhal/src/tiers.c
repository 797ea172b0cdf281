/* tiers.c — kvhal.TieredCacheManager: a CacheManager (whose methods it inherits: allocate, free, cache_finished,
 * evict, lock, unlock...) with a host tier under a PagedCache's device pages (kvhal_cache_manager_create_tiered):
 * match_tiered reports device and host hits, load_back brings host pages back, the write policy decides when pages
 * are copied to the host, and events() drains the KV events. */
#include <string.h>

#include "bind.h"
#include "prefix.h"
#include "stream.h"

typedef struct {
    kvpy_manager_object base; /* first: CacheManager's methods work on it */
    PyObject *cache;          /* the PagedCache (kept alive: the manager borrows it) */
    PyObject *stream;         /* the kvhal.Stream of the copies, or NULL */
    kvhal_write_policy policy;
    uint32_t event_capacity;
    uint64_t host_budget;
} tiered_object;

static int tiered_init(PyObject *op, PyObject *args, PyObject *kw)
{
    tiered_object *self = (tiered_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"cache", "total_pages", "kind", "host_pages", "host_budget", "policy", "stream",
                            "event_capacity", NULL};
    PyObject *cache, *kind = NULL, *policy = NULL, *stream = Py_None;
    long long total = -1, host_pages = -1, host_budget = -1, events = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|LOLLOOL", names, &cache, &total, &kind, &host_pages, &host_budget,
                                     &policy, &stream, &events))
        return -1;
    kvhal_paged_cache *pc = kvpy_pcache_of(st, cache, "cache");
    if (!pc) return -1;
    const kvpy_pcache_object *pco = (kvpy_pcache_object *)cache;
    kvhal_host_tier_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.cache = pc;
    kvhal_prefix_kind k = KVHAL_PREFIX_RADIX;
    if (kind) {
        const char *ks = PyUnicode_Check(kind) ? PyUnicode_AsUTF8(kind) : NULL;
        if (ks && !strcmp(ks, "naive")) k = KVHAL_PREFIX_NAIVE;
        else if (!ks || strcmp(ks, "radix")) {
            PyErr_Clear();
            kvpy_bad_arg(st, "kind: expected 'radix' or 'naive'");
            return -1;
        }
    }
    cfg.policy = KVHAL_WRITE_THROUGH;
    if (policy) {
        const char *ps = PyUnicode_Check(policy) ? PyUnicode_AsUTF8(policy) : NULL;
        if (ps && !strcmp(ps, "write_back")) cfg.policy = KVHAL_WRITE_BACK;
        else if (!ps || strcmp(ps, "write_through")) {
            PyErr_Clear();
            kvpy_bad_arg(st, "policy: expected 'write_through' or 'write_back'");
            return -1;
        }
    }
    if (host_pages >= 0 && host_budget >= 0) {
        kvpy_bad_arg(st, "host_pages: give host_pages or host_budget (bytes), not both");
        return -1;
    }
    const size_t hpb = kvhal_paged_cache_host_page_bytes(pc);
    if (host_pages > 0 && (unsigned long long)host_pages > UINT64_MAX / hpb) {
        kvpy_bad_arg(st, "host_pages: %lld is out of range", host_pages);
        return -1;
    }
    cfg.host_budget = host_pages >= 0 ? (uint64_t)host_pages * hpb : host_budget >= 0 ? (uint64_t)host_budget : 0;
    if (events < 0 || events > UINT32_MAX) {
        kvpy_bad_arg(st, "event_capacity: %lld is out of range", events);
        return -1;
    }
    cfg.event_capacity = (uint32_t)events;
    if (stream != Py_None) {
        if (!PyObject_TypeCheck(stream, st->stream_type)) {
            kvpy_bad_arg(st, "stream: expected a kvhal.Stream or None, got %s", Py_TYPE(stream)->tp_name);
            return -1;
        }
        cfg.stream = ((kvpy_stream_object *)stream)->s;
    }
    const long long nblocks = kvhal_paged_cache_num_blocks(pc);
    if (total < 0) total = nblocks;
    if (total > INT32_MAX) {
        kvpy_bad_arg(st, "total_pages: %lld is out of range", total);
        return -1;
    }
    if (self->base.cm) (void)kvhal_cache_manager_destroy(self->base.cm);
    self->base.cm = NULL;
    kvhal_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_cache_manager_create_tiered((int32_t)total, pco->cfg.block_size, k, &cfg, &self->base.cm);
    Py_END_ALLOW_THREADS
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    self->base.page_size = pco->cfg.block_size;
    Py_XSETREF(self->cache, Py_NewRef(cache));
    Py_XSETREF(self->stream, stream != Py_None ? Py_NewRef(stream) : NULL);
    self->policy = cfg.policy;
    self->event_capacity = cfg.event_capacity;
    self->host_budget = cfg.host_budget;
    return 0;
}

static void tiered_dealloc(PyObject *op)
{
    tiered_object *self = (tiered_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->base.cm) (void)kvhal_cache_manager_destroy(self->base.cm); /* before the cache it borrows */
    Py_CLEAR(self->cache);
    Py_CLEAR(self->stream);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static kvhal_cache_manager *live(PyObject *op)
{
    tiered_object *self = (tiered_object *)op;
    if (!self->base.cm) kvpy_bad_arg(kvpy_state_of(op), "self: the TieredCacheManager was not initialised");
    return self->base.cm;
}

/* match_tiered(tokens) -> (handle, device_len, host_len, pages) */
static PyObject *tiered_match(PyObject *op, PyObject *tokens)
{
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    const size_t ps = (size_t)((tiered_object *)op)->base.page_size;
    kvpy_ids tk;
    if (kvpy_ids_get(st, tokens, "tokens", &tk) != 0) return NULL;
    PyObject *ret = NULL;
    const size_t cap = tk.n / ps;
    kvpy_pages_object *pa = (kvpy_pages_object *)kvpy_pages_new(st, NULL, cap);
    if (pa) {
        kvhal_prefix_handle h = 0;
        size_t dl = 0, hl = 0;
        kvhal_status rc = kvhal_cache_manager_match_tiered(cm, tk.v, tk.n, &h, &dl, &hl, pa->v, cap);
        if (rc != KVHAL_OK) {
            Py_DECREF(pa);
            kvpy_raise(st, rc);
        } else {
            Py_SET_SIZE(pa, (Py_ssize_t)(dl / ps));
            PyObject *ho = kvpy_handle_new(st, h, op);
            if (ho) ret = Py_BuildValue("(NnnN)", ho, (Py_ssize_t)dl, (Py_ssize_t)hl, (PyObject *)pa);
            else Py_DECREF(pa);
        }
    }
    kvpy_ids_release(st, &tk);
    return ret;
}

/* load_back(handle, tokens) -> Pages */
static PyObject *tiered_load_back(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"handle", "tokens"};
    PyObject *a[2];
    if (kvpy_parse_fast("load_back", args, nargs, kwnames, names, 2, 2, a) != 0) return NULL;
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_prefix_handle h;
    if (kvpy_handle_get(st, a[0], op, NULL, &h) != 0) return NULL;
    const size_t ps = (size_t)((tiered_object *)op)->base.page_size;
    kvpy_ids tk;
    if (kvpy_ids_get(st, a[1], "tokens", &tk) != 0) return NULL;
    PyObject *ret = NULL;
    const size_t cap = tk.n / ps;
    kvpy_pages_object *pa = (kvpy_pages_object *)kvpy_pages_new(st, NULL, cap);
    if (pa) {
        size_t loaded = 0;
        kvhal_status rc;
        Py_BEGIN_ALLOW_THREADS
        rc = kvhal_cache_manager_load_back(cm, h, tk.v, tk.n, pa->v, cap, &loaded);
        Py_END_ALLOW_THREADS
        if (rc != KVHAL_OK) {
            Py_DECREF(pa);
            kvpy_raise(st, rc);
        } else {
            Py_SET_SIZE(pa, (Py_ssize_t)(loaded / ps));
            ret = (PyObject *)pa;
        }
    }
    kvpy_ids_release(st, &tk);
    return ret;
}

static PyObject *tiered_transfer_wait(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvhal_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_cache_manager_transfer_wait(cm);
    Py_END_ALLOW_THREADS
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *tiered_transfer_query(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvhal_status rc = kvhal_cache_manager_transfer_query(cm);
    if (rc == KVHAL_OK) Py_RETURN_TRUE;
    if (rc == KVHAL_BUSY) {
        kvhal_clear_error();
        Py_RETURN_FALSE;
    }
    return kvpy_raise(kvpy_state_of(op), rc);
}

static PyObject *tiered_stats(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvhal_host_tier_stats s;
    kvhal_status rc = kvhal_cache_manager_tier_stats(cm, &s);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    return Py_BuildValue("{s:L,s:L,s:K,s:K,s:K,s:K}", "host_pages_total", (long long)s.host_pages_total,
                         "host_pages_used", (long long)s.host_pages_used, "pages_written",
                         (unsigned long long)s.pages_written, "pages_loaded", (unsigned long long)s.pages_loaded,
                         "host_evictions", (unsigned long long)s.host_evictions, "events_dropped",
                         (unsigned long long)s.events_dropped);
}

static PyObject *tiered_host_clear(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvhal_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_cache_manager_host_tier_clear(cm);
    Py_END_ALLOW_THREADS
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *tiered_events(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"max"};
    PyObject *a[1];
    if (kvpy_parse_fast("events", args, nargs, kwnames, names, 1, 0, a) != 0) return NULL;
    kvhal_cache_manager *cm = live(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    Py_ssize_t max = -1;
    if (a[0] && a[0] != Py_None) {
        max = PyNumber_AsSsize_t(a[0], PyExc_OverflowError);
        if (max == -1 && PyErr_Occurred()) return NULL;
        if (max < 0) return kvpy_bad_arg(st, "max: %zd is negative", max);
    }
    return kvpy_events_drain(st, cm, ((tiered_object *)op)->base.page_size, max);
}

static PyObject *tiered_get(PyObject *op, void *which)
{
    tiered_object *self = (tiered_object *)op;
    if (!live(op)) return NULL;
    switch ((intptr_t)which) {
    case 0: return Py_NewRef(self->cache);
    case 1: return PyUnicode_FromString(self->policy == KVHAL_WRITE_BACK ? "write_back" : "write_through");
    case 2: return PyLong_FromUnsignedLongLong(self->host_budget);
    default: return PyLong_FromUnsignedLong(self->event_capacity);
    }
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef tiered_methods[] = {
    {"match_tiered", tiered_match, METH_O,
     "match_tiered($self, tokens)\n--\n\nmatch + lock, and how far the host tier continues the match: (handle, device_len, "
     "host_len, pages). pages: the device pages of device_len tokens; host_len: whole pages past them that "
     "load_back brings back."},
    {"load_back", FAST(tiered_load_back),
     "load_back($self, handle, tokens)\n--\n\nLoads the host pages past the request's device match into device pages it then "
     "holds (they follow its matched pages) and returns them (kvhal.Pages; len * page_size tokens). The copies are "
     "complete after transfer_wait() (or once transfer_query() is True); read the pages only then."},
    {"transfer_wait", tiered_transfer_wait, METH_NOARGS,
     "transfer_wait($self)\n--\n\nEnqueues queued write-backs and waits for every copy (the GIL is released)."},
    {"transfer_query", tiered_transfer_query, METH_NOARGS,
     "transfer_query($self)\n--\n\nEnqueues queued write-backs and polls: True when every copy is done, else False."},
    {"stats", tiered_stats, METH_NOARGS,
     "stats($self)\n--\n\n{host_pages_total, host_pages_used, pages_written, pages_loaded, host_evictions, "
     "events_dropped}."},
    {"host_tier_clear", tiered_host_clear, METH_NOARGS,
     "host_tier_clear($self)\n--\n\nDrops every host page (after the copies in flight); a 'cleared' event for the host."},
    {"events", FAST(tiered_events),
     "events($self, max=None)\n--\n\nDrains the KV events (oldest first, at most max): a list of kvhal.KVEvent. Needs "
     "event_capacity > 0."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef tiered_getset[] = {
    {"cache", tiered_get, NULL, "the PagedCache whose blocks the pages are", (void *)0},
    {"policy", tiered_get, NULL, "'write_through' or 'write_back'", (void *)1},
    {"host_budget", tiered_get, NULL, "bytes of host pages", (void *)2},
    {"event_capacity", tiered_get, NULL, "KV events kept until read (0: none)", (void *)3},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot tiered_slots[] = {
    {Py_tp_doc, "TieredCacheManager(cache, total_pages=None, kind='radix', host_pages=None, host_budget=None, "
                "policy='write_through', stream=None, event_capacity=0)\n--\n\nA CacheManager over a PagedCache's "
                "blocks (total_pages: all of them by default; page size = block size) with a host tier of "
                "host_pages pages (or host_budget bytes; 0: none, events only). policy: 'write_through' (a "
                "finished request's new pages are copied) or 'write_back' (pages are copied when evicted). stream: "
                "a kvhal.Stream for the copies (None: the manager's own). event_capacity > 0 keeps KV events for "
                "events(). The device writes of pages must be complete before the manager copies them (see "
                "kvhal_cache_manager_create_tiered)."},
    {Py_tp_dealloc, KVPY_FN(tiered_dealloc)},
    {Py_tp_init, KVPY_FN(tiered_init)},
    {Py_tp_methods, tiered_methods},
    {Py_tp_getset, tiered_getset},
    {0, NULL}};

static PyType_Spec tiered_spec = {
    .name = "kvhal.TieredCacheManager",
    .basicsize = sizeof(tiered_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = tiered_slots,
};

int kvpy_tiers_add(PyObject *m, kvpy_state *st)
{
    /* CacheManager stays final for Python classes (its methods find the module state through the instance's type,
     * which a Python subclass would not have): the flag that lets this one C subclass be made is set for its
     * creation only */
    st->manager_type->tp_flags |= Py_TPFLAGS_BASETYPE;
    const int rc = kvpy_bind_type_add(m, st, KVPY_T_TIERED, &tiered_spec, (PyObject *)st->manager_type);
    st->manager_type->tp_flags &= ~Py_TPFLAGS_BASETYPE;
    return rc;
}

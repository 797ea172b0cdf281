/* prefix.c — kvhal.PrefixCache, kvhal.PrefixHandle, kvhal.CacheManager.
 *
 * The prefix handle is kept as an opaque value inside a PrefixHandle object (kvpy_handle_t below), so a change of
 * the C type (pointer today, a generation-checked 64-bit value later) is a one-line edit here. */
#include "prefix.h"

#include <string.h>

typedef kvhal_prefix_handle kvpy_handle_t; /* the one place that names the prefix handle's C type */

typedef struct {
    PyObject_HEAD
    kvhal_prefix_cache *pc;
    PyObject *owner; /* the CacheManager whose prefix cache this is (not destroyed here), or NULL */
} prefix_object;

typedef struct {
    PyObject_HEAD
    kvpy_handle_t h;
    PyObject *cache; /* the PrefixCache or CacheManager it came from (a handle is only valid there) */
} handle_object;

typedef kvpy_manager_object manager_object;

/* ---- kvhal.PrefixHandle ----
 * Not tracked by the garbage collector: a handle refers only to its PrefixCache or CacheManager, and neither refers
 * back to handles, so no cycle runs through one (one is made per match: tracking it would cost every match). */
static void handle_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    Py_CLEAR(((handle_object *)op)->cache);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static PyType_Slot handle_slots[] = {
    {Py_tp_doc, "The deepest node a match reached, to lock, unlock and finish a request with; valid with the cache "
                "that made it."},
    {Py_tp_dealloc, KVPY_FN(handle_dealloc)},
    {0, NULL}};

PyType_Spec kvpy_handle_spec = {
    .name = "kvhal.PrefixHandle",
    .basicsize = sizeof(handle_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = handle_slots,
};

PyObject *kvpy_handle_new(kvpy_state *st, kvpy_handle_t h, PyObject *cache)
{
    handle_object *o = PyObject_New(handle_object, st->handle_type);
    if (!o) return NULL;
    o->h = h;
    o->cache = Py_NewRef(cache);
    return (PyObject *)o;
}

/* The handle argument: a PrefixHandle of this cache (or of alt), or None (nothing matched). */
int kvpy_handle_get(kvpy_state *st, PyObject *o, PyObject *cache, PyObject *alt, kvpy_handle_t *out)
{
    if (o == Py_None) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    if (!PyObject_TypeCheck(o, st->handle_type)) {
        kvpy_bad_arg(st, "handle: expected a kvhal.PrefixHandle, got %s", Py_TYPE(o)->tp_name);
        return -1;
    }
    handle_object *h = (handle_object *)o;
    if (h->cache != cache && h->cache != alt) {
        /* a handle is valid only in the cache that gave it: C says KVHAL_INVALID_HANDLE for another cache's */
        kvpy_raise_msg(st, KVHAL_INVALID_HANDLE, "handle: the handle comes from another cache");
        return -1;
    }
    *out = h->h;
    return 0;
}

static int parse_kind(kvpy_state *st, PyObject *o, kvhal_prefix_kind *out)
{
    const char *k = o ? PyUnicode_AsUTF8(o) : "radix";
    if (!k) {
        PyErr_Clear();
        kvpy_bad_arg(st, "kind: expected 'radix' or 'naive'");
        return -1;
    }
    if (!strcmp(k, "radix")) *out = KVHAL_PREFIX_RADIX;
    else if (!strcmp(k, "naive")) *out = KVHAL_PREFIX_NAIVE;
    else {
        kvpy_bad_arg(st, "kind: '%s' is not 'radix' or 'naive'", k);
        return -1;
    }
    return 0;
}

/* (handle, cached, pages) of a match, pages stolen (NULL: its making failed); NULL with an exception set when it
 * cannot be made, pages then released: a manager's caller gives back what the C call took for the request. */
static PyObject *match_result(kvpy_state *st, PyObject *cache, kvpy_handle_t h, size_t cached, PyObject *pages)
{
    PyObject *ho = pages ? kvpy_handle_new(st, h, cache) : NULL;
    PyObject *no = ho ? PyLong_FromSize_t(cached) : NULL;
    PyObject *ret = no ? PyTuple_New(3) : NULL;
    if (!ret) {
        Py_XDECREF(ho);
        Py_XDECREF(pages);
        Py_XDECREF(no);
        return NULL;
    }
    PyTuple_SET_ITEM(ret, 0, ho);
    PyTuple_SET_ITEM(ret, 1, no);
    PyTuple_SET_ITEM(ret, 2, pages);
    return ret;
}

/* match for a prefix cache or a manager: (handle, cached_len, pages) */
static PyObject *match_common(PyObject *self, kvhal_prefix_cache *pc, kvhal_cache_manager *cm, int32_t page_size,
                              PyObject *tokens)
{
    kvpy_state *st = kvpy_state_of(self);
    kvpy_ints tk;
    if (kvpy_ints_get(st, tokens, "tokens", 4, &tk) != 0) return NULL;
    const size_t cap = tk.n / (size_t)(page_size > 0 ? page_size : 1);
    PyObject *ret = NULL;
    /* the match writes its page ids straight into the Pages it returns (sized for the longest match) */
    kvpy_pages_object *pa = (kvpy_pages_object *)kvpy_pages_new(st, NULL, cap);
    if (!pa) goto out;
    kvpy_handle_t h;
    size_t cached = 0;
    kvhal_status rc = cm ? kvhal_cache_manager_match(cm, tk.data, tk.n, &h, &cached, pa->v, cap)
                         : kvhal_prefix_match(pc, tk.data, tk.n, &h, &cached, pa->v, cap);
    if (rc != KVHAL_OK) {
        Py_DECREF(pa);
        kvpy_raise(st, rc);
        goto out;
    }
    const size_t np = cached / (size_t)page_size;
    PyObject *pages;
    if (cap > 64 && np < cap / 2) { /* a short match of a long request: a right-sized copy */
        pages = kvpy_pages_new(st, pa->v, np);
        Py_DECREF(pa);
    } else {
        Py_SET_SIZE(pa, (Py_ssize_t)np);
        pages = (PyObject *)pa;
    }
    ret = match_result(st, self, h, cached, pages);
    if (!ret && cm) (void)kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h); /* the request's own lock */
out:
    kvpy_ints_release(&tk);
    return ret;
}

/* A run of pages collected from a C callback as a Pages (rc: the call's status); frees the run. */
static PyObject *page_run_result(kvpy_state *st, kvpy_page_run *b, kvhal_status rc)
{
    PyObject *ret = NULL;
    if (b->failed) PyErr_NoMemory();
    else if (rc != KVHAL_OK) kvpy_raise(st, rc);
    else ret = kvpy_pages_new(st, b->v, b->n);
    PyMem_Free(b->v);
    return ret;
}

/* ---- kvhal.PrefixCache ---- */
static int prefix_traverse(PyObject *op, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(((prefix_object *)op)->owner);
    return 0;
}

/* Drops the cache: destroyed when it is this object's own, let go when it is a manager's. */
static int prefix_clear(PyObject *op)
{
    prefix_object *self = (prefix_object *)op;
    if (self->pc && !self->owner) (void)kvhal_prefix_cache_destroy(self->pc);
    self->pc = NULL;
    Py_CLEAR(self->owner);
    return 0;
}

static int prefix_init(PyObject *op, PyObject *args, PyObject *kw)
{
    prefix_object *self = (prefix_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"kind", "page_size", NULL};
    PyObject *kind = NULL;
    int page_size = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Oi", names, &kind, &page_size)) return -1;
    kvhal_prefix_kind k;
    if (parse_kind(st, kind, &k) != 0) return -1;
    (void)prefix_clear(op);
    kvhal_status rc = kvhal_prefix_cache_create(k, page_size, &self->pc);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    return 0;
}

static void prefix_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    (void)prefix_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* The object's cache, or NULL with kvhal.InvalidArgument set (never initialised). */
static kvhal_prefix_cache *live_prefix(PyObject *op)
{
    prefix_object *self = (prefix_object *)op;
    if (!self->pc) kvpy_bad_arg(kvpy_state_of(op), "self: the PrefixCache was not initialised");
    return self->pc;
}

static PyObject *prefix_match(PyObject *op, PyObject *tokens)
{
    kvhal_prefix_cache *pc = live_prefix(op);
    if (!pc) return NULL;
    return match_common(op, pc, NULL, kvhal_prefix_cache_page_size(pc), tokens);
}

static PyObject *prefix_lock_common(PyObject *op, PyObject *h, int lock)
{
    kvhal_prefix_cache *pc = live_prefix(op);
    if (!pc) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_handle_t v;
    if (kvpy_handle_get(st, h, op, ((prefix_object *)op)->owner, &v) != 0) return NULL;
    kvhal_status rc = lock ? kvhal_prefix_lock(pc, v) : kvhal_prefix_unlock(pc, v);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

static PyObject *prefix_lock(PyObject *op, PyObject *h) { return prefix_lock_common(op, h, 1); }
static PyObject *prefix_unlock(PyObject *op, PyObject *h) { return prefix_lock_common(op, h, 0); }

/* The cache of a PrefixCache that is not a manager's (insert, evict and reset go through the manager), or NULL
 * with kvhal.InvalidArgument set. */
static kvhal_prefix_cache *own_prefix(PyObject *op, const char *what)
{
    kvhal_prefix_cache *pc = live_prefix(op);
    if (pc && ((prefix_object *)op)->owner) {
        kvpy_bad_arg(kvpy_state_of(op), "self: %s", what);
        return NULL;
    }
    return pc;
}

static PyObject *prefix_insert(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "pages"};
    PyObject *a[2];
    if (kvpy_parse_fast("insert", args, nargs, kwnames, names, 2, 2, a) != 0) return NULL;
    kvhal_prefix_cache *pc = own_prefix(op, "insert into a CacheManager's prefix cache goes through the manager");
    if (!pc) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_ints tk, pg;
    if (kvpy_ints_get(st, a[0], "tokens", 4, &tk) != 0) return NULL;
    if (kvpy_ints_get(st, a[1], "pages", 4, &pg) != 0) {
        kvpy_ints_release(&tk);
        return NULL;
    }
    PyObject *ret = NULL;
    const size_t ps = (size_t)kvhal_prefix_cache_page_size(pc);
    if (pg.n < tk.n / ps) {
        kvpy_bad_arg(st, "pages: %zu pages for %zu tokens (page size %zu) needs %zu", pg.n, tk.n, ps, tk.n / ps);
    } else {
        size_t already = 0;
        kvhal_status rc = kvhal_prefix_insert(pc, tk.data, tk.n, pg.data, &already);
        if (rc != KVHAL_OK) kvpy_raise(st, rc);
        else ret = PyLong_FromSize_t(already);
    }
    kvpy_ints_release(&tk);
    kvpy_ints_release(&pg);
    return ret;
}

/* A num_tokens argument: >= 0. 0, or -1 with an exception set. */
static int num_tokens(kvpy_state *st, PyObject *arg, size_t *out)
{
    const Py_ssize_t want = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (want == -1 && PyErr_Occurred()) return -1;
    if (want < 0) {
        kvpy_bad_arg(st, "num_tokens: %zd is negative", want);
        return -1;
    }
    *out = (size_t)want;
    return 0;
}

static PyObject *prefix_evict(PyObject *op, PyObject *arg)
{
    kvhal_prefix_cache *pc = own_prefix(op, "eviction from a CacheManager's prefix cache goes through the manager");
    if (!pc) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    size_t want, evicted = 0;
    if (num_tokens(st, arg, &want) != 0) return NULL;
    kvpy_page_run b = {0};
    kvhal_status rc = kvhal_prefix_evict(pc, want, kvpy_page_run_collect, &b, &evicted);
    return page_run_result(st, &b, rc);
}

static PyObject *prefix_reset(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_prefix_cache *pc = own_prefix(op, "reset a CacheManager's prefix cache through the manager");
    if (!pc) return NULL;
    kvpy_page_run b = {0};
    kvhal_status rc = kvhal_prefix_reset(pc, kvpy_page_run_collect, &b);
    return page_run_result(kvpy_state_of(op), &b, rc);
}

static PyObject *prefix_size_info(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_prefix_cache *pc = live_prefix(op);
    if (!pc) return NULL;
    kvhal_prefix_size_info s;
    kvhal_status rc = kvhal_prefix_size_info_get(pc, &s);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "evictable_tokens", (Py_ssize_t)s.evictable_tokens,
                         "protected_tokens", (Py_ssize_t)s.protected_tokens, "total_tokens",
                         (Py_ssize_t)s.total_tokens, "num_nodes", (Py_ssize_t)s.num_nodes);
}

static PyObject *prefix_check_integrity(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_prefix_cache *pc = live_prefix(op);
    if (!pc) return NULL;
    kvhal_status rc = kvhal_prefix_check_integrity(pc);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *prefix_get_page_size(PyObject *op, void *c)
{
    (void)c;
    kvhal_prefix_cache *pc = live_prefix(op);
    if (!pc) return NULL;
    return PyLong_FromLong(kvhal_prefix_cache_page_size(pc));
}

static PyMethodDef prefix_methods[] = {
    {"match", prefix_match, METH_O,
     "match($self, tokens)\n--\n\nLongest cached prefix, in whole pages: (handle, cached_len, pages: kvhal.Pages))."},
    {"lock", prefix_lock, METH_O, "lock($self, handle)\n--\n\nProtects the handle's path from eviction."},
    {"unlock", prefix_unlock, METH_O, "unlock($self, handle)\n--\n\nUndoes one lock."},
    {"insert", (PyCFunction)(void (*)(void))prefix_insert, METH_FASTCALL | METH_KEYWORDS,
     "insert($self, tokens, pages)\n--\n\nInserts tokens (aligned down to pages) with their pages; returns the "
     "length that was cached before."},
    {"evict", prefix_evict, METH_O,
     "evict($self, num_tokens)\n--\n\nEvicts unlocked leaves (LRU) until num_tokens are freed; returns the freed "
     "pages."},
    {"reset", prefix_reset, METH_NOARGS, "reset($self)\n--\n\nDrops everything; returns the freed pages."},
    {"size_info", prefix_size_info, METH_NOARGS,
     "size_info($self)\n--\n\n{evictable_tokens, protected_tokens, total_tokens, num_nodes}."},
    {"check_integrity", prefix_check_integrity, METH_NOARGS,
     "check_integrity($self)\n--\n\nRaises kvhal.Integrity if the tree is inconsistent."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef prefix_getset[] = {{"page_size", prefix_get_page_size, NULL, "tokens per page", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot prefix_slots[] = {
    {Py_tp_doc, "PrefixCache(kind='radix', page_size=1)\n--\n\nA prefix cache of token ids to page indices: 'radix' "
                "(a radix tree) or 'naive' (never matches)."},
    {Py_tp_dealloc, KVPY_FN(prefix_dealloc)},
    {Py_tp_traverse, KVPY_FN(prefix_traverse)},
    {Py_tp_clear, KVPY_FN(prefix_clear)},
    {Py_tp_init, KVPY_FN(prefix_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, prefix_methods},
    {Py_tp_getset, prefix_getset},
    {0, NULL}};

PyType_Spec kvpy_prefix_spec = {
    .name = "kvhal.PrefixCache",
    .basicsize = sizeof(prefix_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = prefix_slots,
};

/* ---- kvhal.CacheManager ---- */
static int manager_init(PyObject *op, PyObject *args, PyObject *kw)
{
    manager_object *self = (manager_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"total_pages", "page_size", "kind", NULL};
    int total = 0, page_size = 1;
    PyObject *kind = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|iO", names, &total, &page_size, &kind)) return -1;
    kvhal_prefix_kind k;
    if (parse_kind(st, kind, &k) != 0) return -1;
    if (self->views) {
        kvpy_bad_arg(st, "self: %d PagesView objects of this CacheManager are alive (they view its storage)",
                     self->views);
        return -1;
    }
    if (self->cm) (void)kvhal_cache_manager_destroy(self->cm);
    self->cm = NULL;
    kvhal_status rc = kvhal_cache_manager_create(total, page_size, k, &self->cm);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    self->page_size = page_size;
    return 0;
}

static void manager_dealloc(PyObject *op)
{
    manager_object *self = (manager_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->cm) (void)kvhal_cache_manager_destroy(self->cm);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* The object's manager, or NULL with kvhal.InvalidArgument set (never initialised). */
static kvhal_cache_manager *live_manager(PyObject *op)
{
    manager_object *self = (manager_object *)op;
    if (!self->cm) kvpy_bad_arg(kvpy_state_of(op), "self: the CacheManager was not initialised");
    return self->cm;
}

static PyObject *manager_match(PyObject *op, PyObject *tokens)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    return match_common(op, NULL, cm, ((manager_object *)op)->page_size, tokens);
}

/* allocate's and allocate_view's n: 0..INT32_MAX pages. 0, or -1 with an exception set. */
static int page_count_arg(kvpy_state *st, PyObject *arg, long *n)
{
    *n = PyLong_AsLong(arg);
    if (*n == -1 && PyErr_Occurred()) return -1;
    if (*n < 0 || *n > INT32_MAX) {
        kvpy_bad_arg(st, "n: %ld pages is out of range", *n);
        return -1;
    }
    return 0;
}

static PyObject *manager_allocate(PyObject *op, PyObject *arg)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    long n;
    if (page_count_arg(st, arg, &n) != 0) return NULL;
    kvpy_pages_object *p = (kvpy_pages_object *)kvpy_pages_new(st, NULL, (size_t)n);
    if (!p) return NULL;
    kvhal_status rc = kvhal_cache_manager_allocate(cm, (int32_t)n, p->v); /* straight into the result */
    if (rc == KVHAL_OK) return (PyObject *)p;
    Py_DECREF(p);
    return kvpy_raise(st, rc);
}

/* match_view(tokens): match + lock, the pages a kvhal.PagesView of the manager's own storage. */
static PyObject *manager_match_view(PyObject *op, PyObject *tokens)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_ints tk;
    if (kvpy_ints_get(st, tokens, "tokens", 4, &tk) != 0) return NULL;
    kvpy_handle_t h;
    size_t cached = 0, np = 0;
    const int32_t *v = NULL;
    kvhal_status rc = kvhal_cache_manager_match_view(cm, tk.data, tk.n, &h, &cached, &v, &np);
    kvpy_ints_release(&tk);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    PyObject *ret = match_result(st, op, h, cached, kvpy_pages_view_new(st, op, &((manager_object *)op)->views, v, np));
    if (!ret) (void)kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h); /* the request's own lock */
    return ret;
}

/* admit_view(tokens, extra_tokens=0): match + lock + the pages past the match, as one kvhal.PagesView (the matched
 * ids, then the new ones) of the manager's own storage. */
static PyObject *manager_admit_view(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "extra_tokens"};
    PyObject *a[2];
    if (kvpy_parse_fast("admit_view", args, nargs, kwnames, names, 2, 1, a) != 0) return NULL;
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    size_t extra = 0;
    if (a[1]) {
        const Py_ssize_t e = PyNumber_AsSsize_t(a[1], PyExc_OverflowError);
        if (e == -1 && PyErr_Occurred()) return NULL;
        if (e < 0) return kvpy_bad_arg(st, "extra_tokens: %zd is negative", e);
        extra = (size_t)e;
    }
    kvpy_ints tk;
    if (kvpy_ints_get(st, a[0], "tokens", 4, &tk) != 0) return NULL;
    kvpy_handle_t h;
    size_t cached = 0, np = 0;
    const int32_t *v = NULL;
    kvhal_status rc = kvhal_cache_manager_admit(cm, tk.data, tk.n, extra, &h, &cached, &v, &np);
    kvpy_ints_release(&tk);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    const size_t ps = (size_t)((manager_object *)op)->page_size;
    PyObject *pages = kvpy_pages_view_new(st, op, &((manager_object *)op)->views, v, np);
    if (pages) ((kvpy_pages_view_object *)pages)->matched = (Py_ssize_t)(cached / ps);
    PyObject *ret = match_result(st, op, h, cached, pages);
    if (!ret) { /* the request is admitted in C: its pages and lock go back */
        (void)kvhal_cache_manager_free(cm, v + cached / ps, (int32_t)(np - cached / ps));
        (void)kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), h);
    }
    return ret;
}

static PyObject *manager_allocate_view(PyObject *op, PyObject *arg)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    long n;
    if (page_count_arg(st, arg, &n) != 0) return NULL;
    const int32_t *v = NULL;
    kvhal_status rc = kvhal_cache_manager_allocate_view(cm, (int32_t)n, &v);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    return kvpy_pages_view_new(st, op, &((manager_object *)op)->views, v, (size_t)n);
}

static PyObject *manager_free(PyObject *op, PyObject *arg)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_ints pg;
    if (kvpy_ints_get(st, arg, "pages", 4, &pg) != 0) return NULL;
    kvhal_status rc = pg.n > INT32_MAX ? KVHAL_OUT_OF_RANGE : kvhal_cache_manager_free(cm, pg.data, (int32_t)pg.n);
    kvpy_ints_release(&pg);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

/* cache_finished (suffix 0: the whole request's tokens and pages) and cache_finished_suffix (suffix 1: only what
 * follows the match, tokens[start:]). */
static PyObject *finish_common(PyObject *op, PyObject *handle, PyObject *tokens, PyObject *pages, int suffix,
                               PyObject *start_arg)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    const size_t page_size = (size_t)((manager_object *)op)->page_size;
    kvpy_handle_t h;
    if (kvpy_handle_get(st, handle, op, NULL, &h) != 0) return NULL;
    Py_ssize_t start = 0;
    if (start_arg) {
        start = PyNumber_AsSsize_t(start_arg, PyExc_OverflowError);
        if (start == -1 && PyErr_Occurred()) return NULL;
    }
    kvpy_ints tk, pg;
    if (kvpy_ints_get(st, tokens, "tokens", 4, &tk) != 0) return NULL;
    if (start < 0 || (size_t)start > tk.n) {
        kvpy_bad_arg(st, "start: %zd is outside the %zu tokens", start, tk.n);
        kvpy_ints_release(&tk);
        return NULL;
    }
    tk.data = (const int32_t *)tk.data + start; /* tokens[start:] without a slice object */
    tk.n -= (size_t)start;
    if (kvpy_ints_get(st, pages, "pages", 4, &pg) != 0) {
        kvpy_ints_release(&tk);
        return NULL;
    }
    /* admit_view's row (the matched pages, then the request's own) to a suffix finish: the pages past the match */
    const Py_ssize_t skip =
        suffix && Py_IS_TYPE(pages, st->pages_view_type) ? ((kvpy_pages_view_object *)pages)->matched : 0;
    PyObject *ret = NULL;
    const size_t need = (tk.n + page_size - 1) / page_size;
    if (skip && (size_t)start != (size_t)skip * page_size) {
        kvpy_bad_arg(st, "start: %zd, but pages is admit_view's row, whose first %zd pages hold the %zu matched tokens "
                     "(pass start=%zu)", start, skip, (size_t)skip * page_size, (size_t)skip * page_size);
        goto out;
    }
    pg.data = (const int32_t *)pg.data + skip;
    pg.n -= (size_t)skip;
    if (pg.n < need) {
        kvpy_bad_arg(st, "pages: %zu pages for %zu tokens needs %zu", pg.n, tk.n, need);
    } else {
        kvhal_status rc = suffix ? kvhal_cache_manager_cache_finished_suffix(cm, h, tk.data, tk.n, pg.data)
                                 : kvhal_cache_manager_cache_finished(cm, tk.data, tk.n, pg.data, h);
        if (rc != KVHAL_OK) kvpy_raise(st, rc);
        else ret = Py_NewRef(Py_None);
    }
out:
    kvpy_ints_release(&tk);
    kvpy_ints_release(&pg);
    return ret;
}

static PyObject *manager_finished(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "pages", "handle"};
    PyObject *a[3];
    if (kvpy_parse_fast("cache_finished", args, nargs, kwnames, names, 3, 3, a) != 0) return NULL;
    return finish_common(op, a[2], a[0], a[1], 0, NULL);
}

static PyObject *manager_finished_suffix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"handle", "tokens", "pages", "start"};
    PyObject *a[4];
    if (kvpy_parse_fast("cache_finished_suffix", args, nargs, kwnames, names, 4, 3, a) != 0) return NULL;
    return finish_common(op, a[0], a[1], a[2], 1, a[3]);
}

static PyObject *manager_lock_common(PyObject *op, PyObject *h, int lock)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_handle_t v;
    if (kvpy_handle_get(st, h, op, NULL, &v) != 0) return NULL;
    kvhal_prefix_cache *pc = kvhal_cache_manager_prefix(cm);
    kvhal_status rc = lock ? kvhal_prefix_lock(pc, v) : kvhal_prefix_unlock(pc, v);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

static PyObject *manager_lock(PyObject *op, PyObject *h) { return manager_lock_common(op, h, 1); }
static PyObject *manager_unlock(PyObject *op, PyObject *h) { return manager_lock_common(op, h, 0); }

static PyObject *manager_evict(PyObject *op, PyObject *arg)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    size_t want, evicted = 0;
    if (num_tokens(st, arg, &want) != 0) return NULL;
    kvhal_status rc = kvhal_cache_manager_evict(cm, want, &evicted);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    return PyLong_FromSize_t(evicted);
}

static PyObject *manager_check_integrity(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    kvhal_status rc = kvhal_cache_manager_check_integrity(cm);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *manager_get_int(PyObject *op, void *which)
{
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    switch ((intptr_t)which) {
    case 0: return PyLong_FromLong(kvhal_cache_manager_available(cm));
    case 1: return PyLong_FromLong(kvhal_cache_manager_num_free(cm));
    case 2: return PyLong_FromUnsignedLongLong(kvhal_cache_manager_pages_evicted(cm));
    default: return PyLong_FromLong(((manager_object *)op)->page_size);
    }
}

static PyObject *manager_get_prefix(PyObject *op, void *c)
{
    (void)c;
    kvhal_cache_manager *cm = live_manager(op);
    if (!cm) return NULL;
    PyTypeObject *tp = kvpy_state_of(op)->prefix_type;
    prefix_object *p = (prefix_object *)tp->tp_alloc(tp, 0); /* zeroed and tracked */
    if (!p) return NULL;
    p->pc = kvhal_cache_manager_prefix(cm);
    p->owner = Py_NewRef(op);
    return (PyObject *)p;
}

static PyMethodDef manager_methods[] = {
    {"match", manager_match, METH_O,
     "match($self, tokens)\n--\n\nmatch + lock: (handle, cached_len, pages: kvhal.Pages). Pass the handle to "
     "cache_finished (or unlock it after freeing the request's own pages)."},
    {"lock", manager_lock, METH_O, "lock($self, handle)\n--\n\nOne more lock on the handle's path."},
    {"unlock", manager_unlock, METH_O, "unlock($self, handle)\n--\n\nUndoes one lock."},
    {"allocate", manager_allocate, METH_O,
     "allocate($self, n)\n--\n\nn pages (evicting when free pages run short), all or nothing: kvhal.Pages."},
    {"match_view", manager_match_view, METH_O,
     "match_view($self, tokens)\n--\n\nmatch, the pages a kvhal.PagesView of the manager's own storage (no copy; "
     "valid until the next match_view, which may reuse it for other ids): (handle, cached_len, pages)."},
    {"allocate_view", manager_allocate_view, METH_O,
     "allocate_view($self, n)\n--\n\nallocate, the pages a kvhal.PagesView of the manager's own storage (no copy; "
     "valid until the next allocate_view)."},
    {"admit_view", (PyCFunction)(void (*)(void))manager_admit_view, METH_FASTCALL | METH_KEYWORDS,
     "admit_view($self, tokens, extra_tokens=0)\n--\n\nAdmits a request in one call: match + lock, then the pages "
     "for the uncached rest of tokens plus extra_tokens, all or nothing (kvhal.OutOfMemory, nothing kept, when they "
     "cannot be had): (handle, cached_len, pages), pages ONE kvhal.PagesView of the manager's own storage holding "
     "the matched page ids then the new ones (the request's page-table row; valid until the next admit_view). "
     "Finish with cache_finished_suffix(handle, tokens, pages, start=cached_len)."},
    {"free", manager_free, METH_O, "free($self, pages)\n--\n\nGives pages back."},
    {"cache_finished", (PyCFunction)(void (*)(void))manager_finished, METH_FASTCALL | METH_KEYWORDS,
     "cache_finished($self, tokens, pages, handle)\n--\n\nA request finished: inserts its page-aligned tokens, frees "
     "duplicate and partial pages, unlocks handle."},
    {"cache_finished_suffix", (PyCFunction)(void (*)(void))manager_finished_suffix, METH_FASTCALL | METH_KEYWORDS,
     "cache_finished_suffix($self, handle, tokens, pages, start=0)\n--\n\nThe same given only the tokens and pages "
     "past the match: tokens[start:] (start: the matched length, to pass the whole request's tokens without "
     "slicing them) and their pages (admit_view's row as it came: start must then be its cached_len, and the pages "
     "past the match are taken)."},
    {"evict", manager_evict, METH_O,
     "evict($self, num_tokens)\n--\n\nEvicts unlocked cached prefixes into the free pages; returns the tokens freed."},
    {"check_integrity", manager_check_integrity, METH_NOARGS,
     "check_integrity($self)\n--\n\nfree + evictable + protected + held == total, else kvhal.Integrity."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef manager_getset[] = {
    {"available", manager_get_int, NULL, "free + evictable pages", (void *)0},
    {"num_free", manager_get_int, NULL, "free pages", (void *)1},
    {"pages_evicted", manager_get_int, NULL, "pages evicted so far", (void *)2},
    {"page_size", manager_get_int, NULL, "tokens per page", (void *)3},
    {"prefix", manager_get_prefix, NULL,
     "the manager's PrefixCache (queries, lock and unlock; insert and evict go through the manager)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot manager_slots[] = {
    {Py_tp_doc, "CacheManager(total_pages, page_size=1, kind='radix')\n--\n\nFree pages plus a prefix cache: match, "
                "allocate, free, cache_finished, evict."},
    {Py_tp_dealloc, KVPY_FN(manager_dealloc)},
    {Py_tp_init, KVPY_FN(manager_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, manager_methods},
    {Py_tp_getset, manager_getset},
    {0, NULL}};

PyType_Spec kvpy_manager_spec = {
    .name = "kvhal.CacheManager",
    .basicsize = sizeof(manager_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = manager_slots,
};

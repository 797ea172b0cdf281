/* pcache.c — kvhal.PagedCache: a paged cache of every layer on one device (kvhal_paged_cache), its layer views as
 * kvhal.Tensor (zero-copy, DLPack-exportable, each keeping the cache alive), update, copy_blocks and the host-page
 * size a host tier or a transfer agent works with. */
#include <string.h>

#include "bind.h"
#include "stream.h"

kvhal_paged_cache *kvpy_pcache_of(kvpy_state *st, PyObject *o, const char *arg)
{
    if (!o || !PyObject_TypeCheck(o, st->bind_type[KVPY_T_PCACHE])) {
        kvpy_bad_arg(st, "%s: expected a kvhal.PagedCache, got %s", arg, o ? Py_TYPE(o)->tp_name : "nothing");
        return NULL;
    }
    kvpy_pcache_object *p = (kvpy_pcache_object *)o;
    if (!p->c) kvpy_bad_arg(st, "%s: the PagedCache was not initialised", arg);
    return p->c;
}

static int parse_choice(kvpy_state *st, PyObject *o, const char *arg, const char *const *names, int n, int *out)
{
    if (!o || o == Py_None) return 0;
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    PyErr_Clear();
    kvpy_bad_arg(st, "%s: expected '%s' or '%s'", arg, names[0], names[1]);
    return -1;
}

static int pcache_init(PyObject *op, PyObject *args, PyObject *kw)
{
    kvpy_pcache_object *self = (kvpy_pcache_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"num_layers", "num_heads", "head_dim", "block_size", "num_blocks", "dtype", "device",
                            "layout", "order", "memory_budget", "k_scale", "v_scale", "shareable", NULL};
    int layers, heads, dim, bs;
    long long nblocks = -1, budget = -1;
    PyObject *dt = NULL, *dev = NULL, *layout = NULL, *order = NULL;
    float ks = 0.0f, vs = 0.0f;
    int shareable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiii|LOOOOLffp", names, &layers, &heads, &dim, &bs, &nblocks, &dt,
                                     &dev, &layout, &order, &budget, &ks, &vs, &shareable))
        return -1;
    kvhal_paged_cache_config cfg;
    kvhal_paged_cache_config_init(&cfg);
    static const char *const layouts[] = {"nhd", "hnd"}, *const orders[] = {"layer_first", "page_first"};
    int lo = 0, od = 0;
    if (kvpy_parse_dtype(st, dt, &cfg.dtype) != 0 || kvpy_parse_device(st, dev, "device", &cfg.device) != 0 ||
        parse_choice(st, layout, "layout", layouts, 2, &lo) != 0 || parse_choice(st, order, "order", orders, 2, &od))
        return -1;
    if ((nblocks < 0) == (budget < 0)) {
        kvpy_bad_arg(st, "num_blocks: give num_blocks or memory_budget (bytes), one of them");
        return -1;
    }
    cfg.num_layers = layers;
    cfg.num_heads = heads;
    cfg.head_dim = dim;
    cfg.block_size = bs;
    cfg.layout = (kvhal_paged_layout)lo;
    cfg.order = (kvhal_paged_order)od;
    cfg.k_scale = ks;
    cfg.v_scale = vs;
    if (nblocks >= 0) {
        /* a block of every layer's K and V; the library checks the fields and overflow of the product */
        const double bytes = (double)nblocks * 2.0 * (layers > 0 ? layers : 1) * (heads > 0 ? heads : 1) *
                             (dim > 0 ? dim : 1) * (bs > 0 ? bs : 1) * (double)kvhal_dtype_size(cfg.dtype);
        if (nblocks == 0 || bytes > 1.8e19) {
            kvpy_bad_arg(st, "num_blocks: %lld is out of range", nblocks);
            return -1;
        }
        cfg.memory_budget = (uint64_t)nblocks * 2u * (uint64_t)(layers > 0 ? layers : 1) *
                            (uint64_t)(heads > 0 ? heads : 1) * (uint64_t)(dim > 0 ? dim : 1) *
                            (uint64_t)(bs > 0 ? bs : 1) * kvhal_dtype_size(cfg.dtype);
    } else {
        cfg.memory_budget = (uint64_t)budget;
    }
    if (self->c) (void)kvhal_paged_cache_destroy(self->c);
    self->c = NULL;
    kvhal_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = shareable ? kvhal_paged_cache_create_shareable(&cfg, &self->c) : kvhal_paged_cache_create(&cfg, &self->c);
    Py_END_ALLOW_THREADS
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    self->cfg = cfg;
    self->shareable = shareable;
    return 0;
}

static void pcache_dealloc(PyObject *op)
{
    kvpy_pcache_object *self = (kvpy_pcache_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->c) (void)kvhal_paged_cache_destroy(self->c);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static kvhal_paged_cache *live(PyObject *op) { return kvpy_pcache_of(kvpy_state_of(op), op, "self"); }

/* A layer view's keeper: the tensor's "taken" DLPack tensor, whose deleter lets go of the cache object. */
static void keeper_delete(DLManagedTensor *m)
{
    Py_XDECREF((PyObject *)m->manager_ctx);
    PyMem_Free(m);
}

static PyObject *view_of(PyObject *op, const kvhal_tensor *t)
{
    kvpy_state *st = kvpy_state_of(op);
    DLManagedTensor *keep = PyMem_Calloc(1, sizeof *keep);
    if (!keep) return PyErr_NoMemory();
    kvpy_tensor_object *o = PyObject_New(kvpy_tensor_object, st->tensor_type);
    if (!o) {
        PyMem_Free(keep);
        return NULL;
    }
    keep->manager_ctx = Py_NewRef(op);
    keep->deleter = keeper_delete;
    o->t = *t;
    o->buf = NULL; /* the cache's memory: not the view's to free */
    o->taken.managed = keep;
    o->taken.versioned = 0;
    o->readonly = 0;
    return (PyObject *)o;
}

static PyObject *pcache_layer(PyObject *op, PyObject *arg)
{
    kvhal_paged_cache *c = live(op);
    if (!c) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    const long layer = PyLong_AsLong(arg);
    if (layer == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "layer: expected an int, got %s", Py_TYPE(arg)->tp_name);
    }
    if (layer < 0 || layer >= ((kvpy_pcache_object *)op)->cfg.num_layers)
        return kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "layer: %ld is outside 0..%d", layer,
                              ((kvpy_pcache_object *)op)->cfg.num_layers - 1);
    kvhal_tensor k, v;
    kvhal_status rc = kvhal_paged_cache_layer(c, (int32_t)layer, &k, &v);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    PyObject *ko = view_of(op, &k), *vo = ko ? view_of(op, &v) : NULL;
    if (!vo) {
        Py_XDECREF(ko);
        return NULL;
    }
    return Py_BuildValue("(NN)", ko, vo);
}

static PyObject *pcache_update(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"layer", "k", "v", "slot_mapping", "stream"};
    PyObject *a[5];
    if (kvpy_parse_fast("update", args, nargs, kwnames, names, 5, 4, a) != 0) return NULL;
    kvhal_paged_cache *c = live(op);
    if (!c) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_new_call(st);
    const long layer = PyLong_AsLong(a[0]);
    if (layer == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "layer: expected an int");
    }
    if (layer < INT32_MIN || layer > INT32_MAX) return kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "layer: %ld", layer);
    const kvhal_device dev = ((kvpy_pcache_object *)op)->cfg.device;
    kvhal_stream *s;
    intptr_t native;
    if (kvpy_stream_int(st, a[4], &native) != 0 || kvpy_stream_for(st, a[4], native, dev, &s) != 0) return NULL;
    kvpy_import t[3];
    int n = 0;
    PyObject *ret = NULL;
    for (; n < 3; n++)
        if (kvpy_import_any(st, a[n + 1], names[n + 1], 0, kvpy_dlpack_stream_number(a[4], native), 0, &t[n]) != 0)
            goto out;
    kvhal_status rc = kvhal_paged_cache_update(c, (int32_t)layer, &t[0].t, &t[1].t, &t[2].t, s);
    ret = rc == KVHAL_OK ? Py_NewRef(Py_None) : kvpy_raise(st, rc);
out:
    while (n-- > 0) kvpy_import_release(st, &t[n]);
    return ret;
}

static PyObject *pcache_copy_blocks(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"pairs", "stream"};
    PyObject *a[2];
    if (kvpy_parse_fast("copy_blocks", args, nargs, kwnames, names, 2, 1, a) != 0) return NULL;
    kvhal_paged_cache *c = live(op);
    if (!c) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_stream *s;
    if (kvpy_stream_arg(st, a[1], ((kvpy_pcache_object *)op)->cfg.device, &s) != 0) return NULL;
    kvpy_ints pr;
    if (kvpy_ints_get(st, a[0], "pairs", 8, &pr) != 0) return NULL;
    PyObject *ret = NULL;
    if (pr.n % 2 || pr.n / 2 > INT32_MAX) {
        kvpy_bad_arg(st, "pairs: %zu values is not a whole number of (src, dst) pairs", pr.n);
    } else {
        kvhal_status rc = kvhal_paged_cache_copy_blocks(c, pr.data, (int32_t)(pr.n / 2), s);
        ret = rc == KVHAL_OK ? Py_NewRef(Py_None) : kvpy_raise(st, rc);
    }
    kvpy_ints_release(&pr);
    return ret;
}

static PyObject *pcache_get(PyObject *op, void *which)
{
    kvhal_paged_cache *c = live(op);
    if (!c) return NULL;
    const kvpy_pcache_object *self = (kvpy_pcache_object *)op;
    static const char *const layouts[] = {"nhd", "hnd"}, *const orders[] = {"layer_first", "page_first"};
    switch ((intptr_t)which) {
    case 0: return PyLong_FromLongLong(kvhal_paged_cache_num_blocks(c));
    case 1: return PyLong_FromLong(self->cfg.num_layers);
    case 2: return PyLong_FromLong(self->cfg.num_heads);
    case 3: return PyLong_FromLong(self->cfg.head_dim);
    case 4: return PyLong_FromLong(self->cfg.block_size);
    case 5: return PyUnicode_FromString(kvpy_dtype(self->cfg.dtype)->name);
    case 6: return kvpy_device_str(kvpy_state_of(op), self->cfg.device);
    case 7: return PyLong_FromSize_t(kvhal_paged_cache_host_page_bytes(c));
    case 8: return PyBool_FromLong(self->shareable);
    case 9: return PyUnicode_FromString(layouts[self->cfg.layout == KVHAL_LAYOUT_HND]);
    default: return PyUnicode_FromString(orders[self->cfg.order == KVHAL_PAGE_FIRST]);
    }
}

static PyMethodDef pcache_methods[] = {
    {"layer", pcache_layer, METH_O,
     "layer($self, i)\n--\n\n(k, v): views of layer i, [blocks, block_size, heads, dim] in logical order (the layout in the "
     "strides), as kvhal.Tensor (zero-copy; DLPack-exportable; each keeps the cache alive)."},
    {"update", (PyCFunction)(void (*)(void))pcache_update, METH_FASTCALL | METH_KEYWORDS,
     "update($self, layer, k, v, slot_mapping, stream=None)\n--\n\npaged_caching into one layer with the cache's fp8 "
     "scales."},
    {"copy_blocks", (PyCFunction)(void (*)(void))pcache_copy_blocks, METH_FASTCALL | METH_KEYWORDS,
     "copy_blocks($self, pairs, stream=None)\n--\n\nCopies blocks src -> dst in every layer's K and V; pairs: a flat or "
     "(n, 2) integer array."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef pcache_getset[] = {
    {"num_blocks", pcache_get, NULL, "blocks (pages) the cache holds", (void *)0},
    {"num_layers", pcache_get, NULL, "layers", (void *)1},
    {"num_heads", pcache_get, NULL, "KV heads", (void *)2},
    {"head_dim", pcache_get, NULL, "head dimension", (void *)3},
    {"block_size", pcache_get, NULL, "tokens per block", (void *)4},
    {"dtype", pcache_get, NULL, "the cache's dtype name", (void *)5},
    {"device", pcache_get, NULL, "the device name", (void *)6},
    {"host_page_bytes", pcache_get, NULL, "bytes of one page of every layer's K and V on the host", (void *)7},
    {"shareable", pcache_get, NULL, "whether its memory can be imported by another process", (void *)8},
    {"layout", pcache_get, NULL, "'nhd' or 'hnd'", (void *)9},
    {"order", pcache_get, NULL, "'layer_first' or 'page_first'", (void *)10},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot pcache_slots[] = {
    {Py_tp_doc, "PagedCache(num_layers, num_heads, head_dim, block_size, num_blocks=None, dtype='f32', device='cpu:0', "
                "layout='nhd', order='layer_first', memory_budget=None, k_scale=1.0, v_scale=1.0, shareable=False)\n"
                "--\n\nA paged KV cache of every layer on one device (num_blocks blocks, or as many as memory_budget "
                "bytes hold). shareable: memory another process of the host can import (the transfer agent's "
                "device-to-device path)."},
    {Py_tp_dealloc, KVPY_FN(pcache_dealloc)},
    {Py_tp_init, KVPY_FN(pcache_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, pcache_methods},
    {Py_tp_getset, pcache_getset},
    {0, NULL}};

static PyType_Spec pcache_spec = {
    .name = "kvhal.PagedCache",
    .basicsize = sizeof(kvpy_pcache_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = pcache_slots,
};

int kvpy_pcache_add(PyObject *m, kvpy_state *st) { return kvpy_bind_type_add(m, st, KVPY_T_PCACHE, &pcache_spec, NULL); }

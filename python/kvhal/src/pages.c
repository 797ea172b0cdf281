/* pages.c — kvhal.Pages and integer arrays on the host.
 *
 * kvhal.Pages: one allocation with the ids inline (no array.array constructor call, no intermediate bytes); the
 * buffer protocol (format 'i', read-only) gives NumPy, memoryview and array.array('i', ...) its ids without
 * Python-level iteration, and kvhal calls take it back with zero copies. */
#include "pages.h"

#include <limits.h>
#include <string.h>

PyObject *kvpy_pages_new(kvpy_state *st, const int32_t *v, size_t n)
{
    kvpy_pages_object *p = PyObject_NewVar(kvpy_pages_object, st->pages_type, (Py_ssize_t)n);
    if (!p) return NULL;
    if (n && v) memcpy(p->v, v, n * sizeof(int32_t));
    return (PyObject *)p;
}

static void pages_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static Py_ssize_t pages_len(PyObject *op) { return Py_SIZE(op); }

static PyObject *pages_item(PyObject *op, Py_ssize_t i)
{
    if (i < 0 || i >= Py_SIZE(op)) {
        PyErr_SetString(PyExc_IndexError, "Pages index out of range");
        return NULL;
    }
    return PyLong_FromLong(((kvpy_pages_object *)op)->v[i]);
}

static PyObject *pages_subscript(PyObject *op, PyObject *key)
{
    kvpy_pages_object *self = (kvpy_pages_object *)op;
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) return NULL;
        if (i < 0) i += Py_SIZE(op);
        return pages_item(op, i);
    }
    if (!PySlice_Check(key)) {
        PyErr_Format(PyExc_TypeError, "Pages indices must be integers or slices, not %s", Py_TYPE(key)->tp_name);
        return NULL;
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0) return NULL;
    const Py_ssize_t n = PySlice_AdjustIndices(Py_SIZE(op), &start, &stop, step);
    kvpy_state *st = kvpy_state_of(op);
    if (step == 1) return kvpy_pages_new(st, self->v + start, (size_t)n);
    kvpy_pages_object *p = (kvpy_pages_object *)kvpy_pages_new(st, NULL, (size_t)n);
    if (!p) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) p->v[i] = self->v[start + i * step];
    return (PyObject *)p;
}

static int pages_getbuffer(PyObject *op, Py_buffer *view, int flags)
{
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "kvhal.Pages is read-only");
        view->obj = NULL;
        return -1;
    }
    kvpy_state *st = kvpy_state_of(op);
    view->obj = Py_NewRef(op);
    view->buf = ((kvpy_pages_object *)op)->v;
    view->len = Py_SIZE(op) * (Py_ssize_t)sizeof(int32_t);
    view->readonly = 1;
    view->itemsize = sizeof(int32_t);
    view->format = (flags & PyBUF_FORMAT) ? st->pages_format : NULL;
    view->ndim = 1;
    view->shape = (flags & PyBUF_ND) ? &((PyVarObject *)op)->ob_size : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &st->pages_itemsize : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyObject *pages_tolist(PyObject *op, PyObject *unused)
{
    (void)unused;
    const kvpy_pages_object *self = (kvpy_pages_object *)op;
    PyObject *l = PyList_New(Py_SIZE(op));
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < Py_SIZE(op); i++) {
        PyObject *x = PyLong_FromLong(self->v[i]);
        if (!x) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

/* == and != with another Pages, a list, a tuple or array.array: the same ids in the same order. */
static PyObject *pages_richcompare(PyObject *op, PyObject *other, int cmp)
{
    if (cmp != Py_EQ && cmp != Py_NE) Py_RETURN_NOTIMPLEMENTED;
    const kvpy_pages_object *self = (kvpy_pages_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    int eq;
    if (PyObject_TypeCheck(other, st->pages_type)) {
        eq = Py_SIZE(other) == Py_SIZE(op) &&
             !memcmp(self->v, ((kvpy_pages_object *)other)->v, (size_t)Py_SIZE(op) * sizeof(int32_t));
    } else if (PyList_Check(other) || PyTuple_Check(other) ||
               PyObject_TypeCheck(other, (PyTypeObject *)st->array_type)) {
        const Py_ssize_t n = PySequence_Size(other);
        if (n < 0) return NULL;
        eq = n == Py_SIZE(op);
        for (Py_ssize_t i = 0; eq && i < n; i++) {
            PyObject *x = PySequence_GetItem(other, i);
            if (!x) return NULL;
            const long long val = PyLong_Check(x) ? PyLong_AsLongLong(x) : LLONG_MIN;
            Py_DECREF(x);
            if (val == -1 && PyErr_Occurred()) PyErr_Clear();
            eq = val == self->v[i];
        }
    } else {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if ((cmp == Py_EQ) == (eq != 0)) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *pages_repr(PyObject *op)
{
    PyObject *l = pages_tolist(op, NULL);
    if (!l) return NULL;
    PyObject *r = PyUnicode_FromFormat("kvhal.Pages(%R)", l);
    Py_DECREF(l);
    return r;
}

static PyObject *pages_reduce(PyObject *op, PyObject *unused)
{
    (void)unused; /* pickles as the array.array('i') of its ids */
    PyObject *l = pages_tolist(op, NULL);
    if (!l) return NULL;
    return Py_BuildValue("(O(sN))", kvpy_state_of(op)->array_type, "i", l);
}

static PyMethodDef pages_methods[] = {
    {"tolist", pages_tolist, METH_NOARGS, "tolist($self)\n--\n\nThe page ids as a list of ints."},
    {"__reduce__", pages_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyType_Slot pages_slots[] = {
    {Py_tp_doc, "Page ids (int32), immutable: len(), indexing, slicing (a new Pages), iteration, tolist(), == with a "
                "Pages, list, tuple or array.array, and the buffer protocol (format 'i', read-only: "
                "numpy.asarray(pages), memoryview, array.array('i', pages)). kvhal calls take it back with zero "
                "copies."},
    {Py_tp_dealloc, KVPY_FN(pages_dealloc)},
    {Py_tp_repr, KVPY_FN(pages_repr)},
    {Py_sq_length, KVPY_FN(pages_len)},
    {Py_sq_item, KVPY_FN(pages_item)},
    {Py_mp_length, KVPY_FN(pages_len)},
    {Py_mp_subscript, KVPY_FN(pages_subscript)},
    {Py_bf_getbuffer, KVPY_FN(pages_getbuffer)},
    {Py_tp_hash, KVPY_FN(PyObject_HashNotImplemented)},
    {Py_tp_richcompare, KVPY_FN(pages_richcompare)},
    {Py_tp_methods, pages_methods},
    {0, NULL}};

PyType_Spec kvpy_pages_spec = {
    .name = "kvhal.Pages",
    .basicsize = offsetof(kvpy_pages_object, v),
    .itemsize = sizeof(int32_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = pages_slots,
};

/* ---- kvhal.PagesView ---- */
PyObject *kvpy_pages_view_new(kvpy_state *st, PyObject *owner, int *alive, const int32_t *v, size_t n)
{
    kvpy_pages_view_object *p = PyObject_New(kvpy_pages_view_object, st->pages_view_type);
    if (!p) return NULL;
    p->owner = Py_NewRef(owner);
    p->alive = alive;
    (*alive)++;
    p->v = v;
    p->n = (Py_ssize_t)n;
    p->matched = 0;
    return (PyObject *)p;
}

static void view_dealloc(PyObject *op)
{
    kvpy_pages_view_object *self = (kvpy_pages_view_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    (*self->alive)--;
    Py_DECREF(self->owner);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static Py_ssize_t view_len(PyObject *op) { return ((kvpy_pages_view_object *)op)->n; }

static PyObject *view_item(PyObject *op, Py_ssize_t i)
{
    const kvpy_pages_view_object *self = (kvpy_pages_view_object *)op;
    if (i < 0) i += self->n;
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "PagesView index out of range");
        return NULL;
    }
    return PyLong_FromLong(self->v[i]);
}

static int view_getbuffer(PyObject *op, Py_buffer *view, int flags)
{
    kvpy_pages_view_object *self = (kvpy_pages_view_object *)op;
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "kvhal.PagesView is read-only");
        view->obj = NULL;
        return -1;
    }
    kvpy_state *st = kvpy_state_of(op);
    view->obj = Py_NewRef(op);
    view->buf = (void *)self->v;
    view->len = self->n * (Py_ssize_t)sizeof(int32_t);
    view->readonly = 1;
    view->itemsize = sizeof(int32_t);
    view->format = (flags & PyBUF_FORMAT) ? st->pages_format : NULL;
    view->ndim = 1;
    view->shape = (flags & PyBUF_ND) ? &self->n : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &st->pages_itemsize : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyObject *view_tolist(PyObject *op, PyObject *unused)
{
    (void)unused;
    const kvpy_pages_view_object *self = (kvpy_pages_view_object *)op;
    PyObject *l = PyList_New(self->n);
    for (Py_ssize_t i = 0; l && i < self->n; i++) {
        PyObject *x = PyLong_FromLong(self->v[i]);
        if (!x) Py_CLEAR(l);
        else PyList_SET_ITEM(l, i, x);
    }
    return l;
}

static PyMethodDef view_methods[] = {
    {"tolist", view_tolist, METH_NOARGS, "tolist($self)\n--\n\nThe page ids as a list of ints (a copy)."},
    {NULL, NULL, 0, NULL}};

static PyType_Slot view_slots[] = {
    {Py_tp_doc, "Page ids (int32) in a CacheManager's own storage, as match_view and allocate_view hand them out: "
                "no copy. Read-only: len(), indexing, iteration, tolist(), the buffer protocol (format 'i'); kvhal "
                "calls take it without copies. It is valid until the manager's next call of the same kind, which "
                "may reuse the storage for other ids (never freed memory): use it (or copy it: tolist(), "
                "array.array('i', view)) before that call."},
    {Py_tp_dealloc, KVPY_FN(view_dealloc)},
    {Py_sq_length, KVPY_FN(view_len)},
    {Py_sq_item, KVPY_FN(view_item)},
    {Py_bf_getbuffer, KVPY_FN(view_getbuffer)},
    {Py_tp_hash, KVPY_FN(PyObject_HashNotImplemented)},
    {Py_tp_methods, view_methods},
    {0, NULL}};

PyType_Spec kvpy_pages_view_spec = {
    .name = "kvhal.PagesView",
    .basicsize = sizeof(kvpy_pages_view_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = view_slots,
};

/* ---- integer arrays on the host ---- */
/* The fields that say what a kvpy_ints holds (the buffer and import structs are only read when their flag is
 * set: clearing them too would write a few hundred bytes per argument of every call). */
static inline void ints_clear(kvpy_ints *a)
{
    a->has_view = 0;
    a->has_imp = 0;
    a->st = NULL;
    a->tmp = NULL;
    a->data = NULL;
    a->n = 0;
}

void kvpy_ints_release(kvpy_ints *a)
{
    if (a->has_view) PyBuffer_Release(&a->view);
    if (a->has_imp) kvpy_import_release(a->st, &a->imp);
    PyMem_Free(a->tmp);
    ints_clear(a);
}

static int fmt_is_int(const char *f, size_t itemsize)
{
    if (!f) return 0;
    if (*f == '<' || *f == '=' || *f == '@' || *f == '!') f++;
    if (f[0] == '\0' || f[1] != '\0') return 0;
    switch (f[0]) {
    case 'i': return itemsize == sizeof(int);
    case 'l': return itemsize == sizeof(long);
    case 'q': return itemsize == 8;
    case 'h': return itemsize == 2;
    case 'b': return itemsize == 1;
    default: return 0;
    }
}

/* One value into a->tmp at i, range-checked for int32. */
static int put_int(kvpy_state *st, kvpy_ints *a, const char *arg, int width, size_t i, long long v)
{
    if (width == 4) {
        if (v < INT32_MIN || v > INT32_MAX) {
            kvpy_bad_arg(st, "%s[%zu]: %lld does not fit in int32", arg, i, v);
            return -1;
        }
        ((int32_t *)a->tmp)[i] = (int32_t)v;
    } else {
        ((int64_t *)a->tmp)[i] = (int64_t)v;
    }
    return 0;
}

/* a->n integers of isz bytes (1, 2, 4 or 8), stride bytes apart from base, into a->tmp at width bytes each (each
 * checked by put_int); a->data then points at a->tmp. */
static int ints_copy(kvpy_state *st, kvpy_ints *a, const char *arg, int width, const char *base, ptrdiff_t stride,
                     int isz)
{
    a->tmp = PyMem_Malloc(a->n ? a->n * (size_t)width : 1);
    if (!a->tmp) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < a->n; i++) {
        const char *p = base + (ptrdiff_t)i * stride;
        int64_t v;
        switch (isz) {
        case 1: v = *(const int8_t *)p; break;
        case 2: v = *(const int16_t *)p; break;
        case 4: v = *(const int32_t *)p; break;
        default: v = *(const int64_t *)p; break;
        }
        if (put_int(st, a, arg, width, i, (long long)v) != 0) return -1;
    }
    a->data = a->tmp;
    return 0;
}

/* The buffer a->view (integers, C-contiguous), as items of width bytes. */
static int ints_from_buffer(kvpy_state *st, const char *arg, int width, kvpy_ints *a)
{
    if (!fmt_is_int(a->view.format, (size_t)a->view.itemsize)) {
        kvpy_bad_arg(st, "%s: expected integers, got buffer format '%s'", arg, a->view.format ? a->view.format : "?");
        return -1;
    }
    a->n = (size_t)(a->view.len / a->view.itemsize);
    if (a->view.itemsize == width) {
        a->data = a->view.buf;
        return 0;
    }
    return ints_copy(st, a, arg, width, (const char *)a->view.buf, (ptrdiff_t)a->view.itemsize,
                     (int)a->view.itemsize);
}

/* A DLPack array (a torch tensor has no buffer protocol): 1-D, int32 or int64, on the host; any stride. */
static int ints_from_dlpack(kvpy_state *st, PyObject *o, const char *arg, int width, kvpy_ints *a)
{
    if (kvpy_import_any(st, o, arg, 0, 0, 0, &a->imp) != 0) return -1;
    a->has_imp = 1;
    a->st = st;
    const kvhal_tensor *t = &a->imp.t;
    if (kvhal_buffer_device(t->buffer).type != KVHAL_DEVICE_CPU) {
        kvpy_bad_arg(st, "%s: a host (cpu) array is needed, not one on a device", arg);
        return -1;
    }
    if (t->ndim != 1 || (t->dtype != KVHAL_I32 && t->dtype != KVHAL_I64)) {
        kvpy_bad_arg(st, "%s: expected a 1-D int32 or int64 array, got %d dims of %s", arg, (int)t->ndim,
                     kvpy_dtype(t->dtype)->name);
        return -1;
    }
    const int isz = t->dtype == KVHAL_I32 ? 4 : 8;
    const char *base = (const char *)kvhal_buffer_native(t->buffer) + t->offset;
    a->n = (size_t)t->shape[0];
    if (isz == width && (t->strides[0] == 1 || a->n <= 1)) {
        a->data = base;
        return 0;
    }
    return ints_copy(st, a, arg, width, base, (ptrdiff_t)t->strides[0] * isz, isz);
}

/* Any sequence of ints. */
static int ints_from_sequence(kvpy_state *st, PyObject *o, const char *arg, int width, kvpy_ints *a)
{
    PyObject *seq = PySequence_Fast(o, "");
    if (!seq) {
        PyErr_Clear();
        kvpy_bad_arg(st, "%s: expected an integer array or a sequence of ints, got %s", arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    a->n = (size_t)PySequence_Fast_GET_SIZE(seq);
    a->tmp = PyMem_Malloc(a->n ? a->n * (size_t)width : 1);
    int rc = a->tmp ? 0 : -1;
    if (!a->tmp) PyErr_NoMemory();
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (size_t i = 0; rc == 0 && i < a->n; i++) {
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            kvpy_bad_arg(st, "%s[%zu]: expected an int, got %s", arg, i, Py_TYPE(items[i])->tp_name);
            rc = -1;
        } else {
            rc = put_int(st, a, arg, width, i, v);
        }
    }
    Py_DECREF(seq);
    a->data = a->tmp;
    return rc;
}

int kvpy_ints_get(kvpy_state *st, PyObject *o, const char *arg, int width, kvpy_ints *a)
{
    ints_clear(a);
    if (width == 4 && Py_IS_TYPE(o, st->pages_type)) { /* ours: no buffer request */
        a->data = ((kvpy_pages_object *)o)->v;
        a->n = (size_t)Py_SIZE(o);
        return 0;
    }
    if (width == 4 && Py_IS_TYPE(o, st->pages_view_type)) {
        a->data = ((kvpy_pages_view_object *)o)->v;
        a->n = (size_t)((kvpy_pages_view_object *)o)->n;
        return 0;
    }
    int rc;
    if (PyObject_CheckBuffer(o) && !PyBytes_Check(o)) {
        if (PyObject_GetBuffer(o, &a->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
            a->has_view = 1;
            rc = ints_from_buffer(st, arg, width, a);
            if (rc != 0) kvpy_ints_release(a);
            return rc;
        }
        PyErr_Clear();
    }
    if (!PyList_Check(o) && !PyTuple_Check(o) &&
        (kvpy_xapi_of(st, Py_TYPE(o)) || PyObject_HasAttr((PyObject *)Py_TYPE(o), st->s_dlpack))) {
        rc = ints_from_dlpack(st, o, arg, width, a);
        if (rc != 0) kvpy_ints_release(a);
        return rc;
    }
    rc = ints_from_sequence(st, o, arg, width, a);
    if (rc != 0) kvpy_ints_release(a);
    return rc;
}

/* ---- page runs ---- */
void kvpy_page_run_collect(const int32_t *pages, size_t n, void *user)
{
    kvpy_page_run *b = user;
    if (b->failed) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n) cap *= 2;
        int32_t *nv = PyMem_Realloc(b->v, cap * sizeof(int32_t));
        if (!nv) {
            b->failed = 1;
            return;
        }
        b->v = nv;
        b->cap = cap;
    }
    memcpy(b->v + b->n, pages, n * sizeof(int32_t));
    b->n += n;
}

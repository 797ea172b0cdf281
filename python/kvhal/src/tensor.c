/* tensor.c — kvhal.Tensor: properties, __dlpack__, host copies; kvhal.empty and kvhal.from_dlpack. */
#include "tensor.h"

#include <stdio.h>

static void tensor_dealloc(PyObject *op)
{
    kvpy_tensor_object *self = (kvpy_tensor_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->buf) (void)kvhal_buffer_destroy(self->buf);
    kvpy_taken_release(&self->taken);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* __dlpack__'s dl_device: the tensor's own device or nothing (no copies). 0, or -1 with an exception set. */
static int check_dl_device(PyObject *dl_device, kvhal_device dev)
{
    if (dl_device == Py_None) return 0;
    long ty = -1, id = -1;
    if (PyTuple_Check(dl_device) && PyTuple_GET_SIZE(dl_device) == 2) {
        ty = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 0));
        id = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 1));
    }
    if (PyErr_Occurred()) return -1;
    if (ty != kvpy_dl_device_type(dev) || id != dev.id) {
        PyErr_SetString(PyExc_BufferError, "kvhal.Tensor.__dlpack__: dl_device differs from the tensor's device "
                                           "and copies are not supported");
        return -1;
    }
    return 0;
}

/* The producer's work is ordered before the consumer's: kvhal has no events, so a GPU export waits for the device
 * unless the consumer asked for no synchronisation (-1). 0, or -1 with an exception set. */
static int order_before_consumer(kvpy_state *st, PyObject *stream, kvhal_device dev)
{
    if (kvpy_is_gpu(dev) && stream != Py_None) {
        long long sv = PyLong_AsLongLong(stream);
        if (sv == -1 && PyErr_Occurred()) return -1;
        if (sv == -1) return 0;
    } else if (!kvpy_is_gpu(dev) && dev.type != KVHAL_DEVICE_OPENCL) {
        return 0;
    }
    kvhal_status rc = kvhal_device_synchronize(dev);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    return 0;
}

static PyObject *tensor_dlpack(PyObject *op, PyObject *args, PyObject *kw)
{
    kvpy_tensor_object *self = (kvpy_tensor_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *maxv = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", names, &stream, &maxv, &dl_device, &copy)) return NULL;
    const kvhal_device dev = kvhal_buffer_device(self->t.buffer);
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "kvhal.Tensor.__dlpack__: copy=True is not supported (zero-copy only)");
        return NULL;
    }
    if (check_dl_device(dl_device, dev) != 0) return NULL;
    int versioned = 0;
    if (maxv != Py_None) {
        if (!PyTuple_Check(maxv) || PyTuple_GET_SIZE(maxv) < 1)
            return kvpy_bad_arg(st, "max_version: expected (major, minor)");
        long major = PyLong_AsLong(PyTuple_GET_ITEM(maxv, 0));
        if (major == -1 && PyErr_Occurred()) return NULL;
        versioned = major >= KVHAL_PY_DLPACK_MAJOR;
    }
    if (order_before_consumer(st, stream, dev) != 0) return NULL;
    return kvpy_export(op, &self->t, versioned, self->readonly);
}

static PyObject *tensor_dlpack_device(PyObject *op, PyObject *unused)
{
    (void)unused;
    const kvhal_device dev = kvhal_buffer_device(((kvpy_tensor_object *)op)->t.buffer);
    return Py_BuildValue("(ii)", kvpy_dl_device_type(dev), (int)dev.id);
}

/* copy_from / copy_to: the whole contiguous tensor from or to a contiguous host array of the same byte size. */
static PyObject *tensor_host_copy(PyObject *op, PyObject *host, int to_host)
{
    kvpy_tensor_object *self = (kvpy_tensor_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    kvpy_new_call(st);
    const char *arg = to_host ? "dst" : "src";
    if (!kvhal_tensor_is_contiguous(&self->t))
        return kvpy_bad_arg(st, "self: copy_%s needs a contiguous tensor", to_host ? "to" : "from");
    kvpy_import h;
    if (kvpy_import_any(st, host, arg, to_host, 0, KVPY_IMPORT_RAW, &h) != 0) return NULL;
    PyObject *ret = NULL;
    const size_t n = (size_t)kvhal_tensor_numel(&self->t) * kvhal_dtype_size(self->t.dtype);
    const kvhal_device hd = kvhal_buffer_device(h.t.buffer);
    if (hd.type != KVHAL_DEVICE_CPU) {
        kvpy_bad_arg(st, "%s: must be a host array", arg);
    } else if (!kvhal_tensor_is_contiguous(&h.t) ||
               (size_t)kvhal_tensor_numel(&h.t) * kvhal_dtype_size(h.t.dtype) != n) {
        kvpy_bad_arg(st, "%s: must be contiguous and hold %zu bytes", arg, n);
    } else {
        char *hp = (char *)kvhal_buffer_native(h.t.buffer) + h.t.offset;
        kvhal_status rc = to_host ? kvhal_memcpy_d2h(hp, self->t.buffer, self->t.offset, n, NULL)
                                  : kvhal_memcpy_h2d(self->t.buffer, self->t.offset, hp, n, NULL);
        if (rc != KVHAL_OK) kvpy_raise(st, rc);
        else ret = Py_NewRef(Py_None);
    }
    kvpy_import_release(st, &h);
    return ret;
}

static PyObject *tensor_copy_from(PyObject *op, PyObject *src) { return tensor_host_copy(op, src, 0); }
static PyObject *tensor_copy_to(PyObject *op, PyObject *dst) { return tensor_host_copy(op, dst, 1); }

static PyObject *int64_tuple(const int64_t *v, int n)
{
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

static PyObject *tensor_get_shape(PyObject *op, void *c)
{
    (void)c;
    const kvpy_tensor_object *self = (kvpy_tensor_object *)op;
    return int64_tuple(self->t.shape, self->t.ndim);
}

static PyObject *tensor_get_strides(PyObject *op, void *c)
{
    (void)c;
    const kvpy_tensor_object *self = (kvpy_tensor_object *)op;
    return int64_tuple(self->t.strides, self->t.ndim);
}

static PyObject *tensor_get_dtype(PyObject *op, void *c)
{
    (void)c;
    return PyUnicode_FromString(kvpy_dtype(((kvpy_tensor_object *)op)->t.dtype)->name);
}

static PyObject *tensor_get_device(PyObject *op, void *c)
{
    (void)c;
    return kvpy_device_str(kvpy_state_of(op), kvhal_buffer_device(((kvpy_tensor_object *)op)->t.buffer));
}

static PyObject *tensor_get_offset(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromSize_t(((kvpy_tensor_object *)op)->t.offset);
}

static PyObject *tensor_repr(PyObject *op)
{
    const kvpy_tensor_object *self = (kvpy_tensor_object *)op;
    char dev[64];
    (void)kvhal_device_format(kvhal_buffer_device(self->t.buffer), dev, sizeof dev);
    char shp[160];
    size_t j = 0;
    shp[0] = '\0';
    for (int i = 0; i < self->t.ndim && j < sizeof shp - 24; i++)
        j += (size_t)snprintf(shp + j, sizeof shp - j, i ? ", %lld" : "%lld", (long long)self->t.shape[i]);
    return PyUnicode_FromFormat("kvhal.Tensor(shape=(%s), dtype=%s, device=%s)", shp, kvpy_dtype(self->t.dtype)->name,
                                dev);
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA DLPack capsule of this "
     "tensor (versioned when max_version >= (1, 0)); zero-copy."},
    {"__dlpack_device__", tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self)\n--\n\n(DLPack device type, device id)."},
    {"copy_from", tensor_copy_from, METH_O,
     "copy_from($self, src)\n--\n\nCopies a contiguous host array of the same byte size into this contiguous tensor."},
    {"copy_to", tensor_copy_to, METH_O,
     "copy_to($self, dst)\n--\n\nCopies this contiguous tensor into a contiguous writable host array of the same "
     "byte size."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef tensor_getset[] = {{"shape", tensor_get_shape, NULL, "shape", NULL},
                                      {"strides", tensor_get_strides, NULL, "strides in elements", NULL},
                                      {"dtype", tensor_get_dtype, NULL, "kvhal dtype name", NULL},
                                      {"device", tensor_get_device, NULL, "device name", NULL},
                                      {"offset", tensor_get_offset, NULL, "byte offset in its buffer", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot tensor_slots[] = {
    {Py_tp_doc, "A kvhal tensor: made by kvhal.empty (kvhal owns the memory) or kvhal.from_dlpack (a zero-copy view "
                "that keeps the producer's array alive). Exports __dlpack__."},
    {Py_tp_dealloc, KVPY_FN(tensor_dealloc)},
    {Py_tp_repr, KVPY_FN(tensor_repr)},
    {Py_tp_methods, tensor_methods},
    {Py_tp_getset, tensor_getset},
    {0, NULL}};

PyType_Spec kvpy_tensor_spec = {
    .name = "kvhal.Tensor",
    .basicsize = sizeof(kvpy_tensor_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = tensor_slots,
};

/* ---- module functions ---- */
/* The shape argument of empty: 1..KVHAL_MAX_DIMS sizes >= 0; *bytes: their product times the item size. */
static int parse_shape(kvpy_state *st, PyObject *o, size_t itemsize, int64_t *shape, Py_ssize_t *nd, size_t *bytes)
{
    PyObject *seq = PySequence_Fast(o, "shape: expected a sequence of sizes");
    if (!seq) return -1;
    *nd = PySequence_Fast_GET_SIZE(seq);
    int rc = 0;
    *bytes = itemsize;
    if (*nd < 1 || *nd > KVHAL_MAX_DIMS) {
        kvpy_bad_arg(st, "shape: %zd dimensions (kvhal takes 1 to %d)", *nd, KVHAL_MAX_DIMS);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < *nd; i++) {
        shape[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (shape[i] < 0) {
            if (!PyErr_Occurred()) kvpy_bad_arg(st, "shape[%zd]: %lld is negative", i, (long long)shape[i]);
            rc = -1;
        } else if (shape[i] && *bytes > SIZE_MAX / (size_t)shape[i]) {
            kvpy_bad_arg(st, "shape: too many bytes");
            rc = -1;
        } else {
            *bytes *= (size_t)shape[i];
        }
    }
    Py_DECREF(seq);
    return rc;
}

PyObject *kvpy_empty(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    static const char *const names[] = {"shape", "dtype", "device"};
    PyObject *a[3];
    if (kvpy_parse_fast("empty", args, nargs, kwnames, names, 3, 1, a) != 0) return NULL;
    kvhal_dtype dt;
    kvhal_device dev;
    if (kvpy_parse_dtype(st, a[1], &dt) != 0 || kvpy_parse_device(st, a[2], "device", &dev) != 0) return NULL;
    int64_t shape[KVHAL_MAX_DIMS];
    Py_ssize_t nd;
    size_t bytes;
    if (parse_shape(st, a[0], kvhal_dtype_size(dt), shape, &nd, &bytes) != 0) return NULL;
    kvpy_tensor_object *t = PyObject_New(kvpy_tensor_object, st->tensor_type);
    if (!t) return NULL;
    t->buf = NULL;
    t->taken.managed = NULL;
    t->readonly = 0;
    kvhal_status rc = kvhal_buffer_create(dev, bytes ? bytes : 1, &t->buf);
    if (rc == KVHAL_OK) rc = kvhal_memset(t->buf, 0, 0, bytes ? bytes : 1, NULL);
    if (rc == KVHAL_OK) rc = kvhal_tensor_make(t->buf, 0, dt, (int32_t)nd, shape, NULL, &t->t);
    if (rc != KVHAL_OK) {
        Py_DECREF(t);
        return kvpy_raise(st, rc);
    }
    return (PyObject *)t;
}

PyObject *kvpy_from_dlpack(PyObject *mod, PyObject *obj)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    if (PyObject_TypeCheck(obj, st->tensor_type)) return Py_NewRef(obj);
    kvpy_import a;
    if (kvpy_import_any(st, obj, "array", 0, 0, KVPY_IMPORT_KEEP, &a) != 0) return NULL;
    kvpy_tensor_object *t = PyObject_New(kvpy_tensor_object, st->tensor_type);
    if (!t) {
        kvpy_import_release(st, &a);
        return NULL;
    }
    t->t = a.t;
    t->buf = a.buf;
    t->taken = a.taken;
    t->readonly = a.taken.versioned &&
                  (((DLManagedTensorVersioned *)a.taken.managed)->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
    return (PyObject *)t;
}

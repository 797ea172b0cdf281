/* stream.c — stream arguments resolved to kvhal streams (borrowed handles cached per module), and kvhal.Stream. */
#include "stream.h"

#include <string.h>

/* A stream object read through __cuda_stream__ or .cuda_stream: its integer handle, or NULL with nothing set. */
static PyObject *protocol_handle(kvpy_state *st, PyObject *o, int *failed)
{
    *failed = 0;
    PyObject *m = PyObject_GetAttr(o, st->s_cuda_stream_proto);
    if (!m) {
        PyErr_Clear();
        PyObject *h = PyObject_GetAttr(o, st->s_cuda_stream_attr);
        if (!h) PyErr_Clear();
        return h;
    }
    PyObject *r = PyObject_CallNoArgs(m);
    Py_DECREF(m);
    if (!r) {
        *failed = 1;
        return NULL;
    }
    PyObject *h = NULL;
    if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
        h = PyTuple_GET_ITEM(r, 1);
        Py_INCREF(h);
    }
    Py_DECREF(r);
    return h;
}

int kvpy_stream_int(kvpy_state *st, PyObject *o, intptr_t *out)
{
    *out = 0;
    if (!o || o == Py_None) return 0;
    if (PyObject_TypeCheck(o, st->stream_type)) {
        *out = ((kvpy_stream_object *)o)->native;
        return 0;
    }
    /* an engine passes the same torch.cuda.Stream call after call, and a stream object's handle does not change
     * (the object is held, so its address cannot be reused by another object while it is remembered) */
    if (o == st->last_stream_obj) {
        *out = st->last_stream_native;
        return 0;
    }
    PyObject *h = NULL;
    const int is_int = PyLong_Check(o);
    if (is_int) {
        Py_INCREF(o);
        h = o;
    } else {
        int failed;
        h = protocol_handle(st, o, &failed);
        if (failed) return -1;
    }
    if (!h || !PyLong_Check(h)) {
        Py_XDECREF(h);
        kvpy_bad_arg(st,
                     "stream: a %s is not a stream (pass an integer handle, an object with __cuda_stream__ or "
                     ".cuda_stream, or kvhal.Stream)",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    long long v = PyLong_AsLongLong(h);
    Py_DECREF(h);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (intptr_t)v;
    if (!is_int) {
        Py_INCREF(o);
        Py_XSETREF(st->last_stream_obj, o);
        st->last_stream_native = (intptr_t)v;
    }
    return 0;
}

int kvpy_stream_for(kvpy_state *st, PyObject *o, intptr_t native, kvhal_device dev, kvhal_stream **out)
{
    *out = NULL;
    if (!o || o == Py_None) return 0;
    if (PyObject_TypeCheck(o, st->stream_type)) {
        kvpy_stream_object *so = (kvpy_stream_object *)o;
        if (so->dev.type != dev.type || so->dev.id != dev.id) {
            kvpy_raise_msg(st, KVHAL_DEVICE_MISMATCH, "stream: the stream is on %s:%d, the tensors on %s:%d",
                           kvhal_device_type_name(so->dev.type), so->dev.id, kvhal_device_type_name(dev.type),
                           dev.id);
            return -1;
        }
        *out = so->s;
        return 0;
    }
    return kvpy_stream_native(st, native, dev, out);
}

int kvpy_stream_native(kvpy_state *st, intptr_t native, kvhal_device dev, kvhal_stream **out)
{
    *out = NULL;
    if (!kvpy_is_gpu(dev) && dev.type != KVHAL_DEVICE_OPENCL) return 0; /* cpu: every stream is the same */
    if (native == 0) return 0;                                            /* legacy default */
    for (int i = 0; i < st->streams_n; i++)
        if (st->streams[i].native == native && st->streams[i].dev.type == dev.type && st->streams[i].dev.id == dev.id) {
            *out = st->streams[i].s;
            return 0;
        }
    kvhal_stream *s = NULL;
    kvhal_status rc = kvhal_stream_wrap(dev, (void *)native, &s);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    if (st->streams_n < KVPY_STREAM_MAX) {
        st->streams[st->streams_n].dev = dev;
        st->streams[st->streams_n].native = native;
        st->streams[st->streams_n].s = s;
        st->streams_n++;
    }
    /* past the bound the handle is not cached; it stays alive (the work may still be queued) */
    *out = s;
    return 0;
}

void kvpy_stream_cache_free(kvpy_state *st)
{
    for (int i = 0; i < st->order_events_n; i++) (void)kvhal_event_destroy(st->order_events[i].e);
    st->order_events_n = 0;
    for (int i = 0; i < st->streams_n; i++) (void)kvhal_stream_destroy(st->streams[i].s);
    st->streams_n = 0;
}

/* ---- torch's streams ----
 * torch keeps a current stream per device and thread; its kernels that made a tensor ran there. For torch tensors
 * the binding takes the capsule with stream=-1 (the protocol's "no synchronisation": torch then checks nothing
 * about devices or streams) and orders torch's current stream of the tensors' device before the call's stream
 * itself, so an explicit stream works on any device whatever torch's current device is. */
int kvpy_is_torch_tensor(kvpy_state *st, PyObject *obj)
{
    if (!st->torch_tensor_type) {
        /* looked for once a type named "Tensor" comes (torch.Tensor's own name): NumPy's and other producers'
         * arrays cost a string comparison until then */
        const char *tn = Py_TYPE(obj)->tp_name;
        if (strcmp(tn, "Tensor") != 0 && strcmp(tn, "torch.Tensor") != 0) return 0;
        PyObject *name = PyUnicode_FromString("torch");
        PyObject *torch = name ? PyImport_GetModule(name) : NULL; /* only when the caller imported torch */
        Py_XDECREF(name);
        if (torch) {
            st->torch_tensor_type = PyObject_GetAttrString(torch, "Tensor");
            Py_DECREF(torch);
        }
        if (!st->torch_tensor_type || !PyType_Check(st->torch_tensor_type)) {
            Py_CLEAR(st->torch_tensor_type);
            PyErr_Clear();
            return 0;
        }
    }
    return PyObject_TypeCheck(obj, (PyTypeObject *)st->torch_tensor_type);
}

int kvpy_torch_current_stream(kvpy_state *st, kvhal_device dev, intptr_t *out)
{
    if (!st->torch_current_stream) {
        PyObject *name = PyUnicode_FromString("torch.cuda");
        PyObject *cuda = name ? PyImport_Import(name) : NULL;
        Py_XDECREF(name);
        st->torch_current_stream = cuda ? PyObject_GetAttrString(cuda, "current_stream") : NULL;
        Py_XDECREF(cuda);
        if (!st->torch_current_stream) {
            kvpy_prefix_error("torch.cuda.current_stream");
            return -1;
        }
    }
    PyObject *s = PyObject_CallFunction(st->torch_current_stream, "i", (int)dev.id);
    PyObject *h = s ? PyObject_GetAttr(s, st->s_cuda_stream_attr) : NULL;
    Py_XDECREF(s);
    const long long v = h ? PyLong_AsLongLong(h) : -1;
    Py_XDECREF(h);
    if (v == -1 && PyErr_Occurred()) {
        kvpy_prefix_error("torch.cuda.current_stream");
        return -1;
    }
    *out = (intptr_t)v;
    return 0;
}

int kvpy_order_after(kvpy_state *st, kvhal_device dev, intptr_t producer, kvhal_stream *s)
{
    kvhal_stream *ps;
    if (kvpy_stream_native(st, producer, dev, &ps) != 0) return -1;
    kvhal_event *e = NULL;
    for (int i = 0; i < st->order_events_n && !e; i++)
        if (st->order_events[i].dev.type == dev.type && st->order_events[i].dev.id == dev.id) e = st->order_events[i].e;
    kvhal_status rc = KVHAL_OK;
    if (!e) {
        rc = kvhal_event_create(dev, &e);
        if (rc == KVHAL_OK && st->order_events_n < KVPY_ORDER_EVENTS_MAX) {
            st->order_events[st->order_events_n].dev = dev;
            st->order_events[st->order_events_n].e = e;
            st->order_events_n++;
        }
    }
    if (rc == KVHAL_OK) rc = kvhal_event_record(e, ps);
    if (rc == KVHAL_OK) rc = kvhal_stream_wait_event(s, e);
    int cached = 0;
    for (int i = 0; i < st->order_events_n; i++) cached |= st->order_events[i].e == e;
    if (e && !cached) (void)kvhal_event_destroy(e); /* past the bound: the wait is enqueued, the event may go */
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    return 0;
}

/* ---- kvhal.Stream ---- */
static int stream_init(PyObject *op, PyObject *args, PyObject *kw)
{
    kvpy_stream_object *self = (kvpy_stream_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"device", "native", NULL};
    PyObject *dev_o = NULL, *nat = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", names, &dev_o, &nat)) return -1;
    if (kvpy_parse_device(st, dev_o, "device", &self->dev) != 0) return -1;
    intptr_t h = 0;
    if (nat && kvpy_stream_int(st, nat, &h) != 0) return -1;
    if (self->s) {
        (void)kvhal_stream_destroy(self->s);
        self->s = NULL;
    }
    kvhal_status rc = kvhal_stream_wrap(self->dev, (void *)h, &self->s);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    self->native = h;
    return 0;
}

static void stream_dealloc(PyObject *op)
{
    kvpy_stream_object *self = (kvpy_stream_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->s) (void)kvhal_stream_destroy(self->s);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static PyObject *stream_check_errors(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_status rc = kvhal_stream_check_errors(((kvpy_stream_object *)op)->s);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *stream_synchronize(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_status rc = kvhal_stream_synchronize(((kvpy_stream_object *)op)->s);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *stream_get_device(PyObject *op, void *c)
{
    (void)c;
    return kvpy_device_str(kvpy_state_of(op), ((kvpy_stream_object *)op)->dev);
}

static PyObject *stream_get_native(PyObject *op, void *c)
{
    (void)c;
    return PyLong_FromSsize_t((Py_ssize_t)((kvpy_stream_object *)op)->native);
}

static PyObject *stream_cuda_stream(PyObject *op, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(in)", 0, (Py_ssize_t)((kvpy_stream_object *)op)->native);
}

static PyMethodDef stream_methods[] = {
    {"check_errors", stream_check_errors, METH_NOARGS,
     "check_errors($self)\n--\n\nWaits for the work queued on this stream (only) and raises kvhal.DeviceFault if a "
     "kernel of the device skipped out-of-range slots since the last check."},
    {"synchronize", stream_synchronize, METH_NOARGS, "synchronize($self)\n--\n\nWaits for the stream."},
    {"__cuda_stream__", stream_cuda_stream, METH_NOARGS,
     "__cuda_stream__($self)\n--\n\n(0, handle): the CUDA stream protocol."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef stream_getset[] = {{"device", stream_get_device, NULL, "the device ('cuda:0')", NULL},
                                      {"native", stream_get_native, NULL, "the native handle", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot stream_slots[] = {
    {Py_tp_doc, "Stream(device, native=0)\n--\n\nBorrows a native stream of device: an integer handle (0 or 1: the "
                "legacy default stream, 2: the per-thread default stream), or any object with __cuda_stream__ or "
                ".cuda_stream (torch.cuda.Stream). The native stream is never destroyed by kvhal."},
    {Py_tp_dealloc, KVPY_FN(stream_dealloc)},
    {Py_tp_init, KVPY_FN(stream_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {0, NULL}};

PyType_Spec kvpy_stream_spec = {
    .name = "kvhal.Stream",
    .basicsize = sizeof(kvpy_stream_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = stream_slots,
};

/* devevents.c — kvhal.Event: a point in a stream's work (kvhal_event_*), to poll, wait for (the GIL released), or
 * make another stream of the device wait for without the host waiting. */
#include "bind.h"

typedef struct {
    PyObject_HEAD
    kvhal_event *e;
    kvhal_device dev;
} event_object;

static int event_init(PyObject *op, PyObject *args, PyObject *kw)
{
    event_object *self = (event_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"device", NULL};
    PyObject *dev = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", names, &dev)) return -1;
    kvhal_device d;
    if (kvpy_parse_device(st, dev, "device", &d) != 0) return -1;
    if (self->e) (void)kvhal_event_destroy(self->e);
    self->e = NULL;
    kvhal_status rc = kvhal_event_create(d, &self->e);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    self->dev = d;
    return 0;
}

static void event_dealloc(PyObject *op)
{
    event_object *self = (event_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->e) (void)kvhal_event_destroy(self->e);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static kvhal_event *live(PyObject *op)
{
    event_object *self = (event_object *)op;
    if (!self->e) kvpy_bad_arg(kvpy_state_of(op), "self: the Event was not initialised");
    return self->e;
}

kvhal_event *kvpy_event_arg(kvpy_state *st, PyObject *o, const char *arg)
{
    if (!PyObject_TypeCheck(o, st->bind_type[KVPY_T_EVENT])) {
        kvpy_bad_arg(st, "%s: expected a kvhal.Event, got %s", arg, Py_TYPE(o)->tp_name);
        return NULL;
    }
    event_object *self = (event_object *)o;
    if (!self->e) kvpy_bad_arg(st, "%s: the Event was not initialised", arg);
    return self->e;
}

/* record(stream=None) and wait(stream=None): the stream argument on the event's device. */
static PyObject *event_on_stream(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                 const char *fn, int wait)
{
    static const char *const names[] = {"stream"};
    PyObject *a[1];
    if (kvpy_parse_fast(fn, args, nargs, kwnames, names, 1, 0, a) != 0) return NULL;
    kvhal_event *e = live(op);
    if (!e) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_stream *s;
    if (kvpy_stream_arg(st, a[0], ((event_object *)op)->dev, &s) != 0) return NULL;
    kvhal_status rc;
    /* without backend events a record waits for the stream's work */
    Py_BEGIN_ALLOW_THREADS
    rc = wait ? kvhal_stream_wait_event(s, e) : kvhal_event_record(e, s);
    Py_END_ALLOW_THREADS
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

static PyObject *event_record(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return event_on_stream(op, args, nargs, kwnames, "record", 0);
}

static PyObject *event_wait(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return event_on_stream(op, args, nargs, kwnames, "wait", 1);
}

static PyObject *event_query(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_event *e = live(op);
    if (!e) return NULL;
    kvhal_status rc = kvhal_event_query(e);
    if (rc == KVHAL_OK) Py_RETURN_TRUE;
    if (rc == KVHAL_BUSY) {
        kvhal_clear_error();
        Py_RETURN_FALSE;
    }
    return kvpy_raise(kvpy_state_of(op), rc);
}

static PyObject *event_synchronize(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_event *e = live(op);
    if (!e) return NULL;
    kvhal_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_event_synchronize(e);
    Py_END_ALLOW_THREADS
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *event_get_device(PyObject *op, void *c)
{
    (void)c;
    if (!live(op)) return NULL;
    return kvpy_device_str(kvpy_state_of(op), ((event_object *)op)->dev);
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef event_methods[] = {
    {"record", FAST(event_record),
     "record($self, stream=None)\n--\n\nPlaces the event after the work queued on stream so far (None: the device's default "
     "stream). Recording again moves it."},
    {"wait", FAST(event_wait),
     "wait($self, stream=None)\n--\n\nMakes the work queued on stream from now on wait for the event (the host does not "
     "wait where the backend has events)."},
    {"query", event_query, METH_NOARGS,
     "query($self)\n--\n\nTrue when the work before its last record is done (or it was never recorded), else False."},
    {"synchronize", event_synchronize, METH_NOARGS,
     "synchronize($self)\n--\n\nWaits for the work before its last record (the GIL is released)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef event_getset[] = {{"device", event_get_device, NULL, "the device name", NULL},
                                     {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot event_slots[] = {
    {Py_tp_doc, "Event(device='cpu:0')\n--\n\nA device event: record(stream), query(), synchronize(), wait(stream) "
                "(a stream waits for it). On a backend without events (cpu) record waits for the stream, so the "
                "event is complete on return."},
    {Py_tp_dealloc, KVPY_FN(event_dealloc)},
    {Py_tp_init, KVPY_FN(event_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, event_methods},
    {Py_tp_getset, event_getset},
    {0, NULL}};

static PyType_Spec event_spec = {
    .name = "kvhal.Event",
    .basicsize = sizeof(event_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = event_slots,
};

int kvpy_devevents_add(PyObject *m, kvpy_state *st)
{
    return kvpy_bind_type_add(m, st, KVPY_T_EVENT, &event_spec, NULL);
}

/* _xapi_producer.c — a test-only producer of the DLPack C exchange API (dlpack_compat.h), built by meson for the
 * python suite only: the Debian PyTorch (1.13) predates the API, so kvhal's fast path is exercised here with this
 * type instead.
 *
 * XArray(base, device=(1, 0)) wraps any host buffer (NumPy array) and offers:
 *  - the type attribute __dlpack_c_exchange_api__, a PyCapsule "dlpack_exchange_api" of a version 1.3 table whose
 *    functions count their calls and can be told to fail;
 *  - __dlpack__ (delegates to base.__dlpack__(), counted) and __dlpack_device__ (the device given), so that a
 *    consumer falling back to the Python protocol is seen.
 * device only changes what the table and __dlpack_device__ report (a CUDA device here drives the stream check).
 *
 * Module functions: counts() -> dict of calls, reset(), configure(major=1, dltensor=True, fail=None, stream=0)
 * (fail: None, "dltensor", "managed", "stream", "null"), api_address() -> the table's address as an int (the first
 * revision's attribute form), chained_capsule() -> a capsule of a major-2 header whose prev_api is the table. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlpack_compat.h"

#define MAXD 8

typedef struct {
    PyObject_HEAD
    PyObject *base;
    Py_buffer view;
    int has_view;
    DLDataType dtype;
    int dev_type, dev_id;
    int64_t shape[MAXD], strides[MAXD]; /* strides in elements */
} XArray;

static struct {
    long dltensor, managed, stream, dlpack, deleter;
} g_counts;
static const char *g_fail; /* which function fails next (and every time after) */
static intptr_t g_stream;  /* what current_work_stream reports */
static const char *g_hostile; /* a malformed view to hand out: "neg_shape", "neg_stride", "overflow", "misaligned" */
static int64_t g_hostile_dims[MAXD];
static PyTypeObject XArrayType;

typedef struct {
    DLManagedTensorVersioned m;
    int64_t shape[MAXD], strides[MAXD];
    PyObject *owner;
} Managed;

static int dtype_of(const char *fmt, Py_ssize_t itemsize, DLDataType *out)
{
    char c = fmt ? fmt[0] : 'B';
    if (c == '<' || c == '=' || c == '@') c = fmt[1];
    out->lanes = 1;
    out->bits = (uint8_t)(itemsize * 8);
    switch (c) {
    case 'e': case 'f': case 'd': out->code = kDLFloat; return 0;
    case 'b': case 'h': case 'i': case 'l': case 'q': out->code = kDLInt; return 0;
    case 'B': case 'H': case 'I': case 'L': case 'Q': out->code = kDLUInt; return 0;
    default: return -1;
    }
}

static void fill(XArray *x, DLTensor *t, int64_t *shape, int64_t *strides)
{
    t->data = x->view.buf;
    t->device.device_type = (DLDeviceType)x->dev_type;
    t->device.device_id = x->dev_id;
    t->ndim = x->view.ndim;
    t->dtype = x->dtype;
    t->shape = shape;
    t->strides = strides;
    t->byte_offset = 0;
    if (!g_hostile) return;
    /* a broken or hostile producer: the consumer must refuse the view without touching memory */
    memcpy(g_hostile_dims, shape, sizeof g_hostile_dims);
    t->shape = g_hostile_dims;
    if (!strcmp(g_hostile, "neg_shape")) g_hostile_dims[0] = -3;
    else if (!strcmp(g_hostile, "neg_stride")) t->strides = g_hostile_dims, g_hostile_dims[0] = -1;
    else if (!strcmp(g_hostile, "overflow")) g_hostile_dims[0] = INT64_MAX / 2;
    else if (!strcmp(g_hostile, "misaligned")) t->byte_offset = 1;
}

static int failing(const char *which)
{
    if (g_fail && !strcmp(g_fail, which)) {
        PyErr_Format(PyExc_RuntimeError, "test producer: %s refused", which);
        return 1;
    }
    return 0;
}

static int x_dltensor(void *obj, DLTensor *out)
{
    g_counts.dltensor++;
    if (failing("dltensor")) return -1;
    if (!PyObject_TypeCheck((PyObject *)obj, &XArrayType)) {
        PyErr_SetString(PyExc_TypeError, "test producer: not an XArray");
        return -1;
    }
    XArray *x = obj;
    fill(x, out, x->shape, x->strides);
    return 0;
}

static void managed_deleter(DLManagedTensorVersioned *m)
{
    Managed *mm = m->manager_ctx;
    g_counts.deleter++;
    Py_DECREF(mm->owner);
    free(mm);
}

static int x_managed(void *obj, DLManagedTensorVersioned **out)
{
    g_counts.managed++;
    if (failing("managed")) return -1;
    if (g_fail && !strcmp(g_fail, "null")) { /* a broken producer: success without a tensor */
        *out = NULL;
        return 0;
    }
    XArray *x = obj;
    Managed *mm = calloc(1, sizeof *mm);
    if (!mm) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(mm->shape, x->shape, sizeof mm->shape);
    memcpy(mm->strides, x->strides, sizeof mm->strides);
    mm->m.version.major = 1;
    mm->m.version.minor = 3;
    mm->m.manager_ctx = mm;
    mm->m.deleter = managed_deleter;
    mm->m.flags = x->view.readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    fill(x, &mm->m.dl_tensor, mm->shape, mm->strides);
    Py_INCREF(obj);
    mm->owner = obj;
    *out = &mm->m;
    return 0;
}

static int x_stream(DLDeviceType type, int32_t id, void **out)
{
    (void)type;
    (void)id;
    g_counts.stream++;
    if (failing("stream")) return -1;
    *out = (void *)g_stream;
    return 0;
}

static kvpy_xapi g_api = {{{1, 3}, NULL}, NULL, x_managed, NULL, x_dltensor, x_stream};
static kvpy_xapi_header g_v2 = {{2, 0}, &g_api.header}; /* a future major that chains version 1 */

static int xarray_init(XArray *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"base", "device", NULL};
    PyObject *base;
    int dt = kDLCPU, di = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|(ii)", names, &base, &dt, &di)) return -1;
    if (self->has_view) {
        PyErr_SetString(PyExc_TypeError, "XArray: initialised twice");
        return -1;
    }
    if (PyObject_GetBuffer(base, &self->view, PyBUF_RECORDS_RO) != 0) return -1;
    self->has_view = 1;
    if (self->view.ndim < 1 || self->view.ndim > MAXD || dtype_of(self->view.format, self->view.itemsize,
                                                                  &self->dtype) != 0) {
        PyErr_SetString(PyExc_TypeError, "XArray: 1 to 8 dimensions of a numeric format");
        return -1;
    }
    for (int i = 0; i < self->view.ndim; i++) {
        self->shape[i] = self->view.shape[i];
        self->strides[i] = self->view.strides[i] / self->view.itemsize;
    }
    Py_INCREF(base);
    self->base = base;
    self->dev_type = dt;
    self->dev_id = di;
    return 0;
}

static void xarray_dealloc(XArray *self)
{
    if (self->has_view) PyBuffer_Release(&self->view);
    Py_XDECREF(self->base);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *xarray_dlpack(XArray *self, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw; /* stream and max_version: NumPy's host capsule serves every request here */
    g_counts.dlpack++;
    return PyObject_CallMethod(self->base, "__dlpack__", NULL);
}

static PyObject *xarray_dlpack_device(XArray *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(ii)", self->dev_type, self->dev_id);
}

static PyMethodDef xarray_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))xarray_dlpack, METH_VARARGS | METH_KEYWORDS, NULL},
    {"__dlpack_device__", (PyCFunction)xarray_dlpack_device, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject XArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_xapi_producer.XArray",
    .tp_basicsize = sizeof(XArray),
    .tp_dealloc = (destructor)xarray_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "XArray(base, device=(1, 0)): a host buffer offered through the DLPack C exchange API",
    .tp_methods = xarray_methods,
    .tp_init = (initproc)xarray_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *m_counts(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return Py_BuildValue("{s:l,s:l,s:l,s:l,s:l}", "dltensor", g_counts.dltensor, "managed", g_counts.managed,
                         "stream", g_counts.stream, "dlpack", g_counts.dlpack, "deleter", g_counts.deleter);
}

static PyObject *m_reset(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    memset(&g_counts, 0, sizeof g_counts);
    Py_RETURN_NONE;
}

static PyObject *m_configure(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *names[] = {"major", "dltensor", "fail", "stream", "hostile", NULL};
    unsigned int major = 1;
    int dlt = 1;
    const char *fail = NULL;
    Py_ssize_t stream = 0;
    const char *hostile = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Ipznz", names, &major, &dlt, &fail, &stream, &hostile)) return NULL;
    static char failbuf[32], hostilebuf[32];
    if (hostile) {
        snprintf(hostilebuf, sizeof hostilebuf, "%s", hostile);
        g_hostile = hostilebuf;
    } else {
        g_hostile = NULL;
    }
    g_api.header.version.major = major;
    g_api.dltensor_from_py_object_no_sync = dlt ? x_dltensor : NULL;
    if (fail) {
        snprintf(failbuf, sizeof failbuf, "%s", fail);
        g_fail = failbuf;
    } else {
        g_fail = NULL;
    }
    g_stream = (intptr_t)stream;
    Py_RETURN_NONE;
}

static PyObject *m_api_address(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyLong_FromVoidPtr(&g_api);
}

static PyObject *m_chained_capsule(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyCapsule_New(&g_v2, KVPY_XAPI_CAPSULE, NULL);
}

static PyMethodDef module_methods[] = {
    {"counts", m_counts, METH_NOARGS, NULL},
    {"reset", m_reset, METH_NOARGS, NULL},
    {"configure", (PyCFunction)(void (*)(void))m_configure, METH_VARARGS | METH_KEYWORDS, NULL},
    {"api_address", m_api_address, METH_NOARGS, NULL},
    {"chained_capsule", m_chained_capsule, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_xapi_producer", NULL, -1, module_methods,
                                        NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__xapi_producer(void);
PyMODINIT_FUNC PyInit__xapi_producer(void)
{
    if (PyType_Ready(&XArrayType) < 0) return NULL;
    PyObject *cap = PyCapsule_New(&g_api, KVPY_XAPI_CAPSULE, NULL);
    if (!cap) return NULL;
    /* a static type takes class attributes through its dict before first use; PyType_Modified drops caches */
    const int r = PyDict_SetItemString(XArrayType.tp_dict, "__dlpack_c_exchange_api__", cap);
    Py_DECREF(cap);
    if (r < 0) return NULL;
    PyType_Modified(&XArrayType);
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&XArrayType);
    if (PyModule_AddObject(m, "XArray", (PyObject *)&XArrayType) < 0) return NULL;
    return m;
}

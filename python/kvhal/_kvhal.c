/* _kvhal.c — the CPython extension behind the `kvhal` package: arrays in and out over DLPack (zero copies), the
 * ops, the prefix cache and the cache manager, device listing, and errors as exceptions.
 *
 * Arrays in: a type offering the DLPack C exchange API (__dlpack_c_exchange_api__, dlpack_compat.h; remembered per
 * type) is read through its C functions: a borrowed DLTensor for the length of a call, an owning tensor for
 * from_dlpack, and on CUDA/ROCm the producer's current stream compared with the one kvhal uses (another stream goes
 * through __dlpack__ below, which orders the two). Otherwise any object with __dlpack__ /
 * __dlpack_device__ (NumPy, PyTorch, CuPy, JAX, kvhal.Tensor). The
 * versioned capsule (DLPack 1.x) is asked for first (max_version=(1, 0)); a producer that does not take that
 * keyword gives the unversioned one. The capsule is renamed "used_dltensor(_versioned)" as the protocol asks, its
 * memory wrapped with kvhal_buffer_wrap (a borrow: nothing is copied), and its deleter called once the call is done.
 * On CUDA/ROCm the consumer's stream is passed to __dlpack__ so that the producer orders its work before ours.
 *
 * Host and CUDA/HIP ranges stay wrapped across calls (a small cache by device, address and bytes).
 *
 * Arrays out: kvhal.Tensor (made by kvhal.empty or kvhal.from_dlpack) exports __dlpack__ itself; page lists are
 * kvhal.Pages (int32 ids inline, written by the C calls directly).
 *
 * The prefix handle is kept as an opaque value inside a PrefixHandle object (HANDLE_T below), so a change of the
 * C type (pointer today, a generation-checked 64-bit value later) is a one-line edit here. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "dlpack_compat.h"
#include "kvhal.h"

/* Counts the public lists leave to the caller (no *_COUNT in the API): status codes are 0 .. n-1, dtypes
 * 0 .. KVHAL_FP8_E5M2FNUZ. PY_DTYPE_N also marks "no dtype" in the DLPack table. */
#define PY_COUNT_X(name, code, msg) +1
#define PY_STATUS_N ((int)(0 KVHAL_STATUS_MAP(PY_COUNT_X)))
#define PY_DTYPE_N ((kvhal_dtype)(KVHAL_FP8_E5M2FNUZ + 1))
#define PY_DTYPE_COUNT ((int)KVHAL_FP8_E5M2FNUZ + 1)

typedef kvhal_prefix_handle HANDLE_T; /* the one place that names the prefix handle's C type */

/* ------------------------------------------------------------------------------------------------------------ */
/* Errors                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */
static PyObject *g_error;                          /* kvhal.Error */
static PyObject *g_status_error[PY_STATUS_N]; /* one subclass per status (index 0 unused) */

static PyObject *raise_status(kvhal_status st)
{
    PyObject *cls = (st > 0 && (int)st < PY_STATUS_N && g_status_error[st]) ? g_status_error[st] : g_error;
    const char *msg = kvhal_last_error();
    /* kvhal_last_error() already starts with the status name */
    if (msg && msg[0]) PyErr_SetString(cls, msg);
    else PyErr_Format(cls, "%s: %s", kvhal_status_name(st), kvhal_status_string(st));
    return NULL;
}

/* An argument the binding itself refuses: kvhal.InvalidArgument naming it. */
static PyObject *bad_arg(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PyErr_Format(g_status_error[KVHAL_INVALID_ARGUMENT], "KVHAL_INVALID_ARGUMENT: %s", buf);
    return NULL;
}

/* "INVALID_ARGUMENT" -> "InvalidArgument" */
static void camel(const char *upper, char *out, size_t size)
{
    size_t j = 0;
    int start = 1;
    for (const char *p = upper; *p && j + 1 < size; p++) {
        if (*p == '_') {
            start = 1;
            continue;
        }
        out[j++] = start ? *p : (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
        start = 0;
    }
    out[j] = '\0';
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Small helpers: interned names, keyword parsing for METH_FASTCALL                                             */
/* ------------------------------------------------------------------------------------------------------------ */
static PyObject *s_dlpack, *s_dlpack_device, *s_stream, *s_max_version, *s_cuda_stream_proto, *s_cuda_stream_attr;
static PyObject *g_max_version; /* (1, 0) */
static PyObject *g_kw_stream, *g_kw_max, *g_kw_stream_max; /* keyword-name tuples for __dlpack__ */
static PyObject *g_array_type;  /* array.array */

/* Fills out[0..n) from positional args and keywords named names[0..n); missing ones stay NULL. */
static int parse_fast(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, int n, int required, PyObject **out)
{
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", fn, n, nargs);
        return -1;
    }
    for (int i = 0; i < n; i++) out[i] = i < nargs ? args[i] : NULL;
    if (kwnames) {
        const Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            const char *kn = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
            if (!kn) return -1;
            int found = -1;
            for (int i = 0; i < n; i++)
                if (kn[0] == names[i][0] && !strcmp(kn, names[i])) { /* the names of one function are distinct */
                    found = i;
                    break;
                }
            if (found < 0) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", fn, kn);
                return -1;
            }
            if (out[found]) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn, kn);
                return -1;
            }
            out[found] = args[nargs + k];
        }
    }
    for (int i = 0; i < required; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fn, names[i]);
            return -1;
        }
    return 0;
}

static int parse_device(PyObject *o, const char *arg, kvhal_device *out)
{
    if (!o || o == Py_None) {
        out->type = KVHAL_DEVICE_CPU;
        out->id = 0;
        return 0;
    }
    const char *text = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (!text) {
        bad_arg("%s: expected a device name such as 'cpu:0' or 'cuda:1'", arg);
        return -1;
    }
    kvhal_status st = kvhal_device_parse(text, out);
    if (st != KVHAL_OK) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static PyObject *device_str(kvhal_device d)
{
    char buf[64];
    if (kvhal_device_format(d, buf, sizeof buf) != KVHAL_OK) return raise_status(KVHAL_INVALID_ARGUMENT);
    return PyUnicode_FromString(buf);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* dtypes                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */
static int dl_to_kvhal(DLDataType t, kvhal_dtype *out)
{
    if (t.lanes != 1) return -1;
    switch (t.code) {
    case kDLFloat:
        if (t.bits == 32) *out = KVHAL_F32;
        else if (t.bits == 16) *out = KVHAL_F16;
        else return -1;
        return 0;
    case kDLBfloat:
        if (t.bits != 16) return -1;
        *out = KVHAL_BF16;
        return 0;
    case kDLInt:
        if (t.bits == 32) *out = KVHAL_I32;
        else if (t.bits == 64) *out = KVHAL_I64;
        else return -1;
        return 0;
    case KVHAL_PY_DL_FLOAT8_E4M3FN:
        if (t.bits != 8) return -1;
        *out = KVHAL_FP8_E4M3;
        return 0;
    case KVHAL_PY_DL_FLOAT8_E5M2:
        if (t.bits != 8) return -1;
        *out = KVHAL_FP8_E5M2;
        return 0;
    default: return -1;
    }
}

static DLDataType kvhal_to_dl(kvhal_dtype d)
{
    DLDataType t = {kDLFloat, 32, 1};
    switch (d) {
    case KVHAL_F32: break;
    case KVHAL_F16: t.bits = 16; break;
    case KVHAL_BF16: t.code = kDLBfloat; t.bits = 16; break;
    case KVHAL_FP8_E4M3: t.code = KVHAL_PY_DL_FLOAT8_E4M3FN; t.bits = 8; break;
    case KVHAL_FP8_E5M2: t.code = KVHAL_PY_DL_FLOAT8_E5M2; t.bits = 8; break;
    case KVHAL_I32: t.code = kDLInt; break;
    case KVHAL_I64: t.code = kDLInt; t.bits = 64; break;
    default: break;
    }
    return t;
}

static int parse_dtype(PyObject *o, kvhal_dtype *out)
{
    const char *name = o && PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : "f32";
    if (!name) return -1;
    if (o && !PyUnicode_Check(o)) {
        bad_arg("dtype: expected a name (f32, f16, bf16, fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz, fp8_e5m2fnuz, i32, i64)");
        return -1;
    }
    for (int d = 0; d < PY_DTYPE_COUNT; d++)
        if (!strcmp(name, kvhal_dtype_name((kvhal_dtype)d))) {
            *out = (kvhal_dtype)d;
            return 0;
        }
    bad_arg("dtype: '%s' is not one of f32, f16, bf16, fp8_e4m3, fp8_e5m2, i32, i64", name);
    return -1;
}

/* DLPack device type <-> kvhal device type. Host-pinned memory (CUDA/ROCm host) is CPU memory to kvhal. */
static int dl_device_to_kvhal(int dl_type, int id, kvhal_device *out)
{
    switch (dl_type) {
    case kDLCPU: case kDLCUDAHost: case kDLROCMHost: out->type = KVHAL_DEVICE_CPU; out->id = 0; return 0;
    case kDLCUDA: out->type = KVHAL_DEVICE_CUDA; break;
    case kDLROCM: out->type = KVHAL_DEVICE_HIP; break;
    case kDLOpenCL: out->type = KVHAL_DEVICE_OPENCL; break;
    default: return -1;
    }
    out->id = id;
    return 0;
}

static int kvhal_to_dl_device(kvhal_device d)
{
    switch (d.type) {
    case KVHAL_DEVICE_CPU: return kDLCPU;
    case KVHAL_DEVICE_CUDA: return kDLCUDA;
    case KVHAL_DEVICE_HIP: return kDLROCM;
    case KVHAL_DEVICE_OPENCL: return kDLOpenCL;
    default: return kDLExtDev;
    }
}

static int is_gpu(kvhal_device d) { return d.type == KVHAL_DEVICE_CUDA || d.type == KVHAL_DEVICE_HIP; }

/* ------------------------------------------------------------------------------------------------------------ */
/* kvhal.Tensor: a kvhal tensor owned by Python (kvhal.empty) or a zero-copy view of a DLPack array               */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct {
    void *managed;  /* DLManagedTensor(Versioned) taken from a capsule; its deleter is called on release */
    int versioned;
} taken_t;

static void taken_release(taken_t *tk)
{
    if (!tk->managed) return;
    if (tk->versioned) {
        DLManagedTensorVersioned *m = tk->managed;
        if (m->deleter) m->deleter(m);
    } else {
        DLManagedTensor *m = tk->managed;
        if (m->deleter) m->deleter(m);
    }
    tk->managed = NULL;
}

typedef struct {
    PyObject_HEAD
    kvhal_tensor t;
    kvhal_buffer *buf; /* owned (empty) or wrapped (from_dlpack): destroyed with the object */
    taken_t taken;     /* from_dlpack: the producer's memory, kept until the object goes */
    int readonly;
} TensorObject;

static PyTypeObject TensorType;

static void tensor_dealloc(TensorObject *self)
{
    if (self->buf) (void)kvhal_buffer_destroy(self->buf);
    taken_release(&self->taken);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Importing an argument                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct {
    kvhal_tensor t;
    kvhal_buffer *buf; /* wrapped for this call, or borrowed from the wrap cache (wrap_slot) */
    int wrap_slot;     /* 1 + the wrap cache entry buf came from, 0 when buf is this call's own */
    taken_t taken;
} imp_t;

/* Wrapped host and CUDA/HIP memory by (device, address, bytes), kept across calls: on these devices a wrap holds
 * nothing of the memory (kvhal_buffer_wrap has no backend step there), so a remembered wrap of the same range is
 * the same buffer, and an engine's caches, K/V and slot tensors come back at the same addresses every step. An
 * entry in use by a call (inuse > 0: a call that released the GIL) is never replaced. OpenCL wraps retain the
 * cl_mem and are made per call. */
#define WRAP_CACHE_MAX 16
static struct {
    kvhal_device dev;
    void *data;
    size_t bytes;
    kvhal_buffer *buf;
    int inuse;
} g_wraps[WRAP_CACHE_MAX];
static unsigned g_wrap_next;

static kvhal_status wrap_cached(kvhal_device dev, void *data, size_t bytes, imp_t *out)
{
    for (int i = 0; i < WRAP_CACHE_MAX; i++)
        if (g_wraps[i].buf && g_wraps[i].data == data && g_wraps[i].bytes == bytes && g_wraps[i].dev.type == dev.type &&
            g_wraps[i].dev.id == dev.id) {
            g_wraps[i].inuse++;
            out->buf = g_wraps[i].buf;
            out->wrap_slot = i + 1;
            return KVHAL_OK;
        }
    kvhal_status st = kvhal_buffer_wrap(dev, data, bytes, &out->buf);
    if (st != KVHAL_OK) return st;
    for (int k = 0; k < WRAP_CACHE_MAX; k++) {
        const unsigned i = (g_wrap_next + (unsigned)k) % WRAP_CACHE_MAX;
        if (g_wraps[i].inuse) continue;
        if (g_wraps[i].buf) (void)kvhal_buffer_destroy(g_wraps[i].buf);
        g_wraps[i].dev = dev;
        g_wraps[i].data = data;
        g_wraps[i].bytes = bytes;
        g_wraps[i].buf = out->buf;
        g_wraps[i].inuse = 1;
        out->wrap_slot = (int)i + 1;
        g_wrap_next = i + 1;
        break;
    } /* every entry in use: this wrap stays the call's own */
    return KVHAL_OK;
}

static void imp_release(imp_t *a)
{
    if (a->wrap_slot) g_wraps[a->wrap_slot - 1].inuse--;
    else if (a->buf) (void)kvhal_buffer_destroy(a->buf);
    a->buf = NULL;
    a->wrap_slot = 0;
    taken_release(&a->taken);
}

static char g_empty_byte; /* what an empty host tensor without memory wraps */

/* Producer types that refused max_version (pre-1.0 DLPack): asked without it from then on. */
#define NO_VERSIONED_MAX 16
static PyTypeObject *g_no_versioned[NO_VERSIONED_MAX];
static int g_no_versioned_n;

static int type_unversioned(PyTypeObject *tp)
{
    for (int i = 0; i < g_no_versioned_n; i++)
        if (g_no_versioned[i] == tp) return 1;
    return 0;
}

/* The DLPack C exchange API of a producer type (dlpack_compat.h), looked up once per type and remembered with the
 * type's version tag: assigning or deleting the attribute on the type (PyType_Modified) changes the tag, and the
 * next call looks again. A type without the API, or whose table has no major version 1 in its chain, is remembered
 * as such (NULL). The cache keeps a reference to the type and to the attribute's object. */
static int finish_import(const DLTensor *dl, uint64_t flags, const char *arg, int writable, int mode, imp_t *out);
#define XAPI_CACHE_MAX 32
static struct {
    PyTypeObject *tp;
    unsigned int tag;
    const kvpy_xapi *api;
    PyObject *holder; /* the capsule or int the table came from */
} g_xapi[XAPI_CACHE_MAX];
static int g_xapi_n;
static PyObject *s_xapi, *s_xapi_old; /* "__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__" */

static const kvpy_xapi *xapi_resolve(PyTypeObject *tp, PyObject **holder)
{
    *holder = NULL;
    /* on the type, not the instance (the specification's rule); once per type and version tag, so the public
     * attribute lookup's cost does not matter */
    PyObject *attr = PyObject_GetAttr((PyObject *)tp, s_xapi);
    if (!attr || attr == Py_None) {
        PyErr_Clear();
        Py_XDECREF(attr);
        attr = PyObject_GetAttr((PyObject *)tp, s_xapi_old);
    }
    if (!attr || attr == Py_None) {
        PyErr_Clear();
        Py_XDECREF(attr);
        return NULL;
    }
    void *ptr = NULL;
    if (PyCapsule_IsValid(attr, KVPY_XAPI_CAPSULE)) ptr = PyCapsule_GetPointer(attr, KVPY_XAPI_CAPSULE);
    else if (PyLong_Check(attr)) ptr = PyLong_AsVoidPtr(attr);
    const kvpy_xapi_header *h = ptr;
    while (h && h->version.major != KVHAL_PY_DLPACK_MAJOR) h = h->prev_api; /* a newer major may chain an old one */
    const kvpy_xapi *api = (const kvpy_xapi *)h;
    if (!api || !api->managed_tensor_from_py_object_no_sync || !api->current_work_stream) {
        /* another capsule name, another kind of object, 0, no major 1: not the API; __dlpack__ serves */
        PyErr_Clear();
        Py_DECREF(attr);
        return NULL;
    }
    *holder = attr;
    return api;
}

static const kvpy_xapi *xapi_of(PyTypeObject *tp)
{
    int i = 0;
    for (; i < g_xapi_n; i++)
        if (g_xapi[i].tp == tp) {
            if (g_xapi[i].tag && g_xapi[i].tag == tp->tp_version_tag) return g_xapi[i].api;
            break;
        }
    PyObject *holder;
    const kvpy_xapi *api = xapi_resolve(tp, &holder);
    if (i == g_xapi_n) {
        if (g_xapi_n == XAPI_CACHE_MAX) { /* not remembered: looked up on every call (correct, slower) */
            Py_XDECREF(holder);
            return api;
        }
        Py_INCREF(tp);
        g_xapi[i].tp = tp;
        g_xapi[i].holder = NULL;
        g_xapi_n++;
    }
    Py_XSETREF(g_xapi[i].holder, holder);
    g_xapi[i].api = api;
    g_xapi[i].tag = tp->tp_version_tag; /* the lookup gave the type a tag if it can have one */
    return api;
}

/* Whether the producer's current stream (the exchange API's current_work_stream) is the consumer's stream given as
 * the DLPack stream protocol numbers it (1 legacy default, 2 per-thread default, else a handle; 0, no stream given,
 * is kvhal's legacy default). The producer's NULL is its default stream, the legacy default stream on CUDA/ROCm. */
static int same_stream(void *producer, intptr_t dls)
{
    const intptr_t p = (intptr_t)producer;
    const intptr_t pk = p == 0 ? 1 : p, ck = dls == 0 ? 1 : dls;
    return pk == ck;
}

/* current_work_stream's answer, reused by the other arguments of the same call (one query per call and device):
 * every entry point that imports arrays starts a new call serial, and the thread is part of the key (a producer's
 * current stream is per thread, and another thread may run a call while a __dlpack__ fallback lets it). */
static unsigned long g_call_serial;
static struct {
    unsigned long serial;
    PyThreadState *ts;
    const kvpy_xapi *api;
    int type, id;
    void *stream;
} g_cws;

#define IMP_RAW 1  /* host copies: any 1/2/4/8-byte dtype taken by its size */
#define IMP_KEEP 2 /* the view outlives the call (from_dlpack): an owning import, never a borrowed DLTensor */

/* Imports through the exchange API. 1: done; 0: the producer works on another stream than the one kvhal will use
 * (then __dlpack__, given the call's stream or none, orders the two as the protocol says); -1: error set. */
static int import_xapi(PyObject *obj, const kvpy_xapi *api, const char *arg, int writable, intptr_t stream_int,
                       int mode, imp_t *out)
{
    DLTensor borrowed;
    const DLTensor *dl;
    uint64_t flags = 0;
    if (!(mode & IMP_KEEP) && api->dltensor_from_py_object_no_sync) {
        if (api->dltensor_from_py_object_no_sync(obj, &borrowed) != 0) goto failed;
        dl = &borrowed;
    } else {
        DLManagedTensorVersioned *m = NULL;
        if (api->managed_tensor_from_py_object_no_sync(obj, &m) != 0) goto failed;
        if (!m) {
            bad_arg("%s: the %s's DLPack exchange API gave no tensor", arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
        out->taken.managed = m;
        out->taken.versioned = 1;
        if (m->version.major != KVHAL_PY_DLPACK_MAJOR) {
            const unsigned major = m->version.major;
            taken_release(&out->taken);
            bad_arg("%s: DLPack major version %u is not %d", arg, major, KVHAL_PY_DLPACK_MAJOR);
            return -1;
        }
        dl = &m->dl_tensor;
        flags = m->flags;
    }
    /* with no stream given kvhal works on the legacy default stream, which torch's __dlpack__(stream=None) also
     * orders after its current stream: the producer's current stream must be the one kvhal uses either way */
    if (dl->device.device_type == kDLCUDA || dl->device.device_type == kDLROCM) {
        void *cur = NULL;
        PyThreadState *ts = PyThreadState_Get();
        if (g_cws.serial == g_call_serial && g_cws.ts == ts && g_cws.api == api &&
            g_cws.type == (int)dl->device.device_type && g_cws.id == (int)dl->device.device_id) {
            cur = g_cws.stream;
        } else {
            if (api->current_work_stream(dl->device.device_type, dl->device.device_id, &cur) != 0) {
                taken_release(&out->taken);
                goto failed;
            }
            g_cws.serial = g_call_serial;
            g_cws.ts = ts;
            g_cws.api = api;
            g_cws.type = (int)dl->device.device_type;
            g_cws.id = (int)dl->device.device_id;
            g_cws.stream = cur;
        }
        if (!same_stream(cur, stream_int)) {
            taken_release(&out->taken);
            return 0;
        }
    }
    return finish_import(dl, flags, arg, writable, mode, out) == 0 ? 1 : -1;
failed:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the DLPack exchange API failed without a message");
    {
        /* name the argument, keep the producer's exception type */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *msg = value ? PyObject_Str(value) : NULL;
        PyErr_Format(type, "%s: %s", arg, msg ? PyUnicode_AsUTF8(msg) : "?");
        Py_XDECREF(msg);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    return -1;
}

/* stream_int: the consumer's stream as the DLPack stream protocol numbers it (1 legacy default, 2 per-thread,
 * other values a handle), or 0 when the caller gave no stream (then no stream keyword is passed at all). */
static int import_any(PyObject *obj, const char *arg, int writable, intptr_t stream_int, int mode, imp_t *out);

static int import_dlpack(PyObject *obj, const char *arg, int writable, intptr_t stream_int, imp_t *out)
{
    return import_any(obj, arg, writable, stream_int, 0, out);
}

/* raw: host copies move bytes, so any dtype of 1, 2, 4 or 8 bytes is taken as a kvhal dtype of that size. */
static int import_any(PyObject *obj, const char *arg, int writable, intptr_t stream_int, int mode, imp_t *out)
{
    memset(out, 0, sizeof *out);
    if (PyObject_TypeCheck(obj, &TensorType)) {
        TensorObject *t = (TensorObject *)obj;
        if (writable && t->readonly) {
            bad_arg("%s: the array is read-only (its producer said so) and is written by this call", arg);
            return -1;
        }
        out->t = t->t;
        return 0;
    }
    const kvpy_xapi *api = xapi_of(Py_TYPE(obj));
    if (api) {
        const int r = import_xapi(obj, api, arg, writable, stream_int, mode, out);
        if (r != 0) return r < 0 ? -1 : 0;
    }
    /* No __dlpack_device__ call on the way in (it costs PyTorch microseconds): the capsule carries the device.
     * The consumer's stream goes to the producer only when the caller gave one (stream_int != 0 means given; the
     * protocol's default for None is the legacy stream, which is also ours). A producer that refuses a stream
     * (NumPy: host arrays take none) is asked again without it once __dlpack_device__ says it is not a GPU's. */
    PyObject *kwargs = NULL, *cap = NULL;
    const int try_versioned = !type_unversioned(Py_TYPE(obj));
    PyObject *callargs[3] = {obj, NULL, NULL}; /* self, then the keyword values */
    int with_stream = stream_int != 0, legacy_retry = 0;
    for (int attempt = try_versioned ? 0 : 1; attempt < 2 && !cap; attempt++) {
        Py_ssize_t nk = 0;
        PyObject *names[2];
        PyObject *stream_obj = NULL;
        if (with_stream) {
            stream_obj = PyLong_FromSsize_t((Py_ssize_t)stream_int);
            if (!stream_obj) break;
            callargs[1 + nk] = stream_obj;
            names[nk++] = s_stream;
        }
        if (attempt == 0) {
            callargs[1 + nk] = g_max_version;
            names[nk++] = s_max_version;
        }
        kwargs = nk ? (nk == 2 ? g_kw_stream_max : nk == 1 && names[0] == s_stream ? g_kw_stream : g_kw_max) : NULL;
        cap = PyObject_VectorcallMethod(s_dlpack, callargs, 1, kwargs); /* no bound method made */
        Py_XDECREF(stream_obj);
        if (!cap && PyErr_ExceptionMatches(PyExc_AttributeError) && !PyObject_HasAttr(obj, s_dlpack)) {
            PyErr_Clear();
            bad_arg("%s: a %s is not a DLPack array (no __dlpack__)", arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
        if (!cap && attempt == 0 && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear(); /* a pre-1.0 producer: no max_version keyword */
            if (g_no_versioned_n < NO_VERSIONED_MAX) {
                Py_INCREF(Py_TYPE(obj));
                g_no_versioned[g_no_versioned_n++] = Py_TYPE(obj);
            }
        } else if (!cap && with_stream) {
            /* refused the stream: fine for a host array, an error for a GPU one */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *dv = PyObject_CallMethodNoArgs(obj, s_dlpack_device);
            long dl_type = -1;
            if (dv && PyTuple_Check(dv) && PyTuple_GET_SIZE(dv) == 2) dl_type = PyLong_AsLong(PyTuple_GET_ITEM(dv, 0));
            Py_XDECREF(dv);
            if ((dl_type == kDLCUDA || dl_type == kDLROCM) && stream_int == 2 && !legacy_retry) {
                /* a producer without the per-thread default stream (PyTorch refuses 2): ask it to order its work
                 * before the legacy default stream instead, with which the per-thread default stream synchronizes */
                PyErr_Clear();
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
                legacy_retry = 1;
                stream_int = 1;
                attempt--;
                continue;
            }
            if (dl_type == kDLCUDA || dl_type == kDLROCM || dl_type < 0) {
                PyErr_Clear();
                PyErr_Restore(type, value, tb);
                break;
            }
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Clear();
            with_stream = 0;
            attempt--; /* the same attempt again, without the stream */
        } else if (!cap) {
            break;
        }
    }
    if (!cap) return -1;

    DLTensor *dl = NULL;
    uint64_t flags = 0;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != KVHAL_PY_DLPACK_MAJOR) {
            Py_DECREF(cap);
            bad_arg("%s: DLPack major version %u is not %d", arg, m->version.major, KVHAL_PY_DLPACK_MAJOR);
            return -1;
        }
        if (PyCapsule_SetName(cap, "used_dltensor_versioned") != 0) {
            Py_DECREF(cap);
            return -1;
        }
        out->taken.managed = m;
        out->taken.versioned = 1;
        dl = &m->dl_tensor;
        flags = m->flags;
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (PyCapsule_SetName(cap, "used_dltensor") != 0) {
            Py_DECREF(cap);
            return -1;
        }
        out->taken.managed = m;
        dl = &m->dl_tensor;
    } else {
        Py_DECREF(cap);
        bad_arg("%s: __dlpack__ returned no DLPack capsule", arg);
        return -1;
    }
    Py_DECREF(cap); /* renamed: its destructor leaves the tensor to us */
    return finish_import(dl, flags, arg, writable, mode, out);
}

/* The DLTensor (taken into out->taken, or borrowed for the call) as a kvhal tensor over a wrapped buffer. */
static int finish_import(const DLTensor *dl, uint64_t flags, const char *arg, int writable, int mode, imp_t *out)
{
    const int raw = mode & IMP_RAW;
    kvhal_device dev;
    if (dl->device.device_id < 0 || dl_device_to_kvhal((int)dl->device.device_type, (int)dl->device.device_id, &dev)) {
        const int dt_ = (int)dl->device.device_type, di_ = (int)dl->device.device_id;
        taken_release(&out->taken);
        bad_arg("%s: DLPack device (%d, %d) is not a device type kvhal has", arg, dt_, di_);
        return -1;
    }

    if (writable && (flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
        taken_release(&out->taken);
        bad_arg("%s: the array is read-only (its producer said so) and is written by this call", arg);
        return -1;
    }
    kvhal_dtype dt;
    static const kvhal_dtype by_size[9] = {PY_DTYPE_N, KVHAL_FP8_E4M3, KVHAL_F16, PY_DTYPE_N, KVHAL_I32,
                                           PY_DTYPE_N, PY_DTYPE_N, PY_DTYPE_N, KVHAL_I64};
    if (dl_to_kvhal(dl->dtype, &dt) == 0)
        ;
    else if (raw && dl->dtype.lanes == 1 && dl->dtype.bits % 8 == 0 && dl->dtype.bits <= 64 &&
             by_size[dl->dtype.bits / 8] != PY_DTYPE_N)
        dt = by_size[dl->dtype.bits / 8];
    else {
        const DLDataType t = dl->dtype; /* dl dies with the taken tensor */
        taken_release(&out->taken);
        bad_arg("%s: DLPack dtype (code %u, %u bits, %u lanes) is not one kvhal has (f32, f16, bf16, fp8_e4m3fn, "
                "fp8_e5m2, int32, int64)",
                arg, (unsigned)t.code, (unsigned)t.bits, (unsigned)t.lanes);
        return -1;
    }
    if (dl->ndim < 1 || dl->ndim > KVHAL_MAX_DIMS) {
        const int nd = (int)dl->ndim;
        taken_release(&out->taken);
        bad_arg("%s: %d dimensions (kvhal takes 1 to %d)", arg, nd, KVHAL_MAX_DIMS);
        return -1;
    }
    const size_t esz = kvhal_dtype_size(dt);
    /* The view is checked here as kvhal_tensor_make would (shape and strides >= 0, no 64-bit overflow, the byte
     * offset a multiple of the element size) and the buffer wrapped is exactly the bytes it spans, so every element
     * lies inside it by construction: the tensor is filled in directly (kvhal_tensor_make's second pass over the
     * same checks cost a fifth of an argument's import). */
    kvhal_tensor *t = &out->t;
    int64_t run = 1, numel = 1, last = 0; /* last: the farthest element's index in elements */
    int overflow = 0;
    for (int i = dl->ndim - 1; i >= 0; i--) {
        const int64_t n = dl->shape[i], sd = dl->strides ? dl->strides[i] : run;
        if (n < 0) {
            taken_release(&out->taken);
            bad_arg("%s: dim %d has a negative size %lld", arg, i, (long long)n);
            return -1;
        }
        if (sd < 0) {
            taken_release(&out->taken);
            bad_arg("%s: stride %lld of dim %d is negative (kvhal takes strides >= 0)", arg, (long long)sd, i);
            return -1;
        }
        t->shape[i] = n;
        t->strides[i] = sd;
        int64_t span;
        overflow |= __builtin_mul_overflow(run, n > 0 ? n : 1, &run) | __builtin_mul_overflow(numel, n, &numel);
        if (n > 0) overflow |= __builtin_mul_overflow(n - 1, sd, &span) | __builtin_add_overflow(last, span, &last);
    }
    uint64_t bytes64 = 0;
    if (!overflow && numel > 0)
        overflow = __builtin_mul_overflow((uint64_t)last + 1, (uint64_t)esz, &bytes64) ||
                   __builtin_add_overflow(bytes64, (uint64_t)dl->byte_offset, &bytes64);
    else if (!overflow)
        bytes64 = dl->byte_offset;
    if (overflow || bytes64 > SIZE_MAX || dl->byte_offset % esz) {
        const unsigned long long off = (unsigned long long)dl->byte_offset; /* dl dies with the taken tensor */
        taken_release(&out->taken);
        if (overflow || bytes64 > SIZE_MAX)
            bad_arg("%s: shape and strides overflow 64-bit byte offsets", arg);
        else
            bad_arg("%s: byte offset %llu is not a multiple of the element size %zu", arg, off, esz);
        return -1;
    }
    for (int i = dl->ndim; i < KVHAL_MAX_DIMS; i++) {
        t->shape[i] = 1;
        t->strides[i] = 0;
    }
    size_t bytes = (size_t)bytes64;
    void *data = dl->data;
    t->offset = (size_t)dl->byte_offset;
    if (numel == 0 && dev.type == KVHAL_DEVICE_CPU && (!data || !bytes)) {
        data = &g_empty_byte;
        bytes = 1;
        t->offset = 0;
    }
    t->dtype = dt;
    t->ndim = (int32_t)dl->ndim;
    kvhal_status st = !(mode & IMP_KEEP) && (dev.type == KVHAL_DEVICE_CPU || is_gpu(dev))
                          ? wrap_cached(dev, data, bytes, out)
                          : kvhal_buffer_wrap(dev, data, bytes, &out->buf);
    t->buffer = out->buf;
    if (st == KVHAL_OK && (mode & IMP_KEEP)) st = kvhal_tensor_validate(t); /* kept views: checked in full once */
    if (st != KVHAL_OK) {
        PyObject *e = raise_status(st);
        (void)e;
        /* name the Python argument as well */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        PyErr_Format(type, "%s: %s", arg, s ? PyUnicode_AsUTF8(s) : "");
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        imp_release(out);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams: None, an integer handle, __cuda_stream__, .cuda_stream, or kvhal.Stream                              */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    kvhal_stream *s;
    kvhal_device dev;
    intptr_t native;
} StreamObject;

static PyTypeObject StreamType;

/* Borrowed-stream handles by (device, native handle), made once: an engine uses a few streams for its life. */
#define STREAM_CACHE_MAX 64
static struct {
    kvhal_device dev;
    intptr_t native;
    kvhal_stream *s;
} g_streams[STREAM_CACHE_MAX];
static int g_streams_n;

/* The last stream object read through __cuda_stream__ or .cuda_stream, and its handle: an engine passes the same
 * torch.cuda.Stream call after call, and a stream object's handle does not change (the object is held, so its
 * address cannot be reused by another object while it is remembered here). */
static PyObject *g_last_stream_obj;
static intptr_t g_last_stream_native;

/* The integer handle of a stream argument; 0 (meaning the legacy default) for None. */
static int stream_int_of(PyObject *o, intptr_t *out)
{
    *out = 0;
    if (!o || o == Py_None) return 0;
    if (PyObject_TypeCheck(o, &StreamType)) {
        *out = ((StreamObject *)o)->native;
        return 0;
    }
    if (o == g_last_stream_obj) {
        *out = g_last_stream_native;
        return 0;
    }
    PyObject *h = NULL;
    const int is_int = PyLong_Check(o);
    if (is_int) {
        Py_INCREF(o);
        h = o;
    } else {
        PyObject *m = PyObject_GetAttr(o, s_cuda_stream_proto);
        if (m) {
            PyObject *r = PyObject_CallNoArgs(m);
            Py_DECREF(m);
            if (!r) return -1;
            if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
                h = PyTuple_GET_ITEM(r, 1);
                Py_INCREF(h);
            }
            Py_DECREF(r);
        } else {
            PyErr_Clear();
            h = PyObject_GetAttr(o, s_cuda_stream_attr);
            if (!h) PyErr_Clear();
        }
    }
    if (!h || !PyLong_Check(h)) {
        Py_XDECREF(h);
        bad_arg("stream: a %s is not a stream (pass an integer handle, an object with __cuda_stream__ or "
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
        Py_XSETREF(g_last_stream_obj, o);
        g_last_stream_native = (intptr_t)v;
    }
    return 0;
}

/* The kvhal stream for dev and a stream argument (NULL for the default stream). */
static int stream_for(PyObject *o, intptr_t native, kvhal_device dev, kvhal_stream **out)
{
    *out = NULL;
    if (!o || o == Py_None) return 0;
    if (PyObject_TypeCheck(o, &StreamType)) {
        StreamObject *so = (StreamObject *)o;
        if (so->dev.type != dev.type || so->dev.id != dev.id) {
            PyErr_Format(g_status_error[KVHAL_DEVICE_MISMATCH],
                         "KVHAL_DEVICE_MISMATCH: stream: the stream is on %s:%d, the tensors on %s:%d",
                         kvhal_device_type_name(so->dev.type), so->dev.id, kvhal_device_type_name(dev.type), dev.id);
            return -1;
        }
        *out = so->s;
        return 0;
    }
    if (!is_gpu(dev) && dev.type != KVHAL_DEVICE_OPENCL) return 0; /* cpu: every stream is the same */
    if (native == 0) return 0;                                         /* legacy default */
    for (int i = 0; i < g_streams_n; i++)
        if (g_streams[i].native == native && g_streams[i].dev.type == dev.type && g_streams[i].dev.id == dev.id) {
            *out = g_streams[i].s;
            return 0;
        }
    kvhal_stream *s = NULL;
    kvhal_status st = kvhal_stream_wrap(dev, (void *)native, &s);
    if (st != KVHAL_OK) {
        raise_status(st);
        return -1;
    }
    if (g_streams_n < STREAM_CACHE_MAX) {
        g_streams[g_streams_n].dev = dev;
        g_streams[g_streams_n].native = native;
        g_streams[g_streams_n].s = s;
        g_streams_n++;
    }
    /* past the bound the handle is not cached; it stays alive (the work may still be queued) */
    *out = s;
    return 0;
}

/* The stream to hand a producer: 0 when the caller gave none (the producer then assumes the legacy default stream,
 * which is what kvhal uses); DLPack numbers the legacy default stream 1 (0 is ambiguous there). */
static intptr_t dlpack_stream_number(PyObject *arg, intptr_t native)
{
    if (!arg || arg == Py_None) return 0;
    return native == 0 ? 1 : native;
}

static int stream_init(StreamObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"device", "native", NULL};
    PyObject *dev_o = NULL, *nat = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", names, &dev_o, &nat)) return -1;
    if (parse_device(dev_o, "device", &self->dev) != 0) return -1;
    intptr_t h = 0;
    if (nat && stream_int_of(nat, &h) != 0) return -1;
    if (self->s) {
        (void)kvhal_stream_destroy(self->s);
        self->s = NULL;
    }
    kvhal_status st = kvhal_stream_wrap(self->dev, (void *)h, &self->s);
    if (st != KVHAL_OK) {
        raise_status(st);
        return -1;
    }
    self->native = h;
    return 0;
}

static void stream_dealloc(StreamObject *self)
{
    if (self->s) (void)kvhal_stream_destroy(self->s);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *stream_check_errors(StreamObject *self, PyObject *unused)
{
    (void)unused;
    kvhal_status st = kvhal_stream_check_errors(self->s);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *stream_synchronize(StreamObject *self, PyObject *unused)
{
    (void)unused;
    kvhal_status st = kvhal_stream_synchronize(self->s);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *stream_get_device(StreamObject *self, void *c)
{
    (void)c;
    return device_str(self->dev);
}

static PyObject *stream_get_native(StreamObject *self, void *c)
{
    (void)c;
    return PyLong_FromSsize_t((Py_ssize_t)self->native);
}

static PyObject *stream_cuda_stream(StreamObject *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(in)", 0, (Py_ssize_t)self->native);
}

static PyMethodDef stream_methods[] = {
    {"check_errors", (PyCFunction)stream_check_errors, METH_NOARGS,
     "check_errors()\n--\n\nWaits for the work queued on this stream (only) and raises kvhal.DeviceFault if a kernel "
     "of the device skipped out-of-range slots since the last check."},
    {"synchronize", (PyCFunction)stream_synchronize, METH_NOARGS, "synchronize()\n--\n\nWaits for the stream."},
    {"__cuda_stream__", (PyCFunction)stream_cuda_stream, METH_NOARGS,
     "__cuda_stream__()\n--\n\n(0, handle): the CUDA stream protocol."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef stream_getset[] = {{"device", (getter)stream_get_device, NULL, "the device ('cuda:0')", NULL},
                                      {"native", (getter)stream_get_native, NULL, "the native handle", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvhal.Stream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stream(device, native=0)\n--\n\nBorrows a native stream of device: an integer handle (0 or 1: the "
              "legacy default stream, 2: the per-thread default stream), or any object with __cuda_stream__ or "
              ".cuda_stream (torch.cuda.Stream). The native stream is never destroyed by kvhal.",
    .tp_methods = stream_methods,
    .tp_getset = stream_getset,
    .tp_init = (initproc)stream_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Tensor methods: properties, __dlpack__, host copies                                                          */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct {
    union {
        DLManagedTensorVersioned v;
        DLManagedTensor u;
    } m;
    int64_t shape[KVHAL_MAX_DIMS], strides[KVHAL_MAX_DIMS];
    PyObject *owner;
} export_t;

static void export_free(export_t *e)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(e->owner);
    PyMem_RawFree(e);
    PyGILState_Release(g);
}

static void deleter_versioned(DLManagedTensorVersioned *m) { export_free((export_t *)m->manager_ctx); }
static void deleter_unversioned(DLManagedTensor *m) { export_free((export_t *)m->manager_ctx); }

/* A capsule nobody consumed still owns its tensor. */
static void capsule_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
}

static PyObject *tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *maxv = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", names, &stream, &maxv, &dl_device, &copy)) return NULL;
    const kvhal_device dev = kvhal_buffer_device(self->t.buffer);
    if (copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "kvhal.Tensor.__dlpack__: copy=True is not supported (zero-copy only)");
        return NULL;
    }
    if (dl_device != Py_None) {
        long ty = -1, id = -1;
        if (PyTuple_Check(dl_device) && PyTuple_GET_SIZE(dl_device) == 2) {
            ty = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 0));
            id = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 1));
        }
        if (PyErr_Occurred()) return NULL;
        if (ty != kvhal_to_dl_device(dev) || id != dev.id) {
            PyErr_SetString(PyExc_BufferError, "kvhal.Tensor.__dlpack__: dl_device differs from the tensor's device "
                                               "and copies are not supported");
            return NULL;
        }
    }
    int versioned = 0;
    if (maxv != Py_None) {
        if (!PyTuple_Check(maxv) || PyTuple_GET_SIZE(maxv) < 1) return bad_arg("max_version: expected (major, minor)");
        long major = PyLong_AsLong(PyTuple_GET_ITEM(maxv, 0));
        if (major == -1 && PyErr_Occurred()) return NULL;
        versioned = major >= KVHAL_PY_DLPACK_MAJOR;
    }
    /* The producer's work is ordered before the consumer's: kvhal has no events, so a GPU export waits for the
     * device unless the consumer asked for no synchronisation (-1). */
    if (is_gpu(dev) && stream != Py_None) {
        long long sv = PyLong_AsLongLong(stream);
        if (sv == -1 && PyErr_Occurred()) return NULL;
        if (sv != -1) {
            kvhal_status st = kvhal_device_synchronize(dev);
            if (st != KVHAL_OK) return raise_status(st);
        }
    } else if (is_gpu(dev) || dev.type == KVHAL_DEVICE_OPENCL) {
        kvhal_status st = kvhal_device_synchronize(dev);
        if (st != KVHAL_OK) return raise_status(st);
    }
    export_t *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    DLTensor *dl = versioned ? &e->m.v.dl_tensor : &e->m.u.dl_tensor;
    dl->data = kvhal_buffer_native(self->t.buffer);
    dl->device.device_type = (DLDeviceType)kvhal_to_dl_device(dev);
    dl->device.device_id = dev.id;
    dl->ndim = self->t.ndim;
    dl->dtype = kvhal_to_dl(self->t.dtype);
    for (int i = 0; i < self->t.ndim; i++) {
        e->shape[i] = self->t.shape[i];
        e->strides[i] = self->t.strides[i];
    }
    dl->shape = e->shape;
    dl->strides = e->strides;
    dl->byte_offset = self->t.offset;
    /* Host consumers such as NumPy want the data pointer itself; byte_offset stays for devices where data is a
     * handle (OpenCL). */
    if (dev.type == KVHAL_DEVICE_CPU) {
        dl->data = (char *)dl->data + self->t.offset;
        dl->byte_offset = 0;
    }
    Py_INCREF(self);
    e->owner = (PyObject *)self;
    PyObject *cap;
    if (versioned) {
        e->m.v.version.major = KVHAL_PY_DLPACK_MAJOR;
        e->m.v.version.minor = KVHAL_PY_DLPACK_MINOR;
        e->m.v.manager_ctx = e;
        e->m.v.deleter = deleter_versioned;
        e->m.v.flags = self->readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
        cap = PyCapsule_New(&e->m.v, "dltensor_versioned", capsule_destructor);
    } else {
        e->m.u.manager_ctx = e;
        e->m.u.deleter = deleter_unversioned;
        cap = PyCapsule_New(&e->m.u, "dltensor", capsule_destructor);
    }
    if (!cap) {
        Py_DECREF(self);
        PyMem_RawFree(e);
    }
    return cap;
}

static PyObject *tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
    (void)unused;
    const kvhal_device dev = kvhal_buffer_device(self->t.buffer);
    return Py_BuildValue("(ii)", kvhal_to_dl_device(dev), (int)dev.id);
}

/* copy_from / copy_to: the whole contiguous tensor from or to a contiguous host array of the same byte size. */
static PyObject *tensor_host_copy(TensorObject *self, PyObject *host, int to_host)
{
    g_call_serial++; /* a new call: producers' current streams are asked again */
    if (!kvhal_tensor_is_contiguous(&self->t)) return bad_arg("self: copy_%s needs a contiguous tensor", to_host ? "to" : "from");
    imp_t h;
    if (import_any(host, to_host ? "dst" : "src", to_host, 0, 1, &h) != 0) return NULL;
    PyObject *ret = NULL;
    const size_t n = (size_t)kvhal_tensor_numel(&self->t) * kvhal_dtype_size(self->t.dtype);
    const kvhal_device hd = kvhal_buffer_device(h.t.buffer);
    if (hd.type != KVHAL_DEVICE_CPU) {
        bad_arg("%s: must be a host array", to_host ? "dst" : "src");
    } else if (!kvhal_tensor_is_contiguous(&h.t) ||
               (size_t)kvhal_tensor_numel(&h.t) * kvhal_dtype_size(h.t.dtype) != n) {
        bad_arg("%s: must be contiguous and hold %zu bytes", to_host ? "dst" : "src", n);
    } else {
        char *hp = (char *)kvhal_buffer_native(h.t.buffer) + h.t.offset;
        kvhal_status st = to_host ? kvhal_memcpy_d2h(hp, self->t.buffer, self->t.offset, n, NULL)
                                  : kvhal_memcpy_h2d(self->t.buffer, self->t.offset, hp, n, NULL);
        if (st != KVHAL_OK) raise_status(st);
        else {
            Py_INCREF(Py_None);
            ret = Py_None;
        }
    }
    imp_release(&h);
    return ret;
}

static PyObject *tensor_copy_from(TensorObject *self, PyObject *src) { return tensor_host_copy(self, src, 0); }
static PyObject *tensor_copy_to(TensorObject *self, PyObject *dst) { return tensor_host_copy(self, dst, 1); }

static PyObject *tensor_get_shape(TensorObject *self, void *c)
{
    (void)c;
    PyObject *t = PyTuple_New(self->t.ndim);
    if (!t) return NULL;
    for (int i = 0; i < self->t.ndim; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(self->t.shape[i]));
    return t;
}

static PyObject *tensor_get_strides(TensorObject *self, void *c)
{
    (void)c;
    PyObject *t = PyTuple_New(self->t.ndim);
    if (!t) return NULL;
    for (int i = 0; i < self->t.ndim; i++) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(self->t.strides[i]));
    return t;
}

static PyObject *tensor_get_dtype(TensorObject *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(kvhal_dtype_name(self->t.dtype));
}

static PyObject *tensor_get_device(TensorObject *self, void *c)
{
    (void)c;
    return device_str(kvhal_buffer_device(self->t.buffer));
}

static PyObject *tensor_get_offset(TensorObject *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(self->t.offset);
}

static PyObject *tensor_repr(TensorObject *self)
{
    char dev[64];
    (void)kvhal_device_format(kvhal_buffer_device(self->t.buffer), dev, sizeof dev);
    char shp[160];
    size_t j = 0;
    shp[0] = '\0';
    for (int i = 0; i < self->t.ndim && j < sizeof shp - 24; i++)
        j += (size_t)snprintf(shp + j, sizeof shp - j, i ? ", %lld" : "%lld", (long long)self->t.shape[i]);
    return PyUnicode_FromFormat("kvhal.Tensor(shape=(%s), dtype=%s, device=%s)", shp, kvhal_dtype_name(self->t.dtype),
                                dev);
}

static PyMethodDef tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\nA DLPack capsule of this tensor "
     "(versioned when max_version >= (1, 0)); zero-copy."},
    {"__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(DLPack device type, device id)."},
    {"copy_from", (PyCFunction)tensor_copy_from, METH_O,
     "copy_from(src)\n--\n\nCopies a contiguous host array of the same byte size into this contiguous tensor."},
    {"copy_to", (PyCFunction)tensor_copy_to, METH_O,
     "copy_to(dst)\n--\n\nCopies this contiguous tensor into a contiguous writable host array of the same byte size."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef tensor_getset[] = {{"shape", (getter)tensor_get_shape, NULL, "shape", NULL},
                                      {"strides", (getter)tensor_get_strides, NULL, "strides in elements", NULL},
                                      {"dtype", (getter)tensor_get_dtype, NULL, "kvhal dtype name", NULL},
                                      {"device", (getter)tensor_get_device, NULL, "device name", NULL},
                                      {"offset", (getter)tensor_get_offset, NULL, "byte offset in its buffer", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject TensorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvhal.Tensor",
    .tp_basicsize = sizeof(TensorObject),
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_repr = (reprfunc)tensor_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kvhal tensor: made by kvhal.empty (kvhal owns the memory) or kvhal.from_dlpack (a zero-copy view "
              "that keeps the producer's array alive). Exports __dlpack__.",
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
};

static PyObject *py_empty(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    static const char *const names[] = {"shape", "dtype", "device"};
    PyObject *a[3];
    if (parse_fast("empty", args, nargs, kwnames, names, 3, 1, a) != 0) return NULL;
    kvhal_dtype dt;
    kvhal_device dev;
    if (parse_dtype(a[1], &dt) != 0 || parse_device(a[2], "device", &dev) != 0) return NULL;
    PyObject *seq = PySequence_Fast(a[0], "shape: expected a sequence of sizes");
    if (!seq) return NULL;
    const Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    int64_t shape[KVHAL_MAX_DIMS];
    if (nd < 1 || nd > KVHAL_MAX_DIMS) {
        Py_DECREF(seq);
        return bad_arg("shape: %zd dimensions (kvhal takes 1 to %d)", nd, KVHAL_MAX_DIMS);
    }
    size_t bytes = kvhal_dtype_size(dt);
    for (Py_ssize_t i = 0; i < nd; i++) {
        shape[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (shape[i] < 0) {
            Py_DECREF(seq);
            if (PyErr_Occurred()) return NULL;
            return bad_arg("shape[%zd]: %lld is negative", i, (long long)shape[i]);
        }
        if (shape[i] && bytes > SIZE_MAX / (size_t)shape[i]) {
            Py_DECREF(seq);
            return bad_arg("shape: too many bytes");
        }
        bytes *= (size_t)shape[i];
    }
    Py_DECREF(seq);
    TensorObject *t = PyObject_New(TensorObject, &TensorType);
    if (!t) return NULL;
    t->buf = NULL;
    t->taken.managed = NULL;
    t->readonly = 0;
    kvhal_status st = kvhal_buffer_create(dev, bytes ? bytes : 1, &t->buf);
    if (st == KVHAL_OK) st = kvhal_memset(t->buf, 0, 0, bytes ? bytes : 1, NULL);
    if (st == KVHAL_OK) st = kvhal_tensor_make(t->buf, 0, dt, (int32_t)nd, shape, NULL, &t->t);
    if (st != KVHAL_OK) {
        Py_DECREF(t);
        return raise_status(st);
    }
    return (PyObject *)t;
}

static PyObject *py_from_dlpack(PyObject *mod, PyObject *obj)
{
    g_call_serial++; /* a new call: producers' current streams are asked again */
    (void)mod;
    if (PyObject_TypeCheck(obj, &TensorType)) {
        Py_INCREF(obj);
        return obj;
    }
    imp_t a;
    if (import_any(obj, "array", 0, 0, IMP_KEEP, &a) != 0) return NULL;
    TensorObject *t = PyObject_New(TensorObject, &TensorType);
    if (!t) {
        imp_release(&a);
        return NULL;
    }
    t->t = a.t;
    t->buf = a.buf;
    t->taken = a.taken;
    t->readonly = a.taken.versioned && (((DLManagedTensorVersioned *)a.taken.managed)->flags &
                                        DLPACK_FLAG_BITMASK_READ_ONLY);
    return (PyObject *)t;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Ops                                                                                                          */
/* ------------------------------------------------------------------------------------------------------------ */
static int as_scale(PyObject *o, const char *arg, float *out)
{
    if (!o) {
        *out = 1.0f;
        return 0;
    }
    double v = PyFloat_AsDouble(o); /* floats, ints, NumPy scalars, one-element arrays and tensors (__float__) */
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        bad_arg("%s: expected a float or a one-element tensor, got %s", arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* The five array arguments of paged caching (k_cache, v_cache, k, v, slot_mapping: a[0..4], names[0..4]) imported
 * for the stream object stream, and the kvhal stream for it on k_cache's device. *n counts the imported ones, which
 * the caller releases (imp_release) whatever this returns; -1 with a Python exception set on failure. */
static int import_paged_args(PyObject *const *a, const char *const *names, PyObject *stream, imp_t t[5], int *n,
                             kvhal_stream **s)
{
    *n = 0;
    intptr_t native;
    if (stream_int_of(stream, &native) != 0) return -1;
    const intptr_t dls = dlpack_stream_number(stream, native);
    for (; *n < 5; (*n)++)
        if (import_dlpack(a[*n], names[*n], *n < 2, dls, &t[*n]) != 0) return -1;
    return stream_for(stream, native, kvhal_buffer_device(t[0].t.buffer), s);
}

static PyObject *py_paged_caching(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    g_call_serial++; /* a new call: producers' current streams are asked again */
    (void)mod;
    static const char *const names[] = {"k_cache", "v_cache", "k", "v", "slot_mapping", "k_scale", "v_scale", "stream"};
    PyObject *a[8];
    if (parse_fast("paged_caching", args, nargs, kwnames, names, 8, 5, a) != 0) return NULL;
    float ks, vs;
    if (as_scale(a[5], "k_scale", &ks) != 0 || as_scale(a[6], "v_scale", &vs) != 0) return NULL;
    imp_t t[5];
    int n = 0;
    PyObject *ret = NULL;
    kvhal_stream *s;
    if (import_paged_args(a, names, a[7], t, &n, &s) != 0) goto out;
    kvhal_status st;
    if (kvhal_buffer_device(t[0].t.buffer).type == KVHAL_DEVICE_CPU && kvhal_tensor_numel(&t[2].t) >= (1 << 16)) {
        /* the CPU copies in the call: other Python threads run meanwhile (kvhal calls are thread-safe) */
        Py_BEGIN_ALLOW_THREADS
        st = kvhal_paged_caching(&t[0].t, &t[1].t, &t[2].t, &t[3].t, &t[4].t, ks, vs, s);
        Py_END_ALLOW_THREADS
    } else {
        st = kvhal_paged_caching(&t[0].t, &t[1].t, &t[2].t, &t[3].t, &t[4].t, ks, vs, s);
    }
    if (st != KVHAL_OK) {
        raise_status(st);
        goto out;
    }
    Py_INCREF(Py_None);
    ret = Py_None;
out:
    while (n-- > 0) imp_release(&t[n]);
    return ret;
}

static PyObject *py_dlpack_path(PyObject *mod, PyObject *obj)
{
    (void)mod;
    if (PyObject_TypeCheck(obj, &TensorType)) return PyUnicode_FromString("kvhal.Tensor");
    if (xapi_of(Py_TYPE(obj))) return PyUnicode_FromString("c_exchange_api");
    if (PyObject_HasAttr(obj, s_dlpack)) return PyUnicode_FromString("__dlpack__");
    return bad_arg("array: a %s is not a DLPack array (no __dlpack__)", Py_TYPE(obj)->tp_name);
}

/* _time_paged_caching(k_cache, v_cache, k, v, slot_mapping, reps, stream=None): the arguments imported once, then
 * reps back-to-back kvhal_paged_caching calls timed in C; mean host ns per call. What python/bench/bench_host.py
 * compares a call from Python against (the C call, same process, same tensors). */
static PyObject *py_time_paged_caching(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    g_call_serial++; /* a new call: producers' current streams are asked again */
    (void)mod;
    static const char *const names[] = {"k_cache", "v_cache", "k", "v", "slot_mapping", "reps", "stream"};
    PyObject *a[7];
    if (parse_fast("_time_paged_caching", args, nargs, kwnames, names, 7, 6, a) != 0) return NULL;
    const long reps = PyLong_AsLong(a[5]);
    if (reps == -1 && PyErr_Occurred()) return NULL;
    if (reps < 1) return bad_arg("reps: %ld is not positive", reps);
    imp_t t[5];
    int n = 0;
    PyObject *ret = NULL;
    kvhal_stream *s;
    if (import_paged_args(a, names, a[6], t, &n, &s) != 0) goto out;
    struct timespec t0, t1;
    kvhal_status st = KVHAL_OK;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < reps && st == KVHAL_OK; i++)
        st = kvhal_paged_caching(&t[0].t, &t[1].t, &t[2].t, &t[3].t, &t[4].t, 1.0f, 1.0f, s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (st != KVHAL_OK) {
        raise_status(st);
        goto out;
    }
    const double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    ret = PyFloat_FromDouble(ns / (double)reps);
out:
    while (n-- > 0) imp_release(&t[n]);
    return ret;
}

static PyObject *py_tensor_copy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    g_call_serial++; /* a new call: producers' current streams are asked again */
    (void)mod;
    static const char *const names[] = {"dst", "src", "stream"};
    PyObject *a[3];
    if (parse_fast("tensor_copy", args, nargs, kwnames, names, 3, 2, a) != 0) return NULL;
    intptr_t native;
    if (stream_int_of(a[2], &native) != 0) return NULL;
    imp_t t[2];
    int n = 0;
    PyObject *ret = NULL;
    for (; n < 2; n++)
        if (import_dlpack(a[n], names[n], n == 0, dlpack_stream_number(a[2], native), &t[n]) != 0) goto out;
    kvhal_stream *s;
    if (stream_for(a[2], native, kvhal_buffer_device(t[0].t.buffer), &s) != 0) goto out;
    kvhal_status st = kvhal_tensor_copy(&t[0].t, &t[1].t, s);
    if (st != KVHAL_OK) {
        raise_status(st);
        goto out;
    }
    Py_INCREF(Py_None);
    ret = Py_None;
out:
    while (n-- > 0) imp_release(&t[n]);
    return ret;
}

/* kvhal.Pages: an immutable run of int32 page ids, the one object a match, allocate, evict or reset returns. One
 * allocation with the ids inline (no array.array constructor call, no intermediate bytes); the buffer protocol
 * (format 'i', read-only) gives NumPy, memoryview and array.array('i', ...) its ids without Python-level
 * iteration, and kvhal calls take it back with zero copies. */
typedef struct {
    PyObject_VAR_HEAD
    int32_t v[1];
} PagesObject;

static PyTypeObject PagesType;
static Py_ssize_t g_pages_itemsize = sizeof(int32_t);
static char g_pages_format[] = "i";

static PyObject *pages_new(const int32_t *v, size_t n)
{
    PagesObject *p = PyObject_NewVar(PagesObject, &PagesType, (Py_ssize_t)n);
    if (!p) return NULL;
    if (n) memcpy(p->v, v, n * sizeof(int32_t));
    return (PyObject *)p;
}

static PyObject *i32_array(const int32_t *v, size_t n) { return pages_new(v, n); }

static Py_ssize_t pages_len(PagesObject *self) { return Py_SIZE(self); }

static PyObject *pages_item(PagesObject *self, Py_ssize_t i)
{
    if (i < 0 || i >= Py_SIZE(self)) {
        PyErr_SetString(PyExc_IndexError, "Pages index out of range");
        return NULL;
    }
    return PyLong_FromLong(self->v[i]);
}

static PyObject *pages_subscript(PagesObject *self, PyObject *key)
{
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) return NULL;
        if (i < 0) i += Py_SIZE(self);
        return pages_item(self, i);
    }
    if (!PySlice_Check(key)) {
        PyErr_Format(PyExc_TypeError, "Pages indices must be integers or slices, not %s", Py_TYPE(key)->tp_name);
        return NULL;
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0) return NULL;
    const Py_ssize_t n = PySlice_AdjustIndices(Py_SIZE(self), &start, &stop, step);
    if (step == 1) return pages_new(self->v + start, (size_t)n);
    PagesObject *p = PyObject_NewVar(PagesObject, &PagesType, n);
    if (!p) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) p->v[i] = self->v[start + i * step];
    return (PyObject *)p;
}

static int pages_getbuffer(PagesObject *self, Py_buffer *view, int flags)
{
    if (flags & PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "kvhal.Pages is read-only");
        view->obj = NULL;
        return -1;
    }
    view->obj = (PyObject *)self;
    Py_INCREF(self);
    view->buf = self->v;
    view->len = Py_SIZE(self) * (Py_ssize_t)sizeof(int32_t);
    view->readonly = 1;
    view->itemsize = sizeof(int32_t);
    view->format = (flags & PyBUF_FORMAT) ? g_pages_format : NULL;
    view->ndim = 1;
    view->shape = (flags & PyBUF_ND) ? &((PyVarObject *)self)->ob_size : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &g_pages_itemsize : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static PyObject *pages_tolist(PagesObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *l = PyList_New(Py_SIZE(self));
    if (!l) return NULL;
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) {
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
static PyObject *pages_richcompare(PagesObject *self, PyObject *other, int op)
{
    if (op != Py_EQ && op != Py_NE) Py_RETURN_NOTIMPLEMENTED;
    int eq;
    if (PyObject_TypeCheck(other, &PagesType)) {
        eq = Py_SIZE(other) == Py_SIZE(self) &&
             !memcmp(self->v, ((PagesObject *)other)->v, (size_t)Py_SIZE(self) * sizeof(int32_t));
    } else if (PyList_Check(other) || PyTuple_Check(other) || PyObject_TypeCheck(other, (PyTypeObject *)g_array_type)) {
        const Py_ssize_t n = PySequence_Size(other);
        if (n < 0) return NULL;
        eq = n == Py_SIZE(self);
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
    if ((op == Py_EQ) == (eq != 0)) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

static PyObject *pages_repr(PagesObject *self)
{
    PyObject *l = pages_tolist(self, NULL);
    if (!l) return NULL;
    PyObject *r = PyUnicode_FromFormat("kvhal.Pages(%R)", l);
    Py_DECREF(l);
    return r;
}

static PyObject *pages_reduce(PagesObject *self, PyObject *unused)
{
    (void)unused; /* pickles as the array.array('i') of its ids */
    PyObject *l = pages_tolist(self, NULL);
    if (!l) return NULL;
    return Py_BuildValue("(O(sN))", g_array_type, "i", l);
}

static PySequenceMethods pages_as_sequence = {.sq_length = (lenfunc)pages_len, .sq_item = (ssizeargfunc)pages_item};
static PyMappingMethods pages_as_mapping = {.mp_length = (lenfunc)pages_len,
                                            .mp_subscript = (binaryfunc)pages_subscript};
static PyBufferProcs pages_as_buffer = {.bf_getbuffer = (getbufferproc)pages_getbuffer};
static PyMethodDef pages_methods[] = {
    {"tolist", (PyCFunction)pages_tolist, METH_NOARGS, "tolist()\n--\n\nThe page ids as a list of ints."},
    {"__reduce__", (PyCFunction)pages_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyTypeObject PagesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvhal.Pages",
    .tp_basicsize = offsetof(PagesObject, v),
    .tp_itemsize = sizeof(int32_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Page ids (int32), immutable: len(), indexing, slicing (a new Pages), iteration, tolist(), == with a "
              "Pages, list, tuple or array.array, and the buffer protocol (format 'i', read-only: "
              "numpy.asarray(pages), memoryview, array.array('i', pages)). kvhal calls take it back with zero copies.",
    .tp_repr = (reprfunc)pages_repr,
    .tp_as_sequence = &pages_as_sequence,
    .tp_as_mapping = &pages_as_mapping,
    .tp_as_buffer = &pages_as_buffer,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_richcompare = (richcmpfunc)pages_richcompare,
    .tp_methods = pages_methods,
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Integer arrays on the host: buffer protocol (int32 zero-copy, int64 converted) or any sequence of ints         */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct {
    Py_buffer view;
    int has_view;
    void *tmp;
    const void *data;
    size_t n;
} intarr;

static void intarr_release(intarr *a)
{
    if (a->has_view) PyBuffer_Release(&a->view);
    PyMem_Free(a->tmp);
    memset(a, 0, sizeof *a);
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

/* width 4 or 8: the element size the caller wants. */
static int get_ints(PyObject *o, const char *arg, int width, intarr *a)
{
    memset(a, 0, sizeof *a);
    if (width == 4 && Py_IS_TYPE(o, &PagesType)) { /* ours: no buffer request */
        a->data = ((PagesObject *)o)->v;
        a->n = (size_t)Py_SIZE(o);
        return 0;
    }
    if (PyObject_CheckBuffer(o) && !PyBytes_Check(o)) {
        if (PyObject_GetBuffer(o, &a->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
            a->has_view = 1;
            if (!fmt_is_int(a->view.format, (size_t)a->view.itemsize)) {
                intarr_release(a);
                bad_arg("%s: expected integers, got buffer format '%s'", arg, a->view.format ? a->view.format : "?");
                return -1;
            }
            a->n = (size_t)(a->view.len / a->view.itemsize);
            if (a->view.itemsize == width) {
                a->data = a->view.buf;
                return 0;
            }
            a->tmp = PyMem_Malloc(a->n ? a->n * (size_t)width : 1);
            if (!a->tmp) {
                intarr_release(a);
                PyErr_NoMemory();
                return -1;
            }
            for (size_t i = 0; i < a->n; i++) {
                int64_t v;
                const char *p = (const char *)a->view.buf + i * (size_t)a->view.itemsize;
                switch (a->view.itemsize) {
                case 1: v = *(const int8_t *)p; break;
                case 2: v = *(const int16_t *)p; break;
                case 4: v = *(const int32_t *)p; break;
                default: v = *(const int64_t *)p; break;
                }
                if (width == 4) {
                    if (v < INT32_MIN || v > INT32_MAX) {
                        bad_arg("%s[%zu]: %lld does not fit in int32", arg, i, (long long)v);
                        intarr_release(a);
                        return -1;
                    }
                    ((int32_t *)a->tmp)[i] = (int32_t)v;
                } else {
                    ((int64_t *)a->tmp)[i] = v;
                }
            }
            a->data = a->tmp;
            return 0;
        }
        PyErr_Clear();
    }
    PyObject *seq = PySequence_Fast(o, "");
    if (!seq) {
        PyErr_Clear();
        bad_arg("%s: expected an integer array or a sequence of ints, got %s", arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    a->n = (size_t)PySequence_Fast_GET_SIZE(seq);
    a->tmp = PyMem_Malloc(a->n ? a->n * (size_t)width : 1);
    if (!a->tmp) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (size_t i = 0; i < a->n; i++) {
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_DECREF(seq);
            bad_arg("%s[%zu]: expected an int, got %s", arg, i, Py_TYPE(items[i])->tp_name);
            intarr_release(a);
            return -1;
        }
        if (width == 4 && (v < INT32_MIN || v > INT32_MAX)) {
            Py_DECREF(seq);
            bad_arg("%s[%zu]: %lld does not fit in int32", arg, i, v);
            intarr_release(a);
            return -1;
        }
        if (width == 4) ((int32_t *)a->tmp)[i] = (int32_t)v;
        else ((int64_t *)a->tmp)[i] = v;
    }
    Py_DECREF(seq);
    a->data = a->tmp;
    return 0;
}


/* copy_blocks(caches, pairs, stream=None): pairs (n, 2) int array or a sequence of (src, dst) pairs. */
static PyObject *py_copy_blocks(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    g_call_serial++; /* a new call: producers' current streams are asked again */
    (void)mod;
    static const char *const names[] = {"caches", "pairs", "stream"};
    PyObject *a[3];
    if (parse_fast("copy_blocks", args, nargs, kwnames, names, 3, 2, a) != 0) return NULL;
    intptr_t native;
    if (stream_int_of(a[2], &native) != 0) return NULL;
    PyObject *seq = PySequence_Fast(a[0], "caches: expected a sequence of tensors");
    if (!seq) return NULL;
    const Py_ssize_t nc = PySequence_Fast_GET_SIZE(seq);
    /* pairs: flatten a sequence of pairs, or take a flat / (n, 2) integer array */
    intarr pr;
    memset(&pr, 0, sizeof pr);
    PyObject *flat = NULL;
    if (!PyObject_CheckBuffer(a[1]) && PySequence_Check(a[1]) && PySequence_Size(a[1]) > 0) {
        PyObject *first = PySequence_GetItem(a[1], 0);
        if (first && PySequence_Check(first)) {
            PyObject *ps = PySequence_Fast(a[1], "pairs");
            if (ps) {
                const Py_ssize_t np_ = PySequence_Fast_GET_SIZE(ps);
                flat = PyList_New(0);
                for (Py_ssize_t i = 0; flat && i < np_; i++) {
                    PyObject *p = PySequence_Fast(PySequence_Fast_GET_ITEM(ps, i), "pairs: each pair is (src, dst)");
                    if (!p || PySequence_Fast_GET_SIZE(p) != 2) {
                        Py_XDECREF(p);
                        Py_CLEAR(flat);
                        if (!PyErr_Occurred()) bad_arg("pairs[%zd]: expected (src, dst)", i);
                        break;
                    }
                    PyList_Append(flat, PySequence_Fast_GET_ITEM(p, 0));
                    PyList_Append(flat, PySequence_Fast_GET_ITEM(p, 1));
                    Py_DECREF(p);
                }
                Py_DECREF(ps);
            }
        }
        Py_XDECREF(first);
        if (PyErr_Occurred()) {
            Py_XDECREF(flat);
            Py_DECREF(seq);
            return NULL;
        }
    }
    if (get_ints(flat ? flat : a[1], "pairs", 8, &pr) != 0) {
        Py_XDECREF(flat);
        Py_DECREF(seq);
        return NULL;
    }
    Py_XDECREF(flat);
    PyObject *ret = NULL;
    imp_t *t = NULL;
    kvhal_tensor *ts = NULL;
    Py_ssize_t n = 0;
    if (pr.n % 2) {
        bad_arg("pairs: %zu values is not a whole number of (src, dst) pairs", pr.n);
        goto out;
    }
    if (nc < 1) {
        bad_arg("caches: empty");
        goto out;
    }
    t = PyMem_Calloc((size_t)nc, sizeof *t);
    ts = PyMem_Calloc((size_t)nc, sizeof *ts);
    if (!t || !ts) {
        PyErr_NoMemory();
        goto out;
    }
    for (; n < nc; n++) {
        char arg[32];
        snprintf(arg, sizeof arg, "caches[%zd]", n);
        if (import_dlpack(PySequence_Fast_GET_ITEM(seq, n), arg, 1, dlpack_stream_number(a[2], native), &t[n]) != 0)
            goto out;
        ts[n] = t[n].t;
    }
    kvhal_stream *s;
    if (stream_for(a[2], native, kvhal_buffer_device(t[0].t.buffer), &s) != 0) goto out;
    kvhal_status st = kvhal_copy_blocks(ts, (int32_t)nc, (const int64_t *)pr.data, (int32_t)(pr.n / 2), s);
    if (st != KVHAL_OK) {
        raise_status(st);
        goto out;
    }
    Py_INCREF(Py_None);
    ret = Py_None;
out:
    while (n-- > 0) imp_release(&t[n]);
    PyMem_Free(t);
    PyMem_Free(ts);
    intarr_release(&pr);
    Py_DECREF(seq);
    return ret;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Devices and errors                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */
static PyObject *py_devices(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int ty = 0; ty < KVHAL_MAX_DEVICE_TYPES; ty++) {
        int32_t n = 0;
        if (kvhal_device_count((kvhal_device_type)ty, &n) != KVHAL_OK) {
            kvhal_clear_error();
            continue;
        }
        for (int32_t id = 0; id < n; id++) {
            kvhal_device d = {(kvhal_device_type)ty, id};
            kvhal_device_info info;
            if (kvhal_device_get_info(d, &info) != KVHAL_OK) {
                Py_DECREF(list);
                return raise_status(KVHAL_BACKEND_ERROR);
            }
            char name[64];
            (void)kvhal_device_format(d, name, sizeof name);
            PyObject *e = Py_BuildValue("{s:s,s:s,s:s,s:s,s:K,s:K,s:i,s:O}", "device", name, "name", info.name,
                                        "backend", info.backend, "platform", info.platform, "total_memory",
                                        (unsigned long long)info.total_memory, "free_memory",
                                        (unsigned long long)info.free_memory, "compute_units", (int)info.compute_units,
                                        "peer_access", info.peer_access ? Py_True : Py_False);
            if (!e || PyList_Append(list, e) != 0) {
                Py_XDECREF(e);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(e);
        }
    }
    return list;
}

static PyObject *py_synchronize(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    static const char *const names[] = {"device"};
    PyObject *a[1];
    if (parse_fast("synchronize", args, nargs, kwnames, names, 1, 0, a) != 0) return NULL;
    kvhal_device d;
    if (parse_device(a[0], "device", &d) != 0) return NULL;
    kvhal_status st = kvhal_device_synchronize(d);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

/* check_errors(device="cpu:0", stream=None): with a stream, that stream's work only (kvhal_stream_check_errors). */
static PyObject *py_check_errors(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    (void)mod;
    static const char *const names[] = {"device", "stream"};
    PyObject *a[2];
    if (parse_fast("check_errors", args, nargs, kwnames, names, 2, 0, a) != 0) return NULL;
    kvhal_device d;
    if (parse_device(a[0], "device", &d) != 0) return NULL;
    kvhal_status st;
    if (a[1] && a[1] != Py_None) {
        intptr_t native;
        kvhal_stream *s;
        if (stream_int_of(a[1], &native) != 0) return NULL;
        if (stream_for(a[1], native, d, &s) != 0) return NULL;
        if (s) st = kvhal_stream_check_errors(s);
        else st = kvhal_device_check_errors(d);
    } else {
        st = kvhal_device_check_errors(d);
    }
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *py_last_error(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(kvhal_last_error());
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Prefix cache and cache manager                                                                               */
/* ------------------------------------------------------------------------------------------------------------ */
typedef struct {
    PyObject_HEAD
    kvhal_prefix_cache *pc;
    PyObject *owner; /* the CacheManager whose prefix cache this is (not destroyed here), or NULL */
} PrefixObject;

typedef struct {
    PyObject_HEAD
    HANDLE_T h;
    PyObject *cache; /* the PrefixCache or CacheManager it came from (a handle is only valid there) */
} HandleObject;

typedef struct {
    PyObject_HEAD
    kvhal_cache_manager *cm;
    int32_t page_size;
} ManagerObject;

static PyTypeObject PrefixType, HandleType, ManagerType;

static void handle_dealloc(HandleObject *self)
{
    Py_XDECREF(self->cache);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvhal.PrefixHandle",
    .tp_basicsize = sizeof(HandleObject),
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The deepest node a match reached, to lock, unlock and finish a request with; valid with the cache "
              "that made it.",
};

static PyObject *new_handle(HANDLE_T h, PyObject *cache)
{
    HandleObject *o = PyObject_New(HandleObject, &HandleType);
    if (!o) return NULL;
    o->h = h;
    Py_INCREF(cache);
    o->cache = cache;
    return (PyObject *)o;
}

/* The handle argument: a PrefixHandle of this cache, or None (nothing matched). */
static int get_handle(PyObject *o, PyObject *cache, PyObject *alt, HANDLE_T *out)
{
    if (o == Py_None) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    if (!PyObject_TypeCheck(o, &HandleType)) {
        bad_arg("handle: expected a kvhal.PrefixHandle, got %s", Py_TYPE(o)->tp_name);
        return -1;
    }
    HandleObject *h = (HandleObject *)o;
    if (h->cache != cache && h->cache != alt) {
        bad_arg("handle: the handle comes from another cache");
        return -1;
    }
    *out = h->h;
    return 0;
}

static int parse_kind(PyObject *o, kvhal_prefix_kind *out)
{
    const char *k = o ? PyUnicode_AsUTF8(o) : "radix";
    if (!k) {
        PyErr_Clear();
        bad_arg("kind: expected 'radix' or 'naive'");
        return -1;
    }
    if (!strcmp(k, "radix")) *out = KVHAL_PREFIX_RADIX;
    else if (!strcmp(k, "naive")) *out = KVHAL_PREFIX_NAIVE;
    else {
        bad_arg("kind: '%s' is not 'radix' or 'naive'", k);
        return -1;
    }
    return 0;
}

static int prefix_init(PrefixObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"kind", "page_size", NULL};
    PyObject *kind = NULL;
    int page_size = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|Oi", names, &kind, &page_size)) return -1;
    kvhal_prefix_kind k;
    if (parse_kind(kind, &k) != 0) return -1;
    if (self->pc && !self->owner) (void)kvhal_prefix_cache_destroy(self->pc);
    Py_CLEAR(self->owner);
    self->pc = NULL;
    kvhal_status st = kvhal_prefix_cache_create(k, page_size, &self->pc);
    if (st != KVHAL_OK) {
        raise_status(st);
        return -1;
    }
    return 0;
}

static void prefix_dealloc(PrefixObject *self)
{
    if (self->pc && !self->owner) (void)kvhal_prefix_cache_destroy(self->pc);
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int prefix_live(PrefixObject *self)
{
    if (!self->pc) {
        bad_arg("self: the PrefixCache was not initialised");
        return -1;
    }
    return 0;
}

/* match for a prefix cache or a manager: (handle, cached_len, pages) */
static PyObject *match_common(PyObject *self, kvhal_prefix_cache *pc, kvhal_cache_manager *cm, int32_t page_size,
                              PyObject *tokens)
{
    intarr tk;
    if (get_ints(tokens, "tokens", 4, &tk) != 0) return NULL;
    const size_t cap = tk.n / (size_t)(page_size > 0 ? page_size : 1);
    PyObject *ret = NULL;
    /* the match writes its page ids straight into the Pages it returns (sized for the longest match) */
    PagesObject *pa = (PagesObject *)PyObject_NewVar(PagesObject, &PagesType, (Py_ssize_t)cap);
    if (!pa) goto out;
    HANDLE_T h;
    size_t cached = 0;
    kvhal_status st = cm ? kvhal_cache_manager_match(cm, tk.data, tk.n, &h, &cached, pa->v, cap)
                         : kvhal_prefix_match(pc, tk.data, tk.n, &h, &cached, pa->v, cap);
    if (st != KVHAL_OK) {
        Py_DECREF(pa);
        raise_status(st);
        goto out;
    }
    const size_t np = cached / (size_t)page_size;
    PyObject *pages;
    if (cap > 64 && np < cap / 2) { /* a short match of a long request: a right-sized copy */
        pages = pages_new(pa->v, np);
        Py_DECREF(pa);
    } else {
        Py_SET_SIZE(pa, (Py_ssize_t)np);
        pages = (PyObject *)pa;
    }
    PyObject *ho = pages ? new_handle(h, self) : NULL;
    PyObject *no = ho ? PyLong_FromSize_t(cached) : NULL;
    if (no && (ret = PyTuple_New(3)) != NULL) {
        PyTuple_SET_ITEM(ret, 0, ho);
        PyTuple_SET_ITEM(ret, 1, no);
        PyTuple_SET_ITEM(ret, 2, pages);
    } else {
        Py_XDECREF(ho);
        Py_XDECREF(pages);
        Py_XDECREF(no);
    }
out:
    intarr_release(&tk);
    return ret;
}

static PyObject *prefix_match(PrefixObject *self, PyObject *tokens)
{
    if (prefix_live(self) != 0) return NULL;
    return match_common((PyObject *)self, self->pc, NULL, kvhal_prefix_cache_page_size(self->pc), tokens);
}

static PyObject *prefix_lock_common(PrefixObject *self, PyObject *h, int lock)
{
    if (prefix_live(self) != 0) return NULL;
    HANDLE_T v;
    if (get_handle(h, (PyObject *)self, self->owner, &v) != 0) return NULL;
    kvhal_status st = lock ? kvhal_prefix_lock(self->pc, v) : kvhal_prefix_unlock(self->pc, v);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *prefix_lock(PrefixObject *self, PyObject *h) { return prefix_lock_common(self, h, 1); }
static PyObject *prefix_unlock(PrefixObject *self, PyObject *h) { return prefix_lock_common(self, h, 0); }

static PyObject *prefix_insert(PrefixObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "pages"};
    PyObject *a[2];
    if (parse_fast("insert", args, nargs, kwnames, names, 2, 2, a) != 0) return NULL;
    if (prefix_live(self) != 0) return NULL;
    if (self->owner) return bad_arg("self: insert into a CacheManager's prefix cache goes through the manager");
    intarr tk, pg;
    if (get_ints(a[0], "tokens", 4, &tk) != 0) return NULL;
    if (get_ints(a[1], "pages", 4, &pg) != 0) {
        intarr_release(&tk);
        return NULL;
    }
    PyObject *ret = NULL;
    const size_t ps = (size_t)kvhal_prefix_cache_page_size(self->pc);
    if (pg.n < tk.n / ps) {
        bad_arg("pages: %zu pages for %zu tokens (page size %zu) needs %zu", pg.n, tk.n, ps, tk.n / ps);
    } else {
        size_t already = 0;
        kvhal_status st = kvhal_prefix_insert(self->pc, tk.data, tk.n, pg.data, &already);
        if (st != KVHAL_OK) raise_status(st);
        else ret = PyLong_FromSize_t(already);
    }
    intarr_release(&tk);
    intarr_release(&pg);
    return ret;
}

typedef struct {
    int32_t *v;
    size_t n, cap;
    int failed;
} pagebuf;

static void collect_pages(const int32_t *pages, size_t n, void *user)
{
    pagebuf *b = user;
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

static PyObject *prefix_evict(PrefixObject *self, PyObject *arg)
{
    if (prefix_live(self) != 0) return NULL;
    if (self->owner) return bad_arg("self: eviction from a CacheManager's prefix cache goes through the manager");
    const Py_ssize_t want = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (want == -1 && PyErr_Occurred()) return NULL;
    if (want < 0) return bad_arg("num_tokens: %zd is negative", want);
    pagebuf b = {0};
    size_t evicted = 0;
    kvhal_status st = kvhal_prefix_evict(self->pc, (size_t)want, collect_pages, &b, &evicted);
    PyObject *ret = NULL;
    if (b.failed) PyErr_NoMemory();
    else if (st != KVHAL_OK) raise_status(st);
    else ret = i32_array(b.v, b.n);
    PyMem_Free(b.v);
    return ret;
}

static PyObject *prefix_reset(PrefixObject *self, PyObject *unused)
{
    (void)unused;
    if (prefix_live(self) != 0) return NULL;
    if (self->owner) return bad_arg("self: reset a CacheManager's prefix cache through the manager");
    pagebuf b = {0};
    kvhal_status st = kvhal_prefix_reset(self->pc, collect_pages, &b);
    PyObject *ret = NULL;
    if (b.failed) PyErr_NoMemory();
    else if (st != KVHAL_OK) raise_status(st);
    else ret = i32_array(b.v, b.n);
    PyMem_Free(b.v);
    return ret;
}

static PyObject *prefix_size_info(PrefixObject *self, PyObject *unused)
{
    (void)unused;
    if (prefix_live(self) != 0) return NULL;
    kvhal_prefix_size_info s;
    kvhal_status st = kvhal_prefix_size_info_get(self->pc, &s);
    if (st != KVHAL_OK) return raise_status(st);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "evictable_tokens", (Py_ssize_t)s.evictable_tokens,
                         "protected_tokens", (Py_ssize_t)s.protected_tokens, "total_tokens",
                         (Py_ssize_t)s.total_tokens, "num_nodes", (Py_ssize_t)s.num_nodes);
}

static PyObject *prefix_check_integrity(PrefixObject *self, PyObject *unused)
{
    (void)unused;
    if (prefix_live(self) != 0) return NULL;
    kvhal_status st = kvhal_prefix_check_integrity(self->pc);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *prefix_get_page_size(PrefixObject *self, void *c)
{
    (void)c;
    if (prefix_live(self) != 0) return NULL;
    return PyLong_FromLong(kvhal_prefix_cache_page_size(self->pc));
}

static PyMethodDef prefix_methods[] = {
    {"match", (PyCFunction)prefix_match, METH_O,
     "match(tokens)\n--\n\nLongest cached prefix, in whole pages: (handle, cached_len, pages: kvhal.Pages))."},
    {"lock", (PyCFunction)prefix_lock, METH_O, "lock(handle)\n--\n\nProtects the handle's path from eviction."},
    {"unlock", (PyCFunction)prefix_unlock, METH_O, "unlock(handle)\n--\n\nUndoes one lock."},
    {"insert", (PyCFunction)(void (*)(void))prefix_insert, METH_FASTCALL | METH_KEYWORDS,
     "insert(tokens, pages)\n--\n\nInserts tokens (aligned down to pages) with their pages; returns the length that "
     "was cached before."},
    {"evict", (PyCFunction)prefix_evict, METH_O,
     "evict(num_tokens)\n--\n\nEvicts unlocked leaves (LRU) until num_tokens are freed; returns the freed pages."},
    {"reset", (PyCFunction)prefix_reset, METH_NOARGS, "reset()\n--\n\nDrops everything; returns the freed pages."},
    {"size_info", (PyCFunction)prefix_size_info, METH_NOARGS,
     "size_info()\n--\n\n{evictable_tokens, protected_tokens, total_tokens, num_nodes}."},
    {"check_integrity", (PyCFunction)prefix_check_integrity, METH_NOARGS,
     "check_integrity()\n--\n\nRaises kvhal.Integrity if the tree is inconsistent."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef prefix_getset[] = {{"page_size", (getter)prefix_get_page_size, NULL, "tokens per page", NULL},
                                      {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PrefixType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvhal.PrefixCache",
    .tp_basicsize = sizeof(PrefixObject),
    .tp_dealloc = (destructor)prefix_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PrefixCache(kind='radix', page_size=1)\n--\n\nA prefix cache of token ids to page indices: 'radix' "
              "(a radix tree) or 'naive' (never matches).",
    .tp_methods = prefix_methods,
    .tp_getset = prefix_getset,
    .tp_init = (initproc)prefix_init,
    .tp_new = PyType_GenericNew,
};

static int manager_init(ManagerObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"total_pages", "page_size", "kind", NULL};
    int total = 0, page_size = 1;
    PyObject *kind = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|iO", names, &total, &page_size, &kind)) return -1;
    kvhal_prefix_kind k;
    if (parse_kind(kind, &k) != 0) return -1;
    if (self->cm) (void)kvhal_cache_manager_destroy(self->cm);
    self->cm = NULL;
    kvhal_status st = kvhal_cache_manager_create(total, page_size, k, &self->cm);
    if (st != KVHAL_OK) {
        raise_status(st);
        return -1;
    }
    self->page_size = page_size;
    return 0;
}

static void manager_dealloc(ManagerObject *self)
{
    if (self->cm) (void)kvhal_cache_manager_destroy(self->cm);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int manager_live(ManagerObject *self)
{
    if (!self->cm) {
        bad_arg("self: the CacheManager was not initialised");
        return -1;
    }
    return 0;
}

static PyObject *manager_match(ManagerObject *self, PyObject *tokens)
{
    if (manager_live(self) != 0) return NULL;
    return match_common((PyObject *)self, NULL, self->cm, self->page_size, tokens);
}

static PyObject *manager_allocate(ManagerObject *self, PyObject *arg)
{
    if (manager_live(self) != 0) return NULL;
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > INT32_MAX) return bad_arg("n: %ld pages is out of range", n);
    PagesObject *p = (PagesObject *)PyObject_NewVar(PagesObject, &PagesType, (Py_ssize_t)n);
    if (!p) return NULL;
    kvhal_status st = kvhal_cache_manager_allocate(self->cm, (int32_t)n, p->v); /* straight into the result */
    if (st == KVHAL_OK) return (PyObject *)p;
    Py_DECREF(p);
    return raise_status(st);
}

static PyObject *manager_free(ManagerObject *self, PyObject *arg)
{
    if (manager_live(self) != 0) return NULL;
    intarr pg;
    if (get_ints(arg, "pages", 4, &pg) != 0) return NULL;
    kvhal_status st = pg.n > INT32_MAX ? KVHAL_OUT_OF_RANGE
                                       : kvhal_cache_manager_free(self->cm, pg.data, (int32_t)pg.n);
    intarr_release(&pg);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

/* cache_finished (suffix 0: the whole request's tokens and pages) and cache_finished_suffix (suffix 1: only what
 * follows the match). */
static PyObject *finish_common(ManagerObject *self, PyObject *handle, PyObject *tokens, PyObject *pages, int suffix,
                               PyObject *start_arg)
{
    if (manager_live(self) != 0) return NULL;
    HANDLE_T h;
    if (get_handle(handle, (PyObject *)self, NULL, &h) != 0) return NULL;
    Py_ssize_t start = 0;
    if (start_arg) {
        start = PyNumber_AsSsize_t(start_arg, PyExc_OverflowError);
        if (start == -1 && PyErr_Occurred()) return NULL;
    }
    intarr tk, pg;
    if (get_ints(tokens, "tokens", 4, &tk) != 0) return NULL;
    if (start < 0 || (size_t)start > tk.n) {
        bad_arg("start: %zd is outside the %zu tokens", start, tk.n);
        intarr_release(&tk);
        return NULL;
    }
    tk.data = (const int32_t *)tk.data + start; /* tokens[start:] without a slice object */
    tk.n -= (size_t)start;
    if (get_ints(pages, "pages", 4, &pg) != 0) {
        intarr_release(&tk);
        return NULL;
    }
    PyObject *ret = NULL;
    const size_t need = (tk.n + (size_t)self->page_size - 1) / (size_t)self->page_size;
    if (pg.n < need) bad_arg("pages: %zu pages for %zu tokens needs %zu", pg.n, tk.n, need);
    else {
        kvhal_status st = suffix ? kvhal_cache_manager_cache_finished_suffix(self->cm, h, tk.data, tk.n, pg.data)
                                 : kvhal_cache_manager_cache_finished(self->cm, tk.data, tk.n, pg.data, h);
        if (st != KVHAL_OK) raise_status(st);
        else {
            Py_INCREF(Py_None);
            ret = Py_None;
        }
    }
    intarr_release(&tk);
    intarr_release(&pg);
    return ret;
}

static PyObject *manager_finished(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"tokens", "pages", "handle"};
    PyObject *a[3];
    if (parse_fast("cache_finished", args, nargs, kwnames, names, 3, 3, a) != 0) return NULL;
    return finish_common(self, a[2], a[0], a[1], 0, NULL);
}

static PyObject *manager_finished_suffix(ManagerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                         PyObject *kwnames)
{
    static const char *const names[] = {"handle", "tokens", "pages", "start"};
    PyObject *a[4];
    if (parse_fast("cache_finished_suffix", args, nargs, kwnames, names, 4, 3, a) != 0) return NULL;
    return finish_common(self, a[0], a[1], a[2], 1, a[3]);
}

static PyObject *manager_lock_common(ManagerObject *self, PyObject *h, int lock)
{
    if (manager_live(self) != 0) return NULL;
    HANDLE_T v;
    if (get_handle(h, (PyObject *)self, NULL, &v) != 0) return NULL;
    kvhal_prefix_cache *pc = kvhal_cache_manager_prefix(self->cm);
    kvhal_status st = lock ? kvhal_prefix_lock(pc, v) : kvhal_prefix_unlock(pc, v);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *manager_lock(ManagerObject *self, PyObject *h) { return manager_lock_common(self, h, 1); }
static PyObject *manager_unlock(ManagerObject *self, PyObject *h) { return manager_lock_common(self, h, 0); }

static PyObject *manager_evict(ManagerObject *self, PyObject *arg)
{
    if (manager_live(self) != 0) return NULL;
    const Py_ssize_t want = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (want == -1 && PyErr_Occurred()) return NULL;
    if (want < 0) return bad_arg("num_tokens: %zd is negative", want);
    size_t evicted = 0;
    kvhal_status st = kvhal_cache_manager_evict(self->cm, (size_t)want, &evicted);
    if (st != KVHAL_OK) return raise_status(st);
    return PyLong_FromSize_t(evicted);
}

static PyObject *manager_check_integrity(ManagerObject *self, PyObject *unused)
{
    (void)unused;
    if (manager_live(self) != 0) return NULL;
    kvhal_status st = kvhal_cache_manager_check_integrity(self->cm);
    if (st != KVHAL_OK) return raise_status(st);
    Py_RETURN_NONE;
}

static PyObject *manager_get_int(ManagerObject *self, void *which)
{
    if (manager_live(self) != 0) return NULL;
    switch ((intptr_t)which) {
    case 0: return PyLong_FromLong(kvhal_cache_manager_available(self->cm));
    case 1: return PyLong_FromLong(kvhal_cache_manager_num_free(self->cm));
    case 2: return PyLong_FromUnsignedLongLong(kvhal_cache_manager_pages_evicted(self->cm));
    default: return PyLong_FromLong(self->page_size);
    }
}

static PyObject *manager_get_prefix(ManagerObject *self, void *c)
{
    (void)c;
    if (manager_live(self) != 0) return NULL;
    PrefixObject *p = PyObject_New(PrefixObject, &PrefixType);
    if (!p) return NULL;
    p->pc = kvhal_cache_manager_prefix(self->cm);
    Py_INCREF(self);
    p->owner = (PyObject *)self;
    return (PyObject *)p;
}

static PyMethodDef manager_methods[] = {
    {"match", (PyCFunction)manager_match, METH_O,
     "match(tokens)\n--\n\nmatch + lock: (handle, cached_len, pages: kvhal.Pages). Pass the handle to cache_finished "
     "(or unlock it after freeing the request's own pages)."},
    {"lock", (PyCFunction)manager_lock, METH_O, "lock(handle)\n--\n\nOne more lock on the handle's path."},
    {"unlock", (PyCFunction)manager_unlock, METH_O, "unlock(handle)\n--\n\nUndoes one lock."},
    {"allocate", (PyCFunction)manager_allocate, METH_O,
     "allocate(n)\n--\n\nn pages (evicting when free pages run short), all or nothing: kvhal.Pages."},
    {"free", (PyCFunction)manager_free, METH_O, "free(pages)\n--\n\nGives pages back."},
    {"cache_finished", (PyCFunction)(void (*)(void))manager_finished, METH_FASTCALL | METH_KEYWORDS,
     "cache_finished(tokens, pages, handle)\n--\n\nA request finished: inserts its page-aligned tokens, frees "
     "duplicate and partial pages, unlocks handle."},
    {"cache_finished_suffix", (PyCFunction)(void (*)(void))manager_finished_suffix, METH_FASTCALL | METH_KEYWORDS,
     "cache_finished_suffix(handle, tokens, pages, start=0)\n--\n\nThe same given only the tokens and pages past the "
     "match: tokens[start:] (start: the matched length, to pass the whole request's tokens without slicing them) "
     "and their pages."},
    {"evict", (PyCFunction)manager_evict, METH_O,
     "evict(num_tokens)\n--\n\nEvicts unlocked cached prefixes into the free pages; returns the tokens freed."},
    {"check_integrity", (PyCFunction)manager_check_integrity, METH_NOARGS,
     "check_integrity()\n--\n\nfree + evictable + protected + held == total, else kvhal.Integrity."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef manager_getset[] = {
    {"available", (getter)manager_get_int, NULL, "free + evictable pages", (void *)0},
    {"num_free", (getter)manager_get_int, NULL, "free pages", (void *)1},
    {"pages_evicted", (getter)manager_get_int, NULL, "pages evicted so far", (void *)2},
    {"page_size", (getter)manager_get_int, NULL, "tokens per page", (void *)3},
    {"prefix", (getter)manager_get_prefix, NULL,
     "the manager's PrefixCache (queries, lock and unlock; insert and evict go through the manager)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ManagerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvhal.CacheManager",
    .tp_basicsize = sizeof(ManagerObject),
    .tp_dealloc = (destructor)manager_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CacheManager(total_pages, page_size=1, kind='radix')\n--\n\nFree pages plus a prefix cache: match, "
              "allocate, free, cache_finished, evict.",
    .tp_methods = manager_methods,
    .tp_getset = manager_getset,
    .tp_init = (initproc)manager_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------------------------------------------ */
/* The module                                                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
static PyMethodDef module_methods[] = {
    {"paged_caching", (PyCFunction)(void (*)(void))py_paged_caching, METH_FASTCALL | METH_KEYWORDS,
     "paged_caching(k_cache, v_cache, k, v, slot_mapping, k_scale=1.0, v_scale=1.0, stream=None)\n--\n\n"
     "Writes k and v into the caches (in place) at the slots of slot_mapping; the C API's order and rules. "
     "Asynchronous on GPUs: an out-of-range slot is reported by check_errors."},
    {"copy_blocks", (PyCFunction)(void (*)(void))py_copy_blocks, METH_FASTCALL | METH_KEYWORDS,
     "copy_blocks(caches, pairs, stream=None)\n--\n\nCopies whole blocks src -> dst in every cache; pairs is an "
     "(n, 2) integer array or a sequence of (src, dst)."},
    {"tensor_copy", (PyCFunction)(void (*)(void))py_tensor_copy, METH_FASTCALL | METH_KEYWORDS,
     "tensor_copy(dst, src, stream=None)\n--\n\ndst = src elementwise (same shape and dtype, one device)."},
    {"empty", (PyCFunction)(void (*)(void))py_empty, METH_FASTCALL | METH_KEYWORDS,
     "empty(shape, dtype='f32', device='cpu:0')\n--\n\nA zeroed contiguous kvhal.Tensor that kvhal owns."},
    {"dlpack_path", (PyCFunction)py_dlpack_path, METH_O,
     "dlpack_path(array)\n--\n\nHow kvhal imports this array: 'kvhal.Tensor' (a view made once), 'c_exchange_api' (its "
     "type offers the DLPack C exchange API: no Python call per argument) or '__dlpack__' (a capsule per call). "
     "On a GPU, an exchange-API array whose producer works on another stream than the call's (None: the legacy "
     "default) goes through __dlpack__ for that call (the producer then orders its stream before ours)."},
    {"_time_paged_caching", (PyCFunction)(void (*)(void))py_time_paged_caching, METH_FASTCALL | METH_KEYWORDS,
     "_time_paged_caching(k_cache, v_cache, k, v, slot_mapping, reps, stream=None)\n--\n\nBenchmark helper: "
     "mean host ns of reps kvhal_paged_caching calls made in C on arguments imported once."},
    {"from_dlpack", (PyCFunction)py_from_dlpack, METH_O,
     "from_dlpack(array)\n--\n\nA zero-copy kvhal.Tensor view of a DLPack array (keeps it alive)."},
    {"devices", (PyCFunction)py_devices, METH_NOARGS,
     "devices()\n--\n\nEvery present device: a list of dicts (device, name, backend, platform, total_memory, "
     "free_memory, compute_units, peer_access)."},
    {"synchronize", (PyCFunction)(void (*)(void))py_synchronize, METH_FASTCALL | METH_KEYWORDS,
     "synchronize(device='cpu:0')\n--\n\nWaits for the device and raises kvhal.DeviceFault for a kernel fault."},
    {"check_errors", (PyCFunction)(void (*)(void))py_check_errors, METH_FASTCALL | METH_KEYWORDS,
     "check_errors(device='cpu:0', stream=None)\n--\n\nRaises kvhal.DeviceFault if a kernel skipped out-of-range "
     "indices; with a stream, waits for that stream only."},
    {"last_error", (PyCFunction)py_last_error, METH_NOARGS,
     "last_error()\n--\n\nThis thread's last kvhal error message."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kvhal._kvhal",
                                        "kvhal's C extension (use the kvhal package).", -1, module_methods,
                                        NULL, NULL, NULL, NULL};

#define INTERN(var, text)                                                                                      \
    do {                                                                                                        \
        if (!((var) = PyUnicode_InternFromString(text))) return NULL;                                          \
    } while (0)

PyMODINIT_FUNC PyInit__kvhal(void);
PyMODINIT_FUNC PyInit__kvhal(void)
{
    INTERN(s_dlpack, "__dlpack__");
    INTERN(s_dlpack_device, "__dlpack_device__");
    INTERN(s_stream, "stream");
    INTERN(s_max_version, "max_version");
    INTERN(s_cuda_stream_proto, "__cuda_stream__");
    INTERN(s_cuda_stream_attr, "cuda_stream");
    INTERN(s_xapi, "__dlpack_c_exchange_api__");
    INTERN(s_xapi_old, "__c_dlpack_exchange_api__");
    if (!(g_max_version = Py_BuildValue("(ii)", KVHAL_PY_DLPACK_MAJOR, KVHAL_PY_DLPACK_MINOR))) return NULL;
    if (!(g_kw_stream = PyTuple_Pack(1, s_stream)) || !(g_kw_max = PyTuple_Pack(1, s_max_version)) ||
        !(g_kw_stream_max = PyTuple_Pack(2, s_stream, s_max_version)))
        return NULL;
    PyObject *arr = PyImport_ImportModule("array");
    if (!arr) return NULL;
    g_array_type = PyObject_GetAttrString(arr, "array");
    Py_DECREF(arr);
    if (!g_array_type) return NULL;

    PyTypeObject *types[] = {&TensorType, &StreamType, &PrefixType, &HandleType, &ManagerType, &PagesType};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyType_Ready(types[i]) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    const char *tnames[] = {"Tensor", "Stream", "PrefixCache", "PrefixHandle", "CacheManager", "Pages"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        Py_INCREF(types[i]);
        if (PyModule_AddObject(m, tnames[i], (PyObject *)types[i]) < 0) return NULL;
    }
    g_error = PyErr_NewExceptionWithDoc("kvhal.Error",
                                        "A kvhal call failed; .status is the status name, the message is "
                                        "kvhal_last_error().",
                                        NULL, NULL);
    if (!g_error || PyObject_SetAttrString(g_error, "status", Py_None) < 0) return NULL;
    Py_INCREF(g_error);
    if (PyModule_AddObject(m, "Error", g_error) < 0) return NULL;
    for (int st = 1; st < PY_STATUS_N; st++) {
        const char *sn = kvhal_status_name((kvhal_status)st); /* "KVHAL_INVALID_ARGUMENT" */
        char cname[64], qual[80];
        camel(sn + 6, cname, sizeof cname);
        snprintf(qual, sizeof qual, "kvhal.%s", cname);
        PyObject *bases = st == KVHAL_INVALID_ARGUMENT ? PyTuple_Pack(2, g_error, PyExc_ValueError)
                          : st == KVHAL_OUT_OF_RANGE    ? PyTuple_Pack(2, g_error, PyExc_IndexError)
                          : st == KVHAL_OUT_OF_MEMORY   ? PyTuple_Pack(2, g_error, PyExc_MemoryError)
                                                        : PyTuple_Pack(1, g_error);
        if (!bases) return NULL;
        PyObject *dict = Py_BuildValue("{s:s,s:i}", "status", sn, "code", st);
        g_status_error[st] = dict ? PyErr_NewExceptionWithDoc(qual, kvhal_status_string((kvhal_status)st), bases, dict)
                                  : NULL;
        Py_DECREF(bases);
        Py_XDECREF(dict);
        if (!g_status_error[st]) return NULL;
        Py_INCREF(g_status_error[st]);
        if (PyModule_AddObject(m, cname, g_status_error[st]) < 0) return NULL;
    }
    PyModule_AddIntConstant(m, "STREAM_LEGACY", 1);
    PyModule_AddIntConstant(m, "STREAM_PER_THREAD", 2);
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d.%d", KVHAL_VERSION_MAJOR, KVHAL_VERSION_MINOR, KVHAL_VERSION_PATCH);
    PyModule_AddStringConstant(m, "__version__", ver);
    return m;
}

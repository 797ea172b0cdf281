/* dlpack.c — arrays in (the exchange API, __dlpack__ capsules, the wrap cache) and capsules out. */
#include "dlpack.h"

#include <stdint.h>
#include <string.h>

#include "stream.h"

/* A producer's code (a deleter, a capsule's destructor) may run Python code: the pending exception, if any, is kept
 * aside while it runs and put back after, so that a refusal keeps its message. An exception the producer's code
 * leaves behind is reported as one raised in a destructor (sys.unraisablehook), never returned in its place. */
typedef struct {
    PyObject *type, *value, *tb;
} kept_exception;

static void keep_exception(kept_exception *k) { PyErr_Fetch(&k->type, &k->value, &k->tb); }

static void restore_exception(kept_exception *k)
{
    if (PyErr_Occurred()) PyErr_WriteUnraisable(NULL);
    PyErr_Restore(k->type, k->value, k->tb);
}

/* Drops a reference to a producer's capsule (its destructor may run), the pending exception kept. */
static void capsule_drop(PyObject *cap)
{
    kept_exception k;
    keep_exception(&k);
    Py_DECREF(cap);
    restore_exception(&k);
}

void kvpy_taken_release(kvpy_taken *tk)
{
    if (!tk->managed) return;
    kept_exception k;
    keep_exception(&k);
    if (tk->versioned) {
        DLManagedTensorVersioned *m = tk->managed;
        if (m->deleter) m->deleter(m);
    } else {
        DLManagedTensor *m = tk->managed;
        if (m->deleter) m->deleter(m);
    }
    tk->managed = NULL;
    restore_exception(&k);
}

/* ---- devices ---- */
/* DLPack device type -> kvhal device. Host-pinned memory (CUDA/ROCm host) is CPU memory to kvhal. */
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

int kvpy_dl_device_type(kvhal_device d)
{
    switch (d.type) {
    case KVHAL_DEVICE_CPU: return kDLCPU;
    case KVHAL_DEVICE_CUDA: return kDLCUDA;
    case KVHAL_DEVICE_HIP: return kDLROCM;
    case KVHAL_DEVICE_OPENCL: return kDLOpenCL;
    default: return kDLExtDev;
    }
}

/* ---- the wrap cache ----
 * On host and CUDA/HIP memory a wrap holds nothing of the memory (kvhal_buffer_wrap has no backend step there), so
 * a remembered wrap of the same range is the same buffer, and an engine's caches, K/V and slot tensors come back at
 * the same addresses every step. OpenCL wraps retain the cl_mem and are made per call. */
static kvhal_status wrap_cached(kvpy_state *st, kvhal_device dev, void *data, size_t bytes, kvpy_import *out)
{
    kvpy_wrap_entry *w = st->wraps;
    for (int i = 0; i < KVPY_WRAP_MAX; i++)
        if (w[i].buf && w[i].data == data && w[i].bytes == bytes && w[i].dev.type == dev.type &&
            w[i].dev.id == dev.id) {
            w[i].inuse++;
            out->buf = w[i].buf;
            out->wrap_slot = i + 1;
            return KVHAL_OK;
        }
    kvhal_status rc = kvhal_buffer_wrap(dev, data, bytes, &out->buf);
    if (rc != KVHAL_OK) return rc;
    for (int k = 0; k < KVPY_WRAP_MAX; k++) {
        const unsigned i = (st->wrap_next + (unsigned)k) % KVPY_WRAP_MAX;
        if (w[i].inuse) continue;
        if (w[i].buf) (void)kvhal_buffer_destroy(w[i].buf);
        w[i].dev = dev;
        w[i].data = data;
        w[i].bytes = bytes;
        w[i].buf = out->buf;
        w[i].inuse = 1;
        out->wrap_slot = (int)i + 1;
        st->wrap_next = i + 1;
        break;
    } /* every entry in use: this wrap stays the call's own */
    return KVHAL_OK;
}

void kvpy_wrap_cache_free(kvpy_state *st)
{
    for (int i = 0; i < KVPY_WRAP_MAX; i++) {
        if (st->wraps[i].buf && !st->wraps[i].inuse) (void)kvhal_buffer_destroy(st->wraps[i].buf);
        st->wraps[i].buf = NULL;
    }
}

void kvpy_import_release(kvpy_state *st, kvpy_import *a)
{
    if (a->wrap_slot) st->wraps[a->wrap_slot - 1].inuse--;
    else if (a->buf) (void)kvhal_buffer_destroy(a->buf);
    a->buf = NULL;
    a->wrap_slot = 0;
    kvpy_taken_release(&a->taken);
}

/* ---- the DLPack C exchange API ----
 * Looked up once per type and remembered with the type's version tag: assigning or deleting the attribute on the
 * type (PyType_Modified) changes the tag, and the next call looks again. A type without the API, or whose table has
 * no major version 1 in its chain, is remembered as such (NULL). */
static const kvpy_xapi *xapi_resolve(kvpy_state *st, PyTypeObject *tp, PyObject **holder)
{
    *holder = NULL;
    /* on the type, not the instance (the specification's rule); once per type and version tag, so the public
     * attribute lookup's cost does not matter */
    PyObject *attr = PyObject_GetAttr((PyObject *)tp, st->s_xapi);
    if (!attr || attr == Py_None) {
        PyErr_Clear();
        Py_XDECREF(attr);
        attr = PyObject_GetAttr((PyObject *)tp, st->s_xapi_old);
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

const kvpy_xapi *kvpy_xapi_of(kvpy_state *st, PyTypeObject *tp)
{
    int i = 0;
    for (; i < st->xapi_n; i++)
        if (st->xapi[i].tp == tp) {
            if (st->xapi[i].tag && st->xapi[i].tag == tp->tp_version_tag) return st->xapi[i].api;
            break;
        }
    PyObject *holder;
    const kvpy_xapi *api = xapi_resolve(st, tp, &holder);
    if (i == st->xapi_n) {
        if (st->xapi_n == KVPY_XAPI_MAX) { /* not remembered: looked up on every call (correct, slower) */
            Py_XDECREF(holder);
            return api;
        }
        Py_INCREF(tp);
        st->xapi[i].tp = tp;
        st->xapi[i].holder = NULL;
        st->xapi_n++;
    }
    Py_XSETREF(st->xapi[i].holder, holder);
    st->xapi[i].api = api;
    st->xapi[i].tag = tp->tp_version_tag; /* the lookup gave the type a tag if it can have one */
    return api;
}

/* The producer's current stream on dl's device: asked once per call and device (the thread is part of the key: a
 * producer's current stream is per thread, and another thread may run a call while a __dlpack__ fallback lets it).
 * 0, or -1 with an exception set. */
static int producer_stream(kvpy_state *st, const kvpy_xapi *api, const DLTensor *dl, void **cur)
{
    PyThreadState *ts = PyThreadState_Get();
    kvpy_cws_entry *c = &st->cws;
    if (c->serial == st->call_serial && c->ts == ts && c->api == api && c->type == (int)dl->device.device_type &&
        c->id == (int)dl->device.device_id) {
        *cur = c->stream;
        return 0;
    }
    *cur = NULL;
    if (api->current_work_stream(dl->device.device_type, dl->device.device_id, cur) != 0) return -1;
    c->serial = st->call_serial;
    c->ts = ts;
    c->api = api;
    c->type = (int)dl->device.device_type;
    c->id = (int)dl->device.device_id;
    c->stream = *cur;
    return 0;
}

static int finish_import(kvpy_state *st, const DLTensor *dl, uint64_t flags, const char *arg, int writable, int mode,
                         kvpy_import *out);

/* Imports through the exchange API (no synchronisation: the producer's current stream is noted for
 * kvpy_call_stream). 1: done; -1: error set. */
static int import_xapi(kvpy_state *st, PyObject *obj, const kvpy_xapi *api, const char *arg, int writable, int mode,
                       kvpy_import *out)
{
    DLTensor borrowed;
    const DLTensor *dl;
    uint64_t flags = 0;
    if (!(mode & KVPY_IMPORT_KEEP) && api->dltensor_from_py_object_no_sync) {
        if (api->dltensor_from_py_object_no_sync(obj, &borrowed) != 0) goto failed;
        dl = &borrowed;
    } else {
        DLManagedTensorVersioned *m = NULL;
        if (api->managed_tensor_from_py_object_no_sync(obj, &m) != 0) goto failed;
        if (!m) {
            kvpy_bad_arg(st, "%s: the %s's DLPack exchange API gave no tensor", arg, Py_TYPE(obj)->tp_name);
            return -1;
        }
        out->taken.managed = m;
        out->taken.versioned = 1;
        if (m->version.major != KVHAL_PY_DLPACK_MAJOR) {
            const unsigned major = m->version.major;
            kvpy_taken_release(&out->taken);
            kvpy_bad_arg(st, "%s: DLPack major version %u is not %d", arg, major, KVHAL_PY_DLPACK_MAJOR);
            return -1;
        }
        dl = &m->dl_tensor;
        flags = m->flags;
    }
    /* the producer's current stream, which kvpy_call_stream orders before the call's stream (or uses, when the
     * caller gave none) */
    if (dl->device.device_type == kDLCUDA || dl->device.device_type == kDLROCM) {
        void *cur;
        if (producer_stream(st, api, dl, &cur) != 0) {
            kvpy_taken_release(&out->taken);
            goto failed;
        }
        out->producer = KVPY_PRODUCER_XAPI;
        out->producer_stream = cur;
    }
    return finish_import(st, dl, flags, arg, writable, mode, out) == 0 ? 1 : -1;
failed:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the DLPack exchange API failed without a message");
    kvpy_prefix_error(arg); /* name the argument, keep the producer's exception type */
    return -1;
}

/* ---- __dlpack__ ---- */
static int type_unversioned(kvpy_state *st, PyTypeObject *tp)
{
    for (int i = 0; i < st->no_versioned_n; i++)
        if (st->no_versioned[i] == tp) return 1;
    return 0;
}

/* __dlpack__ refused the stream it was given (the exception pending): 1 to ask again for the legacy default stream
 * (*stream_int set), 0 to ask again without a stream (a host array), -1 to give up (the exception pending again). */
static int after_refused_stream(kvpy_state *st, PyObject *obj, intptr_t *stream_int, int *legacy_retry)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *dv = PyObject_CallMethodNoArgs(obj, st->s_dlpack_device);
    long dl_type = -1;
    if (dv && PyTuple_Check(dv) && PyTuple_GET_SIZE(dv) == 2) dl_type = PyLong_AsLong(PyTuple_GET_ITEM(dv, 0));
    Py_XDECREF(dv);
    PyErr_Clear();
    const int gpu = dl_type == kDLCUDA || dl_type == kDLROCM;
    if (gpu && *stream_int == 2 && !*legacy_retry) {
        /* a producer without the per-thread default stream (PyTorch refuses 2): ask it to order its work before the
         * legacy default stream instead, with which the per-thread default stream synchronizes */
        *legacy_retry = 1;
        *stream_int = 1;
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return 1;
    }
    if (gpu || dl_type < 0) {
        PyErr_Restore(type, value, tb);
        return -1;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return 0;
}

/* The capsule of obj.__dlpack__, asked versioned first. No __dlpack_device__ call on the way in (it costs PyTorch
 * microseconds): the capsule carries the device. The consumer's stream goes to the producer only when the caller
 * gave one (stream_int != 0; the protocol's default for None is the legacy stream, which is also ours). A producer
 * that refuses a stream (NumPy: host arrays take none) is asked again without it once __dlpack_device__ says it is
 * not a GPU's. NULL with an exception set on failure. */
static PyObject *call_dlpack(kvpy_state *st, PyObject *obj, const char *arg, intptr_t stream_int)
{
    PyObject *cap = NULL;
    PyObject *callargs[3] = {obj, NULL, NULL}; /* self, then the keyword values */
    int with_stream = stream_int != 0, legacy_retry = 0;
    for (int attempt = type_unversioned(st, Py_TYPE(obj)) ? 1 : 0; attempt < 2 && !cap; attempt++) {
        Py_ssize_t nk = 0;
        PyObject *names[2];
        PyObject *stream_obj = NULL;
        if (with_stream) {
            stream_obj = PyLong_FromSsize_t((Py_ssize_t)stream_int);
            if (!stream_obj) break;
            callargs[1 + nk] = stream_obj;
            names[nk++] = st->s_stream;
        }
        if (attempt == 0) {
            callargs[1 + nk] = st->max_version;
            names[nk++] = st->s_max_version;
        }
        PyObject *kwargs = NULL;
        if (nk == 2) kwargs = st->kw_stream_max;
        else if (nk == 1) kwargs = names[0] == st->s_stream ? st->kw_stream : st->kw_max;
        cap = PyObject_VectorcallMethod(st->s_dlpack, callargs, 1, kwargs); /* no bound method made */
        Py_XDECREF(stream_obj);
        if (cap) break;
        if (PyErr_ExceptionMatches(PyExc_AttributeError) && !PyObject_HasAttr(obj, st->s_dlpack)) {
            PyErr_Clear();
            return kvpy_bad_arg(st, "%s: a %s is not a DLPack array (no __dlpack__)", arg, Py_TYPE(obj)->tp_name);
        }
        if (attempt == 0 && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear(); /* a pre-1.0 producer: no max_version keyword */
            if (st->no_versioned_n < KVPY_NO_VERSIONED_MAX) {
                Py_INCREF(Py_TYPE(obj));
                st->no_versioned[st->no_versioned_n++] = Py_TYPE(obj);
            }
        } else if (with_stream) {
            const int r = after_refused_stream(st, obj, &stream_int, &legacy_retry);
            if (r < 0) break;
            if (r == 0) with_stream = 0;
            attempt--; /* the same attempt again, with the legacy stream or without one */
        } else {
            break;
        }
    }
    return cap;
}

/* Takes the tensor out of a __dlpack__ capsule (renamed "used_..."; the reference to cap is dropped). */
static int take_capsule(kvpy_state *st, PyObject *cap, const char *arg, kvpy_import *out, DLTensor **dl,
                        uint64_t *flags)
{
    int rc = 0;
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (m->version.major != KVHAL_PY_DLPACK_MAJOR) {
            kvpy_bad_arg(st, "%s: DLPack major version %u is not %d", arg, m->version.major, KVHAL_PY_DLPACK_MAJOR);
            rc = -1;
        } else if (PyCapsule_SetName(cap, "used_dltensor_versioned") != 0) {
            rc = -1;
        } else {
            out->taken.managed = m;
            out->taken.versioned = 1;
            *dl = &m->dl_tensor;
            *flags = m->flags;
        }
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        if (PyCapsule_SetName(cap, "used_dltensor") != 0) {
            rc = -1;
        } else {
            out->taken.managed = m;
            *dl = &m->dl_tensor;
            *flags = 0;
        }
    } else {
        kvpy_bad_arg(st, "%s: __dlpack__ returned no DLPack capsule", arg);
        rc = -1;
    }
    capsule_drop(cap); /* renamed: its destructor leaves the tensor to us (and a refusal's exception stays) */
    return rc;
}

static int import_any(kvpy_state *st, PyObject *obj, const char *arg, int writable, intptr_t stream_int, int mode,
                      kvpy_import *out)
{
    memset(out, 0, sizeof *out);
    if (PyObject_TypeCheck(obj, st->tensor_type)) {
        kvpy_tensor_object *t = (kvpy_tensor_object *)obj;
        if (writable && t->readonly) {
            kvpy_bad_arg(st, "%s: the array is read-only (its producer said so) and is written by this call", arg);
            return -1;
        }
        out->t = t->t;
        return 0;
    }
    const kvpy_xapi *api = kvpy_xapi_of(st, Py_TYPE(obj));
    if (api) {
        const int r = import_xapi(st, obj, api, arg, writable, mode, out);
        if (r != 0) return r < 0 ? -1 : 0;
    }
    const int torch = kvpy_is_torch_tensor(st, obj);
    PyObject *cap = call_dlpack(st, obj, arg, torch ? -1 : stream_int);
    if (!cap) return -1;
    DLTensor *dl = NULL;
    uint64_t flags = 0;
    if (take_capsule(st, cap, arg, out, &dl, &flags) != 0) return -1;
    if (torch && (dl->device.device_type == kDLCUDA || dl->device.device_type == kDLROCM))
        out->producer = KVPY_PRODUCER_TORCH;
    return finish_import(st, dl, flags, arg, writable, mode, out);
}

int kvpy_import_any(kvpy_state *st, PyObject *obj, const char *arg, int writable, intptr_t stream_int, int mode,
                    kvpy_import *out)
{
    if (import_any(st, obj, arg, writable, stream_int, mode, out) == 0) return 0;
    /* every failure a kvhal.Error: a producer's own exception (torch's BufferError, RuntimeError) keeps its
     * message, named after the argument */
    if (!PyErr_ExceptionMatches(st->error) && PyErr_ExceptionMatches(PyExc_Exception) &&
        !PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PyObject *msg = value ? PyObject_Str(value) : NULL;
        const char *text = msg ? PyUnicode_AsUTF8(msg) : NULL;
        if (!text) PyErr_Clear();
        const size_t al = strlen(arg); /* the exchange API's failures already start with the argument's name */
        if (text && !strncmp(text, arg, al) && text[al] == ':' && text[al + 1] == ' ') text += al + 2;
        kvpy_bad_arg(st, "%s: the producer refused the export: %s: %s", arg,
                     type ? ((PyTypeObject *)type)->tp_name : "?", text ? text : "?");
        PyObject *t2, *v2, *tb2; /* the producer's exception as the cause */
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 && value) PyException_SetCause(v2, Py_NewRef(value));
        PyErr_Restore(t2, v2, tb2);
        Py_XDECREF(msg);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    return -1;
}

int kvpy_call_stream(kvpy_state *st, PyObject *stream, intptr_t native, kvhal_device dev, const kvpy_import *t, int n,
                     kvhal_stream **s)
{
    *s = NULL;
    if (!kvpy_is_gpu(dev)) return kvpy_stream_for(st, stream, native, dev, s);
    int told = 0;
    intptr_t producer = 0;
    for (int i = 0; i < n && !told; i++)
        if (t[i].producer == KVPY_PRODUCER_XAPI) {
            producer = (intptr_t)t[i].producer_stream;
            told = 1;
        }
    for (int i = 0; i < n && !told; i++)
        if (t[i].producer == KVPY_PRODUCER_TORCH) {
            if (kvpy_torch_current_stream(st, dev, &producer) != 0) return -1;
            told = 1;
        }
    if (!told) return kvpy_stream_for(st, stream, native, dev, s); /* the producers ordered themselves */
    if (!stream || stream == Py_None) return kvpy_stream_native(st, producer, dev, s); /* torch users' default */
    if (kvpy_stream_for(st, stream, native, dev, s) != 0) return -1;
    return kvpy_same_native(producer, native) ? 0 : kvpy_order_after(st, dev, producer, *s);
}

/* ---- a DLTensor as a kvhal tensor ---- */
/* The dtype of dl; KVPY_IMPORT_RAW: any 1, 2, 4 or 8-byte type as a kvhal dtype of that size (host copies move
 * bytes); KVPY_IMPORT_BYTES: 8-bit integers as fp8_e4m3 with *bytes set. */
static int import_dtype(kvpy_state *st, const DLTensor *dl, const char *arg, int mode, kvhal_dtype *dt, int *bytes)
{
    const DLDataType t = dl->dtype;
    const int raw = mode & KVPY_IMPORT_RAW;
    if (kvpy_dtype_from_dl(t, dt) == 0) return 0;
    if ((mode & KVPY_IMPORT_BYTES) && t.lanes == 1 && t.bits == 8 && (t.code == kDLUInt || t.code == kDLInt)) {
        *dt = KVHAL_FP8_E4M3; /* one byte per element; the caller sets the fp8 format */
        *bytes = 1;
        return 0;
    }
    if (raw && t.lanes == 1 && t.bits % 8 == 0 && t.bits <= 64 && kvpy_dtype_of_size(t.bits / 8, dt) == 0) return 0;
    kvpy_bad_arg(st, "%s: DLPack dtype (code %u, %u bits, %u lanes) is not one kvhal has (%s)", arg, (unsigned)t.code,
                 (unsigned)t.bits, (unsigned)t.lanes, KVPY_DTYPE_NAMES);
    return -1;
}

/* Shape and strides into t, checked as kvhal_tensor_make would (shape and strides >= 0, no 64-bit overflow, the
 * byte offset a multiple of the element size); *bytes: the bytes the view spans from the buffer's start, so every
 * element lies inside a buffer of that size by construction (kvhal_tensor_make's second pass over the same checks
 * cost a fifth of an argument's import). The byte offset and the span are at most PTRDIFF_MAX (no object is
 * larger, and pointer arithmetic past it is undefined). *numel: the element count. 0, or -1 with an exception
 * set. */
static int import_layout(kvpy_state *st, const DLTensor *dl, const char *arg, size_t esz, kvhal_tensor *t,
                         uint64_t *bytes, int64_t *numel)
{
    int64_t run = 1, last = 0; /* last: the farthest element's index in elements */
    int overflow = 0;
    *numel = 1;
    if (dl->byte_offset > (uint64_t)PTRDIFF_MAX) {
        kvpy_bad_arg(st, "%s: byte offset %llu is past PTRDIFF_MAX", arg, (unsigned long long)dl->byte_offset);
        return -1;
    }
    for (int i = dl->ndim - 1; i >= 0; i--) {
        const int64_t n = dl->shape[i], sd = dl->strides ? dl->strides[i] : run;
        if (n < 0) {
            kvpy_bad_arg(st, "%s: dim %d has a negative size %lld", arg, i, (long long)n);
            return -1;
        }
        if (sd < 0) {
            kvpy_bad_arg(st, "%s: stride %lld of dim %d is negative (kvhal takes strides >= 0)", arg, (long long)sd, i);
            return -1;
        }
        t->shape[i] = n;
        t->strides[i] = sd;
        int64_t span;
        overflow |=
            (int)__builtin_mul_overflow(run, n > 0 ? n : 1, &run) | (int)__builtin_mul_overflow(*numel, n, numel);
        if (n > 0)
            overflow |= (int)__builtin_mul_overflow(n - 1, sd, &span) | (int)__builtin_add_overflow(last, span, &last);
    }
    uint64_t b = 0;
    if (!overflow && *numel > 0)
        overflow = __builtin_mul_overflow((uint64_t)last + 1, (uint64_t)esz, &b) ||
                   __builtin_add_overflow(b, (uint64_t)dl->byte_offset, &b);
    else if (!overflow)
        b = dl->byte_offset;
    if (overflow) {
        kvpy_bad_arg(st, "%s: shape and strides overflow 64-bit byte offsets", arg);
        return -1;
    }
    if (b > (uint64_t)PTRDIFF_MAX) {
        kvpy_bad_arg(st, "%s: the view spans %llu bytes, past PTRDIFF_MAX", arg, (unsigned long long)b);
        return -1;
    }
    if (dl->byte_offset % esz) {
        kvpy_bad_arg(st, "%s: byte offset %llu is not a multiple of the element size %zu", arg,
                     (unsigned long long)dl->byte_offset, esz);
        return -1;
    }
    for (int i = dl->ndim; i < KVHAL_MAX_DIMS; i++) {
        t->shape[i] = 1;
        t->strides[i] = 0;
    }
    *bytes = b;
    return 0;
}

/* Checks the DLTensor and fills out->t (no buffer yet). 0, or -1 with an exception set. */
static int import_view(kvpy_state *st, const DLTensor *dl, uint64_t flags, const char *arg, int writable, int mode,
                       kvpy_import *out, kvhal_device *dev, uint64_t *bytes, int64_t *numel)
{
    if (dl->device.device_id < 0 || dl_device_to_kvhal((int)dl->device.device_type, (int)dl->device.device_id, dev)) {
        kvpy_bad_arg(st, "%s: DLPack device (%d, %d) is not a device type kvhal has", arg,
                     (int)dl->device.device_type, (int)dl->device.device_id);
        return -1;
    }
    if (writable && (flags & DLPACK_FLAG_BITMASK_READ_ONLY)) {
        kvpy_bad_arg(st, "%s: the array is read-only (its producer said so) and is written by this call", arg);
        return -1;
    }
    kvhal_dtype dt;
    if (import_dtype(st, dl, arg, mode, &dt, &out->bytes) != 0) return -1;
    if (dl->ndim < 1 || dl->ndim > KVHAL_MAX_DIMS) {
        kvpy_bad_arg(st, "%s: %d dimensions (kvhal takes 1 to %d)", arg, (int)dl->ndim, KVHAL_MAX_DIMS);
        return -1;
    }
    if (!dl->shape) { /* strides may be NULL (compact row-major), the shape never */
        kvpy_bad_arg(st, "%s: the DLPack tensor's shape is NULL for %d dimensions", arg, (int)dl->ndim);
        return -1;
    }
    if (import_layout(st, dl, arg, kvhal_dtype_size(dt), &out->t, bytes, numel) != 0) return -1;
    if (*numel > 0 && !dl->data) {
        kvpy_bad_arg(st, "%s: the DLPack tensor's data is NULL for %lld elements", arg, (long long)*numel);
        return -1;
    }
    /* on the host, data is an address: the view must not run past the end of the address space */
    if (dev->type == KVHAL_DEVICE_CPU && *numel > 0 && (uintptr_t)dl->data > UINTPTR_MAX - (uintptr_t)*bytes) {
        kvpy_bad_arg(st, "%s: data %p plus the view's %llu bytes wraps around the address space", arg, dl->data,
                     (unsigned long long)*bytes);
        return -1;
    }
    out->t.dtype = dt;
    out->t.ndim = (int32_t)dl->ndim;
    out->t.offset = (size_t)dl->byte_offset;
    return 0;
}

/* The DLTensor (taken into out->taken, or borrowed for the call) as a kvhal tensor over a wrapped buffer. */
static int finish_import(kvpy_state *st, const DLTensor *dl, uint64_t flags, const char *arg, int writable, int mode,
                         kvpy_import *out)
{
    kvhal_device dev;
    uint64_t bytes64;
    int64_t numel;
    if (import_view(st, dl, flags, arg, writable, mode, out, &dev, &bytes64, &numel) != 0) {
        PyObject *type, *value, *tb; /* released after the message (dl dies with the taken tensor) */
        PyErr_Fetch(&type, &value, &tb);
        kvpy_taken_release(&out->taken);
        PyErr_Restore(type, value, tb);
        return -1;
    }
    size_t bytes = (size_t)bytes64;
    void *data = dl->data;
    if (numel == 0 && dev.type == KVHAL_DEVICE_CPU && (!data || !bytes)) {
        data = &st->empty_byte;
        bytes = 1;
        out->t.offset = 0;
    }
    kvhal_status rc = !(mode & KVPY_IMPORT_KEEP) && (dev.type == KVHAL_DEVICE_CPU || kvpy_is_gpu(dev))
                          ? wrap_cached(st, dev, data, bytes, out)
                          : kvhal_buffer_wrap(dev, data, bytes, &out->buf);
    out->t.buffer = out->buf;
    if (rc == KVHAL_OK && (mode & KVPY_IMPORT_KEEP)) rc = kvhal_tensor_validate(&out->t); /* kept views: in full */
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        kvpy_prefix_error(arg); /* name the Python argument as well */
        kvpy_import_release(st, out);
        return -1;
    }
    return 0;
}

/* ---- capsules out ---- */
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

PyObject *kvpy_export(PyObject *owner, const kvhal_tensor *t, int versioned, int readonly)
{
    /* the exported type is checked against the dtype table: a consumer reads bits * lanes / 8 bytes per element
     * and must never read past the tensor's memory */
    const DLDataType dt = kvpy_dtype_to_dl(t->dtype);
    if (!kvpy_dtype(t->dtype) || (size_t)dt.bits * dt.lanes != 8 * kvhal_dtype_size(t->dtype))
        return kvpy_raise_msg(kvpy_state_of(owner), KVHAL_INTERNAL,
                              "__dlpack__: dtype %d exports as %u-bit DLPack elements, not its %zu bytes",
                              (int)t->dtype, (unsigned)dt.bits * dt.lanes, kvhal_dtype_size(t->dtype));
    export_t *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    const kvhal_device dev = kvhal_buffer_device(t->buffer);
    DLTensor *dl = versioned ? &e->m.v.dl_tensor : &e->m.u.dl_tensor;
    dl->data = kvhal_buffer_native(t->buffer);
    dl->device.device_type = (DLDeviceType)kvpy_dl_device_type(dev);
    dl->device.device_id = dev.id;
    dl->ndim = t->ndim;
    dl->dtype = dt;
    for (int i = 0; i < t->ndim; i++) {
        e->shape[i] = t->shape[i];
        e->strides[i] = t->strides[i];
    }
    dl->shape = e->shape;
    dl->strides = e->strides;
    dl->byte_offset = t->offset;
    /* Host consumers such as NumPy want the data pointer itself; byte_offset stays for devices where data is a
     * handle (OpenCL). */
    if (dev.type == KVHAL_DEVICE_CPU) {
        dl->data = (char *)dl->data + t->offset;
        dl->byte_offset = 0;
    }
    Py_INCREF(owner);
    e->owner = owner;
    PyObject *cap;
    if (versioned) {
        e->m.v.version.major = KVHAL_PY_DLPACK_MAJOR;
        e->m.v.version.minor = KVHAL_PY_DLPACK_MINOR;
        e->m.v.manager_ctx = e;
        e->m.v.deleter = deleter_versioned;
        e->m.v.flags = readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
        cap = PyCapsule_New(&e->m.v, "dltensor_versioned", capsule_destructor);
    } else {
        e->m.u.manager_ctx = e;
        e->m.u.deleter = deleter_unversioned;
        cap = PyCapsule_New(&e->m.u, "dltensor", capsule_destructor);
    }
    if (!cap) {
        Py_DECREF(owner);
        PyMem_RawFree(e);
    }
    return cap;
}

/* ops.c — paged_caching, copy_blocks, tensor_copy and the device-level calls. */
#include "ops.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dlpack.h"
#include "pages.h"
#include "stream.h"

static int as_scale(kvpy_state *st, PyObject *o, const char *arg, float *out)
{
    if (!o) {
        *out = 1.0f;
        return 0;
    }
    double v = PyFloat_AsDouble(o); /* floats, ints, NumPy scalars, one-element arrays and tensors (__float__) */
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        kvpy_bad_arg(st, "%s: expected a float or a one-element tensor, got %s", arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = (float)v;
    return 0;
}

#define KVPY_TOKENS_OF_SLOTS (-2)

/* paged_caching's options past the C call's arguments: caches of 8-bit integers holding fp8 codes, and a token
 * count below k's (vLLM pads k and v past the slots it writes). */
typedef struct {
    int has_cache_dtype;
    kvhal_dtype cache_dtype;
    int64_t num_tokens; /* -1: all of k's; KVPY_TOKENS_OF_SLOTS: slot_mapping's length (set once it is imported) */
    int hnd;            /* the caches are [blocks, heads, block_size, dim] */
} paged_opts;

static int parse_paged_opts(kvpy_state *st, PyObject *cache_dtype, PyObject *num_tokens, PyObject *layout,
                            paged_opts *o)
{
    o->has_cache_dtype = cache_dtype && cache_dtype != Py_None;
    o->num_tokens = -1;
    o->hnd = 0;
    if (layout && layout != Py_None) {
        const char *l = PyUnicode_Check(layout) ? PyUnicode_AsUTF8(layout) : NULL;
        if (l && !strcmp(l, "HND")) {
            o->hnd = 1;
        } else if (!l || strcmp(l, "NHD")) {
            PyErr_Clear();
            kvpy_bad_arg(st, "layout: expected 'NHD' or 'HND'");
            return -1;
        }
    }
    if (o->has_cache_dtype) {
        if (kvpy_parse_dtype_arg(st, cache_dtype, "cache_dtype", &o->cache_dtype) != 0) return -1;
        if (kvhal_dtype_size(o->cache_dtype) != 1) {
            kvpy_bad_arg(st, "cache_dtype: '%s' is not an fp8 format (the caches' dtype when they are uint8 arrays "
                         "of fp8 codes)", kvpy_dtype(o->cache_dtype)->name);
            return -1;
        }
    }
    if (num_tokens && num_tokens != Py_None) {
        const Py_ssize_t n = PyNumber_AsSsize_t(num_tokens, PyExc_OverflowError);
        if (n == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) return -1;
            PyErr_Clear();
            kvpy_bad_arg(st, "num_tokens: expected an int, got %s", Py_TYPE(num_tokens)->tp_name);
            return -1;
        }
        if (n < 0) {
            kvpy_bad_arg(st, "num_tokens: %zd is negative", n);
            return -1;
        }
        o->num_tokens = (int64_t)n;
    }
    return 0;
}

/* v_cache None: k_cache is [blocks, 2, ...], K at index 0 of dim 1 and V at 1 (FlashInfer's single-tensor form),
 * split into two views of the same memory (t[1] owns nothing). 0, or -1 with an exception set. */
static int split_stacked(kvpy_state *st, kvpy_import t[2])
{
    kvhal_tensor kv = t[0].t;
    if (kv.ndim != 5 || kv.shape[1] != 2) {
        kvpy_bad_arg(st, "k_cache: with v_cache=None, k_cache holds both as [blocks, 2, ...] (5 dims, dim 1 of size "
                     "2); it has %d dims", (int)kv.ndim);
        return -1;
    }
    kvhal_tensor k = kv;
    k.ndim = 4;
    for (int d = 1; d < KVHAL_MAX_DIMS - 1; d++) {
        k.shape[d] = kv.shape[d + 1];
        k.strides[d] = kv.strides[d + 1];
    }
    k.shape[KVHAL_MAX_DIMS - 1] = 1;
    k.strides[KVHAL_MAX_DIMS - 1] = 0;
    t[1] = t[0];
    t[1].buf = NULL; /* t[0] releases the buffer and the producer's tensor */
    t[1].wrap_slot = 0;
    t[1].taken.managed = NULL;
    t[0].t = k;
    t[1].t = k;
    t[1].t.offset += (size_t)kv.strides[1] * kvhal_dtype_size(kv.dtype);
    return 0;
}

/* The options applied to the imported caches (t[0..1]) and k, v (t[2..3]). 0, or -1 with an exception set. */
static int apply_paged_opts(kvpy_state *st, const paged_opts *o, const char *const *names, kvpy_import t[5])
{
    for (int i = 0; o->hnd && i < 2; i++) { /* [blocks, heads, block_size, dim] as kvhal's logical order */
        if (t[i].t.ndim != 4) {
            kvpy_bad_arg(st, "%s: layout='HND' takes 4-D caches [blocks, heads, block_size, dim]", names[i]);
            return -1;
        }
        const int64_t sh = t[i].t.shape[1], sd = t[i].t.strides[1];
        t[i].t.shape[1] = t[i].t.shape[2];
        t[i].t.strides[1] = t[i].t.strides[2];
        t[i].t.shape[2] = sh;
        t[i].t.strides[2] = sd;
    }
    for (int i = 0; o->has_cache_dtype && i < 2; i++) {
        if (t[i].bytes) {
            t[i].t.dtype = o->cache_dtype;
        } else if (t[i].t.dtype != o->cache_dtype) {
            kvpy_raise_msg(st, KVHAL_DTYPE_MISMATCH, "%s: dtype %s, but cache_dtype is %s", names[i],
                           kvpy_dtype(t[i].t.dtype)->name, kvpy_dtype(o->cache_dtype)->name);
            return -1;
        }
    }
    for (int i = 2; o->num_tokens >= 0 && i < 4; i++) {
        if (t[i].t.ndim != 3 || t[i].t.shape[0] < o->num_tokens) {
            kvpy_bad_arg(st, "%s: num_tokens=%lld needs a [tokens >= %lld, heads, dim] array (it has %d dims, %lld "
                         "rows)", names[i], (long long)o->num_tokens, (long long)o->num_tokens, (int)t[i].t.ndim,
                         (long long)t[i].t.shape[0]);
            return -1;
        }
        t[i].t.shape[0] = o->num_tokens; /* the first rows: inside the array by construction */
    }
    return 0;
}

/* The five array arguments of paged caching (k_cache, v_cache, k, v, slot_mapping: a[0..4], names[0..4]) imported
 * for the stream object stream, and the kvhal stream for it on k_cache's device. *n counts the imported ones, which
 * the caller releases (kvpy_import_release) whatever this returns; -1 with a Python exception set on failure. */
static int import_paged_args(kvpy_state *st, PyObject *const *a, const char *const *names, PyObject *stream,
                             paged_opts *o, kvpy_import t[5], int *n, kvhal_stream **s)
{
    *n = 0;
    intptr_t native;
    if (kvpy_stream_int(st, stream, &native) != 0) return -1;
    const intptr_t dls = kvpy_dlpack_stream_number(stream, native);
    const int stacked = a[1] == Py_None;
    for (; *n < 5; (*n)++) {
        if (*n == 1 && stacked) {
            if (split_stacked(st, t) != 0) return -1;
            continue;
        }
        if (kvpy_import_any(st, a[*n], names[*n], *n < 2, dls, *n < 2 && o->has_cache_dtype ? KVPY_IMPORT_BYTES : 0,
                            &t[*n]) != 0)
            return -1;
    }
    if (o->num_tokens == KVPY_TOKENS_OF_SLOTS) /* vLLM's rule: as many tokens as slot_mapping has */
        o->num_tokens = t[4].t.ndim >= 1 ? t[4].t.shape[0] : 0;
    if (apply_paged_opts(st, o, names, t) != 0) return -1;
    return kvpy_call_stream(st, stream, native, kvhal_buffer_device(t[0].t.buffer), t, 5, s);
}

static PyObject *paged_call(kvpy_state *st, PyObject *const *a, const char *const *names, PyObject *stream,
                            paged_opts *o, float ks, float vs);

PyObject *kvpy_paged_caching(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    static const char *const names[] = {"k_cache", "v_cache",     "k",          "v",     "slot_mapping", "k_scale",
                                        "v_scale", "stream", "cache_dtype", "num_tokens", "layout"};
    PyObject *a[11];
    if (kvpy_parse_fast("paged_caching", args, nargs, kwnames, names, 11, 5, a) != 0) return NULL;
    paged_opts o;
    if (parse_paged_opts(st, a[8], a[9], a[10], &o) != 0) return NULL;
    float ks, vs;
    if (as_scale(st, a[5], "k_scale", &ks) != 0 || as_scale(st, a[6], "v_scale", &vs) != 0) return NULL;
    return paged_call(st, a, names, a[7], &o, ks, vs);
}

/* The imports, the C call and the releases of paged_caching and reshape_and_cache_flash: a[0..4] the arrays in
 * paged_caching's order (names: theirs), stream the stream object. */
static PyObject *paged_call(kvpy_state *st, PyObject *const *a, const char *const *names, PyObject *stream,
                            paged_opts *o, float ks, float vs)
{
    kvpy_import t[5];
    int n = 0;
    PyObject *ret = NULL;
    kvhal_stream *s;
    if (import_paged_args(st, a, names, stream, o, t, &n, &s) != 0) goto out;
    kvhal_status rc;
    if (kvhal_buffer_device(t[0].t.buffer).type == KVHAL_DEVICE_CPU && kvhal_tensor_numel(&t[2].t) >= (1 << 16)) {
        /* the CPU copies in the call: other Python threads run meanwhile (kvhal calls are thread-safe) */
        Py_BEGIN_ALLOW_THREADS
        rc = kvhal_paged_caching(&t[0].t, &t[1].t, &t[2].t, &t[3].t, &t[4].t, ks, vs, s);
        Py_END_ALLOW_THREADS
    } else {
        rc = kvhal_paged_caching(&t[0].t, &t[1].t, &t[2].t, &t[3].t, &t[4].t, ks, vs, s);
    }
    ret = rc == KVHAL_OK ? Py_NewRef(Py_None) : kvpy_raise(st, rc);
out:
    while (n-- > 0) kvpy_import_release(st, &t[n]);
    return ret;
}

/* vLLM's reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
 * stream=None) in one C call (kvhal.compat.vllm): the token count read from the imported slot_mapping, the dtype
 * name compared here, the scales read only for an fp8 cache (a GPU tensor's read synchronizes). */
PyObject *kvpy_reshape_and_cache_flash(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    static const char *const names[] = {"key",            "value",   "key_cache", "value_cache", "slot_mapping",
                                        "kv_cache_dtype", "k_scale", "v_scale",   "stream"};
    PyObject *a[9];
    if (kvpy_parse_fast("reshape_and_cache_flash", args, nargs, kwnames, names, 9, 8, a) != 0) return NULL;
    const char *fmt = PyUnicode_Check(a[5]) ? PyUnicode_AsUTF8(a[5]) : NULL;
    if (!fmt) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "kv_cache_dtype: expected a str ('auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2'), got %s",
                            Py_TYPE(a[5])->tp_name);
    }
    paged_opts o = {0, KVHAL_F32, KVPY_TOKENS_OF_SLOTS, 0};
    float ks = 1.0f, vs = 1.0f;
    if (strcmp(fmt, "auto") != 0) {
        if (!strcmp(fmt, "fp8") || !strcmp(fmt, "fp8_e4m3")) o.cache_dtype = KVHAL_FP8_E4M3;
        else if (!strcmp(fmt, "fp8_e5m2")) o.cache_dtype = KVHAL_FP8_E5M2;
        else
            return kvpy_bad_arg(st, "kv_cache_dtype: '%s' is not one of 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2'", fmt);
        o.has_cache_dtype = 1;
        if (as_scale(st, a[6], "k_scale", &ks) != 0 || as_scale(st, a[7], "v_scale", &vs) != 0) return NULL;
    }
    /* paged_caching's order (and its argument names in messages): the caches, key and value, slot_mapping */
    PyObject *const b[5] = {a[2], a[3], a[0], a[1], a[4]};
    static const char *const bnames[] = {"k_cache", "v_cache", "k", "v", "slot_mapping"};
    return paged_call(st, b, bnames, a[8], &o, ks, vs);
}

/* _time_paged_caching(k_cache, v_cache, k, v, slot_mapping, reps, stream=None): the arguments imported once, then
 * reps back-to-back kvhal_paged_caching calls timed in C; mean host ns per call. What python/bench/bench_host.py
 * compares a call from Python against (the C call, same process, same tensors). */
PyObject *kvpy_time_paged_caching(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    static const char *const names[] = {"k_cache", "v_cache", "k", "v", "slot_mapping", "reps", "stream"};
    PyObject *a[7];
    if (kvpy_parse_fast("_time_paged_caching", args, nargs, kwnames, names, 7, 6, a) != 0) return NULL;
    const long reps = PyLong_AsLong(a[5]);
    if (reps == -1 && PyErr_Occurred()) return NULL;
    if (reps < 1) return kvpy_bad_arg(st, "reps: %ld is not positive", reps);
    kvpy_import t[5];
    int n = 0;
    PyObject *ret = NULL;
    kvhal_stream *s;
    paged_opts o = {0, KVHAL_F32, -1, 0};
    if (import_paged_args(st, a, names, a[6], &o, t, &n, &s) != 0) goto out;
    struct timespec t0, t1;
    kvhal_status rc = KVHAL_OK;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < reps && rc == KVHAL_OK; i++)
        rc = kvhal_paged_caching(&t[0].t, &t[1].t, &t[2].t, &t[3].t, &t[4].t, 1.0f, 1.0f, s);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    ret = rc == KVHAL_OK ? PyFloat_FromDouble(ns / (double)reps) : kvpy_raise(st, rc);
out:
    while (n-- > 0) kvpy_import_release(st, &t[n]);
    return ret;
}

PyObject *kvpy_tensor_copy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    static const char *const names[] = {"dst", "src", "stream"};
    PyObject *a[3];
    if (kvpy_parse_fast("tensor_copy", args, nargs, kwnames, names, 3, 2, a) != 0) return NULL;
    intptr_t native;
    if (kvpy_stream_int(st, a[2], &native) != 0) return NULL;
    kvpy_import t[2];
    int n = 0;
    PyObject *ret = NULL;
    for (; n < 2; n++)
        if (kvpy_import_any(st, a[n], names[n], n == 0, kvpy_dlpack_stream_number(a[2], native), 0, &t[n]) != 0)
            goto out;
    kvhal_stream *s;
    if (kvpy_call_stream(st, a[2], native, kvhal_buffer_device(t[0].t.buffer), t, 2, &s) != 0) goto out;
    kvhal_status rc = kvhal_tensor_copy(&t[0].t, &t[1].t, s);
    ret = rc == KVHAL_OK ? Py_NewRef(Py_None) : kvpy_raise(st, rc);
out:
    while (n-- > 0) kvpy_import_release(st, &t[n]);
    return ret;
}

/* copy_blocks' pairs as one flat list when given as a sequence of (src, dst) pairs; NULL (nothing set) when they
 * are not (an integer array, flat or (n, 2), is read as it is); NULL with an exception set on failure. */
static PyObject *flat_pairs(kvpy_state *st, PyObject *pairs)
{
    if (PyObject_CheckBuffer(pairs) || !PySequence_Check(pairs) || PySequence_Size(pairs) <= 0) {
        if (PyErr_Occurred()) PyErr_Clear(); /* a sequence without a size: read as it is */
        return NULL;
    }
    PyObject *first = PySequence_GetItem(pairs, 0);
    PyObject *flat = NULL;
    if (first && PySequence_Check(first)) {
        PyObject *ps = PySequence_Fast(pairs, "pairs");
        if (ps) {
            const Py_ssize_t np_ = PySequence_Fast_GET_SIZE(ps);
            flat = PyList_New(0);
            for (Py_ssize_t i = 0; flat && i < np_; i++) {
                PyObject *p = PySequence_Fast(PySequence_Fast_GET_ITEM(ps, i), "pairs: each pair is (src, dst)");
                if (!p || PySequence_Fast_GET_SIZE(p) != 2) {
                    Py_XDECREF(p);
                    Py_CLEAR(flat);
                    if (!PyErr_Occurred()) kvpy_bad_arg(st, "pairs[%zd]: expected (src, dst)", i);
                    break;
                }
                if (PyList_Append(flat, PySequence_Fast_GET_ITEM(p, 0)) != 0 ||
                    PyList_Append(flat, PySequence_Fast_GET_ITEM(p, 1)) != 0)
                    Py_CLEAR(flat);
                Py_DECREF(p);
            }
            Py_DECREF(ps);
        }
    }
    Py_XDECREF(first);
    return flat;
}

/* The caches imported (t[0..nc), their tensors in ts) and the stream on their device: kvhal_copy_blocks. *n counts
 * the imported ones, which the caller releases. */
static int copy_blocks_on(kvpy_state *st, PyObject *seq, PyObject *stream, intptr_t native, const kvpy_ints *pr,
                          kvpy_import *t, kvhal_tensor *ts, Py_ssize_t *n)
{
    const Py_ssize_t nc = PySequence_Fast_GET_SIZE(seq);
    for (; *n < nc; (*n)++) {
        char arg[32];
        snprintf(arg, sizeof arg, "caches[%zd]", *n);
        if (kvpy_import_any(st, PySequence_Fast_GET_ITEM(seq, *n), arg, 1, kvpy_dlpack_stream_number(stream, native),
                            0, &t[*n]) != 0)
            return -1;
        ts[*n] = t[*n].t;
    }
    kvhal_stream *s;
    if (kvpy_call_stream(st, stream, native, kvhal_buffer_device(t[0].t.buffer), t, (int)nc, &s) != 0) return -1;
    kvhal_status rc = kvhal_copy_blocks(ts, (int32_t)nc, (const int64_t *)pr->data, (int32_t)(pr->n / 2), s);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    return 0;
}

/* copy_blocks(caches, pairs, stream=None): pairs (n, 2) int array or a sequence of (src, dst) pairs. */
PyObject *kvpy_copy_blocks(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    static const char *const names[] = {"caches", "pairs", "stream"};
    PyObject *a[3];
    if (kvpy_parse_fast("copy_blocks", args, nargs, kwnames, names, 3, 2, a) != 0) return NULL;
    intptr_t native;
    if (kvpy_stream_int(st, a[2], &native) != 0) return NULL;
    PyObject *seq = PySequence_Fast(a[0], "caches: expected a sequence of tensors");
    if (!seq) return NULL;
    const Py_ssize_t nc = PySequence_Fast_GET_SIZE(seq);
    kvpy_ints pr = {0};
    PyObject *flat = flat_pairs(st, a[1]);
    if ((!flat && PyErr_Occurred()) || kvpy_ints_get(st, flat ? flat : a[1], "pairs", 8, &pr) != 0) {
        Py_XDECREF(flat);
        Py_DECREF(seq);
        return NULL;
    }
    Py_XDECREF(flat);
    PyObject *ret = NULL;
    kvpy_import *t = NULL;
    kvhal_tensor *ts = NULL;
    Py_ssize_t n = 0;
    if (pr.n % 2) {
        kvpy_bad_arg(st, "pairs: %zu values is not a whole number of (src, dst) pairs", pr.n);
    } else if (nc < 1) {
        kvpy_bad_arg(st, "caches: empty");
    } else if (!(t = PyMem_Calloc((size_t)nc, sizeof *t)) || !(ts = PyMem_Calloc((size_t)nc, sizeof *ts))) {
        PyErr_NoMemory();
    } else if (copy_blocks_on(st, seq, a[2], native, &pr, t, ts, &n) == 0) {
        ret = Py_NewRef(Py_None);
    }
    while (n-- > 0) kvpy_import_release(st, &t[n]);
    PyMem_Free(t);
    PyMem_Free(ts);
    kvpy_ints_release(&pr);
    Py_DECREF(seq);
    return ret;
}

PyObject *kvpy_dlpack_path(PyObject *mod, PyObject *obj)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    if (PyObject_TypeCheck(obj, st->tensor_type)) return PyUnicode_FromString("kvhal.Tensor");
    if (kvpy_xapi_of(st, Py_TYPE(obj))) return PyUnicode_FromString("c_exchange_api");
    if (PyObject_HasAttr(obj, st->s_dlpack)) return PyUnicode_FromString("__dlpack__");
    return kvpy_bad_arg(st, "array: a %s is not a DLPack array (no __dlpack__)", Py_TYPE(obj)->tp_name);
}

/* ---- devices ---- */
static PyObject *device_entry(kvhal_device d, const kvhal_device_info *info)
{
    char name[64];
    (void)kvhal_device_format(d, name, sizeof name);
    return Py_BuildValue("{s:s,s:s,s:s,s:s,s:K,s:K,s:i,s:O}", "device", name, "name", info->name, "backend",
                         info->backend, "platform", info->platform, "total_memory",
                         (unsigned long long)info->total_memory, "free_memory", (unsigned long long)info->free_memory,
                         "compute_units", (int)info->compute_units, "peer_access",
                         info->peer_access ? Py_True : Py_False);
}

PyObject *kvpy_devices(PyObject *mod, PyObject *unused)
{
    (void)unused;
    kvpy_state *st = kvpy_state_of_module(mod);
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
                return kvpy_raise(st, KVHAL_BACKEND_ERROR);
            }
            PyObject *e = device_entry(d, &info);
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

PyObject *kvpy_synchronize(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    static const char *const names[] = {"device"};
    PyObject *a[1];
    if (kvpy_parse_fast("synchronize", args, nargs, kwnames, names, 1, 0, a) != 0) return NULL;
    kvhal_device d;
    if (kvpy_parse_device(st, a[0], "device", &d) != 0) return NULL;
    kvhal_status rc = kvhal_device_synchronize(d);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

/* check_errors(device="cpu:0", stream=None): with a stream, that stream's work only (kvhal_stream_check_errors). */
PyObject *kvpy_check_errors(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    static const char *const names[] = {"device", "stream"};
    PyObject *a[2];
    if (kvpy_parse_fast("check_errors", args, nargs, kwnames, names, 2, 0, a) != 0) return NULL;
    kvhal_device d;
    if (kvpy_parse_device(st, a[0], "device", &d) != 0) return NULL;
    kvhal_stream *s = NULL;
    if (a[1] && a[1] != Py_None) {
        intptr_t native;
        if (kvpy_stream_int(st, a[1], &native) != 0 || kvpy_stream_for(st, a[1], native, d, &s) != 0) return NULL;
    }
    kvhal_status rc = s ? kvhal_stream_check_errors(s) : kvhal_device_check_errors(d);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

PyObject *kvpy_last_error(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(kvhal_last_error());
}

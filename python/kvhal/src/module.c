/* module.c — kvhal._kvhal, the CPython extension behind the `kvhal` package: multi-phase init (PEP 489), the module
 * state's life (traverse, clear, free), the exception classes (kvhal.Error and one subclass per status), and the
 * module's functions. The rooms it puts together are listed in module.h. */
#include <stdio.h>

#include "bind.h"
#include "common.h"
#include "dlpack.h"
#include "ops.h"
#include "pages.h"
#include "prefix.h"
#include "stream.h"
#include "tensor.h"

/* ---- the state's life ---- */
static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    kvpy_state *st = kvpy_state_of_module(m);
    Py_VISIT(st->error);
    for (int i = 0; i < KVPY_STATUS_N; i++) Py_VISIT(st->status_error[i]);
    Py_VISIT(st->tensor_type);
    Py_VISIT(st->stream_type);
    Py_VISIT(st->pages_type);
    Py_VISIT(st->prefix_type);
    Py_VISIT(st->handle_type);
    Py_VISIT(st->manager_type);
    Py_VISIT(st->pages_view_type);
    Py_VISIT(st->array_type);
    for (int i = 0; i < KVPY_BIND_TYPES_MAX; i++) Py_VISIT(st->bind_type[i]);
    Py_VISIT(st->last_stream_obj);
    Py_VISIT(st->torch_tensor_type);
    Py_VISIT(st->torch_current_stream);
    for (int i = 0; i < st->xapi_n; i++) {
        Py_VISIT(st->xapi[i].tp);
        Py_VISIT(st->xapi[i].holder);
    }
    for (int i = 0; i < st->no_versioned_n; i++) Py_VISIT(st->no_versioned[i]);
    return 0;
}

static int module_clear(PyObject *m)
{
    kvpy_state *st = kvpy_state_of_module(m);
    Py_CLEAR(st->error);
    for (int i = 0; i < KVPY_STATUS_N; i++) Py_CLEAR(st->status_error[i]);
    Py_CLEAR(st->tensor_type);
    Py_CLEAR(st->stream_type);
    Py_CLEAR(st->pages_type);
    Py_CLEAR(st->prefix_type);
    Py_CLEAR(st->handle_type);
    Py_CLEAR(st->manager_type);
    Py_CLEAR(st->pages_view_type);
    Py_CLEAR(st->array_type);
    for (int i = 0; i < KVPY_BIND_TYPES_MAX; i++) Py_CLEAR(st->bind_type[i]);
    PyObject **names[] = {&st->s_dlpack,      &st->s_dlpack_device, &st->s_stream,      &st->s_max_version,
                          &st->s_cuda_stream_proto, &st->s_cuda_stream_attr, &st->s_xapi, &st->s_xapi_old,
                          &st->max_version,   &st->kw_stream,       &st->kw_max,        &st->kw_stream_max};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) Py_CLEAR(*names[i]);
    Py_CLEAR(st->last_stream_obj);
    Py_CLEAR(st->torch_tensor_type);
    Py_CLEAR(st->torch_current_stream);
    for (int i = 0; i < st->xapi_n; i++) {
        Py_CLEAR(st->xapi[i].tp);
        Py_CLEAR(st->xapi[i].holder);
    }
    st->xapi_n = 0;
    for (int i = 0; i < st->no_versioned_n; i++) Py_CLEAR(st->no_versioned[i]);
    st->no_versioned_n = 0;
    return 0;
}

static void module_free(void *m)
{
    (void)module_clear((PyObject *)m);
    kvpy_state *st = kvpy_state_of_module((PyObject *)m);
    kvpy_wrap_cache_free(st);
    kvpy_stream_cache_free(st);
}

/* ---- exec ---- */
static int intern_names(kvpy_state *st)
{
    static const struct {
        size_t offset;
        const char *text;
    } names[] = {
        {offsetof(kvpy_state, s_dlpack), "__dlpack__"},
        {offsetof(kvpy_state, s_dlpack_device), "__dlpack_device__"},
        {offsetof(kvpy_state, s_stream), "stream"},
        {offsetof(kvpy_state, s_max_version), "max_version"},
        {offsetof(kvpy_state, s_cuda_stream_proto), "__cuda_stream__"},
        {offsetof(kvpy_state, s_cuda_stream_attr), "cuda_stream"},
        {offsetof(kvpy_state, s_xapi), "__dlpack_c_exchange_api__"},
        {offsetof(kvpy_state, s_xapi_old), "__c_dlpack_exchange_api__"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        PyObject **slot = (PyObject **)((char *)st + names[i].offset);
        if (!(*slot = PyUnicode_InternFromString(names[i].text))) return -1;
    }
    if (!(st->max_version = Py_BuildValue("(ii)", KVHAL_PY_DLPACK_MAJOR, KVHAL_PY_DLPACK_MINOR))) return -1;
    if (!(st->kw_stream = PyTuple_Pack(1, st->s_stream)) || !(st->kw_max = PyTuple_Pack(1, st->s_max_version)) ||
        !(st->kw_stream_max = PyTuple_Pack(2, st->s_stream, st->s_max_version)))
        return -1;
    PyObject *arr = PyImport_ImportModule("array");
    if (!arr) return -1;
    st->array_type = PyObject_GetAttrString(arr, "array");
    Py_DECREF(arr);
    return st->array_type ? 0 : -1;
}

static int add_types(PyObject *m, kvpy_state *st)
{
    const struct {
        PyType_Spec *spec;
        PyTypeObject **slot;
    } types[] = {
        {&kvpy_tensor_spec, &st->tensor_type}, {&kvpy_stream_spec, &st->stream_type},
        {&kvpy_prefix_spec, &st->prefix_type}, {&kvpy_handle_spec, &st->handle_type},
        {&kvpy_manager_spec, &st->manager_type}, {&kvpy_pages_spec, &st->pages_type},
        {&kvpy_pages_view_spec, &st->pages_view_type},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        *types[i].slot = (PyTypeObject *)PyType_FromModuleAndSpec(m, types[i].spec, NULL);
        if (!*types[i].slot || PyModule_AddType(m, *types[i].slot) < 0) return -1;
    }
    return 0;
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

/* kvhal.Error and, per status, kvhal.<CamelName>(Error[, the matching builtin]) with .status and .code. */
static int add_exceptions(PyObject *m, kvpy_state *st)
{
    st->error = PyErr_NewExceptionWithDoc("kvhal.Error",
                                          "A kvhal call failed; .status is the status name, the message is "
                                          "kvhal_last_error().",
                                          NULL, NULL);
    if (!st->error || PyObject_SetAttrString(st->error, "status", Py_None) < 0) return -1;
    if (PyModule_AddObjectRef(m, "Error", st->error) < 0) return -1;
    for (int s = 1; s < KVPY_STATUS_N; s++) {
        const char *sn = kvhal_status_name((kvhal_status)s); /* "KVHAL_INVALID_ARGUMENT" */
        char cname[64], qual[80];
        camel(sn + 6, cname, sizeof cname);
        snprintf(qual, sizeof qual, "kvhal.%s", cname);
        PyObject *bases = s == KVHAL_INVALID_ARGUMENT ? PyTuple_Pack(2, st->error, PyExc_ValueError)
                          : s == KVHAL_OUT_OF_RANGE    ? PyTuple_Pack(2, st->error, PyExc_IndexError)
                          : s == KVHAL_OUT_OF_MEMORY   ? PyTuple_Pack(2, st->error, PyExc_MemoryError)
                                                       : PyTuple_Pack(1, st->error);
        if (!bases) return -1;
        PyObject *dict = Py_BuildValue("{s:s,s:i}", "status", sn, "code", s);
        st->status_error[s] =
            dict ? PyErr_NewExceptionWithDoc(qual, kvhal_status_string((kvhal_status)s), bases, dict) : NULL;
        Py_DECREF(bases);
        Py_XDECREF(dict);
        if (!st->status_error[s] || PyModule_AddObjectRef(m, cname, st->status_error[s]) < 0) return -1;
    }
    return 0;
}

static int module_exec(PyObject *m)
{
    kvpy_state *st = kvpy_state_of_module(m);
    st->pages_itemsize = sizeof(int32_t);
    st->pages_format[0] = 'i';
    if (kvpy_dtype_check() != 0 || intern_names(st) != 0 || add_types(m, st) != 0 || add_exceptions(m, st) != 0 ||
        kvpy_bind_add(m, st) != 0)
        return -1;
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d.%d", KVHAL_VERSION_MAJOR, KVHAL_VERSION_MINOR, KVHAL_VERSION_PATCH);
    if (PyModule_AddIntConstant(m, "STREAM_LEGACY", 1) < 0 || PyModule_AddIntConstant(m, "STREAM_PER_THREAD", 2) < 0 ||
        PyModule_AddStringConstant(m, "__version__", ver) < 0)
        return -1;
    return 0;
}

/* ---- the module ---- */
#define FASTCALL_KW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS

static PyMethodDef module_methods[] = {
    {"paged_caching", FASTCALL_KW(kvpy_paged_caching),
     "paged_caching(k_cache, v_cache, k, v, slot_mapping, k_scale=1.0, v_scale=1.0, stream=None, cache_dtype=None, "
     "num_tokens=None, layout='NHD')\n--\n\n"
     "Writes k and v into the caches (in place) at the slots of slot_mapping; the C API's order and rules. "
     "cache_dtype: the fp8 format of caches kept as uint8 (or int8) arrays of codes ('fp8_e4m3', 'fp8_e5m2', "
     "'fp8_e4m3fnuz', 'fp8_e5m2fnuz'); num_tokens: only the first num_tokens rows of k and v ([tokens, heads, dim]); "
     "layout: 'NHD' caches are [blocks, block_size, heads, dim], 'HND' ones [blocks, heads, block_size, dim]; "
     "v_cache=None: k_cache holds both as [blocks, 2, ...] (K at index 0 of dim 1, V at 1). "
     "Asynchronous on GPUs: an out-of-range slot is reported by check_errors."},
    {"_reshape_and_cache_flash", FASTCALL_KW(kvpy_reshape_and_cache_flash),
     "_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, "
     "stream=None)\n--\n\nvLLM's reshape_and_cache_flash in one C call: use kvhal.compat.vllm."},
    {"copy_blocks", FASTCALL_KW(kvpy_copy_blocks),
     "copy_blocks(caches, pairs, stream=None)\n--\n\nCopies whole blocks src -> dst in every cache; pairs is an "
     "(n, 2) integer array or a sequence of (src, dst)."},
    {"tensor_copy", FASTCALL_KW(kvpy_tensor_copy),
     "tensor_copy(dst, src, stream=None)\n--\n\ndst = src elementwise (same shape and dtype, one device)."},
    {"empty", FASTCALL_KW(kvpy_empty),
     "empty(shape, dtype='f32', device='cpu:0')\n--\n\nA zeroed contiguous kvhal.Tensor that kvhal owns; dtype: "
     "kvhal's name ('f16'), NumPy's or torch's ('float16', numpy.float16, torch.float16)."},
    {"dlpack_path", kvpy_dlpack_path, METH_O,
     "dlpack_path(array)\n--\n\nHow kvhal imports this array: 'kvhal.Tensor' (a view made once), 'c_exchange_api' (its "
     "type offers the DLPack C exchange API: no Python call per argument) or '__dlpack__' (a capsule per call)."},
    {"_time_paged_caching", FASTCALL_KW(kvpy_time_paged_caching),
     "_time_paged_caching(k_cache, v_cache, k, v, slot_mapping, reps, stream=None)\n--\n\nBenchmark helper: "
     "mean host ns of reps kvhal_paged_caching calls made in C on arguments imported once."},
    {"from_dlpack", kvpy_from_dlpack, METH_O,
     "from_dlpack(array)\n--\n\nA zero-copy kvhal.Tensor view of a DLPack array (keeps it alive)."},
    {"devices", kvpy_devices, METH_NOARGS,
     "devices()\n--\n\nEvery present device: a list of dicts (device, name, backend, platform, total_memory, "
     "free_memory, compute_units, peer_access)."},
    {"synchronize", FASTCALL_KW(kvpy_synchronize),
     "synchronize(device='cpu:0')\n--\n\nWaits for the device and raises kvhal.DeviceFault for a kernel fault."},
    {"check_errors", FASTCALL_KW(kvpy_check_errors),
     "check_errors(device='cpu:0', stream=None)\n--\n\nRaises kvhal.DeviceFault if a kernel skipped out-of-range "
     "indices; with a stream, waits for that stream only."},
    {"last_error", kvpy_last_error, METH_NOARGS, "last_error()\n--\n\nThis thread's last kvhal error message."},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot module_slots[] = {{Py_mod_exec, KVPY_FN(module_exec)}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvhal._kvhal",
    .m_doc = "kvhal's C extension (use the kvhal package).",
    .m_size = sizeof(kvpy_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__kvhal(void);
PyMODINIT_FUNC PyInit__kvhal(void) { return PyModuleDef_Init(&module_def); }

/* common.c — keyword parsing, devices by name, statuses as exceptions, and the dtype table. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>


/* ---- arguments ---- */
int kvpy_parse_fast(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
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

int kvpy_parse_device(kvpy_state *st, PyObject *o, const char *arg, kvhal_device *out)
{
    if (!o || o == Py_None) {
        out->type = KVHAL_DEVICE_CPU;
        out->id = 0;
        return 0;
    }
    const char *text = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    if (!text) {
        kvpy_bad_arg(st, "%s: expected a device name such as 'cpu:0' or 'cuda:1'", arg);
        return -1;
    }
    kvhal_status s = kvhal_device_parse(text, out);
    if (s != KVHAL_OK) {
        kvpy_raise(st, s);
        return -1;
    }
    return 0;
}

PyObject *kvpy_device_str(kvpy_state *st, kvhal_device d)
{
    char buf[64];
    if (kvhal_device_format(d, buf, sizeof buf) != KVHAL_OK) return kvpy_raise(st, KVHAL_INVALID_ARGUMENT);
    return PyUnicode_FromString(buf);
}

/* ---- errors ---- */
static PyObject *status_class(kvpy_state *st, kvhal_status s)
{
    if (s > 0 && (int)s < KVPY_STATUS_N && st->status_error[s]) return st->status_error[s];
    return st->error ? st->error : PyExc_RuntimeError; /* RuntimeError: the module is being torn down */
}

PyObject *kvpy_raise(kvpy_state *st, kvhal_status s)
{
    PyObject *cls = status_class(st, s);
    const char *msg = kvhal_last_error();
    /* kvhal_last_error() already starts with the status name */
    if (msg && msg[0]) PyErr_SetString(cls, msg);
    else PyErr_Format(cls, "%s: %s", kvhal_status_name(s), kvhal_status_string(s));
    return NULL;
}

PyObject *kvpy_raise_msg(kvpy_state *st, kvhal_status s, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PyErr_Format(status_class(st, s), "%s: %s", kvhal_status_name(s), buf);
    return NULL;
}

void kvpy_prefix_error(const char *arg)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *msg = value ? PyObject_Str(value) : NULL;
    const char *text = msg ? PyUnicode_AsUTF8(msg) : NULL;
    if (!text) PyErr_Clear();
    PyErr_Format(type ? type : PyExc_RuntimeError, "%s: %s", arg, text ? text : "?");
    Py_XDECREF(msg);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* ---- dtypes: one row per kvhal dtype, indexed by kvhal's enum ---- */
#define KVPY_DTYPE_ROW(e, nm, sz, code, bits) [e] = {nm, sz, {(uint8_t)(code), bits, 1}},
static const kvpy_dtype_info dtypes[KVPY_DTYPE_COUNT] = {KVPY_DTYPES(KVPY_DTYPE_ROW)};
#undef KVPY_DTYPE_ROW

const kvpy_dtype_info *kvpy_dtype(kvhal_dtype d)
{
    return (unsigned)d < KVPY_DTYPE_COUNT ? &dtypes[d] : NULL;
}

#define KVPY_DTYPE_KEY(e, nm, sz, code, bits) [e] = (uint32_t)(code) | (uint32_t)(bits) << 8 | 1u << 16,
const uint32_t kvpy_dtype_dl_keys[KVPY_DTYPE_COUNT] = {KVPY_DTYPES(KVPY_DTYPE_KEY)};
#undef KVPY_DTYPE_KEY

DLDataType kvpy_dtype_to_dl(kvhal_dtype d)
{
    DLDataType t = kvpy_dtype(d) ? dtypes[d].dl : (DLDataType){kDLUInt, 8, 1};
    const int float8 = t.code >= KVHAL_PY_DL_FLOAT8_E4M3FN && t.code <= KVHAL_PY_DL_FLOAT8_E5M2FNUZ;
    if (float8 && !KVHAL_PY_DL_HAS_FLOAT8) t.code = kDLUInt; /* the bits, 8 of them */
    return t;
}

int kvpy_dtype_of_size(size_t bytes, kvhal_dtype *out)
{
    for (int d = 0; d < KVPY_DTYPE_COUNT; d++)
        if (dtypes[d].size == bytes) {
            *out = (kvhal_dtype)d;
            return 0;
        }
    return -1;
}

/* A dtype by one of its names: kvhal's ('f16') or NumPy's and PyTorch's ('float16', 'half'). */
static int dtype_by_name(const char *name, kvhal_dtype *out)
{
    if (!strncmp(name, "torch.", 6)) name += 6; /* str(torch.float16) */
    for (int d = 0; d < KVPY_DTYPE_COUNT; d++)
        if (!strcmp(name, dtypes[d].name)) {
            *out = (kvhal_dtype)d;
            return 0;
        }
#define KVPY_DTYPE_ALIAS(e, nm)                                                                                       \
    if (!strcmp(name, nm)) {                                                                                          \
        *out = e;                                                                                                     \
        return 0;                                                                                                     \
    }
    KVPY_DTYPE_ALIASES(KVPY_DTYPE_ALIAS)
#undef KVPY_DTYPE_ALIAS
    return -1;
}

/* The name of a dtype object: a NumPy dtype's .name, a type's __name__ (numpy.float16), str() otherwise
 * (torch.float16). New reference, or NULL with an exception set. */
static PyObject *dtype_object_name(PyObject *o)
{
    PyObject *n = PyType_Check(o) ? PyObject_GetAttrString(o, "__name__") : PyObject_GetAttrString(o, "name");
    if (n && PyUnicode_Check(n)) return n;
    Py_XDECREF(n);
    PyErr_Clear();
    return PyObject_Str(o);
}

int kvpy_parse_dtype(kvpy_state *st, PyObject *o, kvhal_dtype *out)
{
    return kvpy_parse_dtype_arg(st, o, "dtype", out);
}

int kvpy_parse_dtype_arg(kvpy_state *st, PyObject *o, const char *arg, kvhal_dtype *out)
{
    if (!o || o == Py_None) {
        *out = KVHAL_F32;
        return 0;
    }
    PyObject *name_o = PyUnicode_Check(o) ? Py_NewRef(o) : dtype_object_name(o);
    const char *name = name_o ? PyUnicode_AsUTF8(name_o) : NULL;
    int rc = -1;
    if (!name) {
        PyErr_Clear();
        kvpy_bad_arg(st, "%s: expected a name (%s), a NumPy or a torch dtype, got %s", arg, KVPY_DTYPE_NAMES,
                     Py_TYPE(o)->tp_name);
    } else if (dtype_by_name(name, out) != 0) {
        kvpy_bad_arg(st, "%s: '%s' is not one of kvhal's (%s, or NumPy's and torch's names of them)", arg, name,
                     KVPY_DTYPE_NAMES);
    } else {
        rc = 0;
    }
    Py_XDECREF(name_o);
    return rc;
}

int kvpy_dtype_check(void)
{
    for (int d = 0; d < KVPY_DTYPE_COUNT; d++)
        if (strcmp(dtypes[d].name, kvhal_dtype_name((kvhal_dtype)d)) || dtypes[d].size != dtypes[d].dl.bits / 8 ||
            dtypes[d].size != kvhal_dtype_size((kvhal_dtype)d)) {
            PyErr_Format(PyExc_ImportError,
                         "kvhal._kvhal: dtype %d is '%s' of %zu bytes here but '%s' of %zu bytes in libkvhal (the "
                         "package was built against another kvhal.h)",
                         d, dtypes[d].name, dtypes[d].size, kvhal_dtype_name((kvhal_dtype)d),
                         kvhal_dtype_size((kvhal_dtype)d));
            return -1;
        }
    return 0;
}

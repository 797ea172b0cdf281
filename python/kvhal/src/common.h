/* common.h — what every room of the binding uses: keyword parsing for METH_FASTCALL, devices by name, kvhal
 * statuses as exceptions, and the one dtype table (names, item sizes and DLPack types of kvhal's dtypes, generated
 * at build time from the kvhal_dtype enum of api/kvhal.h into kvpy_dtypes.h). */
#ifndef KVPY_COMMON_H
#define KVPY_COMMON_H

#include "kvpy_dtypes.h" /* generated: KVPY_DTYPES(X), KVPY_DTYPE_COUNT, KVPY_DTYPE_NAMES */
#include "module.h"

/* Fills out[0..n) from positional args and keywords named names[0..n); missing ones stay NULL; the first required
 * ones must be given. 0, or -1 with TypeError set. */
int kvpy_parse_fast(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                    const char *const *names, int n, int required, PyObject **out);

/* A device name ('cpu:0', 'cuda:1'); None or absent is cpu:0. 0, or -1 with an exception set. */
int kvpy_parse_device(kvpy_state *st, PyObject *o, const char *arg, kvhal_device *out);
PyObject *kvpy_device_str(kvpy_state *st, kvhal_device d);

static inline int kvpy_is_gpu(kvhal_device d) { return d.type == KVHAL_DEVICE_CUDA || d.type == KVHAL_DEVICE_HIP; }

/* Raises the status's kvhal exception with kvhal_last_error()'s message; returns NULL. */
PyObject *kvpy_raise(kvpy_state *st, kvhal_status s);

/* Raises the status's kvhal exception with "KVHAL_<STATUS>: " + the message (the binding's own refusals); NULL. */
PyObject *kvpy_raise_msg(kvpy_state *st, kvhal_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* An argument the binding itself refuses: kvhal.InvalidArgument naming it; NULL. */
#define kvpy_bad_arg(st, ...) kvpy_raise_msg((st), KVHAL_INVALID_ARGUMENT, __VA_ARGS__)

/* The pending exception again, its message prefixed with "arg: " (its type kept). */
void kvpy_prefix_error(const char *arg);

/* ---- dtypes ---- */
typedef struct {
    const char *name; /* kvhal_dtype_name() */
    size_t size;      /* kvhal_dtype_size() */
    DLDataType dl;    /* DLPack's type (a float8 code for fp8) */
} kvpy_dtype_info;

/* The row of a dtype, or NULL for a value that is not one. */
const kvpy_dtype_info *kvpy_dtype(kvhal_dtype d);
/* The table's DLPack types packed as code | bits << 8 | lanes << 16, by dtype (the lookup of every import). */
extern const uint32_t kvpy_dtype_dl_keys[KVPY_DTYPE_COUNT];

/* The kvhal dtype of a DLPack type (fp8 by its float8 code); -1 when kvhal has none. */
static inline int kvpy_dtype_from_dl(DLDataType t, kvhal_dtype *out)
{
    const uint32_t key = (uint32_t)t.code | (uint32_t)t.bits << 8 | (uint32_t)t.lanes << 16;
    for (int d = 0; d < KVPY_DTYPE_COUNT; d++)
        if (kvpy_dtype_dl_keys[d] == key) {
            *out = (kvhal_dtype)d;
            return 0;
        }
    return -1;
}
/* The DLPack type a tensor of dtype d exports: its row's, with fp8 as uint8 bits where the build's DLPack header
 * predates float8 codes. Never wider than the dtype. */
DLDataType kvpy_dtype_to_dl(kvhal_dtype d);
/* A dtype of `bytes` bytes per element (host copies move bytes); -1 when none has that size. */
int kvpy_dtype_of_size(size_t bytes, kvhal_dtype *out);
/* A dtype: kvhal's name ('f16'), NumPy's or torch's ('float16', numpy.float16, numpy.dtype('float16'),
 * torch.float16); absent or None: f32. 0, or -1 with kvhal.InvalidArgument set. */
int kvpy_parse_dtype(kvpy_state *st, PyObject *o, kvhal_dtype *out);
/* The same for the argument named arg. */
int kvpy_parse_dtype_arg(kvpy_state *st, PyObject *o, const char *arg, kvhal_dtype *out);
/* The table against the library's kvhal_dtype_name() and kvhal_dtype_size(); 0, or -1 with ImportError set. */
int kvpy_dtype_check(void);

#endif

/* mla.c — kvhal.paged_caching_mla: the MLA cache write (kvhal_paged_caching_mla), one latent row per token, no V. */
#include <string.h>

#include "bind.h"
#include "stream.h"

static PyObject *paged_caching_mla(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    kvpy_new_call(st);
    static const char *const names[] = {"kv_cache", "kv_c", "k_pe", "slot_mapping", "scale", "stream"};
    PyObject *a[6];
    if (kvpy_parse_fast("paged_caching_mla", args, nargs, kwnames, names, 6, 4, a) != 0) return NULL;
    float scale = 1.0f;
    if (a[4]) {
        const double v = PyFloat_AsDouble(a[4]);
        if (v == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return kvpy_bad_arg(st, "scale: expected a float, got %s", Py_TYPE(a[4])->tp_name);
        }
        scale = (float)v;
    }
    intptr_t native;
    if (kvpy_stream_int(st, a[5], &native) != 0) return NULL;
    const intptr_t dls = kvpy_dlpack_stream_number(a[5], native);
    kvpy_import t[4];
    int n = 0, has_pe = a[2] != Py_None;
    PyObject *ret = NULL;
    for (; n < 4; n++) {
        if (n == 2 && !has_pe) {
            memset(&t[n], 0, sizeof t[n]);
            continue;
        }
        if (kvpy_import_any(st, a[n], names[n], n == 0, dls, 0, &t[n]) != 0) goto out;
    }
    kvhal_stream *s;
    if (kvpy_stream_for(st, a[5], native, kvhal_buffer_device(t[0].t.buffer), &s) != 0) goto out;
    kvhal_status rc;
    if (kvhal_buffer_device(t[0].t.buffer).type == KVHAL_DEVICE_CPU && kvhal_tensor_numel(&t[1].t) >= (1 << 16)) {
        /* the CPU writes in the call: other Python threads run meanwhile (kvhal calls are thread-safe) */
        Py_BEGIN_ALLOW_THREADS
        rc = kvhal_paged_caching_mla(&t[0].t, &t[1].t, has_pe ? &t[2].t : NULL, &t[3].t, scale, s);
        Py_END_ALLOW_THREADS
    } else {
        rc = kvhal_paged_caching_mla(&t[0].t, &t[1].t, has_pe ? &t[2].t : NULL, &t[3].t, scale, s);
    }
    ret = rc == KVHAL_OK ? Py_NewRef(Py_None) : kvpy_raise(st, rc);
out:
    while (n-- > 0) kvpy_import_release(st, &t[n]);
    return ret;
}

static PyMethodDef mla_functions[] = {
    {"paged_caching_mla", (PyCFunction)(void (*)(void))paged_caching_mla, METH_FASTCALL | METH_KEYWORDS,
     "paged_caching_mla(kv_cache, kv_c, k_pe, slot_mapping, scale=1.0, stream=None)\n--\n\nWrites each token's "
     "row of an MLA cache ([blocks, block_size, dim] or [blocks, block_size, 1, dim]) from kv_c ([tokens, dim_c]) "
     "and k_pe ([tokens, dim_pe], after kv_c in the row; None: kv_c is the whole row) at the slots of "
     "slot_mapping; fp8 caches store value / scale. vLLM's concat_and_cache_mla in the C API's order."},
    {NULL, NULL, 0, NULL}};

int kvpy_mla_add(PyObject *m, kvpy_state *st)
{
    (void)st;
    return kvpy_bind_functions_add(m, mla_functions);
}

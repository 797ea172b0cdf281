/* bind.c — what the rooms of bind.h share: their registration, page ids from any host array, stream arguments. */
#include "bind.h"

#include <string.h>

#include "stream.h"

_Static_assert(KVPY_T_COUNT <= KVPY_BIND_TYPES_MAX, "module.h's KVPY_BIND_TYPES_MAX is too small");

int kvpy_bind_type_add(PyObject *m, kvpy_state *st, int idx, PyType_Spec *spec, PyObject *base)
{
    PyTypeObject *tp = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, base);
    if (!tp) return -1;
    st->bind_type[idx] = tp;
    return PyModule_AddType(m, tp);
}

int kvpy_bind_functions_add(PyObject *m, PyMethodDef *defs) { return PyModule_AddFunctions(m, defs); }

int kvpy_bind_add(PyObject *m, kvpy_state *st)
{
    if (kvpy_pcache_add(m, st) != 0 || kvpy_events_add(m, st) != 0 || kvpy_tiers_add(m, st) != 0 ||
        kvpy_pool_add(m, st) != 0 || kvpy_devevents_add(m, st) != 0 || kvpy_mla_add(m, st) != 0 ||
        kvpy_xfer_add(m, st) != 0)
        return -1;
    return 0;
}

/* ---- page ids ---- */
void kvpy_ids_release(kvpy_state *st, kvpy_ids *a)
{
    kvpy_ints_release(&a->ints);
    if (a->has_imp) kvpy_import_release(st, &a->imp);
    PyMem_Free(a->tmp);
    memset(a, 0, sizeof *a);
}

/* A CPU DLPack array of integers (torch.Tensor has no buffer protocol). */
static int ids_from_dlpack(kvpy_state *st, PyObject *o, const char *arg, kvpy_ids *a)
{
    kvpy_new_call(st);
    if (kvpy_import_any(st, o, arg, 0, 0, 0, &a->imp) != 0) return -1;
    a->has_imp = 1;
    const kvhal_tensor *t = &a->imp.t;
    if (kvhal_buffer_device(t->buffer).type != KVHAL_DEVICE_CPU) {
        kvpy_bad_arg(st, "%s: page ids must be on the host (cpu), not on a device", arg);
        return -1;
    }
    if (t->dtype != KVHAL_I32 && t->dtype != KVHAL_I64) {
        kvpy_bad_arg(st, "%s: page ids must be int32 or int64, got %s", arg, kvpy_dtype(t->dtype)->name);
        return -1;
    }
    if (t->ndim != 1 || !kvhal_tensor_is_contiguous(t)) {
        kvpy_bad_arg(st, "%s: page ids must be a contiguous 1-D array", arg);
        return -1;
    }
    a->n = (size_t)t->shape[0];
    const char *base = (const char *)kvhal_buffer_native(t->buffer) + t->offset;
    if (t->dtype == KVHAL_I32) {
        a->v = (const int32_t *)base;
        return 0;
    }
    a->tmp = PyMem_Malloc(a->n ? a->n * sizeof(int32_t) : 1);
    if (!a->tmp) {
        PyErr_NoMemory();
        return -1;
    }
    const int64_t *w = (const int64_t *)base;
    for (size_t i = 0; i < a->n; i++) {
        if (w[i] < INT32_MIN || w[i] > INT32_MAX) {
            kvpy_bad_arg(st, "%s[%zu]: %lld does not fit in int32", arg, i, (long long)w[i]);
            return -1;
        }
        a->tmp[i] = (int32_t)w[i];
    }
    a->v = a->tmp;
    return 0;
}

int kvpy_ids_get(kvpy_state *st, PyObject *o, const char *arg, kvpy_ids *a)
{
    memset(a, 0, sizeof *a);
    int rc;
    if (!Py_IS_TYPE(o, st->pages_type) && !PyObject_CheckBuffer(o) && PyObject_HasAttr(o, st->s_dlpack))
        rc = ids_from_dlpack(st, o, arg, a);
    else if ((rc = kvpy_ints_get(st, o, arg, 4, &a->ints)) == 0) {
        a->v = a->ints.data;
        a->n = a->ints.n;
    }
    if (rc != 0) kvpy_ids_release(st, a);
    return rc;
}

/* ---- streams ---- */
int kvpy_stream_arg(kvpy_state *st, PyObject *o, kvhal_device dev, kvhal_stream **out)
{
    intptr_t native;
    *out = NULL;
    if (kvpy_stream_int(st, o, &native) != 0) return -1;
    return kvpy_stream_for(st, o, native, dev, out);
}

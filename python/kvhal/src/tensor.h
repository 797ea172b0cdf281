/* tensor.h — kvhal.Tensor (its object layout is dlpack.h's kvpy_tensor_object), kvhal.empty, kvhal.from_dlpack. */
#ifndef KVPY_TENSOR_H
#define KVPY_TENSOR_H

#include "dlpack.h"

extern PyType_Spec kvpy_tensor_spec;

PyObject *kvpy_empty(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_from_dlpack(PyObject *mod, PyObject *obj);

#endif

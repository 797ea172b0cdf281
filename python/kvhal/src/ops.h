/* ops.h — the module's functions over arrays and devices: paged_caching, vLLM's reshape_and_cache_flash, copy_blocks, tensor_copy, dlpack_path,
 * _time_paged_caching, devices, synchronize, check_errors, last_error. */
#ifndef KVPY_OPS_H
#define KVPY_OPS_H

#include "common.h"

PyObject *kvpy_paged_caching(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_reshape_and_cache_flash(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_time_paged_caching(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_copy_blocks(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_tensor_copy(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_dlpack_path(PyObject *mod, PyObject *obj);
PyObject *kvpy_devices(PyObject *mod, PyObject *unused);
PyObject *kvpy_synchronize(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_check_errors(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *kvpy_last_error(PyObject *mod, PyObject *unused);

#endif

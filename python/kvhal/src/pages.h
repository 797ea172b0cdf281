/* pages.h — kvhal.Pages (an immutable run of int32 page ids, the one object a match, allocate, evict or reset
 * returns) and integer arrays on the host as the C calls take them: page lists, block-copy pairs, token ids. */
#ifndef KVPY_PAGES_H
#define KVPY_PAGES_H

#include "common.h"
#include "dlpack.h"

typedef struct {
    PyObject_VAR_HEAD
    int32_t v[1];
} kvpy_pages_object;

extern PyType_Spec kvpy_pages_spec;

/* kvhal.PagesView: page ids in a cache manager's own storage (CacheManager.match_view, allocate_view), read-only,
 * valid until the manager's next call of the same kind (which may reuse the memory for other ids); it keeps its
 * manager object alive, and counts itself in *alive (the manager refuses to be re-initialised while views of it
 * live). */
typedef struct {
    PyObject_HEAD
    PyObject *owner;
    int *alive;
    const int32_t *v;
    Py_ssize_t n;
    Py_ssize_t matched; /* admit_view's row: its first `matched` ids are the match's (0 for the other views) */
} kvpy_pages_view_object;

extern PyType_Spec kvpy_pages_view_spec;

/* A view of n ids at v, owned by owner (a reference is kept; *alive counts the live views). */
PyObject *kvpy_pages_view_new(kvpy_state *st, PyObject *owner, int *alive, const int32_t *v, size_t n);

/* A new Pages of n ids (copied from v when v is not NULL). */
PyObject *kvpy_pages_new(kvpy_state *st, const int32_t *v, size_t n);

/* An integer array on the host: the buffer protocol (array.array, NumPy, memoryview: zero-copy when the item size is
 * the one asked for, else converted in C), kvhal.Pages and kvhal.PagesView (int32, zero-copy), a 1-D int32/int64
 * DLPack array on the host (a torch CPU tensor: zero-copy or converted in C, strided or not), or any sequence of
 * ints (one Python int read per element). */
typedef struct {
    Py_buffer view;
    int has_view;
    kvpy_import imp; /* the DLPack import (has_imp), released with the rest */
    int has_imp;
    kvpy_state *st;
    void *tmp;
    const void *data; /* n items of the width asked for */
    size_t n;
} kvpy_ints;

/* width 4 (int32, range-checked) or 8 (int64). 0, or -1 with kvhal.InvalidArgument (naming arg) or another
 * exception set; release either way is safe. */
int kvpy_ints_get(kvpy_state *st, PyObject *o, const char *arg, int width, kvpy_ints *a);
void kvpy_ints_release(kvpy_ints *a);

/* Page ids handed out by a C callback (eviction, reset), gathered into one run. */
typedef struct {
    int32_t *v;
    size_t n, cap;
    int failed;
} kvpy_page_run;

void kvpy_page_run_collect(const int32_t *pages, size_t n, void *user); /* the kvhal callback; user: a page run */

#endif

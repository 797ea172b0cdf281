/* module.h — what one instance of the kvhal._kvhal module holds (its module state): the exception classes, the
 * heap types, interned names, and the caches that make repeated calls cheap. The bottom of the binding's headers:
 * every room reaches the state through a module object (PyModule_GetState) or one of the module's types
 * (PyType_GetModuleState); nothing in the binding is a mutable global.
 *
 * Rooms (python/kvhal/src), each with its private header, lower ones never including higher ones:
 *   module.h   the state (this file)
 *   common     argument parsing, status -> exception, the dtype table (generated from api/kvhal.h)
 *   stream     kvhal.Stream and stream arguments
 *   dlpack     arrays in (DLPack capsules, the C exchange API, the wrap cache) and capsules out
 *   tensor     kvhal.Tensor, empty, from_dlpack
 *   pages      kvhal.Pages and integer arrays on the host (page lists, block tables, token ids)
 *   ops        paged_caching, copy_blocks, tensor_copy, devices, synchronize, check_errors
 *   prefix     kvhal.PrefixCache, kvhal.PrefixHandle, kvhal.CacheManager
 *   bind.h     paged caches, the host tier, KV events, block pool, device events, MLA, the transfer agent
 *   module.c   init (PEP 489 multi-phase), the state's life, the exceptions, the module's functions */
#ifndef KVPY_MODULE_H
#define KVPY_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "dlpack_compat.h"
#include "kvhal.h"

#if PY_VERSION_HEX < 0x030A0000
#error "the kvhal Python package needs CPython 3.10 or newer (heap types with Py_TPFLAGS_IMMUTABLETYPE)"
#endif

/* A function in a PyType_Slot (whose pfunc is a void *): ISO C has no conversion between function and object
 * pointers, which every platform CPython runs on makes anyway. */
#if defined(__GNUC__)
#define KVPY_FN(f) (__extension__(void *)(f))
#else
#define KVPY_FN(f) ((void *)(f))
#endif

/* Status codes are 0 .. n-1 (the public list has no count). */
#define KVPY_COUNT_X(name, code, msg) +1
#define KVPY_STATUS_N ((int)(0 KVHAL_STATUS_MAP(KVPY_COUNT_X)))

/* Wrapped host and CUDA/HIP memory by (device, address, bytes), kept across calls (dlpack.c). */
#define KVPY_WRAP_MAX 16
typedef struct {
    kvhal_device dev;
    void *data;
    size_t bytes;
    kvhal_buffer *buf;
    int inuse; /* calls using the wrap now (one that released the GIL); never replaced while > 0 */
} kvpy_wrap_entry;

/* A producer type's DLPack C exchange API, remembered with the type's version tag (dlpack.c). */
#define KVPY_XAPI_MAX 32
typedef struct {
    PyTypeObject *tp; /* strong */
    unsigned int tag;
    const kvpy_xapi *api; /* NULL: the type has none */
    PyObject *holder;     /* strong: the capsule or int the table came from */
} kvpy_xapi_entry;

/* Producer types that refused max_version (pre-1.0 DLPack), asked without it from then on (dlpack.c). */
#define KVPY_NO_VERSIONED_MAX 16

/* current_work_stream's answer, reused by the other arguments of the same call (dlpack.c). */
typedef struct {
    unsigned long serial;
    PyThreadState *ts;
    const kvpy_xapi *api;
    int type, id;
    void *stream;
} kvpy_cws_entry;

/* Borrowed-stream handles by (device, native handle), made once (stream.c). */
#define KVPY_STREAM_MAX 64

/* The types of the rooms bind.h lists (paged caches, tiers, events, pool, device events, transfer). */
#define KVPY_BIND_TYPES_MAX 12
typedef struct {
    kvhal_device dev;
    intptr_t native;
    kvhal_stream *s;
} kvpy_stream_entry;

/* An event per device, recorded on a producer's stream for the call's stream to wait for (stream.c). */
#define KVPY_ORDER_EVENTS_MAX 16
typedef struct {
    kvhal_device dev;
    kvhal_event *e;
} kvpy_event_entry;

typedef struct kvpy_state {
    /* exceptions: kvhal.Error and one subclass per status (index 0 unused) */
    PyObject *error;
    PyObject *status_error[KVPY_STATUS_N];

    /* the module's heap types */
    PyTypeObject *tensor_type, *stream_type, *pages_type, *prefix_type, *handle_type, *manager_type;
    PyTypeObject *pages_view_type;
    PyObject *array_type; /* array.array */
    PyTypeObject *bind_type[KVPY_BIND_TYPES_MAX]; /* bind.h's, by KVPY_T_* */

    /* interned names and the keyword tuples of __dlpack__ calls */
    PyObject *s_dlpack, *s_dlpack_device, *s_stream, *s_max_version, *s_cuda_stream_proto, *s_cuda_stream_attr;
    PyObject *s_xapi, *s_xapi_old; /* "__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__" */
    PyObject *max_version;         /* (1, 0) */
    PyObject *kw_stream, *kw_max, *kw_stream_max;

    /* arrays in (dlpack.c) */
    kvpy_wrap_entry wraps[KVPY_WRAP_MAX];
    unsigned wrap_next;
    kvpy_xapi_entry xapi[KVPY_XAPI_MAX];
    int xapi_n;
    PyTypeObject *no_versioned[KVPY_NO_VERSIONED_MAX]; /* strong */
    int no_versioned_n;
    unsigned long call_serial; /* bumped by every entry point that imports arrays */
    kvpy_cws_entry cws;
    char empty_byte; /* what an empty host tensor without memory wraps */

    /* streams (stream.c) */
    kvpy_stream_entry streams[KVPY_STREAM_MAX];
    int streams_n;
    PyObject *last_stream_obj; /* strong: the last object read through __cuda_stream__ or .cuda_stream */
    intptr_t last_stream_native;
    /* torch, once the caller has imported it (stream.c): torch.Tensor and torch.cuda.current_stream (strong) */
    PyObject *torch_tensor_type, *torch_current_stream;
    /* one event per device: a producer's stream ordered before the call's (stream.c) */
    kvpy_event_entry order_events[KVPY_ORDER_EVENTS_MAX];
    int order_events_n;

    /* kvhal.Pages' buffer protocol (pages.c) */
    Py_ssize_t pages_itemsize;
    char pages_format[2];
} kvpy_state;

static inline kvpy_state *kvpy_state_of_module(PyObject *mod) { return (kvpy_state *)PyModule_GetState(mod); }

/* The state of the module that made tp (one of the module's own types: they are final, so an instance's type is
 * always the one the module made). */
static inline kvpy_state *kvpy_state_of_type(PyTypeObject *tp) { return (kvpy_state *)PyType_GetModuleState(tp); }

static inline kvpy_state *kvpy_state_of(PyObject *self) { return kvpy_state_of_type(Py_TYPE(self)); }

#endif

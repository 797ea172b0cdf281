/* bind.h — the rooms that bind kvhal's serving objects, beside the ops and the prefix cache:
 *   pcache.c    kvhal.PagedCache (a paged cache of every layer; layer views as kvhal.Tensor; shareable memory)
 *   tiers.c     kvhal.TieredCacheManager (a CacheManager with a host tier: match_tiered, load_back, statistics)
 *   events.c    kvhal.KVEvent records (stored, removed, cleared, overflow) drained from a manager
 *   pool.c      kvhal.BlockPool (reference-counted block ids)
 *   devevents.c kvhal.Event (device events: record, query, synchronize, stream waits)
 *   mla.c       kvhal.paged_caching_mla
 *   xfer.c      kvhal.xfer's Agent, Peer, Transfer and XferEvent (built with libkvhal-xfer only)
 *   bind.c      what they share: registration, page ids from any host array, stream arguments
 * Each room's types live in the module state's bind_type[] at its KVPY_T_* index. */
#ifndef KVPY_BIND_H
#define KVPY_BIND_H

#include "dlpack.h"
#include "pages.h"

enum {
    KVPY_T_PCACHE,
    KVPY_T_TIERED,
    KVPY_T_KVEVENT,
    KVPY_T_POOL,
    KVPY_T_EVENT,
    KVPY_T_AGENT,
    KVPY_T_PEER,
    KVPY_T_XFER,
    KVPY_T_XFER_EVENT,
    KVPY_T_COUNT
};

/* kvhal.PagedCache's object. */
typedef struct {
    PyObject_HEAD
    kvhal_paged_cache *c;
    kvhal_paged_cache_config cfg;
    int shareable;
} kvpy_pcache_object;

/* The kvhal paged cache of a kvhal.PagedCache argument, or NULL with kvhal.InvalidArgument naming arg. */
kvhal_paged_cache *kvpy_pcache_of(kvpy_state *st, PyObject *o, const char *arg);

/* Page ids (int32, 1-D) on the host from a kvhal.Pages, anything with the buffer protocol (array.array, NumPy) or
 * a CPU DLPack array of int32 / int64 (torch): read in place where the width is int32, else converted once in C.
 * 0, or -1 with an exception naming arg set; release either way is safe. */
typedef struct {
    kvpy_ints ints;
    kvpy_import imp;
    int has_imp;
    int32_t *tmp;
    const int32_t *v;
    size_t n;
} kvpy_ids;
int kvpy_ids_get(kvpy_state *st, PyObject *o, const char *arg, kvpy_ids *out);
void kvpy_ids_release(kvpy_state *st, kvpy_ids *a);

/* The kvhal stream of a stream argument (None, an int handle, a stream object, kvhal.Stream) on dev. 0, or -1. */
int kvpy_stream_arg(kvpy_state *st, PyObject *o, kvhal_device dev, kvhal_stream **out);

/* The kvhal_event of a kvhal.Event argument (devevents.c); NULL with an exception naming arg otherwise. */
kvhal_event *kvpy_event_arg(kvpy_state *st, PyObject *o, const char *arg);

/* KV events of a manager with event_capacity > 0, drained into a list of kvhal.KVEvent (events.c). */
PyObject *kvpy_events_drain(kvpy_state *st, kvhal_cache_manager *cm, int32_t page_size, Py_ssize_t max);

/* Per room: adds its types and functions to the module (m) and the state. 0, or -1 with an exception set. */
int kvpy_pcache_add(PyObject *m, kvpy_state *st);
int kvpy_tiers_add(PyObject *m, kvpy_state *st);
int kvpy_events_add(PyObject *m, kvpy_state *st);
int kvpy_pool_add(PyObject *m, kvpy_state *st);
int kvpy_devevents_add(PyObject *m, kvpy_state *st);
int kvpy_mla_add(PyObject *m, kvpy_state *st);
int kvpy_xfer_add(PyObject *m, kvpy_state *st);

/* Every room above (module.c calls this once). */
int kvpy_bind_add(PyObject *m, kvpy_state *st);

/* A type from spec added to the module and kept at bind_type[idx] (base: NULL or the base type). 0, or -1. */
int kvpy_bind_type_add(PyObject *m, kvpy_state *st, int idx, PyType_Spec *spec, PyObject *base);

/* Module functions of the rooms, added by kvpy_bind_add. 0, or -1. */
int kvpy_bind_functions_add(PyObject *m, PyMethodDef *defs);

#endif

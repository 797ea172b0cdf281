/* prefix.h — kvhal.PrefixCache, kvhal.PrefixHandle and kvhal.CacheManager over kvhal's prefix cache and cache
 * manager; page lists in and out as kvhal.Pages (pages.h). */
#ifndef KVPY_PREFIX_H
#define KVPY_PREFIX_H

#include "pages.h"

extern PyType_Spec kvpy_prefix_spec, kvpy_handle_spec, kvpy_manager_spec;

/* kvhal.CacheManager's object: the start of kvhal.TieredCacheManager's (tiers.c), whose methods it inherits. */
typedef struct {
    PyObject_HEAD
    kvhal_cache_manager *cm;
    int32_t page_size;
    int views; /* live kvhal.PagesView objects over cm's storage */
} kvpy_manager_object;

/* A PrefixHandle of h, valid with cache (the object whose call made it). */
PyObject *kvpy_handle_new(kvpy_state *st, kvhal_prefix_handle h, PyObject *cache);
/* The handle argument o: a PrefixHandle of cache (or of alt), or None (0). 0, or -1 with an exception set. */
int kvpy_handle_get(kvpy_state *st, PyObject *o, PyObject *cache, PyObject *alt, kvhal_prefix_handle *out);

#endif

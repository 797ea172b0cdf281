/* prefix.h — kvhal.PrefixCache, kvhal.PrefixHandle and kvhal.CacheManager over kvhal's prefix cache and cache
 * manager; page lists in and out as kvhal.Pages (pages.h). */
#ifndef KVPY_PREFIX_H
#define KVPY_PREFIX_H

#include "pages.h"

extern PyType_Spec kvpy_prefix_spec, kvpy_handle_spec, kvpy_manager_spec;

#endif

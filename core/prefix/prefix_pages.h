/* prefix_pages.h — what the tiers see of a prefix cache (evict.c): its pages, never its nodes. */
#ifndef KVHAL_CORE_PREFIX_PAGES_H
#define KVHAL_CORE_PREFIX_PAGES_H

#include "common.h"

/* Calls fn with the pages of every node, node by node (a node's pages in root-path order): the tier page map's
 * check, the cache manager's count of tree pages. Takes the owner flag (KVHAL_BUSY when another call holds it). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_for_each_page(const kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user);

#endif

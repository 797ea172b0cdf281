/* desc_cache.h — the descriptor cache (desc_cache.c). */
#ifndef KVHAL_CORE_DESC_CACHE_H
#define KVHAL_CORE_DESC_CACHE_H

#include "registry.h"

/* The built-in op kinds are the ops of KVHAL_BK_OP_LIST, registered under their ids and names. Returns the
 * descriptor cached for (dev, key), or asks bk whether it supports the op (KVHAL_UNSUPPORTED with its reason if
 * not), creates one with bk's desc_create(args) and caches it; the entry remembers bk, so that its eviction calls
 * bk's desc_destroy without asking the registry. *desc may be NULL for backends without desc_create. */
KVHAL_HIDDEN kvhal_status kvhal__desc_get_or_create(kvhal_device dev, const kvhal__bk *bk, kvhal_bk_op op,
                                                    const kvhal_desc_key *key, const void *args, void **desc);
/* A descriptor outside the cache (for one call): asks bk's supports first (KVHAL_UNSUPPORTED with its reason), then
 * its desc_create (*desc NULL without one). kvhal__desc_release gives it back. */
KVHAL_HIDDEN kvhal_status kvhal__desc_make(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, const void *args,
                                           void **desc);
KVHAL_HIDDEN void kvhal__desc_release(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, void *desc);
/* Sets key->hash from key->op and key->words[0..nwords), for the built-in ops that fill the words directly
 * (one hashing pass instead of one call per word). */
KVHAL_HIDDEN void kvhal__desc_key_rehash(kvhal_desc_key *key);
/* The descriptor cached for (dev, key) on this thread, or NULL; no stats, no allocation. */
KVHAL_HIDDEN void *kvhal__desc_peek(kvhal_device dev, const kvhal_desc_key *key);

#endif

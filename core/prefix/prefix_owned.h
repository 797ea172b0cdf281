/* prefix_owned.h — what a cache manager calls on its own prefix cache beyond the API (match.c, locks.c, evict.c,
 * integrity.c, prefix.c). */
#ifndef KVHAL_CORE_PREFIX_OWNED_H
#define KVHAL_CORE_PREFIX_OWNED_H

#include "common.h"

/* kvhal_prefix_insert + kvhal_prefix_unlock(handle) as one step. suffix false: tokens and pages are the whole
 * request's, and it first checks that handle (a locked match of this request, or NULL) lies on the tokens' path and
 * that pages[] repeats the cached pages up to it; nothing changes when a check fails. suffix true: they are what
 * follows the handle's cached prefix, inserted below it (already_cached then counts from there too). The pages past
 * the handle's are the caller's to have checked (the cache manager has: each one is a page its request holds). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_insert_unlock(kvhal_prefix_cache *pc, const int32_t *tokens,
                                                      size_t num_tokens, const int32_t *pages,
                                                      kvhal_prefix_handle handle, bool suffix,
                                                      size_t *already_cached);
/* Validates handle and gives the tokens from the root through it (0 for NULL). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_handle_len(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle,
                                                   size_t *len);
/* Validates handle and gives the last page of its node (-1 for the root). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_handle_last_page(const kvhal_prefix_cache *pc, kvhal_prefix_handle handle,
                                                         int32_t *page);
/* Locks the node a handle from kvhal_prefix_match names (0: the root, which needs no lock) and gives a request
 * handle (a ticket) for that lock: the cache manager's match hands it out, and finishing or unlocking it consumes
 * it, so that a second finish of one request is KVHAL_INVALID_HANDLE. bound: the tokens the request's match covered
 * (kvhal__prefix_ticket_bound). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_ticket(kvhal_prefix_cache *pc, kvhal_prefix_handle node_h, size_t bound,
                                               kvhal_prefix_handle *out);
/* A request handle's bound: what the tokens its match reported on reach (set: lowers it to *set first when set is
 * not NULL). KVHAL_INVALID_HANDLE for anything but a live request handle. */
KVHAL_HIDDEN kvhal_status kvhal__prefix_ticket_bound(kvhal_prefix_cache *pc, kvhal_prefix_handle handle,
                                                     const size_t *set, size_t *bound);
/* The calls a cache manager makes on its own prefix cache: as the public ones (owner flag included), but without
 * the live-handle lookup (the manager's cache lives as long as the manager, which its own entry looked up).
 * match's view (NULL: none): where the matched pages are, either a pointer into the tree's own storage (a match
 * within one node under the root: no copy; the buffer stays readable and unchanged until the next match with a
 * view, whatever the calls in between do to its node) or pages, which they were copied into. */
KVHAL_HIDDEN kvhal_status kvhal__prefix_match_owned(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                                    kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                                    size_t pages_cap, const int32_t **view);
KVHAL_HIDDEN kvhal_status kvhal__prefix_size_info_get_owned(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out);
KVHAL_HIDDEN kvhal_status kvhal__prefix_evict_owned(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn,
                                                    void *user, size_t *evicted);
KVHAL_HIDDEN kvhal_status kvhal__prefix_check_integrity_owned(const kvhal_prefix_cache *pc);
/* Marks pc as a cache manager's (kvhal_prefix_cache_destroy refuses it) or not; false if pc is not live. */
KVHAL_HIDDEN bool kvhal__prefix_set_manager_owned(kvhal_prefix_cache *pc, bool owned);

#endif

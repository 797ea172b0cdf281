/* handles.h — the live-handle set (handles.c) of every handle a caller destroys: buffers, streams, events, host
 * memory, caches, prefix caches, cache managers, block pools. */
#ifndef KVHAL_CORE_HANDLES_H
#define KVHAL_CORE_HANDLES_H

#include "common.h"

/* Live-handle set for handles a caller destroys (buffers, streams, caches): destroy removes first and fails with
 * KVHAL_INVALID_HANDLE when the pointer is not live, so a double destroy never frees twice. add returns false
 * only when the set cannot grow (out of memory). */
KVHAL_HIDDEN bool kvhal__handle_add(const void *p);
/* Removes p from the live set, but only when the live handle's first uint32_t is magic: destroying a live handle of another kind (a
 * stream passed as a buffer) fails with KVHAL_INVALID_HANDLE instead of freeing it as the wrong type. Every handle
 * struct starts with its magic. */
KVHAL_HIDDEN bool kvhal__handle_remove_kind(const void *p, uint32_t magic);
/* The live set's table size in slots (tests: it follows the live count both ways). */
KVHAL_HIDDEN size_t kvhal__handle_table_slots(void);
/* Whether p is in the live set with magic as its first word (nothing of p is read otherwise). */
KVHAL_HIDDEN bool kvhal__handle_live(const void *p, uint32_t magic);

#endif

/* owner.h — single-owner objects (prefix cache, cache manager): a cheap detector of concurrent use. Macros only. */
#ifndef KVHAL_CORE_OWNER_H
#define KVHAL_CORE_OWNER_H

#include "error.h"

/* Each such object has an atomic_bool in_use; a status-returning call sets it on entry and clears it on exit. A
 * call that finds it set (another thread inside a call on the same object, or a callback calling back in) returns
 * KVHAL_BUSY with a message naming the object, having touched nothing. It does not make sharing safe: the caller
 * serialises; it turns what would hang or corrupt the object into a refusal. */
#define KVHAL_OWNER_ENTER(obj, what)                                                                            \
    do {                                                                                                        \
        if (atomic_exchange_explicit(&(obj)->in_use, true, memory_order_acquire))                               \
            return kvhal__err(KVHAL_BUSY, "%s: %p is in use by another call (another thread, or a callback calling " \
                              "back in); it is single-owner: serialise the calls on it", what, (const void *)(obj)); \
    } while (0)
#define KVHAL_OWNER_LEAVE(obj) atomic_store_explicit(&(obj)->in_use, false, memory_order_release)
/* The whole of a single-owner entry point: check (a status expression), take obj (a non-const pointer; KVHAL_BUSY
 * naming what if another call holds it), return call's status after letting obj go. */
#define KVHAL_OWNED_CALL(check, obj, what, call)                                                                  \
    do {                                                                                                        \
        KVHAL_TRY(check);                                                                                       \
        KVHAL_OWNER_ENTER(obj, what);                                                                           \
        const kvhal_status owned_st_ = (call);                                                                  \
        KVHAL_OWNER_LEAVE(obj);                                                                                 \
        return owned_st_;                                                                                       \
    } while (0)

#endif

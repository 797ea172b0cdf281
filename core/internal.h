/* internal.h — what core files share with each other and nothing else: the buffer and stream structs, error
 * helpers, the dispatch lookup, the descriptor-cache hook used by the built-in ops, and test hooks. */
#ifndef KVHAL_CORE_INTERNAL_H
#define KVHAL_CORE_INTERNAL_H

#include "kvhal.h"
#include "kvhal_backend.h"

#define KVHAL_HIDDEN __attribute__((visibility("hidden")))

/* Handle magics: checked on every use; cleared on destroy so that a double destroy is caught while the memory is
 * still ours (buffers and caches are kept in a live-handle set, see handles.c). */
enum {
    KVHAL_MAGIC_BUFFER = 0x4b564246,  /* KVBF */
    KVHAL_MAGIC_STREAM = 0x4b565354,  /* KVST */
    KVHAL_MAGIC_DEAD = 0x44454144,
};

struct kvhal_buffer {
    uint32_t magic;
    bool owned;              /* created by kvhal (freed on destroy) or wrapped (borrowed) */
    kvhal_device device;
    const kvhal_backend *backend;
    void *native;
    size_t size;
};

struct kvhal_stream {
    uint32_t magic;
    bool owned;
    kvhal_device device;
    const kvhal_backend *backend;
    void *bk_stream;         /* what the backend's stream_create/stream_wrap returned */
};

/* ---- errors (error.c) ---- */
/* Sets this thread's message and returns status. */
KVHAL_HIDDEN kvhal_status kvhal__err(kvhal_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
KVHAL_HIDDEN void kvhal__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Propagate: if (st != KVHAL_OK) return st; (message already set by the callee) */
#define KVHAL_TRY(expr)                                                                                         \
    do {                                                                                                        \
        kvhal_status kvhal__st = (expr);                                                                        \
        if (kvhal__st != KVHAL_OK) return kvhal__st;                                                            \
    } while (0)

#define KVHAL_CHECK_ARG(cond, ...)                                                                              \
    do {                                                                                                        \
        if (!(cond)) return kvhal__err(KVHAL_INVALID_ARGUMENT, __VA_ARGS__);                                    \
    } while (0)

/* ---- registry (registry.c) ---- */
/* The backend serving (type, id), or NULL with an error set (unknown type, backend not loaded, id out of range).
 * O(1): an array index after the one-time load. The returned table is full-size: slots the module did not
 * provide are NULL. */
KVHAL_HIDDEN const kvhal_backend *kvhal__backend(kvhal_device dev);
/* The same, returning the status; the message names the argument arg ("k_cache.device"). */
KVHAL_HIDDEN kvhal_status kvhal__lookup(kvhal_device dev, const char *arg, const kvhal_backend **out);
KVHAL_HIDDEN const kvhal_core_services *kvhal__services(void);
/* The CPU backend's table (backends/cpu), compiled into the core. */
KVHAL_HIDDEN const kvhal_backend *kvhal__cpu_backend(void);

/* ---- handles (buffer.c) ---- */
/* Validates a buffer handle (non-NULL, live magic); the message names argname. */
KVHAL_HIDDEN kvhal_status kvhal__check_buffer(const kvhal_buffer *b, const char *argname);
KVHAL_HIDDEN kvhal_status kvhal__check_stream(const kvhal_stream *s, kvhal_device dev, const char *argname);
/* Backend stream pointer of s (NULL = default). */
static inline void *kvhal__bk_stream(const kvhal_stream *s) { return s ? s->bk_stream : NULL; }
KVHAL_HIDDEN bool kvhal__device_equal(kvhal_device a, kvhal_device b);
/* Live-handle set for handles a caller destroys (buffers, streams, caches): destroy removes first and fails with
 * KVHAL_INVALID_HANDLE when the pointer is not live, so a double destroy never frees twice. add returns false
 * only when the set cannot grow (out of memory). */
KVHAL_HIDDEN bool kvhal__handle_add(const void *p);
KVHAL_HIDDEN bool kvhal__handle_remove(const void *p);

/* ---- tensors (tensor.c) ---- */
/* Validates t and names it argname in the message. */
KVHAL_HIDDEN kvhal_status kvhal__check_tensor(const kvhal_tensor *t, const char *argname);
KVHAL_HIDDEN void kvhal__to_bk_tensor(const kvhal_tensor *t, kvhal_bk_tensor *out);

/* ---- descriptor cache (desc_cache.c) ---- */
/* Built-in op kinds, registered at first use under these ids (0..KVHAL_BK_OP_COUNT-1); their destroy function
 * calls the owning backend's desc_destroy. */
/* Returns a cached descriptor for (dev, key) or creates one with backend->desc_create(args) and caches it.
 * *desc may be NULL for backends without desc_create. */
KVHAL_HIDDEN kvhal_status kvhal__desc_get_or_create(kvhal_device dev, const kvhal_backend *bk, kvhal_bk_op op,
                                                      const kvhal_desc_key *key, const void *args, void **desc);
KVHAL_HIDDEN void kvhal__desc_cache_shutdown(void);

/* ---- fault injection (faults.c) ---- */
/* Every host allocation the core makes on a caller's behalf goes through these; KVHAL_FAULT_ALLOC=N (or
 * kvhal__fault_set) makes the N-th allocation from then on fail. */
KVHAL_HIDDEN void *kvhal__malloc(size_t n);
KVHAL_HIDDEN void *kvhal__calloc(size_t n, size_t size);
KVHAL_HIDDEN void *kvhal__realloc(void *p, size_t n);
KVHAL_HIDDEN bool kvhal__alloc_should_fail(void);

#endif

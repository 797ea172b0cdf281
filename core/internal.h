/* internal.h — what core files share with each other and nothing else: the loaded-backend struct, the buffer and
 * stream structs, error helpers, the dispatch lookup, the descriptor-cache hook used by the built-in ops, and the
 * fault-injection hooks. Backends never include it: they see kvhal_backend.h only. */
#ifndef KVHAL_CORE_INTERNAL_H
#define KVHAL_CORE_INTERNAL_H

#include <stdatomic.h>

#include "kvhal.h"
#include "kvhal_backend.h"

#define KVHAL_HIDDEN __attribute__((visibility("hidden")))

/* Counts the public enums no longer carry (a public *_COUNT would change with every added value). */
#define KVHAL__X_ONE(name, code, msg) +1
enum { KVHAL__STATUS_COUNT = 0 KVHAL_STATUS_MAP(KVHAL__X_ONE) };
#undef KVHAL__X_ONE
enum { KVHAL__DTYPE_COUNT = KVHAL_FP8_E5M2FNUZ + 1, KVHAL__BUILTIN_TYPES = KVHAL_DEVICE_OPENCL + 1 };

/* Handle magics: checked on every use; cleared on destroy so that a double destroy is caught while the memory is
 * still ours (buffers, streams and caches are kept in a live-handle set, see buffer.c). */
enum {
    KVHAL_MAGIC_BUFFER = 0x4b564246,  /* KVBF */
    KVHAL_MAGIC_STREAM = 0x4b565354,  /* KVST */
    KVHAL_MAGIC_DEAD = 0x44454144,
    KVHAL_MAGIC_HOSTMEM = 0x4b56484d, /* KVHM */
    KVHAL_MAGIC_EVENT = 0x4b564556,   /* KVEV */
};

/* A loaded backend module as the core calls it: its two function groups copied full-size (slots past the module's
 * struct_size are NULL), the context its init returned, and the type id the registry gave its device type. Never
 * freed or moved once published (modules stay loaded), so buffers and streams keep a plain pointer to it. */
typedef struct kvhal__bk {
    kvhal_backend_device_fns dev;
    kvhal_backend_op_fns ops;
    void *ctx;
    kvhal_device_type type;
    int32_t device_count;
    char type_name[KVHAL_DEVICE_TYPE_NAME_MAX];
    char name[32];
    void *(*get_proc_address)(void *ctx, const char *name);
} kvhal__bk;

enum { KVHAL__BUF_PLAIN = 0, KVHAL__BUF_SHAREABLE = 1, KVHAL__BUF_IMPORTED = 2 };
struct kvhal_buffer {
    uint32_t magic;
    bool owned;              /* created by kvhal (freed on destroy) or wrapped (borrowed) */
    uint8_t ipc;             /* KVHAL__BUF_PLAIN, _SHAREABLE (buffer_alloc_shareable), _IMPORTED (ipc_import) */
    kvhal_device device;
    const kvhal__bk *backend;
    void *native;
    size_t size;
};

struct kvhal_stream {
    uint32_t magic;
    bool owned;
    kvhal_device device;
    const kvhal__bk *backend;
    void *bk_stream;         /* what the backend's stream_create/stream_wrap returned */
};

struct kvhal_event {
    uint32_t magic;
    kvhal_device device;
    const kvhal__bk *backend;
    void *bk_event;          /* what the backend's event_create returned; NULL where it has no events */
};

struct kvhal_host_memory {
    uint32_t magic;
    bool pinned;             /* from the backend's host_alloc (else posix_memalign) */
    kvhal_device device;
    const kvhal__bk *backend;
    void *ptr;
    size_t size;
};

/* ---- errors (error.c) ---- */
/* Sets this thread's message and returns status. */
KVHAL_HIDDEN kvhal_status kvhal__err(kvhal_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
KVHAL_HIDDEN void kvhal__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops an incomplete UTF-8 sequence at the end of s (what snprintf leaves when it cuts a name in two). */
KVHAL_HIDDEN void kvhal__utf8_trim(char *s);

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

/* ---- single-owner objects (prefix cache, cache manager): a cheap detector of concurrent use ----
 * Each such object has an atomic_bool in_use; a status-returning call sets it on entry and clears it on exit. A
 * call that finds it set (another thread inside a call on the same object, or a callback calling back in) returns
 * KVHAL_BUSY with a message naming the object, having touched nothing. It does not make sharing safe: the caller
 * serialises; it turns what used to hang or corrupt the object into a refusal. */
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
/* ---- versions (version.c) ---- */
/* Copies the caller's config struct cfg (a leading size_t struct_size) into local, whose type is the current one:
 * struct_size must be one of known[0..nknown) (the sizes the struct has had in releases, oldest first, the last
 * = sizeof the current struct); fields past an older caller's size are zero. Otherwise KVHAL_INVALID_ARGUMENT
 * naming arg and the initialiser init ("KVHAL_PAGED_CACHE_CONFIG_INIT"); a NULL cfg too. */
KVHAL_HIDDEN kvhal_status kvhal__config_in(const void *cfg, void *local, const size_t *known, size_t nknown,
                                           const char *arg, const char *init);

/* ---- registry (registry.c) ---- */
/* The backend serving dev, with the status; the message names the argument arg ("k_cache.device"): not a
 * registered type, no module loaded for it, id out of range. O(1): an array index (the one-time discovery aside). */
KVHAL_HIDDEN kvhal_status kvhal__lookup(kvhal_device dev, const char *arg, const kvhal__bk **out);
/* Whether a module file may be loaded: a regular file (looked at without opening it otherwise, then opened with
 * O_NONBLOCK), it and its folder owned by root or the effective user and not group- or other-writable. true: *fd is
 * the file opened (the caller closes it); false: why holds the reason ("refused: ..."). */
KVHAL_HIDDEN bool kvhal__module_file_check(const char *path, int *fd, char *why, size_t n);
/* The CPU backend's entry point (backends/cpu), compiled into the core but reached like any module's. */
KVHAL_HIDDEN const kvhal_backend *kvhal__cpu_backend_entry(uint32_t core_abi_version);
/* "the npu backend (device npu:0) does not implement copy_blocks" */
KVHAL_HIDDEN kvhal_status kvhal__unsupported(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op,
                                             const char *reason);
/* "paged_caching" */
KVHAL_HIDDEN const char *kvhal__op_name(kvhal_bk_op op);
/* Whether t is a registered type id (built in, or given to a loaded module's name). */
KVHAL_HIDDEN bool kvhal__type_registered(kvhal_device_type t);
/* The id of the registered type name[0..len), or -1 (loads the modules first). */
KVHAL_HIDDEN int kvhal__find_type(const char *name, size_t len);
/* "<arg>: "npu:0": "npu" is not a registered device type (registered: cpu, cuda, ...)" with status st; text[0..len)
 * is the type name within the NUL-terminated text. */
KVHAL_HIDDEN kvhal_status kvhal__type_error(kvhal_status st, const char *arg, const char *text, size_t len);

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
/* Removes p from the live set, but only when the live handle's first uint32_t is magic: destroying a live handle of another kind (a
 * stream passed as a buffer) fails with KVHAL_INVALID_HANDLE instead of freeing it as the wrong type. Every handle
 * struct starts with its magic. */
KVHAL_HIDDEN bool kvhal__handle_remove_kind(const void *p, uint32_t magic);
/* The live set's table size in slots (tests: it follows the live count both ways). */
KVHAL_HIDDEN size_t kvhal__handle_table_slots(void);
/* Whether p is in the live set with magic as its first word (nothing of p is read otherwise). */
KVHAL_HIDDEN bool kvhal__handle_live(const void *p, uint32_t magic);

/* Validates a host memory handle (host_memory.c); the message names argname. */
KVHAL_HIDDEN kvhal_status kvhal__check_host_memory(const kvhal_host_memory *h, const char *argname);

/* ---- tensors (tensor.c) ---- */
/* Validates t and names it argname in the message. */
KVHAL_HIDDEN kvhal_status kvhal__check_tensor(const kvhal_tensor *t, const char *argname);
KVHAL_HIDDEN void kvhal__to_bk_tensor(const kvhal_tensor *t, kvhal_bk_tensor *out);

/* ---- descriptor cache (desc_cache.c) ---- */
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
KVHAL_HIDDEN void kvhal__desc_cache_shutdown(void);
/* Sets key->hash from key->op and key->words[0..nwords), for the built-in ops that fill the words directly
 * (one hashing pass instead of one call per word). */
KVHAL_HIDDEN void kvhal__desc_key_rehash(kvhal_desc_key *key);
/* The descriptor cached for (dev, key) on this thread, or NULL; no stats, no allocation. */
KVHAL_HIDDEN void *kvhal__desc_peek(kvhal_device dev, const kvhal_desc_key *key);

/* ---- ops (core/ops/: dispatch.c and one file per op) ---- */
/* Two tensor copies (K and V of a static cache) that either both run or fail before either writes: all
 * validation and descriptor allocation comes first. names: argument names of dst0, src0, dst1, src1. */
KVHAL_HIDDEN kvhal_status kvhal__tensor_copy_pair(const kvhal_tensor *dst0, const kvhal_tensor *src0,
                                                  const kvhal_tensor *dst1, const kvhal_tensor *src1,
                                                  const char *const names[4], kvhal_stream *s);

/* ---- prefix cache (prefix.c): what the cache manager needs beyond the API ---- */
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
 * it, so that a second finish of one request is KVHAL_INVALID_HANDLE. */
KVHAL_HIDDEN kvhal_status kvhal__prefix_ticket(kvhal_prefix_cache *pc, kvhal_prefix_handle node_h,
                                               kvhal_prefix_handle *out);
/* The calls a cache manager makes on its own prefix cache: as the public ones (owner flag included), but without
 * the live-handle lookup (the manager's cache lives as long as the manager, which its own entry looked up). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_match_owned(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                                    kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                                    size_t pages_cap);
KVHAL_HIDDEN kvhal_status kvhal__prefix_size_info_get_owned(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out);
KVHAL_HIDDEN kvhal_status kvhal__prefix_evict_owned(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn,
                                                    void *user, size_t *evicted);
KVHAL_HIDDEN kvhal_status kvhal__prefix_check_integrity_owned(const kvhal_prefix_cache *pc);
/* Marks pc as a cache manager's (kvhal_prefix_cache_destroy refuses it) or not; false if pc is not live. */
KVHAL_HIDDEN bool kvhal__prefix_set_manager_owned(kvhal_prefix_cache *pc, bool owned);
/* Calls fn with the pages of every node (integrity checks). */
KVHAL_HIDDEN kvhal_status kvhal__prefix_for_each_page(const kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user);

/* ---- fault injection (faults.c) ---- */
/* Every host allocation the core makes on a caller's behalf goes through these; KVHAL_FAULT_ALLOC=N (or
 * kvhal__fault_set) makes the N-th allocation from then on fail. */
KVHAL_HIDDEN void *kvhal__malloc(size_t n);
KVHAL_HIDDEN void *kvhal__calloc(size_t n, size_t size);
KVHAL_HIDDEN void *kvhal__realloc(void *p, size_t n);
KVHAL_HIDDEN bool kvhal__alloc_should_fail(void);
/* kvhal_fault_hold_streams: queries report BUSY while held; waits are counted (faults.c). */
KVHAL_HIDDEN bool kvhal__streams_held(void);
KVHAL_HIDDEN void kvhal__stream_waited(void);

#endif

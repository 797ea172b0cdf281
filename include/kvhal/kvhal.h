/**
 * @file kvhal.h
 * @brief The public API of kvhal: devices, buffers, streams, tensors, errors, ops, KV caches, block pool, prefix
 * cache, cache manager and the descriptor cache.
 *
 * Users include `<kvhal/kvhal.h>` and nothing else (backend authors also include `<kvhal/kvhal_backend.h>`).
 *
 * Conventions that hold for every function below unless its own comment says otherwise:
 * - Errors: every call that can fail returns a ::kvhal_status; on failure kvhal_last_error() names the argument and
 *   the value at fault, and nothing was changed (no partial writes to outputs other than those documented). Bad
 *   input is never undefined behaviour: NULL out pointers, invalid handles and out-of-range values are statuses.
 *   The library never aborts, exits or prints on the caller's behalf (see kvhal_log_set()).
 * - Handles (buffers, streams, caches, pools, prefix caches, cache managers) are owned by the caller from create to
 *   destroy; `*_destroy(NULL)` returns KVHAL_OK; a destroyed or foreign handle is KVHAL_INVALID_HANDLE where the
 *   function checks handles (buffers, streams, caches).
 * - Threads: the error, version, log, device and registry calls may be called from any thread at once. A cache,
 *   paged cache, static cache, block pool, prefix cache or cache manager is a single-owner object: one thread at a
 *   time may call functions on it (different objects may be used from different threads at once). Ops and copies
 *   on different streams may be issued from different threads.
 * - Streams: a NULL ::kvhal_stream means the device's default stream. Ops and device-to-device copies are enqueued
 *   on the stream and return before the device has finished (on the CPU backend they run to completion).
 * - Graph capture (CUDA/HIP): the ops (kvhal_paged_caching(), kvhal_copy_blocks(), kvhal_tensor_copy() and the
 *   cache functions that call them) enqueue kernels only and may be captured once their descriptor is cached (the
 *   first call with a given shape creates it, which may allocate device memory: make it before capturing). Calls
 *   that synchronise (kvhal_device_synchronize(), kvhal_stream_synchronize(), host<->device copies, creates and
 *   destroys) must not be called while a stream of that device is capturing.
 */
#ifndef KVHAL_H
#define KVHAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks the functions libkvhal.so exports (every other symbol of the library is hidden). */
#if defined(__GNUC__)
#define KVHAL_API __attribute__((visibility("default")))
#else
#define KVHAL_API
#endif

/** Major version of this header: a new major version may break source and binary compatibility. */
#define KVHAL_VERSION_MAJOR 0
/** Minor version of this header: minor releases only add (see docs/ABI.md). */
#define KVHAL_VERSION_MINOR 1
/** Patch version of this header: fixes only. */
#define KVHAL_VERSION_PATCH 0
/** The version of this header as a string, "MAJOR.MINOR.PATCH" (kvhal_version() gives the library's). */
#define KVHAL_VERSION_STRING "0.1.0"
/** One number for comparisons in the preprocessor: MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0 is 100). */
#define KVHAL_VERSION_NUMBER (KVHAL_VERSION_MAJOR * 10000 + KVHAL_VERSION_MINOR * 100 + KVHAL_VERSION_PATCH)

/* ------------------------------------------------------------------------------------------------------------ */
/* Errors. One table generates the enum, kvhal_status_name() and kvhal_status_string().                          */
/* ------------------------------------------------------------------------------------------------------------ */
/** The status table: X(name, code, message) per status; generates ::kvhal_status, kvhal_status_name() and
 *  kvhal_status_string(). Codes never change; new statuses are appended in a minor release (callers must treat an
 *  unknown code as a failure). */
#define KVHAL_STATUS_MAP(X)                                                                                     \
    X(OK, 0, "success")                                                                                         \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                                                  \
    X(OUT_OF_RANGE, 2, "index, size or length out of range")                                                    \
    X(OUT_OF_MEMORY, 3, "out of memory")                                                                        \
    X(NO_DEVICE, 4, "no such device")                                                                           \
    X(BACKEND_UNAVAILABLE, 5, "backend not built or not loaded")                                                \
    X(UNSUPPORTED, 6, "not supported by this backend, dtype or layout")                                         \
    X(DEVICE_MISMATCH, 7, "arguments live on different devices")                                                \
    X(SHAPE_MISMATCH, 8, "tensor shapes do not match")                                                          \
    X(DTYPE_MISMATCH, 9, "tensor dtypes do not match")                                                          \
    X(BACKEND_ERROR, 10, "the device runtime reported an error")                                                \
    X(DEVICE_FAULT, 11, "a device-side check failed (out-of-range index skipped)")                             \
    X(NOT_FOUND, 12, "not found")                                                                               \
    X(BUSY, 13, "resource is locked or in use")                                                                 \
    X(ABI_MISMATCH, 14, "plugin ABI version not supported")                                                     \
    X(LOAD_FAILED, 15, "plugin could not be loaded")                                                            \
    X(INVALID_HANDLE, 16, "handle is NULL, destroyed or of the wrong kind")                                     \
    X(INTEGRITY, 17, "internal consistency check failed")                                                       \
    X(PARSE_ERROR, 18, "malformed input text")                                                                  \
    X(INTERNAL, 19, "internal error")                                                                           \
    X(TIMEOUT, 20, "timed out")                                                                                 \
    X(PEER_FAILED, 21, "the remote peer failed, closed or broke the protocol")                                \
    X(CANCELED, 22, "canceled")

/** What every fallible call returns: KVHAL_OK (0) or the reason it failed (KVHAL_STATUS_MAP lists them all with
 *  their meaning; kvhal_last_error() has the details). */
typedef enum kvhal_status {
#define KVHAL_X_ENUM(name, code, msg) KVHAL_##name = code,
    KVHAL_STATUS_MAP(KVHAL_X_ENUM)
#undef KVHAL_X_ENUM
} kvhal_status;

/** The status's enumerator name, e.g. "KVHAL_INVALID_ARGUMENT".
 *  @param s any value (an unknown one is not an error).
 *  @return a static string; "KVHAL_UNKNOWN_STATUS" for a value that is not a status.
 *  Thread safety: any thread. */
KVHAL_API const char *kvhal_status_name(kvhal_status s);
/** A short description of the status, e.g. "invalid argument".
 *  @param s any value.
 *  @return a static string; "unknown status" for a value that is not a status.
 *  Thread safety: any thread. */
KVHAL_API const char *kvhal_status_string(kvhal_status s);
/** The message of the last failing kvhal call on this thread, naming the argument and the value at fault
 *  ("KVHAL_INVALID_ARGUMENT: cfg.num_heads: 0 must be >= 1").
 *  @return never NULL; "" when no call failed yet on this thread (or since kvhal_clear_error()). Owned by kvhal,
 *  valid until the next kvhal call on this thread. Successful calls do not clear it.
 *  Thread safety: thread-local; any thread. */
KVHAL_API const char *kvhal_last_error(void);
/** Empties this thread's kvhal_last_error() message.
 *  Thread safety: thread-local; any thread. */
KVHAL_API void kvhal_clear_error(void);
/**
 * Sets this thread's last-error message, as kvhal's own calls do ("KVHAL_<NAME>: " then the formatted text), for
 * kvhal's companion libraries (libkvhal-xfer) so that their errors read like the core's.
 * @param status  the status the caller is about to return.
 * @param fmt     printf format (NULL = ""), read during the call.
 * @return status, unchanged.
 * Thread safety: writes only the calling thread's message.
 */
KVHAL_API kvhal_status kvhal_error_set(kvhal_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ------------------------------------------------------------------------------------------------------------ */
/* Threads, owners and destroyed handles (what holds for every object below)                                    */
/* ------------------------------------------------------------------------------------------------------------ */
/* Thread safety, per object:
 * - Thread-safe (any thread, at once): the device and registry calls; the ops (kvhal_tensor_copy,
 *   kvhal_paged_caching, kvhal_copy_blocks), the memcpy family and kvhal_memset on memory that no two of the calls
 *   write at once, on the default stream (NULL) or each thread on streams of its own; buffer and stream queries;
 *   tensor views (plain values); the descriptor cache (each
 *   thread has its own caches; op registration and capacities are global and locked); the conversions; errors
 *   (kvhal_last_error is per thread); fault injection (process-wide).
 * - Single-owner (one thread at a time; the caller serialises every call on the object, queries included, and a
 *   destroy must not race with any use): a stream (kvhal_stream_synchronize and the calls that enqueue on it), the
 *   caches (kvhal_kv_cache, kvhal_static_cache, kvhal_paged_cache), the block pool, the prefix cache and the cache
 *   manager. Different objects may be used from different threads at once.
 * - Detected: a status-returning call on a prefix cache or a cache manager while another call on the same object
 *   is running (another thread, or a callback such as kvhal_prefix_evict's calling back in) returns KVHAL_BUSY,
 *   naming the object, and changes nothing: a cheap atomic flag per call. It makes misuse visible, not safe. The
 *   queries that return a value instead of a status (kvhal_cache_manager_available, _num_free, _pages_evicted,
 *   kvhal_prefix_cache_page_size) are not covered, nor are the other single-owner objects.
 * Destroyed handles:
 * - Prefix-cache handles (kvhal_prefix_handle) carry a generation: a stale one is always KVHAL_INVALID_HANDLE.
 * - Object pointers (buffers, streams, caches, block pools, prefix caches, cache managers) are looked up in a set of
 *   live objects by *_destroy, and by every status-returning call of the prefix cache and the cache manager: a
 *   destroyed one is KVHAL_INVALID_HANDLE there, without its memory being read, unless a new object of the same
 *   kind has since been created at the same address (a pointer cannot tell the two apart: it then names the new
 *   object). Every other call with a destroyed buffer, stream, cache or block pool is undefined, as with freed
 *   memory: checking each use against the set would put a lock on every op's path.
 * Fork: a device runtime does not survive fork(). In a child forked (fork(), with its pthread_atfork handlers) from
 * the process that initialised a backend module (OpenCL, CUDA, HIP, a vendor's), every call that would reach that
 * module returns KVHAL_BACKEND_UNAVAILABLE naming the device and both process ids: creating buffers, streams,
 * events and caches on its devices, device queries and synchronisation, copies and ops change nothing; a destroy of
 * the parent's buffer, stream, event or pinned host memory there frees only the child's handle (the child never
 * releases the device memory or object, which is the parent's). The built-in cpu device
 * works in the child, the parent's cpu buffers included. A child that needs another device is started with exec, or
 * forked before the process's first kvhal call. */

/** The version of the loaded library, "MAJOR.MINOR.PATCH" (compare with ::KVHAL_VERSION_STRING, the header's).
 *  @return a static string, valid for the life of the process.
 *  Thread safety: any thread. Graph capture: any time. */
KVHAL_API const char *kvhal_version(void);

/** Severity of a log message (KVHAL_LOG=error|warn|info|debug selects the most verbose one delivered). */
typedef enum kvhal_log_level {
    KVHAL_LOG_ERROR = 0, /**< the library could not do something it was asked to (also returned as a status) */
    KVHAL_LOG_WARN = 1,  /**< a setting was ignored or a fallback taken (a malformed environment variable) */
    KVHAL_LOG_INFO = 2,  /**< what was found and chosen (modules, devices) */
    KVHAL_LOG_DEBUG = 3  /**< every error message as it is set for kvhal_last_error() */
} kvhal_log_level;
/** A host application's log sink (see kvhal_log_set()).
 *  @param level the message's severity.
 *  @param message one line without a trailing newline, NUL-terminated; valid only during the call (copy it).
 *  @param user the pointer given to kvhal_log_set().
 *  Called on the thread that logs, possibly several threads at once; it must not block for long. A message may be
 *  logged while kvhal holds an internal lock (module discovery), so the callback must not call kvhal functions
 *  other than kvhal_status_name() and kvhal_status_string(). */
typedef void (*kvhal_log_fn)(kvhal_log_level level, const char *message, void *user);
/** Routes kvhal's log messages to the application's logger instead of stderr.
 *
 *  Which messages are delivered: those at or above the level KVHAL_LOG names; when KVHAL_LOG is unset, none go to
 *  stderr (the default sink) and, once a callback is installed, ::KVHAL_LOG_WARN and ::KVHAL_LOG_ERROR go to it.
 *  @param fn the callback, or NULL to restore the default (stderr, only when KVHAL_LOG is set).
 *  @param user passed back to fn; kvhal does not own it. Keep it valid until another kvhal_log_set() call has
 *  returned and no message can still be in flight on another thread.
 *  @return KVHAL_OK.
 *  Thread safety: any thread; a message being delivered on another thread during the call may still reach the
 *  previous callback. Graph capture: any time. */
KVHAL_API kvhal_status kvhal_log_set(kvhal_log_fn fn, void *user);

/* ------------------------------------------------------------------------------------------------------------ */
/* Devices                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
/* The device and registry calls below (parse through get_proc_address):
 * - Threads: any of them may be called from several threads at once. Module discovery runs once, on the first call
 *   that needs it; kvhal_backend_load is serialised with it; lookups afterwards take no lock.
 * - GPU graphs: none of them enqueues device work, so none is recorded in a graph. The first call of the process
 *   initialises the device runtimes (discovery), so make it before a capture starts. kvhal_device_synchronize and
 *   kvhal_device_check_errors wait for the device and must not be called while one of its streams is captured.
 * - Ownership: they take nothing from the caller (strings are read during the call) and hand out no memory the
 *   caller frees. Registered names, module infos and extras stay valid for the life of the process (modules are
 *   never unloaded).
 * - Bad input: a NULL out pointer or string is KVHAL_INVALID_ARGUMENT naming the argument; an unregistered type
 *   is KVHAL_INVALID_ARGUMENT (by id) or KVHAL_PARSE_ERROR / KVHAL_NOT_FOUND (by name); a registered type that no
 *   loaded module serves is KVHAL_BACKEND_UNAVAILABLE; an id out of range is KVHAL_NO_DEVICE. */

/** Device types. The four built-in names keep these ids whether or not their module is loaded; a module serving
 *  another name ("npu") is given the next free id when it loads (kvhal_device_type_find() looks it up), so a
 *  ::kvhal_device_type may hold values past the named ones. */
typedef enum kvhal_device_type {
    KVHAL_DEVICE_CPU = 0,   /**< the host, served by the CPU backend built into libkvhal */
    KVHAL_DEVICE_CUDA = 1,  /**< NVIDIA GPUs (module libkvhal-cuda.so) */
    KVHAL_DEVICE_HIP = 2,   /**< AMD GPUs (module libkvhal-hip.so) */
    KVHAL_DEVICE_OPENCL = 3 /**< OpenCL devices (module libkvhal-opencl.so) */
} kvhal_device_type;

/** Type ids are below this bound (a module past it is listed as not loaded, with that reason). */
#define KVHAL_MAX_DEVICE_TYPES 16
/** Device ids of one type are below this bound. */
#define KVHAL_MAX_DEVICES_PER_TYPE 64
/** Device type names are shorter than this (including the terminating NUL). */
#define KVHAL_DEVICE_TYPE_NAME_MAX 16

/** One device: a type and an index among the present devices of that type (a plain value, nothing to free). */
typedef struct kvhal_device {
    kvhal_device_type type; /**< the device type (built-in or registered by a module) */
    int32_t id;             /**< 0 .. kvhal_device_count() - 1 */
} kvhal_device;

/** What kvhal_device_get_info() reports. Frozen in layout for the 0.x series (docs/ABI.md). */
typedef struct kvhal_device_info {
    kvhal_device device;  /**< the device asked about */
    char name[256];       /**< "NVIDIA H100 80GB HBM3", "pthread-AMD EPYC..." */
    char backend[KVHAL_DEVICE_TYPE_NAME_MAX]; /**< the device type's name: "cpu", "cuda", "npu" */
    char platform[128];   /**< OpenCL platform name; runtime name otherwise */
    uint64_t total_memory; /**< bytes */
    uint64_t free_memory;  /**< bytes, 0 when the runtime cannot tell */
    int32_t compute_units; /**< multiprocessors, compute units or CPU cores */
    bool peer_access;      /**< can copy directly to other devices of its type */
} kvhal_device_info;

/** Parses a device name: "cpu" | "cpu:0" | "cuda" | "cuda:1" | "opencl:2" | "npu:0", a registered device type name
 *  optionally followed by `:<id>` (a missing id means 0). The type must be registered (built in, or served by a
 *  loaded module); whether the device is present is not checked (kvhal_device_count() tells). Loads the backend
 *  modules on first use.
 *  @param text the name, read during the call.
 *  @param out receives the device.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL argument; KVHAL_PARSE_ERROR for malformed text or an
 *  unregistered type (the message lists the registered ones).
 *  Thread safety: any thread. Graph capture: see the section comment above. */
KVHAL_API kvhal_status kvhal_device_parse(const char *text, kvhal_device *out);
/** Writes a device's name, "cuda:1", into buf (always NUL-terminated when buf_size > 0).
 *  @param dev the device (its type must be registered; the id is not checked against the present devices).
 *  @param buf caller's buffer of buf_size bytes.
 *  @param buf_size its size; 32 is always enough.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL buf, a zero size, an unregistered type or a negative id;
 *  KVHAL_OUT_OF_RANGE when the name does not fit (buf holds its truncated start).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_device_format(kvhal_device dev, char *buf, size_t buf_size);
/** The name of a device type: "cuda"; the name a module registered for types past the built-in ones.
 *  @param t a type id.
 *  @return a static string, valid for the life of the process; "invalid" for an unregistered id.
 *  Thread safety: any thread. */
KVHAL_API const char *kvhal_device_type_name(kvhal_device_type t);
/** The id of a registered device type name.
 *  @param name the type name ("npu"), read during the call.
 *  @param out receives the id.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL argument; KVHAL_NOT_FOUND (naming the registered ones).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_device_type_find(const char *name, kvhal_device_type *out);
/** The device the environment variable KVHAL_DEVICE names (unset or empty: cpu:0). A malformed value or a device
 *  that is not present is an error; there is no silent fallback.
 *  @param out receives the device.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL out; KVHAL_PARSE_ERROR (malformed or unregistered);
 *  KVHAL_BACKEND_UNAVAILABLE (no module serves the type); KVHAL_NO_DEVICE (id not present).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_device_default(kvhal_device *out);
/** The number of present devices of a type.
 *  @param type a type id.
 *  @param count receives the count (0 when no loaded module serves the type).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL count or an unregistered type.
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_device_count(kvhal_device_type type, int32_t *count);
/** Describes a present device.
 *  @param dev the device.
 *  @param out receives the description (caller's storage).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT / KVHAL_BACKEND_UNAVAILABLE / KVHAL_NO_DEVICE as in the section
 *  comment above; KVHAL_BACKEND_ERROR when the runtime fails to answer.
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_device_get_info(kvhal_device dev, kvhal_device_info *out);
/**
 * Waits for all work on the device, then reports and clears its device-side error flag.
 * @param dev the device.
 * @return KVHAL_OK; KVHAL_DEVICE_FAULT when a kernel skipped an out-of-range index since the last check (the message
 *         names the op); KVHAL_NO_DEVICE / KVHAL_BACKEND_UNAVAILABLE / KVHAL_INVALID_ARGUMENT (dev);
 *         KVHAL_BACKEND_ERROR (the runtime failed to wait).
 * Thread safety: any thread. Graph capture: no (it waits for the device). Stream: every stream of the device.
 */
KVHAL_API kvhal_status kvhal_device_synchronize(kvhal_device dev);
/**
 * Reports and clears the device-side error flag after the work queued on the default stream.
 * It waits for the default stream and, through it, kvhal's own streams; a borrowed non-blocking stream's work is
 * checked by kvhal_stream_check_errors (a device-wide wait is kvhal_device_synchronize).
 * @param dev the device.
 * @return as kvhal_device_synchronize.
 * Thread safety: any thread. Graph capture: no (it waits). Stream: the default stream.
 */
KVHAL_API kvhal_status kvhal_device_check_errors(kvhal_device dev);

/** A backend module the registry found (kvhal_backend_module_get(); kvhal-info lists them). Frozen in layout for the
 *  0.x series (docs/ABI.md). */
typedef struct kvhal_backend_module_info {
    char name[32];        /**< the module's own name ("cuda", "acme-npu"), else taken from its file name */
    char device_type[KVHAL_DEVICE_TYPE_NAME_MAX]; /**< the type it serves ("" if it never said) */
    int32_t type_id;      /**< the id that type was given; -1 when the module is not loaded */
    char path[1024];      /**< file loaded, "(built in)" for cpu */
    uint32_t abi_version; /**< the table's version, 0 if it never loaded */
    bool loaded;          /**< whether it serves its type now */
    int32_t device_count; /**< devices it found (0 with a reason when none) */
    char reason[512];     /**< why not loaded, or why zero devices ("no CUDA driver: ...") */
} kvhal_backend_module_info;
/** The number of backend modules found (loaded or not; the built-in CPU backend is the first).
 *  @param count receives it.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL count.
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_backend_module_count(int32_t *count);
/** Describes one backend module.
 *  @param index 0 .. kvhal_backend_module_count() - 1.
 *  @param out receives the description (caller's storage).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL out; KVHAL_OUT_OF_RANGE for a bad index.
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_backend_module_get(int32_t index, kvhal_backend_module_info *out);
/** Loads one more backend module by path after discovery (a vendor runtime registering its plugin itself); the
 *  module stays loaded until the process exits. Not filtered by KVHAL_BACKENDS. Loading the same file twice
 *  returns KVHAL_OK the second time without loading it again.
 *  @param path the module's file, read during the call.
 *  @return KVHAL_OK when it loaded; KVHAL_INVALID_ARGUMENT for a NULL or empty path; KVHAL_LOAD_FAILED (no such
 *  file, no entry symbol, bad table, init failed, its type name is taken or the type bound is reached) or
 *  KVHAL_ABI_MISMATCH, with the reason; the module is then listed as not loaded.
 *  Thread safety: any thread (serialised with discovery). Graph capture: not while any stream is capturing (a
 *  module's init may initialise its runtime). */
KVHAL_API kvhal_status kvhal_backend_load(const char *path);
/** A backend-specific extra that the module serving type exports by name (kvhal_backend.h, get_proc_address).
 *  @param type the device type whose module is asked.
 *  @param name the extra's name, read during the call.
 *  @param out receives the module's pointer (a function or object of the type its documentation gives), valid
 *  while the process runs.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL argument or an unregistered type; KVHAL_NOT_FOUND when the
 *  module has none of that name; KVHAL_BACKEND_UNAVAILABLE when no module serves type.
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_backend_get_proc_address(kvhal_device_type type, const char *name, void **out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams and buffers                                                                                           */
/* ------------------------------------------------------------------------------------------------------------ */
/** A stream (CUDA/HIP stream, OpenCL command queue; the CPU runs in order). NULL everywhere means the device's
 *  default stream. Owned by the caller from create or wrap to kvhal_stream_destroy(). */
typedef struct kvhal_stream kvhal_stream;
/** Device memory (or host memory for cpu) of a known size on one device. Owned by the caller from create or wrap
 *  to kvhal_buffer_destroy(); tensors refer to it without owning it. */
typedef struct kvhal_buffer kvhal_buffer;

/* Current device. No kvhal call changes the calling thread's current device (cudaGetDevice / hipGetDevice): a call
 * on another device selects it and selects the caller's again before it returns (only where they differ).
 *
 * Asynchronous error model (GPU backends; OpenCL alike):
 * - A call returns every error it can see on the host (bad arguments, launch failures) as its status, at once.
 * - Ops are asynchronous on their stream. A check the device makes while running a kernel (a slot_mapping entry or
 *   block id out of range: nothing is written for it) sets the device's error flag; the call that launched the
 *   kernel has already returned KVHAL_OK.
 * - The flag is reported (KVHAL_DEVICE_FAULT, naming the op) and cleared by the first of kvhal_stream_check_errors
 *   (waits for one stream), kvhal_device_check_errors (waits for the default stream and kvhal's streams) or
 *   kvhal_device_synchronize (waits for the device) that runs after the faulting kernel finished. The flag is the
 *   device's, not the stream's: a fault of any stream's finished kernel is reported by whichever check comes first.
 * - The CPU backend checks slots on the host before writing and returns KVHAL_OUT_OF_RANGE from the op itself. */

/** Native handle of the legacy default stream for kvhal_stream_wrap (the value of CUDA's cudaStreamLegacy; NULL
 *  means the same). OpenCL and CPU: the device's default queue. */
#define KVHAL_STREAM_LEGACY ((void *)0x1)
/** Native handle of the per-thread default stream for kvhal_stream_wrap (the value of CUDA's cudaStreamPerThread,
 *  HIP's hipStreamPerThread): work goes to the default stream of whichever thread enqueues it. OpenCL and CPU: the
 *  device's default queue. */
#define KVHAL_STREAM_PER_THREAD ((void *)0x2)

/* Thread safety: every stream call may be made from several threads, each on its own handles; one handle may be
 * used by several threads at once for ops (kvhal does not serialise a native stream: its order is the runtime's).
 * Destroying a handle while another thread uses it is the caller's race. Graph capture: create, wrap, destroy and
 * kvhal_stream_device enqueue nothing and may be called while a stream is being captured; synchronize and
 * check_errors wait and must not be. */
/** Creates a stream on a device (its per-device state is made now, so that ops on it may be captured).
 *  @param dev the device.
 *  @param out receives the stream; the caller destroys it with kvhal_stream_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL out; the device lookup statuses (KVHAL_BACKEND_UNAVAILABLE,
 *  KVHAL_NO_DEVICE); KVHAL_UNSUPPORTED when the backend has no streams; KVHAL_OUT_OF_MEMORY; KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: may be called while another stream is capturing (it enqueues
 *  nothing). */
KVHAL_API kvhal_status kvhal_stream_create(kvhal_device dev, kvhal_stream **out);
/**
 * Borrows a native stream: a cudaStream_t / hipStream_t / cl_command_queue, or one of the default streams.
 * @param dev the device the stream belongs to (opened here: its per-device state is made now, so that ops on the
 *        stream allocate nothing and may be captured into a graph).
 * @param native the native stream, borrowed for the handle's life and never destroyed by kvhal. NULL or
 *        KVHAL_STREAM_LEGACY: the legacy default stream; KVHAL_STREAM_PER_THREAD: the per-thread default stream of
 *        whichever thread enqueues (CUDA, HIP). On OpenCL and CPU these three wrap the device's default queue.
 * @param out receives the handle; release it with kvhal_stream_destroy.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (out NULL, or an OpenCL handle that is not a queue);
 *         KVHAL_DEVICE_MISMATCH (an OpenCL queue of another device); KVHAL_NO_DEVICE / KVHAL_BACKEND_UNAVAILABLE
 *         (dev); KVHAL_UNSUPPORTED (the backend cannot wrap streams); KVHAL_OUT_OF_MEMORY.
 * Thread safety: any thread. Graph capture: may be called while this thread captures (it enqueues nothing; the
 * per-device state is made in the runtime's relaxed capture mode). Stream: none is used.
 */
KVHAL_API kvhal_status kvhal_stream_wrap(kvhal_device dev, void *native, kvhal_stream **out);
/** Destroys a stream made by kvhal_stream_create() (after its queued work) or a wrapper made by kvhal_stream_wrap().
 *  @param s the stream; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE for a destroyed or foreign pointer; KVHAL_BACKEND_ERROR.
 *  Thread safety: not concurrently with other calls using s. Graph capture: not while s is capturing. */
KVHAL_API kvhal_status kvhal_stream_destroy(kvhal_stream *s);
/** Waits until everything queued on the stream has run. It does not read the device-side error flag: call
 *  kvhal_stream_check_errors() for that (a module without a stream wait of its own is waited for device-wide, and
 *  its flag read then, which may give KVHAL_DEVICE_FAULT).
 *  @param s the stream (NULL is refused: use kvhal_device_synchronize() for the default stream).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for NULL; KVHAL_INVALID_HANDLE; KVHAL_BACKEND_ERROR (or
 *  KVHAL_DEVICE_FAULT, see above).
 *  Thread safety: any thread. Graph capture: not while s is capturing. */
KVHAL_API kvhal_status kvhal_stream_synchronize(kvhal_stream *s);
/** The device a stream belongs to.
 *  @param s the stream.
 *  @return its device; {::KVHAL_MAX_DEVICE_TYPES, -1} for NULL or a pointer that is not a live stream.
 *  Thread safety: any thread. */
KVHAL_API kvhal_device kvhal_stream_device(const kvhal_stream *s);
/**
 * Reports device-side faults after the work queued on one stream, without a device-wide wait.
 * Waits for the work already queued on s (nothing else), then reads and clears its device's error flag (see the
 * asynchronous error model above).
 * @param s a live stream handle (borrowed for the call).
 * @return KVHAL_OK; KVHAL_DEVICE_FAULT when a kernel skipped out-of-range indices since the last check (the
 *         message names the op); KVHAL_INVALID_ARGUMENT (s NULL: use kvhal_device_check_errors for the default
 *         stream, or wrap it with KVHAL_STREAM_LEGACY); KVHAL_INVALID_HANDLE (s destroyed or not a stream);
 *         KVHAL_BACKEND_ERROR (the runtime failed to wait, e.g. an earlier kernel crashed).
 * Thread safety: any thread; two threads checking at once each see a fault at most once between them.
 * Graph capture: no (it waits); call it after replaying a graph. Stream: waits for s only.
 */
KVHAL_API kvhal_status kvhal_stream_check_errors(kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Events: a point in a stream's work, to poll or wait for, or to make another stream of the device wait for.     */
/* ------------------------------------------------------------------------------------------------------------ */
/** A device event (cudaEvent_t / hipEvent_t without timing, an OpenCL marker). Owned by the caller from
 *  kvhal_event_create to kvhal_event_destroy. On a backend without events of its own (cpu, and any module that
 *  leaves the plugin table's event slots NULL) kvhal_event_record waits for the stream's work, so the event is
 *  complete on return: correct everywhere, and free where the work is synchronous anyway. */
typedef struct kvhal_event kvhal_event;
/** Creates an event on a device. A new event counts as complete (query: KVHAL_OK) until it is first recorded.
 *  @param dev the device. @param out receives the event; the caller destroys it with kvhal_event_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (out NULL); KVHAL_NO_DEVICE / KVHAL_BACKEND_UNAVAILABLE (dev);
 *          KVHAL_OUT_OF_MEMORY; KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: may be called while a stream is capturing (it enqueues nothing). */
KVHAL_API kvhal_status kvhal_event_create(kvhal_device dev, kvhal_event **out);
/** Destroys an event (a recorded one may still be pending: the runtime lets go of it once it completes).
 *  @param e the event; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE for a destroyed or foreign pointer; KVHAL_BACKEND_ERROR.
 *  Thread safety: not concurrently with other calls using e. Graph capture: enqueues nothing. */
KVHAL_API kvhal_status kvhal_event_destroy(kvhal_event *e);
/** Places the event after the work queued on s so far (recording it again moves it).
 *  @param e a live event. @param s a stream of e's device (NULL: the device's default stream).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (e NULL); KVHAL_INVALID_HANDLE (e or s not live);
 *          KVHAL_DEVICE_MISMATCH (s on another device than e); KVHAL_BACKEND_ERROR (and, on a backend without
 *          events, whatever waiting for s returned).
 *  Thread safety: not concurrently with other calls using e. Graph capture: CUDA/HIP record into a capturing
 *  stream as the runtime does (the event then marks the graph's work); without backend events, not while s is
 *  capturing (it waits). Stream: enqueues on s. */
KVHAL_API kvhal_status kvhal_event_record(kvhal_event *e, kvhal_stream *s);
/** Polls an event.
 *  @param e a live event.
 *  @return KVHAL_OK when the work before its last record is done (or it was never recorded); KVHAL_BUSY while it is
 *          pending (and while kvhal_fault_hold_streams holds); KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE;
 *          KVHAL_BACKEND_ERROR (a failed kernel before it).
 *  Thread safety: any thread. Graph capture: host only, enqueues nothing. Stream: never waits. */
KVHAL_API kvhal_status kvhal_event_query(kvhal_event *e);
/** Waits until the work before the event's last record is done (returns at once for one never recorded).
 *  @param e a live event.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: host only; waits. */
KVHAL_API kvhal_status kvhal_event_synchronize(kvhal_event *e);
/** Makes the work queued on s from now on wait for the event (the host does not wait, where the backend has events).
 *  @param s a stream of e's device (NULL: the device's default stream). @param e a live event.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (e NULL); KVHAL_INVALID_HANDLE; KVHAL_DEVICE_MISMATCH;
 *          KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: as the runtime's cudaStreamWaitEvent. Stream: enqueues on s. */
KVHAL_API kvhal_status kvhal_stream_wait_event(kvhal_stream *s, kvhal_event *e);
/** The device an event belongs to.
 *  @param e the event (borrowed). @return its device; {::KVHAL_MAX_DEVICE_TYPES, -1} for NULL or a pointer that is
 *  not a live event. Thread safety: any thread. Graph capture: host only, enqueues nothing. */
KVHAL_API kvhal_device kvhal_event_device(const kvhal_event *e);

/* Buffers and copies, threads: any thread; a buffer may be read by several threads' calls at once, and destroyed
 * once no call uses it. Graph capture (CUDA/HIP): kvhal_buffer_wrap, _destroy of a wrapped buffer and the accessors
 * enqueue nothing and may be called while a stream is captured; kvhal_buffer_create and _destroy of an owned
 * buffer allocate or free on the default stream and may not; kvhal_memcpy_d2d and kvhal_memset on a captured
 * stream s are recorded (a copy between devices with s NULL is not: it orders the default streams);
 * kvhal_memcpy_h2d and _d2h wait for s and may not be captured. */
/** Allocates device memory.
 *  @param dev the device.
 *  @param bytes the size, at least 1.
 *  @param out receives the buffer; the caller destroys it with kvhal_buffer_destroy(). Contents are undefined.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL out, 0 bytes); the device lookup statuses; KVHAL_OUT_OF_MEMORY.
 *  Thread safety: any thread. Graph capture: not while a stream of dev is capturing. */
KVHAL_API kvhal_status kvhal_buffer_create(kvhal_device dev, size_t bytes, kvhal_buffer **out);
/** Borrows memory the caller owns, without copying: a host pointer (cpu), a device pointer (cuda, hip) or a
 *  cl_mem (opencl).
 *  @param dev the device the memory lives on.
 *  @param native the memory; it must stay valid until the buffer is destroyed. kvhal never frees it.
 *  @param bytes its size.
 *  @param out receives the buffer (kvhal_buffer_destroy() frees the wrapper only).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL out or native, 0 bytes); the device lookup statuses;
 *  KVHAL_OUT_OF_MEMORY; KVHAL_BACKEND_ERROR when the backend rejects the native handle.
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_buffer_wrap(kvhal_device dev, void *native, size_t bytes, kvhal_buffer **out);
/** Frees a buffer made by kvhal_buffer_create() or the wrapper made by kvhal_buffer_wrap(). Work still queued that
 *  uses the buffer must have finished (synchronize first).
 *  @param buf the buffer; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE for a destroyed or foreign pointer; KVHAL_BACKEND_ERROR.
 *  Thread safety: not concurrently with other calls using buf. Graph capture: not while a stream of its device is
 *  capturing. */
KVHAL_API kvhal_status kvhal_buffer_destroy(kvhal_buffer *buf);
/** The size of a buffer in bytes.
 *  @param buf the buffer.
 *  @return its size; 0 for NULL or a pointer that is not a live buffer.
 *  Thread safety: any thread. */
KVHAL_API size_t kvhal_buffer_size(const kvhal_buffer *buf);
/** The device a buffer lives on.
 *  @param buf the buffer.
 *  @return its device; {::KVHAL_MAX_DEVICE_TYPES, -1} for NULL or a pointer that is not a live buffer.
 *  Thread safety: any thread. */
KVHAL_API kvhal_device kvhal_buffer_device(const kvhal_buffer *buf);
/** The native memory of a buffer: the host pointer, device pointer or cl_mem.
 *  @param buf the buffer.
 *  @return the native handle, still owned by the buffer; NULL for NULL or a pointer that is not a live buffer.
 *  Thread safety: any thread. */
KVHAL_API void *kvhal_buffer_native(const kvhal_buffer *buf);

/* Host<->device copies return once host memory may be reused (they are ordered after earlier work on s).
 * Device->device copies and memset are asynchronous on s; the two buffers may be on different devices
 * (peer copy; staged through the host where the devices cannot reach each other). */
/** Copies host memory into a buffer; returns once src may be reused (ordered after earlier work on s).
 *  @param dst the destination buffer.
 *  @param dst_offset byte offset in dst.
 *  @param src host memory, read during the call.
 *  @param bytes how many bytes; 0 does nothing.
 *  @param s the stream (NULL: default), on dst's device.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL src); KVHAL_INVALID_HANDLE (dst or s); KVHAL_OUT_OF_RANGE
 *  (past dst's end); KVHAL_DEVICE_MISMATCH (s on another device); KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: no. Stream: s. */
KVHAL_API kvhal_status kvhal_memcpy_h2d(kvhal_buffer *dst, size_t dst_offset, const void *src, size_t bytes,
                                        kvhal_stream *s);
/** Copies from a buffer into host memory; returns once dst holds the bytes (after earlier work on s).
 *  @param dst host memory of at least bytes bytes.
 *  @param src the source buffer.
 *  @param src_offset byte offset in src.
 *  @param bytes how many bytes; 0 does nothing.
 *  @param s the stream (NULL: default), on src's device.
 *  @return as kvhal_memcpy_h2d().
 *  Thread safety: any thread. Graph capture: no. Stream: s. */
KVHAL_API kvhal_status kvhal_memcpy_d2h(void *dst, const kvhal_buffer *src, size_t src_offset, size_t bytes,
                                        kvhal_stream *s);
/** Copies between buffers, asynchronously on s; the buffers may be on different devices (a peer copy, staged
 *  through the host where the devices cannot reach each other, which makes the call synchronous).
 *  @param dst the destination buffer.
 *  @param dst_offset byte offset in dst.
 *  @param src the source buffer.
 *  @param src_offset byte offset in src.
 *  @param bytes how many bytes; 0 does nothing.
 *  @param s the stream (NULL: default), on dst's device.
 *  @return as kvhal_memcpy_h2d().
 *  Thread safety: any thread. Graph capture: a copy within one device may be captured. Stream: s. */
KVHAL_API kvhal_status kvhal_memcpy_d2d(kvhal_buffer *dst, size_t dst_offset, const kvhal_buffer *src,
                                        size_t src_offset, size_t bytes, kvhal_stream *s);
/** Sets bytes of a buffer to a value, asynchronously on s.
 *  @param dst the buffer.
 *  @param offset byte offset in dst.
 *  @param value the byte value, 0..255.
 *  @param bytes how many bytes; 0 does nothing.
 *  @param s the stream (NULL: default), on dst's device.
 *  @return as kvhal_memcpy_h2d(); KVHAL_INVALID_ARGUMENT for a value outside 0..255; KVHAL_UNSUPPORTED when the
 *  backend has no memset.
 *  Thread safety: any thread. Graph capture: may be captured. Stream: s. */
KVHAL_API kvhal_status kvhal_memset(kvhal_buffer *dst, size_t offset, int value, size_t bytes, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Tensors: plain values, views never allocate                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
/** Element types. Inputs of the ops are f32/f16/bf16; caches may also be any of the four fp8 formats (the OCP
 *  e4m3fn and e5m2, AMD's e4m3fnuz and e5m2fnuz); i32/i64 are slot and index types. Values never change; new
 *  ones are appended in a minor release. */
typedef enum kvhal_dtype {
    KVHAL_F32 = 0,      /**< IEEE binary32 */
    KVHAL_F16 = 1,      /**< IEEE binary16 */
    KVHAL_BF16 = 2,     /**< bfloat16 */
    KVHAL_FP8_E4M3 = 3, /**< 8-bit float, 4 exponent bits, 3 mantissa bits (OCP FP8, no infinities) */
    KVHAL_FP8_E5M2 = 4, /**< 8-bit float, 5 exponent bits, 2 mantissa bits (OCP FP8) */
    KVHAL_I32 = 5,      /**< 32-bit signed integer (slot mappings) */
    KVHAL_I64 = 6,      /**< 64-bit signed integer (slot mappings) */
    /** AMD's fp8 e4m3 "fnuz" (MI300-class GPUs): exponent bias 8, largest finite 240, no infinities, no negative
     *  zero, one NaN (0x80). A cache dtype like the other fp8 formats. */
    KVHAL_FP8_E4M3FNUZ = 7,
    /** AMD's fp8 e5m2 "fnuz": exponent bias 16, largest finite 57344, no infinities, no negative zero, one NaN
     *  (0x80). */
    KVHAL_FP8_E5M2FNUZ = 8,
} kvhal_dtype;

/** The most dimensions a tensor has. */
#define KVHAL_MAX_DIMS 6

/** A strided view of a buffer: a plain value (copy it freely; it owns nothing and is valid while its buffer is). */
typedef struct kvhal_tensor {
    kvhal_buffer *buffer;              /**< the memory it views (not owned) */
    size_t offset;                     /**< bytes from the buffer's start */
    kvhal_dtype dtype;                 /**< element type */
    int32_t ndim;                      /**< 1..KVHAL_MAX_DIMS */
    int64_t shape[KVHAL_MAX_DIMS];     /**< extent of each dimension, >= 0 */
    int64_t strides[KVHAL_MAX_DIMS];   /**< in elements, >= 0 */
} kvhal_tensor;

/** Bytes per element.
 *  @param dt a dtype.
 *  @return 1, 2, 4 or 8; 0 for a value that is not a dtype. Thread safety: any thread. */
KVHAL_API size_t kvhal_dtype_size(kvhal_dtype dt);
/** The dtype's name: "f32", "bf16", "fp8_e4m3".
 *  @param dt a dtype.
 *  @return a static string; "invalid" for a value that is not a dtype. Thread safety: any thread. */
KVHAL_API const char *kvhal_dtype_name(kvhal_dtype dt);
/** Makes a tensor over a buffer, checking dtype, ndim, shape >= 0, strides >= 0 and that every element lies inside
 *  the buffer.
 *  @param buf the buffer (not owned by the tensor).
 *  @param offset byte offset of element 0.
 *  @param dt element type.
 *  @param ndim 1..::KVHAL_MAX_DIMS.
 *  @param shape ndim extents, read during the call.
 *  @param strides ndim strides in elements, or NULL for row-major contiguous.
 *  @param out receives the tensor.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL pointers, bad dtype, ndim, shape or strides, naming them);
 *  KVHAL_INVALID_HANDLE (buf); KVHAL_OUT_OF_RANGE (an element past the buffer's end).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_tensor_make(kvhal_buffer *buf, size_t offset, kvhal_dtype dt, int32_t ndim,
                                         const int64_t *shape, const int64_t *strides, kvhal_tensor *out);
/** Fully validates a tensor value built by hand (as kvhal_tensor_make() checks its arguments).
 *  @param t the tensor.
 *  @return KVHAL_OK or the status kvhal_tensor_make() would give. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_tensor_validate(const kvhal_tensor *t);
/** The number of elements.
 *  @param t the tensor.
 *  @return the product of its shape; 0 for NULL or an invalid ndim. Thread safety: any thread. */
KVHAL_API int64_t kvhal_tensor_numel(const kvhal_tensor *t);
/** Whether the tensor is row-major contiguous (an empty tensor is).
 *  @param t the tensor.
 *  @return true or false; false for NULL or an invalid ndim. Thread safety: any thread. */
KVHAL_API bool kvhal_tensor_is_contiguous(const kvhal_tensor *t);
/** Bytes from the first to one past the last element.
 * @param t a tensor value (read during the call; its buffer is not looked at).
 * @return the span; 0 for an empty tensor, a NULL t or an ndim outside [1, KVHAL_MAX_DIMS]; SIZE_MAX when the span
 *         does not fit in 64 bits (shape and strides overflow) or a shape or stride is negative.
 * Thread safety: any thread (a pure function). Graph capture: host only, enqueues nothing. */
KVHAL_API size_t kvhal_tensor_span_bytes(const kvhal_tensor *t);
/** A view of [start, start + length) along one dimension.
 *  @param t the tensor.
 *  @param dim the dimension, 0..ndim-1.
 *  @param start first index kept.
 *  @param length how many indices are kept (may be 0).
 *  @param out receives the view (may be t itself).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, bad dim); KVHAL_OUT_OF_RANGE (past the extent).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_tensor_narrow(const kvhal_tensor *t, int32_t dim, int64_t start, int64_t length,
                                           kvhal_tensor *out);
/** A view of one index along a dimension, which is removed (ndim - 1; a 1-D tensor is refused).
 *  @param t the tensor.
 *  @param dim the dimension.
 *  @param index the index kept.
 *  @param out receives the view.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_OUT_OF_RANGE. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_tensor_select(const kvhal_tensor *t, int32_t dim, int64_t index, kvhal_tensor *out);
/** A view with the dimensions reordered: out dim i is t's dim perm[i].
 *  @param t the tensor.
 *  @param perm ndim distinct dimension indices, read during the call.
 *  @param out receives the view.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (not a permutation). Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_tensor_permute(const kvhal_tensor *t, const int32_t *perm, kvhal_tensor *out);

/* ------------------------------------------------------------------------------------------------------------ */
/* Ops (validate -> the device's backend -> descriptor cache -> backend call). Asynchronous on GPU backends.     */
/* ------------------------------------------------------------------------------------------------------------ */
/* Thread safety of the ops: any thread, at once, on any tensors (descriptor caches are per thread); two calls that
 * write the same memory concurrently race as any two kernels would.
 * Graph capture (CUDA/HIP): kvhal_tensor_copy and kvhal_paged_caching may be recorded into a graph on a captured
 * stream, the process's first call included (they allocate nothing: per-device state is made when a buffer or
 * stream is made or wrapped on the device, which may itself happen inside the capture). A replay reads the tensors'
 * memory at replay time (same addresses, new contents) and uses the scales of the captured call. kvhal_copy_blocks
 * may be captured when its cache table and pairs travel in the kernel parameters (up to 138 caches; the pairs
 * are those of the captured call); with more caches it stages the pairs through host memory per call, and on a
 * capturing stream it then returns KVHAL_UNSUPPORTED and records nothing (the capture stays valid). */
/** dst = src elementwise (same shape and dtype, same device, any strides). Elements are copied in parallel on
 *  devices: dst must not overlap src (unless it is the same view) nor itself (a stride 0 of a dim longer than 1),
 *  or the result differs between backends.
 *  @param dst the destination view.
 *  @param src the source view.
 *  @param s the stream (NULL: default), on their device.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, invalid tensor); KVHAL_SHAPE_MISMATCH; KVHAL_DTYPE_MISMATCH;
 *  KVHAL_DEVICE_MISMATCH; KVHAL_INVALID_HANDLE; KVHAL_UNSUPPORTED (the backend refuses, with its reason);
 *  KVHAL_OUT_OF_MEMORY (descriptor); KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread (descriptors are cached per thread). Graph capture: yes, the process's first call
 *  included. Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_tensor_copy(const kvhal_tensor *dst, const kvhal_tensor *src, kvhal_stream *s);

/**
 * The paged-caching op: writes k and v into the caches at the slots of slot_mapping.
 * Caches are 4-D in logical order [blocks, block_size, heads, dim] with any strides (NHD: contiguous; HND: a view
 * permuted from [blocks, heads, block_size, dim]). k, v are [tokens, heads, dim] or [batch, seq, heads, dim] with
 * any strides. slot_mapping is i32 or i64 [tokens] (or [batch, seq]), on the caches' device. Token t goes to block
 * slot/block_size, offset slot%block_size; slot < 0 is padding. A slot >= blocks*block_size is never written: with
 * host-readable slots (cpu) the call fails before writing; on GPUs and OpenCL the kernel skips it and sets the
 * device error flag (the asynchronous error model above: kvhal_stream_check_errors reports it). Cache dtype may be
 * FP8 while k/v are f32/f16/bf16: value/scale is rounded to nearest even, saturating. k_cache and v_cache should
 * not share elements (interleaved element ranges are fine, as in KVHAL_PAGE_FIRST): aliased or overlapping caches
 * are not refused and what a shared element holds afterwards is undefined (the CPU writes V after K; GPUs write
 * both in parallel).
 * @param k_cache, v_cache the caches, written in place (borrowed for the call).
 * @param k, v the new keys and values (read; borrowed for the call, read by the device until the work is done).
 * @param slot_mapping the slots (read by the device).
 * @param k_scale, v_scale fp8 scales (> 0, finite); ignored for other cache dtypes.
 * @param s the stream, or NULL for the device's default stream.
 * @return KVHAL_OK (the work is queued); KVHAL_INVALID_ARGUMENT / KVHAL_SHAPE_MISMATCH / KVHAL_DTYPE_MISMATCH /
 *         KVHAL_DEVICE_MISMATCH naming the argument; KVHAL_OUT_OF_RANGE (cpu: a slot past the cache);
 *         KVHAL_UNSUPPORTED (the backend refused the layout, naming why); KVHAL_BACKEND_ERROR (launch failed).
 * Thread safety: any thread. Graph capture: yes, the process's first call included. Stream: enqueued on s; the
 * caller's current device is left as it was.
 */
KVHAL_API kvhal_status kvhal_paged_caching(const kvhal_tensor *k_cache, const kvhal_tensor *v_cache,
                                           const kvhal_tensor *k, const kvhal_tensor *v,
                                           const kvhal_tensor *slot_mapping, float k_scale, float v_scale,
                                           kvhal_stream *s);

/** Copies whole blocks src->dst in every cache of caches[0..num_caches) (e.g. K and V of every layer) in one call.
 *  Each cache has the block index as dim 0 and its other dims dense row-major (one block = one contiguous byte
 *  range). All caches on one device. Devices copy the pairs in parallel: a destination block must not be the
 *  source or destination of another pair (checked; a pair may copy a block onto itself, which writes nothing).
 *  The caches must not overlap each other (not checked: the copies run in parallel, so overlapping caches give
 *  undefined contents).
 *  @param caches num_caches views, read during the call.
 *  @param num_caches >= 1.
 *  @param pairs num_pairs (src, dst) block ids on the host, read during the call.
 *  @param num_pairs >= 0 (0 does nothing).
 *  @param s the stream (NULL: default).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (including overlapping pairs); KVHAL_OUT_OF_RANGE (a block id past a
 *  cache); KVHAL_DEVICE_MISMATCH; KVHAL_INVALID_HANDLE; KVHAL_UNSUPPORTED; KVHAL_OUT_OF_MEMORY; KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: only where the backend's copy of pairs is itself capturable (CUDA/HIP:
 *  up to 138 caches, the pairs in the kernel parameters; else KVHAL_UNSUPPORTED); make the first call of a shape
 *  outside the capture. Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_copy_blocks(const kvhal_tensor *caches, int32_t num_caches, const int64_t *pairs,
                                         int32_t num_pairs, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* FP8 helpers (the host reference of the conversion the kernels do)                                            */
/* ------------------------------------------------------------------------------------------------------------ */
/** Rounds x to an fp8 code: round to nearest, ties to even, saturating (a finite value or infinity beyond the
 *  largest finite magnitude gives that magnitude with x's sign).
 *  @param x        any f32 (NaN included)
 *  @param fp8_type KVHAL_FP8_E4M3 (e4m3fn: NaN 0x7f|sign), KVHAL_FP8_E5M2 (NaN 0x7f|sign), KVHAL_FP8_E4M3FNUZ or
 *                  KVHAL_FP8_E5M2FNUZ (NaN 0x80; a result that rounds to zero is 0x00 whatever x's sign, since
 *                  0x80 is the NaN); any other value is taken as KVHAL_FP8_E4M3
 *  @return the code. Thread safety: pure function. Graph capture: host only, enqueues nothing. */
KVHAL_API uint8_t kvhal_f32_to_fp8(float x, kvhal_dtype fp8_type);
/** The value of an fp8 code (exact).
 *  @param x        the code
 *  @param fp8_type as for kvhal_f32_to_fp8 (an fnuz code 0x80 is NaN; e5m2's 0x7c/0xfc are +-inf)
 *  @return the value as f32. Thread safety: pure function. Graph capture: host only, enqueues nothing. */
KVHAL_API float kvhal_fp8_to_f32(uint8_t x, kvhal_dtype fp8_type);
/** f32 to IEEE half, round to nearest even.
 *  @param x the value.
 *  @return the half bits. Thread safety: any thread. */
KVHAL_API uint16_t kvhal_f32_to_f16(float x);
/** IEEE half to f32 (exact).
 *  @param x the half bits.
 *  @return the value. Thread safety: any thread. */
KVHAL_API float kvhal_f16_to_f32(uint16_t x);
/** f32 to bfloat16, round to nearest even (NaN stays NaN).
 *  @param x the value.
 *  @return the bfloat16 bits. Thread safety: any thread. */
KVHAL_API uint16_t kvhal_f32_to_bf16(float x);
/** bfloat16 to f32 (exact).
 *  @param x the bfloat16 bits.
 *  @return the value. Thread safety: any thread. */
KVHAL_API float kvhal_bf16_to_f32(uint16_t x);

/* ------------------------------------------------------------------------------------------------------------ */
/* Descriptor cache: per thread, per (device type, device id), per op kind, an LRU of descriptors keyed by exact */
/* tensor metadata. Public so that engines can cache their own descriptors (GEMM, RMSNorm, RoPE, ...).            */
/* ------------------------------------------------------------------------------------------------------------ */
/** The most 64-bit words a descriptor key holds. */
#define KVHAL_DESC_KEY_MAX_WORDS 96
/** A descriptor key: an op kind and the exact metadata words of a call. A plain value. */
typedef struct kvhal_desc_key {
    uint64_t hash;     /**< hash_combine over words, constant 0x9e3779b9 (maintained by the add functions) */
    uint32_t op;       /**< op kind */
    uint32_t nwords;   /**< words used */
    uint64_t words[KVHAL_DESC_KEY_MAX_WORDS]; /**< the metadata */
} kvhal_desc_key;

/** An op kind of the descriptor cache: the built-in ops' kinds are registered by the library, user kinds after. */
typedef int32_t kvhal_op_kind;
/** Destroys a descriptor of a user op kind (see kvhal_desc_op_register()).
 *  @param desc the descriptor given to kvhal_desc_cache_put().
 *  @param dev the device it was cached for.
 *  @param user the pointer given at registration. */
typedef void (*kvhal_desc_destroy_fn)(void *desc, kvhal_device dev, void *user);

/** Starts a key for an op kind (no words, hash reset).
 *  @param key the key (caller's storage).
 *  @param op the op kind.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL key. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_desc_key_init(kvhal_desc_key *key, kvhal_op_kind op);
/** Appends a tensor's dtype, ndim, shape and strides (not its buffer or offset) to a key.
 *  @param key the key.
 *  @param t the tensor.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, bad ndim); KVHAL_OUT_OF_RANGE (the key is full).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_desc_key_add_tensor(kvhal_desc_key *key, const kvhal_tensor *t);
/** Appends one word to a key.
 *  @param key the key.
 *  @param v the word.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL); KVHAL_OUT_OF_RANGE (the key is full). Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_desc_key_add_u64(kvhal_desc_key *key, uint64_t v);
/** Whether two keys are equal (op, words).
 *  @param a a key.
 *  @param b a key.
 *  @return true when equal; false when not or when either is NULL. Thread safety: any thread. */
KVHAL_API bool kvhal_desc_key_equal(const kvhal_desc_key *a, const kvhal_desc_key *b);

/** Registers an op kind for an engine's own descriptors.
 *  @param name its name (copied), 1 to 31 characters, not registered yet.
 *  @param destroy destroys its descriptors (on eviction, clear, thread exit and library unload, on the thread that
 *  owns the cache); may be NULL when descriptors need no destruction.
 *  @param user passed to destroy; must stay valid while descriptors of the kind may exist.
 *  @param out receives the kind.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, bad length, name taken); KVHAL_OUT_OF_RANGE (no free kind).
 *  Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_desc_op_register(const char *name, kvhal_desc_destroy_fn destroy, void *user,
                                              kvhal_op_kind *out);
/** Looks up an op kind by name ("paged_caching" for a built-in one).
 *  @param name the name.
 *  @param out receives the kind.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL); KVHAL_NOT_FOUND. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_desc_op_find(const char *name, kvhal_op_kind *out);
/** Sets the capacity of every LRU of an op kind (all threads, all devices); 0 disables caching for the op.
 *  @param op the op kind.
 *  @param capacity entries per (thread, device).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (unregistered kind); KVHAL_OUT_OF_RANGE (above the limit).
 *  Thread safety: any thread; LRUs shrink on their owner thread's next use. */
KVHAL_API kvhal_status kvhal_desc_cache_set_capacity(kvhal_op_kind op, size_t capacity);
/** The capacity of an op kind's LRUs.
 *  @param op the op kind.
 *  @param capacity receives it.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, unregistered kind). Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_desc_cache_get_capacity(kvhal_op_kind op, size_t *capacity);
/** Looks a descriptor up in this thread's cache for dev.
 *  @param dev the device.
 *  @param key the key.
 *  @param desc receives the descriptor (still owned by the cache; valid until this thread evicts or clears it).
 *  @return KVHAL_OK; KVHAL_NOT_FOUND on a miss (no error message is set for a miss); KVHAL_INVALID_ARGUMENT.
 *  Thread safety: per thread. Graph capture: yes. */
KVHAL_API kvhal_status kvhal_desc_cache_get(kvhal_device dev, const kvhal_desc_key *key, void **desc);
/** Puts a descriptor into this thread's cache for dev, taking ownership of it. Evicts the least recently used
 *  entry of that (device, op) when full; replacing an existing key destroys the old descriptor; with capacity 0
 *  the descriptor is destroyed at once.
 *  @param dev the device.
 *  @param key the key (copied).
 *  @param desc the descriptor; on an error status the caller keeps it.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, a built-in op kind, an unregistered kind);
 *  KVHAL_OUT_OF_MEMORY. Thread safety: per thread. */
KVHAL_API kvhal_status kvhal_desc_cache_put(kvhal_device dev, const kvhal_desc_key *key, void *desc);
/** Counters of one (thread, device, op kind) LRU. Frozen in layout for the 0.x series (docs/ABI.md). */
typedef struct kvhal_desc_cache_stats {
    uint64_t hits;      /**< lookups that found a descriptor */
    uint64_t misses;    /**< lookups that did not */
    uint64_t evictions; /**< descriptors destroyed to make room */
    uint64_t inserts;   /**< descriptors put */
    size_t size;        /**< descriptors held now */
    size_t capacity;    /**< the capacity in force */
} kvhal_desc_cache_stats;
/** This thread's counters for (dev, op).
 *  @param dev the device.
 *  @param op the op kind.
 *  @param out receives them.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT. Thread safety: per thread. */
KVHAL_API kvhal_status kvhal_desc_cache_get_stats(kvhal_device dev, kvhal_op_kind op, kvhal_desc_cache_stats *out);
/** Destroys this thread's descriptors of dev (all op kinds).
 *  @param dev the device.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT. Thread safety: per thread. Graph capture: not while a stream of dev
 *  is capturing (destroying a descriptor may free device memory). */
KVHAL_API kvhal_status kvhal_desc_cache_clear(kvhal_device dev);

/* ------------------------------------------------------------------------------------------------------------ */
/* Contiguous multi-device cache: per device, per layer, K [max_len, nkvh/ndev, dk] and V [max_len, nkvh/ndev, dv] */
/* ------------------------------------------------------------------------------------------------------------ */
/* The caches below (contiguous, static, paged), threads: one cache is used by one thread at a time (kvhal takes no
 * lock on it); different caches from different threads at once. Graph capture: create, duplicate and destroy
 * allocate and may not be captured; kvhal_paged_cache_update may (it is kvhal_paged_caching);
 * kvhal_paged_cache_copy_blocks as kvhal_copy_blocks (up to 138 caches); the layer views enqueue nothing. */
/** A contiguous KV cache over one or more devices (heads split evenly). Single-owner object. */
typedef struct kvhal_kv_cache kvhal_kv_cache;
/** Configuration of kvhal_kv_cache_create(). Extensible: initialise with ::KVHAL_KV_CACHE_CONFIG_INIT or
 *  kvhal_kv_cache_config_init() before setting fields (docs/ABI.md). */
typedef struct kvhal_kv_cache_config {
    size_t struct_size;          /**< sizeof(kvhal_kv_cache_config) of the caller's header; set by the initialisers */
    int32_t num_layers;          /**< >= 1 */
    int32_t num_kv_heads;        /**< >= 1, divisible by num_devices */
    int32_t head_dim_k;          /**< >= 1 */
    int32_t head_dim_v;          /**< >= 1 */
    int64_t max_len;             /**< tokens per layer, >= 1 */
    kvhal_dtype dtype;           /**< f32, f16, bf16, fp8_e4m3, fp8_e5m2 */
    int32_t num_devices;         /**< >= 1 */
    const kvhal_device *devices; /**< num_devices entries, read during create; heads are split evenly between them */
} kvhal_kv_cache_config;
/** Static initialiser of a ::kvhal_kv_cache_config: struct_size set, every other field zero (C; C++11 and later: a value-initialised struct). */
#ifdef __cplusplus
/* C++ has designated initializers from C++20 only, and warns (-Wmissing-field-initializers) about the fields
 * they leave out: a value-initialised struct with struct_size set, from any C++ standard, without warnings. */
#define KVHAL_KV_CACHE_CONFIG_INIT ([] { kvhal_kv_cache_config c_{}; c_.struct_size = sizeof c_; return c_; }())
#else
#define KVHAL_KV_CACHE_CONFIG_INIT {.struct_size = sizeof(kvhal_kv_cache_config)}
#endif
/** Initialises a ::kvhal_kv_cache_config: struct_size set, every other field zero (C and any C++).
 *  @param cfg the caller's struct. */
static inline void kvhal_kv_cache_config_init(kvhal_kv_cache_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
}
/** Creates a contiguous cache: per device, per layer, K [max_len, nkvh/ndev, dk] and V [max_len, nkvh/ndev, dv].
 *  @param cfg the configuration, read during the call.
 *  @param out receives the cache; the caller destroys it with kvhal_kv_cache_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, a field out of range or a struct_size this library does not
 *  know, naming the field); KVHAL_OUT_OF_RANGE (sizes overflow); the device lookup statuses; KVHAL_OUT_OF_MEMORY.
 *  Thread safety: any thread. Graph capture: no. */
KVHAL_API kvhal_status kvhal_kv_cache_create(const kvhal_kv_cache_config *cfg, kvhal_kv_cache **out);
/** A new cache of the same shape holding the first seq_len tokens of src (device-to-device copies enqueued on each
 *  device's default stream: synchronise the devices before reading the copy from another stream or the host).
 *  @param src the cache to copy.
 *  @param seq_len 0 .. max_len tokens.
 *  @param out receives the new cache (the caller's to destroy).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_RANGE (seq_len);
 *  KVHAL_OUT_OF_MEMORY; KVHAL_BACKEND_ERROR.
 *  Thread safety: src single-owner. Graph capture: no. */
KVHAL_API kvhal_status kvhal_kv_cache_duplicate(const kvhal_kv_cache *src, int64_t seq_len, kvhal_kv_cache **out);
/** Destroys a contiguous cache and its device memory (queued work using it must have finished).
 *  @param c the cache; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE. Thread safety: single-owner. Graph capture: no. */
KVHAL_API kvhal_status kvhal_kv_cache_destroy(kvhal_kv_cache *c);
/** Views of device index device_index's K and V for a layer: [max_len, nkvh/ndev, dk|dv].
 *  @param c the cache.
 *  @param device_index 0 .. num_devices - 1.
 *  @param layer 0 .. num_layers - 1.
 *  @param k receives the K view (valid while c lives).
 *  @param v receives the V view.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_RANGE.
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_kv_cache_layer(const kvhal_kv_cache *c, int32_t device_index, int32_t layer,
                                            kvhal_tensor *k, kvhal_tensor *v);

/* ------------------------------------------------------------------------------------------------------------ */
/* Static cache: [layers, batch, heads, max_len, dim] per rank                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
/** A static (Hugging Face style) cache on one device. Single-owner object. */
typedef struct kvhal_static_cache kvhal_static_cache;
/** Configuration of kvhal_static_cache_create(). Extensible: initialise with ::KVHAL_STATIC_CACHE_CONFIG_INIT or
 *  kvhal_static_cache_config_init() before setting fields (docs/ABI.md). */
typedef struct kvhal_static_cache_config {
    size_t struct_size;   /**< sizeof(kvhal_static_cache_config) of the caller's header; set by the initialisers */
    int32_t num_layers;   /**< >= 1 */
    int32_t batch;        /**< >= 1 */
    int32_t num_heads_k;  /**< >= 1 */
    int32_t num_heads_v;  /**< >= 1 */
    int32_t head_dim_k;   /**< >= 1 */
    int32_t head_dim_v;   /**< >= 1 */
    int64_t max_len;      /**< >= 1 */
    kvhal_dtype dtype;    /**< f32, f16, bf16, fp8_e4m3, fp8_e5m2 */
    kvhal_device device;  /**< where it lives */
} kvhal_static_cache_config;
/** Static initialiser of a ::kvhal_static_cache_config: struct_size set, every other field zero (C; C++11 and later: a value-initialised struct). */
#ifdef __cplusplus
/* C++ has designated initializers from C++20 only, and warns (-Wmissing-field-initializers) about the fields
 * they leave out: a value-initialised struct with struct_size set, from any C++ standard, without warnings. */
#define KVHAL_STATIC_CACHE_CONFIG_INIT ([] { kvhal_static_cache_config c_{}; c_.struct_size = sizeof c_; return c_; }())
#else
#define KVHAL_STATIC_CACHE_CONFIG_INIT {.struct_size = sizeof(kvhal_static_cache_config)}
#endif
/** Initialises a ::kvhal_static_cache_config: struct_size set, every other field zero (C and any C++).
 *  @param cfg the caller's struct. */
static inline void kvhal_static_cache_config_init(kvhal_static_cache_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
}
/** Creates a static cache: [layers, batch, heads, max_len, dim] for K and V.
 *  @param cfg the configuration, read during the call.
 *  @param out receives the cache; the caller destroys it with kvhal_static_cache_destroy().
 *  @return as kvhal_kv_cache_create(). Thread safety: any thread. Graph capture: no. */
KVHAL_API kvhal_status kvhal_static_cache_create(const kvhal_static_cache_config *cfg, kvhal_static_cache **out);
/** Destroys a static cache (queued work using it must have finished).
 *  @param c the cache; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE. Thread safety: single-owner. Graph capture: no. */
KVHAL_API kvhal_status kvhal_static_cache_destroy(kvhal_static_cache *c);
/** Writes positions [cache_pos, cache_pos+seq) of a layer and returns views of the history.
 *  @param c the cache.
 *  @param layer 0 .. num_layers - 1.
 *  @param k [batch, heads_k, seq, dk] (any strides, cache's dtype, cache's device).
 *  @param v [batch, heads_v, seq, dv].
 *  @param cache_pos first position written.
 *  @param k_hist receives K [batch, heads_k, cache_pos+seq, dk] (a view, valid while c lives).
 *  @param v_hist receives V [batch, heads_v, cache_pos+seq, dv].
 *  @param s the stream (NULL: default).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_SHAPE_MISMATCH; KVHAL_DTYPE_MISMATCH;
 *  KVHAL_DEVICE_MISMATCH; KVHAL_OUT_OF_RANGE (past max_len); the op statuses of kvhal_tensor_copy().
 *  Thread safety: single-owner. Graph capture: as kvhal_tensor_copy(). Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_static_cache_update(kvhal_static_cache *c, int32_t layer, const kvhal_tensor *k,
                                                 const kvhal_tensor *v, int64_t cache_pos, kvhal_tensor *k_hist,
                                                 kvhal_tensor *v_hist, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Paged cache                                                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */
/** Layout of one block of a paged cache. */
typedef enum kvhal_paged_layout {
    KVHAL_LAYOUT_NHD = 0, /**< a block is [block_size, heads, dim] */
    KVHAL_LAYOUT_HND = 1  /**< a block is [heads, block_size, dim] */
} kvhal_paged_layout;
/** Order of layers and blocks in a paged cache's memory. */
typedef enum kvhal_paged_order {
    KVHAL_LAYER_FIRST = 0, /**< [layers][K|V][blocks][block]: each layer's K (and V) is one dense array */
    KVHAL_PAGE_FIRST = 1   /**< [blocks][layers][K|V][block]: a block of all layers is contiguous */
} kvhal_paged_order;
/** A paged (vLLM style) cache on one device. Single-owner object. */
typedef struct kvhal_paged_cache kvhal_paged_cache;
/** Configuration of kvhal_paged_cache_create(). Extensible: initialise with ::KVHAL_PAGED_CACHE_CONFIG_INIT or
 *  kvhal_paged_cache_config_init() before setting fields (docs/ABI.md). */
typedef struct kvhal_paged_cache_config {
    size_t struct_size;          /**< sizeof(kvhal_paged_cache_config) of the caller's header; set by the initialisers */
    int32_t num_layers;          /**< >= 1 */
    int32_t num_heads;           /**< >= 1 */
    int32_t head_dim;            /**< >= 1 */
    int32_t block_size;          /**< tokens per block, >= 1 */
    kvhal_dtype dtype;           /**< f32, f16, bf16, or an fp8 format (fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz, fp8_e5m2fnuz) */
    kvhal_paged_layout layout;   /**< NHD (0, the default) or HND */
    kvhal_paged_order order;     /**< layer-first (0, the default) or page-first */
    uint64_t memory_budget;      /**< bytes for K and V of all layers; the block count follows */
    kvhal_device device;         /**< where it lives */
    float k_scale;               /**< FP8 scale of K (0 means 1) */
    float v_scale;               /**< FP8 scale of V (0 means 1) */
} kvhal_paged_cache_config;
/** Static initialiser of a ::kvhal_paged_cache_config: struct_size set, every other field zero (C; C++11 and later: a value-initialised struct). */
#ifdef __cplusplus
/* C++ has designated initializers from C++20 only, and warns (-Wmissing-field-initializers) about the fields
 * they leave out: a value-initialised struct with struct_size set, from any C++ standard, without warnings. */
#define KVHAL_PAGED_CACHE_CONFIG_INIT ([] { kvhal_paged_cache_config c_{}; c_.struct_size = sizeof c_; return c_; }())
#else
#define KVHAL_PAGED_CACHE_CONFIG_INIT {.struct_size = sizeof(kvhal_paged_cache_config)}
#endif
/** Initialises a ::kvhal_paged_cache_config: struct_size set, every other field zero (C and any C++).
 *  @param cfg the caller's struct. */
static inline void kvhal_paged_cache_config_init(kvhal_paged_cache_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->struct_size = sizeof *cfg;
}
/** Creates a paged cache sized by its memory budget.
 *  @param cfg the configuration, read during the call.
 *  @param out receives the cache; the caller destroys it with kvhal_paged_cache_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, a field out of range or a struct_size this library does not
 *  know, naming the field); KVHAL_OUT_OF_RANGE (sizes that overflow); KVHAL_OUT_OF_MEMORY (a budget below one
 *  block, or the allocation failed); the device lookup statuses. Thread safety: any thread. Graph capture: no. */
KVHAL_API kvhal_status kvhal_paged_cache_create(const kvhal_paged_cache_config *cfg, kvhal_paged_cache **out);
/** Destroys a paged cache (queued work using it must have finished).
 *  @param c the cache; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE. Thread safety: single-owner. Graph capture: no. */
KVHAL_API kvhal_status kvhal_paged_cache_destroy(kvhal_paged_cache *c);
/** The number of blocks the budget gave.
 *  @param c the cache.
 *  @return the block count; 0 for NULL or a pointer that is not a live paged cache. Thread safety: single-owner. */
KVHAL_API int64_t kvhal_paged_cache_num_blocks(const kvhal_paged_cache *c);
/** Views of a layer's K and V: [blocks, block_size, heads, dim] in logical order, the layout in the strides.
 *  @param c the cache.
 *  @param layer 0 .. num_layers - 1.
 *  @param k receives the K view (valid while c lives).
 *  @param v receives the V view.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_RANGE (layer).
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_paged_cache_layer(const kvhal_paged_cache *c, int32_t layer, kvhal_tensor *k,
                                               kvhal_tensor *v);
/** kvhal_paged_caching() into one layer of the cache, with the cache's FP8 scales.
 *  @param c the cache.
 *  @param layer 0 .. num_layers - 1.
 *  @param k the new tokens' K, as for kvhal_paged_caching().
 *  @param v the new tokens' V.
 *  @param slot_mapping the tokens' slots, as for kvhal_paged_caching().
 *  @param s the stream (NULL: default).
 *  @return KVHAL_INVALID_HANDLE, KVHAL_OUT_OF_RANGE (layer) or what kvhal_paged_caching() returns.
 *  Thread safety: single-owner. Graph capture: as kvhal_paged_caching(). Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_paged_cache_update(kvhal_paged_cache *c, int32_t layer, const kvhal_tensor *k,
                                                const kvhal_tensor *v, const kvhal_tensor *slot_mapping,
                                                kvhal_stream *s);
/** kvhal_copy_blocks() over every layer's K and V (copy-on-write of shared blocks).
 *  @param c the cache.
 *  @param pairs num_pairs (src, dst) block ids on the host.
 *  @param num_pairs >= 0.
 *  @param s the stream (NULL: default).
 *  @return KVHAL_INVALID_HANDLE, KVHAL_OUT_OF_MEMORY or what kvhal_copy_blocks() returns.
 *  Thread safety: single-owner. Graph capture: as kvhal_copy_blocks(). Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_paged_cache_copy_blocks(kvhal_paged_cache *c, const int64_t *pairs, int32_t num_pairs,
                                                     kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Block pool: O(1) allocate/free of block ids with reference counts                                             */
/* ------------------------------------------------------------------------------------------------------------ */
/** Block ids with reference counts, for engines that keep their own block tables (vLLM-style): shared prefixes and
 *  copy-on-write by reference count. The cache manager does not use it; it stands on its own. Host memory only.
 *  Single-owner object. */
typedef struct kvhal_block_pool kvhal_block_pool;
/** Creates a pool of num_blocks free blocks.
 *  @param num_blocks >= 1.
 *  @param out receives the pool; the caller destroys it with kvhal_block_pool_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_OUT_OF_MEMORY. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_block_pool_create(int32_t num_blocks, kvhal_block_pool **out);
/** Destroys a pool.
 *  @param p the pool; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE. Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_block_pool_destroy(kvhal_block_pool *p);
/** Allocates n blocks, all or none; each gets reference count 1.
 *  @param p the pool.
 *  @param n >= 0.
 *  @param blocks receives n block ids (caller's array).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_MEMORY (fewer than n free).
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_block_pool_allocate(kvhal_block_pool *p, int32_t n, int32_t *blocks);
/** Adds a reference to an allocated block (share, fork).
 *  @param p the pool.
 *  @param block an allocated block id.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_RANGE (bad id, or the count is at its maximum);
 *  KVHAL_INVALID_ARGUMENT (a free block). Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_block_pool_share(kvhal_block_pool *p, int32_t block);
/** Drops a reference; the block is free again at 0.
 *  @param p the pool.
 *  @param block an allocated block id.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_RANGE; KVHAL_INVALID_ARGUMENT (a free block).
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_block_pool_release(kvhal_block_pool *p, int32_t block);
/** The number of free blocks.
 *  @param p the pool.
 *  @return the count; 0 for NULL or a pointer that is not a live pool. Thread safety: single-owner. */
KVHAL_API int32_t kvhal_block_pool_num_free(const kvhal_block_pool *p);
/** The number of blocks.
 *  @param p the pool.
 *  @return the count; 0 for NULL or a pointer that is not a live pool. Thread safety: single-owner. */
KVHAL_API int32_t kvhal_block_pool_num_total(const kvhal_block_pool *p);
/** A block's reference count.
 *  @param p the pool.
 *  @param block a block id.
 *  @return the count (0 for a free block); -1 for an id out of range or an invalid pool. Thread safety: single-owner. */
KVHAL_API int32_t kvhal_block_pool_ref_count(const kvhal_block_pool *p, int32_t block);
/** Checks the pool's bookkeeping (free list against reference counts).
 *  @param p the pool.
 *  @return KVHAL_OK; KVHAL_INTEGRITY naming the inconsistency; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_MEMORY.
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_block_pool_check_integrity(const kvhal_block_pool *p);

/* ------------------------------------------------------------------------------------------------------------ */
/* Prefix cache: naive (never matches) or radix tree of token ids -> page indices                               */
/* ------------------------------------------------------------------------------------------------------------ */
/* Host memory: a radix cache keeps the token and page arrays of entries it evicts (or drops in reset) for reuse by
 * later inserts; it returns them to the system when it is destroyed. Its footprint is that of its fullest moment.
 * Threads (block pool, prefix cache, cache manager): host-only structures without locks: one thread at a time per
 * object (a scheduler's lock around it), any number of objects at once. Graph capture: they touch no device. */
/** The kind of prefix cache. */
typedef enum kvhal_prefix_kind {
    KVHAL_PREFIX_NAIVE = 0, /**< never matches, keeps nothing (a baseline) */
    KVHAL_PREFIX_RADIX = 1  /**< a radix tree of token ids to page indices, LRU eviction of unlocked leaves */
} kvhal_prefix_kind;
/** A prefix cache (host memory). Single-owner object. */
typedef struct kvhal_prefix_cache kvhal_prefix_cache;
/** A prefix-cache handle: an opaque 64-bit value, 0 meaning "nothing matched". Either a node handle (from
 * kvhal_prefix_match: the node's slot and the slot's generation) or a request handle (from
 * kvhal_cache_manager_match: a lock of its own, consumed by the request's finish or unlock). A stale handle (its
 * node evicted or reset, its request finished or unlocked) is always refused with KVHAL_INVALID_HANDLE, however
 * the memory was reused since. Another cache's handle is refused unless its slot and generation both happen to
 * name a live entry here (generations start at a different place per cache: about 1 in 2^31). */
typedef uint64_t kvhal_prefix_handle;
/** Receives freed page indices during evict or reset.
 *  @param pages n page indices, valid during the call.
 *  @param n how many.
 *  @param user the pointer given to the evicting call.
 *  It must not call back into the cache. */
typedef void (*kvhal_pages_fn)(const int32_t *pages, size_t n, void *user);

/** Creates a prefix cache.
 *  @param kind ::KVHAL_PREFIX_NAIVE or ::KVHAL_PREFIX_RADIX.
 *  @param page_size tokens per page, >= 1.
 *  @param out receives the cache; the caller destroys it with kvhal_prefix_cache_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_OUT_OF_MEMORY. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_prefix_cache_create(kvhal_prefix_kind kind, int32_t page_size,
                                                 kvhal_prefix_cache **out);
/** Destroys a prefix cache; every handle of it is gone with it.
 * @param pc a cache from kvhal_prefix_cache_create (NULL: KVHAL_OK).
 * @return KVHAL_OK; KVHAL_INVALID_HANDLE when pc is not a live prefix cache; KVHAL_INVALID_ARGUMENT when pc belongs
 *         to a cache manager (kvhal_cache_manager_prefix): only kvhal_cache_manager_destroy frees it.
 * Thread safety: pc is single-owner; no call on it may run during or after the destroy. Graph capture: host only. */
KVHAL_API kvhal_status kvhal_prefix_cache_destroy(kvhal_prefix_cache *pc);
/** The page size.
 *  @param pc the cache.
 *  @return tokens per page; 0 for NULL or a pointer that is not a live prefix cache. Thread safety: single-owner. */
KVHAL_API int32_t kvhal_prefix_cache_page_size(const kvhal_prefix_cache *pc);
/** Longest cached prefix of tokens, aligned down to whole pages.
 * @param pc the cache (borrowed for the call).
 * @param tokens num_tokens token ids (read during the call; NULL only with num_tokens 0).
 * @param num_tokens their count.
 * @param handle out (may be NULL): the node handle of the deepest matched node, 0 when nothing matched.
 * @param cached_len out (may be NULL): the matched length in tokens.
 * @param pages out: cached_len/page_size page indices.
 * @param pages_cap entries of room in pages.
 * @return KVHAL_OK; KVHAL_OUT_OF_RANGE when pages_cap is too small (then nothing is written: not pages, handle
 *         nor cached_len); KVHAL_INVALID_HANDLE for a pc that is not live; KVHAL_INVALID_ARGUMENT for NULL arrays;
 *         KVHAL_OUT_OF_MEMORY when a node split cannot allocate.
 * Thread safety: pc is single-owner (see the cache manager section). */
KVHAL_API kvhal_status kvhal_prefix_match(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                          kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                          size_t pages_cap);
/** Protects the path from handle to the root from eviction (counted; unlock undoes one lock).
 * @param pc the cache.
 * @param handle a node handle from match (or a request handle: its node is locked once more).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for 0; KVHAL_INVALID_HANDLE for a stale or foreign handle;
 *         KVHAL_OUT_OF_RANGE when the path holds INT32_MAX locks.
 * Thread safety: pc is single-owner (concurrent calls get KVHAL_BUSY). Graph capture: host only, enqueues nothing. */
KVHAL_API kvhal_status kvhal_prefix_lock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle);
/** Gives back one lock. A request handle (kvhal_cache_manager_match) is consumed: its lock goes back and the handle
 * is stale from then on (a dropped request is released this way).
 * @param pc the cache.
 * @param handle a locked node handle or a live request handle.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for 0 or a node with no lock of its own left (the locks request
 *         handles hold are theirs to give back); KVHAL_INVALID_HANDLE for a stale or foreign handle.
 * Thread safety: pc is single-owner (concurrent calls get KVHAL_BUSY). Graph capture: host only, enqueues nothing. */
KVHAL_API kvhal_status kvhal_prefix_unlock(kvhal_prefix_cache *pc, kvhal_prefix_handle handle);
/** Inserts tokens[0..n) (n aligned down to pages) with their pages (n/page_size entries). The tree keeps its own
 *  pages where the prefix was already present, so the caller still owns its pages[0..already_cached/page_size)
 *  and frees those that are not the tree's (the ones it did not get from match). A naive cache keeps nothing:
 *  already_cached = n, every page stays the caller's.
 *  @param pc the cache.
 *  @param tokens num_tokens token ids.
 *  @param num_tokens how many.
 *  @param pages num_tokens/page_size page indices; those past already_cached now belong to the tree.
 *  @param already_cached receives the length that was present before.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_MEMORY (nothing inserted).
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_prefix_insert(kvhal_prefix_cache *pc, const int32_t *tokens, size_t num_tokens,
                                           const int32_t *pages, size_t *already_cached);
/** Evicts unlocked leaves in LRU order until at least num_tokens tokens are freed (or nothing is evictable).
 *  @param pc the cache.
 *  @param num_tokens tokens to free.
 *  @param fn receives the freed pages, one call per leaf (may be NULL).
 *  @param user passed to fn.
 *  @param evicted receives the tokens freed (may be NULL).
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE; KVHAL_UNSUPPORTED (a naive cache asked for tokens).
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_prefix_evict(kvhal_prefix_cache *pc, size_t num_tokens, kvhal_pages_fn fn, void *user,
                                          size_t *evicted);
/** Token counts of a prefix cache (kvhal_prefix_size_info_get()). */
typedef struct kvhal_prefix_size_info {
    size_t evictable_tokens;  /**< in unlocked entries */
    size_t protected_tokens;  /**< in locked paths */
    size_t total_tokens;      /**< evictable + protected */
    size_t num_nodes;         /**< tree nodes, the root excluded */
} kvhal_prefix_size_info;
/** Token counts of a prefix cache.
 *  @param pc the cache.
 *  @param out receives them.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE. Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_prefix_size_info_get(const kvhal_prefix_cache *pc, kvhal_prefix_size_info *out);
/** Drops everything, locks included (every handle becomes invalid).
 *  @param pc the cache.
 *  @param fn receives the freed pages (may be NULL).
 *  @param user passed to fn.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE. Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_prefix_reset(kvhal_prefix_cache *pc, kvhal_pages_fn fn, void *user);
/** Checks the tree (lengths, lock counts, LRU heap, token counts).
 *  @param pc the cache.
 *  @return KVHAL_OK; KVHAL_INTEGRITY naming the inconsistency; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_MEMORY.
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_prefix_check_integrity(const kvhal_prefix_cache *pc);

/* ------------------------------------------------------------------------------------------------------------ */
/* Cache manager: free pages (a block pool) + a prefix cache                                                     */
/* ------------------------------------------------------------------------------------------------------------ */
/** Free pages plus a prefix cache: what a serving engine needs to place requests' K/V in a paged cache and reuse
 *  shared prefixes. Host memory only. Single-owner object. */
typedef struct kvhal_cache_manager kvhal_cache_manager;
/** Creates a cache manager of total_pages pages.
 *  @param total_pages >= 1 (the paged cache's block count).
 *  @param page_size tokens per page (the paged cache's block size).
 *  @param kind the prefix cache kind.
 *  @param out receives the manager; the caller destroys it with kvhal_cache_manager_destroy().
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_OUT_OF_MEMORY. Thread safety: any thread. */
KVHAL_API kvhal_status kvhal_cache_manager_create(int32_t total_pages, int32_t page_size, kvhal_prefix_kind kind,
                                                  kvhal_cache_manager **out);
/** Destroys a manager and its prefix cache.
 *  @param cm the manager; NULL is KVHAL_OK.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE. Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_destroy(kvhal_cache_manager *cm);
/** The manager's prefix cache, for queries and lock/unlock only: insert and evict go through the manager.
 *  @param cm the manager.
 *  @return the prefix cache, owned by cm; NULL for NULL or a pointer that is not a live manager.
 *  Thread safety: single-owner. */
KVHAL_API kvhal_prefix_cache *kvhal_cache_manager_prefix(kvhal_cache_manager *cm);
/** match + lock, with a request handle of its own (never 0, even when nothing matched).
 * The handle must be passed to cache_finished or cache_finished_suffix once (a second finish is
 * KVHAL_INVALID_HANDLE, so no request can ever insert pages another request holds now), or, for a request that
 * is dropped, to kvhal_prefix_unlock on kvhal_cache_manager_prefix(cm), after kvhal_cache_manager_free of its own
 * pages. Use the prefix cache of a manager for queries and lock/unlock only: insert and evict go through the
 * manager, and it cannot be destroyed on its own.
 * @param cm the manager (single-owner: concurrent calls get KVHAL_BUSY).
 * @param tokens num_tokens ids (read during the call).
 * @param num_tokens their count (an engine passes all but the last prompt token).
 * @param handle out, required: the request handle.
 * @param cached_len out (may be NULL).
 * @param pages out: the cached pages.
 * @param pages_cap entries of room in pages.
 * @return as kvhal_prefix_match (nothing is written on a refusal), and KVHAL_INVALID_ARGUMENT for a NULL handle;
 *         KVHAL_OUT_OF_MEMORY when no request handle can be allocated.
 * Graph capture: host only, enqueues nothing. */
KVHAL_API kvhal_status kvhal_cache_manager_match(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                                 kvhal_prefix_handle *handle, size_t *cached_len, int32_t *pages,
                                                 size_t pages_cap);
/** Allocates n pages, evicting cached prefixes when free pages run short; all or nothing.
 *  @param cm the manager.
 *  @param n >= 0.
 *  @param pages receives n page indices (caller's array).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_MEMORY (fewer than n free and
 *  evictable). Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_allocate(kvhal_cache_manager *cm, int32_t n, int32_t *pages);
/** match + lock, as kvhal_cache_manager_match, with the matched page ids handed out as a view of the manager's own
 *  storage instead of written into the caller's array (no room to size or allocate per call). A match within one
 *  edge of the prefix tree under its root (a shared system prompt, say) is not copied at all: the view is the
 *  tree's own page list; a match through several edges is copied into one array of the manager's.
 *  @param cm the manager (single-owner: concurrent calls get KVHAL_BUSY).
 *  @param tokens, num_tokens, handle, cached_len as for kvhal_cache_manager_match.
 *  @param pages out: the matched page ids, owned by cm: valid until the next kvhal_cache_manager_match_view on cm
 *               (after which the memory may hold other ids) or cm's destruction; other calls leave them unchanged,
 *               even those that split or evict the matched prefix.
 *  @param num_pages out: their count (cached_len / page_size).
 *  @return as kvhal_cache_manager_match; KVHAL_OUT_OF_MEMORY when the view's storage (total_pages ids, made at the
 *          first call) cannot be allocated. Graph capture: host only, enqueues nothing. */
KVHAL_API kvhal_status kvhal_cache_manager_match_view(kvhal_cache_manager *cm, const int32_t *tokens,
                                                      size_t num_tokens, kvhal_prefix_handle *handle,
                                                      size_t *cached_len, const int32_t **pages, size_t *num_pages);
/** kvhal_cache_manager_allocate with the n page ids handed out as a view of the manager's own storage.
 *  @param cm the manager.
 *  @param n >= 0.
 *  @param pages out: n page ids owned by cm, valid until the next kvhal_cache_manager_allocate_view on cm or cm's
 *               destruction.
 *  @return as kvhal_cache_manager_allocate. Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_allocate_view(kvhal_cache_manager *cm, int32_t n, const int32_t **pages);
/** Admits a request in one call: kvhal_cache_manager_match (match + lock) of tokens, then the pages for the
 *  uncached rest plus extra_tokens more (the tokens the request may generate), handed out as ONE list: the matched
 *  page ids followed by the newly allocated ones, the request's page-table row. All or nothing: when the pages
 *  cannot be had, the match's lock is given back and nothing stays allocated or locked (a node the match split
 *  stays split: the cached prefixes are unchanged). Finish the request with kvhal_cache_manager_cache_finished
 *  (the whole list) or kvhal_cache_manager_cache_finished_suffix (tokens + cached_len and pages +
 *  cached_len / page_size), or unlock the handle and free the new pages.
 *  @param cm the manager (single-owner: concurrent calls get KVHAL_BUSY).
 *  @param tokens, num_tokens the prompt, as for kvhal_cache_manager_match (read during the call).
 *  @param extra_tokens tokens past the prompt to allocate pages for too (0: the prompt's own pages only).
 *  @param handle out: the request handle, as kvhal_cache_manager_match gives it.
 *  @param cached_len out (may be NULL): the matched length in tokens (a multiple of the page size).
 *  @param pages out: *num_pages page ids owned by cm: the cached_len / page_size matched ones, then the new ones;
 *               valid until the next kvhal_cache_manager_admit on cm or cm's destruction.
 *  @param num_pages out: ceil((num_tokens + extra_tokens) / page_size).
 *  @return KVHAL_OK; KVHAL_OUT_OF_MEMORY (kvhal_last_error() names extra_tokens) when the pages past the match are
 *          more than the free and evictable ones, nothing kept; otherwise as kvhal_cache_manager_match and
 *          kvhal_cache_manager_allocate. Thread safety: single-owner. Graph capture: host only, enqueues nothing. */
KVHAL_API kvhal_status kvhal_cache_manager_admit(kvhal_cache_manager *cm, const int32_t *tokens, size_t num_tokens,
                                                 size_t extra_tokens, kvhal_prefix_handle *handle,
                                                 size_t *cached_len, const int32_t **pages, size_t *num_pages);
/** Frees pages a request holds (every page is checked as one the caller's requests hold; all or nothing).
 *  @param cm the manager.
 *  @param pages n page indices.
 *  @param n >= 0.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (a page not held, or twice); KVHAL_OUT_OF_RANGE; KVHAL_INVALID_HANDLE.
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_free(kvhal_cache_manager *cm, const int32_t *pages, int32_t n);
/** A request finished: tokens[0..n) with pages covering ceil(n/page_size) pages (the first ones from match).
 * Inserts the page-aligned part, frees duplicate pages and the partial tail page, consumes handle.
 * @param cm the manager (single-owner: concurrent calls get KVHAL_BUSY).
 * @param tokens the request's num_tokens tokens (read during the call).
 * @param num_tokens their count.
 * @param pages its ceil(num_tokens / page_size) pages, the matched ones first (read during the call).
 * @param handle the request handle its kvhal_cache_manager_match gave; consumed on success.
 * @return KVHAL_OK; KVHAL_INVALID_HANDLE when handle is not a live request handle of cm (0, a node handle,
 *         finished or unlocked already, or stale after a reset); KVHAL_INVALID_ARGUMENT for pages not held or not
 *         repeating the matched ones; KVHAL_OUT_OF_MEMORY. Nothing changes on a refusal, and a refusal always
 *         sets kvhal_last_error(). On a write-through tiered manager, a host copy that fails once the pages are
 *         in the device cache does not refuse the finish: KVHAL_OK, and kvhal_cache_manager_tier_write_failures
 *         counts the pages left without a host copy.
 * Thread safety: cm is single-owner (concurrent calls get KVHAL_BUSY). Graph capture: host only, enqueues nothing (a
 * tiered manager's write-through copies: see kvhal_cache_manager_create_tiered). */
KVHAL_API kvhal_status kvhal_cache_manager_cache_finished(kvhal_cache_manager *cm, const int32_t *tokens,
                                                          size_t num_tokens, const int32_t *pages,
                                                          kvhal_prefix_handle handle);
/** The same, given only what follows the match: tokens[0..n) and their pages (ceil(n/page_size) of them) are the
 * request's tokens past the handle's cached length, inserted below the handle. The cached prefix is the handle's
 * by construction, so nothing of it is passed or compared again: what cache_finished spends re-reading and
 * checking the matched prefix (its tokens and pages), this one does not. Every page passed is still checked as one
 * the caller's requests hold.
 * @param cm the manager (single-owner: concurrent calls get KVHAL_BUSY).
 * @param handle the request handle its kvhal_cache_manager_match gave; consumed on success.
 * @param tokens the num_tokens tokens past the match (read during the call; NULL only with num_tokens 0).
 * @param num_tokens their count.
 * @param pages their ceil(num_tokens / page_size) pages, each one the request holds (read during the call).
 * @return as kvhal_cache_manager_cache_finished. Thread safety: cm is single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_cache_finished_suffix(kvhal_cache_manager *cm,
                                                                 kvhal_prefix_handle handle, const int32_t *tokens,
                                                                 size_t num_tokens, const int32_t *pages);
/** Free plus evictable pages (plus, on a tiered manager, draining ones: evicted pages whose copy to the host tier
 *  is queued or in flight, handed out once it completed).
 *  @param cm the manager.
 *  @return the count; 0 for NULL or a pointer that is not a live manager. Thread safety: single-owner. */
KVHAL_API int32_t kvhal_cache_manager_available(const kvhal_cache_manager *cm);
/** Free pages.
 *  @param cm the manager.
 *  @return the count; 0 for NULL or a pointer that is not a live manager. Thread safety: single-owner. */
KVHAL_API int32_t kvhal_cache_manager_num_free(const kvhal_cache_manager *cm);
/** Pages evicted since creation.
 *  @param cm the manager.
 *  @return the count; 0 for NULL or a pointer that is not a live manager. Thread safety: single-owner. */
KVHAL_API uint64_t kvhal_cache_manager_pages_evicted(const kvhal_cache_manager *cm);
/** Evicts at least num_tokens tokens of unlocked cached prefixes (LRU leaves first) into the free pages, or all
 *  there are.
 *  @param cm the manager.
 *  @param num_tokens tokens to free.
 *  @param evicted receives the tokens freed (may be NULL).
 *  On a tiered manager nothing is copied or waited for here: write-back queues the evicted pages for their copy
 *  and they drain (never handed out) until the copy completed; a page whose write-through copy is in flight drains
 *  too. The queued copies are enqueued by the next allocate, load_back, transfer_query or transfer_wait.
 *  @return KVHAL_OK; KVHAL_INVALID_HANDLE; KVHAL_UNSUPPORTED (naive prefix cache). Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_evict(kvhal_cache_manager *cm, size_t num_tokens, size_t *evicted);
/** Checks free + evictable + protected + held by running requests == total, and the prefix cache.
 *  @param cm the manager.
 *  @return KVHAL_OK; KVHAL_INTEGRITY naming the inconsistency; KVHAL_INVALID_HANDLE; KVHAL_OUT_OF_MEMORY.
 *  Thread safety: single-owner. */
KVHAL_API kvhal_status kvhal_cache_manager_check_integrity(const kvhal_cache_manager *cm);

/* The fault-injection hooks of the tests are not part of this API: kvhal_test.h (not installed). */

/* ------------------------------------------------------------------------------------------------------------ */
/* MLA caches (multi-head latent attention): one latent vector per token and no V side                           */
/* ------------------------------------------------------------------------------------------------------------ */
/** Paged caching of an MLA cache (DeepSeek-style multi-head latent attention, vLLM's concat_and_cache_mla): each
 *  token's row of kv_cache (e.g. 512 latent + 64 rotary dims) is written from kv_c and k_pe, or, K-only, from kv_c
 *  alone; there is no V cache. Token t goes to block slot / block_size, offset slot % block_size; a slot < 0 is
 *  padding; a slot past the cache is handled as in kvhal_paged_caching. An fp8 cache stores round(value / scale),
 *  nearest even, saturating, exactly as kvhal_paged_caching. Runs as one paged-caching launch on every device
 *  (the row's two column ranges are its two sides), with descriptors by shape class (token counts are call
 *  arguments).
 *  @param kv_cache     [blocks, block_size, dim] or [blocks, block_size, 1, dim], any strides; f32/f16/bf16 (the
 *                      input's dtype) or an fp8 dtype. Borrowed for the call; written on s.
 *  @param kv_c         [tokens, dim_c] or [tokens, 1, dim_c], f32/f16/bf16, any strides (a view into a fused
 *                      projection is fine); with k_pe NULL, dim_c is the whole row (the K-only form)
 *  @param k_pe         [tokens, dim_pe] or [tokens, 1, dim_pe] of kv_c's dtype, written after kv_c in the row
 *                      (dim_c + dim_pe = dim); NULL for the K-only form
 *  @param slot_mapping i32 or i64 [tokens], on the cache's device
 *  @param scale        fp8 caches: finite and > 0; ignored otherwise
 *  @param s            stream, NULL for the device's default
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL or invalid tensor, ranks, bad scale), KVHAL_SHAPE_MISMATCH (more
 *          than one head, dims that do not add up to the row, token counts), KVHAL_DTYPE_MISMATCH,
 *          KVHAL_DEVICE_MISMATCH, KVHAL_UNSUPPORTED (a part of 0 dims, a K-only row of 1 element, or the backend's
 *          refusal), KVHAL_OUT_OF_RANGE (a slot past the cache, host-readable slots), KVHAL_BACKEND_ERROR; the
 *          message names the argument.
 *  Thread safety: any thread; calls on one stream are ordered. Graph capture: may be captured like
 *  kvhal_paged_caching once its descriptor exists (the first call of a shape class creates it: make that call
 *  before capturing). Stream: asynchronous on s. */
KVHAL_API kvhal_status kvhal_paged_caching_mla(const kvhal_tensor *kv_cache, const kvhal_tensor *kv_c,
                                               const kvhal_tensor *k_pe, const kvhal_tensor *slot_mapping,
                                               float scale, kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Host memory for a device, stream polling and page transfers between a device paged cache and host pages      */
/* ------------------------------------------------------------------------------------------------------------ */
/** Host memory that a device copies to and from at full speed: pinned (CUDA, HIP) through the device's backend,
 * plain 64-byte aligned host memory where the backend has no such memory (cpu, and opencl in this release). */
typedef struct kvhal_host_memory kvhal_host_memory;

/** Allocates host memory for dev's transfers.
 * @param dev the device whose copies will use it. @param bytes at least 1.
 * @param out receives the handle (the caller owns it; kvhal_host_memory_destroy frees it).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT for a NULL out or bytes 0; KVHAL_NO_DEVICE / KVHAL_BACKEND_UNAVAILABLE
 *         for dev; KVHAL_OUT_OF_MEMORY (nothing allocated).
 * Thread safety: any thread. Graph capture: not while one of dev's streams is captured (CUDA's pinned allocation
 * synchronizes). */
KVHAL_API kvhal_status kvhal_host_memory_create(kvhal_device dev, size_t bytes, kvhal_host_memory **out);
/** Frees host memory; no transfer from or into it may still be in flight.
 * @param h a handle from kvhal_host_memory_create (NULL: KVHAL_OK).
 * @return KVHAL_OK; KVHAL_INVALID_HANDLE for a handle that is not live.
 * Thread safety: any thread, once no other call uses h. Graph capture: not while a stream of its device is captured. */
KVHAL_API kvhal_status kvhal_host_memory_destroy(kvhal_host_memory *h);
/** The host pointer of h (NULL for a handle that is not live). @param h the handle. @return the pointer.
 * Thread safety: any thread; h is not changed. Graph capture: host only, enqueues nothing. */
KVHAL_API void *kvhal_host_memory_ptr(const kvhal_host_memory *h);
/** The size of h in bytes (0 for a handle that is not live). @param h the handle. @return the size.
 * Thread safety: any thread; h is not changed. Graph capture: host only, enqueues nothing. */
KVHAL_API size_t kvhal_host_memory_size(const kvhal_host_memory *h);
/** Whether h is pinned or mapped by its device's backend (false: plain host memory). @param h the handle.
 * @return true when the backend allocated it.
 * Thread safety: any thread; h is not changed. Graph capture: host only, enqueues nothing. */
KVHAL_API bool kvhal_host_memory_pinned(const kvhal_host_memory *h);

/** Polls a stream: whether all work queued on it so far is done.
 * @param s a live stream (NULL: KVHAL_INVALID_ARGUMENT; poll a stream of your own, not the default stream).
 * @return KVHAL_OK when done; KVHAL_BUSY while work is pending; KVHAL_INVALID_HANDLE; a device error. Backends whose
 *         work completes on return (cpu) answer KVHAL_OK.
 * Thread safety: any thread. Graph capture: not on a stream being captured. Stream: never waits. */
KVHAL_API kvhal_status kvhal_stream_query(kvhal_stream *s);

/** Direction of a page transfer. */
typedef enum kvhal_transfer_dir {
    KVHAL_TO_HOST = 0,  /**< device blocks -> host pages (offload) */
    KVHAL_TO_DEVICE = 1 /**< host pages -> device blocks (load back) */
} kvhal_transfer_dir;

/** Copies whole pages between device caches and host pages in one call, for every cache at once (K and V of every
 * layer). Each cache has the block index as dim 0 and one block dense row-major (NHD and HND blocks both are), any
 * block stride; every cache's block has the same byte size. Host page h lies at host_page_bytes * h in host and
 * holds the block of cache c at byte c * block bytes (host_page_bytes >= num_caches * block bytes). pairs holds
 * num_pairs (device block, host page) on the host; no device block and no host page may appear twice.
 * @param caches num_caches tensors on one device (read during the call).
 * @param num_caches how many (>= 1).
 * @param host host pages (borrowed; must stay alive until the transfer completes).
 * @param host_page_bytes bytes between host pages. @param pairs, num_pairs the pages (read during the call).
 * @param dir KVHAL_TO_HOST or KVHAL_TO_DEVICE. @param s the stream (NULL: the device's default stream).
 * @return KVHAL_OK once enqueued; KVHAL_INVALID_ARGUMENT (NULL arrays, a block not dense, sizes differing, a
 *         duplicate page, host_page_bytes too small), KVHAL_OUT_OF_RANGE (a block or host page out of range),
 *         KVHAL_DEVICE_MISMATCH, KVHAL_INVALID_HANDLE, KVHAL_UNSUPPORTED (the backend has no page_transfer),
 *         KVHAL_OUT_OF_MEMORY, a backend error. Nothing is copied on a refusal.
 * Stream: asynchronous on s; the transfer is complete when kvhal_stream_query(s) says KVHAL_OK or after
 * kvhal_stream_synchronize(s) (kvhal_device_synchronize for the default stream). Until then the host pages must
 * not be reused (to host: not read; to device: not written). On cpu it is complete when the call returns.
 * Thread safety: any thread; concurrent transfers into the same pages race. Graph capture: may be captured on GPU
 * backends when host is pinned (the pairs travel as kernel parameters). */
KVHAL_API kvhal_status kvhal_page_transfer(const kvhal_tensor *caches, int32_t num_caches, kvhal_host_memory *host,
                                           size_t host_page_bytes, const int64_t *pairs, int32_t num_pairs,
                                           kvhal_transfer_dir dir, kvhal_stream *s);
/** Bytes of one host page of a paged cache: its block of every layer's K and V (2 * layers * block bytes).
 * @param c a paged cache. @return the size; 0 for a cache that is not live.
 * Thread safety: any thread (reads the cache's shape only). Graph capture: host only. */
KVHAL_API size_t kvhal_paged_cache_host_page_bytes(const kvhal_paged_cache *c);
/** kvhal_page_transfer over every layer's K and V of a paged cache (either order, NHD or HND), host pages of
 * kvhal_paged_cache_host_page_bytes(c) each: a host page holds [layers][K, V][block] in the cache's layout.
 * @param c the cache. @param host, pairs, num_pairs, dir, s as kvhal_page_transfer.
 * @return as kvhal_page_transfer; KVHAL_INVALID_HANDLE for c.
 * Thread safety: any thread, several at once (it reads the cache's shape, fixed at creation; concurrent transfers
 * into the same pages race), while no thread destroys the cache. Graph capture: not supported (call it outside a
 * capture). */
KVHAL_API kvhal_status kvhal_paged_cache_transfer(kvhal_paged_cache *c, kvhal_host_memory *host,
                                                  const int64_t *pairs, int32_t num_pairs, kvhal_transfer_dir dir,
                                                  kvhal_stream *s);

/* ------------------------------------------------------------------------------------------------------------ */
/* Hierarchical KV cache: a host tier under a cache manager's device pages, and KV events                        */
/* ------------------------------------------------------------------------------------------------------------ */
/** Seed of the page hash chain (ASCII "kvhal-kv"). The chain of a token sequence cut into pages of page_size
 * tokens: h[-1] = kvhal_kv_root_hash(page_size); h[i] = kvhal_kv_page_hash(h[i-1], the page's tokens, page_size).
 * Both are pure functions of their arguments (no per-process salt): the same tokens and page size give the same
 * hashes in every process and on every machine (little- or big-endian alike). */
#define KVHAL_KV_HASH_SEED 0x6b7668616c2d6b76ull

/** The parent hash of a sequence's first page.
 * @param page_size tokens per page. @return splitmix64(KVHAL_KV_HASH_SEED ^ page_size).
 * Thread safety: any thread (a pure function). Graph capture: host only, enqueues nothing. */
KVHAL_API uint64_t kvhal_kv_root_hash(int32_t page_size);
/** The hash of one page given its parent's: h = parent, then for each token t in order
 * h = splitmix64(h ^ (uint32_t)t), then h = splitmix64(h ^ ((uint64_t)page_size << 32)).
 * splitmix64(z): z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9; z = (z ^ z >> 27) * 0x94d049bb133111eb; z ^ z >> 31.
 * @param parent the previous page's hash (kvhal_kv_root_hash for the first page).
 * @param tokens page_size token ids (read during the call). @param page_size tokens per page.
 * @return the page's hash.
 * Thread safety: any thread (a pure function). Graph capture: host only, enqueues nothing. */
KVHAL_API uint64_t kvhal_kv_page_hash(uint64_t parent, const int32_t *tokens, int32_t page_size);

/** When the host tier receives a device page's content. */
typedef enum kvhal_write_policy {
    KVHAL_WRITE_THROUGH = 0, /**< when a request finishes: every page it adds to the device cache is copied */
    KVHAL_WRITE_BACK = 1     /**< when the device evicts a page not yet in the host tier */
} kvhal_write_policy;

/** What a tiered cache manager is created with. */
typedef struct kvhal_host_tier_config {
    kvhal_paged_cache *cache;  /**< the device paged cache whose blocks the manager's pages are (borrowed: it must
                                    outlive the manager); block_size = the manager's page size */
    uint64_t host_budget;      /**< bytes of host pages (each kvhal_paged_cache_host_page_bytes); 0: no host tier
                                    (events only) */
    kvhal_write_policy policy; /**< write-through or write-back */
    kvhal_stream *stream;      /**< the transfers' stream (borrowed); NULL: the manager makes its own (or uses the
                                    device's default stream where the backend has no streams) */
    uint32_t event_capacity;   /**< KV events kept until read (0: no events); at least 2 when set */
} kvhal_host_tier_config;

/** Creates a cache manager with a host tier (and/or KV events) over a device paged cache. Every other cache manager
 * function works on it; match, finish, evict and check_integrity also maintain the host tier and the events.
 * @param total_pages device pages the manager hands out (<= the cache's blocks). @param page_size = block_size.
 * @param kind the prefix cache (with KVHAL_PREFIX_NAIVE nothing is cached, so the host tier stays empty).
 * @param cfg read during the call.
 * @param out receives the manager (kvhal_cache_manager_destroy frees it, its host memory and its own stream).
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT naming the field at fault; KVHAL_INVALID_HANDLE for cfg->cache or
 *         cfg->stream; KVHAL_OUT_OF_MEMORY (host pages or bookkeeping: nothing is kept).
 * Thread safety: the manager is single-owner, as every cache manager.
 * Stream: the tier's copies run on cfg.stream (or the manager's own) and read device pages when cache_finished
 *         (write-through) or, for pages an eviction queued (write-back), when the next allocate, load_back,
 *         transfer_query or transfer_wait runs, so the K/V writes of those pages must be complete by then
 *         (synchronize the stream that wrote them, or pass that stream as cfg.stream). An evicted page whose copy
 *         is queued or in flight drains: it is handed out only after a poll (the queries inside match_tiered,
 *         allocate and transfer_query) or a wait saw its copy complete; allocation takes free pages first, then
 *         reaps completed copies, evicts what the draining pages cannot cover and waits only when still short.
 *         A host page becomes a hit (and its stored event is queued) once its copy completed. load_back's copies
 *         are waited for with kvhal_cache_manager_transfer_wait. Graph capture: none of the manager's calls may be
 *         captured. */
KVHAL_API kvhal_status kvhal_cache_manager_create_tiered(int32_t total_pages, int32_t page_size,
                                                         kvhal_prefix_kind kind, const kvhal_host_tier_config *cfg,
                                                         kvhal_cache_manager **out);
/** kvhal_cache_manager_match, and how far the host tier continues the match.
 * @param device_len out (may be NULL): tokens cached on the device (pages has their pages).
 * @param host_len out (may be NULL): whole pages of tokens past device_len that the host tier holds (0 without a
 *        host tier); kvhal_cache_manager_load_back brings them back.
 * @param cm, tokens, num_tokens, handle, pages, pages_cap as kvhal_cache_manager_match.
 * @return as kvhal_cache_manager_match.
 * Thread safety: the manager is single-owner (concurrent calls get KVHAL_BUSY). Graph capture: host only; the copies
 * it enqueues are not capturable. */
KVHAL_API kvhal_status kvhal_cache_manager_match_tiered(kvhal_cache_manager *cm, const int32_t *tokens,
                                                        size_t num_tokens, kvhal_prefix_handle *handle,
                                                        size_t *device_len, size_t *host_len, int32_t *pages,
                                                        size_t pages_cap);
/** Loads the host-resident pages that follow a request's device match back into device pages: allocates them
 * (evicting device prefixes as needed, never the request's own), enqueues the host-to-device copies on the tier's
 * stream and returns the pages, which the request then holds like allocated ones (they follow its matched pages;
 * finishing the request caches them on the device again). The copies are complete after
 * kvhal_cache_manager_transfer_wait (or when kvhal_cache_manager_transfer_query says KVHAL_OK); until then the
 * pages must not be read. The host pages stay in the host tier.
 * Bounded by the match: it never loads a page past the tokens the request's match reported, device_len + host_len
 * of kvhal_cache_manager_match_tiered (or, for a handle of kvhal_cache_manager_match or a match_tiered without
 * host_len, the num_tokens that match was given), whatever num_tokens is here: an engine that matched all but the
 * last prompt token may pass the whole prompt and gets exactly the reported host_len (less when host pages were
 * dropped since: loaded_len says). Each request loads once: a second load_back of the same handle loads nothing.
 * @param cm a tiered manager. @param handle the request handle of this request's match.
 * @param tokens, num_tokens the request's tokens (those given to match, or more of the same prompt; read during the
 *        call).
 * @param pages out: the loaded pages. @param pages_cap entries of room in pages. @param loaded_len out: tokens loaded (a multiple of the page
 *        size; 0 when the host tier holds nothing past the device match).
 * @return KVHAL_OK; KVHAL_INVALID_HANDLE; KVHAL_INVALID_ARGUMENT (not tiered, NULL arrays); KVHAL_OUT_OF_RANGE
 *         (pages_cap too small: nothing done); KVHAL_OUT_OF_MEMORY when the device has too few free or evictable pages
 *         (nothing done); a transfer error (the pages go back to the free set).
 * Thread safety: the manager is single-owner (concurrent calls get KVHAL_BUSY). Graph capture: host only; the copies
 * it enqueues are not capturable. */
KVHAL_API kvhal_status kvhal_cache_manager_load_back(kvhal_cache_manager *cm, kvhal_prefix_handle handle,
                                                     const int32_t *tokens, size_t num_tokens, int32_t *pages,
                                                     size_t pages_cap, size_t *loaded_len);
/** Enqueues the queued write-backs and waits for every transfer the manager has enqueued (drained pages go free,
 * host pages become hits). @param cm a tiered manager.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT when cm is not tiered; a device error.
 * Graph capture: not while the tier's stream is captured.
 * Thread safety: the manager is single-owner. Graph capture: no (it waits). */
KVHAL_API kvhal_status kvhal_cache_manager_transfer_wait(kvhal_cache_manager *cm);
/** Enqueues the queued write-backs and polls the manager's transfers (never waits, except on a device without
 * streams); when they are done, drained pages go free and host pages become hits. @param cm a tiered manager.
 * @return KVHAL_OK when all are done, KVHAL_BUSY while some are in flight; KVHAL_INVALID_ARGUMENT when not tiered.
 * Thread safety: the manager is single-owner. Graph capture: no. */
KVHAL_API kvhal_status kvhal_cache_manager_transfer_query(kvhal_cache_manager *cm);

/** Counters of a tiered manager. */
typedef struct kvhal_host_tier_stats {
    int64_t host_pages_total; /**< host pages the budget holds */
    int64_t host_pages_used;  /**< host pages holding a prefix now */
    uint64_t pages_written;   /**< device -> host page copies */
    uint64_t pages_loaded;    /**< host -> device page copies (load-back) */
    uint64_t host_evictions;  /**< host pages dropped (LRU) to make room */
    uint64_t events_dropped;  /**< events lost to a full queue (each loss also queued an overflow event) */
} kvhal_host_tier_stats;
/** @param cm a tiered manager. @param out receives the counters.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT when cm is not tiered or out is NULL.
 * Thread safety: the manager is single-owner. Graph capture: host only. */
KVHAL_API kvhal_status kvhal_cache_manager_tier_stats(const kvhal_cache_manager *cm, kvhal_host_tier_stats *out);
/** Device pages whose copy to the host tier failed (host memory for the copy's bookkeeping, a device error): a
 * write-through copy in cache_finished (the finish still succeeds: the request's pages are in the device cache,
 * only their host copies are missing) or a write-back store. Such pages stay on the device only, as if the host
 * tier had had no room; each failure is also logged as a warning (kvhal_log_set). A counter of its own because
 * kvhal_host_tier_stats is frozen.
 * @param cm a tiered manager. @param pages out: the count since the manager was created.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT when cm is not tiered or pages is NULL.
 * Thread safety: the manager is single-owner. Graph capture: host only. */
KVHAL_API kvhal_status kvhal_cache_manager_tier_write_failures(const kvhal_cache_manager *cm, uint64_t *pages);

/** Drops every host page (after waiting for the transfers in flight); a cleared event for the host tier.
 * @param cm a manager with a host tier. @return KVHAL_OK; KVHAL_INVALID_ARGUMENT when cm has no host tier.
 * Thread safety: the manager is single-owner. Graph capture: no (it waits for the transfers in flight). */
KVHAL_API kvhal_status kvhal_cache_manager_host_tier_clear(kvhal_cache_manager *cm);

/** KV event kinds. */
typedef enum kvhal_kv_event_type {
    KVHAL_KV_STORED = 0,   /**< a page now holds hash's tokens in tier */
    KVHAL_KV_REMOVED = 1,  /**< tier no longer holds hash */
    KVHAL_KV_CLEARED = 2,  /**< tier dropped everything */
    KVHAL_KV_OVERFLOW = 3  /**< dropped events were lost after this point: resynchronise (dropped tells how many) */
} kvhal_kv_event_type;
/** Where a page lives. */
typedef enum kvhal_kv_tier { KVHAL_TIER_DEVICE = 0, KVHAL_TIER_HOST = 1 } kvhal_kv_tier;
/** One KV event. Its tokens (stored events: page_size of them) are written to the caller's token array. */
typedef struct kvhal_kv_event {
    kvhal_kv_event_type type; /**< what happened */
    kvhal_kv_tier tier;       /**< the tier it happened in */
    uint64_t hash;        /**< the page's chain hash (stored, removed) */
    uint64_t parent_hash; /**< its parent's (kvhal_kv_root_hash for a first page; stored) */
    int32_t page;         /**< the device page or host page index */
    int32_t num_tokens;   /**< tokens written for this event (page_size for stored, else 0) */
    uint64_t dropped;     /**< overflow: events lost */
} kvhal_kv_event;
/** Takes up to cap events, oldest first, from a manager created with event_capacity > 0.
 * @param cm the manager. @param out cap events room. @param tokens cap * page_size token room: event i's tokens
 *        are tokens[i * page_size ...]. @param cap room. @param n out: events written.
 * @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (no events configured, NULL arrays with cap > 0, NULL n).
 * Thread safety: the manager is single-owner. Graph capture: host only. */
KVHAL_API kvhal_status kvhal_cache_manager_events_read(kvhal_cache_manager *cm, kvhal_kv_event *out,
                                                       int32_t *tokens, size_t cap, size_t *n);

/* ------------------------------------------------------------------------------------------------------------ */
/* Memory shared between processes of one host: a buffer exported as an opaque handle, imported by another     */
/* process onto one of its devices (CUDA/HIP IPC, POSIX shared memory for cpu).                                  */
/* ------------------------------------------------------------------------------------------------------------ */
/** Largest handle kvhal_buffer_ipc_export() writes, in bytes. */
#define KVHAL_IPC_HANDLE_MAX 256
/** Allocates device memory that other processes of this host can import (kvhal_buffer_ipc_export()): cuda and hip
 *  from cudaMalloc / hipMalloc (not the stream-ordered pool of kvhal_buffer_create(), which the IPC API cannot
 *  export), cpu from a POSIX shared-memory segment (shm_open, mmap; named while the buffer lives, unlinked by
 *  kvhal_buffer_destroy(); the segment of a process killed before that is unlinked by the next shareable CPU
 *  allocation of any process of the host). Otherwise like
 *  kvhal_buffer_create().
 *  @param dev the device.
 *  @param bytes the size, at least 1.
 *  @param out receives the buffer; kvhal_buffer_destroy() frees it. Contents are undefined.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL out, 0 bytes); the device lookup statuses; KVHAL_UNSUPPORTED
 *  (the backend has no shareable memory, e.g. opencl); KVHAL_OUT_OF_MEMORY; KVHAL_BACKEND_ERROR.
 *  Thread safety: any thread. Graph capture: no (cudaMalloc synchronizes the device). */
KVHAL_API kvhal_status kvhal_buffer_create_shareable(kvhal_device dev, size_t bytes, kvhal_buffer **out);
/** Writes a handle of a shareable buffer, to be handed to another process of this host (out of band).
 *  @param buf a buffer from kvhal_buffer_create_shareable() (or a paged cache's from
 *         kvhal_paged_cache_create_shareable()).
 *  @param blob receives the handle: at most cap bytes; NULL with cap 0 asks for the size.
 *  @param cap capacity of blob (KVHAL_IPC_HANDLE_MAX always suffices).
 *  @param len receives the handle's size.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL len, buf not shareable: named); KVHAL_INVALID_HANDLE (buf);
 *  KVHAL_OUT_OF_RANGE (cap too small: *len tells the size, nothing written); KVHAL_UNSUPPORTED (no IPC on the
 *  backend); KVHAL_BACKEND_ERROR. Thread safety: any thread. Graph capture: host only (enqueues nothing). */
KVHAL_API kvhal_status kvhal_buffer_ipc_export(const kvhal_buffer *buf, void *blob, size_t cap, size_t *len);
/** Opens another process's handle as a buffer on a local device of the same type (read access at least; another
 *  GPU of the host reads it peer to peer). The handle is untrusted input: a malformed, forged or foreign one fails
 *  with a status, never a crash. kvhal_buffer_destroy() closes it (the exporter's memory stays the exporter's; it
 *  must outlive every import in use, and what the exporter writes is visible once its own stream's work is done).
 *  @param dev the local device (its type must be the exporter's).
 *  @param blob the handle, len bytes, read during the call.
 *  @param len its size, at most KVHAL_IPC_HANDLE_MAX.
 *  @param out receives the buffer (its size is the exported buffer's).
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL, a malformed handle, naming the field); KVHAL_DEVICE_MISMATCH
 *  (exported from another device type); KVHAL_OUT_OF_RANGE (the memory opened is smaller than the handle says);
 *  KVHAL_UNSUPPORTED (no IPC on the backend); KVHAL_BACKEND_ERROR (the runtime refused it: another host, an
 *  exporter that is gone, the same process on CUDA); KVHAL_OUT_OF_MEMORY.
 *  Thread safety: any thread. Graph capture: no. */
KVHAL_API kvhal_status kvhal_buffer_ipc_import(kvhal_device dev, const void *blob, size_t len, kvhal_buffer **out);
/** Batched copies between two buffers on one device, as one backend operation where the backend has one (on cuda
 *  and hip a kernel launch per 96 ranges, per 512 on cuda where the module and the driver allow; on cuda built
 *  with a 12.8+ runtime and running on a 12.8+ driver, ranges averaging 256 KiB or more on a stream other than the
 *  legacy default one, not capturing, go to the copy engines in one cudaMemcpyBatchAsync instead:
 *  KVHAL_GPU_COPY_BATCH in docs/guide.md),
 *  asynchronously on s: for i in 0..count, bytes[i] bytes from src at src_offsets[i] to dst at dst_offsets[i].
 *  Ranges are checked against both buffers; destination ranges must not
 *  overlap each other or the source ranges when dst is src (not checked: the result is then undefined).
 *  @param dst the destination buffer.
 *  @param src the source buffer (e.g. one from kvhal_buffer_ipc_import()), on dst's device.
 *  @param dst_offsets, src_offsets, bytes count entries each (host memory, read during the call).
 *  @param count 0 .. INT32_MAX; 0 does nothing.
 *  @param s the stream (NULL: default), on dst's device.
 *  @return KVHAL_OK; KVHAL_INVALID_ARGUMENT (NULL arrays with count > 0, naming them); KVHAL_INVALID_HANDLE;
 *  KVHAL_OUT_OF_RANGE (entry i past either buffer, naming i); KVHAL_DEVICE_MISMATCH (src or s on another device);
 *  KVHAL_BACKEND_ERROR. Thread safety: any thread. Graph capture: may be captured. Stream: s. */
KVHAL_API kvhal_status kvhal_memcpy_d2d_batch(kvhal_buffer *dst, const kvhal_buffer *src, const size_t *dst_offsets,
                                              const size_t *src_offsets, const size_t *bytes, int32_t count,
                                              kvhal_stream *s);
/** kvhal_paged_cache_create() whose memory comes from kvhal_buffer_create_shareable(), so that another process of
 *  this host can import it (the buffer of its layer views, kvhal_paged_cache_layer(), to kvhal_buffer_ipc_export()); the transfer agent
 *  (kvhal_xfer.h) then moves pages device to device instead of through host memory. The buffer holds
 *  KVHAL_PAGED_CACHE_PROOF_BYTES more past the last page: the transfer agent's proof area (it writes a receiver's
 *  challenge there to prove the handle names its own memory; no page lies there).
 *  @param cfg as for kvhal_paged_cache_create(). @param out receives the cache; kvhal_paged_cache_destroy() frees
 *         it and its shareable memory (imports of that memory in other processes must be closed first).
 *  @return what kvhal_paged_cache_create() returns; KVHAL_UNSUPPORTED where the device has no shareable memory.
 *  Thread safety: any thread. Graph capture: no. */
KVHAL_API kvhal_status kvhal_paged_cache_create_shareable(const kvhal_paged_cache_config *cfg, kvhal_paged_cache **out);
/** Bytes a shareable paged cache's buffer holds past its pages (kvhal_paged_cache_create_shareable()). */
#define KVHAL_PAGED_CACHE_PROOF_BYTES 4096
/** Whether a buffer can be exported (made by kvhal_buffer_create_shareable()).
 *  @param buf the buffer. @return true for a live shareable buffer; false otherwise (NULL, imported, plain).
 *  Thread safety: any thread. Graph capture: host only. */
KVHAL_API bool kvhal_buffer_is_shareable(const kvhal_buffer *buf);

#ifdef __cplusplus
}
#endif
#endif /* KVHAL_H */

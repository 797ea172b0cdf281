/* ocl_internal.h — what the OpenCL backend's compilation units share. The module's state lives in one ocl_module
 * (the context init returns, freed at shutdown); every device points back to it.
 * The files call one another one way, from the top down (a file calls only the rooms below it):
 *   ocl_table.c    the table, its op slots and per-op dispatch generated from KVHAL_BK_OP_LIST
 *   ocl_<op>.c     one per op of KVHAL_BK_OP_LIST: supports, desc_create, desc_destroy and the op itself
 *   ocl_device.c   platform and device discovery, init/shutdown, device info, get_proc_address (test hooks)
 *   ocl_program.c  the kernel-source table, the program cache, a descriptor's kernels per cl_context, launches
 *   ocl_memory.c   contexts, buffers, streams (command queues), copies, memset, synchronize, the error flag
 *   ocl_error.c    OpenCL error names and statuses, messages, host allocation, the device lookup (ocl_error.h) */
#ifndef KVHAL_OCL_INTERNAL_H
#define KVHAL_OCL_INTERNAL_H

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "kvhal_backend.h"
#include "ocl_error.h"

/* Contexts a device can be used in: its platform's own context (index 0) and those of cl_mem objects or queues a
 * caller wrapped. Entries are appended under the device's mutex and never removed before shutdown, so a reader
 * that loads nctx (acquire) may use entries [0, nctx) without a lock. */
#define OCL_MAX_CTX 8

/* Work-items of one launch at most: keeps in-kernel index math in 32 bits and global sizes within every device's
 * size_t. Larger ops are split into several launches. */
#define OCL_MAX_ITEMS ((uint64_t)1 << 30)

/* Buffers the pool of a device keeps at most (and OCL_POOL_MAX entries). */
#define OCL_POOL_MAX 32

typedef struct ocl_module ocl_module;

typedef struct ocl_ctx {
    cl_context ctx;
    cl_command_queue queue; /* the device's default queue in this context */
    cl_mem err_flag;        /* one int; kernels atomic_or 1 into it when they skip an out-of-range index */
} ocl_ctx;

typedef struct ocl_stream {
    cl_command_queue queue; /* owned or retained (wrapped) */
    ocl_ctx *ce;
    int32_t dev;
    struct ocl_stream *prev, *next; /* the device's live streams, for device-wide synchronize */
    /* stream_query: submitted counts the commands handed to the queue through kvhal__ocl_resolve; query_ev is the
     * marker of the last query and query_seq the count it covers. A query makes a new marker only when something
     * was submitted since: a marker per poll would keep the newest one pending for ever on a device whose worker
     * runs behind the polling thread (PoCL). */
    atomic_uint_fast64_t submitted;
    cl_event query_ev;
    uint64_t query_seq;
} ocl_stream;

typedef struct ocl_device {
    ocl_module *m; /* the module instance the device belongs to */
    int32_t index; /* its id within the module */
    cl_device_id id;
    cl_platform_id platform;
    char name[256];
    char platform_name[128];
    cl_ulong global_mem, max_alloc;
    cl_uint compute_units, address_bits;
    size_t max_wg;
    bool amd_free_mem;   /* cl_amd_device_attribute_query: free memory can be asked */
    bool cpu;            /* CL_DEVICE_TYPE_CPU: kernels are specialised for serial work-items */
    bool nv_fp8;         /* NVIDIA, compute capability >= 8.9: hardware f32 -> fp8 through inline PTX */
    bool shared_context; /* other devices share its platform context (direct peer copies) */
    pthread_mutex_t mu;
    ocl_ctx ctxs[OCL_MAX_CTX];
    atomic_int nctx;
    ocl_stream *streams;
    /* The buffer pool (ocl_memory.c), under mu: buffers kvhal_buffer_destroy released, oldest first, kept for a
     * later kvhal_buffer_create of the same size. pool_cap: the bytes it may hold (global memory / 16). */
    cl_mem pool[OCL_POOL_MAX];
    size_t pool_size[OCL_POOL_MAX];
    int32_t pool_n;
    size_t pool_bytes, pool_cap;
    uint64_t pool_hits; /* creations the pool served (test hook kvhal_opencl_test_pool) */
    atomic_int fail_creates; /* test hook: this many clCreateBuffer calls to come fail as out of memory */
} ocl_device;

typedef struct ocl_prog_entry ocl_prog_entry;

/* The context: everything the module keeps, one per init. */
struct ocl_module {
    const kvhal_core_services *services;
    ocl_device devices[KVHAL_MAX_DEVICES_PER_TYPE];
    int32_t num_devices;
    cl_context platform_ctxs[KVHAL_MAX_DEVICES_PER_TYPE];
    int32_t num_platform_ctxs;
    /* program cache (ocl_program.c) */
    pthread_mutex_t prog_mu;
    ocl_prog_entry *progs; /* under prog_mu */
    char *inject_text;     /* under prog_mu; test hook kvhal_opencl_test_inject_source */
    atomic_uint_fast64_t build_count; /* test hook kvhal_opencl_build_count */
    atomic_int gpu_plans_on_cpu;      /* test hook kvhal_opencl_test_gpu_plans */
};

/* ---- ocl_device.c ---- */
/* Whether kernels for d are planned for a CPU device (false on GPUs, and on every device while the test hook
 * kvhal_opencl_test_gpu_plans is on). */
OCL_HIDDEN bool kvhal__ocl_cpu_plans(const ocl_device *d);
OCL_HIDDEN kvhal_status kvhal__ocl_init(const kvhal_core_services *services, void **ctx, int32_t *device_count,
                                        char *reason, size_t reason_size);
OCL_HIDDEN void kvhal__ocl_shutdown(void *ctx);
OCL_HIDDEN void *kvhal__ocl_get_proc_address(void *ctx, const char *name);
OCL_HIDDEN kvhal_status kvhal__ocl_device_info(void *ctx, int32_t id, kvhal_device_info *out);

/* ---- ocl_memory.c ---- */
/* A queue and an error flag for ctx on d (entry e). */
OCL_HIDDEN kvhal_status kvhal__ocl_ctx_entry_make(ocl_device *d, cl_context ctx, ocl_ctx *e);
OCL_HIDDEN void kvhal__ocl_ctx_entry_release(ocl_ctx *e);
/* The context entry of mem on device d (registers nothing: a mem the module never saw in a known context is an
 * error). With only the platform context in use this makes no OpenCL call. */
OCL_HIDDEN kvhal_status kvhal__ocl_ctx_of_mem(ocl_device *d, cl_mem mem, ocl_ctx **out);
/* The queue and context entry an operation on mem runs in: the stream's (mem must share its context) or the
 * default queue of mem's context. */
OCL_HIDDEN kvhal_status kvhal__ocl_resolve(ocl_device *d, void *stream, cl_mem mem, cl_command_queue *q,
                                           ocl_ctx **ce);
/* clEnqueueCopyBuffer that also handles overlapping ranges of one buffer (through a temporary buffer). */
OCL_HIDDEN kvhal_status kvhal__ocl_copy(ocl_device *d, cl_command_queue q, ocl_ctx *ce, cl_mem dst, size_t dst_off,
                                        cl_mem src, size_t src_off, size_t bytes);
OCL_HIDDEN kvhal_status kvhal__ocl_buffer_alloc(void *ctx, int32_t id, size_t bytes, void **native);
OCL_HIDDEN kvhal_status kvhal__ocl_buffer_free(void *ctx, int32_t id, void *native);
/* Releases every buffer the device's pool holds (shutdown, and before retrying a failed allocation); returns
 * how many. */
OCL_HIDDEN int32_t kvhal__ocl_pool_release(ocl_device *d);
OCL_HIDDEN kvhal_status kvhal__ocl_buffer_wrap(void *ctx, int32_t id, void *native, size_t bytes);
OCL_HIDDEN kvhal_status kvhal__ocl_buffer_unwrap(void *ctx, int32_t id, void *native);
OCL_HIDDEN kvhal_status kvhal__ocl_stream_create(void *ctx, int32_t id, void **stream);
OCL_HIDDEN kvhal_status kvhal__ocl_stream_wrap(void *ctx, int32_t id, void *native, void **stream);
OCL_HIDDEN kvhal_status kvhal__ocl_stream_destroy(void *ctx, int32_t id, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_stream_synchronize(void *ctx, int32_t id, void *stream);
/* KVHAL_OK when the queue's work is done, KVHAL_BUSY otherwise (a marker's status; never waits). */
OCL_HIDDEN kvhal_status kvhal__ocl_stream_query(void *ctx, int32_t id, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_event_create(void *ctx, int32_t id, void **ev);
OCL_HIDDEN kvhal_status kvhal__ocl_event_destroy(void *ctx, int32_t id, void *ev);
OCL_HIDDEN kvhal_status kvhal__ocl_event_record(void *ctx, int32_t id, void *ev, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_event_query(void *ctx, int32_t id, void *ev);
OCL_HIDDEN kvhal_status kvhal__ocl_event_synchronize(void *ctx, int32_t id, void *ev);
OCL_HIDDEN kvhal_status kvhal__ocl_stream_wait_event(void *ctx, int32_t id, void *stream, void *ev);
OCL_HIDDEN kvhal_status kvhal__ocl_memcpy_h2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src,
                                              size_t bytes, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_memcpy_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t src_off,
                                              size_t bytes, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_memcpy_d2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src,
                                              size_t src_off, size_t bytes, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_memcpy_peer(void *ctx, int32_t dst_id, void *dst, size_t dst_off, int32_t src_id,
                                               const void *src, size_t src_off, size_t bytes, void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t bytes,
                                          void *stream);
OCL_HIDDEN kvhal_status kvhal__ocl_synchronize(void *ctx, int32_t id);
OCL_HIDDEN kvhal_status kvhal__ocl_check_errors(void *ctx, int32_t id);
OCL_HIDDEN kvhal_status kvhal__ocl_stream_check_errors(void *ctx, int32_t id, void *stream);

/* ---- ocl_program.c ---- */
#define OCL_MAX_KERNELS 3

/* A descriptor's kernels in one cl_context. */
typedef struct ocl_kset {
    ocl_ctx *ce;
    cl_program prog;
    cl_kernel k[OCL_MAX_KERNELS];
    size_t local[OCL_MAX_KERNELS];
    /* Per kernel, what the op last set of its per-call arguments (0 after creation), so that an unchanged value is
     * not set again: descriptors serve every token count, and a serving loop's count changes every step. */
    uint64_t call_state[OCL_MAX_KERNELS];
    struct ocl_kset *next;
} ocl_kset;

/* What every op's descriptor starts with: the program (the op's .cl file with options) and its kernels, made per
 * cl_context the descriptor is used in (normally just one). preset, when set, gives a new kernel set the
 * arguments that are fixed for the descriptor (metadata), so that a call sets only memory, offsets and scales. */
typedef struct ocl_desc {
    kvhal_bk_op op;
    int32_t nk; /* kernels of the program; 0: the descriptor builds nothing */
    const char *const *knames;
    char options[256];
    kvhal_status (*preset)(ocl_device *d, const struct ocl_desc *desc, ocl_kset *ks);
    ocl_kset *sets;
} ocl_desc;

/* One kernel argument: its size and where its value is. */
typedef struct ocl_karg {
    size_t size;
    const void *ptr;
} ocl_karg;
#define OCL_KA(x) {sizeof(x), &(x)}

/* A built program for (ce's context, d, the op's .cl file, options), built on first request and shared afterwards;
 * returned with a reference the caller releases. A failed build reports its build log. */
OCL_HIDDEN kvhal_status kvhal__ocl_program(ocl_device *d, ocl_ctx *ce, kvhal_bk_op op, const char *options,
                                           cl_program *out);
/* Frees every cached program (shutdown). */
OCL_HIDDEN void kvhal__ocl_programs_free(ocl_module *m);
/* The descriptor's kernels for context ce: built (through the program cache) and preset the first time ce is
 * seen. */
OCL_HIDDEN kvhal_status kvhal__ocl_kset(ocl_device *d, ocl_desc *desc, ocl_ctx *ce, ocl_kset **out);
/* Ends a desc_create: builds the descriptor's kernels for the context of mem (the first call pays for the build,
 * later ones never do) and hands it out, or destroys it (destroy) and returns the error. */
OCL_HIDDEN kvhal_status kvhal__ocl_desc_build(ocl_device *d, ocl_desc *desc, cl_mem mem,
                                              void (*destroy)(ocl_device *d, void *desc), void **out);
/* Releases the kernel sets and frees the descriptor (NULL: nothing). */
OCL_HIDDEN void kvhal__ocl_desc_free(void *desc);
/* Allocates a zeroed descriptor of size bytes (starting with an ocl_desc) for op. */
OCL_HIDDEN kvhal_status kvhal__ocl_desc_alloc(ocl_device *d, kvhal_bk_op op, size_t size, void **out);
/* Checks that desc was made for op. */
OCL_HIDDEN kvhal_status kvhal__ocl_desc_check(ocl_device *d, const void *desc, kvhal_bk_op op);
OCL_HIDDEN kvhal_status kvhal__ocl_set_args(ocl_device *d, cl_kernel k, const char *kname, cl_uint first,
                                            const ocl_karg *a, int n);
/* One 1-D launch of kernel ki of ks covering items work-items (rounded up to its work-group size). */
OCL_HIDDEN kvhal_status kvhal__ocl_launch(ocl_device *d, cl_command_queue q, const ocl_kset *ks, int ki,
                                          const char *kname, uint64_t items, cl_uint nwait, const cl_event *wait,
                                          cl_event *ev);
/* Writes a refusal into reason (printf-style) and returns false, for supports(). */

/* ---- ocl_<op>.c: per op `name` of KVHAL_BK_OP_LIST with argument struct T ----
 *   ocl_<name>_supports     whether d can run it (false with the reason); ocl_table.c's desc_create asks it first
 *   ocl_<name>_desc_create  the plan (work sizes, kernel choice, chunking) and the built kernels, for arguments
 *                           supports accepted
 *   ocl_<name>_desc_destroy frees what desc_create made
 *   ocl_<name>              the op slot: sets the per-call arguments and enqueues */
#define OCL_X_OP_DECL(E, name, T)                                                                               \
    OCL_HIDDEN bool ocl_##name##_supports(const ocl_device *d, const T *a, char *reason, size_t reason_size);   \
    OCL_HIDDEN kvhal_status ocl_##name##_desc_create(ocl_device *d, const T *a, void **desc);                  \
    OCL_HIDDEN void ocl_##name##_desc_destroy(ocl_device *d, void *desc);                                      \
    OCL_HIDDEN kvhal_status ocl_##name(void *ctx, int32_t id, void *desc, const T *a, void *stream);
KVHAL_BK_OP_LIST(OCL_X_OP_DECL)
#undef OCL_X_OP_DECL

/* ocl_copy_blocks.c */
OCL_HIDDEN kvhal_status ocl_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream);

#endif

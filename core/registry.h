/* registry.h — the loaded backends as the core calls them (registry.c): the backend struct, the lookup from a
 * device to its backend, the device type names, and the messages naming a backend. */
#ifndef KVHAL_CORE_REGISTRY_H
#define KVHAL_CORE_REGISTRY_H

#include "common.h"

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
    int32_t pid;        /* the process that ran the module's init; 0: the built-in CPU backend, usable after fork */
} kvhal__bk;

/* This process's id, kept by a fork handler (pthread_atfork) so that the check below is two loads, no system call. */
KVHAL_HIDDEN extern atomic_int kvhal__pid;
/* The refusal of kvhal__bk_here: "<arg>: <type>:<id>: the <module> backend was initialised by process P; this is
 * process C, a fork of it ..." (KVHAL_BACKEND_UNAVAILABLE). */
KVHAL_HIDDEN kvhal_status kvhal__bk_forked(const kvhal__bk *bk, int32_t id, const char *arg);
/* Whether this process may call bk: a device runtime initialised before fork() is not usable in the child (PoCL's
 * threads, CUDA's and HIP's contexts are the parent's; calls hang or fail obscurely), so every entry point that
 * reaches a backend asks this first. The built-in CPU backend has no state a fork breaks. */
static inline bool kvhal__bk_usable(const kvhal__bk *bk)
{
    return __builtin_expect(bk->pid == 0 || bk->pid == atomic_load_explicit(&kvhal__pid, memory_order_relaxed), 1);
}
/* KVHAL_OK, or the refusal (argument arg, device id) when this process is a fork of the one that initialised bk. */
static inline kvhal_status kvhal__bk_here(const kvhal__bk *bk, int32_t id, const char *arg)
{
    return kvhal__bk_usable(bk) ? KVHAL_OK : kvhal__bk_forked(bk, id, arg);
}

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

#endif

/* registry.c — backend discovery, device-type names and the dispatcher.
 *
 * Discovery runs once (pthread_once): the built-in CPU backend, then every libkvhal-*.so module in
 * KVHAL_BACKEND_PATH (colon-separated, first), the build tree beside this library, and the install's lib/kvhal-0/.
 * kvhal_backend_load() adds one more module later. A module that fails (dlopen error, no entry symbol, ABI outside
 * this core's range, a bad table, a bad or taken device-type name, the type bound, init error) is recorded with its
 * reason and skipped.
 *
 * Module files and folders (see kvhal__module_file_check): under secure execution (setuid, setgid, capabilities)
 * KVHAL_BACKEND_PATH and KVHAL_BACKENDS are ignored (secure_getenv). A module file is opened without blocking and
 * must be a regular file; it and its folder must be owned by root or this process's effective user and writable by
 * nobody else (no group or other write bit), as the dynamic loader requires of what it loads for a setuid program;
 * so nobody else can swap the file between the check and dlopen.
 * There is no limit on the number of modules or folder entries listed; a refused file is listed with its reason.
 *
 * Device types are names. The built-in names keep their ids (cpu 0, cuda 1, hip 2, opencl 3) whether or not their
 * module loads; another name is given the next free id below KVHAL_MAX_DEVICE_TYPES when its module loads. The
 * first module to serve a name wins. Afterwards by_type[type] is a plain array lookup with no lock: a slot is
 * written once (release) and never changes, because modules are never unloaded. */
#define _GNU_SOURCE /* dladdr, secure_getenv */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "faults.h"
#include "registry.h"

typedef struct module {
    kvhal_backend_module_info info;
    kvhal__bk bk;
    void *handle;
} module;

static pthread_once_t once = PTHREAD_ONCE_INIT;
/* Held while a module is added (discovery, kvhal_backend_load) and while the module list is read. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
/* Each module is allocated once and never freed or moved (by_type points into it); the array of pointers grows. */
static module **modules;
static int32_t num_modules, cap_modules;
static _Atomic(const kvhal__bk *) by_type[KVHAL_MAX_DEVICE_TYPES];
/* Type names: [0, num_types) are written before num_types is raised (release); built-in names from the start. */
static char type_names[KVHAL_MAX_DEVICE_TYPES][KVHAL_DEVICE_TYPE_NAME_MAX] = {"cpu", "cuda", "hip", "opencl"};
static atomic_int num_types = KVHAL__BUILTIN_TYPES;

/* ---- fork ---- */
atomic_int kvhal__pid;
static const kvhal_backend *builtin_cpu; /* the CPU backend's table (written under load_lock) */

static void forked_child(void) { atomic_store_explicit(&kvhal__pid, (int)getpid(), memory_order_relaxed); }

kvhal_status kvhal__bk_forked(const kvhal__bk *bk, int32_t id, const char *arg)
{
    return kvhal__err(KVHAL_BACKEND_UNAVAILABLE,
                      "%s: %s:%d: the %s backend was initialised by process %d and this is process %d, a fork of it: a "
                      "device runtime does not survive fork (use the device in the parent only, or start the child "
                      "with exec, or fork before the first kvhal call; the cpu device works in both)",
                      arg, bk->type_name, (int)id, bk->name, (int)bk->pid,
                      atomic_load_explicit(&kvhal__pid, memory_order_relaxed));
}

static const kvhal_core_services services = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_core_services),
    .set_error = kvhal__err,
    .log = kvhal__log,
    .alloc_should_fail = kvhal__alloc_should_fail,
};

static const char *const op_names[KVHAL_BK_OP_COUNT] = {
#define X(E, name, T) #name,
    KVHAL_BK_OP_LIST(X)
#undef X
};

const char *kvhal__op_name(kvhal_bk_op op) { return (unsigned)op < KVHAL_BK_OP_COUNT ? op_names[op] : "invalid op"; }

kvhal_status kvhal__unsupported(const kvhal__bk *bk, kvhal_device dev, kvhal_bk_op op, const char *reason)
{
    if (reason)
        return kvhal__err(KVHAL_UNSUPPORTED, "the %s backend (device %s:%d) does not support this %s call: %s",
                          bk->name, bk->type_name, (int)dev.id, kvhal__op_name(op), reason[0] ? reason : "refused");
    return kvhal__err(KVHAL_UNSUPPORTED, "the %s backend (device %s:%d) does not implement %s", bk->name,
                      bk->type_name, (int)dev.id, kvhal__op_name(op));
}

/* ---- type names ---- */

bool kvhal__type_registered(kvhal_device_type t)
{
    return (int)t >= 0 && (int)t < atomic_load_explicit(&num_types, memory_order_acquire);
}

const char *kvhal_device_type_name(kvhal_device_type t) { return kvhal__type_registered(t) ? type_names[t] : "invalid"; }

/* [a-z][a-z0-9_]*, shorter than KVHAL_DEVICE_TYPE_NAME_MAX. NULL when valid, else what is wrong. */
static const char *name_problem(const char *name)
{
    if (!name) return "NULL";
    size_t n = strnlen(name, KVHAL_DEVICE_TYPE_NAME_MAX);
    if (n == 0) return "empty";
    if (n >= KVHAL_DEVICE_TYPE_NAME_MAX) return "longer than 15 characters";
    if (!(name[0] >= 'a' && name[0] <= 'z')) return "does not start with a lowercase letter";
    for (size_t i = 1; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return "not a lowercase identifier ([a-z][a-z0-9_]*)";
    }
    return NULL;
}

/* The id of a registered name (length len, not NUL-terminated), or -1. */
static int find_type(const char *name, size_t len)
{
    int n = atomic_load_explicit(&num_types, memory_order_acquire);
    for (int t = 0; t < n; t++)
        if (strlen(type_names[t]) == len && !strncmp(type_names[t], name, len)) return t;
    return -1;
}

static void ensure_loaded(void);

int kvhal__find_type(const char *name, size_t len)
{
    ensure_loaded();
    return find_type(name, len);
}

/* "cpu, cuda, hip, opencl, npu" */
static void list_types(char *buf, size_t size)
{
    int n = atomic_load_explicit(&num_types, memory_order_acquire);
    size_t used = 0;
    buf[0] = '\0';
    for (int t = 0; t < n && used < size; t++) {
        int w = snprintf(buf + used, size - used, "%s%s", t ? ", " : "", type_names[t]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

kvhal_status kvhal__type_error(kvhal_status st, const char *arg, const char *text, size_t len)
{
    char known[KVHAL_MAX_DEVICE_TYPES * (KVHAL_DEVICE_TYPE_NAME_MAX + 2)];
    list_types(known, sizeof known);
    if (text[len] != '\0')
        return kvhal__err(st, "%s: \"%.64s\": \"%.*s\" is not a registered device type (registered: %s; a vendor "
                          "type is registered when its module loads, see kvhal-info)", arg, text,
                          (int)(len > 64 ? 64 : len), text, known);
    return kvhal__err(st, "%s: \"%.64s\" is not a registered device type (registered: %s; a vendor type is "
                      "registered when its module loads, see kvhal-info)", arg, text, known);
}

kvhal_status kvhal_device_type_find(const char *name, kvhal_device_type *out)
{
    KVHAL_CHECK_ARG(name, "name: NULL");
    KVHAL_CHECK_ARG(out, "out: NULL");
    int t = kvhal__find_type(name, strlen(name));
    if (t < 0) return kvhal__type_error(KVHAL_NOT_FOUND, "name", name, strlen(name));
    *out = (kvhal_device_type)t;
    return KVHAL_OK;
}

/* ---- loading ---- */

/* Entries without which a backend cannot serve anything. */
static const char *missing_required(const kvhal_backend *t, const kvhal_backend_device_fns *d)
{
    if (!t->init) return "init";
    if (!d->device_info) return "device.device_info";
    if (!d->buffer_alloc) return "device.buffer_alloc";
    if (!d->buffer_free) return "device.buffer_free";
    if (!d->memcpy_h2d) return "device.memcpy_h2d";
    if (!d->memcpy_d2h) return "device.memcpy_d2h";
    if (!d->memcpy_d2d) return "device.memcpy_d2d";
    if (!d->synchronize) return "device.synchronize";
    /* the event slots are a group: all six or none (a module with some only is refused, not half-served) */
#define KVHAL__EV_SLOT(f) {d->f != NULL, "device." #f " (the event slots go together)"}
    const struct {
        bool set;
        const char *missing;
    } ev[] = {KVHAL__EV_SLOT(event_create),      KVHAL__EV_SLOT(event_destroy), KVHAL__EV_SLOT(event_record),
              KVHAL__EV_SLOT(event_query),       KVHAL__EV_SLOT(event_synchronize),
              KVHAL__EV_SLOT(stream_wait_event)};
#undef KVHAL__EV_SLOT
    const size_t n = sizeof ev / sizeof ev[0];
    size_t set = 0;
    for (size_t i = 0; i < n; i++) set += ev[i].set;
    for (size_t i = 0; set && set < n && i < n; i++)
        if (!ev[i].set) return ev[i].missing;
    return NULL;
}

static module *new_module(const char *name, const char *path)
{
    if (num_modules == cap_modules) {
        int32_t cap = cap_modules ? 2 * cap_modules : 16;
        /* plain allocations, not fault points: the registry is process state, not a caller's object */
        module **a = cap_modules < INT32_MAX / 2 ? realloc(modules, (size_t)cap * sizeof *a) : NULL;
        if (!a) return NULL;
        modules = a;
        cap_modules = cap;
    }
    module *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    modules[num_modules++] = m;
    m->info.type_id = -1;
    snprintf(m->info.name, sizeof m->info.name, "%s", name);
    snprintf(m->info.path, sizeof m->info.path, "%s", path);
    kvhal__utf8_trim(m->info.name);
    kvhal__utf8_trim(m->info.path);
    return m;
}

/* A module's reason (truncated to fit, on purpose: it is a message). */
__attribute__((format(printf, 2, 3))) static void set_reason(module *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->info.reason, sizeof m->info.reason, fmt, ap);
    va_end(ap);
    kvhal__utf8_trim(m->info.reason);
}
#define REASON set_reason

/* Copies a group that starts with its own size, full-size: slots past the module's size stay zero. */
static bool copy_group(void *dst, size_t dst_size, const void *src, size_t min_size)
{
    uint32_t n;
    memcpy(&n, src, sizeof n);
    if (n < min_size) return false;
    memcpy(dst, src, n < dst_size ? n : dst_size);
    return true;
}

/* Takes a module's table: checks version, sizes, names and required entries, picks the type id, runs init,
 * publishes the backend. Called with load_lock held. Returns the status kvhal_backend_load reports. */
static kvhal_status adopt(module *m, const kvhal_backend *t)
{
    m->info.abi_version = t->abi_version;
    if (t->abi_version < KVHAL_BACKEND_ABI_MIN || t->abi_version > KVHAL_BACKEND_ABI_VERSION) {
        REASON(m, "ABI version %u not supported: the module was built for plugin ABI %u, this core takes ABI %d%s%s",
               t->abi_version, t->abi_version, KVHAL_BACKEND_ABI_VERSION,
               t->abi_version < KVHAL_BACKEND_ABI_MIN ? " (rebuild it against this release's kvhal_backend.h)" : "",
               t->abi_version > KVHAL_BACKEND_ABI_VERSION ? " (it needs a newer kvhal)" : "");
        return KVHAL_ABI_MISMATCH;
    }
    if (t->struct_size < offsetof(kvhal_backend, ops) + sizeof(void *)) {
        REASON(m, "table size %u too small (ABI %u tables are at least %zu bytes)", t->struct_size, t->abi_version,
               offsetof(kvhal_backend, ops) + sizeof(void *));
        return KVHAL_LOAD_FAILED;
    }
    if (t->name && *t->name) snprintf(m->info.name, sizeof m->info.name, "%.31s", t->name); /* reads <= 31 */
    const char *bad = name_problem(t->device_type);
    if (t->device_type) snprintf(m->info.device_type, sizeof m->info.device_type, "%.15s", t->device_type);
    if (bad) {
        REASON(m, "device type name \"%.64s\" is invalid: %s", t->device_type ? t->device_type : "(null)", bad);
        return KVHAL_LOAD_FAILED;
    }
    if (!t->device) {
        REASON(m, "table lacks the required entry 'device'");
        return KVHAL_LOAD_FAILED;
    }
    kvhal__bk *bk = &m->bk;
    if (!copy_group(&bk->dev, sizeof bk->dev, t->device, offsetof(kvhal_backend_device_fns, buffer_alloc))) {
        REASON(m, "device functions: struct_size too small");
        return KVHAL_LOAD_FAILED;
    }
    if (t->ops && !copy_group(&bk->ops, sizeof bk->ops, t->ops, sizeof(uint32_t))) {
        REASON(m, "op functions: struct_size too small");
        return KVHAL_LOAD_FAILED;
    }
    const char *missing = missing_required(t, &bk->dev);
    if (missing) {
        REASON(m, "table lacks the required entry '%s'", missing);
        return KVHAL_LOAD_FAILED;
    }
    int type = find_type(t->device_type, strlen(t->device_type));
    if (type >= 0 && atomic_load_explicit(&by_type[type], memory_order_relaxed)) {
        const char *owner = "another module";
        for (int32_t i = 0; i < num_modules; i++)
            if (modules[i]->info.loaded && modules[i]->info.type_id == type) owner = modules[i]->info.path;
        REASON(m, "skipped: %s devices are already served by %s (the first module to serve a type wins)",
               t->device_type, owner);
        return KVHAL_LOAD_FAILED;
    }
    bool new_type = type < 0;
    if (new_type) {
        type = atomic_load_explicit(&num_types, memory_order_relaxed);
        if (type >= KVHAL_MAX_DEVICE_TYPES) {
            REASON(m, "device type \"%s\" not registered: all %d device type ids are taken (KVHAL_MAX_DEVICE_TYPES)",
                   t->device_type, KVHAL_MAX_DEVICE_TYPES);
            return KVHAL_LOAD_FAILED;
        }
    }
    int32_t count = 0;
    void *ctx = NULL;
    char reason[sizeof m->info.reason] = "";
    kvhal_clear_error();
    kvhal_status st = t->init(&services, &ctx, &count, reason, sizeof reason);
    reason[sizeof reason - 1] = '\0'; /* a module that fills the buffer without a terminator is cut, not over-read */
    if (st != KVHAL_OK) {
        REASON(m, "init failed: %s%s%s", kvhal_status_name(st), reason[0] || kvhal_last_error()[0] ? ": " : "",
               reason[0] ? reason : kvhal_last_error());
        return KVHAL_LOAD_FAILED;
    }
    if (count < 0) count = 0;
    if (count > KVHAL_MAX_DEVICES_PER_TYPE) count = KVHAL_MAX_DEVICES_PER_TYPE;
    bk->ctx = ctx;
    bk->type = (kvhal_device_type)type;
    bk->device_count = count;
    bk->get_proc_address = t->get_proc_address;
    /* the built-in CPU backend holds host memory only: a forked child keeps using it */
    bk->pid = t == builtin_cpu ? 0 : atomic_load_explicit(&kvhal__pid, memory_order_relaxed);
    snprintf(bk->name, sizeof bk->name, "%s", m->info.name);
    snprintf(bk->type_name, sizeof bk->type_name, "%s", t->device_type);
    if (new_type) {
        snprintf(type_names[type], sizeof type_names[type], "%s", t->device_type);
        atomic_store_explicit(&num_types, type + 1, memory_order_release);
    }
    m->info.loaded = true;
    m->info.device_count = count;
    m->info.type_id = type;
    REASON(m, "%s", reason);
    atomic_store_explicit(&by_type[type], bk, memory_order_release);
    return KVHAL_OK;
}

/* KVHAL_BACKENDS=cpu,opencl limits which modules load (e.g. valgrind runs of the CPU suites); unset = all. */
static bool backend_wanted(const char *name)
{
    const char *list = secure_getenv("KVHAL_BACKENDS");
    if (!list || !*list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n)) return true;
        p += len;
        if (*p == ',') p++;
    }
    return false;
}

/* Owner root or the effective user, and no group or other write bit. */
static bool owner_mode_safe(const struct stat *st, const char *what, const char *path, char *why, size_t n)
{
    uid_t me = geteuid();
    if (st->st_uid != 0 && st->st_uid != me) {
        snprintf(why, n, "refused: %s %.900s is owned by uid %u, neither root nor this process's effective user (%u)",
                 what, path, (unsigned)st->st_uid, (unsigned)me);
        return false;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, n, "refused: %s %.900s is writable by %s (mode %04o); a module and its folder must be "
                 "writable by their owner (root or this user) only", what, path,
                 (st->st_mode & S_IWOTH) ? "everyone" : "its group", (unsigned)(st->st_mode & 07777));
        return false;
    }
    return true;
}

bool kvhal__module_file_check(const char *path, int *fd_out, char *why, size_t n)
{
    *fd_out = -1;
    struct stat st, fst;
    /* stat first, so that a FIFO or a device is never opened; then open without blocking and check that the file
     * opened is the one looked at */
    if (stat(path, &st) != 0) {
        snprintf(why, n, "cannot stat %.900s: %s", path, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, n, "refused: %.900s is not a regular file (a FIFO, device or folder is never opened as a module)",
                 path);
        return false;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        snprintf(why, n, "refused: cannot open %.900s: %s", path, strerror(errno));
        return false;
    }
    if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode) || fst.st_dev != st.st_dev || fst.st_ino != st.st_ino) {
        snprintf(why, n, "refused: %.900s changed while it was checked", path);
        close(fd);
        return false;
    }
    if (!owner_mode_safe(&fst, "module file", path, why, n)) {
        close(fd);
        return false;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    struct stat dst;
    if (stat(dir, &dst) != 0 || !owner_mode_safe(&dst, "module folder", dir, why, n)) {
        if (why[0] == '\0') snprintf(why, n, "refused: cannot stat the folder %.900s", dir);
        close(fd);
        return false;
    }
    *fd_out = fd;
    return true;
}

/* Loads one file (load_lock held). explicit: asked for by kvhal_backend_load, so KVHAL_BACKENDS does not filter
 * it. Returns the status for kvhal_backend_load; a module already loaded from the same path is OK. */
static kvhal_status load_file(const char *given, bool explicit)
{
    /* One module reached through two folders (KVHAL_BACKEND_PATH and the build tree) is loaded once. */
    char path[PATH_MAX];
    if (!realpath(given, path)) snprintf(path, sizeof path, "%s", given);
    for (int32_t i = 0; i < num_modules; i++)
        if (!strcmp(modules[i]->info.path, path)) {
            if (modules[i]->info.loaded) return KVHAL_OK;
            if (!explicit) return KVHAL_LOAD_FAILED;
            return kvhal__err(KVHAL_LOAD_FAILED, "path: %s was tried before and not loaded: %s", path,
                              modules[i]->info.reason);
        }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[32] = "";
    if (!strncmp(base, "libkvhal-", 9)) {
        size_t len = strcspn(base + 9, ".");
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, base + 9, len);
        name[len] = '\0';
    } else {
        snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
    }
    if (!explicit && !backend_wanted(name)) return KVHAL_OK;
    module *m = new_module(name, path);
    if (!m) return kvhal__err(KVHAL_OUT_OF_MEMORY, "path: %s: no memory to list the module", path);
    kvhal_status st = KVHAL_LOAD_FAILED;
    int fd;
    m->info.reason[0] = '\0';
    if (!kvhal__module_file_check(path, &fd, m->info.reason, sizeof m->info.reason)) {
        kvhal__utf8_trim(m->info.reason);
        kvhal__log(1, "backend module %s: %s", path, m->info.reason);
        if (explicit) return kvhal__err(st, "path: %s not loaded: %s", path, m->info.reason);
        return st;
    }
    /* by path: the file cannot be swapped in between by anyone but its folder's owner (checked above); not through
     * /proc/self/fd/N, whose name the loader would take for a module loaded earlier through the same number */
    close(fd);
    dlerror();
    /* A fully static program has no dynamic loader (no AT_BASE): glibc's dlopen there cannot load a module that
     * needs the C library (it crashes or loads a second libc), so the module is refused with the reason. A dynamic
     * program linking libkvhal.a loads modules normally. */
    void *h = getauxval(AT_BASE) ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!h && !getauxval(AT_BASE)) {
        REASON(m, "this program is statically linked (no dynamic loader), and modules cannot be loaded into it: link "
                  "the program dynamically (libkvhal.a may stay static inside it)");
    } else if (!h) {
        const char *e = dlerror();
        REASON(m, "dlopen failed: %s", e ? e : "unknown error");
    } else {
        kvhal_backend_entry_fn entry;
        void *sym = dlsym(h, KVHAL_BACKEND_ENTRY_SYMBOL);
        memcpy(&entry, &sym, sizeof entry); /* object pointer to function pointer, without a pedantic cast */
        const kvhal_backend *t = sym ? entry(KVHAL_BACKEND_ABI_VERSION) : NULL;
        if (!sym) REASON(m, "no '%s' symbol", KVHAL_BACKEND_ENTRY_SYMBOL);
        else if (!t)
            REASON(m, "%s(%d) returned NULL (module refuses this core)", KVHAL_BACKEND_ENTRY_SYMBOL,
                   KVHAL_BACKEND_ABI_VERSION);
        else st = adopt(m, t);
        if (st == KVHAL_OK) m->handle = h;
        else dlclose(h);
    }
    if (st != KVHAL_OK && explicit) return kvhal__err(st, "path: %s not loaded: %s", path, m->info.reason);
    return st;
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Loads dir/libkvhal-*.so and dir/<sub>/libkvhal-*.so one level down (the build tree keeps each backend in a
 * folder of its own), in name order. */
static void scan_dir(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        bool module_file = !strncmp(e->d_name, "libkvhal-", 9) && has_suffix(e->d_name, ".so");
        if (!module_file && depth == 0 && e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) continue;
        if (!module_file && depth > 0) continue;
        if (n == cap) { /* no limit: every entry is looked at (a failed growth is logged, not silent) */
            char **a = cap < SIZE_MAX / 4 / sizeof *a ? realloc(names, (cap ? 2 * cap : 64) * sizeof *a) : NULL;
            if (!a) {
                kvhal__log(0, "backend folder %s: out of memory after %zu entries; the rest are not looked at", dir, n);
                break;
            }
            names = a;
            cap = cap ? 2 * cap : 64;
        }
        char *copy = strdup(e->d_name);
        if (copy) names[n++] = copy;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof names[0], cmp_names);
    char path[PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path) {
            if (!strncmp(names[i], "libkvhal-", 9) && has_suffix(names[i], ".so")) load_file(path, false);
            else scan_dir(path, depth + 1);
        }
        free(names[i]);
    }
    free(names);
}

static void load_all(void)
{
    /* before any module's init: each backend records the process that ran it (kvhal__bk_here) */
    atomic_store_explicit(&kvhal__pid, (int)getpid(), memory_order_relaxed);
    (void)pthread_atfork(NULL, NULL, forked_child);
    pthread_mutex_lock(&load_lock);
    module *cpu = new_module("cpu", "(built in)");
    builtin_cpu = kvhal__cpu_backend_entry(KVHAL_BACKEND_ABI_VERSION);
    if (cpu) adopt(cpu, builtin_cpu);

    const char *env = secure_getenv("KVHAL_BACKEND_PATH");
    if (env && *env) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", env);
        char *save = NULL;
        for (char *p = strtok_r(buf, ":", &save); p; p = strtok_r(NULL, ":", &save)) scan_dir(p, 0);
    }
    /* Beside this library: <libdir>/kvhal-0 (installed; the folder is named after the plugin ABI's major version,
     * KVHAL_MODULE_SUBDIR) and <builddir>/backends (build tree: lib is in core/). */
    Dl_info di;
    if (dladdr(&once, &di) && di.dli_fname) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", di.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            char p[PATH_MAX + 32];
            if (snprintf(p, sizeof p, "%s/" KVHAL_MODULE_SUBDIR, dir) < (int)sizeof p) scan_dir(p, 0);
            if (snprintf(p, sizeof p, "%s/../backends", dir) < (int)sizeof p) scan_dir(p, 0);
        }
    }
#ifdef KVHAL_MODULE_DIR
    scan_dir(KVHAL_MODULE_DIR, 0);
#endif
    pthread_mutex_unlock(&load_lock);
}

static void ensure_loaded(void) { pthread_once(&once, load_all); }

kvhal_status kvhal_backend_load(const char *path)
{
    KVHAL_CHECK_ARG(path && *path, "path: NULL or empty");
    ensure_loaded();
    pthread_mutex_lock(&load_lock);
    kvhal_status st = load_file(path, true);
    pthread_mutex_unlock(&load_lock);
    return st;
}

/* ---- dispatch ---- */

kvhal_status kvhal__lookup(kvhal_device dev, const char *arg, const kvhal__bk **out)
{
    ensure_loaded();
    *out = NULL;
    /* The hot path is one bounds check and one load: an unregistered type has no backend either, and which of
     * the two it is matters only for the message. */
    const kvhal__bk *b = (unsigned)dev.type < KVHAL_MAX_DEVICE_TYPES
                             ? atomic_load_explicit(&by_type[dev.type], memory_order_acquire) : NULL;
    if (__builtin_expect(!b, 0) && !kvhal__type_registered(dev.type))
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.type: %d is not a registered device type", arg, (int)dev.type);
    if (!b)
        return kvhal__err(KVHAL_BACKEND_UNAVAILABLE, "%s: %s:%d: the %s backend is not loaded (see kvhal-info)", arg,
                          type_names[dev.type], dev.id, type_names[dev.type]);
    if (dev.id < 0 || dev.id >= b->device_count)
        return kvhal__err(KVHAL_NO_DEVICE, "%s: %s:%d: id out of range (%d %s device%s present)", arg,
                          b->type_name, dev.id, b->device_count, b->type_name, b->device_count == 1 ? "" : "s");
    KVHAL_TRY(kvhal__bk_here(b, dev.id, arg));
    *out = b;
    return KVHAL_OK;
}

kvhal_status kvhal_device_count(kvhal_device_type type, int32_t *count)
{
    KVHAL_CHECK_ARG(count, "count: NULL");
    ensure_loaded();
    KVHAL_CHECK_ARG(kvhal__type_registered(type), "type: %d is not a registered device type", (int)type);
    const kvhal__bk *b = atomic_load_explicit(&by_type[type], memory_order_acquire);
    *count = b ? b->device_count : 0;
    return KVHAL_OK;
}

kvhal_status kvhal_backend_get_proc_address(kvhal_device_type type, const char *name, void **out)
{
    KVHAL_CHECK_ARG(name, "name: NULL");
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    ensure_loaded();
    KVHAL_CHECK_ARG(kvhal__type_registered(type), "type: %d is not a registered device type", (int)type);
    const kvhal__bk *b = atomic_load_explicit(&by_type[type], memory_order_acquire);
    if (!b)
        return kvhal__err(KVHAL_BACKEND_UNAVAILABLE, "type: %s is served by no loaded module (see kvhal-info)",
                          kvhal_device_type_name(type));
    void *p = b->get_proc_address ? b->get_proc_address(b->ctx, name) : NULL;
    if (!p)
        return kvhal__err(KVHAL_NOT_FOUND, "name: the %s backend has no extra named \"%.80s\"", b->name, name);
    *out = p;
    return KVHAL_OK;
}

kvhal_status kvhal_backend_module_count(int32_t *count)
{
    KVHAL_CHECK_ARG(count, "count: NULL");
    ensure_loaded();
    pthread_mutex_lock(&load_lock);
    *count = num_modules;
    pthread_mutex_unlock(&load_lock);
    return KVHAL_OK;
}

kvhal_status kvhal_backend_module_get(int32_t index, kvhal_backend_module_info *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    ensure_loaded();
    pthread_mutex_lock(&load_lock);
    int32_t n = num_modules;
    if (index >= 0 && index < n) *out = modules[index]->info;
    pthread_mutex_unlock(&load_lock);
    if (index < 0 || index >= n)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "index: %d is out of range [0, %d)", index, n);
    return KVHAL_OK;
}

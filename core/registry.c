/* registry.c — backend discovery and the OpDispatcher. Discovery runs once (pthread_once): the built-in CPU
 * backend, then every libkvhal-*.so module in KVHAL_BACKEND_PATH (colon-separated, first), the build tree beside
 * this library, and the install's lib/kvhal/. A module that fails (dlopen error, no entry symbol, ABI too old or
 * too new, missing required entries, init error) is recorded with its reason and skipped; the first module to
 * serve a device type wins. Afterwards dispatch[type][id] is a plain array lookup with no locks. */
#define _GNU_SOURCE /* dladdr */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_MODULES 32

typedef struct module {
    kvhal_backend_module_info info;
    kvhal_backend table; /* full-size copy; slots past the module's struct_size stay NULL */
    void *handle;
} module;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static module modules[MAX_MODULES];
static int32_t num_modules;
static const kvhal_backend *by_type[KVHAL_DEVICE_TYPE_COUNT];
static int32_t device_counts[KVHAL_DEVICE_TYPE_COUNT];


static const kvhal_core_services services = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_core_services),
    .set_error = kvhal__err,
    .log = kvhal__log,
    .alloc_should_fail = kvhal__alloc_should_fail,
};

const kvhal_core_services *kvhal__services(void) { return &services; }

static const char *type_names[KVHAL_DEVICE_TYPE_COUNT] = {"cpu", "cuda", "hip", "opencl"};

/* Entries without which a backend cannot serve anything. */
static const char *missing_required(const kvhal_backend *t)
{
    if (!t->init) return "init";
    if (!t->device_info) return "device_info";
    if (!t->buffer_alloc) return "buffer_alloc";
    if (!t->buffer_free) return "buffer_free";
    if (!t->memcpy_h2d) return "memcpy_h2d";
    if (!t->memcpy_d2h) return "memcpy_d2h";
    if (!t->memcpy_d2d) return "memcpy_d2d";
    if (!t->synchronize) return "synchronize";
    return NULL;
}

static module *new_module(const char *name, const char *path)
{
    if (num_modules >= MAX_MODULES) return NULL;
    module *m = &modules[num_modules++];
    memset(m, 0, sizeof *m);
    snprintf(m->info.name, sizeof m->info.name, "%s", name);
    snprintf(m->info.path, sizeof m->info.path, "%s", path);
    return m;
}

/* Takes a module's table: checks version and size, copies it full-size, runs init, registers its devices. */
static void adopt(module *m, const kvhal_backend *t)
{
    if (t->abi_version < KVHAL_BACKEND_ABI_MIN || t->abi_version > KVHAL_BACKEND_ABI_VERSION) {
        m->info.abi_version = t->abi_version;
        snprintf(m->info.reason, sizeof m->info.reason, "ABI version %u not supported (this core takes %d..%d)",
                 t->abi_version, KVHAL_BACKEND_ABI_MIN, KVHAL_BACKEND_ABI_VERSION);
        return;
    }
    size_t n = t->struct_size < sizeof(kvhal_backend) ? t->struct_size : sizeof(kvhal_backend);
    if (n < offsetof(kvhal_backend, synchronize) + sizeof(void *)) {
        snprintf(m->info.reason, sizeof m->info.reason, "table size %u too small", t->struct_size);
        return;
    }
    memcpy(&m->table, t, n);
    m->info.abi_version = t->abi_version;
    if (t->name) snprintf(m->info.name, sizeof m->info.name, "%s", t->name);
    if ((int)t->type < 0 || t->type >= KVHAL_DEVICE_TYPE_COUNT) {
        snprintf(m->info.reason, sizeof m->info.reason, "unknown device type %d", (int)t->type);
        return;
    }
    const char *missing = missing_required(&m->table);
    if (missing) {
        snprintf(m->info.reason, sizeof m->info.reason, "table lacks the required entry '%s'", missing);
        return;
    }
    if (by_type[t->type]) {
        snprintf(m->info.reason, sizeof m->info.reason, "skipped: %s devices are already served by another module",
                 type_names[t->type]);
        return;
    }
    int32_t count = 0;
    char reason[sizeof m->info.reason] = "";
    kvhal_status st = m->table.init(&services, &count, reason, sizeof reason);
    if (st != KVHAL_OK) {
        snprintf(m->info.reason, sizeof m->info.reason, "init failed: %s%s%s", kvhal_status_name(st),
                 reason[0] ? ": " : "", reason[0] ? reason : kvhal_last_error());
        return;
    }
    if (count < 0) count = 0;
    if (count > KVHAL_MAX_DEVICES_PER_TYPE) count = KVHAL_MAX_DEVICES_PER_TYPE;
    m->info.loaded = true;
    m->info.device_count = count;
    snprintf(m->info.reason, sizeof m->info.reason, "%s", reason);
    by_type[t->type] = &m->table;
    device_counts[t->type] = count;
}

/* KVHAL_BACKENDS=cpu,opencl limits which modules load (e.g. valgrind runs of the CPU suites); unset = all. */
static bool backend_wanted(const char *name)
{
    const char *list = getenv("KVHAL_BACKENDS");
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

static void load_file(const char *given)
{
    /* One module reached through two folders (KVHAL_BACKEND_PATH and the build tree) is loaded once. */
    char path[PATH_MAX];
    if (!realpath(given, path)) snprintf(path, sizeof path, "%s", given);
    for (int32_t i = 0; i < num_modules; i++)
        if (!strcmp(modules[i].info.path, path)) return;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char name[16] = "";
    if (!strncmp(base, "libkvhal-", 9)) {
        size_t len = strcspn(base + 9, ".");
        if (len >= sizeof name) len = sizeof name - 1;
        memcpy(name, base + 9, len);
        name[len] = '\0';
    }
    if (!backend_wanted(name)) return;
    module *m = new_module(name, path);
    if (!m) return;
    dlerror();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(m->info.reason, sizeof m->info.reason, "dlopen failed: %s", e ? e : "unknown error");
        return;
    }
    kvhal_backend_entry_fn entry;
    void *sym = dlsym(h, KVHAL_BACKEND_ENTRY_SYMBOL);
    memcpy(&entry, &sym, sizeof entry); /* object pointer to function pointer, without a pedantic cast */
    if (!sym) {
        snprintf(m->info.reason, sizeof m->info.reason, "no '%s' symbol", KVHAL_BACKEND_ENTRY_SYMBOL);
        dlclose(h);
        return;
    }
    const kvhal_backend *t = entry(KVHAL_BACKEND_ABI_VERSION);
    if (!t) {
        snprintf(m->info.reason, sizeof m->info.reason, "%s(%d) returned NULL (module refuses this core)",
                 KVHAL_BACKEND_ENTRY_SYMBOL, KVHAL_BACKEND_ABI_VERSION);
        dlclose(h);
        return;
    }
    adopt(m, t);
    if (!m->info.loaded) {
        dlclose(h);
        return;
    }
    m->handle = h;
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Loads dir/libkvhal-*.so and dir/<backend>/libkvhal-<backend>.so (the build tree's layout). */
static void scan_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char path[PATH_MAX];
    /* Deterministic order: collect, sort, load. */
    char names[64][NAME_MAX + 1];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (!strncmp(e->d_name, "libkvhal-", 9) && has_suffix(e->d_name, ".so"))
            snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char tmp[NAME_MAX + 1];
            memcpy(tmp, names[j], sizeof tmp);
            memcpy(names[j], names[j - 1], sizeof tmp);
            memcpy(names[j - 1], tmp, sizeof tmp);
        }
    for (int i = 0; i < n; i++) {
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path) load_file(path);
    }
    for (int t = 1; t < KVHAL_DEVICE_TYPE_COUNT; t++) {
        if (snprintf(path, sizeof path, "%s/%s/libkvhal-%s.so", dir, type_names[t], type_names[t]) >= (int)sizeof path)
            continue;
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            load_file(path);
        }
    }
}

static void load_all(void)
{
    module *cpu = new_module("cpu", "(built in)");
    adopt(cpu, kvhal__cpu_backend());

    const char *env = getenv("KVHAL_BACKEND_PATH");
    if (env && *env) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", env);
        char *save = NULL;
        for (char *p = strtok_r(buf, ":", &save); p; p = strtok_r(NULL, ":", &save)) scan_dir(p);
    }
    /* Beside this library: <libdir>/kvhal (installed) and <builddir>/backends (build tree: lib is in core/). */
    Dl_info di;
    if (dladdr(&once, &di) && di.dli_fname) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", di.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = '\0';
            char p[PATH_MAX + 32];
            if (snprintf(p, sizeof p, "%s/kvhal", dir) < (int)sizeof p) scan_dir(p);
            if (snprintf(p, sizeof p, "%s/../backends", dir) < (int)sizeof p) scan_dir(p);
        }
    }
#ifdef KVHAL_MODULE_DIR
    scan_dir(KVHAL_MODULE_DIR);
#endif
}

static inline void ensure_loaded(void) { pthread_once(&once, load_all); }

kvhal_status kvhal__lookup(kvhal_device dev, const char *arg, const kvhal_backend **out)
{
    ensure_loaded();
    *out = NULL;
    if ((unsigned)dev.type >= KVHAL_DEVICE_TYPE_COUNT)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.type: %d is not a device type", arg, (int)dev.type);
    const kvhal_backend *b = by_type[dev.type];
    if (!b)
        return kvhal__err(KVHAL_BACKEND_UNAVAILABLE, "%s: %s:%d: the %s backend is not loaded (see kvhal-info)", arg,
                          type_names[dev.type], dev.id, type_names[dev.type]);
    if (dev.id < 0 || dev.id >= device_counts[dev.type])
        return kvhal__err(KVHAL_NO_DEVICE, "%s: %s:%d: id out of range (%d %s device%s present)", arg,
                          type_names[dev.type], dev.id, device_counts[dev.type], type_names[dev.type],
                          device_counts[dev.type] == 1 ? "" : "s");
    *out = b;
    return KVHAL_OK;
}

const kvhal_backend *kvhal__backend(kvhal_device dev)
{
    const kvhal_backend *b;
    kvhal__lookup(dev, "device", &b);
    return b;
}

kvhal_status kvhal_device_count(kvhal_device_type type, int32_t *count)
{
    KVHAL_CHECK_ARG(count, "count: NULL");
    KVHAL_CHECK_ARG((unsigned)type < KVHAL_DEVICE_TYPE_COUNT, "type: %d is not a device type", (int)type);
    ensure_loaded();
    *count = by_type[type] ? device_counts[type] : 0;
    return KVHAL_OK;
}

kvhal_status kvhal_backend_module_count(int32_t *count)
{
    KVHAL_CHECK_ARG(count, "count: NULL");
    ensure_loaded();
    *count = num_modules;
    return KVHAL_OK;
}

kvhal_status kvhal_backend_module_get(int32_t index, kvhal_backend_module_info *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    ensure_loaded();
    if (index < 0 || index >= num_modules)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "index: %d is out of range [0, %d)", index, num_modules);
    *out = modules[index].info;
    return KVHAL_OK;
}

__attribute__((destructor)) static void registry_unload(void)
{
    /* Descriptors of the unloading thread and of threads still alive go back to their backends while the
     * modules are still mapped. Modules stay mapped: their runtimes tear down through their own atexit hooks. */
    kvhal__desc_cache_shutdown();
}

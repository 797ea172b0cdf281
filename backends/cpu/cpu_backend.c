/* cpu_backend.c — the CPU backend, compiled into the core so that kvhal works on a machine with no accelerator:
 * one device (cpu:0), host memory buffers (64-byte aligned), synchronous copies. Streams exist for API symmetry;
 * work on them completes before the call returns. Its ops live in cpu_ops.c.
 *
 * It is the reference plugin: it uses kvhal_backend.h and the services table only, as a loadable module does, and
 * the registry reaches it through its entry point like any other; only the entry's name differs (a module's is
 * kvhal_backend_entry, exported; this one is hidden inside libkvhal). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_ops.h"

static kvhal_status cpu_init(const kvhal_core_services *s, void **ctx, int32_t *count, char *reason,
                             size_t reason_size)
{
    cpu_ctx *c = malloc(sizeof *c); /* the module's own, not a caller's: no fault injection here */
    if (!c) return s->set_error(KVHAL_OUT_OF_MEMORY, "cpu: cannot allocate the backend's context");
    c->svc = s;
    pthread_mutex_init(&c->ipc_mu, NULL);
    c->ipc_maps = NULL;
    *ctx = c;
    *count = 1;
    if (reason_size) reason[0] = '\0';
    return KVHAL_OK;
}

static void cpu_name(char *buf, size_t n)
{
    snprintf(buf, n, "host CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t') c++;
                c[strcspn(c, "\n")] = '\0';
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static kvhal_status cpu_device_info(void *ctx, int32_t id, kvhal_device_info *out)
{
    cpu_name(out->name, sizeof out->name);
    snprintf(out->platform, sizeof out->platform, "host");
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    out->total_memory = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    out->free_memory = avail > 0 && psz > 0 ? (uint64_t)avail * (uint64_t)psz : 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    out->compute_units = ncpu > 0 ? (int32_t)ncpu : 1;
    out->peer_access = false;
    return KVHAL_OK;
}

static kvhal_status cpu_buffer_alloc(void *ctx, int32_t id, size_t bytes, void **native)
{
    void *p = NULL;
    /* Large caches: 2 MiB alignment plus transparent huge pages cut first-touch page faults ~500x, which is what a
     * fresh cache (create, duplicate) spends its time on. */
    const size_t huge = (size_t)2 << 20;
    size_t align = bytes >= 2 * huge ? huge : 64;
    /* No object may exceed PTRDIFF_MAX; asking the allocator anyway only draws warnings from memory checkers. */
    const kvhal_core_services *svc = ((const cpu_ctx *)ctx)->svc;
    if (bytes > (size_t)PTRDIFF_MAX || svc->alloc_should_fail() || posix_memalign(&p, align, bytes) != 0)
        return svc->set_error(KVHAL_OUT_OF_MEMORY, "bytes: cannot allocate %zu bytes of host memory", bytes);
#ifdef MADV_HUGEPAGE
    if (align == huge) madvise(p, bytes - bytes % huge, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    *native = p;
    return KVHAL_OK;
}

static kvhal_status cpu_buffer_free(void *ctx, int32_t id, void *native)
{
    free(native);
    return KVHAL_OK;
}

/* A CPU stream is a token: work is done when the call returns. */
static char cpu_stream_token;

static kvhal_status cpu_stream_create(void *ctx, int32_t id, void **stream)
{
    *stream = &cpu_stream_token;
    return KVHAL_OK;
}

static kvhal_status cpu_stream_wrap(void *ctx, int32_t id, void *native, void **stream)
{
    *stream = native ? native : &cpu_stream_token; /* NULL: the default stream, a token like the others */
    return KVHAL_OK;
}

static kvhal_status cpu_stream_destroy(void *ctx, int32_t id, void *stream) { return KVHAL_OK; }

static kvhal_status cpu_sync(void *ctx, int32_t id) { return KVHAL_OK; }

static kvhal_status cpu_stream_sync(void *ctx, int32_t id, void *stream) { return KVHAL_OK; }

static kvhal_status cpu_h2d(void *ctx, int32_t id, void *dst, size_t off, const void *src, size_t n, void *s)
{
    memmove((char *)dst + off, src, n);
    return KVHAL_OK;
}

static kvhal_status cpu_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t off, size_t n, void *s)
{
    memmove(dst, (const char *)src + off, n);
    return KVHAL_OK;
}

static kvhal_status cpu_d2d(void *ctx, int32_t id, void *dst, size_t doff, const void *src, size_t soff, size_t n, void *s)
{
    memmove((char *)dst + doff, (const char *)src + soff, n);
    return KVHAL_OK;
}

static kvhal_status cpu_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t n, void *s)
{
    memset((char *)dst + off, value, n);
    return KVHAL_OK;
}

static void cpu_shutdown(void *ctx) { free(ctx); }

static const kvhal_backend_device_fns cpu_device_fns = {
    .struct_size = sizeof(kvhal_backend_device_fns),
    .device_info = cpu_device_info,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .stream_create = cpu_stream_create,
    .stream_wrap = cpu_stream_wrap,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_sync,
    .memcpy_h2d = cpu_h2d,
    .memcpy_d2h = cpu_d2h,
    .memcpy_d2d = cpu_d2d,
    .memset = cpu_memset,
    .synchronize = cpu_sync,
    .check_errors = cpu_sync,
    .buffer_alloc_shareable = cpu_buffer_alloc_shareable,
    .buffer_free_shareable = cpu_buffer_free_shareable,
    .ipc_export = cpu_ipc_export,
    .ipc_import = cpu_ipc_import,
    .ipc_close = cpu_ipc_close,
};

static const kvhal_backend_op_fns cpu_op_fns = {
    .struct_size = sizeof(kvhal_backend_op_fns),
    .supports = NULL, /* every valid call runs on the host */
    .desc_create = cpu_desc_create,
    .desc_destroy = cpu_desc_destroy,
    .copy_batch = cpu_copy_batch,
#define X(E, name, T) .name = cpu_##name,
    KVHAL_BK_OP_LIST(X)
#undef X
};

static const kvhal_backend cpu_table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "cpu",
    .device_type = "cpu",
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .get_proc_address = NULL,
    .device = &cpu_device_fns,
    .ops = &cpu_op_fns,
};

/* The registry's way in (declared in core/internal.h); a loadable module exports kvhal_backend_entry instead. */
__attribute__((visibility("hidden"))) const kvhal_backend *kvhal__cpu_backend_entry(uint32_t core_abi_version);
const kvhal_backend *kvhal__cpu_backend_entry(uint32_t core_abi_version)
{
    (void)core_abi_version;
    return &cpu_table;
}

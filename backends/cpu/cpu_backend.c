/* cpu_backend.c — the CPU backend, compiled into the core so that kvhal works on a machine with no accelerator:
 * one device (cpu:0), host memory buffers (64-byte aligned), synchronous copies. Streams exist for API symmetry;
 * work on them completes before the call returns. Its ops live in cpu_ops.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "cpu_ops.h"

static const kvhal_core_services *svc;

static kvhal_status cpu_init(const kvhal_core_services *s, int32_t *count, char *reason, size_t reason_size)
{
    svc = s;
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

static kvhal_status cpu_device_info(int32_t id, kvhal_device_info *out)
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

static kvhal_status cpu_buffer_alloc(int32_t id, size_t bytes, void **native)
{
    void *p = NULL;
    /* Large caches: 2 MiB alignment plus transparent huge pages cut first-touch page faults ~500x, which is what a
     * fresh cache (create, duplicate) spends its time on. */
    const size_t huge = (size_t)2 << 20;
    size_t align = bytes >= 2 * huge ? huge : 64;
    /* No object may exceed PTRDIFF_MAX; asking the allocator anyway only draws warnings from memory checkers. */
    if (bytes > (size_t)PTRDIFF_MAX || svc->alloc_should_fail() || posix_memalign(&p, align, bytes) != 0)
        return svc->set_error(KVHAL_OUT_OF_MEMORY, "bytes: cannot allocate %zu bytes of host memory", bytes);
#ifdef MADV_HUGEPAGE
    if (align == huge) madvise(p, bytes - bytes % huge, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    *native = p;
    return KVHAL_OK;
}

static kvhal_status cpu_buffer_free(int32_t id, void *native)
{
    free(native);
    return KVHAL_OK;
}

/* A CPU stream is a token: work is done when the call returns. */
static char cpu_stream_token;

static kvhal_status cpu_stream_create(int32_t id, void **stream)
{
    *stream = &cpu_stream_token;
    return KVHAL_OK;
}

static kvhal_status cpu_stream_wrap(int32_t id, void *native, void **stream)
{
    *stream = native;
    return KVHAL_OK;
}

static kvhal_status cpu_stream_destroy(int32_t id, void *stream) { return KVHAL_OK; }

static kvhal_status cpu_sync(int32_t id) { return KVHAL_OK; }

static kvhal_status cpu_stream_sync(int32_t id, void *stream) { return KVHAL_OK; }

static kvhal_status cpu_h2d(int32_t id, void *dst, size_t off, const void *src, size_t n, void *s)
{
    memmove((char *)dst + off, src, n);
    return KVHAL_OK;
}

static kvhal_status cpu_d2h(int32_t id, void *dst, const void *src, size_t off, size_t n, void *s)
{
    memmove(dst, (const char *)src + off, n);
    return KVHAL_OK;
}

static kvhal_status cpu_d2d(int32_t id, void *dst, size_t doff, const void *src, size_t soff, size_t n, void *s)
{
    memmove((char *)dst + doff, (const char *)src + soff, n);
    return KVHAL_OK;
}

static kvhal_status cpu_memset(int32_t id, void *dst, size_t off, int value, size_t n, void *s)
{
    memset((char *)dst + off, value, n);
    return KVHAL_OK;
}

static const kvhal_backend cpu_table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "cpu",
    .type = KVHAL_DEVICE_CPU,
    .init = cpu_init,
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
    .desc_create = kvhal__cpu_desc_create,
    .desc_destroy = kvhal__cpu_desc_destroy,
    .paged_caching = kvhal__cpu_paged_caching,
    .copy_blocks = kvhal__cpu_copy_blocks,
    .tensor_copy = kvhal__cpu_tensor_copy,
    .copy_batch = kvhal__cpu_copy_batch,
};

const kvhal_backend *kvhal__cpu_backend(void) { return &cpu_table; }

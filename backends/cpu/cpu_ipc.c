/* cpu_ipc.c — shareable memory of the CPU backend: POSIX shared-memory segments that another process of
 * this host maps, so that the transfer agent's device path (an imported buffer and one batched copy) runs, and is
 * tested, on the CPU device too.
 *
 * A segment is named "/kvhal-<pid>-<16 random hex digits>", created with O_EXCL and mode 0600 (the same user only),
 * and holds a header page (magic, size, a 16-byte random token) before the data, so that the data starts page
 * aligned. The handle names the segment and carries the token; an import maps the segment read-only and refuses it
 * unless the segment is big enough for the size the handle claims and its header holds the same token (a guessed
 * or stale name fails cleanly). Unlinking: the exporter's segment stays named while its buffer lives (any number of
 * peers may import it, at any time) and is unlinked when the buffer is freed; importers' mappings stay valid after
 * that until they close them.
 *
 * A process killed before it freed its segments cannot unlink them. So the exporter holds a shared flock on each
 * segment it owns, for as long as the buffer lives (the kernel drops it when the process dies, however it dies),
 * and every new export first sweeps /dev/shm: a segment of this format whose lock nobody holds (an exclusive
 * non-blocking flock succeeds) and whose header is complete has lost its owner, and is unlinked. The lock, not the
 * pid in the name, says whether the owner lives: a pid tells nothing across pid namespaces (two containers that
 * share /dev/shm but not their pids). The exporter takes its lock before it sizes the segment and writes the
 * header, so a segment being created (size 0, or no magic yet) is never taken for an orphan; segments of the first
 * format (magic KVSHMEM1, no lock) are never swept. Importers hold no lock: their mappings outlive the name. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_ops.h"

#define SHM_MAGIC 0x4b5653484d454d32ull /* "KVSHMEM2": the owner holds a flock while it lives */
#define BLOB_MAGIC 0x4b565348u          /* KVSH */
#define HDR 4096u
#define NAME_LEN 48
#define TOKEN_LEN 16

typedef struct seg_header {
    uint64_t magic;
    uint64_t bytes;
    uint8_t token[TOKEN_LEN];
} seg_header;

typedef struct cpu_ipc_blob {
    uint32_t magic;
    uint32_t pad;
    uint64_t bytes;
    uint8_t token[TOKEN_LEN];
    char name[NAME_LEN];
} cpu_ipc_blob;
_Static_assert(sizeof(cpu_ipc_blob) <= KVHAL_BK_IPC_BLOB_MAX, "blob too large");

/* Every mapping this module made (exported or imported), to unmap it with its own length. */
typedef struct cpu_map {
    void *native; /* base + HDR */
    size_t maplen;
    bool exported;
    int fd; /* exported: held open with the owner's shared flock until the buffer is freed */
    char name[NAME_LEN];
    struct cpu_map *next;
} cpu_map;


static const kvhal_core_services *svc_of(void *ctx) { return ((const cpu_ctx *)ctx)->svc; }

static void maps_push(void *ctx, cpu_map *m)
{
    cpu_ctx *c = ctx;
    pthread_mutex_lock(&c->ipc_mu);
    m->next = c->ipc_maps;
    c->ipc_maps = m;
    pthread_mutex_unlock(&c->ipc_mu);
}

static cpu_map *maps_take(void *ctx, void *native, bool exported)
{
    cpu_ctx *c = ctx;
    pthread_mutex_lock(&c->ipc_mu);
    cpu_map *found = NULL;
    for (cpu_map **pp = &c->ipc_maps; *pp; pp = &(*pp)->next)
        if ((*pp)->native == native && (*pp)->exported == exported) {
            found = *pp;
            *pp = found->next;
            break;
        }
    pthread_mutex_unlock(&c->ipc_mu);
    return found;
}

static bool maps_find(void *ctx, void *native, char *name, uint8_t *token, uint64_t *bytes)
{
    cpu_ctx *c = ctx;
    bool ok = false;
    pthread_mutex_lock(&c->ipc_mu);
    for (cpu_map *m = c->ipc_maps; m; m = m->next)
        if (m->native == native && m->exported) {
            memcpy(name, m->name, NAME_LEN);
            const seg_header *h = (const seg_header *)((uint8_t *)native - HDR);
            memcpy(token, h->token, TOKEN_LEN);
            *bytes = m->maplen - HDR;
            ok = true;
            break;
        }
    pthread_mutex_unlock(&c->ipc_mu);
    return ok;
}

/* The segment names this module makes: "kvhal-" (no slash in /dev/shm), decimal digits, '-', 16 hex digits. */
static bool is_segment_name(const char *n)
{
    if (strncmp(n, "kvhal-", 6) != 0) return false;
    const char *p = n + 6;
    const char *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    if (p == digits || *p != '-') return false;
    p++;
    int hex = 0;
    for (; (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'); p++) hex++;
    return hex == 16 && *p == '\0';
}

/* Unlinks the segments of this format in /dev/shm whose owner is gone (see the top of this file). Best effort and
 * silent: a segment that cannot be opened (another user's), locked (its owner lives) or read is left alone, and a
 * system without /dev/shm has nothing to sweep. */
static void sweep_orphans(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!is_segment_name(de->d_name)) continue;
        char name[NAME_LEN];
        if (snprintf(name, sizeof name, "/%s", de->d_name) >= (int)sizeof name) continue;
        const int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0) continue;
        struct stat st;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            st.st_size >= (off_t)sizeof(seg_header)) {
            seg_header h;
            if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == SHM_MAGIC) shm_unlink(name);
        }
        close(fd);
    }
    closedir(d);
}

CPU_HIDDEN kvhal_status cpu_buffer_alloc_shareable(void *ctx, int32_t id, size_t bytes, void **native)
{
    (void)id;
    const kvhal_core_services *svc = svc_of(ctx);
    if (bytes > (size_t)PTRDIFF_MAX - HDR || svc->alloc_should_fail())
        return svc->set_error(KVHAL_OUT_OF_MEMORY, "bytes: cannot allocate %zu bytes of shared memory", bytes);
    cpu_map *m = calloc(1, sizeof *m);
    if (!m) return svc->set_error(KVHAL_OUT_OF_MEMORY, "bytes: cannot allocate the shared segment's record");
    uint8_t rnd[8 + TOKEN_LEN];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        free(m);
        return svc->set_error(KVHAL_BACKEND_ERROR, "cpu: getrandom failed: %s", strerror(errno));
    }
    int n = snprintf(m->name, sizeof m->name, "/kvhal-%ld-", (long)getpid());
    for (int i = 0; i < 8; i++) n += snprintf(m->name + n, sizeof m->name - (size_t)n, "%02x", rnd[i]);
    const size_t len = HDR + bytes;
    sweep_orphans();
    int fd = shm_open(m->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        const int e = errno;
        free(m);
        return svc->set_error(KVHAL_BACKEND_ERROR, "bytes: shm_open of a %zu-byte segment failed: %s", bytes,
                              strerror(e));
    }
    /* the owner's lock first: until the header is written the segment is empty, which the sweep leaves alone (a
     * sweep of another process may hold its exclusive lock on the new segment for a moment: wait for it) */
    int locked;
    while ((locked = flock(fd, LOCK_SH)) != 0 && errno == EINTR) {
    }
    void *base = MAP_FAILED;
    if (locked == 0 && ftruncate(fd, (off_t)len) == 0)
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    if (base == MAP_FAILED) {
        shm_unlink(m->name);
        close(fd);
        free(m);
        return svc->set_error(e == ENOMEM || e == ENOSPC ? KVHAL_OUT_OF_MEMORY : KVHAL_BACKEND_ERROR,
                              "bytes: cannot lock, size or map a %zu-byte shared segment: %s", bytes, strerror(e));
    }
    seg_header *h = base;
    h->magic = SHM_MAGIC;
    h->bytes = bytes;
    memcpy(h->token, rnd + 8, TOKEN_LEN);
    m->native = (uint8_t *)base + HDR;
    m->maplen = len;
    m->exported = true;
    m->fd = fd;
    maps_push(ctx, m);
    *native = m->native;
    return KVHAL_OK;
}

CPU_HIDDEN kvhal_status cpu_buffer_free_shareable(void *ctx, int32_t id, void *native)
{
    (void)id;
    cpu_map *m = maps_take(ctx, native, true);
    if (!m) return svc_of(ctx)->set_error(KVHAL_INVALID_ARGUMENT, "native: %p is not a shared segment", native);
    munmap((uint8_t *)native - HDR, m->maplen);
    shm_unlink(m->name);
    close(m->fd); /* the lock goes with the last descriptor, after the name */
    free(m);
    return KVHAL_OK;
}

CPU_HIDDEN kvhal_status cpu_ipc_export(void *ctx, int32_t id, void *native, void *blob, size_t cap, size_t *len)
{
    (void)id;
    const kvhal_core_services *svc = svc_of(ctx);
    cpu_ipc_blob b;
    memset(&b, 0, sizeof b);
    if (!maps_find(ctx, native, b.name, b.token, &b.bytes))
        return svc->set_error(KVHAL_INVALID_ARGUMENT, "native: %p is not a shared segment of this process", native);
    if (cap < sizeof b) return svc->set_error(KVHAL_OUT_OF_RANGE, "cap: %zu bytes, need %zu", cap, sizeof b);
    b.magic = BLOB_MAGIC;
    memcpy(blob, &b, sizeof b);
    *len = sizeof b;
    return KVHAL_OK;
}

/* "/kvhal-" then digits, '-' and hex digits only: nothing that could name another object. */
static bool valid_name(const char *name)
{
    if (!memchr(name, '\0', NAME_LEN) || strncmp(name, "/kvhal-", 7) != 0 || strlen(name) < 9) return false;
    for (const char *p = name + 7; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == '-')) return false;
    return true;
}

CPU_HIDDEN kvhal_status cpu_ipc_import(void *ctx, int32_t id, const void *blob, size_t len, size_t bytes,
                                       void **native)
{
    (void)id;
    const kvhal_core_services *svc = svc_of(ctx);
    cpu_ipc_blob b;
    if (len != sizeof b) return svc->set_error(KVHAL_INVALID_ARGUMENT, "blob: %zu bytes, a cpu handle has %zu", len, sizeof b);
    memcpy(&b, blob, sizeof b);
    if (b.magic != BLOB_MAGIC) return svc->set_error(KVHAL_INVALID_ARGUMENT, "blob: not a cpu shared-memory handle");
    if (!valid_name(b.name)) return svc->set_error(KVHAL_INVALID_ARGUMENT, "blob: malformed segment name");
    if (b.bytes != bytes || bytes == 0 || bytes > (size_t)PTRDIFF_MAX - HDR)
        return svc->set_error(KVHAL_INVALID_ARGUMENT, "blob: segment of %llu bytes, the handle says %zu",
                              (unsigned long long)b.bytes, bytes);
    if (svc->alloc_should_fail()) return svc->set_error(KVHAL_OUT_OF_MEMORY, "blob: cannot map the segment");
    cpu_map *m = calloc(1, sizeof *m);
    if (!m) return svc->set_error(KVHAL_OUT_OF_MEMORY, "blob: cannot allocate the mapping's record");
    int fd = shm_open(b.name, O_RDONLY, 0);
    if (fd < 0) {
        const int e = errno;
        free(m);
        return svc->set_error(KVHAL_BACKEND_ERROR, "blob: cannot open segment %s: %s", b.name, strerror(e));
    }
    struct stat st;
    const size_t maplen = HDR + bytes;
    if (fstat(fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < maplen) {
        close(fd);
        free(m);
        return svc->set_error(KVHAL_OUT_OF_RANGE, "blob: segment %s holds fewer than the %zu bytes the handle says",
                              b.name, bytes);
    }
    void *base = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (base == MAP_FAILED) {
        free(m);
        return svc->set_error(KVHAL_BACKEND_ERROR, "blob: cannot map segment %s: %s", b.name, strerror(e));
    }
    const seg_header *h = base;
    unsigned diff = h->magic != SHM_MAGIC || h->bytes != bytes;
    for (int i = 0; i < TOKEN_LEN; i++) diff |= (unsigned)(h->token[i] ^ b.token[i]);
    if (diff) {
        munmap(base, maplen);
        free(m);
        return svc->set_error(KVHAL_INVALID_ARGUMENT, "blob: segment %s does not match the handle (token or size)",
                              b.name);
    }
    m->native = (uint8_t *)base + HDR;
    m->maplen = maplen;
    memcpy(m->name, b.name, NAME_LEN);
    maps_push(ctx, m);
    *native = m->native;
    return KVHAL_OK;
}

CPU_HIDDEN kvhal_status cpu_ipc_close(void *ctx, int32_t id, void *native)
{
    (void)id;
    cpu_map *m = maps_take(ctx, native, false);
    if (!m) return svc_of(ctx)->set_error(KVHAL_INVALID_ARGUMENT, "native: %p is not an imported segment", native);
    munmap((uint8_t *)native - HDR, m->maplen);
    free(m);
    return KVHAL_OK;
}

/* gpu_codeobj.c — the code-object paths and disk cache of the GPU backends (gpu_codeobj.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* secure_getenv */
#endif
#include "gpu_codeobj.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void note_set(char *note, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note_set(char *note, size_t size, const char *fmt, ...)
{
    if (!note || !size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note, size, fmt, ap);
    va_end(ap);
}

uint64_t kvhal_co_hash(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int kvhal_co_cache_dir(char *buf, size_t size)
{
    const char *e = secure_getenv("KVHAL_CODE_CACHE_DIR");
    int n = -1;
    if (e && e[0]) n = snprintf(buf, size, "%s", e);
    else if ((e = secure_getenv("XDG_CACHE_HOME")) && e[0] == '/') n = snprintf(buf, size, "%s/kvhal", e);
    else if ((e = secure_getenv("HOME")) && e[0]) n = snprintf(buf, size, "%s/.cache/kvhal", e);
    if (n < 0 || (size_t)n >= size) {
        if (size) buf[0] = '\0';
        return -1;
    }
    return 0;
}

static bool target_ok(const kvhal_co_key *key)
{
    const size_t n = strnlen(key->target, sizeof key->target);
    return n > 0 && n < sizeof key->target && !strchr(key->target, '/');
}

int kvhal_co_file_name(const kvhal_co_key *key, char *buf, size_t size)
{
    if (!target_ok(key)) return -1;
    char t[KVHAL_CO_TARGET_MAX];
    size_t i = 0;
    for (; key->target[i]; i++) t[i] = key->target[i] == ':' ? '_' : key->target[i];
    t[i] = '\0';
    const int n = snprintf(buf, size, "%016llx-%s-%u.co", (unsigned long long)key->source_hash, t,
                           (unsigned)key->runtime_version);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

/* The header: magic[8], format u32, runtime_version u32, source_hash u64, target[64], payload length u64,
 * payload checksum u64 (little-endian host order: a cache folder is per machine). */
static void header_make(const kvhal_co_key *key, size_t size, uint64_t sum, unsigned char h[KVHAL_CO_HEADER_BYTES])
{
    const uint32_t fmt = KVHAL_CO_FORMAT, rt = key->runtime_version;
    const uint64_t len = size;
    memset(h, 0, KVHAL_CO_HEADER_BYTES);
    memcpy(h, KVHAL_CO_MAGIC, 8);
    memcpy(h + 8, &fmt, 4);
    memcpy(h + 12, &rt, 4);
    memcpy(h + 16, &key->source_hash, 8);
    memcpy(h + 24, key->target, strnlen(key->target, KVHAL_CO_TARGET_MAX - 1));
    memcpy(h + 88, &len, 8);
    memcpy(h + 96, &sum, 8);
}

static int path_of(const char *dir, const kvhal_co_key *key, char *path, size_t size)
{
    char name[160];
    if (kvhal_co_file_name(key, name, sizeof name) != 0) return -1;
    const int n = snprintf(path, size, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int read_all(int fd, void *buf, size_t n)
{
    unsigned char *p = (unsigned char *)buf;
    while (n) {
        const ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const unsigned char *p = (const unsigned char *)buf;
    while (n) {
        const ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

kvhal_co_load_result kvhal_co_load(const char *dir, const kvhal_co_key *key, void **code, size_t *size, char *note,
                                   size_t note_size)
{
    *code = NULL;
    *size = 0;
    char path[4096];
    if (!dir || !dir[0] || path_of(dir, key, path, sizeof path) != 0) {
        note_set(note, note_size, "no cache file name for this key (folder or target ID too long, or empty)");
        return KVHAL_CO_ERROR;
    }
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO planted there must not block us */
    if (fd < 0) {
        if (errno == ENOENT) return KVHAL_CO_MISS;
        note_set(note, note_size, "%s: %s", path, strerror(errno));
        return KVHAL_CO_ERROR;
    }
    kvhal_co_load_result res = KVHAL_CO_REJECTED;
    struct stat st;
    unsigned char h[KVHAL_CO_HEADER_BYTES], want[KVHAL_CO_HEADER_BYTES];
    void *buf = NULL;
    uint32_t fmt = 0;
    uint64_t len = 0, sum = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        note_set(note, note_size, "%s: not a regular file", path);
        goto out;
    }
    if ((uint64_t)st.st_size < KVHAL_CO_HEADER_BYTES || read_all(fd, h, sizeof h) != 0) {
        note_set(note, note_size, "%s: truncated (%lld bytes, shorter than the header)", path, (long long)st.st_size);
        goto out;
    }
    if (memcmp(h, KVHAL_CO_MAGIC, 8) != 0) {
        note_set(note, note_size, "%s: not a kvhal code object (bad magic)", path);
        goto out;
    }
    memcpy(&fmt, h + 8, 4);
    if (fmt != KVHAL_CO_FORMAT) {
        note_set(note, note_size, "%s: format version %u, this library writes %u", path, fmt, KVHAL_CO_FORMAT);
        goto out;
    }
    memcpy(&len, h + 88, 8);
    memcpy(&sum, h + 96, 8);
    header_make(key, (size_t)len, sum, want);
    if (memcmp(h, want, 88) != 0) {
        note_set(note, note_size, "%s: foreign file (its key is not this source hash, target ID and runtime version)",
                 path);
        goto out;
    }
    if (len == 0 || len > KVHAL_CO_MAX_BYTES || len != (uint64_t)st.st_size - KVHAL_CO_HEADER_BYTES) {
        note_set(note, note_size, "%s: payload length %llu does not match the file (%lld bytes)", path,
                 (unsigned long long)len, (long long)st.st_size);
        goto out;
    }
    buf = malloc((size_t)len);
    if (!buf) {
        note_set(note, note_size, "%s: host allocation of %llu bytes failed", path, (unsigned long long)len);
        res = KVHAL_CO_ERROR;
        goto out;
    }
    if (read_all(fd, buf, (size_t)len) != 0) {
        note_set(note, note_size, "%s: read failed or truncated", path);
        goto out;
    }
    if (kvhal_co_hash(KVHAL_CO_HASH_INIT, buf, (size_t)len) != sum) {
        note_set(note, note_size, "%s: corrupt (checksum mismatch)", path);
        goto out;
    }
    *code = buf;
    *size = (size_t)len;
    buf = NULL;
    res = KVHAL_CO_HIT;
out:
    free(buf);
    close(fd);
    return res;
}

static int mkdir_p(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        const int r = mkdir(path, 0700);
        *p = '/';
        if (r != 0 && errno != EEXIST) return -1;
    }
    return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

int kvhal_co_store(const char *dir, const kvhal_co_key *key, const void *code, size_t size, char *note,
                   size_t note_size)
{
    char path[4096], tmp[4096 + 16], d[4096];
    if (!dir || !dir[0] || path_of(dir, key, path, sizeof path) != 0 || snprintf(d, sizeof d, "%s", dir) >= (int)sizeof d) {
        note_set(note, note_size, "no cache file name for this key (folder or target ID too long, or empty)");
        return -1;
    }
    if (!code || size == 0 || size > KVHAL_CO_MAX_BYTES) {
        note_set(note, note_size, "code object of %zu bytes not cached", size);
        return -1;
    }
    if (mkdir_p(d) != 0) {
        note_set(note, note_size, "cache folder %s: %s", dir, strerror(errno));
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    const int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        note_set(note, note_size, "cache folder %s: %s", dir, strerror(errno));
        return -1;
    }
    unsigned char h[KVHAL_CO_HEADER_BYTES];
    header_make(key, size, kvhal_co_hash(KVHAL_CO_HASH_INIT, code, size), h);
    int ok = write_all(fd, h, sizeof h) == 0 && write_all(fd, code, size) == 0 && fsync(fd) == 0;
    const int err = errno;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) == 0) return 0;
    note_set(note, note_size, "%s: %s", path, strerror(ok ? errno : err));
    (void)unlink(tmp);
    return -1;
}

int kvhal_co_get(const char *dir, const kvhal_co_key *key, kvhal_co_compile_fn compile, void *user, void **code,
                 size_t *size, kvhal_co_origin *origin, char *note, size_t note_size)
{
    char why[512] = "";
    *origin = KVHAL_CO_NONE;
    if (note && note_size) note[0] = '\0';
    if (dir && dir[0]) {
        const kvhal_co_load_result r = kvhal_co_load(dir, key, code, size, why, sizeof why);
        if (r == KVHAL_CO_HIT) {
            *origin = KVHAL_CO_CACHED;
            return 0;
        }
        if (r == KVHAL_CO_REJECTED) note_set(note, note_size, "rejected and rebuilt: %s", why);
        else if (r == KVHAL_CO_ERROR) note_set(note, note_size, "cache not read: %s", why);
    } else {
        note_set(note, note_size, "no cache folder (set KVHAL_CODE_CACHE_DIR, XDG_CACHE_HOME or HOME)");
    }
    char err[2048] = "";
    if (compile(user, key, code, size, err, sizeof err) != 0 || !*code || !*size) {
        free(*code);
        *code = NULL;
        *size = 0;
        note_set(note, note_size, "%s", err[0] ? err : "the compiler failed without a message");
        return -1;
    }
    *origin = KVHAL_CO_COMPILED;
    if (dir && dir[0] && kvhal_co_store(dir, key, *code, *size, why, sizeof why) != 0) {
        const size_t used = note ? strnlen(note, note_size) : 0;
        if (note && used + 1 < note_size)
            snprintf(note + used, note_size - used, "%snot cached: %s", used ? "; " : "", why);
    }
    return 0;
}

/* One "name[:feature...]" element of a target ID, length n. */
static bool feature_in(const char *device, const char *feat, size_t n)
{
    /* feat is "xnack+" or similar: the device must list the same setting */
    const char *p = strchr(device, ':');
    while (p) {
        p++;
        const char *e = strchr(p, ':');
        const size_t m = e ? (size_t)(e - p) : strlen(p);
        if (m == n && !memcmp(p, feat, n)) return true;
        p = e;
    }
    return false;
}

bool kvhal_co_target_matches(const char *target, const char *device)
{
    if (!target || !device || !target[0]) return false;
    const size_t tp = strcspn(target, ":"), dp = strcspn(device, ":");
    if (tp != dp || memcmp(target, device, tp) != 0) return false;
    const char *p = target + tp;
    while (*p == ':') {
        p++;
        const size_t n = strcspn(p, ":");
        if (!n || !feature_in(device, p, n)) return false;
        p += n;
    }
    return true;
}

int kvhal_co_embedded_match(const char *targets, const char *device)
{
    if (!targets) return -1;
    int i = 0;
    for (const char *p = targets; *p; i++) {
        const size_t n = strcspn(p, ",");
        char t[KVHAL_CO_TARGET_MAX];
        if (n > 0 && n < sizeof t) {
            memcpy(t, p, n);
            t[n] = '\0';
            if (kvhal_co_target_matches(t, device)) return i;
        }
        p += n;
        if (*p == ',') p++;
    }
    return -1;
}

int kvhal_co_cuda_path(const char *sm_list, int ptx_arch, int cc, int *arch)
{
    int best = -1;
    for (const char *p = sm_list ? sm_list : ""; *p;) {
        char *end = NULL;
        const long sm = strtol(p, &end, 10);
        if (end == p) break;
        if (sm / 10 == cc / 10 && sm <= cc && sm > best) best = (int)sm;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (best >= 0) {
        if (arch) *arch = best;
        return 1;
    }
    if (ptx_arch > 0 && ptx_arch <= cc) {
        if (arch) *arch = ptx_arch;
        return 2;
    }
    if (arch) *arch = 0;
    return 0;
}

/* Little-endian reads at checked offsets. */
static uint64_t rd(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

int kvhal_co_amdgpu_kernels(const void *elf, size_t size, unsigned *mach,
                            void (*fn)(void *user, const char *name, size_t length), void *user)
{
    const unsigned char *b = (const unsigned char *)elf;
    if (!b || size < 64 || memcmp(b, "\x7f" "ELF", 4) != 0 || b[4] != 2 /* ELFCLASS64 */ || b[5] != 1 /* LSB */)
        return -1;
    if (rd(b + 18, 2) != 224 /* EM_AMDGPU */) return -1;
    if (mach) *mach = (unsigned)(rd(b + 48, 4) & 0xffu);
    const uint64_t shoff = rd(b + 40, 8), shentsize = rd(b + 58, 2), shnum = rd(b + 60, 2);
    if (shentsize < 64 || shoff > size || shnum > (size - shoff) / shentsize) return -1;
    int count = 0;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *sh = b + shoff + i * shentsize;
        const uint64_t type = rd(sh + 4, 4);
        if (type != 2 /* SHT_SYMTAB */ && type != 11 /* SHT_DYNSYM */) continue;
        const uint64_t off = rd(sh + 24, 8), sz = rd(sh + 32, 8), link = rd(sh + 40, 4), ent = rd(sh + 56, 8);
        if (ent < 24 || off > size || sz > size - off || link >= shnum) return -1;
        const unsigned char *str_sh = b + shoff + link * shentsize;
        const uint64_t str_off = rd(str_sh + 24, 8), str_sz = rd(str_sh + 32, 8);
        if (str_off > size || str_sz > size - str_off) return -1;
        const char *strtab = (const char *)b + str_off;
        for (uint64_t s = 0; s + ent <= sz; s += ent) {
            const unsigned char *sym = b + off + s;
            const uint64_t name = rd(sym, 4);
            if (name >= str_sz) return -1;
            const char *nm = strtab + name;
            const char *end = memchr(nm, '\0', (size_t)(str_sz - name));
            if (!end) return -1;
            const size_t n = (size_t)(end - nm);
            /* the .symtab and .dynsym of one object name the same kernels: count one table only */
            if (n > 3 && !memcmp(end - 3, ".kd", 3) && type == 11) {
                if (fn) fn(user, nm, n - 3);
                count++;
            }
        }
    }
    return count;
}

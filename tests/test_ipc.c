/* test_ipc.c — memory shared between processes: kvhal_memcpy_d2d_batch against a host reference on
 * every device present; shareable buffers, their export and import (in-process on the CPU device, whose handles
 * are POSIX shared-memory segments; GPU handles can only be opened by another process, which test_xfer and
 * kvhal-xfer do); and hostile handles, each refused with a status and a message naming the problem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvhal.h"

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static void assert_msg_contains(const char *needle)
{
    const char *m = kvhal_last_error();
    if (!strstr(m, needle)) fail_msg("message \"%s\" lacks \"%s\"", m, needle);
}

/* kvhal_memcpy_d2d_batch on one device against the same copies done on host mirrors: scattered, odd sizes and
 * offsets, adjacent ranges, a zero-byte entry; then the errors (each leaves dst unchanged). */
static void batch_on(kvhal_device dev, bool two_buffers)
{
    enum { SRC = 70000, DST = 90000, N = 300 };
    kvhal_buffer *src = NULL, *dst = NULL;
    assert_int_equal(kvhal_buffer_create(dev, SRC, &src), KVHAL_OK);
    if (two_buffers) assert_int_equal(kvhal_buffer_create(dev, DST, &dst), KVHAL_OK);
    else dst = src; /* within one buffer: disjoint ranges */
    const size_t dsz = two_buffers ? DST : SRC;
    uint8_t *hs = malloc(SRC), *hd = malloc(dsz), *got = malloc(dsz);
    assert_non_null(hs);
    assert_non_null(hd);
    assert_non_null(got);
    fill(hs, SRC, 1);
    assert_int_equal(kvhal_memcpy_h2d(src, 0, hs, SRC, NULL), KVHAL_OK);
    if (two_buffers) {
        fill(hd, dsz, 2);
        assert_int_equal(kvhal_memcpy_h2d(dst, 0, hd, dsz, NULL), KVHAL_OK);
    } else {
        memcpy(hd, hs, SRC);
    }
    size_t so[N], doff[N], by[N];
    for (int i = 0; i < N; i++) {
        by[i] = (size_t)(i % 7 == 3 ? 0 : 1 + (i * 37) % 97);
        if (two_buffers) {
            so[i] = (size_t)((i * 7919) % (SRC - 100));
            doff[i] = (size_t)i * 300 + (size_t)(i % 5); /* disjoint destination ranges */
        } else { /* sources in the first half, destinations in the second */
            so[i] = (size_t)((i * 7919) % (SRC / 2 - 100));
            doff[i] = SRC / 2 + (size_t)i * 110;
        }
    }
    doff[11] = doff[10] + by[10]; /* adjacent destination ranges */
    kvhal_stream *s = NULL;
    if (kvhal_stream_create(dev, &s) != KVHAL_OK) s = NULL;
    /* in four calls of 9, 42, 69 and 137 ranges: a GPU launches a kernel of up to 16 ranges, 48, 96, and (CUDA where
     * kernels take 32 KB of parameters) 512, else the last call's 41 past 96 take the second */
    const int cut[5] = {0, 10, 60, 140, N};
    for (int k = 0; k < 4; k++)
        assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, doff + cut[k], so + cut[k], by + cut[k], cut[k + 1] - cut[k], s),
                         KVHAL_OK);
    if (s) assert_int_equal(kvhal_stream_synchronize(s), KVHAL_OK);
    assert_int_equal(kvhal_device_synchronize(dev), KVHAL_OK);
    for (int i = 0; i < N; i++) memcpy(hd + doff[i], hs + so[i], by[i]);
    assert_int_equal(kvhal_memcpy_d2h(got, dst, 0, dsz, NULL), KVHAL_OK);
    assert_memory_equal(got, hd, dsz);
    /* errors name the entry or the argument; nothing written */
    size_t bad = dsz - 3;
    size_t one = 10, zero = 0;
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, &bad, &zero, &one, 1, s), KVHAL_OUT_OF_RANGE);
    assert_msg_contains("dst_offsets[0]");
    size_t sbad = SRC;
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, &zero, &sbad, &one, 1, s), KVHAL_OUT_OF_RANGE);
    assert_msg_contains("src_offsets[0]");
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, NULL, &zero, &one, 1, s), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("dst_offsets");
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, &zero, NULL, &one, 1, s), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("src_offsets");
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, &zero, &zero, NULL, 1, s), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("bytes");
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, &zero, &zero, &one, -1, s), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("count");
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, NULL, NULL, NULL, 0, s), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_d2d_batch(NULL, src, &zero, &zero, &one, 1, s), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_device_synchronize(dev), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_d2h(got, dst, 0, dsz, NULL), KVHAL_OK);
    assert_memory_equal(got, hd, dsz);
    if (s) kvhal_stream_destroy(s);
    if (two_buffers) kvhal_buffer_destroy(dst);
    kvhal_buffer_destroy(src);
    free(hs);
    free(hd);
    free(got);
}

/* Ranges of 256 KiB and more (CUDA 12.8+ copies them with the copy engines in one batched call on a stream of its
 * own, else the kernel), one of an odd size, on a stream and on the default stream, against host mirrors. */
static void batch_large_on(kvhal_device dev)
{
    enum { SZ = 3 << 20, N = 5 };
    const size_t so[N] = {0, 1 << 20, (2 << 20) + 8, 600000, 3 << 19};
    const size_t doff[N] = {2 << 20, 0, 524298, 1500000, (5 << 19) + 3}; /* disjoint */
    const size_t by[N] = {300000, 1 << 19, 900001, 262144, 262144};
    kvhal_buffer *src = NULL, *dst = NULL;
    assert_int_equal(kvhal_buffer_create(dev, SZ, &src), KVHAL_OK);
    assert_int_equal(kvhal_buffer_create(dev, SZ, &dst), KVHAL_OK);
    uint8_t *hs = malloc(SZ), *hd = malloc(SZ), *got = malloc(SZ);
    assert_non_null(hs);
    assert_non_null(hd);
    assert_non_null(got);
    kvhal_stream *s = NULL;
    if (kvhal_stream_create(dev, &s) != KVHAL_OK) s = NULL;
    for (int round = 0; round < 2; round++) {
        kvhal_stream *on = round ? NULL : s;
        fill(hs, SZ, 3 + round);
        fill(hd, SZ, 5 + round);
        assert_int_equal(kvhal_memcpy_h2d(src, 0, hs, SZ, NULL), KVHAL_OK);
        assert_int_equal(kvhal_memcpy_h2d(dst, 0, hd, SZ, NULL), KVHAL_OK);
        assert_int_equal(kvhal_memcpy_d2d_batch(dst, src, doff, so, by, N, on), KVHAL_OK);
        if (on) assert_int_equal(kvhal_stream_synchronize(on), KVHAL_OK);
        assert_int_equal(kvhal_device_synchronize(dev), KVHAL_OK);
        for (int i = 0; i < N; i++) memcpy(hd + doff[i], hs + so[i], by[i]);
        assert_int_equal(kvhal_memcpy_d2h(got, dst, 0, SZ, NULL), KVHAL_OK);
        assert_memory_equal(got, hd, SZ);
    }
    if (s) kvhal_stream_destroy(s);
    kvhal_buffer_destroy(dst);
    kvhal_buffer_destroy(src);
    free(hs);
    free(hd);
    free(got);
}

static void test_batch_every_device(void **state)
{
    (void)state;
    const kvhal_device_type types[] = {KVHAL_DEVICE_CPU, KVHAL_DEVICE_OPENCL, KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    int ran = 0;
    for (int t = 0; t < 4; t++) {
        int32_t n = 0;
        if (kvhal_device_count(types[t], &n) != KVHAL_OK) n = 0;
        for (int32_t i = 0; i < n; i++) {
            kvhal_device d = {types[t], i};
            batch_on(d, true);
            batch_on(d, false);
            batch_large_on(d);
            ran++;
        }
    }
    printf("# memcpy_d2d_batch verified on %d device(s)\n", ran);
    /* two devices: refused */
    int32_t n = 0;
    if (kvhal_device_count(KVHAL_DEVICE_OPENCL, &n) == KVHAL_OK && n > 0) {
        kvhal_device cpu = {KVHAL_DEVICE_CPU, 0}, ocl = {KVHAL_DEVICE_OPENCL, 0};
        kvhal_buffer *a, *b;
        assert_int_equal(kvhal_buffer_create(cpu, 64, &a), KVHAL_OK);
        assert_int_equal(kvhal_buffer_create(ocl, 64, &b), KVHAL_OK);
        size_t z = 0, o = 8;
        assert_int_equal(kvhal_memcpy_d2d_batch(a, b, &z, &z, &o, 1, NULL), KVHAL_DEVICE_MISMATCH);
        assert_msg_contains("src");
        kvhal_buffer_destroy(a);
        kvhal_buffer_destroy(b);
    }
}

/* A shareable CPU buffer exported and imported (in-process: the handle is a shared-memory segment); the import
 * sees the exporter's bytes and later writes; destroy closes the import, then frees and unlinks the segment. */
static void test_cpu_export_import(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    enum { BYTES = 100000 };
    kvhal_buffer *b = NULL, *imp = NULL, *plain = NULL;
    assert_int_equal(kvhal_buffer_create_shareable(cpu, BYTES, &b), KVHAL_OK);
    assert_true(kvhal_buffer_is_shareable(b));
    uint8_t *want = malloc(BYTES), *got = malloc(BYTES);
    fill(want, BYTES, 3);
    assert_int_equal(kvhal_memcpy_h2d(b, 0, want, BYTES, NULL), KVHAL_OK);
    size_t len = 0;
    assert_int_equal(kvhal_buffer_ipc_export(b, NULL, 0, &len), KVHAL_OUT_OF_RANGE); /* asks the size */
    assert_true(len > 0 && len <= KVHAL_IPC_HANDLE_MAX);
    uint8_t blob[KVHAL_IPC_HANDLE_MAX];
    size_t len2 = 0;
    assert_int_equal(kvhal_buffer_ipc_export(b, blob, sizeof blob, &len2), KVHAL_OK);
    assert_int_equal(len2, len);
    assert_int_equal(kvhal_buffer_ipc_import(cpu, blob, len, &imp), KVHAL_OK);
    assert_int_equal(kvhal_buffer_size(imp), BYTES);
    assert_false(kvhal_buffer_is_shareable(imp));
    assert_int_equal(kvhal_memcpy_d2h(got, imp, 0, BYTES, NULL), KVHAL_OK);
    assert_memory_equal(got, want, BYTES);
    want[5] ^= 0xff;
    assert_int_equal(kvhal_memcpy_h2d(b, 5, want + 5, 1, NULL), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_d2h(got, imp, 0, 16, NULL), KVHAL_OK);
    assert_memory_equal(got, want, 16);
    /* an imported buffer cannot be exported again; a plain one cannot be exported at all */
    assert_int_equal(kvhal_buffer_ipc_export(imp, blob + 0, sizeof blob, &len2), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("imported");
    assert_int_equal(kvhal_buffer_create(cpu, 64, &plain), KVHAL_OK);
    assert_int_equal(kvhal_buffer_ipc_export(plain, blob + 0, sizeof blob, &len2), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("shareable");
    assert_int_equal(kvhal_buffer_ipc_export(plain, blob, sizeof blob, NULL), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("len");
    kvhal_buffer_destroy(plain);
    /* a batch from the import into a plain buffer: the transfer agent's receive path */
    kvhal_buffer *dst;
    assert_int_equal(kvhal_buffer_create(cpu, 4096, &dst), KVHAL_OK);
    size_t so[2] = {100, 90000}, dof[2] = {0, 2048}, by[2] = {1000, 2000};
    assert_int_equal(kvhal_memcpy_d2d_batch(dst, imp, dof, so, by, 2, NULL), KVHAL_OK);
    assert_int_equal(kvhal_memcpy_d2h(got, dst, 0, 4096, NULL), KVHAL_OK);
    assert_memory_equal(got, want + 100, 1000);
    assert_memory_equal(got + 2048, want + 90000, 2000);
    kvhal_buffer_destroy(dst);
    assert_int_equal(kvhal_buffer_destroy(imp), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(b), KVHAL_OK);
    /* the segment is gone: the handle no longer opens */
    assert_int_equal(kvhal_buffer_ipc_import(cpu, blob, len, &imp), KVHAL_BACKEND_ERROR);
    assert_null(imp);
    /* a shareable paged cache */
    kvhal_paged_cache_config cfg = KVHAL_PAGED_CACHE_CONFIG_INIT;
    cfg.num_layers = 2;
    cfg.num_heads = 2;
    cfg.head_dim = 8;
    cfg.block_size = 4;
    cfg.dtype = KVHAL_F16;
    cfg.memory_budget = 1 << 16;
    cfg.device = cpu;
    kvhal_paged_cache *pc;
    assert_int_equal(kvhal_paged_cache_create_shareable(&cfg, &pc), KVHAL_OK);
    kvhal_tensor k, v;
    assert_int_equal(kvhal_paged_cache_layer(pc, 0, &k, &v), KVHAL_OK);
    assert_true(kvhal_buffer_is_shareable(k.buffer));
    kvhal_paged_cache_destroy(pc);
    assert_int_equal(kvhal_paged_cache_create_shareable(NULL, &pc), KVHAL_INVALID_ARGUMENT);
    free(want);
    free(got);
}

/* Hostile handles: every field of the core's header and of the CPU module's part, each refused cleanly. */
static void test_hostile_handles(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_buffer *b, *imp = NULL;
    assert_int_equal(kvhal_buffer_create_shareable(cpu, 5000, &b), KVHAL_OK);
    uint8_t good[KVHAL_IPC_HANDLE_MAX], h[KVHAL_IPC_HANDLE_MAX];
    size_t len = 0;
    assert_int_equal(kvhal_buffer_ipc_export(b, good, sizeof good, &len), KVHAL_OK);
    const size_t hdr = 32; /* the core's header: magic, version, module_len, type[16], bytes */
    struct {
        const char *name;
        size_t at;      /* byte to change */
        uint8_t value;
        size_t len;     /* 0: the right length */
        kvhal_status want;
        const char *msg;
    } cases[] = {
        {"bad magic", 0, 0x00, 0, KVHAL_INVALID_ARGUMENT, "not a kvhal IPC handle"},
        {"bad version", 4, 9, 0, KVHAL_INVALID_ARGUMENT, "version"},
        {"module length past the blob", 6, 0xff, 0, KVHAL_INVALID_ARGUMENT, "len"},
        {"short blob", 0, 0, 20, KVHAL_INVALID_ARGUMENT, "len"},
        {"one byte short", 0, 0, 1, KVHAL_INVALID_ARGUMENT, "len"},
        {"another device type", 8, 'x', 0, KVHAL_DEVICE_MISMATCH, "exported from"},
        {"unterminated type", 8 + 15, 'x', 0, KVHAL_INVALID_ARGUMENT, "not terminated"},
        {"size 0", 24, 0, 0, KVHAL_INVALID_ARGUMENT, "blob"},
        {"size larger than the segment", 25, 0x7f, 0, KVHAL_INVALID_ARGUMENT, "the handle says"},
        {"module magic", hdr + 0, 0x11, 0, KVHAL_INVALID_ARGUMENT, "not a cpu shared-memory handle"},
        {"module size mismatch", hdr + 8, 0x77, 0, KVHAL_INVALID_ARGUMENT, "the handle says"},
        {"token", hdr + 16, 0x5a, 0, KVHAL_INVALID_ARGUMENT, "token"},
        {"name with a slash", hdr + 32 + 8, '/', 0, KVHAL_INVALID_ARGUMENT, "segment name"},
        {"name of another object", hdr + 32 + 1, 'x', 0, KVHAL_INVALID_ARGUMENT, "segment name"},
        {"name of a missing segment", hdr + 32 + 9, 'f', 0, KVHAL_BACKEND_ERROR, "cannot open"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(h, good, len);
        size_t l = len;
        if (cases[c].len == 20) l = 20;
        else if (cases[c].len == 1) l = len - 1;
        else if (cases[c].at == 25) { /* the core's bytes field says more than the segment */
            h[24] = 0x00, h[25] = 0x00, h[26] = 0x01;
        } else if (cases[c].at == 8 + 15) { /* no NUL in the whole field */
            memset(h + 8, 'x', 16);
        } else if (cases[c].at == hdr + 32 + 9) {
            h[cases[c].at] = h[cases[c].at] == 'f' ? 'e' : 'f';
        } else if (cases[c].at == hdr + 16) { /* a token byte changed (set, it stayed as it was 1 time in 256) */
            h[cases[c].at] ^= cases[c].value;
        } else {
            h[cases[c].at] = cases[c].value;
            if (cases[c].at == 24) memset(h + 24, 0, 8);
        }
        kvhal_status st = kvhal_buffer_ipc_import(cpu, h, l, &imp);
        if (st != cases[c].want)
            fail_msg("%s: %s (%s), %s expected", cases[c].name, kvhal_status_name(st), kvhal_last_error(),
                     kvhal_status_name(cases[c].want));
        if (!strstr(kvhal_last_error(), cases[c].msg))
            fail_msg("%s: message \"%s\" lacks \"%s\"", cases[c].name, kvhal_last_error(), cases[c].msg);
        assert_null(imp);
    }
    assert_int_equal(kvhal_buffer_ipc_import(cpu, NULL, len, &imp), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("blob");
    assert_int_equal(kvhal_buffer_ipc_import(cpu, good, len, NULL), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("out");
    assert_int_equal(kvhal_buffer_ipc_import(cpu, good, KVHAL_IPC_HANDLE_MAX + 1, &imp), KVHAL_INVALID_ARGUMENT);
    assert_msg_contains("len");
    /* still good after all that */
    assert_int_equal(kvhal_buffer_ipc_import(cpu, good, len, &imp), KVHAL_OK);
    kvhal_buffer_destroy(imp);
    kvhal_buffer_destroy(b);
}

/* Devices without IPC say so; GPU devices export (their handles open in another process only: see test_xfer). */
static void test_other_devices(void **state)
{
    (void)state;
    int32_t n = 0;
    kvhal_buffer *b = NULL;
    if (kvhal_device_count(KVHAL_DEVICE_OPENCL, &n) == KVHAL_OK && n > 0) {
        kvhal_device ocl = {KVHAL_DEVICE_OPENCL, 0};
        assert_int_equal(kvhal_buffer_create_shareable(ocl, 64, &b), KVHAL_UNSUPPORTED);
        assert_msg_contains("opencl");
        assert_null(b);
        kvhal_buffer *p;
        assert_int_equal(kvhal_buffer_create(ocl, 64, &p), KVHAL_OK);
        size_t len;
        uint8_t blob[KVHAL_IPC_HANDLE_MAX];
        assert_int_equal(kvhal_buffer_ipc_export(p, blob, sizeof blob, &len), KVHAL_UNSUPPORTED);
        kvhal_buffer_destroy(p);
    }
    const kvhal_device_type gpus[] = {KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    for (int t = 0; t < 2; t++) {
        n = 0;
        if (kvhal_device_count(gpus[t], &n) != KVHAL_OK || n <= 0) continue;
        kvhal_device d = {gpus[t], n - 1};
        assert_int_equal(kvhal_buffer_create_shareable(d, 1 << 20, &b), KVHAL_OK);
        uint8_t blob[KVHAL_IPC_HANDLE_MAX];
        size_t len = 0;
        assert_int_equal(kvhal_buffer_ipc_export(b, blob, sizeof blob, &len), KVHAL_OK);
        assert_true(len > 32 && len <= KVHAL_IPC_HANDLE_MAX);
        /* a forged GPU handle fails cleanly (a garbage runtime handle) */
        blob[len - 1] ^= 0x55;
        blob[len - 20] ^= 0x55;
        kvhal_buffer *imp = NULL;
        assert_int_not_equal(kvhal_buffer_ipc_import(d, blob, len, &imp), KVHAL_OK);
        assert_null(imp);
        batch_on(d, true);
        kvhal_buffer_destroy(b);
        printf("# %s: shareable buffer exported (%zu-byte handle)\n", kvhal_device_type_name(gpus[t]), len);
    }
}

/* The /dev/shm entries of pid's shareable CPU buffers. */
static int segments_of(long pid)
{
    char prefix[40];
    snprintf(prefix, sizeof prefix, "kvhal-%ld-", pid);
    DIR *d = opendir("/dev/shm");
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* A child that exports one shareable CPU buffer, writes its handle to out, then waits until the parent closes
 * in_w, the write end of in (or kills it); returns its pid. */
static pid_t exporting_child(int out, int in, int in_w)
{
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid) return pid;
    close(in_w);
    kvhal_buffer *b = NULL;
    uint8_t blob[KVHAL_IPC_HANDLE_MAX];
    size_t len = 0;
    int rc = kvhal_buffer_create_shareable((kvhal_device){KVHAL_DEVICE_CPU, 0}, 8192, &b) == KVHAL_OK &&
                     kvhal_buffer_ipc_export(b, blob, sizeof blob, &len) == KVHAL_OK
                 ? 0
                 : 1;
    if (write(out, &len, sizeof len) != (ssize_t)sizeof len || write(out, blob, len) != (ssize_t)len) rc = 2;
    char c;
    while (read(in, &c, 1) > 0) {
    }
    kvhal_buffer_destroy(b);
    _exit(rc);
}

/* A CPU process killed while it exports leaves its segment named in /dev/shm; the next export of any process
 * unlinks it, and only it: a living exporter's segment stays (and imports), as do a segment still being created
 * (empty) and one of the first format (no owner lock). */
static void test_orphan_segments_swept(void **state)
{
    (void)state;
    const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    if (segments_of(getpid()) < 0) skip(); /* no /dev/shm here: nothing is named there */
    int a_out[2], a_in[2], b_out[2], b_in[2];
    assert_int_equal(pipe(a_out), 0);
    assert_int_equal(pipe(a_in), 0);
    assert_int_equal(pipe(b_out), 0);
    assert_int_equal(pipe(b_in), 0);
    const pid_t a = exporting_child(a_out[1], a_in[0], a_in[1]);
    const pid_t b = exporting_child(b_out[1], b_in[0], b_in[1]);
    size_t alen = 0, blen = 0;
    uint8_t blob[KVHAL_IPC_HANDLE_MAX];
    assert_int_equal(read(a_out[0], &alen, sizeof alen), (ssize_t)sizeof alen);
    assert_true(alen > 0 && alen <= sizeof blob);
    assert_int_equal(read(a_out[0], blob, alen), (ssize_t)alen);
    assert_int_equal(read(b_out[0], &blen, sizeof blen), (ssize_t)sizeof blen);
    assert_true(blen > 0 && blen <= sizeof blob);
    assert_int_equal(read(b_out[0], blob, blen), (ssize_t)blen);
    /* a: killed with its buffer exported, its segment stays named */
    assert_int_equal(kill(a, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(a, &status, 0), a);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(segments_of(a), 1);
    assert_int_equal(segments_of(b), 1);
    /* segments that must survive a sweep: one being created (empty) and one of the first format */
    char empty[48], old[48];
    snprintf(empty, sizeof empty, "/kvhal-%ld-00000000000000e1", (long)getpid());
    snprintf(old, sizeof old, "/kvhal-%ld-00000000000000e2", (long)getpid());
    int fd = shm_open(empty, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    fd = shm_open(old, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    uint8_t page[4096] = {0};
    const uint64_t magic1 = 0x4b5653484d454d31ull; /* KVSHMEM1 */
    memcpy(page, &magic1, sizeof magic1);
    assert_int_equal(write(fd, page, sizeof page), (ssize_t)sizeof page);
    close(fd);
    assert_int_equal(segments_of(getpid()), 2);
    /* this export sweeps */
    kvhal_buffer *mine = NULL, *imp = NULL;
    assert_int_equal(kvhal_buffer_create_shareable(cpu, 4096, &mine), KVHAL_OK);
    assert_int_equal(segments_of(a), 0);
    assert_int_equal(segments_of(b), 1);
    assert_int_equal(segments_of(getpid()), 3);
    assert_int_equal(kvhal_buffer_ipc_import(cpu, blob, blen, &imp), KVHAL_OK); /* b's still opens */
    assert_int_equal(kvhal_buffer_destroy(imp), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(mine), KVHAL_OK);
    assert_int_equal(segments_of(getpid()), 2);
    shm_unlink(empty);
    shm_unlink(old);
    /* b frees its buffer and exits cleanly: nothing of it remains */
    close(b_in[1]);
    assert_int_equal(waitpid(b, &status, 0), b);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(segments_of(b), 0);
    close(a_in[1]);
    for (int i = 0; i < 2; i++) {
        close(a_out[i]);
        close(b_out[i]);
    }
    close(a_in[0]);
    close(b_in[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_every_device),
        cmocka_unit_test(test_cpu_export_import),
        cmocka_unit_test(test_orphan_segments_swept),
        cmocka_unit_test(test_hostile_handles),
        cmocka_unit_test(test_other_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* buffer.c — buffers and streams on any device, and the memcpy family (including copies between two devices,
 * direct where the backend can, staged through the host otherwise). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "device.h"
#include "error.h"
#include "faults.h"
#include "handles.h"
#include "registry.h"

/* ---- buffers ---- */
kvhal_status kvhal__check_buffer(const kvhal_buffer *b, const char *argname)
{
    if (!b) return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: NULL buffer", argname);
    if (b->magic != KVHAL_MAGIC_BUFFER)
        return kvhal__err(KVHAL_INVALID_HANDLE, "%s: %p is not a live kvhal_buffer", argname, (const void *)b);
    return kvhal__bk_here(b->backend, b->device.id, argname);
}

static kvhal_status make_buffer_ipc(kvhal_device dev, size_t bytes, void *native, bool owned, uint8_t ipc,
                                    const void *blob, size_t blob_len, kvhal_buffer **out);
static kvhal_status make_buffer(kvhal_device dev, size_t bytes, void *native, bool owned, kvhal_buffer **out)
{
    return make_buffer_ipc(dev, bytes, native, owned, KVHAL__BUF_PLAIN, NULL, 0, out);
}

/* Releases a buffer's native memory the way it was obtained. */
static kvhal_status release_native(const kvhal__bk *bk, int32_t id, bool owned, uint8_t ipc, void *native)
{
    if (ipc == KVHAL__BUF_SHAREABLE) return bk->dev.buffer_free_shareable(bk->ctx, id, native);
    if (ipc == KVHAL__BUF_IMPORTED) return bk->dev.ipc_close(bk->ctx, id, native);
    if (owned) return bk->dev.buffer_free(bk->ctx, id, native);
    if (bk->dev.buffer_unwrap) return bk->dev.buffer_unwrap(bk->ctx, id, native);
    return KVHAL_OK;
}

static kvhal_status make_buffer_ipc(kvhal_device dev, size_t bytes, void *native, bool owned, uint8_t ipc,
                                    const void *blob, size_t blob_len, kvhal_buffer **out)
{
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    kvhal_buffer *b = kvhal__calloc(1, sizeof *b);
    if (!b) return kvhal__err(KVHAL_OUT_OF_MEMORY, "buffer handle: host allocation failed");
    kvhal_status st = KVHAL_OK;
    if (ipc == KVHAL__BUF_SHAREABLE) {
        st = bk->dev.buffer_alloc_shareable(bk->ctx, dev.id, bytes, &native);
    } else if (ipc == KVHAL__BUF_IMPORTED) {
        st = bk->dev.ipc_import(bk->ctx, dev.id, blob, blob_len, bytes, &native);
    } else if (owned) {
        st = bk->dev.buffer_alloc(bk->ctx, dev.id, bytes, &native);
    } else if (bk->dev.buffer_wrap) {
        st = bk->dev.buffer_wrap(bk->ctx, dev.id, native, bytes);
    }
    if (st != KVHAL_OK) {
        free(b);
        return st;
    }
    if (!kvhal__handle_add(b)) {
        (void)release_native(bk, dev.id, owned, ipc, native);
        free(b);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "buffer handle: host allocation failed");
    }
    b->magic = KVHAL_MAGIC_BUFFER;
    b->owned = owned;
    b->ipc = ipc;
    b->device = dev;
    b->backend = bk;
    b->native = native;
    b->size = bytes;
    *out = b;
    return KVHAL_OK;
}

kvhal_status kvhal_buffer_create(kvhal_device dev, size_t bytes, kvhal_buffer **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_CHECK_ARG(bytes > 0, "bytes: 0 (a buffer must hold at least one byte)");
    return make_buffer(dev, bytes, NULL, true, out);
}

kvhal_status kvhal_buffer_wrap(kvhal_device dev, void *native, size_t bytes, kvhal_buffer **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_CHECK_ARG(native, "native: NULL");
    KVHAL_CHECK_ARG(bytes > 0, "bytes: 0 (a buffer must hold at least one byte)");
    return make_buffer(dev, bytes, native, false, out);
}

kvhal_status kvhal_buffer_destroy(kvhal_buffer *b)
{
    if (!b) return KVHAL_OK; /* like free(NULL) */
    if (!kvhal__handle_remove_kind(b, KVHAL_MAGIC_BUFFER))
        return kvhal__err(KVHAL_INVALID_HANDLE, "buf: %p is not a live kvhal_buffer (destroyed twice?)", (void *)b);
    /* b is this call's alone from here (a racing destroy got INVALID_HANDLE). A forked child keeps the parent's
     * device buffers as they are (releasing them is the parent's): only its handle goes. */
    const kvhal__bk *bk = b->backend;
    kvhal_status st = kvhal__bk_here(bk, b->device.id, "buf");
    if (st == KVHAL_OK) st = release_native(bk, b->device.id, b->owned, b->ipc, b->native);
    b->magic = KVHAL_MAGIC_DEAD;
    free(b);
    return st;
}

size_t kvhal_buffer_size(const kvhal_buffer *b) { return b && b->magic == KVHAL_MAGIC_BUFFER ? b->size : 0; }

kvhal_device kvhal_buffer_device(const kvhal_buffer *b)
{
    kvhal_device none = {(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, -1};
    return b && b->magic == KVHAL_MAGIC_BUFFER ? b->device : none;
}

void *kvhal_buffer_native(const kvhal_buffer *b) { return b && b->magic == KVHAL_MAGIC_BUFFER ? b->native : NULL; }

/* ---- streams ---- */
kvhal_status kvhal__check_stream(const kvhal_stream *s, kvhal_device dev, const char *argname)
{
    if (!s) return KVHAL_OK;
    if (s->magic != KVHAL_MAGIC_STREAM)
        return kvhal__err(KVHAL_INVALID_HANDLE, "%s: %p is not a live kvhal_stream", argname, (const void *)s);
    if (!kvhal__device_equal(s->device, dev))
        return kvhal__err(KVHAL_DEVICE_MISMATCH, "%s: stream is on %s:%d, the operation on %s:%d", argname,
                          kvhal_device_type_name(s->device.type), s->device.id, kvhal_device_type_name(dev.type),
                          dev.id);
    return kvhal__bk_here(s->backend, s->device.id, argname);
}

static kvhal_status make_stream(kvhal_device dev, void *native, bool owned, kvhal_stream **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    if (owned ? !bk->dev.stream_create : !bk->dev.stream_wrap)
        return kvhal__err(KVHAL_UNSUPPORTED, "dev: the %s backend has no stream_%s", kvhal_device_type_name(dev.type),
                          owned ? "create" : "wrap");
    kvhal_stream *s = kvhal__calloc(1, sizeof *s);
    if (!s) return kvhal__err(KVHAL_OUT_OF_MEMORY, "stream handle: host allocation failed");
    kvhal_status st = owned ? bk->dev.stream_create(bk->ctx, dev.id, &s->bk_stream)
                            : bk->dev.stream_wrap(bk->ctx, dev.id, native, &s->bk_stream);
    if (st != KVHAL_OK) {
        free(s);
        return st;
    }
    if (!kvhal__handle_add(s)) {
        if (bk->dev.stream_destroy) bk->dev.stream_destroy(bk->ctx, dev.id, s->bk_stream);
        free(s);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "stream handle: host allocation failed");
    }
    s->magic = KVHAL_MAGIC_STREAM;
    s->owned = owned;
    s->device = dev;
    s->backend = bk;
    *out = s;
    return KVHAL_OK;
}

kvhal_status kvhal_stream_create(kvhal_device dev, kvhal_stream **out) { return make_stream(dev, NULL, true, out); }

/* native NULL, KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD: the default streams; the backend maps them. */
kvhal_status kvhal_stream_wrap(kvhal_device dev, void *native, kvhal_stream **out)
{
    return make_stream(dev, native, false, out);
}

kvhal_status kvhal_stream_destroy(kvhal_stream *s)
{
    if (!s) return KVHAL_OK; /* like free(NULL) */
    if (!kvhal__handle_remove_kind(s, KVHAL_MAGIC_STREAM))
        return kvhal__err(KVHAL_INVALID_HANDLE, "s: %p is not a live kvhal_stream (destroyed twice?)", (void *)s);
    const kvhal__bk *bk = s->backend; /* s is this call's alone; a forked child leaves the parent's stream */
    kvhal_status st = kvhal__bk_here(bk, s->device.id, "s");
    if (st == KVHAL_OK && bk->dev.stream_destroy) st = bk->dev.stream_destroy(bk->ctx, s->device.id, s->bk_stream);
    s->magic = KVHAL_MAGIC_DEAD;
    free(s);
    return st;
}

kvhal_status kvhal_stream_synchronize(kvhal_stream *s)
{
    if (!s) return kvhal__err(KVHAL_INVALID_ARGUMENT, "s: NULL (use kvhal_device_synchronize for the default stream)");
    KVHAL_TRY(kvhal__check_stream(s, s->device, "s"));
    kvhal__stream_waited();
    const kvhal__bk *bk = s->backend;
    if (!bk->dev.stream_synchronize) return bk->dev.synchronize(bk->ctx, s->device.id);
    return bk->dev.stream_synchronize(bk->ctx, s->device.id, s->bk_stream);
}

kvhal_status kvhal_stream_check_errors(kvhal_stream *s)
{
    if (!s)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "s: NULL (use kvhal_device_check_errors for the default stream, or "
                                                  "wrap it with KVHAL_STREAM_LEGACY)");
    KVHAL_TRY(kvhal__check_stream(s, s->device, "s"));
    const kvhal__bk *bk = s->backend;
    if (bk->dev.stream_check_errors) return bk->dev.stream_check_errors(bk->ctx, s->device.id, s->bk_stream);
    kvhal_status st = bk->dev.stream_synchronize ? bk->dev.stream_synchronize(bk->ctx, s->device.id, s->bk_stream)
                                                 : bk->dev.synchronize(bk->ctx, s->device.id);
    if (st != KVHAL_OK) return st;
    return bk->dev.check_errors ? bk->dev.check_errors(bk->ctx, s->device.id) : bk->dev.synchronize(bk->ctx, s->device.id);
}

kvhal_device kvhal_stream_device(const kvhal_stream *s)
{
    kvhal_device none = {(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, -1};
    return s && s->magic == KVHAL_MAGIC_STREAM ? s->device : none;
}

/* ---- copies ---- */
static kvhal_status check_range(const kvhal_buffer *b, const char *arg, size_t off, size_t bytes)
{
    if (off > b->size || bytes > b->size - off)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "%s: range [%zu, %zu + %zu) exceeds the buffer's %zu bytes", arg, off,
                          off, bytes, b->size);
    return KVHAL_OK;
}

kvhal_status kvhal_memcpy_h2d(kvhal_buffer *dst, size_t dst_offset, const void *src, size_t bytes, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_buffer(dst, "dst"));
    KVHAL_CHECK_ARG(src || bytes == 0, "src: NULL");
    KVHAL_TRY(check_range(dst, "dst", dst_offset, bytes));
    KVHAL_TRY(kvhal__check_stream(s, dst->device, "s"));
    if (bytes == 0) return KVHAL_OK;
    const kvhal__bk *bk = dst->backend;
    return bk->dev.memcpy_h2d(bk->ctx, dst->device.id, dst->native, dst_offset, src, bytes, kvhal__bk_stream(s));
}

kvhal_status kvhal_memcpy_d2h(void *dst, const kvhal_buffer *src, size_t src_offset, size_t bytes, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_buffer(src, "src"));
    KVHAL_CHECK_ARG(dst || bytes == 0, "dst: NULL");
    KVHAL_TRY(check_range(src, "src", src_offset, bytes));
    KVHAL_TRY(kvhal__check_stream(s, src->device, "s"));
    if (bytes == 0) return KVHAL_OK;
    const kvhal__bk *bk = src->backend;
    return bk->dev.memcpy_d2h(bk->ctx, src->device.id, dst, src->native, src_offset, bytes, kvhal__bk_stream(s));
}

/* Copy between two devices without a direct path: through a bounded host bounce buffer. */
static kvhal_status staged_copy(kvhal_buffer *dst, size_t dst_off, const kvhal_buffer *src, size_t src_off,
                                size_t bytes, kvhal_stream *s)
{
    /* The caller's stream belongs to one of the two devices; use it on that side, the default on the other. */
    void *ss = s && kvhal__device_equal(s->device, src->device) ? s->bk_stream : NULL;
    void *ds = s && kvhal__device_equal(s->device, dst->device) ? s->bk_stream : NULL;
    size_t chunk = bytes < ((size_t)64 << 20) ? bytes : ((size_t)64 << 20);
    uint8_t *tmp = kvhal__malloc(chunk);
    if (!tmp) return kvhal__err(KVHAL_OUT_OF_MEMORY, "staged copy: %zu-byte host bounce buffer", chunk);
    kvhal_status st = KVHAL_OK;
    for (size_t done = 0; done < bytes && st == KVHAL_OK; done += chunk) {
        size_t n = bytes - done < chunk ? bytes - done : chunk;
        st = src->backend->dev.memcpy_d2h(src->backend->ctx, src->device.id, tmp, src->native, src_off + done, n, ss);
        if (st == KVHAL_OK)
            st = dst->backend->dev.memcpy_h2d(dst->backend->ctx, dst->device.id, dst->native, dst_off + done, tmp, n,
                                              ds);
    }
    free(tmp);
    return st;
}

kvhal_status kvhal_memcpy_d2d(kvhal_buffer *dst, size_t dst_offset, const kvhal_buffer *src, size_t src_offset,
                              size_t bytes, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_buffer(dst, "dst"));
    KVHAL_TRY(kvhal__check_buffer(src, "src"));
    KVHAL_TRY(check_range(dst, "dst", dst_offset, bytes));
    KVHAL_TRY(check_range(src, "src", src_offset, bytes));
    if (s && s->magic == KVHAL_MAGIC_STREAM && !kvhal__device_equal(s->device, dst->device))
        KVHAL_TRY(kvhal__check_stream(s, src->device, "s"));
    else
        KVHAL_TRY(kvhal__check_stream(s, dst->device, "s"));
    if (bytes == 0) return KVHAL_OK;
    if (kvhal__device_equal(dst->device, src->device))
        return dst->backend->dev.memcpy_d2d(dst->backend->ctx, dst->device.id, dst->native, dst_offset, src->native,
                                            src_offset, bytes, kvhal__bk_stream(s));
    if (dst->device.type == src->device.type && dst->backend->dev.memcpy_peer)
        return dst->backend->dev.memcpy_peer(dst->backend->ctx, dst->device.id, dst->native, dst_offset,
                                             src->device.id, src->native, src_offset, bytes, kvhal__bk_stream(s));
    return staged_copy(dst, dst_offset, src, src_offset, bytes, s);
}

kvhal_status kvhal_memset(kvhal_buffer *dst, size_t offset, int value, size_t bytes, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_buffer(dst, "dst"));
    KVHAL_TRY(check_range(dst, "dst", offset, bytes));
    KVHAL_CHECK_ARG(value >= 0 && value <= 255, "value: %d is not a byte value (0..255)", value);
    KVHAL_TRY(kvhal__check_stream(s, dst->device, "s"));
    if (bytes == 0) return KVHAL_OK;
    const kvhal__bk *bk = dst->backend;
    if (!bk->dev.memset) return kvhal__err(KVHAL_UNSUPPORTED, "dst: the %s backend has no memset", bk->name);
    return bk->dev.memset(bk->ctx, dst->device.id, dst->native, offset, value, bytes, kvhal__bk_stream(s));
}

/* ---- memory shared between processes ---- */
/* The core's header in front of the module's part of a handle. Every field is checked on import: the handle comes
 * from another process. */
#define IPC_MAGIC 0x4b564948u /* KVIH */
#define IPC_VERSION 1u
typedef struct ipc_header {
    uint32_t magic;
    uint16_t version;
    uint16_t module_len;              /* bytes of the module's part that follow */
    char type[KVHAL_DEVICE_TYPE_NAME_MAX]; /* the exporter's device type name, NUL-terminated */
    uint64_t bytes;                   /* the exported buffer's size */
} ipc_header;
_Static_assert(sizeof(ipc_header) + KVHAL_BK_IPC_BLOB_MAX <= KVHAL_IPC_HANDLE_MAX, "KVHAL_IPC_HANDLE_MAX too small");

kvhal_status kvhal_buffer_create_shareable(kvhal_device dev, size_t bytes, kvhal_buffer **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_CHECK_ARG(bytes > 0, "bytes: 0 (a buffer must hold at least one byte)");
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    if (!bk->dev.buffer_alloc_shareable || !bk->dev.buffer_free_shareable)
        return kvhal__err(KVHAL_UNSUPPORTED, "dev: the %s backend has no shareable (IPC) memory", bk->name);
    return make_buffer_ipc(dev, bytes, NULL, true, KVHAL__BUF_SHAREABLE, NULL, 0, out);
}

bool kvhal_buffer_is_shareable(const kvhal_buffer *b)
{
    return b && b->magic == KVHAL_MAGIC_BUFFER && b->ipc == KVHAL__BUF_SHAREABLE;
}

kvhal_status kvhal_buffer_ipc_export(const kvhal_buffer *b, void *blob, size_t cap, size_t *len)
{
    KVHAL_CHECK_ARG(len, "len: NULL");
    *len = 0;
    KVHAL_TRY(kvhal__check_buffer(b, "buf"));
    const kvhal__bk *bk = b->backend;
    if (!bk->dev.ipc_export)
        return kvhal__err(KVHAL_UNSUPPORTED, "buf: the %s backend cannot export memory (no IPC)", bk->name);
    KVHAL_CHECK_ARG(b->ipc == KVHAL__BUF_SHAREABLE, "buf: %s buffer; only one from kvhal_buffer_create_shareable "
                    "can be exported", b->ipc == KVHAL__BUF_IMPORTED ? "an imported" : "not a shareable");
    uint8_t part[KVHAL_BK_IPC_BLOB_MAX];
    size_t plen = 0;
    KVHAL_TRY(bk->dev.ipc_export(bk->ctx, b->device.id, b->native, part, sizeof part, &plen));
    if (plen == 0 || plen > sizeof part)
        return kvhal__err(KVHAL_BACKEND_ERROR, "buf: the %s backend wrote a %zu-byte handle (1..%d allowed)",
                          bk->name, plen, KVHAL_BK_IPC_BLOB_MAX);
    const size_t need = sizeof(ipc_header) + plen;
    *len = need;
    if (cap < need)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "cap: %zu bytes, the handle needs %zu", cap, need);
    KVHAL_CHECK_ARG(blob, "blob: NULL");
    ipc_header h;
    memset(&h, 0, sizeof h);
    h.magic = IPC_MAGIC;
    h.version = IPC_VERSION;
    h.module_len = (uint16_t)plen;
    snprintf(h.type, sizeof h.type, "%s", bk->type_name);
    h.bytes = b->size;
    memcpy(blob, &h, sizeof h);
    memcpy((uint8_t *)blob + sizeof h, part, plen);
    return KVHAL_OK;
}

kvhal_status kvhal_buffer_ipc_import(kvhal_device dev, const void *blob, size_t len, kvhal_buffer **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_CHECK_ARG(blob, "blob: NULL");
    KVHAL_CHECK_ARG(len > sizeof(ipc_header) && len <= KVHAL_IPC_HANDLE_MAX,
                    "len: %zu bytes is not the size of an IPC handle (%zu..%d)", len, sizeof(ipc_header) + 1,
                    KVHAL_IPC_HANDLE_MAX);
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    ipc_header h;
    memcpy(&h, blob, sizeof h);
    KVHAL_CHECK_ARG(h.magic == IPC_MAGIC && h.version == IPC_VERSION,
                    "blob: not a kvhal IPC handle (magic 0x%08x, version %u)", (unsigned)h.magic, (unsigned)h.version);
    KVHAL_CHECK_ARG(h.module_len >= 1 && h.module_len <= KVHAL_BK_IPC_BLOB_MAX && len == sizeof h + h.module_len,
                    "len: %zu bytes, the handle says %zu", len, sizeof h + (size_t)h.module_len);
    KVHAL_CHECK_ARG(memchr(h.type, '\0', sizeof h.type) != NULL, "blob: the device type name is not terminated");
    KVHAL_CHECK_ARG(h.bytes >= 1 && h.bytes <= (uint64_t)PTRDIFF_MAX, "blob: a buffer of %llu bytes",
                    (unsigned long long)h.bytes);
    if (strcmp(h.type, bk->type_name) != 0)
        return kvhal__err(KVHAL_DEVICE_MISMATCH, "blob: exported from a %s device, dev is %s:%d", h.type,
                          bk->type_name, (int)dev.id);
    if (!bk->dev.ipc_import || !bk->dev.ipc_close)
        return kvhal__err(KVHAL_UNSUPPORTED, "dev: the %s backend cannot import memory (no IPC)", bk->name);
    return make_buffer_ipc(dev, (size_t)h.bytes, NULL, true, KVHAL__BUF_IMPORTED, (const uint8_t *)blob + sizeof h,
                           h.module_len, out);
}

kvhal_status kvhal_memcpy_d2d_batch(kvhal_buffer *dst, const kvhal_buffer *src, const size_t *dst_offsets,
                                    const size_t *src_offsets, const size_t *bytes, int32_t count, kvhal_stream *s)
{
    KVHAL_TRY(kvhal__check_buffer(dst, "dst"));
    KVHAL_TRY(kvhal__check_buffer(src, "src"));
    KVHAL_CHECK_ARG(count >= 0, "count: %d is negative", (int)count);
    if (!kvhal__device_equal(dst->device, src->device))
        return kvhal__err(KVHAL_DEVICE_MISMATCH, "src: on %s:%d, dst on %s:%d (a batch copies within one device)",
                          kvhal_device_type_name(src->device.type), src->device.id,
                          kvhal_device_type_name(dst->device.type), dst->device.id);
    KVHAL_TRY(kvhal__check_stream(s, dst->device, "s"));
    if (count == 0) return KVHAL_OK;
    KVHAL_CHECK_ARG(dst_offsets, "dst_offsets: NULL");
    KVHAL_CHECK_ARG(src_offsets, "src_offsets: NULL");
    KVHAL_CHECK_ARG(bytes, "bytes: NULL");
    for (int32_t i = 0; i < count; i++) {
        if (dst_offsets[i] > dst->size || bytes[i] > dst->size - dst_offsets[i])
            return kvhal__err(KVHAL_OUT_OF_RANGE, "dst_offsets[%d], bytes[%d]: [%zu, +%zu) exceeds dst's %zu bytes",
                              (int)i, (int)i, dst_offsets[i], bytes[i], dst->size);
        if (src_offsets[i] > src->size || bytes[i] > src->size - src_offsets[i])
            return kvhal__err(KVHAL_OUT_OF_RANGE, "src_offsets[%d], bytes[%d]: [%zu, +%zu) exceeds src's %zu bytes",
                              (int)i, (int)i, src_offsets[i], bytes[i], src->size);
    }
    const kvhal__bk *bk = dst->backend;
    void *bs = kvhal__bk_stream(s);
    if (!bk->ops.copy_batch) {
        for (int32_t i = 0; i < count; i++)
            if (bytes[i])
                KVHAL_TRY(bk->dev.memcpy_d2d(bk->ctx, dst->device.id, dst->native, dst_offsets[i], src->native,
                                             src_offsets[i], bytes[i], bs));
        return KVHAL_OK;
    }
    /* copy_batch takes a native per entry: two arrays of the same pointer, in bounded slices (only as many entries
     * filled as the batch has: a small batch is a launch's worth of host time, not a slice's) */
    enum { SLICE = 1024 };
    void *dn[SLICE], *sn[SLICE];
    const int32_t fill = count < SLICE ? count : SLICE;
    for (int32_t i = 0; i < fill; i++) {
        dn[i] = dst->native;
        sn[i] = src->native;
    }
    for (int32_t first = 0; first < count; first += SLICE) {
        const int32_t n = count - first < SLICE ? count - first : SLICE;
        kvhal_bk_copy_batch batch = {.count = n, .dst = dn, .dst_offsets = dst_offsets + first, .src = sn,
                                     .src_offsets = src_offsets + first, .bytes = bytes + first};
        KVHAL_TRY(bk->ops.copy_batch(bk->ctx, dst->device.id, &batch, bs));
    }
    return KVHAL_OK;
}

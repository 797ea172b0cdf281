/* host_memory.c — host memory for a device's transfers (pinned through the backend's host_alloc, else plain aligned
 * memory) and stream polling (the backend's stream_query, else a wait). */
#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "error.h"
#include "faults.h"
#include "handles.h"
#include "host_memory.h"
#include "registry.h"

kvhal_status kvhal_host_memory_create(kvhal_device dev, size_t bytes, kvhal_host_memory **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    KVHAL_CHECK_ARG(bytes > 0, "bytes: 0 (host memory must hold at least one byte)");
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    kvhal_host_memory *h = kvhal__calloc(1, sizeof *h);
    if (!h) return kvhal__err(KVHAL_OUT_OF_MEMORY, "host memory handle: host allocation failed");
    h->device = dev;
    h->backend = bk;
    h->size = bytes;
    kvhal_status st = KVHAL_OK;
    if (bk->dev.host_alloc && bk->dev.host_free) {
        st = bk->dev.host_alloc(bk->ctx, dev.id, bytes, &h->ptr);
        h->pinned = st == KVHAL_OK;
    } else if (kvhal__alloc_should_fail() || posix_memalign(&h->ptr, 64, bytes) != 0) {
        h->ptr = NULL;
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "bytes: cannot allocate %zu bytes of host memory", bytes);
    }
    /* plain memory is written once now, so that no transfer pays for its first-touch page faults (pinned memory
     * is resident already) */
    if (st == KVHAL_OK && !h->pinned) memset(h->ptr, 0, bytes);
    if (st == KVHAL_OK && !kvhal__handle_add(h)) {
        if (h->pinned) bk->dev.host_free(bk->ctx, dev.id, h->ptr);
        else free(h->ptr);
        st = kvhal__err(KVHAL_OUT_OF_MEMORY, "host memory handle: cannot register the handle");
    }
    if (st != KVHAL_OK) {
        free(h);
        return st;
    }
    h->magic = KVHAL_MAGIC_HOSTMEM;
    *out = h;
    return KVHAL_OK;
}

kvhal_status kvhal_host_memory_destroy(kvhal_host_memory *h)
{
    if (!h) return KVHAL_OK;
    if (!kvhal__handle_remove_kind(h, KVHAL_MAGIC_HOSTMEM))
        return kvhal__err(KVHAL_INVALID_HANDLE, "h: %p is not live host memory (destroyed twice?)", (void *)h);
    h->magic = KVHAL_MAGIC_DEAD; /* h is this call's alone; a forked child leaves the parent's pinned memory */
    kvhal_status st = KVHAL_OK;
    if (h->pinned) {
        st = kvhal__bk_here(h->backend, h->device.id, "h");
        if (st == KVHAL_OK) st = h->backend->dev.host_free(h->backend->ctx, h->device.id, h->ptr);
    } else {
        free(h->ptr);
    }
    free(h);
    return st;
}

kvhal_status kvhal__check_host_memory(const kvhal_host_memory *h, const char *argname)
{
    if (!h) return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: NULL host memory", argname);
    if (!kvhal__handle_live(h, KVHAL_MAGIC_HOSTMEM))
        return kvhal__err(KVHAL_INVALID_HANDLE, "%s: %p is not live host memory", argname, (const void *)h);
    return KVHAL_OK;
}

void *kvhal_host_memory_ptr(const kvhal_host_memory *h)
{
    return h && kvhal__handle_live(h, KVHAL_MAGIC_HOSTMEM) ? h->ptr : NULL;
}

size_t kvhal_host_memory_size(const kvhal_host_memory *h)
{
    return h && kvhal__handle_live(h, KVHAL_MAGIC_HOSTMEM) ? h->size : 0;
}

bool kvhal_host_memory_pinned(const kvhal_host_memory *h)
{
    return h && kvhal__handle_live(h, KVHAL_MAGIC_HOSTMEM) && h->pinned;
}

kvhal_status kvhal_stream_query(kvhal_stream *s)
{
    if (!s) return kvhal__err(KVHAL_INVALID_ARGUMENT, "s: NULL (poll a stream of your own)");
    KVHAL_TRY(kvhal__check_stream(s, s->device, "s"));
    if (kvhal__streams_held()) return KVHAL_BUSY; /* test hook: the work counts as still running */
    const kvhal__bk *bk = s->backend;
    if (bk->dev.stream_query) return bk->dev.stream_query(bk->ctx, s->device.id, s->bk_stream);
    if (bk->dev.stream_synchronize) return bk->dev.stream_synchronize(bk->ctx, s->device.id, s->bk_stream);
    return bk->dev.synchronize(bk->ctx, s->device.id);
}

/* Device events (kvhal_event_*): a handle over the backend's event slots. A backend without them (cpu, a module
 * that leaves them NULL) gets events that are complete once recorded: record waits for the stream, which is what
 * its work does anyway where it is synchronous, and is correct (if slower) where it is not. */
#include <stdlib.h>

#include "buffer.h"
#include "error.h"
#include "faults.h"
#include "handles.h"
#include "registry.h"

struct kvhal_event {
    uint32_t magic;
    kvhal_device device;
    const kvhal__bk *backend;
    void *bk_event;          /* what the backend's event_create returned; NULL where it has no events */
};

static kvhal_status check_event(const kvhal_event *e, const char *argname)
{
    if (!e) return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: NULL", argname);
    if (!kvhal__handle_live(e, KVHAL_MAGIC_EVENT))
        return kvhal__err(KVHAL_INVALID_HANDLE, "%s: %p is not a live kvhal_event", argname, (const void *)e);
    return kvhal__bk_here(e->backend, e->device.id, argname);
}

kvhal_status kvhal_event_create(kvhal_device dev, kvhal_event **out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    *out = NULL;
    const kvhal__bk *bk;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &bk));
    kvhal_event *e = kvhal__calloc(1, sizeof *e);
    if (!e) return kvhal__err(KVHAL_OUT_OF_MEMORY, "event handle: host allocation failed");
    if (bk->dev.event_create) {
        kvhal_status st = bk->dev.event_create(bk->ctx, dev.id, &e->bk_event);
        if (st != KVHAL_OK) {
            free(e);
            return st;
        }
    }
    if (!kvhal__handle_add(e)) {
        if (bk->dev.event_create) bk->dev.event_destroy(bk->ctx, dev.id, e->bk_event);
        free(e);
        return kvhal__err(KVHAL_OUT_OF_MEMORY, "event handle: host allocation failed");
    }
    e->magic = KVHAL_MAGIC_EVENT;
    e->device = dev;
    e->backend = bk;
    *out = e;
    return KVHAL_OK;
}

kvhal_status kvhal_event_destroy(kvhal_event *e)
{
    if (!e) return KVHAL_OK; /* like free(NULL) */
    if (!kvhal__handle_remove_kind(e, KVHAL_MAGIC_EVENT))
        return kvhal__err(KVHAL_INVALID_HANDLE, "e: %p is not a live kvhal_event (destroyed twice?)", (void *)e);
    const kvhal__bk *bk = e->backend; /* e is this call's alone; a forked child leaves the parent's event */
    kvhal_status st = kvhal__bk_here(bk, e->device.id, "e");
    if (st == KVHAL_OK && bk->dev.event_create) st = bk->dev.event_destroy(bk->ctx, e->device.id, e->bk_event);
    e->magic = KVHAL_MAGIC_DEAD;
    free(e);
    return st;
}

kvhal_status kvhal_event_record(kvhal_event *e, kvhal_stream *s)
{
    KVHAL_TRY(check_event(e, "e"));
    KVHAL_TRY(kvhal__check_stream(s, e->device, "s"));
    const kvhal__bk *bk = e->backend;
    if (bk->dev.event_create) return bk->dev.event_record(bk->ctx, e->device.id, e->bk_event, kvhal__bk_stream(s));
    /* no backend events: the work before the record is done once this returns */
    if (bk->dev.stream_synchronize) return bk->dev.stream_synchronize(bk->ctx, e->device.id, kvhal__bk_stream(s));
    return bk->dev.synchronize(bk->ctx, e->device.id);
}

kvhal_status kvhal_event_query(kvhal_event *e)
{
    KVHAL_TRY(check_event(e, "e"));
    if (kvhal__streams_held()) return KVHAL_BUSY; /* test hook: the work counts as still running */
    const kvhal__bk *bk = e->backend;
    return bk->dev.event_create ? bk->dev.event_query(bk->ctx, e->device.id, e->bk_event) : KVHAL_OK;
}

kvhal_status kvhal_event_synchronize(kvhal_event *e)
{
    KVHAL_TRY(check_event(e, "e"));
    kvhal__stream_waited();
    const kvhal__bk *bk = e->backend;
    return bk->dev.event_create ? bk->dev.event_synchronize(bk->ctx, e->device.id, e->bk_event) : KVHAL_OK;
}

kvhal_status kvhal_stream_wait_event(kvhal_stream *s, kvhal_event *e)
{
    KVHAL_TRY(check_event(e, "e"));
    KVHAL_TRY(kvhal__check_stream(s, e->device, "s"));
    const kvhal__bk *bk = e->backend;
    /* without backend events the event completed when it was recorded: nothing to wait for */
    return bk->dev.event_create ? bk->dev.stream_wait_event(bk->ctx, e->device.id, kvhal__bk_stream(s), e->bk_event)
                                : KVHAL_OK;
}

kvhal_device kvhal_event_device(const kvhal_event *e)
{
    kvhal_device none = {(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, -1};
    return e && kvhal__handle_live(e, KVHAL_MAGIC_EVENT) ? e->device : none;
}

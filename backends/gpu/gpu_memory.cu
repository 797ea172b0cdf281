/* gpu_memory.cu — the GPU backends' memory: buffers (and their pool), streams, copies between host and device,
 * on one device and between devices, memset, and the waits (synchronize, check_errors). */
#include "gpu_private.h"

namespace kvhal_gpu {

/* ------------------------------------------------------------------------------------------------------------ */
/* Buffers                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
/* Buffers come from a pool of stream-ordered allocations on the device's default stream: creating and destroying
 * one costs no device-wide synchronisation (cudaFree waits for the whole device) and a destroyed buffer's memory
 * is reused by the next create (a duplicate is an allocation plus a copy). Destroy is ordered after the work of
 * the default stream and of every stream kvhal created (they synchronise with it); while a borrowed stream is alive
 * on the device, which may not, create and destroy wait for the device instead. The pool keeps up to 1/16 of the
 * device's memory across synchronisations and returns the rest. Devices without pools use plain allocations. */
namespace {

void grant_pool_access(const Ctx *c, int32_t owner, int32_t accessor)
{
    gpuMemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = gpuMemLocationTypeDevice;
    d.location.id = accessor;
    d.flags = gpuMemAccessFlagsProtReadWrite;
    (void)gpuMemPoolSetAccess(c->dev[owner].pool, &d, 1);
}

/* The caller has selected the device. */
bool pool_ready(Ctx *c, int32_t id)
{
    DevState *ds = &c->dev[id];
    const int st = __atomic_load_n(&ds->pool_state, __ATOMIC_ACQUIRE);
    if (st) return st > 0;
    pthread_mutex_lock(&c->lock);
    if (!ds->pool_state) {
        int supported = 0, state = -1;
        size_t fr = 0, total = 0;
        if (gpuDeviceGetAttribute(&supported, gpuDevAttrMemoryPoolsSupported, id) == gpuSuccess && supported &&
            gpuMemGetInfo(&fr, &total) == gpuSuccess) {
            gpuMemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = gpuMemAllocationTypePinned;
            props.handleTypes = gpuMemHandleTypeNone;
            props.location.type = gpuMemLocationTypeDevice;
            props.location.id = id;
            gpuMemPool_t pool;
            void *probe = NULL;
            /* a runtime may create pools and still refuse allocations from them: try one before committing */
            if (gpuMemPoolCreate(&pool, &props) == gpuSuccess &&
                gpuMallocFromPoolAsync(&probe, 256, pool, 0) == gpuSuccess && gpuFreeAsync(probe, 0) == gpuSuccess &&
                gpuStreamSynchronize(0) == gpuSuccess) {
                uint64_t keep = (uint64_t)total / 16;
                (void)gpuMemPoolSetAttribute(pool, gpuMemPoolAttrReleaseThreshold, &keep);
                ds->pool = pool;
                state = 1;
                for (int32_t j = 0; j < c->count; j++)
                    if (j != id && c->dev[j].peer[id] == 1) grant_pool_access(c, id, j);
            }
        }
        (void)gpuGetLastError();
        __atomic_store_n(&ds->pool_state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->lock);
    return __atomic_load_n(&ds->pool_state, __ATOMIC_ACQUIRE) > 0;
}

} // namespace

/* "bytes: 4096 on cuda:0: out of memory (...)"; what goes between the size and the device. */
static kvhal_status alloc_failed(const Ctx *c, gpuError_t e, int32_t id, size_t bytes, const char *what)
{
    (void)gpuGetLastError();
    char d[160];
    describe(e, d, sizeof d);
    return fail(c, e == gpuErrorMemoryAllocation ? KVHAL_OUT_OF_MEMORY : KVHAL_BACKEND_ERROR, "bytes: %zu%s %s:%d: %s",
                bytes, *what ? what : " on", KVHAL_GPU_NAME, (int)id, d);
}

kvhal_status gpu_buffer_alloc(void *ctx, int32_t id, size_t bytes, void **native)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!native) return fail(c, KVHAL_INVALID_ARGUMENT, "native: NULL");
    if (alloc_fail(c)) return injected(c, id, "buffer");
    KVHAL_GPU_SETDEV(c, id);
    st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    void *p = NULL;
    gpuError_t e;
    if (pool_ready(c, id)) {
        e = gpuMallocFromPoolAsync(&p, bytes, c->dev[id].pool, 0);
        if (e == gpuSuccess && __atomic_load_n(&c->dev[id].wrapped, __ATOMIC_ACQUIRE) > 0) {
            e = gpuStreamSynchronize(0);
            if (e != gpuSuccess) (void)gpuFreeAsync(p, 0);
        }
    } else {
        e = gpuMalloc(&p, bytes);
    }
    if (e != gpuSuccess) return alloc_failed(c, e, id, bytes, "");
    *native = p;
    return KVHAL_OK;
}

kvhal_status gpu_buffer_free(void *ctx, int32_t id, void *native)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    if (__atomic_load_n(&c->dev[id].pool_state, __ATOMIC_ACQUIRE) > 0) {
        if (__atomic_load_n(&c->dev[id].wrapped, __ATOMIC_ACQUIRE) > 0)
            KVHAL_GPU_TRY(c, gpuDeviceSynchronize(), id, "free (wait for borrowed streams)");
        KVHAL_GPU_TRY(c, gpuFreeAsync(native, 0), id, "free");
    } else {
        KVHAL_GPU_TRY(c, gpuFree(native), id, "free");
    }
    return KVHAL_OK;
}

/* Borrowing checks what the pointer is, so that host memory handed to a GPU device fails here instead of as an
 * illegal address inside a later kernel. */
kvhal_status gpu_buffer_wrap(void *ctx, int32_t id, void *native, size_t bytes)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    int dev = -1, is_device = 0;
    gpuError_t e = gpuPointerDevice(native, &dev, &is_device);
    (void)gpuGetLastError();
    if (e != gpuSuccess || !is_device)
        return fail(c, KVHAL_INVALID_ARGUMENT, "native: %p (%zu bytes) is not %s device memory", native, bytes,
                    KVHAL_GPU_RUNTIME_NAME);
    if (dev != id)
        return fail(c, KVHAL_DEVICE_MISMATCH, "native: %p is memory of %s:%d, not of %s:%d", native, KVHAL_GPU_NAME,
                    dev, KVHAL_GPU_NAME, (int)id);
    return open_device(c, id);
}

kvhal_status gpu_buffer_unwrap(void *ctx, int32_t id, void *native)
{
    (void)native;
    return check_id(ctx_of(ctx), id);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */
namespace {

kvhal_status new_stream(const Ctx *c, int32_t id, gpuStream_t s, bool owned, bool counted, void **out)
{
    Stream *w = static_cast<Stream *>(malloc(sizeof(Stream)));
    if (!w)
        return fail(c, KVHAL_OUT_OF_MEMORY, "%s:%d: stream wrapper: host allocation failed", KVHAL_GPU_NAME, (int)id);
    w->s = s;
    w->dev = id;
    w->owned = owned;
    w->counted = counted;
    *out = w;
    return KVHAL_OK;
}

} // namespace

kvhal_status gpu_stream_create(void *ctx, int32_t id, void **stream)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!stream) return fail(c, KVHAL_INVALID_ARGUMENT, "stream: NULL");
    if (alloc_fail(c)) return injected(c, id, "stream");
    KVHAL_GPU_SETDEV(c, id);
    st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    gpuStream_t s;
    KVHAL_GPU_TRY(c, gpuStreamCreate(&s), id, "stream create");
    st = new_stream(c, id, s, true, false, stream);
    if (st != KVHAL_OK) (void)gpuStreamDestroy(s);
    return st;
}

kvhal_status gpu_stream_wrap(void *ctx, int32_t id, void *native, void **stream)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (!stream) return fail(c, KVHAL_INVALID_ARGUMENT, "stream: NULL");
    if (alloc_fail(c)) return injected(c, id, "stream wrapper");
    st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    /* NULL and KVHAL_STREAM_LEGACY: the legacy default stream; KVHAL_STREAM_PER_THREAD: the calling thread's
     * per-thread default stream (the handle stands for whichever thread enqueues). Both synchronise with the legacy
     * default stream on which buffers are allocated and freed, so they need no waits there (not counted). */
    gpuStream_t s = static_cast<gpuStream_t>(native);
    bool counted = true;
    if (!native || native == KVHAL_STREAM_LEGACY) {
        s = gpuStreamLegacyHandle;
        counted = false;
    } else if (native == KVHAL_STREAM_PER_THREAD) {
        s = gpuStreamPerThreadHandle;
        counted = false;
    }
    st = new_stream(c, id, s, false, counted, stream);
    if (st == KVHAL_OK && counted) __atomic_add_fetch(&c->dev[id].wrapped, 1, __ATOMIC_ACQ_REL);
    return st;
}

kvhal_status gpu_stream_destroy(void *ctx, int32_t id, void *stream)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    Stream *w = static_cast<Stream *>(stream);
    if (!w) return KVHAL_OK;
    gpuError_t e = gpuSuccess;
    const DeviceGuard guard;
    if (w->owned) {
        e = guard.select(id);
        if (e == gpuSuccess) e = gpuStreamDestroy(w->s);
    } else if (w->counted) {
        __atomic_sub_fetch(&c->dev[id].wrapped, 1, __ATOMIC_ACQ_REL);
    }
    free(w);
    if (e != gpuSuccess) return rt_fail(c, e, id, "stream destroy");
    return KVHAL_OK;
}

kvhal_status gpu_stream_synchronize(void *ctx, int32_t id, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuStreamSynchronize(native_stream(stream)), id, "stream synchronize");
    return KVHAL_OK;
}

static kvhal_status stream_query(const Ctx *c, int32_t id, gpuStream_t s)
{
    const gpuError_t e = gpuStreamQuery(s);
    if (e == gpuErrorNotReady) {
        (void)gpuGetLastError();
        return KVHAL_BUSY;
    }
    if (e != gpuSuccess) return rt_fail(c, e, id, "stream query");
    return KVHAL_OK;
}

/* A stream of its own is queried in its own context, as an event is: no device selection (a driver call or two less
 * per poll); the default streams are the current device's, so for them the device is selected. */
kvhal_status gpu_stream_query(void *ctx, int32_t id, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    const gpuStream_t s = native_stream(stream);
#if defined(KVHAL_GPU_HIP)
    const bool dflt = s == (gpuStream_t)0 || s == gpuStreamPerThreadHandle; /* HIP's legacy handle is 0 */
#else
    const bool dflt = s == (gpuStream_t)0 || s == gpuStreamLegacyHandle || s == gpuStreamPerThreadHandle;
#endif
    if (dflt) {
        KVHAL_GPU_SETDEV(c, id);
        return stream_query(c, id, s);
    }
    return stream_query(c, id, s);
}

/* Events: the runtime's, without timing (a cheaper record and query). Created with the device opened, so that the
 * event belongs to the primary context the streams of this module use. */
kvhal_status gpu_event_create(void *ctx, int32_t id, void **ev)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (alloc_fail(c)) return injected(c, id, "event");
    st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    gpuEvent_t e = NULL;
    KVHAL_GPU_TRY(c, gpuEventCreateWithFlags(&e, gpuEventDisableTiming), id, "event create");
    *ev = e;
    return KVHAL_OK;
}

kvhal_status gpu_event_destroy(void *ctx, int32_t id, void *ev)
{
    const Ctx *c = ctx_of(ctx);
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuEventDestroy(static_cast<gpuEvent_t>(ev)), id, "event destroy");
    return KVHAL_OK;
}

kvhal_status gpu_event_record(void *ctx, int32_t id, void *ev, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuEventRecord(static_cast<gpuEvent_t>(ev), native_stream(stream)), id, "event record");
    return KVHAL_OK;
}

kvhal_status gpu_event_query(void *ctx, int32_t id, void *ev)
{
    const Ctx *c = ctx_of(ctx);
    /* no device selection: a query reads the event's own context (and costs a driver call less) */
    const gpuError_t e = gpuEventQuery(static_cast<gpuEvent_t>(ev));
    if (e == gpuErrorNotReady) {
        (void)gpuGetLastError();
        return KVHAL_BUSY;
    }
    if (e != gpuSuccess) return rt_fail(c, e, id, "event query");
    return KVHAL_OK;
}

kvhal_status gpu_event_synchronize(void *ctx, int32_t id, void *ev)
{
    const Ctx *c = ctx_of(ctx);
    KVHAL_GPU_TRY(c, gpuEventSynchronize(static_cast<gpuEvent_t>(ev)), id, "event synchronize");
    return KVHAL_OK;
}

kvhal_status gpu_stream_wait_event(void *ctx, int32_t id, void *stream, void *ev)
{
    const Ctx *c = ctx_of(ctx);
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuStreamWaitEvent(native_stream(stream), static_cast<gpuEvent_t>(ev), 0), id,
                  "stream wait event");
    return KVHAL_OK;
}

/* Host memory for page transfers: mapped and portable pinned memory, which kernels on every device can address. */
kvhal_status gpu_host_alloc(void *ctx, int32_t id, size_t bytes, void **ptr)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    if (alloc_fail(c)) return injected(c, id, "host memory");
    KVHAL_GPU_SETDEV(c, id);
    void *p = NULL;
    const gpuError_t e = gpuMallocHostMapped(&p, bytes);
    if (e != gpuSuccess) return alloc_failed(c, e, id, bytes, " of pinned host memory for");
    *ptr = p;
    return KVHAL_OK;
}

kvhal_status gpu_host_free(void *ctx, int32_t id, void *ptr)
{
    const Ctx *c = ctx_of(ctx);
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuFreeHost(ptr), id, "pinned host memory free");
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Copies                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */
/* Host copies wait for their stream: the caller may reuse (or free) host memory on return, pinned or not. */
kvhal_status gpu_memcpy_h2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes,
                            void *stream)
{
    const Ctx *c = ctx_of(ctx);
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    const gpuStream_t s = native_stream(stream);
    KVHAL_GPU_TRY(c, gpuMemcpyAsync(static_cast<char *>(dst) + dst_off, src, bytes, gpuMemcpyHostToDevice, s), id,
                  "memcpy host to device");
    KVHAL_GPU_TRY(c, gpuStreamSynchronize(s), id, "memcpy host to device (wait)");
    return KVHAL_OK;
}

kvhal_status gpu_memcpy_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t src_off, size_t bytes,
                            void *stream)
{
    const Ctx *c = ctx_of(ctx);
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    const gpuStream_t s = native_stream(stream);
    KVHAL_GPU_TRY(c, gpuMemcpyAsync(dst, static_cast<const char *>(src) + src_off, bytes, gpuMemcpyDeviceToHost, s),
                  id, "memcpy device to host");
    KVHAL_GPU_TRY(c, gpuStreamSynchronize(s), id, "memcpy device to host (wait)");
    return KVHAL_OK;
}

kvhal_status gpu_memcpy_d2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off,
                            size_t bytes, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuMemcpyAsync(static_cast<char *>(dst) + dst_off, static_cast<const char *>(src) + src_off,
                                    bytes, gpuMemcpyDeviceToDevice, native_stream(stream)),
                  id, "memcpy device to device");
    return KVHAL_OK;
}

namespace {

/* Enables direct access between a and b in both directions, once per pair, where the hardware allows it. Without
 * it peer copies still work (the runtime stages them), only slower, so failure here is not an error. */
void enable_peer(Ctx *c, int32_t a, int32_t b)
{
    if (__atomic_load_n(&c->dev[a].peer[b], __ATOMIC_ACQUIRE) != 0) return;
    pthread_mutex_lock(&c->lock);
    const int32_t pair[2][2] = {{a, b}, {b, a}};
    for (int k = 0; k < 2; k++) {
        const int32_t x = pair[k][0], y = pair[k][1];
        if (c->dev[x].peer[y] != 0) continue;
        int can = 0;
        signed char state = -1;
        if (gpuDeviceCanAccessPeer(&can, x, y) == gpuSuccess && can && use_device(x) == gpuSuccess) {
            gpuError_t e = gpuDeviceEnablePeerAccess(y, 0);
            if (e == gpuSuccess || e == gpuErrorPeerAccessAlreadyEnabled) state = 1;
            /* buffers of y's pool are mapped for x only on request */
            if (state == 1 && c->dev[y].pool_state > 0) grant_pool_access(c, y, x);
        }
        (void)gpuGetLastError();
        __atomic_store_n(&c->dev[x].peer[y], state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->lock);
}

/* Event ordering of one device's default stream after another's (peer copies on the default streams). */
gpuError_t order_after(int32_t waiter, int32_t signaler)
{
    gpuEvent_t ev;
    gpuError_t e = use_device(signaler);
    if (e != gpuSuccess) return e;
    if ((e = gpuEventCreateWithFlags(&ev, gpuEventDisableTiming)) != gpuSuccess) return e;
    e = gpuEventRecord(ev, 0);
    if (e == gpuSuccess && (e = use_device(waiter)) == gpuSuccess) e = gpuStreamWaitEvent(0, ev, 0);
    (void)gpuEventDestroy(ev); /* released once the wait is satisfied */
    return e;
}

} // namespace

/* stream: the caller's stream (on either device) or NULL: then the copy runs on the source's default stream,
 * ordered after work already queued on the destination's default stream and before work queued there later. */
kvhal_status gpu_memcpy_peer(void *ctx, int32_t dst_id, void *dst, size_t dst_off, int32_t src_id, const void *src,
                             size_t src_off, size_t bytes, void *stream)
{
    Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, dst_id);
    if (st == KVHAL_OK) st = check_id(c, src_id);
    if (st != KVHAL_OK) return st;
    if (!bytes) return KVHAL_OK;
    if (dst_id == src_id) return gpu_memcpy_d2d(ctx, dst_id, dst, dst_off, src, src_off, bytes, stream);
    const DeviceGuard guard; /* enable_peer and order_after switch devices */
    enable_peer(c, dst_id, src_id);
    char *d = static_cast<char *>(dst) + dst_off;
    const char *s = static_cast<const char *>(src) + src_off;
    if (stream) {
        Stream *w = static_cast<Stream *>(stream);
        KVHAL_GPU_SETDEV(c, w->dev);
        KVHAL_GPU_TRY(c, gpuMemcpyPeerAsync(d, dst_id, s, src_id, bytes, w->s), dst_id, "peer copy");
        return KVHAL_OK;
    }
    KVHAL_GPU_TRY(c, order_after(src_id, dst_id), dst_id, "peer copy (order after the destination)");
    KVHAL_GPU_SETDEV(c, src_id);
    KVHAL_GPU_TRY(c, gpuMemcpyPeerAsync(d, dst_id, s, src_id, bytes, 0), src_id, "peer copy");
    KVHAL_GPU_TRY(c, order_after(dst_id, src_id), dst_id, "peer copy (order the destination after it)");
    return KVHAL_OK;
}

kvhal_status gpu_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    if (!bytes) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuMemsetAsync(static_cast<char *>(dst) + off, value, bytes, native_stream(stream)), id,
                  "memset");
    return KVHAL_OK;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Waits                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */
kvhal_status gpu_synchronize(void *ctx, int32_t id)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuDeviceSynchronize(), id, "device synchronize");
    return read_flag(c, id);
}

/* Waits for work queued on the default stream and, through it, on kvhal's streams; borrowed non-blocking streams
 * are the caller's to wait for. */
kvhal_status gpu_check_errors(void *ctx, int32_t id)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuStreamSynchronize(0), id, "wait for queued work");
    return read_flag(c, id);
}

/* Waits for the work queued on one stream only (no device-wide wait), then reads and clears the device's flag. The
 * flag is the device's: a fault raised by a kernel of another stream that has finished is reported here too. */
kvhal_status gpu_stream_check_errors(void *ctx, int32_t id, void *stream)
{
    const Ctx *c = ctx_of(ctx);
    kvhal_status st = check_id(c, id);
    if (st != KVHAL_OK) return st;
    KVHAL_GPU_SETDEV(c, id);
    KVHAL_GPU_TRY(c, gpuStreamSynchronize(native_stream(stream)), id, "wait for the stream's queued work");
    return read_flag(c, id);
}

} // namespace kvhal_gpu

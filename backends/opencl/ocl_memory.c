/* ocl_memory.c — the OpenCL module's memory side: the contexts a device is used in (its platform's and those of
 * wrapped objects), buffers (cl_mem), streams (command queues), copies (overlapping ones through a temporary
 * buffer, between platforms through the host), memset, synchronize and the device-side error flag. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

kvhal_status kvhal__ocl_ctx_entry_make(ocl_device *d, cl_context ctx, ocl_ctx *e)
{
    cl_int err;
    e->ctx = ctx;
    e->queue = clCreateCommandQueue(ctx, d->id, 0, &err);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "clCreateCommandQueue on '%s'", d->name);
    cl_int zero = 0;
    e->err_flag = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, &zero, &err);
    if (err != CL_SUCCESS) {
        clReleaseCommandQueue(e->queue);
        e->queue = NULL;
        return kvhal__ocl_fail(d->m, err, "clCreateBuffer (error flag) on '%s'", d->name);
    }
    return KVHAL_OK;
}

void kvhal__ocl_ctx_entry_release(ocl_ctx *e)
{
    if (e->err_flag) clReleaseMemObject(e->err_flag);
    if (e->queue) clReleaseCommandQueue(e->queue);
    e->err_flag = NULL;
    e->queue = NULL;
}

/* ---- contexts ---- */
kvhal_status kvhal__ocl_ctx_of_mem(ocl_device *d, cl_mem mem, ocl_ctx **out)
{
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    if (n == 1 || !mem) {
        *out = &d->ctxs[0];
        return KVHAL_OK;
    }
    cl_context c;
    cl_int err = clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof c, &c, NULL);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clGetMemObjectInfo(CL_MEM_CONTEXT)", d->index);
    for (int i = 0; i < n; i++) {
        if (d->ctxs[i].ctx == c) {
            *out = &d->ctxs[i];
            return KVHAL_OK;
        }
    }
    return OCL_SET_ERROR(d->m, KVHAL_INVALID_ARGUMENT,
                         "opencl:%d: cl_mem %p lives in a cl_context this device was never given (wrap it with "
                         "kvhal_buffer_wrap first)",
                         d->index, (void *)mem);
}

/* The entry of ctx on d, added (with a queue and an error flag of its own) when the caller brings a context of
 * theirs that holds d. */
static kvhal_status ctx_register(ocl_device *d, cl_context ctx, ocl_ctx **out)
{
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        if (d->ctxs[i].ctx == ctx) {
            *out = &d->ctxs[i];
            return KVHAL_OK;
        }
    }
    kvhal_status st = KVHAL_OK;
    pthread_mutex_lock(&d->mu);
    n = atomic_load_explicit(&d->nctx, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        if (d->ctxs[i].ctx == ctx) {
            *out = &d->ctxs[i];
            pthread_mutex_unlock(&d->mu);
            return KVHAL_OK;
        }
    }
    cl_uint nd = 0;
    cl_device_id *ds = NULL;
    size_t bytes = 0;
    cl_int err = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, 0, NULL, &bytes);
    if (err == CL_SUCCESS) {
        ds = malloc(bytes ? bytes : 1);
        if (!ds) err = CL_OUT_OF_HOST_MEMORY;
        else err = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, bytes, ds, NULL);
    }
    if (err != CL_SUCCESS) {
        st = kvhal__ocl_fail(d->m, err, "opencl:%d: clGetContextInfo(CL_CONTEXT_DEVICES)", d->index);
    } else {
        nd = (cl_uint)(bytes / sizeof *ds);
        bool has = false;
        for (cl_uint i = 0; i < nd; i++) has = has || ds[i] == d->id;
        if (!has)
            st = OCL_SET_ERROR(d->m, KVHAL_DEVICE_MISMATCH,
                               "opencl:%d: the object's cl_context does not hold device '%s'",
                               d->index, d->name);
        else if (n >= OCL_MAX_CTX)
            st = OCL_SET_ERROR(d->m, KVHAL_UNSUPPORTED, "opencl:%d: more than %d cl_contexts in use on one device",
                               d->index, OCL_MAX_CTX);
    }
    free(ds);
    if (st == KVHAL_OK) {
        err = clRetainContext(ctx);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(d->m, err, "clRetainContext");
    }
    if (st == KVHAL_OK) {
        st = kvhal__ocl_ctx_entry_make(d, ctx, &d->ctxs[n]);
        if (st != KVHAL_OK) clReleaseContext(ctx);
    }
    if (st == KVHAL_OK) {
        *out = &d->ctxs[n];
        atomic_store_explicit(&d->nctx, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

kvhal_status kvhal__ocl_resolve(ocl_device *d, void *stream, cl_mem mem, cl_command_queue *q, ocl_ctx **ce)
{
    if (stream) {
        ocl_stream *s = stream;
        if (mem && atomic_load_explicit(&d->nctx, memory_order_acquire) > 1) {
            ocl_ctx *mc;
            kvhal_status st = kvhal__ocl_ctx_of_mem(d, mem, &mc);
            if (st != KVHAL_OK) return st;
            if (mc != s->ce)
                return OCL_SET_ERROR(d->m, KVHAL_DEVICE_MISMATCH,
                                     "s: the stream's cl_command_queue and the buffer belong to different cl_contexts");
        }
        *q = s->queue;
        *ce = s->ce;
        atomic_fetch_add_explicit(&s->submitted, 1, memory_order_relaxed);
        return KVHAL_OK;
    }
    ocl_ctx *c;
    kvhal_status st = kvhal__ocl_ctx_of_mem(d, mem, &c);
    if (st != KVHAL_OK) return st;
    *q = c->queue;
    *ce = c;
    return KVHAL_OK;
}

/* ---- buffers ---- */
/* ---- the buffer pool ----
 * A kv-cache duplicate, or any engine that allocates and frees buffers of one size again and again, would pay for
 * a fresh allocation every time: clCreateBuffer, the runtime's deferred allocation at first use (for a GPU, device
 * memory mapped and cleared for the process) and the first-touch round trip below, which also waits for the
 * default queue to drain. That is what held a full-length duplicate at about half of a device copy on NVIDIA's
 * OpenCL although the copy itself is one clEnqueueCopyBuffer. So kvhal_buffer_destroy keeps the buffer (up to
 * OCL_POOL_MAX of them and 1/16 of the device's global memory, the oldest dropped first) and kvhal_buffer_create
 * of the same size takes it back, as the CUDA/HIP backends' stream-ordered pool does. Safe because the API
 * requires work using a buffer to be finished (or queued on the in-order default queue) before it is destroyed;
 * contents of a created buffer are undefined. A failed allocation releases the pool and tries once more. */
static cl_mem pool_take(ocl_device *d, size_t bytes)
{
    cl_mem m = NULL;
    pthread_mutex_lock(&d->mu);
    for (int32_t i = d->pool_n - 1; i >= 0; i--) { /* the newest first: the likeliest to be warm */
        if (d->pool_size[i] != bytes) continue;
        m = d->pool[i];
        memmove(&d->pool[i], &d->pool[i + 1], (size_t)(d->pool_n - 1 - i) * sizeof d->pool[0]);
        memmove(&d->pool_size[i], &d->pool_size[i + 1], (size_t)(d->pool_n - 1 - i) * sizeof d->pool_size[0]);
        d->pool_n--;
        d->pool_bytes -= bytes;
        d->pool_hits++;
        break;
    }
    pthread_mutex_unlock(&d->mu);
    return m;
}

/* Keeps m (bytes long) in the pool, dropping the oldest entries to make room; false when it cannot be kept. */
static bool pool_put(ocl_device *d, cl_mem m, size_t bytes)
{
    cl_mem drop[OCL_POOL_MAX];
    int32_t ndrop = 0;
    bool kept = false;
    pthread_mutex_lock(&d->mu);
    if (bytes <= d->pool_cap) {
        while (d->pool_n > 0 && (d->pool_n == OCL_POOL_MAX || d->pool_bytes + bytes > d->pool_cap)) {
            drop[ndrop++] = d->pool[0];
            d->pool_bytes -= d->pool_size[0];
            memmove(&d->pool[0], &d->pool[1], (size_t)(d->pool_n - 1) * sizeof d->pool[0]);
            memmove(&d->pool_size[0], &d->pool_size[1], (size_t)(d->pool_n - 1) * sizeof d->pool_size[0]);
            d->pool_n--;
        }
        d->pool[d->pool_n] = m;
        d->pool_size[d->pool_n] = bytes;
        d->pool_n++;
        d->pool_bytes += bytes;
        kept = true;
    }
    pthread_mutex_unlock(&d->mu);
    for (int32_t i = 0; i < ndrop; i++) clReleaseMemObject(drop[i]);
    return kept;
}

int32_t kvhal__ocl_pool_release(ocl_device *d)
{
    cl_mem drop[OCL_POOL_MAX];
    pthread_mutex_lock(&d->mu);
    const int32_t n = d->pool_n;
    memcpy(drop, d->pool, (size_t)n * sizeof drop[0]);
    d->pool_n = 0;
    d->pool_bytes = 0;
    pthread_mutex_unlock(&d->mu);
    for (int32_t i = 0; i < n; i++) clReleaseMemObject(drop[i]);
    return n;
}

/* clCreateBuffer and a first touch; *what names the step that failed. */
static cl_int create_touched(ocl_device *d, size_t bytes, cl_mem *out, const char **what)
{
    cl_int err;
    *what = "clCreateBuffer";
    int fail = atomic_load(&d->fail_creates);
    while (fail > 0 && !atomic_compare_exchange_weak(&d->fail_creates, &fail, fail - 1)) {
    }
    if (fail > 0) return CL_MEM_OBJECT_ALLOCATION_FAILURE; /* kvhal_opencl_test_pool's simulated failure */
    cl_mem m = clCreateBuffer(d->ctxs[0].ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) return err;
    /* OpenCL allocates lazily, at first use; touching one byte now makes an allocation failure show here rather
     * than in a later, unrelated operation. */
    *what = "first touch";
    cl_uchar zero = 0;
    cl_event ev;
    err = clEnqueueFillBuffer(d->ctxs[0].queue, m, &zero, 1, 0, 1, 0, NULL, &ev);
    if (err == CL_SUCCESS) {
        err = clWaitForEvents(1, &ev);
        cl_int status = CL_COMPLETE;
        if (err == CL_SUCCESS)
            err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
        if (err == CL_SUCCESS && status < 0) err = status;
        clReleaseEvent(ev);
    }
    if (err != CL_SUCCESS) {
        clReleaseMemObject(m);
        return err == CL_OUT_OF_RESOURCES ? CL_MEM_OBJECT_ALLOCATION_FAILURE : err;
    }
    *out = m;
    return CL_SUCCESS;
}

kvhal_status kvhal__ocl_buffer_alloc(void *ctx, int32_t id, size_t bytes, void **native)
{
    OCL_GET_DEVICE(ctx, id, d);
    if (kvhal__ocl_alloc_refused(d->m))
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY,
                             "opencl:%d: allocation of %zu bytes failed (fault injection)", id,
                             bytes);
    /* A 32-bit device addresses less than 4 GiB; kernels take offsets as ulong but add them to its pointers. */
    if (d->address_bits < 64 && (uint64_t)bytes >= (uint64_t)1 << d->address_bits)
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY,
                             "bytes: %zu exceeds the %u-bit address space of opencl:%d ('%s')",
                             bytes, d->address_bits, id, d->name);
    if (bytes > d->max_alloc)
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY,
                             "bytes: %zu exceeds the largest single allocation of opencl:%d ('%s'): "
                             "CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu",
                             bytes, id, d->name, (unsigned long long)d->max_alloc);
    cl_mem m = pool_take(d, bytes);
    if (m) {
        *native = m;
        return KVHAL_OK;
    }
    const char *what;
    cl_int err = create_touched(d, bytes, &m, &what);
    if ((err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
         err == CL_OUT_OF_HOST_MEMORY) &&
        kvhal__ocl_pool_release(d) > 0) /* the memory the pool held may be what was missing */
        err = create_touched(d, bytes, &m, &what);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: %s of a %zu-byte buffer", id, what, bytes);
    *native = m;
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_buffer_free(void *ctx, int32_t id, void *native)
{
    OCL_GET_DEVICE(ctx, id, d);
    cl_mem m = (cl_mem)native;
    size_t bytes = 0;
    /* kept for a later create of its size; otherwise released: deletion waits for commands still using the
     * buffer (OpenCL defers it) */
    if (!kvhal__ocl_finalizing() && clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof bytes, &bytes, NULL) == CL_SUCCESS &&
        pool_put(d, m, bytes))
        return KVHAL_OK;
    cl_int err = clReleaseMemObject(m);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clReleaseMemObject", id);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_buffer_wrap(void *ctx, int32_t id, void *native, size_t bytes)
{
    OCL_GET_DEVICE(ctx, id, d);
    cl_mem m = (cl_mem)native;
    size_t size = 0;
    cl_context mctx;
    cl_mem_object_type type;
    cl_int err = clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof type, &type, NULL);
    if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof mctx, &mctx, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err, "native: %p is not a usable cl_mem (clGetMemObjectInfo)", native);
    if (type != CL_MEM_OBJECT_BUFFER)
        return OCL_SET_ERROR(d->m, KVHAL_INVALID_ARGUMENT,
                             "native: cl_mem %p is an image or pipe, not a buffer", native);
    if (bytes > size)
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_RANGE,
                             "bytes: %zu exceeds the %zu bytes of cl_mem %p", bytes, size, native);
    ocl_ctx *ce;
    kvhal_status st = ctx_register(d, mctx, &ce);
    if (st != KVHAL_OK) return st;
    err = clRetainMemObject(m);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clRetainMemObject", id);
    return KVHAL_OK;
}

/* Drops the reference buffer_wrap took, as buffer_free drops the one buffer_alloc made. */
kvhal_status kvhal__ocl_buffer_unwrap(void *ctx, int32_t id, void *native)
{
    OCL_GET_DEVICE(ctx, id, d);
    /* the caller's cl_mem: the reference wrap took is given back, never kept in the pool */
    cl_int err = clReleaseMemObject((cl_mem)native);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clReleaseMemObject", id);
    return KVHAL_OK;
}

/* ---- streams ---- */
static void stream_link(ocl_device *d, ocl_stream *s)
{
    pthread_mutex_lock(&d->mu);
    s->prev = NULL;
    s->next = d->streams;
    if (d->streams) d->streams->prev = s;
    d->streams = s;
    pthread_mutex_unlock(&d->mu);
}

static void stream_unlink(ocl_device *d, ocl_stream *s)
{
    pthread_mutex_lock(&d->mu);
    if (s->prev) s->prev->next = s->next;
    else d->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&d->mu);
}

kvhal_status kvhal__ocl_stream_create(void *ctx, int32_t id, void **stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    ocl_stream *s = kvhal__ocl_malloc(d->m, sizeof *s);
    if (!s) return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a stream failed", id);
    cl_int err;
    s->queue = clCreateCommandQueue(d->ctxs[0].ctx, d->id, 0, &err); /* in order */
    if (err != CL_SUCCESS) {
        free(s);
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clCreateCommandQueue", id);
    }
    s->ce = &d->ctxs[0];
    s->dev = id;
    atomic_init(&s->submitted, 0);
    s->query_ev = NULL;
    s->query_seq = 0;
    stream_link(d, s);
    *stream = s;
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_stream_wrap(void *ctx, int32_t id, void *native, void **stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    /* The default streams (NULL, KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD) are the device's default queue. */
    if (!native || native == KVHAL_STREAM_LEGACY || native == KVHAL_STREAM_PER_THREAD) native = d->ctxs[0].queue;
    cl_command_queue q = (cl_command_queue)native;
    cl_device_id qd;
    cl_context qc;
    cl_int err = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof qd, &qd, NULL);
    if (err == CL_SUCCESS) err = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof qc, &qc, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err,
                               "native: %p is not a usable cl_command_queue (clGetCommandQueueInfo)", native);
    if (qd != d->id) {
        char name[256];
        kvhal__ocl_device_str(qd, CL_DEVICE_NAME, name, sizeof name);
        return OCL_SET_ERROR(d->m, KVHAL_DEVICE_MISMATCH,
                             "native: the queue runs on '%s', not on opencl:%d ('%s')", name,
                             id, d->name);
    }
    ocl_ctx *ce;
    kvhal_status st = ctx_register(d, qc, &ce);
    if (st != KVHAL_OK) return st;
    ocl_stream *s = kvhal__ocl_malloc(d->m, sizeof *s);
    if (!s) return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a stream failed", id);
    err = clRetainCommandQueue(q);
    if (err != CL_SUCCESS) {
        free(s);
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clRetainCommandQueue", id);
    }
    s->queue = q;
    s->ce = ce;
    s->dev = id;
    atomic_init(&s->submitted, 0);
    s->query_ev = NULL;
    s->query_seq = 0;
    stream_link(d, s);
    *stream = s;
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_stream_destroy(void *ctx, int32_t id, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    ocl_stream *s = stream;
    if (!s) return KVHAL_OK;
    stream_unlink(d, s);
    if (s->query_ev) clReleaseEvent(s->query_ev);
    /* Our reference only: an owned queue goes away (after its commands finish), a wrapped one stays the caller's. */
    cl_int err = clReleaseCommandQueue(s->queue);
    free(s);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clReleaseCommandQueue", id);
    return KVHAL_OK;
}

static kvhal_status finish_default(ocl_device *d)
{
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int c = 0; c < n; c++) {
        cl_int err = clFinish(d->ctxs[c].queue);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clFinish", d->index);
    }
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_stream_synchronize(void *ctx, int32_t id, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    if (!stream) return finish_default(d);
    cl_int err = clFinish(((ocl_stream *)stream)->queue);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clFinish", id);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_stream_query(void *ctx, int32_t id, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    if (!stream) return finish_default(d);
    ocl_stream *s = stream;
    const uint64_t seq = atomic_load_explicit(&s->submitted, memory_order_relaxed);
    cl_int err = CL_SUCCESS;
    if (!s->query_ev || s->query_seq != seq) { /* work submitted since the last query's marker: a new marker */
        cl_event ev;
        err = clEnqueueMarkerWithWaitList(s->queue, 0, NULL, &ev);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueMarkerWithWaitList", id);
        if (s->query_ev) clReleaseEvent(s->query_ev);
        s->query_ev = ev;
        s->query_seq = seq;
        err = clFlush(s->queue);
    }
    cl_int state = CL_QUEUED;
    if (err == CL_SUCCESS)
        err = clGetEventInfo(s->query_ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: stream query", id);
    if (state < 0) return kvhal__ocl_fail(d->m, state, "opencl:%d: work on the stream failed", id);
    return state == CL_COMPLETE ? KVHAL_OK : KVHAL_BUSY;
}

/* ---- copies ---- */
kvhal_status kvhal__ocl_memcpy_h2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes,
                                   void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(d, stream, (cl_mem)dst, &q, &ce);
    if (st != KVHAL_OK) return st;
    cl_int err = clEnqueueWriteBuffer(q, (cl_mem)dst, CL_TRUE, dst_off, bytes, src, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueWriteBuffer(offset %zu, %zu bytes)", id, dst_off, bytes);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_memcpy_d2h(void *ctx, int32_t id, void *dst, const void *src, size_t src_off, size_t bytes,
                                   void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(d, stream, (cl_mem)src, &q, &ce);
    if (st != KVHAL_OK) return st;
    cl_int err = clEnqueueReadBuffer(q, (cl_mem)src, CL_TRUE, src_off, bytes, dst, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueReadBuffer(offset %zu, %zu bytes)", id, src_off, bytes);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_copy(ocl_device *d, cl_command_queue q, ocl_ctx *ce, cl_mem dst, size_t dst_off, cl_mem src,
                             size_t src_off, size_t bytes)
{
    if (bytes == 0 || (dst == src && dst_off == src_off)) return KVHAL_OK;
    cl_int err;
    if (dst == src && dst_off < src_off + bytes && src_off < dst_off + bytes) {
        /* clEnqueueCopyBuffer refuses overlapping ranges; go through a temporary buffer (memmove semantics). */
        if (kvhal__ocl_alloc_refused(d->m))
            return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY,
                                 "opencl:%d: temporary buffer of %zu bytes (fault injection)",
                                 d->index, bytes);
        cl_mem tmp = clCreateBuffer(ce->ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        if (err != CL_SUCCESS)
            return kvhal__ocl_fail(d->m, err, "opencl:%d: clCreateBuffer(temporary, %zu bytes)", d->index,
                                   bytes);
        err = clEnqueueCopyBuffer(q, src, tmp, src_off, 0, bytes, 0, NULL, NULL);
        if (err == CL_SUCCESS) err = clEnqueueCopyBuffer(q, tmp, dst, 0, dst_off, bytes, 0, NULL, NULL);
        clReleaseMemObject(tmp); /* freed once the copies are done */
    } else {
        err = clEnqueueCopyBuffer(q, src, dst, src_off, dst_off, bytes, 0, NULL, NULL);
    }
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueCopyBuffer(src offset %zu, dst offset %zu, %zu bytes)",
                               d->index, src_off, dst_off, bytes);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_memcpy_d2d(void *ctx, int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off,
                                   size_t bytes, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(d, stream, (cl_mem)dst, &q, &ce);
    if (st != KVHAL_OK) return st;
    return kvhal__ocl_copy(d, q, ce, (cl_mem)dst, dst_off, (cl_mem)src, src_off, bytes);
}

kvhal_status kvhal__ocl_memcpy_peer(void *ctx, int32_t dst_id, void *dst, size_t dst_off, int32_t src_id,
                                    const void *src, size_t src_off, size_t bytes, void *stream)
{
    OCL_GET_DEVICE(ctx, dst_id, dd);
    OCL_GET_DEVICE(ctx, src_id, sd);
    ocl_module *m = ctx;
    ocl_stream *s = stream;
    if (s) atomic_fetch_add_explicit(&s->submitted, 1, memory_order_relaxed);
    ocl_ctx *dc, *sc;
    kvhal_status st = kvhal__ocl_ctx_of_mem(dd, (cl_mem)dst, &dc);
    if (st == KVHAL_OK) st = kvhal__ocl_ctx_of_mem(sd, (cl_mem)src, &sc);
    if (st != KVHAL_OK) return st;
    if (dc->ctx == sc->ctx) {
        /* One context holds both: the runtime moves the data between its devices. */
        cl_command_queue q = s && s->ce->ctx == dc->ctx ? s->queue : dc->queue;
        return kvhal__ocl_copy(dd, q, dc, (cl_mem)dst, dst_off, (cl_mem)src, src_off, bytes);
    }
    /* Different platforms: through a bounded host buffer, each side on the stream if it is that side's. */
    cl_command_queue sq = s && s->dev == src_id && s->ce == sc ? s->queue : sc->queue;
    cl_command_queue dq = s && s->dev == dst_id && s->ce == dc ? s->queue : dc->queue;
    size_t chunk = bytes < ((size_t)16 << 20) ? bytes : ((size_t)16 << 20);
    unsigned char *tmp = kvhal__ocl_malloc(m, chunk);
    if (!tmp) return OCL_SET_ERROR(m, KVHAL_OUT_OF_MEMORY, "peer copy: %zu-byte host bounce buffer", chunk);
    cl_int err = CL_SUCCESS;
    const char *what = "clEnqueueReadBuffer";
    for (size_t done = 0; done < bytes && err == CL_SUCCESS; done += chunk) {
        size_t n = bytes - done < chunk ? bytes - done : chunk;
        err = clEnqueueReadBuffer(sq, (cl_mem)src, CL_TRUE, src_off + done, n, tmp, 0, NULL, NULL);
        if (err == CL_SUCCESS) {
            what = "clEnqueueWriteBuffer";
            err = clEnqueueWriteBuffer(dq, (cl_mem)dst, CL_TRUE, dst_off + done, n, tmp, 0, NULL, NULL);
        }
    }
    free(tmp);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(m, err, "opencl:%d -> opencl:%d: staged copy of %zu bytes: %s", src_id, dst_id, bytes,
                               what);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_memset(void *ctx, int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(d, stream, (cl_mem)dst, &q, &ce);
    if (st != KVHAL_OK) return st;
    cl_uchar v = (cl_uchar)value;
    cl_int err = clEnqueueFillBuffer(q, (cl_mem)dst, &v, 1, off, bytes, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueFillBuffer(offset %zu, %zu bytes)", id, off, bytes);
    return KVHAL_OK;
}

/* ---- synchronize and the device-side error flag ---- */
static kvhal_status finish_all(ocl_device *d)
{
    kvhal_status st = finish_default(d);
    if (st != KVHAL_OK) return st;
    pthread_mutex_lock(&d->mu);
    for (ocl_stream *s = d->streams; s && st == KVHAL_OK; s = s->next) {
        cl_int err = clFinish(s->queue);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(d->m, err, "opencl:%d: clFinish (stream)", d->index);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

static kvhal_status read_and_clear_flags(ocl_device *d)
{
    bool fault = false;
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int c = 0; c < n; c++) {
        ocl_ctx *e = &d->ctxs[c];
        cl_int v = 0;
        cl_int err = clEnqueueReadBuffer(e->queue, e->err_flag, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: reading the error flag", d->index);
        if (v) {
            cl_int zero = 0;
            err = clEnqueueWriteBuffer(e->queue, e->err_flag, CL_TRUE, 0, sizeof zero, &zero, 0, NULL, NULL);
            if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clearing the error flag", d->index);
            fault = true;
        }
    }
    if (fault)
        return OCL_SET_ERROR(d->m, KVHAL_DEVICE_FAULT,
                             "opencl:%d: a kernel skipped an out-of-range index (a slot past the end of the cache) "
                             "since the last check; nothing was written for it",
                             d->index);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_synchronize(void *ctx, int32_t id)
{
    OCL_GET_DEVICE(ctx, id, d);
    kvhal_status st = finish_all(d);
    if (st != KVHAL_OK) return st;
    return read_and_clear_flags(d);
}

/* Finishes one queue only; the flags are read through the default queues once that queue's kernels are done. */
kvhal_status kvhal__ocl_stream_check_errors(void *ctx, int32_t id, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    kvhal_status st = kvhal__ocl_stream_synchronize(ctx, id, stream);
    if (st != KVHAL_OK) return st;
    return read_and_clear_flags(d);
}

kvhal_status kvhal__ocl_check_errors(void *ctx, int32_t id)
{
    /* The flag can only be read after the kernels that might set it, on any queue, are done. */
    return kvhal__ocl_synchronize(ctx, id);
}


/* ---- events ----
 * An event is one marker per queue it was recorded on: a stream's queue, or for the default stream every context's
 * default queue (the default stream is all of them, as stream_synchronize(NULL) finishes all). A marker is flushed
 * when made, so that it completes without another call. A wait on a queue of the marker's context is a barrier
 * with the marker in its wait list; a marker of another cl_context cannot be waited on by a queue, so the host waits
 * for it (the event of a stream made on one context and a wait on a queue of another). */
typedef struct ocl_event {
    int n;
    cl_event ev[OCL_MAX_CTX];
    ocl_ctx *ce[OCL_MAX_CTX];
} ocl_event;

static void event_clear(ocl_event *e)
{
    for (int i = 0; i < e->n; i++) clReleaseEvent(e->ev[i]);
    e->n = 0;
}

kvhal_status kvhal__ocl_event_create(void *ctx, int32_t id, void **ev)
{
    OCL_GET_DEVICE(ctx, id, d);
    ocl_event *e = kvhal__ocl_malloc(d->m, sizeof *e);
    if (!e) return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for an event failed", id);
    e->n = 0;
    *ev = e;
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_event_destroy(void *ctx, int32_t id, void *ev)
{
    (void)ctx;
    (void)id;
    event_clear(ev);
    free(ev);
    return KVHAL_OK;
}

static kvhal_status mark(ocl_device *d, ocl_event *e, cl_command_queue q, ocl_ctx *ce)
{
    cl_event m;
    cl_int err = clEnqueueMarkerWithWaitList(q, 0, NULL, &m);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueMarkerWithWaitList", d->index);
    e->ev[e->n] = m;
    e->ce[e->n++] = ce;
    err = clFlush(q);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clFlush", d->index);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_event_record(void *ctx, int32_t id, void *ev, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    ocl_event *e = ev;
    event_clear(e);
    if (stream) return mark(d, e, ((ocl_stream *)stream)->queue, ((ocl_stream *)stream)->ce);
    const int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int c = 0; c < n; c++) {
        kvhal_status st = mark(d, e, d->ctxs[c].queue, &d->ctxs[c]);
        if (st != KVHAL_OK) return st;
    }
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_event_query(void *ctx, int32_t id, void *ev)
{
    OCL_GET_DEVICE(ctx, id, d);
    const ocl_event *e = ev;
    for (int i = 0; i < e->n; i++) {
        cl_int state = CL_QUEUED;
        cl_int err = clGetEventInfo(e->ev[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: event query", id);
        if (state < 0) return kvhal__ocl_fail(d->m, state, "opencl:%d: work before the event failed", id);
        if (state != CL_COMPLETE) return KVHAL_BUSY;
    }
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_event_synchronize(void *ctx, int32_t id, void *ev)
{
    OCL_GET_DEVICE(ctx, id, d);
    const ocl_event *e = ev;
    cl_int err = CL_SUCCESS; /* one marker at a time: a wait list may not mix cl_contexts */
    for (int i = 0; i < e->n && err == CL_SUCCESS; i++) err = clWaitForEvents(1, &e->ev[i]);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clWaitForEvents", id);
    return KVHAL_OK;
}

/* The markers of e that queue q (of context ce) can wait on go into its wait list; the others are waited for here. */
static kvhal_status wait_on(ocl_device *d, const ocl_event *e, cl_command_queue q, const ocl_ctx *ce)
{
    cl_event same[OCL_MAX_CTX];
    cl_uint n = 0;
    for (int i = 0; i < e->n; i++) {
        if (e->ce[i] == ce) {
            same[n++] = e->ev[i];
            continue;
        }
        cl_int err = clWaitForEvents(1, &e->ev[i]);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clWaitForEvents", d->index);
    }
    if (!n) return KVHAL_OK;
    cl_int err = clEnqueueBarrierWithWaitList(q, n, same, NULL);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueBarrierWithWaitList", d->index);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_stream_wait_event(void *ctx, int32_t id, void *stream, void *ev)
{
    OCL_GET_DEVICE(ctx, id, d);
    const ocl_event *e = ev;
    if (stream) return wait_on(d, e, ((ocl_stream *)stream)->queue, ((ocl_stream *)stream)->ce);
    const int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int c = 0; c < n; c++) {
        kvhal_status st = wait_on(d, e, d->ctxs[c].queue, &d->ctxs[c]);
        if (st != KVHAL_OK) return st;
    }
    return KVHAL_OK;
}

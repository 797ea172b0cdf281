/* ocl_page_transfer.c — page_transfer on OpenCL: non-blocking buffer reads and writes on the stream's queue. When
 * every cache lies in one cl_mem at evenly spaced offsets (a paged cache's K and V of every layer, layer-first) a
 * page is one rectangular copy (rows: the caches' blocks, host rows packed); otherwise one copy per cache and page.
 * No kernel and no descriptor. */
#include <stdio.h>

#include "ocl_internal.h"

bool ocl_page_transfer_supports(const ocl_device *d, const kvhal_bk_page_transfer *a, char *reason,
                                size_t reason_size)
{
    (void)d;
    if (a->num_caches < 1 || a->num_pairs < 0 || a->block_bytes < 0)
        return kvhal_bk_refuse(reason, reason_size, "page_transfer of %d caches and %d pairs", (int)a->num_caches,
                               (int)a->num_pairs);
    return true;
}

kvhal_status ocl_page_transfer_desc_create(ocl_device *d, const kvhal_bk_page_transfer *a, void **desc)
{
    (void)d;
    (void)a;
    *desc = NULL; /* nothing to plan: the copies are the runtime's */
    return KVHAL_OK;
}

void ocl_page_transfer_desc_destroy(ocl_device *d, void *desc)
{
    (void)d;
    (void)desc;
}

/* The spacing of the caches' block 0 when all lie in one buffer at evenly spaced offsets (>= a block apart, so
 * that rows do not overlap), else 0. */
static size_t even_pitch(const kvhal_bk_page_transfer *a)
{
    if (a->num_caches == 1) return (size_t)a->block_bytes;
    if (a->offsets[1] <= a->offsets[0]) return 0;
    const size_t pitch = a->offsets[1] - a->offsets[0];
    if (pitch < (size_t)a->block_bytes) return 0;
    for (int32_t c = 1; c < a->num_caches; c++)
        if (a->natives[c] != a->natives[0] || a->offsets[c] != a->offsets[0] + (size_t)c * pitch ||
            a->block_strides[c] != a->block_strides[0])
            return 0;
    return pitch;
}

kvhal_status ocl_page_transfer(void *ctx, int32_t id, void *desc, const kvhal_bk_page_transfer *a, void *stream)
{
    (void)desc;
    OCL_GET_DEVICE(ctx, id, d);
    if (a->num_pairs <= 0 || a->block_bytes <= 0) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(d, stream, (cl_mem)a->natives[0], &q, &ce);
    if (st != KVHAL_OK) return st;
    const size_t bytes = (size_t)a->block_bytes;
    const size_t pitch = even_pitch(a);
    char *host = (char *)a->host + a->host_offset;
    for (int32_t p = 0; p < a->num_pairs; p++) {
        char *page = host + a->pairs[2 * p + 1] * a->host_page_bytes;
        const int64_t blk = a->pairs[2 * p];
        if (pitch) {
            cl_mem mem = (cl_mem)a->natives[0];
            const size_t origin[3] = {a->offsets[0] + (size_t)(blk * a->block_strides[0]), 0, 0};
            const size_t host_origin[3] = {0, 0, 0};
            const size_t region[3] = {bytes, (size_t)a->num_caches, 1};
            cl_int err = a->to_host
                             ? clEnqueueReadBufferRect(q, mem, CL_FALSE, origin, host_origin, region, pitch, 0, bytes,
                                                       0, page, 0, NULL, NULL)
                             : clEnqueueWriteBufferRect(q, mem, CL_FALSE, origin, host_origin, region, pitch, 0, bytes,
                                                        0, page, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                return kvhal__ocl_fail(d->m, err, "opencl:%d: page_transfer: %s of page %d", id,
                                       a->to_host ? "clEnqueueReadBufferRect" : "clEnqueueWriteBufferRect", (int)p);
            continue;
        }
        for (int32_t c = 0; c < a->num_caches; c++) {
            cl_mem mem = (cl_mem)a->natives[c];
            cl_command_queue qc = q;
            if (mem != (cl_mem)a->natives[0]) {
                st = kvhal__ocl_resolve(d, stream, mem, &qc, &ce);
                if (st != KVHAL_OK) return st;
            }
            const size_t off = a->offsets[c] + (size_t)(blk * a->block_strides[c]);
            char *h = page + (size_t)c * bytes;
            cl_int err = a->to_host ? clEnqueueReadBuffer(qc, mem, CL_FALSE, off, bytes, h, 0, NULL, NULL)
                                    : clEnqueueWriteBuffer(qc, mem, CL_FALSE, off, bytes, h, 0, NULL, NULL);
            if (err != CL_SUCCESS)
                return kvhal__ocl_fail(d->m, err, "opencl:%d: page_transfer: %s of page %d, cache %d", id,
                                       a->to_host ? "clEnqueueReadBuffer" : "clEnqueueWriteBuffer", (int)p, (int)c);
        }
    }
    cl_int err = clFlush(q);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: page_transfer: clFlush", id);
    return KVHAL_OK;
}

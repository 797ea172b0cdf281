/* ocl_copy_blocks.c — copy_blocks and copy_batch on OpenCL. copy_blocks' plan, made once per descriptor: the
 * work-items each cache's block takes with each unit kernel (copy_blocks_16/_4/_1: 16-, 4- or 1-byte units, so many
 * units per work-item on CPU devices, one on GPUs) and the metadata half of the device table (block strides and
 * sizes). A call adds its offsets and buffers, uploads pairs and table into a device buffer the descriptor keeps
 * from call to call, and launches over up to CB_NBUF distinct buffers at a time. copy_batch is a list of copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

#define CB_NBUF 16
enum { CB_NK = 3 };
static const char *const cb_knames[CB_NK] = {"copy_blocks_16", "copy_blocks_4", "copy_blocks_1"};
static const uint64_t cb_units[CB_NK] = {16, 4, 1};

typedef struct cb_desc {
    ocl_desc base;
    int32_t num_caches;
    int32_t group;     /* units per work-item */
    uint64_t align;    /* every block stride and size OR-ed: with the offsets, it picks the unit kernel */
    cl_ulong *table;   /* 4 words per cache: [buffer index, offset, block stride, block bytes]; the last two set */
    uint64_t *items;   /* work-items per block, CB_NK per cache */
    /* the device copy of pairs and table, reused from call to call */
    cl_mem meta;
    size_t meta_cap;
    cl_context meta_ctx;
    cl_event meta_last_use; /* completes when the last launch reading meta is done */
} cb_desc;

static uint64_t block_items(uint64_t block_bytes, uint64_t unit, int32_t group)
{
    return (block_bytes / unit + (uint64_t)group - 1) / (uint64_t)group;
}

/* Units per work-item: 16 consecutive ones on CPU devices, 4 interleaved ones on GPUs (copy_blocks.cl). */
static int32_t cb_group_of(const ocl_device *d) { return kvhal__ocl_cpu_plans(d) ? 16 : 4; }

/* The widest unit kernel the block strides and sizes allow (offsets may narrow it further per call). */
static int widest_kernel(uint64_t align) { return align % 16 == 0 ? 0 : align % 4 == 0 ? 1 : 2; }

bool ocl_copy_blocks_supports(const ocl_device *d, const kvhal_bk_copy_blocks *a, char *reason, size_t reason_size)
{
    if (a->num_caches < 0 || a->num_pairs < 0)
        return kvhal_bk_refuse(reason, reason_size, "copy_blocks of %d caches and %d pairs", (int)a->num_caches,
                                 (int)a->num_pairs);
    const int32_t group = cb_group_of(d);
    uint64_t align = 0;
    for (int32_t c = 0; c < a->num_caches; c++) align |= (uint64_t)a->block_strides[c] | (uint64_t)a->block_bytes[c];
    const int ki = widest_kernel(align);
    for (int32_t c = 0; c < a->num_caches; c++) {
        uint64_t n = block_items((uint64_t)a->block_bytes[c], cb_units[ki], group);
        if (n > OCL_MAX_ITEMS)
            return kvhal_bk_refuse(reason, reason_size, "copy_blocks: a block of %lld bytes takes %llu work-items, "
                                     "more than one launch (%llu) on '%s'", (long long)a->block_bytes[c],
                                     (unsigned long long)n, (unsigned long long)OCL_MAX_ITEMS, d->name);
    }
    return true;
}

kvhal_status ocl_copy_blocks_desc_create(ocl_device *d, const kvhal_bk_copy_blocks *a, void **out)
{
    cb_desc *cd;
    kvhal_status st = kvhal__ocl_desc_alloc(d, KVHAL_BK_OP_COPY_BLOCKS, sizeof *cd, (void **)&cd);
    if (st != KVHAL_OK) return st;
    const size_t nc = a->num_caches > 0 ? (size_t)a->num_caches : 0;
    cd->num_caches = a->num_caches;
    cd->group = cb_group_of(d);
    cd->table = kvhal__ocl_malloc(d->m, 4 * nc * sizeof *cd->table);
    cd->items = kvhal__ocl_malloc(d->m, CB_NK * nc * sizeof *cd->items);
    if (!cd->table || !cd->items) {
        ocl_copy_blocks_desc_destroy(d, cd);
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: copy_blocks: host plan for %d caches", d->index,
                             (int)a->num_caches);
    }
    for (size_t c = 0; c < nc; c++) {
        cd->align |= (uint64_t)a->block_strides[c] | (uint64_t)a->block_bytes[c];
        cd->table[4 * c + 2] = (cl_ulong)a->block_strides[c];
        cd->table[4 * c + 3] = (cl_ulong)a->block_bytes[c];
        for (int ki = 0; ki < CB_NK; ki++)
            cd->items[CB_NK * c + (size_t)ki] = block_items((uint64_t)a->block_bytes[c], cb_units[ki], cd->group);
    }
    cd->base.knames = cb_knames;
    cd->base.nk = CB_NK;
    snprintf(cd->base.options, sizeof cd->base.options, "-DCB_GROUP=%d -DCB_INTERLEAVE=%d", cd->group,
             kvhal__ocl_cpu_plans(d) ? 0 : 1);
    cl_mem first = a->num_caches > 0 && a->natives ? (cl_mem)a->natives[0] : NULL;
    return kvhal__ocl_desc_build(d, &cd->base, first, ocl_copy_blocks_desc_destroy, out);
}

void ocl_copy_blocks_desc_destroy(ocl_device *d, void *desc)
{
    (void)d;
    cb_desc *cd = desc;
    if (!cd) return;
    if (!kvhal__ocl_finalizing()) {
        if (cd->meta_last_use) clReleaseEvent(cd->meta_last_use);
        if (cd->meta) clReleaseMemObject(cd->meta); /* deleted once the launches reading it are done */
    }
    free(cd->table);
    free(cd->items);
    kvhal__ocl_desc_free(cd);
}

static void CL_CALLBACK free_host_copy(cl_event ev, cl_int status, void *user)
{
    (void)ev;
    (void)status;
    free(user);
}

/* The caches from c0 on that one launch can take: up to CB_NBUF distinct buffers, listed in bufs. Returns the
 * first cache left for the next launch; with table, writes each cache's argument index into its entry. */
static int32_t cb_group(const kvhal_bk_copy_blocks *a, int32_t c0, cl_mem *bufs, int32_t *nbufs, cl_ulong *table)
{
    int32_t nb = 0, c = c0;
    for (; c < a->num_caches; c++) {
        cl_mem mem = (cl_mem)a->natives[c];
        int32_t j = 0;
        while (j < nb && bufs[j] != mem) j++;
        if (j == nb) {
            if (nb == CB_NBUF) break;
            bufs[nb++] = mem;
        }
        if (table) table[4 * (size_t)c] = (cl_ulong)j;
    }
    *nbufs = nb;
    return c;
}

/* Uploads the call's pairs and cache table into the descriptor's meta buffer (grown as needed) on q: *written is
 * the write's event, which the launches wait for. */
static kvhal_status cb_upload(ocl_device *d, cb_desc *cd, const kvhal_bk_copy_blocks *a, cl_command_queue q,
                              ocl_ctx *ce, cl_event *written)
{
    const int32_t id = d->index;
    cl_int err;
    /* meta = pairs, then the cache table. The host copy lives until the (non-blocking) write has read it: an
     * event callback frees it, so the call never waits for the device. */
    const size_t nc = (size_t)a->num_caches;
    size_t words = 2 * (size_t)a->num_pairs + 4 * nc, bytes = words * sizeof(cl_ulong);
    cl_ulong *host = kvhal__ocl_malloc(d->m, bytes);
    if (!host)
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: copy_blocks: %zu-byte host table", id, bytes);
    memcpy(host, a->pairs, 2 * (size_t)a->num_pairs * sizeof(int64_t));
    cl_ulong *table = host + 2 * (size_t)a->num_pairs;
    memcpy(table, cd->table, 4 * nc * sizeof *table);
    for (size_t c = 0; c < nc; c++) table[4 * c + 1] = (cl_ulong)a->offsets[c];
    cl_mem bufs[CB_NBUF];
    int32_t nb;
    for (int32_t c0 = 0; c0 < a->num_caches;) c0 = cb_group(a, c0, bufs, &nb, table);
    if (!cd->meta || cd->meta_ctx != ce->ctx || cd->meta_cap < bytes) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        if (kvhal__ocl_alloc_refused(d->m)) {
            free(host);
            return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: copy_blocks table buffer (fault injection)",
                                 id);
        }
        cl_mem mem = clCreateBuffer(ce->ctx, CL_MEM_READ_ONLY, cap, NULL, &err);
        if (err != CL_SUCCESS) {
            free(host);
            return kvhal__ocl_fail(d->m, err, "opencl:%d: clCreateBuffer(copy_blocks table, %zu bytes)", id, cap);
        }
        if (cd->meta) clReleaseMemObject(cd->meta); /* deleted after the launches still reading it */
        if (cd->meta_last_use) clReleaseEvent(cd->meta_last_use);
        cd->meta = mem;
        cd->meta_cap = cap;
        cd->meta_ctx = ce->ctx;
        cd->meta_last_use = NULL;
    }
    /* The previous call's launches may still read meta, possibly on another queue: the write waits for them. */
    err = clEnqueueWriteBuffer(q, cd->meta, CL_FALSE, 0, bytes, host, cd->meta_last_use ? 1 : 0,
                               cd->meta_last_use ? &cd->meta_last_use : NULL, written);
    if (err != CL_SUCCESS) {
        free(host);
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueWriteBuffer(copy_blocks table, %zu bytes)", id,
                               bytes);
    }
    if (clSetEventCallback(*written, CL_COMPLETE, free_host_copy, host) != CL_SUCCESS) {
        err = clWaitForEvents(1, written);
        free(host);
        if (err != CL_SUCCESS) {
            clReleaseEvent(*written);
            return kvhal__ocl_fail(d->m, err, "opencl:%d: copy_blocks table upload", id);
        }
    }
    return KVHAL_OK;
}

kvhal_status ocl_copy_blocks(void *ctx, int32_t id, void *desc, const kvhal_bk_copy_blocks *a, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    kvhal_status st = kvhal__ocl_desc_check(d, desc, KVHAL_BK_OP_COPY_BLOCKS);
    if (st != KVHAL_OK) return st;
    cb_desc *cd = desc;
    if (a->num_caches <= 0 || a->num_pairs <= 0) return KVHAL_OK;
    if (a->num_caches != cd->num_caches)
        return OCL_SET_ERROR(d->m, KVHAL_INTERNAL, "opencl:%d: copy_blocks descriptor made for %d caches, called "
                             "with %d", id, (int)cd->num_caches, (int)a->num_caches);
    cl_command_queue q;
    ocl_ctx *ce;
    ocl_kset *ks;
    st = kvhal__ocl_resolve(d, stream, (cl_mem)a->natives[0], &q, &ce);
    if (st == KVHAL_OK) st = kvhal__ocl_kset(d, &cd->base, ce, &ks);
    if (st != KVHAL_OK) return st;

    uint64_t acc = cd->align;
    for (int32_t c = 0; c < a->num_caches; c++) acc |= (uint64_t)a->offsets[c];
    const int ki = widest_kernel(acc);

    cl_event written;
    st = cb_upload(d, cd, a, q, ce, &written);
    if (st != KVHAL_OK) return st;

    cl_mem bufs[CB_NBUF];
    int32_t nb;
    cl_int err;
    cl_event last = NULL;
    int launches = 0;
    cl_uint num_pairs = (cl_uint)a->num_pairs;
    for (int32_t c0 = 0; c0 < a->num_caches && st == KVHAL_OK;) {
        int32_t c1 = cb_group(a, c0, bufs, &nb, NULL);
        for (int32_t j = nb; j < CB_NBUF; j++) bufs[j] = bufs[0];
        uint64_t upj = 1; /* work-items per job */
        for (int32_t c = c0; c < c1; c++) {
            uint64_t n = cd->items[CB_NK * (size_t)c + (size_t)ki];
            if (n > upj) upj = n;
        }
        if (upj > OCL_MAX_ITEMS) { /* only a narrower kernel than the plan's widest (offsets) gets here */
            st = OCL_SET_ERROR(d->m, KVHAL_UNSUPPORTED, "opencl:%d: copy_blocks: a block of %llu work-items exceeds "
                               "one launch", id, (unsigned long long)upj);
            break;
        }
        cl_ulong table_off = 2 * (cl_ulong)a->num_pairs + 4 * (cl_ulong)c0;
        cl_uint units_per_job = (cl_uint)upj;
        const uint64_t jobs = (uint64_t)(c1 - c0) * num_pairs, per_launch = OCL_MAX_ITEMS / upj;
        for (uint64_t j0 = 0; j0 < jobs && st == KVHAL_OK; j0 += per_launch) {
            cl_ulong job0 = j0;
            cl_uint items = (cl_uint)((jobs - j0 < per_launch ? jobs - j0 : per_launch) * upj);
            const ocl_karg args[] = {OCL_KA(bufs[0]),  OCL_KA(bufs[1]),   OCL_KA(bufs[2]),     OCL_KA(bufs[3]),
                                     OCL_KA(bufs[4]),  OCL_KA(bufs[5]),   OCL_KA(bufs[6]),     OCL_KA(bufs[7]),
                                     OCL_KA(bufs[8]),  OCL_KA(bufs[9]),   OCL_KA(bufs[10]),    OCL_KA(bufs[11]),
                                     OCL_KA(bufs[12]), OCL_KA(bufs[13]),  OCL_KA(bufs[14]),    OCL_KA(bufs[15]),
                                     OCL_KA(cd->meta), OCL_KA(table_off), OCL_KA(num_pairs),   OCL_KA(units_per_job),
                                     OCL_KA(job0),     OCL_KA(items)};
            st = kvhal__ocl_set_args(d, ks->k[ki], cb_knames[ki], 0, args, (int)(sizeof args / sizeof args[0]));
            cl_event ev = NULL;
            if (st == KVHAL_OK) st = kvhal__ocl_launch(d, q, ks, ki, cb_knames[ki], items, 1, &written, &ev);
            if (st == KVHAL_OK) {
                if (last) clReleaseEvent(last);
                last = ev;
                launches++;
            }
        }
        c0 = c1;
    }
    clReleaseEvent(written);
    if (launches > 1 && st == KVHAL_OK) {
        /* Several launches: one marker stands for all of them (it waits for everything queued before it). */
        cl_event all;
        err = clEnqueueMarkerWithWaitList(q, 0, NULL, &all);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueMarkerWithWaitList", id);
        else {
            clReleaseEvent(last);
            last = all;
        }
    }
    if (last) {
        if (cd->meta_last_use) clReleaseEvent(cd->meta_last_use);
        cd->meta_last_use = last;
    }
    return st;
}

/* ---- copy_batch ---- */
kvhal_status ocl_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    if (a->count <= 0) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(d, stream, (cl_mem)a->dst[0], &q, &ce);
    /* Ranges that continue the previous one in both buffers go out as one copy: each clEnqueueCopyBuffer costs
     * microseconds of its own on GPU runtimes, and a full-length duplicate (every layer's K and V back to back) is
     * then a single copy of the whole cache instead of 2 x layers small ones. */
    for (int32_t i = 0; i < a->count && st == KVHAL_OK;) {
        size_t n = a->bytes[i];
        int32_t j = i + 1;
        while (j < a->count && a->dst[j] == a->dst[i] && a->src[j] == a->src[i] &&
               a->dst_offsets[j] == a->dst_offsets[i] + n && a->src_offsets[j] == a->src_offsets[i] + n &&
               (a->dst[i] != a->src[i] || a->dst_offsets[i] == a->src_offsets[i])) /* no merged overlap */
            n += a->bytes[j++];
        st = kvhal__ocl_copy(d, q, ce, (cl_mem)a->dst[i], a->dst_offsets[i], (cl_mem)a->src[i], a->src_offsets[i], n);
        i = j;
    }
    return st;
}

/* ocl_ops.c — the OpenCL backend's ops: descriptors (a built program and its kernels, specialised by -D options
 * derived from tensor metadata only), paged caching, copy_blocks, tensor_copy and copy_batch. A descriptor is
 * created on the first call with some metadata and cached by the core; it holds its kernels per cl_context it has
 * been used in (normally just one), and the programs themselves come from the module's program cache, so two
 * descriptors with the same options share one build. Offsets that vary from call to call (buffer offsets) never
 * go into options: they pick, at run time, between the wide-access kernel and the any-alignment one of a program. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

/* The .cl files use kvhal_dtype's numbering for dtypes (KV_F32 = KVHAL_F32, ...). */
_Static_assert(KVHAL_F32 == 0 && KVHAL_F16 == 1 && KVHAL_BF16 == 2 && KVHAL_FP8_E4M3 == 3 && KVHAL_FP8_E5M2 == 4,
               "kv_common.cl dtype codes");

#define MAX_KERNELS 3
#define CB_NBUF 16

#ifndef KVHAL_OCL_GPU_GROUP
#define KVHAL_OCL_GPU_GROUP 2 /* chunks per work-item of the paged-caching kernel on GPU devices (a power of two) */
#endif

typedef struct kset {
    ocl_ctx *ce;
    cl_program prog;
    cl_kernel k[MAX_KERNELS];
    size_t local[MAX_KERNELS];
    struct kset *next;
} kset;

/* Everything the paged-caching options are made of. */
typedef struct pc_plan {
    int32_t empty; /* no work for any call with this metadata: nothing is built */
    int32_t in_dt, out_dt, slot_i64, heads, block_size, hd_k, hd_v, vec_k, vec_v, group, interleave;
    int32_t lin_k, lout_k, lin_v, lout_v; /* alignment (bytes) the vec kernel needs of each base offset */
} pc_plan;

/* tensor_copy after dropping size-1 dims and merging dims dense in both tensors. */
typedef struct tc_layout {
    int32_t ndim; /* 0: no elements */
    uint64_t shape[KVHAL_MAX_DIMS], ds[KVHAL_MAX_DIMS], ss[KVHAL_MAX_DIMS];
} tc_layout;

typedef struct tc_plan {
    int32_t ndim, esize, vec, contiguous;
} tc_plan;

typedef struct ocl_desc {
    kvhal_bk_op op;
    ocl_src src;
    int32_t nk;
    const char *const *knames;
    char options[256];
    union {
        pc_plan pc;
        tc_plan tc;
    } plan;
    kset *sets;
    /* copy_blocks: units per work-item, and the device copy of pairs and cache table, reused from call to call */
    int32_t cb_group;
    cl_mem meta;
    size_t meta_cap;
    cl_context meta_ctx;
    cl_event meta_last_use; /* completes when the last launch reading meta is done */
} ocl_desc;

static const char *const pc_knames[] = {"paged_caching_vec", "paged_caching_any"};
static const char *const cb_knames[] = {"copy_blocks_16", "copy_blocks_4", "copy_blocks_1"};
static const char *const tc_knames[] = {"tensor_copy_vec", "tensor_copy_any"};

/* ---- kernels ---- */
typedef struct karg {
    size_t size;
    const void *ptr;
} karg;
#define KA(x) {sizeof(x), &(x)}

static kvhal_status set_args(int32_t id, cl_kernel k, const char *kname, const karg *a, int n)
{
    for (int i = 0; i < n; i++) {
        cl_int err = clSetKernelArg(k, (cl_uint)i, a[i].size, a[i].ptr);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clSetKernelArg(%s, %d)", id, kname, i);
    }
    return KVHAL_OK;
}

/* Work-items of one launch at most: keeps in-kernel index math in 32 bits and global sizes within every device's
 * size_t. Larger ops are split into several launches. */
#define MAX_ITEMS ((uint64_t)1 << 30)

static kvhal_status launch(int32_t id, cl_command_queue q, const kset *ks, int ki, const char *kname, uint64_t items,
                           cl_uint nwait, const cl_event *wait, cl_event *ev)
{
    size_t local = ks->local[ki];
    size_t global = (size_t)((items + local - 1) / local) * local;
    cl_int err = clEnqueueNDRangeKernel(q, ks->k[ki], 1, NULL, &global, &local, nwait, wait, ev);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "opencl:%d: clEnqueueNDRangeKernel(%s, global %zu, local %zu)", id, kname, global,
                               local);
    return KVHAL_OK;
}

static void kset_free(kset *s)
{
    if (!kvhal__ocl_finalizing()) {
        for (int i = 0; i < MAX_KERNELS; i++)
            if (s->k[i]) clReleaseKernel(s->k[i]);
        if (s->prog) clReleaseProgram(s->prog);
    }
    free(s);
}

/* The descriptor's kernels for context ce: built (through the program cache) the first time ce is seen. */
static kvhal_status get_kset(int32_t id, ocl_desc *desc, ocl_ctx *ce, kset **out)
{
    for (kset *s = desc->sets; s; s = s->next) {
        if (s->ce == ce) {
            *out = s;
            return KVHAL_OK;
        }
    }
    ocl_device *d = kvhal__ocl_device(id);
    kset *s = kvhal__ocl_malloc(sizeof *s);
    if (!s) return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for kernels failed", id);
    memset(s, 0, sizeof *s);
    s->ce = ce;
    kvhal_status st = kvhal__ocl_program(d, ce, desc->src, desc->options, &s->prog);
    for (int i = 0; i < desc->nk && st == KVHAL_OK; i++) {
        cl_int err;
        s->k[i] = clCreateKernel(s->prog, desc->knames[i], &err);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(err, "opencl:%d: clCreateKernel(%s)", id, desc->knames[i]);
        else st = kvhal__ocl_local_size(d, s->k[i], &s->local[i]);
    }
    if (st != KVHAL_OK) {
        kset_free(s);
        return st;
    }
    s->next = desc->sets;
    desc->sets = s;
    *out = s;
    return KVHAL_OK;
}

/* ---- plans: everything derived from metadata ---- */
static int32_t dt_size(kvhal_dtype dt)
{
    switch (dt) {
    case KVHAL_F32:
    case KVHAL_I32: return 4;
    case KVHAL_F16:
    case KVHAL_BF16: return 2;
    case KVHAL_FP8_E4M3:
    case KVHAL_FP8_E5M2: return 1;
    case KVHAL_I64: return 8;
    default: return 0;
    }
}

static bool dt_is_float(kvhal_dtype dt) { return dt >= KVHAL_F32 && dt <= KVHAL_FP8_E5M2; }

static bool multiple(int64_t v, int64_t m) { return v % m == 0; }

/* Elements per work-item for one side: the widest chunk that keeps every access aligned, given strides only. */
static int32_t pc_pick_vec(const kvhal_bk_paged_side *s, int32_t in_size, int32_t out_size, bool outer_used,
                           bool inner_used, bool heads_used, bool offset_used)
{
    if (s->head_dim <= 1 || s->in_dim_stride != 1 || s->cache_dim_stride != 1) return 1;
    int32_t v = 16 / (in_size < out_size ? in_size : out_size);
    for (; v > 1; v /= 2) {
        if (s->head_dim % v) continue;
        int64_t lin = v * in_size < 16 ? v * in_size : 16, lout = v * out_size < 16 ? v * out_size : 16;
        if (outer_used && !multiple(s->tok_stride_outer * in_size, lin)) continue;
        if (inner_used && !multiple(s->tok_stride_inner * in_size, lin)) continue;
        if (heads_used && !multiple(s->in_head_stride * in_size, lin)) continue;
        if (!multiple(s->block_stride * out_size, lout)) continue;
        if (offset_used && !multiple(s->offset_stride * out_size, lout)) continue;
        if (heads_used && !multiple(s->cache_head_stride * out_size, lout)) continue;
        break;
    }
    return v;
}

static kvhal_status pc_make_plan(int32_t id, const kvhal_bk_paged_caching *a, pc_plan *p)
{
    const ocl_device *d = kvhal__ocl_device(id);
    memset(p, 0, sizeof *p);
    if (!dt_is_float(a->input_dtype) || !dt_is_float(a->cache_dtype))
        return OCL_SET_ERROR(KVHAL_UNSUPPORTED, "opencl:%d: paged caching of dtype %d into a cache of dtype %d", id,
                             (int)a->input_dtype, (int)a->cache_dtype);
    if (a->slot_dtype != KVHAL_I32 && a->slot_dtype != KVHAL_I64)
        return OCL_SET_ERROR(KVHAL_UNSUPPORTED, "opencl:%d: slot_mapping dtype %d (i32 or i64 expected)", id,
                             (int)a->slot_dtype);
    /* One side may have head dim 0 (nothing of it to store) while the other still has work. */
    if (a->num_heads < 1 || a->block_size < 1 || (a->k.head_dim < 1 && a->v.head_dim < 1) || a->num_tokens < 1) {
        p->empty = 1;
        return KVHAL_OK;
    }
    int32_t in = dt_size(a->input_dtype), out = dt_size(a->cache_dtype);
    p->in_dt = (int32_t)a->input_dtype;
    p->out_dt = (int32_t)a->cache_dtype;
    p->slot_i64 = a->slot_dtype == KVHAL_I64;
    p->heads = a->num_heads;
    p->block_size = a->block_size;
    p->hd_k = a->k.head_dim;
    p->hd_v = a->v.head_dim;
    bool outer = a->num_tokens > a->seq_len, inner = a->seq_len > 1, heads = a->num_heads > 1,
         offset = a->block_size > 1;
    p->vec_k = pc_pick_vec(&a->k, in, out, outer, inner, heads, offset);
    p->vec_v = pc_pick_vec(&a->v, in, out, outer, inner, heads, offset);
    /* CPU devices run work-items one after another: there several neighbouring chunks per item amortise the index
     * math. GPUs need bytes in flight: there a work-item loads KVHAL_OCL_GPU_GROUP chunks a head-dim quarter/half
     * apart (interleaved, so that each of its loads is still coalesced with its neighbours') before it stores. */
    const bool cpu = kvhal__ocl_cpu_plans(d);
    const int32_t max_group = cpu ? 8 : KVHAL_OCL_GPU_GROUP;
    p->group = 1;
    p->interleave = !cpu;
    if (p->vec_k > 1 && p->vec_v > 1)
        while (p->group < max_group && (p->hd_k / p->vec_k) % (2 * p->group) == 0 &&
               (p->hd_v / p->vec_v) % (2 * p->group) == 0)
            p->group *= 2;
    p->lin_k = p->vec_k * in < 16 ? p->vec_k * in : 16;
    p->lout_k = p->vec_k * out < 16 ? p->vec_k * out : 16;
    p->lin_v = p->vec_v * in < 16 ? p->vec_v * in : 16;
    p->lout_v = p->vec_v * out < 16 ? p->vec_v * out : 16;
    return KVHAL_OK;
}

static void tc_coalesce(const kvhal_bk_tensor_copy *a, tc_layout *L)
{
    memset(L, 0, sizeof *L);
    int32_t n = 0;
    for (int32_t i = 0; i < a->dst.ndim; i++) {
        if (a->dst.shape[i] == 0) return; /* no elements */
        if (a->dst.shape[i] == 1) continue;
        uint64_t sh = (uint64_t)a->dst.shape[i], ds = (uint64_t)a->dst.strides[i], ss = (uint64_t)a->src.strides[i];
        if (n > 0 && L->ds[n - 1] == ds * sh && L->ss[n - 1] == ss * sh) {
            L->shape[n - 1] *= sh; /* the outer dim continues this one in both tensors */
            L->ds[n - 1] = ds;
            L->ss[n - 1] = ss;
            continue;
        }
        L->shape[n] = sh;
        L->ds[n] = ds;
        L->ss[n] = ss;
        n++;
    }
    if (n == 0) { /* one element */
        L->shape[0] = 1;
        L->ds[0] = L->ss[0] = 1;
        n = 1;
    }
    L->ndim = n;
}

static kvhal_status tc_make_plan(int32_t id, const kvhal_bk_tensor_copy *a, tc_layout *L, tc_plan *p)
{
    memset(p, 0, sizeof *p);
    p->esize = dt_size(a->dst.dtype);
    if (p->esize == 0 || a->dst.dtype != a->src.dtype || a->dst.ndim != a->src.ndim || a->dst.ndim < 0 ||
        a->dst.ndim > KVHAL_MAX_DIMS)
        return OCL_SET_ERROR(KVHAL_INVALID_ARGUMENT, "opencl:%d: tensor_copy of dtype %d/%d, ndim %d/%d", id,
                             (int)a->dst.dtype, (int)a->src.dtype, a->dst.ndim, a->src.ndim);
    for (int32_t i = 0; i < a->dst.ndim; i++)
        if (a->dst.shape[i] != a->src.shape[i] || a->dst.shape[i] < 0 || a->dst.strides[i] < 0 ||
            a->src.strides[i] < 0)
            return OCL_SET_ERROR(KVHAL_SHAPE_MISMATCH, "opencl:%d: tensor_copy dim %d: shape %lld/%lld", id, i,
                                 (long long)a->dst.shape[i], (long long)a->src.shape[i]);
    tc_coalesce(a, L);
    p->ndim = L->ndim;
    if (L->ndim == 0) return KVHAL_OK;
    int32_t n = L->ndim;
    p->contiguous = n == 1 && L->ds[0] == 1 && L->ss[0] == 1;
    p->vec = 1;
    if (!p->contiguous && L->ds[n - 1] == 1 && L->ss[n - 1] == 1) {
        int32_t v = 16 / p->esize;
        for (; v > 1; v /= 2) {
            bool ok = L->shape[n - 1] % (uint64_t)v == 0;
            for (int32_t i = 0; i < n - 1 && ok; i++) ok = L->ds[i] % (uint64_t)v == 0 && L->ss[i] % (uint64_t)v == 0;
            if (ok) break;
        }
        p->vec = v;
    }
    return KVHAL_OK;
}

/* ---- descriptors ---- */
static cl_mem first_mem(kvhal_bk_op op, const void *args)
{
    switch (op) {
    case KVHAL_BK_OP_PAGED_CACHING: return (cl_mem)((const kvhal_bk_paged_caching *)args)->k.cache;
    case KVHAL_BK_OP_COPY_BLOCKS: {
        const kvhal_bk_copy_blocks *a = args;
        return a->num_caches > 0 && a->natives ? (cl_mem)a->natives[0] : NULL;
    }
    case KVHAL_BK_OP_TENSOR_COPY: return (cl_mem)((const kvhal_bk_tensor_copy *)args)->dst.native;
    default: return NULL;
    }
}

kvhal_status kvhal__ocl_desc_create(int32_t id, kvhal_bk_op op, const void *args, void **out)
{
    ocl_device *d = kvhal__ocl_device(id);
    if (!d) return OCL_SET_ERROR(KVHAL_NO_DEVICE, "opencl:%d: no such device", id);
    if (!args || !out) return OCL_SET_ERROR(KVHAL_INVALID_ARGUMENT, "opencl:%d: desc_create without arguments", id);
    ocl_desc *desc = kvhal__ocl_malloc(sizeof *desc);
    if (!desc) return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a descriptor failed", id);
    memset(desc, 0, sizeof *desc);
    desc->op = op;
    kvhal_status st = KVHAL_OK;
    switch (op) {
    case KVHAL_BK_OP_PAGED_CACHING: {
        pc_plan *p = &desc->plan.pc;
        st = pc_make_plan(id, args, p);
        desc->src = OCL_SRC_PAGED_CACHING;
        desc->knames = pc_knames;
        desc->nk = p->empty ? 0 : 2;
        snprintf(desc->options, sizeof desc->options,
                 "-DIN_DT=%d -DOUT_DT=%d -DSLOT_I64=%d -DHEADS=%d -DBLOCK_SIZE=%d -DHD_K=%d -DHD_V=%d -DVEC_K=%d "
                 "-DVEC_V=%d -DGROUP=%d -DINTERLEAVE=%d -DKV_NV_HW=%d",
                 p->in_dt, p->out_dt, p->slot_i64, p->heads, p->block_size, p->hd_k, p->hd_v, p->vec_k, p->vec_v,
                 p->group, p->interleave, kvhal__ocl_device(id)->nv_fp8 ? 1 : 0);
        break;
    }
    case KVHAL_BK_OP_COPY_BLOCKS:
        desc->src = OCL_SRC_COPY_BLOCKS;
        desc->knames = cb_knames;
        desc->nk = 3;
        desc->cb_group = kvhal__ocl_device(id)->cpu ? 16 : 1;
        snprintf(desc->options, sizeof desc->options, "-DCB_GROUP=%d", desc->cb_group);
        break;
    case KVHAL_BK_OP_TENSOR_COPY: {
        tc_layout L;
        tc_plan *p = &desc->plan.tc;
        st = tc_make_plan(id, args, &L, p);
        desc->src = OCL_SRC_TENSOR_COPY;
        desc->knames = tc_knames;
        desc->nk = p->ndim == 0 || p->contiguous ? 0 : 2; /* contiguous copies are clEnqueueCopyBuffer */
        snprintf(desc->options, sizeof desc->options, "-DNDIM=%d -DESIZE=%d -DUNIT=%d", p->ndim, p->esize,
                 p->vec * p->esize);
        break;
    }
    default:
        st = OCL_SET_ERROR(KVHAL_UNSUPPORTED, "opencl:%d: op %d has no descriptor", id, (int)op);
    }
    /* Build now, for the context of the first call's memory: the first call pays for it, later ones never do. */
    if (st == KVHAL_OK && desc->nk > 0) {
        ocl_ctx *ce;
        kset *ks;
        st = kvhal__ocl_ctx_of_mem(d, first_mem(op, args), &ce);
        if (st == KVHAL_OK) st = get_kset(id, desc, ce, &ks);
    }
    if (st != KVHAL_OK) {
        free(desc);
        return st;
    }
    *out = desc;
    return KVHAL_OK;
}

void kvhal__ocl_desc_destroy(int32_t id, kvhal_bk_op op, void *p)
{
    (void)id;
    (void)op;
    ocl_desc *desc = p;
    if (!desc) return;
    while (desc->sets) {
        kset *s = desc->sets;
        desc->sets = s->next;
        kset_free(s);
    }
    if (!kvhal__ocl_finalizing()) {
        if (desc->meta_last_use) clReleaseEvent(desc->meta_last_use);
        if (desc->meta) clReleaseMemObject(desc->meta); /* deleted once the launches reading it are done */
    }
    free(desc);
}

static kvhal_status check_desc(int32_t id, const ocl_desc *desc, kvhal_bk_op op)
{
    if (!desc || desc->op != op)
        return OCL_SET_ERROR(KVHAL_INVALID_ARGUMENT, "opencl:%d: descriptor missing or of another op", id);
    return KVHAL_OK;
}

/* ---- paged caching ---- */
/* (scale, 1 / scale) for kv_div and its mode: 0 for 1, 1 for a power of two (x * inv is then exact), 2 otherwise.
 * The core passes 1 for non-fp8 caches and checks fp8 scales are finite and > 0. */
static cl_uint scale_mode(float scale, cl_float2 *sc)
{
    sc->s[0] = scale;
    sc->s[1] = 1.0f / scale;
    if (scale == 1.0f) return 0;
    int e;
    return frexpf(scale, &e) == 0.5f ? 1 : 2;
}

kvhal_status kvhal__ocl_paged_caching(int32_t id, void *desc_, const kvhal_bk_paged_caching *a, void *stream)
{
    ocl_desc *desc = desc_;
    kvhal_status st = check_desc(id, desc, KVHAL_BK_OP_PAGED_CACHING);
    if (st != KVHAL_OK) return st;
    pc_plan p;
    st = pc_make_plan(id, a, &p);
    if (st != KVHAL_OK) return st;
    if (memcmp(&p, &desc->plan.pc, sizeof p))
        return OCL_SET_ERROR(KVHAL_INTERNAL, "opencl:%d: paged-caching descriptor built for other metadata", id);
    if (p.empty) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    kset *ks;
    st = kvhal__ocl_resolve(id, stream, (cl_mem)a->k.cache, &q, &ce);
    if (st == KVHAL_OK) st = get_kset(id, desc, ce, &ks);
    if (st != KVHAL_OK) return st;

    size_t slot_size = p.slot_i64 ? 8 : 4;
    bool vec = a->k.cache_offset % (size_t)p.lout_k == 0 && a->k.input_offset % (size_t)p.lin_k == 0 &&
               a->v.cache_offset % (size_t)p.lout_v == 0 && a->v.input_offset % (size_t)p.lin_v == 0 &&
               a->slots_offset % slot_size == 0;
    int ki = vec ? 0 : 1;
    int64_t vk = vec ? p.vec_k * p.group : 1, vv = vec ? p.vec_v * p.group : 1; /* elements per work-item */

    cl_mem kc = (cl_mem)a->k.cache, kin = (cl_mem)a->k.input, vc = (cl_mem)a->v.cache, vin = (cl_mem)a->v.input;
    cl_mem slots = (cl_mem)a->slots, err_flag = ce->err_flag;
    cl_ulong kc_off = a->k.cache_offset, ki_off = a->k.input_offset, vc_off = a->v.cache_offset,
             vi_off = a->v.input_offset, slots_off = a->slots_offset;
    cl_long4 kcs = {.s = {a->k.block_stride, a->k.offset_stride, a->k.cache_head_stride, a->k.cache_dim_stride}};
    cl_long4 kis = {.s = {a->k.tok_stride_outer, a->k.tok_stride_inner, a->k.in_head_stride, a->k.in_dim_stride}};
    cl_long4 vcs = {.s = {a->v.block_stride, a->v.offset_stride, a->v.cache_head_stride, a->v.cache_dim_stride}};
    cl_long4 vis = {.s = {a->v.tok_stride_outer, a->v.tok_stride_inner, a->v.in_head_stride, a->v.in_dim_stride}};
    cl_long2 ss = {.s = {a->slot_stride_outer, a->slot_stride_inner}};
    cl_float2 k_sc, v_sc;
    cl_uint modes = scale_mode(a->k.scale, &k_sc) | scale_mode(a->v.scale, &v_sc) << 2;
    cl_ulong num_tokens = (cl_ulong)a->num_tokens, seq_len = (cl_ulong)a->seq_len;
    cl_long num_slots = a->num_blocks * a->block_size;
    const karg args[] = {KA(kc),    KA(kc_off),    KA(kcs), KA(kin),      KA(ki_off),     KA(kis),     KA(k_sc),
                         KA(vc),    KA(vc_off),    KA(vcs), KA(vin),      KA(vi_off),     KA(vis),     KA(v_sc),
                         KA(slots), KA(slots_off), KA(ss),  KA(err_flag), KA(num_tokens), KA(seq_len), KA(num_slots),
                         KA(modes)};
    st = set_args(id, ks->k[ki], pc_knames[ki], args, (int)(sizeof args / sizeof args[0]));
    if (st != KVHAL_OK) return st;
    const uint64_t per_tok = (uint64_t)p.heads * (uint64_t)(p.hd_k / vk + p.hd_v / vv);
    if (per_tok > MAX_ITEMS)
        return OCL_SET_ERROR(KVHAL_UNSUPPORTED, "opencl:%d: %llu work-items per token exceed one launch", id,
                             (unsigned long long)per_tok);
    const uint64_t per_launch = MAX_ITEMS / per_tok;
    for (uint64_t t0 = 0; t0 < (uint64_t)a->num_tokens && st == KVHAL_OK; t0 += per_launch) {
        uint64_t n = (uint64_t)a->num_tokens - t0 < per_launch ? (uint64_t)a->num_tokens - t0 : per_launch;
        cl_ulong tok0 = t0;
        cl_uint items = (cl_uint)(n * per_tok);
        const karg piece[] = {KA(tok0), KA(items)};
        for (int j = 0; j < 2 && st == KVHAL_OK; j++) {
            cl_int err = clSetKernelArg(ks->k[ki], (cl_uint)(22 + j), piece[j].size, piece[j].ptr);
            if (err != CL_SUCCESS)
                st = kvhal__ocl_fail(err, "opencl:%d: clSetKernelArg(%s, %d)", id, pc_knames[ki], 22 + j);
        }
        if (st == KVHAL_OK) st = launch(id, q, ks, ki, pc_knames[ki], items, 0, NULL, NULL);
    }
    return st;
}

/* ---- copy_blocks ---- */
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
        cl_mem m = (cl_mem)a->natives[c];
        int32_t j = 0;
        while (j < nb && bufs[j] != m) j++;
        if (j == nb) {
            if (nb == CB_NBUF) break;
            bufs[nb++] = m;
        }
        if (table) table[4 * (size_t)c] = (cl_ulong)j;
    }
    *nbufs = nb;
    return c;
}

kvhal_status kvhal__ocl_copy_blocks(int32_t id, void *desc_, const kvhal_bk_copy_blocks *a, void *stream)
{
    ocl_desc *desc = desc_;
    kvhal_status st = check_desc(id, desc, KVHAL_BK_OP_COPY_BLOCKS);
    if (st != KVHAL_OK) return st;
    if (a->num_caches <= 0 || a->num_pairs <= 0) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    kset *ks;
    st = kvhal__ocl_resolve(id, stream, (cl_mem)a->natives[0], &q, &ce);
    if (st == KVHAL_OK) st = get_kset(id, desc, ce, &ks);
    if (st != KVHAL_OK) return st;

    uint64_t acc = 0;
    for (int32_t c = 0; c < a->num_caches; c++)
        acc |= (uint64_t)a->offsets[c] | (uint64_t)a->block_strides[c] | (uint64_t)a->block_bytes[c];
    int ki = acc % 16 == 0 ? 0 : acc % 4 == 0 ? 1 : 2;

    /* meta = pairs, then the cache table. The host copy lives until the (non-blocking) write has read it: an
     * event callback frees it, so the call never waits for the device. */
    size_t words = 2 * (size_t)a->num_pairs + 4 * (size_t)a->num_caches, bytes = words * sizeof(cl_ulong);
    cl_ulong *host = kvhal__ocl_malloc(bytes);
    if (!host) return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: copy_blocks: %zu-byte host table", id, bytes);
    memcpy(host, a->pairs, 2 * (size_t)a->num_pairs * sizeof(int64_t));
    cl_ulong *table = host + 2 * (size_t)a->num_pairs;
    for (int32_t c = 0; c < a->num_caches; c++) {
        cl_ulong *e = table + 4 * (size_t)c;
        e[1] = (cl_ulong)a->offsets[c];
        e[2] = (cl_ulong)a->block_strides[c];
        e[3] = (cl_ulong)a->block_bytes[c];
    }
    cl_mem bufs[CB_NBUF];
    int32_t nb;
    for (int32_t c0 = 0; c0 < a->num_caches;) c0 = cb_group(a, c0, bufs, &nb, table);

    cl_int err;
    if (!desc->meta || desc->meta_ctx != ce->ctx || desc->meta_cap < bytes) {
        size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        if (kvhal__ocl_services->alloc_should_fail && kvhal__ocl_services->alloc_should_fail()) {
            free(host);
            return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: copy_blocks table buffer (fault injection)", id);
        }
        cl_mem m = clCreateBuffer(ce->ctx, CL_MEM_READ_ONLY, cap, NULL, &err);
        if (err != CL_SUCCESS) {
            free(host);
            return kvhal__ocl_fail(err, "opencl:%d: clCreateBuffer(copy_blocks table, %zu bytes)", id, cap);
        }
        if (desc->meta) clReleaseMemObject(desc->meta); /* deleted after the launches still reading it */
        if (desc->meta_last_use) clReleaseEvent(desc->meta_last_use);
        desc->meta = m;
        desc->meta_cap = cap;
        desc->meta_ctx = ce->ctx;
        desc->meta_last_use = NULL;
    }
    /* The previous call's launches may still read meta, possibly on another queue: the write waits for them. */
    cl_event written;
    err = clEnqueueWriteBuffer(q, desc->meta, CL_FALSE, 0, bytes, host, desc->meta_last_use ? 1 : 0,
                               desc->meta_last_use ? &desc->meta_last_use : NULL, &written);
    if (err != CL_SUCCESS) {
        free(host);
        return kvhal__ocl_fail(err, "opencl:%d: clEnqueueWriteBuffer(copy_blocks table, %zu bytes)", id, bytes);
    }
    if (clSetEventCallback(written, CL_COMPLETE, free_host_copy, host) != CL_SUCCESS) {
        err = clWaitForEvents(1, &written);
        free(host);
        if (err != CL_SUCCESS) {
            clReleaseEvent(written);
            return kvhal__ocl_fail(err, "opencl:%d: copy_blocks table upload", id);
        }
    }

    cl_event last = NULL;
    int launches = 0;
    const uint64_t unit = ki == 0 ? 16 : ki == 1 ? 4 : 1;
    cl_uint num_pairs = (cl_uint)a->num_pairs;
    for (int32_t c0 = 0; c0 < a->num_caches && st == KVHAL_OK;) {
        int32_t c1 = cb_group(a, c0, bufs, &nb, NULL);
        for (int32_t j = nb; j < CB_NBUF; j++) bufs[j] = bufs[0];
        uint64_t upj = 1; /* work-items per job */
        for (int32_t c = c0; c < c1; c++) {
            uint64_t n = ((uint64_t)a->block_bytes[c] / unit + (uint64_t)desc->cb_group - 1) / (uint64_t)desc->cb_group;
            if (n > upj) upj = n;
        }
        if (upj > MAX_ITEMS) {
            st = OCL_SET_ERROR(KVHAL_UNSUPPORTED, "opencl:%d: copy_blocks: a block of %llu work-items exceeds one "
                               "launch", id, (unsigned long long)upj);
            break;
        }
        cl_ulong table_off = 2 * (cl_ulong)a->num_pairs + 4 * (cl_ulong)c0;
        cl_uint units_per_job = (cl_uint)upj;
        const uint64_t jobs = (uint64_t)(c1 - c0) * num_pairs, per_launch = MAX_ITEMS / upj;
        for (uint64_t j0 = 0; j0 < jobs && st == KVHAL_OK; j0 += per_launch) {
            cl_ulong job0 = j0;
            cl_uint items = (cl_uint)((jobs - j0 < per_launch ? jobs - j0 : per_launch) * upj);
            const karg args[] = {KA(bufs[0]),  KA(bufs[1]),  KA(bufs[2]),  KA(bufs[3]),     KA(bufs[4]),
                                 KA(bufs[5]),  KA(bufs[6]),  KA(bufs[7]),  KA(bufs[8]),     KA(bufs[9]),
                                 KA(bufs[10]), KA(bufs[11]), KA(bufs[12]), KA(bufs[13]),    KA(bufs[14]),
                                 KA(bufs[15]), KA(desc->meta), KA(table_off), KA(num_pairs), KA(units_per_job),
                                 KA(job0),     KA(items)};
            st = set_args(id, ks->k[ki], cb_knames[ki], args, (int)(sizeof args / sizeof args[0]));
            cl_event ev = NULL;
            if (st == KVHAL_OK) st = launch(id, q, ks, ki, cb_knames[ki], items, 1, &written, &ev);
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
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(err, "opencl:%d: clEnqueueMarkerWithWaitList", id);
        else {
            clReleaseEvent(last);
            last = all;
        }
    }
    if (last) {
        if (desc->meta_last_use) clReleaseEvent(desc->meta_last_use);
        desc->meta_last_use = last;
    }
    return st;
}

/* ---- tensor_copy ---- */
kvhal_status kvhal__ocl_tensor_copy(int32_t id, void *desc_, const kvhal_bk_tensor_copy *a, void *stream)
{
    ocl_desc *desc = desc_;
    kvhal_status st = check_desc(id, desc, KVHAL_BK_OP_TENSOR_COPY);
    if (st != KVHAL_OK) return st;
    tc_layout L;
    tc_plan p;
    st = tc_make_plan(id, a, &L, &p);
    if (st != KVHAL_OK) return st;
    if (memcmp(&p, &desc->plan.tc, sizeof p))
        return OCL_SET_ERROR(KVHAL_INTERNAL, "opencl:%d: tensor_copy descriptor built for other metadata", id);
    if (p.ndim == 0) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    st = kvhal__ocl_resolve(id, stream, (cl_mem)a->dst.native, &q, &ce);
    if (st != KVHAL_OK) return st;
    if (p.contiguous)
        return kvhal__ocl_copy(id, q, ce, (cl_mem)a->dst.native, a->dst.offset, (cl_mem)a->src.native, a->src.offset,
                               (size_t)L.shape[0] * (size_t)p.esize);
    kset *ks;
    st = get_kset(id, desc, ce, &ks);
    if (st != KVHAL_OK) return st;

    size_t unit = (size_t)p.vec * (size_t)p.esize;
    bool vec = a->dst.offset % unit == 0 && a->src.offset % unit == 0;
    int ki = vec ? 0 : 1;
    cl_ulong8 shape = {.s = {0}}, ds = {.s = {0}}, ss = {.s = {0}};
    cl_ulong total = 1;
    for (int32_t i = 0; i < L.ndim; i++) {
        uint64_t div = vec && p.vec > 1 ? (uint64_t)p.vec : 1;
        bool inner = i == L.ndim - 1;
        shape.s[i] = inner ? L.shape[i] / div : L.shape[i];
        ds.s[i] = inner ? L.ds[i] : L.ds[i] / div;
        ss.s[i] = inner ? L.ss[i] : L.ss[i] / div;
        total *= shape.s[i];
    }
    cl_mem dst = (cl_mem)a->dst.native, src = (cl_mem)a->src.native;
    cl_ulong dst_off = a->dst.offset, src_off = a->src.offset;
    cl_uint small = total <= 0xffffffffu;
    for (uint64_t b = 0; b < total && st == KVHAL_OK; b += MAX_ITEMS) {
        cl_ulong base = b;
        uint64_t items = total - b < MAX_ITEMS ? total - b : MAX_ITEMS;
        const karg args[] = {KA(dst),  KA(dst_off), KA(src),   KA(src_off), KA(shape),
                             KA(ds),   KA(ss),      KA(base),  KA(total),   KA(small)};
        st = set_args(id, ks->k[ki], tc_knames[ki], args, (int)(sizeof args / sizeof args[0]));
        if (st == KVHAL_OK) st = launch(id, q, ks, ki, tc_knames[ki], items, 0, NULL, NULL);
    }
    return st;
}

/* ---- copy_batch ---- */
kvhal_status kvhal__ocl_copy_batch(int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    if (a->count <= 0) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(id, stream, (cl_mem)a->dst[0], &q, &ce);
    for (int32_t i = 0; i < a->count && st == KVHAL_OK; i++)
        st = kvhal__ocl_copy(id, q, ce, (cl_mem)a->dst[i], a->dst_offsets[i], (cl_mem)a->src[i], a->src_offsets[i],
                             a->bytes[i]);
    return st;
}

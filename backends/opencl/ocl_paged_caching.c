/* ocl_paged_caching.c — the paged-caching op on OpenCL: the plan (chunk widths, chunks per work-item, the launch
 * split) is made once per descriptor from the metadata and becomes the program's -D options; the kernel arguments
 * fixed by the metadata are set when the kernels are made (preset), so a call sets only memory, offsets and fp8
 * scales. Buffer offsets vary from call to call and never go into options: they pick, at run time, between the
 * wide-access kernel (paged_caching_vec) and the any-alignment one (paged_caching_any) of the same program. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

/* The .cl files use kvhal_dtype's numbering for dtypes (KV_F32 = KVHAL_F32, ...). */
_Static_assert(KVHAL_F32 == 0 && KVHAL_F16 == 1 && KVHAL_BF16 == 2 && KVHAL_FP8_E4M3 == 3 && KVHAL_FP8_E5M2 == 4 &&
                   KVHAL_FP8_E4M3FNUZ == 7 && KVHAL_FP8_E5M2FNUZ == 8,
               "kv_common.cl dtype codes");

#ifndef KVHAL_OCL_GPU_GROUP
#define KVHAL_OCL_GPU_GROUP 2 /* chunks per work-item of the paged-caching kernel on GPU devices (a power of two) */
#endif
#ifndef KVHAL_OCL_GPU_GROUP_CONVERT
#define KVHAL_OCL_GPU_GROUP_CONVERT 1 /* the same for rows that convert (fp8 caches) */
#endif

enum { PC_VEC = 0, PC_ANY = 1, PC_NK = 2 };
static const char *const pc_knames[PC_NK] = {"paged_caching_vec", "paged_caching_any"};
/* Argument indices of the kernels (paged_caching.cl). */
enum {
    PC_ARG_KC = 0, PC_ARG_KC_OFF = 1, PC_ARG_KCS = 2, PC_ARG_KIN = 3, PC_ARG_KI_OFF = 4, PC_ARG_KIS = 5,
    PC_ARG_K_SC = 6, PC_ARG_VC = 7, PC_ARG_VC_OFF = 8, PC_ARG_VCS = 9, PC_ARG_VIN = 10, PC_ARG_VI_OFF = 11,
    PC_ARG_VIS = 12, PC_ARG_V_SC = 13, PC_ARG_SLOTS = 14, PC_ARG_SLOTS_OFF = 15, PC_ARG_SS = 16, PC_ARG_ERR = 17,
    PC_ARG_NUM_TOKENS = 18, PC_ARG_SEQ_LEN = 19, PC_ARG_NUM_SLOTS = 20, PC_ARG_MODES = 21, PC_ARG_TOK0 = 22,
    PC_ARG_ITEMS = 23
};

/* Everything the options are made of, and the launch plan of each kernel. */
typedef struct pc_plan {
    int32_t in_dt, out_dt, slot_i64, heads, block_size, hd_k, hd_v, vec_k, vec_v, group, interleave;
    int32_t lin_k, lout_k, lin_v, lout_v; /* alignment (bytes) the vec kernel needs of each base offset */
    uint64_t per_tok[PC_NK];              /* work-items per token */
    uint64_t per_launch[PC_NK];           /* tokens per launch (0: the kernel cannot run this shape) */
} pc_plan;

typedef struct pc_desc {
    ocl_desc base;
    pc_plan p;
    bool fp8;
    /* the metadata arguments, set once per kernel set. The kernels take a token as (t / seq_len, t % seq_len) only
     * where seq_len != num_tokens: a flat call (not batched) passes 0 for both, and its outer strides as 0, so
     * that a descriptor serves every token count; a batched one passes its seq_len and num_tokens 0. */
    cl_long4 kcs, kis, vcs, vis;
    cl_long2 ss;
    cl_ulong num_tokens, seq_len;
    cl_long num_slots;
} pc_desc;

static bool dt_is_float(kvhal_dtype dt)
{
    return (dt >= KVHAL_F32 && dt <= KVHAL_FP8_E5M2) || dt == KVHAL_FP8_E4M3FNUZ || dt == KVHAL_FP8_E5M2FNUZ;
}

static bool multiple(int64_t v, int64_t m) { return v % m == 0; }

/* Elements per work-item for one side: the widest chunk that keeps every access aligned, given strides only. */
static int32_t pick_vec(const kvhal_bk_paged_side *s, int32_t in_size, int32_t out_size, bool outer_used,
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

static void make_plan(const ocl_device *d, const kvhal_bk_paged_caching *a, pc_plan *p)
{
    memset(p, 0, sizeof *p);
    int32_t in = (int32_t)kvhal_bk_dtype_size(a->input_dtype), out = (int32_t)kvhal_bk_dtype_size(a->cache_dtype);
    p->in_dt = (int32_t)a->input_dtype;
    p->out_dt = (int32_t)a->cache_dtype;
    p->slot_i64 = a->slot_dtype == KVHAL_I64;
    p->heads = a->num_heads;
    p->block_size = a->block_size;
    p->hd_k = a->k.head_dim;
    p->hd_v = a->v.head_dim;
    bool inner = !a->batched || a->seq_len > 1, heads = a->num_heads > 1, offset = a->block_size > 1;
    p->vec_k = pick_vec(&a->k, in, out, a->batched, inner, heads, offset);
    p->vec_v = pick_vec(&a->v, in, out, a->batched, inner, heads, offset);
    /* CPU devices run work-items one after another: there several neighbouring chunks per item amortise the index
     * math. GPUs need bytes in flight: there a work-item loads KVHAL_OCL_GPU_GROUP chunks a head-dim quarter/half
     * apart (interleaved, so that each of its loads is still coalesced with its neighbours') before it stores. */
    const bool cpu = kvhal__ocl_cpu_plans(d);
    /* On GPUs a converting row (fp8 caches) keeps one chunk per work-item: on NVIDIA's OpenCL (H100) llama3-8b
     * fp8 at 8192 tokens ran at 0.935-0.953 of a copy with
     * one chunk, 0.840-0.962 with two (fnuz: 0.910-0.928 against 0.628-0.681; four chunks: 0.43-0.47; not
     * profiled: the conversion's registers are the likely cost); rows that only copy keep KVHAL_OCL_GPU_GROUP. */
    const bool converts = a->input_dtype != a->cache_dtype;
    const int32_t max_group = cpu ? 8 : converts ? KVHAL_OCL_GPU_GROUP_CONVERT : KVHAL_OCL_GPU_GROUP;
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
    /* Elements per work-item: vec * group chunks in the vec kernel, one element in the any kernel. */
    const int64_t per_item[PC_NK][2] = {{(int64_t)p->vec_k * p->group, (int64_t)p->vec_v * p->group}, {1, 1}};
    for (int ki = 0; ki < PC_NK; ki++) {
        p->per_tok[ki] = (uint64_t)p->heads * (uint64_t)(p->hd_k / per_item[ki][0] + p->hd_v / per_item[ki][1]);
        p->per_launch[ki] = p->per_tok[ki] <= OCL_MAX_ITEMS ? OCL_MAX_ITEMS / p->per_tok[ki] : 0;
    }
}

bool ocl_paged_caching_supports(const ocl_device *d, const kvhal_bk_paged_caching *a, char *reason,
                                size_t reason_size)
{
    if (!dt_is_float(a->input_dtype) || !dt_is_float(a->cache_dtype))
        return kvhal_bk_refuse(reason, reason_size, "paged caching of %s into a cache of %s",
                                 kvhal_bk_dtype_name(a->input_dtype), kvhal_bk_dtype_name(a->cache_dtype));
    if (a->slot_dtype != KVHAL_I32 && a->slot_dtype != KVHAL_I64)
        return kvhal_bk_refuse(reason, reason_size, "slot_mapping dtype %s (i32 or i64 expected)",
                                 kvhal_bk_dtype_name(a->slot_dtype));
    if (a->num_heads < 1 || a->block_size < 1 || a->k.head_dim < 1 || a->v.head_dim < 1 || a->num_tokens < 1)
        return kvhal_bk_refuse(reason, reason_size, "paged caching without elements (%d heads, head dims %d/%d, "
                                 "%lld tokens)", (int)a->num_heads, (int)a->k.head_dim, (int)a->v.head_dim,
                                 (long long)a->num_tokens);
    /* The wide kernel's work-items of one token must fit one launch (the any-alignment kernel's are checked per
     * call: it runs only for misaligned offsets). */
    pc_plan p;
    make_plan(d, a, &p);
    if (p.per_launch[PC_VEC] == 0)
        return kvhal_bk_refuse(reason, reason_size, "%llu work-items per token exceed one launch (%llu) on '%s'",
                                 (unsigned long long)p.per_tok[PC_VEC], (unsigned long long)OCL_MAX_ITEMS, d->name);
    return true;
}

/* (scale, 1 / scale) for kv_div and its mode: 0 for 1, 1 for a power of two (x * inv is then exact), 2 for another
 * scale in [2^-64, 2^64] (the reciprocal with one correction), 3 otherwise. The core passes 1 for non-fp8 caches and
 * checks fp8 scales are finite and > 0. */
static cl_uint scale_mode(float scale, cl_float2 *sc)
{
    sc->s[0] = scale;
    sc->s[1] = 1.0f / scale;
    if (scale == 1.0f) return 0;
    int e;
    if (frexpf(scale, &e) == 0.5f) return 1;
    return scale >= 0x1p-64f && scale <= 0x1p64f ? 2 : 3;
}

/* The arguments the metadata fixes, on both kernels of a new kernel set; without fp8 the scales too (1). */
static kvhal_status pc_preset(ocl_device *d, const ocl_desc *base, ocl_kset *ks)
{
    const pc_desc *pd = (const pc_desc *)base;
    cl_mem err_flag = ks->ce->err_flag;
    kvhal_status st = KVHAL_OK;
    for (int ki = 0; ki < PC_NK && st == KVHAL_OK; ki++) {
        const ocl_karg strides[] = {OCL_KA(pd->kcs), OCL_KA(pd->kis)};
        const ocl_karg vstrides[] = {OCL_KA(pd->vcs), OCL_KA(pd->vis)};
        const ocl_karg tail[] = {OCL_KA(pd->ss), OCL_KA(err_flag), OCL_KA(pd->num_tokens), OCL_KA(pd->seq_len),
                                 OCL_KA(pd->num_slots)};
        st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_KCS, &strides[0], 1);
        if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_KIS, &strides[1], 1);
        if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_VCS, &vstrides[0], 1);
        if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_VIS, &vstrides[1], 1);
        if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_SS, tail, 5);
        if (st == KVHAL_OK && !pd->fp8) {
            cl_float2 one;
            cl_uint modes = scale_mode(1.0f, &one);
            const ocl_karg sc[] = {OCL_KA(one), OCL_KA(modes)};
            st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_K_SC, &sc[0], 1);
            if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_V_SC, &sc[0], 1);
            if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, ks->k[ki], pc_knames[ki], PC_ARG_MODES, &sc[1], 1);
        }
    }
    return st;
}

kvhal_status ocl_paged_caching_desc_create(ocl_device *d, const kvhal_bk_paged_caching *a, void **out)
{
    pc_desc *pd;
    kvhal_status st = kvhal__ocl_desc_alloc(d, KVHAL_BK_OP_PAGED_CACHING, sizeof *pd, (void **)&pd);
    if (st != KVHAL_OK) return st;
    pc_plan *p = &pd->p;
    make_plan(d, a, p);
    pd->fp8 = a->fp8;
    pd->kcs = (cl_long4){.s = {a->k.block_stride, a->k.offset_stride, a->k.cache_head_stride, a->k.cache_dim_stride}};
    const bool b = a->batched;
    pd->kis = (cl_long4){.s = {b ? a->k.tok_stride_outer : 0, a->k.tok_stride_inner, a->k.in_head_stride,
                               a->k.in_dim_stride}};
    pd->vcs = (cl_long4){.s = {a->v.block_stride, a->v.offset_stride, a->v.cache_head_stride, a->v.cache_dim_stride}};
    pd->vis = (cl_long4){.s = {b ? a->v.tok_stride_outer : 0, a->v.tok_stride_inner, a->v.in_head_stride,
                               a->v.in_dim_stride}};
    pd->ss = (cl_long2){.s = {b ? a->slot_stride_outer : 0, a->slot_stride_inner}};
    pd->num_tokens = 0;
    pd->seq_len = b ? (cl_ulong)a->seq_len : 0;
    pd->num_slots = a->num_slots;
    pd->base.knames = pc_knames;
    pd->base.nk = PC_NK;
    pd->base.preset = pc_preset;
    snprintf(pd->base.options, sizeof pd->base.options,
             "-DIN_DT=%d -DOUT_DT=%d -DSLOT_I64=%d -DHEADS=%d -DBLOCK_SIZE=%d -DHD_K=%d -DHD_V=%d -DVEC_K=%d "
             "-DVEC_V=%d -DGROUP=%d -DINTERLEAVE=%d -DKV_NV_HW=%d",
             p->in_dt, p->out_dt, p->slot_i64, p->heads, p->block_size, p->hd_k, p->hd_v, p->vec_k, p->vec_v,
             p->group, p->interleave, d->nv_fp8 ? 1 : 0);
    return kvhal__ocl_desc_build(d, &pd->base, (cl_mem)a->k.cache, ocl_paged_caching_desc_destroy, out);
}

void ocl_paged_caching_desc_destroy(ocl_device *d, void *desc)
{
    (void)d;
    kvhal__ocl_desc_free(desc);
}

kvhal_status ocl_paged_caching(void *ctx, int32_t id, void *desc, const kvhal_bk_paged_caching *a, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    kvhal_status st = kvhal__ocl_desc_check(d, desc, KVHAL_BK_OP_PAGED_CACHING);
    if (st != KVHAL_OK) return st;
    pc_desc *pd = desc;
    const pc_plan *p = &pd->p;
    cl_command_queue q;
    ocl_ctx *ce;
    ocl_kset *ks;
    st = kvhal__ocl_resolve(d, stream, (cl_mem)a->k.cache, &q, &ce);
    if (st == KVHAL_OK) st = kvhal__ocl_kset(d, &pd->base, ce, &ks);
    if (st != KVHAL_OK) return st;

    size_t slot_size = p->slot_i64 ? 8 : 4;
    bool vec = a->k.cache_offset % (size_t)p->lout_k == 0 && a->k.input_offset % (size_t)p->lin_k == 0 &&
               a->v.cache_offset % (size_t)p->lout_v == 0 && a->v.input_offset % (size_t)p->lin_v == 0 &&
               a->slots_offset % slot_size == 0;
    const int ki = vec ? PC_VEC : PC_ANY;
    if (p->per_launch[ki] == 0)
        return OCL_SET_ERROR(d->m, KVHAL_UNSUPPORTED, "opencl:%d: %llu work-items per token exceed one launch", id,
                             (unsigned long long)p->per_tok[ki]);

    cl_mem kc = (cl_mem)a->k.cache, kin = (cl_mem)a->k.input, vc = (cl_mem)a->v.cache, vin = (cl_mem)a->v.input;
    cl_mem slots = (cl_mem)a->slots;
    cl_ulong kc_off = a->k.cache_offset, ki_off = a->k.input_offset, vc_off = a->v.cache_offset,
             vi_off = a->v.input_offset, slots_off = a->slots_offset;
    cl_kernel k = ks->k[ki];
    const char *kname = pc_knames[ki];
    const ocl_karg kside[] = {OCL_KA(kc), OCL_KA(kc_off)}, kin_a[] = {OCL_KA(kin), OCL_KA(ki_off)};
    const ocl_karg vside[] = {OCL_KA(vc), OCL_KA(vc_off)}, vin_a[] = {OCL_KA(vin), OCL_KA(vi_off)};
    const ocl_karg slot_a[] = {OCL_KA(slots), OCL_KA(slots_off)};
    st = kvhal__ocl_set_args(d, k, kname, PC_ARG_KC, kside, 2);
    if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, k, kname, PC_ARG_KIN, kin_a, 2);
    if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, k, kname, PC_ARG_VC, vside, 2);
    if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, k, kname, PC_ARG_VIN, vin_a, 2);
    if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, k, kname, PC_ARG_SLOTS, slot_a, 2);
    if (st == KVHAL_OK && pd->fp8) {
        cl_float2 k_sc, v_sc;
        cl_uint modes = scale_mode(a->k.scale, &k_sc) | scale_mode(a->v.scale, &v_sc) << 2;
        const ocl_karg sc[] = {OCL_KA(k_sc), OCL_KA(v_sc), OCL_KA(modes)};
        st = kvhal__ocl_set_args(d, k, kname, PC_ARG_K_SC, &sc[0], 1);
        if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, k, kname, PC_ARG_V_SC, &sc[1], 1);
        if (st == KVHAL_OK) st = kvhal__ocl_set_args(d, k, kname, PC_ARG_MODES, &sc[2], 1);
    }
    if (st != KVHAL_OK) return st;
    const uint64_t per_tok = p->per_tok[ki], per_launch = p->per_launch[ki], tokens = (uint64_t)a->num_tokens;
    if (per_launch >= tokens) {
        /* one launch: (tok0 0, items) set only when the token count differs from the last call's */
        const cl_uint items = (cl_uint)(tokens * per_tok);
        if (ks->call_state[ki] != items) {
            cl_ulong tok0 = 0;
            const ocl_karg piece[] = {OCL_KA(tok0), OCL_KA(items)};
            st = kvhal__ocl_set_args(d, k, kname, PC_ARG_TOK0, piece, 2);
            if (st != KVHAL_OK) return st;
            ks->call_state[ki] = items;
        }
        return kvhal__ocl_launch(d, q, ks, ki, kname, tokens * per_tok, 0, NULL, NULL);
    }
    ks->call_state[ki] = 0; /* the pieces below change tok0 and items */
    for (uint64_t t0 = 0; t0 < tokens && st == KVHAL_OK; t0 += per_launch) {
        uint64_t n = tokens - t0 < per_launch ? tokens - t0 : per_launch;
        cl_ulong tok0 = t0;
        cl_uint items = (cl_uint)(n * per_tok);
        const ocl_karg piece[] = {OCL_KA(tok0), OCL_KA(items)};
        st = kvhal__ocl_set_args(d, k, kname, PC_ARG_TOK0, piece, 2);
        if (st == KVHAL_OK) st = kvhal__ocl_launch(d, q, ks, ki, kname, items, 0, NULL, NULL);
    }
    return st;
}

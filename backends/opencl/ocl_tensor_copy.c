/* ocl_tensor_copy.c — tensor_copy on OpenCL. The plan, made once per descriptor: size-1 dims dropped and dims
 * dense in both tensors merged; a copy that is then one dense range is clEnqueueCopyBuffer, any other runs
 * tensor_copy_vec (UNIT-byte units, where the innermost dim and every outer stride allow it) or, for offsets not
 * aligned to the unit, tensor_copy_any (elements), with the shapes, strides and launch split of both kernels set
 * when the kernels are made. A call sets only the memory and offsets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

_Static_assert(KVHAL_MAX_DIMS <= 8, "tensor_copy.cl takes shapes and strides as ulong8");

enum { TC_VEC = 0, TC_ANY = 1, TC_NK = 2 };
static const char *const tc_knames[TC_NK] = {"tensor_copy_vec", "tensor_copy_any"};
/* Argument indices of the kernels (tensor_copy.cl). */
enum { TC_ARG_DST = 0, TC_ARG_DST_OFF = 1, TC_ARG_SRC = 2, TC_ARG_SRC_OFF = 3, TC_ARG_SHAPE = 4, TC_ARG_BASE = 7 };

/* tensor_copy after dropping size-1 dims and merging dims dense in both tensors. */
typedef struct tc_layout {
    int32_t ndim; /* 0: no elements */
    uint64_t shape[KVHAL_MAX_DIMS], ds[KVHAL_MAX_DIMS], ss[KVHAL_MAX_DIMS];
} tc_layout;

/* What one kernel is launched with: shape and strides in its units, and its unit count. */
typedef struct tc_launch {
    cl_ulong8 shape, ds, ss;
    cl_ulong total;
    cl_uint small; /* total fits 32 bits: cheaper index math */
} tc_launch;

typedef struct tc_desc {
    ocl_desc base;
    int32_t ndim, esize, vec, contiguous;
    size_t bytes; /* contiguous copies: their length */
    tc_launch run[TC_NK];
} tc_desc;

static void coalesce(const kvhal_bk_tensor_copy *a, tc_layout *L)
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

bool ocl_tensor_copy_supports(const ocl_device *d, const kvhal_bk_tensor_copy *a, char *reason, size_t reason_size)
{
    (void)d;
    if ((int32_t)kvhal_bk_dtype_size(a->dst.dtype) == 0 || a->dst.dtype != a->src.dtype || a->dst.ndim != a->src.ndim ||
        a->dst.ndim < 0 || a->dst.ndim > KVHAL_MAX_DIMS)
        return kvhal_bk_refuse(reason, reason_size, "tensor_copy of dtype %s/%s, ndim %d/%d",
                                 kvhal_bk_dtype_name(a->dst.dtype), kvhal_bk_dtype_name(a->src.dtype), a->dst.ndim, a->src.ndim);
    for (int32_t i = 0; i < a->dst.ndim; i++)
        if (a->dst.shape[i] != a->src.shape[i] || a->dst.shape[i] < 0 || a->dst.strides[i] < 0 ||
            a->src.strides[i] < 0)
            return kvhal_bk_refuse(reason, reason_size, "tensor_copy dim %d: shape %lld/%lld, strides %lld/%lld",
                                     i, (long long)a->dst.shape[i], (long long)a->src.shape[i],
                                     (long long)a->dst.strides[i], (long long)a->src.strides[i]);
    return true;
}

static kvhal_status tc_preset(ocl_device *d, const ocl_desc *base, ocl_kset *ks)
{
    const tc_desc *td = (const tc_desc *)base;
    kvhal_status st = KVHAL_OK;
    for (int ki = 0; ki < TC_NK && st == KVHAL_OK; ki++) {
        const tc_launch *r = &td->run[ki];
        cl_ulong base0 = 0;
        const ocl_karg args[] = {OCL_KA(r->shape), OCL_KA(r->ds),    OCL_KA(r->ss),
                                 OCL_KA(base0),    OCL_KA(r->total), OCL_KA(r->small)};
        /* base changes per launch only when one launch cannot take every unit */
        st = kvhal__ocl_set_args(d, ks->k[ki], tc_knames[ki], TC_ARG_SHAPE, args, 6);
    }
    return st;
}

kvhal_status ocl_tensor_copy_desc_create(ocl_device *d, const kvhal_bk_tensor_copy *a, void **out)
{
    tc_desc *td;
    kvhal_status st = kvhal__ocl_desc_alloc(d, KVHAL_BK_OP_TENSOR_COPY, sizeof *td, (void **)&td);
    if (st != KVHAL_OK) return st;
    tc_layout L;
    coalesce(a, &L);
    td->esize = (int32_t)kvhal_bk_dtype_size(a->dst.dtype);
    td->ndim = L.ndim;
    if (L.ndim > 0) {
        int32_t n = L.ndim;
        td->contiguous = n == 1 && L.ds[0] == 1 && L.ss[0] == 1;
        td->bytes = (size_t)L.shape[0] * (size_t)td->esize;
        td->vec = 1;
        if (!td->contiguous && L.ds[n - 1] == 1 && L.ss[n - 1] == 1) {
            int32_t v = 16 / td->esize;
            for (; v > 1; v /= 2) {
                bool ok = L.shape[n - 1] % (uint64_t)v == 0;
                for (int32_t i = 0; i < n - 1 && ok; i++)
                    ok = L.ds[i] % (uint64_t)v == 0 && L.ss[i] % (uint64_t)v == 0;
                if (ok) break;
            }
            td->vec = v;
        }
        /* Both kernels' shapes and strides: the vec kernel counts UNIT-byte units (the innermost dim divided by
         * vec, the outer strides too), the any kernel elements. */
        for (int ki = 0; ki < TC_NK; ki++) {
            tc_launch *r = &td->run[ki];
            uint64_t div = ki == TC_VEC && td->vec > 1 ? (uint64_t)td->vec : 1;
            r->total = 1;
            for (int32_t i = 0; i < n; i++) {
                bool inner = i == n - 1;
                r->shape.s[i] = inner ? L.shape[i] / div : L.shape[i];
                r->ds.s[i] = inner ? L.ds[i] : L.ds[i] / div;
                r->ss.s[i] = inner ? L.ss[i] : L.ss[i] / div;
                r->total *= r->shape.s[i];
            }
            r->small = r->total <= 0xffffffffu;
        }
    }
    td->base.knames = tc_knames;
    td->base.nk = td->ndim == 0 || td->contiguous ? 0 : TC_NK; /* contiguous copies are clEnqueueCopyBuffer */
    td->base.preset = tc_preset;
    snprintf(td->base.options, sizeof td->base.options, "-DNDIM=%d -DESIZE=%d -DUNIT=%d", td->ndim, td->esize,
             td->vec * td->esize);
    return kvhal__ocl_desc_build(d, &td->base, (cl_mem)a->dst.native, ocl_tensor_copy_desc_destroy, out);
}

void ocl_tensor_copy_desc_destroy(ocl_device *d, void *desc)
{
    (void)d;
    kvhal__ocl_desc_free(desc);
}

kvhal_status ocl_tensor_copy(void *ctx, int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    OCL_GET_DEVICE(ctx, id, d);
    kvhal_status st = kvhal__ocl_desc_check(d, desc, KVHAL_BK_OP_TENSOR_COPY);
    if (st != KVHAL_OK) return st;
    tc_desc *td = desc;
    if (td->ndim == 0) return KVHAL_OK;
    cl_command_queue q;
    ocl_ctx *ce;
    st = kvhal__ocl_resolve(d, stream, (cl_mem)a->dst.native, &q, &ce);
    if (st != KVHAL_OK) return st;
    if (td->contiguous)
        return kvhal__ocl_copy(d, q, ce, (cl_mem)a->dst.native, a->dst.offset, (cl_mem)a->src.native, a->src.offset,
                               td->bytes);
    ocl_kset *ks;
    st = kvhal__ocl_kset(d, &td->base, ce, &ks);
    if (st != KVHAL_OK) return st;

    size_t unit = (size_t)td->vec * (size_t)td->esize;
    const int ki = a->dst.offset % unit == 0 && a->src.offset % unit == 0 ? TC_VEC : TC_ANY;
    cl_mem dst = (cl_mem)a->dst.native, src = (cl_mem)a->src.native;
    cl_ulong dst_off = a->dst.offset, src_off = a->src.offset;
    const ocl_karg args[] = {OCL_KA(dst), OCL_KA(dst_off), OCL_KA(src), OCL_KA(src_off)};
    st = kvhal__ocl_set_args(d, ks->k[ki], tc_knames[ki], TC_ARG_DST, args, 4);
    const uint64_t total = td->run[ki].total;
    for (uint64_t b = 0; b < total && st == KVHAL_OK; b += OCL_MAX_ITEMS) {
        uint64_t items = total - b < OCL_MAX_ITEMS ? total - b : OCL_MAX_ITEMS;
        if (total > OCL_MAX_ITEMS) {
            cl_ulong base = b;
            const ocl_karg piece[] = {OCL_KA(base)};
            st = kvhal__ocl_set_args(d, ks->k[ki], tc_knames[ki], TC_ARG_BASE, piece, 1);
        }
        if (st == KVHAL_OK) st = kvhal__ocl_launch(d, q, ks, ki, tc_knames[ki], items, 0, NULL, NULL);
    }
    return st;
}

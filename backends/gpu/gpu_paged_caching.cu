/* gpu_paged_caching.cu — the paged-caching op of the GPU backends: what the kernels support, the descriptor (the
 * kernel instantiations, unit strides, divisors and launch geometry of the vector and scalar paths) and the launch.
 * The kernels are paged_caching_kernel's instantiations in kvhal_gpu_kernels.cuh, all of them launched from here. */
#include "gpu_private.h"

namespace kvhal_gpu {
namespace {

template <class X> void launch_paged(const PagedParams &p, uint32_t grid, uint32_t threads, gpuStream_t s)
{
    paged_caching_kernel<X, X><<<grid, threads, 0, s>>>(p);
}

/* One instantiation of the paged kernel: its runtime launch, its symbol, and (CUDA, once resolved for the
 * descriptor's device) its driver function, launched through cuLaunchKernel: the runtime's launch path costs
 * about 0.3 us more per call on an H200. */
struct PagedLaunch {
    void (*run)(const PagedParams &p, uint32_t grid, uint32_t threads, gpuStream_t s);
    const void *sym;
    void *fn;
    const char *(*spelling)(); /* X's C++ spelling, for the run-time compiled path (HIP on AMD) */
    int unroll;                /* units each thread loads per pass (PagedGeom<X>::UNROLL), per side or in all */
    bool rows;                 /* the row form (PagedGeom<X>::ROWS): a token's units are K's row plus V's */
    int min_blocks;            /* resident blocks per multiprocessor it is compiled for (PagedGeom<X>::MIN_BLOCKS) */
};

template <class X> PagedLaunch paged_launcher()
{
    PagedLaunch l = {launch_paged<X>, reinterpret_cast<const void *>(paged_caching_kernel<X, X>), nullptr,
                     type_spelling<X>, (int)PagedGeom<X>::UNROLL, PagedGeom<X>::ROWS != 0,
                     (int)PagedGeom<X>::MIN_BLOCKS};
    return l;
}

/* l->fn: the driver function of l's kernel on device id, or NULL (not resolvable: the runtime launches); HIP: the
 * run-time compiled kernel where the device has no embedded code object (gpu_codepath.cu), else NULL. */
kvhal_status resolve_driver_fn(Ctx *c, int32_t id, PagedLaunch *l)
{
    l->fn = nullptr;
#if !defined(KVHAL_GPU_HIP)
    void *none = nullptr; /* CUDA: fails only for a device the module has no code for (gpu_codepath.cu) */
    const kvhal_status st = kernel_fn(c, id, "", &none);
    if (st != KVHAL_OK) return st;
    cudaFunction_t f;
    const DeviceGuard guard;
    if (c->cu_launch && guard.select(id) == cudaSuccess && cudaGetFuncBySymbol(&f, l->sym) == cudaSuccess)
        l->fn = static_cast<void *>(f);
    (void)cudaGetLastError();
    return KVHAL_OK;
#else
    char expr[384] = "";
#if defined(KVHAL_GPU_RTC)
    kernel_expr(expr, sizeof expr, "kvhal_gpu::paged_caching_kernel<%s, %s>", l->spelling());
#endif
    return kernel_fn(c, id, expr, &l->fn);
#endif
}

struct PagedDesc {
    PagedParams pv, ps;                           /* vector and scalar templates (unit strides, divisors) */
    bool fast32_shape; /* num_slots and seq_len allow 32-bit divisions; the token count decides per call */
    PagedLaunch vec[3], sc[3];                    /* by scale mode (SM_MUL, SM_RCP, SM_DIV); one for copies */
    PagedLaunch vec_wave[3]; /* the vector path's kernels for a call that fits in one wave (KVHAL_GPU_WAVE_KERNELS) */
    bool wave;               /* vec_wave is built */
    uint32_t out_align; /* bytes the cache bases need on the vector path (inputs need 16) */
    bool vec_ok, fp8;   /* fp8: the kernels convert to the fp8 cache with the call's scales */
    bool fnuz;          /* an fnuz cache: the vector path's MUL/RCP kernels take s / 2 and 2 / s */
};

int kdt(kvhal_dtype d)
{
    switch (d) {
    case KVHAL_F32: return DT_F32;
    case KVHAL_F16: return DT_F16;
    case KVHAL_BF16: return DT_BF16;
    case KVHAL_FP8_E4M3: return DT_E4M3;
    case KVHAL_FP8_E5M2: return DT_E5M2;
    case KVHAL_FP8_E4M3FNUZ: return DT_E4M3FNUZ;
    case KVHAL_FP8_E5M2FNUZ: return DT_E5M2FNUZ;
    default: return -1;
    }
}

/* The vector path's kernel shapes, both the row form (Rows): as many units in flight per thread as the per-side form,
 * it lifts the MLA rows (one 64-unit side beside an 8-unit one, which left most threads idle on V) and matches the
 * others on an H100; fp8 rows of at least KVHAL_GPU_ROWS_FP8_LONG units per token (llama-sized heads: 256 units for
 * 8 x 128 bf16 per side) gain from 2 units per thread at 16 resident blocks (more warps to overlap the conversion
 * with the loads: +0.01 to +0.02 at 8192 tokens), which is no better for shorter rows (an MLA row makes 3-token
 * blocks, more than one wave of them). Each is built with hints H (KVHAL_GPU_ROW_HINTS, or KVHAL_GPU_WAVE_HINTS for
 * a call of one wave). */
enum {
    VS_ROWS = 0,   /* 2 * KVHAL_GPU_PAGED_UNROLL units per thread, KVHAL_GPU_PAGED_MIN_BLOCKS */
    VS_ROWS_2 = 1, /* 2 units per thread, 16 resident blocks (fp8 of long rows) */
    VS_COUNT = 2
};
#define KVHAL_GPU_ROWS_FP8_LONG 128

/* The hints apply to the transforms that take them (HintsOk: the OCP fp8 conversions with a multiply or the
 * reciprocal, and the copies); the others run the plain shape of the same geometry. The fnuz formats stay off them:
 * their trimmed form (packed OCP conversions, a test per 16 bytes) ran bf16 input at 0.57 of cudaMemcpy on the
 * H200, against 0.87 on the plain shape. */
template <class X> struct HintsOk {
    enum { value = 1 };
};
template <int IN, int OUT> struct HintsOk<XFp8Vec<IN, OUT, SM_DIV>> {
    enum { value = 0 };
};
template <int IN, int OUT, int MODE> struct HintsOk<XFp8VecFnuz<IN, OUT, MODE>> {
    enum { value = 0 };
};

template <class X, int H> PagedLaunch vec_launcher(int shape)
{
    enum { HX = HintsOk<X>::value ? H : 0 };
    if (shape == VS_ROWS_2) return paged_launcher<Rows<X, 2, 16, HX>>();
    return paged_launcher<Rows<X, 2 * KVHAL_GPU_PAGED_UNROLL, KVHAL_GPU_PAGED_MIN_BLOCKS, HX>>();
}

/* vec < 0: the scalar path; else the vector path's shape (VS_*) with hints H */
template <int IN, int OUT, int MODE, int H> PagedLaunch fp8_launcher(int vec)
{
    return vec >= 0 ? vec_launcher<XFp8Vec<IN, OUT, MODE>, H>(vec) : paged_launcher<XFp8Scalar<IN, OUT, MODE>>();
}

/* fnuz: the vector path converts q2 = 2 * (x / s) through the OCP conversion (XFp8VecFnuz; for SM_MUL and SM_RCP
 * the call passes s / 2 and 2 / s). */
template <int IN, int OUT, int MODE, int H> PagedLaunch fp8_launcher_fnuz(int vec)
{
    return vec >= 0 ? vec_launcher<XFp8VecFnuz<IN, OUT, MODE>, H>(vec) : paged_launcher<XFp8Scalar<IN, OUT, MODE>>();
}

template <int IN, int MODE, int H> PagedLaunch fp8_launcher_out(int out, int vec)
{
    switch (out) {
    case DT_E4M3: return fp8_launcher<IN, DT_E4M3, MODE, H>(vec);
    case DT_E5M2: return fp8_launcher<IN, DT_E5M2, MODE, H>(vec);
    case DT_E4M3FNUZ: return fp8_launcher_fnuz<IN, DT_E4M3FNUZ, MODE, H>(vec);
    default: return fp8_launcher_fnuz<IN, DT_E5M2FNUZ, MODE, H>(vec);
    }
}

template <int MODE, int H> PagedLaunch fp8_launcher_in(int in, int out, int vec)
{
    switch (in) {
    case DT_F32: return fp8_launcher_out<DT_F32, MODE, H>(out, vec);
    case DT_F16: return fp8_launcher_out<DT_F16, MODE, H>(out, vec);
    default: return fp8_launcher_out<DT_BF16, MODE, H>(out, vec);
    }
}

/* The three scale modes' kernels of an fp8 cache, for the scalar path (vec < 0) or a vector shape with hints H. */
template <int H> void fp8_launchers(int in, int out, int vec, PagedLaunch *l)
{
    l[SM_MUL] = fp8_launcher_in<SM_MUL, H>(in, out, vec);
    l[SM_RCP] = fp8_launcher_in<SM_RCP, H>(in, out, vec);
    l[SM_DIV] = fp8_launcher_in<SM_DIV, H>(in, out, vec);
}

/* Same-dtype copies: the scalar path by element size, or the vector path's row form with hints H; wide = twice the
 * units per thread, for KVHAL_GPU_PAGED_WIDE_MIN_BLOCKS resident blocks (rows of at least 64 units, 1 KiB). */
template <int H> PagedLaunch copy_launcher(size_t es, bool vec, bool wide)
{
    if (vec && wide)
        return paged_launcher<Rows<XCopy<uint4>, 4 * KVHAL_GPU_PAGED_UNROLL, KVHAL_GPU_PAGED_WIDE_MIN_BLOCKS, H>>();
    if (vec) return vec_launcher<XCopy<uint4>, H>(VS_ROWS);
    switch (es) {
    case 1: return paged_launcher<XCopy<uint8_t>>();
    case 2: return paged_launcher<XCopy<uint16_t>>();
    default: return paged_launcher<XCopy<uint32_t>>();
    }
}

/* One side in units of n elements (n = 1: scalar path). Strides that cannot matter for this call (a dim of extent
 * 1) are zeroed, so they neither block the vector path nor move an address. False when the path is impossible for
 * this side (for n = 1: a token row too large for the kernel's 32-bit unit indices). */
bool build_side(const kvhal_bk_paged_side *s, const kvhal_bk_paged_caching *a, int64_t n, PagedSide *o)
{
    const int64_t heads = a->num_heads, hd = s->head_dim;
    const bool fold = heads == 1 || (s->in_head_stride == hd * s->in_dim_stride &&
                                     s->cache_head_stride == hd * s->cache_dim_stride);
    const int64_t eh = fold ? 1 : heads, ed = fold ? heads * hd : hd; /* heads and elements per head, as walked */
    int64_t tok_outer = a->batched ? s->tok_stride_outer : 0;
    /* count-independent (the descriptor serves every token count): a flat call's inner stride always counts */
    int64_t tok_inner = (!a->batched || a->seq_len > 1) ? s->tok_stride_inner : 0;
    int64_t in_head = eh > 1 ? s->in_head_stride : 0, cache_head = eh > 1 ? s->cache_head_stride : 0;
    int64_t block_stride = a->num_blocks > 1 ? s->block_stride : 0;
    int64_t offset_stride = a->block_size > 1 ? s->offset_stride : 0;
    int64_t in_dim = ed > 1 ? s->in_dim_stride : 0, cache_dim = ed > 1 ? s->cache_dim_stride : 0;
    if (n > 1) {
        if (ed % n || in_dim != 1 || cache_dim != 1) return false;
        if (tok_outer % n || tok_inner % n || in_head % n || cache_head % n || block_stride % n || offset_stride % n)
            return false;
        tok_outer /= n, tok_inner /= n, in_head /= n, cache_head /= n, block_stride /= n, offset_stride /= n;
        in_dim = cache_dim = 1;
    }
    const int64_t uph = ed / n, row = eh * uph;
    if (uph < 1 || row > (int64_t)(1u << 31) / KVHAL_GPU_MAX_TPC) return false;
    o->one_run = eh == 1 && in_dim == 1 && cache_dim == 1;
    o->in_run = in_dim == 1 && (eh == 1 || in_head == uph);
    o->cache = NULL;
    o->input = NULL;
    o->block_stride = block_stride;
    o->offset_stride = offset_stride;
    o->cache_head = cache_head;
    o->cache_dim = cache_dim;
    o->tok_outer = tok_outer;
    o->tok_inner = tok_inner;
    o->in_head = in_head;
    o->in_dim = in_dim;
    o->scale = 1.0f;
    o->inv = 1.0f;
    o->row_units = (uint32_t)row;
    o->div_row = kvhal_fastdiv32_make((uint32_t)row);
    o->div_head = kvhal_fastdiv32_make((uint32_t)uph);
    return true;
}

/* Tokens per block: enough units per thread to keep unroll loads in flight (the kernel's PagedGeom), fewer when the
 * call is too small to fill every multiprocessor several times over. A token's units: its longer side's row in
 * the per-side form, both rows in the row form. */
void paged_geometry(PagedParams *p, int sm_count, int unroll, bool rows, uint32_t *threads)
{
    const uint32_t row = rows ? p->k.row_units + p->v.row_units
                              : (p->k.row_units > p->v.row_units ? p->k.row_units : p->v.row_units);
    int64_t tpc = (int64_t)(KVHAL_GPU_PAGED_THREADS * unroll) / row;
    if (tpc < 1) tpc = 1;
    if (tpc > KVHAL_GPU_MAX_TPC) tpc = KVHAL_GPU_MAX_TPC;
    while (tpc > 1 && (p->num_tokens + tpc - 1) / tpc < 4 * (int64_t)sm_count) tpc >>= 1;
    if (tpc > p->num_tokens) tpc = p->num_tokens > 0 ? p->num_tokens : 1;
    p->tpc = (int32_t)tpc;
    const uint64_t work = (uint64_t)tpc * row;
    uint32_t t = KVHAL_GPU_PAGED_THREADS;
    if (work < KVHAL_GPU_PAGED_THREADS) t = (uint32_t)((work + 63) / 64 * 64);
    *threads = t;
}

/* a passed paged_caching_supports, so the scalar path always builds; the vector path may not. The caller has
 * allocated the device's error flag. Fails only where the device's kernels must be compiled at run time. */
kvhal_status paged_build(Ctx *c, int32_t id, const kvhal_bk_paged_caching *a, PagedDesc *d)
{
    const int in = kdt(a->input_dtype), out = kdt(a->cache_dtype);
    const size_t es = kvhal_bk_dtype_size(a->input_dtype), out_es = kvhal_bk_dtype_size(a->cache_dtype);
    const bool same = a->input_dtype == a->cache_dtype;
    memset(d, 0, sizeof *d);
    d->fp8 = !same;
    d->fnuz = out == DT_E4M3FNUZ || out == DT_E5M2FNUZ;
    PagedParams base;
    memset(&base, 0, sizeof base);
    base.slot_outer = a->batched ? a->slot_stride_outer : 0;
    base.slot_inner = a->slot_stride_inner;
    base.seq_len = a->seq_len;
    base.num_tokens = a->num_tokens;
    base.num_slots = a->num_slots;
    base.block_size = a->block_size;
    base.slot64 = a->slot_dtype == KVHAL_I64;
    base.batched = a->batched;
    /* block_size is an int32_t, so within fastdiv32's divisor range (<= 2^31) */
    /* a flat call's seq_len is its token count, which the kernel never divides by (batched is 0) */
    d->fast32_shape = base.num_slots <= (int64_t)UINT32_MAX && (!a->batched || a->seq_len <= ((int64_t)1 << 31));
    if (d->fast32_shape) {
        base.div_bs = kvhal_fastdiv32_make((uint32_t)a->block_size);
        base.div_seq = kvhal_fastdiv32_make(a->batched ? (uint32_t)a->seq_len : 1u);
    }
    base.err = c->dev[id].dflag;

    d->ps = base;
    (void)build_side(&a->k, a, 1, &d->ps.k);
    (void)build_side(&a->v, a, 1, &d->ps.v);

    const int64_t vec = 16 / (int64_t)es; /* elements per 16 input bytes */
    d->pv = base;
    d->vec_ok = build_side(&a->k, a, vec, &d->pv.k) && build_side(&a->v, a, vec, &d->pv.v);
    d->out_align = (uint32_t)(vec * (int64_t)out_es);

    d->wave = KVHAL_GPU_WAVE_KERNELS;
    if (same) {
        const uint32_t row = d->pv.k.row_units > d->pv.v.row_units ? d->pv.k.row_units : d->pv.v.row_units;
        const bool wide = d->vec_ok && row >= 64;
        d->sc[SM_MUL] = copy_launcher<0>(es, false, false);
        d->vec[SM_MUL] = copy_launcher<KVHAL_GPU_ROW_HINTS>(es, true, wide);
        if (d->wave) d->vec_wave[SM_MUL] = copy_launcher<KVHAL_GPU_WAVE_HINTS>(es, true, wide);
    } else {
        const bool long_rows = d->pv.k.row_units + d->pv.v.row_units >= KVHAL_GPU_ROWS_FP8_LONG;
        const int shape = long_rows ? VS_ROWS_2 : VS_ROWS;
        fp8_launchers<0>(in, out, -1, d->sc);
        fp8_launchers<KVHAL_GPU_ROW_HINTS>(in, out, shape, d->vec);
        if (d->wave) fp8_launchers<KVHAL_GPU_WAVE_HINTS>(in, out, shape, d->vec_wave);
    }
    /* the driver functions (CUDA) or run-time compiled kernels (HIP on AMD without an embedded code object) of every
     * launch the descriptor may make; the vector path's only where the shape allows it */
    kvhal_status st = KVHAL_OK;
    for (int m = 0; m < (same ? 1 : 3) && st == KVHAL_OK; m++) {
        st = resolve_driver_fn(c, id, &d->sc[m]);
        if (st == KVHAL_OK && d->vec_ok) st = resolve_driver_fn(c, id, &d->vec[m]);
        if (st == KVHAL_OK && d->vec_ok && d->wave) st = resolve_driver_fn(c, id, &d->vec_wave[m]);
    }
    return st;
}

} // namespace

#if defined(KVHAL_GPU_RTC)
void paged_caching_rtc_exprs(RtcExprFn add, void *user)
{
    static const int ins[3] = {DT_F32, DT_F16, DT_BF16};
    static const int outs[4] = {DT_E4M3, DT_E5M2, DT_E4M3FNUZ, DT_E5M2FNUZ};
    static const size_t sizes[3] = {1, 2, 4};
    static_assert(!KVHAL_GPU_WAVE_KERNELS, "the run-time compiled module builds no one-wave kernels");
    char expr[384];
    /* the scalar path, then the vector path's shapes (VS_*) */
    for (int vec = -1; vec < VS_COUNT; vec++) {
        PagedLaunch l[3 + 3 * 4 * 3];
        int n = 0;
        if (vec < 0)
            for (int i = 0; i < 3; i++) l[n++] = copy_launcher<0>(sizes[i], false, false);
        else if (vec == VS_ROWS) /* the vector copies: narrow and wide */
            for (int w = 0; w < 2; w++) l[n++] = copy_launcher<KVHAL_GPU_ROW_HINTS>(16, true, w != 0);
        for (int i = 0; i < 3; i++)
            for (int o = 0; o < 4; o++, n += 3) fp8_launchers<KVHAL_GPU_ROW_HINTS>(ins[i], outs[o], vec, &l[n]);
        for (int i = 0; i < n; i++) {
            kernel_expr(expr, sizeof expr, "kvhal_gpu::paged_caching_kernel<%s, %s>", l[i].spelling());
            add(user, expr);
        }
    }
}
#endif

/* The kernels copy a cache of the input's dtype (1, 2 or 4 bytes) or convert f32/f16/bf16 to fp8, with i32 or i64
 * slots and a token row of at most 2^31 / KVHAL_GPU_MAX_TPC elements. */
bool paged_caching_supports(Ctx *c, int32_t id, const kvhal_bk_paged_caching *a, char *reason, size_t reason_size)
{
    (void)c;
    (void)id;
    const int in = kdt(a->input_dtype), out = kdt(a->cache_dtype);
    if (in < 0 || out < 0 || (a->input_dtype != a->cache_dtype && (in > DT_BF16 || !a->fp8)))
        return kvhal_bk_refuse(reason, reason_size, "the cache must have the input's dtype, or be fp8 with f32/f16/bf16 "
                      "input (input %s, cache %s)", kvhal_bk_dtype_name(a->input_dtype), kvhal_bk_dtype_name(a->cache_dtype));
    if (a->slot_dtype != KVHAL_I32 && a->slot_dtype != KVHAL_I64)
        return kvhal_bk_refuse(reason, reason_size, "slot_mapping dtype %s is not i32 or i64", kvhal_bk_dtype_name(a->slot_dtype));
    if (a->num_heads < 1 || a->k.head_dim < 1 || a->v.head_dim < 1 || a->block_size < 1 || a->seq_len < 1)
        return kvhal_bk_refuse(reason, reason_size, "heads %d, head dims %d/%d, block size %d, seq_len %lld must all be >= 1",
                      (int)a->num_heads, (int)a->k.head_dim, (int)a->v.head_dim, (int)a->block_size,
                      (long long)a->seq_len);
    PagedSide scratch;
    if (!build_side(&a->k, a, 1, &scratch) || !build_side(&a->v, a, 1, &scratch))
        return kvhal_bk_refuse(reason, reason_size, "a token row of %d heads x %d/%d dims is too large for the kernel",
                      (int)a->num_heads, (int)a->k.head_dim, (int)a->v.head_dim);
    return true;
}

kvhal_status paged_caching_desc_create(Ctx *c, int32_t id, const kvhal_bk_paged_caching *a, void **desc)
{
    kvhal_status st = open_device(c, id);
    if (st != KVHAL_OK) return st;
    void *d = NULL;
    st = host_alloc(c, id, sizeof(PagedDesc), "paged caching descriptor", &d);
    if (st != KVHAL_OK) return st;
    st = paged_build(c, id, a, static_cast<PagedDesc *>(d));
    if (st != KVHAL_OK) {
        free(d);
        return st;
    }
    *desc = d;
    return KVHAL_OK;
}

void paged_caching_desc_destroy(Ctx *c, int32_t id, void *desc)
{
    (void)c;
    (void)id;
    free(desc);
}

kvhal_status gpu_paged_caching(void *ctx, int32_t id, void *desc, const kvhal_bk_paged_caching *a, void *stream)
{
    Ctx *c = ctx_of(ctx);
    PagedDesc local;
    const PagedDesc *d = static_cast<const PagedDesc *>(desc);
    if (!d) {
        kvhal_status st = check_id(c, id);
        if (st == KVHAL_OK) st = open_device(c, id);
        if (st == KVHAL_OK) st = paged_build(c, id, a, &local);
        if (st != KVHAL_OK) return st;
        d = &local;
    }
    if (a->num_tokens <= 0) return KVHAL_OK;
    KVHAL_GPU_SETDEV(c, id);
    char *kc = static_cast<char *>(a->k.cache) + a->k.cache_offset;
    char *vc = static_cast<char *>(a->v.cache) + a->v.cache_offset;
    const char *ki = static_cast<const char *>(a->k.input) + a->k.input_offset;
    const char *vi = static_cast<const char *>(a->v.input) + a->v.input_offset;
    const bool vec = d->vec_ok && (((uintptr_t)ki | (uintptr_t)vi) & 15u) == 0 &&
                     (((uintptr_t)kc | (uintptr_t)vc) % d->out_align) == 0;
    const int mode = d->fp8 ? kvhal_gpu_scale_mode(a->k.scale, a->v.scale) : SM_MUL;
    PagedParams p = vec ? d->pv : d->ps;
    p.k.cache = kc;
    p.v.cache = vc;
    p.k.input = ki;
    p.v.input = vi;
    if (d->fp8) {
        /* XFp8VecFnuz works on twice the quotient: halving s and doubling 1/s are exact for the scales that take it
         * (a power of two with a normal reciprocal, or [2^-64, 2^64]) */
        const float f = d->fnuz && vec && mode != SM_DIV ? 2.0f : 1.0f;
        p.k.scale = a->k.scale / f;
        p.k.inv = f / a->k.scale;
        p.v.scale = a->v.scale / f;
        p.v.inv = f / a->v.scale;
    }
    p.slots = static_cast<const char *>(a->slots) + a->slots_offset;
    p.num_tokens = a->num_tokens;
    p.seq_len = a->seq_len;
    p.fast32 = d->fast32_shape && a->num_tokens <= (int64_t)UINT32_MAX;
    uint32_t threads;
    const PagedLaunch *runp = vec ? &d->vec[mode] : &d->sc[mode];
    /* tokens per block follow the token count */
    paged_geometry(&p, c->dev[id].sm_count, runp->unroll, runp->rows, &threads);
    /* depends on the path (tokens per block), which depends on the call's addresses: checked here, not in
     * paged_caching_supports */
    const int64_t grid = (a->num_tokens + p.tpc - 1) / p.tpc;
    /* a call whose blocks are all resident at once (one wave) runs the same shape with the one-wave hints */
    if (vec && d->wave && grid <= (int64_t)c->dev[id].sm_count * runp->min_blocks) runp = &d->vec_wave[mode];
    const PagedLaunch &run = *runp;
    if (grid > 0x7fffffff)
        return fail(c, KVHAL_UNSUPPORTED, "num_tokens: %lld is too many for one launch", (long long)a->num_tokens);
#if !defined(KVHAL_GPU_HIP)
    if (run.fn) {
        /* a thread that has not used the runtime yet has no current context (KVHAL_BUSY): the runtime's launch
         * makes one */
        const kvhal_status ls = driver_launch(c, id, run.fn, (uint32_t)grid, threads, static_cast<void *>(&p),
                                              native_stream(stream), "paged caching launch");
        if (ls != KVHAL_BUSY) return ls;
    }
#else
    if (run.fn) return launch_fn(c, id, run.fn, (uint32_t)grid, threads, &p, native_stream(stream), "paged caching launch");
#endif
    run.run(p, (uint32_t)grid, threads, native_stream(stream));
    KVHAL_GPU_TRY(c, gpuGetLastError(), id, "paged caching launch");
    return KVHAL_OK;
}

const void *paged_caching_one_kernel(void)
{
    return reinterpret_cast<const void *>(paged_caching_kernel<XCopy<uint16_t>, XCopy<uint16_t>>);
}

} // namespace kvhal_gpu

/* cpu_ops.c — the CPU backend's ops: paged caching, copy_blocks, tensor_copy and copy_batch on host memory.
 * Work is synchronous. Slots are host-readable here, so paged caching checks every slot before it writes anything:
 * an out-of-range slot fails the call with the cache untouched (GPU backends skip it and raise a device flag).
 * The descriptor records which copy loop fits the call's strides and dtypes, so a call does no planning.
 * Large writes (a prefill's worth of tokens) use non-temporal stores: they skip the read-for-ownership of every
 * destination line, which is a third of the memory traffic of a scattered copy that does not fit the caches. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cpu_ops.h"
#include "kvhal_numerics.h"

/* How one side (K or V) of a paged-caching call moves a token. */
typedef enum {
    MOVE_TOKEN,   /* same dtype, [heads, dim] dense on both sides: one memcpy per token */
    MOVE_ROW,     /* same dtype, dim contiguous on both sides: one memcpy per (token, head) */
    MOVE_CONVERT, /* fp8 cache, dim contiguous on both sides: a conversion loop per (token, head) */
    MOVE_GENERIC  /* anything else: element by element */
} move_kind;

typedef struct cpu_desc {
    kvhal_bk_op op;
    move_kind k_move, v_move;
} cpu_desc;

static move_kind plan_side(const kvhal_bk_paged_side *s, kvhal_dtype in, kvhal_dtype cache, int32_t heads)
{
    bool rows = s->in_dim_stride == 1 && s->cache_dim_stride == 1;
    if (in != cache) return rows ? MOVE_CONVERT : MOVE_GENERIC;
    if (!rows) return MOVE_GENERIC;
    if (heads == 1 || (s->in_head_stride == s->head_dim && s->cache_head_stride == s->head_dim)) return MOVE_TOKEN;
    return MOVE_ROW;
}

kvhal_status cpu_desc_create(void *ctx, int32_t id, kvhal_bk_op op, const void *args, void **desc)
{
    const kvhal_core_services *svc = ((const cpu_ctx *)ctx)->svc;
    cpu_desc *d = svc->alloc_should_fail() ? NULL : malloc(sizeof *d);
    if (!d) return svc->set_error(KVHAL_OUT_OF_MEMORY, "cpu: cannot allocate a descriptor");
    d->op = op;
    d->k_move = d->v_move = MOVE_GENERIC;
    if (op == KVHAL_BK_OP_PAGED_CACHING) {
        const kvhal_bk_paged_caching *a = args;
        d->k_move = plan_side(&a->k, a->input_dtype, a->cache_dtype, a->num_heads);
        d->v_move = plan_side(&a->v, a->input_dtype, a->cache_dtype, a->num_heads);
    }
    *desc = d;
    return KVHAL_OK;
}

void cpu_desc_destroy(void *ctx, int32_t id, kvhal_bk_op op, void *desc) { free(desc); }

/* ---- row copies ---- */

/* Above this many bytes written per call, the destination will not stay in the caches anyway. */
#define STREAM_THRESHOLD ((size_t)8 << 20)

/* Copies n bytes with streaming stores where the destination is 16-byte aligned; call stream_fence() after. */
static void copy_stream(char *dst, const char *src, size_t n)
{
#if defined(__SSE2__)
    size_t head = (size_t)(-(uintptr_t)dst & 15u);
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    for (; n >= 16; n -= 16, dst += 16, src += 16) _mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
#endif
    memcpy(dst, src, n);
}

/* Streaming stores are weakly ordered: make them visible before the op returns. */
static void stream_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

static inline void copy_row(char *dst, const char *src, size_t n, bool stream)
{
    if (stream) copy_stream(dst, src, n);
    else memcpy(dst, src, n);
}

static void copy_strided(char *dst, int64_t ds, const char *src, int64_t ss, size_t es, int64_t n)
{
    switch (es) {
    case 1:
        for (int64_t i = 0; i < n; i++) dst[i * ds] = src[i * ss];
        break;
    case 2:
        for (int64_t i = 0; i < n; i++) memcpy(dst + i * ds * 2, src + i * ss * 2, 2);
        break;
    case 4:
        for (int64_t i = 0; i < n; i++) memcpy(dst + i * ds * 4, src + i * ss * 4, 4);
        break;
    default:
        for (int64_t i = 0; i < n; i++) memcpy(dst + (size_t)(i * ds) * es, src + (size_t)(i * ss) * es, es);
        break;
    }
}

/* ---- fp8 conversion ---- */

static inline float load_f32(const char *p, int64_t i)
{
    float f;
    memcpy(&f, p + i * 4, 4);
    return f;
}

static inline float load_f16(const char *p, int64_t i)
{
    uint16_t h;
    memcpy(&h, p + i * 2, 2);
    return kvhal_num_f16_to_f32(h);
}

static inline float load_bf16(const char *p, int64_t i)
{
    uint16_t h;
    memcpy(&h, p + i * 2, 2);
    return kvhal_num_bf16_to_f32(h);
}

#if defined(__SSE2__)
/* Four elements at a time. The loads are kvhal_num_f16_to_f32 / kvhal_num_bf16_to_f32 lane by lane; the encoders
 * round with integer arithmetic on the f32 bits (the carry of a rounded-up mantissa runs into the exponent) and
 * round subnormal results by adding 2^k, whose ulp is the fp8 subnormal quantum: the same codes as the scalar
 * kvhal_num_f32_to_* conversions (kvhal_numerics.h) for every input, checked through the CPU backend over all 2^32
 * inputs for a set of scales by tests/fp8_check --device=cpu (and on a slice by the ops suite). */
static inline __m128 load4_f32(const char *p) { return _mm_loadu_ps((const float *)p); }

static inline __m128 load4_bf16(const char *p)
{
    __m128i h = _mm_loadl_epi64((const __m128i *)p);
    return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

static inline __m128i select4(__m128i mask, __m128i a, __m128i b)
{
    return _mm_or_si128(_mm_and_si128(mask, a), _mm_andnot_si128(mask, b));
}

static inline __m128 load4_f16(const char *p)
{
    __m128i h = _mm_unpacklo_epi16(_mm_loadl_epi64((const __m128i *)p), _mm_setzero_si128());
    __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
    __m128i m = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13);
    __m128i e = _mm_and_si128(m, _mm_set1_epi32(0x0f800000));
    __m128i normal = _mm_add_epi32(m, _mm_set1_epi32((127 - 15) << 23));
    __m128i special = _mm_add_epi32(m, _mm_set1_epi32((255 - 31) << 23));
    __m128 subf = _mm_sub_ps(_mm_castsi128_ps(_mm_add_epi32(m, _mm_set1_epi32((127 - 15 + 1) << 23))),
                             _mm_castsi128_ps(_mm_set1_epi32(113 << 23)));
    __m128i r = select4(_mm_cmpeq_epi32(e, _mm_setzero_si128()), _mm_castps_si128(subf), normal);
    r = select4(_mm_cmpeq_epi32(e, _mm_set1_epi32(0x0f800000)), special, r);
    return _mm_castsi128_ps(_mm_or_si128(r, sign));
}

/* The codes of four quotients q of inputs x as 32-bit lanes (sign | code), as the scalar conversions give them,
 * except that the sign and NaN-ness come from x (cpu_scale_mode's mode 1: a NaN q of a non-NaN x saturates). */
static inline __m128i codes4(__m128 q, __m128 x, int m, int bias, uint32_t max_bits, uint32_t max_code, float magic)
{
    const int shift = 23 - m;
    __m128i ux = _mm_castps_si128(x);
    __m128i sign = _mm_and_si128(_mm_srli_epi32(ux, 24), _mm_set1_epi32(0x80));
    __m128i ax = _mm_and_si128(ux, _mm_set1_epi32(0x7fffffff));
    __m128i a = _mm_and_si128(_mm_castps_si128(q), _mm_set1_epi32(0x7fffffff));
    __m128i r = _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32((1 << (shift - 1)) - 1)),
                              _mm_and_si128(_mm_srli_epi32(a, shift), _mm_set1_epi32(1)));
    __m128i normal = _mm_sub_epi32(_mm_srli_epi32(r, shift), _mm_set1_epi32((127 - bias) << m));
    __m128 vm = _mm_set1_ps(magic);
    __m128i sub = _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(a), vm)), _mm_castps_si128(vm));
    /* a < 2^31 after the sign is cleared, so signed compares order it correctly; a NaN's a is past max_bits */
    __m128i code = select4(_mm_cmplt_epi32(a, _mm_set1_epi32((127 + 1 - bias) << 23)), sub, normal);
    code = select4(_mm_cmplt_epi32(a, _mm_set1_epi32((int)max_bits)), code, _mm_set1_epi32((int)max_code));
    code = select4(_mm_cmpgt_epi32(ax, _mm_set1_epi32(0x7f800000)), _mm_set1_epi32(0x7f), code);
    return _mm_or_si128(sign, _mm_and_si128(code, _mm_set1_epi32(0x7f)));
}

/* kvhal_num_fnuz_finish on four lanes: NaN x -> 0x80, a result that rounds to zero -> 0x00 (no negative zero). */
static inline __m128i fnuz4(__m128 x, __m128i code)
{
    __m128i ax = _mm_and_si128(_mm_castps_si128(x), _mm_set1_epi32(0x7fffffff));
    __m128i zero = _mm_cmpeq_epi32(_mm_and_si128(code, _mm_set1_epi32(0x7f)), _mm_setzero_si128());
    code = _mm_andnot_si128(zero, code);
    return select4(_mm_cmpgt_epi32(ax, _mm_set1_epi32(0x7f800000)), _mm_set1_epi32(0x80), code);
}

static inline void store4(uint8_t *dst, __m128i code)
{
    __m128i packed = _mm_packus_epi16(_mm_packs_epi32(code, code), _mm_setzero_si128());
    int32_t four = _mm_cvtsi128_si32(packed);
    memcpy(dst, &four, 4);
}

#define ENCODE4_E4M3(dst, q, x) store4(dst, codes4(q, x, 3, 7, 0x43e00000u, 0x7eu, 16384.0f))
#define ENCODE4_E5M2(dst, q, x) store4(dst, codes4(q, x, 2, 15, 0x47600000u, 0x7bu, 128.0f))
#define ENCODE4_E4M3FNUZ(dst, q, x) store4(dst, fnuz4(x, codes4(q, x, 3, 8, 0x43700000u, 0x7fu, 8192.0f)))
#define ENCODE4_E5M2FNUZ(dst, q, x) store4(dst, fnuz4(x, codes4(q, x, 2, 16, 0x47600000u, 0x7fu, 64.0f)))
#define VECTOR_PART(W, LOADV, ES, ENCODEV, QUOTV)                                                             \
    do {                                                                                                        \
        for (; i + (W) <= n; i += (W)) {                                                                        \
            const VEC##W xv = LOADV(src + i * (ES));                                                            \
            ENCODEV(dst + i, QUOTV(xv), xv);                                                                    \
        }                                                                                                       \
    } while (0)
#define VEC4 __m128
#define QUOT4_MUL(x) _mm_mul_ps(x, vinv)
#define QUOT4_DIV(x) _mm_div_ps(x, vscale)
#define VECTOR_SETUP4                                                                                           \
    const __m128 vscale = _mm_set1_ps(scale), vinv = _mm_set1_ps(inv);                                          \
    (void)vscale, (void)vinv
#else
#define VECTOR_PART(W, LOADV, ES, ENCODEV, QUOTV) (void)0
#define VECTOR_SETUP4 (void)0
#endif

/* Scalar quotients (cpu_scale_mode): 0 multiply by the exact 1/s, 2 divide. */
#define QUOT_MUL(x) ((x) * inv)
#define QUOT_DIV(x) ((x) / scale)

/* One loop per (input dtype, fp8 format, quotient, vector width W) so that each is compiled with its conversions
 * inlined: W elements at a time (load<W>_*, ENCODE<W>_*) where the row is contiguous, then one at a time. */
#define CONVERT_LOOP(W, LOAD, ES, ENCODE, ENCODEV, QUOT, QUOTV, IN)                                             \
    do {                                                                                                        \
        if (ds == 1 && ss == 1) {                                                                               \
            int64_t i = 0;                                                                                      \
            VECTOR_PART(W, load##W##_##IN, ES, ENCODEV, QUOTV);                                                 \
            for (; i < n; i++) dst[i] = ENCODE(QUOT(LOAD(src, i)));                                             \
        } else {                                                                                                \
            for (int64_t i = 0; i < n; i++) dst[i * ds] = ENCODE(QUOT(LOAD(src, i * ss)));                      \
        }                                                                                                       \
    } while (0)

#define CONVERT_BY_INPUT(W, ENCODE, ENCODEV, QUOT, QUOTV)                                                       \
    do {                                                                                                        \
        if (in == KVHAL_F32) CONVERT_LOOP(W, load_f32, 4, ENCODE, ENCODEV, QUOT, QUOTV, f32);                   \
        else if (in == KVHAL_F16) CONVERT_LOOP(W, load_f16, 2, ENCODE, ENCODEV, QUOT, QUOTV, f16);              \
        else CONVERT_LOOP(W, load_bf16, 2, ENCODE, ENCODEV, QUOT, QUOTV, bf16);                                 \
    } while (0)

#define CONVERT_ROW(W, QUOT, QUOTV)                                                                             \
    do {                                                                                                        \
        switch (out) {                                                                                          \
        case KVHAL_FP8_E4M3: CONVERT_BY_INPUT(W, kvhal_num_f32_to_e4m3fn, ENCODE##W##_E4M3, QUOT, QUOTV); break; \
        case KVHAL_FP8_E5M2: CONVERT_BY_INPUT(W, kvhal_num_f32_to_e5m2, ENCODE##W##_E5M2, QUOT, QUOTV); break; \
        case KVHAL_FP8_E4M3FNUZ:                                                                                \
            CONVERT_BY_INPUT(W, kvhal_num_f32_to_e4m3fnuz, ENCODE##W##_E4M3FNUZ, QUOT, QUOTV);                 \
            break;                                                                                              \
        default: CONVERT_BY_INPUT(W, kvhal_num_f32_to_e5m2fnuz, ENCODE##W##_E5M2FNUZ, QUOT, QUOTV); break;     \
        }                                                                                                       \
    } while (0)

/* SSE2 (or scalar): modes 0 and 2 of cpu_scale_mode (inv = 1 / scale, exact in mode 0). */
static void convert_row_plain(uint8_t *dst, int64_t ds, const char *src, int64_t ss, kvhal_dtype in,
                              kvhal_dtype out, int mode, float scale, float inv, int64_t n)
{
    VECTOR_SETUP4;
    if (mode == 0) CONVERT_ROW(4, QUOT_MUL, QUOT4_MUL);
    else CONVERT_ROW(4, QUOT_DIV, QUOT4_DIV);
}

#if defined(__SSE2__) && (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define KVHAL_CPU_WIDE 1
/* The wide path: eight elements at a time with AVX2, F16C for f16 inputs and FMA for mode 1 (the reciprocal with
 * its correction, kvhal_num_quot_rcp), compiled for those extensions and run only where the CPU has all three
 * (cpu_has_wide) and KVHAL_CPU_WIDE is not "0"; every mode of cpu_scale_mode runs here then, so all scales get
 * the same width. Elsewhere the SSE2 loops run, and a calibrated scale divides. */
#define WIDE_TARGET __attribute__((target("avx2,fma,f16c")))
#define VEC8 __m256

static inline WIDE_TARGET __m256 load8_f32(const char *p) { return _mm256_loadu_ps((const float *)p); }

static inline WIDE_TARGET __m256 load8_bf16(const char *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* exact for every f16 (subnormals included); a NaN stays a NaN of its sign, all fp8 needs of it */
static inline WIDE_TARGET __m256 load8_f16(const char *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

static inline WIDE_TARGET __m256i select8(__m256i mask, __m256i a, __m256i b)
{
    return _mm256_blendv_epi8(b, a, mask);
}

/* codes4 on eight lanes */
static inline WIDE_TARGET __m256i codes8(__m256 q, __m256 x, int m, int bias, uint32_t max_bits, uint32_t max_code,
                                         float magic)
{
    const int shift = 23 - m;
    __m256i ux = _mm256_castps_si256(x);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(ux, 24), _mm256_set1_epi32(0x80));
    __m256i ax = _mm256_and_si256(ux, _mm256_set1_epi32(0x7fffffff));
    __m256i a = _mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32(0x7fffffff));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32((1 << (shift - 1)) - 1)),
                                 _mm256_and_si256(_mm256_srli_epi32(a, shift), _mm256_set1_epi32(1)));
    __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(r, shift), _mm256_set1_epi32((127 - bias) << m));
    __m256 vm = _mm256_set1_ps(magic);
    __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), vm)),
                                   _mm256_castps_si256(vm));
    __m256i code = select8(_mm256_cmpgt_epi32(_mm256_set1_epi32((127 + 1 - bias) << 23), a), sub, normal);
    code = select8(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)max_bits), a), code, _mm256_set1_epi32((int)max_code));
    code = select8(_mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000)), _mm256_set1_epi32(0x7f), code);
    return _mm256_or_si256(sign, _mm256_and_si256(code, _mm256_set1_epi32(0x7f)));
}

static inline WIDE_TARGET __m256i fnuz8(__m256 x, __m256i code)
{
    __m256i ax = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
    __m256i zero = _mm256_cmpeq_epi32(_mm256_and_si256(code, _mm256_set1_epi32(0x7f)), _mm256_setzero_si256());
    code = _mm256_andnot_si256(zero, code);
    return select8(_mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000)), _mm256_set1_epi32(0x80), code);
}

static inline WIDE_TARGET void store8(uint8_t *dst, __m256i code)
{
    /* packs work within 128-bit halves: bytes 0-3 of each half are its four codes */
    __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(code, code), _mm256_setzero_si256());
    int32_t lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(p)), hi = _mm_cvtsi128_si32(_mm256_extracti128_si256(p, 1));
    memcpy(dst, &lo, 4);
    memcpy(dst + 4, &hi, 4);
}

#define ENCODE8_E4M3(dst, q, x) store8(dst, codes8(q, x, 3, 7, 0x43e00000u, 0x7eu, 16384.0f))
#define ENCODE8_E5M2(dst, q, x) store8(dst, codes8(q, x, 2, 15, 0x47600000u, 0x7bu, 128.0f))
#define ENCODE8_E4M3FNUZ(dst, q, x) store8(dst, fnuz8(x, codes8(q, x, 3, 8, 0x43700000u, 0x7fu, 8192.0f)))
#define ENCODE8_E5M2FNUZ(dst, q, x) store8(dst, fnuz8(x, codes8(q, x, 2, 16, 0x47600000u, 0x7fu, 64.0f)))

/* y = x * inv, r = y * s - x exactly, q = y - r * inv (kvhal_num_quot_rcp) */
static inline WIDE_TARGET __m256 quot8_fma(__m256 x, __m256 s, __m256 inv)
{
    const __m256 y = _mm256_mul_ps(x, inv);
    return _mm256_fnmadd_ps(_mm256_fmsub_ps(y, s, x), inv, y);
}

static inline WIDE_TARGET float quot_fma(float x, float s, float inv)
{
    const __m128 vx = _mm_set_ss(x), vinv = _mm_set_ss(inv);
    const __m128 y = _mm_mul_ss(vx, vinv);
    const float q = _mm_cvtss_f32(_mm_fnmadd_ss(_mm_fmsub_ss(y, _mm_set_ss(s), vx), vinv, y));
    /* an infinite y gives NaN: the division's infinity, which saturates (a NaN x stays NaN). The sign is x's (s > 0),
     * as codes8 takes it on the vector body: the scalar encoders read q's sign, and for x = +0 q is -(+0) + (+0),
     * +0 by IEEE 754 and on hardware, but -0 under valgrind 3.19, whose vfnmadd acts as -(a*b - c),
     * and so made a +0 input the code 0x80 */
    return q != q && x == x ? (x < 0 ? -HUGE_VALF : HUGE_VALF) : copysignf(q, x);
}

#define QUOT_FMA(x) quot_fma(x, scale, inv)
#define QUOT8_FMA(x) quot8_fma(x, vscale, vinv)
#define QUOT8_MUL(x) _mm256_mul_ps(x, vinv)
#define QUOT8_DIV(x) _mm256_div_ps(x, vscale)

static WIDE_TARGET void convert_row_wide(uint8_t *dst, int64_t ds, const char *src, int64_t ss, kvhal_dtype in,
                                         kvhal_dtype out, int mode, float scale, float inv, int64_t n)
{
    const __m256 vscale = _mm256_set1_ps(scale), vinv = _mm256_set1_ps(inv);
    if (mode == 0) CONVERT_ROW(8, QUOT_MUL, QUOT8_MUL);
    else if (mode == 1) CONVERT_ROW(8, QUOT_FMA, QUOT8_FMA);
    else CONVERT_ROW(8, QUOT_DIV, QUOT8_DIV);
}

static bool cpu_has_wide(void)
{
    static int known; /* 0 not asked yet, 1 no, 2 yes: a benign race, every thread finds the same answer */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (!k) {
        __builtin_cpu_init();
        const char *env = getenv("KVHAL_CPU_WIDE"); /* "0": the SSE2 loops (tests and comparisons) */
        /* F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows it; the OS keeps
         * the YMM state it needs wherever AVX2 is reported usable */
        unsigned eax, ebx, ecx = 0, edx;
        const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
        k = !(env && !strcmp(env, "0")) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c
                ? 2
                : 1;
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k == 2;
}
#else
static bool cpu_has_wide(void) { return false; }
#endif

/* ---- value / scale: how the CPU divides by a scale ----
 * kvhal stores the fp8 code of RN32(x / s) (the f32 quotient, then the fp8 rounding). The conversion loops form that
 * quotient one of three ways, picked once per call from the scale:
 * 0  s = 2^k with 1/s a normal float: x * (1/s), the same real number as x / s, so the same rounding.
 * 1  a calibrated s in [2^-64, 2^64], on a CPU with FMA: kvhal_num_quot_rcp (the method of the GPU kernels), the
 *    correctly rounded quotient wherever fp8 can tell. When y = x * inv is infinite (x infinite, or the quotient
 *    overflows) q is NaN although x is not: the encoders here then take the sign and NaN-ness from x and the
 *    magnitude from q, so such a q saturates like the division's infinity.
 * 2  otherwise: the IEEE division x / s.
 * Checked on all 2^32 inputs for a set of scales through the CPU backend itself by tests/fp8_check --device=cpu
 * (dense: the vector loop; --strided: the scalar loop). */
static int cpu_scale_mode(float s, int has_fma)
{
    if (kvhal_num_scale_is_pow2(s)) return 0;
    if (has_fma && kvhal_num_scale_rcp_ok(s)) return 1;
    return 2;
}

/* How one side divides by its scale (q_make, once per call). */
typedef struct quot {
    int mode; /* cpu_scale_mode */
    bool wide;
    float scale, inv;
} quot;

static quot q_make(float scale)
{
    const bool wide = cpu_has_wide();
    quot q = {cpu_scale_mode(scale, wide), wide, scale, 1.0f / scale};
    return q;
}

/* One row of n elements: dst[i * ds] = the code of RN32(src[i * ss] / scale). */
static void convert_row(uint8_t *dst, int64_t ds, const char *src, int64_t ss, kvhal_dtype in, kvhal_dtype out,
                        const quot *q, int64_t n)
{
#if defined(KVHAL_CPU_WIDE)
    if (q->wide) {
        convert_row_wide(dst, ds, src, ss, in, out, q->mode, q->scale, q->inv, n);
        return;
    }
#endif
    convert_row_plain(dst, ds, src, ss, in, out, q->mode, q->scale, q->inv, n);
}

/* ---- paged caching ---- */

static inline int64_t read_slot(const char *base, kvhal_dtype dt, int64_t index)
{
    if (dt == KVHAL_I32) {
        int32_t v;
        memcpy(&v, base + index * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, base + index * 8, 8);
    return v;
}

static void move_token(const kvhal_bk_paged_caching *a, const kvhal_bk_paged_side *s, move_kind kind, int64_t tok_elem,
                       int64_t slot, size_t ies, size_t ces, bool stream, const quot *q)
{
    const int64_t blk = slot / a->block_size, off = slot - blk * a->block_size;
    char *cache = (char *)s->cache + s->cache_offset + (size_t)(blk * s->block_stride + off * s->offset_stride) * ces;
    const char *in = (const char *)s->input + s->input_offset + (size_t)tok_elem * ies;
    const int32_t heads = a->num_heads, hd = s->head_dim;
    switch (kind) {
    case MOVE_TOKEN:
        copy_row(cache, in, (size_t)heads * (size_t)hd * ces, stream);
        break;
    case MOVE_ROW:
        for (int32_t h = 0; h < heads; h++)
            copy_row(cache + (size_t)(h * s->cache_head_stride) * ces, in + (size_t)(h * s->in_head_stride) * ies,
                     (size_t)hd * ces, stream);
        break;
    case MOVE_CONVERT:
    case MOVE_GENERIC:
        for (int32_t h = 0; h < heads; h++) {
            char *c = cache + (size_t)(h * s->cache_head_stride) * ces;
            const char *x = in + (size_t)(h * s->in_head_stride) * ies;
            if (a->input_dtype == a->cache_dtype)
                copy_strided(c, s->cache_dim_stride, x, s->in_dim_stride, ces, hd);
            else
                convert_row((uint8_t *)c, s->cache_dim_stride, x, s->in_dim_stride, a->input_dtype, a->cache_dtype, q,
                            hd);
        }
        break;
    }
}

kvhal_status cpu_paged_caching(void *ctx, int32_t id, void *desc, const kvhal_bk_paged_caching *a, void *stream)
{
    const cpu_desc *d = desc;
    move_kind km = d ? d->k_move : plan_side(&a->k, a->input_dtype, a->cache_dtype, a->num_heads);
    move_kind vm = d ? d->v_move : plan_side(&a->v, a->input_dtype, a->cache_dtype, a->num_heads);
    const char *slots = (const char *)a->slots + a->slots_offset;
    const int64_t max_slot = a->num_slots;
    const int64_t seq = a->seq_len, outer = a->num_tokens / seq;

    /* Every slot first: a bad one must leave the cache as it was. */
    for (int64_t b = 0; b < outer; b++) {
        for (int64_t i = 0; i < seq; i++) {
            int64_t slot = read_slot(slots, a->slot_dtype, b * a->slot_stride_outer + i * a->slot_stride_inner);
            if (slot >= max_slot)
                return ((const cpu_ctx *)ctx)->svc->set_error(KVHAL_OUT_OF_RANGE, "slot_mapping[%lld]: slot %lld is out of range [0, %lld) "
                                  "(%lld blocks of %d); nothing was written", (long long)(b * seq + i),
                                  (long long)slot, (long long)max_slot, (long long)a->num_blocks, (int)a->block_size);
        }
    }
    const size_t ies = kvhal_bk_dtype_size(a->input_dtype), ces = kvhal_bk_dtype_size(a->cache_dtype);
    /* each factor widened first: two head dims near INT32_MAX must not overflow an int (stride-0 views let such a
     * call through); the product may wrap, it only picks the store kind */
    const size_t written =
        (size_t)a->num_tokens * (size_t)a->num_heads * ((size_t)a->k.head_dim + (size_t)a->v.head_dim) * ces;
    const bool nt = written >= STREAM_THRESHOLD;
    /* how each side divides by its scale, decided once per call (fp8 caches only: other calls do not divide) */
    const bool fp8 = a->input_dtype != a->cache_dtype;
    const quot kq = q_make(fp8 ? a->k.scale : 1.0f), vq = q_make(fp8 ? a->v.scale : 1.0f);
    for (int64_t b = 0; b < outer; b++) {
        for (int64_t i = 0; i < seq; i++) {
            int64_t slot = read_slot(slots, a->slot_dtype, b * a->slot_stride_outer + i * a->slot_stride_inner);
            if (slot < 0) continue; /* padding */
            move_token(a, &a->k, km, b * a->k.tok_stride_outer + i * a->k.tok_stride_inner, slot, ies, ces, nt, &kq);
            move_token(a, &a->v, vm, b * a->v.tok_stride_outer + i * a->v.tok_stride_inner, slot, ies, ces, nt, &vq);
        }
    }
    if (nt) stream_fence();
    return KVHAL_OK;
}

/* ---- copy_blocks ---- */

kvhal_status cpu_copy_blocks(void *ctx, int32_t id, void *desc, const kvhal_bk_copy_blocks *a, void *stream)
{
    size_t written = 0;
    for (int32_t c = 0; c < a->num_caches; c++) written += (size_t)a->block_bytes[c] * (size_t)a->num_pairs;
    const bool nt = written >= STREAM_THRESHOLD;
    for (int32_t c = 0; c < a->num_caches; c++) {
        char *base = (char *)a->natives[c] + a->offsets[c];
        const int64_t stride = a->block_strides[c];
        const size_t bytes = (size_t)a->block_bytes[c];
        for (int32_t p = 0; p < a->num_pairs; p++) {
            const int64_t src = a->pairs[2 * p], dst = a->pairs[2 * p + 1];
            if (src == dst) continue;
            copy_row(base + dst * stride, base + src * stride, bytes, nt);
        }
    }
    if (nt) stream_fence();
    return KVHAL_OK;
}

/* ---- tensor_copy ---- */

/* Drops size-1 dims and merges dims that are contiguous in both tensors, so that a dense copy becomes one row. */
static int collapse(const kvhal_bk_tensor_copy *a, int64_t *shape, int64_t *ds, int64_t *ss)
{
    int n = 0;
    for (int i = 0; i < a->dst.ndim; i++) {
        if (a->dst.shape[i] == 1) continue;
        if (n > 0 && ds[n - 1] == a->dst.strides[i] * a->dst.shape[i] &&
            ss[n - 1] == a->src.strides[i] * a->dst.shape[i]) {
            shape[n - 1] *= a->dst.shape[i];
            ds[n - 1] = a->dst.strides[i];
            ss[n - 1] = a->src.strides[i];
            continue;
        }
        shape[n] = a->dst.shape[i];
        ds[n] = a->dst.strides[i];
        ss[n] = a->src.strides[i];
        n++;
    }
    if (n == 0) {
        shape[0] = 1;
        ds[0] = ss[0] = 1;
        n = 1;
    }
    return n;
}

kvhal_status cpu_tensor_copy(void *ctx, int32_t id, void *desc, const kvhal_bk_tensor_copy *a, void *stream)
{
    int64_t shape[KVHAL_MAX_DIMS], ds[KVHAL_MAX_DIMS], ss[KVHAL_MAX_DIMS];
    for (int i = 0; i < a->dst.ndim; i++)
        if (a->dst.shape[i] == 0) return KVHAL_OK;
    const int n = collapse(a, shape, ds, ss);
    const size_t es = kvhal_bk_dtype_size(a->dst.dtype);
    char *dst = (char *)a->dst.native + a->dst.offset;
    const char *src = (const char *)a->src.native + a->src.offset;
    const int last = n - 1;
    const bool rows = ds[last] == 1 && ss[last] == 1;
    int64_t idx[KVHAL_MAX_DIMS] = {0};
    for (;;) {
        int64_t doff = 0, soff = 0;
        for (int i = 0; i < last; i++) {
            doff += idx[i] * ds[i];
            soff += idx[i] * ss[i];
        }
        if (rows) memmove(dst + (size_t)doff * es, src + (size_t)soff * es, (size_t)shape[last] * es);
        else copy_strided(dst + (size_t)doff * es, ds[last], src + (size_t)soff * es, ss[last], es, shape[last]);
        int i = last - 1;
        while (i >= 0 && ++idx[i] == shape[i]) idx[i--] = 0;
        if (i < 0) break;
    }
    return KVHAL_OK;
}

kvhal_status cpu_copy_batch(void *ctx, int32_t id, const kvhal_bk_copy_batch *a, void *stream)
{
    for (int32_t i = 0; i < a->count; i++)
        memmove((char *)a->dst[i] + a->dst_offsets[i], (const char *)a->src[i] + a->src_offsets[i], a->bytes[i]);
    return KVHAL_OK;
}

/* ---- page_transfer: synchronous, so the pages are in place when the call returns ---- */

kvhal_status cpu_page_transfer(void *ctx, int32_t id, void *desc, const kvhal_bk_page_transfer *a, void *stream)
{
    const size_t bytes = (size_t)a->block_bytes;
    const bool nt = bytes * (size_t)a->num_caches * (size_t)a->num_pairs >= STREAM_THRESHOLD;
    char *host = (char *)a->host + a->host_offset;
    for (int32_t p = 0; p < a->num_pairs; p++) {
        char *page = host + a->pairs[2 * p + 1] * a->host_page_bytes;
        for (int32_t c = 0; c < a->num_caches; c++) {
            char *blk = (char *)a->natives[c] + a->offsets[c] + a->pairs[2 * p] * a->block_strides[c];
            if (a->to_host) copy_row(page + (size_t)c * bytes, blk, bytes, nt);
            else copy_row(blk, page + (size_t)c * bytes, bytes, nt);
        }
    }
    if (nt) stream_fence();
    return KVHAL_OK;
}

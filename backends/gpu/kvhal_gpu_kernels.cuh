/* kvhal_gpu_kernels.cuh — the template kernels of the CUDA and HIP backends and what the host code needs to launch
 * them: one source, built by nvcc and by hipcc (vendor names come from kvhal_gpu_runtime.h, the arithmetic from
 * kvhal_gpu_math.h). Every kernel is meant to be bound by memory bandwidth, so each one moves 16-byte units where
 * the layout allows (a unit is then VEC elements: the host turns element strides into unit strides), keeps several
 * loads in flight per thread before the first store, and indexes work on gridDim.x with 64-bit offsets. The host
 * code picks the instantiation and launch geometry once per descriptor (gpu_<op>.cu).
 *
 * Every file of the backend includes this header (through gpu_private.h), so it defines only types, templates and
 * inline functions, which are compiled where they are used: each kernel is instantiated in the one op file that
 * launches it. Kernels that are not templates (copy_blocks, copy_batch) live in the op file that launches them
 * (gpu_copy_blocks.cu). */
#ifndef KVHAL_GPU_KERNELS_CUH
#define KVHAL_GPU_KERNELS_CUH

#ifndef __HIPCC_RTC__ /* hiprtc defines the fixed-width types itself */
#include <stdint.h>
#endif

#include "kvhal_gpu_runtime.h"
#include "kvhal_gpu_math.h"

namespace kvhal_gpu {

/* Tuning constants (overridable at build time with -D, for measurements of other geometries). */
#ifndef KVHAL_GPU_THREADS
#define KVHAL_GPU_THREADS 256 /* threads per block of every kernel */
#endif
#ifndef KVHAL_GPU_UNROLL
#define KVHAL_GPU_UNROLL 4 /* independent units each thread loads before it stores */
#endif
#define KVHAL_GPU_MAX_TPC 64 /* tokens per block of the paged-caching kernel, at most */
#ifndef KVHAL_GPU_PAGED_WIDE_MIN_BLOCKS
#define KVHAL_GPU_PAGED_WIDE_MIN_BLOCKS 8 /* resident blocks per multiprocessor of the row form's wide copy */
#endif
#ifndef KVHAL_GPU_PAGED_THREADS
#define KVHAL_GPU_PAGED_THREADS 128 /* threads per block of the paged-caching kernel, at most */
#endif
#ifndef KVHAL_GPU_PAGED_UNROLL
#define KVHAL_GPU_PAGED_UNROLL 2 /* units of K and of V each thread of the paged-caching kernel loads per pass */
#endif
#ifndef KVHAL_GPU_PAGED_MIN_BLOCKS
#define KVHAL_GPU_PAGED_MIN_BLOCKS 12 /* resident blocks per multiprocessor the paged kernel is compiled for */
#endif
#define KVHAL_GPU_CHUNK (16 * 1024) /* bytes one block copies per work item: one pass of 256 x 4 x 16 B */
#define KVHAL_GPU_BATCH_MAX 96      /* ranges per copy_batch launch: they travel as kernel parameters */
#define KVHAL_GPU_BATCH_SMALL 16    /* copy_batch launches of at most this many ranges carry a smaller struct */
#define KVHAL_GPU_BATCH_MID 48      /* and of at most this many, a middle one */
/* CUDA 12.1+ on sm_70+ takes kernel parameters of up to 32 KB: where the build's every SM architecture allows it
 * (KVHAL_GPU_LARGE_PARAMS, backends/cuda/meson.build) and the driver does, copy_batch launches up to this many ranges
 * at once (14 KB), so that a batch of hundreds of ranges is one launch rather than one per KVHAL_GPU_BATCH_MAX. */
#if defined(KVHAL_GPU_LARGE_PARAMS) && !defined(KVHAL_GPU_HIP) && defined(CUDART_VERSION) && CUDART_VERSION >= 12010
#define KVHAL_GPU_BATCH_LARGE 512
#endif

/* Bytes of the per-device error flag, in mapped pinned host memory: a kernel that skips an index stores 1 into its
 * op's byte (a plain store: every writer stores the same value, so no atomics are needed and none cross the bus),
 * and synchronize reads the flag on the host with no extra device work. */
#define KVHAL_GPU_ERR_SLOT 0  /* paged caching: a slot >= num_blocks * block_size was skipped */
#define KVHAL_GPU_ERR_BLOCK 1 /* copy_blocks: a block id outside [0, num_blocks) was skipped */
#define KVHAL_GPU_ERR_BYTES 8

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_E4M3 = 3, DT_E5M2 = 4, DT_E4M3FNUZ = 5, DT_E5M2FNUZ = 6 };
#define KVHAL_GPU_FNUZ(OUT) ((OUT) == DT_E4M3FNUZ || (OUT) == DT_E5M2FNUZ)

/* ------------------------------------------------------------------------------------------------------------ */
/* Element transforms of the paged-caching kernel: In is what one load reads, Out what one store writes.        */
/* ------------------------------------------------------------------------------------------------------------ */
template <typename T> struct XCopy {
    typedef T In;
    typedef T Out;
    static __device__ __forceinline__ Out apply(const In &v, float, float) { return v; }
};

/* The row form of the paged kernel (paged_rows_pass; gpu_paged_caching.cu chooses it): transform X with U units in
 * flight per thread, compiled for MINB resident blocks. The units of a block are one index space, all K units of
 * its tokens first, then all V units, so every thread loads U useful units whatever the two sides' row lengths
 * (an MLA row, 512 latent + 64 rotary dims, is 64 + 8 units: the per-side form keeps most threads idle on V). */
/* H: the row form's memory hints (KVHAL_GPU_HINT_*), 0 for plain accesses. */
template <class X, int U, int MINB, int H = 0> struct Rows : X {};

/* Row-form hints (CUDA; HIP builds the plain accesses and conversion):
 *   RUN  a row that is one run in the input (heads contiguous there: the HND layout's input) loads without the
 *        head split, as a one-run row does; only the cache side divides by the head's units;
 *   TRIM the OCP fp8 conversion with fewer instructions per 16 bytes (sm_89+: XFp8Trim);
 *   NA   input loads as ld.global.L1::no_allocate (each input unit is read once: no L1 line is kept). */
#define KVHAL_GPU_HINT_RUN 4
#define KVHAL_GPU_HINT_TRIM 8
#define KVHAL_GPU_HINT_NA 16

/* The hints the vector path's row form runs with (gpu_paged_caching.cu): on CUDA RUN and TRIM, and for a call whose
 * blocks are all resident at once (one wave: grid <= multiprocessors x the kernel's resident blocks) NA too, which
 * won on the one-wave rows and lost none beyond noise on an H100; on HIP none, the accesses its platforms were
 * measured with (KVHAL_GPU_WAVE_KERNELS 0: no separate one-wave kernels). KVHAL_GPU_KERNELS_NOTE says which in the
 * device info (short: the platform string holds 128 bytes with the runtime and the code path before it). */
#if defined(KVHAL_GPU_HIP)
#define KVHAL_GPU_ROW_HINTS 0
#define KVHAL_GPU_WAVE_KERNELS 0
#define KVHAL_GPU_WAVE_HINTS 0
#define KVHAL_GPU_KERNELS_NOTE "rows, plain accesses"
#else
#define KVHAL_GPU_ROW_HINTS (KVHAL_GPU_HINT_RUN | KVHAL_GPU_HINT_TRIM)
#define KVHAL_GPU_WAVE_KERNELS 1
#define KVHAL_GPU_WAVE_HINTS (KVHAL_GPU_HINT_RUN | KVHAL_GPU_HINT_TRIM | KVHAL_GPU_HINT_NA)
#define KVHAL_GPU_KERNELS_NOTE "rows, run/trim hints, one-wave no-alloc"
#endif

/* Per transform: units each thread loads per pass (per side, or in all for Rows), the resident blocks the kernel is
 * compiled for, whether it is the row form, and its hints. */
template <class X> struct PagedGeom {
    enum { UNROLL = KVHAL_GPU_PAGED_UNROLL, MIN_BLOCKS = KVHAL_GPU_PAGED_MIN_BLOCKS, ROWS = 0, HINTS = 0 };
};
template <class X, int U, int MINB, int H> struct PagedGeom<Rows<X, U, MINB, H>> {
    enum { UNROLL = U, MIN_BLOCKS = MINB, ROWS = 1, HINTS = H };
};

template <int IN> __device__ __forceinline__ float load_elem(uint32_t bits)
{
    return IN == DT_F16 ? KVHAL_GPU_HALF_TO_FLOAT(bits) : kvhal_num_bf16_to_f32((uint16_t)bits);
}

/* The quotient x / s as the reference's IEEE division gives it, inv = 1/s rounded by the host. MODE (per call, from
 * kvhal_gpu_scale_mode): SM_MUL x * inv, exact for a power-of-two s; SM_RCP the reciprocal with one fma correction
 * (kvhal_num_quot_rcp: the same bits for every quotient fp8 can tell apart, a NaN where the quotient overflows, which
 * the callers saturate); SM_DIV the division itself, for scales outside the reciprocal's proven range. */
enum { SM_MUL = 0, SM_RCP = 1, SM_DIV = 2 };
template <int MODE> __device__ __forceinline__ float scaled(float x, float s, float inv)
{
    return MODE == SM_MUL ? x * inv : MODE == SM_RCP ? kvhal_num_quot_rcp(x, s, inv) : x / s;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(__HIP_PLATFORM_AMD__)
/* sm_89 and later convert f32 to fp8 in hardware, rounding to nearest even with saturation (cvt.rn.satfinite), which
 * is the rounding of kvhal_f32_to_fp8. For the scalar path (magnitudes): clamping first with fminf (which returns
 * the number when one side is NaN) gives the software path's results exactly: infinities and NaN magnitudes become
 * the largest finite code, and the callers add sign and NaN bits as before. The instruction converts a pair; both
 * halves get x, the low byte is kept. */
#define KVHAL_GPU_HW_FP8 1
template <int OUT> __device__ __forceinline__ uint32_t fp8_mag_hw(float x)
{
    unsigned short r;
    if (OUT == DT_E4M3) {
        x = fminf(x, 448.0f);
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x), "f"(x));
    } else {
        x = fminf(x, 57344.0f);
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x), "f"(x));
    }
    return r & 0xffu;
}

/* Signed values straight into cvt.rn.satfinite (the vector paths): it rounds to nearest even and saturates +-inf
 * and out-of-range values to +-max with their sign, as the reference does; only a NaN comes out differently (the
 * canonical NaN code, whatever its sign), and fp8_nan_bytes finds those bytes for the caller to give sign | 0x7f.
 * No clamp, no separate sign: half the instructions of the magnitude form. lo -> byte 0, hi -> byte 1. */
template <int OUT> __device__ __forceinline__ uint32_t fp8_hw_x2(float lo, float hi)
{
    unsigned short r;
    if (OUT == DT_E4M3)
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 0xff in each byte of c that holds a NaN code: no finite result is above 0x7e (e4m3) or 0x7b (e5m2), and
 * satfinite never gives e5m2's inf (0x7c), so a byte is NaN exactly when its low 7 bits reach 0x7f / 0x7d. */
template <int OUT> __device__ __forceinline__ uint32_t fp8_nan_bytes(uint32_t c)
{
    const uint32_t m = ((c & 0x7f7f7f7fu) + (OUT == DT_E4M3 ? 0x01010101u : 0x03030303u)) & 0x80808080u;
    return (m >> 7) * 0xffu;
}

/* NaN bytes (mask n) of c become sign | 0x7f where the input was NaN (mask in_nan), else sign | the largest finite
 * code (a quotient that overflowed to NaN in SM_RCP: it saturates); the sign bits (bit 7 of each byte) come from
 * the input. */
template <int OUT>
__device__ __forceinline__ uint32_t fp8_fix_nan(uint32_t c, uint32_t n, uint32_t sign, uint32_t in_nan)
{
    const uint32_t max4 = OUT == DT_E4M3 ? 0x7e7e7e7eu : 0x7b7b7b7bu;
    return (c & ~n) | (n & in_nan & (0x7f7f7f7fu | sign)) | (n & ~in_nan & (max4 | sign));
}
#endif

/* y >= 0 (or a positive NaN): the software vector path converts magnitudes, scale > 0 */
template <int OUT> __device__ __forceinline__ uint32_t fp8_mag_nonneg(float y)
{
    const uint32_t a = kvhal_num_f32_bits(y);
    return OUT == DT_E4M3       ? kvhal_num_e4m3fn_mag(a)
           : OUT == DT_E5M2     ? kvhal_num_e5m2_mag(a)
           : OUT == DT_E4M3FNUZ ? kvhal_num_e4m3fnuz_mag(a)
                                : kvhal_num_e5m2fnuz_mag(a);
}

/* The code of x / s: sign and NaN from x (s > 0), the magnitude from |x| / s. A NaN quotient of a non-NaN |x| (an
 * overflow in SM_RCP) becomes the largest finite code, as both magnitude conversions clamp NaN. */
template <int OUT, int MODE> __device__ __forceinline__ uint32_t fp8_full(float x, float s, float inv)
{
    const uint32_t u = kvhal_num_f32_bits(x);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t nan_bit = OUT == DT_E4M3 ? KVHAL_NUM_E4M3FN_NAN_BIT : KVHAL_NUM_E5M2_NAN_BIT;
    const float q = scaled<MODE>(kvhal_num_bits_f32(u & 0x7fffffffu), s, inv);
    if (KVHAL_GPU_FNUZ(OUT)) return kvhal_num_fnuz_finish(u, fp8_mag_nonneg<OUT>(q)); /* no NVIDIA hardware for fnuz */
#ifdef KVHAL_GPU_HW_FP8
    const uint32_t mag = fp8_mag_hw<OUT>(q);
#else
    const uint32_t mag = fp8_mag_nonneg<OUT>(q);
#endif
    return ((u >> 24) & 0x80u) | mag | (nan ? nan_bit : 0u);
}

/* One element at a time (any dim stride). */
template <int IN, int OUT, int MODE> struct XFp8Scalar;
template <int OUT, int MODE> struct XFp8Scalar<DT_F32, OUT, MODE> {
    typedef float In;
    typedef uint8_t Out;
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
        return (uint8_t)fp8_full<OUT, MODE>(v, s, inv);
    }
};
template <int IN, int OUT, int MODE> struct XFp8Scalar {
    typedef uint16_t In;
    typedef uint8_t Out;
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
        return (uint8_t)fp8_full<OUT, MODE>(load_elem<IN>(v), s, inv);
    }
};

/* 16 input bytes at a time: 4 f32 -> 4 fp8 bytes, or 8 f16/bf16 -> 8 fp8 bytes, the bytes gathered with byte
 * permutes. On sm_89+ signed values go straight into the hardware conversion, two per instruction, and only NaN
 * bytes are patched afterwards (this path is bound by instruction issue, not memory, when it has more work per
 * byte: it went from 0.78 to 0.89 of a device copy at 8192 tokens on an H200). Elsewhere magnitudes are converted
 * per element in software, with signs and NaNs handled per 32-bit word of the input (two 16-bit lanes at once). */
template <int IN, int OUT, int MODE> struct XFp8Vec;
template <int OUT, int MODE> struct XFp8Vec<DT_F32, OUT, MODE> {
    typedef uint4 In;
    typedef uint32_t Out;
    static __device__ __forceinline__ uint32_t one(uint32_t u, float s, float inv)
    {
        return fp8_full<OUT, MODE>(kvhal_num_bits_f32(u), s, inv);
    }
    static __device__ __forceinline__ uint32_t nan_byte(uint32_t u, uint32_t byte)
    {
        return (u & 0x7fffffffu) > 0x7f800000u ? byte : 0u;
    }
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
#ifdef KVHAL_GPU_HW_FP8
        const uint32_t lo = fp8_hw_x2<OUT>(scaled<MODE>(kvhal_num_bits_f32(v.x), s, inv),
                                           scaled<MODE>(kvhal_num_bits_f32(v.y), s, inv));
        const uint32_t hi = fp8_hw_x2<OUT>(scaled<MODE>(kvhal_num_bits_f32(v.z), s, inv),
                                           scaled<MODE>(kvhal_num_bits_f32(v.w), s, inv));
        const uint32_t c = __byte_perm(lo, hi, 0x5410), n = fp8_nan_bytes<OUT>(c);
        if (!n) return c;
        const uint32_t sign = ((v.x >> 24) & 0x80u) | ((v.y >> 16) & 0x8000u) | ((v.z >> 8) & 0x800000u) |
                              (v.w & 0x80000000u);
        const uint32_t in_nan = nan_byte(v.x, 0xffu) | nan_byte(v.y, 0xff00u) | nan_byte(v.z, 0xff0000u) |
                                nan_byte(v.w, 0xff000000u);
        return fp8_fix_nan<OUT>(c, n, sign, in_nan);
#else
        const uint32_t lo = __byte_perm(one(v.x, s, inv), one(v.y, s, inv), 0x0040);
        const uint32_t hi = __byte_perm(one(v.z, s, inv), one(v.w, s, inv), 0x0040);
        return __byte_perm(lo, hi, 0x5410);
#endif
    }
};

/* Two 16-bit lanes of w -> their fp8 codes in bytes 0 and 2 (the software path). */
template <int IN, int OUT, int MODE> __device__ __forceinline__ uint32_t fp8_pair(uint32_t w, float s, float inv)
{
    /* magnitudes: with scale > 0 the scaled values stay non-negative */
    const float lo = IN == DT_BF16 ? kvhal_num_bits_f32((w & 0x7fffu) << 16) : KVHAL_GPU_HALF_TO_FLOAT(w & 0x7fffu);
    const float hi = IN == DT_BF16 ? kvhal_num_bits_f32(w & 0x7fff0000u) : KVHAL_GPU_HALF_TO_FLOAT((w >> 16) & 0x7fffu);
    const uint32_t codes =
        __byte_perm(fp8_mag_nonneg<OUT>(scaled<MODE>(lo, s, inv)), fp8_mag_nonneg<OUT>(scaled<MODE>(hi, s, inv)),
                    0x0400);
    return codes | ((w >> 8) & 0x00800080u); /* the lanes' sign bits land on bit 7 of bytes 0 and 2 */
}

/* Lanes of w that are NaN, as bit 15 of each lane (inf is 0x7f80 in bf16, 0x7c00 in f16: anything above is NaN). */
template <int IN> __device__ __forceinline__ uint32_t nan_lanes(uint32_t w)
{
    return ((w & 0x7fff7fffu) + (IN == DT_BF16 ? 0x007f007fu : 0x03ff03ffu)) & 0x80008000u;
}

/* Input NaN lanes of w0 (bytes 0, 1) and w1 (bytes 2, 3) as 0xff bytes. */
template <int IN> __device__ __forceinline__ uint32_t nan_lane_bytes(uint32_t w0, uint32_t w1)
{
    const uint32_t m0 = nan_lanes<IN>(w0), m1 = nan_lanes<IN>(w1);
    return ((m0 >> 15) & 1u) * 0xffu | ((m0 >> 31) & 1u) * 0xff00u | ((m1 >> 15) & 1u) * 0xff0000u |
           ((m1 >> 31) & 1u) * 0xff000000u;
}

template <int IN, int OUT, int MODE> struct XFp8Vec {
    typedef uint4 In;
    typedef uint2 Out;
#ifdef KVHAL_GPU_HW_FP8
    static __device__ __forceinline__ float lane_lo(uint32_t w)
    {
        return IN == DT_BF16 ? kvhal_num_bits_f32(w << 16) : KVHAL_GPU_HALF_TO_FLOAT(w & 0xffffu);
    }
    static __device__ __forceinline__ float lane_hi(uint32_t w)
    {
        return IN == DT_BF16 ? kvhal_num_bits_f32(w & 0xffff0000u) : KVHAL_GPU_HALF_TO_FLOAT(w >> 16);
    }
    static __device__ __forceinline__ uint32_t word(uint32_t w, float s, float inv) /* 2 lanes -> bytes 0, 1 */
    {
        return fp8_hw_x2<OUT>(scaled<MODE>(lane_lo(w), s, inv), scaled<MODE>(lane_hi(w), s, inv));
    }
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
        Out o;
        o.x = __byte_perm(word(v.x, s, inv), word(v.y, s, inv), 0x5410);
        o.y = __byte_perm(word(v.z, s, inv), word(v.w, s, inv), 0x5410);
        const uint32_t nx = fp8_nan_bytes<OUT>(o.x), ny = fp8_nan_bytes<OUT>(o.y);
        if (nx | ny) { /* rare: the high byte of each 16-bit lane carries its sign */
            o.x = fp8_fix_nan<OUT>(o.x, nx, __byte_perm(v.x, v.y, 0x7531) & 0x80808080u, nan_lane_bytes<IN>(v.x, v.y));
            o.y = fp8_fix_nan<OUT>(o.y, ny, __byte_perm(v.z, v.w, 0x7531) & 0x80808080u, nan_lane_bytes<IN>(v.z, v.w));
        }
        return o;
    }
#else
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
        uint32_t c0 = fp8_pair<IN, OUT, MODE>(v.x, s, inv), c1 = fp8_pair<IN, OUT, MODE>(v.y, s, inv);
        uint32_t c2 = fp8_pair<IN, OUT, MODE>(v.z, s, inv), c3 = fp8_pair<IN, OUT, MODE>(v.w, s, inv);
        if (nan_lanes<IN>(v.x) | nan_lanes<IN>(v.y) | nan_lanes<IN>(v.z) | nan_lanes<IN>(v.w)) {
            /* rare: a NaN's magnitude code is the largest finite one; this bit makes it 0x7f */
            const uint32_t bit = OUT == DT_E4M3 ? KVHAL_NUM_E4M3FN_NAN_BIT : KVHAL_NUM_E5M2_NAN_BIT;
            c0 |= (nan_lanes<IN>(v.x) >> 15) * bit;
            c1 |= (nan_lanes<IN>(v.y) >> 15) * bit;
            c2 |= (nan_lanes<IN>(v.z) >> 15) * bit;
            c3 |= (nan_lanes<IN>(v.w) >> 15) * bit;
        }
        Out o;
        o.x = __byte_perm(c0, c1, 0x6420);
        o.y = __byte_perm(c2, c3, 0x6420);
        return o;
    }
#endif
};

/* AMD's fnuz formats through the OCP conversion (kvhal_num_fnuz_from_ocp), 16 input bytes at a time. For SM_MUL
 * and SM_RCP the host passes s / 2 and 2 / s, so that scaled<MODE> gives q2 = 2 * (x / s) exactly (a power-of-two
 * factor on every term of the multiply or the correction); SM_DIV takes the call's scale and doubles the quotient
 * (exact, or an overflow, which saturates either way). On sm_89+ the hardware converts q2 two lanes at a time and only
 * bytes at the largest OCP magnitude (saturation, NaN) go through software; negative zeros lose their sign with
 * four integer operations per word. Elsewhere every element is converted in software from q2 / 2. */
template <int OUT> __device__ __forceinline__ uint32_t fnuz_one(float x, float q2, uint32_t ocp)
{
    const int e4 = OUT == DT_E4M3FNUZ;
#ifdef KVHAL_GPU_HW_FP8
    return kvhal_num_fnuz_from_ocp(ocp, q2, kvhal_num_f32_bits(x), e4);
#else
    (void)ocp;
    const uint32_t a = kvhal_num_f32_bits(q2 * 0.5f) & 0x7fffffffu;
    return kvhal_num_fnuz_finish(kvhal_num_f32_bits(x), e4 ? kvhal_num_e4m3fnuz_mag(a) : kvhal_num_e5m2fnuz_mag(a));
#endif
}

/* Four elements x[i] with q2[i]: their fnuz codes, byte i for element i. */
template <int OUT> __device__ __forceinline__ uint32_t fnuz_four(const float *x, const float *q2)
{
#ifdef KVHAL_GPU_HW_FP8
    const int OCP = OUT == DT_E4M3FNUZ ? DT_E4M3 : DT_E5M2;
    const uint32_t c = __byte_perm(fp8_hw_x2<OCP>(q2[0], q2[1]), fp8_hw_x2<OCP>(q2[2], q2[3]), 0x5410);
    const uint32_t m = c & 0x7f7f7f7fu;
    if (((m + (OUT == DT_E4M3FNUZ ? 0x02020202u : 0x05050505u)) & 0x80808080u) == 0)
        return c & (0x7f7f7f7fu | ((m + 0x7f7f7f7fu) & 0x80808080u)); /* a zero magnitude drops its sign */
    uint32_t r = 0; /* rare: a byte at the largest OCP magnitude */
    for (int i = 0; i < 4; i++) r |= fnuz_one<OUT>(x[i], q2[i], (c >> (8 * i)) & 0xffu) << (8 * i);
    return r;
#else
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= fnuz_one<OUT>(x[i], q2[i], 0u) << (8 * i);
    return r;
#endif
}

/* q2 = 2 * (x / s) as the XFp8VecFnuz kernels get their scales (see above) */
template <int MODE> __device__ __forceinline__ float scaled2(float x, float s, float inv)
{
    return MODE == SM_DIV ? 2.0f * (x / s) : scaled<MODE>(x, s, inv);
}

template <int IN, int OUT, int MODE> struct XFp8VecFnuz;
template <int OUT, int MODE> struct XFp8VecFnuz<DT_F32, OUT, MODE> {
    typedef uint4 In;
    typedef uint32_t Out;
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
        const float x[4] = {kvhal_num_bits_f32(v.x), kvhal_num_bits_f32(v.y), kvhal_num_bits_f32(v.z),
                            kvhal_num_bits_f32(v.w)};
        const float q2[4] = {scaled2<MODE>(x[0], s, inv), scaled2<MODE>(x[1], s, inv), scaled2<MODE>(x[2], s, inv),
                             scaled2<MODE>(x[3], s, inv)};
        return fnuz_four<OUT>(x, q2);
    }
};
template <int IN, int OUT, int MODE> struct XFp8VecFnuz {
    typedef uint4 In;
    typedef uint2 Out;
    static __device__ __forceinline__ uint32_t quad(uint32_t w0, uint32_t w1, float s, float inv)
    {
        const float x[4] = {load_elem<IN>(w0 & 0xffffu), load_elem<IN>(w0 >> 16), load_elem<IN>(w1 & 0xffffu),
                            load_elem<IN>(w1 >> 16)};
        const float q2[4] = {scaled2<MODE>(x[0], s, inv), scaled2<MODE>(x[1], s, inv), scaled2<MODE>(x[2], s, inv),
                             scaled2<MODE>(x[3], s, inv)};
        return fnuz_four<OUT>(x, q2);
    }
    static __device__ __forceinline__ Out apply(const In &v, float s, float inv)
    {
        Out o;
        o.x = quad(v.x, v.y, s, inv);
        o.y = quad(v.z, v.w, s, inv);
        return o;
    }
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Paged caching                                                                                                */
/* ------------------------------------------------------------------------------------------------------------ */
/* One of K and V, in units (a unit is 1 element on the scalar path, 16 input bytes on the vector path). A token's
 * row is heads x units_per_head units; heads that are contiguous in both tensors are folded into one. */
struct PagedSide {
    char *cache;                                           /* base: native + offset, per call */
    const char *input;                                     /* base, per call */
    int64_t block_stride, offset_stride, cache_head, cache_dim; /* units of the cache */
    int64_t tok_outer, tok_inner, in_head, in_dim;          /* units of the input */
    float scale, inv;                                      /* scale and 1/scale rounded, per call */
    uint32_t row_units;                                    /* heads * units_per_head */
    kvhal_fastdiv32 div_row;                               /* by row_units */
    kvhal_fastdiv32 div_head;                              /* by units_per_head */
    uint32_t one_run; /* the row is one run of units, contiguous in the input and the cache (heads folded, unit
                       * dim strides 1: the vector path's NHD and MLA rows): the row form skips the head split */
    uint32_t in_run;  /* the row is one run of units in the input (unit dim stride 1, heads contiguous or one):
                       * the hinted row form (KVHAL_GPU_HINT_RUN) loads it without the head split */
};

struct PagedParams {
    PagedSide k, v;
    const char *slots; /* base, per call */
    volatile uint8_t *err;
    int64_t slot_outer, slot_inner; /* elements */
    int64_t seq_len, num_tokens, num_slots, block_size;
    int32_t slot64;  /* slots are int64 (else int32) */
    int32_t batched; /* num_tokens > seq_len: token t is (t / seq_len, t % seq_len) */
    int32_t tpc;     /* tokens per block (<= blockDim.x) */
    int32_t fast32;  /* num_slots and num_tokens < 2^32, block_size and seq_len <= 2^31: divide with div_bs/div_seq */
    kvhal_fastdiv32 div_bs, div_seq; /* by block_size, by seq_len */
};

/* Where unit i of a token block lives: token t (in the block), head h, unit c of the head. Computed twice per unit
 * (for the load and again for the store) rather than kept live across the barrier: registers are what limits
 * how many loads each multiprocessor keeps in flight. */
struct UnitPos {
    uint32_t t, h, c;
};

__device__ __forceinline__ UnitPos unit_pos(const PagedSide &sd, uint32_t i)
{
    UnitPos q;
    q.t = kvhal_fastdiv32_div(i, sd.div_row);
    const uint32_t r = i - q.t * sd.row_units;
    q.h = kvhal_fastdiv32_div(r, sd.div_head);
    q.c = r - q.h * sd.div_head.d;
    return q;
}

template <class X>
__device__ __forceinline__ void paged_load(const PagedSide &sd, const int64_t *s_in, uint32_t n, uint32_t b0,
                                           typename X::In *val)
{
    typedef typename X::In In;
    const In *in = reinterpret_cast<const In *>(sd.input);
#pragma unroll
    for (int u = 0; u < PagedGeom<X>::UNROLL; u++) {
        const uint32_t i = b0 + (uint32_t)u * blockDim.x + threadIdx.x;
        if (i < n) {
            const UnitPos q = unit_pos(sd, i);
            val[u] = in[s_in[q.t] + (int64_t)q.h * sd.in_head + (int64_t)q.c * sd.in_dim];
        }
    }
}

template <class X>
__device__ __forceinline__ void paged_store(const PagedSide &sd, const int64_t *s_cache, uint32_t n, uint32_t b0,
                                            const typename X::In *val)
{
    typedef typename X::Out Out;
    Out *out = reinterpret_cast<Out *>(sd.cache);
#pragma unroll
    for (int u = 0; u < PagedGeom<X>::UNROLL; u++) {
        const uint32_t i = b0 + (uint32_t)u * blockDim.x + threadIdx.x;
        if (i >= n) continue;
        const UnitPos q = unit_pos(sd, i);
        const int64_t co = s_cache[q.t];
        if (co >= 0) out[co + (int64_t)q.h * sd.cache_head + (int64_t)q.c * sd.cache_dim] = X::apply(val[u], sd.scale, sd.inv);
    }
}

/* The row form's unit j of one side (j < tokens * row_units): unit r of token t's row, t = j / row_units, divided
 * again for the store rather than kept across the barrier (registers: keeping t costs spills). A one-run row needs
 * no head split (no second division, no 64-bit multiplies). The row form runs on the vector path only, where unit
 * dim strides are 1 (build_side). */
/* The row form's conversion under hints H: X's own, or with KVHAL_GPU_HINT_TRIM the trimmed OCP conversion
 * (XFp8Trim) where the hardware one exists. */
template <class X> struct BaseX {
    typedef X T;
};
template <class X, int U, int MINB, int H> struct BaseX<Rows<X, U, MINB, H>> {
    typedef X T;
};
template <class X, int H> struct Conv {
    static __device__ __forceinline__ typename X::Out apply(const typename X::In &v, float s, float inv)
    {
        return X::apply(v, s, inv);
    }
};

#ifdef KVHAL_GPU_HW_FP8
/* Four quotients -> four OCP fp8 codes in one 32-bit word (a0 in byte 0): two packed conversions written straight
 * into the halves of one register, where fp8_hw_x2's 16-bit results were masked and permuted (3
 * instructions fewer per 4 bytes in the SASS). */
template <int OUT> __device__ __forceinline__ uint32_t fp8_hw_x4(float a0, float a1, float a2, float a3)
{
    uint32_t r;
    if (OUT == DT_E4M3)
        asm("{\n\t.reg .b16 lo, hi;\n\tcvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\tmov.b32 %0, {lo, hi};\n\t}"
            : "=r"(r)
            : "f"(a0), "f"(a1), "f"(a2), "f"(a3));
    else
        asm("{\n\t.reg .b16 lo, hi;\n\tcvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n\tmov.b32 %0, {lo, hi};\n\t}"
            : "=r"(r)
            : "f"(a0), "f"(a1), "f"(a2), "f"(a3));
    return r;
}

/* Whether any byte of a or b is a NaN code (fp8_nan_bytes' test, the masks only built when it holds). */
template <int OUT> __device__ __forceinline__ bool fp8_any_nan(uint32_t a, uint32_t b)
{
    const uint32_t add = OUT == DT_E4M3 ? 0x01010101u : 0x03030303u;
    return ((((a & 0x7f7f7f7fu) + add) | ((b & 0x7f7f7f7fu) + add)) & 0x80808080u) != 0;
}

/* XFp8Vec's conversion with the same results (the same quotients and hardware rounding, the same NaN fix-up). */
template <class X> struct XFp8Trim;
template <int OUT, int MODE> struct XFp8Trim<XFp8Vec<DT_F32, OUT, MODE>> {
    typedef XFp8Vec<DT_F32, OUT, MODE> V;
    static __device__ __forceinline__ uint32_t apply(const uint4 &v, float s, float inv)
    {
        const uint32_t c = fp8_hw_x4<OUT>(
            scaled<MODE>(kvhal_num_bits_f32(v.x), s, inv), scaled<MODE>(kvhal_num_bits_f32(v.y), s, inv),
            scaled<MODE>(kvhal_num_bits_f32(v.z), s, inv), scaled<MODE>(kvhal_num_bits_f32(v.w), s, inv));
        if (!fp8_any_nan<OUT>(c, 0u)) return c;
        const uint32_t n = fp8_nan_bytes<OUT>(c);
        const uint32_t sign = ((v.x >> 24) & 0x80u) | ((v.y >> 16) & 0x8000u) | ((v.z >> 8) & 0x800000u) |
                              (v.w & 0x80000000u);
        const uint32_t in_nan = V::nan_byte(v.x, 0xffu) | V::nan_byte(v.y, 0xff00u) | V::nan_byte(v.z, 0xff0000u) |
                                V::nan_byte(v.w, 0xff000000u);
        return fp8_fix_nan<OUT>(c, n, sign, in_nan);
    }
};
template <int IN, int OUT, int MODE> struct XFp8Trim<XFp8Vec<IN, OUT, MODE>> {
    typedef XFp8Vec<IN, OUT, MODE> V;
    static __device__ __forceinline__ uint32_t quad(uint32_t w0, uint32_t w1, float s, float inv)
    {
        return fp8_hw_x4<OUT>(scaled<MODE>(V::lane_lo(w0), s, inv), scaled<MODE>(V::lane_hi(w0), s, inv),
                              scaled<MODE>(V::lane_lo(w1), s, inv), scaled<MODE>(V::lane_hi(w1), s, inv));
    }
    static __device__ __forceinline__ uint2 apply(const uint4 &v, float s, float inv)
    {
        uint2 o;
        o.x = quad(v.x, v.y, s, inv);
        o.y = quad(v.z, v.w, s, inv);
        if (fp8_any_nan<OUT>(o.x, o.y)) { /* rare: as XFp8Vec */
            const uint32_t nx = fp8_nan_bytes<OUT>(o.x), ny = fp8_nan_bytes<OUT>(o.y);
            o.x = fp8_fix_nan<OUT>(o.x, nx, __byte_perm(v.x, v.y, 0x7531) & 0x80808080u, nan_lane_bytes<IN>(v.x, v.y));
            o.y = fp8_fix_nan<OUT>(o.y, ny, __byte_perm(v.z, v.w, 0x7531) & 0x80808080u, nan_lane_bytes<IN>(v.z, v.w));
        }
        return o;
    }
};
template <int IN, int OUT, int MODE, int H> struct Conv<XFp8Vec<IN, OUT, MODE>, H> {
    typedef XFp8Vec<IN, OUT, MODE> V;
    static __device__ __forceinline__ typename V::Out apply(const uint4 &v, float s, float inv)
    {
        return (H & KVHAL_GPU_HINT_TRIM) && !KVHAL_GPU_FNUZ(OUT) ? XFp8Trim<V>::apply(v, s, inv) : V::apply(v, s, inv);
    }
};
#endif

/* The row form's input loads under hints H (KVHAL_GPU_HINT_NA, CUDA only): the vector path's input unit is always a
 * uint4. */
#if defined(__CUDA_ARCH__) && !defined(__HIP_PLATFORM_AMD__) && !defined(__HIPCC_RTC__)
#define KVHAL_GPU_PTX_HINTS 1
#endif
template <int H, class T> __device__ __forceinline__ T ld_in(const T *p) { return *p; }
template <int H> __device__ __forceinline__ uint4 ld_in(const uint4 *p)
{
#ifdef KVHAL_GPU_PTX_HINTS
    if (H & KVHAL_GPU_HINT_NA) {
        uint4 v;
        asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
        return v;
    }
#endif
    return *p;
}

template <class X>
__device__ __forceinline__ typename X::In rows_load(const PagedSide &sd, const int64_t *s_in, uint32_t j)
{
    enum { H = PagedGeom<X>::HINTS };
    const typename X::In *in = reinterpret_cast<const typename X::In *>(sd.input);
    const uint32_t t = kvhal_fastdiv32_div(j, sd.div_row), r = j - t * sd.row_units;
    if (sd.one_run || ((H & KVHAL_GPU_HINT_RUN) && sd.in_run)) return ld_in<H>(in + s_in[t] + (int64_t)r);
    const uint32_t h = kvhal_fastdiv32_div(r, sd.div_head);
    return ld_in<H>(in + s_in[t] + (int64_t)h * sd.in_head + (int64_t)(r - h * sd.div_head.d));
}

template <class X>
__device__ __forceinline__ void rows_store(const PagedSide &sd, const int64_t *s_cache, uint32_t j,
                                           const typename X::In &v)
{
    enum { H = PagedGeom<X>::HINTS };
    typename X::Out *out = reinterpret_cast<typename X::Out *>(sd.cache);
    const uint32_t t = kvhal_fastdiv32_div(j, sd.div_row), r = j - t * sd.row_units;
    const int64_t co = s_cache[t];
    if (co < 0) return;
    if (sd.one_run) {
        out[co + (int64_t)r] = Conv<typename BaseX<X>::T, H>::apply(v, sd.scale, sd.inv);
        return;
    }
    const uint32_t h = kvhal_fastdiv32_div(r, sd.div_head);
    out[co + (int64_t)h * sd.cache_head + (int64_t)(r - h * sd.div_head.d)] =
        Conv<typename BaseX<X>::T, H>::apply(v, sd.scale, sd.inv);
}

/* Token tid's cache offsets in shared memory (-1: padding, or a slot out of range, which is flagged), from the slot
 * the thread loaded; every thread then meets at the barrier. */
__device__ __forceinline__ void paged_slot_offsets(const PagedParams &p, int64_t slot, uint32_t tid, uint32_t ntok,
                                                   int64_t *s_ck, int64_t *s_cv)
{
    if (tid < ntok) {
        int64_t ck = -1, cv = -1;
        if (slot >= p.num_slots) {
            p.err[KVHAL_GPU_ERR_SLOT] = 1;
        } else if (slot >= 0) {
            const int64_t blk = p.fast32 ? (int64_t)kvhal_fastdiv32_div((uint32_t)slot, p.div_bs) : slot / p.block_size;
            const int64_t off = slot - blk * p.block_size;
            ck = blk * p.k.block_stride + off * p.k.offset_stride;
            cv = blk * p.v.block_stride + off * p.v.offset_stride;
        }
        s_ck[tid] = ck;
        s_cv[tid] = cv;
    }
    __syncthreads();
}

/* The row form's passes over a block's ntok tokens: nk K units then the V units, U per thread per pass. */
template <class X>
__device__ __forceinline__ void paged_rows_pass(const PagedParams &p, int64_t slot, uint32_t ntok, int64_t *s_ck,
                                                int64_t *s_cv, const int64_t *s_ik, const int64_t *s_iv)
{
    enum { U = PagedGeom<X>::UNROLL };
    const uint32_t tid = threadIdx.x;
    const uint32_t nk = ntok * p.k.row_units, n = nk + ntok * p.v.row_units;
    for (uint32_t b0 = 0; b0 < n; b0 += U * blockDim.x) { /* uniform trip count */
        typename X::In val[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t i = b0 + (uint32_t)u * blockDim.x + tid;
            if (i < nk) val[u] = rows_load<X>(p.k, s_ik, i);
            else if (i < n) val[u] = rows_load<X>(p.v, s_iv, i - nk);
        }
        if (b0 == 0) paged_slot_offsets(p, slot, tid, ntok, s_ck, s_cv);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t i = b0 + (uint32_t)u * blockDim.x + tid;
            if (i < nk) rows_store<X>(p.k, s_ck, i, val[u]);
            else if (i < n) rows_store<X>(p.v, s_cv, i - nk, val[u]);
        }
    }
}

/* Block b handles tokens [b * tpc, b * tpc + tpc). The only memory latency it waits for is its data loads: each
 * token's slot load is issued first and consumed only after every K and V load of the first pass is in flight,
 * then the slots become cache offsets in shared memory (padding skipped, out-of-range flagged) and the stores go.
 * XK and XV are one type in every instantiation; a Rows transform runs the row form (paged_rows_pass), any other
 * the per-side form, where thread i loads unit i of K and unit i of V. */
template <class XK, class XV>
__global__ void __launch_bounds__(KVHAL_GPU_PAGED_THREADS, PagedGeom<XK>::MIN_BLOCKS) paged_caching_kernel(const PagedParams p)
{
    __shared__ int64_t s_ck[KVHAL_GPU_MAX_TPC], s_cv[KVHAL_GPU_MAX_TPC];
    __shared__ int64_t s_ik[KVHAL_GPU_MAX_TPC], s_iv[KVHAL_GPU_MAX_TPC];
    const int64_t tok0 = (int64_t)blockIdx.x * p.tpc;
    const int64_t left = p.num_tokens - tok0;
    const uint32_t ntok = (uint32_t)(left < p.tpc ? left : p.tpc);
    const uint32_t tid = threadIdx.x;
    int64_t slot = -1;
    if (tid < ntok) {
        const int64_t tok = tok0 + tid;
        /* 32-bit division by multiplication where the sizes allow: a 64-bit divide is a long dependent chain that
         * warp 0 would run while the block's other warps wait at the barrier below */
        const int64_t b = !p.batched ? 0
                          : p.fast32 ? (int64_t)kvhal_fastdiv32_div((uint32_t)tok, p.div_seq) : tok / p.seq_len;
        const int64_t s = tok - b * p.seq_len;
        const int64_t si = b * p.slot_outer + s * p.slot_inner;
        slot = p.slot64 ? reinterpret_cast<const int64_t *>(p.slots)[si]
                        : (int64_t)reinterpret_cast<const int32_t *>(p.slots)[si];
        s_ik[tid] = b * p.k.tok_outer + s * p.k.tok_inner;
        s_iv[tid] = b * p.v.tok_outer + s * p.v.tok_inner;
    }
    __syncthreads();
    if (PagedGeom<XK>::ROWS) {
        paged_rows_pass<XK>(p, slot, ntok, s_ck, s_cv, s_ik, s_iv);
        return;
    }
    const uint32_t nk = ntok * p.k.row_units, nv = ntok * p.v.row_units, n = nk > nv ? nk : nv;
    for (uint32_t b0 = 0; b0 < n; b0 += PagedGeom<XK>::UNROLL * blockDim.x) { /* uniform trip count */
        typename XK::In vk[PagedGeom<XK>::UNROLL];
        typename XV::In vv[PagedGeom<XK>::UNROLL];
        paged_load<XK>(p.k, s_ik, nk, b0, vk);
        paged_load<XV>(p.v, s_iv, nv, b0, vv);
        if (b0 == 0) paged_slot_offsets(p, slot, tid, ntok, s_ck, s_cv);
        paged_store<XK>(p.k, s_ck, nk, b0, vk);
        paged_store<XV>(p.v, s_cv, nv, b0, vv);
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* tensor_copy: dims already collapsed on the host; a unit is one element or, when the innermost dim is          */
/* contiguous in both tensors, 2..16 bytes of it.                                                              */
/* ------------------------------------------------------------------------------------------------------------ */
#define KVHAL_GPU_MAX_DIMS 6

struct TensorCopyParams {
    char *dst;       /* per call */
    const char *src; /* per call */
    int64_t n;       /* units */
    int64_t dstride[KVHAL_GPU_MAX_DIMS], sstride[KVHAL_GPU_MAX_DIMS]; /* units */
    kvhal_fastdiv64 div[KVHAL_GPU_MAX_DIMS];                         /* by each dim's extent in units */
    int32_t nd;
};

template <typename T>
__global__ void __launch_bounds__(KVHAL_GPU_THREADS) tensor_copy_kernel(const TensorCopyParams p)
{
    T *dst = reinterpret_cast<T *>(p.dst);
    const T *src = reinterpret_cast<const T *>(p.src);
    const uint64_t n = (uint64_t)p.n;
    const uint64_t step = (uint64_t)blockDim.x * gridDim.x;
    for (uint64_t base = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; base < n; base += KVHAL_GPU_UNROLL * step) {
        T v[KVHAL_GPU_UNROLL];
        int64_t doff[KVHAL_GPU_UNROLL];
#pragma unroll
        for (int u = 0; u < KVHAL_GPU_UNROLL; u++) {
            uint64_t i = base + (uint64_t)u * step;
            doff[u] = -1;
            if (i < n) {
                int64_t so = 0, d = 0;
#pragma unroll
                for (int k = KVHAL_GPU_MAX_DIMS - 1; k > 0; k--) {
                    if (k < p.nd) {
                        const uint64_t q = kvhal_fastdiv64_div(i, p.div[k]);
                        const int64_t c = (int64_t)(i - q * p.div[k].d);
                        so += c * p.sstride[k];
                        d += c * p.dstride[k];
                        i = q;
                    }
                }
                so += (int64_t)i * p.sstride[0];
                d += (int64_t)i * p.dstride[0];
                doff[u] = d;
                v[u] = src[so];
            }
        }
#pragma unroll
        for (int u = 0; u < KVHAL_GPU_UNROLL; u++)
            if (doff[u] >= 0) dst[doff[u]] = v[u];
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Byte-range copies (copy_blocks, copy_batch, page_transfer): the widest unit dividing addresses and length. */
/* ------------------------------------------------------------------------------------------------------------ */
template <typename T>
__device__ __forceinline__ void copy_units(char *dst, const char *src, uint64_t bytes)
{
    T *d = reinterpret_cast<T *>(dst);
    const T *s = reinterpret_cast<const T *>(src);
    const uint64_t n = bytes / sizeof(T);
    for (uint64_t base = threadIdx.x; base < n; base += (uint64_t)KVHAL_GPU_UNROLL * blockDim.x) {
        T v[KVHAL_GPU_UNROLL];
#pragma unroll
        for (int u = 0; u < KVHAL_GPU_UNROLL; u++) {
            const uint64_t i = base + (uint64_t)u * blockDim.x;
            if (i < n) v[u] = s[i];
        }
#pragma unroll
        for (int u = 0; u < KVHAL_GPU_UNROLL; u++) {
            const uint64_t i = base + (uint64_t)u * blockDim.x;
            if (i < n) d[i] = v[u];
        }
    }
}

/* The branch is uniform across the block: every thread sees the same addresses. */
__device__ __forceinline__ void copy_range(char *dst, const char *src, uint64_t bytes)
{
    const uint64_t a = (uint64_t)(uintptr_t)dst | (uint64_t)(uintptr_t)src | bytes;
    if ((a & 15u) == 0) copy_units<uint4>(dst, src, bytes);
    else if ((a & 7u) == 0) copy_units<uint2>(dst, src, bytes);
    else if ((a & 3u) == 0) copy_units<uint32_t>(dst, src, bytes);
    else if ((a & 1u) == 0) copy_units<uint16_t>(dst, src, bytes);
    else copy_units<uint8_t>(dst, src, bytes);
}

} // namespace kvhal_gpu

#endif /* KVHAL_GPU_KERNELS_CUH */

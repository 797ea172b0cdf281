/* reference.c — the host reference of kvhal's ops and number formats used by the tests (see reference.h). Written
 * for obviousness, not speed: every element is addressed through its full index and every conversion follows the
 * format's definition. */
#include "reference.h"

#include <math.h>
#include <string.h>

uint64_t ref_rand(ref_rng *r)
{
    if (!r->s) r->s = 0x853c49e6748fea9bull;
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

uint64_t ref_rand_below(ref_rng *r, uint64_t n) { return n ? ref_rand(r) % n : 0; }

float ref_rand_float(ref_rng *r, int lo_exp, int hi_exp)
{
    double m = 1.0 + (double)(ref_rand(r) >> 11) / 9007199254740992.0; /* [1, 2) */
    int e = lo_exp + (int)ref_rand_below(r, (uint64_t)(hi_exp - lo_exp + 1));
    float f = (float)ldexp(m, e);
    return (ref_rand(r) & 1) ? -f : f;
}

/* ---- formats ---- */

double ref_f16_decode(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, f = h & 1023;
    double v;
    if (e == 31) v = f ? NAN : INFINITY;
    else if (e == 0) v = ldexp(f, -24);
    else v = ldexp(1024 + f, e - 25);
    return s ? -v : v;
}

double ref_bf16_decode(uint16_t b)
{
    int s = b >> 15, e = (b >> 7) & 255, f = b & 127;
    double v;
    if (e == 255) v = f ? NAN : INFINITY;
    else if (e == 0) v = ldexp(f, -133);
    else v = ldexp(128 + f, e - 134);
    return s ? -v : v;
}

double ref_fp8_decode(uint8_t code, kvhal_dtype fp8)
{
    int s = code >> 7;
    double v;
    if (fp8 == KVHAL_FP8_E4M3FNUZ || fp8 == KVHAL_FP8_E5M2FNUZ) {
        /* AMD's fnuz formats, from their definition: bias 8 / 16, no infinities, 0x80 the one NaN */
        if (code == 0x80) return NAN;
        const int mb = fp8 == KVHAL_FP8_E4M3FNUZ ? 3 : 2, bias = fp8 == KVHAL_FP8_E4M3FNUZ ? 8 : 16;
        const int e = (code & 0x7f) >> mb, f = code & ((1 << mb) - 1);
        v = e == 0 ? ldexp(f, 1 - bias - mb) : ldexp((1 << mb) + f, e - bias - mb);
    } else if (fp8 == KVHAL_FP8_E4M3) {
        int e = (code >> 3) & 15, f = code & 7;
        if (e == 15 && f == 7) return NAN;
        v = e == 0 ? ldexp(f, -9) : ldexp(8 + f, e - 10);
    } else {
        int e = (code >> 2) & 31, f = code & 3;
        if (e == 31) {
            if (f) return NAN;
            v = INFINITY;
        } else {
            v = e == 0 ? ldexp(f, -16) : ldexp(4 + f, e - 17);
        }
    }
    return s ? -v : v;
}

uint8_t ref_fp8_encode(float x, kvhal_dtype fp8)
{
    const bool fnuz = fp8 == KVHAL_FP8_E4M3FNUZ || fp8 == KVHAL_FP8_E5M2FNUZ;
    const int max_code = fnuz ? 0x7f : fp8 == KVHAL_FP8_E4M3 ? 0x7e : 0x7b;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return fnuz ? 0x80 : sign | 0x7f;
    double a = fabs((double)x);
    if (a >= ref_fp8_decode((uint8_t)max_code, fp8)) return sign | (uint8_t)max_code;
    int best = 0;
    double best_d = INFINITY;
    for (int c = 0; c <= max_code; c++) {
        double d = fabs(ref_fp8_decode((uint8_t)c, fp8) - a);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    if (fnuz && best == 0) return 0; /* no negative zero: 0x80 is the NaN */
    return sign | (uint8_t)best;
}

/* Rounds |x| to a binary format with m fraction bits and minimum normal exponent emin using double arithmetic:
 * the quantum at x's binade, rint() (ties to even under the default rounding mode). */
static double round_to_format(double a, int m, int emin)
{
    if (a == 0) return 0;
    int e;
    frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;       /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - m);
    return rint(a / q) * q;
}

uint16_t ref_f16_encode(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x)) return sign | 0x7e00;
    double r = round_to_format(fabs((double)x), 10, -14);
    if (r >= 65536.0) return sign | 0x7c00;
    if (r < ldexp(1, -14)) return sign | (uint16_t)(r / ldexp(1, -24));
    int e;
    double f = frexp(r, &e); /* r = f * 2^e */
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)(ldexp(f, 11) - 1024);
}

uint16_t ref_bf16_encode(float x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    if (isnan(x)) return sign | 0x7fc0;
    double r = round_to_format(fabs((double)x), 7, -126);
    if (r >= ldexp(1, 128)) return sign | 0x7f80;
    if (r < ldexp(1, -126)) return sign | (uint16_t)(r / ldexp(1, -133));
    int e;
    double f = frexp(r, &e);
    return sign | (uint16_t)((e - 1 + 127) << 7) | (uint16_t)(ldexp(f, 8) - 128);
}

/* ---- elements ---- */

int64_t ref_elem_offset(const kvhal_tensor *t, const int64_t *idx)
{
    int64_t off = (int64_t)(t->offset / kvhal_dtype_size(t->dtype));
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    return off;
}

float ref_load(const uint8_t *m, kvhal_dtype dt, int64_t elem)
{
    switch (dt) {
    case KVHAL_F32: {
        float f;
        memcpy(&f, m + elem * 4, 4);
        return f;
    }
    case KVHAL_F16: {
        uint16_t h;
        memcpy(&h, m + elem * 2, 2);
        return (float)ref_f16_decode(h);
    }
    case KVHAL_BF16: {
        uint16_t h;
        memcpy(&h, m + elem * 2, 2);
        return (float)ref_bf16_decode(h);
    }
    default:
        return (float)ref_fp8_decode(m[elem], dt);
    }
}

int64_t ref_load_int(const uint8_t *m, kvhal_dtype dt, int64_t elem)
{
    if (dt == KVHAL_I32) {
        int32_t v;
        memcpy(&v, m + elem * 4, 4);
        return v;
    }
    int64_t v;
    memcpy(&v, m + elem * 8, 8);
    return v;
}

/* Moves one element: raw bytes when the dtypes match, value / scale rounded to fp8 otherwise. */
static void put_element(uint8_t *dst, kvhal_dtype ddt, int64_t delem, const uint8_t *src, kvhal_dtype sdt,
                        int64_t selem, float scale)
{
    size_t des = kvhal_dtype_size(ddt), ses = kvhal_dtype_size(sdt);
    if (ddt == sdt) {
        memcpy(dst + delem * (int64_t)des, src + selem * (int64_t)ses, des);
        return;
    }
    float x = ref_load(src, sdt, selem);
    float q = x / scale; /* in float, as the op is defined */
    dst[delem] = ref_fp8_encode(q, ddt);
}

/* ---- ops ---- */

static void side(uint8_t *cm, const kvhal_tensor *cache, const uint8_t *im, const kvhal_tensor *in, int64_t t,
                 int64_t seq, int64_t slot, float scale)
{
    const int64_t bs = cache->shape[1], heads = cache->shape[2], dim = cache->shape[3];
    for (int64_t h = 0; h < heads; h++) {
        for (int64_t d = 0; d < dim; d++) {
            int64_t ci[4] = {slot / bs, slot % bs, h, d};
            int64_t ii[4];
            if (in->ndim == 4) {
                ii[0] = t / seq, ii[1] = t % seq, ii[2] = h, ii[3] = d;
            } else {
                ii[0] = t, ii[1] = h, ii[2] = d;
            }
            put_element(cm, cache->dtype, ref_elem_offset(cache, ci), im, in->dtype, ref_elem_offset(in, ii), scale);
        }
    }
}

void ref_paged_caching(uint8_t *kc_mirror, const kvhal_tensor *k_cache, uint8_t *vc_mirror,
                       const kvhal_tensor *v_cache, const uint8_t *k_mirror, const kvhal_tensor *k,
                       const uint8_t *v_mirror, const kvhal_tensor *v, const uint8_t *slot_mirror,
                       const kvhal_tensor *slots, float k_scale, float v_scale)
{
    const int64_t tokens = k->ndim == 4 ? k->shape[0] * k->shape[1] : k->shape[0];
    const int64_t seq = k->ndim == 4 ? k->shape[1] : tokens;
    const int64_t slot_seq = slots->ndim == 2 ? slots->shape[1] : tokens;
    const int64_t max_slot = k_cache->shape[0] * k_cache->shape[1];
    for (int64_t t = 0; t < tokens; t++) {
        int64_t si[2];
        if (slots->ndim == 2) si[0] = t / slot_seq, si[1] = t % slot_seq;
        else si[0] = t;
        int64_t slot = ref_load_int(slot_mirror, slots->dtype, ref_elem_offset(slots, si));
        if (slot < 0 || slot >= max_slot) continue;
        side(kc_mirror, k_cache, k_mirror, k, t, seq, slot, k_scale);
        side(vc_mirror, v_cache, v_mirror, v, t, seq, slot, v_scale);
    }
}

/* Visits every index of a shape in row-major order. */
static bool next_index(int64_t *idx, const int64_t *shape, int ndim)
{
    for (int i = ndim - 1; i >= 0; i--) {
        if (++idx[i] < shape[i]) return true;
        idx[i] = 0;
    }
    return false;
}

void ref_copy_blocks(uint8_t *const *mirrors, const kvhal_tensor *caches, int32_t num_caches, const int64_t *pairs,
                     int32_t num_pairs)
{
    for (int32_t p = 0; p < num_pairs; p++) {
        for (int32_t c = 0; c < num_caches; c++) {
            const kvhal_tensor *t = &caches[c];
            int64_t inner[KVHAL_MAX_DIMS] = {0}, idx[KVHAL_MAX_DIMS], jdx[KVHAL_MAX_DIMS];
            bool empty = false;
            for (int i = 1; i < t->ndim; i++) empty |= t->shape[i] == 0;
            if (empty) continue;
            do {
                idx[0] = pairs[2 * p], jdx[0] = pairs[2 * p + 1];
                for (int i = 1; i < t->ndim; i++) idx[i] = jdx[i] = inner[i - 1];
                put_element(mirrors[c], t->dtype, ref_elem_offset(t, jdx), mirrors[c], t->dtype,
                            ref_elem_offset(t, idx), 1.0f);
            } while (next_index(inner, t->shape + 1, t->ndim - 1));
        }
    }
}

void ref_tensor_copy(uint8_t *dst_mirror, const kvhal_tensor *dst, const uint8_t *src_mirror,
                     const kvhal_tensor *src)
{
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] == 0) return;
    int64_t idx[KVHAL_MAX_DIMS] = {0};
    do {
        put_element(dst_mirror, dst->dtype, ref_elem_offset(dst, idx), src_mirror, src->dtype,
                    ref_elem_offset(src, idx), 1.0f);
    } while (next_index(idx, dst->shape, dst->ndim));
}

void ref_page_transfer(uint8_t *const *mirrors, const kvhal_tensor *caches, int32_t num_caches, uint8_t *host,
                       size_t host_page_bytes, const int64_t *pairs, int32_t num_pairs, bool to_host)
{
    for (int32_t p = 0; p < num_pairs; p++) {
        size_t at = (size_t)pairs[2 * p + 1] * host_page_bytes; /* the page's first byte in host */
        for (int32_t c = 0; c < num_caches; c++) {
            const kvhal_tensor *t = &caches[c];
            const size_t es = kvhal_dtype_size(t->dtype);
            int64_t inner[KVHAL_MAX_DIMS] = {0}, idx[KVHAL_MAX_DIMS];
            bool empty = false;
            for (int i = 1; i < t->ndim; i++) empty |= t->shape[i] == 0;
            if (empty) continue;
            do { /* the block's elements in row-major order fill the host page one after another */
                idx[0] = pairs[2 * p];
                for (int i = 1; i < t->ndim; i++) idx[i] = inner[i - 1];
                uint8_t *dev = mirrors[c] + (size_t)ref_elem_offset(t, idx) * es;
                if (to_host) memcpy(host + at, dev, es);
                else memcpy(dev, host + at, es);
                at += es;
            } while (next_index(inner, t->shape + 1, t->ndim - 1));
        }
    }
}

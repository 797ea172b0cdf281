/* checks.c — the checks of kvhal-conformance: every op on a device of any registered device type (built in, or
 * registered by a loaded module such as examples/vendor-plugin's npu), against the host reference (reference.c):
 * paged caching over all input/cache dtypes (fp8 with scales), NHD and HND, odd strides, [batch, seq] inputs, i32/i64
 * and padding slots, out-of-range slots (CPU: error, nothing written; device backends: skipped + KVHAL_DEVICE_FAULT),
 * then copy_blocks, tensor_copy, page_transfer and device events, plus the number-format conversions themselves
 * (a host check). The whole device buffer is compared after each op, so a stray write anywhere is caught. An op a
 * present device does not support is a failure, except where a check says it is optional (page_transfer). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "kvhal.h"
#include "check.h"
#include "reference.h"
#include "device_buffer.h"

/* Fills the whole buffer with finite values of dtype dt (as if it were one array of dt). */
static void dbuf_fill_values(dbuf *b, kvhal_dtype dt, ref_rng *r, float scale)
{
    size_t es = kvhal_dtype_size(dt), n = b->size / es;
    for (size_t i = 0; i < n; i++) {
        float x;
        uint64_t pick = ref_rand_below(r, 8);
        if (pick == 0 && (dt == KVHAL_F32 || dt == KVHAL_F16 || dt == KVHAL_BF16)) {
            /* an exact tie between two neighbouring fp8 values (either format), times the scale */
            static const kvhal_dtype fs[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
            static const uint8_t maxc[4] = {0x7e, 0x7b, 0x7f, 0x7f};
            const int fi = (int)ref_rand_below(r, 4);
            kvhal_dtype f = fs[fi];
            uint8_t c = (uint8_t)ref_rand_below(r, maxc[fi]);
            x = (float)((ref_fp8_decode(c, f) + ref_fp8_decode((uint8_t)(c + 1), f)) / 2 * scale);
            if (ref_rand(r) & 1) x = -x;
        } else if (pick == 1) {
            x = 0.0f;
        } else {
            x = ref_rand_float(r, -18, 17) * scale;
        }
        uint8_t *p = b->mirror + i * es;
        if (dt == KVHAL_F32) memcpy(p, &x, 4);
        else if (dt == KVHAL_F16) {
            uint16_t h = ref_f16_encode(x);
            memcpy(p, &h, 2);
        } else if (dt == KVHAL_BF16) {
            uint16_t h = ref_bf16_encode(x);
            memcpy(p, &h, 2);
        }
    }
    dbuf_upload(b);
}

static void store_slot(dbuf *b, kvhal_dtype dt, int64_t elem, int64_t v)
{
    if (dt == KVHAL_I32) {
        int32_t x = (int32_t)v;
        memcpy(b->mirror + elem * 4, &x, 4);
    } else {
        memcpy(b->mirror + elem * 8, &v, 8);
    }
}

/* ---- conversions (device independent; run once, on the host entry) ---- */

static void test_conversions(void **state)
{
    (void)state;
    static const kvhal_dtype fp8s[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
    ref_rng r = {42};
    for (int f = 0; f < 4; f++) {
        kvhal_dtype t = fp8s[f];
        const bool fnuz = f >= 2;
        for (int c = 0; c < 256; c++) {
            double want = ref_fp8_decode((uint8_t)c, t);
            float got = kvhal_fp8_to_f32((uint8_t)c, t);
            if (isnan(want)) assert_true(isnan(got));
            else if ((double)got != want) fail_msg("%s decode 0x%02x: %g, want %g", kvhal_dtype_name(t), c, got, want);
        }
        /* every code, the midpoints to its neighbours and the floats right around them */
        const int max_code = fnuz ? 0x7f : t == KVHAL_FP8_E4M3 ? 0x7e : 0x7b;
        for (int c = 0; c <= max_code; c++) {
            double a = ref_fp8_decode((uint8_t)c, t);
            double b = c < max_code ? ref_fp8_decode((uint8_t)(c + 1), t) : a * 1.25;
            float pts[5] = {(float)a, (float)((a + b) / 2), nextafterf((float)((a + b) / 2), 0.0f),
                            nextafterf((float)((a + b) / 2), INFINITY), nextafterf((float)a, INFINITY)};
            for (int i = 0; i < 5; i++) {
                for (int sgn = 0; sgn < 2; sgn++) {
                    float x = sgn ? -pts[i] : pts[i];
                    uint8_t got = kvhal_f32_to_fp8(x, t), want = ref_fp8_encode(x, t);
                    if (got != want)
                        fail_msg("%s encode %a: 0x%02x, want 0x%02x", kvhal_dtype_name(t), (double)x, got, want);
                }
            }
        }
        for (int i = 0; i < 200000; i++) {
            float x = ref_rand_float(&r, -30, 20);
            uint8_t got = kvhal_f32_to_fp8(x, t), want = ref_fp8_encode(x, t);
            if (got != want) fail_msg("%s encode %a: 0x%02x, want 0x%02x", kvhal_dtype_name(t), (double)x, got, want);
        }
        /* specials: saturation (inf too), NaN keeps its sign, signed zero */
        assert_int_equal(kvhal_f32_to_fp8(INFINITY, t), max_code);
        assert_int_equal(kvhal_f32_to_fp8(-INFINITY, t), 0x80 | max_code);
        assert_int_equal(kvhal_f32_to_fp8(1e30f, t), max_code);
        assert_int_equal(kvhal_f32_to_fp8(NAN, t), fnuz ? 0x80 : 0x7f);
        assert_int_equal(kvhal_f32_to_fp8(-NAN, t), fnuz ? 0x80 : 0xff);
        assert_int_equal(kvhal_f32_to_fp8(-0.0f, t), fnuz ? 0x00 : 0x80); /* fnuz: no negative zero */
        assert_int_equal(kvhal_f32_to_fp8(-1e-30f, t), fnuz ? 0x00 : 0x80);
        assert_int_equal(kvhal_f32_to_fp8(1e-30f, t), 0x00);
    }
    /* the fnuz formats' definitions: largest 240 / 57344, smallest 2^-10 / 2^-17, 0x80 the one NaN, no infinity */
    assert_true(kvhal_fp8_to_f32(0x7f, KVHAL_FP8_E4M3FNUZ) == 240.0f);
    assert_true(kvhal_fp8_to_f32(0x7f, KVHAL_FP8_E5M2FNUZ) == 57344.0f);
    assert_true(kvhal_fp8_to_f32(0x01, KVHAL_FP8_E4M3FNUZ) == ldexpf(1, -10));
    assert_true(kvhal_fp8_to_f32(0x01, KVHAL_FP8_E5M2FNUZ) == ldexpf(1, -17));
    assert_true(kvhal_fp8_to_f32(0x40, KVHAL_FP8_E4M3FNUZ) == 1.0f);
    assert_true(kvhal_fp8_to_f32(0x40, KVHAL_FP8_E5M2FNUZ) == 1.0f);
    assert_true(isnan(kvhal_fp8_to_f32(0x80, KVHAL_FP8_E4M3FNUZ)));
    assert_true(isnan(kvhal_fp8_to_f32(0x80, KVHAL_FP8_E5M2FNUZ)));
    assert_true(kvhal_fp8_to_f32(0xff, KVHAL_FP8_E4M3FNUZ) == -240.0f);
    assert_int_equal(kvhal_f32_to_fp8(INFINITY, KVHAL_FP8_E4M3FNUZ), 0x7f);
    assert_int_equal(kvhal_f32_to_fp8(-300.0f, KVHAL_FP8_E4M3FNUZ), 0xff);
    assert_true(kvhal_fp8_to_f32(0x7e, KVHAL_FP8_E4M3) == 448.0f);
    assert_true(kvhal_fp8_to_f32(0x7b, KVHAL_FP8_E5M2) == 57344.0f);
    assert_true(isinf(kvhal_fp8_to_f32(0x7c, KVHAL_FP8_E5M2)));
    assert_true(kvhal_fp8_to_f32(0x01, KVHAL_FP8_E4M3) == ldexpf(1, -9));
    assert_true(kvhal_fp8_to_f32(0x01, KVHAL_FP8_E5M2) == ldexpf(1, -16));

    /* f16 and bf16: every code decodes as defined and round-trips; random floats round as the reference */
    for (uint32_t h = 0; h < 65536; h++) {
        double w16 = ref_f16_decode((uint16_t)h), wb = ref_bf16_decode((uint16_t)h);
        float g16 = kvhal_f16_to_f32((uint16_t)h), gb = kvhal_bf16_to_f32((uint16_t)h);
        if (isnan(w16)) assert_true(isnan(g16));
        else {
            if ((double)g16 != w16) fail_msg("f16 decode 0x%04x: %g, want %g", h, g16, w16);
            assert_int_equal(kvhal_f32_to_f16(g16), h);
        }
        if (isnan(wb)) assert_true(isnan(gb));
        else {
            if ((double)gb != wb) fail_msg("bf16 decode 0x%04x: %g, want %g", h, gb, wb);
            assert_int_equal(kvhal_f32_to_bf16(gb), h);
        }
    }
    for (int i = 0; i < 300000; i++) {
        float x = ref_rand_float(&r, i % 2 ? -30 : -140, i % 2 ? 20 : 130);
        if (i % 7 == 0) {
            /* exact f16 / bf16 midpoints */
            uint16_t h = (uint16_t)ref_rand_below(&r, 0x7bff);
            x = (float)((ref_f16_decode(h) + ref_f16_decode((uint16_t)(h + 1))) / 2);
        } else if (i % 7 == 1) {
            uint16_t h = (uint16_t)ref_rand_below(&r, 0x7f7f);
            x = (float)((ref_bf16_decode(h) + ref_bf16_decode((uint16_t)(h + 1))) / 2);
        }
        uint16_t g = kvhal_f32_to_f16(x), w = ref_f16_encode(x);
        if (g != w) fail_msg("f16 encode %a: 0x%04x, want 0x%04x", (double)x, g, w);
        g = kvhal_f32_to_bf16(x), w = ref_bf16_encode(x);
        if (g != w) fail_msg("bf16 encode %a: 0x%04x, want 0x%04x", (double)x, g, w);
    }
    assert_int_equal(kvhal_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(kvhal_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(kvhal_f32_to_bf16(INFINITY), 0x7f80);
    assert_true(isnan(kvhal_f16_to_f32(kvhal_f32_to_f16(NAN))));
    assert_true(isnan(kvhal_bf16_to_f32(kvhal_f32_to_bf16(NAN))));
}

/* ---- paged caching ---- */

enum { FORM_DENSE, FORM_FUSED, FORM_STRIDED_DIM, FORM_BATCH_SEQ, FORM_FLAT_2D_SLOTS, FORM_BATCH_SEQ_FLAT_SLOTS,
       FORM_COUNT };
static const char *const form_names[FORM_COUNT] = {"dense [T,H,D]", "fused qkv [T,3,H,D]", "dim stride 2",
                                                   "[B,S,H,D] + [B,S] slots", "[T,H,D] + [B,S] slots",
                                                   "[B,S,H,D] + [B*S] slots (stride 3)"};

#define NB 7
#define BS 5
#define NH 3
#define DK 20
#define DV 12
#define BATCH 2
#define SEQ 6
#define CACHE_PAD 64 /* bytes before the K cache, to test offsets */

typedef struct pc_setup {
    dbuf cache, kin, vin, slots;
    kvhal_tensor kc, vc, k, v, s;
    int64_t tokens;
} pc_setup;

/* Builds the cache views and inputs of one case. The inputs are filled later. */
static void pc_build(pc_setup *p, kvhal_device dev, kvhal_dtype in_dt, kvhal_dtype cache_dt, kvhal_dtype slot_dt,
                     kvhal_paged_layout layout, int form, ref_rng *r)
{
    memset(p, 0, sizeof *p);
    const size_t ces = kvhal_dtype_size(cache_dt), ies = kvhal_dtype_size(in_dt), ses = kvhal_dtype_size(slot_dt);
    const int64_t kelems = NB * BS * NH * DK, velems = NB * BS * NH * DV;
    dbuf_make(&p->cache, dev, CACHE_PAD + (size_t)(kelems + velems) * ces + 32, r);
    int64_t kshape[4] = {NB, BS, NH, DK}, vshape[4] = {NB, BS, NH, DV};
    int64_t ks[4], vs[4];
    if (layout == KVHAL_LAYOUT_NHD) {
        int64_t a[4] = {BS * NH * DK, NH * DK, DK, 1}, b[4] = {BS * NH * DV, NH * DV, DV, 1};
        memcpy(ks, a, sizeof a), memcpy(vs, b, sizeof b);
    } else {
        int64_t a[4] = {NH * BS * DK, DK, BS * DK, 1}, b[4] = {NH * BS * DV, DV, BS * DV, 1};
        memcpy(ks, a, sizeof a), memcpy(vs, b, sizeof b);
    }
    p->kc = tensor(&p->cache, CACHE_PAD, cache_dt, 4, kshape, ks);
    p->vc = tensor(&p->cache, CACHE_PAD + (size_t)kelems * ces, cache_dt, 4, vshape, vs);

    const bool bs_form = form == FORM_BATCH_SEQ || form == FORM_FLAT_2D_SLOTS || form == FORM_BATCH_SEQ_FLAT_SLOTS;
    p->tokens = bs_form ? BATCH * SEQ : 11;
    const int64_t T = p->tokens;
    switch (form) {
    case FORM_DENSE:
    case FORM_FLAT_2D_SLOTS: {
        dbuf_make(&p->kin, dev, (size_t)(T * NH * DK) * ies, r);
        dbuf_make(&p->vin, dev, (size_t)(T * NH * DV) * ies, r);
        int64_t a[3] = {T, NH, DK}, b[3] = {T, NH, DV};
        p->k = tensor(&p->kin, 0, in_dt, 3, a, NULL);
        p->v = tensor(&p->vin, 0, in_dt, 3, b, NULL);
        break;
    }
    case FORM_FUSED: {
        /* q, k, v of one projection output [T, 3, H, D]: K and V are views with a token stride of 3*H*D */
        dbuf_make(&p->kin, dev, (size_t)(T * 3 * NH * DK) * ies, r);
        dbuf_make(&p->vin, dev, (size_t)(T * 3 * NH * DV) * ies, r);
        int64_t a[3] = {T, NH, DK}, as[3] = {3 * NH * DK, DK, 1}, b[3] = {T, NH, DV}, bs[3] = {3 * NH * DV, DV, 1};
        p->k = tensor(&p->kin, (size_t)(NH * DK) * ies, in_dt, 3, a, as);
        p->v = tensor(&p->vin, (size_t)(2 * NH * DV) * ies, in_dt, 3, b, bs);
        break;
    }
    case FORM_STRIDED_DIM: {
        /* K with a non-unit dim stride and a padded head stride; V with heads before tokens in memory */
        const int64_t hs = 2 * DK + 3;
        dbuf_make(&p->kin, dev, (size_t)(T * NH * hs) * ies, r);
        dbuf_make(&p->vin, dev, (size_t)(T * NH * DV) * ies, r);
        int64_t a[3] = {T, NH, DK}, as[3] = {NH * hs, hs, 2}, b[3] = {T, NH, DV}, bs[3] = {DV, T * DV, 1};
        p->k = tensor(&p->kin, 0, in_dt, 3, a, as);
        p->v = tensor(&p->vin, 0, in_dt, 3, b, bs);
        break;
    }
    case FORM_BATCH_SEQ:
    case FORM_BATCH_SEQ_FLAT_SLOTS: {
        dbuf_make(&p->kin, dev, (size_t)(T * NH * DK) * ies, r);
        dbuf_make(&p->vin, dev, (size_t)(T * NH * DV) * ies + 64, r);
        int64_t a[4] = {BATCH, SEQ, NH, DK}, b[4] = {BATCH, SEQ, NH, DV};
        /* V's batches are padded apart */
        int64_t bs[4] = {SEQ * NH * DV + (int64_t)(32 / ies), NH * DV, DV, 1};
        p->k = tensor(&p->kin, 0, in_dt, 4, a, NULL);
        p->v = tensor(&p->vin, 0, in_dt, 4, b, bs);
        break;
    }
    }
    if (form == FORM_BATCH_SEQ_FLAT_SLOTS) {
        dbuf_make(&p->slots, dev, (size_t)(T * 3) * ses, r);
        int64_t a[1] = {T}, as[1] = {3};
        p->s = tensor(&p->slots, 2 * ses, slot_dt, 1, a, as);
    } else if (bs_form) {
        /* [B, S] slots taken from column 1 of a [B, S, 2] array */
        dbuf_make(&p->slots, dev, (size_t)(T * 2) * ses, r);
        int64_t a[2] = {BATCH, SEQ}, as[2] = {2 * SEQ, 2};
        p->s = tensor(&p->slots, ses, slot_dt, 2, a, as);
    } else {
        dbuf_make(&p->slots, dev, (size_t)T * ses, r);
        int64_t a[1] = {T};
        p->s = tensor(&p->slots, 0, slot_dt, 1, a, NULL);
    }
}

/* Distinct random slots (a slot written twice has no defined winner on a GPU), some of them padding. */
static void pc_fill(pc_setup *p, kvhal_dtype in_dt, float ks, float vs, ref_rng *r, int64_t bad_token,
                    int64_t bad_slot)
{
    dbuf_fill_values(&p->kin, in_dt, r, ks);
    dbuf_fill_values(&p->vin, in_dt, r, vs);
    int64_t perm[NB * BS];
    for (int i = 0; i < NB * BS; i++) perm[i] = i;
    for (int i = NB * BS - 1; i > 0; i--) {
        int j = (int)ref_rand_below(r, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int64_t t = 0; t < p->tokens; t++) {
        int64_t slot = perm[t];
        if (t % 4 == 3) slot = t % 8 == 3 ? -1 : -1000; /* padding */
        if (t == bad_token) slot = bad_slot;
        int64_t idx[2] = {t / SEQ, t % SEQ};
        if (p->s.ndim == 1) idx[0] = t;
        store_slot(&p->slots, p->s.dtype, ref_elem_offset(&p->s, idx), slot);
    }
    dbuf_upload(&p->slots);
}

static void pc_free(pc_setup *p)
{
    dbuf_free(&p->cache);
    dbuf_free(&p->kin);
    dbuf_free(&p->vin);
    dbuf_free(&p->slots);
}

static void pc_expect_all(pc_setup *p, const char *label)
{
    char what[320]; /* labels are under 256 characters */
    snprintf(what, sizeof what, "%s: cache", label);
    dbuf_expect(&p->cache, what);
    snprintf(what, sizeof what, "%s: k input", label);
    dbuf_expect(&p->kin, what);
    snprintf(what, sizeof what, "%s: v input", label);
    dbuf_expect(&p->vin, what);
}

static void run_paged_case(kvhal_device dev, kvhal_dtype in_dt, kvhal_dtype cache_dt, kvhal_dtype slot_dt,
                           kvhal_paged_layout layout, int form, ref_rng *r)
{
    char label[256];
    snprintf(label, sizeof label, "paged_caching in=%s cache=%s slots=%s %s %s", kvhal_dtype_name(in_dt),
             kvhal_dtype_name(cache_dt), kvhal_dtype_name(slot_dt), layout == KVHAL_LAYOUT_NHD ? "NHD" : "HND",
             form_names[form]);
    const bool fp8 = cache_dt == KVHAL_FP8_E4M3 || cache_dt == KVHAL_FP8_E5M2 || cache_dt == KVHAL_FP8_E4M3FNUZ ||
                     cache_dt == KVHAL_FP8_E5M2FNUZ;
    pc_setup p;
    pc_build(&p, dev, in_dt, cache_dt, slot_dt, layout, form, r);
    /* several times: the later calls hit the descriptor cache with new data and new scales. fp8 scales cover every
     * scaling mode a backend may specialise: 1 (none), powers of two above and below 1 (exact as a multiply by
     * 1/scale), calibrated ones (0.37, 0.0123: a reciprocal with a correction on GPUs), one calibrated scale with a
     * power of two, and scales outside the reciprocal's range (1e-30, 3e30: a true division). */
    static const float fp8_scales[6][2] = {{0.5f, 2.0f}, {0.37f, 3.0f}, {1.0f, 0.25f}, {0.0123f, 0.37f},
                                           {0.37f, 0.5f}, {1e-30f, 3e30f}};
    for (int rep = 0; rep < (fp8 ? 6 : 2); rep++) {
        float ks = fp8 ? fp8_scales[rep][0] : 1.0f, vs = fp8 ? fp8_scales[rep][1] : 1.0f;
        pc_fill(&p, in_dt, ks, vs, r, -1, 0);
        kvhal_status st = kvhal_paged_caching(&p.kc, &p.vc, &p.k, &p.v, &p.s, ks, vs, NULL);
        if (st != KVHAL_OK) fail_msg("%s: %s (%s)", label, kvhal_status_name(st), kvhal_last_error());
        st = kvhal_device_synchronize(dev);
        if (st != KVHAL_OK) fail_msg("%s: synchronize: %s (%s)", label, kvhal_status_name(st), kvhal_last_error());
        ref_paged_caching(p.cache.mirror, &p.kc, p.cache.mirror, &p.vc, p.kin.mirror, &p.k, p.vin.mirror, &p.v,
                          p.slots.mirror, &p.s, ks, vs);
        pc_expect_all(&p, label);
    }
    pc_free(&p);
}

static void test_paged_caching(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {1234};
    static const kvhal_dtype ins[3] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16};
    int cases = 0;
    for (int i = 0; i < 3; i++) {
        kvhal_dtype outs[5] = {ins[i], KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
        for (int o = 0; o < 5; o++) {
            for (int layout = 0; layout < 2; layout++) {
                for (int form = 0; form < FORM_COUNT; form++) {
                    /* alternate the slot dtype so both meet every other parameter across the matrix */
                    kvhal_dtype slot_dt = (form + layout + o) % 2 ? KVHAL_I32 : KVHAL_I64;
                    run_paged_case(dev, ins[i], outs[o], slot_dt, (kvhal_paged_layout)layout, form, &r);
                    cases++;
                }
            }
        }
    }
    /* both slot dtypes on the densest and the most strided form of each dtype pair */
    for (int i = 0; i < 3; i++) {
        for (int s = 0; s < 2; s++) {
            run_paged_case(dev, ins[i], KVHAL_FP8_E4M3, s ? KVHAL_I32 : KVHAL_I64, KVHAL_LAYOUT_HND,
                           FORM_STRIDED_DIM, &r);
            run_paged_case(dev, ins[i], ins[i], s ? KVHAL_I32 : KVHAL_I64, KVHAL_LAYOUT_NHD, FORM_DENSE, &r);
            cases += 2;
        }
    }
    conf_note("%d cases matched the reference", cases);
}

/* Signed zeros into every fp8 format at every scale mode, dense (DK = 20, DV = 12 with eight lanes: the vector body
 * and a scalar tail of each row) and with a dim stride (the scalar loop): +0 must give 0x00, -0 0x80 (0x00 in the
 * fnuz formats). The CPU backend's reciprocal + fma tail once took the code's sign from the quotient, which is
 * -(+0) + (+0): +0 on hardware, -0 under valgrind's vfnmadd,
 * so a +0 input became 0x80 there; the sign now comes from the input on every path. */
static void test_paged_signed_zeros(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {77};
    static const kvhal_dtype ins[3] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16};
    static const kvhal_dtype outs[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
    static const float scales[4][2] = {{0.37f, 3.0f}, {0.0123f, 0.5f}, {1.0f, 0.25f}, {1e-30f, 3e30f}};
    for (int i = 0; i < 3; i++) {
        for (int o = 0; o < 4; o++) {
            for (int form = 0; form < 2; form++) {
                pc_setup p;
                const int pf = form ? FORM_STRIDED_DIM : FORM_DENSE;
                pc_build(&p, dev, ins[i], outs[o], KVHAL_I64, KVHAL_LAYOUT_NHD, pf, &r);
                for (int sc = 0; sc < 4; sc++) {
                    const float ks = scales[sc][0], vs = scales[sc][1];
                    pc_fill(&p, ins[i], ks, vs, &r, -1, 0);
                    /* every element a zero, +0 and -0 in runs of three so both signs meet every lane */
                    dbuf *ins2[2] = {&p.kin, &p.vin};
                    const size_t es = kvhal_dtype_size(ins[i]);
                    for (int b = 0; b < 2; b++) {
                        for (size_t e = 0; e < ins2[b]->size / es; e++) {
                            memset(ins2[b]->mirror + e * es, 0, es);
                            if ((e / 3) % 2) ins2[b]->mirror[e * es + es - 1] = 0x80;
                        }
                        dbuf_upload(ins2[b]);
                    }
                    char label[160];
                    snprintf(label, sizeof label, "signed zeros in=%s cache=%s %s scales %g %g",
                             kvhal_dtype_name(ins[i]), kvhal_dtype_name(outs[o]), form_names[pf], (double)ks,
                             (double)vs);
                    OK(kvhal_paged_caching(&p.kc, &p.vc, &p.k, &p.v, &p.s, ks, vs, NULL));
                    OK(kvhal_device_synchronize(dev));
                    ref_paged_caching(p.cache.mirror, &p.kc, p.cache.mirror, &p.vc, p.kin.mirror, &p.k, p.vin.mirror,
                                      &p.v, p.slots.mirror, &p.s, ks, vs);
                    pc_expect_all(&p, label);
                }
                pc_free(&p);
            }
        }
    }
}

static void test_paged_out_of_range(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {99};
    const bool host_slots = dev.type == KVHAL_DEVICE_CPU;
    struct {
        kvhal_dtype in, cache, slot;
        int64_t bad;
    } cases[] = {
        {KVHAL_F16, KVHAL_F16, KVHAL_I64, NB * BS},            /* one past the end */
        {KVHAL_F32, KVHAL_FP8_E4M3, KVHAL_I32, INT32_MAX},      /* far */
        {KVHAL_BF16, KVHAL_BF16, KVHAL_I64, (int64_t)1 << 40},  /* beyond 32 bits */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int layout = 0; layout < 2; layout++) {
            pc_setup p;
            pc_build(&p, dev, cases[c].in, cases[c].cache, cases[c].slot, (kvhal_paged_layout)layout, FORM_DENSE,
                     &r);
            const int64_t bad_token = 5;
            pc_fill(&p, cases[c].in, 1.0f, 1.0f, &r, bad_token, cases[c].bad);
            kvhal_clear_error();
            /* HND runs on a stream of its own, whose check reports the fault without a device-wide wait */
            kvhal_stream *cs = NULL;
            if (layout == 1) assert_int_equal(kvhal_stream_create(dev, &cs), KVHAL_OK);
            kvhal_status st = kvhal_paged_caching(&p.kc, &p.vc, &p.k, &p.v, &p.s, 1.0f, 1.0f, cs);
            if (host_slots) {
                /* fails before writing anything; the message names the token and the slot */
                assert_int_equal(st, KVHAL_OUT_OF_RANGE);
                char tok[64], val[64];
                snprintf(tok, sizeof tok, "[%lld]", (long long)bad_token);
                snprintf(val, sizeof val, "%lld", (long long)cases[c].bad);
                if (!strstr(kvhal_last_error(), tok) || !strstr(kvhal_last_error(), val))
                    fail_msg("message does not name token %s and slot %s: %s", tok, val, kvhal_last_error());
                assert_int_equal(kvhal_device_synchronize(dev), KVHAL_OK);
            } else {
                /* the kernel skips the slot and raises the device flag, reported (once) by synchronize */
                if (st != KVHAL_OK) fail_msg("launch: %s (%s)", kvhal_status_name(st), kvhal_last_error());
                if (cs) {
                    assert_int_equal(kvhal_stream_check_errors(cs), KVHAL_DEVICE_FAULT);
                    if (!strstr(kvhal_last_error(), "slot"))
                        fail_msg("stream check does not name the slot fault: %s", kvhal_last_error());
                    assert_int_equal(kvhal_stream_check_errors(cs), KVHAL_OK);
                } else {
                    assert_int_equal(kvhal_device_synchronize(dev), KVHAL_DEVICE_FAULT);
                }
                assert_int_equal(kvhal_device_synchronize(dev), KVHAL_OK);
                ref_paged_caching(p.cache.mirror, &p.kc, p.cache.mirror, &p.vc, p.kin.mirror, &p.k, p.vin.mirror,
                                  &p.v, p.slots.mirror, &p.s, 1.0f, 1.0f);
            }
            if (cs) assert_int_equal(kvhal_stream_check_errors(cs), KVHAL_OK);
            assert_int_equal(kvhal_stream_destroy(cs), KVHAL_OK);
            pc_expect_all(&p, host_slots ? "out-of-range slot (cache untouched)" : "out-of-range slot (skipped)");
            pc_free(&p);
        }
    }
}

static void test_paged_edge_cases(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {7};
    pc_setup p;
    pc_build(&p, dev, KVHAL_F16, KVHAL_F16, KVHAL_I64, KVHAL_LAYOUT_NHD, FORM_DENSE, &r);
    pc_fill(&p, KVHAL_F16, 1.0f, 1.0f, &r, -1, 0);
    /* zero tokens: nothing happens */
    kvhal_tensor k0, v0, s0;
    OK(kvhal_tensor_narrow(&p.k, 0, 0, 0, &k0));
    OK(kvhal_tensor_narrow(&p.v, 0, 0, 0, &v0));
    OK(kvhal_tensor_narrow(&p.s, 0, 0, 0, &s0));
    OK(kvhal_paged_caching(&p.kc, &p.vc, &k0, &v0, &s0, 1.0f, 1.0f, NULL));
    OK(kvhal_device_synchronize(dev));
    pc_expect_all(&p, "zero tokens");
    /* all padding: nothing is written */
    for (int64_t t = 0; t < p.tokens; t++) store_slot(&p.slots, KVHAL_I64, t, -1 - t);
    dbuf_upload(&p.slots);
    OK(kvhal_paged_caching(&p.kc, &p.vc, &p.k, &p.v, &p.s, 1.0f, 1.0f, NULL));
    OK(kvhal_device_synchronize(dev));
    pc_expect_all(&p, "all padding");
    /* a cache shaped wrongly for the input is refused with the argument named */
    kvhal_tensor kbad;
    OK(kvhal_tensor_narrow(&p.k, 2, 0, DK - 1, &kbad));
    kvhal_clear_error();
    assert_int_equal(kvhal_paged_caching(&p.kc, &p.vc, &kbad, &p.v, &p.s, 1.0f, 1.0f, NULL), KVHAL_SHAPE_MISMATCH);
    assert_non_null(strstr(kvhal_last_error(), "k.shape[2]"));
    /* fp8 needs a positive finite scale */
    pc_setup q;
    pc_build(&q, dev, KVHAL_F32, KVHAL_FP8_E5M2, KVHAL_I32, KVHAL_LAYOUT_HND, FORM_DENSE, &r);
    assert_int_equal(kvhal_paged_caching(&q.kc, &q.vc, &q.k, &q.v, &q.s, 0.0f, 1.0f, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "k_scale"));
    assert_int_equal(kvhal_paged_caching(&q.kc, &q.vc, &q.k, &q.v, &q.s, 1.0f, NAN, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "v_scale"));
    /* a cache dtype that is neither the input's nor fp8 */
    kvhal_tensor kc32 = p.kc, vc32 = p.vc;
    kc32.dtype = vc32.dtype = KVHAL_F32;
    kc32.offset = vc32.offset = 0;
    kc32.shape[0] = vc32.shape[0] = 1;
    assert_int_equal(kvhal_paged_caching(&kc32, &vc32, &p.k, &p.v, &p.s, 1.0f, 1.0f, NULL), KVHAL_DTYPE_MISMATCH);
    pc_expect_all(&p, "refused calls");
    pc_free(&q);
    pc_free(&p);
    /* K of head dim 0 beside V of head dim 4: refused alike on every device, nothing written */
    dbuf kcb, vcb, vin, sl;
    dbuf_make(&kcb, dev, 16, &r);
    dbuf_make(&vcb, dev, 2 * 2 * 2 * 4 * 4, &r);
    dbuf_make(&vin, dev, 3 * 2 * 4 * 4, &r);
    dbuf_make(&sl, dev, 3 * 8, &r);
    int64_t kcs[4] = {2, 2, 2, 0}, vcs[4] = {2, 2, 2, 4}, ks[3] = {3, 2, 0}, vs[3] = {3, 2, 4}, ss[1] = {3};
    kvhal_tensor kc0 = tensor(&kcb, 0, KVHAL_F32, 4, kcs, NULL), vc4 = tensor(&vcb, 0, KVHAL_F32, 4, vcs, NULL);
    kvhal_tensor kin0 = tensor(&vin, 0, KVHAL_F32, 3, ks, NULL), vin4 = tensor(&vin, 0, KVHAL_F32, 3, vs, NULL);
    kvhal_tensor s3 = tensor(&sl, 0, KVHAL_I64, 1, ss, NULL);
    const int64_t slots3[3] = {3, -1, 0};
    for (int t = 0; t < 3; t++) store_slot(&sl, KVHAL_I64, t, slots3[t]);
    dbuf_upload(&sl);
    assert_int_equal(kvhal_paged_caching(&kc0, &vc4, &kin0, &vin4, &s3, 1.0f, 1.0f, NULL), KVHAL_UNSUPPORTED);
    assert_non_null(strstr(kvhal_last_error(), "k_cache.shape[3]"));
    OK(kvhal_device_synchronize(dev));
    dbuf_expect(&vcb, "v cache beside a k of head dim 0");
    dbuf_expect(&kcb, "k cache of head dim 0");
    dbuf_free(&kcb);
    dbuf_free(&vcb);
    dbuf_free(&vin);
    dbuf_free(&sl);
}

/* ---- copy_blocks ---- */

static void test_copy_blocks(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {31};
    dbuf a, b;
    dbuf_make(&a, dev, 4096, &r);
    dbuf_make(&b, dev, 1024, &r);
    /* three caches of different dtypes and block shapes, two sharing a buffer; one has padded blocks */
    kvhal_tensor c[3];
    int64_t s0[4] = {6, 4, 3, 8};                        /* f16, dense: 96 elements a block */
    int64_t s1[3] = {6, 5, 2}, st1[3] = {13, 2, 1};      /* f32, blocks 13 elements apart, 10 used */
    int64_t s2[2] = {9, 7};                              /* fp8 */
    c[0] = tensor(&a, 0, KVHAL_F16, 4, s0, NULL);
    c[1] = tensor(&a, 6 * 96 * 2 + 8, KVHAL_F32, 3, s1, st1);
    c[2] = tensor(&b, 3, KVHAL_FP8_E4M3, 2, s2, NULL);
    uint8_t *mirrors[3] = {a.mirror, a.mirror, b.mirror};
    /* No block is both a destination and another pair's source: devices copy the pairs in parallel. A source may
     * repeat, and a block may be copied onto itself. The second round reuses the descriptor with new pairs. */
    const int64_t rounds[2][8] = {{0, 3, 5, 1, 2, 2, 0, 4}, {1, 0, 3, 5, 4, 4, 1, 2}};
    int64_t pairs[8];
    for (int round = 0; round < 2; round++) {
        memcpy(pairs, rounds[round], sizeof pairs);
        OK(kvhal_copy_blocks(c, 3, pairs, 4, NULL));
        OK(kvhal_device_synchronize(dev));
        ref_copy_blocks(mirrors, c, 3, pairs, 4);
        dbuf_expect(&a, "copy_blocks buffer a");
        dbuf_expect(&b, "copy_blocks buffer b");
    }
    /* one cache, one pair; then none */
    OK(kvhal_copy_blocks(&c[2], 1, (int64_t[]){8, 7}, 1, NULL));
    ref_copy_blocks(&b.mirror, &c[2], 1, (int64_t[]){8, 7}, 1);
    OK(kvhal_copy_blocks(c, 3, pairs, 0, NULL));
    dbuf_expect(&b, "copy_blocks single pair");
    /* out of range for the smallest cache (6 blocks), even though cache 2 has 9 */
    kvhal_clear_error();
    assert_int_equal(kvhal_copy_blocks(c, 3, (int64_t[]){0, 6}, 1, NULL), KVHAL_OUT_OF_RANGE);
    assert_non_null(strstr(kvhal_last_error(), "pairs[1]"));
    /* a block that is not dense (an HND view permuted to NHD order) is refused */
    kvhal_tensor perm;
    OK(kvhal_tensor_permute(&c[0], (int32_t[]){0, 2, 1, 3}, &perm));
    assert_int_equal(kvhal_copy_blocks(&perm, 1, pairs, 1, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "caches[0]"));
    dbuf_expect(&a, "copy_blocks after refused calls");
    dbuf_free(&a);
    dbuf_free(&b);
}

/* ---- tensor_copy ---- */

static void test_tensor_copy(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {77};
    static const kvhal_dtype dts[9] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16, KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_I32,
                                       KVHAL_I64, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
    for (int d = 0; d < 9; d++) {
        const kvhal_dtype dt = dts[d];
        const size_t es = kvhal_dtype_size(dt);
        dbuf src, dst;
        dbuf_make(&src, dev, 4096 * es, &r);
        dbuf_make(&dst, dev, 4096 * es, &r);
        struct {
            int ndim;
            int64_t shape[6], ss[6], ds[6];
            size_t soff, doff;
        } cases[] = {
            {3, {5, 7, 3}, {21, 3, 1}, {21, 3, 1}, 0, 0},                                  /* dense */
            {3, {5, 7, 3}, {1, 5, 35}, {21, 3, 1}, 3, 1},                                  /* transposed source */
            {2, {9, 11}, {40, 2}, {12, 1}, 5, 7},                                          /* strided rows, narrow */
            {4, {2, 3, 4, 5}, {60, 20, 5, 1}, {120, 40, 10, 2}, 0, 1},                     /* strided dest */
            {6, {2, 1, 3, 2, 1, 4}, {48, 48, 16, 8, 4, 1}, {24, 24, 8, 4, 4, 1}, 100, 50}, /* 6-D, size-1 dims */
            {1, {1}, {1}, {1}, 17, 23},                                                    /* one element */
            {2, {3, 0}, {4, 1}, {4, 1}, 0, 0},                                             /* empty */
            {2, {16, 16}, {0, 1}, {16, 1}, 9, 0},                                          /* broadcast source */
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            kvhal_tensor s = tensor(&src, cases[c].soff * es, dt, cases[c].ndim, cases[c].shape, cases[c].ss);
            kvhal_tensor t = tensor(&dst, cases[c].doff * es, dt, cases[c].ndim, cases[c].shape, cases[c].ds);
            for (int rep = 0; rep < 2; rep++) {
                OK(kvhal_tensor_copy(&t, &s, NULL));
                OK(kvhal_device_synchronize(dev));
                ref_tensor_copy(dst.mirror, &t, src.mirror, &s);
                char what[128];
                snprintf(what, sizeof what, "tensor_copy %s case %zu", kvhal_dtype_name(dt), c);
                dbuf_expect(&dst, what);
                dbuf_expect(&src, what);
                /* change the source so the repeat (a descriptor hit) must copy new values */
                for (size_t i = 0; i < src.size; i++) src.mirror[i] = (uint8_t)ref_rand(&r);
                dbuf_upload(&src);
            }
        }
        /* mismatches are refused and write nothing */
        int64_t sh[2] = {4, 4}, sh2[2] = {4, 5};
        kvhal_tensor s = tensor(&src, 0, dt, 2, sh, NULL), t = tensor(&dst, 0, dt, 2, sh2, NULL);
        assert_int_equal(kvhal_tensor_copy(&t, &s, NULL), KVHAL_SHAPE_MISMATCH);
        kvhal_tensor t2 = tensor(&dst, 0, dt == KVHAL_F32 ? KVHAL_I32 : KVHAL_F32, 2, sh, NULL);
        assert_int_equal(kvhal_tensor_copy(&t2, &s, NULL), KVHAL_DTYPE_MISMATCH);
        dbuf_expect(&dst, "tensor_copy after refused calls");
        dbuf_free(&src);
        dbuf_free(&dst);
    }
}

/* ---- page_transfer ---- */

/* Waits for s (or the device, for the default stream) by polling kvhal_stream_query. */
static void wait_stream(kvhal_device dev, kvhal_stream *s)
{
    if (!s) {
        OK(kvhal_device_synchronize(dev));
        return;
    }
    kvhal_status st;
    for (long i = 0; (st = kvhal_stream_query(s)) == KVHAL_BUSY; i++)
        if (i > 100000000L) fail_msg("%s", "kvhal_stream_query: still busy after 1e8 polls");
    OK(st);
}

/* A device module outside this tree may leave page_transfer out (its slot NULL): the test is skipped for it then,
 * never for the built-in backends, which all implement it. */
static bool transfer_unsupported(kvhal_device dev, kvhal_status st)
{
    if (st != KVHAL_UNSUPPORTED || dev.type <= KVHAL_DEVICE_OPENCL) return false; /* cpu, cuda, hip, opencl */
    return true;
}

static void test_page_transfer(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {47};
    dbuf a, b;
    dbuf_make(&a, dev, 4096, &r);
    dbuf_make(&b, dev, 2048, &r);
    /* three caches of 192-byte blocks: dense f16, padded f32 blocks (50 elements apart), bf16 in another buffer */
    kvhal_tensor c[3];
    int64_t s0[4] = {6, 4, 3, 8};
    int64_t s1[2] = {7, 48}, st1[2] = {50, 1};
    int64_t s2[2] = {8, 96};
    c[0] = tensor(&a, 0, KVHAL_F16, 4, s0, NULL);
    c[1] = tensor(&a, 6 * 192 + 16, KVHAL_F32, 2, s1, st1);
    c[2] = tensor(&b, 6, KVHAL_BF16, 2, s2, NULL);
    uint8_t *mirrors[3] = {a.mirror, a.mirror, b.mirror};
    const size_t page = 3 * 192 + 40; /* host pages with a gap after the blocks */
    kvhal_host_memory *host;
    OK(kvhal_host_memory_create(dev, 10 * page, &host));
    uint8_t *hp = kvhal_host_memory_ptr(host), *hm = malloc(10 * page);
    assert_non_null(hm);
    for (size_t i = 0; i < 10 * page; i++) hm[i] = hp[i] = (uint8_t)ref_rand(&r);
    kvhal_stream *s = NULL;
    if (kvhal_stream_create(dev, &s) != KVHAL_OK) s = NULL; /* a device without streams: the default one */
    const int64_t out[6] = {0, 3, 5, 0, 2, 9}, in[6] = {1, 3, 4, 9, 3, 0};
    kvhal_status st = kvhal_page_transfer(c, 3, host, page, out, 3, KVHAL_TO_HOST, s);
    if (transfer_unsupported(dev, st)) {
        kvhal_stream_destroy(s);
        kvhal_host_memory_destroy(host);
        free(hm);
        dbuf_free(&a);
        dbuf_free(&b);
        conf_skip("the module leaves page_transfer out (optional)");
    }
    OK(st);
    wait_stream(dev, s);
    ref_page_transfer(mirrors, c, 3, hm, page, out, 3, true);
    assert_memory_equal(hp, hm, 10 * page);
    /* back to other blocks (page 3 holds block 0, page 9 block 2, page 0 block 5) */
    OK(kvhal_page_transfer(c, 3, host, page, in, 3, KVHAL_TO_DEVICE, s));
    wait_stream(dev, s);
    ref_page_transfer(mirrors, c, 3, hm, page, in, 3, false);
    dbuf_expect(&a, "page_transfer to device, buffer a");
    dbuf_expect(&b, "page_transfer to device, buffer b");
    /* refusals change nothing */
    kvhal_clear_error();
    assert_int_equal(kvhal_page_transfer(c, 3, host, page, (int64_t[]){0, 1, 2, 1}, 2, KVHAL_TO_HOST, s),
                     KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "pairs[3]"));
    assert_int_equal(kvhal_page_transfer(c, 3, host, page, (int64_t[]){6, 1}, 1, KVHAL_TO_HOST, s),
                     KVHAL_OUT_OF_RANGE);
    assert_non_null(strstr(kvhal_last_error(), "pairs[0]"));
    assert_int_equal(kvhal_page_transfer(c, 3, host, page, (int64_t[]){0, 10}, 1, KVHAL_TO_HOST, s),
                     KVHAL_OUT_OF_RANGE);
    assert_non_null(strstr(kvhal_last_error(), "host page"));
    assert_int_equal(kvhal_page_transfer(c, 3, host, 3 * 192 - 1, out, 1, KVHAL_TO_HOST, s),
                     KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "host_page_bytes"));
    kvhal_tensor c4[2] = {c[0], tensor(&b, 0, KVHAL_F32, 2, (int64_t[]){4, 40}, NULL)};
    assert_int_equal(kvhal_page_transfer(c4, 2, host, page, out, 1, KVHAL_TO_HOST, s), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "caches[1]"));
    assert_int_equal(kvhal_page_transfer(c, 3, NULL, page, out, 1, KVHAL_TO_HOST, s), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "host"));
    assert_int_equal(kvhal_page_transfer(c, 3, host, page, out, 1, (kvhal_transfer_dir)7, s),
                     KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "dir"));
    OK(kvhal_page_transfer(c, 3, host, page, out, 0, KVHAL_TO_HOST, s));
    wait_stream(dev, s);
    assert_memory_equal(hp, hm, 10 * page);
    dbuf_expect(&a, "page_transfer after refused calls");
    OK(kvhal_stream_destroy(s));
    OK(kvhal_host_memory_destroy(host));
    free(hm);
    dbuf_free(&a);
    dbuf_free(&b);
}

/* Pages of 192 KiB blocks on a stream of its own: what CUDA sends through cudaMemcpyBatchAsync (chunks of 256 KiB
 * and more on average after merging; its kernel serves smaller ones), with four caches interleaved block by block
 * (a page's four blocks are adjacent on the device as on the host, so they are merged into one 768 KiB chunk) and
 * two in another buffer, not adjacent (192 KiB chunks each: 1152 KiB in three chunks per page); pages
 * scattered on both sides, consecutive ones too; against the host reference, both directions. */
static void test_page_transfer_large(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {59};
    enum { LBB = 192 << 10, LNB = 6, NCACHE = 6 };
    dbuf a, b;
    dbuf_make(&a, dev, (size_t)4 * LNB * LBB, &r);
    dbuf_make(&b, dev, (size_t)2 * LNB * LBB + 256, &r);
    kvhal_tensor c[NCACHE];
    int64_t sh[2] = {LNB, LBB / 4}, inter[2] = {4 * LBB / 4, 1};
    for (int k = 0; k < 4; k++) c[k] = tensor(&a, (size_t)k * LBB, KVHAL_F32, 2, sh, inter);
    c[4] = tensor(&b, 0, KVHAL_F32, 2, sh, NULL);
    c[5] = tensor(&b, (size_t)LNB * LBB + 256, KVHAL_F32, 2, sh, NULL);
    uint8_t *mirrors[NCACHE] = {a.mirror, a.mirror, a.mirror, a.mirror, b.mirror, b.mirror};
    const size_t page = (size_t)NCACHE * LBB + 64;
    kvhal_host_memory *host;
    OK(kvhal_host_memory_create(dev, 8 * page, &host));
    uint8_t *hp = kvhal_host_memory_ptr(host), *hm = malloc(8 * page);
    assert_non_null(hm);
    for (size_t i = 0; i < 8 * page; i++) hm[i] = hp[i] = (uint8_t)ref_rand(&r);
    kvhal_stream *s = NULL;
    if (kvhal_stream_create(dev, &s) != KVHAL_OK) s = NULL;
    const int64_t out[10] = {4, 6, 1, 2, 2, 3, 5, 0, 0, 7}, in[8] = {3, 2, 4, 3, 0, 7, 1, 6};
    kvhal_status st = kvhal_page_transfer(c, NCACHE, host, page, out, 5, KVHAL_TO_HOST, s);
    if (transfer_unsupported(dev, st)) {
        if (s) kvhal_stream_destroy(s);
        kvhal_host_memory_destroy(host);
        free(hm);
        dbuf_free(&a);
        dbuf_free(&b);
        conf_skip("the module leaves page_transfer out (optional)");
    }
    OK(st);
    wait_stream(dev, s);
    ref_page_transfer(mirrors, c, NCACHE, hm, page, out, 5, true);
    assert_memory_equal(hp, hm, 8 * page);
    OK(kvhal_page_transfer(c, NCACHE, host, page, in, 4, KVHAL_TO_DEVICE, s));
    wait_stream(dev, s);
    ref_page_transfer(mirrors, c, NCACHE, hm, page, in, 4, false);
    dbuf_expect(&a, "page_transfer of 8 KiB blocks to device, buffer a");
    dbuf_expect(&b, "page_transfer of 8 KiB blocks to device, buffer b");
    if (s) OK(kvhal_stream_destroy(s));
    OK(kvhal_host_memory_destroy(host));
    free(hm);
    dbuf_free(&a);
    dbuf_free(&b);
}

/* The paged cache's transfer in both orders and layouts: a host page is [layers][K, V][block in the cache's
 * layout], checked element by element through the layer views; then loaded back into other blocks. */
static void test_paged_cache_transfer(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {53};
    for (int order = 0; order < 2; order++) {
        for (int layout = 0; layout < 2; layout++) {
            kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 3, .num_heads = 2, .head_dim = 8, .block_size = 4,
                                            .dtype = KVHAL_BF16, .layout = (kvhal_paged_layout)layout,
                                            .order = (kvhal_paged_order)order, .memory_budget = 3 * 2 * 8 * 2 * 4 * 2 * 8,
                                            .device = dev};
            kvhal_paged_cache *pc;
            OK(kvhal_paged_cache_create(&cfg, &pc));
            const int64_t nb = kvhal_paged_cache_num_blocks(pc);
            assert_int_equal(nb, 8);
            kvhal_tensor k0;
            OK(kvhal_paged_cache_layer(pc, 0, &k0, NULL));
            const size_t total = 3 * 2 * (size_t)nb * 64 * 2;
            uint8_t *m = malloc(total), *back = malloc(total);
            assert_non_null(m);
            assert_non_null(back);
            for (size_t i = 0; i < total; i++) m[i] = (uint8_t)ref_rand(&r);
            OK(kvhal_memcpy_h2d(k0.buffer, 0, m, total, NULL));
            const size_t page = kvhal_paged_cache_host_page_bytes(pc);
            assert_int_equal(page, 3 * 2 * 64 * 2);
            kvhal_host_memory *host;
            OK(kvhal_host_memory_create(dev, 4 * page, &host));
            const uint8_t *hp = kvhal_host_memory_ptr(host);
            const int64_t out[4] = {6, 2, 1, 0}, in[4] = {3, 2, 7, 0};
            kvhal_status st = kvhal_paged_cache_transfer(pc, host, out, 2, KVHAL_TO_HOST, NULL);
            if (transfer_unsupported(dev, st)) {
                kvhal_host_memory_destroy(host);
                kvhal_paged_cache_destroy(pc);
                free(m);
                free(back);
                conf_skip("the module leaves page_transfer out (optional)");
            }
            OK(st);
            OK(kvhal_device_synchronize(dev));
            for (int p = 0; p < 2; p++)
                for (int32_t l = 0; l < 3; l++) {
                    kvhal_tensor kv[2];
                    OK(kvhal_paged_cache_layer(pc, l, &kv[0], &kv[1]));
                    for (int side = 0; side < 2; side++) {
                        const kvhal_tensor *t = &kv[side];
                        const int64_t base = ref_elem_offset(t, (int64_t[]){out[2 * p], 0, 0, 0});
                        for (int64_t i = 0; i < 4 * 2 * 8; i++) {
                            /* element i of the block in memory order: its offset from the block's first */
                            const size_t hb = (size_t)out[2 * p + 1] * page + ((size_t)(2 * l + side) * 64 + (size_t)i) * 2;
                            const size_t db = (size_t)(base + i) * 2;
                            if (memcmp(hp + hb, m + db, 2))
                                fail_msg("order %d layout %d: page %d layer %d side %d element %lld differs", order,
                                         layout, p, (int)l, side, (long long)i);
                        }
                    }
                }
            OK(kvhal_paged_cache_transfer(pc, host, in, 2, KVHAL_TO_DEVICE, NULL));
            OK(kvhal_device_synchronize(dev));
            OK(kvhal_memcpy_d2h(back, k0.buffer, 0, total, NULL));
            /* expected: block 3 = old block 6, block 7 = old block 1, everything else unchanged */
            for (int32_t l = 0; l < 3; l++) {
                kvhal_tensor kv[2];
                OK(kvhal_paged_cache_layer(pc, l, &kv[0], &kv[1]));
                for (int side = 0; side < 2; side++) {
                    const size_t d3 = (size_t)ref_elem_offset(&kv[side], (int64_t[]){3, 0, 0, 0}) * 2;
                    const size_t d6 = (size_t)ref_elem_offset(&kv[side], (int64_t[]){6, 0, 0, 0}) * 2;
                    const size_t d7 = (size_t)ref_elem_offset(&kv[side], (int64_t[]){7, 0, 0, 0}) * 2;
                    const size_t d1 = (size_t)ref_elem_offset(&kv[side], (int64_t[]){1, 0, 0, 0}) * 2;
                    memcpy(m + d3, m + d6, 128);
                    memcpy(m + d7, m + d1, 128);
                }
            }
            assert_memory_equal(back, m, total);
            OK(kvhal_host_memory_destroy(host));
            OK(kvhal_paged_cache_destroy(pc));
            free(m);
            free(back);
        }
    }
}

/* n distinct random slots in [0, range), about a tenth of them padding (-1). */
static void fill_distinct_slots(ref_rng *r, int64_t *out, int64_t n, int64_t range)
{
    for (int64_t t = 0; t < n; t++) {
        int64_t v;
        bool dup;
        do {
            v = ref_rand_below(r, 10) == 0 ? -1 : (int64_t)ref_rand_below(r, (uint64_t)range);
            dup = false;
            for (int64_t u = 0; u < t && v >= 0; u++) dup |= out[u] == v;
        } while (dup);
        out[t] = v;
    }
}

/* Descriptors by shape class: token counts that change on every call ([tokens, heads, dim], then [batch, seq, heads,
 * dim] with the batch size changing) on one cache, each call checked against the reference, and the descriptors
 * this thread created for the device counted: one per class (flat; batched with seq 8; a batch of 1 is flat). */
static void run_shape_class_case(kvhal_device dev, kvhal_dtype in_dt, kvhal_dtype cache_dt, float ks, float vs)
{
    enum { SC_H = 4, SC_D = 64, SC_BS = 16, SC_NB = 64, SC_MAXT = 300, SC_SEQ = 8 };
    ref_rng r = {4242 + (uint64_t)cache_dt};
    const size_t ies = kvhal_dtype_size(in_dt), ces = kvhal_dtype_size(cache_dt);
    dbuf kc, vc, kin, vin, sl;
    dbuf_make(&kc, dev, (size_t)SC_NB * SC_BS * SC_H * SC_D * ces, &r);
    dbuf_make(&vc, dev, (size_t)SC_NB * SC_BS * SC_H * SC_D * ces, &r);
    dbuf_make(&kin, dev, (size_t)SC_MAXT * SC_H * SC_D * ies, &r);
    dbuf_make(&vin, dev, (size_t)SC_MAXT * SC_H * SC_D * ies, &r);
    dbuf_make(&sl, dev, (size_t)SC_MAXT * 4, &r);
    const int64_t cshape[4] = {SC_NB, SC_BS, SC_H, SC_D};
    const kvhal_tensor tkc = tensor(&kc, 0, cache_dt, 4, cshape, NULL), tvc = tensor(&vc, 0, cache_dt, 4, cshape, NULL);
    kvhal_op_kind op;
    OK(kvhal_desc_op_find("paged_caching", &op));
    kvhal_desc_cache_stats s0, s1;
    OK(kvhal_desc_cache_clear(dev));
    OK(kvhal_desc_cache_get_stats(dev, op, &s0));
    /* flat calls, then batched ones (batch 1 is a flat call of SC_SEQ tokens) */
    static const int64_t flat[] = {1, 2, 3, 7, 16, 31, 64, 100, 257, 300, 5, 1, 128};
    static const int64_t batches[] = {2, 3, 1, 5, 4, 2};
    const size_t nflat = sizeof flat / sizeof flat[0], nb = sizeof batches / sizeof batches[0];
    for (size_t c = 0; c < nflat + nb; c++) {
        const bool batched = c >= nflat;
        const int64_t n = batched ? batches[c - nflat] * SC_SEQ : flat[c];
        int64_t drawn[SC_MAXT];
        fill_distinct_slots(&r, drawn, n, SC_NB * SC_BS);
        int32_t *slots = (int32_t *)sl.mirror;
        for (int64_t t = 0; t < n; t++) slots[t] = (int32_t)drawn[t];
        dbuf_upload(&sl);
        kvhal_tensor tk, tv, ts;
        if (batched) {
            const int64_t b = n / SC_SEQ, ishape[4] = {b, SC_SEQ, SC_H, SC_D}, sshape[2] = {b, SC_SEQ};
            tk = tensor(&kin, 0, in_dt, 4, ishape, NULL);
            tv = tensor(&vin, 0, in_dt, 4, ishape, NULL);
            ts = tensor(&sl, 0, KVHAL_I32, 2, sshape, NULL);
        } else {
            const int64_t ishape[3] = {n, SC_H, SC_D}, sshape[1] = {n};
            tk = tensor(&kin, 0, in_dt, 3, ishape, NULL);
            tv = tensor(&vin, 0, in_dt, 3, ishape, NULL);
            ts = tensor(&sl, 0, KVHAL_I32, 1, sshape, NULL);
        }
        OK(kvhal_paged_caching(&tkc, &tvc, &tk, &tv, &ts, ks, vs, NULL));
        OK(kvhal_device_synchronize(dev));
        ref_paged_caching(kc.mirror, &tkc, vc.mirror, &tvc, kin.mirror, &tk, vin.mirror, &tv, sl.mirror, &ts, ks, vs);
        char what[128];
        snprintf(what, sizeof what, "shape class %s -> %s, %s call of %lld tokens: k cache", kvhal_dtype_name(in_dt),
                 kvhal_dtype_name(cache_dt), batched ? "batched" : "flat", (long long)n);
        dbuf_expect(&kc, what);
        snprintf(what, sizeof what, "shape class %s -> %s, %s call of %lld tokens: v cache", kvhal_dtype_name(in_dt),
                 kvhal_dtype_name(cache_dt), batched ? "batched" : "flat", (long long)n);
        dbuf_expect(&vc, what);
    }
    OK(kvhal_desc_cache_get_stats(dev, op, &s1));
    if (s1.inserts - s0.inserts != 2 || s1.misses - s0.misses != 2)
        fail_msg("%s -> %s: %llu descriptors created (%llu misses) for %zu calls of 2 shape classes",
                 kvhal_dtype_name(in_dt), kvhal_dtype_name(cache_dt), (unsigned long long)(s1.inserts - s0.inserts),
                 (unsigned long long)(s1.misses - s0.misses), nflat + nb);
    dbuf_free(&kc);
    dbuf_free(&vc);
    dbuf_free(&kin);
    dbuf_free(&vin);
    dbuf_free(&sl);
}

static void test_paged_shape_class(void **state)
{
    kvhal_device dev = device_of(state);
    run_shape_class_case(dev, KVHAL_BF16, KVHAL_BF16, 1.0f, 1.0f);
    run_shape_class_case(dev, KVHAL_F16, KVHAL_FP8_E4M3, 0.37f, 0.5f);
    run_shape_class_case(dev, KVHAL_F32, KVHAL_FP8_E5M2FNUZ, 0.0123f, 3.0f);
}

/* MLA caches: rows of 576 (512 latent + 64 rotary) written from two inputs (kv_c a view of a wider fused
 * projection, k_pe its own tensor) and K-only from one, into bf16, fp8 e4m3 (calibrated scale) and e5m2fnuz caches,
 * with token counts changing between calls; each call checked against a direct host loop. Then bad shapes. */
static void mla_expect_row(uint8_t *cm, kvhal_dtype cdt, int64_t slot, int64_t row, int64_t col0, const uint8_t *im,
                           kvhal_dtype idt, int64_t elem0, int64_t n, float scale)
{
    const size_t ces = kvhal_dtype_size(cdt), ies = kvhal_dtype_size(idt);
    for (int64_t d = 0; d < n; d++) {
        uint8_t *dst = cm + (size_t)(slot * row + col0 + d) * ces;
        if (cdt == idt) memcpy(dst, im + (size_t)(elem0 + d) * ies, ies);
        else *dst = ref_fp8_encode(ref_load(im, idt, elem0 + d) / scale, cdt);
    }
}

static void run_mla_case(kvhal_device dev, kvhal_dtype in_dt, kvhal_dtype cache_dt, float scale, bool k_only)
{
    enum { M_LAT = 512, M_PE = 64, M_ROW = 576, M_FUSED = 640, M_BS = 16, M_NB = 24, M_MAXT = 200 };
    ref_rng r = {99 + (uint64_t)cache_dt * 2 + k_only};
    const size_t ies = kvhal_dtype_size(in_dt), ces = kvhal_dtype_size(cache_dt);
    dbuf cache, fused, pe, sl;
    dbuf_make(&cache, dev, (size_t)M_NB * M_BS * M_ROW * ces, &r);
    dbuf_make(&fused, dev, (size_t)M_MAXT * M_FUSED * ies, &r); /* [T, 640]: kv_c is its first 512 columns */
    dbuf_make(&pe, dev, (size_t)M_MAXT * M_PE * ies, &r);
    dbuf_make(&sl, dev, (size_t)M_MAXT * 8, &r);
    const int64_t cshape[3] = {M_NB, M_BS, M_ROW};
    const kvhal_tensor tc = tensor(&cache, 0, cache_dt, 3, cshape, NULL);
    static const int64_t counts[] = {1, 7, 64, 200, 3};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        const int64_t n = counts[c];
        int64_t *slots = (int64_t *)sl.mirror;
        fill_distinct_slots(&r, slots, n, M_NB * M_BS);
        dbuf_upload(&sl);
        const int64_t sshape[1] = {n};
        const kvhal_tensor ts = tensor(&sl, 0, KVHAL_I64, 1, sshape, NULL);
        if (k_only) {
            const int64_t ish[2] = {n, M_ROW}, ist[2] = {M_FUSED, 1};
            const kvhal_tensor kv = tensor(&fused, 0, in_dt, 2, ish, ist);
            OK(kvhal_paged_caching_mla(&tc, &kv, NULL, &ts, scale, NULL));
            for (int64_t t = 0; t < n; t++)
                if (slots[t] >= 0)
                    mla_expect_row(cache.mirror, cache_dt, slots[t], M_ROW, 0, fused.mirror, in_dt, t * M_FUSED, M_ROW,
                                   scale);
        } else {
            const int64_t csh[2] = {n, M_LAT}, cst[2] = {M_FUSED, 1}, psh[3] = {n, 1, M_PE};
            const kvhal_tensor kvc = tensor(&fused, 0, in_dt, 2, csh, cst);
            const kvhal_tensor kpe = tensor(&pe, 0, in_dt, 3, psh, NULL);
            OK(kvhal_paged_caching_mla(&tc, &kvc, &kpe, &ts, scale, NULL));
            for (int64_t t = 0; t < n; t++) {
                if (slots[t] < 0) continue;
                mla_expect_row(cache.mirror, cache_dt, slots[t], M_ROW, 0, fused.mirror, in_dt, t * M_FUSED, M_LAT,
                               scale);
                mla_expect_row(cache.mirror, cache_dt, slots[t], M_ROW, M_LAT, pe.mirror, in_dt, t * M_PE, M_PE, scale);
            }
        }
        OK(kvhal_device_synchronize(dev));
        char what[128];
        snprintf(what, sizeof what, "mla %s %s -> %s, %lld tokens", k_only ? "K-only" : "two-part",
                 kvhal_dtype_name(in_dt), kvhal_dtype_name(cache_dt), (long long)n);
        dbuf_expect(&cache, what);
    }
    dbuf_free(&cache);
    dbuf_free(&fused);
    dbuf_free(&pe);
    dbuf_free(&sl);
}

static void test_paged_mla(void **state)
{
    kvhal_device dev = device_of(state);
    for (int k_only = 0; k_only < 2; k_only++) {
        run_mla_case(dev, KVHAL_BF16, KVHAL_BF16, 1.0f, k_only);
        run_mla_case(dev, KVHAL_BF16, KVHAL_FP8_E4M3, 0.37f, k_only);
        run_mla_case(dev, KVHAL_F16, KVHAL_FP8_E5M2FNUZ, 0.0123f, k_only);
    }
    /* bad input: more than one head, dims that do not add up, dtypes, a one-element K-only row */
    ref_rng r = {5};
    dbuf b;
    dbuf_make(&b, dev, 1 << 16, &r);
    const int64_t c3[3] = {4, 4, 64}, c4h2[4] = {4, 4, 2, 32}, in2[2] = {8, 48}, pe2[2] = {8, 16}, pe9[2] = {8, 17};
    const int64_t s1[1] = {8}, c1[3] = {4, 4, 1}, in1[2] = {8, 1};
    const kvhal_tensor cache = tensor(&b, 0, KVHAL_BF16, 3, c3, NULL), cache2 = tensor(&b, 0, KVHAL_BF16, 4, c4h2, NULL);
    const kvhal_tensor kvc = tensor(&b, 0, KVHAL_BF16, 2, in2, NULL), kpe = tensor(&b, 0, KVHAL_BF16, 2, pe2, NULL);
    const kvhal_tensor kpe9 = tensor(&b, 0, KVHAL_BF16, 2, pe9, NULL), kpe_f16 = tensor(&b, 0, KVHAL_F16, 2, pe2, NULL);
    const kvhal_tensor slots = tensor(&b, 0, KVHAL_I32, 1, s1, NULL);
    const kvhal_tensor cache1 = tensor(&b, 0, KVHAL_BF16, 3, c1, NULL), kv1 = tensor(&b, 0, KVHAL_BF16, 2, in1, NULL);
    assert_int_equal(kvhal_paged_caching_mla(&cache2, &kvc, &kpe, &slots, 1.0f, NULL), KVHAL_SHAPE_MISMATCH);
    assert_non_null(strstr(kvhal_last_error(), "kv_cache.shape[2]"));
    assert_int_equal(kvhal_paged_caching_mla(&cache, &kvc, &kpe9, &slots, 1.0f, NULL), KVHAL_SHAPE_MISMATCH);
    assert_non_null(strstr(kvhal_last_error(), "k_pe"));
    assert_int_equal(kvhal_paged_caching_mla(&cache, &kvc, NULL, &slots, 1.0f, NULL), KVHAL_SHAPE_MISMATCH);
    assert_non_null(strstr(kvhal_last_error(), "kv_c"));
    assert_int_equal(kvhal_paged_caching_mla(&cache, &kvc, &kpe_f16, &slots, 1.0f, NULL), KVHAL_DTYPE_MISMATCH);
    assert_non_null(strstr(kvhal_last_error(), "k_pe.dtype"));
    assert_int_equal(kvhal_paged_caching_mla(&cache1, &kv1, NULL, &slots, 1.0f, NULL), KVHAL_UNSUPPORTED);
    assert_int_equal(kvhal_paged_caching_mla(NULL, &kvc, &kpe, &slots, 1.0f, NULL), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "kv_cache"));
    dbuf_free(&b);
}

/* fp8 caches of rows whose head dims are multiples of 16 (the GPU backends' 16-element paths: OpenCL's PTX and
 * fnuz-through-OCP conversions, the CUDA/HIP vector kernels), every input float dtype into every fp8 format at
 * every scale mode, NHD and HND, with a quarter of the elements special: +-inf, NaNs of both signs, +-0, the input
 * dtype's largest finite value and smallest subnormal, and scale times values at and around the top of each fp8
 * format (its largest value, the ties above it, the saturation point of the OCP namesake of an fnuz format). */
static void test_paged_fp8_wide(void **state)
{
    enum { W_NB = 8, W_BS = 4, W_H = 2, W_DK = 64, W_DV = 32, W_T = 24 };
    kvhal_device dev = device_of(state);
    ref_rng r = {9183};
    static const kvhal_dtype ins[3] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16};
    static const kvhal_dtype outs[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
    static const float scales[5][2] = {{1.0f, 0.5f}, {0.37f, 3.0f}, {0.0123f, 2.0f}, {1e-30f, 3e30f}, {4.0f, 0.37f}};
    /* values around the top of the four formats (before the scale): 224, 240, 248, 256, 416, 432, 448, 464, 480,
     * 512 cover e4m3fnuz's top (240) and e4m3's (448) with the ties beside them; 26624 .. 65536 e5m2's and e5m2fnuz's */
    static const float tops[] = {224.0f, 232.0f, 240.0f, 248.0f, 256.0f, 416.0f, 432.0f, 448.0f, 464.0f, 480.0f,
                                 512.0f, 26624.0f, 28672.0f, 30720.0f, 49152.0f, 53248.0f, 57344.0f, 61440.0f,
                                 65536.0f, 0x1p-10f, 0x1p-11f, 0x3p-12f, 0x1p-17f, 0x1p-18f, 0x3p-19f};
    const int ntops = (int)(sizeof tops / sizeof tops[0]);
    int cases = 0;
    for (int i = 0; i < 3; i++) {
        const kvhal_dtype in_dt = ins[i];
        const size_t ies = kvhal_dtype_size(in_dt);
        for (int o = 0; o < 4; o++) {
            for (int layout = 0; layout < 2; layout++) {
                dbuf kc, vc, kin, vin, sl;
                dbuf_make(&kc, dev, (size_t)W_NB * W_BS * W_H * W_DK, &r);
                dbuf_make(&vc, dev, (size_t)W_NB * W_BS * W_H * W_DV, &r);
                dbuf_make(&kin, dev, (size_t)W_T * W_H * W_DK * ies, &r);
                dbuf_make(&vin, dev, (size_t)W_T * W_H * W_DV * ies, &r);
                dbuf_make(&sl, dev, (size_t)W_T * 8, &r);
                const int64_t kshape[4] = {W_NB, W_BS, W_H, W_DK}, vshape[4] = {W_NB, W_BS, W_H, W_DV};
                const int64_t khnd[4] = {W_H * W_BS * W_DK, W_DK, W_BS * W_DK, 1};
                const int64_t vhnd[4] = {W_H * W_BS * W_DV, W_DV, W_BS * W_DV, 1};
                const kvhal_tensor tkc = tensor(&kc, 0, outs[o], 4, kshape, layout ? khnd : NULL);
                const kvhal_tensor tvc = tensor(&vc, 0, outs[o], 4, vshape, layout ? vhnd : NULL);
                const int64_t ksh[3] = {W_T, W_H, W_DK}, vsh[3] = {W_T, W_H, W_DV}, ssh[1] = {W_T};
                const kvhal_tensor tk = tensor(&kin, 0, in_dt, 3, ksh, NULL), tv = tensor(&vin, 0, in_dt, 3, vsh, NULL);
                const kvhal_tensor ts = tensor(&sl, 0, KVHAL_I64, 1, ssh, NULL);
                int64_t drawn[W_T];
                fill_distinct_slots(&r, drawn, W_T, W_NB * W_BS);
                memcpy(sl.mirror, drawn, sizeof drawn);
                dbuf_upload(&sl);
                for (int sc = 0; sc < 5; sc++) {
                    const float ks = scales[sc][0], vs = scales[sc][1];
                    dbuf *bufs[2] = {&kin, &vin};
                    const float bs[2] = {ks, vs};
                    for (int b = 0; b < 2; b++) {
                        dbuf_fill_values(bufs[b], in_dt, &r, bs[b]);
                        for (size_t e = 0; e < bufs[b]->size / ies; e++) {
                            const uint64_t pick = ref_rand_below(&r, 16);
                            if (pick >= 4) continue;
                            uint8_t *p = bufs[b]->mirror + e * ies;
                            const uint32_t neg = (uint32_t)(ref_rand(&r) & 1);
                            uint32_t bits; /* in the input dtype */
                            if (pick == 0) { /* inf, NaN (quiet; an f32 signalling one too), zero */
                                static const uint32_t f32s[4] = {0x7f800000u, 0x7fc00000u, 0x7f800001u, 0u};
                                static const uint32_t f16s[4] = {0x7c00u, 0x7e00u, 0x7c01u, 0u};
                                static const uint32_t bf16s[4] = {0x7f80u, 0x7fc0u, 0x7f81u, 0u};
                                const int k = (int)ref_rand_below(&r, 4);
                                bits = in_dt == KVHAL_F32 ? f32s[k] : in_dt == KVHAL_F16 ? f16s[k] : bf16s[k];
                            } else if (pick == 1) { /* the dtype's largest finite value or smallest subnormal */
                                const bool big = ref_rand(&r) & 1;
                                bits = in_dt == KVHAL_F32 ? (big ? 0x7f7fffffu : 1u)
                                       : in_dt == KVHAL_F16 ? (big ? 0x7bffu : 1u)
                                                            : (big ? 0x7f7fu : 1u);
                            } else { /* near the top (or the bottom) of an fp8 format, times the scale */
                                const float x = tops[ref_rand_below(&r, (uint64_t)ntops)] * bs[b];
                                uint32_t u;
                                memcpy(&u, &x, 4);
                                bits = in_dt == KVHAL_F32 ? u : in_dt == KVHAL_F16 ? ref_f16_encode(x)
                                                                                   : ref_bf16_encode(x);
                                bits &= in_dt == KVHAL_F32 ? 0x7fffffffu : 0x7fffu;
                            }
                            bits |= neg << (8 * ies - 1);
                            memcpy(p, &bits, ies); /* little-endian hosts (kvhal's own check) */
                        }
                        dbuf_upload(bufs[b]);
                    }
                    char label[160];
                    snprintf(label, sizeof label, "fp8 wide rows in=%s cache=%s %s scales %g %g",
                             kvhal_dtype_name(in_dt), kvhal_dtype_name(outs[o]), layout ? "HND" : "NHD", (double)ks,
                             (double)vs);
                    OK(kvhal_paged_caching(&tkc, &tvc, &tk, &tv, &ts, ks, vs, NULL));
                    OK(kvhal_device_synchronize(dev));
                    ref_paged_caching(kc.mirror, &tkc, vc.mirror, &tvc, kin.mirror, &tk, vin.mirror, &tv, sl.mirror,
                                      &ts, ks, vs);
                    char what[200];
                    snprintf(what, sizeof what, "%s: k cache", label);
                    dbuf_expect(&kc, what);
                    snprintf(what, sizeof what, "%s: v cache", label);
                    dbuf_expect(&vc, what);
                    cases++;
                }
                dbuf_free(&kc);
                dbuf_free(&vc);
                dbuf_free(&kin);
                dbuf_free(&vin);
                dbuf_free(&sl);
            }
        }
    }
    conf_note("%d calls matched the reference", cases);
}

/* ---- events ---- */

/* Polls e until it completes (bounded), requiring only KVHAL_OK or KVHAL_BUSY on the way. */
static void poll_event(kvhal_event *e)
{
    kvhal_status st;
    for (long i = 0; (st = kvhal_event_query(e)) == KVHAL_BUSY; i++)
        if (i > 100000000L) fail_msg("%s", "kvhal_event_query: still busy after 1e8 polls");
    OK(st);
}

/* Events order work across two streams of one device: copies a -> b on s1 (eight times over, so that the GPU is
 * still at them when s2 is given its work), an event after them, s2 waits for it and copies b -> c; c must then
 * hold a's bytes. Recording again moves the event; bad handles and streams of another device are refused. On a
 * backend without events of its own (cpu) the event is complete once recorded. */
static void test_events(void **state)
{
    kvhal_device dev = device_of(state);
    ref_rng r = {71};
    const size_t size = 4u << 20;
    dbuf a, b, c;
    dbuf_make(&a, dev, size, &r);
    dbuf_make(&b, dev, size, &r);
    dbuf_make(&c, dev, size, &r);
    kvhal_event *e = NULL, *e2 = NULL;
    OK(kvhal_event_create(dev, &e));
    OK(kvhal_event_create(dev, &e2));
    const kvhal_device ed = kvhal_event_device(e);
    assert_int_equal(ed.type, dev.type);
    assert_int_equal(ed.id, dev.id);
    OK(kvhal_event_query(e)); /* never recorded: complete */
    OK(kvhal_event_synchronize(e));
    kvhal_stream *s1 = NULL, *s2 = NULL;
    const kvhal_status sst = kvhal_stream_create(dev, &s1);
    if (transfer_unsupported(dev, sst)) { /* a module of another tree without streams: events need them here */
        OK(kvhal_event_destroy(e2));
        OK(kvhal_event_destroy(e));
        dbuf_free(&a);
        dbuf_free(&b);
        dbuf_free(&c);
        conf_skip("the module has no streams, which these events need");
    }
    OK(sst);
    OK(kvhal_stream_create(dev, &s2));
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < 8; k++) OK(kvhal_memcpy_d2d(b.buf, 0, a.buf, 0, size, s1));
        OK(kvhal_event_record(e, s1));
        OK(kvhal_stream_wait_event(s2, e));
        OK(kvhal_memcpy_d2d(c.buf, 0, b.buf, 0, size, s2));
        OK(kvhal_event_record(e2, s2));
        poll_event(e2);
        OK(kvhal_event_query(e)); /* s2's copy ran after it */
        memcpy(b.mirror, a.mirror, size);
        memcpy(c.mirror, a.mirror, size);
        dbuf_expect(&c, "events: the copy behind the event");
        /* the next round copies new bytes */
        for (size_t i = 0; i < size; i += 8) a.mirror[i] = (uint8_t)ref_rand(&r);
        dbuf_upload(&a);
    }
    /* the default stream; a wait on it */
    OK(kvhal_memcpy_d2d(b.buf, 0, a.buf, 0, size, NULL));
    OK(kvhal_event_record(e, NULL));
    OK(kvhal_stream_wait_event(NULL, e));
    OK(kvhal_event_synchronize(e));
    OK(kvhal_event_query(e));
    memcpy(b.mirror, a.mirror, size);
    dbuf_expect(&b, "events: the default stream's copy");
    /* bad input */
    assert_int_equal(kvhal_event_create(dev, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_event_record(NULL, s1), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "e: NULL"));
    assert_int_equal(kvhal_event_query(NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_event_synchronize(NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_stream_wait_event(s1, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_event_query((kvhal_event *)(void *)s1), KVHAL_INVALID_HANDLE); /* a stream */
    assert_int_equal(kvhal_event_record(e, (kvhal_stream *)(void *)e2), KVHAL_INVALID_HANDLE); /* an event */
    if (dev.type != KVHAL_DEVICE_CPU) {
        kvhal_stream *cs = NULL;
        OK(kvhal_stream_create((kvhal_device){KVHAL_DEVICE_CPU, 0}, &cs));
        assert_int_equal(kvhal_event_record(e, cs), KVHAL_DEVICE_MISMATCH);
        assert_non_null(strstr(kvhal_last_error(), "s: stream is on cpu:0"));
        assert_int_equal(kvhal_stream_wait_event(cs, e), KVHAL_DEVICE_MISMATCH);
        OK(kvhal_stream_destroy(cs));
    }
    OK(kvhal_stream_destroy(s1));
    OK(kvhal_stream_destroy(s2));
    OK(kvhal_event_destroy(e2));
    OK(kvhal_event_destroy(e));
    assert_int_equal(kvhal_event_query(e), KVHAL_INVALID_HANDLE); /* destroyed (not read: not in the live set) */
    assert_int_equal(kvhal_event_destroy(e), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_event_device(e).id, -1);
    OK(kvhal_event_destroy(NULL));
    dbuf_free(&a);
    dbuf_free(&b);
    dbuf_free(&c);
}

const conf_check conf_host_checks[] = {
    {"conversions", "f16, bf16, fp8 conversions", test_conversions},
};
const size_t conf_num_host_checks = sizeof conf_host_checks / sizeof conf_host_checks[0];

const conf_check conf_device_checks[] = {
    {"paged_caching", "paged_caching", test_paged_caching},
    {"paged_signed_zeros", "paged_caching", test_paged_signed_zeros},
    {"paged_out_of_range", "paged_caching", test_paged_out_of_range},
    {"paged_edge_cases", "paged_caching", test_paged_edge_cases},
    {"copy_blocks", "copy_blocks", test_copy_blocks},
    {"tensor_copy", "tensor_copy", test_tensor_copy},
    {"paged_shape_class", "paged_caching", test_paged_shape_class},
    {"paged_fp8_wide", "paged_caching", test_paged_fp8_wide},
    {"paged_mla", "paged_caching (MLA)", test_paged_mla},
    {"page_transfer", "page_transfer", test_page_transfer},
    {"paged_cache_transfer", "page_transfer (paged cache)", test_paged_cache_transfer},
    {"page_transfer_large", "page_transfer", test_page_transfer_large},
    {"events", "events", test_events},
};
const size_t conf_num_device_checks = sizeof conf_device_checks / sizeof conf_device_checks[0];

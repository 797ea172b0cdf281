/* test_gpu_paths.c — the CUDA and HIP backends' own code paths on every GPU present, against the host reference:
 * the vectorized paged-caching kernels at model shapes (head_dim 128/64, NHD and HND, every dtype pair, power-of-two
 * and other fp8 scales) and their scalar fallback on misaligned bases, the unit sizes of tensor_copy, copy_blocks
 * calls queued back to back (the staging ring laps and must wait, never corrupt), copy_blocks with more pairs than
 * one launch's parameters carry and with more caches than they hold, the kernels named in the device info, the
 * batched copy behind
 * kv_cache_duplicate (more ranges than one launch takes), created streams, borrowed device pointers, and copies
 * between two GPUs. The conformance suite's small odd shapes mostly take the scalar paths; these take the fast ones.
 * Without a CUDA or HIP device every test reports itself skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "kvhal.h"
#include "reference.h"
#include "device_buffer.h"

typedef struct gpu_ctx {
    kvhal_device dev;
    kvhal_device peer; /* another device of the same type, or type COUNT */
    bool present;
} gpu_ctx;

static gpu_ctx *ctx_of(void **state)
{
    gpu_ctx *c = *state;
    if (!c->present) skip();
    return c;
}

/* Values of dt over bytes [off, off + n*es) of the mirror: one in eight an exact fp8 tie times scale, one in 64 a
 * special (NaN, infinities, values far beyond fp8's range, values below its smallest subnormal, -0), the rest
 * spread over 2^-16..2^16 times scale. NaNs are positive: the reference decodes inputs to float, which keeps no
 * NaN sign. */
static void fill_values(dbuf *b, size_t off, size_t n, kvhal_dtype dt, float scale, ref_rng *r)
{
    const size_t es = kvhal_dtype_size(dt);
    static const float specials[] = {NAN, INFINITY, -INFINITY, 1e30f, -1e30f, 60000.0f, -458.0f, 1e-12f, -3e-7f,
                                     -0.0f};
    for (size_t i = 0; i < n; i++) {
        float x;
        if (ref_rand_below(r, 64) == 0) {
            x = specials[ref_rand_below(r, sizeof specials / sizeof specials[0])];
            if (x == x && x != 0.0f && x > -1e29f && x < 1e29f) x *= scale;
        } else if (ref_rand_below(r, 8) == 0) {
            kvhal_dtype f = ref_rand(r) & 1 ? KVHAL_FP8_E4M3 : KVHAL_FP8_E5M2;
            uint8_t c = (uint8_t)ref_rand_below(r, f == KVHAL_FP8_E4M3 ? 0x7e : 0x7b);
            x = (float)((ref_fp8_decode(c, f) + ref_fp8_decode((uint8_t)(c + 1), f)) / 2 * scale);
            if (ref_rand(r) & 1) x = -x;
        } else {
            x = ref_rand_float(r, -16, 16) * scale;
        }
        uint8_t *p = b->mirror + off + i * es;
        if (dt == KVHAL_F32) {
            memcpy(p, &x, 4);
        } else {
            uint16_t h = dt == KVHAL_F16 ? ref_f16_encode(x) : ref_bf16_encode(x);
            memcpy(p, &h, 2);
        }
    }
    OK(kvhal_memcpy_h2d(b->buf, 0, b->mirror, b->size, NULL));
}

/* ---- paged caching at model shapes ---- */

#define PH 4    /* heads */
#define PDK 128 /* K head dim */
#define PDV 64  /* V head dim */
#define PBS 16  /* block size */
#define PNB 40  /* blocks */
#define PT 300  /* tokens: not a multiple of any tokens-per-block choice */

static void paged_case(kvhal_device dev, kvhal_dtype in, kvhal_dtype cache, kvhal_dtype slot_dt, int hnd,
                       int misalign, int batch_form, kvhal_stream *s, ref_rng *r)
{
    char label[160];
    snprintf(label, sizeof label, "paged in=%s cache=%s slots=%s %s%s%s", kvhal_dtype_name(in),
             kvhal_dtype_name(cache), kvhal_dtype_name(slot_dt), hnd ? "HND" : "NHD", misalign ? " misaligned" : "",
             batch_form ? " [B,S]" : "");
    const size_t ces = kvhal_dtype_size(cache), ies = kvhal_dtype_size(in), ses = kvhal_dtype_size(slot_dt);
    const int64_t kel = (int64_t)PNB * PBS * PH * PDK, vel = (int64_t)PNB * PBS * PH * PDV;
    const size_t mis_c = misalign ? ces : 0, mis_i = misalign ? ies : 0;
    dbuf cb, kb, vb, sb;
    dbuf_make(&cb, dev, (size_t)(kel + vel) * ces + 256, r);
    dbuf_make(&kb, dev, (size_t)PT * PH * PDK * ies + 64, r);
    dbuf_make(&vb, dev, (size_t)PT * PH * PDV * ies + 64, r);
    dbuf_make(&sb, dev, (size_t)PT * ses, r);
    int64_t ksh[4] = {PNB, PBS, PH, PDK}, vsh[4] = {PNB, PBS, PH, PDV};
    int64_t kst[4], vst[4];
    if (!hnd) {
        int64_t a[4] = {PBS * PH * PDK, PH * PDK, PDK, 1}, b[4] = {PBS * PH * PDV, PH * PDV, PDV, 1};
        memcpy(kst, a, sizeof a), memcpy(vst, b, sizeof b);
    } else {
        int64_t a[4] = {PH * PBS * PDK, PDK, PBS * PDK, 1}, b[4] = {PH * PBS * PDV, PDV, PBS * PDV, 1};
        memcpy(kst, a, sizeof a), memcpy(vst, b, sizeof b);
    }
    const size_t voff = 128 + (size_t)kel * ces;
    kvhal_tensor kc = tensor(&cb, mis_c, cache, 4, ksh, kst), vc = tensor(&cb, voff + mis_c, cache, 4, vsh, vst);
    kvhal_tensor k, v, sl;
    if (batch_form) {
        int64_t a[4] = {3, PT / 3, PH, PDK}, b[4] = {3, PT / 3, PH, PDV}, ss[2] = {3, PT / 3};
        k = tensor(&kb, mis_i, in, 4, a, NULL);
        v = tensor(&vb, mis_i, in, 4, b, NULL);
        sl = tensor(&sb, 0, slot_dt, 2, ss, NULL);
    } else {
        int64_t a[3] = {PT, PH, PDK}, b[3] = {PT, PH, PDV}, ss[1] = {PT};
        k = tensor(&kb, mis_i, in, 3, a, NULL);
        v = tensor(&vb, mis_i, in, 3, b, NULL);
        sl = tensor(&sb, 0, slot_dt, 1, ss, NULL);
    }
    const bool fp8 = cache == KVHAL_FP8_E4M3 || cache == KVHAL_FP8_E5M2;
    for (int rep = 0; rep < 2; rep++) {
        /* rep 0: power-of-two scales (multiply path); rep 1: others (divide path) */
        const float ks = fp8 ? (rep ? 0.37f : 0.5f) : 1.0f, vs = fp8 ? (rep ? 3.0f : 2.0f) : 1.0f;
        fill_values(&kb, mis_i, (size_t)PT * PH * PDK, in, ks, r);
        fill_values(&vb, mis_i, (size_t)PT * PH * PDV, in, vs, r);
        int64_t perm[PNB * PBS];
        for (int i = 0; i < PNB * PBS; i++) perm[i] = i;
        for (int i = PNB * PBS - 1; i > 0; i--) {
            int j = (int)ref_rand_below(r, (uint64_t)i + 1);
            int64_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int t = 0; t < PT; t++) {
            int64_t v64 = t % 8 == 5 ? -1 : perm[t];
            if (slot_dt == KVHAL_I32) {
                int32_t v32 = (int32_t)v64;
                memcpy(sb.mirror + (size_t)t * 4, &v32, 4);
            } else {
                memcpy(sb.mirror + (size_t)t * 8, &v64, 8);
            }
        }
        OK(kvhal_memcpy_h2d(sb.buf, 0, sb.mirror, sb.size, NULL));
        kvhal_status st = kvhal_paged_caching(&kc, &vc, &k, &v, &sl, ks, vs, s);
        if (st != KVHAL_OK) fail_msg("%s: %s (%s)", label, kvhal_status_name(st), kvhal_last_error());
        if (s) OK(kvhal_stream_synchronize(s));
        st = kvhal_device_synchronize(dev);
        if (st != KVHAL_OK) fail_msg("%s: synchronize: %s (%s)", label, kvhal_status_name(st), kvhal_last_error());
        ref_paged_caching(cb.mirror, &kc, cb.mirror, &vc, kb.mirror, &k, vb.mirror, &v, sb.mirror, &sl, ks, vs);
        dbuf_expect(&cb, label);
    }
    dbuf_free(&cb);
    dbuf_free(&kb);
    dbuf_free(&vb);
    dbuf_free(&sb);
}

static void test_paged_fast_paths(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {2024};
    static const kvhal_dtype ins[3] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const kvhal_dtype outs[3] = {ins[i], KVHAL_FP8_E4M3, KVHAL_FP8_E5M2};
        for (int o = 0; o < 3; o++)
            for (int hnd = 0; hnd < 2; hnd++)
                for (int mis = 0; mis < 2; mis++, n++)
                    paged_case(c->dev, ins[i], outs[o], (n % 2) ? KVHAL_I32 : KVHAL_I64, hnd, mis, n % 3 == 0, NULL,
                               &r);
    }
    printf("[ info     ] %d paged caching cases matched the reference\n", n);
}

/* The same kernels on a created stream. */
static void test_paged_on_stream(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {5};
    kvhal_stream *s;
    OK(kvhal_stream_create(c->dev, &s));
    paged_case(c->dev, KVHAL_BF16, KVHAL_BF16, KVHAL_I64, 0, 0, 0, s, &r);
    paged_case(c->dev, KVHAL_F16, KVHAL_FP8_E4M3, KVHAL_I32, 1, 0, 1, s, &r);
    OK(kvhal_stream_destroy(s));
}

/* ---- tensor_copy unit sizes ---- */

static void test_tensor_copy_units(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {11};
    struct {
        kvhal_dtype dt;
        int nd;
        int64_t shape[4], ss[4], ds[4];
        size_t soff, doff; /* elements */
    } cases[] = {
        /* a static-cache window [B, H, S, D] out of [B, H, 256, D]: 16-byte units */
        {KVHAL_F16, 4, {2, 8, 64, 128}, {8 * 256 * 128, 256 * 128, 128, 1}, {8 * 64 * 128, 64 * 128, 128, 1}, 128, 0},
        /* rows of 6 f32 (24 bytes): 8-byte units */
        {KVHAL_F32, 3, {5, 7, 6}, {7 * 8, 8, 1}, {7 * 6, 6, 1}, 2, 0},
        /* rows of 6 bf16 (12 bytes): 4-byte units */
        {KVHAL_BF16, 2, {33, 6}, {10, 1}, {6, 1}, 2, 4},
        /* rows of 3 f16: elements */
        {KVHAL_F16, 2, {40, 3}, {5, 1}, {3, 1}, 1, 0},
        /* fp8 rows of 48 bytes, 64 apart: 16-byte units */
        {KVHAL_FP8_E5M2, 2, {33, 48}, {64, 1}, {48, 1}, 0, 16},
        /* i64 transpose: elements, outer dims permuted */
        {KVHAL_I64, 2, {37, 29}, {1, 37}, {29, 1}, 0, 0},
        /* large contiguous: one memcpy */
        {KVHAL_BF16, 2, {512, 1024}, {1024, 1}, {1024, 1}, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const size_t es = kvhal_dtype_size(cases[i].dt);
        int64_t sspan = 1, dspan = 1;
        for (int d = 0; d < cases[i].nd; d++) {
            sspan += (cases[i].shape[d] - 1) * cases[i].ss[d];
            dspan += (cases[i].shape[d] - 1) * cases[i].ds[d];
        }
        dbuf src, dst;
        dbuf_make(&src, c->dev, ((size_t)sspan + cases[i].soff) * es + 64, &r);
        dbuf_make(&dst, c->dev, ((size_t)dspan + cases[i].doff) * es + 64, &r);
        kvhal_tensor s = tensor(&src, cases[i].soff * es, cases[i].dt, cases[i].nd, cases[i].shape, cases[i].ss);
        kvhal_tensor t = tensor(&dst, cases[i].doff * es, cases[i].dt, cases[i].nd, cases[i].shape, cases[i].ds);
        OK(kvhal_tensor_copy(&t, &s, NULL));
        OK(kvhal_device_synchronize(c->dev));
        ref_tensor_copy(dst.mirror, &t, src.mirror, &s);
        char what[64];
        snprintf(what, sizeof what, "tensor_copy case %zu", i);
        dbuf_expect(&dst, what);
        dbuf_free(&src);
        dbuf_free(&dst);
    }
}

/* ---- copy_blocks: many caches, calls queued back to back ---- */

static void test_copy_blocks_ring(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {3};
    enum { CACHES = 64, BLOCKS = 20, BLOCK_ELEMS = 16 * 4 * 64, ROUNDS = 10, PAIRS = 6 };
    const size_t block_bytes = BLOCK_ELEMS * 2, cache_bytes = (size_t)BLOCKS * block_bytes;
    dbuf b;
    dbuf_make(&b, c->dev, CACHES * cache_bytes, &r);
    kvhal_tensor caches[CACHES];
    uint8_t *mirrors[CACHES];
    for (int i = 0; i < CACHES; i++) {
        int64_t sh[4] = {BLOCKS, 16, 4, 64};
        caches[i] = tensor(&b, (size_t)i * cache_bytes, KVHAL_BF16, 4, sh, NULL);
        mirrors[i] = b.mirror;
    }
    int64_t all[ROUNDS][2 * PAIRS];
    for (int round = 0; round < ROUNDS; round++) {
        /* distinct sources from blocks 0..9, distinct destinations from 10..19: no block is both in one call, and
         * no block is written twice by one call (the pairs of a call run in parallel) */
        int64_t perm[10];
        for (int i = 0; i < 10; i++) perm[i] = i;
        for (int i = 9; i > 0; i--) {
            int j = (int)ref_rand_below(&r, (uint64_t)i + 1);
            int64_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int p = 0; p < PAIRS; p++) {
            all[round][2 * p] = perm[p];
            all[round][2 * p + 1] = 10 + (int64_t)((round + p * 3) % 10);
        }
        /* later rounds read what earlier ones wrote: swap halves every other round */
        if (round % 2)
            for (int p = 0; p < PAIRS; p++) {
                int64_t t = all[round][2 * p];
                all[round][2 * p] = all[round][2 * p + 1];
                all[round][2 * p + 1] = t;
            }
        OK(kvhal_copy_blocks(caches, CACHES, all[round], PAIRS, NULL));
    }
    OK(kvhal_device_synchronize(c->dev));
    for (int round = 0; round < ROUNDS; round++) ref_copy_blocks(mirrors, caches, CACHES, all[round], PAIRS);
    dbuf_expect(&b, "copy_blocks over 10 queued calls");
    dbuf_free(&b);
}

/* ---- copy_blocks: more pairs than one launch's parameters carry (launched once per group),
 * blocks of several 16 KiB work items, a block of odd size, and more caches than the parameters hold (staged) ---- */

static void test_copy_blocks_many_pairs(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {5};
    enum { BLOCKS = 700, PAIRS = 340 };
    /* cache 0: 40 KiB blocks (3 work items, the last partial); cache 1: 6-byte blocks (2-byte units); cache 2: 2 KiB
     * blocks at a base only 2-byte aligned */
    const size_t b0 = 40 * 1024, b1 = 6, b2 = 2048;
    dbuf b;
    dbuf_make(&b, c->dev, BLOCKS * (b0 + b1 + b2) + 64, &r);
    int64_t s0[2] = {BLOCKS, (int64_t)b0 / 2}, s1[2] = {BLOCKS, 3}, s2[3] = {BLOCKS, 16, 64};
    kvhal_tensor caches[3] = {tensor(&b, 0, KVHAL_BF16, 2, s0, NULL),
                              tensor(&b, BLOCKS * b0, KVHAL_F16, 2, s1, NULL),
                              tensor(&b, BLOCKS * (b0 + b1) + 2, KVHAL_F16, 3, s2, NULL)};
    uint8_t *mirrors[3] = {b.mirror, b.mirror, b.mirror};
    /* sources a permutation of blocks 0..339, destinations 350..689 shuffled: no block is both, none written twice */
    int64_t src[PAIRS], dst[PAIRS], pairs[2 * PAIRS];
    for (int i = 0; i < PAIRS; i++) src[i] = i, dst[i] = 350 + i;
    for (int i = PAIRS - 1; i > 0; i--) {
        int j = (int)ref_rand_below(&r, (uint64_t)i + 1), k = (int)ref_rand_below(&r, (uint64_t)i + 1);
        int64_t t = src[i];
        src[i] = src[j], src[j] = t;
        t = dst[i], dst[i] = dst[k], dst[k] = t;
    }
    for (int i = 0; i < PAIRS; i++) pairs[2 * i] = src[i], pairs[2 * i + 1] = dst[i];
    OK(kvhal_copy_blocks(caches, 3, pairs, PAIRS, NULL));
    OK(kvhal_device_synchronize(c->dev));
    ref_copy_blocks(mirrors, caches, 3, pairs, PAIRS);
    dbuf_expect(&b, "copy_blocks of 340 pairs");
    /* one out-of-range pair in the last group: the whole call is refused before any launch */
    pairs[2 * (PAIRS - 1) + 1] = BLOCKS;
    kvhal_clear_error();
    assert_int_equal(kvhal_copy_blocks(caches, 3, pairs, PAIRS, NULL), KVHAL_OUT_OF_RANGE);
    dbuf_expect(&b, "copy_blocks refused before any copy");
    dbuf_free(&b);
}

static void test_copy_blocks_many_caches(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {6};
    enum { CACHES = 160, BLOCKS = 8, PAIRS = 3 };
    const size_t block_bytes = 4 * 32 * 2;
    dbuf b;
    dbuf_make(&b, c->dev, CACHES * BLOCKS * block_bytes, &r);
    kvhal_tensor caches[CACHES];
    uint8_t *mirrors[CACHES];
    for (int i = 0; i < CACHES; i++) {
        int64_t sh[3] = {BLOCKS, 4, 32};
        caches[i] = tensor(&b, (size_t)i * BLOCKS * block_bytes, KVHAL_BF16, 3, sh, NULL);
        mirrors[i] = b.mirror;
    }
    int64_t pairs[2 * PAIRS] = {0, 5, 1, 6, 2, 7};
    OK(kvhal_copy_blocks(caches, CACHES, pairs, PAIRS, NULL));
    OK(kvhal_device_synchronize(c->dev));
    ref_copy_blocks(mirrors, caches, CACHES, pairs, PAIRS);
    dbuf_expect(&b, "copy_blocks over 160 caches");
    dbuf_free(&b);
}

/* ---- the device info names the kernels the module runs (benchmarks print it) ---- */

static void test_kernels_in_info(void **state)
{
    gpu_ctx *c = ctx_of(state);
    kvhal_device_info info;
    OK(kvhal_device_get_info(c->dev, &info));
    if (!strstr(info.platform, "; kernels: rows")) fail_msg("device info '%s' lacks '; kernels: rows'", info.platform);
}

/* ---- kv_cache_duplicate: the batched copy, more ranges than one launch carries ---- */

static void test_duplicate_batches(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {8};
    kvhal_kv_cache_config cfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = 70, .num_kv_heads = 2, .head_dim_k = 64, .head_dim_v = 40,
                                 .max_len = 50, .dtype = KVHAL_F16, .num_devices = 1, .devices = &c->dev};
    kvhal_kv_cache *src, *dup;
    OK(kvhal_kv_cache_create(&cfg, &src));
    /* fill every layer's K and V with random bytes through their views */
    uint8_t *expect_k[70], *expect_v[70];
    const size_t kbytes = 50 * 2 * 64 * 2, vbytes = 50 * 2 * 40 * 2;
    for (int l = 0; l < 70; l++) {
        kvhal_tensor k, v;
        OK(kvhal_kv_cache_layer(src, 0, l, &k, &v));
        expect_k[l] = malloc(kbytes);
        expect_v[l] = malloc(vbytes);
        assert_true(expect_k[l] && expect_v[l]);
        for (size_t i = 0; i < kbytes; i++) expect_k[l][i] = (uint8_t)ref_rand(&r);
        for (size_t i = 0; i < vbytes; i++) expect_v[l][i] = (uint8_t)ref_rand(&r);
        OK(kvhal_memcpy_h2d(k.buffer, k.offset, expect_k[l], kbytes, NULL));
        OK(kvhal_memcpy_h2d(v.buffer, v.offset, expect_v[l], vbytes, NULL));
    }
    const int64_t seq = 37;
    OK(kvhal_kv_cache_duplicate(src, seq, &dup));
    OK(kvhal_device_synchronize(c->dev));
    uint8_t *got = malloc(kbytes);
    assert_non_null(got);
    for (int l = 0; l < 70; l++) {
        kvhal_tensor k, v;
        OK(kvhal_kv_cache_layer(dup, 0, l, &k, &v));
        const size_t kn = (size_t)seq * 2 * 64 * 2, vn = (size_t)seq * 2 * 40 * 2;
        OK(kvhal_memcpy_d2h(got, k.buffer, k.offset, kn, NULL));
        if (memcmp(got, expect_k[l], kn)) fail_msg("duplicate: layer %d K differs", l);
        OK(kvhal_memcpy_d2h(got, v.buffer, v.offset, vn, NULL));
        if (memcmp(got, expect_v[l], vn)) fail_msg("duplicate: layer %d V differs", l);
        free(expect_k[l]);
        free(expect_v[l]);
    }
    free(got);
    OK(kvhal_kv_cache_destroy(dup));
    OK(kvhal_kv_cache_destroy(src));
}

/* ---- borrowed pointers, memset, device info ---- */

static void test_wrap_and_memset(void **state)
{
    gpu_ctx *c = ctx_of(state);
    ref_rng r = {21};
    dbuf b;
    dbuf_make(&b, c->dev, 4096, &r);
    /* a device pointer into the middle of another allocation can be borrowed */
    kvhal_buffer *w;
    OK(kvhal_buffer_wrap(c->dev, (uint8_t *)kvhal_buffer_native(b.buf) + 1024, 1024, &w));
    OK(kvhal_memset(w, 10, 0xab, 100, NULL));
    memset(b.mirror + 1034, 0xab, 100);
    OK(kvhal_buffer_destroy(w));
    OK(kvhal_device_synchronize(c->dev));
    dbuf_expect(&b, "memset through a borrowed pointer");
    /* host memory is not device memory */
    uint8_t host[64];
    kvhal_clear_error();
    kvhal_buffer *bad = NULL;
    assert_int_equal(kvhal_buffer_wrap(c->dev, host, sizeof host, &bad), KVHAL_INVALID_ARGUMENT);
    assert_null(bad);
    assert_non_null(strstr(kvhal_last_error(), "native"));
    kvhal_device_info info;
    OK(kvhal_device_get_info(c->dev, &info));
    assert_true(info.total_memory > 0);
    assert_true(info.free_memory > 0 && info.free_memory <= info.total_memory);
    assert_true(info.compute_units > 0);
    assert_true(info.name[0] != '\0');
    dbuf_free(&b);
}

/* ---- two GPUs: peer copies, both directions, default stream and a created one ---- */

static void test_peer_copy(void **state)
{
    gpu_ctx *c = ctx_of(state);
    if (c->peer.type == (kvhal_device_type)KVHAL_MAX_DEVICE_TYPES) skip();
    ref_rng r = {77};
    dbuf a, b;
    const size_t n = (size_t)3 << 20;
    dbuf_make(&a, c->dev, n, &r);
    dbuf_make(&b, c->peer, n, &r);
    OK(kvhal_memcpy_d2d(b.buf, 100, a.buf, 7, n / 2, NULL));
    memcpy(b.mirror + 100, a.mirror + 7, n / 2);
    OK(kvhal_memcpy_d2d(a.buf, 0, b.buf, n / 2, n / 4, NULL));
    memcpy(a.mirror, b.mirror + n / 2, n / 4);
    kvhal_stream *s;
    OK(kvhal_stream_create(c->peer, &s));
    OK(kvhal_memcpy_d2d(a.buf, n / 2, b.buf, 0, 4096, s));
    memcpy(a.mirror + n / 2, b.mirror, 4096);
    OK(kvhal_stream_synchronize(s));
    OK(kvhal_stream_destroy(s));
    OK(kvhal_device_synchronize(c->dev));
    OK(kvhal_device_synchronize(c->peer));
    dbuf_expect(&a, "peer copies into the first device");
    dbuf_expect(&b, "peer copies into the second device");
    dbuf_free(&a);
    dbuf_free(&b);
}

typedef struct test_fn {
    const char *name;
    CMUnitTestFunction fn;
} test_fn;

static const test_fn gpu_tests[] = {
    {"paged_fast_paths", test_paged_fast_paths}, {"paged_on_stream", test_paged_on_stream},
    {"tensor_copy_units", test_tensor_copy_units}, {"copy_blocks_ring", test_copy_blocks_ring},
    {"duplicate_batches", test_duplicate_batches}, {"wrap_and_memset", test_wrap_and_memset},
    {"peer_copy", test_peer_copy}, {"copy_blocks_many_pairs", test_copy_blocks_many_pairs},
    {"copy_blocks_many_caches", test_copy_blocks_many_caches}, {"kernels_in_info", test_kernels_in_info},
};
#define NUM_GPU_TESTS (sizeof gpu_tests / sizeof gpu_tests[0])

int main(void)
{
    static const kvhal_device_type types[2] = {KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    static gpu_ctx ctx[2 * KVHAL_MAX_DEVICES_PER_TYPE];
    static struct CMUnitTest tests[2 * KVHAL_MAX_DEVICES_PER_TYPE * NUM_GPU_TESTS];
    static char names[2 * KVHAL_MAX_DEVICES_PER_TYPE * NUM_GPU_TESTS][96];
    size_t n = 0, nc = 0;
    for (int ti = 0; ti < 2; ti++) {
        int32_t count = 0;
        if (kvhal_device_count(types[ti], &count) != KVHAL_OK) count = 0;
        const char *tn = kvhal_device_type_name(types[ti]);
        const int32_t shown = count > 0 ? count : 1;
        for (int32_t id = 0; id < shown && id < KVHAL_MAX_DEVICES_PER_TYPE; id++) {
            gpu_ctx *c = &ctx[nc++];
            c->dev = (kvhal_device){types[ti], id};
            c->present = count > 0;
            c->peer = count > 1 ? (kvhal_device){types[ti], (id + 1) % count}
                                : (kvhal_device){(kvhal_device_type)KVHAL_MAX_DEVICE_TYPES, -1};
            for (size_t f = 0; f < NUM_GPU_TESTS; f++) {
                if (count > 0) snprintf(names[n], sizeof names[n], "%s:%d: %s", tn, (int)id, gpu_tests[f].name);
                else snprintf(names[n], sizeof names[n], "%s: %s (no %s device)", tn, gpu_tests[f].name, tn);
                tests[n] = (struct CMUnitTest){names[n], gpu_tests[f].fn, NULL, NULL, c};
                n++;
            }
        }
    }
    return _cmocka_run_group_tests("gpu_paths", tests, n, NULL, NULL);
}

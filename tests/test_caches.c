/* test_caches.c — the three caches on every device present, against the host reference: the contiguous kv cache
 * (layer views, duplicate of a prefix, multi-device splitting on every device type with two or more devices, and
 * the heads % devices error), the static cache (update windows, history views, bounds that write nothing), and the
 * paged cache (block count from the budget, NHD/HND x layer-first/page-first views that tile the buffer exactly,
 * update through the paged-caching op, copy_blocks over every layer). Device types without (enough) devices report
 * their tests as skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"
#include "reference.h"

#define OK(expr)                                                                                                \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());       \
    } while (0)

typedef struct dev_ctx {
    kvhal_device_type type;
    int32_t count;
} dev_ctx;

static kvhal_device first_device(void **state)
{
    dev_ctx *c = *state;
    if (c->count < 1) skip();
    return (kvhal_device){c->type, 0};
}

/* ---- host copies of device memory ---- */

static uint8_t *read_all(const kvhal_buffer *b)
{
    size_t n = kvhal_buffer_size(b);
    uint8_t *p = malloc(n);
    assert_non_null(p);
    OK(kvhal_memcpy_d2h(p, b, 0, n, NULL));
    return p;
}

static void expect_buffer(const kvhal_buffer *b, const uint8_t *want, const char *what)
{
    size_t n = kvhal_buffer_size(b);
    uint8_t *got = read_all(b);
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("%s: byte %zu of %zu is 0x%02x, the reference has 0x%02x", what, i, n, got[i],
                                        want[i]);
    free(got);
}

/* A device buffer of random values of dt (finite), and its host copy. */
static kvhal_buffer *random_buffer(kvhal_device dev, kvhal_dtype dt, size_t elems, ref_rng *r, uint8_t **mirror)
{
    size_t es = kvhal_dtype_size(dt), n = elems * es;
    uint8_t *m = malloc(n);
    assert_non_null(m);
    for (size_t i = 0; i < elems; i++) {
        float x = ref_rand_float(r, -8, 8);
        if (dt == KVHAL_F32) memcpy(m + i * 4, &x, 4);
        else if (dt == KVHAL_F16) {
            uint16_t h = ref_f16_encode(x);
            memcpy(m + i * 2, &h, 2);
        } else if (dt == KVHAL_BF16) {
            uint16_t h = ref_bf16_encode(x);
            memcpy(m + i * 2, &h, 2);
        } else {
            m[i] = ref_fp8_encode(x, dt);
        }
    }
    kvhal_buffer *b;
    OK(kvhal_buffer_create(dev, n, &b));
    OK(kvhal_memcpy_h2d(b, 0, m, n, NULL));
    *mirror = m;
    return b;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* ---- kv cache ---- */

static void kv_cache_on(const kvhal_device *devs, int32_t ndev)
{
    ref_rng r = {5};
    const int32_t layers = 3, nkvh = 2 * ndev, dk = 16, dv = 8;
    const int64_t max_len = 32;
    kvhal_kv_cache_config cfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = layers, .num_kv_heads = nkvh, .head_dim_k = dk, .head_dim_v = dv,
                                 .max_len = max_len, .dtype = KVHAL_BF16, .num_devices = ndev, .devices = devs};
    kvhal_kv_cache *c;
    OK(kvhal_kv_cache_create(&cfg, &c));
    /* write random data into every view; the views must not overlap, so reading each back gives its data */
    uint8_t *data[64][3][2]; /* [device][layer][K, V] */
    assert_true(ndev <= 64);
    for (int32_t d = 0; d < ndev; d++) {
        for (int32_t l = 0; l < layers; l++) {
            kvhal_tensor k, v;
            OK(kvhal_kv_cache_layer(c, d, l, &k, &v));
            assert_int_equal(kvhal_buffer_device(k.buffer).type, devs[d].type);
            assert_int_equal(kvhal_buffer_device(k.buffer).id, devs[d].id);
            assert_int_equal(k.ndim, 3);
            assert_int_equal(k.shape[0], max_len);
            assert_int_equal(k.shape[1], nkvh / ndev);
            assert_int_equal(k.shape[2], dk);
            assert_int_equal(v.shape[2], dv);
            assert_true(kvhal_tensor_is_contiguous(&k) && kvhal_tensor_is_contiguous(&v));
            kvhal_tensor *views[2] = {&k, &v};
            for (int s = 0; s < 2; s++) {
                size_t n = kvhal_tensor_span_bytes(views[s]);
                uint8_t *zero = malloc(n);
                OK(kvhal_memcpy_d2h(zero, views[s]->buffer, views[s]->offset, n, NULL));
                assert_true(all_zero(zero, n)); /* a new cache is cleared */
                free(zero);
                data[d][l][s] = malloc(n);
                for (size_t i = 0; i < n; i++) data[d][l][s][i] = (uint8_t)ref_rand(&r);
                OK(kvhal_memcpy_h2d(views[s]->buffer, views[s]->offset, data[d][l][s], n, NULL));
            }
        }
    }
    const int64_t lens[3] = {17, 0, max_len};
    for (int li = 0; li < 3; li++) {
        const int64_t len = lens[li];
        kvhal_kv_cache *dup;
        OK(kvhal_kv_cache_duplicate(c, len, &dup));
        for (int32_t d = 0; d < ndev; d++) {
            for (int32_t l = 0; l < layers; l++) {
                kvhal_tensor k[2], v[2];
                OK(kvhal_kv_cache_layer(c, d, l, &k[0], &v[0]));
                OK(kvhal_kv_cache_layer(dup, d, l, &k[1], &v[1]));
                assert_true(k[1].buffer != k[0].buffer);
                for (int s = 0; s < 2; s++) {
                    const kvhal_tensor *src = s ? &v[0] : &k[0], *dst = s ? &v[1] : &k[1];
                    size_t n = kvhal_tensor_span_bytes(src), prefix = n / (size_t)max_len * (size_t)len;
                    uint8_t *got = malloc(n);
                    OK(kvhal_memcpy_d2h(got, dst->buffer, dst->offset, n, NULL));
                    if (memcmp(got, data[d][l][s], prefix) != 0)
                        fail_msg("duplicate(%lld): device %d layer %d %s: prefix differs", (long long)len, (int)d,
                                 (int)l, s ? "V" : "K");
                    if (!all_zero(got + prefix, n - prefix))
                        fail_msg("duplicate(%lld): device %d layer %d %s: tail not zero", (long long)len, (int)d,
                                 (int)l, s ? "V" : "K");
                    OK(kvhal_memcpy_d2h(got, src->buffer, src->offset, n, NULL));
                    assert_memory_equal(got, data[d][l][s], n); /* the source is untouched */
                    free(got);
                }
            }
        }
        OK(kvhal_kv_cache_destroy(dup));
    }
    assert_int_equal(kvhal_kv_cache_duplicate(c, max_len + 1, &(kvhal_kv_cache *){NULL}), KVHAL_OUT_OF_RANGE);
    kvhal_tensor k;
    assert_int_equal(kvhal_kv_cache_layer(c, ndev, 0, &k, NULL), KVHAL_OUT_OF_RANGE);
    assert_int_equal(kvhal_kv_cache_layer(c, 0, layers, &k, NULL), KVHAL_OUT_OF_RANGE);
    OK(kvhal_kv_cache_destroy(c));
    assert_int_equal(kvhal_kv_cache_destroy(c), KVHAL_INVALID_HANDLE);
    for (int32_t d = 0; d < ndev; d++)
        for (int32_t l = 0; l < layers; l++) free(data[d][l][0]), free(data[d][l][1]);
}

static void test_kv_cache_single(void **state)
{
    kvhal_device dev = first_device(state);
    kv_cache_on(&dev, 1);
    /* heads that do not split evenly, and a device listed twice, are refused */
    kvhal_device two[2] = {dev, dev};
    kvhal_kv_cache_config cfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = 1, .num_kv_heads = 3, .head_dim_k = 4, .head_dim_v = 4,
                                 .max_len = 4, .dtype = KVHAL_F16, .num_devices = 2, .devices = two};
    kvhal_kv_cache *c;
    assert_int_equal(kvhal_kv_cache_create(&cfg, &c), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "num_kv_heads"));
    cfg.num_kv_heads = 4;
    assert_int_equal(kvhal_kv_cache_create(&cfg, &c), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "devices[1]"));
    cfg.num_devices = 1;
    cfg.dtype = KVHAL_I32;
    assert_int_equal(kvhal_kv_cache_create(&cfg, &c), KVHAL_INVALID_ARGUMENT);
}

static void test_kv_cache_multi(void **state)
{
    dev_ctx *ctx = *state;
    if (ctx->count < 2) skip();
    kvhal_device devs[KVHAL_MAX_DEVICES_PER_TYPE];
    for (int32_t i = 0; i < ctx->count; i++) devs[i] = (kvhal_device){ctx->type, i};
    kv_cache_on(devs, ctx->count);
    /* heads % devices != 0 */
    kvhal_kv_cache_config cfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = 1, .num_kv_heads = 2 * ctx->count + 1, .head_dim_k = 4,
                                 .head_dim_v = 4, .max_len = 4, .dtype = KVHAL_F16, .num_devices = ctx->count,
                                 .devices = devs};
    kvhal_kv_cache *c;
    assert_int_equal(kvhal_kv_cache_create(&cfg, &c), KVHAL_INVALID_ARGUMENT);
}

/* ---- static cache ---- */

static void test_static_cache(void **state)
{
    kvhal_device dev = first_device(state);
    ref_rng r = {11};
    const kvhal_dtype dts[2] = {KVHAL_F32, KVHAL_BF16};
    for (int di = 0; di < 2; di++) {
        const kvhal_dtype dt = dts[di];
        const size_t es = kvhal_dtype_size(dt);
        kvhal_static_cache_config cfg = {.struct_size = sizeof(kvhal_static_cache_config), .num_layers = 2, .batch = 2, .num_heads_k = 3, .num_heads_v = 2,
                                         .head_dim_k = 8, .head_dim_v = 4, .max_len = 16, .dtype = dt, .device = dev};
        kvhal_static_cache *c;
        OK(kvhal_static_cache_create(&cfg, &c));
        /* inputs [batch, seq, heads, dim] in memory, passed as permuted [batch, heads, seq, dim] views */
        uint8_t *km, *vm;
        kvhal_buffer *kb = random_buffer(dev, dt, 2 * 5 * 3 * 8, &r, &km);
        kvhal_buffer *vb = random_buffer(dev, dt, 2 * 5 * 2 * 4, &r, &vm);
        uint8_t *mirror = NULL;
        int64_t pos = 0, cap = 5; /* tokens the input buffers hold */
        const int64_t seqs[4] = {5, 3, 0, 8};
        for (int step = 0; step < 4; step++) {
            const int64_t seq = seqs[step];
            int64_t ks[4] = {2, seq, 3, 8}, vs[4] = {2, seq, 2, 4};
            int64_t kst[4] = {cap * 3 * 8, 3 * 8, 8, 1}, vst[4] = {cap * 2 * 4, 2 * 4, 4, 1};
            kvhal_tensor k0, v0, k, v, kh, vh;
            OK(kvhal_tensor_make(kb, 0, dt, 4, ks, kst, &k0));
            OK(kvhal_tensor_make(vb, 0, dt, 4, vs, vst, &v0));
            OK(kvhal_tensor_permute(&k0, (int32_t[]){0, 2, 1, 3}, &k));
            OK(kvhal_tensor_permute(&v0, (int32_t[]){0, 2, 1, 3}, &v));
            OK(kvhal_static_cache_update(c, 1, &k, &v, pos, &kh, &vh, NULL));
            OK(kvhal_device_synchronize(dev));
            assert_int_equal(kh.ndim, 4);
            assert_int_equal(kh.shape[0], 2);
            assert_int_equal(kh.shape[1], 3);
            assert_int_equal(kh.shape[2], pos + seq);
            assert_int_equal(kh.shape[3], 8);
            assert_int_equal(vh.shape[1], 2);
            assert_int_equal(vh.shape[2], pos + seq);
            assert_int_equal(vh.shape[3], 4);
            if (!mirror) {
                mirror = read_all(kh.buffer);
                /* the first window is the only data in a cleared cache */
                memset(mirror, 0, kvhal_buffer_size(kh.buffer));
            }
            kvhal_tensor kw, vw;
            OK(kvhal_tensor_narrow(&kh, 2, pos, seq, &kw));
            OK(kvhal_tensor_narrow(&vh, 2, pos, seq, &vw));
            ref_tensor_copy(mirror, &kw, km, &k);
            ref_tensor_copy(mirror, &vw, vm, &v);
            char what[64];
            snprintf(what, sizeof what, "static %s step %d", kvhal_dtype_name(dt), step);
            expect_buffer(kh.buffer, mirror, what);
            /* the history views read back as the windows written so far: the first element of each window */
            if (seq > 0) {
                int64_t idx[4] = {1, 2, pos, 7}, in_idx[4] = {1, 2, 0, 7};
                assert_memory_equal(mirror + ref_elem_offset(&kh, idx) * (int64_t)es,
                                    km + ref_elem_offset(&k, in_idx) * (int64_t)es, es);
            }
            pos += seq;
            if (step == 2) {
                /* new data for the last window */
                kvhal_buffer_destroy(kb);
                free(km);
                kb = random_buffer(dev, dt, 2 * 8 * 3 * 8, &r, &km);
                kvhal_buffer_destroy(vb);
                free(vm);
                vb = random_buffer(dev, dt, 2 * 8 * 2 * 4, &r, &vm);
                cap = 8;
            }
        }
        assert_int_equal(pos, 16);
        /* bounds and shapes: refused, nothing written */
        int64_t ks[4] = {2, 3, 1, 8}, vs[4] = {2, 2, 1, 4}, vs2[4] = {2, 2, 2, 4}, kbat[4] = {1, 3, 1, 8};
        kvhal_tensor k, v, v2, kbad, kh;
        OK(kvhal_tensor_make(kb, 0, dt, 4, ks, NULL, &k));
        OK(kvhal_tensor_make(vb, 0, dt, 4, vs, NULL, &v));
        OK(kvhal_tensor_make(vb, 0, dt, 4, vs2, NULL, &v2));
        OK(kvhal_tensor_make(kb, 0, dt, 4, kbat, NULL, &kbad));
        assert_int_equal(kvhal_static_cache_update(c, 1, &k, &v, 16, &kh, NULL, NULL), KVHAL_OUT_OF_RANGE);
        assert_non_null(strstr(kvhal_last_error(), "cache_pos"));
        assert_int_equal(kvhal_static_cache_update(c, 1, &k, &v, -1, &kh, NULL, NULL), KVHAL_OUT_OF_RANGE);
        assert_int_equal(kvhal_static_cache_update(c, 1, &k, &v2, 0, &kh, NULL, NULL), KVHAL_SHAPE_MISMATCH);
        assert_int_equal(kvhal_static_cache_update(c, 1, &kbad, &v, 0, &kh, NULL, NULL), KVHAL_SHAPE_MISMATCH);
        assert_non_null(strstr(kvhal_last_error(), "batch"));
        assert_int_equal(kvhal_static_cache_update(c, 1, &v, &k, 0, &kh, NULL, NULL), KVHAL_SHAPE_MISMATCH);
        assert_int_equal(kvhal_static_cache_update(c, 2, &k, &v, 0, &kh, NULL, NULL), KVHAL_OUT_OF_RANGE);
        kvhal_tensor kwrong = k;
        kwrong.dtype = dt == KVHAL_F32 ? KVHAL_I32 : KVHAL_F16;
        assert_int_equal(kvhal_static_cache_update(c, 1, &kwrong, &v, 0, &kh, NULL, NULL), KVHAL_DTYPE_MISMATCH);
        /* layer 0 saw nothing, and the refused calls wrote nothing */
        OK(kvhal_static_cache_update(c, 0, &k, &v, 15, &kh, NULL, NULL));
        kvhal_tensor kw, vh0, vw;
        OK(kvhal_tensor_narrow(&kh, 2, 15, 1, &kw));
        ref_tensor_copy(mirror, &kw, km, &k);
        OK(kvhal_static_cache_update(c, 0, &k, &v, 15, NULL, &vh0, NULL));
        OK(kvhal_tensor_narrow(&vh0, 2, 15, 1, &vw));
        ref_tensor_copy(mirror, &vw, vm, &v);
        expect_buffer(kh.buffer, mirror, "static cache after refused updates");
        free(mirror);
        free(km);
        free(vm);
        OK(kvhal_buffer_destroy(kb));
        OK(kvhal_buffer_destroy(vb));
        OK(kvhal_static_cache_destroy(c));
        assert_int_equal(kvhal_static_cache_destroy(c), KVHAL_INVALID_HANDLE);
    }
}

/* ---- paged cache ---- */

static void paged_one(kvhal_device dev, kvhal_dtype dt, kvhal_paged_layout layout, kvhal_paged_order order,
                      ref_rng *r)
{
    const int32_t L = 3, H = 2, D = 12, BSZ = 4;
    const size_t es = kvhal_dtype_size(dt);
    const uint64_t per_block = 2ull * L * BSZ * H * D * es;
    const bool fp8 = dt == KVHAL_FP8_E4M3 || dt == KVHAL_FP8_E5M2;
    kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = L, .num_heads = H, .head_dim = D, .block_size = BSZ,
                                    .dtype = dt, .layout = layout, .order = order,
                                    .memory_budget = 6 * per_block + per_block - 1, .device = dev,
                                    .k_scale = fp8 ? 0.5f : 0.0f, .v_scale = 0.0f};
    kvhal_paged_cache *c;
    OK(kvhal_paged_cache_create(&cfg, &c));
    const int64_t NBk = kvhal_paged_cache_num_blocks(c);
    assert_int_equal(NBk, 6);

    /* the 2L views tile the buffer exactly once, with the layout in their strides */
    kvhal_tensor kv[2 * 3];
    const kvhal_buffer *buf = NULL;
    for (int32_t l = 0; l < L; l++) {
        OK(kvhal_paged_cache_layer(c, l, &kv[2 * l], &kv[2 * l + 1]));
        for (int s = 0; s < 2; s++) {
            const kvhal_tensor *t = &kv[2 * l + s];
            if (!buf) buf = t->buffer;
            assert_ptr_equal(t->buffer, buf);
            assert_int_equal(t->ndim, 4);
            assert_int_equal(t->shape[0], 6);
            assert_int_equal(t->shape[1], BSZ);
            assert_int_equal(t->shape[2], H);
            assert_int_equal(t->shape[3], D);
            assert_int_equal(t->strides[3], 1);
            assert_int_equal(t->strides[0], order == KVHAL_LAYER_FIRST ? BSZ * H * D : 2 * L * BSZ * H * D);
            assert_int_equal(t->strides[1], layout == KVHAL_LAYOUT_NHD ? H * D : D);
            assert_int_equal(t->strides[2], layout == KVHAL_LAYOUT_NHD ? D : BSZ * D);
        }
    }
    const size_t total = kvhal_buffer_size(buf);
    assert_int_equal(total, 6 * per_block);
    uint8_t *cover = calloc(total, 1);
    for (int i = 0; i < 2 * L; i++) {
        int64_t idx[4] = {0, 0, 0, 0};
        for (idx[0] = 0; idx[0] < 6; idx[0]++)
            for (idx[1] = 0; idx[1] < BSZ; idx[1]++)
                for (idx[2] = 0; idx[2] < H; idx[2]++)
                    for (idx[3] = 0; idx[3] < D; idx[3]++)
                        for (size_t b = 0; b < es; b++) cover[(size_t)ref_elem_offset(&kv[i], idx) * es + b]++;
    }
    for (size_t i = 0; i < total; i++)
        if (cover[i] != 1) fail_msg("paged views: byte %zu is covered %d times", i, cover[i]);
    free(cover);

    uint8_t *mirror = read_all(buf);
    assert_true(all_zero(mirror, total));
    /* updates of two layers through the paged-caching op */
    const kvhal_dtype in_dt = fp8 ? KVHAL_F32 : dt;
    const int64_t T = 9;
    for (int32_t l = 1; l < L; l++) {
        uint8_t *km, *vm;
        kvhal_buffer *kb = random_buffer(dev, in_dt, (size_t)(T * H * D), r, &km);
        kvhal_buffer *vb = random_buffer(dev, in_dt, (size_t)(T * H * D), r, &vm);
        int64_t slots[9];
        int64_t perm[24];
        for (int i = 0; i < 24; i++) perm[i] = i;
        for (int i = 23; i > 0; i--) {
            int j = (int)ref_rand_below(r, (uint64_t)i + 1);
            int64_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int t = 0; t < T; t++) slots[t] = t == 4 ? -1 : perm[t];
        kvhal_buffer *sb;
        OK(kvhal_buffer_create(dev, sizeof slots, &sb));
        OK(kvhal_memcpy_h2d(sb, 0, slots, sizeof slots, NULL));
        kvhal_tensor k, v, s;
        int64_t sh[3] = {T, H, D}, ss[1] = {T};
        OK(kvhal_tensor_make(kb, 0, in_dt, 3, sh, NULL, &k));
        OK(kvhal_tensor_make(vb, 0, in_dt, 3, sh, NULL, &v));
        OK(kvhal_tensor_make(sb, 0, KVHAL_I64, 1, ss, NULL, &s));
        OK(kvhal_paged_cache_update(c, l, &k, &v, &s, NULL));
        OK(kvhal_device_synchronize(dev));
        ref_paged_caching(mirror, &kv[2 * l], mirror, &kv[2 * l + 1], km, &k, vm, &v, (const uint8_t *)slots, &s,
                          fp8 ? 0.5f : 1.0f, 1.0f);
        expect_buffer(buf, mirror, "paged cache update");
        assert_int_equal(kvhal_paged_cache_update(c, L, &k, &v, &s, NULL), KVHAL_OUT_OF_RANGE);
        free(km);
        free(vm);
        OK(kvhal_buffer_destroy(kb));
        OK(kvhal_buffer_destroy(vb));
        OK(kvhal_buffer_destroy(sb));
    }
    /* copy_blocks over every layer (sources and destinations disjoint: devices copy pairs in parallel) */
    int64_t pairs[6] = {0, 3, 5, 1, 2, 4};
    OK(kvhal_paged_cache_copy_blocks(c, pairs, 3, NULL));
    OK(kvhal_device_synchronize(dev));
    uint8_t *mirrors[6] = {mirror, mirror, mirror, mirror, mirror, mirror};
    ref_copy_blocks(mirrors, kv, 2 * L, pairs, 3);
    expect_buffer(buf, mirror, "paged cache copy_blocks");
    int64_t bad[2] = {0, 6};
    assert_int_equal(kvhal_paged_cache_copy_blocks(c, bad, 1, NULL), KVHAL_OUT_OF_RANGE);
    OK(kvhal_paged_cache_copy_blocks(c, bad, 0, NULL));
    expect_buffer(buf, mirror, "paged cache after refused calls");
    free(mirror);
    OK(kvhal_paged_cache_destroy(c));
    assert_int_equal(kvhal_paged_cache_destroy(c), KVHAL_INVALID_HANDLE);
}

static void test_paged_cache(void **state)
{
    kvhal_device dev = first_device(state);
    ref_rng r = {21};
    const kvhal_dtype dts[3] = {KVHAL_F16, KVHAL_FP8_E4M3, KVHAL_F32};
    for (int d = 0; d < 3; d++)
        for (int layout = 0; layout < 2; layout++)
            for (int order = 0; order < 2; order++)
                paged_one(dev, dts[d], (kvhal_paged_layout)layout, (kvhal_paged_order)order, &r);
    /* the budget: one byte short of a block is refused with a clear message */
    kvhal_paged_cache_config cfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 2, .num_heads = 2, .head_dim = 8, .block_size = 16,
                                    .dtype = KVHAL_BF16, .memory_budget = 2 * 2 * 16 * 2 * 8 * 2 - 1, .device = dev};
    kvhal_paged_cache *c;
    assert_int_equal(kvhal_paged_cache_create(&cfg, &c), KVHAL_OUT_OF_MEMORY);
    assert_non_null(strstr(kvhal_last_error(), "not enough memory for one block"));
    cfg.memory_budget++;
    OK(kvhal_paged_cache_create(&cfg, &c));
    assert_int_equal(kvhal_paged_cache_num_blocks(c), 1);
    OK(kvhal_paged_cache_destroy(c));
    cfg.k_scale = -1.0f;
    assert_int_equal(kvhal_paged_cache_create(&cfg, &c), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "k_scale"));
}

/* ---- registration ---- */

typedef struct test_fn {
    const char *name;
    CMUnitTestFunction fn;
} test_fn;

static const test_fn device_tests[] = {
    {"kv_cache", test_kv_cache_single},
    {"kv_cache_multi_device", test_kv_cache_multi},
    {"static_cache", test_static_cache},
    {"paged_cache", test_paged_cache},
};
#define NUM_TESTS (sizeof device_tests / sizeof device_tests[0])

int main(void)
{
    static const kvhal_device_type types[] = {KVHAL_DEVICE_CPU, KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP,
                                              KVHAL_DEVICE_OPENCL};
    static dev_ctx ctx[4];
    struct CMUnitTest tests[4 * NUM_TESTS];
    static char names[4 * NUM_TESTS][96];
    size_t n = 0;
    for (int t = 0; t < 4; t++) {
        ctx[t].type = types[t];
        if (kvhal_device_count(types[t], &ctx[t].count) != KVHAL_OK) ctx[t].count = 0;
        for (size_t f = 0; f < NUM_TESTS; f++) {
            const char *tn = kvhal_device_type_name(types[t]);
            if (ctx[t].count == 0) snprintf(names[n], sizeof names[n], "%s: %s (no %s device)", tn,
                                            device_tests[f].name, tn);
            else if (device_tests[f].fn == test_kv_cache_multi && ctx[t].count < 2)
                snprintf(names[n], sizeof names[n], "%s: %s (one %s device)", tn, device_tests[f].name, tn);
            else snprintf(names[n], sizeof names[n], "%s: %s", tn, device_tests[f].name);
            tests[n] = (struct CMUnitTest){names[n], device_tests[f].fn, NULL, NULL, &ctx[t]};
            n++;
        }
    }
    return _cmocka_run_group_tests("caches", tests, n, NULL, NULL);
}

/* kv.c — see kv.h. */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "failure.h"
#include "mix.h"

static inline size_t row_offset(uint64_t hash, int32_t layer, int side)
{
    return (size_t)(mix64(hash ^ ((uint64_t)(layer + 1) * 0xd6e8feb86659fd93ULL) ^ ((uint64_t)(side + 1) << 56)) &
                    (TABLE_N - 1));
}

/* The content tables: small integers in the input dtype and in the cache's. */
static void fill_tables(kvstate *kv, size_t tab)
{
    uint64_t rng = 0x7461626c65ULL;
    for (size_t i = 0; i < tab; i++) {
        float v = (float)((int)(rng_next(&rng) % 15) - 7);
        uint8_t *in = kv->tab_in + i * kv->ies, *ca = kv->tab_cache + i * kv->ces;
        uint16_t h16;
        switch (kv->idt) {
        case KVHAL_F32: memcpy(in, &v, 4); break;
        case KVHAL_BF16: h16 = kvhal_f32_to_bf16(v); memcpy(in, &h16, 2); break;
        default: h16 = kvhal_f32_to_f16(v); memcpy(in, &h16, 2); break;
        }
        if (kv->cdt == KVHAL_FP8_E4M3 || kv->cdt == KVHAL_FP8_E5M2) *ca = kvhal_f32_to_fp8(v, kv->cdt);
        else memcpy(ca, in, kv->ces);
    }
}

int kv_init(kvstate *kv, const options *o, int64_t *num_pages)
{
    memset(kv, 0, sizeof *kv);
    kvhal_status st = kvhal_device_default(&kv->dev);
    if (st != KVHAL_OK) {
        replay_fail(kvhal_status_name(st), "KVHAL_DEVICE: %s", replay_status_msg(st));
        return -1;
    }
    kvhal_paged_cache_config cfg = KVHAL_PAGED_CACHE_CONFIG_INIT;
    cfg.num_layers = o->layers;
    cfg.num_heads = o->kv_heads;
    cfg.head_dim = o->head_dim;
    cfg.block_size = o->page_size;
    cfg.dtype = o->dtype;
    cfg.layout = o->layout;
    cfg.order = o->order;
    cfg.memory_budget = o->budget;
    cfg.device = kv->dev;
    st = kvhal_paged_cache_create(&cfg, &kv->cache);
    if (st != KVHAL_OK) {
        replay_fail(kvhal_status_name(st), "paged cache: %s", replay_status_msg(st));
        return -1;
    }
    *num_pages = kvhal_paged_cache_num_blocks(kv->cache);
    kv->cdt = o->dtype;
    kv->idt = (o->dtype == KVHAL_FP8_E4M3 || o->dtype == KVHAL_FP8_E5M2) ? KVHAL_F16 : o->dtype;
    kv->ces = kvhal_dtype_size(kv->cdt);
    kv->ies = kvhal_dtype_size(kv->idt);
    kv->layers = o->layers;
    kv->heads = o->kv_heads;
    kv->dim = o->head_dim;
    kv->ps = o->page_size;
    kv->row = (size_t)o->kv_heads * (size_t)o->head_dim;
    kv->chunk = (size_t)o->chunk;
    size_t tab = TABLE_N + kv->row;
    kv->tab_in = malloc(tab * kv->ies);
    kv->tab_cache = malloc(tab * kv->ces);
    kv->khost = malloc(kv->chunk * kv->row * kv->ies);
    kv->vhost = malloc(kv->chunk * kv->row * kv->ies);
    kv->shost = malloc(kv->chunk * sizeof(int64_t));
    kv->layer_k = calloc((size_t)kv->layers, sizeof(kvhal_tensor));
    kv->layer_v = calloc((size_t)kv->layers, sizeof(kvhal_tensor));
    kv->readbuf = malloc(kv->row * kv->ces);
    if (!kv->tab_in || !kv->tab_cache || !kv->khost || !kv->vhost || !kv->shost || !kv->layer_k || !kv->layer_v ||
        !kv->readbuf) {
        replay_fail("KVHAL_OUT_OF_MEMORY", "out of host memory for the K/V staging buffers");
        return -1;
    }
    fill_tables(kv, tab);
    size_t kvbytes = kv->chunk * kv->row * kv->ies;
    if ((st = kvhal_buffer_create(kv->dev, kvbytes, &kv->kbuf)) != KVHAL_OK ||
        (st = kvhal_buffer_create(kv->dev, kvbytes, &kv->vbuf)) != KVHAL_OK ||
        (st = kvhal_buffer_create(kv->dev, kv->chunk * sizeof(int64_t), &kv->sbuf)) != KVHAL_OK) {
        replay_fail(kvhal_status_name(st), "staging buffers: %s", replay_status_msg(st));
        return -1;
    }
    for (int32_t l = 0; l < kv->layers; l++)
        if ((st = kvhal_paged_cache_layer(kv->cache, l, &kv->layer_k[l], &kv->layer_v[l])) != KVHAL_OK) {
            replay_fail(kvhal_status_name(st), "paged cache layer %d: %s", (int)l, replay_status_msg(st));
            return -1;
        }
    return 0;
}

void kv_free(kvstate *kv)
{
    if (kv->kbuf) kvhal_buffer_destroy(kv->kbuf);
    if (kv->vbuf) kvhal_buffer_destroy(kv->vbuf);
    if (kv->sbuf) kvhal_buffer_destroy(kv->sbuf);
    if (kv->cache) kvhal_paged_cache_destroy(kv->cache);
    free(kv->tab_in);
    free(kv->tab_cache);
    free(kv->khost);
    free(kv->vhost);
    free(kv->shost);
    free(kv->layer_k);
    free(kv->layer_v);
    free(kv->readbuf);
    memset(kv, 0, sizeof *kv);
}

kvhal_status kv_write(kvstate *kv, const uint64_t *hash, const int64_t *slots, size_t n, double *t_write,
                      uint64_t *bytes_written, const char **what)
{
    for (size_t base = 0; base < n; base += kv->chunk) {
        size_t m = n - base < kv->chunk ? n - base : kv->chunk;
        kvhal_status st = kvhal_memcpy_h2d(kv->sbuf, 0, slots + base, m * sizeof(int64_t), NULL);
        if (st != KVHAL_OK) return *what = "slot mapping upload", st;
        int64_t kshape[3] = {(int64_t)m, kv->heads, kv->dim}, sshape[1] = {(int64_t)m};
        kvhal_tensor kt, vt, s;
        if ((st = kvhal_tensor_make(kv->kbuf, 0, kv->idt, 3, kshape, NULL, &kt)) != KVHAL_OK ||
            (st = kvhal_tensor_make(kv->vbuf, 0, kv->idt, 3, kshape, NULL, &vt)) != KVHAL_OK ||
            (st = kvhal_tensor_make(kv->sbuf, 0, KVHAL_I64, 1, sshape, NULL, &s)) != KVHAL_OK)
            return *what = "tensor", st;
        size_t rb = kv->row * kv->ies;
        for (int32_t l = 0; l < kv->layers; l++) {
            for (size_t i = 0; i < m; i++) {
                memcpy(kv->khost + i * rb, kv->tab_in + row_offset(hash[base + i], l, 0) * kv->ies, rb);
                memcpy(kv->vhost + i * rb, kv->tab_in + row_offset(hash[base + i], l, 1) * kv->ies, rb);
            }
            if ((st = kvhal_memcpy_h2d(kv->kbuf, 0, kv->khost, m * rb, NULL)) != KVHAL_OK ||
                (st = kvhal_memcpy_h2d(kv->vbuf, 0, kv->vhost, m * rb, NULL)) != KVHAL_OK)
                return *what = "K/V upload", st;
            double t0 = now_s();
            st = kvhal_paged_cache_update(kv->cache, l, &kt, &vt, &s, NULL);
            if (st == KVHAL_OK) st = kvhal_device_synchronize(kv->dev);
            *t_write += now_s() - t0;
            if (st != KVHAL_OK) return *what = "paged caching", st;
        }
        *bytes_written += (uint64_t)m * kv->row * kv->ces * 2 * (uint64_t)kv->layers;
    }
    return KVHAL_OK;
}

kvhal_status kv_check_row(kvstate *kv, uint64_t hash, int32_t layer, int side, int64_t page, int64_t off,
                          int32_t *bad_head)
{
    const kvhal_tensor *t = side ? &kv->layer_v[layer] : &kv->layer_k[layer];
    const uint8_t *expect = kv->tab_cache + row_offset(hash, layer, side) * kv->ces;
    for (int32_t h = 0; h < kv->heads; h++) {
        uint8_t *dst = kv->readbuf + (size_t)h * (size_t)kv->dim * kv->ces;
        size_t el = (size_t)(page * t->strides[0] + off * t->strides[1] + h * t->strides[2]);
        kvhal_status st;
        if (t->strides[3] == 1) {
            st = kvhal_memcpy_d2h(dst, t->buffer, t->offset + el * kv->ces, (size_t)kv->dim * kv->ces, NULL);
        } else {
            st = KVHAL_OK;
            for (int32_t d = 0; d < kv->dim && st == KVHAL_OK; d++)
                st = kvhal_memcpy_d2h(dst + (size_t)d * kv->ces, t->buffer,
                                      t->offset + (el + (size_t)(d * t->strides[3])) * kv->ces, kv->ces, NULL);
        }
        if (st != KVHAL_OK) return st;
    }
    *bad_head = -1;
    if (memcmp(kv->readbuf, expect, kv->row * kv->ces) != 0) {
        int32_t bad = 0;
        while (memcmp(kv->readbuf + (size_t)bad * (size_t)kv->dim * kv->ces,
                      expect + (size_t)bad * (size_t)kv->dim * kv->ces, (size_t)kv->dim * kv->ces) == 0)
            bad++;
        *bad_head = bad;
    }
    return KVHAL_OK;
}

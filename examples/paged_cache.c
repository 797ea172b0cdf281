/* paged_cache.c — kvhal example: write K and V of a few tokens into a paged cache with the paged-caching op and
 * read them back, on whatever device KVHAL_DEVICE names (cpu when unset; cuda:0, opencl:0, npu:0, ...).
 *
 *   cc paged_cache.c $(pkg-config --cflags --libs kvhal) -o paged_cache && KVHAL_DEVICE=cpu ./paged_cache
 *
 * Exit status 0 when every element read back is the one written, 1 otherwise (the message says why). */
#include <kvhal/kvhal.h>

#include <stdio.h>
#include <stdlib.h>

enum { LAYERS = 2, HEADS = 4, DIM = 64, BLOCK = 16, TOKENS = 40 };

#define CHECK(call)                                                                                             \
    do {                                                                                                        \
        kvhal_status st_ = (call);                                                                              \
        if (st_ != KVHAL_OK) {                                                                                  \
            fprintf(stderr, "paged_cache: %s failed: %s\n", #call, kvhal_last_error());                          \
            return 1;                                                                                           \
        }                                                                                                       \
    } while (0)

/* The value written for (layer, K or V, token, head, d): exact in f16. */
static float value(int layer, int side, int t, int h, int d)
{
    return (float)((layer * 7 + side * 3 + t * 5 + h * 11 + d) % 64) * 0.25f - 8.0f;
}

static int run(kvhal_device dev, uint16_t *host_kv, uint16_t *host_read)
{
    char name[32];
    CHECK(kvhal_device_format(dev, name, sizeof name));
    printf("kvhal %s on %s\n", kvhal_version(), name);

    kvhal_paged_cache_config cfg;
    kvhal_paged_cache_config_init(&cfg); /* sets struct_size; every other field 0 */
    cfg.num_layers = LAYERS;
    cfg.num_heads = HEADS;
    cfg.head_dim = DIM;
    cfg.block_size = BLOCK;
    cfg.dtype = KVHAL_F16;
    cfg.layout = KVHAL_LAYOUT_HND;
    cfg.order = KVHAL_LAYER_FIRST;
    cfg.memory_budget = 1u << 20;
    cfg.device = dev;
    kvhal_paged_cache *cache = NULL;
    CHECK(kvhal_paged_cache_create(&cfg, &cache));
    const int64_t blocks = kvhal_paged_cache_num_blocks(cache);

    /* Token t goes to slot (blocks - 1 - t / BLOCK) * BLOCK + t % BLOCK: the blocks are used back to front. */
    int64_t slots[TOKENS];
    for (int t = 0; t < TOKENS; t++) slots[t] = (blocks - 1 - t / BLOCK) * BLOCK + t % BLOCK;

    const size_t kv_bytes = (size_t)TOKENS * HEADS * DIM * sizeof(uint16_t);
    kvhal_buffer *kbuf = NULL, *vbuf = NULL, *sbuf = NULL;
    CHECK(kvhal_buffer_create(dev, kv_bytes, &kbuf));
    CHECK(kvhal_buffer_create(dev, kv_bytes, &vbuf));
    CHECK(kvhal_buffer_create(dev, sizeof slots, &sbuf));
    CHECK(kvhal_memcpy_h2d(sbuf, 0, slots, sizeof slots, NULL));
    const int64_t kv_shape[3] = {TOKENS, HEADS, DIM}, slot_shape[1] = {TOKENS};
    kvhal_tensor k, v, s;
    CHECK(kvhal_tensor_make(kbuf, 0, KVHAL_F16, 3, kv_shape, NULL, &k));
    CHECK(kvhal_tensor_make(vbuf, 0, KVHAL_F16, 3, kv_shape, NULL, &v));
    CHECK(kvhal_tensor_make(sbuf, 0, KVHAL_I64, 1, slot_shape, NULL, &s));

    for (int l = 0; l < LAYERS; l++) {
        for (int side = 0; side < 2; side++) {
            for (int t = 0; t < TOKENS; t++)
                for (int h = 0; h < HEADS; h++)
                    for (int d = 0; d < DIM; d++)
                        host_kv[((size_t)t * HEADS + h) * DIM + d] = kvhal_f32_to_f16(value(l, side, t, h, d));
            CHECK(kvhal_memcpy_h2d(side ? vbuf : kbuf, 0, host_kv, kv_bytes, NULL));
        }
        CHECK(kvhal_paged_cache_update(cache, l, &k, &v, &s, NULL)); /* asynchronous on GPUs */
        CHECK(kvhal_device_synchronize(dev)); /* before the host buffer is refilled for the next layer */
    }

    /* Read back: the layer views are [blocks, block_size, heads, dim] in logical order; the strides carry the
     * layout, so one loop reads NHD and HND alike. */
    int bad = 0;
    for (int l = 0; l < LAYERS && !bad; l++) {
        kvhal_tensor views[2];
        CHECK(kvhal_paged_cache_layer(cache, l, &views[0], &views[1]));
        for (int side = 0; side < 2 && !bad; side++) {
            const kvhal_tensor *c = &views[side];
            const size_t span = kvhal_tensor_span_bytes(c);
            CHECK(kvhal_memcpy_d2h(host_read, c->buffer, c->offset, span, NULL));
            for (int t = 0; t < TOKENS && !bad; t++)
                for (int h = 0; h < HEADS && !bad; h++)
                    for (int d = 0; d < DIM && !bad; d++) {
                        const int64_t at = (slots[t] / BLOCK) * c->strides[0] + (slots[t] % BLOCK) * c->strides[1] +
                                           h * c->strides[2] + d * c->strides[3];
                        const float got = kvhal_f16_to_f32(host_read[at]), want = value(l, side, t, h, d);
                        if (got != want) {
                            fprintf(stderr, "paged_cache: layer %d %s token %d head %d dim %d: %g, wrote %g\n", l,
                                    side ? "V" : "K", t, h, d, (double)got, (double)want);
                            bad = 1;
                        }
                    }
        }
    }
    if (!bad) printf("%d tokens x %d layers written through the paged-caching op and read back: all equal\n", TOKENS,
                     LAYERS);
    CHECK(kvhal_buffer_destroy(kbuf));
    CHECK(kvhal_buffer_destroy(vbuf));
    CHECK(kvhal_buffer_destroy(sbuf));
    CHECK(kvhal_paged_cache_destroy(cache));
    return bad;
}

int main(void)
{
    kvhal_device dev;
    if (kvhal_device_default(&dev) != KVHAL_OK) {
        fprintf(stderr, "paged_cache: KVHAL_DEVICE: %s\n", kvhal_last_error());
        return 1;
    }
    /* 1 MiB budget over 2 layers x K,V of f16 4x64 blocks of 16: room for 64 blocks, read whole per view. */
    uint16_t *host_kv = malloc((size_t)TOKENS * HEADS * DIM * sizeof(uint16_t));
    uint16_t *host_read = malloc(1u << 20);
    int rc = host_kv && host_read ? run(dev, host_kv, host_read) : 1;
    free(host_kv);
    free(host_read);
    return rc;
}

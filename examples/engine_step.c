/* engine_step.c — kvhal example: an inference engine's step loop on a paged cache, with prefix reuse.
 *
 * Each step admits one request (a shared system prompt plus a question of its own), asks the cache manager for
 * the longest cached prefix (kvhal_cache_manager_match), allocates pages for the rest, writes K and V of the new
 * tokens in every layer (kvhal_paged_cache_update), decodes a few tokens one at a time, and hands the request back
 * (kvhal_cache_manager_cache_finished_suffix) so that the next request finds the prompt cached. Every matched
 * prefix is read back and compared with what the first request wrote. Runs on KVHAL_DEVICE (cpu when unset).
 *
 *   cc engine_step.c $(pkg-config --cflags --libs kvhal) -o engine_step && ./engine_step
 *
 * Exit status 0 when every request after the first reused the system prompt and its K/V read back intact. */
#include <kvhal/kvhal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LAYERS = 2, HEADS = 2, DIM = 32, PAGE = 16, SYSTEM = 64, QUESTION = 20, DECODE = 6, REQUESTS = 5 };
enum { MAX_TOKENS = SYSTEM + QUESTION + DECODE, MAX_PAGES = (MAX_TOKENS + PAGE - 1) / PAGE };

#define CHECK(call)                                                                                             \
    do {                                                                                                        \
        kvhal_status st_ = (call);                                                                              \
        if (st_ != KVHAL_OK) {                                                                                  \
            fprintf(stderr, "engine_step: %s failed: %s\n", #call, kvhal_last_error());                          \
            return 1;                                                                                           \
        }                                                                                                       \
    } while (0)

/* What "the model" produces for token id tok at position pos: K/V depend on both, as attention states do. */
static float kv_value(int32_t tok, int pos, int layer, int side, int h, int d)
{
    return (float)((tok * 31 + pos * 7 + layer * 5 + side * 3 + h * 13 + d) % 1000) * 0.5f;
}

typedef struct engine {
    kvhal_device dev;
    kvhal_paged_cache *cache;
    kvhal_cache_manager *cm;
    kvhal_buffer *kbuf, *vbuf, *sbuf;
    float host[MAX_TOKENS * HEADS * DIM];
} engine;

/* Writes K and V of tokens[from..to) (positions from..to) of one request into its pages, every layer. */
static int write_tokens(engine *e, const int32_t *tokens, const int32_t *pages, int from, int to)
{
    const int n = to - from;
    int64_t slots[MAX_TOKENS];
    for (int i = 0; i < n; i++) slots[i] = (int64_t)pages[(from + i) / PAGE] * PAGE + (from + i) % PAGE;
    CHECK(kvhal_memcpy_h2d(e->sbuf, 0, slots, (size_t)n * sizeof slots[0], NULL));
    const int64_t shape[3] = {n, HEADS, DIM}, sshape[1] = {n};
    kvhal_tensor k, v, s;
    CHECK(kvhal_tensor_make(e->kbuf, 0, KVHAL_F32, 3, shape, NULL, &k));
    CHECK(kvhal_tensor_make(e->vbuf, 0, KVHAL_F32, 3, shape, NULL, &v));
    CHECK(kvhal_tensor_make(e->sbuf, 0, KVHAL_I64, 1, sshape, NULL, &s));
    for (int l = 0; l < LAYERS; l++) {
        for (int side = 0; side < 2; side++) {
            for (int i = 0; i < n; i++)
                for (int h = 0; h < HEADS; h++)
                    for (int d = 0; d < DIM; d++)
                        e->host[(i * HEADS + h) * DIM + d] = kv_value(tokens[from + i], from + i, l, side, h, d);
            CHECK(kvhal_memcpy_h2d(side ? e->vbuf : e->kbuf, 0, e->host, (size_t)n * HEADS * DIM * sizeof(float),
                                   NULL));
        }
        CHECK(kvhal_paged_cache_update(e->cache, l, &k, &v, &s, NULL));
        CHECK(kvhal_device_synchronize(e->dev)); /* the host staging buffer is refilled for the next layer */
    }
    return 0;
}

/* Reads layer 0's K of positions [0, len) back from the pages and compares them with what was written. */
static int verify_prefix(engine *e, const int32_t *tokens, const int32_t *pages, int len)
{
    kvhal_tensor kc, vc;
    CHECK(kvhal_paged_cache_layer(e->cache, 0, &kc, &vc));
    float row[HEADS * DIM];
    for (int p = 0; p < len; p++) {
        /* A NHD cache holds one token's heads x dim contiguously: one copy per token. */
        const int64_t at = (int64_t)pages[p / PAGE] * kc.strides[0] + (p % PAGE) * kc.strides[1];
        CHECK(kvhal_memcpy_d2h(row, kc.buffer, kc.offset + (size_t)at * sizeof(float), sizeof row, NULL));
        for (int h = 0; h < HEADS; h++)
            for (int d = 0; d < DIM; d++)
                if (row[h * DIM + d] != kv_value(tokens[p], p, 0, 0, h, d)) {
                    fprintf(stderr, "engine_step: cached K of position %d head %d dim %d differs\n", p, h, d);
                    return 1;
                }
    }
    return 0;
}

static int step(engine *e, int r, size_t *reused)
{
    int32_t tokens[MAX_TOKENS], pages[MAX_PAGES];
    for (int i = 0; i < SYSTEM; i++) tokens[i] = 1000 + i;                       /* the shared system prompt */
    for (int i = 0; i < QUESTION; i++) tokens[SYSTEM + i] = 5000 + r * 100 + i; /* this request's question */
    int len = SYSTEM + QUESTION;

    kvhal_prefix_handle handle = 0;
    size_t cached = 0;
    CHECK(kvhal_cache_manager_match(e->cm, tokens, (size_t)len, &handle, &cached, pages, MAX_PAGES));
    if (cached > 0 && verify_prefix(e, tokens, pages, (int)cached) != 0) return 1;
    *reused = cached;

    /* Prefill: pages for what is not cached, then K and V of those tokens. */
    const int have = (int)cached / PAGE, need = (len + PAGE - 1) / PAGE;
    CHECK(kvhal_cache_manager_allocate(e->cm, need - have, pages + have));
    if (write_tokens(e, tokens, pages, (int)cached, len) != 0) return 1;

    /* Decode: one token per iteration, a new page when the last one is full. */
    for (int i = 0; i < DECODE; i++, len++) {
        tokens[len] = 9000 + r * 10 + i;
        if (len % PAGE == 0) CHECK(kvhal_cache_manager_allocate(e->cm, 1, pages + len / PAGE));
        if (write_tokens(e, tokens, pages, len, len + 1) != 0) return 1;
    }

    /* Finished: what follows the match goes into the prefix cache (full pages), the partial tail page is freed. */
    CHECK(kvhal_cache_manager_cache_finished_suffix(e->cm, handle, tokens + cached, (size_t)len - cached,
                                                    pages + cached / PAGE));
    CHECK(kvhal_cache_manager_check_integrity(e->cm));
    return 0;
}

static int run(engine *e)
{
    kvhal_paged_cache_config cfg = KVHAL_PAGED_CACHE_CONFIG_INIT;
    cfg.num_layers = LAYERS;
    cfg.num_heads = HEADS;
    cfg.head_dim = DIM;
    cfg.block_size = PAGE;
    cfg.dtype = KVHAL_F32;
    cfg.layout = KVHAL_LAYOUT_NHD;
    cfg.memory_budget = 4u << 20;
    cfg.device = e->dev;
    CHECK(kvhal_paged_cache_create(&cfg, &e->cache));
    const int64_t blocks = kvhal_paged_cache_num_blocks(e->cache);
    CHECK(kvhal_cache_manager_create((int32_t)blocks, PAGE, KVHAL_PREFIX_RADIX, &e->cm));
    CHECK(kvhal_buffer_create(e->dev, sizeof e->host, &e->kbuf));
    CHECK(kvhal_buffer_create(e->dev, sizeof e->host, &e->vbuf));
    CHECK(kvhal_buffer_create(e->dev, MAX_TOKENS * sizeof(int64_t), &e->sbuf));

    int rc = 0;
    for (int r = 0; r < REQUESTS && rc == 0; r++) {
        size_t reused = 0;
        rc = step(e, r, &reused);
        if (rc == 0) printf("request %d: %zu of %d prompt tokens reused from the prefix cache\n", r, reused,
                            SYSTEM + QUESTION);
        /* The system prompt is 4 whole pages: every request after the first must find it. */
        if (rc == 0 && r > 0 && reused < SYSTEM) {
            fprintf(stderr, "engine_step: request %d reused %zu tokens, expected the %d of the system prompt\n", r,
                    reused, SYSTEM);
            rc = 1;
        }
    }
    printf("%s: %d pages, %d free or evictable at the end\n", rc ? "FAILED" : "ok", (int)blocks,
           (int)kvhal_cache_manager_available(e->cm));
    CHECK(kvhal_buffer_destroy(e->kbuf));
    CHECK(kvhal_buffer_destroy(e->vbuf));
    CHECK(kvhal_buffer_destroy(e->sbuf));
    CHECK(kvhal_cache_manager_destroy(e->cm));
    CHECK(kvhal_paged_cache_destroy(e->cache));
    return rc;
}

int main(void)
{
    engine *e = calloc(1, sizeof *e);
    if (!e) return 1;
    int rc = 1;
    if (kvhal_device_default(&e->dev) != KVHAL_OK) fprintf(stderr, "engine_step: KVHAL_DEVICE: %s\n", kvhal_last_error());
    else rc = run(e);
    free(e);
    return rc;
}

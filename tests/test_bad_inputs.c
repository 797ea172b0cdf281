/* test_bad_inputs.c — the bad-input matrix: for every public function, the invalid inputs a caller can give,
 * each with the status it must return and a word its message must contain (the argument at fault). Every row is
 * one case; the suite prints how many were tried and passed. Nothing here may crash, abort or print. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"
#include "replay_trace.h"

static int tried, passed;
static char failures[8192];

static void check(const char *expr, kvhal_status got, kvhal_status want, const char *needle, int line)
{
    tried++;
    const char *msg = kvhal_last_error();
    bool ok = got == want && (!needle || strstr(msg, needle) != NULL);
    if (ok) {
        passed++;
        return;
    }
    size_t len = strlen(failures);
    snprintf(failures + len, sizeof failures - len, "line %d: %s\n  got %s \"%s\", want %s mentioning \"%s\"\n", line,
             expr, kvhal_status_name(got), msg, kvhal_status_name(want), needle ? needle : "");
}

#define CASE(expr, want, needle)                                                                                \
    do {                                                                                                        \
        kvhal_clear_error();                                                                                    \
        check(#expr, (expr), (want), (needle), __LINE__);                                                       \
    } while (0)

static const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};

/* What every section of the matrix shares: devices that do not exist, a host scratch area, and three CPU buffers
 * (4096 bytes, 64 bytes, and one already destroyed) made by test_matrix. */
static const kvhal_device bad_type = {(kvhal_device_type)42, 0}, bad_id = {KVHAL_DEVICE_CPU, 3},
                          neg_id = {KVHAL_DEVICE_CPU, -1};
static kvhal_buffer *buf, *small, *dead;
/* made by the ops section, used again by the caches section: a 5-token f16 input and its slot mapping */
static kvhal_buffer *cb, *ib, *sb;
static kvhal_tensor kin16, slots;
static char host[4096];

static void matrix_devices(void)
{
    kvhal_device dev;
    int32_t n32;
    kvhal_device_info info;
    /* ---- devices ---- */
    CASE(kvhal_device_parse(NULL, &dev), KVHAL_INVALID_ARGUMENT, "text");
    CASE(kvhal_device_parse("cpu", NULL), KVHAL_INVALID_ARGUMENT, "out");
    CASE(kvhal_device_parse("", &dev), KVHAL_PARSE_ERROR, "text");
    CASE(kvhal_device_parse("tpu:0", &dev), KVHAL_PARSE_ERROR, "tpu");
    CASE(kvhal_device_parse("cuda:", &dev), KVHAL_PARSE_ERROR, "id");
    CASE(kvhal_device_parse("cuda:-1", &dev), KVHAL_PARSE_ERROR, "id");
    CASE(kvhal_device_parse("cuda:1x", &dev), KVHAL_PARSE_ERROR, "trailing");
    CASE(kvhal_device_parse("cuda:99999999999999999999", &dev), KVHAL_PARSE_ERROR, "id");
    CASE(kvhal_device_format(cpu, NULL, 8), KVHAL_INVALID_ARGUMENT, "buf");
    CASE(kvhal_device_format(cpu, host, 2), KVHAL_OUT_OF_RANGE, "buf_size");
    CASE(kvhal_device_count((kvhal_device_type)9, &n32), KVHAL_INVALID_ARGUMENT, "type");
    CASE(kvhal_device_count(KVHAL_DEVICE_CPU, NULL), KVHAL_INVALID_ARGUMENT, "count");
    CASE(kvhal_device_get_info(bad_type, &info), KVHAL_INVALID_ARGUMENT, "type");
    CASE(kvhal_device_get_info(bad_id, &info), KVHAL_NO_DEVICE, "cpu:3");
    CASE(kvhal_device_get_info(neg_id, &info), KVHAL_NO_DEVICE, "cpu:-1");
    CASE(kvhal_device_get_info(cpu, NULL), KVHAL_INVALID_ARGUMENT, "out");
    CASE(kvhal_device_synchronize(bad_id), KVHAL_NO_DEVICE, "cpu:3");
    CASE(kvhal_device_check_errors(bad_type), KVHAL_INVALID_ARGUMENT, "type");
    CASE(kvhal_backend_module_get(-1, NULL), KVHAL_INVALID_ARGUMENT, "out");
    kvhal_backend_module_info mi;
    CASE(kvhal_backend_module_get(1000, &mi), KVHAL_OUT_OF_RANGE, "index");
    setenv("KVHAL_DEVICE", "cuda:x", 1);
    CASE(kvhal_device_default(&dev), KVHAL_PARSE_ERROR, "KVHAL_DEVICE");
    setenv("KVHAL_DEVICE", "cpu:5", 1);
    CASE(kvhal_device_default(&dev), KVHAL_NO_DEVICE, "KVHAL_DEVICE");
    unsetenv("KVHAL_DEVICE");
}

static void matrix_buffers_streams(void)
{
    kvhal_stream *st = NULL;
    /* ---- buffers and streams ---- */
    kvhal_buffer *b2;
    CASE(kvhal_buffer_create(cpu, 0, &b2), KVHAL_INVALID_ARGUMENT, "bytes");
    CASE(kvhal_buffer_create(cpu, 16, NULL), KVHAL_INVALID_ARGUMENT, "out");
    CASE(kvhal_buffer_create(bad_id, 16, &b2), KVHAL_NO_DEVICE, "cpu:3");
    CASE(kvhal_buffer_create(bad_type, 16, &b2), KVHAL_INVALID_ARGUMENT, "type");
    CASE(kvhal_buffer_create(cpu, SIZE_MAX, &b2), KVHAL_OUT_OF_MEMORY, "bytes");
    CASE(kvhal_buffer_wrap(cpu, NULL, 16, &b2), KVHAL_INVALID_ARGUMENT, "native");
    CASE(kvhal_buffer_wrap(cpu, host, 0, &b2), KVHAL_INVALID_ARGUMENT, "bytes");
    CASE(kvhal_buffer_destroy(NULL), KVHAL_OK, ""); /* like free(NULL) */
    CASE(kvhal_buffer_destroy(dead), KVHAL_INVALID_HANDLE, "destroyed");
    CASE(kvhal_memcpy_h2d(NULL, 0, host, 1, NULL), KVHAL_INVALID_ARGUMENT, "dst");
    CASE(kvhal_memcpy_h2d(buf, 0, NULL, 1, NULL), KVHAL_INVALID_ARGUMENT, "src");
    CASE(kvhal_memcpy_h2d(buf, 4000, host, 97, NULL), KVHAL_OUT_OF_RANGE, "dst");
    CASE(kvhal_memcpy_h2d(buf, SIZE_MAX, host, 2, NULL), KVHAL_OUT_OF_RANGE, "dst");
    CASE(kvhal_memcpy_d2h(host, buf, 1, 4096, NULL), KVHAL_OUT_OF_RANGE, "src");
    CASE(kvhal_memcpy_d2h(NULL, buf, 0, 4, NULL), KVHAL_INVALID_ARGUMENT, "dst");
    CASE(kvhal_memcpy_d2d(buf, 0, small, 0, 65, NULL), KVHAL_OUT_OF_RANGE, "src");
    CASE(kvhal_memcpy_d2d(small, 10, buf, 0, 60, NULL), KVHAL_OUT_OF_RANGE, "dst");
    CASE(kvhal_memcpy_d2d(buf, 0, NULL, 0, 1, NULL), KVHAL_INVALID_ARGUMENT, "src");
    CASE(kvhal_memset(buf, 0, 256, 4, NULL), KVHAL_INVALID_ARGUMENT, "value");
    CASE(kvhal_memset(buf, 4090, 0, 7, NULL), KVHAL_OUT_OF_RANGE, "dst");
    CASE(kvhal_stream_create(bad_id, &st), KVHAL_NO_DEVICE, "cpu:3");
    CASE(kvhal_stream_create(cpu, NULL), KVHAL_INVALID_ARGUMENT, "out");
    CASE(kvhal_stream_wrap(cpu, NULL, NULL), KVHAL_INVALID_ARGUMENT, "out");
    CASE(kvhal_stream_check_errors(NULL), KVHAL_INVALID_ARGUMENT, "s");
    CASE(kvhal_stream_destroy(NULL), KVHAL_OK, "");
    CASE(kvhal_stream_synchronize(NULL), KVHAL_INVALID_ARGUMENT, "s");
    assert_int_equal(kvhal_stream_create(cpu, &st), KVHAL_OK);
    assert_int_equal(kvhal_stream_destroy(st), KVHAL_OK);
    CASE(kvhal_stream_destroy(st), KVHAL_INVALID_HANDLE, "destroyed");
}

static void matrix_tensors(void)
{
    /* ---- tensors ---- */
    kvhal_tensor t, v;
    int64_t shape2[2] = {16, 64}, neg[2] = {-1, 4}, big[2] = {INT64_MAX / 2, 4}, strides_neg[2] = {-4, 1};
    CASE(kvhal_tensor_make(NULL, 0, KVHAL_F32, 2, shape2, NULL, &t), KVHAL_INVALID_ARGUMENT, "buf");
    CASE(kvhal_tensor_make(buf, 0, (kvhal_dtype)99, 2, shape2, NULL, &t), KVHAL_INVALID_ARGUMENT, "dt");
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 0, shape2, NULL, &t), KVHAL_INVALID_ARGUMENT, "ndim");
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 7, shape2, NULL, &t), KVHAL_INVALID_ARGUMENT, "ndim");
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, NULL, NULL, &t), KVHAL_INVALID_ARGUMENT, "shape");
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, neg, NULL, &t), KVHAL_INVALID_ARGUMENT, "shape[0]");
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, shape2, strides_neg, &t), KVHAL_INVALID_ARGUMENT, "strides[0]");
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, big, NULL, &t), KVHAL_OUT_OF_RANGE, "");
    CASE(kvhal_tensor_make(buf, 4, KVHAL_F32, 2, shape2, NULL, &t), KVHAL_OUT_OF_RANGE, "past the buffer");
    CASE(kvhal_tensor_make(buf, 2, KVHAL_F32, 1, shape2, NULL, &t), KVHAL_INVALID_ARGUMENT, "offset");
    /* A stream handle passed where a buffer is expected is caught by its magic (using a destroyed buffer is
     * undefined, as with free(); only a double destroy is detected, through the live-handle set). */
    kvhal_stream *wrong;
    assert_int_equal(kvhal_stream_create(cpu, &wrong), KVHAL_OK);
    CASE(kvhal_tensor_make((kvhal_buffer *)(void *)wrong, 0, KVHAL_F32, 1, shape2, NULL, &t), KVHAL_INVALID_HANDLE,
         "buf");
    CASE(kvhal_buffer_destroy((kvhal_buffer *)(void *)wrong), KVHAL_INVALID_HANDLE, "buf");
    assert_int_equal(kvhal_stream_destroy(wrong), KVHAL_OK);
    CASE(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, shape2, NULL, NULL), KVHAL_INVALID_ARGUMENT, "out");
    assert_int_equal(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, shape2, NULL, &t), KVHAL_OK);
    CASE(kvhal_tensor_narrow(&t, 2, 0, 1, &v), KVHAL_INVALID_ARGUMENT, "dim");
    CASE(kvhal_tensor_narrow(&t, 0, 10, 7, &v), KVHAL_OUT_OF_RANGE, "length");
    CASE(kvhal_tensor_narrow(&t, 0, -1, 2, &v), KVHAL_OUT_OF_RANGE, "start");
    CASE(kvhal_tensor_narrow(NULL, 0, 0, 1, &v), KVHAL_INVALID_ARGUMENT, "t");
    CASE(kvhal_tensor_select(&t, 0, 16, &v), KVHAL_OUT_OF_RANGE, "index");
    CASE(kvhal_tensor_select(&t, -1, 0, &v), KVHAL_INVALID_ARGUMENT, "dim");
    int32_t perm_bad[2] = {0, 0}, perm_oob[2] = {0, 2};
    CASE(kvhal_tensor_permute(&t, perm_bad, &v), KVHAL_INVALID_ARGUMENT, "perm[1]");
    CASE(kvhal_tensor_permute(&t, perm_oob, &v), KVHAL_INVALID_ARGUMENT, "perm[1]");
    CASE(kvhal_tensor_permute(&t, NULL, &v), KVHAL_INVALID_ARGUMENT, "perm");
    kvhal_tensor hand = t;
    hand.shape[0] = 17; /* one row past the end */
    CASE(kvhal_tensor_validate(&hand), KVHAL_OUT_OF_RANGE, "past the buffer");
    hand = t;
    hand.ndim = 9;
    CASE(kvhal_tensor_validate(&hand), KVHAL_INVALID_ARGUMENT, "ndim");
}

static void matrix_ops(void)
{
    /* ---- ops ---- */
    assert_int_equal(kvhal_buffer_create(cpu, 4 * 8 * 2 * 16 * 2, &cb), KVHAL_OK);  /* 4 blocks x 8 x 2 x 16 f16 */
    assert_int_equal(kvhal_buffer_create(cpu, 5 * 2 * 16 * 4, &ib), KVHAL_OK);      /* 5 tokens x 2 x 16 f32 */
    assert_int_equal(kvhal_buffer_create(cpu, 5 * 8, &sb), KVHAL_OK);
    kvhal_tensor kc, kin, slots_f;
    int64_t cshape[4] = {4, 8, 2, 16}, ishape[3] = {5, 2, 16}, sshape[1] = {5}, s4[1] = {4};
    assert_int_equal(kvhal_tensor_make(cb, 0, KVHAL_F16, 4, cshape, NULL, &kc), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(ib, 0, KVHAL_F32, 3, ishape, NULL, &kin), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(ib, 0, KVHAL_F16, 3, ishape, NULL, &kin16), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(sb, 0, KVHAL_I64, 1, sshape, NULL, &slots), KVHAL_OK);
    assert_int_equal(kvhal_tensor_make(sb, 0, KVHAL_F32, 1, sshape, NULL, &slots_f), KVHAL_OK);
    int64_t sl[5] = {0, 1, 2, -1, 32};
    kvhal_memcpy_h2d(sb, 0, sl, sizeof sl, NULL);
    CASE(kvhal_paged_caching(NULL, &kc, &kin16, &kin16, &slots, 1, 1, NULL), KVHAL_INVALID_ARGUMENT, "k_cache");
    CASE(kvhal_paged_caching(&kc, &kc, &kin16, &kin16, NULL, 1, 1, NULL), KVHAL_INVALID_ARGUMENT, "slot_mapping");
    CASE(kvhal_paged_caching(&kc, &kc, &kin16, &kin16, &slots_f, 1, 1, NULL), KVHAL_DTYPE_MISMATCH, "slot_mapping");
    CASE(kvhal_paged_caching(&kc, &kc, &kin, &kin16, &slots, 1, 1, NULL), KVHAL_DTYPE_MISMATCH, "k");
    kvhal_tensor s_short;
    assert_int_equal(kvhal_tensor_make(sb, 0, KVHAL_I64, 1, s4, NULL, &s_short), KVHAL_OK);
    CASE(kvhal_paged_caching(&kc, &kc, &kin16, &kin16, &s_short, 1, 1, NULL), KVHAL_SHAPE_MISMATCH, "slot_mapping");
    /* slot 32 = 4 blocks x 8: out of range; CPU slots are host-readable: error before any write */
    CASE(kvhal_paged_caching(&kc, &kc, &kin16, &kin16, &slots, 1, 1, NULL), KVHAL_OUT_OF_RANGE, "32");
    kvhal_tensor kc3;
    assert_int_equal(kvhal_tensor_select(&kc, 0, 0, &kc3), KVHAL_OK);
    CASE(kvhal_paged_caching(&kc3, &kc, &kin16, &kin16, &slots, 1, 1, NULL), KVHAL_INVALID_ARGUMENT, "k_cache");
    int64_t pairs_bad[2] = {0, 4}, pairs_neg[2] = {-1, 0};
    CASE(kvhal_copy_blocks(&kc, 1, pairs_bad, 1, NULL), KVHAL_OUT_OF_RANGE, "pairs");
    CASE(kvhal_copy_blocks(&kc, 1, pairs_neg, 1, NULL), KVHAL_OUT_OF_RANGE, "pairs");
    CASE(kvhal_copy_blocks(NULL, 1, pairs_bad, 1, NULL), KVHAL_INVALID_ARGUMENT, "caches");
    CASE(kvhal_copy_blocks(&kc, 0, pairs_bad, 1, NULL), KVHAL_INVALID_ARGUMENT, "num_caches");
    CASE(kvhal_copy_blocks(&kc, 1, NULL, 1, NULL), KVHAL_INVALID_ARGUMENT, "pairs");
    /* pairs that would race on a device (pairs run in parallel there, in order on the CPU) */
    int64_t pairs_2w[4] = {0, 2, 1, 2}, pairs_rw[4] = {0, 1, 1, 3}, pairs_swap[4] = {0, 1, 1, 0};
    int64_t pairs_self_w[4] = {3, 3, 0, 3}, pairs_ok[8] = {0, 1, 0, 2, 3, 3, 0, 0};
    CASE(kvhal_copy_blocks(&kc, 1, pairs_2w, 2, NULL), KVHAL_INVALID_ARGUMENT, "pairs[3]");
    CASE(kvhal_copy_blocks(&kc, 1, pairs_rw, 2, NULL), KVHAL_INVALID_ARGUMENT, "pairs[2]");
    CASE(kvhal_copy_blocks(&kc, 1, pairs_swap, 2, NULL), KVHAL_INVALID_ARGUMENT, "pairs[0]");
    CASE(kvhal_copy_blocks(&kc, 1, pairs_self_w, 2, NULL), KVHAL_INVALID_ARGUMENT, "pairs[0]");
    CASE(kvhal_copy_blocks(&kc, 1, pairs_ok, 4, NULL), KVHAL_OK, NULL); /* repeated sources, self copies */
    int64_t many[2 * 100];
    for (int i = 0; i < 100; i++) many[2 * i] = 2, many[2 * i + 1] = 2;
    CASE(kvhal_copy_blocks(&kc, 1, many, 100, NULL), KVHAL_OK, NULL);
    many[2 * 70] = 1;
    CASE(kvhal_copy_blocks(&kc, 1, many, 100, NULL), KVHAL_INVALID_ARGUMENT, "source block 2");
    /* one block: its stride is never used, and a huge one must not overflow the byte stride (UBSan) */
    kvhal_tensor one_block;
    int64_t ob_shape[4] = {1, 8, 2, 16}, ob_strides[4] = {INT64_MAX - 5, 32, 16, 1};
    assert_int_equal(kvhal_tensor_make(cb, 0, KVHAL_F16, 4, ob_shape, ob_strides, &one_block), KVHAL_OK);
    CASE(kvhal_copy_blocks(&one_block, 1, (int64_t[]){0, 0}, 1, NULL), KVHAL_OK, NULL);
    CASE(kvhal_tensor_copy(&kin, &kin16, NULL), KVHAL_DTYPE_MISMATCH, "");
    CASE(kvhal_tensor_copy(&kc, &kin16, NULL), KVHAL_SHAPE_MISMATCH, "");
}

static void matrix_caches(void)
{
    kvhal_tensor t, v;
    /* ---- caches ---- */
    kvhal_kv_cache *kv;
    kvhal_kv_cache_config kcfg = {.struct_size = sizeof(kvhal_kv_cache_config), .num_layers = 2, .num_kv_heads = 3, .head_dim_k = 8, .head_dim_v = 8,
                                  .max_len = 16, .dtype = KVHAL_F16, .num_devices = 2,
                                  .devices = (kvhal_device[]){cpu, cpu}};
    CASE(kvhal_kv_cache_create(&kcfg, &kv), KVHAL_INVALID_ARGUMENT, "num_kv_heads");
    kcfg.num_devices = 1;
    kcfg.num_layers = 0;
    CASE(kvhal_kv_cache_create(&kcfg, &kv), KVHAL_INVALID_ARGUMENT, "num_layers");
    kcfg.num_layers = 2;
    kcfg.max_len = -1;
    CASE(kvhal_kv_cache_create(&kcfg, &kv), KVHAL_INVALID_ARGUMENT, "max_len");
    kcfg.max_len = 16;
    kcfg.devices = &bad_id;
    CASE(kvhal_kv_cache_create(&kcfg, &kv), KVHAL_NO_DEVICE, "cpu:3");
    kcfg.devices = &cpu;
    CASE(kvhal_kv_cache_create(NULL, &kv), KVHAL_INVALID_ARGUMENT, "cfg");
    assert_int_equal(kvhal_kv_cache_create(&kcfg, &kv), KVHAL_OK);
    kvhal_kv_cache *kv2;
    CASE(kvhal_kv_cache_duplicate(kv, 17, &kv2), KVHAL_OUT_OF_RANGE, "seq_len");
    CASE(kvhal_kv_cache_duplicate(kv, -1, &kv2), KVHAL_OUT_OF_RANGE, "seq_len");
    CASE(kvhal_kv_cache_layer(kv, 0, 2, &t, &v), KVHAL_OUT_OF_RANGE, "layer");
    CASE(kvhal_kv_cache_layer(kv, 1, 0, &t, &v), KVHAL_OUT_OF_RANGE, "device_index");
    assert_int_equal(kvhal_kv_cache_destroy(kv), KVHAL_OK);
    CASE(kvhal_kv_cache_destroy(kv), KVHAL_INVALID_HANDLE, "");
    CASE(kvhal_kv_cache_destroy(NULL), KVHAL_OK, "");
    /* Every destroy takes NULL like free(NULL). */
    CASE(kvhal_static_cache_destroy(NULL), KVHAL_OK, "");
    CASE(kvhal_paged_cache_destroy(NULL), KVHAL_OK, "");
    CASE(kvhal_block_pool_destroy(NULL), KVHAL_OK, "");
    CASE(kvhal_prefix_cache_destroy(NULL), KVHAL_OK, "");
    CASE(kvhal_cache_manager_destroy(NULL), KVHAL_OK, "");

    kvhal_static_cache *sc;
    kvhal_static_cache_config scfg = {.struct_size = sizeof(kvhal_static_cache_config), .num_layers = 2, .batch = 2, .num_heads_k = 2, .num_heads_v = 2,
                                      .head_dim_k = 16, .head_dim_v = 16, .max_len = 8, .dtype = KVHAL_F32,
                                      .device = cpu};
    scfg.batch = 0;
    CASE(kvhal_static_cache_create(&scfg, &sc), KVHAL_INVALID_ARGUMENT, "batch");
    /* batch * max_len * element size wraps to 4: must not create a 4-byte-per-element cache */
    scfg.batch = 4;
    scfg.max_len = ((int64_t)1 << 62) + 1;
    scfg.dtype = KVHAL_FP8_E4M3;
    CASE(kvhal_static_cache_create(&scfg, &sc), KVHAL_OUT_OF_RANGE, "cfg");
    scfg.max_len = 8;
    scfg.dtype = KVHAL_F32;
    scfg.batch = 2;
    assert_int_equal(kvhal_static_cache_create(&scfg, &sc), KVHAL_OK);
    kvhal_tensor sk, kh, vh;
    int64_t skshape[4] = {2, 2, 3, 16};
    assert_int_equal(kvhal_tensor_make(buf, 0, KVHAL_F32, 4, skshape, NULL, &sk), KVHAL_OK);
    CASE(kvhal_static_cache_update(sc, 2, &sk, &sk, 0, &kh, &vh, NULL), KVHAL_OUT_OF_RANGE, "layer");
    CASE(kvhal_static_cache_update(sc, -1, &sk, &sk, 0, &kh, &vh, NULL), KVHAL_OUT_OF_RANGE, "layer");
    CASE(kvhal_static_cache_update(sc, 0, &sk, &sk, 6, &kh, &vh, NULL), KVHAL_OUT_OF_RANGE, "cache_pos");
    CASE(kvhal_static_cache_update(sc, 0, &sk, &sk, -1, &kh, &vh, NULL), KVHAL_OUT_OF_RANGE, "cache_pos");
    int64_t wrong_batch[4] = {1, 2, 3, 16};
    kvhal_tensor skb;
    assert_int_equal(kvhal_tensor_make(buf, 0, KVHAL_F32, 4, wrong_batch, NULL, &skb), KVHAL_OK);
    CASE(kvhal_static_cache_update(sc, 0, &skb, &sk, 0, &kh, &vh, NULL), KVHAL_SHAPE_MISMATCH, "batch");
    CASE(kvhal_static_cache_update(sc, 0, &kin16, &sk, 0, &kh, &vh, NULL), KVHAL_SHAPE_MISMATCH, "k");
    assert_int_equal(kvhal_static_cache_destroy(sc), KVHAL_OK);

    kvhal_paged_cache *pc;
    kvhal_paged_cache_config pcfg = {.struct_size = sizeof(kvhal_paged_cache_config), .num_layers = 2, .num_heads = 2, .head_dim = 16, .block_size = 8,
                                     .dtype = KVHAL_F16, .memory_budget = 100, .device = cpu};
    CASE(kvhal_paged_cache_create(&pcfg, &pc), KVHAL_OUT_OF_MEMORY, "not enough memory for one block");
    pcfg.memory_budget = 1 << 20;
    pcfg.block_size = 0;
    CASE(kvhal_paged_cache_create(&pcfg, &pc), KVHAL_INVALID_ARGUMENT, "block_size");
    /* block_size * num_heads * head_dim = 2^64 wraps to 0 (was a division by zero) */
    pcfg.block_size = 1 << 20;
    pcfg.num_heads = 1 << 20;
    pcfg.head_dim = 1 << 24;
    CASE(kvhal_paged_cache_create(&pcfg, &pc), KVHAL_OUT_OF_RANGE, "overflows");
    pcfg.num_heads = 2;
    pcfg.head_dim = 16;
    pcfg.block_size = 8;
    pcfg.dtype = KVHAL_I32;
    CASE(kvhal_paged_cache_create(&pcfg, &pc), KVHAL_INVALID_ARGUMENT, "dtype");
    pcfg.dtype = KVHAL_F16;
    pcfg.layout = (kvhal_paged_layout)5;
    CASE(kvhal_paged_cache_create(&pcfg, &pc), KVHAL_INVALID_ARGUMENT, "layout");
    pcfg.layout = KVHAL_LAYOUT_NHD;
    assert_int_equal(kvhal_paged_cache_create(&pcfg, &pc), KVHAL_OK);
    CASE(kvhal_paged_cache_layer(pc, 2, &t, &v), KVHAL_OUT_OF_RANGE, "layer");
    CASE(kvhal_paged_cache_update(pc, 5, &kin16, &kin16, &slots, NULL), KVHAL_OUT_OF_RANGE, "layer");
    int64_t far_pairs[2] = {0, 1 << 30};
    CASE(kvhal_paged_cache_copy_blocks(pc, far_pairs, 1, NULL), KVHAL_OUT_OF_RANGE, "pairs");
    assert_int_equal(kvhal_paged_cache_destroy(pc), KVHAL_OK);
}

static void matrix_pools_prefix(void)
{
    /* ---- block pool, prefix cache, cache manager ---- */
    kvhal_block_pool *bp;
    int32_t blocks[8];
    CASE(kvhal_block_pool_create(0, &bp), KVHAL_INVALID_ARGUMENT, "num_blocks");
    CASE(kvhal_block_pool_create(-5, &bp), KVHAL_INVALID_ARGUMENT, "num_blocks");
    assert_int_equal(kvhal_block_pool_create(4, &bp), KVHAL_OK);
    CASE(kvhal_block_pool_allocate(bp, 5, blocks), KVHAL_OUT_OF_MEMORY, "");
    CASE(kvhal_block_pool_allocate(bp, -1, blocks), KVHAL_INVALID_ARGUMENT, "n");
    CASE(kvhal_block_pool_release(bp, 2), KVHAL_INVALID_ARGUMENT, "block");
    CASE(kvhal_block_pool_release(bp, 9), KVHAL_OUT_OF_RANGE, "block");
    CASE(kvhal_block_pool_share(bp, 0), KVHAL_INVALID_ARGUMENT, "block");
    assert_int_equal(kvhal_block_pool_destroy(bp), KVHAL_OK);
    CASE(kvhal_block_pool_destroy(bp), KVHAL_INVALID_HANDLE, "destroyed twice");

    kvhal_prefix_cache *px, *naive;
    CASE(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 0, &px), KVHAL_INVALID_ARGUMENT, "page_size");
    CASE(kvhal_prefix_cache_create((kvhal_prefix_kind)7, 1, &px), KVHAL_INVALID_ARGUMENT, "kind");
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 4, &px), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_NAIVE, 1, &naive), KVHAL_OK);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8}, pg[2] = {0, 1}, out[1];
    size_t already, cached, ev;
    kvhal_prefix_handle h;
    CASE(kvhal_prefix_insert(px, NULL, 8, pg, &already), KVHAL_INVALID_ARGUMENT, "tokens");
    CASE(kvhal_prefix_insert(px, toks, 8, NULL, &already), KVHAL_INVALID_ARGUMENT, "pages");
    assert_int_equal(kvhal_prefix_insert(px, toks, 8, pg, &already), KVHAL_OK);
    CASE(kvhal_prefix_match(px, toks, 8, &h, &cached, out, 1), KVHAL_OUT_OF_RANGE, "pages_cap");
    CASE(kvhal_prefix_unlock(px, 0), KVHAL_INVALID_ARGUMENT, "handle");
    CASE(kvhal_prefix_evict(naive, 1, NULL, NULL, &ev), KVHAL_UNSUPPORTED, "naive");
    CASE(kvhal_prefix_evict(naive, 0, NULL, NULL, &ev), KVHAL_OK, NULL);
    assert_int_equal(kvhal_prefix_cache_destroy(px), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(naive), KVHAL_OK);
    CASE(kvhal_prefix_cache_destroy(naive), KVHAL_INVALID_HANDLE, "destroyed twice");

    kvhal_cache_manager *cm;
    CASE(kvhal_cache_manager_create(0, 4, KVHAL_PREFIX_RADIX, &cm), KVHAL_INVALID_ARGUMENT, "total_pages");
    CASE(kvhal_cache_manager_create(8, 0, KVHAL_PREFIX_RADIX, &cm), KVHAL_INVALID_ARGUMENT, "page_size");
    assert_int_equal(kvhal_cache_manager_create(2, 4, KVHAL_PREFIX_RADIX, &cm), KVHAL_OK);
    int32_t three[3];
    CASE(kvhal_cache_manager_allocate(cm, 3, three), KVHAL_OUT_OF_MEMORY, "");
    assert_int_equal(kvhal_cache_manager_num_free(cm), 2); /* no partial allocation */
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
    CASE(kvhal_cache_manager_destroy(cm), KVHAL_INVALID_HANDLE, "destroyed twice");
}

static void matrix_desc_cache(void)
{
    /* ---- descriptor cache ---- */
    kvhal_desc_key key;
    kvhal_op_kind op;
    CASE(kvhal_desc_key_init(NULL, 0), KVHAL_INVALID_ARGUMENT, "key");
    CASE(kvhal_desc_op_register(NULL, NULL, NULL, &op), KVHAL_INVALID_ARGUMENT, "name");
    CASE(kvhal_desc_cache_set_capacity(9999, 4), KVHAL_INVALID_ARGUMENT, "op");
    assert_int_equal(kvhal_desc_key_init(&key, 0), KVHAL_OK);
    for (int i = 0; i < KVHAL_DESC_KEY_MAX_WORDS; i++) kvhal_desc_key_add_u64(&key, (uint64_t)i);
    CASE(kvhal_desc_key_add_u64(&key, 1), KVHAL_OUT_OF_RANGE, "key");
    void *d;
    CASE(kvhal_desc_cache_get(bad_id, &key, &d), KVHAL_NO_DEVICE, "cpu:3");
}

static void matrix_trace_lines(void)
{
    /* ---- kvhal-replay trace lines (the tool's parser): -1 with a message naming the field or position ---- */
    static const struct {
        const char *line, *needle;
    } bad_lines[] = {
        {"{\"input_length\": -5, \"output_length\": 1, \"hash_ids\": [1]}", "input_length"},
        {"{\"input_length\": 5, \"output_length\": \"x\", \"hash_ids\": [1]}", "output_length"},
        {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, }", "hash_ids"},
        {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": 7}", "hash_ids"},
        {"{\"input_length\": 99999999999999999999, \"output_length\": 1}", "input_length"},
        {"{\"input_length\": 5, \"output_length\": 1", "column"},
        {"[1, 2, 3]", "column"},
        {"{\"input_length\": 5} trailing", "column"},
        {"{\"timestamp\": nan, \"input_length\": 5}", "timestamp"},
    };
    for (size_t i = 0; i < sizeof bad_lines / sizeof bad_lines[0]; i++) {
        replay_trace_request req;
        int64_t *ids = NULL;
        size_t nids = 0, cap = 0;
        char err[256] = "";
        int r = replay_trace_parse_line(bad_lines[i].line, strlen(bad_lines[i].line), &req, &ids, &nids, &cap, err,
                                        sizeof err);
        free(ids);
        tried++;
        if (r == -1 && strstr(err, bad_lines[i].needle)) {
            passed++;
        } else {
            size_t len = strlen(failures);
            snprintf(failures + len, sizeof failures - len, "trace line %zu: %s\n  got %d \"%s\", want -1 naming %s\n",
                     i, bad_lines[i].line, r, err, bad_lines[i].needle);
        }
    }
}

static void test_matrix(void **state)
{
    (void)state;
    assert_int_equal(kvhal_buffer_create(cpu, 4096, &buf), KVHAL_OK);
    assert_int_equal(kvhal_buffer_create(cpu, 64, &small), KVHAL_OK);
    assert_int_equal(kvhal_buffer_create(cpu, 64, &dead), KVHAL_OK);
    assert_int_equal(kvhal_buffer_destroy(dead), KVHAL_OK);
    matrix_devices();
    matrix_buffers_streams();
    matrix_tensors();
    matrix_ops();
    matrix_caches();
    matrix_pools_prefix();
    matrix_desc_cache();
    matrix_trace_lines();
    kvhal_buffer_destroy(cb);
    kvhal_buffer_destroy(ib);
    kvhal_buffer_destroy(sb);
    kvhal_buffer_destroy(small);
    kvhal_buffer_destroy(buf);

    printf("bad-input matrix: %d cases tried, %d passed\n", tried, passed);
    if (passed != tried) fail_msg("%d of %d bad-input cases failed:\n%s", tried - passed, tried, failures);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matrix)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_opencl_build.c — the OpenCL backend's own suite: programs are built once per specialisation and context and
 * never again for a repeated call (counted by the module's kvhal_opencl_build_count hook), a failed build puts its
 * build log into kvhal_last_error, a machine with no OpenCL platform gives zero devices with the reason, device
 * info names platform and device, model-shaped paged caching takes the wide-access kernels for every dtype pair
 * (bit-exact against the host conversions), and a caller's cl_mem and command queue can be wrapped, also from a
 * cl_context of the caller's own. Tests skip when no OpenCL device (or module) is present. */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../backends/opencl/kvhal_opencl_test.h"
#include "kvhal.h"
#include "kvhal_test.h"

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#define HAVE_CL_HEADERS 1
#endif
#endif

#define OK(expr)                                                                                                \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());       \
    } while (0)

static kvhal_device dev = {KVHAL_DEVICE_OPENCL, 0};
static bool have_device;
static char module_path[1024];
static kvhal_opencl_build_count_fn build_count;
static kvhal_opencl_test_inject_source_fn inject_source;
static kvhal_opencl_test_gpu_plans_fn gpu_plans;
static kvhal_opencl_test_pool_fn pool;

static void need_device(void)
{
    if (!have_device) skip();
}

static void assert_contains(const char *haystack, const char *needle)
{
    const char *h = haystack ? haystack : "(null)"; /* also keeps gcc's -Wformat-overflow quiet under UBSan */
    if (!strstr(h, needle)) fail_msg("\"%s\" does not contain \"%s\"", h, needle);
}

/* ---- the paged-caching workload, checked element by element against the host conversions ---- */
typedef struct pc_case {
    int32_t heads, hd, block_size, num_blocks;
    int64_t tokens;
    size_t in_off;        /* bytes before k and v in their buffers (misaligned offsets take the any-alignment kernel) */
    kvhal_dtype in_dt;    /* 0 = f32 */
    kvhal_dtype cache_dt; /* 0 = f32 */
    bool hnd;             /* cache blocks stored [heads, block_size, dim] */
    float scale;          /* fp8 caches; 0 = 1 */
} pc_case;

typedef struct buf_maker {
    /* NULL: kvhal_buffer_create; else a function making a cl_mem of the caller's own and wrapping it */
    kvhal_status (*make)(size_t bytes, kvhal_buffer **out, void *user);
    void (*destroy)(kvhal_buffer *b, void *user);
    void *user;
    kvhal_stream *stream;
} buf_maker;

static kvhal_status make_buf(const buf_maker *m, size_t bytes, kvhal_buffer **out)
{
    if (m && m->make) return m->make(bytes, out, m->user);
    return kvhal_buffer_create(dev, bytes, out);
}

static void drop_buf(const buf_maker *m, kvhal_buffer *b)
{
    if (!b) return;
    if (m && m->destroy) m->destroy(b, m->user);
    else OK(kvhal_buffer_destroy(b));
}

static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

static void put_value(uint8_t *p, kvhal_dtype dt, float x)
{
    if (dt == KVHAL_F32) memcpy(p, &x, 4);
    else {
        uint16_t h = dt == KVHAL_F16 ? kvhal_f32_to_f16(x) : kvhal_f32_to_bf16(x);
        memcpy(p, &h, 2);
    }
}

static float get_value(const uint8_t *p, kvhal_dtype dt)
{
    float x;
    uint16_t h;
    if (dt == KVHAL_F32) {
        memcpy(&x, p, 4);
        return x;
    }
    memcpy(&h, p, 2);
    return dt == KVHAL_F16 ? kvhal_f16_to_f32(h) : kvhal_bf16_to_f32(h);
}

/* Runs one paged-caching call; with the call OK, checks every cache byte (written slots, untouched rest). */
static kvhal_status run_paged(const pc_case *c, const buf_maker *m)
{
    const kvhal_dtype in_dt = c->in_dt, cache_dt = c->cache_dt;
    const bool fp8 = cache_dt == KVHAL_FP8_E4M3 || cache_dt == KVHAL_FP8_E5M2;
    const float scale = fp8 && c->scale != 0.0f ? c->scale : 1.0f;
    const size_t ies = kvhal_dtype_size(in_dt), ces = kvhal_dtype_size(cache_dt);
    const int64_t row = (int64_t)c->heads * c->hd, nslots = (int64_t)c->num_blocks * c->block_size;
    const size_t cache_bytes = (size_t)(nslots * row) * ces, in_bytes = c->in_off + (size_t)(c->tokens * row) * ies;
    kvhal_stream *s = m ? m->stream : NULL;
    uint8_t *kin = malloc(in_bytes), *vin = malloc(in_bytes), *kc = malloc(cache_bytes), *vc = malloc(cache_bytes);
    uint8_t *ek = calloc(cache_bytes, 1), *ev = calloc(cache_bytes, 1);
    int64_t *slots = malloc((size_t)c->tokens * 8);
    assert_true(kin && vin && kc && vc && ek && ev && slots);
    uint32_t seed = (uint32_t)(c->hd * 131 + c->tokens);
    for (size_t i = 0; i + ies <= in_bytes; i += ies) {
        put_value(kin + i, in_dt, ((float)lcg(&seed) - 8388608.0f) / 65536.0f * scale);
        put_value(vin + i, in_dt, ((float)lcg(&seed) - 8388608.0f) / 16384.0f * scale);
    }
    /* distinct slots spread over the cache, one padding token */
    for (int64_t t = 0; t < c->tokens; t++) slots[t] = (t * 7 + 3) % nslots;
    if (c->tokens > 2) slots[1] = -1;

    /* cache strides of the logical [blocks, block_size, heads, dim] view */
    int64_t cst[4] = {c->block_size * row, row, c->hd, 1};
    if (c->hnd) cst[1] = c->hd, cst[2] = (int64_t)c->block_size * c->hd;
    for (int64_t t = 0; t < c->tokens; t++) {
        if (slots[t] < 0) continue;
        int64_t b = slots[t] / c->block_size, o = slots[t] % c->block_size;
        for (int64_t h = 0; h < c->heads; h++)
            for (int64_t d = 0; d < c->hd; d++) {
                size_t src = c->in_off + (size_t)(t * row + h * c->hd + d) * ies;
                size_t dst = (size_t)(b * cst[0] + o * cst[1] + h * cst[2] + d) * ces;
                if (!fp8) {
                    memcpy(ek + dst, kin + src, ies);
                    memcpy(ev + dst, vin + src, ies);
                } else {
                    ek[dst] = kvhal_f32_to_fp8(get_value(kin + src, in_dt) / scale, cache_dt);
                    ev[dst] = kvhal_f32_to_fp8(get_value(vin + src, in_dt) / scale, cache_dt);
                }
            }
    }

    kvhal_buffer *bk = NULL, *bv = NULL, *bkc = NULL, *bvc = NULL, *bs = NULL;
    OK(make_buf(m, in_bytes, &bk));
    OK(make_buf(m, in_bytes, &bv));
    OK(make_buf(m, cache_bytes, &bkc));
    OK(make_buf(m, cache_bytes, &bvc));
    OK(make_buf(m, (size_t)c->tokens * 8, &bs));
    OK(kvhal_memcpy_h2d(bk, 0, kin, in_bytes, s));
    OK(kvhal_memcpy_h2d(bv, 0, vin, in_bytes, s));
    OK(kvhal_memset(bkc, 0, 0, cache_bytes, s));
    OK(kvhal_memset(bvc, 0, 0, cache_bytes, s));
    OK(kvhal_memcpy_h2d(bs, 0, slots, (size_t)c->tokens * 8, s));

    kvhal_tensor tk, tv, tkc, tvc, ts;
    int64_t in_shape[3] = {c->tokens, c->heads, c->hd};
    int64_t cache_shape[4] = {c->num_blocks, c->block_size, c->heads, c->hd};
    int64_t slot_shape[1] = {c->tokens};
    OK(kvhal_tensor_make(bk, c->in_off, in_dt, 3, in_shape, NULL, &tk));
    OK(kvhal_tensor_make(bv, c->in_off, in_dt, 3, in_shape, NULL, &tv));
    OK(kvhal_tensor_make(bkc, 0, cache_dt, 4, cache_shape, cst, &tkc));
    OK(kvhal_tensor_make(bvc, 0, cache_dt, 4, cache_shape, cst, &tvc));
    OK(kvhal_tensor_make(bs, 0, KVHAL_I64, 1, slot_shape, NULL, &ts));
    kvhal_status st = kvhal_paged_caching(&tkc, &tvc, &tk, &tv, &ts, scale, scale, s);
    if (st == KVHAL_OK) {
        OK(kvhal_memcpy_d2h(kc, bkc, 0, cache_bytes, s));
        OK(kvhal_memcpy_d2h(vc, bvc, 0, cache_bytes, s));
        OK(kvhal_device_synchronize(dev));
        assert_memory_equal(kc, ek, cache_bytes);
        assert_memory_equal(vc, ev, cache_bytes);
    }
    drop_buf(m, bk);
    drop_buf(m, bv);
    drop_buf(m, bkc);
    drop_buf(m, bvc);
    drop_buf(m, bs);
    free(kin);
    free(vin);
    free(kc);
    free(vc);
    free(ek);
    free(ev);
    free(slots);
    return st;
}

/* ---- no platform: a child process started with OCL_ICD_VENDORS pointing nowhere ---- */
static int no_platform_child(void)
{
    int32_t n = -1;
    if (kvhal_device_count(KVHAL_DEVICE_OPENCL, &n) != KVHAL_OK) return 1;
    int32_t mods = 0;
    kvhal_backend_module_count(&mods);
    for (int32_t i = 0; i < mods; i++) {
        kvhal_backend_module_info info;
        if (kvhal_backend_module_get(i, &info) != KVHAL_OK || strcmp(info.name, "opencl") || !info.loaded) continue;
        if (n > 0) return 77; /* this ICD loader does not honour OCL_ICD_VENDORS */
        printf("reason: %s\n", info.reason);
        return info.device_count == 0 && strstr(info.reason, "no OpenCL platform") ? 0 : 2;
    }
    return 3; /* module did not load at all */
}

static void test_no_platform_gives_zero_devices_and_reason(void **state)
{
    (void)state;
    if (!module_path[0]) skip();
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("OCL_ICD_VENDORS", "/nonexistent-kvhal-test-vendors", 1);
        unsetenv("OCL_ICD_FILENAMES");
        execl("/proc/self/exe", "test_opencl_build", "--no-platform-child", (char *)NULL);
        _exit(4);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) skip(); /* the loader ignores OCL_ICD_VENDORS: nothing to test here */
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- device info ---- */
static void test_device_info_names_platform_and_device(void **state)
{
    (void)state;
    need_device();
    kvhal_device_info info;
    OK(kvhal_device_get_info(dev, &info));
    assert_string_equal(info.backend, "opencl");
    assert_true(info.name[0] != '\0');
    assert_true(info.platform[0] != '\0');
    assert_true(info.total_memory > 0);
    assert_true(info.compute_units > 0);
    assert_int_equal(info.device.type, KVHAL_DEVICE_OPENCL);
    assert_int_equal(info.device.id, 0);
}

/* ---- build counting ---- */
static void test_repeated_calls_never_rebuild(void **state)
{
    (void)state;
    need_device();
    pc_case m1 = {.heads = 3, .hd = 40, .block_size = 8, .num_blocks = 5, .tokens = 11};
    uint64_t c0 = build_count();
    OK(run_paged(&m1, NULL));
    assert_int_equal(build_count(), c0 + 1); /* first call: one build */
    for (int i = 0; i < 4; i++) OK(run_paged(&m1, NULL));
    assert_int_equal(build_count(), c0 + 1); /* cached descriptor: no build */

    /* Another token count is another descriptor (its key differs) with the same options: the program is shared. */
    pc_case m1b = m1;
    m1b.tokens = 7;
    OK(run_paged(&m1b, NULL));
    assert_int_equal(build_count(), c0 + 1);

    /* Descriptors gone: the next one finds the program in the module's cache. */
    OK(kvhal_desc_cache_clear(dev));
    OK(run_paged(&m1, NULL));
    assert_int_equal(build_count(), c0 + 1);

    /* A misaligned input offset runs the any-alignment kernel of the same program. */
    pc_case m1c = m1;
    m1c.in_off = 4;
    OK(run_paged(&m1c, NULL));
    assert_int_equal(build_count(), c0 + 1);

    /* A different specialisation (head_dim) builds once more, then never again. */
    pc_case m2 = m1;
    m2.hd = 24;
    OK(run_paged(&m2, NULL));
    assert_int_equal(build_count(), c0 + 2);
    OK(run_paged(&m2, NULL));
    OK(run_paged(&m1, NULL));
    assert_int_equal(build_count(), c0 + 2);

    kvhal_op_kind op;
    kvhal_desc_cache_stats stats;
    OK(kvhal_desc_op_find("paged_caching", &op));
    OK(kvhal_desc_cache_get_stats(dev, op, &stats));
    assert_true(stats.hits >= 5);
}

static void test_tensor_copy_and_copy_blocks_build_once(void **state)
{
    (void)state;
    need_device();
    /* tensor_copy of a transposed view (not contiguous: needs the kernel) */
    enum { R = 37, C = 29 };
    float host[R * C], out[R * C];
    for (int i = 0; i < R * C; i++) host[i] = (float)i * 0.5f;
    kvhal_buffer *a, *b;
    OK(kvhal_buffer_create(dev, sizeof host, &a));
    OK(kvhal_buffer_create(dev, sizeof host, &b));
    OK(kvhal_memcpy_h2d(a, 0, host, sizeof host, NULL));
    int64_t shape[2] = {C, R}, tstrides[2] = {1, C};
    kvhal_tensor src, dst;
    OK(kvhal_tensor_make(a, 0, KVHAL_F32, 2, shape, tstrides, &src));
    OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, NULL, &dst));
    uint64_t c0 = build_count();
    OK(kvhal_tensor_copy(&dst, &src, NULL));
    uint64_t c1 = build_count();
    assert_int_equal(c1, c0 + 1); /* nothing earlier in this process copied tensors */
    for (int i = 0; i < 3; i++) OK(kvhal_tensor_copy(&dst, &src, NULL));
    assert_int_equal(build_count(), c1);
    OK(kvhal_memcpy_d2h(out, b, 0, sizeof out, NULL));
    for (int j = 0; j < C; j++)
        for (int i = 0; i < R; i++) assert_true(out[j * R + i] == host[i * C + j]);

    /* copy_blocks over a [6 blocks, 3, 5] f32 cache */
    kvhal_tensor cache;
    int64_t cshape[3] = {6, 3, 5};
    kvhal_buffer *cb;
    float blocks[6 * 15], got[6 * 15];
    for (int i = 0; i < 6 * 15; i++) blocks[i] = (float)i;
    OK(kvhal_buffer_create(dev, sizeof blocks, &cb));
    OK(kvhal_memcpy_h2d(cb, 0, blocks, sizeof blocks, NULL));
    OK(kvhal_tensor_make(cb, 0, KVHAL_F32, 3, cshape, NULL, &cache));
    int64_t pairs[4] = {0, 5, 2, 1};
    uint64_t c2 = build_count();
    OK(kvhal_copy_blocks(&cache, 1, pairs, 2, NULL));
    uint64_t c3 = build_count();
    assert_int_equal(c3, c2 + 1);
    for (int i = 0; i < 3; i++) OK(kvhal_copy_blocks(&cache, 1, pairs, 2, NULL));
    assert_int_equal(build_count(), c3);
    OK(kvhal_memcpy_d2h(got, cb, 0, sizeof got, NULL));
    OK(kvhal_device_synchronize(dev));
    assert_memory_equal(got + 5 * 15, blocks + 0 * 15, 15 * 4);
    assert_memory_equal(got + 1 * 15, blocks + 2 * 15, 15 * 4);
    assert_memory_equal(got + 0 * 15, blocks + 0 * 15, 15 * 4);
    OK(kvhal_buffer_destroy(a));
    OK(kvhal_buffer_destroy(b));
    OK(kvhal_buffer_destroy(cb));
}

static void test_failed_build_reports_its_log(void **state)
{
    (void)state;
    need_device();
    pc_case m3 = {.heads = 2, .hd = 56, .block_size = 4, .num_blocks = 3, .tokens = 5};
    uint64_t c0 = build_count();
    inject_source("\nvoid kvhal_test_broken(void) { kvhal_undeclared_identifier = 1; }\n");
    kvhal_status st = run_paged(&m3, NULL);
    inject_source(NULL);
    assert_int_equal(st, KVHAL_BACKEND_ERROR);
    assert_int_equal(build_count(), c0 + 1);
    const char *msg = kvhal_last_error();
    assert_contains(msg, "CL_BUILD_PROGRAM_FAILURE");
    assert_contains(msg, "paged_caching.cl");
    assert_contains(msg, "build log");
    assert_contains(msg, "kvhal_undeclared_identifier"); /* from the compiler's own log */

    /* The failed build was not cached: without the injected text the same call builds and works, once. */
    OK(run_paged(&m3, NULL));
    assert_int_equal(build_count(), c0 + 2);
    OK(run_paged(&m3, NULL));
    assert_int_equal(build_count(), c0 + 2);
}

/* copy_blocks over more buffers than one launch takes (16), with blocks of different sizes in one launch, and
 * with a block size that is no multiple of 4 bytes (the byte-unit kernel); rounds 2 and 3 as planned for GPUs
 * (interleaved units per work-item). */
static void test_copy_blocks_many_buffers(void **state)
{
    (void)state;
    need_device();
    OK(kvhal_desc_cache_clear(dev));
    enum { NC = 21, NB = 5 };
    kvhal_buffer *bufs[NC];
    kvhal_tensor caches[NC];
    uint8_t *host[NC], *got = malloc(4096);
    size_t sizes[NC];
    int64_t pairs[6] = {0, 4, 3, 1, 3, 2}; /* no block is both a source and a destination: no order between pairs */
    assert_non_null(got);
    for (int round = 0; round < 4; round++) {
        if (round == 2) {
            OK(kvhal_desc_cache_clear(dev));
            gpu_plans(1);
        }
        for (int c = 0; c < NC; c++) {
            /* rounds 1 and 3 make the last cache f16 [NB, 3, 3]: 18-byte blocks */
            bool odd = (round & 1) && c == NC - 1;
            kvhal_dtype dt = odd ? KVHAL_F16 : KVHAL_F32;
            int64_t shape[3] = {NB, odd ? 3 : 3 + c % 3, odd ? 3 : 4};
            size_t off = 16 * (size_t)(c % 2);
            sizes[c] = off + (size_t)(shape[0] * shape[1] * shape[2]) * kvhal_dtype_size(dt);
            host[c] = malloc(sizes[c]);
            assert_non_null(host[c]);
            for (size_t i = 0; i < sizes[c]; i++) host[c][i] = (uint8_t)(i * 7 + c * 13 + round);
            OK(kvhal_buffer_create(dev, sizes[c], &bufs[c]));
            OK(kvhal_memcpy_h2d(bufs[c], 0, host[c], sizes[c], NULL));
            OK(kvhal_tensor_make(bufs[c], off, dt, 3, shape, NULL, &caches[c]));
        }
        OK(kvhal_copy_blocks(caches, NC, pairs, 3, NULL));
        OK(kvhal_device_synchronize(dev));
        for (int c = 0; c < NC; c++) {
            size_t off = caches[c].offset, bb = (size_t)caches[c].strides[0] * kvhal_dtype_size(caches[c].dtype);
            for (int p = 0; p < 3; p++)
                memmove(host[c] + off + (size_t)pairs[2 * p + 1] * bb, host[c] + off + (size_t)pairs[2 * p] * bb, bb);
            OK(kvhal_memcpy_d2h(got, bufs[c], 0, sizes[c], NULL));
            if (memcmp(got, host[c], sizes[c])) {
                gpu_plans(0);
                fail_msg("round %d: cache %d differs", round, c);
            }
            OK(kvhal_buffer_destroy(bufs[c]));
            free(host[c]);
        }
    }
    gpu_plans(0);
    OK(kvhal_desc_cache_clear(dev));
    free(got);
}

/* Threads have descriptor caches of their own; the module's program cache is shared: four threads calling with the
 * same new metadata at once build one program between them. */
enum { THREADS = 4 };
typedef struct thread_job {
    kvhal_tensor kc, vc, k, s;
    kvhal_status st;
} thread_job;

static void *thread_main(void *p)
{
    thread_job *j = p;
    j->st = kvhal_paged_caching(&j->kc, &j->vc, &j->k, &j->k, &j->s, 1.0f, 1.0f, NULL);
    if (j->st == KVHAL_OK) j->st = kvhal_paged_caching(&j->kc, &j->vc, &j->k, &j->k, &j->s, 1.0f, 1.0f, NULL);
    return NULL;
}

static void test_threads_share_one_build(void **state)
{
    (void)state;
    need_device();
    enum { T = 6, H = 2, D = 36, BS = 4, NB = 3, ROW = H * D };
    float in[T * ROW], out[NB * BS * ROW], want[NB * BS * ROW];
    int32_t slots[T] = {5, 0, -1, 11, 7, 2};
    for (int i = 0; i < T * ROW; i++) in[i] = (float)i + 0.25f;
    memset(want, 0, sizeof want);
    for (int t = 0; t < T; t++)
        if (slots[t] >= 0) memcpy(want + slots[t] * ROW, in + t * ROW, ROW * 4);
    kvhal_buffer *bufs[THREADS][4];
    thread_job jobs[THREADS];
    int64_t cshape[4] = {NB, BS, H, D}, ishape[3] = {T, H, D}, sshape[1] = {T};
    for (int j = 0; j < THREADS; j++) {
        OK(kvhal_buffer_create(dev, sizeof out, &bufs[j][0]));
        OK(kvhal_buffer_create(dev, sizeof out, &bufs[j][1]));
        OK(kvhal_buffer_create(dev, sizeof in, &bufs[j][2]));
        OK(kvhal_buffer_create(dev, sizeof slots, &bufs[j][3]));
        OK(kvhal_memset(bufs[j][0], 0, 0, sizeof out, NULL));
        OK(kvhal_memset(bufs[j][1], 0, 0, sizeof out, NULL));
        OK(kvhal_memcpy_h2d(bufs[j][2], 0, in, sizeof in, NULL));
        OK(kvhal_memcpy_h2d(bufs[j][3], 0, slots, sizeof slots, NULL));
        OK(kvhal_tensor_make(bufs[j][0], 0, KVHAL_F32, 4, cshape, NULL, &jobs[j].kc));
        OK(kvhal_tensor_make(bufs[j][1], 0, KVHAL_F32, 4, cshape, NULL, &jobs[j].vc));
        OK(kvhal_tensor_make(bufs[j][2], 0, KVHAL_F32, 3, ishape, NULL, &jobs[j].k));
        OK(kvhal_tensor_make(bufs[j][3], 0, KVHAL_I32, 1, sshape, NULL, &jobs[j].s));
    }
    uint64_t c0 = build_count();
    pthread_t th[THREADS];
    for (int j = 0; j < THREADS; j++) assert_int_equal(pthread_create(&th[j], NULL, thread_main, &jobs[j]), 0);
    for (int j = 0; j < THREADS; j++) assert_int_equal(pthread_join(th[j], NULL), 0);
    for (int j = 0; j < THREADS; j++)
        if (jobs[j].st != KVHAL_OK) fail_msg("thread %d: %s", j, kvhal_status_name(jobs[j].st));
    assert_int_equal(build_count(), c0 + 1);
    OK(kvhal_device_synchronize(dev));
    for (int j = 0; j < THREADS; j++) {
        for (int b = 0; b < 2; b++) {
            OK(kvhal_memcpy_d2h(out, bufs[j][b], 0, sizeof out, NULL));
            assert_memory_equal(out, want, sizeof out);
        }
        for (int b = 0; b < 4; b++) OK(kvhal_buffer_destroy(bufs[j][b]));
    }
}

/* Model shapes take the wide-access kernels (16-byte chunks; fp8 chunks of 16 elements); odd offsets the
 * any-alignment one. Every dtype pair the op takes, NHD and HND. */
static void test_model_shapes_every_dtype_pair(void **state)
{
    (void)state;
    need_device();
    static const kvhal_dtype ins[3] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16};
    for (int i = 0; i < 3; i++) {
        kvhal_dtype outs[3] = {ins[i], KVHAL_FP8_E4M3, KVHAL_FP8_E5M2};
        for (int o = 0; o < 3; o++)
            for (int hnd = 0; hnd < 2; hnd++) {
                pc_case c = {.heads = 4, .hd = hnd ? 64 : 128, .block_size = 16, .num_blocks = 9, .tokens = 77,
                             .in_dt = ins[i], .cache_dt = outs[o], .hnd = hnd, .scale = o == 1 ? 0.37f : 3.0f};
                OK(run_paged(&c, NULL));
                c.in_off = kvhal_dtype_size(ins[i]); /* one element in: not 16-byte aligned */
                OK(run_paged(&c, NULL));
            }
    }
}

/* The kernels as planned for GPUs (several chunks per work-item, interleaved across the head dim) on whatever
 * device this is, so that CI's PoCL checks them against the reference too; and scales of every mode. */
static void test_gpu_shaped_plans(void **state)
{
    (void)state;
    need_device();
    OK(kvhal_desc_cache_clear(dev));
    gpu_plans(1);
    static const kvhal_dtype ins[3] = {KVHAL_F32, KVHAL_F16, KVHAL_BF16};
    static const float scales[4] = {1.0f, 0.5f, 4.0f, 0.37f};
    for (int i = 0; i < 3; i++) {
        kvhal_dtype outs[3] = {ins[i], KVHAL_FP8_E4M3, KVHAL_FP8_E5M2};
        for (int o = 0; o < 3; o++)
            for (int hnd = 0; hnd < 2; hnd++)
                for (int sc = 0; sc < (o ? 4 : 1); sc++) {
                    pc_case c = {.heads = 3, .hd = hnd ? 64 : 128, .block_size = 16, .num_blocks = 9, .tokens = 61,
                                 .in_dt = ins[i], .cache_dt = outs[o], .hnd = hnd, .scale = scales[sc]};
                    kvhal_status st = run_paged(&c, NULL);
                    if (st != KVHAL_OK) gpu_plans(0);
                    OK(st);
                }
    }
    gpu_plans(0);
    OK(kvhal_desc_cache_clear(dev));
}

/* Every host or device allocation the module makes for a caller can fail (fault injection): the call then reports
 * KVHAL_OUT_OF_MEMORY with a message and leaves nothing behind (ASan's leak check runs this too). */
static kvhal_status fault_scenario(void)
{
    enum { CACHE = 2 * 4 * 3 * 8 }; /* elements of one [2 blocks, 4 slots, 3 heads, 8 dims] f32 cache */
    kvhal_status st = kvhal_desc_cache_clear(dev); /* so that descriptors are created (and allocate) every time */
    kvhal_buffer *cache = NULL, *in = NULL, *slots = NULL;
    kvhal_stream *s = NULL;
    kvhal_tensor kc, vc, k, ts, blocks;
    int64_t cshape[4] = {2, 4, 3, 8}, ishape[3] = {5, 3, 8}, sshape[1] = {5}, bshape[2] = {4, CACHE / 2};
    int32_t sl[5] = {0, 3, -1, 7, 2};
    int64_t pairs[2] = {0, 3};
    if (st == KVHAL_OK) st = kvhal_buffer_create(dev, 2 * CACHE * 4, &cache);
    if (st == KVHAL_OK) st = kvhal_buffer_create(dev, 5 * 3 * 8 * 4, &in);
    if (st == KVHAL_OK) st = kvhal_buffer_create(dev, sizeof sl, &slots);
    if (st == KVHAL_OK) st = kvhal_stream_create(dev, &s);
    if (st == KVHAL_OK) st = kvhal_memcpy_h2d(slots, 0, sl, sizeof sl, s);
    if (st == KVHAL_OK) st = kvhal_tensor_make(cache, 0, KVHAL_F32, 4, cshape, NULL, &kc);
    if (st == KVHAL_OK) st = kvhal_tensor_make(cache, CACHE * 4, KVHAL_F32, 4, cshape, NULL, &vc);
    if (st == KVHAL_OK) st = kvhal_tensor_make(in, 0, KVHAL_F32, 3, ishape, NULL, &k);
    if (st == KVHAL_OK) st = kvhal_tensor_make(slots, 0, KVHAL_I32, 1, sshape, NULL, &ts);
    if (st == KVHAL_OK) st = kvhal_tensor_make(cache, 0, KVHAL_F32, 2, bshape, NULL, &blocks);
    if (st == KVHAL_OK) st = kvhal_paged_caching(&kc, &vc, &k, &k, &ts, 1.0f, 1.0f, s);
    if (st == KVHAL_OK) st = kvhal_copy_blocks(&blocks, 1, pairs, 1, s);
    if (st == KVHAL_OK) st = kvhal_stream_synchronize(s);
    if (s) {
        kvhal_status st2 = kvhal_stream_destroy(s);
        if (st == KVHAL_OK) st = st2;
    }
    if (slots) OK(kvhal_buffer_destroy(slots));
    if (in) OK(kvhal_buffer_destroy(in));
    if (cache) OK(kvhal_buffer_destroy(cache));
    return st;
}

/* ---- the buffer pool (ocl_memory.c) ---- */
/* A destroyed buffer comes back for a create of its size and no other, works like a fresh one, and the pool holds
 * no more than its cap in bytes (a larger buffer is released, the oldest go first to make room) and 32 buffers. */
static void test_buffer_pool(void **state)
{
    (void)state;
    need_device();
    kvhal_device_info info;
    OK(kvhal_device_get_info(dev, &info));
    const int64_t default_cap = (int64_t)(info.total_memory / 16);
    const size_t n = 65536 + 17;
    unsigned char *pat = malloc(n), *back = malloc(n);
    assert_non_null(pat);
    assert_non_null(back);
    for (size_t i = 0; i < n; i++) pat[i] = (unsigned char)(i * 31u + 7u);

    const uint64_t h0 = pool(0, 1 << 20, -1); /* emptied, 1 MiB */
    kvhal_buffer *a, *b;
    OK(kvhal_buffer_create(dev, n, &a));
    void *na = kvhal_buffer_native(a);
    OK(kvhal_buffer_destroy(a)); /* kept */
    OK(kvhal_buffer_create(dev, n + 1, &b)); /* another size: a fresh buffer, not the kept one */
    assert_int_equal(pool(0, -1, -1), h0);
    assert_ptr_not_equal(kvhal_buffer_native(b), na);
    OK(kvhal_buffer_create(dev, n, &a)); /* its size: the kept one */
    assert_int_equal(pool(0, -1, -1), h0 + 1);
    assert_ptr_equal(kvhal_buffer_native(a), na);
    assert_int_equal(kvhal_buffer_size(a), n);
    OK(kvhal_memcpy_h2d(a, 0, pat, n, NULL));
    OK(kvhal_memcpy_d2d(b, 1, a, 0, n, NULL));
    OK(kvhal_memcpy_d2h(back, b, 1, n, NULL));
    assert_memory_equal(back, pat, n);
    OK(kvhal_buffer_destroy(a));
    OK(kvhal_buffer_destroy(b));

    /* the cap in bytes */
    const uint64_t h1 = pool(0, (int64_t)(3 * n), -1);
    OK(kvhal_buffer_create(dev, 4 * n, &a));
    OK(kvhal_buffer_destroy(a)); /* larger than the cap: released */
    OK(kvhal_buffer_create(dev, 4 * n, &a));
    assert_int_equal(pool(0, -1, -1), h1);
    OK(kvhal_buffer_destroy(a));
    (void)pool(0, (int64_t)(3 * n), -1); /* emptied */
    kvhal_buffer *x[3];
    for (int i = 0; i < 3; i++) OK(kvhal_buffer_create(dev, n + (size_t)i, &x[i]));
    for (int i = 0; i < 3; i++) OK(kvhal_buffer_destroy(x[i])); /* the third (3n + 3 bytes in all) drops the first */
    for (int i = 0; i < 3; i++) {
        const uint64_t before = pool(0, -1, -1);
        OK(kvhal_buffer_create(dev, n + (size_t)i, &x[i]));
        assert_int_equal(pool(0, -1, -1), before + (i > 0 ? 1 : 0));
    }
    for (int i = 0; i < 3; i++) OK(kvhal_buffer_destroy(x[i]));

    /* the count: 40 destroyed, the newest 32 kept */
    (void)pool(0, default_cap, -1);
    kvhal_buffer *many[40];
    for (int i = 0; i < 40; i++) OK(kvhal_buffer_create(dev, 256 * (size_t)(i + 1), &many[i]));
    for (int i = 0; i < 40; i++) OK(kvhal_buffer_destroy(many[i]));
    for (int i = 0; i < 40; i++) {
        const uint64_t before = pool(0, -1, -1);
        OK(kvhal_buffer_create(dev, 256 * (size_t)(i + 1), &many[i]));
        assert_int_equal(pool(0, -1, -1), before + (i >= 8 ? 1 : 0));
    }
    for (int i = 0; i < 40; i++) OK(kvhal_buffer_destroy(many[i]));
    /* a failed allocation releases the pool and tries once more; with nothing pooled it fails */
    (void)pool(0, default_cap, -1);
    OK(kvhal_buffer_create(dev, n, &a));
    OK(kvhal_buffer_destroy(a)); /* kept */
    const uint64_t h3 = pool(0, -1, 1); /* the next clCreateBuffer fails */
    OK(kvhal_buffer_create(dev, n + 1, &b)); /* fails, releases the kept buffer, succeeds on the retry */
    OK(kvhal_buffer_create(dev, n, &a)); /* the kept one is gone */
    assert_int_equal(pool(0, -1, -1), h3);
    OK(kvhal_buffer_destroy(a));
    OK(kvhal_buffer_destroy(b));
    (void)pool(0, default_cap, 1); /* emptied: no retry */
    assert_int_equal(kvhal_buffer_create(dev, n, &a), KVHAL_OUT_OF_MEMORY);
    assert_contains(kvhal_last_error(), "clCreateBuffer of a");
    OK(kvhal_buffer_create(dev, n, &a)); /* one failure only */
    OK(kvhal_buffer_destroy(a));
    (void)pool(0, default_cap, 0);
    free(pat);
    free(back);
}

static void test_allocation_failures_are_clean(void **state)
{
    (void)state;
    need_device();
    OK(fault_scenario()); /* builds the programs once, outside the walk */
    int64_t n = 1;
    for (;; n++) {
        kvhal_clear_error();
        kvhal_fault_inject_alloc(n);
        kvhal_status st = fault_scenario();
        int64_t used = kvhal_fault_alloc_count();
        kvhal_fault_inject_alloc(0);
        if (st == KVHAL_OK) {
            assert_true(used < n);
            break;
        }
        if (st != KVHAL_OUT_OF_MEMORY)
            fail_msg("fault at allocation %lld gave %s (%s)", (long long)n, kvhal_status_name(st), kvhal_last_error());
        assert_true(kvhal_last_error()[0] != '\0');
        assert_true(n < 1000);
    }
    assert_true(n > 8); /* buffers, stream, descriptors, kernels, copy_blocks table: all walked */
    printf("[ info     ] %lld allocation points walked\n", (long long)(n - 1));
    OK(kvhal_device_synchronize(dev));
}

/* ---- wrapping a caller's cl_mem and queue (OpenCL reached through dlopen: the test links no OpenCL) ---- */
#ifdef HAVE_CL_HEADERS
static struct {
    void *lib;
    __typeof__(&clGetMemObjectInfo) GetMemObjectInfo;
    __typeof__(&clGetContextInfo) GetContextInfo;
    __typeof__(&clGetDeviceInfo) GetDeviceInfo;
    __typeof__(&clCreateContext) CreateContext;
    __typeof__(&clCreateCommandQueue) CreateCommandQueue;
    __typeof__(&clCreateBuffer) CreateBuffer;
    __typeof__(&clEnqueueWriteBuffer) EnqueueWriteBuffer;
    __typeof__(&clEnqueueReadBuffer) EnqueueReadBuffer;
    __typeof__(&clFinish) Finish;
    __typeof__(&clReleaseMemObject) ReleaseMemObject;
    __typeof__(&clReleaseCommandQueue) ReleaseCommandQueue;
    __typeof__(&clReleaseContext) ReleaseContext;
} cl;

static bool load_cl(void)
{
    if (cl.lib) return true;
    cl.lib = dlopen("libOpenCL.so.1", RTLD_NOW);
    if (!cl.lib) return false;
#define SYM(name)                                                                                               \
    do {                                                                                                        \
        void *p = dlsym(cl.lib, "cl" #name);                                                                    \
        if (!p) return false;                                                                                   \
        memcpy(&cl.name, &p, sizeof p);                                                                         \
    } while (0)
    SYM(GetMemObjectInfo);
    SYM(GetContextInfo);
    SYM(GetDeviceInfo);
    SYM(CreateContext);
    SYM(CreateCommandQueue);
    SYM(CreateBuffer);
    SYM(EnqueueWriteBuffer);
    SYM(EnqueueReadBuffer);
    SYM(Finish);
    SYM(ReleaseMemObject);
    SYM(ReleaseCommandQueue);
    SYM(ReleaseContext);
#undef SYM
    return true;
}

/* kvhal's context for dev and the cl_device_id of dev in it (matched by name). */
static void kvhal_context(cl_context *ctx, cl_device_id *did)
{
    kvhal_buffer *b;
    OK(kvhal_buffer_create(dev, 64, &b));
    cl_mem m = kvhal_buffer_native(b);
    assert_int_equal(cl.GetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof *ctx, ctx, NULL), CL_SUCCESS);
    OK(kvhal_buffer_destroy(b));
    cl_device_id ids[16];
    size_t bytes = 0;
    assert_int_equal(cl.GetContextInfo(*ctx, CL_CONTEXT_DEVICES, sizeof ids, ids, &bytes), CL_SUCCESS);
    kvhal_device_info info;
    OK(kvhal_device_get_info(dev, &info));
    for (size_t i = 0; i < bytes / sizeof ids[0]; i++) {
        char name[256] = "";
        cl.GetDeviceInfo(ids[i], CL_DEVICE_NAME, sizeof name, name, NULL);
        if (!strcmp(name, info.name)) {
            *did = ids[i];
            return;
        }
    }
    fail_msg("device '%s' not found in kvhal's context", info.name);
}

static cl_uint refcount(cl_mem m)
{
    cl_uint n = 0;
    assert_int_equal(cl.GetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof n, &n, NULL), CL_SUCCESS);
    return n;
}

static void test_wrap_cl_mem_and_queue(void **state)
{
    (void)state;
    need_device();
    if (!load_cl()) skip();
    cl_context ctx;
    cl_device_id did;
    kvhal_context(&ctx, &did);
    cl_int err;
    cl_command_queue q = cl.CreateCommandQueue(ctx, did, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    enum { N = 4096 };
    unsigned char pattern[N], got[N];
    for (int i = 0; i < N; i++) pattern[i] = (unsigned char)(i * 13 + 1);
    cl_mem m = cl.CreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    assert_int_equal(cl.EnqueueWriteBuffer(q, m, CL_TRUE, 0, N, pattern, 0, NULL, NULL), CL_SUCCESS);

    cl_uint rc0 = refcount(m);
    kvhal_buffer *wb;
    kvhal_stream *ws;
    OK(kvhal_buffer_wrap(dev, m, N, &wb));
    assert_int_equal(refcount(m), rc0 + 1);
    assert_ptr_equal(kvhal_buffer_native(wb), m);
    OK(kvhal_stream_wrap(dev, q, &ws));
    assert_int_equal(kvhal_buffer_wrap(dev, m, N + 1, &(kvhal_buffer *){NULL}), KVHAL_OUT_OF_RANGE);

    OK(kvhal_memcpy_d2h(got, wb, 0, N, ws));
    assert_memory_equal(got, pattern, N);
    OK(kvhal_memset(wb, 100, 7, 50, ws));
    kvhal_buffer *kb;
    OK(kvhal_buffer_create(dev, N, &kb));
    OK(kvhal_memcpy_d2d(kb, 0, wb, 0, N, ws));
    OK(kvhal_stream_synchronize(ws));
    OK(kvhal_memcpy_d2h(got, kb, 0, N, NULL));
    memset(pattern + 100, 7, 50);
    assert_memory_equal(got, pattern, N);

    OK(kvhal_stream_destroy(ws));
    OK(kvhal_buffer_destroy(wb));
    assert_int_equal(refcount(m), rc0);
    /* The caller's queue and buffer are still theirs. */
    memset(got, 0, N);
    assert_int_equal(cl.EnqueueReadBuffer(q, m, CL_TRUE, 0, N, got, 0, NULL, NULL), CL_SUCCESS);
    assert_memory_equal(got, pattern, N);
    assert_int_equal(cl.Finish(q), CL_SUCCESS);
    OK(kvhal_buffer_destroy(kb));
    cl.ReleaseMemObject(m);
    cl.ReleaseCommandQueue(q);
}

typedef struct foreign {
    cl_context ctx;
    int made;
} foreign;

static kvhal_status foreign_make(size_t bytes, kvhal_buffer **out, void *user)
{
    foreign *f = user;
    cl_int err;
    cl_mem m = cl.CreateBuffer(f->ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) fail_msg("clCreateBuffer: %d", err);
    kvhal_status st = kvhal_buffer_wrap(dev, m, bytes, out);
    cl.ReleaseMemObject(m); /* the wrapper holds its own reference */
    f->made++;
    return st;
}

static void foreign_destroy(kvhal_buffer *b, void *user)
{
    (void)user;
    OK(kvhal_buffer_destroy(b));
}

static void test_wrap_from_a_context_of_the_callers_own(void **state)
{
    (void)state;
    need_device();
    if (!load_cl()) skip();
    cl_context kctx;
    cl_device_id did;
    kvhal_context(&kctx, &did);
    cl_int err;
    foreign f = {.ctx = cl.CreateContext(NULL, 1, &did, NULL, NULL, &err), .made = 0};
    assert_int_equal(err, CL_SUCCESS);
    cl_command_queue q = cl.CreateCommandQueue(f.ctx, did, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    kvhal_stream *ws;
    OK(kvhal_stream_wrap(dev, q, &ws));

    pc_case m = {.heads = 2, .hd = 20, .block_size = 4, .num_blocks = 6, .tokens = 9};
    OK(run_paged(&m, NULL)); /* built (or found) in kvhal's own context */
    uint64_t c0 = build_count();
    buf_maker bm = {.make = foreign_make, .destroy = foreign_destroy, .user = &f, .stream = ws};
    OK(run_paged(&m, &bm)); /* a program belongs to one context: one more build */
    assert_int_equal(build_count(), c0 + 1);
    assert_true(f.made > 0);
    OK(run_paged(&m, &bm));
    bm.stream = NULL; /* default queue of the caller's context */
    OK(run_paged(&m, &bm));
    assert_int_equal(build_count(), c0 + 1);

    /* A buffer of the caller's context on a queue of kvhal's context is refused, not crashed into. */
    kvhal_buffer *fb;
    kvhal_stream *ks;
    OK(foreign_make(64, &fb, &f));
    OK(kvhal_stream_create(dev, &ks));
    unsigned char tmp[64];
    assert_int_equal(kvhal_memcpy_d2h(tmp, fb, 0, sizeof tmp, ks), KVHAL_DEVICE_MISMATCH);
    assert_contains(kvhal_last_error(), "cl_context");
    OK(kvhal_device_synchronize(dev));

    /* Events across the two contexts: one recorded on the caller's queue and waited for by a stream of kvhal's
     * context (a marker of another context: the host waits); one recorded on the default stream (a marker on each
     * context's default queue) and waited for by the caller's queue (a barrier for its own context's marker, a host
     * wait for the other); the copy behind each wait sees the bytes written before the event. */
    kvhal_event *e;
    OK(kvhal_event_create(dev, &e));
    kvhal_buffer *kb;
    OK(kvhal_buffer_create(dev, sizeof tmp, &kb));
    unsigned char pat[64], got[64];
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < sizeof pat; i++) pat[i] = (unsigned char)(i * 7 + 3 + round);
        OK(kvhal_memcpy_h2d(round ? kb : fb, 0, pat, sizeof pat, round ? NULL : ws));
        OK(kvhal_event_record(e, round ? NULL : ws));
        OK(kvhal_stream_wait_event(round ? ws : ks, e));
        memset(got, 0, sizeof got);
        OK(kvhal_memcpy_d2h(got, round ? kb : fb, 0, sizeof got, round ? NULL : ws));
        OK(kvhal_event_synchronize(e));
        OK(kvhal_event_query(e));
        assert_memory_equal(got, pat, sizeof pat);
    }
    OK(kvhal_buffer_destroy(kb));
    OK(kvhal_event_destroy(e));
    OK(kvhal_stream_destroy(ks));
    OK(kvhal_buffer_destroy(fb));
    OK(kvhal_stream_destroy(ws));
    cl.ReleaseCommandQueue(q);
    cl.ReleaseContext(f.ctx);
}
#else
static void test_wrap_cl_mem_and_queue(void **state)
{
    (void)state;
    skip(); /* built without OpenCL headers */
}
static void test_wrap_from_a_context_of_the_callers_own(void **state)
{
    (void)state;
    skip();
}
#endif

static int setup(void **state)
{
    (void)state;
    int32_t n = 0;
    if (kvhal_device_count(KVHAL_DEVICE_OPENCL, &n) != KVHAL_OK) return -1;
    int32_t mods = 0;
    kvhal_backend_module_count(&mods);
    for (int32_t i = 0; i < mods; i++) {
        kvhal_backend_module_info info;
        if (kvhal_backend_module_get(i, &info) == KVHAL_OK && !strcmp(info.name, "opencl") && info.loaded) {
            snprintf(module_path, sizeof module_path, "%s", info.path);
            break;
        }
    }
    if (n < 1 || !module_path[0]) return 0;
    /* The hooks of the module the library loaded, by name through its get_proc_address. */
    void *p1 = NULL, *p2 = NULL, *p3 = NULL, *p4 = NULL;
    if (kvhal_backend_get_proc_address(KVHAL_DEVICE_OPENCL, "kvhal_opencl_build_count", &p1) != KVHAL_OK ||
        kvhal_backend_get_proc_address(KVHAL_DEVICE_OPENCL, "kvhal_opencl_test_inject_source", &p2) != KVHAL_OK ||
        kvhal_backend_get_proc_address(KVHAL_DEVICE_OPENCL, "kvhal_opencl_test_gpu_plans", &p3) != KVHAL_OK ||
        kvhal_backend_get_proc_address(KVHAL_DEVICE_OPENCL, "kvhal_opencl_test_pool", &p4) != KVHAL_OK) {
        fprintf(stderr, "%s lacks its test hooks: %s\n", module_path, kvhal_last_error());
        return -1;
    }
    memcpy(&build_count, &p1, sizeof p1);
    memcpy(&inject_source, &p2, sizeof p2);
    memcpy(&gpu_plans, &p3, sizeof p3);
    memcpy(&pool, &p4, sizeof p4);
    have_device = true;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--no-platform-child")) return no_platform_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_platform_gives_zero_devices_and_reason),
        cmocka_unit_test(test_device_info_names_platform_and_device),
        cmocka_unit_test(test_repeated_calls_never_rebuild),
        cmocka_unit_test(test_tensor_copy_and_copy_blocks_build_once),
        cmocka_unit_test(test_failed_build_reports_its_log),
        cmocka_unit_test(test_copy_blocks_many_buffers),
        cmocka_unit_test(test_threads_share_one_build),
        cmocka_unit_test(test_model_shapes_every_dtype_pair),
        cmocka_unit_test(test_gpu_shaped_plans),
        cmocka_unit_test(test_buffer_pool),
        cmocka_unit_test(test_allocation_failures_are_clean),
        cmocka_unit_test(test_wrap_cl_mem_and_queue),
        cmocka_unit_test(test_wrap_from_a_context_of_the_callers_own),
    };
    return cmocka_run_group_tests_name("opencl", tests, setup, NULL);
}

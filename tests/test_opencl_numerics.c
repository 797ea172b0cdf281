/* test_opencl_numerics.c — the OpenCL kernels' number conversions (backends/opencl/kv_common.cl, compiled at run time
 * from OpenCL C, so they cannot include kvhal_numerics.h) against the header, bit for bit: a small kernel over
 * kv_common.cl runs on the first OpenCL device (PoCL in CI) and encodes f32 to f16, bf16 and the four fp8 formats,
 * scalar and (fp8, f16 loads) eight at a time, for every sign, exponent and top 7 mantissa bits with low halves at
 * and around every rounding boundary, plus random and special inputs; and decodes every f16, bf16 and fp8 code.
 * Skipped (77) without an OpenCL device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include "kvhal_numerics.h"

#ifndef KVHAL_CL_COMMON
#error KVHAL_CL_COMMON: the path of backends/opencl/kv_common.cl
#endif

/* Per input u: out[3i] = f16 | bf16 << 16; out[3i+1] = e4m3fn | e5m2 << 8 | e4m3fnuz << 16 | e5m2fnuz << 24 (the
 * scalar kv_encode); out[3i+2] = e4m3fn | e5m2 << 8 of kv_f32_to_fp8_8 (the CPU plans' vector encoder). Per code c
 * (65536): dec[8c..] = kv_decode of c as f16, bf16, kv_f16_to_f32_8, and of c & 0xff as the four fp8 formats. */
static const char test_kernels[] =
    "kernel void enc(global const uint *in, global uint *out)\n"
    "{\n"
    "    const size_t g = get_global_id(0);\n"
    "    const uint8 u = vload8(g, in);\n"
    "    const float8 x = as_float8(u);\n"
    "    const uint8 v4 = kv_f32_to_fp8_8(x, 3, 7, 0x7eu), v5 = kv_f32_to_fp8_8(x, 2, 15, 0x7bu);\n"
    "    const uint a4[8] = {v4.s0, v4.s1, v4.s2, v4.s3, v4.s4, v4.s5, v4.s6, v4.s7};\n"
    "    const uint a5[8] = {v5.s0, v5.s1, v5.s2, v5.s3, v5.s4, v5.s5, v5.s6, v5.s7};\n"
    "    for (int k = 0; k < 8; k++) {\n"
    "        const size_t i = 8 * g + k;\n"
    "        const float f = as_float(in[i]);\n"
    "        out[3 * i] = kv_encode(f, KV_F16) | kv_encode(f, KV_BF16) << 16;\n"
    "        out[3 * i + 1] = kv_encode(f, KV_E4M3) | kv_encode(f, KV_E5M2) << 8 | kv_encode(f, KV_E4M3FNUZ) << 16 |\n"
    "                         kv_encode(f, KV_E5M2FNUZ) << 24;\n"
    "        out[3 * i + 2] = a4[k] | a5[k] << 8;\n"
    "    }\n"
    "}\n"
    "kernel void dec(global uint *out)\n"
    "{\n"
    "    const uint c = (uint)get_global_id(0);\n"
    "    global uint *o = out + 8 * (size_t)c;\n"
    "    o[0] = as_uint(kv_decode(c, KV_F16));\n"
    "    o[1] = as_uint(kv_decode(c, KV_BF16));\n"
    "    o[2] = as_uint(kv_f16_to_f32_8((uint8)c).s3);\n"
    "    o[3] = as_uint(kv_decode(c & 0xffu, KV_E4M3));\n"
    "    o[4] = as_uint(kv_decode(c & 0xffu, KV_E5M2));\n"
    "    o[5] = as_uint(kv_decode(c & 0xffu, KV_E4M3FNUZ));\n"
    "    o[6] = as_uint(kv_decode(c & 0xffu, KV_E5M2FNUZ));\n"
    "    o[7] = 0;\n"
    "}\n";

typedef struct {
    cl_context ctx;
    cl_command_queue q;
    cl_program prog;
    cl_device_id dev;
} cl_env;

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)size + 1);
    if (s && fread(s, 1, (size_t)size, f) != (size_t)size) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) s[size] = '\0';
    *n = (size_t)size;
    return s;
}

static int setup(void **state)
{
    static cl_env env;
    cl_platform_id plats[8];
    cl_uint np = 0;
    if (clGetPlatformIDs(8, plats, &np) != CL_SUCCESS || np == 0) return 0;
    for (cl_uint i = 0; i < np && !env.dev; i++) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, &env.dev, &nd) != CL_SUCCESS || nd == 0) env.dev = NULL;
    }
    if (!env.dev) return 0;
    cl_int err;
    env.ctx = clCreateContext(NULL, 1, &env.dev, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    env.q = clCreateCommandQueue(env.ctx, env.dev, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    size_t n = 0;
    char *common = read_file(KVHAL_CL_COMMON, &n);
    assert_non_null(common);
    const char *srcs[2] = {common, test_kernels};
    env.prog = clCreateProgramWithSource(env.ctx, 2, srcs, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    err = clBuildProgram(env.prog, 1, &env.dev, "-cl-std=CL1.2", NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[8192] = "";
        clGetProgramBuildInfo(env.prog, env.dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        fail_msg("clBuildProgram: %d\n%s", (int)err, log);
    }
    free(common);
    *state = &env;
    return 0;
}

static int teardown(void **state)
{
    cl_env *env = *state;
    if (!env) return 0;
    clReleaseProgram(env->prog);
    clReleaseCommandQueue(env->q);
    clReleaseContext(env->ctx);
    return 0;
}

/* Runs kernel name over items work-items with in (NULL: none) and an output of out_words; returns the output. */
static uint32_t *run(cl_env *env, const char *name, const uint32_t *in, size_t in_words, size_t items,
                     size_t out_words)
{
    cl_int err;
    cl_kernel k = clCreateKernel(env->prog, name, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem out = clCreateBuffer(env->ctx, CL_MEM_WRITE_ONLY, out_words * 4, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_mem inb = NULL;
    cl_uint arg = 0;
    if (in) {
        inb = clCreateBuffer(env->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, in_words * 4, (void *)in, &err);
        assert_int_equal(err, CL_SUCCESS);
        assert_int_equal(clSetKernelArg(k, arg++, sizeof inb, &inb), CL_SUCCESS);
    }
    assert_int_equal(clSetKernelArg(k, arg, sizeof out, &out), CL_SUCCESS);
    assert_int_equal(clEnqueueNDRangeKernel(env->q, k, 1, NULL, &items, NULL, 0, NULL, NULL), CL_SUCCESS);
    uint32_t *host = malloc(out_words * 4);
    assert_non_null(host);
    assert_int_equal(clEnqueueReadBuffer(env->q, out, CL_TRUE, 0, out_words * 4, host, 0, NULL, NULL), CL_SUCCESS);
    if (inb) clReleaseMemObject(inb);
    clReleaseMemObject(out);
    clReleaseKernel(k);
    return host;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545f4914f6cdd1dull) >> 32);
}

static void test_encode(void **state)
{
    cl_env *env = *state;
    if (!env) skip();
    /* the low halves around every rounding position of f16 (bit 12 rounds, bit 13 is the kept lsb), bf16 (bit 15)
     * and, for fp8, in the top half (bits 16 and up) */
    static const uint32_t lows[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                                    0x3001, 0x7fff, 0x8000, 0x8001, 0x9000, 0xc000, 0xefff, 0xffff};
    static const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                        0xffc00001u, 0x7f800001u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u,
                                        0x807fffffu, 0x43e00000u, 0x43f00000u, 0x47600000u, 0x47700000u,
                                        0x3a800000u, 0x37800000u, 0x477fefffu, 0x477ff000u, 0x33800000u};
    const size_t nl = sizeof lows / sizeof lows[0], ns = sizeof specials / sizeof specials[0];
    const size_t n = ((65536 * nl + (1u << 20) + ns) + 7) / 8 * 8;
    uint32_t *in = malloc(n * 4);
    assert_non_null(in);
    size_t m = 0;
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t j = 0; j < nl; j++) in[m++] = hi << 16 | lows[j];
    for (size_t j = 0; j < ns; j++) in[m++] = specials[j];
    while (m < n) in[m++] = rnd();
    uint32_t *out = run(env, "enc", in, n, n / 8, 3 * n);
    size_t bad = 0;
    for (size_t i = 0; i < n && bad < 10; i++) {
        const float x = kvhal_num_bits_f32(in[i]);
        const uint32_t w0 = (uint32_t)kvhal_num_f32_to_f16(x) | (uint32_t)kvhal_num_f32_to_bf16(x) << 16;
        const uint32_t w1 = (uint32_t)kvhal_num_f32_to_e4m3fn(x) | (uint32_t)kvhal_num_f32_to_e5m2(x) << 8 |
                            (uint32_t)kvhal_num_f32_to_e4m3fnuz(x) << 16 | (uint32_t)kvhal_num_f32_to_e5m2fnuz(x) << 24;
        const uint32_t w2 = w1 & 0xffffu;
        if (out[3 * i] != w0 || out[3 * i + 1] != w1 || out[3 * i + 2] != w2) {
            print_error("f32 0x%08x: OpenCL f16|bf16 0x%08x fp8 0x%08x fp8x8 0x%04x, header 0x%08x 0x%08x 0x%04x\n",
                        (unsigned)in[i], (unsigned)out[3 * i], (unsigned)out[3 * i + 1], (unsigned)out[3 * i + 2],
                        (unsigned)w0, (unsigned)w1, (unsigned)w2);
            bad++;
        }
    }
    free(out);
    free(in);
    if (bad) fail_msg("%s", "OpenCL encoders differ from kvhal_numerics.h");
}

static void test_decode(void **state)
{
    cl_env *env = *state;
    if (!env) skip();
    uint32_t *out = run(env, "dec", NULL, 0, 65536, 8 * 65536);
    size_t bad = 0;
    for (uint32_t c = 0; c < 65536 && bad < 10; c++) {
        const uint8_t b = (uint8_t)c;
        const uint32_t want[7] = {
            kvhal_num_f32_bits(kvhal_num_f16_to_f32((uint16_t)c)), kvhal_num_f32_bits(kvhal_num_bf16_to_f32((uint16_t)c)),
            kvhal_num_f32_bits(kvhal_num_f16_to_f32((uint16_t)c)), kvhal_num_f32_bits(kvhal_num_e4m3fn_to_f32(b)),
            kvhal_num_f32_bits(kvhal_num_e5m2_to_f32(b)),         kvhal_num_f32_bits(kvhal_num_e4m3fnuz_to_f32(b)),
            kvhal_num_f32_bits(kvhal_num_e5m2fnuz_to_f32(b))};
        for (int k = 0; k < 7; k++)
            if (out[8 * c + (uint32_t)k] != want[k]) {
                print_error("code 0x%04x, decoder %d: OpenCL 0x%08x, header 0x%08x\n", (unsigned)c, k,
                            (unsigned)out[8 * c + (uint32_t)k], (unsigned)want[k]);
                bad++;
            }
    }
    free(out);
    if (bad) fail_msg("%s", "OpenCL decoders differ from kvhal_numerics.h");
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_encode), cmocka_unit_test(test_decode)};
    return cmocka_run_group_tests(tests, setup, teardown);
}

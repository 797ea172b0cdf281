/* numerics_check.c — <kvhal/kvhal_numerics.h> compiled here, as a vendor's module or a C++ program compiles it, against
 * the library's exported conversions (kvhal_f32_to_fp8 & co. in libkvhal): every f16, bf16 and fp8 code decoded, and
 * f32 encoded into f16, bf16 and the four fp8 formats. The build compiles this file twice, as C and as C++.
 *
 * Encoding inputs: by default every one of the 2^24 values of an f32's upper 24 bits (sign, exponent, the top 15
 * mantissa bits) with each of the low bytes 0x00, 0x01, 0x7f, 0x80, 0x81, 0xff. Every format here rounds at bit 13 of
 * the f32 mantissa or above, so the low byte only ever counts as "some bits below the rounding point" (sticky):
 * these six cover it zero, non-zero, at and around the middle. --all checks all 2^32 inputs (about 20 s of CPU per
 * format: suite long runs it for each format, --format=NAME picking one). Exit status 0 all equal, 1 a difference (the first ones printed), 2 usage. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"
#include "kvhal_numerics.h"

typedef uint32_t (*enc_fn)(float x);

static uint32_t lib_f16(float x) { return kvhal_f32_to_f16(x); }
static uint32_t lib_bf16(float x) { return kvhal_f32_to_bf16(x); }
static uint32_t lib_e4m3(float x) { return kvhal_f32_to_fp8(x, KVHAL_FP8_E4M3); }
static uint32_t lib_e5m2(float x) { return kvhal_f32_to_fp8(x, KVHAL_FP8_E5M2); }
static uint32_t lib_e4m3fnuz(float x) { return kvhal_f32_to_fp8(x, KVHAL_FP8_E4M3FNUZ); }
static uint32_t lib_e5m2fnuz(float x) { return kvhal_f32_to_fp8(x, KVHAL_FP8_E5M2FNUZ); }
static uint32_t hdr_f16(float x) { return kvhal_num_f32_to_f16(x); }
static uint32_t hdr_bf16(float x) { return kvhal_num_f32_to_bf16(x); }
static uint32_t hdr_e4m3(float x) { return kvhal_num_f32_to_e4m3fn(x); }
static uint32_t hdr_e5m2(float x) { return kvhal_num_f32_to_e5m2(x); }
static uint32_t hdr_e4m3fnuz(float x) { return kvhal_num_f32_to_e4m3fnuz(x); }
static uint32_t hdr_e5m2fnuz(float x) { return kvhal_num_f32_to_e5m2fnuz(x); }

static const struct {
    const char *name;
    enc_fn lib, hdr;
} encoders[] = {
    {"f16", lib_f16, hdr_f16},         {"bf16", lib_bf16, hdr_bf16},
    {"fp8_e4m3", lib_e4m3, hdr_e4m3},  {"fp8_e5m2", lib_e5m2, hdr_e5m2},
    {"fp8_e4m3fnuz", lib_e4m3fnuz, hdr_e4m3fnuz}, {"fp8_e5m2fnuz", lib_e5m2fnuz, hdr_e5m2fnuz},
};

static unsigned long long failures;

static void mismatch(const char *what, uint32_t in, uint32_t got, uint32_t want)
{
    if (failures++ < 10) printf("MISMATCH %s of 0x%08x: header 0x%x, library 0x%x\n", what, in, got, want);
}

/* bit-equal floats (NaN payloads included) */
static int same_float(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void check_decodes(void)
{
    static const kvhal_dtype fp8[4] = {KVHAL_FP8_E4M3, KVHAL_FP8_E5M2, KVHAL_FP8_E4M3FNUZ, KVHAL_FP8_E5M2FNUZ};
    for (uint32_t c = 0; c < 256; c++) {
        const float hdr[4] = {kvhal_num_e4m3fn_to_f32((uint8_t)c), kvhal_num_e5m2_to_f32((uint8_t)c),
                              kvhal_num_e4m3fnuz_to_f32((uint8_t)c), kvhal_num_e5m2fnuz_to_f32((uint8_t)c)};
        for (int f = 0; f < 4; f++) {
            const float lib = kvhal_fp8_to_f32((uint8_t)c, fp8[f]);
            if (!same_float(hdr[f], lib)) mismatch(kvhal_dtype_name(fp8[f]), c, kvhal_num_f32_bits(hdr[f]),
                                                   kvhal_num_f32_bits(lib));
        }
    }
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kvhal_num_f16_to_f32((uint16_t)h), b = kvhal_f16_to_f32((uint16_t)h);
        if (!same_float(a, b)) mismatch("f16 decode", h, kvhal_num_f32_bits(a), kvhal_num_f32_bits(b));
        a = kvhal_num_bf16_to_f32((uint16_t)h), b = kvhal_bf16_to_f32((uint16_t)h);
        if (!same_float(a, b)) mismatch("bf16 decode", h, kvhal_num_f32_bits(a), kvhal_num_f32_bits(b));
    }
}

static unsigned long long check_encoder(size_t e, int all)
{
    static const uint32_t low[6] = {0x00, 0x01, 0x7f, 0x80, 0x81, 0xff};
    unsigned long long n = 0;
    for (uint64_t hi = 0; hi < (1ull << 24); hi++) {
        for (uint32_t l = 0; l < (all ? 256u : 6u); l++) {
            const uint32_t u = (uint32_t)(hi << 8) | (all ? l : low[l]);
            const float x = kvhal_num_bits_f32(u);
            const uint32_t got = encoders[e].hdr(x), want = encoders[e].lib(x);
            if (got != want) mismatch(encoders[e].name, u, got, want);
            n++;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    int all = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--all")) all = 1;
        else if (!strncmp(argv[i], "--format=", 9)) only = argv[i] + 9;
        else {
            fprintf(stderr, "numerics_check: error: unknown argument '%s' (usage: numerics_check [--all] "
                            "[--format=f16|bf16|fp8_e4m3|fp8_e5m2|fp8_e4m3fnuz|fp8_e5m2fnuz])\n", argv[i]);
            return 2;
        }
    }
    int known = only == NULL;
    for (size_t e = 0; e < sizeof encoders / sizeof encoders[0]; e++) known |= only && !strcmp(only, encoders[e].name);
    if (!known) {
        fprintf(stderr, "numerics_check: error: --format=%s: not a format\n", only);
        return 2;
    }
#ifdef __cplusplus
    const char *lang = "C++";
#else
    const char *lang = "C";
#endif
    check_decodes();
    printf("%s: every f16, bf16 and fp8 code decodes as libkvhal does%s\n", lang, failures ? ": NO" : "");
    for (size_t e = 0; e < sizeof encoders / sizeof encoders[0]; e++) {
        if (only && strcmp(only, encoders[e].name)) continue;
        const unsigned long long before = failures, n = check_encoder(e, all);
        printf("%s: f32 -> %s: %llu inputs, %s\n", lang, encoders[e].name, n,
               failures == before ? "all equal to libkvhal" : "DIFFERENCES");
    }
    return failures ? 1 : 0;
}

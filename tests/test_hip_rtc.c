/* test_hip_rtc.c — the HIP module's run-time compiler (gpu_codepath.cu, reached through the module's extra
 * "kvhal_hip_rtc_compile"), with no AMD GPU: hiprtc compiles the kernel source embedded in the module for gfx90a
 * (wave64) and gfx1030 (wave32), and each code object is checked as the build-time ones are
 * (backends/gpu/check_hip_code_objects.sh): an AMDGPU ELF for that processor (EF_AMDGPU_MACH) holding every kernel
 * family; and every kernel instantiation the module's ops can ask for (the module's own list, spelled as the
 * descriptors spell them) compiles, one kernel per expression; the module's disk-cache path with the real
 * compiler and runtime version (compiled, read back, a corrupted file rebuilt). A target this ROCm's hiprtc cannot compile for
 * (gfx940 with Debian 12's HIP 5.2, which would crash inside hiprtc) is refused with a message naming it. The code objects are written to $KVHAL_RTC_OUT (if set) for
 * inspection. Skipped (77) when the HIP module is not built. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_codeobj.h"
#include "kvhal.h"

typedef int (*rtc_compile_fn)(const char *target, const char *const *exprs, int n, void **code, size_t *size,
                              char *err, size_t err_size);
typedef void (*rtc_exprs_fn)(void (*add)(void *user, const char *expr, const char *needle), void *user);
typedef int (*rtc_code_object_fn)(const char *target, const char *expr, const char *dir, void **code, size_t *size,
                                  int *origin, char *note, size_t note_size);
static rtc_compile_fn g_compile;
static rtc_exprs_fn g_exprs_of_module;
static rtc_code_object_fn g_code_object;

/* One instantiation of every kernel family the module launches. */
static const char *const g_exprs[] = {
    "kvhal_gpu::paged_caching_kernel<kvhal_gpu::XCopy<uint4>, kvhal_gpu::XCopy<uint4>>",
    "kvhal_gpu::paged_caching_kernel<kvhal_gpu::XFp8Vec<2, 3, true>, kvhal_gpu::XFp8Vec<2, 3, true>>",
    "kvhal_gpu::tensor_copy_kernel<uint16_t>",
    "kvhal_gpu::copy_blocks_kernel",
    "kvhal_gpu::copy_batch_kernel",
    "kvhal_gpu::page_transfer_kernel",
};
static const char *const g_families[] = {"paged_caching_kernel", "tensor_copy_kernel", "copy_blocks_kernel",
                                         "copy_batch_kernel", "page_transfer_kernel"};
#define FAMILIES ((int)(sizeof g_families / sizeof g_families[0]))

typedef struct {
    int found[FAMILIES];
    int kernels;
} seen;

static void on_kernel(void *user, const char *name, size_t len)
{
    seen *s = (seen *)user;
    char buf[512];
    if (len >= sizeof buf) return;
    memcpy(buf, name, len);
    buf[len] = '\0';
    s->kernels++;
    for (int i = 0; i < FAMILIES; i++)
        if (strstr(buf, g_families[i])) s->found[i]++;
}

static void save(const char *target, const void *code, size_t size)
{
    const char *dir = getenv("KVHAL_RTC_OUT");
    if (!dir || !dir[0]) return;
    char path[512];
    snprintf(path, sizeof path, "%s/rtc-%s.co", dir, target);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(code, 1, size, f);
    fclose(f);
}

static void check_target(const char *target, unsigned mach_want)
{
    void *code = NULL;
    size_t size = 0;
    char err[8192];
    const int rc = g_compile(target, g_exprs, (int)(sizeof g_exprs / sizeof g_exprs[0]), &code, &size, err, sizeof err);
    if (rc != 0) fail_msg("%s: %s", target, err);
    assert_non_null(code);
    assert_true(size > 1000);
    save(target, code, size);
    unsigned mach = 0;
    seen s;
    memset(&s, 0, sizeof s);
    assert_int_equal(kvhal_co_amdgpu_kernels(code, size, &mach, on_kernel, &s), 6);
    assert_int_equal(mach, mach_want);
    assert_int_equal(s.found[0], 2);
    for (int i = 1; i < FAMILIES; i++) assert_int_equal(s.found[i], 1);
    /* the scanner refuses the same bytes cut short or with another machine */
    assert_int_equal(kvhal_co_amdgpu_kernels(code, 63, NULL, NULL, NULL), -1);
    assert_int_equal(kvhal_co_amdgpu_kernels(code, size / 2, NULL, NULL, NULL), -1);
    ((unsigned char *)code)[18] = 62; /* EM_X86_64 */
    assert_int_equal(kvhal_co_amdgpu_kernels(code, size, NULL, NULL, NULL), -1);
    free(code);
}

/* Every name expression the module's ops can ask for (its own list, from the same launchers the descriptors use),
 * deduplicated. */
#define EXPR_MAX 512
typedef struct {
    char *e[EXPR_MAX], *needle[EXPR_MAX];
    int n;
} expr_list;

static void add_expr(void *user, const char *expr, const char *needle)
{
    expr_list *l = (expr_list *)user;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i], expr)) return;
    if (l->n == EXPR_MAX) fail_msg("more than %d kernel expressions: raise EXPR_MAX", EXPR_MAX); /* never cut */
    l->e[l->n] = strdup(expr);
    l->needle[l->n++] = strdup(needle);
}

typedef struct {
    const char *needle;
    int kernels, named;
} count_named;

static void on_any_kernel(void *user, const char *name, size_t len)
{
    count_named *c = (count_named *)user;
    char buf[512];
    c->kernels++;
    if (len < sizeof buf) {
        memcpy(buf, name, len);
        buf[len] = '\0';
        if (c->needle && strstr(buf, c->needle)) c->named++;
    }
}

/* All of the module's kernels in one program per wave size: each expression must instantiate its own kernel. Then
 * one of them alone, as the module compiles them (one kernel per program). */
static void check_module_kernels(const char *target)
{
    expr_list l;
    memset(&l, 0, sizeof l);
    g_exprs_of_module(add_expr, &l);
    printf("# %s: %d kernel instantiations\n", target, l.n);
    assert_true(l.n >= 30); /* paged caching: 5 copies + 36 fp8 per path; tensor_copy: 5; copy_blocks, copy_batch,
                             * page_transfer */
    static const char *const singles[] = {"kvhal_gpu::copy_blocks_kernel", "kvhal_gpu::copy_batch_kernel",
                                          "kvhal_gpu::page_transfer_kernel"};
    for (size_t j = 0; j < sizeof singles / sizeof singles[0]; j++) {
        bool listed = false;
        for (int i = 0; i < l.n; i++) listed = listed || !strcmp(l.e[i], singles[j]);
        if (!listed) fail_msg("the module does not list %s", singles[j]);
    }
    for (int i = 0; i < l.n; i++) assert_non_null(strstr(l.e[i], "kvhal_gpu::"));
    void *code = NULL;
    size_t size = 0;
    char err[8192];
    if (g_compile(target, (const char *const *)l.e, l.n, &code, &size, err, sizeof err) != 0)
        fail_msg("%s: %s", target, err);
    count_named all = {NULL, 0, 0};
    assert_int_equal(kvhal_co_amdgpu_kernels(code, size, NULL, on_any_kernel, &all), l.n);
    free(code);
    /* one expression per program, as the module compiles them: exactly one kernel carries the name the module
     * looks for (the header's non-template copy kernels come along in every program) */
    const int picks[3] = {0, l.n / 2, l.n - 3};
    for (int k = 0; k < 3; k++) {
        const char *one = l.e[picks[k]];
        if (g_compile(target, &one, 1, &code, &size, err, sizeof err) != 0) fail_msg("%s: %s", one, err);
        count_named c = {l.needle[picks[k]], 0, 0};
        assert_true(kvhal_co_amdgpu_kernels(code, size, NULL, on_any_kernel, &c) >= 1);
        if (c.named != 1) fail_msg("%s: %d kernels named %s", one, c.named, c.needle);
        free(code);
    }
    for (int i = 0; i < l.n; i++) {
        free(l.e[i]);
        free(l.needle[i]);
    }
}

static void test_every_module_kernel_gfx90a(void **state)
{
    (void)state;
    check_module_kernels("gfx90a");
}

static void test_every_module_kernel_gfx1030(void **state)
{
    (void)state;
    check_module_kernels("gfx1030");
}

/* The module's path for one kernel through the disk cache with the real compiler and runtime version: compiled
 * once, then read back; a corrupted file rejected and rebuilt; another target is another file. */
static void test_disk_cache_with_hiprtc(void **state)
{
    (void)state;
    char dir[] = "/tmp/kvhal-hiprtc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *expr = "kvhal_gpu::copy_batch_kernel";
    void *code = NULL;
    size_t size = 0, first = 0;
    int origin = 0;
    char note[4096];
    assert_int_equal(g_code_object("gfx1030", expr, dir, &code, &size, &origin, note, sizeof note), 0);
    assert_int_equal(origin, KVHAL_CO_COMPILED);
    first = size;
    free(code);
    assert_int_equal(g_code_object("gfx1030", expr, dir, &code, &size, &origin, note, sizeof note), 0);
    assert_int_equal(origin, KVHAL_CO_CACHED);
    assert_int_equal(size, first);
    assert_true(kvhal_co_amdgpu_kernels(code, size, NULL, NULL, NULL) >= 1);
    free(code);
    /* flip a payload byte of the one file in the folder */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "f=$(ls %s/*.co) && printf 'X' | dd of=\"$f\" bs=1 seek=300 conv=notrunc 2>/dev/null", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(g_code_object("gfx1030", expr, dir, &code, &size, &origin, note, sizeof note), 0);
    assert_int_equal(origin, KVHAL_CO_COMPILED);
    assert_non_null(strstr(note, "checksum"));
    free(code);
    assert_int_equal(g_code_object("gfx90a", expr, dir, &code, &size, &origin, note, sizeof note), 0);
    assert_int_equal(origin, KVHAL_CO_COMPILED);
    free(code);
    assert_int_not_equal(g_code_object("gfx940", expr, dir, &code, &size, &origin, note, sizeof note), 0);
    assert_non_null(strstr(note, "cannot compile for gfx940"));
    snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 2 && rm -rf %s", dir, dir);
    assert_int_equal(system(cmd), 0);
}

static void test_gfx90a_wave64(void **state)
{
    (void)state;
    check_target("gfx90a", 0x3f);
}

static void test_gfx90a_with_features(void **state)
{
    (void)state;
    check_target("gfx90a:sramecc+:xnack-", 0x3f); /* what an MI250X reports */
}

static void test_gfx1030_wave32(void **state)
{
    (void)state;
    check_target("gfx1030", 0x36);
}

/* gfx940 (MI300A/X family; MI300X itself is gfx942): Debian 12's hiprtc (code-object manager 2.4) does not know
 * it. A newer ROCm compiles it; this one must refuse with the reason, not crash. */
static void test_unknown_target_refused(void **state)
{
    (void)state;
    const char *const targets[] = {"gfx940", "gfx942:sramecc+:xnack-", "gfx1100", "gfx9999"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        void *code = NULL;
        size_t size = 0;
        char err[1024] = "";
        const int rc = g_compile(targets[i], g_exprs, 1, &code, &size, err, sizeof err);
        if (rc == 0) { /* this ROCm knows it: then it must be a real code object */
            seen s;
            memset(&s, 0, sizeof s);
            assert_int_equal(kvhal_co_amdgpu_kernels(code, size, NULL, on_kernel, &s), 1);
            printf("# %s: compiled (%zu bytes)\n", targets[i], size);
            free(code);
            continue;
        }
        assert_null(code);
        printf("# %s: %s\n", targets[i], err);
        assert_non_null(strstr(err, "cannot compile for"));
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    void *code = NULL;
    size_t size = 0;
    char err[1024] = "";
    assert_int_not_equal(g_compile("", g_exprs, 1, &code, &size, err, sizeof err), 0);
    assert_non_null(strstr(err, "target"));
    assert_int_not_equal(g_compile(NULL, g_exprs, 1, &code, &size, err, sizeof err), 0);
    assert_int_not_equal(g_compile("gfx90a", g_exprs, 1, NULL, &size, err, sizeof err), 0);
    /* an expression that names no kernel: hiprtc's message comes back */
    const char *bad = "kvhal_gpu::no_such_kernel<int>";
    assert_int_not_equal(g_compile("gfx90a", &bad, 1, &code, &size, err, sizeof err), 0);
    assert_null(code);
    assert_true(strlen(err) > 0);
}

int main(void)
{
    void *p = NULL;
    if (kvhal_backend_get_proc_address(KVHAL_DEVICE_HIP, "kvhal_hip_rtc_compile", &p) != KVHAL_OK || !p) {
        printf("no HIP module with a run-time compiler: %s\n", kvhal_last_error());
        return 77;
    }
    memcpy(&g_compile, &p, sizeof p);
    if (kvhal_backend_get_proc_address(KVHAL_DEVICE_HIP, "kvhal_hip_rtc_kernel_exprs", &p) != KVHAL_OK || !p) {
        printf("the HIP module does not list its run-time kernels: %s\n", kvhal_last_error());
        return 1;
    }
    memcpy(&g_exprs_of_module, &p, sizeof p);
    if (kvhal_backend_get_proc_address(KVHAL_DEVICE_HIP, "kvhal_hip_rtc_code_object", &p) != KVHAL_OK || !p) {
        printf("the HIP module has no run-time code-object path: %s\n", kvhal_last_error());
        return 1;
    }
    memcpy(&g_code_object, &p, sizeof p);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gfx90a_wave64),
        cmocka_unit_test(test_gfx90a_with_features),
        cmocka_unit_test(test_gfx1030_wave32),
        cmocka_unit_test(test_every_module_kernel_gfx90a),
        cmocka_unit_test(test_every_module_kernel_gfx1030),
        cmocka_unit_test(test_disk_cache_with_hiprtc),
        cmocka_unit_test(test_unknown_target_refused),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

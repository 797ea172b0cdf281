/* test_codeobj.c — the GPU backends' code-object logic (backends/gpu/gpu_codeobj.c) with fabricated runtime answers:
 * the disk cache (folder from the environment, hit, miss, every kind of rejected file rebuilt, atomic writes, a
 * folder that cannot be written, a failing compiler), target-ID matching of embedded code objects, and the CUDA
 * path choice (cubin / PTX JIT / none). No GPU runtime is involved: the compiler is a callback that counts calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu_codeobj.h"

typedef struct {
    int calls;
    int fail;
    unsigned char fill;
    size_t size;
} fake_compiler;

static int fake_compile(void *user, const kvhal_co_key *key, void **code, size_t *size, char *err, size_t err_size)
{
    fake_compiler *f = (fake_compiler *)user;
    f->calls++;
    if (f->fail) {
        snprintf(err, err_size, "fake compiler: error for %s", key->target);
        return 1;
    }
    unsigned char *p = malloc(f->size);
    if (!p) return 1;
    for (size_t i = 0; i < f->size; i++) p[i] = (unsigned char)(f->fill + i);
    *code = p;
    *size = f->size;
    return 0;
}

static char g_dir[256];

static int setup_dir(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/kvhal-codeobj-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int teardown_dir(void **state)
{
    (void)state;
    (void)chmod(g_dir, 0700);
    rm_tree(g_dir);
    return 0;
}

static kvhal_co_key key_of(uint64_t h, const char *target, uint32_t rt)
{
    kvhal_co_key k;
    memset(&k, 0, sizeof k);
    k.source_hash = h;
    k.runtime_version = rt;
    snprintf(k.target, sizeof k.target, "%s", target);
    return k;
}

static void file_path(const kvhal_co_key *k, char *buf, size_t size)
{
    char name[160];
    assert_int_equal(kvhal_co_file_name(k, name, sizeof name), 0);
    snprintf(buf, size, "%s/%s", g_dir, name);
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* ---- the folder ---- */
static void test_cache_dir_from_environment(void **state)
{
    (void)state;
    char buf[512];
    setenv("KVHAL_CODE_CACHE_DIR", "/some/where", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    setenv("HOME", "/home/u", 1);
    assert_int_equal(kvhal_co_cache_dir(buf, sizeof buf), 0);
    assert_string_equal(buf, "/some/where");
    unsetenv("KVHAL_CODE_CACHE_DIR");
    assert_int_equal(kvhal_co_cache_dir(buf, sizeof buf), 0);
    assert_string_equal(buf, "/xdg/kvhal");
    setenv("XDG_CACHE_HOME", "relative", 1); /* not absolute: ignored, as the XDG spec says */
    assert_int_equal(kvhal_co_cache_dir(buf, sizeof buf), 0);
    assert_string_equal(buf, "/home/u/.cache/kvhal");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    assert_int_equal(kvhal_co_cache_dir(buf, sizeof buf), -1);
    assert_string_equal(buf, "");
    setenv("KVHAL_CODE_CACHE_DIR", "/a/rather/long/folder", 1);
    assert_int_equal(kvhal_co_cache_dir(buf, 8), -1); /* does not fit */
    unsetenv("KVHAL_CODE_CACHE_DIR");
}

static void test_file_name_is_made_from_the_key(void **state)
{
    (void)state;
    char buf[160];
    kvhal_co_key k = key_of(0x0123456789abcdefull, "gfx942:sramecc+:xnack-", 50221151);
    assert_int_equal(kvhal_co_file_name(&k, buf, sizeof buf), 0);
    assert_string_equal(buf, "0123456789abcdef-gfx942_sramecc+_xnack--50221151.co");
    k = key_of(1, "", 1);
    assert_int_equal(kvhal_co_file_name(&k, buf, sizeof buf), -1);
    k = key_of(1, "../etc", 1);
    assert_int_equal(kvhal_co_file_name(&k, buf, sizeof buf), -1);
    k = key_of(1, "gfx90a", 1);
    assert_int_equal(kvhal_co_file_name(&k, buf, 10), -1);
}

/* ---- hit and miss ---- */
static void test_compiles_once_then_reads_back(void **state)
{
    (void)state;
    fake_compiler f = {0, 0, 7, 3000};
    kvhal_co_key k = key_of(42, "gfx1100", 60000000);
    void *code = NULL;
    size_t size = 0;
    kvhal_co_origin o;
    char note[1024];
    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
    assert_int_equal(o, KVHAL_CO_COMPILED);
    assert_int_equal(f.calls, 1);
    assert_int_equal(size, 3000);
    assert_string_equal(note, "");
    free(code);
    assert_int_equal(count_files(g_dir), 1); /* no temporary left behind */

    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
    assert_int_equal(o, KVHAL_CO_CACHED);
    assert_int_equal(f.calls, 1);
    assert_int_equal(size, 3000);
    const unsigned char *p = code;
    for (size_t i = 0; i < size; i++) assert_int_equal(p[i], (unsigned char)(7 + i));
    free(code);

    /* another key of each part: another file, compiled */
    kvhal_co_key other[3] = {key_of(43, "gfx1100", 60000000), key_of(42, "gfx1101", 60000000),
                             key_of(42, "gfx1100", 60000001)};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvhal_co_get(g_dir, &other[i], fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
        assert_int_equal(o, KVHAL_CO_COMPILED);
        free(code);
    }
    assert_int_equal(f.calls, 4);
    assert_int_equal(count_files(g_dir), 4);
}

/* Something that is not a regular file under the key's name (a FIFO would block a plain open) is rejected. */
static void test_rejects_fifo(void **state)
{
    (void)state;
    kvhal_co_key k = key_of(3, "gfx90a", 1);
    char path[512], note[512] = "";
    file_path(&k, path, sizeof path);
    assert_int_equal(mkfifo(path, 0600), 0);
    void *code = NULL;
    size_t size = 0;
    assert_int_equal(kvhal_co_load(g_dir, &k, &code, &size, note, sizeof note), KVHAL_CO_REJECTED);
    assert_non_null(strstr(note, "not a regular file"));
    assert_null(code);
}

static void test_load_miss(void **state)
{
    (void)state;
    kvhal_co_key k = key_of(1, "gfx90a", 1);
    void *code = (void *)1;
    size_t size = 1;
    char note[256] = "";
    assert_int_equal(kvhal_co_load(g_dir, &k, &code, &size, note, sizeof note), KVHAL_CO_MISS);
    assert_null(code);
    assert_int_equal(size, 0);
}

/* ---- rejected files: each one is reported and rebuilt ---- */
typedef void (*corruptor)(const char *path, const kvhal_co_key *k);

static void rewrite(const char *path, long off, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, off, SEEK_SET), 0);
    assert_int_equal(fwrite(bytes, 1, n, fp), n);
    fclose(fp);
}

static void bad_magic(const char *path, const kvhal_co_key *k)
{
    (void)k;
    rewrite(path, 0, "ELF!", 4);
}
static void bad_payload(const char *path, const kvhal_co_key *k)
{
    (void)k;
    rewrite(path, KVHAL_CO_HEADER_BYTES + 100, "\xff\xfe", 2);
}
static void truncated(const char *path, const kvhal_co_key *k)
{
    (void)k;
    assert_int_equal(truncate(path, KVHAL_CO_HEADER_BYTES + 10), 0);
}
static void too_short(const char *path, const kvhal_co_key *k)
{
    (void)k;
    assert_int_equal(truncate(path, 20), 0);
}
static void empty(const char *path, const kvhal_co_key *k)
{
    (void)k;
    assert_int_equal(truncate(path, 0), 0);
}
static void appended(const char *path, const kvhal_co_key *k)
{
    (void)k;
    FILE *fp = fopen(path, "ab");
    assert_non_null(fp);
    fputs("junk", fp);
    fclose(fp);
}
static void future_format(const char *path, const kvhal_co_key *k)
{
    (void)k;
    const uint32_t v = KVHAL_CO_FORMAT + 1;
    rewrite(path, 8, &v, 4);
}
/* A file of another key copied under this key's name (another runtime version, target or source hash). */
static void foreign(const char *path, const kvhal_co_key *k, kvhal_co_key other)
{
    char note[256];
    (void)k;
    assert_int_equal(kvhal_co_store(g_dir, &other, "foreign code object", 19, note, sizeof note), 0);
    char src[512];
    file_path(&other, src, sizeof src);
    assert_int_equal(rename(src, path), 0);
}
static void foreign_runtime(const char *path, const kvhal_co_key *k)
{
    foreign(path, k, key_of(k->source_hash, k->target, k->runtime_version + 1));
}
static void foreign_target(const char *path, const kvhal_co_key *k)
{
    foreign(path, k, key_of(k->source_hash, "gfx90a", k->runtime_version));
}
static void foreign_source(const char *path, const kvhal_co_key *k)
{
    foreign(path, k, key_of(k->source_hash ^ 1, k->target, k->runtime_version));
}

static void check_rejected_then_rebuilt(corruptor bad, const char *why)
{
    fake_compiler f = {0, 0, 3, 500};
    kvhal_co_key k = key_of(0x99, "gfx942:sramecc+:xnack-", 60342131);
    void *code = NULL;
    size_t size = 0;
    kvhal_co_origin o;
    char note[1024], path[512];
    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
    free(code);
    file_path(&k, path, sizeof path);
    bad(path, &k);

    assert_int_equal(kvhal_co_load(g_dir, &k, &code, &size, note, sizeof note), KVHAL_CO_REJECTED);
    assert_null(code);
    if (!strstr(note, why)) fail_msg("note \"%s\" does not say \"%s\"", note, why);

    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
    assert_int_equal(o, KVHAL_CO_COMPILED);
    assert_int_equal(f.calls, 2);
    assert_non_null(strstr(note, "rejected and rebuilt"));
    assert_int_equal(size, 500);
    free(code);
    /* the rebuilt file is whole again */
    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
    assert_int_equal(o, KVHAL_CO_CACHED);
    assert_int_equal(f.calls, 2);
    assert_int_equal(((unsigned char *)code)[0], 3);
    free(code);
}

static void test_rejects_bad_magic(void **s) { (void)s; check_rejected_then_rebuilt(bad_magic, "bad magic"); }
static void test_rejects_corrupt_payload(void **s) { (void)s; check_rejected_then_rebuilt(bad_payload, "checksum"); }
static void test_rejects_truncated(void **s) { (void)s; check_rejected_then_rebuilt(truncated, "payload length"); }
static void test_rejects_short_header(void **s) { (void)s; check_rejected_then_rebuilt(too_short, "truncated"); }
static void test_rejects_empty(void **s) { (void)s; check_rejected_then_rebuilt(empty, "truncated"); }
static void test_rejects_appended(void **s) { (void)s; check_rejected_then_rebuilt(appended, "payload length"); }
static void test_rejects_format(void **s) { (void)s; check_rejected_then_rebuilt(future_format, "format version"); }
static void test_rejects_foreign_runtime(void **s) { (void)s; check_rejected_then_rebuilt(foreign_runtime, "foreign"); }
static void test_rejects_foreign_target(void **s) { (void)s; check_rejected_then_rebuilt(foreign_target, "foreign"); }
static void test_rejects_foreign_source(void **s) { (void)s; check_rejected_then_rebuilt(foreign_source, "foreign"); }

/* ---- failures ---- */
static void test_compiler_failure_is_reported(void **state)
{
    (void)state;
    fake_compiler f = {0, 1, 0, 10};
    kvhal_co_key k = key_of(5, "gfx1030", 1);
    void *code = NULL;
    size_t size = 0;
    kvhal_co_origin o;
    char note[1024];
    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), -1);
    assert_null(code);
    assert_int_equal(o, KVHAL_CO_NONE);
    assert_non_null(strstr(note, "fake compiler: error for gfx1030"));
    assert_int_equal(count_files(g_dir), 0);
}

static void test_unwritable_folder_still_compiles(void **state)
{
    (void)state;
    if (geteuid() == 0) { /* root writes anywhere: use a path under a regular file instead */
        char file[512], dir[600];
        snprintf(file, sizeof file, "%s/plain", g_dir);
        FILE *fp = fopen(file, "w");
        assert_non_null(fp);
        fclose(fp);
        snprintf(dir, sizeof dir, "%s/sub", file);
        fake_compiler f = {0, 0, 1, 64};
        kvhal_co_key k = key_of(6, "gfx90a", 1);
        void *code = NULL;
        size_t size = 0;
        kvhal_co_origin o;
        char note[1024];
        assert_int_equal(kvhal_co_get(dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
        assert_int_equal(o, KVHAL_CO_COMPILED);
        assert_non_null(strstr(note, "not cached"));
        free(code);
        return;
    }
    assert_int_equal(chmod(g_dir, 0500), 0);
    fake_compiler f = {0, 0, 1, 64};
    kvhal_co_key k = key_of(6, "gfx90a", 1);
    void *code = NULL;
    size_t size = 0;
    kvhal_co_origin o;
    char note[1024];
    assert_int_equal(kvhal_co_get(g_dir, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
    assert_int_equal(o, KVHAL_CO_COMPILED);
    assert_non_null(strstr(note, "not cached"));
    free(code);
}

static void test_no_folder_compiles_every_time(void **state)
{
    (void)state;
    fake_compiler f = {0, 0, 1, 64};
    kvhal_co_key k = key_of(6, "gfx90a", 1);
    void *code = NULL;
    size_t size = 0;
    kvhal_co_origin o;
    char note[1024];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvhal_co_get(NULL, &k, fake_compile, &f, &code, &size, &o, note, sizeof note), 0);
        assert_int_equal(o, KVHAL_CO_COMPILED);
        assert_non_null(strstr(note, "no cache folder"));
        free(code);
    }
    assert_int_equal(f.calls, 2);
}

static void test_store_creates_nested_folder(void **state)
{
    (void)state;
    char dir[512], note[256];
    snprintf(dir, sizeof dir, "%s/a/b/c", g_dir);
    kvhal_co_key k = key_of(7, "gfx90a", 2);
    assert_int_equal(kvhal_co_store(dir, &k, "x", 1, note, sizeof note), 0);
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    void *code = NULL;
    size_t size = 0;
    assert_int_equal(kvhal_co_load(dir, &k, &code, &size, note, sizeof note), KVHAL_CO_HIT);
    assert_int_equal(size, 1);
    free(code);
    assert_int_equal(kvhal_co_store(dir, &k, NULL, 0, note, sizeof note), -1);
}

/* ---- which code a device runs ---- */
static void test_target_matching(void **state)
{
    (void)state;
    assert_true(kvhal_co_target_matches("gfx90a", "gfx90a:sramecc+:xnack-"));
    assert_true(kvhal_co_target_matches("gfx90a", "gfx90a"));
    assert_true(kvhal_co_target_matches("gfx90a:xnack-", "gfx90a:sramecc+:xnack-"));
    assert_false(kvhal_co_target_matches("gfx90a:xnack+", "gfx90a:sramecc+:xnack-"));
    assert_false(kvhal_co_target_matches("gfx90a:xnack-", "gfx90a")); /* device does not say */
    assert_false(kvhal_co_target_matches("gfx940", "gfx942:sramecc+:xnack-"));
    assert_false(kvhal_co_target_matches("gfx94", "gfx942"));
    assert_false(kvhal_co_target_matches("gfx1030", "gfx1031"));
    assert_false(kvhal_co_target_matches("", "gfx90a"));
    assert_int_equal(kvhal_co_embedded_match("gfx90a,gfx940,gfx1030", "gfx1030"), 2);
    assert_int_equal(kvhal_co_embedded_match("gfx90a,gfx940,gfx1030", "gfx90a:sramecc+:xnack-"), 0);
    assert_int_equal(kvhal_co_embedded_match("gfx90a,gfx940,gfx1030", "gfx942:sramecc+:xnack-"), -1); /* MI300X */
    assert_int_equal(kvhal_co_embedded_match("gfx90a,gfx940,gfx1030", "gfx1100"), -1);
    assert_int_equal(kvhal_co_embedded_match("", "gfx90a"), -1);
    assert_int_equal(kvhal_co_embedded_match(",,gfx90a", "gfx90a"), 2);
}

static void test_cuda_path(void **state)
{
    (void)state;
    int arch = -1;
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 90, &arch), 1); /* H100 / H200: the sm_90 cubin */
    assert_int_equal(arch, 90);
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 80, &arch), 1); /* A100 */
    assert_int_equal(arch, 80);
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 86, &arch), 1); /* sm_86 runs the sm_80 cubin */
    assert_int_equal(arch, 80);
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 89, &arch), 1);
    assert_int_equal(arch, 80);
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 100, &arch), 2); /* Blackwell: the compute_90 PTX, JIT */
    assert_int_equal(arch, 90);
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 120, &arch), 2);
    assert_int_equal(kvhal_co_cuda_path("80,90", 90, 75, &arch), 0); /* Turing: nothing */
    assert_int_equal(arch, 0);
    assert_int_equal(kvhal_co_cuda_path("90", 90, 80, &arch), 0);
    assert_int_equal(kvhal_co_cuda_path("", 0, 90, &arch), 0);
}

static void test_hash(void **state)
{
    (void)state;
    assert_int_equal(kvhal_co_hash(KVHAL_CO_HASH_INIT, "", 0), KVHAL_CO_HASH_INIT);
    /* FNV-1a 64 of "a" */
    assert_true(kvhal_co_hash(KVHAL_CO_HASH_INIT, "a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(kvhal_co_hash(KVHAL_CO_HASH_INIT, "ab", 2) !=
                kvhal_co_hash(KVHAL_CO_HASH_INIT, "ba", 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_dir_from_environment),
        cmocka_unit_test(test_file_name_is_made_from_the_key),
        cmocka_unit_test_setup_teardown(test_compiles_once_then_reads_back, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_load_miss, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_fifo, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_bad_magic, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_corrupt_payload, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_truncated, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_short_header, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_empty, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_appended, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_format, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_foreign_runtime, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_foreign_target, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rejects_foreign_source, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_compiler_failure_is_reported, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_unwritable_folder_still_compiles, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_no_folder_compiles_every_time, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_store_creates_nested_folder, setup_dir, teardown_dir),
        cmocka_unit_test(test_target_matching),
        cmocka_unit_test(test_cuda_path),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

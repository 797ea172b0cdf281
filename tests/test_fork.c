/* test_fork.c — fork() and the devices, on every device present (cpu always, OpenCL on PoCL, the example npu module):
 *   fork_child_refused     the parent creates a buffer, a stream and an event and runs an op, then forks: in the child
 *                          every call that reaches a backend module the parent initialised is KVHAL_BACKEND_UNAVAILABLE
 *                          naming the device and "fork", at once (alarm() bounds the child: a hang fails the test);
 *                          the cpu device keeps working in the child, on the parent's buffer too; the child exits
 *                          normally (the library's destructors run); the parent's objects still work afterwards
 *   fork_before_first_call a child forked before the process's first kvhal call uses every device (main() forks it
 *                          first thing) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvhal.h"

#define OKS(expr)                                                                                               \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());       \
    } while (0)

enum { N = 64, CHILD_SECONDS = 60 };

/* Under AddressSanitizer the exit of a child forked from a threaded process runs LeakSanitizer, which tries to stop
 * threads the child does not have: such a child leaves with _exit (the plain and valgrind runs check exit()). */
#if defined(__SANITIZE_ADDRESS__)
#define CHILD_SKIPS_EXIT_HANDLERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHILD_SKIPS_EXIT_HANDLERS 1
#endif
#endif
#ifndef CHILD_SKIPS_EXIT_HANDLERS
#define CHILD_SKIPS_EXIT_HANDLERS 0
#endif

/* The first device of every registered type that has one. */
static int devices(kvhal_device *out, int cap)
{
    int n = 0;
    for (int t = 0; t < KVHAL_MAX_DEVICE_TYPES && n < cap; t++) {
        int32_t c = 0;
        if (kvhal_device_count((kvhal_device_type)t, &c) == KVHAL_OK && c > 0)
            out[n++] = (kvhal_device){(kvhal_device_type)t, 0};
    }
    return n;
}

/* ---- in the child: failures are counted and reported on stderr (cmocka's state is the parent's) ---- */
static int child_failures;

static void child_fail(const char *what, kvhal_status st)
{
    fprintf(stderr, "child %d: %s: %s (%s)\n", (int)getpid(), what, kvhal_status_name(st), kvhal_last_error());
    child_failures++;
}

/* A call in the child: on cpu it must succeed; on a module's device it must be refused as a fork, naming the
 * device. */
static void expect(kvhal_device d, const char *what, kvhal_status st)
{
    char name[32];
    (void)kvhal_device_format(d, name, sizeof name);
    if (d.type == KVHAL_DEVICE_CPU) {
        if (st != KVHAL_OK) child_fail(what, st);
        return;
    }
    if (st != KVHAL_BACKEND_UNAVAILABLE || !strstr(kvhal_last_error(), "fork") || !strstr(kvhal_last_error(), name))
        child_fail(what, st);
}

static void tensor_of(kvhal_buffer *b, size_t off, kvhal_tensor *t)
{
    const int64_t shape[1] = {N / 2};
    OKS(kvhal_tensor_make(b, off, KVHAL_F32, 1, shape, NULL, t));
}

static void in_child(kvhal_device d, kvhal_buffer *a, kvhal_stream *s, kvhal_event *e, const float *want)
{
    alarm(CHILD_SECONDS); /* a hang ends the child with SIGALRM, which the parent reports */
    kvhal_clear_error();
    float got[N] = {0}, ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    kvhal_buffer *b = NULL;
    expect(d, "buffer_create", kvhal_buffer_create(d, sizeof got, &b));
    expect(d, "memcpy_d2h of the parent's buffer", kvhal_memcpy_d2h(got, a, 0, sizeof got, NULL));
    if (d.type == KVHAL_DEVICE_CPU && memcmp(got, want, sizeof got)) child_fail("the parent's data", KVHAL_OK);
    expect(d, "memcpy_h2d", kvhal_memcpy_h2d(a, 0, ones, sizeof ones, NULL));
    kvhal_tensor lo, hi;
    memset(&lo, 0, sizeof lo);
    memset(&hi, 0, sizeof hi);
    lo.buffer = hi.buffer = a;
    if (d.type == KVHAL_DEVICE_CPU) {
        tensor_of(a, 0, &lo);
        tensor_of(a, N / 2 * sizeof(float), &hi);
    } else { /* kvhal_tensor_make checks the buffer: refused too */
        const int64_t shape[1] = {N / 2};
        expect(d, "tensor_make", kvhal_tensor_make(a, 0, KVHAL_F32, 1, shape, NULL, &lo));
        lo = (kvhal_tensor){.buffer = a, .dtype = KVHAL_F32, .ndim = 1, .shape = {N / 2}, .strides = {1}};
        hi = lo;
        hi.offset = N / 2 * sizeof(float);
    }
    expect(d, "tensor_copy", kvhal_tensor_copy(&hi, &lo, NULL));
    expect(d, "device_synchronize", kvhal_device_synchronize(d));
    kvhal_device_info info;
    expect(d, "device_get_info", kvhal_device_get_info(d, &info));
    kvhal_stream *s2 = NULL;
    const kvhal_status sc = kvhal_stream_create(d, &s2);
    if (sc != KVHAL_UNSUPPORTED) expect(d, "stream_create", sc);
    if (s) {
        expect(d, "stream_synchronize", kvhal_stream_synchronize(s));
        expect(d, "stream_query", kvhal_stream_query(s));
        expect(d, "memcpy_h2d on the parent's stream", kvhal_memcpy_h2d(a, 0, ones, sizeof ones, s));
    }
    kvhal_event *e2 = NULL;
    expect(d, "event_create", kvhal_event_create(d, &e2));
    expect(d, "event_record", kvhal_event_record(e, s));
    expect(d, "event_synchronize", kvhal_event_synchronize(e));
    kvhal_host_memory *hm = NULL;
    expect(d, "host_memory_create", kvhal_host_memory_create(d, 64, &hm));
    kvhal_paged_cache_config cfg = KVHAL_PAGED_CACHE_CONFIG_INIT;
    cfg.num_layers = 1;
    cfg.num_heads = 1;
    cfg.head_dim = 4;
    cfg.block_size = 2;
    cfg.dtype = KVHAL_F32;
    cfg.memory_budget = 4096;
    cfg.device = d;
    kvhal_paged_cache *pc = NULL;
    expect(d, "paged_cache_create", kvhal_paged_cache_create(&cfg, &pc));
    /* the parent's objects: destroyed on cpu (the child's copies), left alone on a module's device */
    expect(d, "event_destroy of the parent's event", kvhal_event_destroy(e));
    expect(d, "stream_destroy of the parent's stream", s ? kvhal_stream_destroy(s) : KVHAL_OK);
    expect(d, "buffer_destroy of the parent's buffer", kvhal_buffer_destroy(a));
    if (d.type == KVHAL_DEVICE_CPU) {
        if (kvhal_paged_cache_destroy(pc) || kvhal_host_memory_destroy(hm) || kvhal_event_destroy(e2) ||
            kvhal_stream_destroy(s2) || kvhal_buffer_destroy(b))
            child_fail("destroying the child's own objects", KVHAL_OK);
    } else if (b || s2 || e2 || hm || pc) {
        child_fail("a refused create wrote its out argument", KVHAL_OK);
    }
#if CHILD_SKIPS_EXIT_HANDLERS
    _exit(child_failures ? 1 : 0);
#else
    exit(child_failures ? 1 : 0); /* exit(), not _exit(): the library's destructors run in the child too */
#endif
}

static void fork_on(kvhal_device d)
{
    char name[32];
    OKS(kvhal_device_format(d, name, sizeof name));
    float want[N], got[N];
    for (int i = 0; i < N; i++) want[i] = (float)i * 0.5f;
    kvhal_buffer *a;
    OKS(kvhal_buffer_create(d, sizeof want, &a));
    kvhal_stream *s = NULL;
    const kvhal_status sc = kvhal_stream_create(d, &s);
    if (sc != KVHAL_UNSUPPORTED) OKS(sc);
    kvhal_event *e;
    OKS(kvhal_event_create(d, &e));
    OKS(kvhal_memcpy_h2d(a, 0, want, sizeof want, s));
    kvhal_tensor lo, hi;
    tensor_of(a, 0, &lo);
    tensor_of(a, N / 2 * sizeof(float), &hi);
    OKS(kvhal_tensor_copy(&hi, &lo, s)); /* an op: the parent's thread caches a descriptor of this device */
    OKS(kvhal_event_record(e, s));
    OKS(kvhal_memcpy_d2h(got, a, 0, sizeof got, s));
    if (s) OKS(kvhal_stream_synchronize(s));
    memcpy(want + N / 2, want, N / 2 * sizeof(float));
    assert_memory_equal(got, want, sizeof got);
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) in_child(d, a, s, e, want);
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws))
        fail_msg("%s: the child ended by signal %d%s", name, WTERMSIG(ws),
                 WTERMSIG(ws) == SIGALRM ? " (it hung: alarm)" : "");
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) fail_msg("%s: the child failed (stderr has why)", name);
    printf("[ fork     ] %s: the child %s\n", name,
           d.type == KVHAL_DEVICE_CPU ? "used the device" : "was refused at every entry point");
    /* the parent's objects are untouched by the child */
    memset(got, 0, sizeof got);
    OKS(kvhal_memcpy_d2h(got, a, 0, sizeof got, s));
    if (s) OKS(kvhal_stream_synchronize(s));
    assert_memory_equal(got, want, sizeof got);
    OKS(kvhal_event_synchronize(e));
    OKS(kvhal_event_destroy(e));
    OKS(kvhal_stream_destroy(s));
    OKS(kvhal_buffer_destroy(a));
}

static void test_fork_child_refused(void **state)
{
    (void)state;
    kvhal_device d[KVHAL_MAX_DEVICE_TYPES];
    const int n = devices(d, KVHAL_MAX_DEVICE_TYPES);
    assert_true(n >= 1 && d[0].type == KVHAL_DEVICE_CPU);
    for (int i = 0; i < n; i++) fork_on(d[i]);
}

/* ---- a child forked before the first kvhal call: main() runs it before cmocka ---- */
static int early_status = -1; /* the child's wait status */

static int early_child(void)
{
    alarm(CHILD_SECONDS);
    kvhal_device d[KVHAL_MAX_DEVICE_TYPES];
    const int n = devices(d, KVHAL_MAX_DEVICE_TYPES);
    int bad = n < 1;
    for (int i = 0; i < n; i++) {
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8] = {0};
        kvhal_buffer *b = NULL;
        if (kvhal_buffer_create(d[i], sizeof x, &b) || kvhal_memcpy_h2d(b, 0, x, sizeof x, NULL) ||
            kvhal_memcpy_d2h(y, b, 0, sizeof y, NULL) || kvhal_buffer_destroy(b) || memcmp(x, y, sizeof x)) {
            fprintf(stderr, "early child: device type %d: %s\n", (int)d[i].type, kvhal_last_error());
            bad = 1;
        }
    }
    return bad;
}

static void test_fork_before_first_call(void **state)
{
    (void)state;
    if (WIFSIGNALED(early_status)) fail_msg("the child ended by signal %d", WTERMSIG(early_status));
    assert_true(WIFEXITED(early_status));
    assert_int_equal(WEXITSTATUS(early_status), 0);
}

int main(void)
{
    /* first thing, before any kvhal call of this process */
    const pid_t pid = fork();
    if (pid == 0) exit(early_child());
    if (pid < 0 || waitpid(pid, &early_status, 0) != pid) early_status = -1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_before_first_call),
        cmocka_unit_test(test_fork_child_refused),
    };
    return cmocka_run_group_tests_name("fork", tests, NULL, NULL);
}

/* test_errors.c — the status table (every code has its own name and message, unknown values are handled), the
 * thread-local last-error message, and that failing calls name the argument and the value at fault. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

/* The statuses of KVHAL_STATUS_MAP, counted here (kvhal.h has no public count). */
#define X_ONE(name, code, msg) +1
enum { NUM_STATUSES = 0 KVHAL_STATUS_MAP(X_ONE) };
#undef X_ONE

typedef struct status_row {
    kvhal_status code;
    const char *name; /* "KVHAL_" #name, as the table spells it */
    const char *msg;
} status_row;

static const status_row rows[] = {
#define ROW(name, code, msg) {KVHAL_##name, "KVHAL_" #name, msg},
    KVHAL_STATUS_MAP(ROW)
#undef ROW
};
#define NROWS ((int)(sizeof rows / sizeof rows[0]))

static void assert_contains(const char *haystack, const char *needle)
{
    if (!strstr(haystack, needle)) fail_msg("\"%s\" does not contain \"%s\"", haystack, needle);
}

static void test_codes_are_dense(void **state)
{
    (void)state;
    /* Codes are 0..COUNT-1 in table order, so arrays indexed by status are safe. */
    assert_int_equal(NROWS, NUM_STATUSES);
    for (int i = 0; i < NROWS; i++) assert_int_equal(rows[i].code, i);
    assert_int_equal(KVHAL_OK, 0);
}

static void test_names_and_messages_distinct(void **state)
{
    (void)state;
    for (int i = 0; i < NROWS; i++) {
        const char *n = kvhal_status_name(rows[i].code);
        const char *m = kvhal_status_string(rows[i].code);
        assert_non_null(n);
        assert_non_null(m);
        assert_string_equal(n, rows[i].name);
        assert_string_equal(m, rows[i].msg);
        assert_true(strlen(m) > 0);
        for (int j = 0; j < i; j++) {
            if (!strcmp(n, kvhal_status_name(rows[j].code)))
                fail_msg("status %d and %d share the name %s", i, j, n);
            if (!strcmp(m, kvhal_status_string(rows[j].code)))
                fail_msg("status %d and %d share the message \"%s\"", i, j, m);
        }
    }
}

static void test_unknown_status(void **state)
{
    (void)state;
    const int bad[] = {-1, NUM_STATUSES, NUM_STATUSES + 1, 1000, INT32_MAX, INT32_MIN};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        kvhal_status s = (kvhal_status)bad[k];
        const char *n = kvhal_status_name(s);
        const char *m = kvhal_status_string(s);
        assert_non_null(n);
        assert_non_null(m);
        assert_true(strlen(n) > 0);
        assert_true(strlen(m) > 0);
        /* An unknown value must not pass for a real status. */
        for (int i = 0; i < NROWS; i++) {
            assert_string_not_equal(n, rows[i].name);
            assert_string_not_equal(m, rows[i].msg);
        }
    }
}

static void test_last_error_set_and_cleared(void **state)
{
    (void)state;
    kvhal_clear_error();
    assert_non_null(kvhal_last_error());
    assert_string_equal(kvhal_last_error(), "");
    kvhal_buffer *b = (kvhal_buffer *)&b; /* must be overwritten with NULL on failure */
    assert_int_equal(kvhal_buffer_create((kvhal_device){KVHAL_DEVICE_CPU, 0}, 0, &b), KVHAL_INVALID_ARGUMENT);
    assert_null(b);
    assert_true(strlen(kvhal_last_error()) > 0);
    kvhal_clear_error();
    assert_string_equal(kvhal_last_error(), "");
}

/* Each failing call's message names the argument (and the offending value where there is one). */
static void test_messages_name_the_argument(void **state)
{
    (void)state;
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_buffer *b = NULL;

    assert_int_equal(kvhal_buffer_create(cpu, 0, &b), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "bytes");

    assert_int_equal(kvhal_buffer_create(cpu, 16, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "out");

    kvhal_device d;
    assert_int_equal(kvhal_device_parse(NULL, &d), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "text");
    assert_int_equal(kvhal_device_parse("gpu:3", &d), KVHAL_PARSE_ERROR);
    assert_contains(kvhal_last_error(), "gpu:3");

    int32_t n;
    assert_int_equal(kvhal_device_count((kvhal_device_type)99, &n), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "type");
    assert_contains(kvhal_last_error(), "99");

    kvhal_backend_module_info mi;
    assert_int_equal(kvhal_backend_module_get(-7, &mi), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "index");
    assert_contains(kvhal_last_error(), "-7");

    assert_int_equal(kvhal_buffer_create(cpu, 64, &b), KVHAL_OK);
    assert_int_equal(kvhal_memset(b, 0, 300, 8, NULL), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "value");
    assert_contains(kvhal_last_error(), "300");
    uint8_t host[8] = {0};
    assert_int_equal(kvhal_memcpy_h2d(b, 60, host, 8, NULL), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "dst");
    assert_contains(kvhal_last_error(), "64"); /* the buffer's size */
    assert_int_equal(kvhal_memcpy_d2h(host, b, 65, 0, NULL), KVHAL_OUT_OF_RANGE);
    assert_contains(kvhal_last_error(), "src");

    kvhal_tensor t;
    int64_t shape[2] = {4, 5};
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F32, 0, shape, NULL, &t), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "ndim");
    shape[1] = -5;
    assert_int_equal(kvhal_tensor_make(b, 0, KVHAL_F32, 2, shape, NULL, &t), KVHAL_INVALID_ARGUMENT);
    assert_contains(kvhal_last_error(), "shape[1]");
    assert_contains(kvhal_last_error(), "-5");
    assert_int_equal(kvhal_buffer_destroy(b), KVHAL_OK);

    kvhal_device missing = {KVHAL_DEVICE_CPU, 1};
    assert_int_not_equal(kvhal_device_synchronize(missing), KVHAL_OK);
    assert_contains(kvhal_last_error(), "cpu:1");
}

/* ---- thread locality ---- */
typedef struct thread_probe {
    char seen_at_start[1024]; /* what this thread saw before failing anything */
    char own_error[1024];     /* its own message after failing */
    char after_main[1024];    /* its message after the main thread failed a different call */
    pthread_barrier_t *b1, *b2;
} thread_probe;

static void *probe_thread(void *arg)
{
    thread_probe *p = arg;
    snprintf(p->seen_at_start, sizeof p->seen_at_start, "%s", kvhal_last_error());
    kvhal_device d;
    kvhal_device_parse("opencl:999", &d);
    snprintf(p->own_error, sizeof p->own_error, "%s", kvhal_last_error());
    pthread_barrier_wait(p->b1); /* main fails its own call now */
    pthread_barrier_wait(p->b2);
    snprintf(p->after_main, sizeof p->after_main, "%s", kvhal_last_error());
    return NULL;
}

static void test_last_error_is_thread_local(void **state)
{
    (void)state;
    kvhal_clear_error();
    kvhal_device d;
    /* The main thread fails first: a new thread must not see it. */
    assert_int_equal(kvhal_device_parse("nonsense", &d), KVHAL_PARSE_ERROR);
    char main_msg[1024];
    snprintf(main_msg, sizeof main_msg, "%s", kvhal_last_error());
    assert_contains(main_msg, "nonsense");

    pthread_barrier_t b1, b2;
    pthread_barrier_init(&b1, NULL, 2);
    pthread_barrier_init(&b2, NULL, 2);
    thread_probe p = {.b1 = &b1, .b2 = &b2};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, probe_thread, &p), 0);
    pthread_barrier_wait(&b1);
    /* The thread has failed its own call: ours is unchanged. */
    assert_string_equal(kvhal_last_error(), main_msg);
    kvhal_buffer *b;
    assert_int_equal(kvhal_buffer_create((kvhal_device){KVHAL_DEVICE_CPU, 0}, 0, &b), KVHAL_INVALID_ARGUMENT);
    char main_msg2[1024];
    snprintf(main_msg2, sizeof main_msg2, "%s", kvhal_last_error());
    pthread_barrier_wait(&b2);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&b1);
    pthread_barrier_destroy(&b2);

    assert_string_equal(p.seen_at_start, "");
    assert_contains(p.own_error, "opencl:999");
    assert_string_equal(p.after_main, p.own_error); /* main's second failure did not leak over */
    assert_contains(main_msg2, "bytes");
    assert_string_equal(kvhal_last_error(), main_msg2);
}

/* Many threads failing different calls at once each read back exactly their own message. */
#define NWORKERS 6
#define ROUNDS 200
typedef struct worker {
    int index;
    int mismatches;
} worker;

static void *worker_thread(void *arg)
{
    worker *w = arg;
    char text[32], want[64];
    for (int r = 0; r < ROUNDS; r++) {
        snprintf(text, sizeof text, "w%d_r%d", w->index, r);
        snprintf(want, sizeof want, "\"%s\"", text);
        kvhal_device d;
        if (kvhal_device_parse(text, &d) != KVHAL_PARSE_ERROR || !strstr(kvhal_last_error(), want)) w->mismatches++;
    }
    return NULL;
}

static void test_last_error_concurrent(void **state)
{
    (void)state;
    pthread_t th[NWORKERS];
    worker w[NWORKERS];
    for (int i = 0; i < NWORKERS; i++) {
        w[i] = (worker){.index = i};
        assert_int_equal(pthread_create(&th[i], NULL, worker_thread, &w[i]), 0);
    }
    for (int i = 0; i < NWORKERS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NWORKERS; i++) assert_int_equal(w[i].mismatches, 0);
}

static void test_long_message_is_bounded(void **state)
{
    (void)state;
    /* A huge argument must not overflow the message buffer; the message stays a terminated string. */
    static char big[20000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvhal_device d;
    assert_int_equal(kvhal_device_parse(big, &d), KVHAL_PARSE_ERROR);
    size_t len = strlen(kvhal_last_error());
    assert_true(len > 0);
    assert_true(len < 2048); /* quotes a bounded prefix, not the whole argument */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_are_dense),
        cmocka_unit_test(test_names_and_messages_distinct),
        cmocka_unit_test(test_unknown_status),
        cmocka_unit_test(test_last_error_set_and_cleared),
        cmocka_unit_test(test_messages_name_the_argument),
        cmocka_unit_test(test_last_error_is_thread_local),
        cmocka_unit_test(test_last_error_concurrent),
        cmocka_unit_test(test_long_message_is_bounded),
    };
    return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}

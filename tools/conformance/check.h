/* check.h — the checks of kvhal-conformance and the few assertions they use. A check is a function run on one device
 * (or on the host); an assertion that fails ends the check with a message (fail_msg, assert_*), skip() ends it as
 * not applicable. The names are cmocka's, so that device_buffer.h and reference.c serve the cmocka suites under
 * tests/ too; here they are implemented with setjmp/longjmp and no test framework, so the installed tool needs
 * nothing beyond libkvhal. A check that fails leaves what it allocated (the process ends soon after). */
#ifndef KVHAL_CONFORMANCE_CHECK_H
#define KVHAL_CONFORMANCE_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvhal.h"

/* Ends the running check as failed (message printf-style) or as skipped (the message says why). */
_Noreturn void conf_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
_Noreturn void conf_skip(const char *why);
/* A note on a check that passed ("192 cases matched the reference"): shown in its row's message. */
void conf_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define fail_msg(...) conf_fail(__FILE__, __LINE__, __VA_ARGS__)
#define skip() conf_skip(NULL)
#define assert_true(c)                                                                                          \
    do {                                                                                                        \
        if (!(c)) conf_fail(__FILE__, __LINE__, "%s is false", #c);                                             \
    } while (0)
#define assert_non_null(p)                                                                                      \
    do {                                                                                                        \
        if ((p) == NULL) conf_fail(__FILE__, __LINE__, "%s is NULL", #p);                                       \
    } while (0)
#define assert_int_equal(a, b)                                                                                  \
    do {                                                                                                        \
        const long long a_ = (long long)(a), b_ = (long long)(b);                                               \
        if (a_ != b_) conf_fail(__FILE__, __LINE__, "%s is %lld, expected %lld", #a, a_, b_);                   \
    } while (0)
#define assert_memory_equal(a, b, n)                                                                            \
    do {                                                                                                        \
        if (memcmp((a), (b), (n)) != 0) conf_fail(__FILE__, __LINE__, "%s and %s differ", #a, #b);               \
    } while (0)

/* One check: its name, the public op (or device function) it exercises, and the function. state points to the
 * device the check runs on (device_of() below reads it). */
typedef struct conf_check {
    const char *name;
    const char *op;
    void (*fn)(void **state);
} conf_check;

/* The device a device check runs on (state of the check). */
static inline kvhal_device device_of(void **state) { return *(const kvhal_device *)*state; }

/* checks.c: the host check (the number conversions) and the device checks, in the order they run. */
extern const conf_check conf_host_checks[];
extern const size_t conf_num_host_checks;
extern const conf_check conf_device_checks[];
extern const size_t conf_num_device_checks;

#endif

/* error.h — the thread's last-error message and the log (error.c), and the macros that propagate a status. */
#ifndef KVHAL_CORE_ERROR_H
#define KVHAL_CORE_ERROR_H

#include "common.h"

/* Sets this thread's message and returns status. */
KVHAL_HIDDEN kvhal_status kvhal__err(kvhal_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
KVHAL_HIDDEN void kvhal__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops an incomplete UTF-8 sequence at the end of s (what snprintf leaves when it cuts a name in two). */
KVHAL_HIDDEN void kvhal__utf8_trim(char *s);

/* Propagate: if (st != KVHAL_OK) return st; (message already set by the callee) */
#define KVHAL_TRY(expr)                                                                                         \
    do {                                                                                                        \
        kvhal_status kvhal__st = (expr);                                                                        \
        if (kvhal__st != KVHAL_OK) return kvhal__st;                                                            \
    } while (0)

#define KVHAL_CHECK_ARG(cond, ...)                                                                              \
    do {                                                                                                        \
        if (!(cond)) return kvhal__err(KVHAL_INVALID_ARGUMENT, __VA_ARGS__);                                    \
    } while (0)

#endif

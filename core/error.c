/* error.c — status names and messages from the one table in kvhal.h, the thread-local last-error message, and the
 * opt-in log (KVHAL_LOG=error|warn|info|debug, written to stderr only when asked, or handed to the application's
 * callback, kvhal_log_set). */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static _Thread_local char last_error[1024];

const char *kvhal_status_name(kvhal_status s)
{
    switch (s) {
#define KVHAL_X_NAME(name, code, msg) case KVHAL_##name: return "KVHAL_" #name;
        KVHAL_STATUS_MAP(KVHAL_X_NAME)
#undef KVHAL_X_NAME
    default: return "KVHAL_UNKNOWN_STATUS";
    }
}

const char *kvhal_status_string(kvhal_status s)
{
    switch (s) {
#define KVHAL_X_MSG(name, code, msg) case KVHAL_##name: return msg;
        KVHAL_STATUS_MAP(KVHAL_X_MSG)
#undef KVHAL_X_MSG
    default: return "unknown status";
    }
}

const char *kvhal_last_error(void) { return last_error; }

void kvhal_clear_error(void) { last_error[0] = '\0'; }

static void cut_utf8(char *s, size_t len);
void kvhal__utf8_trim(char *s) { cut_utf8(s, strlen(s)); }

/* A message cut to fit its buffer (len bytes, NUL-terminated) ends on a whole UTF-8 character: an incomplete
 * sequence at the end (a caller's path or name cut in two) is dropped. */
static void cut_utf8(char *s, size_t len)
{
    size_t i = len, cont = 0;
    while (i > 0 && cont < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) i--, cont++;
    if (i == 0) return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xf0 ? 3 : lead >= 0xe0 ? 2 : lead >= 0xc0 ? 1 : 0;
    if (lead >= 0xc0 && cont < need) s[i - 1] = '\0';
}

static kvhal_status verr(kvhal_status status, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static kvhal_status verr(kvhal_status status, const char *fmt, va_list ap)
{
    int n = snprintf(last_error, sizeof last_error, "%s: ", kvhal_status_name(status));
    if (n < 0) n = 0;
    if ((size_t)n < sizeof last_error) {
        int m = vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
        if (m >= 0 && (size_t)n + (size_t)m >= sizeof last_error) cut_utf8(last_error, sizeof last_error - 1);
    }
    kvhal__log(3, "%s", last_error);
    return status;
}

kvhal_status kvhal__err(kvhal_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvhal_status r = verr(status, fmt, ap);
    va_end(ap);
    return r;
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static kvhal_log_fn log_fn;   /* under log_lock */
static void *log_user;        /* under log_lock */
static atomic_bool log_hooked; /* log_fn != NULL, read without the lock by the level check */

static int log_level(void)
{
    /* Read each time: cheap next to the logging itself, and tests may change it. Unset: nothing, or warnings and
     * errors when the application installed a callback (it asked for the messages). */
    const char *v = getenv("KVHAL_LOG");
    if (!v || !*v) return atomic_load_explicit(&log_hooked, memory_order_relaxed) ? KVHAL_LOG_WARN : -1;
    if (!strcmp(v, "error")) return 0;
    if (!strcmp(v, "warn")) return 1;
    if (!strcmp(v, "info")) return 2;
    if (!strcmp(v, "debug")) return 3;
    /* logging was asked for, with a value that is none of the four: warn (once per value seen) and log warnings */
    static _Thread_local char warned[64];
    if (strncmp(warned, v, sizeof warned - 1) != 0) {
        snprintf(warned, sizeof warned, "%s", v);
        fprintf(stderr, "kvhal warn: KVHAL_LOG: \"%.40s\" is not error, warn, info or debug; logging warnings and "
                "errors\n", v);
    }
    return 1;
}

kvhal_status kvhal_log_set(kvhal_log_fn fn, void *user)
{
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = fn ? user : NULL;
    atomic_store_explicit(&log_hooked, fn != NULL, memory_order_relaxed);
    pthread_mutex_unlock(&log_lock);
    return KVHAL_OK;
}

void kvhal__log(int level, const char *fmt, ...)
{
    if (level > log_level()) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    level = level < 0 ? 0 : level > 3 ? 3 : level;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_lock);
    kvhal_log_fn fn = log_fn;
    void *user = log_user;
    pthread_mutex_unlock(&log_lock);
    /* Called outside the lock, so that a callback may log through kvhal or replace itself. */
    if (fn) fn((kvhal_log_level)level, msg, user);
    else fprintf(stderr, "kvhal %s: %s\n", names[level], msg);
}

kvhal_status kvhal_error_set(kvhal_status status, const char *fmt, ...)
{
    if (!fmt) fmt = "";
    va_list ap;
    va_start(ap, fmt);
    kvhal_status r = verr(status, fmt, ap);
    va_end(ap);
    return r;
}

/* failure.c — see failure.h. */
#include "failure.h"

#include <stdarg.h>
#include <stdio.h>

static char failure_status[64], failure_message[1024];

void replay_fail(const char *status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: error: %s\n", REPLAY_TOOL, msg);
    if (!failure_status[0]) {
        snprintf(failure_status, sizeof failure_status, "%s", status);
        snprintf(failure_message, sizeof failure_message, "%s", msg);
    }
}

void replay_failure_reset(void) { failure_status[0] = failure_message[0] = '\0'; }

const char *replay_failure_status(void) { return failure_status; }

const char *replay_failure_message(void) { return failure_message; }

const char *replay_status_msg(kvhal_status st)
{
    const char *m = kvhal_last_error();
    return *m ? m : kvhal_status_name(st);
}

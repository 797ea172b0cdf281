/* failure.h — kvhal-replay's first failure of a run: printed as "kvhal-replay: error: ..." when it happens, and kept
 * for the error object of the JSON output (tool conventions, README "Tools"). */
#ifndef KVHAL_REPLAY_FAILURE_H
#define KVHAL_REPLAY_FAILURE_H

#include "kvhal.h"

#define REPLAY_TOOL "kvhal-replay"

/* Prints the message on stderr; the first one of the run is kept with its status (a kvhal status name or the
 * tool's own, "VERIFICATION_FAILED"). */
void replay_fail(const char *status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Forgets the kept failure: a new run starts. */
void replay_failure_reset(void);
/* The kept status and message ("" when nothing failed). */
const char *replay_failure_status(void);
const char *replay_failure_message(void);
/* kvhal_last_error(), or the status's name when it is empty. */
const char *replay_status_msg(kvhal_status st);

#endif

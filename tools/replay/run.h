/* run.h — one kvhal-replay run: the workload, the paged cache (unless --no-kv) and the cache manager set up, the
 * passes replayed (--repeat), the summary printed and everything freed. */
#ifndef KVHAL_REPLAY_RUN_H
#define KVHAL_REPLAY_RUN_H

#include "options.h"

/* One run; with --json a run that failed before its summary prints the failure object instead. 0 when every
 * check passed, 1 otherwise. */
int run_replay(const options *o);

#endif

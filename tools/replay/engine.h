/* engine.h — kvhal-replay's engine: the requests of the workload driven through the cache manager the way an
 * inference engine would (per request match + lock, allocate, write K and V of every new token in every layer,
 * decode steps appending one token at a time, cache_finished), every prefix hit verified. */
#ifndef KVHAL_REPLAY_ENGINE_H
#define KVHAL_REPLAY_ENGINE_H

#include "replay.h"

/* One pass over the workload, starting from an empty prefix cache (and empty tiers), which it leaves empty. 0,
 * or -1 on an error or a failed check (reported). */
int run_once(replay *r);

#endif

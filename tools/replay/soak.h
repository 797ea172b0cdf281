/* soak.h — kvhal-replay --soak: a fixed set of runs under eviction pressure with frequent integrity checks. */
#ifndef KVHAL_REPLAY_SOAK_H
#define KVHAL_REPLAY_SOAK_H

#include "options.h"

/* The soak's runs on top of base (its --json, --quiet, --seed and host-tier options kept): 0 when every run
 * passed, 1 otherwise. */
int run_soak(const options *base);

#endif

/* check.h — kvhal-replay's verification, outside the measured time: sampled rows of every prefix hit read back
 * (--no-kv: each page's shadow of its prefix hash), the cache manager's integrity check, and the unbounded
 * reference (what a cache that never evicts would hit on the run's own schedule). */
#ifndef KVHAL_REPLAY_CHECK_H
#define KVHAL_REPLAY_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "replay.h"

/* Reads back the row of token pos of s's matched prefix (--no-kv: its page's shadow) in a random layer. */
void verify_row(replay *r, slot *s, size_t pos);
/* Reads back sampled rows of the matched prefix (first token, last token, random ones). */
void verify_hit(replay *r, slot *s);
/* kvhal_cache_manager_check_integrity, counted (a failure is reported). */
void check_integrity(replay *r);
/* Logs an admission or a finish of the pass for the reference (a store into a preallocated array: the only part
 * of the reference inside the pass). */
void sched_log(replay *r, const slot *s, bool finish);
/* The unbounded reference of the pass just run, from its log: no cache can hit more than it, and a radix cache
 * that has never evicted hits exactly that. 0, or -1 when a match broke either rule (reported) or without
 * memory. */
int check_reference(replay *r);

#endif

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
/* The unbounded reference learns the page of chain hash h: 0, or -1 without memory. */
int ideal_add(replay *r, uint64_t h);
/* Tokens of tok[0..n) an unbounded cache would match: whole pages, as the manager matches. */
size_t ideal_match(const replay *r, const int32_t *tok, size_t n);

#endif

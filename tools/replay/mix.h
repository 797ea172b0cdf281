/* mix.h — kvhal-replay's mixing function, the rolling hash that names a token's prefix, and the generator the
 * workload and the checks draw from. */
#ifndef KVHAL_REPLAY_MIX_H
#define KVHAL_REPLAY_MIX_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* The rolling hash that names a token's prefix: equal hashes <=> (almost surely) equal token prefixes. */
static inline uint64_t hash_step(uint64_t h, int32_t tok) { return mix64(h + 0x9e3779b97f4a7c15ULL + (uint32_t)tok); }
#define HASH_START 0x6b7668616c2d7270ULL

static inline uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    return mix64(*s);
}

static inline size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

#endif

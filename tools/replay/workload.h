/* workload.h — kvhal-replay's workloads: the generated shared-prefix shape (groups x prompts, system prompt,
 * question, output; optional zipf group popularity) or a JSONL trace, and the tokens and prefix hashes of every
 * request. */
#ifndef KVHAL_REPLAY_WORKLOAD_H
#define KVHAL_REPLAY_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "options.h"
#include "replay_trace.h"

typedef struct wreq {
    uint32_t in_len, out_len;
    int32_t group;   /* shared prefix: the group; trace: -1 */
    uint32_t index;  /* shared prefix: index in the group; trace: index in the trace */
} wreq;

typedef struct workload {
    bool trace;
    wreq *reqs;
    size_t n;
    size_t max_len;
    uint64_t total_in, total_out;
    /* materialized tokens and prefix hashes of every request when they fit. hash[k] names the prefix through
     * token (k+1)*hstride-1: every token (hstride 1) for K/V content, every page end with --no-kv */
    int32_t *tok;
    uint64_t *hash; /* K/V mode */
    uint32_t *tag;  /* --no-kv: the 32 bits of each hash that the shadow keeps; half the memory to stream */
    size_t *toff, *hoff;
    size_t hstride;
    replay_trace tr;
    int64_t block, vocab;
    uint64_t seed;
    int64_t system_len, question_len;
    char name[256];
} workload;

/* Builds the workload of o (a trace is loaded and checked: its failure is reported). 0, or -1 (workload_free
 * still frees what was built). */
int workload_init(workload *w, const options *o);
void workload_free(workload *w);
/* Tokens of request i, and its prefix hashes (hash) or their low 32 bits (tag), whichever is not NULL. */
void gen_tokens(const workload *w, size_t i, int32_t *tok, uint64_t *hash, uint32_t *tag);

#endif

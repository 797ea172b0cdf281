/* kvhal-replay — drives a serving workload through the cache manager (block pool + prefix cache) and the paged
 * cache, the way an inference engine would: per request match + lock, allocate, write K and V of every new token
 * in every layer with the paged-caching op, decode steps appending one token at a time, cache_finished. Every
 * prefix hit is verified by reading back sampled rows of the matched prefix: the content written for a token is
 * a function of a rolling hash of the token ids up to it (and of layer, head and K/V), so a wrong page returned by
 * the prefix cache is detected, not just a wrong position. --no-kv keeps only the page bookkeeping (the radix
 * benchmark) and checks hits against a per-page shadow of the prefix hash instead.
 * Workloads: the generated shared-prefix shape (groups x prompts, system prompt, question, output; optional zipf
 * group popularity) or a JSONL trace {timestamp, input_length, output_length, hash_ids}.
 *
 * The rooms (tools/replay/, each file's header says what it holds), from the bottom up: failure, mix, clock,
 * options, replay_trace; workload, kv; replay (the run's state); check, events, report; engine; run; soak; main. */
#include <stdio.h>

#include "failure.h"
#include "options.h"
#include "run.h"
#include "soak.h"
#include "tool_common.h"

int main(int argc, char **argv)
{
    tool_stdout_guard();
    options o;
    default_options(&o);
    int p = parse_options(argc, argv, &o);
    if (p < 0) return TOOL_EXIT_USAGE;
    if (p == 1) {
        usage(stdout);
        return tool_exit(REPLAY_TOOL, TOOL_EXIT_OK);
    }
    if (p == 3) {
        tool_print_version(REPLAY_TOOL);
        return tool_exit(REPLAY_TOOL, TOOL_EXIT_OK);
    }
    return tool_exit(REPLAY_TOOL, p == 2 ? run_soak(&o) : run_replay(&o));
}

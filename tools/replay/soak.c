/* soak.c — see soak.h. */
#include "soak.h"

#include <stdio.h>

#include "run.h"

/* The CI soak: eviction pressure (the cache holds a fraction of the workload), locks held by a large batch,
 * integrity checked every few requests, at page sizes 1, 4 and 16 and with the naive cache, three workload seeds
 * each. */
int run_soak(const options *base)
{
    static const struct {
        int32_t ps, batch;
        kvhal_prefix_kind kind;
        double zipf;
        const char *budget;
        kvhal_paged_layout layout;
    } runs[] = {
        {16, 16, KVHAL_PREFIX_RADIX, 1.1, "12MiB", KVHAL_LAYOUT_NHD},
        {1, 8, KVHAL_PREFIX_RADIX, 0.8, "8MiB", KVHAL_LAYOUT_NHD},
        {4, 32, KVHAL_PREFIX_RADIX, 1.3, "10MiB", KVHAL_LAYOUT_HND},
        {4, 8, KVHAL_PREFIX_NAIVE, 0, "8MiB", KVHAL_LAYOUT_NHD},
    };
    int failed = 0;
    size_t nruns = sizeof runs / sizeof runs[0];
    for (size_t j = 0; j < 3 * nruns; j++) {
        size_t i = j % nruns;
        options o = *base;
        o.page_size = runs[i].ps;
        o.batch = runs[i].batch;
        o.kind = runs[i].kind;
        o.zipf = runs[i].zipf;
        o.layout = runs[i].layout;
        parse_size("--kv-budget", runs[i].budget, &o.budget);
        o.groups = 32;
        o.prompts = 24;
        o.system_len = 1000;
        o.question_len = 100;
        o.output_len = 60;
        o.check_every = 16;
        o.samples = 16;
        o.repeat = 1;
        o.seed = base->seed + j;
        o.finish_whole = j / nruns == 1; /* the second round finishes requests the other way */
        if (!o.json)
            printf("== soak %zu/%zu: page size %d, batch %d, %s, budget %s, %s, seed %llu\n", j + 1, 3 * nruns,
                   (int)o.page_size, (int)o.batch, o.kind == KVHAL_PREFIX_RADIX ? "radix" : "naive", runs[i].budget,
                   o.finish_whole ? "cache_finished" : "cache_finished_suffix", (unsigned long long)o.seed);
        fflush(stdout);
        if (run_replay(&o) != 0) failed++;
    }
    if (!base->json) printf("soak: %s\n", failed ? "FAIL" : "PASS");
    return failed ? 1 : 0;
}

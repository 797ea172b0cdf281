/* clock.c — see clock.h. */
#include "clock.h"

#include <stdio.h>
#include <string.h>

bool replay_use_tsc;

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void tick_init(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    char cs[32] = "";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f) {
        if (!fgets(cs, sizeof cs, f)) cs[0] = '\0';
        fclose(f);
    }
    replay_use_tsc = strcmp(cs, "tsc\n") == 0;
#endif
}

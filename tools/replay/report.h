/* report.h — what kvhal-replay prints: progress on stderr while it runs, and the summary of a run (text, or with
 * --json one object: percentiles of the per-call times, null for what was not measured, the error object when a
 * check failed). */
#ifndef KVHAL_REPLAY_REPORT_H
#define KVHAL_REPLAY_REPORT_H

#include <stdbool.h>

#include "replay.h"

/* A progress bar on a terminal, a line per tenth of the work otherwise; nothing with --quiet or --json. force:
 * now, and the bar's last line. */
void progress(replay *r, bool force);
/* The summary on stdout. device: the device's name (unused with --no-kv). Sorts the per-call samples. */
void print_summary(const replay *r, const workload *w, const char *device);

/* --timeline: the CSV header, and a row for the window of requests finished since the last row (prompt tokens
 * admitted, device and host hits, pages evicted from each tier in it). end_of_pass: the pass's last, partial
 * window (nothing when it is empty). */
void timeline_header(replay *r);
/* A pass starts: its first window counts from here. */
void timeline_pass_start(replay *r);
void timeline_row(replay *r, bool end_of_pass);

#endif

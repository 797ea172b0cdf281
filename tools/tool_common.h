/* tool_common.h — what kvhal's command-line tools share so that they behave alike (README, "Tools"):
 * `<tool>: error: <message>` on stderr, exit codes (0 success, 1 the run or a verification failed, 2 usage),
 * `--version` printing `<tool> <kvhal version>`, number parsing for getopt_long arguments, JSON output (strings,
 * null for what was not measured, the failure object) and percentiles. */
#ifndef KVHAL_TOOL_COMMON_H
#define KVHAL_TOOL_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvhal.h"

enum { TOOL_EXIT_OK = 0, TOOL_EXIT_FAILED = 1, TOOL_EXIT_USAGE = 2 };

/* "<tool>: error: <message>\n" on stderr. */
void tool_error(const char *tool, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "<tool> <kvhal_version()>\n" on stdout. */
void tool_print_version(const char *tool);
/* A usage error: the message, then "Try '<tool> --help'." on stderr; returns TOOL_EXIT_USAGE. */
int tool_usage_error(const char *tool, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses a whole decimal integer in [lo, hi] into *out; false (and a usage error naming --opt) otherwise. */
bool tool_parse_i64(const char *tool, const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out);
/* A double in [lo, hi]. */
bool tool_parse_f64(const char *tool, const char *opt, const char *text, double lo, double hi, double *out);

/* JSON: a string with escapes; a number, or null when !measured (or not finite). */
void tool_json_str(FILE *f, const char *s);
void tool_json_num(FILE *f, double v, bool measured);
/* {"ok": false, "version": "...", "error": {"status": "KVHAL_...", "message": "..."}} and a newline. status may be
 * a kvhal status name or the tool's own ("USAGE", "VERIFICATION_FAILED"). */
void tool_json_failure(FILE *f, const char *status, const char *message);

/* Percentiles of v[0..n) by nearest rank (v is sorted in place); NaN for n == 0. */
typedef struct tool_percentiles {
    double p50, p90, p99, mean, min, max;
    size_t n;
} tool_percentiles;
tool_percentiles tool_percentiles_of(double *v, size_t n);
/* "p50":x,"p90":y,"p99":z,"mean":m,"min":a,"max":b,"n":k (no braces; null for each when n == 0). */
void tool_json_percentiles(FILE *f, const tool_percentiles *p);

#endif

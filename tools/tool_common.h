/* tool_common.h — what kvhal's command-line tools share so that they behave alike (README, "Tools"):
 * `<tool>: error: <message>` on stderr, exit codes (0 success, 1 the run or a verification failed or its output
 * was lost, 2 usage), `-V`/`--version` printing `<tool> <kvhal_version()>` (the loaded library's), number parsing
 * for getopt_long arguments, the one JSON writer (objects that open with "ok", "tool" and "version"; null for what
 * was not measured; the failure object), output checks (a full disk or a closed stdout is an error) and
 * percentiles. */
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
/* {"ok": false, "tool": ..., "version": ..., "error": {"status": "KVHAL_...", "message": "..."}} and a newline.
 * status may be a kvhal status name or the tool's own ("USAGE", "VERIFICATION_FAILED"). */
void tool_json_failure(FILE *f, const char *tool, const char *status, const char *message);
/* A progress line on stderr: "<tool>: <done>/<total> <unit> (<pct>%), <elapsed> s, ETA <eta> s[: <what>]";
 * t0 is tool_now_s() at the start. */
double tool_now_s(void);
void tool_progress(const char *tool, size_t done, size_t total, const char *unit, double t0, const char *what);

/* Output that cannot be lost silently. tool_stdout_guard, first thing in main: a closed stdout (fd 1) is taken by
 * /dev/null so that no file the tool opens lands there, and remembered. tool_close_output: flushes and closes f
 * (named what in the message), false with "<tool>: error: <what>: <reason>" when anything written to it was lost.
 * tool_exit: the exit status rc, or TOOL_EXIT_FAILED when stdout was closed or its output was lost (said on
 * stderr). */
void tool_stdout_guard(void);
bool tool_close_output(const char *tool, FILE *f, const char *what);
/* The same without the message: the reason in reason[cap] when false. */
bool tool_close_file(FILE *f, char *reason, size_t cap);
int tool_exit(const char *tool, int rc);

/* The JSON writer: objects and arrays nested up to 16 deep, commas placed by the writer. A key is given inside
 * an object and NULL inside an array or at the top. */
typedef struct tool_json {
    FILE *f;
    int depth;
    bool first[16];
} tool_json;
void tool_json_init(tool_json *j, FILE *f);
void tool_json_open(tool_json *j, const char *key);        /* { */
void tool_json_close(tool_json *j);                        /* } (a newline after the outermost one) */
void tool_json_open_array(tool_json *j, const char *key);  /* [ */
void tool_json_close_array(tool_json *j);                  /* ] */
void tool_json_key_str(tool_json *j, const char *key, const char *v); /* NULL: null */
void tool_json_key_num(tool_json *j, const char *key, double v, bool measured);
void tool_json_key_int(tool_json *j, const char *key, long long v);
void tool_json_key_bool(tool_json *j, const char *key, bool v);
void tool_json_key_raw(tool_json *j, const char *key, const char *json); /* already JSON text */
/* Opens the top object with the keys every tool's object starts with: "ok", "tool", "version" (kvhal_version()). */
void tool_json_head(tool_json *j, const char *tool, bool ok);
/* "error": {"status": ..., "message": ...} inside the open object. */
void tool_json_error(tool_json *j, const char *status, const char *message);

/* Percentiles of v[0..n) by nearest rank (v is sorted in place); NaN for n == 0. */
typedef struct tool_percentiles {
    double p50, p90, p99, mean, min, max;
    size_t n;
} tool_percentiles;
tool_percentiles tool_percentiles_of(double *v, size_t n);
/* "p50":x,"p90":y,"p99":z,"mean":m,"min":a,"max":b,"n":k (no braces; null for each when n == 0). */
void tool_json_percentiles(FILE *f, const tool_percentiles *p);

#endif

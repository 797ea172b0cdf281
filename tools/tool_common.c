/* tool_common.c — see tool_common.h. */
#include "tool_common.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void tool_error(const char *tool, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", tool);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void tool_print_version(const char *tool) { printf("%s %s\n", tool, kvhal_version()); }

int tool_usage_error(const char *tool, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", tool);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s --help'.\n", tool);
    va_end(ap);
    return TOOL_EXIT_USAGE;
}

bool tool_parse_i64(const char *tool, const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = text && *text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || errno || *end || v < lo || v > hi) {
        tool_usage_error(tool, "--%s: '%s' is not an integer in [%lld, %lld]", opt, text ? text : "",
                         (long long)lo, (long long)hi);
        return false;
    }
    *out = v;
    return true;
}

bool tool_parse_f64(const char *tool, const char *opt, const char *text, double lo, double hi, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = text && *text ? strtod(text, &end) : 0;
    if (!text || !*text || errno || *end || !(v >= lo && v <= hi)) {
        tool_usage_error(tool, "--%s: '%s' is not a number in [%g, %g]", opt, text ? text : "", lo, hi);
        return false;
    }
    *out = v;
    return true;
}

void tool_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void tool_json_num(FILE *f, double v, bool measured)
{
    if (!measured || !isfinite(v)) fputs("null", f);
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) fprintf(f, "%.0f", v); /* integers exactly */
    else fprintf(f, "%.9g", v);
}

void tool_json_failure(FILE *f, const char *tool, const char *status, const char *message)
{
    tool_json j;
    tool_json_init(&j, f);
    tool_json_head(&j, tool, false);
    tool_json_error(&j, status, message);
    tool_json_close(&j);
}

void tool_json_init(tool_json *j, FILE *f)
{
    j->f = f;
    j->depth = 0;
    j->first[0] = true;
}

/* The comma before an element and its key. */
static void json_key(tool_json *j, const char *key)
{
    if (!j->first[j->depth]) fputs(", ", j->f);
    j->first[j->depth] = false;
    if (key) {
        tool_json_str(j->f, key);
        fputs(": ", j->f);
    }
}

static void json_push(tool_json *j, const char *key, char c)
{
    json_key(j, key);
    fputc(c, j->f);
    if (j->depth < 15) j->depth++;
    j->first[j->depth] = true;
}

void tool_json_open(tool_json *j, const char *key) { json_push(j, key, '{'); }
void tool_json_open_array(tool_json *j, const char *key) { json_push(j, key, '['); }

void tool_json_close(tool_json *j)
{
    fputc('}', j->f);
    if (j->depth > 0) j->depth--;
    if (j->depth == 0) fputc('\n', j->f);
}

void tool_json_close_array(tool_json *j)
{
    fputc(']', j->f);
    if (j->depth > 0) j->depth--;
}

void tool_json_key_str(tool_json *j, const char *key, const char *v)
{
    json_key(j, key);
    if (v) tool_json_str(j->f, v);
    else fputs("null", j->f);
}

void tool_json_key_num(tool_json *j, const char *key, double v, bool measured)
{
    json_key(j, key);
    tool_json_num(j->f, v, measured);
}

void tool_json_key_int(tool_json *j, const char *key, long long v)
{
    json_key(j, key);
    fprintf(j->f, "%lld", v);
}

void tool_json_key_bool(tool_json *j, const char *key, bool v)
{
    json_key(j, key);
    fputs(v ? "true" : "false", j->f);
}

void tool_json_key_raw(tool_json *j, const char *key, const char *json)
{
    json_key(j, key);
    fputs(json, j->f);
}

void tool_json_head(tool_json *j, const char *tool, bool ok)
{
    tool_json_open(j, NULL);
    tool_json_key_bool(j, "ok", ok);
    tool_json_key_str(j, "tool", tool);
    tool_json_key_str(j, "version", kvhal_version());
}

void tool_json_error(tool_json *j, const char *status, const char *message)
{
    tool_json_open(j, "error");
    tool_json_key_str(j, "status", status);
    tool_json_key_str(j, "message", message);
    tool_json_close(j);
}

static bool stdout_was_closed;

void tool_stdout_guard(void)
{
    if (fcntl(1, F_GETFD) != -1 || errno != EBADF) return;
    stdout_was_closed = true;
    const int fd = open("/dev/null", O_WRONLY);
    if (fd >= 0 && fd != 1) close(fd); /* 1 is the lowest free descriptor: open takes it */
}

bool tool_close_file(FILE *f, char *reason, size_t cap)
{
    const bool earlier = ferror(f) != 0; /* a write that failed before (its errno is gone) */
    errno = 0;
    int e = 0;
    if (fflush(f) != 0) e = errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (!earlier && !e) return true;
    snprintf(reason, cap, "%s", e ? strerror(e) : "a write failed");
    return false;
}

bool tool_close_output(const char *tool, FILE *f, const char *what)
{
    char reason[128];
    if (tool_close_file(f, reason, sizeof reason)) return true;
    tool_error(tool, "%s: the output was lost (%s)", what, reason);
    return false;
}

int tool_exit(const char *tool, int rc)
{
    if (stdout_was_closed) {
        fflush(stdout);
        tool_error(tool, "standard output is closed: the output was lost");
        return TOOL_EXIT_FAILED;
    }
    if (!tool_close_output(tool, stdout, "standard output")) return TOOL_EXIT_FAILED;
    return rc;
}

double tool_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tool_progress(const char *tool, size_t done, size_t total, const char *unit, double t0, const char *what)
{
    const double el = tool_now_s() - t0;
    fprintf(stderr, "%s: %zu/%zu %s (%.0f%%), %.1f s", tool, done, total, unit,
            total ? 100.0 * (double)done / (double)total : 100.0, el);
    if (done > 0 && done < total) fprintf(stderr, ", ETA %.0f s", el / (double)done * (double)(total - done));
    if (what && *what) fprintf(stderr, ": %s", what);
    fputc('\n', stderr);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double rank(const double *v, size_t n, double q)
{
    /* nearest rank: the smallest value with at least q of the values at or below it */
    size_t k = (size_t)ceil(q * (double)n);
    return v[k == 0 ? 0 : k - 1];
}

tool_percentiles tool_percentiles_of(double *v, size_t n)
{
    tool_percentiles p = {NAN, NAN, NAN, NAN, NAN, NAN, n};
    if (n == 0) return p;
    qsort(v, n, sizeof v[0], cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    p.p50 = rank(v, n, 0.50);
    p.p90 = rank(v, n, 0.90);
    p.p99 = rank(v, n, 0.99);
    p.mean = sum / (double)n;
    p.min = v[0];
    p.max = v[n - 1];
    return p;
}

void tool_json_percentiles(FILE *f, const tool_percentiles *p)
{
    const bool m = p->n > 0;
    fprintf(f, "\"p50\":");
    tool_json_num(f, p->p50, m);
    fprintf(f, ",\"p90\":");
    tool_json_num(f, p->p90, m);
    fprintf(f, ",\"p99\":");
    tool_json_num(f, p->p99, m);
    fprintf(f, ",\"mean\":");
    tool_json_num(f, p->mean, m);
    fprintf(f, ",\"min\":");
    tool_json_num(f, p->min, m);
    fprintf(f, ",\"max\":");
    tool_json_num(f, p->max, m);
    fprintf(f, ",\"n\":%zu", p->n);
}

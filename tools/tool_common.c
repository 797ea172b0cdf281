/* tool_common.c — see tool_common.h. */
#include "tool_common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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

void tool_json_failure(FILE *f, const char *status, const char *message)
{
    fprintf(f, "{\"ok\":false,\"version\":");
    tool_json_str(f, kvhal_version());
    fprintf(f, ",\"error\":{\"status\":");
    tool_json_str(f, status);
    fprintf(f, ",\"message\":");
    tool_json_str(f, message);
    fprintf(f, "}}\n");
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

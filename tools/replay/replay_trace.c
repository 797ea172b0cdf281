/* replay_trace.c — a small hand-written JSON reader for the JSONL traces kvhal-replay takes (see replay_trace.h).
 * It accepts exactly one object per line, reads the four fields it knows, skips any other value (nesting bounded,
 * so hostile input cannot exhaust the stack: the skipper is iterative anyway), and names the line, column and
 * field of the first problem it meets. */
#include "replay_trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct cursor {
    const char *s;
    size_t len, pos;
    char *err;
    size_t err_size;
} cursor;

static int fail(cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(cursor *c, const char *fmt, ...)
{
    int n = snprintf(c->err, c->err_size, "column %zu: ", c->pos + 1);
    if (n < 0) n = 0;
    if ((size_t)n < c->err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->err_size - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static void skip_ws(cursor *c)
{
    while (c->pos < c->len) {
        char ch = c->s[c->pos];
        if (ch != ' ' && ch != '\t' && ch != '\r' && ch != '\n') break;
        c->pos++;
    }
}

static int peek(const cursor *c) { return c->pos < c->len ? (unsigned char)c->s[c->pos] : -1; }

/* A printable excerpt of the text at pos, for messages. */
static const char *excerpt(const cursor *c, size_t pos, char *buf, size_t size)
{
    size_t n = 0;
    while (pos + n < c->len && n + 1 < size && n < 24) {
        char ch = c->s[pos + n];
        if (ch == ',' || ch == '}' || ch == ']' || ch == '\n') break;
        buf[n] = (ch >= 32 && ch < 127) ? ch : '?';
        n++;
    }
    buf[n] = '\0';
    if (n == 0) snprintf(buf, size, "%s", pos < c->len ? "(a separator)" : "(end of line)");
    return buf;
}

/* The four hex digits at s (known to be in the line); -1 if they are not hex. */
static long hex4(const char *s)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        char h = s[i];
        int d = h >= '0' && h <= '9'   ? h - '0'
                : h >= 'a' && h <= 'f' ? h - 'a' + 10
                : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Length of the well-formed UTF-8 sequence at s[0..n) (RFC 3629: no overlong forms, no surrogates, <= U+10FFFF),
 * 0 if it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned char b = s[0];
    size_t k;
    uint32_t cp;
    if (b < 0x80) return 1;
    if (b >= 0xc2 && b <= 0xdf) k = 2, cp = b & 0x1f;
    else if (b >= 0xe0 && b <= 0xef) k = 3, cp = b & 0x0f;
    else if (b >= 0xf0 && b <= 0xf4) k = 4, cp = b & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return k;
}

/* Appends code point cp as UTF-8 to out (n bytes so far, out_size room; *cut set when it does not fit). */
static void put_utf8(char *out, size_t out_size, size_t *n, uint32_t cp, bool *cut)
{
    char b[4];
    size_t k;
    k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    static const unsigned char lead[5] = {0, 0x00, 0xc0, 0xe0, 0xf0};
    for (size_t i = k - 1; i > 0; i--, cp >>= 6) b[i] = (char)(0x80 | (cp & 0x3f));
    b[0] = (char)(lead[k] | cp);
    if (*n + k >= out_size) {
        *cut = true;
        return;
    }
    memcpy(out + *n, b, k);
    *n += k;
}

/* A JSON string (RFC 8259): raw bytes must be well-formed UTF-8, escapes are checked (a \\u surrogate must be a
 * high one followed by a low one). Its decoded content goes to out when given; *cut (when given) tells that it did
 * not fit in out_size - 1 bytes (such a string is never equal to a shorter name). */
static int parse_string_cut(cursor *c, char *out, size_t out_size, const char *what, bool *cut_out)
{
    if (peek(c) != '"') {
        char b[32];
        return fail(c, "expected %s (a string in double quotes), found \"%s\"", what, excerpt(c, c->pos, b, sizeof b));
    }
    size_t start = ++c->pos, n = 0;
    bool cut = false;
    while (c->pos < c->len) {
        unsigned char ch = (unsigned char)c->s[c->pos];
        if (ch == '"') {
            c->pos++;
            if (out) out[n] = '\0';
            if (cut_out) *cut_out = cut;
            return 0;
        }
        if (ch < 0x20) return fail(c, "control character 0x%02x inside %s", ch, what);
        if (ch == '\\') {
            if (c->pos + 1 >= c->len) break;
            char e = c->s[c->pos + 1];
            if (!strchr("\"\\/bfnrtu", e) || e == '\0')
                return fail(c, "invalid escape \\%c inside %s", e >= 32 && e < 127 ? e : '?', what);
            uint32_t cp = 0;
            size_t adv = 2;
            if (e == 'u') {
                long v = c->pos + 6 <= c->len ? hex4(c->s + c->pos + 2) : -1;
                if (v < 0) return fail(c, "invalid \\u escape inside %s", what);
                cp = (uint32_t)v;
                adv = 6;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return fail(c, "\\u%04x inside %s: a low surrogate without a high one before it", (unsigned)cp,
                                what);
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    long lo = c->pos + 12 <= c->len && c->s[c->pos + 6] == '\\' && c->s[c->pos + 7] == 'u'
                                  ? hex4(c->s + c->pos + 8) : -1;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return fail(c, "\\u%04x inside %s: a high surrogate not followed by a low one", (unsigned)cp,
                                    what);
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (uint32_t)(lo - 0xdc00);
                    adv = 12;
                }
            } else {
                static const char from[] = "bfnrt", to[] = "\b\f\n\r\t";
                const char *at = strchr(from, e);
                cp = (uint32_t)(unsigned char)(at ? to[at - from] : e);
            }
            if (out) {
                if (cp == 0) cut = true; /* a NUL in a name: equal to no name */
                else put_utf8(out, out_size, &n, cp, &cut);
            }
            c->pos += adv;
            continue;
        }
        size_t k = utf8_len((const unsigned char *)c->s + c->pos, c->len - c->pos);
        if (k == 0) return fail(c, "invalid UTF-8 (byte 0x%02x) inside %s", ch, what);
        if (out) {
            if (n + k < out_size) {
                memcpy(out + n, c->s + c->pos, k);
                n += k;
            } else {
                cut = true;
            }
        }
        c->pos += k;
    }
    c->pos = start - 1;
    return fail(c, "unterminated %s", what);
}

static int parse_string(cursor *c, char *out, size_t out_size, const char *what)
{
    return parse_string_cut(c, out, out_size, what, NULL);
}

/* Scans a JSON number; [start, end) is its text. */
static int scan_number(cursor *c, size_t *start, bool *is_int)
{
    size_t p = c->pos;
    *start = p;
    *is_int = true;
    if (p < c->len && c->s[p] == '-') p++;
    if (p >= c->len || c->s[p] < '0' || c->s[p] > '9') return -1;
    if (c->s[p] == '0') p++;
    else
        while (p < c->len && c->s[p] >= '0' && c->s[p] <= '9') p++;
    if (p < c->len && c->s[p] == '.') {
        *is_int = false;
        p++;
        if (p >= c->len || c->s[p] < '0' || c->s[p] > '9') return -1;
        while (p < c->len && c->s[p] >= '0' && c->s[p] <= '9') p++;
    }
    if (p < c->len && (c->s[p] == 'e' || c->s[p] == 'E')) {
        *is_int = false;
        p++;
        if (p < c->len && (c->s[p] == '+' || c->s[p] == '-')) p++;
        if (p >= c->len || c->s[p] < '0' || c->s[p] > '9') return -1;
        while (p < c->len && c->s[p] >= '0' && c->s[p] <= '9') p++;
    }
    c->pos = p;
    return 0;
}

/* A non-negative integer <= max. */
static int parse_uint(cursor *c, const char *field, int64_t max, int64_t *out)
{
    size_t start;
    bool is_int;
    char b[32];
    if (scan_number(c, &start, &is_int) != 0 || !is_int || c->s[start] == '-') {
        c->pos = start;
        return fail(c, "field \"%s\": expected a non-negative integer, found \"%s\"", field,
                    excerpt(c, start, b, sizeof b));
    }
    int64_t v = 0;
    for (size_t i = start; i < c->pos; i++) {
        int d = c->s[i] - '0';
        if (v > (max - d) / 10) {
            c->pos = start;
            return fail(c, "field \"%s\": %s exceeds the limit %lld", field, excerpt(c, start, b, sizeof b),
                        (long long)max);
        }
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_double(cursor *c, const char *field, double *out)
{
    size_t start;
    bool is_int;
    char b[32];
    if (scan_number(c, &start, &is_int) != 0) {
        c->pos = start;
        return fail(c, "field \"%s\": expected a number, found \"%s\"", field, excerpt(c, start, b, sizeof b));
    }
    char num[64];
    size_t n = c->pos - start;
    if (n >= sizeof num) {
        c->pos = start;
        return fail(c, "field \"%s\": number of %zu characters is too long", field, n);
    }
    memcpy(num, c->s + start, n);
    num[n] = '\0';
    errno = 0;
    *out = strtod(num, NULL);
    if (errno == ERANGE) {
        c->pos = start;
        return fail(c, "field \"%s\": %s is out of range", field, num);
    }
    return 0;
}

static bool match_word(cursor *c, const char *w)
{
    size_t n = strlen(w);
    if (c->len - c->pos >= n && memcmp(c->s + c->pos, w, n) == 0) {
        c->pos += n;
        return true;
    }
    return false;
}

/* Skips any JSON value, iteratively, nesting at most MAX_DEPTH deep. */
static int skip_value(cursor *c, const char *field)
{
    char stack[MAX_DEPTH];
    int depth = 0;
    for (;;) {
        skip_ws(c);
        int ch = peek(c);
        char b[32];
        if (ch == '"') {
            if (parse_string(c, NULL, 0, "a string") != 0) return -1;
        } else if (ch == '{' || ch == '[') {
            if (depth == MAX_DEPTH)
                return fail(c, "field \"%s\": nested more than %d levels deep", field, MAX_DEPTH);
            stack[depth++] = (char)ch;
            c->pos++;
            skip_ws(c);
            int close = ch == '{' ? '}' : ']';
            if (peek(c) == close) {
                c->pos++;
                depth--;
                goto after_value;
            }
            if (ch == '{') {
                if (parse_string(c, NULL, 0, "an object key") != 0) return -1;
                skip_ws(c);
                if (peek(c) != ':') return fail(c, "field \"%s\": expected ':' after an object key", field);
                c->pos++;
            }
            continue;
        } else if (ch == '-' || (ch >= '0' && ch <= '9')) {
            size_t start;
            bool is_int;
            if (scan_number(c, &start, &is_int) != 0) {
                c->pos = start;
                return fail(c, "field \"%s\": malformed number \"%s\"", field, excerpt(c, start, b, sizeof b));
            }
        } else if (!match_word(c, "true") && !match_word(c, "false") && !match_word(c, "null")) {
            return fail(c, "field \"%s\": expected a value, found \"%s\"", field, excerpt(c, c->pos, b, sizeof b));
        }
    after_value:
        for (;;) {
            if (depth == 0) return 0;
            skip_ws(c);
            int close = stack[depth - 1] == '{' ? '}' : ']';
            int nx = peek(c);
            if (nx == close) {
                c->pos++;
                depth--;
                continue;
            }
            if (nx != ',') return fail(c, "field \"%s\": expected ',' or '%c' inside the value", field, close);
            c->pos++;
            if (stack[depth - 1] == '{') {
                skip_ws(c);
                if (parse_string(c, NULL, 0, "an object key") != 0) return -1;
                skip_ws(c);
                if (peek(c) != ':') return fail(c, "field \"%s\": expected ':' after an object key", field);
                c->pos++;
            }
            break;
        }
    }
}

static int parse_ids(cursor *c, int64_t **ids, size_t *num_ids, size_t *cap_ids, size_t *count)
{
    if (peek(c) != '[') {
        char b[32];
        return fail(c, "field \"hash_ids\": expected an array of integers, found \"%s\"",
                    excerpt(c, c->pos, b, sizeof b));
    }
    c->pos++;
    skip_ws(c);
    *count = 0;
    if (peek(c) == ']') {
        c->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        int64_t v;
        if (parse_uint(c, "hash_ids", INT64_MAX, &v) != 0) return -1;
        if (*count == REPLAY_TRACE_MAX_IDS)
            return fail(c, "field \"hash_ids\": more than %d ids", REPLAY_TRACE_MAX_IDS);
        if (*num_ids == *cap_ids) {
            size_t cap = *cap_ids ? *cap_ids * 2 : 1024;
            int64_t *grown = realloc(*ids, cap * sizeof **ids);
            if (!grown) return fail(c, "out of memory for %zu hash ids", cap);
            *ids = grown;
            *cap_ids = cap;
        }
        (*ids)[(*num_ids)++] = v;
        (*count)++;
        skip_ws(c);
        int ch = peek(c);
        if (ch == ',') {
            c->pos++;
            continue;
        }
        if (ch == ']') {
            c->pos++;
            return 0;
        }
        return fail(c, "field \"hash_ids\": expected ',' or ']' after an id");
    }
}

int replay_trace_parse_line(const char *line, size_t len, replay_trace_request *out, int64_t **ids, size_t *num_ids,
                            size_t *cap_ids, char *err, size_t err_size)
{
    cursor c = {line, len, 0, err, err_size};
    if (err_size) err[0] = '\0';
    if (len && memchr(line, '\0', len)) {
        c.pos = (size_t)((const char *)memchr(line, '\0', len) - line);
        return fail(&c, "NUL byte in the line");
    }
    skip_ws(&c);
    if (c.pos == len) return 0;
    if (peek(&c) != '{') {
        char b[32];
        return fail(&c, "expected a JSON object '{', found \"%s\"", excerpt(&c, c.pos, b, sizeof b));
    }
    c.pos++;
    size_t ids_before = *num_ids;
    replay_trace_request r = {0};
    r.first_id = ids_before;
    bool seen_ts = false, seen_in = false, seen_out = false, seen_ids = false;
    skip_ws(&c);
    if (peek(&c) == '}') {
        c.pos++;
    } else {
        for (;;) {
            skip_ws(&c);
            char key[64];
            size_t key_pos = c.pos;
            bool key_cut = false;
            if (parse_string_cut(&c, key, sizeof key, "a field name", &key_cut) != 0) goto bad;
            if (key_cut) key[0] = '\0'; /* longer than any known name (and escapes decoded): an unknown field */
            skip_ws(&c);
            if (peek(&c) != ':') {
                fail(&c, "expected ':' after field \"%s\"", key);
                goto bad;
            }
            c.pos++;
            skip_ws(&c);
            bool *seen = NULL;
            int rc = 0;
            if (!strcmp(key, "timestamp")) {
                seen = &seen_ts;
                if (!*seen) rc = parse_double(&c, key, &r.timestamp);
            } else if (!strcmp(key, "input_length")) {
                seen = &seen_in;
                if (!*seen) rc = parse_uint(&c, key, REPLAY_TRACE_MAX_TOKENS, &r.input_length);
            } else if (!strcmp(key, "output_length")) {
                seen = &seen_out;
                if (!*seen) rc = parse_uint(&c, key, REPLAY_TRACE_MAX_TOKENS, &r.output_length);
            } else if (!strcmp(key, "hash_ids")) {
                seen = &seen_ids;
                if (!*seen) rc = parse_ids(&c, ids, num_ids, cap_ids, &r.num_ids);
            } else {
                rc = skip_value(&c, key);
            }
            if (seen && *seen) {
                c.pos = key_pos;
                fail(&c, "field \"%s\" appears twice", key);
                goto bad;
            }
            if (rc != 0) goto bad;
            if (seen) *seen = true;
            skip_ws(&c);
            int ch = peek(&c);
            if (ch == ',') {
                c.pos++;
                continue;
            }
            if (ch == '}') {
                c.pos++;
                break;
            }
            fail(&c, "expected ',' or '}' after field \"%s\"", key);
            goto bad;
        }
    }
    skip_ws(&c);
    if (c.pos != len) {
        fail(&c, "unexpected text after the object (one object per line)");
        goto bad;
    }
    const char *missing = !seen_in ? "input_length" : !seen_out ? "output_length" : !seen_ids ? "hash_ids" : NULL;
    if (missing) {
        fail(&c, "missing field \"%s\"", missing);
        goto bad;
    }
    if (r.input_length + r.output_length > REPLAY_TRACE_MAX_TOKENS) {
        fail(&c, "field \"output_length\": input_length + output_length = %lld exceeds the limit %d",
             (long long)(r.input_length + r.output_length), REPLAY_TRACE_MAX_TOKENS);
        goto bad;
    }
    *out = r;
    return 1;
bad:
    *num_ids = ids_before;
    return -1;
}

/* One line into *buf (grown as needed, the newline dropped), read byte by byte up to max bytes: 1 a line, 0 the end
 * of the file, -1 a line longer than max (the rest of it is not read), -2 out of memory. */
static int read_line(FILE *f, char **buf, size_t *cap, size_t max, size_t *len)
{
    size_t n = 0;
    int ch;
    while ((ch = getc_unlocked(f)) != EOF) {
        if (ch == '\n') break;
        if (n == max) return -1;
        if (n + 1 >= *cap) {
            size_t ncap = *cap ? *cap * 2 : 4096;
            if (ncap > max + 1) ncap = max + 1;
            char *g = realloc(*buf, ncap);
            if (!g) return -2;
            *buf = g;
            *cap = ncap;
        }
        (*buf)[n++] = (char)ch;
    }
    if (ch == EOF && n == 0) return 0;
    *len = n;
    return 1;
}

int replay_trace_load_block(const char *path, int64_t block, replay_trace *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t line_cap = 0, cap_reqs = 0, cap_ids = 0, lineno = 0, n = 0;
    char msg[512];
    int rc = 0, got_line;
    double last_ts = 0;
    bool have_ts = false;
    while ((got_line = read_line(f, &line, &line_cap, REPLAY_TRACE_MAX_LINE, &n)) != 0) {
        lineno++;
        if (got_line < 0) {
            if (got_line == -1)
                snprintf(err, err_size, "%s:%zu: line longer than %zu bytes (REPLAY_TRACE_MAX_LINE); refused unread",
                         path, lineno, REPLAY_TRACE_MAX_LINE);
            else
                snprintf(err, err_size, "%s:%zu: out of memory for the line", path, lineno);
            rc = -1;
            break;
        }
        replay_trace_request r;
        size_t ids_before = out->num_ids;
        int got = replay_trace_parse_line(line, n, &r, &out->ids, &out->num_ids, &cap_ids, msg, sizeof msg);
        if (got < 0) {
            snprintf(err, err_size, "%s:%zu: %s", path, lineno, msg);
            rc = -1;
            break;
        }
        if (got == 0) continue;
        r.line = lineno;
        if (block > 0) {
            /* one id per block of the prompt, the last one partial */
            size_t want = (size_t)((r.input_length + block - 1) / block);
            if (r.num_ids != want) {
                snprintf(err, err_size, "%s:%zu: field \"hash_ids\": %zu ids for input_length %lld; the trace's block "
                         "of %lld tokens needs ceil(%lld / %lld) = %zu", path, lineno, r.num_ids,
                         (long long)r.input_length, (long long)block, (long long)r.input_length, (long long)block,
                         want);
                rc = -1;
                break;
            }
        }
        if (r.input_length == 0) { /* nothing to match, cache or compute: not a request */
            out->num_ids = ids_before;
            out->empty++;
            continue;
        }
        if (have_ts && r.timestamp < last_ts && out->ts_regressions++ == 0) out->first_regression_line = lineno;
        last_ts = r.timestamp;
        have_ts = true;
        if (out->count == cap_reqs) {
            size_t cap = cap_reqs ? cap_reqs * 2 : 256;
            replay_trace_request *grown = realloc(out->reqs, cap * sizeof *grown);
            if (!grown) {
                snprintf(err, err_size, "%s:%zu: out of memory for %zu requests", path, lineno, cap);
                rc = -1;
                break;
            }
            out->reqs = grown;
            cap_reqs = cap;
        }
        out->reqs[out->count++] = r;
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, err_size, "%s:%zu: read error: %s", path, lineno + 1, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && out->count == 0) {
        snprintf(err, err_size, "%s: no requests in the trace%s", path, out->empty ? " (only zero-length ones)" : "");
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc != 0) replay_trace_free(out);
    return rc;
}

int replay_trace_load(const char *path, replay_trace *out, char *err, size_t err_size)
{
    return replay_trace_load_block(path, 0, out, err, err_size);
}

static int by_time(const void *a, const void *b)
{
    const replay_trace_request *x = a, *y = b;
    if (x->timestamp != y->timestamp) return x->timestamp < y->timestamp ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line); /* stable: file order among equals */
}

void replay_trace_sort_by_time(replay_trace *t)
{
    if (t->count > 1) qsort(t->reqs, t->count, sizeof *t->reqs, by_time);
}

void replay_trace_free(replay_trace *t)
{
    free(t->reqs);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

/* test_replay_trace.c — kvhal-replay's JSONL trace reader: well-formed lines in their variants (unknown fields of
 * any shape skipped, blank lines, CRLF), and malformed input of every kind refused with a message that names the
 * line, column and field, never accepted and never crashing; the committed sample trace loads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "replay_trace.h"

typedef struct parsed {
    int rc;
    replay_trace_request r;
    int64_t *ids;
    size_t num_ids, cap;
    char err[512];
} parsed;

static parsed parse(const char *line)
{
    parsed p;
    memset(&p, 0, sizeof p);
    p.rc = replay_trace_parse_line(line, strlen(line), &p.r, &p.ids, &p.num_ids, &p.cap, p.err, sizeof p.err);
    return p;
}

static void expect_error(const char *line, const char *needle)
{
    parsed p = parse(line);
    if (p.rc != -1) fail_msg("accepted: %s", line);
    if (!strstr(p.err, needle)) fail_msg("message \"%s\" lacks \"%s\" for: %s", p.err, needle, line);
    assert_int_equal(p.num_ids, 0); /* ids of a refused line are not kept */
    free(p.ids);
}

static void test_valid_lines(void **state)
{
    (void)state;
    parsed p =
        parse("{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47, 48]}\n");
    assert_int_equal(p.rc, 1);
    assert_true(p.r.timestamp == 27482.0);
    assert_int_equal(p.r.input_length, 6955);
    assert_int_equal(p.r.output_length, 52);
    assert_int_equal(p.r.num_ids, 3);
    assert_int_equal(p.r.first_id, 0);
    assert_int_equal(p.ids[2], 48);
    free(p.ids);

    /* any order, no timestamp, floats and exponents in the timestamp, unknown fields of every shape, CRLF */
    p = parse(" { \"hash_ids\":[],\"extra\":{\"a\":[1,{\"b\":null}],\"c\":\"x\\\"y\\u00e9\"},\"output_length\":0,"
              "\"input_length\":5, \"t\": true, \"f\": false, \"n\": -1.5e3, \"timestamp\": 1.25e2 }\r\n");
    assert_int_equal(p.rc, 1);
    assert_true(p.r.timestamp == 125.0);
    assert_int_equal(p.r.input_length, 5);
    assert_int_equal(p.r.num_ids, 0);
    free(p.ids);

    /* a second line appends its ids after the first's */
    parsed q;
    memset(&q, 0, sizeof q);
    const char *a = "{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, 2]}";
    const char *b = "{\"input_length\": 2, \"output_length\": 3, \"hash_ids\": [9]}";
    assert_int_equal(replay_trace_parse_line(a, strlen(a), &q.r, &q.ids, &q.num_ids, &q.cap, q.err, sizeof q.err), 1);
    assert_int_equal(replay_trace_parse_line(b, strlen(b), &q.r, &q.ids, &q.num_ids, &q.cap, q.err, sizeof q.err), 1);
    assert_int_equal(q.r.first_id, 2);
    assert_int_equal(q.num_ids, 3);
    assert_int_equal(q.ids[2], 9);
    free(q.ids);

    /* blank lines are skipped */
    p = parse("   \t\r\n");
    assert_int_equal(p.rc, 0);
    p = parse("");
    assert_int_equal(p.rc, 0);
}

static void test_malformed_lines(void **state)
{
    (void)state;
    expect_error("[1, 2]", "expected a JSON object");
    expect_error("{\"input_length\": 5, \"output_length\": 1}", "missing field \"hash_ids\"");
    expect_error("{\"output_length\": 1, \"hash_ids\": []}", "missing field \"input_length\"");
    expect_error("{\"input_length\": -5, \"output_length\": 1, \"hash_ids\": []}",
                 "field \"input_length\": expected a non-negative integer, found \"-5\"");
    expect_error("{\"input_length\": 5.5, \"output_length\": 1, \"hash_ids\": []}", "field \"input_length\"");
    expect_error("{\"input_length\": \"5\", \"output_length\": 1, \"hash_ids\": []}", "field \"input_length\"");
    expect_error("{\"input_length\": 99999999999999999999999, \"output_length\": 1, \"hash_ids\": []}",
                 "exceeds the limit");
    expect_error("{\"input_length\": 16777216, \"output_length\": 1, \"hash_ids\": []}", "exceeds the limit");
    expect_error("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, -2]}", "field \"hash_ids\"");
    expect_error("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1 2]}", "expected ',' or ']'");
    expect_error("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": 7}", "expected an array");
    expect_error("{\"input_length\": 5, \"input_length\": 6, \"output_length\": 1, \"hash_ids\": []}", "appears twice");
    expect_error("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": []} x", "unexpected text after");
    expect_error("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [] ", "expected ',' or '}'");
    expect_error("{\"input_length\" 5}", "expected ':'");
    expect_error("{input_length: 5}", "field name");
    expect_error("{\"input_length\": 5, \"note\": \"unterminated", "unterminated");
    expect_error("{\"note\": \"bad \\q escape\"}", "invalid escape");
    expect_error("{\"note\": \"\\u12\"}", "\\u escape");
    expect_error("{\"note\": tru}", "expected a value");
    expect_error("{\"note\": [1, 2,]}", "expected a value");
    expect_error("{\"note\": {\"a\" 1}}", "expected ':'");
    expect_error("{\"timestamp\": 1e999, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}", "out of range");
    expect_error("{\"timestamp\": 01, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}", "expected ','");
    expect_error("{\"timestamp\": -, \"input_length\": 1}", "expected a number");
    /* nesting is bounded (and skipping it never recurses) */
    char deep[600];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{\"x\": ");
    for (int i = 0; i < 200; i++) deep[n++] = '[';
    deep[n] = '\0';
    expect_error(deep, "nested more than");
    /* a NUL byte inside the line */
    parsed p;
    memset(&p, 0, sizeof p);
    const char nul[] = "{\"input_length\": 5\0, \"output_length\": 1, \"hash_ids\": []}";
    int rc = replay_trace_parse_line(nul, sizeof nul - 1, &p.r, &p.ids, &p.num_ids, &p.cap, p.err, sizeof p.err);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(p.err, "NUL"));
    assert_non_null(strstr(p.err, "column 19"));
}

/* Random mutations of a valid line: whatever is accepted is consistent; whatever is refused says why. */
static void test_mutations(void **state)
{
    (void)state;
    const char *good = "{\"timestamp\": 12.5, \"input_length\": 700, \"output_length\": 30, \"hash_ids\": [3, 4], "
                       "\"meta\": {\"k\": [\"v\", 1, null]}}";
    size_t len = strlen(good);
    char buf[256];
    uint64_t rng = 42;
    const char alphabet[] = "{}[],:\" \\-0123456789.eEtrufalsn";
    for (int i = 0; i < 20000; i++) {
        memcpy(buf, good, len);
        size_t m = len;
        int edits = 1 + (int)((rng = rng * 6364136223846793005ULL + 1442695040888963407ULL) >> 62);
        for (int e = 0; e < edits; e++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t pos = (size_t)(rng >> 33) % m;
            char c = alphabet[(rng >> 20) % (sizeof alphabet - 1)];
            if ((rng >> 10) % 3 == 0 && m > 1) {
                memmove(buf + pos, buf + pos + 1, m - pos - 1); /* delete */
                m--;
            } else if ((rng >> 10) % 3 == 1 && m + 1 < sizeof buf) {
                memmove(buf + pos + 1, buf + pos, m - pos); /* insert */
                buf[pos] = c;
                m++;
            } else {
                buf[pos] = c;
            }
        }
        parsed p;
        memset(&p, 0, sizeof p);
        int rc = replay_trace_parse_line(buf, m, &p.r, &p.ids, &p.num_ids, &p.cap, p.err, sizeof p.err);
        if (rc == 1) {
            assert_true(p.r.input_length >= 0 && p.r.output_length >= 0);
            assert_int_equal(p.r.num_ids, p.num_ids);
        } else {
            assert_int_equal(rc, -1);
            assert_true(strncmp(p.err, "column ", 7) == 0);
            assert_int_equal(p.num_ids, 0);
        }
        free(p.ids);
    }
}

static void test_load_files(void **state)
{
    (void)state;
    char path[] = "/tmp/kvhal-trace-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n\n", f);
    fputs("{\"input_length\": 20, \"output_length\": 2, \"hash_ids\": [1, 2]}\n", f);
    fputs("{\"input_length\": 30, \"output_length\": -2, \"hash_ids\": [1, 2]}\n", f);
    fclose(f);
    replay_trace t;
    char err[1024];
    assert_int_equal(replay_trace_load(path, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":4: column"));
    assert_non_null(strstr(err, "output_length"));
    assert_null(t.reqs);

    f = fopen(path, "w");
    fputs("{\"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n\n", f);
    fputs("{\"input_length\": 20, \"output_length\": 2, \"hash_ids\": [1, 2]}", f); /* no final newline */
    fclose(f);
    assert_int_equal(replay_trace_load(path, &t, err, sizeof err), 0);
    assert_int_equal(t.count, 2);
    assert_int_equal(t.reqs[1].line, 3);
    assert_int_equal(t.reqs[1].first_id, 1);
    assert_int_equal(t.ids[2], 2);
    replay_trace_free(&t);

    f = fopen(path, "w");
    fputs("\n \n", f);
    fclose(f);
    assert_int_equal(replay_trace_load(path, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "no requests"));
    unlink(path);
    assert_int_equal(replay_trace_load("/nonexistent/trace.jsonl", &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot open"));

    const char *dir = getenv("KVHAL_TEST_DATA");
    if (dir) {
        char sample[1024];
        snprintf(sample, sizeof sample, "%s/sample_trace.jsonl", dir);
        assert_int_equal(replay_trace_load(sample, &t, err, sizeof err), 0);
        assert_true(t.count >= 40);
        for (size_t i = 0; i < t.count; i++) assert_true(t.reqs[i].num_ids * 512 >= (size_t)t.reqs[i].input_length);
        replay_trace_free(&t);
    }
}

/* JSON key names are compared decoded, so an escaped spelling of a known field is a duplicate; strings (skipped
 * ones too) must be well-formed UTF-8 with paired surrogates. */
static void test_trace_json_keys_decoded_utf8_checked(void **state)
{
    (void)state;
    expect_error("{\"input_length\": 5, \"input\\u005flength\": 6, \"output_length\": 1, \"hash_ids\": [1]}",
                 "appears twice");
    expect_error("{\"x\": \"a\xff\", \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}", "invalid UTF-8");
    expect_error("{\"x\": \"\xc0\xaf\", \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}",
                 "invalid UTF-8");
    expect_error("{\"x\": \"\xed\xa0\x80\", \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}",
                 "invalid UTF-8"); /* an encoded surrogate */
    expect_error("{\"x\": \"\\udc00\", \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}", "low surrogate");
    expect_error("{\"x\": \"\\ud800x\", \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}",
                 "high surrogate");
    /* a NUL escaped into a name is equal to no known name (not "input_length" cut at the NUL) */
    parsed p = parse("{\"input_length\\u0000x\": 7, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}");
    assert_int_equal(p.rc, 1);
    assert_int_equal(p.r.input_length, 5);
    free(p.ids);
    p = parse("{\"x\": \"\\ud83d\\ude00 \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\", \"output\\u005flength\": 1, "
              "\"input_length\": 5, \"hash_ids\": [1]}");
    assert_int_equal(p.rc, 1);
    assert_int_equal(p.r.output_length, 1);
    free(p.ids);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* hash_ids must be ceil(input_length / block) ids; zero-length requests are not requests;
 * timestamps going back are counted and can be sorted (stably). */
static void test_trace_ids_count_empty_and_timestamps(void **state)
{
    (void)state;
    char path[] = "/tmp/kvhal-trace-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    replay_trace t;
    char err[1024];
    write_file(path, "{\"input_length\": 1000, \"output_length\": 2, \"hash_ids\": [1]}\n");
    assert_int_equal(replay_trace_load_block(path, 512, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, ":1: field \"hash_ids\": 1 ids for input_length 1000"));
    write_file(path, "{\"input_length\": 1000, \"output_length\": 2, \"hash_ids\": [1, 2, 3]}\n");
    assert_int_equal(replay_trace_load_block(path, 512, &t, err, sizeof err), -1);
    write_file(path, "{\"input_length\": 1024, \"output_length\": 2, \"hash_ids\": [1, 2]}\n"
                     "{\"timestamp\": 5, \"input_length\": 0, \"output_length\": 9, \"hash_ids\": []}\n"
                     "{\"timestamp\": 9, \"input_length\": 1025, \"output_length\": 2, \"hash_ids\": [1, 2, 3]}\n"
                     "{\"timestamp\": 3, \"input_length\": 1, \"output_length\": 2, \"hash_ids\": [7]}\n"
                     "{\"timestamp\": 3, \"input_length\": 2, \"output_length\": 2, \"hash_ids\": [8]}\n");
    assert_int_equal(replay_trace_load_block(path, 512, &t, err, sizeof err), 0);
    assert_int_equal(t.count, 4);
    assert_int_equal(t.empty, 1);
    assert_int_equal(t.ts_regressions, 1);
    assert_int_equal(t.first_regression_line, 4);
    replay_trace_sort_by_time(&t);
    assert_int_equal(t.reqs[0].line, 1); /* timestamp 0 (absent) */
    assert_int_equal(t.reqs[1].line, 4); /* 3, first in the file */
    assert_int_equal(t.reqs[2].line, 5);
    assert_int_equal(t.reqs[3].line, 3);
    assert_int_equal(t.ids[t.reqs[1].first_id], 7); /* ids follow their request */
    replay_trace_free(&t);
    write_file(path, "{\"input_length\": 0, \"output_length\": 2, \"hash_ids\": []}\n");
    assert_int_equal(replay_trace_load_block(path, 512, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "only zero-length"));
    unlink(path);
    assert_int_equal(replay_match_len(0), 0);
    assert_int_equal(replay_match_len(1), 0);
    assert_int_equal(replay_match_len(1000), 999);
}

/* A line past REPLAY_TRACE_MAX_LINE is refused without being read whole. */
static void test_trace_line_length_bounded(void **state)
{
    (void)state;
    char path[] = "/tmp/kvhal-trace-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs("{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n{\"pad\": \"", f);
    static char chunk[1 << 16];
    memset(chunk, 'a', sizeof chunk);
    for (size_t done = 0; done <= REPLAY_TRACE_MAX_LINE; done += sizeof chunk) fwrite(chunk, 1, sizeof chunk, f);
    fputs("\", \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\n", f);
    fclose(f);
    replay_trace t;
    char err[1024];
    assert_int_equal(replay_trace_load(path, &t, err, sizeof err), -1);
    if (!strstr(err, ":2: line longer than")) fail_msg("%s", err);
    assert_null(t.reqs);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_lines),
        cmocka_unit_test(test_malformed_lines),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_load_files),
        cmocka_unit_test(test_trace_json_keys_decoded_utf8_checked),
        cmocka_unit_test(test_trace_ids_count_empty_and_timestamps),
        cmocka_unit_test(test_trace_line_length_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

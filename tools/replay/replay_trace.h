/* replay_trace.h — reader of JSONL request traces for kvhal-replay: one JSON object per line,
 *   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, ...]}
 * (the shape of public production traces of LLM serving). hash_ids[i] names block i of the prompt: equal ids at
 * equal positions mean the same trace-block tokens. Unknown fields are skipped; malformed input is reported with
 * the file, line, column and field, never trusted. */
#ifndef KVHAL_REPLAY_TRACE_H
#define KVHAL_REPLAY_TRACE_H

#include <stddef.h>
#include <stdint.h>

/* Longest prompt plus output accepted from a trace line (tokens), and the most hash ids on one line. */
#define REPLAY_TRACE_MAX_TOKENS (1 << 24)
#define REPLAY_TRACE_MAX_IDS (1 << 20)
/* Longest line accepted (bytes, the newline excluded): a line is read up to this bound and refused past it, never
 * read whole first. 2^20 ids of up to 20 characters each fit. */
#define REPLAY_TRACE_MAX_LINE ((size_t)32 << 20)

typedef struct replay_trace_request {
    double timestamp;       /* as in the trace (0 when absent) */
    int64_t input_length;   /* tokens */
    int64_t output_length;  /* tokens */
    size_t first_id;        /* index of its first hash id in replay_trace.ids */
    size_t num_ids;
    size_t line;            /* 1-based line in the file */
} replay_trace_request;

typedef struct replay_trace {
    replay_trace_request *reqs;
    size_t count;
    int64_t *ids;           /* all hash ids, request after request */
    size_t num_ids;
    size_t empty;           /* lines with input_length 0: not requests, left out of reqs (counted here) */
    size_t ts_regressions;  /* requests whose timestamp is below the one before (file order) */
    size_t first_regression_line;
} replay_trace;

/* Parses one line (len bytes, need not be NUL-terminated). Returns 1 for a request (written to *out, its ids
 * appended to *ids / *num_ids / *cap_ids, grown with realloc), 0 for a blank line, -1 on an error with a message
 * in err ("column 17: field \"input_length\": expected a non-negative integer, found \"-5\""). */
int replay_trace_parse_line(const char *line, size_t len, replay_trace_request *out, int64_t **ids, size_t *num_ids,
                            size_t *cap_ids, char *err, size_t err_size);

/* Loads a whole file. Returns 0, or -1 with "path:line: message" in err (and nothing to free). Lines longer than
 * REPLAY_TRACE_MAX_LINE are refused. block > 0: each request must carry exactly ceil(input_length / block) hash ids
 * (the trace format's meaning: one id per block of the prompt, the last one partial); block 0 skips that check.
 * Zero-length requests are counted in out->empty and left out; timestamps that go back are counted (they are
 * accepted, in file order: replay_trace_sort_by_time orders them). */
int replay_trace_load_block(const char *path, int64_t block, replay_trace *out, char *err, size_t err_size);
/* replay_trace_load_block(path, 0, ...). */
int replay_trace_load(const char *path, replay_trace *out, char *err, size_t err_size);
/* Orders the requests by timestamp, stably (equal ones keep their file order). */
void replay_trace_sort_by_time(replay_trace *t);
void replay_trace_free(replay_trace *t);

/* How many of a prompt's tokens a request may take from the prefix cache: all but the last, as serving engines do
 * (the last prompt token is computed again to produce the logits of the first output token). */
static inline size_t replay_match_len(size_t input_length) { return input_length ? input_length - 1 : 0; }

#endif

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
} replay_trace;

/* Parses one line (len bytes, need not be NUL-terminated). Returns 1 for a request (written to *out, its ids
 * appended to *ids / *num_ids / *cap_ids, grown with realloc), 0 for a blank line, -1 on an error with a message
 * in err ("column 17: field \"input_length\": expected a non-negative integer, found \"-5\""). */
int replay_trace_parse_line(const char *line, size_t len, replay_trace_request *out, int64_t **ids, size_t *num_ids,
                            size_t *cap_ids, char *err, size_t err_size);

/* Loads a whole file. Returns 0, or -1 with "path:line: message" in err (and nothing to free). */
int replay_trace_load(const char *path, replay_trace *out, char *err, size_t err_size);
void replay_trace_free(replay_trace *t);

#endif

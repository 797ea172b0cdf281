/* fuzz_trace.c — libFuzzer target for kvhal-replay's JSONL trace parser: every line is parsed or rejected with a
 * message; an accepted request has sane lengths and ids inside the id array. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "replay_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t *ids = NULL;
    size_t num_ids = 0, cap = 0;
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        replay_trace_request req;
        char err[256];
        err[0] = '\0';
        size_t before = num_ids;
        int r = replay_trace_parse_line(p, len, &req, &ids, &num_ids, &cap, err, sizeof err);
        if (r < 0 && err[0] == '\0') abort();
        if (r == 1) {
            if (req.input_length < 0 || req.output_length < 0) abort();
            if (req.first_id != before || req.first_id + req.num_ids != num_ids || num_ids > cap) abort();
        }
        if (r < 0) num_ids = before;
        p += len + (nl ? 1 : 0);
    }
    free(ids);
    return 0;
}

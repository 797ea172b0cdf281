/* fuzz_tensor.c — libFuzzer target for tensor construction and views: builds a tensor from fuzzed metadata over a
 * small host buffer, applies fuzzed narrow/select/permute steps, and reads every element of every accepted view
 * through the buffer's host pointer, so AddressSanitizer reports any view that validation let past the buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    const uint8_t *p;
    size_t n;
} reader;

static uint64_t take(reader *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = (v << 8) | (r->n ? *r->p : 0);
        if (r->n) {
            r->p++;
            r->n--;
        }
    }
    return v;
}

static volatile uint8_t sink;

/* Touches every element of an accepted view (bounded), walking the strides. */
static void touch(const kvhal_tensor *t)
{
    int64_t numel = kvhal_tensor_numel(t);
    if (numel <= 0 || numel > (1 << 16)) return;
    const uint8_t *base = (const uint8_t *)kvhal_buffer_native(t->buffer) + t->offset;
    size_t es = kvhal_dtype_size(t->dtype);
    int64_t idx[KVHAL_MAX_DIMS] = {0};
    for (int64_t e = 0; e < numel; e++) {
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        for (size_t b = 0; b < es; b++) sink ^= base[(size_t)off * es + b];
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    size_t bytes = 1 + (size_t)(take(&r, 2) % 4096);
    kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};
    kvhal_buffer *buf;
    if (kvhal_buffer_create(cpu, bytes, &buf) != KVHAL_OK) return 0;
    memset(kvhal_buffer_native(buf), 0, bytes);
    kvhal_dtype dt = (kvhal_dtype)(take(&r, 1) % (KVHAL_I64 + 2));
    int32_t ndim = (int32_t)(take(&r, 1) % (KVHAL_MAX_DIMS + 2));
    size_t offset = (size_t)(take(&r, 2) % 8192);
    int64_t shape[KVHAL_MAX_DIMS + 1], strides[KVHAL_MAX_DIMS + 1];
    for (int i = 0; i <= KVHAL_MAX_DIMS; i++) {
        shape[i] = (int64_t)take(&r, 2) - 4;      /* includes negatives and zero */
        strides[i] = (int64_t)take(&r, 2) - 2;
        if (take(&r, 1) == 0xff) shape[i] = INT64_MAX / 3; /* overflow probes */
    }
    bool contiguous = take(&r, 1) & 1;
    kvhal_tensor t;
    if (kvhal_tensor_make(buf, offset, dt, ndim, shape, contiguous ? NULL : strides, &t) == KVHAL_OK) {
        touch(&t);
        for (int step = 0; step < 8 && r.n; step++) {
            kvhal_tensor v;
            kvhal_status st;
            int op = (int)(take(&r, 1) % 3);
            int32_t dim = (int32_t)(take(&r, 1) % 8) - 1;
            int64_t a = (int64_t)take(&r, 2) - 8, b = (int64_t)take(&r, 2) - 8;
            if (op == 0) {
                st = kvhal_tensor_narrow(&t, dim, a, b, &v);
            } else if (op == 1) {
                st = kvhal_tensor_select(&t, dim, a, &v);
            } else {
                int32_t perm[KVHAL_MAX_DIMS];
                for (int i = 0; i < KVHAL_MAX_DIMS; i++) perm[i] = (int32_t)(take(&r, 1) % 8) - 1;
                st = kvhal_tensor_permute(&t, perm, &v);
            }
            if (st == KVHAL_OK) {
                if (kvhal_tensor_validate(&v) != KVHAL_OK) abort(); /* a view of a valid tensor stays valid */
                touch(&v);
                t = v;
            }
        }
    }
    kvhal_buffer_destroy(buf);
    return 0;
}

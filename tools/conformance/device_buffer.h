/* device_buffer.h — test helpers shared by the suites that run on every device: device buffers with a host mirror
 * (the reference of what the device must hold), the OK() check, and tensors over such buffers. */
#ifndef KVHAL_TEST_DEVICE_BUFFER_H
#define KVHAL_TEST_DEVICE_BUFFER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"
#include "reference.h"

#define OK(expr)                                                                                                \
    do {                                                                                                        \
        kvhal_status st_ = (expr);                                                                              \
        if (st_ != KVHAL_OK) fail_msg("%s: %s (%s)", #expr, kvhal_status_name(st_), kvhal_last_error());       \
    } while (0)

/* ---- device buffers with host mirrors ---- */

typedef struct dbuf {
    kvhal_buffer *buf;
    uint8_t *mirror;
    size_t size;
} dbuf;

static inline void dbuf_upload(dbuf *b) { OK(kvhal_memcpy_h2d(b->buf, 0, b->mirror, b->size, NULL)); }

/* A buffer of random bytes (mirror == device). */
static inline void dbuf_make(dbuf *b, kvhal_device dev, size_t size, ref_rng *r)
{
    b->size = size;
    b->mirror = malloc(size);
    assert_non_null(b->mirror);
    for (size_t i = 0; i < size; i++) b->mirror[i] = (uint8_t)ref_rand(r);
    OK(kvhal_buffer_create(dev, size, &b->buf));
    dbuf_upload(b);
}


/* The device's bytes must equal the mirror. */
static inline void dbuf_expect(const dbuf *b, const char *what)
{
    uint8_t *got = malloc(b->size);
    assert_non_null(got);
    OK(kvhal_memcpy_d2h(got, b->buf, 0, b->size, NULL));
    for (size_t i = 0; i < b->size; i++) {
        if (got[i] != b->mirror[i]) {
            fail_msg("%s: byte %zu of %zu is 0x%02x, the reference has 0x%02x", what, i, b->size, got[i],
                     b->mirror[i]);
        }
    }
    free(got);
}

static inline void dbuf_free(dbuf *b)
{
    if (b->buf) OK(kvhal_buffer_destroy(b->buf));
    free(b->mirror);
    memset(b, 0, sizeof *b);
}

static inline kvhal_tensor tensor(const dbuf *b, size_t offset, kvhal_dtype dt, int ndim, const int64_t *shape,
                           const int64_t *strides)
{
    kvhal_tensor t;
    OK(kvhal_tensor_make(b->buf, offset, dt, ndim, shape, strides, &t));
    return t;
}

#endif

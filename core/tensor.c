/* tensor.c — tensor values: dtypes, construction with bounds checks against the buffer, views (narrow, select,
 * permute) that never allocate, and the conversion to the backend's view of a tensor. All size arithmetic is
 * overflow-checked: a tensor whose extent does not fit in the buffer (or in 64 bits) is rejected. */
#include <string.h>

#include "buffer.h"
#include "error.h"
#include "tensor.h"

static const size_t dtype_sizes[KVHAL__DTYPE_COUNT] = {4, 2, 2, 1, 1, 4, 8, 1, 1};
static const char *dtype_names[KVHAL__DTYPE_COUNT] = {"f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "i32", "i64",
                                                     "fp8_e4m3fnuz", "fp8_e5m2fnuz"};

size_t kvhal_dtype_size(kvhal_dtype dt) { return (unsigned)dt < KVHAL__DTYPE_COUNT ? dtype_sizes[dt] : 0; }

const char *kvhal_dtype_name(kvhal_dtype dt) { return (unsigned)dt < KVHAL__DTYPE_COUNT ? dtype_names[dt] : "invalid"; }

/* Offset in elements of the last element, or -1 on overflow; 0 for an empty tensor (checked by the caller). */
static bool last_element(const kvhal_tensor *t, uint64_t *last)
{
    uint64_t acc = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 0) {
            *last = 0;
            return true;
        }
        uint64_t term;
        if (__builtin_mul_overflow((uint64_t)(t->shape[i] - 1), (uint64_t)t->strides[i], &term)) return false;
        if (__builtin_add_overflow(acc, term, &acc)) return false;
    }
    *last = acc;
    return true;
}

int64_t kvhal_tensor_numel(const kvhal_tensor *t)
{
    if (!t || t->ndim < 1 || t->ndim > KVHAL_MAX_DIMS) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || __builtin_mul_overflow(n, t->shape[i], &n)) return 0;
    }
    return n;
}

size_t kvhal_tensor_span_bytes(const kvhal_tensor *t)
{
    if (!t || t->ndim < 1 || t->ndim > KVHAL_MAX_DIMS) return 0;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] < 0 || t->strides[i] < 0) return SIZE_MAX; /* not a valid tensor: no span */
    uint64_t last, bytes;
    if (kvhal_tensor_numel(t) == 0) {
        bool empty = false;
        for (int i = 0; i < t->ndim; i++) empty = empty || t->shape[i] == 0;
        return empty ? 0 : SIZE_MAX; /* numel is 0 on overflow too */
    }
    if (!last_element(t, &last) || last == UINT64_MAX ||
        __builtin_mul_overflow(last + 1, (uint64_t)kvhal_dtype_size(t->dtype), &bytes) ||
        bytes > SIZE_MAX)
        return SIZE_MAX;
    return (size_t)bytes;
}

bool kvhal_tensor_is_contiguous(const kvhal_tensor *t)
{
    if (!t || t->ndim < 1 || t->ndim > KVHAL_MAX_DIMS) return false;
    /* An empty tensor lays out nothing: contiguous, as kvhal_tensor_make with NULL strides promises. */
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return true;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        if (__builtin_mul_overflow(expect, t->shape[i], &expect)) return false;
    }
    return true;
}

kvhal_status kvhal__check_tensor(const kvhal_tensor *t, const char *arg)
{
    if (!t) return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s: NULL tensor", arg);
    KVHAL_TRY(kvhal__check_buffer(t->buffer, arg));
    if ((unsigned)t->dtype >= KVHAL__DTYPE_COUNT)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.dtype: %d is not a dtype", arg, (int)t->dtype);
    if (t->ndim < 1 || t->ndim > KVHAL_MAX_DIMS)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.ndim: %d is outside [1, %d]", arg, t->ndim, KVHAL_MAX_DIMS);
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.shape[%d]: %lld is negative", arg, i, (long long)t->shape[i]);
        if (t->strides[i] < 0)
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.strides[%d]: %lld is negative", arg, i,
                              (long long)t->strides[i]);
    }
    size_t es = dtype_sizes[t->dtype];
    if (t->offset % es)
        return kvhal__err(KVHAL_INVALID_ARGUMENT, "%s.offset: %zu is not a multiple of the %s element size %zu", arg,
                          t->offset, dtype_names[t->dtype], es);
    bool empty = false;
    for (int i = 0; i < t->ndim; i++) empty = empty || t->shape[i] == 0;
    /* numel is 0 on overflow too: such a shape must not pass as empty. */
    if (!empty && kvhal_tensor_numel(t) == 0)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "%s: the element count of the shape overflows 64 bits", arg);
    if (empty) {
        if (t->offset > t->buffer->size)
            return kvhal__err(KVHAL_OUT_OF_RANGE, "%s.offset: %zu is past the buffer's %zu bytes", arg, t->offset,
                              t->buffer->size);
        return KVHAL_OK;
    }
    uint64_t last, end;
    if (!last_element(t, &last) || last == UINT64_MAX || __builtin_mul_overflow(last + 1, (uint64_t)es, &end) ||
        __builtin_add_overflow(end, (uint64_t)t->offset, &end))
        return kvhal__err(KVHAL_OUT_OF_RANGE, "%s: shape and strides overflow 64-bit byte offsets", arg);
    if (end > t->buffer->size)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "%s: view ends at byte %llu, past the buffer's %zu bytes", arg,
                          (unsigned long long)end, t->buffer->size);
    return KVHAL_OK;
}

kvhal_status kvhal_tensor_validate(const kvhal_tensor *t) { return kvhal__check_tensor(t, "t"); }

kvhal_status kvhal_tensor_make(kvhal_buffer *buf, size_t offset, kvhal_dtype dt, int32_t ndim, const int64_t *shape,
                               const int64_t *strides, kvhal_tensor *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    KVHAL_TRY(kvhal__check_buffer(buf, "buf"));
    KVHAL_CHECK_ARG((unsigned)dt < KVHAL__DTYPE_COUNT, "dt: %d is not a dtype", (int)dt);
    KVHAL_CHECK_ARG(ndim >= 1 && ndim <= KVHAL_MAX_DIMS, "ndim: %d is outside [1, %d]", ndim, KVHAL_MAX_DIMS);
    KVHAL_CHECK_ARG(shape, "shape: NULL");
    kvhal_tensor t;
    memset(&t, 0, sizeof t);
    t.buffer = buf;
    t.offset = offset;
    t.dtype = dt;
    t.ndim = ndim;
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        KVHAL_CHECK_ARG(shape[i] >= 0, "shape[%d]: %lld is negative", i, (long long)shape[i]);
        t.shape[i] = shape[i];
        t.strides[i] = strides ? strides[i] : expect;
        if (!strides && __builtin_mul_overflow(expect, shape[i] ? shape[i] : 1, &expect))
            return kvhal__err(KVHAL_OUT_OF_RANGE, "shape: element count overflows 64 bits");
    }
    for (int i = ndim; i < KVHAL_MAX_DIMS; i++) {
        t.shape[i] = 1;
        t.strides[i] = 0;
    }
    KVHAL_TRY(kvhal__check_tensor(&t, "tensor"));
    *out = t;
    return KVHAL_OK;
}

kvhal_status kvhal_tensor_narrow(const kvhal_tensor *t, int32_t dim, int64_t start, int64_t length, kvhal_tensor *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    KVHAL_TRY(kvhal__check_tensor(t, "t"));
    KVHAL_CHECK_ARG(dim >= 0 && dim < t->ndim, "dim: %d is outside [0, %d)", dim, t->ndim);
    if (start < 0 || length < 0 || start > t->shape[dim] || length > t->shape[dim] - start)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "start, length: [%lld, %lld + %lld) is outside dim %d of size %lld",
                          (long long)start, (long long)start, (long long)length, dim, (long long)t->shape[dim]);
    kvhal_tensor r = *t;
    r.shape[dim] = length;
    /* An empty view keeps the offset: moving it could point past the buffer and make the view invalid. */
    if (kvhal_tensor_numel(&r) > 0) r.offset += (size_t)start * (size_t)t->strides[dim] * dtype_sizes[t->dtype];
    *out = r;
    return KVHAL_OK;
}

kvhal_status kvhal_tensor_select(const kvhal_tensor *t, int32_t dim, int64_t index, kvhal_tensor *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    KVHAL_TRY(kvhal__check_tensor(t, "t"));
    KVHAL_CHECK_ARG(dim >= 0 && dim < t->ndim, "dim: %d is outside [0, %d)", dim, t->ndim);
    KVHAL_CHECK_ARG(t->ndim > 1, "t: a 1-D tensor has no dimension to keep after select");
    if (index < 0 || index >= t->shape[dim])
        return kvhal__err(KVHAL_OUT_OF_RANGE, "index: %lld is outside [0, %lld) of dim %d", (long long)index,
                          (long long)t->shape[dim], dim);
    kvhal_tensor r = *t;
    if (kvhal_tensor_numel(t) > 0) r.offset += (size_t)index * (size_t)t->strides[dim] * dtype_sizes[t->dtype];
    for (int i = dim; i < t->ndim - 1; i++) {
        r.shape[i] = t->shape[i + 1];
        r.strides[i] = t->strides[i + 1];
    }
    r.ndim = t->ndim - 1;
    r.shape[r.ndim] = 1;
    r.strides[r.ndim] = 0;
    *out = r;
    return KVHAL_OK;
}

kvhal_status kvhal_tensor_permute(const kvhal_tensor *t, const int32_t *perm, kvhal_tensor *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    KVHAL_CHECK_ARG(perm, "perm: NULL");
    KVHAL_TRY(kvhal__check_tensor(t, "t"));
    bool seen[KVHAL_MAX_DIMS] = {false};
    kvhal_tensor r = *t;
    for (int i = 0; i < t->ndim; i++) {
        int p = perm[i];
        if (p < 0 || p >= t->ndim || seen[p])
            return kvhal__err(KVHAL_INVALID_ARGUMENT, "perm[%d]: %d is out of range or repeated (ndim %d)", i, p,
                              t->ndim);
        seen[p] = true;
        r.shape[i] = t->shape[p];
        r.strides[i] = t->strides[p];
    }
    *out = r;
    return KVHAL_OK;
}

void kvhal__to_bk_tensor(const kvhal_tensor *t, kvhal_bk_tensor *out)
{
    out->native = t->buffer->native;
    out->offset = t->offset;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    memcpy(out->strides, t->strides, sizeof out->strides);
}

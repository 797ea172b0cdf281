/* stream.h — kvhal.Stream and stream arguments: None (the default stream), an integer handle, an object with
 * __cuda_stream__ or .cuda_stream (torch.cuda.Stream), or kvhal.Stream. */
#ifndef KVPY_STREAM_H
#define KVPY_STREAM_H

#include "common.h"

typedef struct {
    PyObject_HEAD
    kvhal_stream *s;
    kvhal_device dev;
    intptr_t native;
} kvpy_stream_object;

extern PyType_Spec kvpy_stream_spec;

/* The integer handle of a stream argument; 0 (the legacy default) for None or absent. 0, or -1 with an exception
 * set. */
int kvpy_stream_int(kvpy_state *st, PyObject *o, intptr_t *out);

/* The kvhal stream for a stream argument on dev (NULL: the device's default stream), native being
 * kvpy_stream_int's answer for it. 0, or -1 with an exception set. */
int kvpy_stream_for(kvpy_state *st, PyObject *o, intptr_t native, kvhal_device dev, kvhal_stream **out);

/* The kvhal stream of a native handle on dev (NULL for 0, the legacy default; cpu: NULL), made once and cached. */
int kvpy_stream_native(kvpy_state *st, intptr_t native, kvhal_device dev, kvhal_stream **out);

/* Whether obj is a torch.Tensor (torch already imported by the caller; never imports it). */
int kvpy_is_torch_tensor(kvpy_state *st, PyObject *obj);

/* torch's current stream of a CUDA/ROCm device (torch.cuda.current_stream(dev.id).cuda_stream). 0, or -1 with an
 * exception set. */
int kvpy_torch_current_stream(kvpy_state *st, kvhal_device dev, intptr_t *out);

/* Work queued on s from now on waits for the work queued so far on the native stream producer of dev (an event
 * per device, recorded there). 0, or -1 with an exception set. */
int kvpy_order_after(kvpy_state *st, kvhal_device dev, intptr_t producer, kvhal_stream *s);

/* Whether two native handles name the same stream (0 and 1 are both the legacy default stream). */
static inline int kvpy_same_native(intptr_t a, intptr_t b) { return (a == 0 ? 1 : a) == (b == 0 ? 1 : b); }

/* The stream to hand a producer: 0 when the caller gave none (the producer then assumes the legacy default stream,
 * which is what kvhal uses); DLPack numbers the legacy default stream 1 (0 is ambiguous there). */
static inline intptr_t kvpy_dlpack_stream_number(PyObject *arg, intptr_t native)
{
    if (!arg || arg == Py_None) return 0;
    return native == 0 ? 1 : native;
}

/* The cached borrowed streams, destroyed with the module. */
void kvpy_stream_cache_free(kvpy_state *st);

#endif

/* dlpack.h — arrays in and out over DLPack.
 *
 * Arrays in: a type offering the DLPack C exchange API (__dlpack_c_exchange_api__, dlpack_compat.h; remembered per
 * type) is read through its C functions: a borrowed DLTensor for the length of a call, an owning tensor for
 * from_dlpack, and on CUDA/ROCm the producer's current stream compared with the one kvhal uses (another stream goes
 * through __dlpack__, which orders the two). Otherwise any object with __dlpack__ / __dlpack_device__ (NumPy,
 * PyTorch, CuPy, JAX, kvhal.Tensor). The versioned capsule (DLPack 1.x) is asked for first (max_version=(1, 0)); a
 * producer that does not take that keyword gives the unversioned one. The capsule is renamed
 * "used_dltensor(_versioned)" as the protocol asks, its memory wrapped with kvhal_buffer_wrap (a borrow: nothing is
 * copied), and its deleter called once the call is done. On CUDA/ROCm the consumer's stream is passed to __dlpack__
 * so that the producer orders its work before ours. Host and CUDA/HIP ranges stay wrapped across calls (a small
 * cache by device, address and bytes, in the module state).
 *
 * Arrays out: kvhal.Tensor's __dlpack__ builds its capsules here (kvpy_export). */
#ifndef KVPY_DLPACK_H
#define KVPY_DLPACK_H

#include "common.h"

/* A DLManagedTensor(Versioned) taken from a producer; its deleter is called on release. */
typedef struct {
    void *managed;
    int versioned;
} kvpy_taken;

void kvpy_taken_release(kvpy_taken *tk);

/* kvhal.Tensor's object (its type and methods: tensor.c): a kvhal tensor owned by Python (kvhal.empty) or a
 * zero-copy view of a DLPack array (kvhal.from_dlpack). Here because an import takes a kvhal.Tensor as it is. */
typedef struct {
    PyObject_HEAD
    kvhal_tensor t;
    kvhal_buffer *buf; /* owned (empty) or wrapped (from_dlpack): destroyed with the object */
    kvpy_taken taken;  /* from_dlpack: the producer's memory, kept until the object goes */
    int readonly;
} kvpy_tensor_object;

/* One imported argument. */
typedef struct {
    kvhal_tensor t;
    kvhal_buffer *buf; /* wrapped for this call, or borrowed from the wrap cache (wrap_slot) */
    int wrap_slot;     /* 1 + the wrap cache entry buf came from, 0 when buf is this call's own */
    int bytes;         /* KVPY_IMPORT_BYTES: the array was 8-bit integers, taken as fp8_e4m3 for the caller to retype */
    /* who orders the producer's work before the call (CUDA/ROCm arrays): KVPY_PRODUCER_PROTOCOL, the producer itself
     * (__dlpack__ was given the call's stream); KVPY_PRODUCER_TORCH, kvhal (a torch tensor taken with stream=-1:
     * its work is on torch's current stream of the device); KVPY_PRODUCER_XAPI, kvhal (the exchange API said the
     * producer's current stream: producer_stream) */
    int producer;
    void *producer_stream;
    kvpy_taken taken;
} kvpy_import;

#define KVPY_PRODUCER_PROTOCOL 0
#define KVPY_PRODUCER_TORCH 1
#define KVPY_PRODUCER_XAPI 2

#define KVPY_IMPORT_RAW 1  /* host copies: any 1/2/4/8-byte dtype taken by its size */
#define KVPY_IMPORT_KEEP 2 /* the view outlives the call (from_dlpack): an owning import, never a borrowed DLTensor */
#define KVPY_IMPORT_BYTES 4 /* fp8 caches kept as uint8/int8 arrays: taken (out->bytes set) for the caller to retype */

/* Every entry point that imports arrays starts a new call: producers' current streams are asked again. */
static inline void kvpy_new_call(kvpy_state *st) { st->call_serial++; }

/* Imports obj as the argument named arg (written by the call when writable). stream_int: the consumer's stream as
 * the DLPack stream protocol numbers it (1 legacy default, 2 per-thread, other values a handle), or 0 when the caller
 * gave no stream (then no stream keyword is passed at all). torch tensors and exchange-API arrays are taken without
 * synchronisation (out->producer says so): the caller orders them (kvpy_call_stream). mode: KVPY_IMPORT_* bits.
 * 0, or -1 with a kvhal exception set naming arg (a producer's own exception becomes kvhal.InvalidArgument with
 * its message; nothing to release then). */
int kvpy_import_any(kvpy_state *st, PyObject *obj, const char *arg, int writable, intptr_t stream_int, int mode,
                    kvpy_import *out);
void kvpy_import_release(kvpy_state *st, kvpy_import *a);

/* The kvhal stream of a call on dev over the imported arrays t[0..n): the caller's stream (stream, native: its
 * kvpy_stream_int), or with none given the producer's current stream of dev where a producer tells it (torch, the
 * exchange API), else the default stream; the producer's work ordered before it where the import left that to
 * kvhal. 0, or -1 with an exception set. */
int kvpy_call_stream(kvpy_state *st, PyObject *stream, intptr_t native, kvhal_device dev, const kvpy_import *t, int n,
                     kvhal_stream **s);

/* The DLPack C exchange API of a producer type, or NULL (remembered per type and version tag). */
const kvpy_xapi *kvpy_xapi_of(kvpy_state *st, PyTypeObject *tp);

/* DLPack device type of a kvhal device. */
int kvpy_dl_device_type(kvhal_device d);

/* A DLPack capsule of t ("dltensor_versioned" when versioned, else "dltensor") that keeps owner alive until its
 * consumer calls the deleter (or the capsule dies unconsumed). */
PyObject *kvpy_export(PyObject *owner, const kvhal_tensor *t, int versioned, int readonly);

/* The cached wraps, destroyed with the module. */
void kvpy_wrap_cache_free(kvpy_state *st);

#endif

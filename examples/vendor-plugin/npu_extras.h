/* npu_extras.h — what the example NPU module (libkvhal-npu.so) offers beyond the kvhal API, for applications.
 * Both are reached through kvhal_backend_get_proc_address() on the "npu" device type; the module links nothing
 * of kvhal and keeps no global state, so the function needs the module's context, which is the first extra:
 *
 *     kvhal_device_type npu;
 *     void *ctx, *fn;
 *     kvhal_device_type_find("npu", &npu);
 *     kvhal_backend_get_proc_address(npu, EXAMPLE_NPU_CONTEXT, &ctx);
 *     kvhal_backend_get_proc_address(npu, EXAMPLE_NPU_BYTES_ALLOCATED, &fn);
 *     example_npu_bytes_allocated_fn bytes_allocated;
 *     memcpy(&bytes_allocated, &fn, sizeof fn);     (object pointer to function pointer, ISO C)
 *     uint64_t live = bytes_allocated(ctx, 0);      (npu:0)
 */
#ifndef EXAMPLE_NPU_EXTRAS_H
#define EXAMPLE_NPU_EXTRAS_H

#include <stdint.h>

/* The module's context (an opaque handle, valid while kvhal is loaded). */
#define EXAMPLE_NPU_CONTEXT "example_npu_context"
/* Bytes of the device's memory held by buffers kvhal created and has not destroyed yet (wrapped memory is the
 * caller's and not counted); 0 for a device id the module does not have. */
#define EXAMPLE_NPU_BYTES_ALLOCATED "example_npu_bytes_allocated"
typedef uint64_t (*example_npu_bytes_allocated_fn)(void *npu_context, int32_t device_id);

#endif

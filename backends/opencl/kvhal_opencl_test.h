/* kvhal_opencl_test.h — test hooks of the OpenCL module (libkvhal-opencl.so). They are not part of the kvhal API
 * and not exported symbols (the module exports kvhal_backend_entry only): the module's get_proc_address serves
 * them by these names, so tests reach them with
 *     void *p; kvhal_backend_get_proc_address(KVHAL_DEVICE_OPENCL, "kvhal_opencl_build_count", &p);
 * and call them through the types below. They act on the module's instance that was initialised last (the one
 * the library loaded).
 *
 *   uint64_t kvhal_opencl_build_count(void)
 *       Number of clBuildProgram calls the module has made since it was initialised (successful or not). A program is
 *       built once per (context, device, program, options) and reused afterwards, so repeated ops with the same
 *       metadata leave this count unchanged.
 *
 *   void kvhal_opencl_test_inject_source(const char *text)
 *       Appends text to every program source built from now on (NULL or "" stops it). Programs built with
 *       injected text are cached under that text as well, so a test can make a build fail on purpose (and see
 *       its build log in kvhal_last_error()) without disturbing programs already built.
 *
 *   void kvhal_opencl_test_gpu_plans(int on)
 *       While on, descriptors created from then on are planned as for a GPU on every device (CPU devices included),
 *       so that the GPU-shaped kernels (interleaved chunks per work-item) run, and are checked, on PoCL in CI.
 *       Descriptors already cached keep their plan: clear the descriptor cache around it.
 *
 *   uint64_t kvhal_opencl_test_pool(int32_t id, int64_t cap, int32_t fail_creates)
 *       Returns how many kvhal_buffer_create calls on opencl:id the buffer pool has served (ocl_memory.c). With
 *       cap >= 0 it first empties the pool and sets the bytes it may hold to cap (the default is the device's
 *       global memory / 16); cap = -1 changes nothing. fail_creates >= 0: that many clCreateBuffer calls to come
 *       fail as CL_MEM_OBJECT_ALLOCATION_FAILURE without reaching OpenCL (the pool's release-and-retry path);
 *       -1 changes nothing. */
#ifndef KVHAL_OPENCL_TEST_H
#define KVHAL_OPENCL_TEST_H
#include <stdint.h>

typedef uint64_t (*kvhal_opencl_build_count_fn)(void);
typedef void (*kvhal_opencl_test_inject_source_fn)(const char *text);
typedef void (*kvhal_opencl_test_gpu_plans_fn)(int on);
typedef uint64_t (*kvhal_opencl_test_pool_fn)(int32_t id, int64_t cap, int32_t fail_creates);

#endif

/* kvhal_opencl_test.h — test hooks the OpenCL module (libkvhal-opencl.so) exports besides kvhal_backend_entry.
 * They are not part of the kvhal API: tests find them with dlsym on the loaded module, by these names.
 *
 *   uint64_t kvhal_opencl_build_count(void)
 *       Number of clBuildProgram calls the module has made since it was loaded (successful or not). A program is
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
 *       Descriptors already cached keep their plan: clear the descriptor cache around it. */
#ifndef KVHAL_OPENCL_TEST_H
#define KVHAL_OPENCL_TEST_H
#include <stdint.h>

typedef uint64_t (*kvhal_opencl_build_count_fn)(void);
typedef void (*kvhal_opencl_test_inject_source_fn)(const char *text);
typedef void (*kvhal_opencl_test_gpu_plans_fn)(int on);

#endif

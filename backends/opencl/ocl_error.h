/* ocl_error.h — the bottom room of the OpenCL module (ocl_error.c): OpenCL error names and the statuses they map
 * to, error messages, host allocation with the core's fault injection, the device lookup, device strings and the
 * exit flag. It calls no other file of the module. */
#ifndef KVHAL_OCL_ERROR_H
#define KVHAL_OCL_ERROR_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stdbool.h>
#include <stddef.h>

#include "kvhal_backend.h"

/* Not in the 1.2 headers' core set. */
#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif

#define OCL_HIDDEN __attribute__((visibility("hidden")))

typedef struct ocl_module ocl_module;
typedef struct ocl_device ocl_device;

#define OCL_SET_ERROR(m, st, ...) (m)->services->set_error((st), __VA_ARGS__)

/* Device id of the module, NULL when out of range. */
OCL_HIDDEN ocl_device *kvhal__ocl_device(ocl_module *m, int32_t id);
/* The device for an entry's (ctx, id), or return KVHAL_NO_DEVICE from the enclosing function. */
#define OCL_GET_DEVICE(ctx, id, d)                                                                              \
    ocl_device *d = kvhal__ocl_device((ocl_module *)(ctx), (id));                                               \
    if (!d)                                                                                                     \
        return OCL_SET_ERROR((ocl_module *)(ctx), KVHAL_NO_DEVICE, "opencl:%d: no such device (%d present)",     \
                             (int)(id), (int)((ocl_module *)(ctx))->num_devices)
OCL_HIDDEN const char *kvhal__ocl_err_name(cl_int err);
OCL_HIDDEN kvhal_status kvhal__ocl_map_err(cl_int err);
/* Sets the error message "<what>: <CL_ERROR_NAME> (<code>)" with what formatted, and returns the mapped status. */
OCL_HIDDEN kvhal_status kvhal__ocl_fail(ocl_module *m, cl_int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* True once the process exits (the module's destructor ran): OpenCL objects must not be touched any more. */
OCL_HIDDEN bool kvhal__ocl_finalizing(void);
/* strdup through malloc (no fault injection: module bookkeeping). */
OCL_HIDDEN char *kvhal__ocl_strdup(const char *s);
/* Host allocation on a caller's behalf (fault injection first). */
OCL_HIDDEN void *kvhal__ocl_malloc(ocl_module *m, size_t n);
/* Fault injection for device allocations made on a caller's behalf. */
OCL_HIDDEN bool kvhal__ocl_alloc_refused(ocl_module *m);
OCL_HIDDEN void kvhal__ocl_device_str(cl_device_id dv, cl_device_info what, char *buf, size_t n);

#endif

/* ocl_error.c — the bottom of the OpenCL module, which every other file may call and which calls none of them: OpenCL
 * error names and the kvhal statuses they map to, error messages, host allocation with the core's fault injection,
 * the device lookup, device strings, and the process-wide exit flag. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

static const struct {
    cl_int code;
    const char *name;
} cl_errors[] = {
    {0, "CL_SUCCESS"},
    {-1, "CL_DEVICE_NOT_FOUND"},
    {-2, "CL_DEVICE_NOT_AVAILABLE"},
    {-3, "CL_COMPILER_NOT_AVAILABLE"},
    {-4, "CL_MEM_OBJECT_ALLOCATION_FAILURE"},
    {-5, "CL_OUT_OF_RESOURCES"},
    {-6, "CL_OUT_OF_HOST_MEMORY"},
    {-7, "CL_PROFILING_INFO_NOT_AVAILABLE"},
    {-8, "CL_MEM_COPY_OVERLAP"},
    {-9, "CL_IMAGE_FORMAT_MISMATCH"},
    {-10, "CL_IMAGE_FORMAT_NOT_SUPPORTED"},
    {-11, "CL_BUILD_PROGRAM_FAILURE"},
    {-12, "CL_MAP_FAILURE"},
    {-13, "CL_MISALIGNED_SUB_BUFFER_OFFSET"},
    {-14, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"},
    {-15, "CL_COMPILE_PROGRAM_FAILURE"},
    {-16, "CL_LINKER_NOT_AVAILABLE"},
    {-17, "CL_LINK_PROGRAM_FAILURE"},
    {-18, "CL_DEVICE_PARTITION_FAILED"},
    {-19, "CL_KERNEL_ARG_INFO_NOT_AVAILABLE"},
    {-30, "CL_INVALID_VALUE"},
    {-31, "CL_INVALID_DEVICE_TYPE"},
    {-32, "CL_INVALID_PLATFORM"},
    {-33, "CL_INVALID_DEVICE"},
    {-34, "CL_INVALID_CONTEXT"},
    {-35, "CL_INVALID_QUEUE_PROPERTIES"},
    {-36, "CL_INVALID_COMMAND_QUEUE"},
    {-37, "CL_INVALID_HOST_PTR"},
    {-38, "CL_INVALID_MEM_OBJECT"},
    {-39, "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR"},
    {-40, "CL_INVALID_IMAGE_SIZE"},
    {-41, "CL_INVALID_SAMPLER"},
    {-42, "CL_INVALID_BINARY"},
    {-43, "CL_INVALID_BUILD_OPTIONS"},
    {-44, "CL_INVALID_PROGRAM"},
    {-45, "CL_INVALID_PROGRAM_EXECUTABLE"},
    {-46, "CL_INVALID_KERNEL_NAME"},
    {-47, "CL_INVALID_KERNEL_DEFINITION"},
    {-48, "CL_INVALID_KERNEL"},
    {-49, "CL_INVALID_ARG_INDEX"},
    {-50, "CL_INVALID_ARG_VALUE"},
    {-51, "CL_INVALID_ARG_SIZE"},
    {-52, "CL_INVALID_KERNEL_ARGS"},
    {-53, "CL_INVALID_WORK_DIMENSION"},
    {-54, "CL_INVALID_WORK_GROUP_SIZE"},
    {-55, "CL_INVALID_WORK_ITEM_SIZE"},
    {-56, "CL_INVALID_GLOBAL_OFFSET"},
    {-57, "CL_INVALID_EVENT_WAIT_LIST"},
    {-58, "CL_INVALID_EVENT"},
    {-59, "CL_INVALID_OPERATION"},
    {-60, "CL_INVALID_GL_OBJECT"},
    {-61, "CL_INVALID_BUFFER_SIZE"},
    {-62, "CL_INVALID_MIP_LEVEL"},
    {-63, "CL_INVALID_GLOBAL_WORK_SIZE"},
    {-64, "CL_INVALID_PROPERTY"},
    {-65, "CL_INVALID_IMAGE_DESCRIPTOR"},
    {-66, "CL_INVALID_COMPILER_OPTIONS"},
    {-67, "CL_INVALID_LINKER_OPTIONS"},
    {-68, "CL_INVALID_DEVICE_PARTITION_COUNT"},
    {-69, "CL_INVALID_PIPE_SIZE"},
    {-70, "CL_INVALID_DEVICE_QUEUE"},
    {-71, "CL_INVALID_SPEC_ID"},
    {-72, "CL_MAX_SIZE_RESTRICTION_EXCEEDED"},
    {-1001, "CL_PLATFORM_NOT_FOUND_KHR"},
};

const char *kvhal__ocl_err_name(cl_int err)
{
    for (size_t i = 0; i < sizeof cl_errors / sizeof cl_errors[0]; i++)
        if (cl_errors[i].code == err) return cl_errors[i].name;
    return "CL_UNKNOWN_ERROR";
}

kvhal_status kvhal__ocl_map_err(cl_int err)
{
    switch (err) {
    case CL_OUT_OF_HOST_MEMORY:
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
        return KVHAL_OUT_OF_MEMORY;
    case CL_INVALID_MEM_OBJECT:
    case CL_INVALID_COMMAND_QUEUE:
    case CL_INVALID_CONTEXT:
    case CL_INVALID_EVENT:
        return KVHAL_INVALID_HANDLE;
    case CL_INVALID_VALUE:
    case CL_MEM_COPY_OVERLAP:
    case CL_INVALID_BUFFER_SIZE:
        return KVHAL_INVALID_ARGUMENT;
    case CL_DEVICE_NOT_FOUND:
    case CL_DEVICE_NOT_AVAILABLE:
    case CL_INVALID_DEVICE:
    case CL_PLATFORM_NOT_FOUND_KHR:
        return KVHAL_NO_DEVICE;
    case CL_COMPILER_NOT_AVAILABLE:
        return KVHAL_UNSUPPORTED;
    default:
        return KVHAL_BACKEND_ERROR;
    }
}

kvhal_status kvhal__ocl_fail(ocl_module *m, cl_int err, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return OCL_SET_ERROR(m, kvhal__ocl_map_err(err), "%s: %s (%d)", what, kvhal__ocl_err_name(err), (int)err);
}

bool kvhal__ocl_alloc_refused(ocl_module *m)
{
    return m->services->alloc_should_fail && m->services->alloc_should_fail();
}

void *kvhal__ocl_malloc(ocl_module *m, size_t n)
{
    if (kvhal__ocl_alloc_refused(m)) return NULL;
    return malloc(n ? n : 1);
}

ocl_device *kvhal__ocl_device(ocl_module *m, int32_t id)
{
    return id >= 0 && id < m->num_devices ? &m->devices[id] : NULL;
}

void kvhal__ocl_device_str(cl_device_id dv, cl_device_info what, char *buf, size_t n)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(dv, what, n, buf, NULL) != CL_SUCCESS) snprintf(buf, n, "(unknown)");
    buf[n - 1] = '\0';
}

char *kvhal__ocl_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *r = malloc(n);
    if (r) memcpy(r, s, n);
    return r;
}

/* At exit the core's own destructor hands back the descriptors still cached, and that runs after this module's
 * destructor, by when the OpenCL runtime (which we depend on, so it is finalised after us) may be gone: from here on
 * only host memory is freed and no OpenCL call is made. */
static atomic_bool finalizing;

__attribute__((destructor)) static void ocl_module_fini(void) { atomic_store(&finalizing, true); }

bool kvhal__ocl_finalizing(void) { return atomic_load(&finalizing); }

/* ocl_backend.c — the OpenCL backend module (libkvhal-opencl.so): platform and device discovery through the ICD
 * loader, contexts and default queues, buffers (cl_mem), streams (command queues), copies, memset, the device-side
 * error flag, OpenCL error names, and the program cache that makes every (context, device, program, options)
 * build happen once. The ops and their descriptors live in ocl_ops.c; kernels in the .cl files beside this one. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal_opencl_test.h"
#include "ocl_internal.h"

#define OCL_EXPORT __attribute__((visibility("default")))

/* Not in the 1.2 headers' core set. */
#ifndef CL_PLATFORM_NOT_FOUND_KHR
#define CL_PLATFORM_NOT_FOUND_KHR -1001
#endif
#define OCL_DEVICE_GLOBAL_FREE_MEMORY_AMD 0x4039

const kvhal_core_services *kvhal__ocl_services;

static ocl_device devices[KVHAL_MAX_DEVICES_PER_TYPE];
static int32_t num_devices;
static cl_context platform_ctxs[KVHAL_MAX_DEVICES_PER_TYPE];
static int32_t num_platform_ctxs;

/* ---- errors ---- */
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

static kvhal_status map_err(cl_int err)
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

kvhal_status kvhal__ocl_fail(cl_int err, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return OCL_SET_ERROR(map_err(err), "%s: %s (%d)", what, kvhal__ocl_err_name(err), (int)err);
}

void *kvhal__ocl_malloc(size_t n)
{
    if (kvhal__ocl_services->alloc_should_fail && kvhal__ocl_services->alloc_should_fail()) return NULL;
    return malloc(n ? n : 1);
}

static bool alloc_refused(void)
{
    return kvhal__ocl_services->alloc_should_fail && kvhal__ocl_services->alloc_should_fail();
}

ocl_device *kvhal__ocl_device(int32_t id) { return id >= 0 && id < num_devices ? &devices[id] : NULL; }

#define GET_DEVICE(id, d)                                                                                       \
    ocl_device *d = kvhal__ocl_device(id);                                                                      \
    if (!d) return OCL_SET_ERROR(KVHAL_NO_DEVICE, "opencl:%d: no such device (%d present)", (int)(id), num_devices)

static int32_t dev_index(const ocl_device *d) { return (int32_t)(d - devices); }

/* ---- discovery ---- */
static void get_platform_str(cl_platform_id p, cl_platform_info what, char *buf, size_t n)
{
    buf[0] = '\0';
    if (clGetPlatformInfo(p, what, n, buf, NULL) != CL_SUCCESS) snprintf(buf, n, "(unknown)");
    buf[n - 1] = '\0';
}

static void get_device_str(cl_device_id dv, cl_device_info what, char *buf, size_t n)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(dv, what, n, buf, NULL) != CL_SUCCESS) snprintf(buf, n, "(unknown)");
    buf[n - 1] = '\0';
}

static void append_reason(char *reason, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append_reason(char *reason, size_t size, const char *fmt, ...)
{
    size_t used = strlen(reason);
    if (used + 3 >= size) return;
    if (used) {
        memcpy(reason + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason + used, size - used, fmt, ap);
    va_end(ap);
}

/* "OpenCL 1.2 ..." -> 102; 0 when unreadable. */
static int parse_version(const char *s, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(s, prefix, n)) return 0;
    int major = 0, minor = 0;
    if (sscanf(s + n, "%d.%d", &major, &minor) != 2) return 0;
    return major * 100 + minor;
}

/* Why a device cannot serve kvhal (NULL: it can). */
static const char *unusable(cl_device_id dv)
{
    cl_bool b = CL_FALSE;
    char ver[128];
    if (clGetDeviceInfo(dv, CL_DEVICE_AVAILABLE, sizeof b, &b, NULL) != CL_SUCCESS || !b) return "not available";
    if (clGetDeviceInfo(dv, CL_DEVICE_COMPILER_AVAILABLE, sizeof b, &b, NULL) != CL_SUCCESS || !b)
        return "no OpenCL C compiler";
    if (clGetDeviceInfo(dv, CL_DEVICE_ENDIAN_LITTLE, sizeof b, &b, NULL) != CL_SUCCESS || !b)
        return "big-endian devices are not supported";
    get_device_str(dv, CL_DEVICE_VERSION, ver, sizeof ver);
    if (parse_version(ver, "OpenCL ") < 102) return "OpenCL 1.2 or later is required";
    get_device_str(dv, CL_DEVICE_OPENCL_C_VERSION, ver, sizeof ver);
    if (parse_version(ver, "OpenCL C ") < 102) return "OpenCL C 1.2 or later is required";
    return NULL;
}

static kvhal_status make_ctx_entry(ocl_device *d, cl_context ctx, ocl_ctx *e)
{
    cl_int err;
    e->ctx = ctx;
    e->queue = clCreateCommandQueue(ctx, d->id, 0, &err);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "clCreateCommandQueue on '%s'", d->name);
    cl_int zero = 0;
    e->err_flag = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zero, &zero, &err);
    if (err != CL_SUCCESS) {
        clReleaseCommandQueue(e->queue);
        e->queue = NULL;
        return kvhal__ocl_fail(err, "clCreateBuffer (error flag) on '%s'", d->name);
    }
    return KVHAL_OK;
}

static void release_ctx_entry(ocl_ctx *e)
{
    if (e->err_flag) clReleaseMemObject(e->err_flag);
    if (e->queue) clReleaseCommandQueue(e->queue);
    e->err_flag = NULL;
    e->queue = NULL;
}

/* Sets up device slot `devices[num_devices]` for dv in ctx; returns false (reason appended) if it cannot. */
static bool add_device(cl_platform_id p, const char *pname, cl_device_id dv, cl_context ctx, bool shared,
                       char *reason, size_t reason_size)
{
    ocl_device *d = &devices[num_devices];
    memset(d, 0, sizeof *d);
    d->id = dv;
    d->platform = p;
    d->shared_context = shared;
    snprintf(d->platform_name, sizeof d->platform_name, "%s", pname);
    get_device_str(dv, CL_DEVICE_NAME, d->name, sizeof d->name);
    cl_int err = clGetDeviceInfo(dv, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof d->global_mem, &d->global_mem, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(dv, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof d->max_alloc, &d->max_alloc, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(dv, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof d->compute_units, &d->compute_units, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(dv, CL_DEVICE_ADDRESS_BITS, sizeof d->address_bits, &d->address_bits, NULL);
    if (err == CL_SUCCESS) err = clGetDeviceInfo(dv, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_wg, &d->max_wg, NULL);
    if (err != CL_SUCCESS) {
        append_reason(reason, reason_size, "'%s': clGetDeviceInfo: %s (%d)", d->name, kvhal__ocl_err_name(err),
                      (int)err);
        return false;
    }
    cl_device_type type = 0;
    if (clGetDeviceInfo(dv, CL_DEVICE_TYPE, sizeof type, &type, NULL) == CL_SUCCESS)
        d->cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    size_t ext_size = 0;
    if (clGetDeviceInfo(dv, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_size) == CL_SUCCESS && ext_size) {
        char *ext = malloc(ext_size + 1);
        if (ext && clGetDeviceInfo(dv, CL_DEVICE_EXTENSIONS, ext_size, ext, NULL) == CL_SUCCESS) {
            ext[ext_size] = '\0';
            d->amd_free_mem = strstr(ext, "cl_amd_device_attribute_query") != NULL;
            if (strstr(ext, "cl_nv_device_attribute_query")) {
                /* CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV / _MINOR_NV of cl_nv_device_attribute_query */
                cl_uint major = 0, minor = 0;
                if (clGetDeviceInfo(dv, 0x4000, sizeof major, &major, NULL) == CL_SUCCESS &&
                    clGetDeviceInfo(dv, 0x4001, sizeof minor, &minor, NULL) == CL_SUCCESS)
                    d->nv_fp8 = major * 10 + minor >= 89;
            }
        }
        free(ext);
    }
    if (make_ctx_entry(d, ctx, &d->ctxs[0]) != KVHAL_OK) {
        /* The status went to kvhal_last_error; init reports through reason instead. */
        append_reason(reason, reason_size, "'%s': queue or error flag could not be created", d->name);
        return false;
    }
    pthread_mutex_init(&d->mu, NULL);
    atomic_store(&d->nctx, 1);
    num_devices++;
    return true;
}

typedef struct plat {
    cl_platform_id id;
    char name[128], vendor[128], version[128];
} plat;

static int plat_cmp(const plat *a, const plat *b)
{
    int c = strcmp(a->name, b->name);
    if (!c) c = strcmp(a->vendor, b->vendor);
    if (!c) c = strcmp(a->version, b->version);
    return c;
}

static kvhal_status ocl_init(const kvhal_core_services *services, int32_t *device_count, char *reason,
                             size_t reason_size)
{
    if (!services || !services->set_error) return KVHAL_INVALID_ARGUMENT;
    kvhal__ocl_services = services;
    *device_count = 0;
    if (reason_size) reason[0] = '\0';
    num_devices = 0;
    num_platform_ctxs = 0;

    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && np == 0)) {
        const char *vendors = getenv("OCL_ICD_VENDORS"), *files = getenv("OCL_ICD_FILENAMES");
        snprintf(reason, reason_size,
                 "no OpenCL platform: the ICD loader found no vendor driver (clGetPlatformIDs: %s%s%s%s%s)",
                 err == CL_SUCCESS ? "0 platforms" : "CL_PLATFORM_NOT_FOUND_KHR (-1001)",
                 vendors ? "; OCL_ICD_VENDORS=" : "", vendors ? vendors : "", files ? "; OCL_ICD_FILENAMES=" : "",
                 files ? files : "");
        return KVHAL_OK;
    }
    if (err != CL_SUCCESS) {
        snprintf(reason, reason_size, "clGetPlatformIDs: %s (%d)", kvhal__ocl_err_name(err), (int)err);
        return KVHAL_OK;
    }
    cl_platform_id *ids = malloc(np * sizeof *ids);
    plat *plats = malloc(np * sizeof *plats);
    if (!ids || !plats) {
        free(ids);
        free(plats);
        snprintf(reason, reason_size, "out of host memory listing %u platforms", np);
        return KVHAL_OUT_OF_MEMORY;
    }
    err = clGetPlatformIDs(np, ids, NULL);
    if (err != CL_SUCCESS) {
        snprintf(reason, reason_size, "clGetPlatformIDs: %s (%d)", kvhal__ocl_err_name(err), (int)err);
        free(ids);
        free(plats);
        return KVHAL_OK;
    }
    /* The loader's platform order follows its vendors folder listing; sorting by name, vendor and version keeps
     * kvhal's device ids the same from run to run (insertion sort: stable for identical platforms). */
    for (cl_uint i = 0; i < np; i++) {
        plats[i].id = ids[i];
        get_platform_str(ids[i], CL_PLATFORM_NAME, plats[i].name, sizeof plats[i].name);
        get_platform_str(ids[i], CL_PLATFORM_VENDOR, plats[i].vendor, sizeof plats[i].vendor);
        get_platform_str(ids[i], CL_PLATFORM_VERSION, plats[i].version, sizeof plats[i].version);
        for (cl_uint j = i; j > 0 && plat_cmp(&plats[j - 1], &plats[j]) > 0; j--) {
            plat t = plats[j];
            plats[j] = plats[j - 1];
            plats[j - 1] = t;
        }
    }
    free(ids);

    for (cl_uint pi = 0; pi < np && num_devices < KVHAL_MAX_DEVICES_PER_TYPE; pi++) {
        const plat *p = &plats[pi];
        cl_uint nd = 0;
        err = clGetDeviceIDs(p->id, CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (err == CL_DEVICE_NOT_FOUND || (err == CL_SUCCESS && nd == 0)) {
            append_reason(reason, reason_size, "platform '%s': no devices", p->name);
            continue;
        }
        if (err != CL_SUCCESS) {
            append_reason(reason, reason_size, "platform '%s': clGetDeviceIDs: %s (%d)", p->name,
                          kvhal__ocl_err_name(err), (int)err);
            continue;
        }
        cl_device_id *dv = malloc(nd * sizeof *dv);
        if (!dv) continue;
        err = clGetDeviceIDs(p->id, CL_DEVICE_TYPE_ALL, nd, dv, NULL);
        if (err != CL_SUCCESS) {
            append_reason(reason, reason_size, "platform '%s': clGetDeviceIDs: %s (%d)", p->name,
                          kvhal__ocl_err_name(err), (int)err);
            free(dv);
            continue;
        }
        cl_uint nuse = 0;
        for (cl_uint i = 0; i < nd; i++) {
            const char *why = unusable(dv[i]);
            if (why) {
                char name[256];
                get_device_str(dv[i], CL_DEVICE_NAME, name, sizeof name);
                append_reason(reason, reason_size, "'%s' (platform '%s') skipped: %s", name, p->name, why);
            } else {
                dv[nuse++] = dv[i];
            }
        }
        if (nuse > (cl_uint)(KVHAL_MAX_DEVICES_PER_TYPE - num_devices))
            nuse = (cl_uint)(KVHAL_MAX_DEVICES_PER_TYPE - num_devices);
        if (nuse == 0) {
            free(dv);
            continue;
        }
        /* One context per platform: its devices share buffers, so copies between them need no host staging. */
        cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p->id, 0};
        cl_context ctx = clCreateContext(props, nuse, dv, NULL, NULL, &err);
        if (err != CL_SUCCESS) {
            append_reason(reason, reason_size, "platform '%s': clCreateContext: %s (%d)", p->name,
                          kvhal__ocl_err_name(err), (int)err);
            free(dv);
            continue;
        }
        int32_t added = 0;
        for (cl_uint i = 0; i < nuse; i++)
            if (add_device(p->id, p->name, dv[i], ctx, nuse > 1, reason, reason_size)) added++;
        free(dv);
        if (added) platform_ctxs[num_platform_ctxs++] = ctx;
        else clReleaseContext(ctx);
    }
    free(plats);
    if (num_devices == 0 && !reason[0]) snprintf(reason, reason_size, "no OpenCL device found");
    *device_count = num_devices;
    return KVHAL_OK;
}

/* ---- program cache ---- */
extern const unsigned char kvhal__ocl_src_kv_common[] OCL_HIDDEN;
extern const size_t kvhal__ocl_src_kv_common_len OCL_HIDDEN;
extern const unsigned char kvhal__ocl_src_paged_caching[] OCL_HIDDEN;
extern const size_t kvhal__ocl_src_paged_caching_len OCL_HIDDEN;
extern const unsigned char kvhal__ocl_src_copy_blocks[] OCL_HIDDEN;
extern const size_t kvhal__ocl_src_copy_blocks_len OCL_HIDDEN;
extern const unsigned char kvhal__ocl_src_tensor_copy[] OCL_HIDDEN;
extern const size_t kvhal__ocl_src_tensor_copy_len OCL_HIDDEN;

static const char *const src_names[OCL_SRC_COUNT] = {"paged_caching", "copy_blocks", "tensor_copy"};

typedef struct prog_entry {
    cl_context ctx;
    cl_device_id dev;
    ocl_src src;
    char *options;
    char *inject; /* NULL when built without injected text */
    cl_program prog;
    struct prog_entry *next;
} prog_entry;

static pthread_mutex_t prog_mu = PTHREAD_MUTEX_INITIALIZER;
static prog_entry *progs;
static char *inject_text; /* under prog_mu */
static atomic_uint_fast64_t build_count;

static bool str_eq(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *r = malloc(n);
    if (r) memcpy(r, s, n);
    return r;
}

/* A failed build: the log (trimmed) goes into the error message and, whole, into the log. */
static kvhal_status build_failed(ocl_device *d, cl_program prog, ocl_src src, const char *options, cl_int err)
{
    size_t n = 0;
    char *log = NULL;
    if (clGetProgramBuildInfo(prog, d->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) == CL_SUCCESS && n) {
        log = malloc(n + 1);
        if (log && clGetProgramBuildInfo(prog, d->id, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) log[n] = '\0';
        else {
            free(log);
            log = NULL;
        }
    }
    const char *l = log ? log : "(no build log)";
    while (*l == ' ' || *l == '\n' || *l == '\r' || *l == '\t') l++;
    if (kvhal__ocl_services->log)
        kvhal__ocl_services->log(0, "opencl:%d: build of %s.cl (options '%s') failed: %s (%d)\n%s", dev_index(d),
                                 src_names[src], options, kvhal__ocl_err_name(err), (int)err, l);
    kvhal_status st = OCL_SET_ERROR(map_err(err), "opencl:%d ('%s'): clBuildProgram(%s.cl): %s (%d); build log: %.640s",
                                    dev_index(d), d->name, src_names[src], kvhal__ocl_err_name(err), (int)err, l);
    free(log);
    return st;
}

kvhal_status kvhal__ocl_program(ocl_device *d, ocl_ctx *ce, ocl_src src, const char *options, cl_program *out)
{
    static const unsigned char *const texts[OCL_SRC_COUNT] = {kvhal__ocl_src_paged_caching,
                                                               kvhal__ocl_src_copy_blocks,
                                                               kvhal__ocl_src_tensor_copy};
    const size_t lens[OCL_SRC_COUNT] = {kvhal__ocl_src_paged_caching_len, kvhal__ocl_src_copy_blocks_len,
                                        kvhal__ocl_src_tensor_copy_len};
    kvhal_status st = KVHAL_OK;
    /* The lock is held through a build: builds are rare, and two threads asking for one program must not both
     * build it (nor may a failed build be half-inserted). */
    pthread_mutex_lock(&prog_mu);
    for (prog_entry *e = progs; e; e = e->next) {
        if (e->ctx == ce->ctx && e->dev == d->id && e->src == src && !strcmp(e->options, options) &&
            str_eq(e->inject, inject_text)) {
            cl_int err = clRetainProgram(e->prog);
            if (err != CL_SUCCESS) st = kvhal__ocl_fail(err, "clRetainProgram");
            else *out = e->prog;
            pthread_mutex_unlock(&prog_mu);
            return st;
        }
    }
    prog_entry *e = kvhal__ocl_malloc(sizeof *e);
    char *opt_copy = str_dup(options);
    char *inj_copy = inject_text ? str_dup(inject_text) : NULL;
    if (!e || !opt_copy || (inject_text && !inj_copy)) {
        free(e);
        free(opt_copy);
        free(inj_copy);
        pthread_mutex_unlock(&prog_mu);
        return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a program of %s.cl failed",
                             dev_index(d), src_names[src]);
    }
    const char *strings[3] = {(const char *)kvhal__ocl_src_kv_common, (const char *)texts[src], inject_text};
    size_t sizes[3] = {kvhal__ocl_src_kv_common_len, lens[src], inject_text ? strlen(inject_text) : 0};
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ce->ctx, inject_text ? 3 : 2, strings, sizes, &err);
    if (err != CL_SUCCESS) {
        st = kvhal__ocl_fail(err, "opencl:%d: clCreateProgramWithSource(%s.cl)", dev_index(d), src_names[src]);
    } else {
        char full[1024];
        snprintf(full, sizeof full, "-cl-std=CL1.2 %s", options);
        err = clBuildProgram(prog, 1, &d->id, full, NULL, NULL);
        atomic_fetch_add(&build_count, 1);
        if (err != CL_SUCCESS) {
            st = build_failed(d, prog, src, full, err);
            clReleaseProgram(prog);
        }
    }
    if (st == KVHAL_OK) {
        err = clRetainProgram(prog); /* one reference for the cache, one for the caller */
        if (err != CL_SUCCESS) {
            st = kvhal__ocl_fail(err, "clRetainProgram");
            clReleaseProgram(prog);
        }
    }
    if (st != KVHAL_OK) {
        free(e);
        free(opt_copy);
        free(inj_copy);
        pthread_mutex_unlock(&prog_mu);
        return st;
    }
    e->ctx = ce->ctx;
    e->dev = d->id;
    e->src = src;
    e->options = opt_copy;
    e->inject = inj_copy;
    e->prog = prog;
    e->next = progs;
    progs = e;
    *out = prog;
    pthread_mutex_unlock(&prog_mu);
    return KVHAL_OK;
}

uint64_t kvhal_opencl_build_count(void) OCL_EXPORT;
uint64_t kvhal_opencl_build_count(void) { return (uint64_t)atomic_load(&build_count); }

void kvhal_opencl_test_inject_source(const char *text) OCL_EXPORT;
void kvhal_opencl_test_inject_source(const char *text)
{
    char *copy = text && *text ? str_dup(text) : NULL;
    pthread_mutex_lock(&prog_mu);
    free(inject_text);
    inject_text = copy;
    pthread_mutex_unlock(&prog_mu);
}

static atomic_int gpu_plans_on_cpu;

void kvhal_opencl_test_gpu_plans(int on) OCL_EXPORT;
void kvhal_opencl_test_gpu_plans(int on) { atomic_store(&gpu_plans_on_cpu, on != 0); }

bool kvhal__ocl_cpu_plans(const ocl_device *d) { return d->cpu && !atomic_load(&gpu_plans_on_cpu); }

kvhal_status kvhal__ocl_local_size(ocl_device *d, cl_kernel k, size_t *local)
{
    size_t kwg = 0, mult = 0;
    cl_int err = clGetKernelWorkGroupInfo(k, d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL);
    if (err == CL_SUCCESS)
        err = clGetKernelWorkGroupInfo(k, d->id, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof mult, &mult,
                                       NULL);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clGetKernelWorkGroupInfo", dev_index(d));
    size_t l = kwg < 256 ? kwg : 256;
    if (l > d->max_wg) l = d->max_wg;
    if (mult > 1 && l > mult) l -= l % mult;
    *local = l ? l : 1;
    return KVHAL_OK;
}

/* ---- contexts ---- */
kvhal_status kvhal__ocl_ctx_of_mem(ocl_device *d, cl_mem mem, ocl_ctx **out)
{
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    if (n == 1 || !mem) {
        *out = &d->ctxs[0];
        return KVHAL_OK;
    }
    cl_context c;
    cl_int err = clGetMemObjectInfo(mem, CL_MEM_CONTEXT, sizeof c, &c, NULL);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clGetMemObjectInfo(CL_MEM_CONTEXT)", dev_index(d));
    for (int i = 0; i < n; i++) {
        if (d->ctxs[i].ctx == c) {
            *out = &d->ctxs[i];
            return KVHAL_OK;
        }
    }
    return OCL_SET_ERROR(KVHAL_INVALID_ARGUMENT,
                         "opencl:%d: cl_mem %p lives in a cl_context this device was never given (wrap it with "
                         "kvhal_buffer_wrap first)",
                         dev_index(d), (void *)mem);
}

/* The entry of ctx on d, added (with a queue and an error flag of its own) when the caller brings a context of
 * theirs that holds d. */
static kvhal_status ctx_register(ocl_device *d, cl_context ctx, ocl_ctx **out)
{
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int i = 0; i < n; i++) {
        if (d->ctxs[i].ctx == ctx) {
            *out = &d->ctxs[i];
            return KVHAL_OK;
        }
    }
    kvhal_status st = KVHAL_OK;
    pthread_mutex_lock(&d->mu);
    n = atomic_load_explicit(&d->nctx, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        if (d->ctxs[i].ctx == ctx) {
            *out = &d->ctxs[i];
            pthread_mutex_unlock(&d->mu);
            return KVHAL_OK;
        }
    }
    cl_uint nd = 0;
    cl_device_id *ds = NULL;
    size_t bytes = 0;
    cl_int err = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, 0, NULL, &bytes);
    if (err == CL_SUCCESS) {
        ds = malloc(bytes ? bytes : 1);
        if (!ds) err = CL_OUT_OF_HOST_MEMORY;
        else err = clGetContextInfo(ctx, CL_CONTEXT_DEVICES, bytes, ds, NULL);
    }
    if (err != CL_SUCCESS) {
        st = kvhal__ocl_fail(err, "opencl:%d: clGetContextInfo(CL_CONTEXT_DEVICES)", dev_index(d));
    } else {
        nd = (cl_uint)(bytes / sizeof *ds);
        bool has = false;
        for (cl_uint i = 0; i < nd; i++) has = has || ds[i] == d->id;
        if (!has)
            st = OCL_SET_ERROR(KVHAL_DEVICE_MISMATCH, "opencl:%d: the object's cl_context does not hold device '%s'",
                               dev_index(d), d->name);
        else if (n >= OCL_MAX_CTX)
            st = OCL_SET_ERROR(KVHAL_UNSUPPORTED, "opencl:%d: more than %d cl_contexts in use on one device",
                               dev_index(d), OCL_MAX_CTX);
    }
    free(ds);
    if (st == KVHAL_OK) {
        err = clRetainContext(ctx);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(err, "clRetainContext");
    }
    if (st == KVHAL_OK) {
        st = make_ctx_entry(d, ctx, &d->ctxs[n]);
        if (st != KVHAL_OK) clReleaseContext(ctx);
    }
    if (st == KVHAL_OK) {
        *out = &d->ctxs[n];
        atomic_store_explicit(&d->nctx, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

kvhal_status kvhal__ocl_resolve(int32_t id, void *stream, cl_mem mem, cl_command_queue *q, ocl_ctx **ce)
{
    GET_DEVICE(id, d);
    if (stream) {
        ocl_stream *s = stream;
        if (mem && atomic_load_explicit(&d->nctx, memory_order_acquire) > 1) {
            ocl_ctx *mc;
            kvhal_status st = kvhal__ocl_ctx_of_mem(d, mem, &mc);
            if (st != KVHAL_OK) return st;
            if (mc != s->ce)
                return OCL_SET_ERROR(KVHAL_DEVICE_MISMATCH,
                                     "s: the stream's cl_command_queue and the buffer belong to different cl_contexts");
        }
        *q = s->queue;
        *ce = s->ce;
        return KVHAL_OK;
    }
    ocl_ctx *c;
    kvhal_status st = kvhal__ocl_ctx_of_mem(d, mem, &c);
    if (st != KVHAL_OK) return st;
    *q = c->queue;
    *ce = c;
    return KVHAL_OK;
}

/* ---- process exit ---- */
/* At exit the core's own destructor hands back the descriptors still cached, and that runs after this module's
 * destructor, by when the OpenCL runtime (which we depend on, so it is finalised after us) may be gone: from here
 * on only host memory is freed and no OpenCL call is made. */
static atomic_bool finalizing;

__attribute__((destructor)) static void ocl_module_fini(void) { atomic_store(&finalizing, true); }

bool kvhal__ocl_finalizing(void) { return atomic_load(&finalizing); }

/* ---- devices ---- */
static void ocl_shutdown(void)
{
    if (kvhal__ocl_finalizing()) return;
    pthread_mutex_lock(&prog_mu);
    while (progs) {
        prog_entry *e = progs;
        progs = e->next;
        clReleaseProgram(e->prog);
        free(e->options);
        free(e->inject);
        free(e);
    }
    free(inject_text);
    inject_text = NULL;
    pthread_mutex_unlock(&prog_mu);
    for (int32_t i = 0; i < num_devices; i++) {
        ocl_device *d = &devices[i];
        int n = atomic_load(&d->nctx);
        for (int c = 0; c < n; c++) {
            if (d->ctxs[c].queue) clFinish(d->ctxs[c].queue);
            release_ctx_entry(&d->ctxs[c]);
            if (c > 0) clReleaseContext(d->ctxs[c].ctx); /* retained at registration */
        }
        atomic_store(&d->nctx, 0);
        pthread_mutex_destroy(&d->mu);
    }
    for (int32_t i = 0; i < num_platform_ctxs; i++) clReleaseContext(platform_ctxs[i]);
    num_platform_ctxs = 0;
    num_devices = 0;
}

static kvhal_status ocl_device_info(int32_t id, kvhal_device_info *out)
{
    GET_DEVICE(id, d);
    memset(out, 0, sizeof *out);
    out->device.type = KVHAL_DEVICE_OPENCL;
    out->device.id = id;
    snprintf(out->name, sizeof out->name, "%s", d->name);
    snprintf(out->backend, sizeof out->backend, "opencl");
    snprintf(out->platform, sizeof out->platform, "%s", d->platform_name);
    out->total_memory = d->global_mem;
    out->compute_units = (int32_t)d->compute_units;
    out->peer_access = d->shared_context;
    if (d->amd_free_mem) {
        size_t kb[2] = {0, 0};
        if (clGetDeviceInfo(d->id, OCL_DEVICE_GLOBAL_FREE_MEMORY_AMD, sizeof kb, kb, NULL) == CL_SUCCESS)
            out->free_memory = (uint64_t)kb[0] * 1024u;
    }
    return KVHAL_OK;
}

/* ---- buffers ---- */
static kvhal_status ocl_buffer_alloc(int32_t id, size_t bytes, void **native)
{
    GET_DEVICE(id, d);
    if (alloc_refused())
        return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: allocation of %zu bytes failed (fault injection)", id,
                             bytes);
    /* A 32-bit device addresses less than 4 GiB; kernels take offsets as ulong but add them to its pointers. */
    if (d->address_bits < 64 && (uint64_t)bytes >= (uint64_t)1 << d->address_bits)
        return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "bytes: %zu exceeds the %u-bit address space of opencl:%d ('%s')",
                             bytes, d->address_bits, id, d->name);
    if (bytes > d->max_alloc)
        return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY,
                             "bytes: %zu exceeds the largest single allocation of opencl:%d ('%s'): "
                             "CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu",
                             bytes, id, d->name, (unsigned long long)d->max_alloc);
    cl_int err;
    cl_mem m = clCreateBuffer(d->ctxs[0].ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clCreateBuffer(%zu bytes)", id, bytes);
    /* OpenCL allocates lazily, at first use; touching one byte now makes an allocation failure show here rather
     * than in a later, unrelated operation. */
    cl_uchar zero = 0;
    cl_event ev;
    err = clEnqueueFillBuffer(d->ctxs[0].queue, m, &zero, 1, 0, 1, 0, NULL, &ev);
    if (err == CL_SUCCESS) {
        err = clWaitForEvents(1, &ev);
        cl_int status = CL_COMPLETE;
        if (err == CL_SUCCESS)
            err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
        if (err == CL_SUCCESS && status < 0) err = status;
        clReleaseEvent(ev);
    }
    if (err != CL_SUCCESS) {
        clReleaseMemObject(m);
        if (err == CL_OUT_OF_RESOURCES) err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return kvhal__ocl_fail(err, "opencl:%d: first touch of a %zu-byte buffer", id, bytes);
    }
    *native = m;
    return KVHAL_OK;
}

static kvhal_status ocl_buffer_free(int32_t id, void *native)
{
    GET_DEVICE(id, d);
    (void)d;
    /* Deletion waits for commands still using the buffer (OpenCL defers it), so no synchronize is needed. */
    cl_int err = clReleaseMemObject((cl_mem)native);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clReleaseMemObject", id);
    return KVHAL_OK;
}

static kvhal_status ocl_buffer_wrap(int32_t id, void *native, size_t bytes)
{
    GET_DEVICE(id, d);
    cl_mem m = (cl_mem)native;
    size_t size = 0;
    cl_context ctx;
    cl_mem_object_type type;
    cl_int err = clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof type, &type, NULL);
    if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err == CL_SUCCESS) err = clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "native: %p is not a usable cl_mem (clGetMemObjectInfo)", native);
    if (type != CL_MEM_OBJECT_BUFFER)
        return OCL_SET_ERROR(KVHAL_INVALID_ARGUMENT, "native: cl_mem %p is an image or pipe, not a buffer", native);
    if (bytes > size)
        return OCL_SET_ERROR(KVHAL_OUT_OF_RANGE, "bytes: %zu exceeds the %zu bytes of cl_mem %p", bytes, size, native);
    ocl_ctx *ce;
    kvhal_status st = ctx_register(d, ctx, &ce);
    if (st != KVHAL_OK) return st;
    err = clRetainMemObject(m);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clRetainMemObject", id);
    return KVHAL_OK;
}

static kvhal_status ocl_buffer_unwrap(int32_t id, void *native)
{
    GET_DEVICE(id, d);
    (void)d;
    cl_int err = clReleaseMemObject((cl_mem)native);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clReleaseMemObject (unwrap)", id);
    return KVHAL_OK;
}

/* ---- streams ---- */
static void stream_link(ocl_device *d, ocl_stream *s)
{
    pthread_mutex_lock(&d->mu);
    s->prev = NULL;
    s->next = d->streams;
    if (d->streams) d->streams->prev = s;
    d->streams = s;
    pthread_mutex_unlock(&d->mu);
}

static void stream_unlink(ocl_device *d, ocl_stream *s)
{
    pthread_mutex_lock(&d->mu);
    if (s->prev) s->prev->next = s->next;
    else d->streams = s->next;
    if (s->next) s->next->prev = s->prev;
    pthread_mutex_unlock(&d->mu);
}

static kvhal_status ocl_stream_create(int32_t id, void **stream)
{
    GET_DEVICE(id, d);
    ocl_stream *s = kvhal__ocl_malloc(sizeof *s);
    if (!s) return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a stream failed", id);
    cl_int err;
    s->queue = clCreateCommandQueue(d->ctxs[0].ctx, d->id, 0, &err); /* in order */
    if (err != CL_SUCCESS) {
        free(s);
        return kvhal__ocl_fail(err, "opencl:%d: clCreateCommandQueue", id);
    }
    s->ce = &d->ctxs[0];
    s->dev = id;
    stream_link(d, s);
    *stream = s;
    return KVHAL_OK;
}

static kvhal_status ocl_stream_wrap(int32_t id, void *native, void **stream)
{
    GET_DEVICE(id, d);
    cl_command_queue q = (cl_command_queue)native;
    cl_device_id qd;
    cl_context qc;
    cl_int err = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE, sizeof qd, &qd, NULL);
    if (err == CL_SUCCESS) err = clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof qc, &qc, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "native: %p is not a usable cl_command_queue (clGetCommandQueueInfo)", native);
    if (qd != d->id) {
        char name[256];
        get_device_str(qd, CL_DEVICE_NAME, name, sizeof name);
        return OCL_SET_ERROR(KVHAL_DEVICE_MISMATCH, "native: the queue runs on '%s', not on opencl:%d ('%s')", name,
                             id, d->name);
    }
    ocl_ctx *ce;
    kvhal_status st = ctx_register(d, qc, &ce);
    if (st != KVHAL_OK) return st;
    ocl_stream *s = kvhal__ocl_malloc(sizeof *s);
    if (!s) return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a stream failed", id);
    err = clRetainCommandQueue(q);
    if (err != CL_SUCCESS) {
        free(s);
        return kvhal__ocl_fail(err, "opencl:%d: clRetainCommandQueue", id);
    }
    s->queue = q;
    s->ce = ce;
    s->dev = id;
    stream_link(d, s);
    *stream = s;
    return KVHAL_OK;
}

static kvhal_status ocl_stream_destroy(int32_t id, void *stream)
{
    GET_DEVICE(id, d);
    ocl_stream *s = stream;
    if (!s) return KVHAL_OK;
    stream_unlink(d, s);
    /* Our reference only: an owned queue goes away (after its commands finish), a wrapped one stays the caller's. */
    cl_int err = clReleaseCommandQueue(s->queue);
    free(s);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clReleaseCommandQueue", id);
    return KVHAL_OK;
}

static kvhal_status finish_default(ocl_device *d)
{
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int c = 0; c < n; c++) {
        cl_int err = clFinish(d->ctxs[c].queue);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clFinish", dev_index(d));
    }
    return KVHAL_OK;
}

static kvhal_status ocl_stream_synchronize(int32_t id, void *stream)
{
    GET_DEVICE(id, d);
    if (!stream) return finish_default(d);
    cl_int err = clFinish(((ocl_stream *)stream)->queue);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clFinish", id);
    return KVHAL_OK;
}

/* ---- copies ---- */
static kvhal_status ocl_memcpy_h2d(int32_t id, void *dst, size_t dst_off, const void *src, size_t bytes,
                                   void *stream)
{
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(id, stream, (cl_mem)dst, &q, &ce);
    if (st != KVHAL_OK) return st;
    cl_int err = clEnqueueWriteBuffer(q, (cl_mem)dst, CL_TRUE, dst_off, bytes, src, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "opencl:%d: clEnqueueWriteBuffer(offset %zu, %zu bytes)", id, dst_off, bytes);
    return KVHAL_OK;
}

static kvhal_status ocl_memcpy_d2h(int32_t id, void *dst, const void *src, size_t src_off, size_t bytes,
                                   void *stream)
{
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(id, stream, (cl_mem)src, &q, &ce);
    if (st != KVHAL_OK) return st;
    cl_int err = clEnqueueReadBuffer(q, (cl_mem)src, CL_TRUE, src_off, bytes, dst, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "opencl:%d: clEnqueueReadBuffer(offset %zu, %zu bytes)", id, src_off, bytes);
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_copy(int32_t id, cl_command_queue q, ocl_ctx *ce, cl_mem dst, size_t dst_off, cl_mem src,
                             size_t src_off, size_t bytes)
{
    if (bytes == 0 || (dst == src && dst_off == src_off)) return KVHAL_OK;
    cl_int err;
    if (dst == src && dst_off < src_off + bytes && src_off < dst_off + bytes) {
        /* clEnqueueCopyBuffer refuses overlapping ranges; go through a temporary buffer (memmove semantics). */
        if (alloc_refused())
            return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "opencl:%d: temporary buffer of %zu bytes (fault injection)",
                                 id, bytes);
        cl_mem tmp = clCreateBuffer(ce->ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        if (err != CL_SUCCESS)
            return kvhal__ocl_fail(err, "opencl:%d: clCreateBuffer(temporary, %zu bytes)", id, bytes);
        err = clEnqueueCopyBuffer(q, src, tmp, src_off, 0, bytes, 0, NULL, NULL);
        if (err == CL_SUCCESS) err = clEnqueueCopyBuffer(q, tmp, dst, 0, dst_off, bytes, 0, NULL, NULL);
        clReleaseMemObject(tmp); /* freed once the copies are done */
    } else {
        err = clEnqueueCopyBuffer(q, src, dst, src_off, dst_off, bytes, 0, NULL, NULL);
    }
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "opencl:%d: clEnqueueCopyBuffer(src offset %zu, dst offset %zu, %zu bytes)", id,
                               src_off, dst_off, bytes);
    return KVHAL_OK;
}

static kvhal_status ocl_memcpy_d2d(int32_t id, void *dst, size_t dst_off, const void *src, size_t src_off,
                                   size_t bytes, void *stream)
{
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(id, stream, (cl_mem)dst, &q, &ce);
    if (st != KVHAL_OK) return st;
    return kvhal__ocl_copy(id, q, ce, (cl_mem)dst, dst_off, (cl_mem)src, src_off, bytes);
}

static kvhal_status ocl_memcpy_peer(int32_t dst_id, void *dst, size_t dst_off, int32_t src_id, const void *src,
                                    size_t src_off, size_t bytes, void *stream)
{
    GET_DEVICE(dst_id, dd);
    GET_DEVICE(src_id, sd);
    ocl_stream *s = stream;
    ocl_ctx *dc, *sc;
    kvhal_status st = kvhal__ocl_ctx_of_mem(dd, (cl_mem)dst, &dc);
    if (st == KVHAL_OK) st = kvhal__ocl_ctx_of_mem(sd, (cl_mem)src, &sc);
    if (st != KVHAL_OK) return st;
    if (dc->ctx == sc->ctx) {
        /* One context holds both: the runtime moves the data between its devices. */
        cl_command_queue q = s && s->ce->ctx == dc->ctx ? s->queue : dc->queue;
        return kvhal__ocl_copy(dst_id, q, dc, (cl_mem)dst, dst_off, (cl_mem)src, src_off, bytes);
    }
    /* Different platforms: through a bounded host buffer, each side on the stream if it is that side's. */
    cl_command_queue sq = s && s->dev == src_id && s->ce == sc ? s->queue : sc->queue;
    cl_command_queue dq = s && s->dev == dst_id && s->ce == dc ? s->queue : dc->queue;
    size_t chunk = bytes < ((size_t)16 << 20) ? bytes : ((size_t)16 << 20);
    unsigned char *tmp = kvhal__ocl_malloc(chunk);
    if (!tmp) return OCL_SET_ERROR(KVHAL_OUT_OF_MEMORY, "peer copy: %zu-byte host bounce buffer", chunk);
    cl_int err = CL_SUCCESS;
    const char *what = "clEnqueueReadBuffer";
    for (size_t done = 0; done < bytes && err == CL_SUCCESS; done += chunk) {
        size_t n = bytes - done < chunk ? bytes - done : chunk;
        err = clEnqueueReadBuffer(sq, (cl_mem)src, CL_TRUE, src_off + done, n, tmp, 0, NULL, NULL);
        if (err == CL_SUCCESS) {
            what = "clEnqueueWriteBuffer";
            err = clEnqueueWriteBuffer(dq, (cl_mem)dst, CL_TRUE, dst_off + done, n, tmp, 0, NULL, NULL);
        }
    }
    free(tmp);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "opencl:%d -> opencl:%d: staged copy of %zu bytes: %s", src_id, dst_id, bytes,
                               what);
    return KVHAL_OK;
}

static kvhal_status ocl_memset(int32_t id, void *dst, size_t off, int value, size_t bytes, void *stream)
{
    cl_command_queue q;
    ocl_ctx *ce;
    kvhal_status st = kvhal__ocl_resolve(id, stream, (cl_mem)dst, &q, &ce);
    if (st != KVHAL_OK) return st;
    cl_uchar v = (cl_uchar)value;
    cl_int err = clEnqueueFillBuffer(q, (cl_mem)dst, &v, 1, off, bytes, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(err, "opencl:%d: clEnqueueFillBuffer(offset %zu, %zu bytes)", id, off, bytes);
    return KVHAL_OK;
}

/* ---- synchronize and the device-side error flag ---- */
static kvhal_status finish_all(ocl_device *d)
{
    kvhal_status st = finish_default(d);
    if (st != KVHAL_OK) return st;
    pthread_mutex_lock(&d->mu);
    for (ocl_stream *s = d->streams; s && st == KVHAL_OK; s = s->next) {
        cl_int err = clFinish(s->queue);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(err, "opencl:%d: clFinish (stream)", dev_index(d));
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

static kvhal_status read_and_clear_flags(ocl_device *d)
{
    bool fault = false;
    int n = atomic_load_explicit(&d->nctx, memory_order_acquire);
    for (int c = 0; c < n; c++) {
        ocl_ctx *e = &d->ctxs[c];
        cl_int v = 0;
        cl_int err = clEnqueueReadBuffer(e->queue, e->err_flag, CL_TRUE, 0, sizeof v, &v, 0, NULL, NULL);
        if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: reading the error flag", dev_index(d));
        if (v) {
            cl_int zero = 0;
            err = clEnqueueWriteBuffer(e->queue, e->err_flag, CL_TRUE, 0, sizeof zero, &zero, 0, NULL, NULL);
            if (err != CL_SUCCESS) return kvhal__ocl_fail(err, "opencl:%d: clearing the error flag", dev_index(d));
            fault = true;
        }
    }
    if (fault)
        return OCL_SET_ERROR(KVHAL_DEVICE_FAULT,
                             "opencl:%d: a kernel skipped an out-of-range index (a slot past the end of the cache) "
                             "since the last check; nothing was written for it",
                             dev_index(d));
    return KVHAL_OK;
}

static kvhal_status ocl_synchronize(int32_t id)
{
    GET_DEVICE(id, d);
    kvhal_status st = finish_all(d);
    if (st != KVHAL_OK) return st;
    return read_and_clear_flags(d);
}

static kvhal_status ocl_check_errors(int32_t id)
{
    /* The flag can only be read after the kernels that might set it, on any queue, are done. */
    return ocl_synchronize(id);
}

/* ---- the table ---- */
static const kvhal_backend table = {
    .abi_version = KVHAL_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kvhal_backend),
    .name = "opencl",
    .type = KVHAL_DEVICE_OPENCL,
    .init = ocl_init,
    .shutdown = ocl_shutdown,
    .device_info = ocl_device_info,
    .buffer_alloc = ocl_buffer_alloc,
    .buffer_free = ocl_buffer_free,
    .buffer_wrap = ocl_buffer_wrap,
    .buffer_unwrap = ocl_buffer_unwrap,
    .stream_create = ocl_stream_create,
    .stream_wrap = ocl_stream_wrap,
    .stream_destroy = ocl_stream_destroy,
    .stream_synchronize = ocl_stream_synchronize,
    .memcpy_h2d = ocl_memcpy_h2d,
    .memcpy_d2h = ocl_memcpy_d2h,
    .memcpy_d2d = ocl_memcpy_d2d,
    .memcpy_peer = ocl_memcpy_peer,
    .memset = ocl_memset,
    .synchronize = ocl_synchronize,
    .check_errors = ocl_check_errors,
    .desc_create = kvhal__ocl_desc_create,
    .desc_destroy = kvhal__ocl_desc_destroy,
    .paged_caching = kvhal__ocl_paged_caching,
    .copy_blocks = kvhal__ocl_copy_blocks,
    .tensor_copy = kvhal__ocl_tensor_copy,
    .copy_batch = kvhal__ocl_copy_batch,
};

const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version) OCL_EXPORT;
const kvhal_backend *kvhal_backend_entry(uint32_t core_abi_version)
{
    /* The table only ever grows, so any core from ABI_MIN on can use it; the core checks our version itself. */
    return core_abi_version >= KVHAL_BACKEND_ABI_MIN ? &table : NULL;
}

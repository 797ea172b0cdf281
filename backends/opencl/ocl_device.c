/* ocl_device.c — the OpenCL module's devices: platform and device discovery through the ICD loader (one context
 * per platform), init and shutdown of the module's context (ocl_module), device info, and get_proc_address with the module's test hooks (kvhal_opencl_test.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal_opencl_test.h"
#include "ocl_internal.h"

#define OCL_DEVICE_GLOBAL_FREE_MEMORY_AMD 0x4039

/* ---- discovery ---- */
static void get_platform_str(cl_platform_id p, cl_platform_info what, char *buf, size_t n)
{
    buf[0] = '\0';
    if (clGetPlatformInfo(p, what, n, buf, NULL) != CL_SUCCESS) snprintf(buf, n, "(unknown)");
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
    kvhal__ocl_device_str(dv, CL_DEVICE_VERSION, ver, sizeof ver);
    if (parse_version(ver, "OpenCL ") < 102) return "OpenCL 1.2 or later is required";
    kvhal__ocl_device_str(dv, CL_DEVICE_OPENCL_C_VERSION, ver, sizeof ver);
    if (parse_version(ver, "OpenCL C ") < 102) return "OpenCL C 1.2 or later is required";
    return NULL;
}

/* Sets up device slot `m->devices[m->num_devices]` for dv in ctx; returns false (reason appended) if it cannot. */
static bool add_device(ocl_module *m, cl_platform_id p, const char *pname, cl_device_id dv, cl_context ctx, bool shared,
                       char *reason, size_t reason_size)
{
    ocl_device *d = &m->devices[m->num_devices];
    memset(d, 0, sizeof *d);
    d->m = m;
    d->index = m->num_devices;
    d->id = dv;
    d->platform = p;
    d->shared_context = shared;
    snprintf(d->platform_name, sizeof d->platform_name, "%s", pname);
    kvhal__ocl_device_str(dv, CL_DEVICE_NAME, d->name, sizeof d->name);
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
    if (kvhal__ocl_ctx_entry_make(d, ctx, &d->ctxs[0]) != KVHAL_OK) {
        /* The status went to kvhal_last_error; init reports through reason instead. */
        append_reason(reason, reason_size, "'%s': queue or error flag could not be created", d->name);
        return false;
    }
    pthread_mutex_init(&d->mu, NULL);
    d->pool_cap = (size_t)(d->global_mem / 16);
    atomic_store(&d->nctx, 1);
    m->num_devices++;
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

/* Finds the platforms and their usable devices; reason tells why some (or all) were left out. */
static kvhal_status discover(ocl_module *m, char *reason, size_t reason_size)
{

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

    for (cl_uint pi = 0; pi < np && m->num_devices < KVHAL_MAX_DEVICES_PER_TYPE; pi++) {
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
                kvhal__ocl_device_str(dv[i], CL_DEVICE_NAME, name, sizeof name);
                append_reason(reason, reason_size, "'%s' (platform '%s') skipped: %s", name, p->name, why);
            } else {
                dv[nuse++] = dv[i];
            }
        }
        if (nuse > (cl_uint)(KVHAL_MAX_DEVICES_PER_TYPE - m->num_devices))
            nuse = (cl_uint)(KVHAL_MAX_DEVICES_PER_TYPE - m->num_devices);
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
            if (add_device(m, p->id, p->name, dv[i], ctx, nuse > 1, reason, reason_size)) added++;
        free(dv);
        if (added) m->platform_ctxs[m->num_platform_ctxs++] = ctx;
        else clReleaseContext(ctx);
    }
    free(plats);
    if (m->num_devices == 0 && !reason[0]) snprintf(reason, reason_size, "no OpenCL device found");
    return KVHAL_OK;
}

/* ---- the module's only statics ----
 * Everything an instance keeps lives in its ocl_module. Two facts are process-wide, though: finalizing
 * (ocl_error.c) and
 *   hook_module the instance the test hooks act on (the last one initialised and not shut down): the hooks'
 *               types (kvhal_opencl_test.h) carry no context, so get_proc_address cannot hand one to them. */
static _Atomic(ocl_module *) hook_module;

/* ---- init and shutdown ---- */
kvhal_status kvhal__ocl_init(const kvhal_core_services *services, void **ctx, int32_t *device_count, char *reason,
                             size_t reason_size)
{
    if (!services || !services->set_error || !ctx || !device_count) return KVHAL_INVALID_ARGUMENT;
    *ctx = NULL;
    *device_count = 0;
    if (reason_size) reason[0] = '\0';
    ocl_module *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(reason, reason_size, "out of host memory for the module's context");
        return KVHAL_OUT_OF_MEMORY;
    }
    m->services = services;
    pthread_mutex_init(&m->prog_mu, NULL);
    kvhal_status st = discover(m, reason, reason_size);
    if (st != KVHAL_OK) {
        kvhal__ocl_shutdown(m);
        return st;
    }
    atomic_store(&hook_module, m);
    *ctx = m;
    *device_count = m->num_devices;
    return KVHAL_OK;
}

void kvhal__ocl_shutdown(void *ctx)
{
    ocl_module *m = ctx;
    if (!m) return;
    ocl_module *expected = m;
    atomic_compare_exchange_strong(&hook_module, &expected, NULL);
    if (!kvhal__ocl_finalizing()) {
        kvhal__ocl_programs_free(m);
        for (int32_t i = 0; i < m->num_devices; i++) {
            ocl_device *d = &m->devices[i];
            kvhal__ocl_pool_release(d); /* after the programs, before the contexts (kept buffers live in ctxs[0]) */
            int n = atomic_load(&d->nctx);
            for (int c = 0; c < n; c++) {
                if (d->ctxs[c].queue) clFinish(d->ctxs[c].queue);
                kvhal__ocl_ctx_entry_release(&d->ctxs[c]);
                if (c > 0) clReleaseContext(d->ctxs[c].ctx); /* retained at registration */
            }
            atomic_store(&d->nctx, 0);
            pthread_mutex_destroy(&d->mu);
        }
        for (int32_t i = 0; i < m->num_platform_ctxs; i++) clReleaseContext(m->platform_ctxs[i]);
    }
    free(m->inject_text);
    pthread_mutex_destroy(&m->prog_mu);
    free(m);
}

kvhal_status kvhal__ocl_device_info(void *ctx, int32_t id, kvhal_device_info *out)
{
    OCL_GET_DEVICE(ctx, id, d);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", d->name);
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

/* ---- test hooks (kvhal_opencl_test.h), served by get_proc_address ---- */
static uint64_t hook_build_count(void)
{
    ocl_module *m = atomic_load(&hook_module);
    return m ? (uint64_t)atomic_load(&m->build_count) : 0;
}

static void hook_inject_source(const char *text)
{
    ocl_module *m = atomic_load(&hook_module);
    if (!m) return;
    char *copy = text && *text ? kvhal__ocl_strdup(text) : NULL;
    pthread_mutex_lock(&m->prog_mu);
    free(m->inject_text);
    m->inject_text = copy;
    pthread_mutex_unlock(&m->prog_mu);
}

static void hook_gpu_plans(int on)
{
    ocl_module *m = atomic_load(&hook_module);
    if (m) atomic_store(&m->gpu_plans_on_cpu, on != 0);
}

static uint64_t hook_pool(int32_t id, int64_t cap, int32_t fail_creates)
{
    ocl_module *m = atomic_load(&hook_module);
    ocl_device *d = m ? kvhal__ocl_device(m, id) : NULL;
    if (!d) return 0;
    if (fail_creates >= 0) atomic_store(&d->fail_creates, fail_creates);
    if (cap >= 0) {
        kvhal__ocl_pool_release(d);
        pthread_mutex_lock(&d->mu);
        d->pool_cap = (size_t)cap;
        pthread_mutex_unlock(&d->mu);
    }
    pthread_mutex_lock(&d->mu);
    const uint64_t hits = d->pool_hits;
    pthread_mutex_unlock(&d->mu);
    return hits;
}

bool kvhal__ocl_cpu_plans(const ocl_device *d) { return d->cpu && !atomic_load(&d->m->gpu_plans_on_cpu); }

void *kvhal__ocl_get_proc_address(void *ctx, const char *name)
{
    (void)ctx;
    /* Checked against the header's types here, so a hook and its declared type cannot drift apart. */
    static const kvhal_opencl_build_count_fn build_count = hook_build_count;
    static const kvhal_opencl_test_inject_source_fn inject_source = hook_inject_source;
    static const kvhal_opencl_test_gpu_plans_fn gpu_plans = hook_gpu_plans;
    static const kvhal_opencl_test_pool_fn pool = hook_pool;
    void *p = NULL;
    if (!name) return NULL;
    if (!strcmp(name, "kvhal_opencl_build_count")) memcpy(&p, &build_count, sizeof p);
    else if (!strcmp(name, "kvhal_opencl_test_inject_source")) memcpy(&p, &inject_source, sizeof p);
    else if (!strcmp(name, "kvhal_opencl_test_gpu_plans")) memcpy(&p, &gpu_plans, sizeof p);
    else if (!strcmp(name, "kvhal_opencl_test_pool")) memcpy(&p, &pool, sizeof p);
    return p;
}

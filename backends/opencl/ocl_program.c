/* ocl_program.c — the OpenCL module's programs: the kernel-source table (one embedded .cl file per op of
 * KVHAL_BK_OP_LIST, built after kv_common.cl), the program cache that makes every (context, device, op, options)
 * build happen once, a descriptor's kernels per cl_context, kernel arguments and launches. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ocl_internal.h"

/* ---- the kernel sources (embed_cl.py): kv_common.cl, then <name>.cl for every op `name` ---- */
extern const unsigned char kvhal_cl_src_kv_common[] OCL_HIDDEN;
extern const size_t kvhal_cl_src_kv_common_len OCL_HIDDEN;
#define OCL_X_SRC_DECL(E, name, T)                                                                              \
    extern const unsigned char kvhal_cl_src_##name[] OCL_HIDDEN;                                               \
    extern const size_t kvhal_cl_src_##name##_len OCL_HIDDEN;
KVHAL_BK_OP_LIST(OCL_X_SRC_DECL)
#undef OCL_X_SRC_DECL

/* An op without its .cl file fails to link (its kvhal_cl_src_<name> is undefined). */
static const struct {
    const char *name;
    const unsigned char *text;
    const size_t *len;
} sources[KVHAL_BK_OP_COUNT] = {
#define OCL_X_SRC(E, name, T) [KVHAL_BK_OP_##E] = {#name, kvhal_cl_src_##name, &kvhal_cl_src_##name##_len},
    KVHAL_BK_OP_LIST(OCL_X_SRC)
#undef OCL_X_SRC
};

/* ---- the program cache ---- */
struct ocl_prog_entry {
    cl_context ctx;
    cl_device_id dev;
    kvhal_bk_op op;
    char *options;
    char *inject; /* NULL when built without injected text */
    cl_program prog;
    struct ocl_prog_entry *next;
};

static bool str_eq(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* A failed build: the log (trimmed) goes into the error message and, whole, into the log. */
static kvhal_status build_failed(ocl_device *d, cl_program prog, kvhal_bk_op op, const char *options, cl_int err)
{
    const kvhal_core_services *sv = d->m->services;
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
    if (sv->log)
        sv->log(0, "opencl:%d: build of %s.cl (options '%s') failed: %s (%d)\n%s", d->index, sources[op].name,
                options, kvhal__ocl_err_name(err), (int)err, l);
    kvhal_status st = sv->set_error(kvhal__ocl_map_err(err),
                                    "opencl:%d ('%s'): clBuildProgram(%s.cl): %s (%d); build log: %.640s", d->index,
                                    d->name, sources[op].name, kvhal__ocl_err_name(err), (int)err, l);
    free(log);
    return st;
}

kvhal_status kvhal__ocl_program(ocl_device *d, ocl_ctx *ce, kvhal_bk_op op, const char *options, cl_program *out)
{
    ocl_module *m = d->m;
    kvhal_status st = KVHAL_OK;
    /* The lock is held through a build: builds are rare, and two threads asking for one program must not both
     * build it (nor may a failed build be half-inserted). */
    pthread_mutex_lock(&m->prog_mu);
    const char *inject = m->inject_text;
    for (ocl_prog_entry *e = m->progs; e; e = e->next) {
        if (e->ctx == ce->ctx && e->dev == d->id && e->op == op && !strcmp(e->options, options) &&
            str_eq(e->inject, inject)) {
            cl_int err = clRetainProgram(e->prog);
            if (err != CL_SUCCESS) st = kvhal__ocl_fail(m, err, "clRetainProgram");
            else *out = e->prog;
            pthread_mutex_unlock(&m->prog_mu);
            return st;
        }
    }
    ocl_prog_entry *e = kvhal__ocl_malloc(m, sizeof *e);
    char *opt_copy = kvhal__ocl_strdup(options);
    char *inj_copy = inject ? kvhal__ocl_strdup(inject) : NULL;
    if (!e || !opt_copy || (inject && !inj_copy)) {
        free(e);
        free(opt_copy);
        free(inj_copy);
        pthread_mutex_unlock(&m->prog_mu);
        return OCL_SET_ERROR(m, KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a program of %s.cl failed",
                             d->index, sources[op].name);
    }
    const char *strings[3] = {(const char *)kvhal_cl_src_kv_common, (const char *)sources[op].text, inject};
    size_t sizes[3] = {kvhal_cl_src_kv_common_len, *sources[op].len, inject ? strlen(inject) : 0};
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ce->ctx, inject ? 3 : 2, strings, sizes, &err);
    if (err != CL_SUCCESS) {
        st = kvhal__ocl_fail(m, err, "opencl:%d: clCreateProgramWithSource(%s.cl)", d->index, sources[op].name);
    } else {
        char full[1024];
        snprintf(full, sizeof full, "-cl-std=CL1.2 %s", options);
        err = clBuildProgram(prog, 1, &d->id, full, NULL, NULL);
        atomic_fetch_add(&m->build_count, 1);
        if (err != CL_SUCCESS) {
            st = build_failed(d, prog, op, full, err);
            clReleaseProgram(prog);
        }
    }
    if (st == KVHAL_OK) {
        err = clRetainProgram(prog); /* one reference for the cache, one for the caller */
        if (err != CL_SUCCESS) {
            st = kvhal__ocl_fail(m, err, "clRetainProgram");
            clReleaseProgram(prog);
        }
    }
    if (st != KVHAL_OK) {
        free(e);
        free(opt_copy);
        free(inj_copy);
        pthread_mutex_unlock(&m->prog_mu);
        return st;
    }
    e->ctx = ce->ctx;
    e->dev = d->id;
    e->op = op;
    e->options = opt_copy;
    e->inject = inj_copy;
    e->prog = prog;
    e->next = m->progs;
    m->progs = e;
    *out = prog;
    pthread_mutex_unlock(&m->prog_mu);
    return KVHAL_OK;
}

void kvhal__ocl_programs_free(ocl_module *m)
{
    pthread_mutex_lock(&m->prog_mu);
    while (m->progs) {
        ocl_prog_entry *e = m->progs;
        m->progs = e->next;
        clReleaseProgram(e->prog);
        free(e->options);
        free(e->inject);
        free(e);
    }
    pthread_mutex_unlock(&m->prog_mu);
}

/* ---- a descriptor's kernels ---- */
/* Work-group size for kernel k on d: 256 or the kernel's limit, a multiple of its preferred multiple. */
static kvhal_status local_size(ocl_device *d, cl_kernel k, size_t *local)
{
    size_t kwg = 0, mult = 0;
    cl_int err = clGetKernelWorkGroupInfo(k, d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL);
    if (err == CL_SUCCESS)
        err = clGetKernelWorkGroupInfo(k, d->id, CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof mult, &mult,
                                       NULL);
    if (err != CL_SUCCESS) return kvhal__ocl_fail(d->m, err, "opencl:%d: clGetKernelWorkGroupInfo", d->index);
    size_t l = kwg < 256 ? kwg : 256;
    if (l > d->max_wg) l = d->max_wg;
    if (mult > 1 && l > mult) l -= l % mult;
    *local = l ? l : 1;
    return KVHAL_OK;
}

static void kset_free(ocl_kset *s)
{
    if (!kvhal__ocl_finalizing()) {
        for (int i = 0; i < OCL_MAX_KERNELS; i++)
            if (s->k[i]) clReleaseKernel(s->k[i]);
        if (s->prog) clReleaseProgram(s->prog);
    }
    free(s);
}

kvhal_status kvhal__ocl_kset(ocl_device *d, ocl_desc *desc, ocl_ctx *ce, ocl_kset **out)
{
    for (ocl_kset *s = desc->sets; s; s = s->next) {
        if (s->ce == ce) {
            *out = s;
            return KVHAL_OK;
        }
    }
    ocl_kset *s = kvhal__ocl_malloc(d->m, sizeof *s);
    if (!s) return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for kernels failed", d->index);
    memset(s, 0, sizeof *s);
    s->ce = ce;
    kvhal_status st = kvhal__ocl_program(d, ce, desc->op, desc->options, &s->prog);
    for (int i = 0; i < desc->nk && st == KVHAL_OK; i++) {
        cl_int err;
        s->k[i] = clCreateKernel(s->prog, desc->knames[i], &err);
        if (err != CL_SUCCESS) st = kvhal__ocl_fail(d->m, err,
            "opencl:%d: clCreateKernel(%s)", d->index, desc->knames[i]);
        else st = local_size(d, s->k[i], &s->local[i]);
    }
    if (st == KVHAL_OK && desc->preset) st = desc->preset(d, desc, s);
    if (st != KVHAL_OK) {
        kset_free(s);
        return st;
    }
    s->next = desc->sets;
    desc->sets = s;
    *out = s;
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_desc_alloc(ocl_device *d, kvhal_bk_op op, size_t size, void **out)
{
    ocl_desc *desc = kvhal__ocl_malloc(d->m, size);
    if (!desc)
        return OCL_SET_ERROR(d->m, KVHAL_OUT_OF_MEMORY, "opencl:%d: host allocation for a descriptor failed",
                             d->index);
    memset(desc, 0, size);
    desc->op = op;
    *out = desc;
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_desc_build(ocl_device *d, ocl_desc *desc, cl_mem mem,
                                   void (*destroy)(ocl_device *d, void *desc), void **out)
{
    kvhal_status st = KVHAL_OK;
    if (desc->nk > 0) {
        ocl_ctx *ce;
        ocl_kset *ks;
        st = kvhal__ocl_ctx_of_mem(d, mem, &ce);
        if (st == KVHAL_OK) st = kvhal__ocl_kset(d, desc, ce, &ks);
    }
    if (st != KVHAL_OK) {
        destroy(d, desc);
        return st;
    }
    *out = desc;
    return KVHAL_OK;
}

void kvhal__ocl_desc_free(void *p)
{
    ocl_desc *desc = p;
    if (!desc) return;
    while (desc->sets) {
        ocl_kset *s = desc->sets;
        desc->sets = s->next;
        kset_free(s);
    }
    free(desc);
}

kvhal_status kvhal__ocl_desc_check(ocl_device *d, const void *desc, kvhal_bk_op op)
{
    if (!desc || ((const ocl_desc *)desc)->op != op)
        return OCL_SET_ERROR(d->m, KVHAL_INVALID_ARGUMENT, "opencl:%d: descriptor missing or of another op",
                             d->index);
    return KVHAL_OK;
}

/* ---- arguments and launches ---- */
kvhal_status kvhal__ocl_set_args(ocl_device *d, cl_kernel k, const char *kname, cl_uint first, const ocl_karg *a,
                                 int n)
{
    for (int i = 0; i < n; i++) {
        cl_int err = clSetKernelArg(k, first + (cl_uint)i, a[i].size, a[i].ptr);
        if (err != CL_SUCCESS)
            return kvhal__ocl_fail(d->m, err, "opencl:%d: clSetKernelArg(%s, %d)", d->index, kname,
                                   (int)first + i);
    }
    return KVHAL_OK;
}

kvhal_status kvhal__ocl_launch(ocl_device *d, cl_command_queue q, const ocl_kset *ks, int ki, const char *kname,
                               uint64_t items, cl_uint nwait, const cl_event *wait, cl_event *ev)
{
    size_t local = ks->local[ki];
    size_t global = (size_t)((items + local - 1) / local) * local;
    cl_int err = clEnqueueNDRangeKernel(q, ks->k[ki], 1, NULL, &global, &local, nwait, wait, ev);
    if (err != CL_SUCCESS)
        return kvhal__ocl_fail(d->m, err, "opencl:%d: clEnqueueNDRangeKernel(%s, global %zu, local %zu)", d->index,
                               kname, global, local);
    return KVHAL_OK;
}

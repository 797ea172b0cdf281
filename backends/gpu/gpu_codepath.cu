/* gpu_codepath.cu — which code each device of the GPU backends runs, and (HIP on AMD) the kernels compiled at run
 * time for a GPU that no embedded code object serves.
 *
 * CUDA, and HIP built for NVIDIA: the module embeds cubins for every nvcc_arch and the PTX of the last one; a device
 * runs the cubin of its major version at or below its minor, else the driver JIT-compiles the PTX (and keeps the
 * result in its own compute cache, CUDA_CACHE_PATH), else it has no code. Launches are unchanged.
 *
 * HIP on AMD (KVHAL_GPU_RTC): the module embeds code objects for hip_targets. A device whose target ID
 * (hipDeviceProp_t::gcnArchName, e.g. "gfx942:sramecc+:xnack-") none of them matches, or every device when
 * KVHAL_HIP_FORCE_RTC=1, gets its kernels from hiprtc: each kernel instantiation a descriptor needs is compiled on
 * first use from the kernel source embedded in the module (KVHAL_GPU_RTC_SOURCES: one name expression per program,
 * so the program holds exactly that template kernel beside the non-template ones), for that exact target ID. The code object
 * goes through the disk cache (gpu_codeobj.c: keyed by the hash of source + expression + options, the target ID and
 * the runtime version), is loaded with hipModuleLoadData and launched with hipModuleLaunchKernel; loaded kernels are
 * kept per device until shutdown. hiprtc of a ROCm that does not know the target (Debian 12's HIP 5.2 and gfx940+)
 * is refused before it is called, from the list of targets its code-object manager reports: that hiprtc crashes
 * (frees an invalid pointer) when asked for a processor it does not know. */
#include "gpu_private.h"

#include "gpu_codeobj.h"
#include <time.h>

#if defined(KVHAL_GPU_RTC)
#include <amd_comgr.h> /* types only: the library is opened at first compile (see comgr_knows) */
#include <dlfcn.h>
#include <hip/hiprtc.h>

/* The kernel source hiprtc compiles: these headers, embedded at build time by embed_cl.py (backends/hip/meson.build)
 * as kvhal_cl_src_<symbol>, given to hiprtc under their include names; the program includes every one of them, so
 * it holds every non-template kernel, and each name expression instantiates its template kernel. An op's own kernel
 * header is one line here (gpu_private.h: the recipe). */
#define KVHAL_GPU_RTC_SOURCES(X)                                                                                \
    X(kvhal_numerics, "kvhal_numerics.h")                                                                       \
    X(kvhal_gpu_runtime, "kvhal_gpu_runtime.h")                                                                 \
    X(kvhal_gpu_math, "kvhal_gpu_math.h")                                                                       \
    X(kvhal_gpu_kernels, "kvhal_gpu_kernels.cuh")                                                               \
    X(kvhal_gpu_copy_kernels, "kvhal_gpu_copy_kernels.cuh")                                                     \
    X(kvhal_gpu_page_kernels, "kvhal_gpu_page_kernels.cuh")

extern "C" {
#define KVHAL_GPU_X_EXTERN(sym, name) extern const unsigned char kvhal_cl_src_##sym[]; extern const size_t kvhal_cl_src_##sym##_len;
KVHAL_GPU_RTC_SOURCES(KVHAL_GPU_X_EXTERN)
#undef KVHAL_GPU_X_EXTERN
}
#endif

#ifndef KVHAL_GPU_SM_LIST
#define KVHAL_GPU_SM_LIST ""
#endif
#ifndef KVHAL_GPU_PTX_ARCH
#define KVHAL_GPU_PTX_ARCH 0
#endif
#ifndef KVHAL_GPU_HIP_TARGETS
#define KVHAL_GPU_HIP_TARGETS ""
#endif

namespace kvhal_gpu {

enum { PATH_NONE = 0, PATH_CUBIN = 1, PATH_PTX = 2, PATH_EMBEDDED = 3, PATH_RTC = 4 };

struct RtcKernel {
    char expr[384];
    void *module; /* hipModule_t */
    void *fn;     /* hipFunction_t */
    RtcKernel *next;
};

struct CodeState {
    int path;
    int arch;                         /* CUDA: the cubin's or PTX's SM */
    char target[KVHAL_CO_TARGET_MAX]; /* HIP: the device's target ID */
    char why[160];                    /* PATH_NONE, or why the run-time path was taken */
    pthread_mutex_t lock;             /* kernels, counts */
    RtcKernel *kernels;
    int compiled, cached;
    int loaded, loaded_us; /* functions load_code loaded when the device was opened, and the time it took */
};

void kernel_expr(char *buf, size_t size, const char *fmt, const char *pretty)
{
    /* clang: "const char *kvhal_gpu::type_spelling() [T = kvhal_gpu::XCopy<HIP_vector_type<unsigned int, 4>>]" */
    const char *t = pretty ? strstr(pretty, "[T = ") : NULL;
    char ty[320] = "";
    if (t) {
        t += 5;
        size_t n = strlen(t);
        if (n && t[n - 1] == ']') n--;
        if (n >= sizeof ty) n = 0;
        memcpy(ty, t, n);
        ty[n] = '\0';
    }
    snprintf(buf, size, fmt, ty, ty);
}

#if defined(KVHAL_GPU_RTC)
namespace {

/* Whether this hiprtc's code-object manager knows the processor of target (what it does not know, it crashes on).
 * The manager is opened here, not linked: it carries LLVM, and loading it beside another LLVM user in the process
 * (PoCL, the OpenCL CPU driver) aborts the process (LLVM's command-line options registered twice), so the module
 * loads it only when a device needs kernels compiled, as hiprtc itself does. */
bool comgr_knows(const char *target, char *err, size_t err_size)
{
    const size_t proc = strcspn(target, ":");
    void *lib = dlopen("libamd_comgr.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libamd_comgr.so", RTLD_NOW | RTLD_LOCAL);
    typedef amd_comgr_status_t (*CountFn)(size_t *);
    typedef amd_comgr_status_t (*NameFn)(size_t, const char **);
    typedef void (*VersionFn)(size_t *, size_t *);
    CountFn count = NULL;
    NameFn name = NULL;
    VersionFn version = NULL;
    if (lib) {
        void *a = dlsym(lib, "amd_comgr_get_isa_count"), *b = dlsym(lib, "amd_comgr_get_isa_name"),
             *v = dlsym(lib, "amd_comgr_get_version");
        memcpy(&count, &a, sizeof a);
        memcpy(&name, &b, sizeof b);
        memcpy(&version, &v, sizeof v);
    }
    size_t n = 0;
    if (!count || !name || !version || count(&n) != AMD_COMGR_STATUS_SUCCESS) {
        snprintf(err, err_size, "hiprtc: the code-object manager (libamd_comgr) %s", lib ? "lists no targets" : "is not installed");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const char *isa = NULL;
        if (name(i, &isa) != AMD_COMGR_STATUS_SUCCESS || !isa) continue;
        const char *p = strstr(isa, "--");
        if (p && strlen(p + 2) == proc && !strncmp(p + 2, target, proc)) return true;
    }
    size_t major = 0, minor = 0;
    version(&major, &minor);
    snprintf(err, err_size, "hiprtc: this ROCm (code-object manager %zu.%zu) cannot compile for %.*s; a newer ROCm is "
             "needed for this GPU", major, minor, (int)proc, target);
    return false;
}

char *dup_text(const unsigned char *p, size_t n)
{
    char *s = static_cast<char *>(malloc(n + 1));
    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

/* hiprtc 5.2 defines the 32- and 64-bit fixed-width types itself, not these (same types as <stdint.h>, so a
 * hiprtc that defines them too accepts the repeated typedefs). */
#define KVHAL_GPU_X_INCLUDE(sym, name) "#include \"" name "\"\n"
const char rtc_prelude[] = "typedef unsigned char uint8_t;\ntypedef signed char int8_t;\ntypedef unsigned short uint16_t;\n"
                           "typedef short int16_t;\ntypedef __UINTPTR_TYPE__ uintptr_t;\n"
                           KVHAL_GPU_RTC_SOURCES(KVHAL_GPU_X_INCLUDE);
#undef KVHAL_GPU_X_INCLUDE

struct RtcSource {
    const unsigned char *text;
    const size_t *len;
    const char *name;
};
#define KVHAL_GPU_X_SOURCE(sym, name) {kvhal_cl_src_##sym, &kvhal_cl_src_##sym##_len, name},
const RtcSource rtc_sources[] = {KVHAL_GPU_RTC_SOURCES(KVHAL_GPU_X_SOURCE)};
#undef KVHAL_GPU_X_SOURCE
enum { RTC_NSOURCES = sizeof rtc_sources / sizeof rtc_sources[0] };

uint64_t rtc_source_hash(const char *const *exprs, int n)
{
    uint64_t h = kvhal_co_hash(KVHAL_CO_HASH_INIT, rtc_prelude, sizeof rtc_prelude);
    for (int i = 0; i < RTC_NSOURCES; i++) h = kvhal_co_hash(h, rtc_sources[i].text, *rtc_sources[i].len);
    for (int i = 0; i < n; i++) h = kvhal_co_hash(h, exprs[i], strlen(exprs[i]) + 1);
    return h;
}

} // namespace

/* The run-time compiler: the embedded kernel source with one name expression per entry of exprs (each instantiates
 * that kernel), for target (a target ID). 0 with *code (malloc'd) / *size, else non-zero with the message (the
 * compiler's log included) in err. Also the module's test hook "kvhal_hip_rtc_compile" (get_proc_address). */
extern "C" int kvhal_hip_rtc_compile(const char *target, const char *const *exprs, int n, void **code, size_t *size,
                                     char *err, size_t err_size)
{
    if (err && err_size) err[0] = '\0';
    if (!code || !size) return 1;
    *code = NULL;
    *size = 0;
    if (!target || !target[0] || strlen(target) >= KVHAL_CO_TARGET_MAX || (n > 0 && !exprs) || n < 0) {
        snprintf(err, err_size, "hiprtc: target: %s", !target || !target[0] ? "empty" : "too long");
        return 1;
    }
    if (!comgr_knows(target, err, err_size)) return 1;
    char *hdr[RTC_NSOURCES];
    const char *texts[RTC_NSOURCES], *names[RTC_NSOURCES];
    for (int i = 0; i < RTC_NSOURCES; i++) {
        texts[i] = hdr[i] = dup_text(rtc_sources[i].text, *rtc_sources[i].len);
        names[i] = rtc_sources[i].name;
    }
    int rc = 1;
    hiprtcProgram prog = NULL;
    hiprtcResult r = HIPRTC_SUCCESS;
    char arch[96];
    const char *opts[] = {arch, "-O3", "-std=c++17"};
    for (int i = 0; i < RTC_NSOURCES; i++)
        if (!hdr[i]) {
            snprintf(err, err_size, "hiprtc: host allocation failed");
            goto out;
        }
    r = hiprtcCreateProgram(&prog, rtc_prelude, "kvhal_gpu_rtc.hip", RTC_NSOURCES, texts, names);
    if (r != HIPRTC_SUCCESS) {
        snprintf(err, err_size, "hiprtcCreateProgram: %s", hiprtcGetErrorString(r));
        prog = NULL;
        goto out;
    }
    for (int i = 0; i < n; i++)
        if ((r = hiprtcAddNameExpression(prog, exprs[i])) != HIPRTC_SUCCESS) {
            snprintf(err, err_size, "hiprtcAddNameExpression(%s): %s", exprs[i], hiprtcGetErrorString(r));
            goto out;
        }
    snprintf(arch, sizeof arch, "--gpu-architecture=%s", target);
    r = hiprtcCompileProgram(prog, 3, opts);
    if (r != HIPRTC_SUCCESS) {
        size_t ls = 0;
        int used = snprintf(err, err_size, "hiprtc for %s: %s", target, hiprtcGetErrorString(r));
        if (hiprtcGetProgramLogSize(prog, &ls) == HIPRTC_SUCCESS && ls > 1 && used > 0 && (size_t)used + 3 < err_size) {
            char *log = static_cast<char *>(malloc(ls + 1));
            if (log && hiprtcGetProgramLog(prog, log) == HIPRTC_SUCCESS) {
                log[ls] = '\0';
                snprintf(err + used, err_size - (size_t)used, ": %s", log);
            }
            free(log);
        }
        goto out;
    }
    {
        size_t cs = 0;
        if ((r = hiprtcGetCodeSize(prog, &cs)) != HIPRTC_SUCCESS || cs == 0) {
            snprintf(err, err_size, "hiprtcGetCodeSize: %s (%zu bytes)", hiprtcGetErrorString(r), cs);
            goto out;
        }
        void *buf = malloc(cs);
        if (!buf) {
            snprintf(err, err_size, "hiprtc: host allocation of %zu bytes failed", cs);
            goto out;
        }
        if ((r = hiprtcGetCode(prog, static_cast<char *>(buf))) != HIPRTC_SUCCESS) {
            free(buf);
            snprintf(err, err_size, "hiprtcGetCode: %s", hiprtcGetErrorString(r));
            goto out;
        }
        *code = buf;
        *size = cs;
        rc = 0;
    }
out:
    if (prog) (void)hiprtcDestroyProgram(&prog);
    for (int i = 0; i < RTC_NSOURCES; i++) free(hdr[i]);
    return rc;
}

namespace {

struct CompileOne {
    const char *expr;
};

int compile_cb(void *user, const kvhal_co_key *key, void **code, size_t *size, char *err, size_t err_size)
{
    const char *e = static_cast<CompileOne *>(user)->expr;
    return kvhal_hip_rtc_compile(key->target, &e, 1, code, size, err, err_size);
}

/* The kernel of a name expression among a code object's kernels: a program holds the kernel its expression
 * instantiates and also the header's non-template kernels (copy_blocks, copy_batch), so the kernel is found by its
 * name as the Itanium mangling writes it, length first ("20paged_caching_kernel"). */
struct MatchKernel {
    char needle[96];
    char name[512];
    int n;
};

void match_kernel(void *user, const char *name, size_t len)
{
    MatchKernel *k = static_cast<MatchKernel *>(user);
    const size_t nl = strlen(k->needle);
    bool hit = false;
    for (size_t i = 0; !hit && i + nl <= len; i++) hit = !memcmp(name + i, k->needle, nl);
    if (!hit) return;
    if (k->n++ == 0 && len < sizeof k->name) {
        memcpy(k->name, name, len);
        k->name[len] = '\0';
    }
}

} // namespace

/* "kvhal_gpu::paged_caching_kernel<...>" -> "20paged_caching_kernel" (gpu_private.h) */
void kernel_needle(const char *expr, char *buf, size_t size)
{
    const char *lt = strchr(expr, '<');
    const char *end = lt ? lt : expr + strlen(expr);
    const char *start = expr;
    for (const char *p = expr; p + 1 < end; p++)
        if (p[0] == ':' && p[1] == ':') start = p + 2;
    snprintf(buf, size, "%d%.*s", (int)(end - start), (int)(end - start), start);
}

/* The code object of one kernel (name expression expr) for target: from the disk cache (dir, NULL: the documented
 * folder from the environment) or compiled and stored, keyed by the source hash, target ID and runtime version.
 * 0 with *code (malloc'd), *size, *origin, and note saying what happened to the cache; else non-zero with the
 * message in note. What kernel_fn uses; also the test hook "kvhal_hip_rtc_code_object". */
extern "C" int kvhal_hip_rtc_code_object(const char *target, const char *expr, const char *dir, void **code,
                                         size_t *size, int *origin, char *note, size_t note_size)
{
    if (!target || !expr || !code || !size || !origin) {
        if (note && note_size) snprintf(note, note_size, "NULL argument");
        return 1;
    }
    kvhal_co_key key;
    memset(&key, 0, sizeof key);
    int rt = 0;
    (void)hipRuntimeGetVersion(&rt);
    key.runtime_version = (uint32_t)rt;
    key.source_hash = rtc_source_hash(&expr, 1);
    snprintf(key.target, sizeof key.target, "%s", target);
    char env_dir[1024];
    if (!dir) dir = kvhal_co_cache_dir(env_dir, sizeof env_dir) == 0 ? env_dir : NULL;
    CompileOne one = {expr};
    kvhal_co_origin o = KVHAL_CO_NONE;
    const int rc = kvhal_co_get(dir, &key, compile_cb, &one, code, size, &o, note, note_size);
    *origin = (int)o;
    return rc;
}

#endif /* KVHAL_GPU_RTC */

void code_path_init(Ctx *c, int32_t id)
{
    CodeState *cs = static_cast<CodeState *>(calloc(1, sizeof(CodeState)));
    if (!cs) return; /* described as "not decided"; kernel_fn then fails with the reason */
    if (pthread_mutex_init(&cs->lock, NULL) != 0) {
        free(cs);
        return;
    }
    gpuDeviceProp prop;
    if (gpuGetDeviceProperties(&prop, id) != gpuSuccess) {
        (void)gpuGetLastError();
        snprintf(cs->why, sizeof cs->why, "device properties unavailable");
        c->dev[id].code = cs;
        return;
    }
#if defined(KVHAL_GPU_RTC)
    snprintf(cs->target, sizeof cs->target, "%s", prop.gcnArchName);
    const char *force = secure_getenv("KVHAL_HIP_FORCE_RTC");
    const bool forced = force && !strcmp(force, "1");
    if (!forced && kvhal_co_embedded_match(KVHAL_GPU_HIP_TARGETS, cs->target) >= 0) {
        cs->path = PATH_EMBEDDED;
    } else {
        cs->path = PATH_RTC;
        snprintf(cs->why, sizeof cs->why, "%s", forced ? "KVHAL_HIP_FORCE_RTC=1" : "no embedded code object");
    }
#else
    const int cc = prop.major * 10 + prop.minor;
    const int p = kvhal_co_cuda_path(KVHAL_GPU_SM_LIST, KVHAL_GPU_PTX_ARCH, cc, &cs->arch);
    cs->path = p == 1 ? PATH_CUBIN : p == 2 ? PATH_PTX : PATH_NONE;
    if (p == 0)
        snprintf(cs->why, sizeof cs->why, "sm_%d: no cubin of this major version and PTX compute_%d is newer", cc,
                 (int)KVHAL_GPU_PTX_ARCH);
#endif
    c->dev[id].code = cs;
}

void code_path_shutdown(Ctx *c)
{
    for (int32_t i = 0; i < c->count; i++) {
        CodeState *cs = c->dev[i].code;
        if (!cs) continue;
        for (RtcKernel *k = cs->kernels, *next; k; k = next) {
            next = k->next;
#if defined(KVHAL_GPU_RTC)
            (void)hipModuleUnload(static_cast<hipModule_t>(k->module));
#endif
            free(k);
        }
        pthread_mutex_destroy(&cs->lock);
        free(cs);
        c->dev[i].code = NULL;
    }
}

void code_path_describe(const Ctx *c, int32_t id, char *buf, size_t size)
{
    const CodeState *cs = id >= 0 && id < c->count ? c->dev[id].code : NULL;
    if (!cs) {
        snprintf(buf, size, "code: not decided");
        return;
    }
    switch (cs->path) {
    case PATH_CUBIN:
        if (const int loaded = __atomic_load_n(&cs->loaded, __ATOMIC_ACQUIRE))
            snprintf(buf, size, "code: sm_%d cubin, %d loaded in %.1f ms", cs->arch, loaded,
                     __atomic_load_n(&cs->loaded_us, __ATOMIC_RELAXED) / 1000.0);
        else
            snprintf(buf, size, "code: sm_%d cubin", cs->arch);
        break;
    case PATH_PTX: snprintf(buf, size, "code: PTX compute_%d, JIT-compiled by the driver", cs->arch); break;
    case PATH_EMBEDDED: snprintf(buf, size, "code: embedded (%s)", cs->target); break;
    case PATH_RTC: {
        CodeState *m = const_cast<CodeState *>(cs);
        pthread_mutex_lock(&m->lock);
        snprintf(buf, size, "code: run-time compiled (hiprtc) for %s, %d compiled, %d from disk cache", cs->target,
                 cs->compiled, cs->cached);
        pthread_mutex_unlock(&m->lock);
        break;
    }
    default: snprintf(buf, size, "code: none (%s)", cs->why);
    }
}

void load_code(Ctx *c, int32_t id, const void *const *kernels, int n)
{
    CodeState *cs = c->dev[id].code;
    const char *lazy = secure_getenv("KVHAL_GPU_LAZY_LOAD");
    if (!cs || cs->path == PATH_NONE || cs->path == PATH_RTC || (lazy && !strcmp(lazy, "1"))) return;
#if !defined(KVHAL_GPU_HIP)
    const bool all = cs->path == PATH_CUBIN && c->cu_func_module && c->cu_module_count && c->cu_module_functions &&
                     c->cu_func_load;
    CUmodule done[8];
    int ndone = 0, loaded = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        cudaFunction_t f;
        if (cudaGetFuncBySymbol(&f, kernels[i]) != cudaSuccess) continue; /* loads kernels[i] */
        CUmodule m;
        unsigned count = 0;
        if (!all || c->cu_func_module(&m, f) != CUDA_SUCCESS) continue;
        bool seen = false;
        for (int j = 0; j < ndone; j++) seen = seen || done[j] == m;
        if (seen || c->cu_module_count(&count, m) != CUDA_SUCCESS || count == 0) continue;
        if (ndone < (int)(sizeof done / sizeof done[0])) done[ndone++] = m;
        CUfunction *fns = static_cast<CUfunction *>(malloc(count * sizeof(CUfunction)));
        if (!fns) continue;
        if (c->cu_module_functions(fns, count, m) == CUDA_SUCCESS)
            for (unsigned j = 0; j < count; j++) loaded += c->cu_func_load(fns[j]) == CUDA_SUCCESS;
        free(fns);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const long long us = (t1.tv_sec - t0.tv_sec) * 1000000ll + (t1.tv_nsec - t0.tv_nsec) / 1000;
    __atomic_store_n(&cs->loaded_us, (int)(us < 0x7fffffff ? us : 0x7fffffff), __ATOMIC_RELAXED);
    __atomic_store_n(&cs->loaded, loaded, __ATOMIC_RELEASE);
#else
    for (int i = 0; i < n; i++) {
        gpuFuncAttributes a;
        (void)gpuFuncGetAttributes(&a, kernels[i]);
    }
#endif
    (void)gpuGetLastError();
}

kvhal_status kernel_fn(Ctx *c, int32_t id, const char *expr, void **fn)
{
    *fn = NULL;
    CodeState *cs = c->dev[id].code;
    if (!cs) return fail(c, KVHAL_OUT_OF_MEMORY, "%s:%d: code path: host allocation failed at init", KVHAL_GPU_NAME,
                         (int)id);
    if (cs->path == PATH_NONE)
        return fail(c, KVHAL_UNSUPPORTED, "%s:%d: the module has no code for this device: %s", KVHAL_GPU_NAME,
                    (int)id, cs->why);
    if (cs->path != PATH_RTC) return KVHAL_OK;
#if defined(KVHAL_GPU_RTC)
    kvhal_status st = KVHAL_OK;
    pthread_mutex_lock(&cs->lock);
    for (RtcKernel *k = cs->kernels; k; k = k->next)
        if (!strcmp(k->expr, expr)) {
            *fn = k->fn;
            pthread_mutex_unlock(&cs->lock);
            return KVHAL_OK;
        }
    char note[2048];
    void *code = NULL;
    size_t size = 0;
    int origin = KVHAL_CO_NONE;
    RtcKernel *k = NULL;
    MatchKernel mk;
    memset(&mk, 0, sizeof mk);
    kernel_needle(expr, mk.needle, sizeof mk.needle);
    hipModule_t mod = NULL;
    hipFunction_t f = NULL;
    hipError_t e;
    if (alloc_fail(c)) {
        st = injected(c, id, "run-time kernel");
        goto out;
    }
    if (kvhal_hip_rtc_code_object(cs->target, expr, NULL, &code, &size, &origin, note, sizeof note) != 0) {
        st = fail(c, KVHAL_BACKEND_ERROR, "hip:%d: %s: %s", (int)id, expr, note);
        goto out;
    }
    if (kvhal_co_amdgpu_kernels(code, size, NULL, match_kernel, &mk) < 1 || mk.n != 1 || !mk.name[0]) {
        st = fail(c, KVHAL_BACKEND_ERROR, "hip:%d: %s: the code object holds %d kernels named %s, not one", (int)id,
                  expr, mk.n, mk.needle);
        goto out;
    }
    if ((e = use_device(id)) != hipSuccess || (e = hipModuleLoadData(&mod, code)) != hipSuccess) {
        st = rt_fail(c, e, id, "load run-time compiled kernel");
        goto out;
    }
    if ((e = hipModuleGetFunction(&f, mod, mk.name)) != hipSuccess) {
        (void)hipModuleUnload(mod);
        st = rt_fail(c, e, id, "run-time compiled kernel");
        goto out;
    }
    k = static_cast<RtcKernel *>(calloc(1, sizeof(RtcKernel)));
    if (!k) {
        (void)hipModuleUnload(mod);
        st = fail(c, KVHAL_OUT_OF_MEMORY, "hip:%d: run-time kernel: host allocation failed", (int)id);
        goto out;
    }
    snprintf(k->expr, sizeof k->expr, "%s", expr);
    k->module = mod;
    k->fn = f;
    k->next = cs->kernels;
    cs->kernels = k;
    if (origin == (int)KVHAL_CO_CACHED) cs->cached++;
    else cs->compiled++;
    *fn = f;
out:
    pthread_mutex_unlock(&cs->lock);
    free(code);
    return st;
#else
    (void)expr;
    return fail(c, KVHAL_BACKEND_ERROR, "%s:%d: no run-time compiler in this module", KVHAL_GPU_NAME, (int)id);
#endif
}

#if !defined(KVHAL_GPU_HIP)
kvhal_status driver_launch(const Ctx *c, int32_t id, void *fn, uint32_t grid, uint32_t threads, void *param,
                           gpuStream_t s, const char *what)
{
    void *args[] = {param};
    const CUresult r = c->cu_launch(static_cast<CUfunction>(fn), grid, 1, 1, threads, 1, 1, 0, s, args, nullptr);
    if (r == CUDA_SUCCESS) return KVHAL_OK;
    if (r == CUDA_ERROR_INVALID_CONTEXT) return KVHAL_BUSY;
    const char *name = nullptr;
    if (!c->cu_error_name || c->cu_error_name(r, &name) != CUDA_SUCCESS || !name) name = "unknown error";
    return fail(c, KVHAL_BACKEND_ERROR, "cuda:%d: %s: cuLaunchKernel: %s (%d)", (int)id, what, name, (int)r);
}
#endif

kvhal_status launch_fn(const Ctx *c, int32_t id, void *fn, uint32_t grid, uint32_t threads, void *param,
                       gpuStream_t s, const char *what)
{
#if defined(KVHAL_GPU_RTC)
    void *args[] = {param};
    KVHAL_GPU_TRY(c, hipModuleLaunchKernel(static_cast<hipFunction_t>(fn), grid, 1, 1, threads, 1, 1, 0, s, args,
                                           NULL),
                  id, what);
    return KVHAL_OK;
#else
    (void)fn, (void)grid, (void)threads, (void)param, (void)s;
    return fail(c, KVHAL_BACKEND_ERROR, "%s:%d: %s: no run-time kernels in this module", KVHAL_GPU_NAME, (int)id,
                what);
#endif
}

} // namespace kvhal_gpu

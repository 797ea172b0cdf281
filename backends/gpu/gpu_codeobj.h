/* gpu_codeobj.h — code objects of the GPU backends that are not in the module: which path a device's kernels take
 * (an embedded code object, one compiled at run time, one read back from the disk cache, PTX that the driver JIT-
 * compiles), and the disk cache of run-time compiled code objects. Plain C (compiled by the host compiler into the
 * HIP module, and into tests/test_codeobj.c with fabricated runtime answers): nothing here calls a GPU runtime; the
 * compiler is a callback.
 *
 * The cache: one file per key in the cache folder (KVHAL_CODE_CACHE_DIR, else $XDG_CACHE_HOME/kvhal, else
 * $HOME/.cache/kvhal; environment read with secure_getenv). A key is the hash of the source compiled (with its
 * name expressions and options), the target ID and the runtime version; the file name is made from the key, and the
 * file starts with a header that repeats it (magic, format version, key, payload length, payload checksum). A file
 * whose header, key, length or checksum does not match is rejected (the reason is reported) and rebuilt. Files are
 * written to a temporary name in the same folder and renamed into place, so a reader sees a whole file or none. */
#ifndef KVHAL_GPU_CODEOBJ_H
#define KVHAL_GPU_CODEOBJ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVHAL_CO_MAGIC "KVHALCO\0"
#define KVHAL_CO_FORMAT 1u
#define KVHAL_CO_TARGET_MAX 64             /* bytes of a target ID, NUL included */
#define KVHAL_CO_MAX_BYTES (256u << 20)    /* larger cache files are rejected unread */
#define KVHAL_CO_HEADER_BYTES 104u

/* What a cached code object is for. */
typedef struct kvhal_co_key {
    uint64_t source_hash;                /* kvhal_co_hash of everything compiled: source, names, options */
    uint32_t runtime_version;            /* the runtime's (hipRuntimeGetVersion), so an upgrade recompiles */
    char target[KVHAL_CO_TARGET_MAX];    /* the device's target ID, e.g. "gfx942:sramecc+:xnack-" */
} kvhal_co_key;

/* Where a code object came from. */
typedef enum kvhal_co_origin {
    KVHAL_CO_NONE = 0,     /* not obtained */
    KVHAL_CO_COMPILED = 1, /* compiled now (and written to the cache unless the note says otherwise) */
    KVHAL_CO_CACHED = 2    /* read back from the cache */
} kvhal_co_origin;

/* Compiles the code object for key: on success returns 0 with *code (malloc'd, the caller frees it) and *size;
 * else non-zero with a message in err. */
typedef int (*kvhal_co_compile_fn)(void *user, const kvhal_co_key *key, void **code, size_t *size, char *err,
                                   size_t err_size);

/* FNV-1a, 64-bit, continuing from h (start with KVHAL_CO_HASH_INIT). */
#define KVHAL_CO_HASH_INIT 0xcbf29ce484222325ull
uint64_t kvhal_co_hash(uint64_t h, const void *data, size_t n);

/* The cache folder into buf: KVHAL_CODE_CACHE_DIR, else $XDG_CACHE_HOME/kvhal, else $HOME/.cache/kvhal. Returns 0,
 * or -1 (with nothing usable in buf) when none is set or the path does not fit. */
int kvhal_co_cache_dir(char *buf, size_t size);

/* The file name of key (no folder) into buf: "<source hash>-<target, ':' as '_'>-<runtime version>.co". -1 when
 * the target is empty, holds '/' or does not fit. */
int kvhal_co_file_name(const kvhal_co_key *key, char *buf, size_t size);

/* Result of kvhal_co_load. */
typedef enum kvhal_co_load_result {
    KVHAL_CO_HIT = 0,      /* *code / *size hold the payload (malloc'd) */
    KVHAL_CO_MISS = 1,     /* no file */
    KVHAL_CO_REJECTED = 2, /* a file that is not this key's whole code object: why in note */
    KVHAL_CO_ERROR = 3     /* could not read it (I/O, memory): why in note */
} kvhal_co_load_result;

kvhal_co_load_result kvhal_co_load(const char *dir, const kvhal_co_key *key, void **code, size_t *size, char *note,
                                   size_t note_size);

/* Writes key's code object into dir (created, mode 0700, if missing) through a temporary file and rename. 0, or -1
 * with why in note (the cache is then simply not written). */
int kvhal_co_store(const char *dir, const kvhal_co_key *key, const void *code, size_t size, char *note,
                   size_t note_size);

/* The code object of key: from the cache in dir (NULL: no cache) when a valid file is there, else compiled with
 * compile and then stored. Returns 0 with *code (malloc'd), *size and *origin; a cache problem that did not
 * prevent the result (a rejected file that was rebuilt, a folder that cannot be written) is described in note.
 * Returns -1 when compiling failed (the compiler's message in note). */
int kvhal_co_get(const char *dir, const kvhal_co_key *key, kvhal_co_compile_fn compile, void *user, void **code,
                 size_t *size, kvhal_co_origin *origin, char *note, size_t note_size);

/* Whether a code object built for target (a target ID without features, or with some, e.g. "gfx90a" or
 * "gfx90a:xnack+") runs on a device whose target ID is device (e.g. "gfx90a:sramecc+:xnack-"): same processor, and
 * every feature the code object names has the device's setting. */
bool kvhal_co_target_matches(const char *target, const char *device);

/* Which of the comma-separated embedded targets (e.g. "gfx90a,gfx940,gfx1030") serves device: its index, or -1. */
int kvhal_co_embedded_match(const char *targets, const char *device);

/* CUDA: how a device of compute capability cc (major * 10 + minor) runs the module's kernels, given the embedded
 * SM list (e.g. "80,90", cubins of each) and the PTX architecture (the last of them): 1 an embedded cubin (the
 * highest of the device's major version at or below its minor: cubins run on later minors), 2 the PTX, JIT-compiled
 * by the driver (which keeps the result in its own compute cache, CUDA_CACHE_PATH), 0 no code for this device.
 * *arch: the cubin's or the PTX's architecture. */
int kvhal_co_cuda_path(const char *sm_list, int ptx_arch, int cc, int *arch);

/* An AMD GPU code object (ELF64, EM_AMDGPU): its kernels are the symbols "<name>.kd" (kernel descriptors). Calls
 * fn(user, name, length) for each kernel (name without ".kd", not NUL-terminated) and returns how many there are;
 * -1 when the bytes are not a well-formed little-endian ELF64 AMDGPU object (every offset is checked against size).
 * *mach (may be NULL): the EF_AMDGPU_MACH bits of e_flags (gfx90a 0x3f, gfx940 0x40, gfx942 0x4c, gfx1030 0x36). */
int kvhal_co_amdgpu_kernels(const void *elf, size_t size, unsigned *mach,
                            void (*fn)(void *user, const char *name, size_t length), void *user);

#ifdef __cplusplus
}
#endif

#endif /* KVHAL_GPU_CODEOBJ_H */

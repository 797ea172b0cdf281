/* graph_capture.c — GPU-only check (tests/meson.build, suite gpu; built with the CUDA runtime when the CUDA module
 * is): the process's first kvhal call is made inside cudaStreamBeginCapture on a non-blocking stream. 32 layers'
 * paged_caching at decode size (64 tokens, 8 KV heads x 128, f16) are captured into one graph, which is replayed 20
 * times with new slot mappings and K/V uploaded before each replay; every replay is compared bit for bit with a
 * host reference. Also: the caller's current device is unchanged by every call, and the default and per-thread
 * streams wrap and run the op, and copy_blocks is recorded into a graph where its pairs travel in the kernel
 * parameters (refused with KVHAL_UNSUPPORTED where they are staged), and the module loaded its kernels when the device
 * was opened (inside the capture). Exit 0 on success, 1 on a mismatch or error, 77 (skipped) without a CUDA device. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"

#define LAYERS 32
#define TOK 64
#define HEADS 8
#define DIM 128
#define BS 16
#define NB 64
#define EXIT_SKIP 77

#define CU(x)                                                                                                   \
    do {                                                                                                        \
        cudaError_t e_ = (x);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                \
            fprintf(stderr, "graph_capture: error: %s: %s\n", #x, cudaGetErrorString(e_));                     \
            return 1;                                                                                           \
        }                                                                                                       \
    } while (0)
#define KV(x)                                                                                                   \
    do {                                                                                                        \
        kvhal_status s_ = (x);                                                                                  \
        if (s_ != KVHAL_OK) {                                                                                   \
            fprintf(stderr, "graph_capture: error: %s: %s\n", #x, kvhal_last_error());                         \
            return 1;                                                                                           \
        }                                                                                                       \
    } while (0)

static const size_t row = HEADS * DIM, cache_elems = (size_t)NB * BS * HEADS * DIM,
                    in_elems = (size_t)TOK * HEADS * DIM;
static const int64_t csh[4] = {NB, BS, HEADS, DIM}, ish[3] = {TOK, HEADS, DIM}, ssh[1] = {TOK};
static const kvhal_device dev = {KVHAL_DEVICE_CUDA, 0};

/* The device memory (the caches of every layer, the inputs of every layer, the slot mapping) and its kvhal
 * wrappers, the capturing stream, and the host side of the check. */
static struct {
    void *kc[LAYERS], *vc[LAYERS], *kin, *vin, *slots;
    cudaStream_t cs;
    kvhal_stream *ks;
    kvhal_buffer *bk[LAYERS], *bv[LAYERS], *bki, *bvi, *bs;
    kvhal_tensor st;
    uint16_t *hk, *hv, *ref, *got;
    uint64_t rng;
} g;

static uint16_t refk[LAYERS][NB * BS * HEADS * DIM]; /* the host reference of each checked layer's K cache */

static uint16_t next_f16(int shift)
{
    g.rng = g.rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint16_t)(g.rng >> shift) & 0x7bff; /* finite f16 patterns */
}

static int alloc_device(void)
{
    CU(cudaSetDevice(0));
    for (int l = 0; l < LAYERS; l++) {
        CU(cudaMalloc(&g.kc[l], cache_elems * 2));
        CU(cudaMalloc(&g.vc[l], cache_elems * 2));
        CU(cudaMemset(g.kc[l], 0, cache_elems * 2));
        CU(cudaMemset(g.vc[l], 0, cache_elems * 2));
    }
    CU(cudaMalloc(&g.kin, in_elems * 2 * LAYERS));
    CU(cudaMalloc(&g.vin, in_elems * 2 * LAYERS));
    CU(cudaMalloc(&g.slots, TOK * 8));
    CU(cudaStreamCreateWithFlags(&g.cs, cudaStreamNonBlocking));
    CU(cudaDeviceSynchronize());
    g.hk = malloc(in_elems * 2 * LAYERS);
    g.hv = malloc(in_elems * 2 * LAYERS);
    g.ref = calloc(cache_elems, 2);
    g.got = malloc(cache_elems * 2);
    if (!g.hk || !g.hv || !g.ref || !g.got) {
        fprintf(stderr, "graph_capture: error: out of host memory\n");
        return 1;
    }
    g.rng = 14;
    return 0;
}

/* The capture: the first kvhal call of the process is the buffer wrap below; every layer's paged_caching is
 * recorded into *exec. */
static int capture_layers(cudaGraphExec_t *exec)
{
    cudaGraph_t graph;
    CU(cudaStreamBeginCapture(g.cs, cudaStreamCaptureModeGlobal));
    KV(kvhal_buffer_wrap(dev, g.kin, in_elems * 2 * LAYERS, &g.bki));
    KV(kvhal_buffer_wrap(dev, g.vin, in_elems * 2 * LAYERS, &g.bvi));
    KV(kvhal_buffer_wrap(dev, g.slots, TOK * 8, &g.bs));
    KV(kvhal_stream_wrap(dev, g.cs, &g.ks));
    KV(kvhal_tensor_make(g.bs, 0, KVHAL_I64, 1, ssh, NULL, &g.st));
    for (int l = 0; l < LAYERS; l++) {
        kvhal_tensor k, v, ki, vi;
        KV(kvhal_buffer_wrap(dev, g.kc[l], cache_elems * 2, &g.bk[l]));
        KV(kvhal_buffer_wrap(dev, g.vc[l], cache_elems * 2, &g.bv[l]));
        KV(kvhal_tensor_make(g.bk[l], 0, KVHAL_F16, 4, csh, NULL, &k));
        KV(kvhal_tensor_make(g.bv[l], 0, KVHAL_F16, 4, csh, NULL, &v));
        KV(kvhal_tensor_make(g.bki, (size_t)l * in_elems * 2, KVHAL_F16, 3, ish, NULL, &ki));
        KV(kvhal_tensor_make(g.bvi, (size_t)l * in_elems * 2, KVHAL_F16, 3, ish, NULL, &vi));
        KV(kvhal_paged_caching(&k, &v, &ki, &vi, &g.st, 1.0f, 1.0f, g.ks));
    }
    CU(cudaStreamEndCapture(g.cs, &graph));
    CU(cudaGraphInstantiate(exec, graph, 0));
    int cur = -1;
    CU(cudaGetDevice(&cur));
    if (cur != 0) {
        fprintf(stderr, "graph_capture: error: current device moved to %d\n", cur);
        return 1;
    }
    return 0;
}

/* 20 replays, each with new K/V and slots uploaded first; layers 0, 7, 14, 21, 28 compared with the reference. */
static int replay_layers(cudaGraphExec_t exec)
{
    int64_t hs[TOK];
    for (int rep = 0; rep < 20; rep++) {
        for (size_t i = 0; i < in_elems * LAYERS; i++) {
            g.hk[i] = next_f16(48);
            g.hv[i] = (uint16_t)(g.rng >> 32) & 0x7bff;
        }
        for (int t = 0; t < TOK; t++) hs[t] = (int64_t)((rep * 131 + t * 17) % (NB * BS));
        hs[TOK - 1] = -1; /* padding */
        CU(cudaMemcpyAsync(g.kin, g.hk, in_elems * 2 * LAYERS, cudaMemcpyHostToDevice, g.cs));
        CU(cudaMemcpyAsync(g.vin, g.hv, in_elems * 2 * LAYERS, cudaMemcpyHostToDevice, g.cs));
        CU(cudaMemcpyAsync(g.slots, hs, sizeof hs, cudaMemcpyHostToDevice, g.cs));
        CU(cudaGraphLaunch(exec, g.cs));
        CU(cudaStreamSynchronize(g.cs));
        KV(kvhal_stream_check_errors(g.ks));
        for (int l = 0; l < LAYERS; l += 7) {
            CU(cudaMemcpy(g.got, g.kc[l], cache_elems * 2, cudaMemcpyDeviceToHost));
            for (int t = 0; t < TOK; t++)
                if (hs[t] >= 0)
                    memcpy(&refk[l][(size_t)hs[t] * row], &g.hk[(size_t)l * in_elems + (size_t)t * row], row * 2);
            if (memcmp(g.got, refk[l], cache_elems * 2)) {
                fprintf(stderr, "graph_capture: error: replay %d layer %d: K differs from the host reference\n", rep,
                        l);
                return 1;
            }
        }
    }
    return 0;
}

/* The legacy and per-thread default streams wrap and run the op. */
static int default_streams(void)
{
    void *const defaults[2] = {KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD};
    for (int i = 0; i < 2; i++) {
        kvhal_stream *w;
        KV(kvhal_stream_wrap(dev, defaults[i], &w));
        kvhal_tensor k, v, ki, vi;
        KV(kvhal_tensor_make(g.bk[0], 0, KVHAL_F16, 4, csh, NULL, &k));
        KV(kvhal_tensor_make(g.bv[0], 0, KVHAL_F16, 4, csh, NULL, &v));
        KV(kvhal_tensor_make(g.bki, 0, KVHAL_F16, 3, ish, NULL, &ki));
        KV(kvhal_tensor_make(g.bvi, 0, KVHAL_F16, 3, ish, NULL, &vi));
        KV(kvhal_paged_caching(&k, &v, &ki, &vi, &g.st, 1.0f, 1.0f, w));
        KV(kvhal_stream_check_errors(w));
        KV(kvhal_stream_destroy(w));
    }
    return 0;
}

enum { NC = 2 * LAYERS, NP = 8, NC_STAGED = 140 };

/* Replays the recorded copy_blocks 3 times over new contents of caches 0 and NC - 1; each destination block must
 * equal its source block, and nothing outside the destinations may change. */
static int replay_copy_blocks(cudaGraphExec_t cexec, const int64_t *pairs)
{
    const size_t block = (size_t)BS * row; /* elements per block */
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < NC; i += NC - 1) { /* caches 0 (K of layer 0) and 63 (V of layer 31): new contents */
            for (size_t e = 0; e < cache_elems; e++) g.ref[e] = next_f16(48);
            /* on cs: a pageable cudaMemcpy may return before its DMA lands, and cs does not wait for the legacy
             * stream */
            CU(cudaMemcpyAsync(i < LAYERS ? g.kc[i] : g.vc[i - LAYERS], g.ref, cache_elems * 2,
                               cudaMemcpyHostToDevice, g.cs));
            CU(cudaStreamSynchronize(g.cs));
        }
        CU(cudaGraphLaunch(cexec, g.cs));
        CU(cudaStreamSynchronize(g.cs));
        KV(kvhal_stream_check_errors(g.ks));
        for (int i = 0; i < NC; i += NC - 1) {
            void *d = i < LAYERS ? g.kc[i] : g.vc[i - LAYERS];
            CU(cudaMemcpy(g.got, d, cache_elems * 2, cudaMemcpyDeviceToHost));
            /* each destination block equals its source block (no pair writes a source) */
            for (int p = 0; p < NP; p++)
                if (memcmp(g.got + (size_t)pairs[2 * p + 1] * block, g.got + (size_t)pairs[2 * p] * block, block * 2)) {
                    fprintf(stderr, "graph_capture: error: copy_blocks replay %d cache %d pair %d: block %lld is not "
                                    "a copy of block %lld\n",
                            rep, i, p, (long long)pairs[2 * p + 1], (long long)pairs[2 * p]);
                    return 1;
                }
            if (rep == 0 && i == NC - 1 && memcmp(g.got, g.ref, (size_t)pairs[2 * (NP - 1) + 1] * block * 2)) {
                fprintf(stderr, "graph_capture: error: copy_blocks replay wrote outside its destination blocks\n");
                return 1;
            }
        }
    }
    return 0;
}

/* copy_blocks: the 64 caches (K and V of the 32 layers) with 8 pairs carry their table and pairs in the kernel
 * parameters, so the call is recorded; replays copy blocks of whatever the caches hold then. 140 caches are
 * staged: refused on the capturing stream with KVHAL_UNSUPPORTED, and the capture stays valid. */
static int capture_copy_blocks(void)
{
    static kvhal_tensor caches[NC_STAGED];
    for (int i = 0; i < NC_STAGED; i++)
        KV(kvhal_tensor_make(i % NC < LAYERS ? g.bk[i % NC] : g.bv[i % NC - LAYERS], 0, KVHAL_F16, 4, csh, NULL,
                             &caches[i]));
    int64_t pairs[2 * NP];
    for (int p = 0; p < NP; p++) {
        pairs[2 * p] = 3 * p + 1;           /* sources 1, 4, .., 22 */
        pairs[2 * p + 1] = NB - 1 - 2 * p; /* destinations 63, 61, .., 49 */
    }
    cudaGraph_t cg;
    CU(cudaStreamBeginCapture(g.cs, cudaStreamCaptureModeGlobal));
    KV(kvhal_copy_blocks(caches, NC, pairs, NP, g.ks));
    const kvhal_status refused = kvhal_copy_blocks(caches, NC_STAGED, pairs, NP, g.ks);
    CU(cudaStreamEndCapture(g.cs, &cg));
    if (refused != KVHAL_UNSUPPORTED) {
        fprintf(stderr, "graph_capture: error: copy_blocks of %d caches (staged) gave %s on a capturing stream\n",
                NC_STAGED, kvhal_status_name(refused));
        return 1;
    }
    cudaGraphExec_t cexec;
    CU(cudaGraphInstantiate(&cexec, cg, 0));
    return replay_copy_blocks(cexec, pairs);
}

/* The module loaded every kernel when the device was opened (inside the first capture): with a driver of CUDA 12.4
 * or later (cuFuncLoad) and the embedded cubins, the device info says how many and how long it took. */
static int code_loaded_at_open(void)
{
    int drv = 0;
    kvhal_device_info info;
    CU(cudaDriverGetVersion(&drv));
    KV(kvhal_device_get_info(dev, &info));
    const char *lazy = getenv("KVHAL_GPU_LAZY_LOAD");
    if (drv < 12040 || !strstr(info.platform, "cubin") || (lazy && !strcmp(lazy, "1"))) {
        printf("graph_capture: the load at open not checked (driver %d, %s%s)\n", drv, info.platform,
               lazy && !strcmp(lazy, "1") ? ", KVHAL_GPU_LAZY_LOAD=1" : "");
        return 0;
    }
    if (!strstr(info.platform, " loaded in ")) {
        fprintf(stderr, "graph_capture: error: the module did not load its kernels when the device was opened: %s\n",
                info.platform);
        return 1;
    }
    printf("graph_capture: OK: %s\n", info.platform);
    return 0;
}

int main(void)
{
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count < 1) {
        printf("graph_capture: skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
        return EXIT_SKIP;
    }
    cudaGraphExec_t exec;
    if (alloc_device() || capture_layers(&exec) || replay_layers(exec) || default_streams()) return 1;
    printf("graph_capture: OK: 32 layers captured with the first kvhal call inside the capture, 20 replays "
           "bit-exact, current device kept, legacy and per-thread default streams\n");
    if (capture_copy_blocks()) return 1;
    printf("graph_capture: OK: copy_blocks of %d caches x %d pairs captured and replayed 3 times bit-exact; %d "
           "caches (staged) refused on the capturing stream with KVHAL_UNSUPPORTED, the capture kept\n",
           NC, NP, NC_STAGED);
    return code_loaded_at_open();
}

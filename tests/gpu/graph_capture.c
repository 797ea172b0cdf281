/* graph_capture.c — GPU-only check (run by docs/measurements/scripts/python-gpu.sh, built there with the CUDA
 * runtime): the process's first kvhal call is made inside cudaStreamBeginCapture on a non-blocking stream. 32
 * layers' paged_caching at decode size (64 tokens, 8 KV heads x 128, f16) are captured into one graph, which is
 * replayed 20 times with new slot mappings and K/V uploaded before each replay; every replay is compared bit for
 * bit with a host reference. Also: the caller's current device is unchanged by every call, and the default and
 * per-thread streams wrap and run the op, and copy_blocks is recorded into a graph where its pairs travel in the
 * kernel parameters (refused with KVHAL_UNSUPPORTED where they are staged). Exit 0 on success, 1 on a mismatch or
 * error. */
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

int main(void)
{
    const size_t row = HEADS * DIM, cache_elems = (size_t)NB * BS * row, in_elems = (size_t)TOK * row;
    void *kc[LAYERS], *vc[LAYERS], *kin, *vin, *slots;
    CU(cudaSetDevice(0));
    for (int l = 0; l < LAYERS; l++) {
        CU(cudaMalloc(&kc[l], cache_elems * 2));
        CU(cudaMalloc(&vc[l], cache_elems * 2));
        CU(cudaMemset(kc[l], 0, cache_elems * 2));
        CU(cudaMemset(vc[l], 0, cache_elems * 2));
    }
    CU(cudaMalloc(&kin, in_elems * 2 * LAYERS));
    CU(cudaMalloc(&vin, in_elems * 2 * LAYERS));
    CU(cudaMalloc(&slots, TOK * 8));
    cudaStream_t cs;
    CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CU(cudaDeviceSynchronize());

    /* capture: the first kvhal call of the process is the buffer wrap below */
    cudaGraph_t graph;
    CU(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    kvhal_device dev = {KVHAL_DEVICE_CUDA, 0};
    kvhal_stream *ks;
    kvhal_buffer *bk[LAYERS], *bv[LAYERS], *bki, *bvi, *bs;
    KV(kvhal_buffer_wrap(dev, kin, in_elems * 2 * LAYERS, &bki));
    KV(kvhal_buffer_wrap(dev, vin, in_elems * 2 * LAYERS, &bvi));
    KV(kvhal_buffer_wrap(dev, slots, TOK * 8, &bs));
    KV(kvhal_stream_wrap(dev, cs, &ks));
    const int64_t csh[4] = {NB, BS, HEADS, DIM}, ish[3] = {TOK, HEADS, DIM}, ssh[1] = {TOK};
    kvhal_tensor st;
    KV(kvhal_tensor_make(bs, 0, KVHAL_I64, 1, ssh, NULL, &st));
    for (int l = 0; l < LAYERS; l++) {
        kvhal_tensor k, v, ki, vi;
        KV(kvhal_buffer_wrap(dev, kc[l], cache_elems * 2, &bk[l]));
        KV(kvhal_buffer_wrap(dev, vc[l], cache_elems * 2, &bv[l]));
        KV(kvhal_tensor_make(bk[l], 0, KVHAL_F16, 4, csh, NULL, &k));
        KV(kvhal_tensor_make(bv[l], 0, KVHAL_F16, 4, csh, NULL, &v));
        KV(kvhal_tensor_make(bki, (size_t)l * in_elems * 2, KVHAL_F16, 3, ish, NULL, &ki));
        KV(kvhal_tensor_make(bvi, (size_t)l * in_elems * 2, KVHAL_F16, 3, ish, NULL, &vi));
        KV(kvhal_paged_caching(&k, &v, &ki, &vi, &st, 1.0f, 1.0f, ks));
    }
    CU(cudaStreamEndCapture(cs, &graph));
    cudaGraphExec_t exec;
    CU(cudaGraphInstantiate(&exec, graph, 0));
    int cur = -1;
    CU(cudaGetDevice(&cur));
    if (cur != 0) {
        fprintf(stderr, "graph_capture: error: current device moved to %d\n", cur);
        return 1;
    }

    uint16_t *hk = malloc(in_elems * 2 * LAYERS), *hv = malloc(in_elems * 2 * LAYERS);
    uint16_t *ref = calloc(cache_elems, 2), *got = malloc(cache_elems * 2);
    int64_t hs[TOK];
    uint64_t rng = 14;
    for (int rep = 0; rep < 20; rep++) {
        for (size_t i = 0; i < in_elems * LAYERS; i++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            hk[i] = (uint16_t)(rng >> 48) & 0x7bff; /* finite f16 patterns */
            hv[i] = (uint16_t)(rng >> 32) & 0x7bff;
        }
        for (int t = 0; t < TOK; t++) hs[t] = (int64_t)((rep * 131 + t * 17) % (NB * BS));
        hs[TOK - 1] = -1; /* padding */
        CU(cudaMemcpyAsync(kin, hk, in_elems * 2 * LAYERS, cudaMemcpyHostToDevice, cs));
        CU(cudaMemcpyAsync(vin, hv, in_elems * 2 * LAYERS, cudaMemcpyHostToDevice, cs));
        CU(cudaMemcpyAsync(slots, hs, sizeof hs, cudaMemcpyHostToDevice, cs));
        CU(cudaGraphLaunch(exec, cs));
        CU(cudaStreamSynchronize(cs));
        KV(kvhal_stream_check_errors(ks));
        for (int l = 0; l < LAYERS; l += 7) { /* layers 0, 7, 14, 21, 28: K (and V of layer 0) */
            CU(cudaMemcpy(got, kc[l], cache_elems * 2, cudaMemcpyDeviceToHost));
            static uint16_t refk[LAYERS][NB * BS * HEADS * DIM];
            for (int t = 0; t < TOK; t++)
                if (hs[t] >= 0) memcpy(&refk[l][(size_t)hs[t] * row], &hk[(size_t)l * in_elems + (size_t)t * row], row * 2);
            if (memcmp(got, refk[l], cache_elems * 2)) {
                fprintf(stderr, "graph_capture: error: replay %d layer %d: K differs from the host reference\n", rep, l);
                return 1;
            }
        }
    }
    /* default and per-thread streams */
    void *const defaults[2] = {KVHAL_STREAM_LEGACY, KVHAL_STREAM_PER_THREAD};
    for (int i = 0; i < 2; i++) {
        kvhal_stream *w;
        KV(kvhal_stream_wrap(dev, defaults[i], &w));
        kvhal_tensor k, v, ki, vi;
        KV(kvhal_tensor_make(bk[0], 0, KVHAL_F16, 4, csh, NULL, &k));
        KV(kvhal_tensor_make(bv[0], 0, KVHAL_F16, 4, csh, NULL, &v));
        KV(kvhal_tensor_make(bki, 0, KVHAL_F16, 3, ish, NULL, &ki));
        KV(kvhal_tensor_make(bvi, 0, KVHAL_F16, 3, ish, NULL, &vi));
        KV(kvhal_paged_caching(&k, &v, &ki, &vi, &st, 1.0f, 1.0f, w));
        KV(kvhal_stream_check_errors(w));
        KV(kvhal_stream_destroy(w));
    }
    (void)ref;
    printf("graph_capture: OK: 32 layers captured with the first kvhal call inside the capture, 20 replays "
           "bit-exact, current device kept, legacy and per-thread default streams\n");

    /* copy_blocks: the 64 caches (K and V of the 32 layers) with 8 pairs carry their table and pairs in the kernel
     * parameters, so the call is recorded; replays copy blocks of whatever the caches hold then. 140 caches are
     * staged: refused on the capturing stream with KVHAL_UNSUPPORTED, and the capture stays valid. */
    enum { NC = 2 * LAYERS, NP = 8, NC_STAGED = 140 };
    kvhal_tensor caches[NC_STAGED];
    for (int i = 0; i < NC_STAGED; i++)
        KV(kvhal_tensor_make(i % NC < LAYERS ? bk[i % NC] : bv[i % NC - LAYERS], 0, KVHAL_F16, 4, csh, NULL,
                             &caches[i]));
    int64_t pairs[2 * NP];
    for (int p = 0; p < NP; p++) {
        pairs[2 * p] = 3 * p + 1;           /* sources 1, 4, .., 22 */
        pairs[2 * p + 1] = NB - 1 - 2 * p; /* destinations 63, 61, .., 49 */
    }
    cudaGraph_t cg;
    CU(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
    KV(kvhal_copy_blocks(caches, NC, pairs, NP, ks));
    const kvhal_status refused = kvhal_copy_blocks(caches, NC_STAGED, pairs, NP, ks);
    CU(cudaStreamEndCapture(cs, &cg));
    if (refused != KVHAL_UNSUPPORTED) {
        fprintf(stderr, "graph_capture: error: copy_blocks of %d caches (staged) gave %s on a capturing stream\n",
                NC_STAGED, kvhal_status_name(refused));
        return 1;
    }
    cudaGraphExec_t cexec;
    CU(cudaGraphInstantiate(&cexec, cg, 0));
    const size_t block = (size_t)BS * row; /* elements per block */
    for (int rep = 0; rep < 3; rep++) {
        for (int i = 0; i < NC; i += NC - 1) { /* caches 0 (K of layer 0) and 63 (V of layer 31): new contents */
            for (size_t e = 0; e < cache_elems; e++) {
                rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
                ref[e] = (uint16_t)(rng >> 48) & 0x7bff;
            }
            /* on cs: a pageable cudaMemcpy may return before its DMA lands, and cs does not wait for the legacy
             * stream (the first version of this check raced its own upload) */
            CU(cudaMemcpyAsync(i < LAYERS ? kc[i] : vc[i - LAYERS], ref, cache_elems * 2, cudaMemcpyHostToDevice, cs));
            CU(cudaStreamSynchronize(cs));
        }
        CU(cudaGraphLaunch(cexec, cs));
        CU(cudaStreamSynchronize(cs));
        KV(kvhal_stream_check_errors(ks));
        for (int i = 0; i < NC; i += NC - 1) {
            void *d = i < LAYERS ? kc[i] : vc[i - LAYERS];
            CU(cudaMemcpy(got, d, cache_elems * 2, cudaMemcpyDeviceToHost));
            /* each destination block equals its source block (no pair writes a source) */
            for (int p = 0; p < NP; p++)
                if (memcmp(got + (size_t)pairs[2 * p + 1] * block, got + (size_t)pairs[2 * p] * block, block * 2)) {
                    fprintf(stderr, "graph_capture: error: copy_blocks replay %d cache %d pair %d: block %lld is not "
                                    "a copy of block %lld\n",
                            rep, i, p, (long long)pairs[2 * p + 1], (long long)pairs[2 * p]);
                    return 1;
                }
            if (rep == 0 && i == NC - 1 && memcmp(got, ref, (size_t)pairs[2 * (NP - 1) + 1] * block * 2)) {
                fprintf(stderr, "graph_capture: error: copy_blocks replay wrote outside its destination blocks\n");
                return 1;
            }
        }
    }
    printf("graph_capture: OK: copy_blocks of %d caches x %d pairs captured and replayed 3 times bit-exact; %d "
           "caches (staged) refused on the capturing stream with KVHAL_UNSUPPORTED, the capture kept\n",
           NC, NP, NC_STAGED);
    return 0;
}

// peer_bw.cu: the anchor of bench/transfer-ipc.sh, cudaMemcpyPeerAsync of the same bytes between the same two GPUs
// (one contiguous buffer each side), timed with events: the median of 5 repeats of ITERS copies per size.
// Build: nvcc -O2 -o peer_bw bench/peer_bw.cu.  Run: peer_bw SRC DST ITERS.
// Output, one line per size: "peer <bytes> <GB/s>" (10^9 bytes per second, one direction).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
int main(int argc, char **argv)
{
    int src = argc > 1 ? atoi(argv[1]) : 0, dst = argc > 2 ? atoi(argv[2]) : 1, iters = argc > 3 ? atoi(argv[3]) : 40;
    const size_t sizes[] = {256u << 10, 1u << 20, 4u << 20, 16u << 20};
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, src, dst));
    printf("# cuda:%d -> cuda:%d peer access %s\n", src, dst, can ? "yes" : "no (staged by the driver)");
    void *a, *b;
    CK(cudaSetDevice(dst));
    CK(cudaMalloc(&b, 16u << 20));
    if (can) cudaDeviceEnablePeerAccess(src, 0);
    CK(cudaSetDevice(src));
    CK(cudaMalloc(&a, 16u << 20));
    if (can) cudaDeviceEnablePeerAccess(dst, 0);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (size_t sz : sizes) {
        for (int w = 0; w < 4; w++) CK(cudaMemcpyPeerAsync(b, dst, a, src, sz, s));
        std::vector<float> ms;
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(e0, s));
            for (int i = 0; i < iters; i++) CK(cudaMemcpyPeerAsync(b, dst, a, src, sz, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        printf("peer %zu %.3f\n", sz, (double)sz * iters / (ms[2] * 1e-3) / 1e9);
    }
    return 0;
}

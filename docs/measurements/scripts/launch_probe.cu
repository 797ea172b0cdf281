// Device-run probe (not part of the project): raw cost of a <<<>>> launch with a 300-byte parameter, and cudaGetDevice.
#include <cstdio>
#include <algorithm>
#include <time.h>
struct P { char b[300]; int *out; };
__global__ void k(P p) { if (p.b[7] == 42 && threadIdx.x == 1000) *p.out = 1; }
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main() {
    P p = {}; cudaMalloc(&p.out, 4);
    for (int i = 0; i < 10; i++) k<<<256, 128>>>(p);
    cudaDeviceSynchronize();
    double h[9], g[9];
    for (int r = 0; r < 9; r++) {
        double t0 = now();
        for (int i = 0; i < 50; i++) k<<<256, 128>>>(p);
        double t1 = now();
        cudaDeviceSynchronize();
        h[r] = (t1 - t0) / 50 * 1e9; g[r] = (now() - t0) / 50 * 1e9;
    }
    std::sort(h, h + 9); std::sort(g, g + 9);
    printf("probe raw launch: host %.0f ns/launch, host+gpu %.0f ns/launch\n", h[4], g[4]);
    int d; double t0 = now();
    for (int i = 0; i < 1000000; i++) cudaGetDevice(&d);
    printf("probe cudaGetDevice: %.1f ns\n", (now() - t0) * 1e3);
    printf("probe last error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}

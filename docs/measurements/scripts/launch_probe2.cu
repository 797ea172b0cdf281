// Device-run probe (not part of the project): host cost of one kernel launch against the parameter size and the API.
#include <cstdio>
#include <algorithm>
#include <time.h>
#include <cuda.h>
template <int N> struct P { char b[N]; int *out; };
template <int N> __global__ void k(P<N> p) { if (p.b[N - 1] == 42 && threadIdx.x == 1000) *p.out = 1; }
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
template <int N> void run(const char *api) {
    P<N> p = {}; cudaMalloc(&p.out, 4);
    CUfunction f; cudaGetFuncBySymbol(&f, (const void *)k<N>);
    void *args[] = {&p};
    for (int i = 0; i < 10; i++) k<N><<<32, 128>>>(p);
    cudaDeviceSynchronize();
    double h[21];
    for (int r = 0; r < 21; r++) {
        double t0 = now();
        for (int i = 0; i < 100; i++) {
            if (api[0] == 'r') k<N><<<32, 128>>>(p);
            else cuLaunchKernel(f, 32, 1, 1, 128, 1, 1, 0, 0, args, nullptr);
        }
        h[r] = (now() - t0) / 100 * 1e9;
        cudaDeviceSynchronize();
    }
    std::sort(h, h + 21);
    printf("launch %-7s param %4d B: host %.0f ns (min %.0f)\n", api, N + 8, h[10], h[0]);
}
int main() {
    run<8>("runtime"); run<56>("runtime"); run<152>("runtime"); run<300>("runtime"); run<600>("runtime");
    run<8>("driver"); run<56>("driver"); run<152>("driver"); run<300>("driver");
    printf("last error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
}

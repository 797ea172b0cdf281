/* Device-run probe (not part of the project): host time per paged-caching call on a descriptor hit with the launch
 * queue not saturated (50 calls) and saturated (2000), GPU time per call, and the cost of an idle synchronize. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kvhal.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
#define CK(e) do { kvhal_status s_ = (e); if (s_) { printf("%s: %s\n", #e, kvhal_last_error()); exit(1); } } while (0)
int main(void)
{
    kvhal_device dev = {KVHAL_DEVICE_CUDA, 0};
    const int64_t T = 256, H = 8, D = 128, BS = 16, NB = T / BS;
    kvhal_buffer *in, *cache, *slots;
    size_t el = (size_t)(T * H * D);
    CK(kvhal_buffer_create(dev, 4 * el, &in));
    CK(kvhal_memset(in, 0, 0x3c, 4 * el, NULL));
    CK(kvhal_buffer_create(dev, 4 * el, &cache));
    CK(kvhal_buffer_create(dev, T * 8, &slots));
    kvhal_tensor k, v, kc, vc, s;
    int64_t ish[3] = {T, H, D}, csh[4] = {NB, BS, H, D}, ssh[1] = {T};
    CK(kvhal_tensor_make(in, 0, KVHAL_BF16, 3, ish, NULL, &k));
    CK(kvhal_tensor_make(in, 2 * el, KVHAL_BF16, 3, ish, NULL, &v));
    CK(kvhal_tensor_make(cache, 0, KVHAL_BF16, 4, csh, NULL, &kc));
    CK(kvhal_tensor_make(cache, 2 * el, KVHAL_BF16, 4, csh, NULL, &vc));
    CK(kvhal_tensor_make(slots, 0, KVHAL_I64, 1, ssh, NULL, &s));
    int64_t hs[256];
    for (int pad = 0; pad < 2; pad++) {
        for (int i = 0; i < T; i++) hs[i] = pad ? -1 : i;
        CK(kvhal_memcpy_h2d(slots, 0, hs, sizeof hs, NULL));
        for (int i = 0; i < 3; i++) CK(kvhal_paged_caching(&kc, &vc, &k, &v, &s, 1, 1, NULL));
        CK(kvhal_device_synchronize(dev));
        int ns[2] = {50, 2000};
        for (int j = 0; j < 2; j++) {
            double host[9], tot[9];
            for (int r = 0; r < 9; r++) {
                double t0 = now();
                for (int i = 0; i < ns[j]; i++) CK(kvhal_paged_caching(&kc, &vc, &k, &v, &s, 1, 1, NULL));
                double t1 = now();
                CK(kvhal_device_synchronize(dev));
                double t2 = now();
                host[r] = (t1 - t0) / ns[j] * 1e9, tot[r] = (t2 - t0) / ns[j] * 1e9;
            }
            qsort(host, 9, sizeof(double), cmp), qsort(tot, 9, sizeof(double), cmp);
            printf("probe paged %s calls=%d: host %.0f ns/call, host+gpu %.0f ns/call\n", pad ? "padding" : "real", ns[j], host[4], tot[4]);
        }
    }
    double sy[21];
    for (int r = 0; r < 21; r++) { double t0 = now(); CK(kvhal_device_synchronize(dev)); sy[r] = (now() - t0) * 1e9; }
    qsort(sy, 21, sizeof(double), cmp);
    printf("probe idle kvhal_device_synchronize: %.0f ns\n", sy[10]);
    return 0;
}

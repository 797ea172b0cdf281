/* gpu_or_skip.c — runs a test program only where a GPU is: exits 77 (meson: skipped) when no CUDA or HIP device
 * is present, else replaces itself with argv[1] and its arguments. The GPU modules' kernel-variant runs of the
 * conformance and GPU-path suites (tests/meson.build, suite gpu) go through it: without a GPU they would only run
 * the CPU's tests again. Usage: gpu_or_skip PROGRAM [ARG...]. */
#include <stdio.h>
#include <unistd.h>

#include "kvhal.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_or_skip PROGRAM [ARG...]\n");
        return 2;
    }
    static const kvhal_device_type gpus[] = {KVHAL_DEVICE_CUDA, KVHAL_DEVICE_HIP};
    int32_t total = 0;
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++) {
        int32_t n = 0;
        if (kvhal_device_count(gpus[i], &n) == KVHAL_OK) total += n;
    }
    if (total == 0) {
        printf("gpu_or_skip: no CUDA or HIP device: %s skipped\n", argv[1]);
        return 77;
    }
    execv(argv[1], argv + 1);
    perror(argv[1]);
    return 1;
}

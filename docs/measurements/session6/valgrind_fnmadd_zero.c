/* Minimal check of the sign of an exact zero from FMA3 under valgrind (session 6, the CPU backend's wide fp8 path).
 * IEEE 754 fusedMultiplyAdd and the Intel SDM: vfnmadd computes -(a*b) + c with one rounding, vfmsub a*b - c; an
 * exact zero sum of operands of opposite sign is +0 in round-to-nearest. quot_fma (backends/cpu/cpu_ops.c) with
 * x = +0 computes y = x*inv = +0, r = fmsub(y, s, x) = +0, q = fnmadd(r, inv, y) = -(+0) + (+0), which must be +0.
 * Build: cc -O2 -mavx2 -mfma valgrind_fnmadd_zero.c -o vfz; run ./vfz and valgrind -q ./vfz. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

int main(void)
{
    volatile float va = 0.0f, vb = 0.37f, vc = 0.0f, vx = 1.0f, vy = 2.0f;
    const __m128 a = _mm_set_ss(va), b = _mm_set_ss(vb), c = _mm_set_ss(vc);
    const __m128 x = _mm_set_ss(vx), y = _mm_set_ss(vy);
    /* expected (IEEE / hardware): +0 = 0x00000000 for every line */
    printf("fnmadd_ss(+0, 0.37, +0)  = 0x%08x  [-(+0*0.37) + +0]\n", bits(_mm_cvtss_f32(_mm_fnmadd_ss(a, b, c))));
    printf("fmsub_ss (+0, 0.37, +0)  = 0x%08x  [+0*0.37 - +0]\n", bits(_mm_cvtss_f32(_mm_fmsub_ss(a, b, c))));
    printf("fmadd_ss (+0, 0.37, +0)  = 0x%08x  [+0*0.37 + +0]\n", bits(_mm_cvtss_f32(_mm_fmadd_ss(a, b, c))));
    printf("fnmsub_ss(+0, 0.37, -0)  = 0x%08x  [-(+0*0.37) - -0]\n",
           bits(_mm_cvtss_f32(_mm_fnmsub_ss(a, b, _mm_set_ss(-vc)))));
    printf("fnmadd_ss(1, 2, 2)       = 0x%08x  [-(1*2) + 2, nonzero operands]\n",
           bits(_mm_cvtss_f32(_mm_fnmadd_ss(x, y, y))));
    const __m256 a8 = _mm256_set1_ps(va), b8 = _mm256_set1_ps(vb), c8 = _mm256_set1_ps(vc);
    printf("fnmadd_ps(+0, 0.37, +0)  = 0x%08x  [ymm, lane 0]\n",
           bits(_mm256_cvtss_f32(_mm256_fnmadd_ps(a8, b8, c8))));
    /* quot_fma of cpu_ops.c with x = +0, s = 0.37 */
    const __m128 s = _mm_set_ss(vb), inv = _mm_set_ss(1.0f / vb), x0 = _mm_set_ss(va);
    const __m128 y0 = _mm_mul_ss(x0, inv);
    const float q = _mm_cvtss_f32(_mm_fnmadd_ss(_mm_fmsub_ss(y0, s, x0), inv, y0));
    printf("quot_fma(+0, 0.37)       = 0x%08x  [the fp8 quotient; its sign bit becomes the code's]\n", bits(q));
    return 0;
}

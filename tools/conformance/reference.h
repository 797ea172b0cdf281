/* reference.h — plain host reference implementations of kvhal's ops for the tests, computed element by element
 * from the definitions in kvhal.h on host copies ("mirrors") of whole device buffers. They share no code with the
 * library: number formats are decoded from their definitions and fp8 is encoded by a nearest-value search over
 * every code, so a bug in the library's conversions cannot hide in the reference. */
#ifndef KVHAL_TESTS_REFERENCE_H
#define KVHAL_TESTS_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvhal.h"

/* Deterministic pseudo-random numbers (xorshift64*), so failures reproduce. */
typedef struct ref_rng {
    uint64_t s;
} ref_rng;
uint64_t ref_rand(ref_rng *r);
/* uniform in [0, n) */
uint64_t ref_rand_below(ref_rng *r, uint64_t n);
/* A float with a random sign and a magnitude spread over 2^lo_exp .. 2^hi_exp (never NaN or inf). */
float ref_rand_float(ref_rng *r, int lo_exp, int hi_exp);

/* Number formats from their definitions. */
double ref_f16_decode(uint16_t h);
double ref_bf16_decode(uint16_t b);
double ref_fp8_decode(uint8_t code, kvhal_dtype fp8); /* NaN for NaN codes, +-inf for e5m2's inf codes */
/* Nearest fp8 code to x, ties to the even code, saturating to the largest finite magnitude; NaN -> 0x7f|sign. */
uint8_t ref_fp8_encode(float x, kvhal_dtype fp8);
/* Nearest f16 / bf16 (ties to even), computed with double arithmetic; overflow gives inf. */
uint16_t ref_f16_encode(float x);
uint16_t ref_bf16_encode(float x);

/* Element offset (in elements, including t->offset) of the element at idx[0..ndim). */
int64_t ref_elem_offset(const kvhal_tensor *t, const int64_t *idx);
/* Value of a float element of a mirror (f32, f16, bf16, fp8) as float. */
float ref_load(const uint8_t *mirror, kvhal_dtype dt, int64_t elem);
/* Slot value of an i32/i64 element. */
int64_t ref_load_int(const uint8_t *mirror, kvhal_dtype dt, int64_t elem);

/* The paged-caching op on mirrors. kc/vc: cache mirrors (updated in place); k/v/slots: input mirrors. Slots out
 * of range are skipped (the device-side behaviour); the CPU's fail-before-write behaviour is checked separately. */
void ref_paged_caching(uint8_t *kc_mirror, const kvhal_tensor *k_cache, uint8_t *vc_mirror,
                       const kvhal_tensor *v_cache, const uint8_t *k_mirror, const kvhal_tensor *k,
                       const uint8_t *v_mirror, const kvhal_tensor *v, const uint8_t *slot_mirror,
                       const kvhal_tensor *slots, float k_scale, float v_scale);

/* copy_blocks on mirrors: mirrors[c] is the mirror of caches[c]'s buffer (caches may share a buffer: then pass the
 * same mirror). Pairs run in order. */
void ref_copy_blocks(uint8_t *const *mirrors, const kvhal_tensor *caches, int32_t num_caches, const int64_t *pairs,
                     int32_t num_pairs);

/* page_transfer on mirrors (mirrors as for ref_copy_blocks): host page pairs[2p+1] of host (host_page_bytes each)
 * holds device block pairs[2p] of every cache, cache after cache, each block's elements in row-major order. */
void ref_page_transfer(uint8_t *const *mirrors, const kvhal_tensor *caches, int32_t num_caches, uint8_t *host,
                       size_t host_page_bytes, const int64_t *pairs, int32_t num_pairs, bool to_host);

/* dst = src element by element (same shape and dtype). */
void ref_tensor_copy(uint8_t *dst_mirror, const kvhal_tensor *dst, const uint8_t *src_mirror,
                     const kvhal_tensor *src);

#endif

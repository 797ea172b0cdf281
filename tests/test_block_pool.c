/* test_block_pool.c — the block pool: all-or-nothing allocation, reference counts (share/release), the free list
 * staying consistent under a long random sequence checked against a plain array of counts, and the error paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"
#include "kvhal_test.h"

static void test_allocate_release(void **state)
{
    (void)state;
    kvhal_block_pool *p;
    assert_int_equal(kvhal_block_pool_create(8, &p), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_num_total(p), 8);
    assert_int_equal(kvhal_block_pool_num_free(p), 8);
    int32_t b[8];
    assert_int_equal(kvhal_block_pool_allocate(p, 3, b), KVHAL_OK);
    /* fresh pool hands out 0, 1, 2 */
    assert_int_equal(b[0], 0);
    assert_int_equal(b[1], 1);
    assert_int_equal(b[2], 2);
    for (int i = 0; i < 3; i++) assert_int_equal(kvhal_block_pool_ref_count(p, b[i]), 1);
    assert_int_equal(kvhal_block_pool_ref_count(p, 3), 0);
    assert_int_equal(kvhal_block_pool_num_free(p), 5);
    assert_int_equal(kvhal_block_pool_check_integrity(p), KVHAL_OK);

    /* all or nothing */
    int32_t more[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    assert_int_equal(kvhal_block_pool_allocate(p, 6, more), KVHAL_OUT_OF_MEMORY);
    assert_non_null(strstr(kvhal_last_error(), "6"));
    assert_int_equal(kvhal_block_pool_num_free(p), 5);
    for (int i = 0; i < 8; i++) assert_int_equal(more[i], -7);
    assert_int_equal(kvhal_block_pool_allocate(p, 5, more), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_num_free(p), 0);
    assert_int_equal(kvhal_block_pool_allocate(p, 1, more + 5), KVHAL_OUT_OF_MEMORY);
    assert_int_equal(kvhal_block_pool_allocate(p, 0, NULL), KVHAL_OK);

    /* release order is LIFO: the last released comes back first */
    assert_int_equal(kvhal_block_pool_release(p, b[1]), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_release(p, more[2]), KVHAL_OK);
    int32_t again[2];
    assert_int_equal(kvhal_block_pool_allocate(p, 2, again), KVHAL_OK);
    assert_int_equal(again[0], more[2]);
    assert_int_equal(again[1], b[1]);
    assert_int_equal(kvhal_block_pool_check_integrity(p), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_destroy(p), KVHAL_OK);
}

static void test_share(void **state)
{
    (void)state;
    kvhal_block_pool *p;
    assert_int_equal(kvhal_block_pool_create(4, &p), KVHAL_OK);
    int32_t b;
    assert_int_equal(kvhal_block_pool_allocate(p, 1, &b), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_share(p, b), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_share(p, b), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_ref_count(p, b), 3);
    assert_int_equal(kvhal_block_pool_release(p, b), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_release(p, b), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_num_free(p), 3); /* still referenced once */
    assert_int_equal(kvhal_block_pool_release(p, b), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_num_free(p), 4);
    /* a double free is caught, not pushed twice */
    assert_int_equal(kvhal_block_pool_release(p, b), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "block"));
    assert_int_equal(kvhal_block_pool_num_free(p), 4);
    assert_int_equal(kvhal_block_pool_share(p, b), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_block_pool_check_integrity(p), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_destroy(p), KVHAL_OK);
}

static void test_errors(void **state)
{
    (void)state;
    kvhal_block_pool *p = (kvhal_block_pool *)0x1;
    assert_int_equal(kvhal_block_pool_create(0, &p), KVHAL_INVALID_ARGUMENT);
    assert_null(p);
    assert_int_equal(kvhal_block_pool_create(4, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_block_pool_create(4, &p), KVHAL_OK);
    int32_t b[4];
    assert_int_equal(kvhal_block_pool_allocate(p, -1, b), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_block_pool_allocate(p, 2, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_block_pool_release(p, 4), KVHAL_OUT_OF_RANGE);
    assert_non_null(strstr(kvhal_last_error(), "block: 4"));
    assert_int_equal(kvhal_block_pool_release(p, -1), KVHAL_OUT_OF_RANGE);
    assert_int_equal(kvhal_block_pool_ref_count(p, 99), -1);
    assert_int_equal(kvhal_block_pool_allocate(NULL, 1, b), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_block_pool_check_integrity(NULL), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_block_pool_num_free(NULL), 0);
    assert_int_equal(kvhal_block_pool_destroy(NULL), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_destroy(p), KVHAL_OK);
}

static void test_fault_injection(void **state)
{
    (void)state;
    /* every allocation of create fails cleanly */
    for (int64_t k = 1; k <= 3; k++) {
        kvhal_block_pool *p = NULL;
        kvhal_fault_inject_alloc(k);
        kvhal_status st = kvhal_block_pool_create(16, &p);
        kvhal_fault_inject_alloc(0);
        assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
        assert_null(p);
    }
}

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ULL;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Allocation takes a range path when the stack top holds consecutive ids and goes id by id otherwise: both hand
 * out the stack's LIFO order and leave the same counts. */
static void test_allocate_runs(void **state)
{
    (void)state;
    kvhal_block_pool *p;
    assert_int_equal(kvhal_block_pool_create(64, &p), KVHAL_OK);
    int32_t a[64];
    assert_int_equal(kvhal_block_pool_allocate(p, 40, a), KVHAL_OK); /* fresh: 0, 1, ..., 39 */
    for (int32_t i = 0; i < 40; i++) {
        assert_int_equal(a[i], i);
        assert_int_equal(kvhal_block_pool_ref_count(p, i), 1);
    }
    assert_int_equal(kvhal_block_pool_ref_count(p, 40), 0);
    static const int32_t scattered[5] = {5, 30, 17, 2, 9};
    for (int i = 0; i < 5; i++) assert_int_equal(kvhal_block_pool_release(p, scattered[i]), KVHAL_OK);
    int32_t b[5];
    assert_int_equal(kvhal_block_pool_allocate(p, 5, b), KVHAL_OK); /* not a run: last released first */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(b[i], scattered[4 - i]);
        assert_int_equal(kvhal_block_pool_ref_count(p, b[i]), 1);
    }
    /* the stack top now reads 33 ... 63 at its ends, but 36 and 37 are swapped: no run, id by id */
    static const int32_t back[7] = {39, 38, 36, 37, 35, 34, 33};
    for (int i = 0; i < 7; i++) assert_int_equal(kvhal_block_pool_release(p, back[i]), KVHAL_OK);
    int32_t c[31];
    assert_int_equal(kvhal_block_pool_allocate(p, 31, c), KVHAL_OK);
    for (int i = 0; i < 7; i++) assert_int_equal(c[i], back[6 - i]);
    for (int32_t i = 7; i < 31; i++) assert_int_equal(c[i], 40 + (i - 7));
    assert_int_equal(kvhal_block_pool_num_free(p), 0);
    assert_int_equal(kvhal_block_pool_allocate(p, 1, c), KVHAL_OUT_OF_MEMORY);
    /* refilled with a descending run: comes back as an ascending one */
    for (int32_t i = 63; i >= 40; i--) assert_int_equal(kvhal_block_pool_release(p, i), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_allocate(p, 24, c), KVHAL_OK);
    for (int32_t i = 0; i < 24; i++) {
        assert_int_equal(c[i], 40 + i);
        assert_int_equal(kvhal_block_pool_ref_count(p, 40 + i), 1);
    }
    assert_int_equal(kvhal_block_pool_check_integrity(p), KVHAL_OK);
    assert_int_equal(kvhal_block_pool_destroy(p), KVHAL_OK);
}

/* Random allocate/share/release against an array of expected reference counts. */
static void test_random_against_model(void **state)
{
    (void)state;
    enum { N = 97 };
    int32_t model[N] = {0};
    kvhal_block_pool *p;
    assert_int_equal(kvhal_block_pool_create(N, &p), KVHAL_OK);
    uint64_t rng = 12345;
    for (int step = 0; step < 20000; step++) {
        int op = (int)(rng_next(&rng) % 3);
        int nfree = 0;
        for (int i = 0; i < N; i++) nfree += model[i] == 0;
        if (op == 0) {
            int32_t n = (int32_t)(rng_next(&rng) % 8);
            int32_t got[8];
            kvhal_status st = kvhal_block_pool_allocate(p, n, got);
            if (n > nfree) {
                assert_int_equal(st, KVHAL_OUT_OF_MEMORY);
            } else {
                assert_int_equal(st, KVHAL_OK);
                for (int32_t i = 0; i < n; i++) {
                    assert_in_range(got[i], 0, N - 1);
                    assert_int_equal(model[got[i]], 0);
                    model[got[i]] = 1;
                }
            }
        } else {
            int32_t b = (int32_t)(rng_next(&rng) % N);
            if (op == 1) {
                kvhal_status st = kvhal_block_pool_share(p, b);
                assert_int_equal(st, model[b] ? KVHAL_OK : KVHAL_INVALID_ARGUMENT);
                if (model[b]) model[b]++;
            } else {
                kvhal_status st = kvhal_block_pool_release(p, b);
                assert_int_equal(st, model[b] ? KVHAL_OK : KVHAL_INVALID_ARGUMENT);
                if (model[b]) model[b]--;
            }
        }
        nfree = 0;
        for (int i = 0; i < N; i++) {
            nfree += model[i] == 0;
            assert_int_equal(kvhal_block_pool_ref_count(p, i), model[i]);
        }
        assert_int_equal(kvhal_block_pool_num_free(p), nfree);
        if (step % 16 == 0) assert_int_equal(kvhal_block_pool_check_integrity(p), KVHAL_OK);
    }
    assert_int_equal(kvhal_block_pool_destroy(p), KVHAL_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocate_release),
        cmocka_unit_test(test_allocate_runs),
        cmocka_unit_test(test_share),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_fault_injection),
        cmocka_unit_test(test_random_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

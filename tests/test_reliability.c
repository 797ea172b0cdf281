/* test_reliability.c — regression tests for the reliability and security findings of issue 21, one (or more) per
 * defect, named test_d<N>_... after the defect's number in the issue. Each failed on the tree the fixes started
 * from (the commit messages say how it failed). Handles are only compared with 0 and passed on, so that the same
 * source also compiles against that tree's header. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvhal.h"

static kvhal_cache_manager *make_cm(int32_t total, int32_t ps)
{
    kvhal_cache_manager *cm = NULL;
    assert_int_equal(kvhal_cache_manager_create(total, ps, KVHAL_PREFIX_RADIX, &cm), KVHAL_OK);
    return cm;
}

static void cm_ok(const kvhal_cache_manager *cm)
{
    if (kvhal_cache_manager_check_integrity(cm) != KVHAL_OK) fail_msg("%s", kvhal_last_error());
}

static size_t protected_tokens(kvhal_prefix_cache *pc)
{
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(pc, &si), KVHAL_OK);
    return si.protected_tokens;
}

/* Defect 2: a node handle whose node was evicted, after an unrelated insert took its slot, must not lock (or
 * unlock) the unrelated entry. */
static void test_d2_stale_prefix_handle_refused(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = NULL;
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, &pc), KVHAL_OK);
    size_t already, got, ev;
    int32_t out[4];
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){1, 2}, 2, (int32_t[]){0, 1}, &already), KVHAL_OK);
    kvhal_prefix_handle h;
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){1, 2}, 2, &h, &got, out, 4), KVHAL_OK);
    assert_int_equal(got, 2);
    assert_true(h != 0);
    assert_int_equal(kvhal_prefix_evict(pc, 100, NULL, NULL, &ev), KVHAL_OK);
    assert_int_equal(ev, 2);
    /* the unrelated entry takes the freed node slot */
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){5, 6}, 2, (int32_t[]){2, 3}, &already), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, h), KVHAL_INVALID_HANDLE);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    assert_int_equal(protected_tokens(pc), 0);
    assert_int_equal(kvhal_prefix_unlock(pc, h), KVHAL_INVALID_HANDLE);
    /* the same after a reset */
    kvhal_prefix_handle h2;
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){5, 6}, 2, &h2, &got, out, 4), KVHAL_OK);
    assert_int_equal(kvhal_prefix_lock(pc, h2), KVHAL_OK);
    assert_int_equal(kvhal_prefix_reset(pc, NULL, NULL), KVHAL_OK);
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){7, 8}, 2, (int32_t[]){4, 5}, &already), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, h2), KVHAL_INVALID_HANDLE);
    assert_int_equal(kvhal_prefix_lock(pc, h2), KVHAL_INVALID_HANDLE);
    assert_int_equal(protected_tokens(pc), 0);
    assert_int_equal(kvhal_prefix_check_integrity(pc), KVHAL_OK);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
}

/* Defect 2: request A finishes twice; between the two, A's cached suffix is evicted and its pages go to request
 * B, which holds a lock on the same node A matched. The second finish must be refused: accepted, it put B's pages
 * under A's tokens and a later match served them (another request's K/V). */
static void test_d2_double_finish_suffix_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make_cm(8, 1);
    kvhal_prefix_cache *pc = kvhal_cache_manager_prefix(cm);
    int32_t seed_pages[2], pa[2], pb[6], out[8];
    size_t cached;
    kvhal_prefix_handle h0, ha, hb;
    /* the shared prefix [1, 2] */
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2}, 2, &h0, &cached, out, 8), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, seed_pages), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, (int32_t[]){1, 2}, 2, seed_pages, h0), KVHAL_OK);
    /* A: [1, 2, 3, 4] */
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3, 4}, 4, &ha, &cached, out, 8), KVHAL_OK);
    assert_int_equal(cached, 2);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pa), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){3, 4}, 2, pa), KVHAL_OK);
    cm_ok(cm);
    /* B: [1, 2, 9] locks the node A matched; A's suffix leaf is evicted and B gets every free page (A's too) */
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 9}, 3, &hb, &cached, out, 8), KVHAL_OK);
    assert_int_equal(cached, 2);
    size_t ev = 0;
    assert_int_equal(kvhal_cache_manager_evict(cm, 100, &ev), KVHAL_OK);
    assert_int_equal(ev, 2);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 6, pb), KVHAL_OK);
    /* A finishes again with its old pages, now B's */
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){3, 4}, 2, pa), KVHAL_INVALID_HANDLE);
    assert_non_null(strstr(kvhal_last_error(), "handle"));
    cm_ok(cm);
    /* nobody is served B's pages for A's tokens */
    kvhal_prefix_handle hc;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3, 4}, 4, &hc, &cached, out, 8), KVHAL_OK);
    assert_int_equal(cached, 2);
    assert_int_equal(kvhal_prefix_unlock(pc, hc), KVHAL_OK);
    /* B's own handle still works, once */
    assert_int_equal(kvhal_cache_manager_free(cm, pb, 6), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, hb), KVHAL_OK);
    assert_int_equal(kvhal_prefix_unlock(pc, hb), KVHAL_INVALID_HANDLE);
    assert_int_equal(protected_tokens(pc), 0);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 2: a request that matched nothing finishes twice (its pages reused by B in between): refused too. */
static void test_d2_double_finish_empty_match_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make_cm(4, 1);
    int32_t pa[2], pb[4], out[4];
    size_t cached;
    kvhal_prefix_handle ha;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2}, 2, &ha, &cached, out, 4), KVHAL_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pa), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){1, 2}, 2, pa), KVHAL_OK);
    size_t ev;
    assert_int_equal(kvhal_cache_manager_evict(cm, 100, &ev), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 4, pb), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished_suffix(cm, ha, (int32_t[]){1, 2}, 2, pa), KVHAL_INVALID_HANDLE);
    cm_ok(cm);
    kvhal_prefix_handle hc;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2}, 2, &hc, &cached, out, 4), KVHAL_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(kvhal_prefix_unlock(kvhal_cache_manager_prefix(cm), hc), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_free(cm, pb, 4), KVHAL_OK);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 3: the prefix cache a manager owns cannot be destroyed on its own; the manager keeps working. */
static void test_d3_manager_prefix_destroy_refused(void **state)
{
    (void)state;
    kvhal_cache_manager *cm = make_cm(8, 2);
    kvhal_prefix_cache *pc = kvhal_cache_manager_prefix(cm);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "cache manager"));
    int32_t pages[2], out[2];
    size_t cached;
    kvhal_prefix_handle h;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3, 4}, 4, &h, &cached, out, 2), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 2, pages), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, (int32_t[]){1, 2, 3, 4}, 4, pages, h), KVHAL_OK);
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

/* Defect 9: a refused match (pages_cap too small) writes nothing: not pages, not handle, not cached_len. */
static void test_d9_refused_match_writes_nothing(void **state)
{
    (void)state;
    kvhal_prefix_cache *pc = NULL;
    assert_int_equal(kvhal_prefix_cache_create(KVHAL_PREFIX_RADIX, 1, &pc), KVHAL_OK);
    size_t already;
    assert_int_equal(kvhal_prefix_insert(pc, (int32_t[]){1, 2, 3}, 3, (int32_t[]){0, 1, 2}, &already), KVHAL_OK);
    kvhal_prefix_handle h, h_before;
    memset(&h, 0xab, sizeof h);
    h_before = h;
    size_t cached = 12345;
    int32_t out[2] = {-7, -7};
    assert_int_equal(kvhal_prefix_match(pc, (int32_t[]){1, 2, 3}, 3, &h, &cached, out, 2), KVHAL_OUT_OF_RANGE);
    assert_memory_equal(&h, &h_before, sizeof h);
    assert_int_equal(cached, 12345);
    assert_int_equal(out[0], -7);
    assert_int_equal(kvhal_prefix_cache_destroy(pc), KVHAL_OK);
    /* the manager's match likewise */
    kvhal_cache_manager *cm = make_cm(8, 1);
    kvhal_prefix_handle h0;
    int32_t pg[3], o8[8];
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3}, 3, &h0, &cached, o8, 8), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_allocate(cm, 3, pg), KVHAL_OK);
    assert_int_equal(kvhal_cache_manager_cache_finished(cm, (int32_t[]){1, 2, 3}, 3, pg, h0), KVHAL_OK);
    h = h_before;
    cached = 12345;
    assert_int_equal(kvhal_cache_manager_match(cm, (int32_t[]){1, 2, 3}, 3, &h, &cached, out, 2), KVHAL_OUT_OF_RANGE);
    assert_memory_equal(&h, &h_before, sizeof h);
    assert_int_equal(cached, 12345);
    kvhal_prefix_size_info si;
    assert_int_equal(kvhal_prefix_size_info_get(kvhal_cache_manager_prefix(cm), &si), KVHAL_OK);
    assert_int_equal(si.protected_tokens, 0); /* no lock taken either */
    cm_ok(cm);
    assert_int_equal(kvhal_cache_manager_destroy(cm), KVHAL_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_d2_stale_prefix_handle_refused),
        cmocka_unit_test(test_d2_double_finish_suffix_refused),
        cmocka_unit_test(test_d2_double_finish_empty_match_refused),
        cmocka_unit_test(test_d3_manager_prefix_destroy_refused),
        cmocka_unit_test(test_d9_refused_match_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

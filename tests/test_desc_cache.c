/* test_desc_cache.c — the descriptor cache: key building and equality, LRU order, eviction and replacement destroying
 * each descriptor exactly once (on the thread that owns it), exact-key lookup under forced hash collisions,
 * per-op capacity (including 0 and KVHAL_DESC_CACHE_CAPACITY), stats, clear, the op-kind registry under concurrent
 * registration, and 8 threads at once, each with its own cache that its exit destroys. CI also runs this under
 * TSan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvhal.h"

static const kvhal_device cpu = {KVHAL_DEVICE_CPU, 0};

#define OK(expr) assert_int_equal((expr), KVHAL_OK)

/* Descriptors live in a static pool and are never freed, so a double destroy is counted instead of crashing. */
typedef struct tdesc {
    atomic_int destroyed;
    pthread_t owner;
    atomic_int wrong_thread;
} tdesc;

#define POOL 8192
static tdesc pool[POOL];
static atomic_int total_destroyed;

static void counting_destroy(void *d, kvhal_device dev, void *user)
{
    (void)dev;
    (void)user;
    tdesc *t = d;
    if (!pthread_equal(t->owner, pthread_self())) atomic_fetch_add(&t->wrong_thread, 1);
    atomic_fetch_add(&t->destroyed, 1);
    atomic_fetch_add(&total_destroyed, 1);
}

static tdesc *fresh(int i)
{
    atomic_store(&pool[i].destroyed, 0);
    atomic_store(&pool[i].wrong_thread, 0);
    pool[i].owner = pthread_self();
    return &pool[i];
}

static kvhal_op_kind op_a, op_b;
static const char *self_path = "";

static void key_of(kvhal_desc_key *k, kvhal_op_kind op, uint64_t a, uint64_t b)
{
    OK(kvhal_desc_key_init(k, op));
    OK(kvhal_desc_key_add_u64(k, a));
    OK(kvhal_desc_key_add_u64(k, b));
}

static void *get(kvhal_op_kind op, uint64_t a, uint64_t b)
{
    kvhal_desc_key k;
    key_of(&k, op, a, b);
    void *d = NULL;
    kvhal_status st = kvhal_desc_cache_get(cpu, &k, &d);
    if (st == KVHAL_NOT_FOUND) return NULL;
    assert_int_equal(st, KVHAL_OK);
    return d;
}

static void put(kvhal_op_kind op, uint64_t a, uint64_t b, void *d)
{
    kvhal_desc_key k;
    key_of(&k, op, a, b);
    OK(kvhal_desc_cache_put(cpu, &k, d));
}

static kvhal_desc_cache_stats stats(kvhal_op_kind op)
{
    kvhal_desc_cache_stats s;
    OK(kvhal_desc_cache_get_stats(cpu, op, &s));
    return s;
}

static int setup(void **state)
{
    (void)state;
    OK(kvhal_desc_cache_clear(cpu));
    OK(kvhal_desc_cache_set_capacity(op_a, 3));
    OK(kvhal_desc_cache_set_capacity(op_b, 100));
    atomic_store(&total_destroyed, 0);
    return 0;
}

/* ---- tests ---- */

static void test_builtin_kinds_and_default_capacity(void **state)
{
    (void)state;
    static const char *names[3] = {"paged_caching", "copy_blocks", "tensor_copy"};
    for (int i = 0; i < 3; i++) {
        kvhal_op_kind k = -1;
        OK(kvhal_desc_op_find(names[i], &k));
        assert_int_equal(k, i);
        size_t cap = 0;
        OK(kvhal_desc_cache_get_capacity(k, &cap));
        const char *env = getenv("KVHAL_DESC_CACHE_CAPACITY");
        if (!env || !*env) assert_int_equal(cap, 100);
    }
    kvhal_op_kind k;
    assert_int_equal(kvhal_desc_op_find("no such op", &k), KVHAL_NOT_FOUND);
    kvhal_op_kind dup;
    assert_int_equal(kvhal_desc_op_register("paged_caching", counting_destroy, NULL, &dup), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "paged_caching"));
}

/* The capacity comes from the environment: checked in a child process started with the variable set. */
static void test_env_capacity(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("KVHAL_DESC_CACHE_CAPACITY", "7", 1);
        /* argv[0], not /proc/self/exe, which is valgrind itself when the suite runs under it */
        execl(strchr(self_path, '/') ? self_path : "/proc/self/exe", "test_desc_cache", "--env-child", (char *)NULL);
        _exit(99);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static int env_child(void)
{
    size_t cap = 0;
    kvhal_op_kind op;
    if (kvhal_desc_cache_get_capacity(0, &cap) != KVHAL_OK || cap != 7) return 1;
    if (kvhal_desc_op_register("env.child", NULL, NULL, &op) != KVHAL_OK) return 2;
    if (kvhal_desc_cache_get_capacity(op, &cap) != KVHAL_OK || cap != 7) return 3;
    return 0;
}

static void test_keys(void **state)
{
    (void)state;
    kvhal_desc_key a, b;
    key_of(&a, op_a, 1, 2);
    key_of(&b, op_a, 1, 2);
    assert_true(kvhal_desc_key_equal(&a, &b));
    assert_true(a.hash == b.hash);
    key_of(&b, op_a, 2, 1);
    assert_false(kvhal_desc_key_equal(&a, &b));
    assert_true(a.hash != b.hash); /* order matters */
    key_of(&b, op_b, 1, 2);
    assert_false(kvhal_desc_key_equal(&a, &b)); /* op matters */
    OK(kvhal_desc_key_init(&b, op_a));
    OK(kvhal_desc_key_add_u64(&b, 1));
    assert_false(kvhal_desc_key_equal(&a, &b)); /* length matters */

    /* tensors: dtype, ndim, shape and strides, not the buffer or offset */
    kvhal_buffer *buf;
    OK(kvhal_buffer_create(cpu, 4096, &buf));
    kvhal_tensor t1, t2;
    int64_t sh[2] = {4, 8};
    OK(kvhal_tensor_make(buf, 0, KVHAL_F32, 2, sh, NULL, &t1));
    OK(kvhal_tensor_make(buf, 64, KVHAL_F32, 2, sh, NULL, &t2));
    OK(kvhal_desc_key_init(&a, op_a));
    OK(kvhal_desc_key_add_tensor(&a, &t1));
    OK(kvhal_desc_key_init(&b, op_a));
    OK(kvhal_desc_key_add_tensor(&b, &t2));
    assert_true(kvhal_desc_key_equal(&a, &b));
    assert_int_equal(a.nwords, 2 + 2 * 2);
    OK(kvhal_tensor_permute(&t1, (int32_t[]){1, 0}, &t2));
    OK(kvhal_desc_key_init(&b, op_a));
    OK(kvhal_desc_key_add_tensor(&b, &t2));
    assert_false(kvhal_desc_key_equal(&a, &b));
    t2 = t1;
    t2.dtype = KVHAL_I32;
    OK(kvhal_desc_key_init(&b, op_a));
    OK(kvhal_desc_key_add_tensor(&b, &t2));
    assert_false(kvhal_desc_key_equal(&a, &b));
    /* a full key refuses more words and stays unchanged */
    OK(kvhal_desc_key_init(&a, op_a));
    for (int i = 0; i < KVHAL_DESC_KEY_MAX_WORDS - 3; i++) OK(kvhal_desc_key_add_u64(&a, (uint64_t)i));
    b = a;
    assert_int_equal(kvhal_desc_key_add_tensor(&a, &t1), KVHAL_OUT_OF_RANGE);
    assert_true(kvhal_desc_key_equal(&a, &b));
    OK(kvhal_buffer_destroy(buf));
    /* an op kind that is not registered */
    assert_int_equal(kvhal_desc_key_init(&a, 255), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_desc_key_init(&a, -1), KVHAL_INVALID_ARGUMENT);
}

static void test_lru_order(void **state)
{
    (void)state;
    tdesc *d1 = fresh(1), *d2 = fresh(2), *d3 = fresh(3), *d4 = fresh(4), *d5 = fresh(5);
    kvhal_desc_cache_stats s0 = stats(op_a); /* counters are cumulative: compare differences */
    put(op_a, 1, 0, d1);
    put(op_a, 2, 0, d2);
    put(op_a, 3, 0, d3);
    assert_ptr_equal(get(op_a, 1, 0), d1); /* 1 becomes the most recent: order 1, 3, 2 */
    put(op_a, 4, 0, d4);                   /* evicts 2 */
    assert_null(get(op_a, 2, 0));
    assert_int_equal(atomic_load(&d2->destroyed), 1);
    assert_ptr_equal(get(op_a, 3, 0), d3); /* order 3, 4, 1 */
    put(op_a, 5, 0, d5);                   /* evicts 1 */
    assert_null(get(op_a, 1, 0));
    assert_int_equal(atomic_load(&d1->destroyed), 1);
    assert_ptr_equal(get(op_a, 3, 0), d3);
    assert_ptr_equal(get(op_a, 4, 0), d4);
    assert_ptr_equal(get(op_a, 5, 0), d5);
    assert_int_equal(atomic_load(&d3->destroyed) + atomic_load(&d4->destroyed) + atomic_load(&d5->destroyed), 0);
    kvhal_desc_cache_stats s = stats(op_a);
    assert_int_equal(s.size, 3);
    assert_int_equal(s.capacity, 3);
    assert_int_equal(s.inserts - s0.inserts, 5);
    assert_int_equal(s.evictions - s0.evictions, 2);
    assert_int_equal(s.hits - s0.hits, 5);
    assert_int_equal(s.misses - s0.misses, 2);
    /* the other op kind's LRU is separate */
    assert_int_equal(stats(op_b).size, 0);
    OK(kvhal_desc_cache_clear(cpu));
    for (int i = 1; i <= 5; i++) {
        assert_int_equal(atomic_load(&pool[i].destroyed), 1);
        assert_int_equal(atomic_load(&pool[i].wrong_thread), 0);
    }
    assert_int_equal(stats(op_a).size, 0);
}

static void test_replace(void **state)
{
    (void)state;
    tdesc *d1 = fresh(10), *d2 = fresh(11);
    put(op_a, 7, 7, d1);
    put(op_a, 7, 7, d1); /* the same descriptor again: nothing destroyed */
    assert_int_equal(atomic_load(&d1->destroyed), 0);
    put(op_a, 7, 7, d2); /* a new descriptor for the key destroys the old one */
    assert_int_equal(atomic_load(&d1->destroyed), 1);
    assert_ptr_equal(get(op_a, 7, 7), d2);
    assert_int_equal(stats(op_a).size, 1);
    OK(kvhal_desc_cache_clear(cpu));
    assert_int_equal(atomic_load(&d1->destroyed), 1);
    assert_int_equal(atomic_load(&d2->destroyed), 1);
}

/* Keys forced into one bucket (equal hash, different words) stay distinct entries. */
static void test_collisions(void **state)
{
    (void)state;
    OK(kvhal_desc_cache_set_capacity(op_b, 64));
    kvhal_desc_key keys[40];
    for (int i = 0; i < 40; i++) {
        OK(kvhal_desc_key_init(&keys[i], op_b));
        for (int w = 0; w <= i % 5; w++) OK(kvhal_desc_key_add_u64(&keys[i], (uint64_t)(i * 100 + w)));
        keys[i].hash = 0x1234567812345678ull; /* every key collides */
        OK(kvhal_desc_cache_put(cpu, &keys[i], fresh(100 + i)));
    }
    /* same hash and the same first words but one word shorter: a different key */
    kvhal_desc_key shorter = keys[4];
    shorter.nwords--;
    void *d;
    assert_int_equal(kvhal_desc_cache_get(cpu, &shorter, &d), KVHAL_NOT_FOUND);
    kvhal_desc_key other = keys[3];
    other.words[0] ^= 1;
    assert_int_equal(kvhal_desc_cache_get(cpu, &other, &d), KVHAL_NOT_FOUND);
    for (int i = 39; i >= 0; i--) {
        OK(kvhal_desc_cache_get(cpu, &keys[i], &d));
        assert_ptr_equal(d, &pool[100 + i]);
    }
    assert_int_equal(stats(op_b).size, 40);
    /* eviction of colliding entries unlinks the right one */
    OK(kvhal_desc_cache_set_capacity(op_b, 10));
    assert_int_equal(stats(op_b).size, 10);
    for (int i = 0; i < 40; i++) {
        kvhal_status st = kvhal_desc_cache_get(cpu, &keys[i], &d);
        if (i < 10) { /* the last 10 looked up above were 9..0 */
            assert_int_equal(st, KVHAL_OK);
            assert_ptr_equal(d, &pool[100 + i]);
            assert_int_equal(atomic_load(&pool[100 + i].destroyed), 0);
        } else {
            assert_int_equal(st, KVHAL_NOT_FOUND);
            assert_int_equal(atomic_load(&pool[100 + i].destroyed), 1);
        }
    }
    OK(kvhal_desc_cache_clear(cpu));
    for (int i = 0; i < 40; i++) assert_int_equal(atomic_load(&pool[100 + i].destroyed), 1);
}

static void test_many_evictions(void **state)
{
    (void)state;
    OK(kvhal_desc_cache_set_capacity(op_b, 10));
    kvhal_desc_cache_stats s0 = stats(op_b); /* counters are cumulative: compare differences */
    for (int i = 0; i < 1000; i++) put(op_b, (uint64_t)i, 42, fresh(1000 + i));
    kvhal_desc_cache_stats s = stats(op_b);
    assert_int_equal(s.size, 10);
    assert_int_equal(s.evictions - s0.evictions, 990);
    assert_int_equal(s.inserts - s0.inserts, 1000);
    assert_int_equal(atomic_load(&total_destroyed), 990);
    for (int i = 0; i < 1000; i++) assert_int_equal(atomic_load(&pool[1000 + i].destroyed), i < 990 ? 1 : 0);
    for (int i = 990; i < 1000; i++) assert_ptr_equal(get(op_b, (uint64_t)i, 42), &pool[1000 + i]);
    OK(kvhal_desc_cache_clear(cpu));
    for (int i = 0; i < 1000; i++) assert_int_equal(atomic_load(&pool[1000 + i].destroyed), 1);
    assert_int_equal(atomic_load(&total_destroyed), 1000);
}

static void test_capacity(void **state)
{
    (void)state;
    size_t cap;
    OK(kvhal_desc_cache_get_capacity(op_a, &cap));
    assert_int_equal(cap, 3);
    put(op_a, 1, 1, fresh(20));
    put(op_a, 2, 1, fresh(21));
    put(op_a, 3, 1, fresh(22));
    put(op_b, 1, 1, fresh(23));
    /* shrinking trims this thread's LRU at once, oldest first, and only that op kind */
    OK(kvhal_desc_cache_set_capacity(op_a, 1));
    assert_int_equal(atomic_load(&pool[20].destroyed), 1);
    assert_int_equal(atomic_load(&pool[21].destroyed), 1);
    assert_int_equal(atomic_load(&pool[22].destroyed), 0);
    assert_int_equal(stats(op_a).size, 1);
    assert_int_equal(stats(op_a).capacity, 1);
    assert_ptr_equal(get(op_b, 1, 1), &pool[23]);
    OK(kvhal_desc_cache_get_capacity(op_b, &cap));
    assert_int_equal(cap, 100);
    /* capacity 0: put takes ownership and destroys at once */
    OK(kvhal_desc_cache_set_capacity(op_a, 0));
    assert_int_equal(atomic_load(&pool[22].destroyed), 1);
    put(op_a, 9, 9, fresh(24));
    assert_int_equal(atomic_load(&pool[24].destroyed), 1);
    assert_null(get(op_a, 9, 9));
    assert_int_equal(stats(op_a).size, 0);
    assert_int_equal(kvhal_desc_cache_set_capacity(op_a, (size_t)1 << 40), KVHAL_OUT_OF_RANGE);
    assert_int_equal(kvhal_desc_cache_set_capacity(9999, 1), KVHAL_INVALID_ARGUMENT);
    OK(kvhal_desc_cache_clear(cpu));
    assert_int_equal(atomic_load(&pool[23].destroyed), 1);
}

static void test_bad_args(void **state)
{
    (void)state;
    kvhal_desc_key k;
    void *d;
    key_of(&k, op_a, 1, 1);
    assert_int_equal(kvhal_desc_cache_get(cpu, NULL, &d), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_desc_cache_get(cpu, &k, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_desc_cache_put(cpu, NULL, &d), KVHAL_INVALID_ARGUMENT);
    kvhal_device none = {KVHAL_DEVICE_CPU, 5};
    assert_int_equal(kvhal_desc_cache_put(none, &k, &d), KVHAL_NO_DEVICE);
    k.op = 250;
    assert_int_equal(kvhal_desc_cache_get(cpu, &k, &d), KVHAL_INVALID_ARGUMENT);
    assert_non_null(strstr(kvhal_last_error(), "key.op"));
    key_of(&k, op_a, 1, 1);
    k.nwords = KVHAL_DESC_KEY_MAX_WORDS + 1;
    assert_int_equal(kvhal_desc_cache_put(cpu, &k, &d), KVHAL_INVALID_ARGUMENT);
    kvhal_desc_cache_stats s;
    assert_int_equal(kvhal_desc_cache_get_stats(cpu, op_a, NULL), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_desc_cache_get_stats(cpu, 777, &s), KVHAL_INVALID_ARGUMENT);
    kvhal_op_kind op;
    assert_int_equal(kvhal_desc_op_register("", NULL, NULL, &op), KVHAL_INVALID_ARGUMENT);
    char longname[100];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(kvhal_desc_op_register(longname, NULL, NULL, &op), KVHAL_INVALID_ARGUMENT);
    assert_int_equal(kvhal_desc_op_register("x", NULL, NULL, NULL), KVHAL_INVALID_ARGUMENT);
}

/* The built-in ops go through the same cache: a repeated tensor_copy is one miss then hits. */
static void test_builtin_op_stats(void **state)
{
    (void)state;
    kvhal_buffer *b;
    OK(kvhal_buffer_create(cpu, 1024, &b));
    kvhal_tensor s, d;
    int64_t sh[2] = {8, 8};
    OK(kvhal_tensor_make(b, 0, KVHAL_F32, 2, sh, NULL, &s));
    OK(kvhal_tensor_make(b, 512, KVHAL_F32, 2, sh, NULL, &d));
    kvhal_desc_cache_stats before = stats(2);
    OK(kvhal_tensor_copy(&d, &s, NULL));
    OK(kvhal_tensor_copy(&d, &s, NULL));
    OK(kvhal_tensor_copy(&d, &s, NULL));
    kvhal_desc_cache_stats after = stats(2);
    assert_int_equal(after.misses - before.misses, 1);
    assert_int_equal(after.hits - before.hits, 2);
    assert_int_equal(after.size, before.size + 1);
    OK(kvhal_desc_cache_clear(cpu));
    assert_int_equal(stats(2).size, 0);
    OK(kvhal_buffer_destroy(b));
}

/* ---- threads ---- */

#define THREADS 8
#define PER_THREAD 200

typedef struct thread_arg {
    int index;
    int failures;
    pthread_barrier_t *barrier;
    kvhal_op_kind registered;
} thread_arg;

static void *worker(void *p)
{
    thread_arg *a = p;
    const int base = 3000 + a->index * PER_THREAD;
    pthread_barrier_wait(a->barrier);
    /* everybody uses the same keys; each thread must only ever see its own descriptors */
    for (int i = 0; i < PER_THREAD; i++) {
        kvhal_desc_key k;
        key_of(&k, op_b, (uint64_t)i, 0);
        void *d = NULL;
        if (kvhal_desc_cache_get(cpu, &k, &d) != KVHAL_NOT_FOUND) a->failures++;
        if (kvhal_desc_cache_put(cpu, &k, fresh(base + i)) != KVHAL_OK) a->failures++;
    }
    /* capacity 50: the first 150 were evicted, on this thread */
    for (int i = 0; i < PER_THREAD; i++) {
        kvhal_desc_key k;
        key_of(&k, op_b, (uint64_t)i, 0);
        void *d = NULL;
        kvhal_status st = kvhal_desc_cache_get(cpu, &k, &d);
        if (i < PER_THREAD - 50) {
            if (st != KVHAL_NOT_FOUND || atomic_load(&pool[base + i].destroyed) != 1) a->failures++;
        } else if (st != KVHAL_OK || d != &pool[base + i]) {
            a->failures++;
        }
    }
    kvhal_desc_cache_stats s;
    if (kvhal_desc_cache_get_stats(cpu, op_b, &s) != KVHAL_OK || s.size != 50 || s.inserts != PER_THREAD ||
        s.evictions != PER_THREAD - 50 || s.hits != 50 || s.misses != PER_THREAD + PER_THREAD - 50)
        a->failures++;
    /* concurrent registration: unique names all succeed with distinct ids; a shared name succeeds once */
    char name[32];
    snprintf(name, sizeof name, "thread.%d", a->index);
    if (kvhal_desc_op_register(name, counting_destroy, NULL, &a->registered) != KVHAL_OK) a->failures++;
    kvhal_op_kind shared;
    if (kvhal_desc_op_register("thread.shared", counting_destroy, NULL, &shared) == KVHAL_OK)
        atomic_fetch_add(&pool[POOL - 1].destroyed, 1); /* used as a win counter */
    return NULL; /* the 50 remaining descriptors are destroyed by the thread's exit */
}

static void test_threads(void **state)
{
    (void)state;
    OK(kvhal_desc_cache_set_capacity(op_b, 50));
    atomic_store(&pool[POOL - 1].destroyed, 0);
    pthread_t th[THREADS];
    thread_arg args[THREADS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg){.index = i, .barrier = &barrier, .registered = -1};
        assert_int_equal(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&barrier);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(args[i].failures, 0);
        for (int j = 0; j < i; j++) assert_int_not_equal(args[i].registered, args[j].registered);
        for (int d = 0; d < PER_THREAD; d++) {
            tdesc *t = &pool[3000 + i * PER_THREAD + d];
            assert_int_equal(atomic_load(&t->destroyed), 1);   /* evicted, or destroyed at thread exit */
            assert_int_equal(atomic_load(&t->wrong_thread), 0); /* always by its own thread */
        }
    }
    assert_int_equal(atomic_load(&pool[POOL - 1].destroyed), 1);
    /* this thread's cache saw none of it */
    assert_int_equal(stats(op_b).size, 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--env-child")) return env_child();
    self_path = argv[0];
    if (kvhal_desc_op_register("test.a", counting_destroy, NULL, &op_a) != KVHAL_OK ||
        kvhal_desc_op_register("test.b", counting_destroy, NULL, &op_b) != KVHAL_OK) {
        fprintf(stderr, "register: %s\n", kvhal_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_env_capacity),
        cmocka_unit_test(test_builtin_kinds_and_default_capacity),
        cmocka_unit_test_setup(test_keys, setup),
        cmocka_unit_test_setup(test_lru_order, setup),
        cmocka_unit_test_setup(test_replace, setup),
        cmocka_unit_test_setup(test_collisions, setup),
        cmocka_unit_test_setup(test_many_evictions, setup),
        cmocka_unit_test_setup(test_capacity, setup),
        cmocka_unit_test_setup(test_bad_args, setup),
        cmocka_unit_test_setup(test_builtin_op_stats, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

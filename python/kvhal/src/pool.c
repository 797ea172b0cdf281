/* pool.c — kvhal.BlockPool: block ids with reference counts (kvhal_block_pool), for engines that keep their own
 * block tables: allocate (all or nothing), share (one more reference), release (one fewer; free at 0). */
#include "bind.h"

typedef struct {
    PyObject_HEAD
    kvhal_block_pool *p;
} pool_object;

static int pool_init(PyObject *op, PyObject *args, PyObject *kw)
{
    pool_object *self = (pool_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    static char *names[] = {"num_blocks", NULL};
    long long n;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L", names, &n)) return -1;
    if (n < 1 || n > INT32_MAX) {
        kvpy_bad_arg(st, "num_blocks: %lld is outside 1..%d", n, INT32_MAX);
        return -1;
    }
    if (self->p) (void)kvhal_block_pool_destroy(self->p);
    self->p = NULL;
    kvhal_status rc = kvhal_block_pool_create((int32_t)n, &self->p);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    return 0;
}

static void pool_dealloc(PyObject *op)
{
    pool_object *self = (pool_object *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->p) (void)kvhal_block_pool_destroy(self->p);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static kvhal_block_pool *live(PyObject *op)
{
    pool_object *self = (pool_object *)op;
    if (!self->p) kvpy_bad_arg(kvpy_state_of(op), "self: the BlockPool was not initialised");
    return self->p;
}

static PyObject *pool_allocate(PyObject *op, PyObject *arg)
{
    kvhal_block_pool *p = live(op);
    if (!p) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "n: expected an int, got %s", Py_TYPE(arg)->tp_name);
    }
    if (n < 0 || n > INT32_MAX) return kvpy_bad_arg(st, "n: %ld blocks is out of range", n);
    kvpy_pages_object *b = (kvpy_pages_object *)kvpy_pages_new(st, NULL, (size_t)n);
    if (!b) return NULL;
    kvhal_status rc = kvhal_block_pool_allocate(p, (int32_t)n, b->v);
    if (rc == KVHAL_OK) return (PyObject *)b;
    Py_DECREF(b);
    return kvpy_raise(st, rc);
}

/* share / release: one block id or an array of them (all checked first: nothing changes on a refusal). */
static PyObject *pool_refs(PyObject *op, PyObject *arg, int share)
{
    kvhal_block_pool *p = live(op);
    if (!p) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    int32_t one;
    kvpy_ids ids = {0};
    const int32_t *v = &one;
    size_t n = 1;
    if (PyLong_Check(arg)) {
        const long x = PyLong_AsLong(arg);
        if (x == -1 && PyErr_Occurred()) return NULL;
        if (x < INT32_MIN || x > INT32_MAX) return kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "blocks: %ld", x);
        one = (int32_t)x;
    } else {
        if (kvpy_ids_get(st, arg, "blocks", &ids) != 0) return NULL;
        v = ids.v;
        n = ids.n;
    }
    const int32_t total = kvhal_block_pool_num_total(p);
    PyObject *ret = NULL;
    size_t i = 0;
    for (; i < n; i++) {
        const int32_t rc_ = v[i] >= 0 && v[i] < total ? kvhal_block_pool_ref_count(p, v[i]) : -1;
        if (rc_ < 0) {
            kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "blocks[%zu]: %d is outside 0..%d", i, (int)v[i], (int)total - 1);
            break;
        }
        if (rc_ == 0) {
            kvpy_bad_arg(st, "blocks[%zu]: block %d is free", i, (int)v[i]);
            break;
        }
    }
    if (i == n) {
        kvhal_status rc = KVHAL_OK;
        for (i = 0; i < n && rc == KVHAL_OK; i++)
            rc = share ? kvhal_block_pool_share(p, v[i]) : kvhal_block_pool_release(p, v[i]);
        if (rc != KVHAL_OK) kvpy_raise(st, rc);
        else ret = Py_NewRef(Py_None);
    }
    kvpy_ids_release(st, &ids);
    return ret;
}

static PyObject *pool_share(PyObject *op, PyObject *arg) { return pool_refs(op, arg, 1); }
static PyObject *pool_release(PyObject *op, PyObject *arg) { return pool_refs(op, arg, 0); }

static PyObject *pool_ref_count(PyObject *op, PyObject *arg)
{
    kvhal_block_pool *p = live(op);
    if (!p) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    const long b = PyLong_AsLong(arg);
    if (b == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "block: expected an int, got %s", Py_TYPE(arg)->tp_name);
    }
    const int32_t total = kvhal_block_pool_num_total(p);
    if (b < 0 || b >= total) return kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "block: %ld is outside 0..%d", b, total - 1);
    return PyLong_FromLong(kvhal_block_pool_ref_count(p, (int32_t)b));
}

static PyObject *pool_check(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_block_pool *p = live(op);
    if (!p) return NULL;
    kvhal_status rc = kvhal_block_pool_check_integrity(p);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *pool_get(PyObject *op, void *which)
{
    kvhal_block_pool *p = live(op);
    if (!p) return NULL;
    return PyLong_FromLong(which ? kvhal_block_pool_num_total(p) : kvhal_block_pool_num_free(p));
}

static PyMethodDef pool_methods[] = {
    {"allocate", pool_allocate, METH_O,
     "allocate($self, n)\n--\n\nn blocks, each with one reference, all or nothing (kvhal.OutOfMemory): kvhal.Pages."},
    {"share", pool_share, METH_O,
     "share($self, blocks)\n--\n\nOne more reference to each block (an int or an integer array); all checked first."},
    {"release", pool_release, METH_O,
     "release($self, blocks)\n--\n\nOne fewer reference to each block (an int or an integer array); a block is free at 0."},
    {"ref_count", pool_ref_count, METH_O, "ref_count($self, block)\n--\n\nThe block's reference count (0: free)."},
    {"check_integrity", pool_check, METH_NOARGS,
     "check_integrity($self)\n--\n\nThe free list against the reference counts, else kvhal.Integrity."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef pool_getset[] = {{"num_free", pool_get, NULL, "free blocks", NULL},
                                    {"num_total", pool_get, NULL, "blocks", (void *)1},
                                    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot pool_slots[] = {
    {Py_tp_doc, "BlockPool(num_blocks)\n--\n\nBlock ids 0..num_blocks-1 with reference counts: allocate, share, "
                "release (shared prefixes and copy-on-write for engines with their own block tables)."},
    {Py_tp_dealloc, KVPY_FN(pool_dealloc)},
    {Py_tp_init, KVPY_FN(pool_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, pool_methods},
    {Py_tp_getset, pool_getset},
    {0, NULL}};

static PyType_Spec pool_spec = {
    .name = "kvhal.BlockPool",
    .basicsize = sizeof(pool_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = pool_slots,
};

int kvpy_pool_add(PyObject *m, kvpy_state *st) { return kvpy_bind_type_add(m, st, KVPY_T_POOL, &pool_spec, NULL); }

/* events.c — KV events as Python records: kvhal.KVEvent, a named tuple (a struct sequence) per event with its kind
 * ('stored', 'removed', 'cleared', 'overflow'), its tier ('device', 'host'), the page's chain hash and its parent's,
 * the page, the page's tokens (stored events) and, for an overflow, how many events were lost. Drained from a
 * manager in order, oldest first (kvhal_cache_manager_events_read). */
#include "bind.h"

static PyStructSequence_Field kvevent_fields[] = {
    {"kind", "'stored', 'removed', 'cleared' or 'overflow'"},
    {"tier", "'device' or 'host'"},
    {"hash", "the page's chain hash (stored, removed; kvhal_kv_page_hash)"},
    {"parent_hash", "its parent page's hash (stored; kv_root_hash(page_size) for a first page)"},
    {"page", "the device page or host page index"},
    {"tokens", "the page's tokens (stored: page_size of them; otherwise empty), a tuple of ints"},
    {"dropped", "overflow: how many events were lost"},
    {NULL, NULL}};

static PyStructSequence_Desc kvevent_desc = {
    "kvhal.KVEvent",
    "KVEvent(kind, tier, hash, parent_hash, page, tokens, dropped)\n--\n\nOne KV event of a TieredCacheManager "
    "made with event_capacity > 0 (TieredCacheManager.events()).",
    kvevent_fields, 7};

static const char *const kinds[] = {"stored", "removed", "cleared", "overflow"};

static PyObject *event_record(kvpy_state *st, const kvhal_kv_event *e, const int32_t *tokens)
{
    PyObject *r = PyStructSequence_New(st->bind_type[KVPY_T_KVEVENT]);
    if (!r) return NULL;
    const int k = (unsigned)e->type < 4 ? (int)e->type : 3;
    const int nt = e->num_tokens > 0 ? e->num_tokens : 0;
    PyObject *tk = PyTuple_New(nt);
    for (int i = 0; tk && i < nt; i++) {
        PyObject *x = PyLong_FromLong(tokens[i]);
        if (!x) Py_CLEAR(tk);
        else PyTuple_SET_ITEM(tk, i, x);
    }
    PyObject *v[7] = {PyUnicode_FromString(kinds[k]), PyUnicode_FromString(e->tier == KVHAL_TIER_HOST ? "host" : "device"),
                      PyLong_FromUnsignedLongLong(e->hash), PyLong_FromUnsignedLongLong(e->parent_hash),
                      PyLong_FromLong(e->page), tk, PyLong_FromUnsignedLongLong(e->dropped)};
    int ok = 1;
    for (int i = 0; i < 7; i++) {
        if (!v[i]) ok = 0;
        PyStructSequence_SetItem(r, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    if (!ok) Py_CLEAR(r);
    return r;
}

PyObject *kvpy_events_drain(kvpy_state *st, kvhal_cache_manager *cm, int32_t page_size, Py_ssize_t max)
{
    enum { CHUNK = 64 };
    kvhal_kv_event ev[CHUNK];
    int32_t *tokens = PyMem_Malloc((size_t)CHUNK * (size_t)page_size * sizeof(int32_t));
    if (!tokens) return PyErr_NoMemory();
    PyObject *list = PyList_New(0);
    while (list && (max < 0 || PyList_GET_SIZE(list) < max)) {
        size_t cap = CHUNK, n = 0;
        if (max >= 0 && (size_t)(max - PyList_GET_SIZE(list)) < cap) cap = (size_t)(max - PyList_GET_SIZE(list));
        kvhal_status rc = kvhal_cache_manager_events_read(cm, ev, tokens, cap, &n);
        if (rc != KVHAL_OK) {
            Py_CLEAR(list);
            kvpy_raise(st, rc);
            break;
        }
        for (size_t i = 0; list && i < n; i++) {
            PyObject *r = event_record(st, &ev[i], tokens + i * (size_t)page_size);
            if (!r || PyList_Append(list, r) != 0) Py_CLEAR(list);
            Py_XDECREF(r);
        }
        if (n < cap) break;
    }
    PyMem_Free(tokens);
    return list;
}

/* kv_page_hash(parent, tokens) and kv_root_hash(page_size): the chain the events' hashes follow. */
static PyObject *kv_root_hash(PyObject *mod, PyObject *arg)
{
    const long ps = PyLong_AsLong(arg);
    if (ps == -1 && PyErr_Occurred()) return NULL;
    if (ps < 1 || ps > INT32_MAX) return kvpy_bad_arg(kvpy_state_of_module(mod), "page_size: %ld must be >= 1", ps);
    return PyLong_FromUnsignedLongLong(kvhal_kv_root_hash((int32_t)ps));
}

static PyObject *kv_page_hash(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    kvpy_state *st = kvpy_state_of_module(mod);
    static const char *const names[] = {"parent", "tokens"};
    PyObject *a[2];
    if (kvpy_parse_fast("kv_page_hash", args, nargs, kwnames, names, 2, 2, a) != 0) return NULL;
    const unsigned long long parent = PyLong_AsUnsignedLongLong(a[0]);
    if (parent == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "parent: expected a hash (an int in 0..2**64-1)");
    }
    kvpy_ids tk;
    if (kvpy_ids_get(st, a[1], "tokens", &tk) != 0) return NULL;
    PyObject *ret;
    if (tk.n < 1 || tk.n > INT32_MAX) ret = kvpy_bad_arg(st, "tokens: a page of 1 or more tokens, got %zu", tk.n);
    else ret = PyLong_FromUnsignedLongLong(kvhal_kv_page_hash(parent, tk.v, (int32_t)tk.n));
    kvpy_ids_release(st, &tk);
    return ret;
}

static PyMethodDef event_functions[] = {
    {"kv_root_hash", kv_root_hash, METH_O,
     "kv_root_hash(page_size)\n--\n\nThe parent hash of a sequence's first page (KV events' parent_hash)."},
    {"kv_page_hash", (PyCFunction)(void (*)(void))kv_page_hash, METH_FASTCALL | METH_KEYWORDS,
     "kv_page_hash(parent, tokens)\n--\n\nThe chain hash of one page of tokens (page_size = len(tokens)) given its "
     "parent's: what KV events carry, the same in every process."},
    {NULL, NULL, 0, NULL}};

int kvpy_events_add(PyObject *m, kvpy_state *st)
{
    PyTypeObject *tp = PyStructSequence_NewType(&kvevent_desc);
    if (!tp) return -1;
    st->bind_type[KVPY_T_KVEVENT] = tp;
    if (PyModule_AddType(m, tp) < 0) return -1;
    return kvpy_bind_functions_add(m, event_functions);
}

/* xfer.c — the transfer agent (kvhal_xfer.h, libkvhal-xfer) as kvhal.xfer's Agent, Peer, Transfer and XferEvent;
 * compiled to nothing where the library is not built (KVPY_HAVE_XFER unset: kvhal.xfer then says so).
 *
 * Lifetimes. The C agent owns its peers and frees every peer and transfer handle when destroyed, so a Peer and a
 * Transfer hold their Agent, and the Agent keeps its live Peers (by C pointer, for events) and its Transfers in
 * flight (until their completion is seen): a cycle the garbage collector breaks (every type here is GC-tracked).
 * Agent.close() destroys the C agent at once; its Peers and Transfers then refuse calls (kvhal.InvalidHandle). The
 * Agent also holds the PagedCache it registered and every CacheManager a receive gives pages back to: both must
 * outlive the C agent.
 *
 * Threads: an agent is single-owner in C. Calls that wait (connect, progress, wait) release the GIL; an agent
 * object refuses a second call while one is running (kvhal.Busy), so two Python threads never enter it at once. */
#include <string.h>

#include "bind.h"
#include "prefix.h"

#ifndef KVPY_HAVE_XFER
int kvpy_xfer_add(PyObject *m, kvpy_state *st)
{
    (void)st;
    return PyModule_AddIntConstant(m, "_have_xfer", 0);
}
#else
#include "kvhal_xfer.h"

typedef struct {
    PyObject_HEAD
    kvhal_xfer_agent *a;
    PyObject *cache;    /* the registered PagedCache, or NULL */
    PyObject *peers;    /* dict: int(C peer) -> Peer */
    PyObject *xfers;    /* dict: int(C transfer) -> Transfer, while in flight */
    PyObject *managers; /* list of CacheManagers receives give pages back to */
    int busy;
} agent_object;

typedef struct {
    PyObject_HEAD
    agent_object *agent;
    kvhal_xfer_peer *p;
} peer_object;

typedef struct {
    PyObject_HEAD
    agent_object *agent;
    kvhal_xfer *x;
    uint64_t request_id;
    int is_receive;
    PyObject *held; /* a stream's layer events (kvhal.Event), alive until the transfer is released; or NULL */
} xfer_object;

/* ---- the configuration: the one place mapping Agent's arguments to kvhal_xfer_config ---- */
typedef struct {
    kvhal_xfer_config cfg;
    PyObject *keep[3]; /* the strings the config points into, alive until create returns */
} agent_config;

static int config_string(kvpy_state *st, PyObject *o, const char *arg, int required, const char **out,
                         PyObject **keep)
{
    *out = NULL;
    if (!o || o == Py_None) {
        if (required) kvpy_bad_arg(st, "%s: required (a str)", arg);
        return required ? -1 : 0;
    }
    if (!PyUnicode_Check(o)) {
        kvpy_bad_arg(st, "%s: expected a str, got %s", arg, Py_TYPE(o)->tp_name);
        return -1;
    }
    *keep = Py_NewRef(o);
    *out = PyUnicode_AsUTF8(o);
    return *out ? 0 : -1;
}

static int config_from_args(kvpy_state *st, PyObject *args, PyObject *kw, agent_config *c)
{
    static char *names[] = {"token", "name", "timeout_ms", "transports", "max_peers", NULL};
    PyObject *token = NULL, *name = NULL, *transports = NULL;
    long long timeout_ms = 0, max_peers = 0;
    memset(c, 0, sizeof *c);
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OLOL", names, &token, &name, &timeout_ms, &transports, &max_peers))
        return -1;
    if (config_string(st, token, "token", 1, &c->cfg.token, &c->keep[0]) != 0 ||
        config_string(st, name, "name", 0, &c->cfg.name, &c->keep[1]) != 0 ||
        config_string(st, transports, "transports", 0, &c->cfg.transports, &c->keep[2]) != 0)
        return -1;
    if (timeout_ms < 0 || timeout_ms > UINT32_MAX) {
        kvpy_bad_arg(st, "timeout_ms: %lld is outside 0..%u", timeout_ms, UINT32_MAX);
        return -1;
    }
    if (max_peers < 0 || max_peers > INT32_MAX) {
        kvpy_bad_arg(st, "max_peers: %lld is out of range", max_peers);
        return -1;
    }
    c->cfg.timeout_ms = (uint32_t)timeout_ms;
    c->cfg.max_peers = (int32_t)max_peers;
    return 0;
}

static void config_release(agent_config *c)
{
    for (int i = 0; i < 3; i++) Py_CLEAR(c->keep[i]);
}

/* ---- the agent ---- */
static kvhal_xfer_agent *agent_enter(agent_object *self)
{
    kvpy_state *st = kvpy_state_of((PyObject *)self);
    if (!self->a) {
        kvpy_raise_msg(st, KVHAL_INVALID_HANDLE, "agent: closed");
        return NULL;
    }
    if (self->busy) {
        kvpy_raise_msg(st, KVHAL_BUSY, "agent: another thread is in a call on this agent");
        return NULL;
    }
    return self->a;
}

static int agent_traverse(PyObject *op, visitproc visit, void *arg)
{
    agent_object *self = (agent_object *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->cache);
    Py_VISIT(self->peers);
    Py_VISIT(self->xfers);
    Py_VISIT(self->managers);
    return 0;
}

/* Destroys the C agent (its peers and transfer handles with it) and drops what it held. */
static void agent_destroy(agent_object *self)
{
    if (self->a) {
        kvhal_xfer_agent *a = self->a;
        self->a = NULL;
        Py_BEGIN_ALLOW_THREADS
        (void)kvhal_xfer_agent_destroy(a);
        Py_END_ALLOW_THREADS
    }
    /* the handles went with the agent: the objects that named them refuse calls from now on */
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (self->peers && PyDict_Next(self->peers, &pos, &k, &v)) ((peer_object *)v)->p = NULL;
    pos = 0;
    while (self->xfers && PyDict_Next(self->xfers, &pos, &k, &v)) ((xfer_object *)v)->x = NULL;
}

static int agent_clear(PyObject *op)
{
    agent_object *self = (agent_object *)op;
    agent_destroy(self);
    Py_CLEAR(self->peers);
    Py_CLEAR(self->xfers);
    Py_CLEAR(self->managers);
    Py_CLEAR(self->cache);
    return 0;
}

static void agent_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    (void)agent_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static int agent_init(PyObject *op, PyObject *args, PyObject *kw)
{
    agent_object *self = (agent_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    if (self->a) {
        kvpy_bad_arg(st, "self: the Agent is already initialised");
        return -1;
    }
    agent_config c;
    if (config_from_args(st, args, kw, &c) != 0) {
        config_release(&c);
        return -1;
    }
    kvhal_status rc;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_xfer_agent_create(&c.cfg, &self->a);
    Py_END_ALLOW_THREADS
    config_release(&c);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
        return -1;
    }
    if (!(self->peers = PyDict_New()) || !(self->xfers = PyDict_New()) || !(self->managers = PyList_New(0)))
        return -1;
    return 0;
}

static PyObject *agent_register(PyObject *op, PyObject *cache)
{
    agent_object *self = (agent_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_xfer_agent *a = agent_enter(self);
    if (!a) return NULL;
    kvhal_paged_cache *pc = kvpy_pcache_of(st, cache, "cache");
    if (!pc) return NULL;
    kvhal_status rc = kvhal_xfer_register_paged_cache(a, pc);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_XSETREF(self->cache, Py_NewRef(cache));
    Py_RETURN_NONE;
}

static PyObject *agent_address(PyObject *op, void *c)
{
    (void)c;
    agent_object *self = (agent_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_xfer_agent *a = agent_enter(self);
    if (!a) return NULL;
    size_t len = 0;
    kvhal_status rc = kvhal_xfer_local_address(a, NULL, 0, &len);
    if (rc != KVHAL_OK && rc != KVHAL_OUT_OF_RANGE) return kvpy_raise(st, rc);
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!b) return NULL;
    rc = kvhal_xfer_local_address(a, PyBytes_AS_STRING(b), len, &len);
    if (rc != KVHAL_OK) {
        Py_DECREF(b);
        return kvpy_raise(st, rc);
    }
    return b;
}

/* The Peer object of a C peer (made and remembered on first sight); a new reference, or NULL with an error. */
static PyObject *peer_of(agent_object *self, kvhal_xfer_peer *p)
{
    if (!p) return Py_NewRef(Py_None);
    kvpy_state *st = kvpy_state_of((PyObject *)self);
    PyObject *key = PyLong_FromVoidPtr(p);
    if (!key) return NULL;
    PyObject *o = PyDict_GetItemWithError(self->peers, key);
    if (o) {
        Py_DECREF(key);
        return Py_NewRef(o);
    }
    peer_object *po = PyErr_Occurred() ? NULL : PyObject_GC_New(peer_object, st->bind_type[KVPY_T_PEER]);
    if (po) {
        po->agent = (agent_object *)Py_NewRef((PyObject *)self);
        po->p = p;
        PyObject_GC_Track(po);
        if (PyDict_SetItem(self->peers, key, (PyObject *)po) != 0) Py_CLEAR(po);
    }
    Py_DECREF(key);
    return (PyObject *)po;
}

static PyObject *agent_connect(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"address", "token"};
    PyObject *a[2];
    if (kvpy_parse_fast("connect", args, nargs, kwnames, names, 2, 2, a) != 0) return NULL;
    agent_object *self = (agent_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_xfer_agent *ag = agent_enter(self);
    if (!ag) return NULL;
    if (!PyUnicode_Check(a[1])) return kvpy_bad_arg(st, "token: expected a str, got %s", Py_TYPE(a[1])->tp_name);
    const char *token = PyUnicode_AsUTF8(a[1]);
    if (!token) return NULL;
    Py_buffer blob;
    if (PyObject_GetBuffer(a[0], &blob, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "address: expected bytes (another Agent's address), got %s", Py_TYPE(a[0])->tp_name);
    }
    kvhal_xfer_peer *p = NULL;
    kvhal_status rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_xfer_connect(ag, blob.buf, (size_t)blob.len, token, &p);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    PyBuffer_Release(&blob);
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    return peer_of(self, p);
}

static PyObject *transfer_new(agent_object *agent, kvhal_xfer *x, uint64_t req, int is_receive)
{
    kvpy_state *st = kvpy_state_of((PyObject *)agent);
    xfer_object *o = PyObject_GC_New(xfer_object, st->bind_type[KVPY_T_XFER]);
    if (!o) {
        (void)kvhal_xfer_release(x);
        return NULL;
    }
    o->agent = (agent_object *)Py_NewRef((PyObject *)agent);
    o->x = x;
    o->request_id = req;
    o->is_receive = is_receive;
    o->held = NULL;
    PyObject_GC_Track(o);
    PyObject *key = PyLong_FromVoidPtr(x);
    if (!key || PyDict_SetItem(agent->xfers, key, (PyObject *)o) != 0) Py_CLEAR(o);
    Py_XDECREF(key);
    return (PyObject *)o;
}

/* A transfer seen complete: the agent lets go of it (the object releases its handle when it goes). */
static void transfer_done(agent_object *agent, kvhal_xfer *x)
{
    PyObject *key = PyLong_FromVoidPtr(x);
    if (!key) {
        PyErr_Clear();
        return;
    }
    if (PyDict_DelItem(agent->xfers, key) != 0) PyErr_Clear();
    Py_DECREF(key);
}

static PyStructSequence_Field xev_fields[] = {
    {"kind", "'peer_connected', 'peer_rejected', 'peer_failed', 'grant', 'recv_done', 'send_done', 'offer', "
             "'layer_done' or 'listener_lost' (make a new agent)"},
    {"peer", "the Peer concerned (None for a refused connection)"},
    {"transfer", "recv_done, send_done: the Transfer"},
    {"request_id", "grant, recv_done, send_done, offer: the request"},
    {"status", "recv_done, send_done, peer_failed, peer_rejected: None for success, else the status name"},
    {"num_pages", "grant, offer: the page count; layer_done: the layer that arrived"},
    {"pages", "grant: the receiver's page ids (kvhal.Pages), to send into; else None"},
    {"message", "what happened, for logs"},
    {NULL, NULL}};

static PyStructSequence_Desc xev_desc = {
    "kvhal.xfer.XferEvent",
    "XferEvent(kind, peer, transfer, request_id, status, num_pages, pages, message)\n--\n\nWhat Agent.progress() "
    "reports.",
    xev_fields, 8};

static const char *const xev_kinds[] = {"none",      "peer_connected", "peer_rejected", "peer_failed", "grant",
                                        "recv_done", "send_done",      "offer",         "layer_done",  "listener_lost"};
#define XEV_KINDS ((unsigned)(sizeof xev_kinds / sizeof xev_kinds[0]))

static PyObject *event_object_of(agent_object *self, const kvhal_xfer_event *ev)
{
    kvpy_state *st = kvpy_state_of((PyObject *)self);
    PyObject *r = PyStructSequence_New(st->bind_type[KVPY_T_XFER_EVENT]);
    if (!r) return NULL;
    PyObject *xo = Py_None;
    if (ev->xfer) {
        PyObject *key = PyLong_FromVoidPtr(ev->xfer);
        xo = key ? PyDict_GetItemWithError(self->xfers, key) : NULL;
        Py_XDECREF(key);
        if (!xo) {
            if (PyErr_Occurred()) PyErr_Clear();
            xo = Py_None; /* released already */
        }
    }
    Py_INCREF(xo);
    const int done = ev->type == KVHAL_XFER_EVENT_RECV_DONE || ev->type == KVHAL_XFER_EVENT_SEND_DONE;
    const int with_status = done || ev->type == KVHAL_XFER_EVENT_PEER_FAILED ||
                            ev->type == KVHAL_XFER_EVENT_PEER_REJECTED || ev->type == KVHAL_XFER_EVENT_LISTENER_LOST;
    const unsigned k = (unsigned)ev->type < XEV_KINDS ? (unsigned)ev->type : 0;
    PyObject *v[8] = {
        PyUnicode_FromString(xev_kinds[k]),
        peer_of(self, ev->peer),
        xo,
        PyLong_FromUnsignedLongLong(ev->request_id),
        with_status && ev->status != KVHAL_OK ? PyUnicode_FromString(kvhal_status_name(ev->status)) : Py_NewRef(Py_None),
        PyLong_FromLong(ev->num_pages),
        ev->pages && ev->num_pages > 0 && ev->type != KVHAL_XFER_EVENT_LAYER_DONE ? kvpy_pages_new(st, ev->pages, (size_t)ev->num_pages) : Py_NewRef(Py_None),
        PyUnicode_DecodeUTF8(ev->message, (Py_ssize_t)strnlen(ev->message, sizeof ev->message), "replace"),
    };
    int ok = 1;
    for (int i = 0; i < 8; i++) {
        if (!v[i]) ok = 0;
        PyStructSequence_SetItem(r, i, v[i] ? v[i] : Py_NewRef(Py_None));
    }
    if (done && ev->xfer) transfer_done(self, ev->xfer);
    if (!ok) Py_CLEAR(r);
    return r;
}

static PyObject *agent_progress(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"timeout_ms"};
    PyObject *a[1];
    if (kvpy_parse_fast("progress", args, nargs, kwnames, names, 1, 0, a) != 0) return NULL;
    agent_object *self = (agent_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    kvhal_xfer_agent *ag = agent_enter(self);
    if (!ag) return NULL;
    long long t = 0;
    if (a[0] && a[0] != Py_None) {
        t = PyLong_AsLongLong(a[0]);
        if (t == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return kvpy_bad_arg(st, "timeout_ms: expected an int");
        }
        if (t < 0 || t > UINT32_MAX) return kvpy_bad_arg(st, "timeout_ms: %lld is outside 0..%u", t, UINT32_MAX);
    }
    kvhal_xfer_event ev;
    kvhal_status rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_xfer_progress(ag, (uint32_t)t, &ev);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    if (ev.type == KVHAL_XFER_EVENT_NONE) Py_RETURN_NONE;
    return event_object_of(self, &ev);
}

static PyObject *agent_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    agent_object *self = (agent_object *)op;
    if (self->busy) return kvpy_raise_msg(kvpy_state_of(op), KVHAL_BUSY, "agent: another thread is in a call on it");
    agent_destroy(self);
    PyDict_Clear(self->peers);
    PyDict_Clear(self->xfers);
    Py_RETURN_NONE;
}

static PyObject *agent_enter_ctx(PyObject *op, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(op);
}

static PyObject *agent_exit_ctx(PyObject *op, PyObject *args)
{
    (void)args;
    PyObject *r = agent_close(op, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE; /* exceptions of the block propagate */
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef agent_methods[] = {
    {"register_cache", agent_register, METH_O,
     "register_cache($self, cache)\n--\n\nThe PagedCache whose pages this agent sends and receives (one, before connecting; "
     "kept alive by the agent)."},
    {"connect", FAST(agent_connect),
     "connect($self, address, token)\n--\n\nConnects to the agent whose address (bytes) is given, presenting token; waits "
     "(the GIL released) until it accepts (a Peer) or refuses (kvhal.PeerFailed, kvhal.Timeout). The other agent "
     "must be progressed until this returns (another thread or process): it answers from its progress."},
    {"progress", FAST(agent_progress),
     "progress($self, timeout_ms=0)\n--\n\nProgresses the agent and returns the next XferEvent, or None when none came "
     "within timeout_ms (the GIL released while waiting)."},
    {"close", agent_close, METH_NOARGS,
     "close($self)\n--\n\nDestroys the agent now: its peers close, transfers in flight fail (granted pages go back to "
     "their cache manager); its Peer and Transfer objects refuse calls from then on."},
    {"__enter__", agent_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", agent_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyObject *agent_get_cache(PyObject *op, void *c)
{
    (void)c;
    PyObject *cache = ((agent_object *)op)->cache;
    return Py_NewRef(cache ? cache : Py_None);
}

static PyObject *agent_get_closed(PyObject *op, void *c)
{
    (void)c;
    return PyBool_FromLong(((agent_object *)op)->a == NULL);
}

static PyGetSetDef agent_getset[] = {
    {"address", agent_address, NULL, "this agent's address (bytes), to hand to peers out of band", NULL},
    {"cache", agent_get_cache, NULL, "the registered PagedCache, or None", NULL},
    {"closed", agent_get_closed, NULL, "whether close() ran", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot agent_slots[] = {
    {Py_tp_doc, "Agent(token, name=None, timeout_ms=0, transports=None, max_peers=0)\n--\n\nA transfer agent (one "
                "UCX worker, one registered PagedCache, its peers and transfers). token: what a connecting peer "
                "must present; timeout_ms: connect, stalled transfer and silent-peer limit (0: 10 s); transports: "
                "UCX transports ('tcp', 'shm', 'posix,cma'; None: UCX's choice); max_peers: 0 = 64."},
    {Py_tp_dealloc, KVPY_FN(agent_dealloc)},
    {Py_tp_traverse, KVPY_FN(agent_traverse)},
    {Py_tp_clear, KVPY_FN(agent_clear)},
    {Py_tp_init, KVPY_FN(agent_init)},
    {Py_tp_new, KVPY_FN(PyType_GenericNew)},
    {Py_tp_methods, agent_methods},
    {Py_tp_getset, agent_getset},
    {0, NULL}};

static PyType_Spec agent_spec = {
    .name = "kvhal.xfer.Agent",
    .basicsize = sizeof(agent_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = agent_slots,
};

/* ---- peers ---- */
static int peer_traverse(PyObject *op, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(op));
    Py_VISIT((PyObject *)((peer_object *)op)->agent);
    return 0;
}

static int peer_clear(PyObject *op)
{
    Py_CLEAR(((peer_object *)op)->agent);
    return 0;
}

static void peer_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    (void)peer_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

/* The live C peer, its agent entered; NULL with kvhal.InvalidHandle or kvhal.Busy set. */
static kvhal_xfer_peer *peer_enter(PyObject *op)
{
    peer_object *self = (peer_object *)op;
    if (!self->agent || !agent_enter(self->agent)) return NULL;
    if (!self->p) kvpy_raise_msg(kvpy_state_of(op), KVHAL_INVALID_HANDLE, "peer: disconnected");
    return self->p;
}

static int parse_request(kvpy_state *st, PyObject *o, uint64_t *out)
{
    const unsigned long long v = PyLong_Check(o) ? PyLong_AsUnsignedLongLong(o) : (unsigned long long)-1;
    if ((v == (unsigned long long)-1 && PyErr_Occurred()) || !PyLong_Check(o)) {
        PyErr_Clear();
        kvpy_bad_arg(st, "request_id: expected an int in 0..2**64-1");
        return -1;
    }
    *out = v;
    return 0;
}

/* first_layer and num_layers (None: the rest of the cache's layers). */
static int parse_layers(kvpy_state *st, agent_object *agent, PyObject *first, PyObject *num, int32_t *f, int32_t *n)
{
    long long fv = 0, nv = -1;
    if (first && first != Py_None && ((fv = PyLong_AsLongLong(first)) == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        kvpy_bad_arg(st, "first_layer: expected an int");
        return -1;
    }
    if (num && num != Py_None && ((nv = PyLong_AsLongLong(num)) == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        kvpy_bad_arg(st, "num_layers: expected an int");
        return -1;
    }
    const int32_t layers = agent->cache ? ((kvpy_pcache_object *)agent->cache)->cfg.num_layers : 0;
    if (nv < 0 && (!num || num == Py_None)) nv = layers - fv;
    if (fv < INT32_MIN || fv > INT32_MAX || nv < INT32_MIN || nv > INT32_MAX) {
        kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "first_layer, num_layers: %lld, %lld", fv, nv);
        return -1;
    }
    *f = (int32_t)fv;
    *n = (int32_t)nv;
    return 0;
}

static PyObject *peer_receive(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int layers)
{
    static const char *const names[] = {"request_id", "pages", "manager"};
    PyObject *a[3];
    if (kvpy_parse_fast(layers ? "post_receive_layers" : "post_receive", args, nargs, kwnames, names, 3, 2, a) != 0)
        return NULL;
    kvhal_xfer_peer *p = peer_enter(op);
    if (!p) return NULL;
    agent_object *agent = ((peer_object *)op)->agent;
    kvpy_state *st = kvpy_state_of(op);
    uint64_t req;
    if (parse_request(st, a[0], &req) != 0) return NULL;
    kvhal_cache_manager *cm = NULL;
    if (a[2] && a[2] != Py_None) {
        if (!PyObject_TypeCheck(a[2], st->manager_type))
            return kvpy_bad_arg(st, "manager: expected a kvhal.CacheManager or None, got %s", Py_TYPE(a[2])->tp_name);
        cm = ((kvpy_manager_object *)a[2])->cm;
        if (!cm) return kvpy_bad_arg(st, "manager: the CacheManager was not initialised");
    }
    kvpy_ids pg;
    if (kvpy_ids_get(st, a[1], "pages", &pg) != 0) return NULL;
    PyObject *ret = NULL;
    kvhal_xfer *x = NULL;
    kvhal_status rc = pg.n > INT32_MAX ? kvhal_error_set(KVHAL_OUT_OF_RANGE, "pages: %zu pages", pg.n)
                      : layers         ? kvhal_xfer_post_receive_layers(p, req, pg.v, (int32_t)pg.n, cm, &x)
                                       : kvhal_xfer_post_receive(p, req, pg.v, (int32_t)pg.n, cm, &x);
    if (rc != KVHAL_OK) {
        kvpy_raise(st, rc);
    } else {
        /* the agent keeps the manager its pages go back to (the C agent gives them back until it is destroyed) */
        int kept = cm ? PySequence_Contains(agent->managers, a[2]) : 1;
        if (kept == 0) kept = PyList_Append(agent->managers, a[2]) == 0 ? 1 : -1;
        if (kept < 0) (void)kvhal_xfer_release(x); /* not kept: the receive is canceled */
        else ret = transfer_new(agent, x, req, 1);
    }
    kvpy_ids_release(st, &pg);
    return ret;
}

static PyObject *peer_post_receive(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return peer_receive(op, args, nargs, kwnames, 0);
}

static PyObject *peer_post_receive_layers(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return peer_receive(op, args, nargs, kwnames, 1);
}

/* src_pages and dst_pages of a send or a stream: the same count. 0, or -1 with an exception set (nothing held). */
static int take_src_dst(kvpy_state *st, PyObject *src_o, PyObject *dst_o, kvpy_ids *src, kvpy_ids *dst)
{
    if (kvpy_ids_get(st, src_o, "src_pages", src) != 0) return -1;
    if (kvpy_ids_get(st, dst_o, "dst_pages", dst) != 0) {
        kvpy_ids_release(st, src);
        return -1;
    }
    if (dst->n != src->n) {
        kvpy_bad_arg(st, "dst_pages: %zu pages for %zu src_pages", dst->n, src->n);
        kvpy_ids_release(st, src);
        kvpy_ids_release(st, dst);
        return -1;
    }
    return 0;
}

/* stream_open(request_id, src_pages, dst_pages): a stream of the request's layers into the peer's granted pages */
static PyObject *peer_stream_open(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"request_id", "src_pages", "dst_pages"};
    PyObject *a[3];
    if (kvpy_parse_fast("stream_open", args, nargs, kwnames, names, 3, 3, a) != 0) return NULL;
    kvhal_xfer_peer *p = peer_enter(op);
    if (!p) return NULL;
    agent_object *agent = ((peer_object *)op)->agent;
    kvpy_state *st = kvpy_state_of(op);
    uint64_t req;
    if (parse_request(st, a[0], &req) != 0) return NULL;
    kvpy_ids src, dst;
    if (take_src_dst(st, a[1], a[2], &src, &dst) != 0) return NULL;
    PyObject *ret = NULL;
    kvhal_xfer *x = NULL;
    kvhal_status rc = src.n > INT32_MAX ? kvhal_error_set(KVHAL_OUT_OF_RANGE, "src_pages: %zu pages", src.n)
                                        : kvhal_xfer_stream_open(p, req, src.v, dst.v, (int32_t)src.n, &x);
    if (rc != KVHAL_OK) kvpy_raise(st, rc);
    else ret = transfer_new(agent, x, req, 0);
    kvpy_ids_release(st, &src);
    kvpy_ids_release(st, &dst);
    return ret;
}

static PyObject *peer_send(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int offer)
{
    static const char *const snames[] = {"request_id", "src_pages", "dst_pages", "first_layer", "num_layers"};
    static const char *const onames[] = {"request_id", "src_pages", "first_layer", "num_layers"};
    PyObject *a[5] = {NULL};
    if (offer ? kvpy_parse_fast("offer_pages", args, nargs, kwnames, onames, 4, 2, a)
              : kvpy_parse_fast("send_pages", args, nargs, kwnames, snames, 5, 3, a))
        return NULL;
    if (offer) { /* the same slots as send_pages: no dst_pages */
        a[4] = a[3];
        a[3] = a[2];
        a[2] = NULL;
    }
    kvhal_xfer_peer *p = peer_enter(op);
    if (!p) return NULL;
    agent_object *agent = ((peer_object *)op)->agent;
    kvpy_state *st = kvpy_state_of(op);
    uint64_t req;
    int32_t first, num;
    if (parse_request(st, a[0], &req) != 0 || parse_layers(st, agent, a[3], a[4], &first, &num) != 0) return NULL;
    kvpy_ids src, dst = {0};
    if (offer ? kvpy_ids_get(st, a[1], "src_pages", &src) : take_src_dst(st, a[1], a[2], &src, &dst)) return NULL;
    PyObject *ret = NULL;
    kvhal_xfer *x = NULL;
    kvhal_status rc;
    if (src.n > INT32_MAX) rc = kvhal_error_set(KVHAL_OUT_OF_RANGE, "src_pages: %zu pages", src.n);
    else if (offer) {
        agent->busy = 1; /* the IPC path synchronizes the cache's device */
        Py_BEGIN_ALLOW_THREADS
        rc = kvhal_xfer_offer_pages(p, req, src.v, (int32_t)src.n, first, num, &x);
        Py_END_ALLOW_THREADS
        agent->busy = 0;
    } else {
        agent->busy = 1;
        Py_BEGIN_ALLOW_THREADS
        rc = kvhal_xfer_send_pages(p, req, src.v, dst.v, (int32_t)src.n, first, num, &x);
        Py_END_ALLOW_THREADS
        agent->busy = 0;
    }
    if (rc != KVHAL_OK) kvpy_raise(st, rc);
    else ret = transfer_new(agent, x, req, 0);
    kvpy_ids_release(st, &src);
    kvpy_ids_release(st, &dst);
    return ret;
}

static PyObject *peer_send_pages(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return peer_send(op, args, nargs, kwnames, 0);
}

static PyObject *peer_offer_pages(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return peer_send(op, args, nargs, kwnames, 1);
}

static PyObject *peer_disconnect(PyObject *op, PyObject *unused)
{
    (void)unused;
    peer_object *self = (peer_object *)op;
    if (!self->p) Py_RETURN_NONE; /* disconnected already, or its agent closed */
    kvhal_xfer_peer *p = peer_enter(op);
    if (!p) return NULL;
    (void)kvhal_xfer_disconnect(p);
    self->p = NULL;
    PyObject *key = PyLong_FromVoidPtr(p);
    if (!key || PyDict_DelItem(self->agent->peers, key) != 0) PyErr_Clear();
    Py_XDECREF(key);
    Py_RETURN_NONE;
}

static PyObject *peer_get(PyObject *op, void *which)
{
    kvhal_xfer_peer *p = peer_enter(op);
    if (!p) return NULL;
    return PyUnicode_FromString(which ? kvhal_xfer_peer_ipc(p) : kvhal_xfer_peer_name(p));
}

static PyMethodDef peer_methods[] = {
    {"post_receive", FAST(peer_post_receive),
     "post_receive($self, request_id, pages, manager=None)\n--\n\nReceiver: grants pages (ids of the registered cache) for "
     "a request (the sender gets a 'grant' event), or takes the pages the peer offered for it. On failure, timeout "
     "or cancel the pages go back to manager (a CacheManager) when given. Returns a Transfer."},
    {"post_receive_layers", FAST(peer_post_receive_layers),
     "post_receive_layers($self, request_id, pages, manager=None)\n--\n\nReceiver: post_receive, and a 'layer_done' "
     "event (num_pages: the layer) as each layer of the request's pages lands, before 'recv_done': decode may start "
     "on the first layers while the sender still streams the last ones. Returns a Transfer."},
    {"stream_open", FAST(peer_stream_open),
     "stream_open($self, request_id, src_pages, dst_pages)\n--\n\nSender: opens a stream of the request's layers from "
     "src_pages into the peer's dst_pages (its grant); nothing moves until Transfer.stream_layer hands a layer. The "
     "Transfer completes ('send_done') once every layer was handed and acknowledged."},
    {"send_pages", FAST(peer_send_pages),
     "send_pages($self, request_id, src_pages, dst_pages, first_layer=0, num_layers=None)\n--\n\nSender: sends K and V of "
     "layers [first_layer, first_layer + num_layers) (None: the rest) of src_pages into the peer's dst_pages (from "
     "its grant). The source pages must not change until the Transfer completes. Returns a Transfer."},
    {"offer_pages", FAST(peer_offer_pages),
     "offer_pages($self, request_id, src_pages, first_layer=0, num_layers=None)\n--\n\nSender on one host (IPC, CMA paths): "
     "offers the pages before any grant; the receiver's post_receive takes them (page i into its page i). Returns a "
     "Transfer."},
    {"disconnect", peer_disconnect, METH_NOARGS,
     "disconnect($self)\n--\n\nCloses the connection; its transfers in flight fail with kvhal.Canceled."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef peer_getset[] = {{"name", peer_get, NULL, "the peer agent's name", NULL},
                                    {"ipc", peer_get, NULL,
                                     "the connection's IPC state as this side's sends see it ('ipc', 'cma', "
                                     "'offered', 'other host', ...)",
                                     (void *)1},
                                    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot peer_slots[] = {
    {Py_tp_doc, "A connection to another agent (from Agent.connect or a 'peer_connected' event)."},
    {Py_tp_dealloc, KVPY_FN(peer_dealloc)},
    {Py_tp_traverse, KVPY_FN(peer_traverse)},
    {Py_tp_clear, KVPY_FN(peer_clear)},
    {Py_tp_methods, peer_methods},
    {Py_tp_getset, peer_getset},
    {0, NULL}};

static PyType_Spec peer_spec = {
    .name = "kvhal.xfer.Peer",
    .basicsize = sizeof(peer_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = peer_slots,
};

/* ---- transfers ---- */
static int xfer_traverse(PyObject *op, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(op));
    Py_VISIT((PyObject *)((xfer_object *)op)->agent);
    Py_VISIT(((xfer_object *)op)->held);
    return 0;
}

static int xfer_clear(PyObject *op)
{
    xfer_object *self = (xfer_object *)op;
    if (self->x && self->agent && self->agent->a) (void)kvhal_xfer_release(self->x);
    self->x = NULL;
    Py_CLEAR(self->held); /* after the release: the C stream no longer reads the events */
    Py_CLEAR(self->agent);
    return 0;
}

static void xfer_dealloc(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    (void)xfer_clear(op);
    tp->tp_free(op);
    Py_DECREF(tp);
}

static kvhal_xfer *xfer_enter(PyObject *op)
{
    xfer_object *self = (xfer_object *)op;
    if (!self->agent || !agent_enter(self->agent)) return NULL;
    if (!self->x) kvpy_raise_msg(kvpy_state_of(op), KVHAL_INVALID_HANDLE, "transfer: released");
    return self->x;
}

/* test / wait: True when complete, False while in flight; a failure raises its status. */
static PyObject *xfer_result(PyObject *op, kvhal_status rc)
{
    xfer_object *self = (xfer_object *)op;
    if (rc == KVHAL_BUSY) {
        kvhal_clear_error();
        Py_RETURN_FALSE;
    }
    transfer_done(self->agent, self->x);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_TRUE;
}

static PyObject *xfer_test(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_xfer *x = xfer_enter(op);
    if (!x) return NULL;
    return xfer_result(op, kvhal_xfer_test(x));
}

static PyObject *xfer_wait(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"timeout_ms"};
    PyObject *a[1];
    if (kvpy_parse_fast("wait", args, nargs, kwnames, names, 1, 1, a) != 0) return NULL;
    kvhal_xfer *x = xfer_enter(op);
    if (!x) return NULL;
    kvpy_state *st = kvpy_state_of(op);
    const long long t = PyLong_AsLongLong(a[0]);
    if (t == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "timeout_ms: expected an int");
    }
    if (t < 0 || t > UINT32_MAX) return kvpy_bad_arg(st, "timeout_ms: %lld is outside 0..%u", t, UINT32_MAX);
    agent_object *agent = ((xfer_object *)op)->agent;
    kvhal_status rc;
    agent->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_xfer_wait(x, (uint32_t)t);
    Py_END_ALLOW_THREADS
    agent->busy = 0;
    return xfer_result(op, rc);
}

static PyObject *xfer_cancel(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_xfer *x = xfer_enter(op);
    if (!x) return NULL;
    kvhal_status rc = kvhal_xfer_cancel(x);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    Py_RETURN_NONE;
}

static PyObject *xfer_release(PyObject *op, PyObject *unused)
{
    (void)unused;
    xfer_object *self = (xfer_object *)op;
    if (!self->x) Py_RETURN_NONE;
    kvhal_xfer *x = xfer_enter(op);
    if (!x) return NULL;
    transfer_done(self->agent, x);
    (void)kvhal_xfer_release(x);
    self->x = NULL;
    Py_RETURN_NONE;
}

/* stream_layer(layer, written=None): layer `layer` of the stream's source pages goes once `written` completed */
static PyObject *xfer_stream_layer(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"layer", "written"};
    PyObject *a[2];
    if (kvpy_parse_fast("stream_layer", args, nargs, kwnames, names, 2, 1, a) != 0) return NULL;
    kvhal_xfer *x = xfer_enter(op);
    if (!x) return NULL;
    xfer_object *self = (xfer_object *)op;
    kvpy_state *st = kvpy_state_of(op);
    const long long layer = PyLong_AsLongLong(a[0]);
    if (layer == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return kvpy_bad_arg(st, "layer: expected an int");
    }
    if (layer < 0 || layer > INT32_MAX) return kvpy_raise_msg(st, KVHAL_OUT_OF_RANGE, "layer: %lld", layer);
    kvhal_event *ev = NULL;
    if (a[1] && a[1] != Py_None) {
        ev = kvpy_event_arg(st, a[1], "written");
        if (!ev) return NULL;
        /* the C stream borrows the event until it completes: the transfer object keeps it */
        if (!self->held && !(self->held = PyList_New(0))) return NULL;
        if (PyList_Append(self->held, a[1]) != 0) return NULL;
    }
    kvhal_status rc;
    self->agent->busy = 1; /* without an event, a device cache's device is synchronized */
    Py_BEGIN_ALLOW_THREADS
    rc = kvhal_xfer_stream_layer(x, (int32_t)layer, ev);
    Py_END_ALLOW_THREADS
    self->agent->busy = 0;
    if (rc != KVHAL_OK) return kvpy_raise(st, rc);
    Py_RETURN_NONE;
}

static PyObject *xfer_info(PyObject *op, PyObject *unused)
{
    (void)unused;
    kvhal_xfer *x = xfer_enter(op);
    if (!x) return NULL;
    kvhal_xfer_info in;
    kvhal_status rc = kvhal_xfer_get_info(x, &in);
    if (rc != KVHAL_OK) return kvpy_raise(kvpy_state_of(op), rc);
    return Py_BuildValue("{s:K,s:K,s:K,s:s,s:O,s:s}", "request_id", (unsigned long long)in.request_id,
                         "bytes_total", (unsigned long long)in.bytes_total, "bytes_done",
                         (unsigned long long)in.bytes_done, "status", kvhal_status_name(in.status), "is_receive",
                         in.is_receive ? Py_True : Py_False, "path", kvhal_xfer_path(x));
}

static PyObject *xfer_get(PyObject *op, void *which)
{
    xfer_object *self = (xfer_object *)op;
    if (which) return PyBool_FromLong(self->is_receive);
    return PyLong_FromUnsignedLongLong(self->request_id);
}

static PyMethodDef xfer_methods[] = {
    {"test", xfer_test, METH_NOARGS,
     "test($self)\n--\n\nTrue when complete, False while in flight (progresses the agent once); a failed transfer raises "
     "its status (kvhal.PeerFailed, kvhal.Timeout, kvhal.Canceled, ...)."},
    {"wait", FAST(xfer_wait),
     "wait($self, timeout_ms)\n--\n\nWaits at most timeout_ms (the GIL released): True when complete, False when still in "
     "flight; a failure raises. Events arriving meanwhile stay queued for progress()."},
    {"cancel", xfer_cancel, METH_NOARGS,
     "cancel($self)\n--\n\nCancels it; it then completes with kvhal.Canceled (wait before reusing source pages)."},
    {"release", xfer_release, METH_NOARGS,
     "release($self)\n--\n\nReleases the handle now (cancelling it when in flight); the object refuses calls after."},
    {"stream_layer", FAST(xfer_stream_layer),
     "stream_layer($self, layer, written=None)\n--\n\nA stream from Peer.stream_open: layer `layer` of its source pages "
     "is written once `written` (a kvhal.Event recorded after the layer's writes) has completed, and goes to the peer "
     "then (the agent polls the event from its progress); without an event it goes now. Each layer once, any order; "
     "the event is kept until the transfer is released."},
    {"info", xfer_info, METH_NOARGS,
     "info($self)\n--\n\n{request_id, bytes_total, bytes_done, status, is_receive, path} (path: 'ipc', 'cma', 'staged', "
     "'host', or '' before any frame)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef xfer_getset[] = {{"request_id", xfer_get, NULL, "the request it carries", NULL},
                                    {"is_receive", xfer_get, NULL, "True on the receiving side", (void *)1},
                                    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot xfer_slots[] = {
    {Py_tp_doc, "One transfer: pages being sent, or pages granted and being received (Peer.post_receive, "
                "send_pages, offer_pages). Released when the object goes (cancelled first if still in flight)."},
    {Py_tp_dealloc, KVPY_FN(xfer_dealloc)},
    {Py_tp_traverse, KVPY_FN(xfer_traverse)},
    {Py_tp_clear, KVPY_FN(xfer_clear)},
    {Py_tp_methods, xfer_methods},
    {Py_tp_getset, xfer_getset},
    {0, NULL}};

static PyType_Spec xfer_spec = {
    .name = "kvhal.xfer.Transfer",
    .basicsize = sizeof(xfer_object),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = xfer_slots,
};

int kvpy_xfer_add(PyObject *m, kvpy_state *st)
{
    PyTypeObject *ev = PyStructSequence_NewType(&xev_desc);
    if (!ev) return -1;
    st->bind_type[KVPY_T_XFER_EVENT] = ev;
    /* the transfer classes are reached as kvhal.xfer.* (xfer.py), kept here under private names */
    const struct {
        int idx;
        PyType_Spec *spec;
        const char *attr;
    } types[] = {{KVPY_T_AGENT, &agent_spec, "_XferAgent"}, {KVPY_T_PEER, &peer_spec, "_XferPeer"},
                 {KVPY_T_XFER, &xfer_spec, "_XferTransfer"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        PyTypeObject *tp = (PyTypeObject *)PyType_FromModuleAndSpec(m, types[i].spec, NULL);
        if (!tp) return -1;
        st->bind_type[types[i].idx] = tp;
        if (PyModule_AddObjectRef(m, types[i].attr, (PyObject *)tp) < 0) return -1;
    }
    if (PyModule_AddObjectRef(m, "_XferEvent", (PyObject *)ev) < 0) return -1;
    return PyModule_AddIntConstant(m, "_have_xfer", 1);
}
#endif

/* xfer_peer.c — peers: the handshake (HELLO, HELLO_ACK, AUTH: each side proves the token over both nonces, both
 * sessions, names, hosts and geometries, docs/design/transfer-protocol.md; the wire version and geometry checked;
 * then, on one host, our cache offered to the peer with IPC_MAP), the start of a connect, peers attached, and peer
 * failure. The connector is connected on AUTH_OK, the listener's word that the proof checked. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "xfer_internal.h"
#include "xfer_rooms.h"

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status);
static bool peer_link(kvhal_xfer_agent *a, kvhal_xfer_peer *p, peer_state st, uint64_t session);

void peer_fail(kvhal_xfer_peer *p, kvhal_status st, bool tell, const char *fmt, ...)
{
    if (p->state == P_FAILED) return;
    kvhal_xfer_agent *a = p->agent;
    const bool was_connected = p->state == P_CONNECTED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->fail_msg, sizeof p->fail_msg, fmt, ap);
    va_end(ap);
    p->fail_status = st;
    p->state = P_FAILED;
    explicit_bzero(p->token, sizeof p->token);
    a->live_peers--;
    for (kvhal_xfer *x = a->xfers, *nx; x; x = nx) {
        nx = x->next;
        if (x->peer != p) continue;
        if (x->failing && x->offer && x->withdrawn && !x->finished) { /* it waited for the peer's answers */
            snprintf(x->message + strlen(x->message), sizeof x->message - strlen(x->message),
                     " (peer %s failed before it confirmed the withdrawal: %s)", p->name, p->fail_msg);
            xfer_settle(x); /* may free x */
            continue;
        }
        xfer_finish(x, st, "peer %s: %s", p->name, p->fail_msg);
    }
    /* The endpoint is closed from pump (never from a UCX callback): after a BYE when the peer is to be told,
     * otherwise forcibly, which completes every send still on it with an error and releases its buffers. */
    ucp_ep_h ep = p->ep;
    p->ep = NULL;
    if (ep) {
        xw_common bye = {XW_MAGIC, XW_VERSION, XW_BYE, p->their_session};
        const bool say = tell && was_connected && !p->ep_error;
        queue_msg(a, NULL, ep, &bye, say ? sizeof bye : 0, NULL, 0, true);
        if (a->msgs_tail && a->msgs_tail->ep == ep) a->msgs_tail->force = true;
    }
    if (was_connected)
        push_event(a, KVHAL_XFER_EVENT_PEER_FAILED, p, NULL, 0, st, NULL, 0, "peer %s: %s", p->name, p->fail_msg);
}

/* An endpoint closed at once (forced: its error callback, whose argument is about to be freed, is not called). */
static void ep_drop(kvhal_xfer_agent *a, ucp_ep_h ep)
{
    queue_msg(a, NULL, ep, NULL, 0, NULL, 0, true);
    if (a->msgs_tail && a->msgs_tail->ep == ep) a->msgs_tail->force = true;
    flush_msgs(a);
}

static bool same_geometry(const xw_geometry *x, const xw_geometry *y)
{
    return x->num_layers == y->num_layers && x->num_heads == y->num_heads && x->head_dim == y->head_dim &&
           x->block_size == y->block_size && x->dtype == y->dtype && x->layout == y->layout &&
           x->chunk_bytes == y->chunk_bytes;
}

/* Why two geometries differ: the fields that do (theirs/ours), of every field that must match, chunk_bytes
 * included (the differing ones only, so that a reason cut to XW_REASON_LEN still names them). */
static void geometry_reason(char *out, size_t cap, const xw_geometry *t, const xw_geometry *o)
{
    const struct {
        const char *name;
        unsigned long long theirs, ours;
    } f[] = {{"layers", (unsigned long long)t->num_layers, (unsigned long long)o->num_layers},
             {"heads", (unsigned long long)t->num_heads, (unsigned long long)o->num_heads},
             {"dim", (unsigned long long)t->head_dim, (unsigned long long)o->head_dim},
             {"block", (unsigned long long)t->block_size, (unsigned long long)o->block_size},
             {"dtype", (unsigned long long)t->dtype, (unsigned long long)o->dtype},
             {"layout", (unsigned long long)t->layout, (unsigned long long)o->layout},
             {"chunk_bytes", t->chunk_bytes, o->chunk_bytes}};
    size_t n = (size_t)snprintf(out, cap, "cache geometry differs (theirs/ours:");
    for (size_t i = 0; i < sizeof f / sizeof f[0] && n < cap; i++)
        if (f[i].theirs != f[i].ours)
            n += (size_t)snprintf(out + n, cap - n, " %s %llu/%llu", f[i].name, f[i].theirs, f[i].ours);
    if (n < cap) snprintf(out + n, cap - n, ")");
}

kvhal_xfer_peer *find_session(kvhal_xfer_agent *a, uint64_t s)
{
    if (s == 0) return NULL;
    for (kvhal_xfer_peer *p = a->peers; p; p = p->next)
        if (p->my_session == s && p->state != P_FAILED) return p;
    return NULL;
}


void on_hello_ack(kvhal_xfer_agent *a, const void *header, size_t header_length, uint64_t dest,
                  uint16_t version)
{
    xw_hello_ack k;
    kvhal_xfer_peer *p = NULL;
    for (kvhal_xfer_peer *q = a->peers; q; q = q->next)
        if (q->my_session == dest && q->state == P_CONNECTING) p = q;
    if (!p) return; /* not for a connect in progress: ignore */
    if (version != XW_VERSION) { /* its reason (a refusal's) is where ours is, whatever the version */
        char why[XW_REASON_LEN] = "";
        const size_t ro = offsetof(xw_hello_ack, reason);
        if (header_length >= ro + XW_REASON_LEN) {
            memcpy(why, (const uint8_t *)header + ro, XW_REASON_LEN);
            why[XW_REASON_LEN - 1] = '\0';
            printable(why);
        }
        peer_fail(p, KVHAL_PEER_FAILED, false, "speaks wire version %u, this agent %u: not compatible%s%s",
                  (unsigned)version, (unsigned)XW_VERSION, why[0] ? "; it said: " : "", why);
        return;
    }
    if (header_length != sizeof k) {
        peer_fail(p, KVHAL_PEER_FAILED, false, "malformed HELLO_ACK (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    printable(k.reason);
    k.name[sizeof k.name - 1] = '\0';
    k.host[sizeof k.host - 1] = '\0';
    copy_name(p->name, sizeof p->name, k.name);
    if (k.status != 0) {
        explicit_bzero(p->token, sizeof p->token);
        peer_fail(p, KVHAL_PEER_FAILED, false, "refused the connection: %s", k.reason);
        return;
    }
    /* The listener's proof first: before it checks, nothing it said is believed and nothing is sent to it. */
    memcpy(p->tr.nonce_l, k.nonce, XW_NONCE);
    p->tr.session_l = k.src_session;
    memcpy(p->tr.name_l, k.name, XW_NAME_LEN);
    memcpy(p->tr.host_l, k.host, XW_HOST_LEN);
    p->tr.g_l = k.g;
    const bool proven = auth_check(p->token, &p->tr, XW_LABEL_LISTENER, k.proof);
    xw_auth au;
    memset(&au, 0, sizeof au);
    au.c = (xw_common){XW_MAGIC, XW_VERSION, XW_AUTH, k.src_session};
    if (proven) kvhal__xfer_proof(p->token, &p->tr, XW_LABEL_CONNECTOR, au.proof);
    explicit_bzero(p->token, sizeof p->token);
    if (!proven) {
        /* a BYE (it carries nothing of the token) so that an honest listener with another token stops waiting */
        if (k.src_session) {
            xw_common bye = {XW_MAGIC, XW_VERSION, XW_BYE, k.src_session};
            queue_msg(a, NULL, p->ep, &bye, sizeof bye, NULL, 0, false);
        }
        peer_fail(p, KVHAL_PEER_FAILED, false, "did not prove that it holds the token (another token, or not the "
                  "agent the blob names): nothing was sent to it");
        return;
    }
    char why[XW_REASON_LEN + 64];
    if (k.src_session == 0 || k.g.num_blocks < 1 || k.g.num_blocks > INT32_MAX) {
        peer_fail(p, KVHAL_PEER_FAILED, false, "malformed HELLO_ACK (session id 0, or %lld pages)",
                  (long long)k.g.num_blocks);
        return;
    }
    if (!same_geometry(&k.g, &a->g)) {
        geometry_reason(why, sizeof why, &k.g, &a->g);
        xw_common bye = {XW_MAGIC, XW_VERSION, XW_BYE, k.src_session};
        queue_msg(a, NULL, p->ep, &bye, sizeof bye, NULL, 0, false);
        peer_fail(p, KVHAL_PEER_FAILED, false, "%s", why);
        return;
    }
    p->their_session = k.src_session;
    p->g = k.g;
    p->auth_sent = true; /* connected once the listener says it checked our proof (AUTH_OK, on_auth_ok) */
    queue_msg(a, p, p->ep, &au, sizeof au, NULL, 0, false);
    p->same_host = a->host_id[0] && strcmp(k.host, a->host_id) == 0;
}

/* Connector: the listener checked our proof: connected (then, on one host, our cache offered). */
void on_auth_ok(kvhal_xfer_agent *a, kvhal_xfer_peer *p, size_t header_length)
{
    if (header_length != sizeof(xw_common)) {
        peer_fail(p, KVHAL_PEER_FAILED, false, "malformed AUTH_OK (%zu bytes)", header_length);
        return;
    }
    p->state = P_CONNECTED;
    offer_ipc(a, p);
}

/* An endpoint that reports peer failure where the transports can (tcp); shared-memory transports of UCX 1.13 have
 * no peer-failure handling, so there the endpoint goes without it and the agent's timeouts alone detect a dead or
 * stalled peer. */
ucs_status_t ep_create(kvhal_xfer_agent *a, ucp_ep_params_t *prm, ucp_ep_h *ep)
{
    ucs_status_t us = UCS_ERR_UNREACHABLE;
    if (!a->no_peer_errors) us = ucp_ep_create(a->worker, prm, ep);
    if (us == UCS_ERR_UNREACHABLE && (prm->field_mask & UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE)) {
        ucp_ep_params_t q = *prm;
        q.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        us = ucp_ep_create(a->worker, &q, ep);
        if (us == UCS_OK) a->no_peer_errors = true; /* the transports cannot: do not ask (and log) again */
    }
    return us;
}

/* A HELLO (from pump): bounds, geometry; then an endpoint back to the connector and the answer: a refusal with
 * its reason, or the challenge (our nonce and our proof of the token over the transcript). The peer made for it
 * waits in P_AUTH, counted among max_peers, for the connector's proof (on_auth) at most the timeout. */
void accept_hello(kvhal_xfer_agent *a, pending_hello *ph)
{
    xw_hello *h = &ph->h;
    h->name[sizeof h->name - 1] = '\0';
    h->host[sizeof h->host - 1] = '\0';
    char name[XW_NAME_LEN];
    copy_name(name, sizeof name, h->name);
    char reason[XW_REASON_LEN + 64] = "";
    h->tcp_seg[sizeof h->tcp_seg - 1] = '\0';
    printable(h->tcp_seg);
    if (ph->version) {
        /* Another wire version cannot be authenticated: no endpoint to the address it carries and no answer. The
         * connector sees its connect time out; the reason is this side's event. */
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from ? refused without an answer: wire version %u, this agent speaks %u",
                   (unsigned)ph->version, (unsigned)XW_VERSION);
        return;
    }
    if (!a->cache) snprintf(reason, sizeof reason, "no paged cache registered");
    else if (!same_geometry(&h->g, &a->g)) geometry_reason(reason, sizeof reason, &h->g, &a->g);
    else if (h->g.num_blocks < 1 || h->g.num_blocks > INT32_MAX)
        snprintf(reason, sizeof reason, "the connector's cache has %lld pages", (long long)h->g.num_blocks);
    else if (h->tcp_seg[0] && a->tcp_seg[0] && strncmp(h->tcp_seg, a->tcp_seg, XW_SEG_LEN) != 0)
        snprintf(reason, sizeof reason, "UCX TCP receive segments differ (%.15s here, %.15s there; "
                 "UCX_TCP_RX_SEG_SIZE): UCX cannot mix them", a->tcp_seg, h->tcp_seg);
    else if (a->live_peers >= a->max_peers)
        snprintf(reason, sizeof reason, "too many peers (%d, connections being authenticated included)",
                 (int)a->max_peers);
    else if (h->src_session == 0) snprintf(reason, sizeof reason, "session id 0");
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = (const ucp_address_t *)ph->addr};
    kvhal_xfer_peer *p = NULL;
    xw_hello_ack k;
    memset(&k, 0, sizeof k);
    if (!reason[0] && !auth_nonce(k.nonce, sizeof k.nonce)) snprintf(reason, sizeof reason, "no random numbers");
    if (!reason[0] && !(p = calloc(1, sizeof *p))) snprintf(reason, sizeof reason, "out of memory");
    /* the same error handling as every other endpoint (UCX refuses asymmetric ones), also for a refusal's */
    ep_params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = ep_error_cb;
    ep_params.err_handler.arg = p; /* NULL for a refusal: nothing to report */
    ucp_ep_h ep = NULL;
    ucs_status_t us = ep_create(a, &ep_params, &ep);
    if (us != UCS_OK) {
        free(p);
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from %s: cannot reach it back: %s", name, ucs_status_string(us));
        return;
    }
    k.c = (xw_common){XW_MAGIC, XW_VERSION, XW_HELLO_ACK, h->src_session};
    copy_name(k.name, sizeof k.name, a->name);
    k.g = a->g;
    memcpy(k.host, a->host_id, sizeof k.host);
    memcpy(k.tcp_seg, a->tcp_seg, sizeof k.tcp_seg);
    if (reason[0]) {
        k.status = KVHAL_PEER_FAILED;
        copy_name(k.reason, sizeof k.reason, reason);
        queue_msg(a, NULL, ep, &k, sizeof k, NULL, 0, true);
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from %s refused: %s", name, reason);
        return;
    }
    if (!peer_link(a, p, P_AUTH, random_session())) {
        ep_drop(a, ep);
        free(p);
        push_event(a, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
                   "connection from %s refused: out of memory", name);
        return;
    }
    p->ep = ep;
    p->accepted_side = true;
    p->their_session = h->src_session;
    p->g = h->g;
    p->deadline_ns = deadline_from_now(a);
    memcpy(p->name, name, sizeof name);
    k.src_session = p->my_session;
    memcpy(p->tr.nonce_c, h->nonce, XW_NONCE);
    memcpy(p->tr.nonce_l, k.nonce, XW_NONCE);
    p->tr.session_c = h->src_session;
    p->tr.session_l = p->my_session;
    memcpy(p->tr.name_c, h->name, XW_NAME_LEN);
    memcpy(p->tr.name_l, k.name, XW_NAME_LEN);
    memcpy(p->tr.host_c, h->host, XW_HOST_LEN);
    memcpy(p->tr.host_l, k.host, XW_HOST_LEN);
    p->tr.g_c = h->g;
    p->tr.g_l = k.g;
    kvhal__xfer_proof(a->token, &p->tr, XW_LABEL_LISTENER, k.proof);
    queue_msg(a, p, NULL, &k, sizeof k, NULL, 0, false);
}

/* Listener: the connector's AUTH (from the handler, so that the frames it sends right after find the peer
 * connected): its proof checked over the transcript of this connection (our fresh nonce in it). */
void on_auth(kvhal_xfer_agent *a, kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_auth au;
    if (header_length != sizeof au) {
        auth_refuse(p, "malformed AUTH (%zu bytes)", header_length);
        return;
    }
    memcpy(&au, header, sizeof au);
    if (!auth_check(a->token, &p->tr, XW_LABEL_CONNECTOR, au.proof)) {
        auth_refuse(p, "wrong token: its proof does not check");
        return;
    }
    p->state = P_CONNECTED;
    p->same_host = a->host_id[0] && strcmp(p->tr.host_c, a->host_id) == 0;
    xw_common ok = {XW_MAGIC, XW_VERSION, XW_AUTH_OK, p->their_session};
    queue_msg(a, p, NULL, &ok, sizeof ok, NULL, 0, false); /* before anything else to it */
    offer_ipc(a, p);
    push_event(a, KVHAL_XFER_EVENT_PEER_CONNECTED, p, NULL, 0, KVHAL_OK, NULL, 0, "peer %s connected", p->name);
}

/* Listener: a handshake that failed (P_AUTH): the reason is a PEER_REJECTED event, the peer goes (pump frees it). */
void auth_refuse(kvhal_xfer_peer *p, const char *fmt, ...)
{
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    push_event(p->agent, KVHAL_XFER_EVENT_PEER_REJECTED, NULL, NULL, 0, KVHAL_PEER_FAILED, NULL, 0,
               "connection from %s refused: %s", p->name, why);
    p->reap = true;
    peer_fail(p, KVHAL_PEER_FAILED, false, "%s", why);
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    kvhal_xfer_peer *p = arg;
    if (!p) return;
    p->ep_error = true; /* handled in pump */
    p->ep_status = status;
}

/* Keeps a HELLO for pump (accept_hello): hlen bytes of its header (the rest zero), the connector's address (its
 * data), and its wire version when it is not ours (0: ours). Out of memory: dropped, the connector times out. */
void queue_hello(kvhal_xfer_agent *a, const void *header, size_t hlen, const void *data, size_t length,
                 uint16_t version)
{
    pending_hello *ph = calloc(1, sizeof *ph);
    void *addr = malloc(length);
    if (!ph || !addr) {
        free(ph);
        free(addr);
        return;
    }
    memcpy(&ph->h, header, hlen);
    ph->h.addr_len = (uint32_t)length;
    memcpy(addr, data, length);
    ph->version = version;
    ph->addr = addr;
    ph->next = a->hellos;
    a->hellos = ph;
}

/* A new peer, linked into the agent in state st, frames to it naming session; it sends as the agent's DATA path
 * until it imports our cache. False (nothing linked): the live-handle set cannot grow. */
static bool peer_link(kvhal_xfer_agent *a, kvhal_xfer_peer *p, peer_state st, uint64_t session)
{
    p->magic = PEER_MAGIC;
    if (!kvhal__handle_add(p)) return false;
    p->agent = a;
    p->state = st;
    p->my_session = session;
    p->tx_path = a->data_path;
    p->next = a->peers;
    a->peers = p;
    a->live_peers++;
    return true;
}

/* kvhal_xfer_connect's start: the arguments checked, the peer made (connecting) with an endpoint to the blob's
 * address, and its HELLO queued; the caller waits for the answer (pump). */
kvhal_status peer_connect(kvhal_xfer_agent *a, const void *blob, size_t len, const char *token, kvhal_xfer_peer **out)
{
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    CHECK_ARG(blob, "blob: NULL");
    CHECK_ARG(token, "token: NULL");
    CHECK_ARG(strlen(token) <= KVHAL_XFER_TOKEN_MAX, "token: longer than %d characters", KVHAL_XFER_TOKEN_MAX);
    CHECK_ARG(a->cache, "agent: register a paged cache before connecting");
    xw_blob b;
    CHECK_ARG(len > sizeof b, "len: %zu bytes is too short for an address blob", len);
    memcpy(&b, blob, sizeof b);
    CHECK_ARG(b.magic == XW_BLOB_MAGIC, "blob: not a kvhal transfer address");
    CHECK_ARG(b.version == XW_VERSION, "blob: an address of wire version %u, this agent speaks %u: not compatible",
              (unsigned)b.version, (unsigned)XW_VERSION);
    CHECK_ARG(b.addr_len > 0 && b.addr_len <= XW_MAX_ADDR && len == sizeof b + b.addr_len,
              "len: %zu bytes, the blob says %zu", len, sizeof b + (size_t)b.addr_len);
    CHECK_ARG(a->live_peers < a->max_peers, "agent: already %d peers (cfg.max_peers)", (int)a->max_peers);
    kvhal_xfer_peer *p = calloc(1, sizeof *p);
    void *addr = malloc(b.addr_len);
    if (!p || !addr) {
        free(p);
        free(addr);
        return ERR(KVHAL_OUT_OF_MEMORY, "connect: cannot allocate the peer");
    }
    memcpy(addr, (const uint8_t *)blob + sizeof b, b.addr_len);
    b.name[sizeof b.name - 1] = '\0';
    copy_name(p->name, sizeof p->name, b.name);
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                                 .address = addr, .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                                 .err_handler = {ep_error_cb, p}};
    ucs_status_t us = ep_create(a, &ep_params, &p->ep);
    free(addr);
    if (us != UCS_OK) {
        free(p);
        return ERR(KVHAL_PEER_FAILED, "blob: cannot reach %s: %s", b.name, ucs_status_string(us));
    }
    xw_hello h;
    memset(&h, 0, sizeof h);
    const bool nonce = auth_nonce(h.nonce, sizeof h.nonce);
    if (!nonce || !peer_link(a, p, P_CONNECTING, random_session())) {
        ep_drop(a, p->ep);
        free(p);
        return nonce ? ERR(KVHAL_OUT_OF_MEMORY, "connect: cannot record the peer")
                     : ERR(KVHAL_BACKEND_ERROR, "connect: getrandom gave no nonce for the handshake");
    }
    p->deadline_ns = deadline_from_now(a);
    memcpy(p->token, token, strlen(token));
    h.c = (xw_common){XW_MAGIC, XW_VERSION, XW_HELLO, 0};
    h.src_session = p->my_session;
    copy_name(h.name, sizeof h.name, a->name);
    h.g = a->g;
    h.addr_len = (uint32_t)a->addr_len;
    memcpy(h.host, a->host_id, sizeof h.host);
    memcpy(h.tcp_seg, a->tcp_seg, sizeof h.tcp_seg);
    memcpy(p->tr.nonce_c, h.nonce, XW_NONCE);
    p->tr.session_c = h.src_session;
    memcpy(p->tr.name_c, h.name, XW_NAME_LEN);
    memcpy(p->tr.host_c, h.host, XW_HOST_LEN);
    p->tr.g_c = h.g;
    queue_msg(a, p, p->ep, &h, sizeof h, a->addr, a->addr_len, false);
    *out = p;
    return KVHAL_OK;
}

const char *kvhal_xfer_peer_name(const kvhal_xfer_peer *p)
{
    return p && kvhal__handle_live(p, PEER_MAGIC) ? p->name : "";
}

const char *kvhal_xfer_peer_ipc(const kvhal_xfer_peer *p)
{
    if (!p || !kvhal__handle_live(p, PEER_MAGIC)) return "";
    switch (p->ipc_state) {
    case IPC_READY: return p->ipc_kind == XW_IPC_CMA ? "cma" : "ipc";
    case IPC_OFFERED: return "offered";
    case IPC_REFUSED: return p->ipc_reason[0] ? p->ipc_reason : "refused";
    default: return p->same_host ? "same host, no shareable cache" : "other host";
    }
}

kvhal_status kvhal__xfer_attach_peer(kvhal_xfer_agent *a, uint64_t session, const xw_geometry *g,
                                     kvhal_xfer_peer **out)
{
    CHECK_ARG(out, "out: NULL");
    *out = NULL;
    kvhal_status st = check_agent(a);
    if (st != KVHAL_OK) return st;
    CHECK_ARG(g, "g: NULL");
    CHECK_ARG(session && !find_session(a, session), "session: 0 or already a peer's");
    kvhal_xfer_peer *p = calloc(1, sizeof *p);
    if (!p) return ERR(KVHAL_OUT_OF_MEMORY, "attach: cannot allocate the peer");
    if (!peer_link(a, p, P_CONNECTED, session)) {
        free(p);
        return ERR(KVHAL_OUT_OF_MEMORY, "attach: cannot record the peer");
    }
    p->accepted_side = true;
    p->their_session = session;
    p->g = *g;
    copy_name(p->name, sizeof p->name, "attached");
    *out = p;
    return KVHAL_OK;
}

/* Sender: offers our cache's handle to a peer on our host (once per connection). */
void offer_ipc(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
{
    if (!p->same_host || p->ipc_state != IPC_NONE) return;
    /* a shareable cache: its handle; else a host cache, where CMA is among the transports: where to read it */
    const bool cma = !a->ipc_blob_len && a->host && a->cma_ok;
    if (!a->ipc_blob_len && !cma) return;
    xw_cma_blob cb;
    memset(&cb, 0, sizeof cb);
    cb.pid = (uint32_t)getpid();
    cb.base = (uint64_t)(uintptr_t)a->host_base;
    cb.size = a->cache_buf ? kvhal_buffer_size(a->cache_buf) : 0;
    cb.probe_addr = (uint64_t)(uintptr_t)p->cma_probe; /* the receiver's nonce goes there (cma_answer) */
    const void *blob = cma ? (const void *)&cb : (const void *)a->ipc_blob;
    const size_t blob_len = cma ? sizeof cb : a->ipc_blob_len;
    const int32_t L = a->g.num_layers;
    const size_t dlen = blob_len + 2u * (size_t)L * sizeof(uint64_t);
    uint8_t *d = malloc(dlen);
    if (!d) return; /* through UCX then */
    memcpy(d, blob, blob_len);
    uint64_t *off = (uint64_t *)(void *)(d + blob_len);
    for (int32_t l = 0; l < L; l++) {
        const uint64_t ko = a->k_off[l], vo = a->v_off[l];
        memcpy(&off[2 * l], &ko, sizeof ko);
        memcpy(&off[2 * l + 1], &vo, sizeof vo);
    }
    xw_ipc_map m;
    memset(&m, 0, sizeof m);
    m.c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_MAP, p->their_session};
    m.blob_len = (uint32_t)blob_len;
    m.num_layers = L;
    m.block_stride = a->block_stride;
    m.num_blocks = a->g.num_blocks;
    m.kind = cma ? XW_IPC_CMA : XW_IPC_HANDLE;
    queue_msg(a, p, NULL, &m, sizeof m, d, dlen, false);
    free(d);
    p->ipc_state = IPC_OFFERED;
    p->ipc_kind = (int)m.kind;
}

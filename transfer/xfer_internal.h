/* xfer_internal.h — what remote peers send to libkvhal-xfer (as receivers and as senders), without a UCX
 * connection, for the fuzzer (fuzz/fuzz_xfer.c), and the agent's sizes for the tests (tests/xfer/). Private to
 * transfer/, fuzz/ and tests/: not installed, not exported (the library's symbols are hidden; the fuzzer and the
 * tests link the library's object files). Frames given here go through the
 * same handler UCX calls for every active message, so everything a remote peer can send is checked by the code
 * that checks it in production. */
#ifndef KVHAL_XFER_INTERNAL_H
#define KVHAL_XFER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "kvhal_xfer.h"
#include "xfer_wire.h"

/* One frame from a peer, as UCX hands it to the agent's active-message handler (header, then data) and what the
 * handler returns to UCX. rndv: the frame came by rendezvous, data being UCX's descriptor of it; only frames the
 * handler refuses before fetching their data (anything but a well-formed DATA frame for a pending grant) may be
 * passed so, as the handler hands an accepted one's descriptor to UCX. */
ucs_status_t kvhal__xfer_recv_frame(kvhal_xfer_agent *a, const void *header, size_t header_length, void *data,
                                    size_t length, bool rndv);

/* A peer connected to a, as a HELLO with the right token makes one, but without an endpoint: frames whose
 * dest_session is session reach it, and what a sends it is dropped (a frame of a transfer to it counts as sent).
 * g: its cache geometry (num_blocks: its page count). Freed by kvhal_xfer_disconnect (or kvhal_xfer_agent_destroy). */
kvhal_status kvhal__xfer_attach_peer(kvhal_xfer_agent *a, uint64_t session, const xw_geometry *g,
                                     kvhal_xfer_peer **out);

/* The sender's id of x: what the receiver echoes in its ACKs (xw_ack.xfer_id). */
uint64_t kvhal__xfer_id(const kvhal_xfer *x);

/* What a holds for transfers and peers: transfers, peers, frames being received, messages queued or in flight,
 * HELLOs and IPC copies not yet processed, queued events, endpoints closing. 0 once every peer is disconnected,
 * every transfer released and every event taken; anything else is held past its owner's life. */
size_t kvhal__xfer_agent_held(const kvhal_xfer_agent *a);

/* Sizes the library fixes (xfer_types.h), set smaller for an agent so that the tests' small caches take the paths
 * large transfers take: frames split across the copy workers, transfers of several gathered frames, chained launch
 * groups. 0 (cma_piece, gather_frame) or -1 (gather_min, ipc_chain) keeps the agent's; set right after
 * kvhal_xfer_agent_create, before any transfer. */
typedef struct kvhal__xfer_tuning {
    size_t cma_piece;    /* CMA frames are split in pieces of this many bytes at least */
    size_t gather_frame; /* TCP frames carry this many bytes at most (one page at least) */
    int64_t gather_min;  /* TCP frames of this many bytes and more are gathered by the workers */
    int64_t ipc_chain;   /* a launch group of this many bytes at most is chained behind the one running (0: never) */
} kvhal__xfer_tuning;
void kvhal__xfer_tune(kvhal_xfer_agent *a, const kvhal__xfer_tuning *t);

/* A proof of the token over a handshake's transcript with the role's label (XW_LABEL_CONNECTOR or
 * XW_LABEL_LISTENER): HMAC-SHA-256 keyed with the token (xfer_auth.c). The tests' hand-made peer and the fuzzer's
 * seeds prove themselves with it. */
void kvhal__xfer_proof(const char *token, const xw_transcript *t, const char *label, uint8_t out[XW_PROOF]);
/* For the fuzzer, which cannot compute a proof over a nonce it never sees: every connection a waits the
 * connector's proof for (a HELLO's, over an endpoint to itself) is given its valid AUTH, through the same handler. */
void kvhal__xfer_prove_pending(kvhal_xfer_agent *a);
/* For the fuzzer, which cannot see the nonce of an IPC handle's challenge: the nonce the peer of session waits to
 * read back (true), or false when no imported handle of that peer waits for its proof. */
bool kvhal__xfer_ipc_nonce(const kvhal_xfer_agent *a, uint64_t session, uint8_t out[XW_NONCE]);
/* The local ports of the TCP listening sockets a watches (LISTENER_LOST), up to cap; returns how many. */
int kvhal__xfer_listen_ports(const kvhal_xfer_agent *a, uint16_t *ports, int cap);
/* getrandom's bytes (false: none to be had); whether proof is the token's over t with label (constant time) */
bool auth_nonce(uint8_t *out, size_t n);
bool auth_check(const char *token, const xw_transcript *t, const char *label, const uint8_t proof[XW_PROOF]);

#endif

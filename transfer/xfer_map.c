/* xfer_map.c — the IPC map: a peer's IPC_MAP (its cache's handle, or where to read it with process_vm_readv)
 * checked and imported by the receiver, which then copies through the IPC or the CMA path, and its answer
 * (IPC_MAP_ACK) taken by the sender, which then sends through that path. A handle is accepted only after its
 * challenge (xfer_wire.h, XW_IPC_SLOT): the receiver's nonce, written by the sender into its proof area, read back
 * through the imported memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/memops.h>

#include "xfer_internal.h"
#include "xfer_rooms.h"

static void send_map_ack(kvhal_xfer_agent *a, kvhal_xfer_peer *p, kvhal_status st, const char *reason)
{
    xw_ipc_map_ack k;
    memset(&k, 0, sizeof k);
    k.c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_MAP_ACK, p->their_session};
    k.status = (int32_t)st;
    copy_name(k.reason, sizeof k.reason, reason);
    queue_msg(a, p, NULL, &k, sizeof k, NULL, 0, false);
}

/* Receiver (from pump): checks a peer's IPC_MAP, imports its handle on our cache's device, checks that every page
 * of every layer it could name lies inside what was imported, and answers. A handle that cannot be imported is
 * refused (the peer then sends through host memory); a malformed frame drops the peer. */
void process_ipc_map(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
{
    uint8_t *fr = p->map_frame;
    const size_t len = p->map_len;
    p->map_frame = NULL;
    p->map_len = 0;
    xw_ipc_map m;
    memcpy(&m, fr, sizeof m);
    const uint8_t *data = fr + sizeof m;
    const size_t dlen = len - sizeof m;
    const int32_t L = a->g.num_layers;
    char why[XW_REASON_LEN] = "";
    if (p->rx_path || p->ipc_claim) {
        free(fr);
        peer_fail(p, KVHAL_PEER_FAILED, true, "a second IPC_MAP on one connection");
        return;
    }
    if (m.blob_len < 1 || m.blob_len > XW_IPC_BLOB_MAX || m.num_layers != L ||
        (m.kind != XW_IPC_HANDLE && m.kind != XW_IPC_CMA) ||
        (m.kind == XW_IPC_CMA && m.blob_len != sizeof(xw_cma_blob)) ||
        dlen != (size_t)m.blob_len + 2u * (size_t)L * sizeof(uint64_t) || m.num_blocks != p->g.num_blocks ||
        m.block_stride < a->g.chunk_bytes) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "malformed IPC_MAP frame (handle %u bytes, %d layers, %lld pages, "
                  "stride %llu, %zu data bytes)", (unsigned)m.blob_len, (int)m.num_layers, (long long)m.num_blocks,
                  (unsigned long long)m.block_stride, dlen);
        free(fr);
        return;
    }
    uint64_t *off = malloc(2u * (size_t)L * sizeof *off);
    kvhal_buffer *buf = NULL;
    xw_cma_blob cb;
    uint64_t size = 0;
    if (!off) snprintf(why, sizeof why, "out of host memory");
    else memcpy(off, data + m.blob_len, 2u * (size_t)L * sizeof *off);
    if (!why[0] && m.kind == XW_IPC_CMA) {
        memcpy(&cb, data, sizeof cb);
        cma_precheck(a, &cb, why, sizeof why);
        if (!why[0] && !p->cma_challenged) { /* first the challenge: the map waits for its answer */
            if (cma_challenge(a, p, why, sizeof why)) {
                free(off);
                p->cma_claim = fr;
                p->cma_claim_len = len;
                return;
            }
        } else if (!why[0]) {
            cma_readback(a, p, &cb, why, sizeof why);
        }
        size = cb.size;
    } else if (!why[0]) {
        if (kvhal_buffer_ipc_import(kvhal_buffer_device(a->cache_buf), data, m.blob_len, &buf) != KVHAL_OK)
            snprintf(why, sizeof why, "import failed: %s", kvhal_last_error());
        else size = kvhal_buffer_size(buf);
    }
    uint64_t extent = 0; /* the first byte past every page */
    if (!why[0]) { /* the last byte any (page, layer, side) can reach, overflow-checked */
        uint64_t span;
        if (__builtin_mul_overflow((uint64_t)(m.num_blocks - 1), m.block_stride, &span) ||
            __builtin_add_overflow(span, a->g.chunk_bytes, &span))
            snprintf(why, sizeof why, "%lld pages of stride %llu overflow", (long long)m.num_blocks,
                     (unsigned long long)m.block_stride);
        for (int32_t i = 0; i < 2 * L && !why[0]; i++) {
            uint64_t end;
            if (__builtin_add_overflow(off[i], span, &end) || end > size)
                snprintf(why, sizeof why, "layer %d %s: its pages reach past the %llu imported bytes", (int)(i / 2),
                         i % 2 ? "V" : "K", (unsigned long long)size);
            else if (end > extent)
                extent = end;
        }
    }
    if (!why[0] && m.kind == XW_IPC_HANDLE && !auth_nonce(p->ipc_nonce, sizeof p->ipc_nonce))
        snprintf(why, sizeof why, "no random numbers for the handle's challenge");
    free(fr);
    if (why[0]) {
        kvhal_buffer_destroy(buf);
        free(off);
        kvhal_clear_error();
        send_map_ack(a, p, KVHAL_UNSUPPORTED, why);
        return;
    }
    p->ipc_off = off;
    p->ipc_stride = m.block_stride;
    p->ipc_blocks = m.num_blocks;
    if (m.kind == XW_IPC_HANDLE) { /* imported, not yet accepted: first the proof that it is the peer's own */
        p->ipc_claim = buf;
        p->ipc_extent = extent;
        p->ipc_proof_in = false;
        p->ipc_deadline_ns = deadline_from_now(a);
        xw_ipc_challenge ch;
        memset(&ch, 0, sizeof ch);
        ch.c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_CHALLENGE, p->their_session};
        memcpy(ch.nonce, p->ipc_nonce, sizeof ch.nonce);
        queue_msg(a, p, NULL, &ch, sizeof ch, NULL, 0, false);
        return;
    }
    p->cma = true;
    p->cma_pid = cb.pid;
    p->cma_base = cb.base;
    p->rx_path = &xfer_path_cma;
    send_map_ack(a, p, KVHAL_OK, "");
}

/* Receiver: an imported handle waiting for its proof let go (refused, or its peer failed). */
static void ipc_claim_drop(kvhal_xfer_peer *p)
{
    kvhal_buffer_destroy(p->ipc_claim);
    kvhal_clear_error();
    p->ipc_claim = NULL;
    p->ipc_proof_in = false;
    free(p->ipc_off);
    p->ipc_off = NULL;
}

/* Receiver (from the handler): the sender's IPC_PROOF, checked from pump (ipc_proof_check). */
void on_ipc_proof(kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    if (header_length != sizeof(xw_ipc_proof) || !p->ipc_claim || p->ipc_proof_in) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "unexpected or malformed IPC_PROOF (%zu bytes)", header_length);
        return;
    }
    memcpy(&p->ipc_proof, header, sizeof p->ipc_proof);
    p->ipc_proof.reason[sizeof p->ipc_proof.reason - 1] = '\0';
    printable(p->ipc_proof.reason);
    p->ipc_proof_in = true;
}

/* Receiver (from pump): an imported handle waiting for its proof. Accepted (the IPC path, IPC_MAP_ACK OK) only when
 * the peer's IPC_PROOF names a slot past every page and inside the imported size whose bytes, read through the
 * imported mapping, are our nonce; a mismatch fails the peer by name (it named memory that is not its own, or lied
 * about where it wrote); no proof within the timeout, or a sender that says it cannot write one, refuses the map
 * (the peer sends through UCX). Before that not a byte of the imported memory is read but the slot. */
void ipc_proof_check(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now)
{
    if (!p->ipc_claim || p->state != P_CONNECTED) return;
    char why[XW_REASON_LEN] = "";
    if (!p->ipc_proof_in) {
        if (now <= p->ipc_deadline_ns) return;
        snprintf(why, sizeof why, "no proof of the IPC handle within %u ms", (unsigned)a->timeout_ms);
        ipc_claim_drop(p);
        send_map_ack(a, p, KVHAL_UNSUPPORTED, why);
        return;
    }
    const xw_ipc_proof *f = &p->ipc_proof;
    const uint64_t size = kvhal_buffer_size(p->ipc_claim);
    if (f->status != 0) {
        snprintf(why, sizeof why, "the sender could not prove its handle: %.80s", f->reason);
        ipc_claim_drop(p);
        send_map_ack(a, p, KVHAL_UNSUPPORTED, why);
        return;
    }
    if (f->offset < p->ipc_extent || f->offset > size || size - f->offset < XW_NONCE) {
        const unsigned long long at = (unsigned long long)f->offset, lo = (unsigned long long)p->ipc_extent;
        ipc_claim_drop(p);
        peer_fail(p, KVHAL_PEER_FAILED, true, "peer %s: its IPC proof at byte %llu lies outside the proof area "
                  "[%llu, %llu) of the memory it named: refused", p->name, at, lo, (unsigned long long)size);
        return;
    }
    uint8_t got[XW_NONCE];
    if (kvhal_memcpy_d2h(got, p->ipc_claim, (size_t)f->offset, sizeof got, NULL) != KVHAL_OK) {
        snprintf(why, sizeof why, "cannot read the handle's proof back: %.70s", kvhal_last_error());
        ipc_claim_drop(p);
        send_map_ack(a, p, KVHAL_UNSUPPORTED, why);
        return;
    }
    if (!memeql_sec(got, p->ipc_nonce, sizeof got)) {
        const unsigned long long at = (unsigned long long)f->offset;
        ipc_claim_drop(p);
        peer_fail(p, KVHAL_PEER_FAILED, true, "peer %s: the memory its IPC handle names does not hold this agent's "
                  "challenge nonce at byte %llu (a buffer that is not its own?): refused, nothing read", p->name, at);
        return;
    }
    p->ipc_buf = p->ipc_claim;
    p->ipc_claim = NULL;
    p->ipc_proof_in = false;
    p->rx_path = &xfer_path_ipc;
    send_map_ack(a, p, KVHAL_OK, "");
}

/* Sender: the proof area's slot a peer held given back (its receiver answered our map, or it went). */
void ipc_slot_release(kvhal_xfer_peer *p)
{
    if (!p->ipc_slot) return;
    const int s = p->ipc_slot - 1;
    p->agent->proof_busy[s / 64] &= ~(1ull << (s % 64));
    p->ipc_slot = 0;
}

/* Sender (from the handler): the receiver's challenge for our handle; answered from pump (ipc_answer). */
void on_ipc_challenge(kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    if (header_length != sizeof(xw_ipc_challenge) || p->ipc_state != IPC_OFFERED || p->ipc_kind != XW_IPC_HANDLE ||
        p->ipc_chal_pending || p->ipc_slot) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "unexpected or malformed IPC_CHALLENGE (%zu bytes)", header_length);
        return;
    }
    xw_ipc_challenge ch;
    memcpy(&ch, header, sizeof ch);
    memcpy(p->ipc_chal, ch.nonce, sizeof p->ipc_chal);
    p->ipc_chal_pending = true;
}

/* Sender (from pump): the receiver's nonce written into a free slot of our proof area (the tail of our shareable
 * cache's buffer, past every page: no KV page is touched), the device synchronized, then IPC_PROOF names the slot.
 * No slot free: it waits for one (slots are held for a round trip). A write that fails is said so (the receiver
 * refuses the map; pages go through UCX). */
void ipc_answer(kvhal_xfer_agent *a, kvhal_xfer_peer *p)
{
    if (!p->ipc_chal_pending || p->state != P_CONNECTED) return;
    int slot = -1;
    for (int s = 0; s < a->proof_slots && slot < 0; s++)
        if (!(a->proof_busy[s / 64] & (1ull << (s % 64)))) slot = s;
    if (slot < 0) return;
    xw_ipc_proof f;
    memset(&f, 0, sizeof f);
    f.c = (xw_common){XW_MAGIC, XW_VERSION, XW_IPC_PROOF, p->their_session};
    f.offset = a->proof_off + (uint64_t)slot * XW_IPC_SLOT;
    kvhal_status st = kvhal_memcpy_h2d(a->cache_buf, (size_t)f.offset, p->ipc_chal, XW_NONCE, NULL);
    if (st == KVHAL_OK) st = kvhal_device_synchronize(kvhal_buffer_device(a->cache_buf));
    if (st != KVHAL_OK) {
        f.status = (int32_t)st;
        copy_name(f.reason, sizeof f.reason, kvhal_last_error());
        kvhal_clear_error();
    } else {
        a->proof_busy[slot / 64] |= 1ull << (slot % 64);
        p->ipc_slot = slot + 1;
    }
    p->ipc_chal_pending = false;
    queue_msg(a, p, NULL, &f, sizeof f, NULL, 0, false);
}

/* Receiver (from pump): a CMA map waiting for its challenge's answer, taken up again once the socket named a
 * process for it, or the timeout passed (then refused). */
void cma_claim_check(kvhal_xfer_agent *a, kvhal_xfer_peer *p, uint64_t now)
{
    if (!p->cma_claim || p->state != P_CONNECTED || (!p->cma_cred_pid && now <= p->cma_deadline_ns)) return;
    p->map_frame = p->cma_claim;
    p->map_len = p->cma_claim_len;
    p->cma_claim = NULL;
    process_ipc_map(a, p);
}

void on_ipc_map_ack(kvhal_xfer_peer *p, const void *header, size_t header_length)
{
    xw_ipc_map_ack k;
    if (header_length != sizeof k || p->ipc_state != IPC_OFFERED) {
        peer_fail(p, KVHAL_PEER_FAILED, true, "unexpected or malformed IPC_MAP_ACK (%zu bytes)", header_length);
        return;
    }
    memcpy(&k, header, sizeof k);
    k.reason[sizeof k.reason - 1] = '\0';
    ipc_slot_release(p);
    p->ipc_chal_pending = false;
    if (k.status == 0) { /* the peer reads our pages itself from now on */
        p->ipc_state = IPC_READY;
        p->tx_path = p->ipc_kind == XW_IPC_CMA ? &xfer_path_cma : &xfer_path_ipc;
    } else {
        p->ipc_state = IPC_REFUSED;
        copy_name(p->ipc_reason, sizeof p->ipc_reason, k.reason);
    }
}

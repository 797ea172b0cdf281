/* xfer_map.c — the IPC map: a peer's IPC_MAP (its cache's handle, or where to read it with process_vm_readv)
 * checked and imported by the receiver, which then copies through the IPC or the CMA path, and its answer
 * (IPC_MAP_ACK) taken by the sender, which then sends through that path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (p->rx_path) {
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
        }
    }
    free(fr);
    if (why[0]) {
        kvhal_buffer_destroy(buf);
        free(off);
        kvhal_clear_error();
        send_map_ack(a, p, KVHAL_UNSUPPORTED, why);
        return;
    }
    p->ipc_buf = buf;
    p->rx_path = &xfer_path_ipc;
    if (m.kind == XW_IPC_CMA) {
        p->cma = true;
        p->cma_pid = cb.pid;
        p->cma_base = cb.base;
        p->rx_path = &xfer_path_cma;
    }
    p->ipc_off = off;
    p->ipc_stride = m.block_stride;
    p->ipc_blocks = m.num_blocks;
    send_map_ack(a, p, KVHAL_OK, "");
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
    if (k.status == 0) { /* the peer reads our pages itself from now on */
        p->ipc_state = IPC_READY;
        p->tx_path = p->ipc_kind == XW_IPC_CMA ? &xfer_path_cma : &xfer_path_ipc;
    } else {
        p->ipc_state = IPC_REFUSED;
        copy_name(p->ipc_reason, sizeof p->ipc_reason, k.reason);
    }
}

/* fuzz_xfer.h — what fuzz_xfer.c (the libFuzzer target over what the transfer agent is sent by its peers) and
 * xfer_seeds.c (which writes its seed corpus) agree on: the receiver's caches, its peers and pending receives, its
 * send to a third peer, the sender's cache the IPC path imports, and the input's record format.
 *
 * An input is one configuration byte (bit 0: the receiver's cache is page-first, else layer-first), then records:
 *   op (1 byte), header length (2 bytes, little-endian), data length (2 bytes), header, data
 * cut short where the input ends. op & 7: FX_FRAME, FX_FRAME_PUMP, FX_PUMP, FX_CANCEL, FX_DISCONNECT (others:
 * FX_PUMP); op & FX_SECOND picks receive / peer B instead of A, op & FX_THIRD the send / peer C (over
 * FX_SECOND); op & FX_RNDV delivers the frame as a rendezvous one (ignored for DATA frames: an accepted one's data
 * would be fetched through UCX).
 * Placeholders the target replaces with what exists only at run time: an IPC_MAP whose handle is FX_SENDBLOB
 * (blob_len 8) gets the sender cache's real handle; an IPC_PROOF whose reason starts with FX_PROVE has the nonce
 * its peer's receiver waits for written into the sender cache at the offset it names (where that lies inside the
 * cache's buffer), as the sender would; an ACK's xfer_id FX_XFER_SEND the send's id; a HELLO's address is always the receiver's own worker address
 * (addr_len follows it where it matched the data's length), so no made-up address ever reaches UCX. */
#ifndef KVHAL_FUZZ_XFER_H
#define KVHAL_FUZZ_XFER_H

#include <stdint.h>

#include "kvhal.h"
#include "xfer_wire.h"

#define FX_TOKEN "fuzz-token"
/* an AUTH frame whose proof starts with these bytes proves every connection waiting for it (the fuzzer cannot
 * compute a proof over the agent's fresh nonce): kvhal__xfer_prove_pending */
#define FX_PROVE "FXPROVE"
#define FX_LAYERS 3
#define FX_HEADS 2
#define FX_DIM 4
#define FX_BLOCK 4
#define FX_CHUNK ((uint64_t)FX_BLOCK * FX_HEADS * FX_DIM * 2) /* f16: one block of one layer's K (or V) */
#define FX_PAGES 8      /* the receiver's */
#define FX_SEND_PAGES 6 /* the peers' (their GRANTs and the imported cache's page ids are checked against it) */

#define FX_SESSION_A 0x5eed00000000000aull /* the session the receiver gave peer A (dest_session of A's frames) */
#define FX_SESSION_B 0x5eed00000000000bull
#define FX_REQUEST_A 101u /* receive A: from peer A into FX_GRANT_A */
#define FX_REQUEST_B 202u /* receive B: from peer B into FX_GRANT_B */
#define FX_GRANT_A_N 3
#define FX_GRANT_B_N 2
static const int32_t FX_GRANT_A[FX_GRANT_A_N] = {5, 2, 6}; /* scattered, not in order */
static const int32_t FX_GRANT_B[FX_GRANT_B_N] = {7, 0};
/* pages 1, 3, 4 are never granted: they and every byte around the cache must stay as they were */

/* The send side: peer C (a receiver) is sent request C once it grants pages for it: min(granted, FX_SEND_MAX)
 * pages, all layers, page i from FX_SEND_SRC[i % FX_SEND_SRC_N] (a page may be sent into several). Past
 * FX_FRAME_PAGES pages a send takes two frames. Its ACKs name the sender's transfer by an id known only at run
 * time: an ACK whose xfer_id is FX_XFER_SEND gets the send's real one. */
#define FX_SESSION_C 0x5eed00000000000cull
#define FX_REQUEST_C 303u
#define FX_SEND_SRC_N 4
static const int32_t FX_SEND_SRC[FX_SEND_SRC_N] = {3, 1, 4, 5};
#define FX_FRAME_PAGES 256 /* the sender's pages per DATA frame (MAX_FRAME_PAGES, transfer/xfer_types.h) */
#define FX_SEND_MAX 300
#define FX_XFER_SEND 0x5e4dull

enum { FX_FRAME = 0, FX_FRAME_PUMP = 1, FX_PUMP = 2, FX_CANCEL = 3, FX_DISCONNECT = 4 };
#define FX_SECOND 0x08
#define FX_THIRD 0x10 /* FX_CANCEL, FX_DISCONNECT: the send to peer C / peer C (over FX_SECOND) */
#define FX_RNDV 0x80
#define FX_SENDBLOB "SENDBLOB"

/* The receiver's caches (FX_PAGES, either order) and the peers' (FX_SEND_PAGES, layer-first, shareable). */
static inline kvhal_paged_cache_config fx_cache_config(int64_t pages, kvhal_paged_order order)
{
    kvhal_paged_cache_config c = KVHAL_PAGED_CACHE_CONFIG_INIT;
    c.num_layers = FX_LAYERS;
    c.num_heads = FX_HEADS;
    c.head_dim = FX_DIM;
    c.block_size = FX_BLOCK;
    c.dtype = KVHAL_F16;
    c.order = order;
    c.memory_budget = (uint64_t)pages * 2u * FX_LAYERS * FX_CHUNK;
    c.device = (kvhal_device){KVHAL_DEVICE_CPU, 0};
    return c;
}

/* The peers' geometry, as their HELLOs say it. */
static inline xw_geometry fx_geometry(void)
{
    return (xw_geometry){.num_layers = FX_LAYERS, .num_heads = FX_HEADS, .head_dim = FX_DIM, .block_size = FX_BLOCK,
                         .dtype = KVHAL_F16, .layout = KVHAL_LAYOUT_NHD, .num_blocks = FX_SEND_PAGES,
                         .chunk_bytes = FX_CHUNK};
}

#endif

/* xfer_seeds.c — writes fuzz_xfer's seed corpus (fuzz/corpus/xfer/) into the folder given: well-formed sessions
 * that complete both pending receives over DATA frames (whole, per layer, per page, either cache order) and over
 * the IPC path, and a few of each refusal (pages not granted or out of range, a (page, layer) twice, an unknown
 * request, frames of one peer for the other's request, cancels and disconnects mid-transfer, GRANT / ACK / BYE /
 * IPC_MAP_ACK / HELLO / HELLO_ACK frames, rendezvous where DATA is not allowed it, truncated and foreign frames);
 * and the send to peer C: granted and acknowledged (one frame, two frames in either order), and a receiver that
 * acknowledges a frame twice, refuses one, names the wrong size, a frame never sent or pages past its end.
 * Built with -Dfuzz=true (build-fuzz/fuzz/xfer_seeds DIR); the geometry and the record format are fuzz_xfer.h's. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_xfer.h"
#include "kvhal.h"
#include "xfer_wire.h"

static uint8_t out[1 << 16];
static size_t out_len;
static const char *dir;
static uint64_t ipc_off[2 * FX_LAYERS], ipc_stride;

static void put(const void *p, size_t n)
{
    if (out_len + n > sizeof out) {
        fprintf(stderr, "xfer_seeds: a seed outgrew %zu bytes\n", sizeof out);
        exit(1);
    }
    if (n) memcpy(out + out_len, p, n);
    out_len += n;
}

static void begin(uint8_t config)
{
    out_len = 0;
    put(&config, 1);
}

static void record(uint8_t op, const void *hdr, size_t hlen, const void *dat, size_t dlen)
{
    const uint8_t h[5] = {op, (uint8_t)hlen, (uint8_t)(hlen >> 8), (uint8_t)dlen, (uint8_t)(dlen >> 8)};
    put(h, sizeof h);
    put(hdr, hlen);
    put(dat, dlen);
}

static void op_only(uint8_t op) { record(op, NULL, 0, NULL, 0); }

static void finish(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(out, 1, out_len, f) != out_len || fclose(f) != 0) {
        fprintf(stderr, "xfer_seeds: cannot write %s\n", path);
        exit(1);
    }
}

static xw_common common(uint16_t type, uint64_t session) { return (xw_common){XW_MAGIC, XW_VERSION, type, session}; }

static uint64_t session_of(int peer) { return peer == 2 ? FX_SESSION_C : peer ? FX_SESSION_B : FX_SESSION_A; }

/* C's GRANT for request C: n pages, page i being i % FX_SEND_PAGES (or pages, when given). */
static void grant_c(uint8_t op, int32_t n, const int32_t *pages)
{
    static int32_t p[FX_SEND_MAX + 8];
    for (int32_t i = 0; i < n; i++) p[i] = pages ? pages[i] : i % FX_SEND_PAGES;
    xw_grant g = {.c = common(XW_GRANT, FX_SESSION_C), .request_id = FX_REQUEST_C, .n_pages = n};
    record(op, &g, sizeof g, p, (size_t)n * sizeof(int32_t));
}

/* C's ACK of frame of the send (FX_XFER_SEND: the target puts in the send's id), for pages pages of it. */
static void ack_c(uint8_t op, uint32_t frame, int32_t status, uint64_t pages, const char *reason)
{
    xw_ack k = {.c = common(XW_ACK, FX_SESSION_C), .xfer_id = FX_XFER_SEND, .frame = frame, .status = status,
                .bytes = pages * FX_LAYERS * 2u * FX_CHUNK};
    snprintf(k.reason, sizeof k.reason, "%s", reason);
    record(op, &k, sizeof k, NULL, 0);
}

/* A DATA frame of peer (0 A, 1 B) for request into pages x layers [l0, l0+nl), the K/V bytes a pattern. */
static void data_frame(uint8_t op, int peer, uint64_t request, uint32_t frame, int32_t l0, int32_t nl,
                       const int32_t *pages, int32_t n)
{
    uint8_t hdr[sizeof(xw_data) + 16 * sizeof(int32_t)];
    static uint8_t dat[16 * FX_LAYERS * 2 * FX_CHUNK];
    xw_data h = {.c = common(XW_DATA, session_of(peer)), .request_id = request, .xfer_id = 77 + (uint64_t)peer,
                 .frame = frame, .first_layer = l0, .num_layers = nl, .n_pages = n, .chunk_bytes = FX_CHUNK};
    memcpy(hdr, &h, sizeof h);
    memcpy(hdr + sizeof h, pages, (size_t)n * sizeof(int32_t));
    const size_t dlen = (size_t)n * (size_t)nl * 2u * FX_CHUNK;
    for (size_t i = 0; i < dlen; i++) dat[i] = (uint8_t)(i * 7u + frame);
    record(op, hdr, sizeof h + (size_t)n * sizeof(int32_t), dat, dlen);
}

static void ipc_map(uint8_t op, int peer)
{
    xw_ipc_map m = {.c = common(XW_IPC_MAP, session_of(peer)), .blob_len = 8, .num_layers = FX_LAYERS,
                    .block_stride = ipc_stride, .num_blocks = FX_SEND_PAGES};
    uint8_t dat[8 + sizeof ipc_off];
    memcpy(dat, FX_SENDBLOB, 8);
    memcpy(dat + 8, ipc_off, sizeof ipc_off);
    record(op, &m, sizeof m, dat, sizeof dat);
}

/* The sender's answer to the receiver's IPC challenge: its nonce written at the proof area's first slot (the
 * target writes it: FX_PROVE), or at offset (a hostile proof). */
static uint64_t proof_off;
static void ipc_proof(uint8_t op, int peer, uint64_t offset, bool prove)
{
    xw_ipc_proof f = {.c = common(XW_IPC_PROOF, session_of(peer)), .offset = offset};
    if (prove) memcpy(f.reason, FX_PROVE, 7);
    record(op, &f, sizeof f, NULL, 0);
}

/* An IPC_MAP of the sender cache's handle, imported (pump), then proven. */
static void ipc_map_proven(uint8_t flags, int peer)
{
    ipc_map(FX_FRAME_PUMP | flags, peer);
    ipc_proof(FX_FRAME_PUMP | flags, peer, proof_off, true);
}

/* A DATA_IPC frame: (src, dst) pairs. */
static void data_ipc(uint8_t op, int peer, uint64_t request, uint32_t frame, int32_t l0, int32_t nl,
                     const int32_t *pairs, int32_t n)
{
    xw_data_ipc h = {.c = common(XW_DATA_IPC, session_of(peer)), .request_id = request,
                     .xfer_id = 88 + (uint64_t)peer, .frame = frame, .first_layer = l0, .num_layers = nl,
                     .n_pages = n};
    record(op, &h, sizeof h, pairs, (size_t)n * 2u * sizeof(int32_t));
}

/* An OFFER frame: source pages [first, first + n) of a request of total pages. */
static void offer(uint8_t op, int peer, uint64_t request, uint64_t xfer, uint32_t frame, int32_t l0, int32_t nl,
                  int32_t first, int32_t total, const int32_t *src, int32_t n)
{
    xw_offer h = {.c = common(XW_OFFER, session_of(peer)), .request_id = request, .xfer_id = xfer, .frame = frame,
                  .first_layer = l0, .num_layers = nl, .first_page = first, .total_pages = total, .n_pages = n};
    record(op, &h, sizeof h, src, (size_t)n * sizeof(int32_t));
}

static void withdraw(uint8_t op, int peer, uint64_t request, uint64_t xfer)
{
    xw_withdraw w = {.c = common(XW_WITHDRAW, session_of(peer)), .request_id = request, .xfer_id = xfer};
    record(op, &w, sizeof w, NULL, 0);
}

static void complete_both(uint8_t config, bool pump_each)
{
    const uint8_t op = pump_each ? FX_FRAME_PUMP : FX_FRAME;
    data_frame(op, 0, FX_REQUEST_A, 0, 0, FX_LAYERS, FX_GRANT_A, FX_GRANT_A_N);
    data_frame(op | FX_SECOND, 1, FX_REQUEST_B, 0, 0, FX_LAYERS, FX_GRANT_B, FX_GRANT_B_N);
    (void)config;
}

static void hello(uint8_t op, const char *token, uint64_t src_session)
{
    xw_hello h;
    memset(&h, 0, sizeof h);
    h.c = common(XW_HELLO, 0);
    h.src_session = src_session;
    snprintf(h.name, sizeof h.name, "prefill");
    memcpy(h.nonce, token, strnlen(token, sizeof h.nonce)); /* a nonce (the token never crosses the wire) */
    h.g = fx_geometry();
    h.addr_len = 4;
    snprintf(h.host, sizeof h.host, "some-boot-id/some-host");
    record(op, &h, sizeof h, "SELF", 4);
}

/* Receives on every path: whole and per layer or page, the IPC path, offers (also hostile ones), frames mixed. */
static void seeds_paths(void)
{
    for (uint8_t cfg = 0; cfg < 2; cfg++) { /* both complete, one frame each; layer-first and page-first */
        begin(cfg);
        complete_both(cfg, true);
        finish(cfg ? "complete_page_first" : "complete_layer_first");
    }
    begin(1); /* per layer (A), per page (B), frames delivered before any progress */
    for (int32_t l = 0; l < FX_LAYERS; l++)
        data_frame(FX_FRAME, 0, FX_REQUEST_A, (uint32_t)l, l, 1, (const int32_t[]){6, 2, 5}, 3);
    data_frame(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, 0, 0, FX_LAYERS, &FX_GRANT_B[1], 1);
    data_frame(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, 1, 0, FX_LAYERS, &FX_GRANT_B[0], 1);
    op_only(FX_PUMP);
    finish("per_layer_per_page");

    begin(0); /* the IPC path: both peers map the sender's cache, A in one frame, B layer by layer */
    ipc_map_proven(0, 0);
    ipc_map_proven(0, 1);
    data_ipc(FX_FRAME_PUMP, 0, FX_REQUEST_A, 0, 0, FX_LAYERS, (const int32_t[]){0, 5, 3, 2, 5, 6}, 3);
    for (int32_t l = 0; l < FX_LAYERS; l++)
        data_ipc(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, (uint32_t)l, l, 1, (const int32_t[]){1, 7, 4, 0}, 2);
    op_only(FX_PUMP);
    finish("ipc");
    begin(1); /* offers: B's pending receive takes one frame per page (layer 0, then the rest); offers no receive
               * takes wait (one withdrawn, one kept until the peer goes); a size that differs fails receive A */
    ipc_map_proven(0, 0);
    ipc_map_proven(0, 1);
    offer(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, 31, 0, 0, 1, 0, FX_GRANT_B_N, (const int32_t[]){4}, 1);
    offer(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, 31, 1, 0, 1, 1, FX_GRANT_B_N, (const int32_t[]){2}, 1);
    offer(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 32, 0, 1, FX_LAYERS - 1, 0, FX_GRANT_B_N,
          (const int32_t[]){4, 2}, 2);
    offer(FX_FRAME_PUMP | FX_SECOND, 1, 777, 33, 0, 0, FX_LAYERS, 0, 2, (const int32_t[]){0, 1}, 2);
    offer(FX_FRAME_PUMP | FX_SECOND, 1, 778, 34, 0, 0, FX_LAYERS, 0, 1, (const int32_t[]){5}, 1);
    withdraw(FX_FRAME_PUMP | FX_SECOND, 1, 777, 33);
    offer(FX_FRAME_PUMP, 0, FX_REQUEST_A, 35, 0, 0, FX_LAYERS, 0, FX_GRANT_A_N + 1, (const int32_t[]){0}, 1);
    finish("offer");
    begin(0); /* hostile offers: past the imported cache, past the request, a page twice, no map, short header */
    offer(FX_FRAME_PUMP, 0, FX_REQUEST_A, 36, 0, 0, FX_LAYERS, 0, FX_GRANT_A_N, (const int32_t[]){0}, 1);
    ipc_map_proven(0, 0);
    ipc_map_proven(0, 1);
    offer(FX_FRAME_PUMP, 0, FX_REQUEST_A, 37, 0, 0, FX_LAYERS, 2, 2, (const int32_t[]){0}, 1);
    offer(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 38, 0, 0, FX_LAYERS, 0, FX_GRANT_B_N,
          (const int32_t[]){FX_SEND_PAGES, 0}, 2);
    {
        xw_withdraw w = {.c = common(XW_WITHDRAW, FX_SESSION_A), .xfer_id = 1};
        record(FX_FRAME_PUMP, &w, sizeof w - 4, NULL, 0);
    }
    complete_both(0, true);
    finish("offer_hostile");
    begin(1); /* IPC and DATA frames mixed within one receive, a second IPC_MAP */
    ipc_map_proven(0, 0);
    data_ipc(FX_FRAME, 0, FX_REQUEST_A, 0, 0, 2, (const int32_t[]){0, 5, 3, 2, 5, 6}, 3);
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_A, 1, 2, 1, FX_GRANT_A, FX_GRANT_A_N);
    ipc_map(FX_FRAME_PUMP, 0);
    finish("ipc_mixed");
    begin(0); /* hostile proofs: A's names a slot that does not hold the nonce, B's a byte inside the pages; then
               * their DATA_IPC frames (no imported cache) and a proof nobody asked for */
    ipc_map(FX_FRAME_PUMP, 0);
    ipc_map(FX_FRAME_PUMP, 1);
    ipc_proof(FX_FRAME_PUMP, 0, proof_off + XW_IPC_SLOT, false);
    ipc_proof(FX_FRAME_PUMP | FX_SECOND, 1, 0, true);
    data_ipc(FX_FRAME_PUMP, 0, FX_REQUEST_A, 0, 0, FX_LAYERS, (const int32_t[]){0, 5}, 1);
    ipc_proof(FX_FRAME_PUMP, 0, proof_off, true);
    finish("ipc_proof_hostile");
}

/* Hostile and unlucky frames for the receives: duplicates, ranges, requests nobody granted, cancel, disconnect,
 * the other frame types, connections, rendezvous and truncated frames. */
static void seeds_hostile(void)
{
    begin(0); /* a (page, layer) twice: within a frame, then across frames */
    data_frame(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 0, 0, 1, (const int32_t[]){7, 7}, 2);
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_A, 0, 1, 2, (const int32_t[]){5}, 1);
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_A, 1, 2, 1, (const int32_t[]){2, 5}, 2);
    finish("duplicate");
    begin(1); /* pages not granted, out of range, negative; layers out of range; wrong chunk size */
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_A, 0, 0, 1, (const int32_t[]){3}, 1);
    data_frame(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 0, 0, 1, (const int32_t[]){FX_PAGES}, 1);
    finish("bad_pages");
    begin(0);
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_A, 0, 2, 2, FX_GRANT_A, 1);
    data_frame(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 0, 0, 1, (const int32_t[]){-1}, 1);
    finish("bad_layers");

    begin(0); /* a request nobody granted, one peer's frame for the other's request, then the real ones */
    data_frame(FX_FRAME_PUMP, 0, 999, 0, 0, FX_LAYERS, FX_GRANT_A, FX_GRANT_A_N);
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_B, 0, 0, FX_LAYERS, FX_GRANT_B, FX_GRANT_B_N);
    complete_both(0, true);
    finish("unknown_request");

    begin(1); /* cancel mid-transfer, then more frames; the other receive completes */
    data_frame(FX_FRAME, 0, FX_REQUEST_A, 0, 0, FX_LAYERS, (const int32_t[]){5}, 1);
    op_only(FX_CANCEL);
    data_frame(FX_FRAME_PUMP, 0, FX_REQUEST_A, 1, 0, FX_LAYERS, (const int32_t[]){2, 6}, 2);
    data_frame(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 0, 0, FX_LAYERS, FX_GRANT_B, FX_GRANT_B_N);
    finish("cancel");
    begin(0); /* a peer disconnected with a frame not yet acknowledged, then frames naming its session */
    ipc_map_proven(FX_SECOND, 1);
    data_frame(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, 0, 0, FX_LAYERS, &FX_GRANT_B[0], 1);
    data_ipc(FX_FRAME | FX_SECOND, 1, FX_REQUEST_B, 1, 0, FX_LAYERS, (const int32_t[]){2, 7}, 1);
    op_only(FX_DISCONNECT | FX_SECOND);
    data_frame(FX_FRAME_PUMP | FX_SECOND, 1, FX_REQUEST_B, 2, 0, FX_LAYERS, &FX_GRANT_B[1], 1);
    op_only(FX_PUMP);
    finish("disconnect");

    begin(0); /* the other frames a peer may send: GRANT, ACK, IPC_MAP_ACK, unknown type, BYE */
    {
        xw_grant gr = {.c = common(XW_GRANT, FX_SESSION_A), .request_id = 5, .n_pages = 2};
        record(FX_FRAME_PUMP, &gr, sizeof gr, (const int32_t[]){0, FX_SEND_PAGES - 1}, 8);
        xw_ack ak = {.c = common(XW_ACK, FX_SESSION_A), .xfer_id = 1, .frame = 0, .status = 0, .bytes = 64};
        record(FX_FRAME_PUMP, &ak, sizeof ak, NULL, 0);
        xw_ipc_map_ack mk = {.c = common(XW_IPC_MAP_ACK, FX_SESSION_B), .status = 0};
        record(FX_FRAME_PUMP, &mk, sizeof mk, NULL, 0);
        xw_common un = common(42, FX_SESSION_A);
        record(FX_FRAME_PUMP, &un, sizeof un, NULL, 0);
        xw_common bye = common(XW_BYE, FX_SESSION_B);
        record(FX_FRAME_PUMP, &bye, sizeof bye, NULL, 0);
        finish("control");
    }
    begin(1); /* connections: the right token (accepted over an endpoint to itself), a wrong one, a stray answer */
    hello(FX_FRAME_PUMP, FX_TOKEN, 0x1234);
    hello(FX_FRAME_PUMP, "not-the-token", 0x1235);
    {
        xw_auth au; /* the first proven (FX_PROVE), a forged one for the other */
        memset(&au, 0, sizeof au);
        au.c = common(XW_AUTH, 0x1235);
        memcpy(au.proof, "forged", 6);
        record(FX_FRAME_PUMP, &au, sizeof au, NULL, 0);
        memcpy(au.proof, FX_PROVE, 7);
        record(FX_FRAME_PUMP, &au, sizeof au, NULL, 0);
        xw_common ok = common(XW_AUTH_OK, FX_SESSION_A); /* to a peer connected already: nothing */
        record(FX_FRAME_PUMP, &ok, sizeof ok, NULL, 0);
    }
    {
        xw_hello_ack k;
        memset(&k, 0, sizeof k);
        k.c = common(XW_HELLO_ACK, 0x1234);
        k.src_session = FX_SESSION_A;
        k.g = fx_geometry();
        record(FX_FRAME_PUMP, &k, sizeof k, NULL, 0);
    }
    complete_both(1, true);
    finish("hello");
    begin(0); /* rendezvous frames that must not be (all refused), truncated and foreign frames, then data */
    {
        xw_ack ak = {.c = common(XW_ACK, FX_SESSION_A), .xfer_id = 1};
        record(FX_FRAME_PUMP | FX_RNDV, &ak, sizeof ak, NULL, 0);
        xw_data_ipc di = {.c = common(XW_DATA_IPC, FX_SESSION_B), .request_id = FX_REQUEST_B, .n_pages = 1};
        record(FX_FRAME_PUMP | FX_RNDV, &di, sizeof di, (const int32_t[]){0, 7}, 8);
        xw_data d = {.c = common(XW_DATA, FX_SESSION_A), .request_id = FX_REQUEST_A, .n_pages = 1};
        record(FX_FRAME_PUMP, &d, sizeof d - 4, NULL, 0);
        xw_common foreign = {0x12345678, XW_VERSION, XW_DATA, FX_SESSION_A};
        record(FX_FRAME_PUMP, &foreign, sizeof foreign, NULL, 0);
        xw_common other_session = common(XW_BYE, 0x5eed);
        record(FX_FRAME_PUMP, &other_session, sizeof other_session, NULL, 0);
    }
    complete_both(0, false);
    op_only(FX_PUMP);
    finish("rndv_truncated");
}

/* The send to peer C: its GRANTs and ACKs, refusals, a cancel mid-way. */
static void seeds_send(void)
{
    /* the send to peer C */
    begin(0); /* one frame, acknowledged; the receives complete meanwhile */
    grant_c(FX_FRAME_PUMP, 3, (const int32_t[]){5, 0, 2});
    complete_both(0, true);
    ack_c(FX_FRAME_PUMP, 0, 0, 3, "");
    finish("send_one_frame");
    begin(1); /* two frames (FX_FRAME_PAGES + 4 pages), acknowledged last first */
    grant_c(FX_FRAME_PUMP, FX_FRAME_PAGES + 4, NULL);
    ack_c(FX_FRAME_PUMP, 1, 0, 4, "");
    ack_c(FX_FRAME_PUMP, 0, 0, FX_FRAME_PAGES, "");
    finish("send_two_frames");
    begin(0); /* the first of two frames acknowledged twice: the peer is dropped, the send fails */
    grant_c(FX_FRAME_PUMP, FX_FRAME_PAGES + 4, NULL);
    ack_c(FX_FRAME_PUMP, 0, 0, FX_FRAME_PAGES, "");
    ack_c(FX_FRAME_PUMP, 0, 0, FX_FRAME_PAGES, "");
    ack_c(FX_FRAME_PUMP, 1, 0, 4, "");
    finish("send_ack_twice");
    begin(1); /* refusals: a frame never sent, the wrong size, a refusal with its reason, a second GRANT */
    grant_c(FX_FRAME_PUMP, FX_FRAME_PAGES + 1, NULL);
    ack_c(FX_FRAME_PUMP, 7, 0, 1, "");
    ack_c(FX_FRAME_PUMP, 1, 0, 2, "");
    ack_c(FX_FRAME_PUMP, 0, KVHAL_NOT_FOUND, 0, "no such request");
    grant_c(FX_FRAME_PUMP, 2, NULL);
    finish("send_refused");
    begin(0); /* pages past the peer's end; then a good GRANT, the send cancelled and C disconnected mid-way */
    grant_c(FX_FRAME_PUMP, 2, (const int32_t[]){1, FX_SEND_PAGES});
    grant_c(FX_FRAME_PUMP, 2, (const int32_t[]){1, 2});
    op_only(FX_CANCEL | FX_THIRD);
    ack_c(FX_FRAME_PUMP, 0, 0, 2, "");
    op_only(FX_DISCONNECT | FX_THIRD);
    ack_c(FX_FRAME_PUMP, 0, 0, 2, "");
    finish("send_cancel");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: xfer_seeds DIR (fuzz/corpus/xfer)\n");
        return 2;
    }
    dir = argv[1];
    /* the peers' cache as fuzz_xfer makes it: its layers' byte offsets and page stride go in IPC_MAP frames */
    kvhal_paged_cache_config c = fx_cache_config(FX_SEND_PAGES, KVHAL_LAYER_FIRST);
    kvhal_paged_cache *pc = NULL;
    if (kvhal_paged_cache_create_shareable(&c, &pc) != KVHAL_OK) {
        fprintf(stderr, "xfer_seeds: %s\n", kvhal_last_error());
        return 1;
    }
    for (int32_t l = 0; l < FX_LAYERS; l++) {
        kvhal_tensor k, v;
        kvhal_paged_cache_layer(pc, l, &k, &v);
        ipc_off[2 * l] = k.offset;
        ipc_off[2 * l + 1] = v.offset;
        ipc_stride = (uint64_t)k.strides[0] * 2u;
        proof_off = kvhal_buffer_size(k.buffer) - KVHAL_PAGED_CACHE_PROOF_BYTES;
    }
    kvhal_paged_cache_destroy(pc);

    seeds_paths();
    seeds_hostile();
    seeds_send();
    return 0;
}

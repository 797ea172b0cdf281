/* xfer_wire.h — the frames two kvhal transfer agents exchange as UCX active messages (one AM id, the frame type in
 * a common header). Private to transfer/ and to the transfer tests, which play a hostile peer with hand-made frames.
 * Every frame comes from an untrusted peer: the receiver copies the header out (it may be unaligned), checks its
 * exact length, magic, version, the session it names and every field before acting on it. */
#ifndef KVHAL_XFER_WIRE_H
#define KVHAL_XFER_WIRE_H

#include <stdint.h>

#define XW_AM_ID 0x4b56u        /* the one active-message id */
#define XW_MAGIC 0x4b565846u    /* KVXF */
#define XW_BLOB_MAGIC 0x4b564142u /* KVAB: an address blob */
#define XW_VERSION 6u /* 2: host identity in HELLO / HELLO_ACK, the IPC frames; 3: IPC_MAP kinds (CMA), the TCP
                         receive segment size in HELLO / HELLO_ACK; 4: OFFER and WITHDRAW; 5: mutual authentication
                         (nonces and HMAC proofs in HELLO / HELLO_ACK / AUTH, no token on the wire), the CMA
                         challenge (CMA_CHALLENGE); 6: the IPC handle's challenge (IPC_CHALLENGE, IPC_PROOF) */
#define XW_SEG_LEN 16           /* UCX's TCP receive segment size as configured ("256k"), "" without TCP */
#define XW_NAME_LEN 32
#define XW_TOKEN_LEN 64         /* the token's room in the agent (never on the wire) */
#define XW_NONCE 32             /* a handshake nonce (getrandom) */
#define XW_PROOF 32             /* an HMAC-SHA-256 proof */
#define XW_REASON_LEN 128
#define XW_MAX_ADDR 65536u      /* largest worker address accepted in a HELLO or a blob */
#define XW_MAX_GRANT 65536      /* pages in one grant */
#define XW_HOST_LEN 128         /* host identity: boot_id + hostname */
#define XW_IPC_BLOB_MAX 256     /* KVHAL_IPC_HANDLE_MAX */
#define XW_IPC_FRAME_PAGES 4096 /* (src, dst) pairs in one DATA_IPC frame */

enum xw_type {
    XW_HELLO = 1,     /* connector -> listener: its nonce, name, geometry, session; data: the connector's worker
                         address. No token, nor anything computed from it */
    XW_HELLO_ACK = 2, /* listener -> connector: a challenge (its nonce, session, geometry and its proof of the token
                         over the transcript, xw_transcript) or a refusal (reason) */
    XW_GRANT = 3,     /* receiver -> sender: request id; data: n page ids of the receiver */
    XW_DATA = 4,      /* sender -> receiver: one frame of pages x layers; header: dst pages; data: K/V chunks */
    XW_ACK = 5,       /* receiver -> sender: a frame was written (status OK) or refused (status, reason) */
    XW_BYE = 6,       /* either way: the peer closes the connection */
    XW_IPC_MAP = 7,   /* sender -> receiver, once per connection, same host only: its cache's IPC handle (kind
                         XW_IPC_HANDLE) or where to read it with process_vm_readv (XW_IPC_CMA, an xw_cma_blob); data:
                         blob_len bytes of that, then num_layers x {K, V} byte offsets of block 0 (uint64) */
    XW_IPC_MAP_ACK = 8, /* receiver -> sender: the handle was imported (status OK: DATA_IPC may follow) or not */
    XW_DATA_IPC = 9,  /* sender -> receiver: copy these pages yourself from the imported cache; data: n_pages
                         (src, dst) int32 pairs; acknowledged (XW_ACK) once the copy completed */
    XW_OFFER = 10,    /* sender -> receiver, after an IPC_MAP the receiver imported: pages [first_page, first_page +
                         n_pages) of a request (of total_pages) are these source pages; data: n_pages int32 source
                         page ids. The receiver copies them into the pages it posts for the request (at once when
                         the receive is already posted, else when it is) and acknowledges (XW_ACK) as for DATA_IPC;
                         an offer no receive takes within half the receiver's timeout is refused (XW_ACK, TIMEOUT) */
    XW_WITHDRAW = 11, /* sender -> receiver: an offer was canceled: its frames not yet taken are dropped, each
                         answered by an XW_ACK (CANCELED); frames already taken are copied and acknowledged */
    XW_AUTH = 12,     /* connector -> listener: its proof of the token over the transcript; the listener's peer is
                         connected once it checks */
    XW_CMA_CHALLENGE = 13, /* receiver -> sender, after an IPC_MAP of kind CMA: a nonce of the receiver's choice and
                              the abstract Unix socket to prove the sender's process on (xw_cma_challenge); the
                              sender answers on that socket, not with a frame */
    XW_AUTH_OK = 14,  /* listener -> connector: its proof checked, the connection is a peer (header only); the
                         connector's kvhal_xfer_connect returns once it came */
    XW_IPC_CHALLENGE = 15, /* receiver -> sender, after an IPC_MAP of kind HANDLE it imported: a nonce of the
                              receiver's choice (xw_ipc_challenge), to be written into the exported allocation */
    XW_IPC_PROOF = 16, /* sender -> receiver: where in its exported allocation it wrote that nonce (xw_ipc_proof);
                          the receiver reads it back through the imported mapping before it accepts the map */
};

typedef struct xw_common {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint64_t dest_session; /* the session the destination gave this connection (0 in a HELLO) */
} xw_common;

/* The cache geometry both sides must share; num_blocks is the sender's own (for its early checks). */
typedef struct xw_geometry {
    int32_t num_layers, num_heads, head_dim, block_size, dtype, layout;
    int64_t num_blocks;
    uint64_t chunk_bytes; /* one block of one layer's K (or V) */
} xw_geometry;

typedef struct xw_blob {
    uint32_t magic;
    uint16_t version;
    uint16_t pad;
    uint32_t addr_len;
    char name[XW_NAME_LEN];
    /* then addr_len bytes of UCX worker address */
} xw_blob;

typedef struct xw_hello {
    xw_common c;
    uint64_t src_session; /* what the listener puts in dest_session of frames to the connector */
    char name[XW_NAME_LEN];
    uint8_t nonce[XW_NONCE]; /* the connector's, fresh (getrandom) */
    xw_geometry g;
    uint32_t addr_len;
    uint32_t pad;
    char host[XW_HOST_LEN]; /* the connector's host identity (same host: the IPC path may be offered) */
    char tcp_seg[XW_SEG_LEN]; /* UCX 1.13 cannot mix TCP endpoints whose receive segments differ: refused */
} xw_hello;

typedef struct xw_hello_ack {
    xw_common c;
    uint64_t src_session;
    int32_t status; /* kvhal_status: 0 accepted */
    uint32_t pad;
    char name[XW_NAME_LEN];
    xw_geometry g;
    char reason[XW_REASON_LEN]; /* at the same offset in every version: a refusal stays readable */
    char host[XW_HOST_LEN];
    char tcp_seg[XW_SEG_LEN];
    uint8_t nonce[XW_NONCE]; /* the listener's, fresh */
    uint8_t proof[XW_PROOF]; /* HMAC-SHA-256(token, xw_transcript with label XW_LABEL_LISTENER) */
} xw_hello_ack;

typedef struct xw_auth {
    xw_common c;
    uint8_t proof[XW_PROOF]; /* HMAC-SHA-256(token, xw_transcript with label XW_LABEL_CONNECTOR) */
} xw_auth;

/* What both proofs cover (never sent: each side builds it from the HELLO and HELLO_ACK it sent and received, the
 * names, hosts and geometry as the 32-, 128- and 40-byte fields on the wire). The label is the role: a listener's
 * proof is no connector's (a reflected HELLO_ACK fails); both nonces are fresh for each connection (a replayed
 * HELLO or AUTH fails); the sessions, names, hosts and geometries are both sides' (a spliced one fails). */
#define XW_LABEL_CONNECTOR "kvhal-xfer-conn"
#define XW_LABEL_LISTENER "kvhal-xfer-lstn"
typedef struct xw_transcript {
    char label[16];
    uint8_t nonce_c[XW_NONCE], nonce_l[XW_NONCE];
    uint64_t session_c, session_l;
    char name_c[XW_NAME_LEN], name_l[XW_NAME_LEN];
    char host_c[XW_HOST_LEN], host_l[XW_HOST_LEN];
    xw_geometry g_c, g_l;
} xw_transcript;

typedef struct xw_grant {
    xw_common c;
    uint64_t request_id;
    int32_t n_pages;
    uint32_t pad;
} xw_grant;

typedef struct xw_data {
    xw_common c;
    uint64_t request_id;
    uint64_t xfer_id;  /* the sender's, echoed in the ACK */
    uint32_t frame;    /* the frame's index within the sender's transfer */
    int32_t first_layer, num_layers;
    int32_t n_pages;
    uint64_t chunk_bytes;
    /* then n_pages int32 destination page ids; the data is, for each page, for each layer, K then V */
} xw_data;

typedef struct xw_ack {
    xw_common c;
    uint64_t xfer_id;
    uint32_t frame;
    int32_t status;
    uint64_t bytes;
    char reason[XW_REASON_LEN];
} xw_ack;

enum { XW_IPC_HANDLE = 0, XW_IPC_CMA = 1 };

typedef struct xw_ipc_map {
    xw_common c;
    uint32_t blob_len;    /* 1..XW_IPC_BLOB_MAX */
    int32_t num_layers;   /* the sender's (equal to the receiver's) */
    uint64_t block_stride; /* bytes between blocks */
    int64_t num_blocks;   /* the sender's page count */
    uint32_t kind;        /* XW_IPC_HANDLE or XW_IPC_CMA */
    uint32_t pad;
} xw_ipc_map;

/* XW_IPC_CMA: the sender's host cache, to be read by the receiver with process_vm_readv (one kernel copy from the
 * sender's scattered pages into the receiver's, the transfer UCX's rendezvous makes over CMA for contiguous
 * buffers only). The receiver answers with a CMA_CHALLENGE: a nonce of its choosing and the name of an abstract
 * Unix socket it listens on; the sender writes the nonce at probe_addr (XW_CMA_PROBE bytes of its own memory),
 * then sends {the receiver's session, the nonce} on that socket (xw_cma_sock_msg). The receiver accepts the map only
 * when the socket's SO_PEERCRED pid is pid (the kernel's word that the process is the sender's: a peer naming
 * another process is refused by name) and the nonce, read back from pid at probe_addr with process_vm_readv, is
 * the one it chose; probe is unused (zero). */
#define XW_CMA_PROBE 16
typedef struct xw_cma_blob {
    uint32_t pid;
    uint32_t pad;
    uint64_t base;        /* the cache's first byte in the sender's address space */
    uint64_t size;        /* its bytes */
    uint64_t probe_addr;
    uint8_t probe[XW_CMA_PROBE];
} xw_cma_blob;

#define XW_SOCK_LEN 48 /* an abstract socket's name (without the leading NUL) */
typedef struct xw_cma_challenge {
    xw_common c;
    uint8_t nonce[XW_CMA_PROBE];
    char sock[XW_SOCK_LEN];
} xw_cma_challenge;

/* What the sender writes on the receiver's abstract socket (one write, then it closes). */
typedef struct xw_cma_sock_msg {
    uint64_t session; /* the receiver's session of the connection (dest_session of its frames) */
    uint8_t nonce[XW_CMA_PROBE];
} xw_cma_sock_msg;

/* XW_IPC_HANDLE: the proof that the handle names the sender's own allocation. After importing the handle the
 * receiver sends IPC_CHALLENGE (XW_NONCE fresh bytes); the sender writes them into its proof area, the tail of its
 * shareable cache's buffer past every page (kvhal_paged_cache_create_shareable reserves it; never a KV page), in a
 * slot of XW_IPC_SLOT bytes of its choosing, and answers IPC_PROOF with the slot's byte offset (status 0), or a
 * status and reason when it cannot. The receiver accepts the map only when the offset lies past every page the map
 * names and inside the imported size, and the XW_NONCE bytes it reads there through the imported mapping are its
 * nonce; a mismatch fails the peer, by name. Until then no page is read (DATA_IPC and OFFER fail the peer). */
#define XW_IPC_SLOT 32
typedef struct xw_ipc_challenge {
    xw_common c;
    uint8_t nonce[XW_NONCE];
} xw_ipc_challenge;

typedef struct xw_ipc_proof {
    xw_common c;
    uint64_t offset;   /* the slot's first byte in the exported buffer */
    int32_t status;    /* 0: the nonce is there; else the sender could not write it (reason) */
    uint32_t pad;
    char reason[XW_REASON_LEN];
} xw_ipc_proof;

typedef struct xw_ipc_map_ack {
    xw_common c;
    int32_t status;
    uint32_t pad;
    char reason[XW_REASON_LEN];
} xw_ipc_map_ack;

typedef struct xw_data_ipc {
    xw_common c;
    uint64_t request_id;
    uint64_t xfer_id;
    uint32_t frame;
    int32_t first_layer, num_layers;
    int32_t n_pages;  /* 1..XW_IPC_FRAME_PAGES pairs follow as data */
} xw_data_ipc;

typedef struct xw_offer {
    xw_common c;
    uint64_t request_id;
    uint64_t xfer_id;
    uint32_t frame;
    int32_t first_layer, num_layers;
    int32_t first_page;  /* the index in the request of the frame's first page */
    int32_t total_pages; /* the request's pages (1..XW_MAX_GRANT): a receive of another size refuses the offer */
    int32_t n_pages;     /* 1..XW_IPC_FRAME_PAGES source page ids follow as data */
} xw_offer;
typedef struct xw_withdraw {
    xw_common c;
    uint64_t request_id;
    uint64_t xfer_id;
} xw_withdraw;
#endif

/* xfer_test.h — the transfer suite's shared helpers (tests/xfer/, one program: test_xfer). The suite tests
 * libkvhal-xfer (suite transfer): a transfer between two agents verified byte by byte against the host pattern on
 * every device present (CPU in place, others staged), and the faults: a wrong token, another cache geometry, hostile
 * frames from a hand-made UCX peer (page ids past the end or not granted, layers out of range, sizes that do not add
 * up, truncated headers, a (page, layer) sent twice, unknown sessions), a stalled peer, a peer process killed
 * mid-transfer, cancel, bad arguments, and the copy workers' own failures (a device copy failing on one, their
 * threads refused, a fork while they hold frames). After each: the receiver's error is clear, not one byte of its
 * cache outside the delivered pages changed, every granted page is back in the cache manager, and (under
 * ASan/valgrind) nothing leaked.
 *
 * The receiver agent B is progressed by a server thread (kvhal_xfer_connect blocks on the connecting side); every
 * call on B takes the lock that thread holds while it progresses. */
#ifndef KVHAL_TEST_XFER_H
#define KVHAL_TEST_XFER_H

#define _GNU_SOURCE /* RTLD_NEXT */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <ucp/api/ucp.h>

#include "kvhal.h"
#include "kvhal_xfer.h"
#include "xfer_internal.h"
#include "xfer_wire.h"
#include "xfer_workers.h"

#define TOKEN "test-token"
#define TIMEOUT_MS 400
#define L 3
#define HEADS 2
#define DIM 8
#define BLOCK 4
#define CHUNK ((size_t)BLOCK * HEADS * DIM * 2) /* f16 */
#define PAGES 64

/* ---------------------------------------------------------------------------------------------------------- */
typedef struct server {
    kvhal_xfer_agent *ag;
    kvhal_paged_cache *cache;
    kvhal_cache_manager *cm;
    kvhal_buffer *buf;
    pthread_t th;
    pthread_mutex_t mu;
    atomic_int stop; /* atomic: read by the server thread (a volatile int was a data race under TSan) */
    kvhal_xfer_event evs[1024];
    int32_t grant_pages[1024][8];
    int nev;
    uint8_t *canary; /* a copy of the whole cache as it was before the test */
    size_t bytes;
} server;

/* ---------------------------------------------------------------------------------------------------------- */
typedef struct raw {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    ucp_address_t *addr;
    size_t alen;
    uint64_t my_session, their_session;
    int hello_status;
    bool got_hello_ack;
    xw_hello_ack ack;     /* the listener's answer as it came */
    xw_hello hello;       /* what raw_open sent */
    xw_auth auth;         /* and its proof (zero when it sent none) */
    uint8_t *cma_write_to; /* where a CMA_CHALLENGE's nonce goes (NULL: its map's probe address) */
    uint8_t *cma_probe_at; /* its CMA map's probe address (raw_map_kind) */
    int cma_challenges;    /* CMA_CHALLENGE frames answered */
    /* the IPC handle's challenge: raw_map_kind answers it by writing the nonce into ipc_own at ipc_proof_at and
     * naming that offset in IPC_PROOF (ipc_own NULL: no answer) */
    kvhal_buffer *ipc_own;
    uint64_t ipc_proof_at;
    bool got_ipc_challenge;
    uint8_t ipc_nonce[XW_NONCE];
    int nacks;
    xw_ack last_ack;
    int ngrants; /* GRANT frames received */
    bool got_map_ack;
    xw_ipc_map_ack map_ack;
    /* frames' memory: a send that did not complete (a rendezvous the receiver never pulls, or pulls after the
     * peer gave up on it) may still be read by UCX, so it is freed only after the worker is destroyed */
    void *keep[256];
    int nkeep;
} raw;

extern const char *tls;
extern atomic_int data_frames, xfer_threads;
extern atomic_int d2d_batches;
extern atomic_bool worker_gate;
extern atomic_int workers_held;
extern atomic_uint threads_refuse;
extern atomic_int refuse_base, threads_refused;
extern pthread_mutex_t gate_mu;
extern size_t vm_read_cap;
extern const char *raw_tcp_seg;
extern const char *self_path;

double now_s(void);
kvhal_status agent_create(const kvhal_xfer_config *cfg, kvhal_xfer_agent **out);
void assert_contains(const char *s, const char *needle);
void gate_set(bool closed);
int gate_count(int *reads);
int created_agent_eps(void);
int open_agent_eps(void);
void *serve(void *arg);
bool tls_cma(const char *t);
kvhal_paged_cache *make_cache(kvhal_device dev, int32_t heads, int64_t pages, kvhal_paged_order order);
kvhal_buffer *cache_buffer(kvhal_paged_cache *pc);
size_t chunk_at(kvhal_paged_cache *pc, int32_t l, int kv, int32_t page);
void fill_pattern(uint8_t *out, size_t n, uint64_t seed);
void server_start(server *s, kvhal_device dev, uint32_t timeout_ms);
void server_stop(server *s);
size_t server_blob(server *s, uint8_t *blob, size_t cap);
int server_nev(server *s);
int wait_event(server *s, kvhal_xfer_event_type type, int from, double seconds);
void check_cache(server *s, const int32_t *pages, int32_t n);
void all_pages_free(server *s);
kvhal_status grant(server *s, kvhal_xfer_peer *peer, uint64_t req, int32_t n, int32_t *pages, kvhal_xfer **x);
kvhal_status wait_recv(server *s, kvhal_xfer *x, double seconds, char *msg, size_t cap);
void sender_grant(kvhal_xfer_agent *a, kvhal_xfer_event *ev);
void raw_progress(raw *r, double seconds);
void raw_send(raw *r, const void *hdr, size_t hlen, const void *data, size_t dlen, uint32_t flags);
void raw_open_v(raw *r, const uint8_t *blob, size_t len, const char *token, uint16_t version);
void raw_open(raw *r, const uint8_t *blob, size_t len, const char *token);
xw_transcript raw_transcript(const raw *r);
void raw_close(raw *r);
void raw_data(raw *r, uint64_t session, uint64_t req, int32_t first, int32_t nl, const int32_t *pages,
                     int32_t n, size_t hlen_cut, size_t dlen, uint64_t chunk, uint32_t flags);
size_t cpu_server(server *s, uint32_t timeout_ms, uint8_t *blob, size_t cap);
void fork_fails_held(server *s, kvhal_xfer *x, kvhal_cache_manager *cm, kvhal_xfer_peer *drop,
                            const char *what);
void test_transfer_every_device(void **state);
void test_wrong_token_and_geometry(void **state);
void test_wire_version(void **state);
void test_hostile_frames(void **state);
void test_cancel_and_duplicates(void **state);
void test_stalled_peer(void **state);
void test_many_peers(void **state);
void test_peer_killed_mid_transfer(void **state);
void test_bad_arguments(void **state);
void test_destroy_in_flight(void **state);
void test_silent_agent_and_destroy_with_grants(void **state);
int ipc_sender_main(int argc, char **argv);
void test_ipc_two_processes(void **state);
void raw_keep(raw *r, void *p);
void raw_ipc_prove(raw *r);
void raw_map_kind(raw *r, uint32_t kind, const uint8_t *blob, size_t blen, const uint64_t *off,
                         uint64_t stride, int64_t blocks, bool wait_ack);
xw_cma_blob cma_blob(uint32_t pid, const void *base, uint64_t size, uint8_t *probe);
void raw_data_ipc(raw *r, uint64_t req, int32_t first, int32_t nl, const int32_t *pairs, int32_t n,
                         size_t dlen, uint32_t flags);
kvhal_xfer_peer *raw_mapped(server *s, raw *r, const uint8_t *blob, size_t len, const uint8_t *hblob,
                                   size_t hlen, const uint64_t *off, uint64_t stride);
void check_ipc_pages(server *s, kvhal_paged_cache *hc, const uint8_t *hpat, const int32_t *src,
                            const int32_t *dst, int n);
kvhal_paged_cache *shareable_cpu_cache(uint64_t seed, uint8_t **hpat);
void test_hostile_ipc(void **state);
void test_ipc_chain(void **state);
void test_ipc_bystander(void **state);
void test_cma_copies_in_flight(void **state);
kvhal_xfer_peer *connect_to(server *s, kvhal_xfer_agent *a, kvhal_paged_cache *c, kvhal_xfer_peer **pb);
void test_gathers_in_flight(void **state);
void test_recv_staging_in_flight(void **state);
void test_dropped_peers_close_endpoints(void **state);
void test_worker_copy_fails(void **state);
void test_worker_threads_refused(void **state);
void test_fork_with_frames_held(void **state);
void test_offers(void **state);
void test_stream_two_processes(void **state);
void test_stream_peer_killed(void **state);
void test_stream_slow_receiver(void **state);
void test_impostor_listener(void **state);
void test_replayed_hello(void **state);
void test_cma_bystander(void **state);
void test_grant_flood(void **state);
void test_double_destroy(void **state);
void test_peer_reason_printable(void **state);
void test_listener_after_fd_exhaustion(void **state);
void test_net_devices(void **state);
int listener_fds_main(int argc, char **argv);
extern pid_t vm_watch_pid;
extern const char *server_token;
extern uint64_t raw_chunk;
extern const raw *raw_replay;
extern int vm_watch_reads;

#endif

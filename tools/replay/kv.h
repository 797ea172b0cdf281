/* kv.h — kvhal-replay's paged cache and the K/V content it writes and reads back.
 *
 * The row of a token (all heads x dim of one layer, K or V) is a slice of a fixed random table, starting at an
 * offset drawn from (prefix hash, layer, K/V): generating it is a memcpy, and any other prefix, layer or side
 * lands elsewhere in the table. Values are small integers, exact in every cache dtype including fp8. */
#ifndef KVHAL_REPLAY_KV_H
#define KVHAL_REPLAY_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kvhal.h"
#include "options.h"

#define TABLE_N (1u << 16)

typedef struct kvstate {
    kvhal_device dev;
    kvhal_paged_cache *cache;
    kvhal_dtype cdt, idt;
    size_t ces, ies;
    int32_t layers, heads, dim, ps;
    size_t row;               /* heads * dim elements */
    uint8_t *tab_in, *tab_cache;
    size_t chunk;
    kvhal_buffer *kbuf, *vbuf, *sbuf;
    uint8_t *khost, *vhost;
    int64_t *shost;
    kvhal_tensor *layer_k, *layer_v; /* views for read-back */
    uint8_t *readbuf;
} kvstate;

/* The device (KVHAL_DEVICE), the paged cache of o and the staging buffers; *num_pages: the cache's pages. 0, or
 * -1 with the failure reported (kv_free still frees what was made). */
int kv_init(kvstate *kv, const options *o, int64_t *num_pages);
void kv_free(kvstate *kv);
/* Writes K and V of n tokens (prefix hashes hash[i], cache slots slots[i]) in every layer; adds the time of the
 * paged-caching calls to *t_write and the bytes written to *bytes_written. On an error *what names the step. */
kvhal_status kv_write(kvstate *kv, const uint64_t *hash, const int64_t *slots, size_t n, double *t_write,
                      uint64_t *bytes_written, const char **what);
/* Reads back the row (side 0: K, 1: V) at page, offset of layer and compares it with the content of the prefix
 * hash: *bad_head is -1 when it matches, else the first head that differs. */
kvhal_status kv_check_row(kvstate *kv, uint64_t hash, int32_t layer, int side, int64_t page, int64_t off,
                          int32_t *bad_head);

#endif

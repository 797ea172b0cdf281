/* xfer_pools.c — the agent's buffer pools: bounce buffers for gathered frames, staging buffers (pinned host memory
 * of the device where the backend can) for a device cache's frames. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_rooms.h"

static void bounce_put(kvhal_xfer_agent *a, void *p);

/* A gathered frame was sent (or will not be): its bounce buffer goes back to the pool. */
void frame_unbounce(kvhal_xfer_agent *a, send_frame *f)
{
    if (!f->bounce) return;
    bounce_put(a, f->bounce);
    f->bounce = NULL;
    a->gathered -= f->bytes;
}

/* Bounce buffers for the contiguous path (see kvhal_xfer_send_pages): reused, so that a frame does not pay for
 * fresh pages (a large malloc is an mmap whose pages the kernel clears on first touch). */
void *bounce_get(kvhal_xfer_agent *a, size_t len)
{
    int best = -1;
    for (int i = 0; i < BOUNCE_POOL; i++)
        if (a->pool[i].p && a->pool[i].cap >= len && (best < 0 || a->pool[i].cap < a->pool[best].cap)) best = i;
    if (best < 0) {
        size_t *b = malloc(64 + (len ? len : 1));
        if (!b) return NULL;
        b[0] = len;
        return (uint8_t *)b + 64;
    }
    void *p = a->pool[best].p;
    a->pool_bytes -= a->pool[best].cap;
    a->pool[best].p = NULL;
    return p;
}

static void bounce_put(kvhal_xfer_agent *a, void *p)
{
    if (!p) return;
    size_t *b = (size_t *)(void *)((uint8_t *)p - 64);
    if (a->pool_bytes + b[0] <= BOUNCE_POOL_BYTES)
        for (int i = 0; i < BOUNCE_POOL; i++)
            if (!a->pool[i].p) {
                a->pool[i].p = p;
                a->pool[i].cap = b[0];
                a->pool_bytes += b[0];
                return;
            }
    free(b);
}

void bounce_pool_free(kvhal_xfer_agent *a)
{
    for (int i = 0; i < BOUNCE_POOL; i++)
        if (a->pool[i].p) free((uint8_t *)a->pool[i].p - 64);
    memset(a->pool, 0, sizeof a->pool);
    a->pool_bytes = 0;
}

/* Staging buffers of a device cache's frames: host memory of the cache's device (pinned on CUDA and HIP, so that
 * the copies run at the link's speed and UCX reads and writes memory that stays put), reused because pinning is
 * slow (milliseconds for megabytes). The smallest idle one that fits and wastes at most half, else a new one. */
static kvhal_host_memory *stage_get(kvhal_xfer_agent *a, size_t len)
{
    if (len > STAGE_POOL_BYTES || a->stage_live + len > STAGE_PINNED_MAX) return NULL; /* pageable then */
    int best = -1;
    for (int i = 0; i < STAGE_POOL; i++) {
        const size_t cap = a->stage_pool[i] ? kvhal_host_memory_size(a->stage_pool[i]) : 0;
        if (cap >= len && cap / 2 <= len &&
            (best < 0 || cap < kvhal_host_memory_size(a->stage_pool[best])))
            best = i;
    }
    if (best >= 0) {
        kvhal_host_memory *m = a->stage_pool[best];
        a->stage_pool[best] = NULL;
        a->stage_pool_bytes -= kvhal_host_memory_size(m);
        a->stage_live += kvhal_host_memory_size(m);
        return m;
    }
    kvhal_host_memory *m = NULL;
    if (kvhal_host_memory_create(kvhal_buffer_device(a->cache_buf), len ? len : 1, &m) != KVHAL_OK) m = NULL;
    kvhal_clear_error();
    if (m) a->stage_live += kvhal_host_memory_size(m);
    return m;
}

/* A frame's staging: pinned from the pool where it may (stage_get), else malloc'd; *mem says which (NULL: malloc). */
void *stage_alloc(kvhal_xfer_agent *a, size_t len, kvhal_host_memory **mem)
{
    *mem = stage_get(a, len);
    return *mem ? kvhal_host_memory_ptr(*mem) : malloc(len ? len : 1);
}

static void stage_put(kvhal_xfer_agent *a, kvhal_host_memory *m)
{
    if (!m) return;
    const size_t cap = kvhal_host_memory_size(m);
    a->stage_live -= cap;
    if (a->stage_pool_bytes + cap <= STAGE_POOL_BYTES)
        for (int i = 0; i < STAGE_POOL; i++)
            if (!a->stage_pool[i]) {
                a->stage_pool[i] = m;
                a->stage_pool_bytes += cap;
                return;
            }
    kvhal_host_memory_destroy(m);
}

/* Gives a frame's staging back: to the pool (pinned) or to the heap (stage_alloc's malloc). */
void stage_release(kvhal_xfer_agent *a, kvhal_host_memory *mem, void *p)
{
    if (mem) stage_put(a, mem);
    else free(p);
}

void stage_pool_free(kvhal_xfer_agent *a)
{
    for (int i = 0; i < STAGE_POOL; i++) kvhal_host_memory_destroy(a->stage_pool[i]);
    memset(a->stage_pool, 0, sizeof a->stage_pool);
    a->stage_pool_bytes = 0;
    kvhal_stream_destroy(a->stage_stream);
    a->stage_stream = NULL;
}

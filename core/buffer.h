/* buffer.h — buffers and streams (buffer.c): their structs and the checks of their handles. */
#ifndef KVHAL_CORE_BUFFER_H
#define KVHAL_CORE_BUFFER_H

#include "registry.h"

enum { KVHAL__BUF_PLAIN = 0, KVHAL__BUF_SHAREABLE = 1, KVHAL__BUF_IMPORTED = 2 };
struct kvhal_buffer {
    uint32_t magic;
    bool owned;              /* created by kvhal (freed on destroy) or wrapped (borrowed) */
    uint8_t ipc;             /* KVHAL__BUF_PLAIN, _SHAREABLE (buffer_alloc_shareable), _IMPORTED (ipc_import) */
    kvhal_device device;
    const kvhal__bk *backend;
    void *native;
    size_t size;
};

struct kvhal_stream {
    uint32_t magic;
    bool owned;
    kvhal_device device;
    const kvhal__bk *backend;
    void *bk_stream;         /* what the backend's stream_create/stream_wrap returned */
};

/* Validates a buffer handle (non-NULL, live magic); the message names argname. */
KVHAL_HIDDEN kvhal_status kvhal__check_buffer(const kvhal_buffer *b, const char *argname);
KVHAL_HIDDEN kvhal_status kvhal__check_stream(const kvhal_stream *s, kvhal_device dev, const char *argname);
/* Backend stream pointer of s (NULL = default). */
static inline void *kvhal__bk_stream(const kvhal_stream *s) { return s ? s->bk_stream : NULL; }

#endif

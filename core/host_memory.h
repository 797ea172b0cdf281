/* host_memory.h — host memory for copies to and from a device (host_memory.c). */
#ifndef KVHAL_CORE_HOST_MEMORY_H
#define KVHAL_CORE_HOST_MEMORY_H

#include "registry.h"

struct kvhal_host_memory {
    uint32_t magic;
    bool pinned;             /* from the backend's host_alloc (else posix_memalign) */
    kvhal_device device;
    const kvhal__bk *backend;
    void *ptr;
    size_t size;
};

/* Validates a host memory handle; the message names argname. */
KVHAL_HIDDEN kvhal_status kvhal__check_host_memory(const kvhal_host_memory *h, const char *argname);

#endif

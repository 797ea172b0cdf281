/* faults.h — fault injection (faults.c): the host allocations the core makes for a caller, and held streams. */
#ifndef KVHAL_CORE_FAULTS_H
#define KVHAL_CORE_FAULTS_H

#include "common.h"

/* Every host allocation the core makes on a caller's behalf goes through these; KVHAL_FAULT_ALLOC=N (or
 * kvhal__fault_set) makes the N-th allocation from then on fail. */
KVHAL_HIDDEN void *kvhal__malloc(size_t n);
KVHAL_HIDDEN void *kvhal__calloc(size_t n, size_t size);
KVHAL_HIDDEN void *kvhal__realloc(void *p, size_t n);
KVHAL_HIDDEN bool kvhal__alloc_should_fail(void);
/* kvhal_fault_hold_streams: queries report BUSY while held; waits are counted (faults.c). */
KVHAL_HIDDEN bool kvhal__streams_held(void);
KVHAL_HIDDEN void kvhal__stream_waited(void);

#endif

/* kvhal_test.h — kvhal's test hooks: fault injection for allocations and held streams. Not part of the API or the
 * ABI: not installed, exported from libkvhal.so.0 under the symbol version KVHAL_TEST_0 (core/libkvhal.map), which
 * the ABI check leaves out (abi/test-hooks.suppr), so they may change in any release. kvhal's own suites, fuzzers
 * and kvhal-conformance's checks use them; an application never needs them. */
#ifndef KVHAL_TEST_H
#define KVHAL_TEST_H

#include <stdint.h>

#include "kvhal.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Test hook: the n-th host or device allocation made on a caller's behalf from now on fails (the call returns
 *  KVHAL_OUT_OF_MEMORY and undoes what it did). KVHAL_FAULT_ALLOC=n in the environment does the same at load.
 *  @param n >= 1 to arm; 0 turns it off.
 *  Thread safety: process-wide (allocations on every thread count). Graph capture: host only (no device work). */
KVHAL_API void kvhal_fault_inject_alloc(int64_t n);
/** Allocations counted since the last kvhal_fault_inject_alloc() call (to walk every allocation point).
 *  @return the count. Thread safety: process-wide. Graph capture: host only. */
KVHAL_API int64_t kvhal_fault_alloc_count(void);
/** Test hook: while hold is nonzero, kvhal_stream_query and the tiered manager's polling of its copies
 *  (kvhal_cache_manager_transfer_query, and the cheap queries inside match and allocate) report the queued work as
 *  still running (KVHAL_BUSY), whatever the device did; waits (kvhal_stream_synchronize, kvhal_device_synchronize)
 *  still complete and are counted. It lets a test keep a copy "in flight" on a device whose copies are synchronous.
 *  @param hold nonzero to hold, 0 to release. The wait count restarts at 0.
 *  Thread safety: process-wide. Graph capture: host only (no device work). */
KVHAL_API void kvhal_fault_hold_streams(int hold);
/** Waits (kvhal_stream_synchronize, kvhal_device_synchronize) since the last kvhal_fault_hold_streams() call.
 *  @return the count. Thread safety: process-wide. Graph capture: host only. */
KVHAL_API int64_t kvhal_fault_stream_waits(void);

#ifdef __cplusplus
}
#endif
#endif /* KVHAL_TEST_H */

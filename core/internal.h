/* internal.h — every header of the core at once, for white-box tests that reach into several rooms. Core files
 * include the headers of the rooms they use instead; nothing in a room includes this one. */
#ifndef KVHAL_CORE_INTERNAL_H
#define KVHAL_CORE_INTERNAL_H

#include "buffer.h"
#include "common.h"
#include "desc_cache.h"
#include "device.h"
#include "error.h"
#include "faults.h"
#include "handles.h"
#include "host_memory.h"
#include "ops/tensor_copy.h"
#include "owner.h"
#include "prefix/prefix_owned.h"
#include "prefix/prefix_pages.h"
#include "registry.h"
#include "tensor.h"
#include "tiers/host_tier.h"
#include "tiers/kv_events.h"
#include "tiers/tier.h"
#include "tiers/tiering.h"
#include "version.h"

#endif

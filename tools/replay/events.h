/* events.h — kvhal-replay --events: the cache manager's KV events written out as JSON lines. */
#ifndef KVHAL_REPLAY_EVENTS_H
#define KVHAL_REPLAY_EVENTS_H

#include "replay.h"

/* Events read from the queue per call. */
#define EV_BATCH 1024

/* Writes every queued event (hashes as hex strings: JSON numbers lose 64-bit precision); nothing without
 * --events. Events the ring dropped (an overflow event) are counted in st.events_dropped. The time it takes is
 * not engine time. */
void drain_events(replay *r);

#endif

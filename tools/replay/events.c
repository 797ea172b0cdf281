/* events.c — see events.h. */
#include "events.h"

#include "clock.h"

void drain_events(replay *r)
{
    if (!r->events) return;
    uint64_t t0 = tick();
    static const char *const types[] = {"stored", "removed", "cleared", "overflow"};
    size_t n;
    do {
        kvhal_status st = kvhal_cache_manager_events_read(r->cm, r->evbuf, r->evtok, EV_BATCH, &n);
        if (st != KVHAL_OK) {
            fatal_status(r, "events", st);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            const kvhal_kv_event *e = &r->evbuf[i];
            fprintf(r->events, "{\"type\": \"%s\", \"tier\": \"%s\"", types[e->type & 3],
                    e->tier == KVHAL_TIER_HOST ? "host" : "device");
            if (e->type == KVHAL_KV_OVERFLOW) {
                fprintf(r->events, ", \"dropped\": %llu}\n", (unsigned long long)e->dropped);
                r->st.events_dropped += e->dropped;
                continue;
            }
            if (e->type != KVHAL_KV_CLEARED)
                fprintf(r->events, ", \"hash\": \"%016llx\", \"page\": %d", (unsigned long long)e->hash, (int)e->page);
            if (e->type == KVHAL_KV_STORED) {
                fprintf(r->events, ", \"parent_hash\": \"%016llx\", \"tokens\": [", (unsigned long long)e->parent_hash);
                for (int32_t k = 0; k < e->num_tokens; k++)
                    fprintf(r->events, "%s%d", k ? ", " : "", (int)r->evtok[i * (size_t)r->ps + (size_t)k]);
                fputc(']', r->events);
            }
            fputs("}\n", r->events);
        }
        r->st.events_written += n;
    } while (n == EV_BATCH);
    r->excluded += tick() - t0;
}

/* xfer_util.c — the bottom room: the clock and deadlines, names, session ids, handle checks, the host's identity,
 * page-list checks and the progress loops' waits. It calls no other room. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "xfer_rooms.h"

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t random_session(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = now_ns() * 0x9e3779b97f4a7c15ull;
    }
    return v;
}

void copy_name(char *dst, size_t cap, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
    dst[i] = '\0';
}

void printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

uint64_t deadline_from_now(const kvhal_xfer_agent *a) { return now_ns() + (uint64_t)a->timeout_ms * 1000000ull; }

kvhal_status check_agent(const kvhal_xfer_agent *a)
{
    CHECK_ARG(a, "agent: NULL");
    if (!kvhal__handle_live(a, AGENT_MAGIC))
        return ERR(KVHAL_INVALID_HANDLE, "agent: %p is not a live transfer agent", (void *)a);
    return KVHAL_OK;
}

kvhal_status check_peer(const kvhal_xfer_peer *p)
{
    CHECK_ARG(p, "peer: NULL");
    if (!kvhal__handle_live(p, PEER_MAGIC) || p->state == P_AUTH)
        return ERR(KVHAL_INVALID_HANDLE, "peer: %p is not a live transfer peer", (void *)p);
    if (p->state == P_FAILED) return ERR(p->fail_status, "peer %s: %s", p->name, p->fail_msg);
    return KVHAL_OK;
}

kvhal_status check_xfer(const kvhal_xfer *x)
{
    CHECK_ARG(x, "xfer: NULL");
    if (!kvhal__handle_live(x, XFER_MAGIC) || x->released)
        return ERR(KVHAL_INVALID_HANDLE, "xfer: %p is not a live transfer", (const void *)x);
    return KVHAL_OK;
}

/* Waiting in the progress loops. A side that naps while a transfer moves stalls the shared-memory FIFO or the
 * socket its peer waits on (the FIFO holds about 64 us of data), so rounds in which UCX did something (work: what
 * pump returned) reset the idle count, and only 2000 idle rounds in a row lead to 20 us naps. Every 64th round
 * yields the CPU: free on an idle core, and on a busy host it lets the peer process (or anyone) run instead of
 * this loop's spinning. */
void idle_wait(idle_state *w, unsigned work)
{
    if (work) w->idle = 0;
    else if (++w->idle >= 2000) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        return;
    }
    if ((++w->rounds & 63) == 0) sched_yield();
}

/* "boot_id/hostname": two agents with the same one run on the same host (kernel instance). */
void host_identity(char *out, size_t cap)
{
    char boot[64] = "", host[72] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    host[sizeof host - 1] = '\0';
    snprintf(out, cap, "%s/%s", boot, host);
}

kvhal_status check_pages(const char *arg, const int32_t *pages, int32_t n, int64_t limit)
{
    for (int32_t i = 0; i < n; i++)
        if (pages[i] < 0 || pages[i] >= limit)
            return ERR(KVHAL_OUT_OF_RANGE, "%s[%d]: page %d is out of range [0, %lld)", arg, (int)i, (int)pages[i],
                       (long long)limit);
    return KVHAL_OK;
}

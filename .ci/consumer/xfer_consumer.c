/* A consumer of libkvhal-xfer (pkg-config kvhal-xfer, or CMake's kvhal::xfer): creates a transfer agent and
 * destroys it, which needs the library, its header and UCX at run time. */
#include <stdio.h>

#include <kvhal_xfer.h>

int main(void)
{
    kvhal_xfer_config cfg = {0};
    cfg.name = "consumer";
    cfg.token = "t";
    kvhal_xfer_agent *a = NULL;
    kvhal_status st = kvhal_xfer_agent_create(&cfg, &a);
    if (st != KVHAL_OK) {
        fprintf(stderr, "kvhal_xfer_agent_create: %s: %s\n", kvhal_status_name(st), kvhal_last_error());
        return 1;
    }
    printf("libkvhal-xfer agent created and destroyed (kvhal %s)\n", kvhal_version());
    return kvhal_xfer_agent_destroy(a) == KVHAL_OK ? 0 : 1;
}

/* secure_env_helper.c — run by test_d1_secure_execution_ignores_module_env (tests/test_reliability.c) as a
 * set-user-id copy: prints whether the process runs in secure execution (AT_SECURE) and whether the npu module that
 * KVHAL_BACKEND_PATH names was loaded. Linked with the core statically, so that no library path is needed. */
#include <stdio.h>
#include <sys/auxv.h>

#include "kvhal.h"

int main(void)
{
    kvhal_device_type t;
    int loaded = kvhal_device_type_find("npu", &t) == KVHAL_OK;
    printf("secure=%lu npu=%s\n", getauxval(AT_SECURE), loaded ? "loaded" : "absent");
    return 0;
}

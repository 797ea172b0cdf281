/* fuzz_device.c — libFuzzer target for the device-string parser: any input must be accepted or rejected with a
 * status and message, never crash; an accepted string must format back to a string that parses to the same device. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvhal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    kvhal_device d, d2;
    if (kvhal_device_parse(s, &d) == KVHAL_OK) {
        char buf[32];
        if (kvhal_device_format(d, buf, sizeof buf) != KVHAL_OK) abort();
        if (kvhal_device_parse(buf, &d2) != KVHAL_OK || d2.type != d.type || d2.id != d.id) abort();
        if (d.id < 0 || d.id >= KVHAL_MAX_DEVICES_PER_TYPE) abort();
    } else if (kvhal_last_error()[0] == '\0') {
        abort(); /* a rejection must say why */
    }
    free(s);
    return 0;
}

/* device.c — device names ("cuda:1"), KVHAL_DEVICE, device info, synchronize and the device-side error check. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "error.h"
#include "faults.h"
#include "registry.h"

bool kvhal__device_equal(kvhal_device a, kvhal_device b) { return a.type == b.type && a.id == b.id; }

kvhal_status kvhal_device_parse(const char *text, kvhal_device *out)
{
    KVHAL_CHECK_ARG(text, "text: NULL");
    KVHAL_CHECK_ARG(out, "out: NULL");
    const char *colon = strchr(text, ':');
    size_t tlen = colon ? (size_t)(colon - text) : strlen(text);
    int type = kvhal__find_type(text, tlen);
    if (type < 0) return kvhal__type_error(KVHAL_PARSE_ERROR, "text", text, tlen);
    long id = 0;
    if (colon) {
        const char *p = colon + 1;
        if (!isdigit((unsigned char)*p))
            return kvhal__err(KVHAL_PARSE_ERROR, "text: \"%.64s\": expected a device id (digits) after ':'", text);
        char *end;
        errno = 0;
        id = strtol(p, &end, 10);
        if (*end != '\0')
            return kvhal__err(KVHAL_PARSE_ERROR, "text: \"%.64s\": trailing characters after the device id", text);
        if (errno || id >= KVHAL_MAX_DEVICES_PER_TYPE)
            return kvhal__err(KVHAL_PARSE_ERROR, "text: \"%.64s\": device id must be below %d", text,
                              KVHAL_MAX_DEVICES_PER_TYPE);
    }
    out->type = (kvhal_device_type)type;
    out->id = (int32_t)id;
    return KVHAL_OK;
}

kvhal_status kvhal_device_format(kvhal_device dev, char *buf, size_t buf_size)
{
    KVHAL_CHECK_ARG(buf && buf_size > 0, "buf: NULL or buf_size 0");
    KVHAL_CHECK_ARG(kvhal__type_registered(dev.type), "dev.type: %d is not a registered device type", (int)dev.type);
    KVHAL_CHECK_ARG(dev.id >= 0, "dev.id: %d is negative", dev.id);
    int n = snprintf(buf, buf_size, "%s:%d", kvhal_device_type_name(dev.type), dev.id);
    if (n < 0 || (size_t)n >= buf_size)
        return kvhal__err(KVHAL_OUT_OF_RANGE, "buf_size: %zu is too small for \"%s:%d\"", buf_size,
                          kvhal_device_type_name(dev.type), dev.id);
    return KVHAL_OK;
}

kvhal_status kvhal_device_default(kvhal_device *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    const char *v = getenv("KVHAL_DEVICE");
    kvhal_device d = {KVHAL_DEVICE_CPU, 0};
    if (v && *v) {
        kvhal_status st = kvhal_device_parse(v, &d);
        if (st != KVHAL_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s", kvhal_last_error());
            return kvhal__err(st, "KVHAL_DEVICE=\"%.64s\": malformed or unknown (expected <type>[:<id>]): %s", v,
                              msg);
        }
    }
    const kvhal__bk *b;
    if (kvhal__lookup(d, "KVHAL_DEVICE", &b) != KVHAL_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", kvhal_last_error());
        return kvhal__err(KVHAL_NO_DEVICE, "KVHAL_DEVICE=\"%.64s\": device not present (%s)", v ? v : "", msg);
    }
    *out = d;
    return KVHAL_OK;
}

kvhal_status kvhal_device_get_info(kvhal_device dev, kvhal_device_info *out)
{
    KVHAL_CHECK_ARG(out, "out: NULL");
    const kvhal__bk *b;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &b));
    memset(out, 0, sizeof *out);
    KVHAL_TRY(b->dev.device_info(b->ctx, dev.id, out));
    out->device = dev;
    snprintf(out->backend, sizeof out->backend, "%s", kvhal_device_type_name(dev.type));
    return KVHAL_OK;
}

kvhal_status kvhal_device_synchronize(kvhal_device dev)
{
    const kvhal__bk *b;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &b));
    kvhal__stream_waited();
    return b->dev.synchronize(b->ctx, dev.id);
}

kvhal_status kvhal_device_check_errors(kvhal_device dev)
{
    const kvhal__bk *b;
    KVHAL_TRY(kvhal__lookup(dev, "dev", &b));
    return b->dev.check_errors ? b->dev.check_errors(b->ctx, dev.id) : b->dev.synchronize(b->ctx, dev.id);
}

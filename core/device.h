/* device.h — devices (device.c). */
#ifndef KVHAL_CORE_DEVICE_H
#define KVHAL_CORE_DEVICE_H

#include "common.h"

KVHAL_HIDDEN bool kvhal__device_equal(kvhal_device a, kvhal_device b);

#endif

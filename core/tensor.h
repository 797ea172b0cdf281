/* tensor.h — tensor checks and the backend's view of a tensor (tensor.c). */
#ifndef KVHAL_CORE_TENSOR_H
#define KVHAL_CORE_TENSOR_H

#include "common.h"

/* Validates t and names it argname in the message. */
KVHAL_HIDDEN kvhal_status kvhal__check_tensor(const kvhal_tensor *t, const char *argname);
KVHAL_HIDDEN void kvhal__to_bk_tensor(const kvhal_tensor *t, kvhal_bk_tensor *out);

#endif

/* tensor_copy.h — what the static cache needs of the tensor copy op beyond the API (tensor_copy.c). */
#ifndef KVHAL_CORE_OPS_TENSOR_COPY_H
#define KVHAL_CORE_OPS_TENSOR_COPY_H

#include "common.h"

/* Two tensor copies (K and V of a static cache) that either both run or fail before either writes: all
 * validation and descriptor allocation comes first. names: argument names of dst0, src0, dst1, src1. */
KVHAL_HIDDEN kvhal_status kvhal__tensor_copy_pair(const kvhal_tensor *dst0, const kvhal_tensor *src0,
                                                  const kvhal_tensor *dst1, const kvhal_tensor *src1,
                                                  const char *const names[4], kvhal_stream *s);

#endif

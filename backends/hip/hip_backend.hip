/* hip_backend.hip — the HIP backend module (libkvhal-hip.so): the shared GPU host code and kernels of
 * backends/common built with hipcc for every --offload-arch in the hip_targets option. */
#define KVHAL_GPU_HIP 1
#include "kvhal_gpu_backend_impl.h"

/* cuda_backend.cu — the CUDA backend module (libkvhal-cuda.so): the shared GPU host code and kernels of
 * backends/common built with nvcc against the CUDA runtime. Nothing here is CUDA-specific beyond that choice. */
#include "kvhal_gpu_backend_impl.h"

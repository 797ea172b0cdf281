/* kvhal_gpu_runtime.h — the one place where the CUDA and HIP backends differ: it maps the gpu* names used by the
 * shared host code (gpu_*.cu, gpu_private.h) and kernels (kvhal_gpu_kernels.cuh) onto the CUDA runtime or onto HIP.
 * The same sources build both: hipcc -x hip compiles them for HIP (clang defines __HIP__, which selects HIP here,
 * as does defining KVHAL_GPU_HIP), nvcc for CUDA, the default. Only names the backends use are mapped, so a
 * missing one shows up as a compile error on the vendor that lacks it. */
#ifndef KVHAL_GPU_RUNTIME_H
#define KVHAL_GPU_RUNTIME_H

#if defined(__HIP__) && !defined(KVHAL_GPU_HIP)
#define KVHAL_GPU_HIP 1
#endif

#if defined(KVHAL_GPU_HIP)
#ifndef __HIPCC_RTC__ /* hiprtc (the run-time compiled kernels, gpu_codepath.cu) has these built in */
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#endif

#define KVHAL_GPU_NAME "hip"
#define KVHAL_GPU_GRID_CONSTANT /* HIP reads kernel parameters in place */
#define KVHAL_GPU_RUNTIME_NAME "HIP"

#ifndef __HIPCC_RTC__ /* host types: the run-time compiled kernels need none */
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipEvent_t gpuEvent_t;
typedef hipDeviceProp_t gpuDeviceProp;
typedef hipMemPool_t gpuMemPool_t;
typedef hipMemPoolProps gpuMemPoolProps;
typedef hipMemAccessDesc gpuMemAccessDesc;
#endif
#define gpuMemAllocationTypePinned hipMemAllocationTypePinned
#define gpuMemHandleTypeNone hipMemHandleTypeNone
#define gpuMemLocationTypeDevice hipMemLocationTypeDevice
#define gpuMemAccessFlagsProtReadWrite hipMemAccessFlagsProtReadWrite
#define gpuMemPoolAttrReleaseThreshold hipMemPoolAttrReleaseThreshold
#define gpuDevAttrMemoryPoolsSupported hipDeviceAttributeMemoryPoolsSupported
#define gpuMemPoolCreate hipMemPoolCreate
#define gpuMemPoolSetAttribute hipMemPoolSetAttribute
#define gpuMemPoolSetAccess hipMemPoolSetAccess
#define gpuMemPoolTrimTo hipMemPoolTrimTo
#define gpuMallocFromPoolAsync hipMallocFromPoolAsync
#define gpuFreeAsync hipFreeAsync
#define gpuSuccess hipSuccess
#define gpuErrorNotReady hipErrorNotReady
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
#define gpuErrorPeerAccessAlreadyEnabled hipErrorPeerAccessAlreadyEnabled
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount

#define gpuGetErrorString hipGetErrorString
#define gpuGetErrorName hipGetErrorName
#define gpuGetLastError hipGetLastError
#define gpuFuncGetAttributes hipFuncGetAttributes
#ifndef __HIPCC_RTC__ /* a host type: hiprtc's built-ins have no function attributes */
typedef hipFuncAttributes gpuFuncAttributes;
#endif
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuMemGetInfo hipMemGetInfo
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define gpuDriverGetVersion hipDriverGetVersion
#define gpuDeviceCanAccessPeer hipDeviceCanAccessPeer
#define gpuDeviceEnablePeerAccess hipDeviceEnablePeerAccess
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuMalloc hipMalloc
/* IPC: handles of hipMalloc'd memory; imports opened with peer access enabled as needed */
#ifndef __HIPCC_RTC__ /* a host type: hiprtc's built-ins have no IPC handle */
typedef hipIpcMemHandle_t gpuIpcMemHandle_t;
#endif
#define gpuIpcGetMemHandle hipIpcGetMemHandle
#define gpuIpcOpenMemHandle(p, h) hipIpcOpenMemHandle((p), (h), hipIpcMemLazyEnablePeerAccess)
#define gpuIpcCloseMemHandle hipIpcCloseMemHandle
#define gpuFree hipFree
#define gpuMallocHost(p, n) hipHostMalloc((p), (n), 0)
#define gpuMallocHostMapped(p, n) hipHostMalloc((p), (n), hipHostMallocMapped | hipHostMallocPortable)
#define gpuHostGetDevicePointer hipHostGetDevicePointer
#define gpuFreeHost hipHostFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyPeerAsync hipMemcpyPeerAsync
#define gpuMemsetAsync hipMemsetAsync
#define gpuStreamCreate hipStreamCreate
#define gpuStreamLegacyHandle ((hipStream_t)0) /* HIP's null stream is its legacy default */
#define gpuStreamPerThreadHandle hipStreamPerThread
#define gpuStreamCaptureMode_t hipStreamCaptureMode
#define gpuStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define gpuThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
#define gpuStreamCaptureStatus hipStreamCaptureStatus
#define gpuStreamCaptureStatusNone hipStreamCaptureStatusNone
#define gpuStreamIsCapturing hipStreamIsCapturing
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamQuery hipStreamQuery
#define gpuStreamWaitEvent hipStreamWaitEvent
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventQuery hipEventQuery
#define gpuEventSynchronize hipEventSynchronize

/* f16 bits -> f32 with the hardware conversion (exact). */
#define KVHAL_GPU_HALF_TO_FLOAT(bits) __half2float(__ushort_as_half((unsigned short)(bits)))

#ifndef __HIPCC_RTC__
/* Whether p is device (or managed) memory, and of which device. ROCm 6 renamed memoryType to type. */
static inline gpuError_t gpuPointerDevice(const void *p, int *dev, int *is_device)
{
    hipPointerAttribute_t a;
    hipError_t e = hipPointerGetAttributes(&a, p);
    if (e != hipSuccess) return e;
#if HIP_VERSION_MAJOR >= 6 /* HIP on NVIDIA reports managed memory as type hipMemoryTypeManaged, isManaged 0 */
    *is_device = a.type == hipMemoryTypeDevice || a.type == hipMemoryTypeManaged || a.isManaged;
#else
    *is_device = a.memoryType == hipMemoryTypeDevice || a.isManaged;
#endif
    *dev = a.device;
    return hipSuccess;
}
#endif

#else /* CUDA */
#include <cuda.h> /* driver types only: cuLaunchKernel is looked up at run time, libcuda is not linked */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#define KVHAL_GPU_NAME "cuda"
/* a kernel parameter indexed at run time is read in place, not copied to each thread's local memory */
#define KVHAL_GPU_GRID_CONSTANT __grid_constant__
#define KVHAL_GPU_RUNTIME_NAME "CUDA"

typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaEvent_t gpuEvent_t;
typedef cudaDeviceProp gpuDeviceProp;
typedef cudaMemPool_t gpuMemPool_t;
typedef cudaMemPoolProps gpuMemPoolProps;
typedef cudaMemAccessDesc gpuMemAccessDesc;
#define gpuMemAllocationTypePinned cudaMemAllocationTypePinned
#define gpuMemHandleTypeNone cudaMemHandleTypeNone
#define gpuMemLocationTypeDevice cudaMemLocationTypeDevice
#define gpuMemAccessFlagsProtReadWrite cudaMemAccessFlagsProtReadWrite
#define gpuMemPoolAttrReleaseThreshold cudaMemPoolAttrReleaseThreshold
#define gpuDevAttrMemoryPoolsSupported cudaDevAttrMemoryPoolsSupported
#define gpuMemPoolCreate cudaMemPoolCreate
#define gpuMemPoolSetAttribute cudaMemPoolSetAttribute
#define gpuMemPoolSetAccess cudaMemPoolSetAccess
#define gpuMemPoolTrimTo cudaMemPoolTrimTo
#define gpuMallocFromPoolAsync cudaMallocFromPoolAsync
#define gpuFreeAsync cudaFreeAsync
#define gpuSuccess cudaSuccess
#define gpuErrorNotReady cudaErrorNotReady
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuErrorPeerAccessAlreadyEnabled cudaErrorPeerAccessAlreadyEnabled
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount

#define gpuGetErrorString cudaGetErrorString
#define gpuGetErrorName cudaGetErrorName
#define gpuGetLastError cudaGetLastError
#define gpuFuncGetAttributes cudaFuncGetAttributes
typedef cudaFuncAttributes gpuFuncAttributes;
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuMemGetInfo cudaMemGetInfo
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define gpuDriverGetVersion cudaDriverGetVersion
#define gpuDeviceCanAccessPeer cudaDeviceCanAccessPeer
#define gpuDeviceEnablePeerAccess cudaDeviceEnablePeerAccess
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuMalloc cudaMalloc
/* IPC: handles of cudaMalloc'd memory; imports opened with peer access enabled as needed */
typedef cudaIpcMemHandle_t gpuIpcMemHandle_t;
#define gpuIpcGetMemHandle cudaIpcGetMemHandle
#define gpuIpcOpenMemHandle(p, h) cudaIpcOpenMemHandle((p), (h), cudaIpcMemLazyEnablePeerAccess)
#define gpuIpcCloseMemHandle cudaIpcCloseMemHandle
#define gpuFree cudaFree
#define gpuMallocHost(p, n) cudaMallocHost((p), (n))
#define gpuMallocHostMapped(p, n) cudaHostAlloc((p), (n), cudaHostAllocMapped | cudaHostAllocPortable)
#define gpuHostGetDevicePointer cudaHostGetDevicePointer
#define gpuFreeHost cudaFreeHost
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyPeerAsync cudaMemcpyPeerAsync
#define gpuMemsetAsync cudaMemsetAsync
#define gpuStreamCreate cudaStreamCreate
#define gpuStreamLegacyHandle cudaStreamLegacy
#define gpuStreamPerThreadHandle cudaStreamPerThread
#define gpuStreamCaptureMode_t cudaStreamCaptureMode
#define gpuStreamCaptureModeRelaxed cudaStreamCaptureModeRelaxed
#define gpuThreadExchangeStreamCaptureMode cudaThreadExchangeStreamCaptureMode
#define gpuStreamCaptureStatus cudaStreamCaptureStatus
#define gpuStreamCaptureStatusNone cudaStreamCaptureStatusNone
#define gpuStreamIsCapturing cudaStreamIsCapturing
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamQuery cudaStreamQuery
#define gpuStreamWaitEvent cudaStreamWaitEvent
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventQuery cudaEventQuery
#define gpuEventSynchronize cudaEventSynchronize

/* f16 bits -> f32 with the hardware conversion (exact). */
#define KVHAL_GPU_HALF_TO_FLOAT(bits) __half2float(__ushort_as_half((unsigned short)(bits)))

/* Whether p is device (or managed) memory, and of which device. */
static inline gpuError_t gpuPointerDevice(const void *p, int *dev, int *is_device)
{
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) return e;
    *is_device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    *dev = a.device;
    return cudaSuccess;
}
#endif

#endif /* KVHAL_GPU_RUNTIME_H */

"""kvhal: the key/value caches of LLM inference on any accelerator, from Python.

Arrays go in over DLPack with zero copies (NumPy, PyTorch, CuPy, JAX, kvhal.Tensor): any object with
``__dlpack__``/``__dlpack_device__`` on a device kvhal has (cpu, cuda, hip, opencl). A type that offers the DLPack
C exchange API (``__dlpack_c_exchange_api__``, e.g. recent PyTorch) is read through it, without a Python call per
argument; :func:`dlpack_path` tells which way an array goes. Ops write the caches in place. Page lists come back
as :class:`Pages` (int32, buffer protocol) and go back in without copies. Streams are ``None`` (with torch tensors
torch's current stream of the tensors' device, as torch extensions do; otherwise the device's default stream), an
integer handle, an object with ``__cuda_stream__`` or ``.cuda_stream`` (``torch.cuda.Stream``), or :class:`Stream`,
on the tensors' device whatever torch's current device is: torch's stream (or an exchange-API producer's) is
ordered before the call's with a device event, other producers' per the DLPack stream protocol. Dtypes are kvhal's
names, NumPy's or torch's (``'f16'``, ``'float16'``, ``numpy.float16``, ``torch.float16``). Drop-in calls with
vLLM's and FlashInfer's signatures are in :mod:`kvhal.compat`. Every failure raises a subclass of :class:`Error`
named after its status
(``kvhal.InvalidArgument``, ``kvhal.DeviceFault``, ...), with the message of ``kvhal_last_error``.

GPU work is asynchronous: an out-of-range slot is skipped by the kernel and reported by the next
:func:`check_errors` (per stream) or :func:`synchronize`. ``paged_caching`` and ``tensor_copy`` may be captured
into a CUDA graph (``torch.cuda.graph``), the process's first kvhal call included (with torch tensors and no stream,
the call runs on the capturing stream).
"""
from ._kvhal import *  # noqa: F401,F403
from ._kvhal import (Error, Tensor, Stream, PrefixCache, PrefixHandle, CacheManager, Pages, PagesView, paged_caching,
                     copy_blocks, tensor_copy, empty, from_dlpack, dlpack_path, devices, synchronize, check_errors,
                     last_error, __version__, STREAM_LEGACY, STREAM_PER_THREAD)
from ._kvhal import (PagedCache, TieredCacheManager, KVEvent, BlockPool, Event, paged_caching_mla, kv_root_hash,
                     kv_page_hash)

STATUS_ERRORS = {cls.status: cls for cls in Error.__subclasses__()}
"""Status name ("KVHAL_DEVICE_FAULT") -> its exception class."""

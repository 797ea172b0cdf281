"""kvhal: the key/value caches of LLM inference on any accelerator, from Python.

Arrays go in over DLPack with zero copies (NumPy, PyTorch, CuPy, JAX, kvhal.Tensor): any object with
``__dlpack__``/``__dlpack_device__`` on a device kvhal has (cpu, cuda, hip, opencl). A type that offers the DLPack
C exchange API (``__dlpack_c_exchange_api__``, e.g. recent PyTorch) is read through it, without a Python call per
argument; :func:`dlpack_path` tells which way an array goes. Ops write the caches in place. Page lists come back
as :class:`Pages` (int32, buffer protocol) and go back in without copies. Streams are ``None`` (the device's default stream), an integer handle, an object with ``__cuda_stream__``
or ``.cuda_stream`` (``torch.cuda.Stream``), or :class:`Stream`; the producer's stream is synchronised per the
DLPack stream protocol. Every failure raises a subclass of :class:`Error` named after its status
(``kvhal.InvalidArgument``, ``kvhal.DeviceFault``, ...), with the message of ``kvhal_last_error``.

GPU work is asynchronous: an out-of-range slot is skipped by the kernel and reported by the next
:func:`check_errors` (per stream) or :func:`synchronize`. ``paged_caching`` and ``tensor_copy`` may be captured
into a CUDA graph (``torch.cuda.graph``), the process's first kvhal call included; pass
``stream=torch.cuda.current_stream()`` inside the capture.
"""
from ._kvhal import *  # noqa: F401,F403
from ._kvhal import (Error, Tensor, Stream, PrefixCache, PrefixHandle, CacheManager, Pages, paged_caching,
                     copy_blocks, tensor_copy, empty, from_dlpack, dlpack_path, devices, synchronize, check_errors,
                     last_error, __version__, STREAM_LEGACY, STREAM_PER_THREAD)
from ._kvhal import (PagedCache, TieredCacheManager, KVEvent, BlockPool, Event, paged_caching_mla, kv_root_hash,
                     kv_page_hash)

STATUS_ERRORS = {cls.status: cls for cls in Error.__subclasses__()}
"""Status name ("KVHAL_DEVICE_FAULT") -> its exception class."""

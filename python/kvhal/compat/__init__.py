"""Drop-in calls with the signatures and semantics of other libraries' KV-cache writes, over kvhal's own calls.

- :mod:`kvhal.compat.vllm`: ``reshape_and_cache_flash`` (vLLM's argument order, ``kv_cache_dtype`` strings, fp8
  caches kept as ``uint8``).
- :mod:`kvhal.compat.flashinfer`: ``append_paged_kv_cache`` (FlashInfer's page table: indices, indptr, last-page
  lengths; NHD and HND layouts; a (k, v) tuple or one [pages, 2, ...] tensor).

They take any DLPack arrays kvhal takes (torch, NumPy, CuPy, kvhal.Tensor) and raise :class:`kvhal.Error`
subclasses."""
from . import flashinfer, vllm  # noqa: F401

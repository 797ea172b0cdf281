"""vLLM's KV-cache write, with vLLM's signature and semantics (``vllm._custom_ops.reshape_and_cache_flash``).

``key``, ``value``: [num_tokens, num_heads, head_size]; ``key_cache``, ``value_cache``: the flash layout
[num_blocks, block_size, num_heads, head_size] (any strides); ``slot_mapping``: [n] int64 (or int32), token ``t``
going to block ``slot // block_size``, offset ``slot % block_size``; a negative slot is padding and is skipped.
Only the first ``n = slot_mapping.shape[0]`` tokens of ``key`` and ``value`` are written (vLLM pads them for CUDA
graphs). ``kv_cache_dtype``: ``"auto"`` (the caches have the inputs' dtype; the scales are not read) or ``"fp8"``
(= ``"fp8_e4m3"``, OCP e4m3fn) / ``"fp8_e5m2"``: the caches hold fp8 codes, as ``uint8`` arrays (vLLM's allocation)
or arrays of that fp8 type, and each value is stored as ``value / scale`` rounded to nearest even, saturated to
the largest finite magnitude (vLLM's ``__NV_SATFINITE`` conversion). ``k_scale``, ``v_scale``: floats or
one-element tensors (a tensor on a GPU is read on the host: a synchronisation per call; pass floats where the
scales are fixed). On AMD GPUs whose fp8 is e4m3fnuz, call :func:`kvhal.paged_caching` with
``cache_dtype="fp8_e4m3fnuz"``.
"""
from .._kvhal import _reshape_and_cache_flash

__all__ = ["reshape_and_cache_flash"]


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                            stream=None):
    """Writes key and value into the caches at the slots of slot_mapping (vLLM's reshape_and_cache_flash).
    stream: as for kvhal.paged_caching (None: torch's current stream of the tensors' device). One C call: the
    token count comes from slot_mapping as imported, kv_cache_dtype is checked there, and the scales are read only
    for an fp8 cache."""
    _reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                             stream)

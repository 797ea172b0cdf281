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
from .. import InvalidArgument, paged_caching

_FP8 = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}

__all__ = ["reshape_and_cache_flash"]


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                            stream=None):
    """Writes key and value into the caches at the slots of slot_mapping (vLLM's reshape_and_cache_flash).
    stream: as for kvhal.paged_caching (None: torch's current stream of the tensors' device)."""
    n = slot_mapping.shape[0]
    if kv_cache_dtype == "auto":
        paged_caching(key_cache, value_cache, key, value, slot_mapping, stream=stream, num_tokens=n)
        return
    fmt = _FP8.get(kv_cache_dtype)
    if fmt is None:
        raise InvalidArgument(f"KVHAL_INVALID_ARGUMENT: kv_cache_dtype: {kv_cache_dtype!r} is not one of 'auto', "
                              f"'fp8', 'fp8_e4m3', 'fp8_e5m2'")
    paged_caching(key_cache, value_cache, key, value, slot_mapping, k_scale, v_scale, stream, fmt, n)

"""FlashInfer's KV-cache append, with FlashInfer's signature and semantics (``flashinfer.page.append_paged_kv_cache``).

The page table is FlashInfer's: request ``b`` owns pages ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, its last
page holding ``kv_last_page_len[b]`` entries. Entry ``i`` of ``append_key``/``append_value`` ([nnz, num_kv_heads,
head_dim]) belongs to request ``batch_indices[i]`` at position ``positions[i]`` of its sequence, and is written to
page ``kv_indices[kv_indptr[b] + positions[i] // page_size]``, entry ``positions[i] % page_size``.
``paged_kv_cache``: a tuple ``(k_cache, v_cache)`` of [max_num_pages, page_size, num_kv_heads, head_dim] (NHD) or
[max_num_pages, num_kv_heads, page_size, head_dim] (HND) arrays, or one [max_num_pages, 2, ...] array (K at index 0
of dim 1, V at 1). A position outside its request's sequence (negative, or past the pages the table gives it) is
not written: the call fails with :class:`kvhal.OutOfRange` on the CPU, and GPUs report it through
:func:`kvhal.check_errors` (FlashInfer leaves it undefined).

The slots are computed where the index arrays are: with torch on their device (no synchronisation), with NumPy for
host arrays; a kvhal.Tensor's indices are read on the host, and host slots go to the caches' device when the caches
are elsewhere (kvhal.Tensors or torch tensors).
"""
import numpy as np

from .. import InvalidArgument, Tensor, empty, paged_caching

__all__ = ["append_paged_kv_cache"]


def _bad(msg):
    return InvalidArgument("KVHAL_INVALID_ARGUMENT: " + msg)


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _host(x, arg):
    """A host NumPy view (or copy, for a kvhal.Tensor on a device) of an index array."""
    if isinstance(x, Tensor) and not x.device.startswith("cpu"):
        out = np.empty(x.shape, dtype={"i32": np.int32, "i64": np.int64}.get(x.dtype, np.int64))
        if x.dtype not in ("i32", "i64"):
            raise _bad(f"{arg}: expected an int32 or int64 array, got {x.dtype}")
        x.copy_to(out)
        return out
    a = np.asarray(x) if not hasattr(x, "__dlpack__") or isinstance(x, np.ndarray) else np.from_dlpack(x)
    if a.dtype.kind not in "iu":
        raise _bad(f"{arg}: expected an integer array, got {a.dtype}")
    return a


def _slots(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, page_size, num_pages):
    """The flat slot (page * page_size + entry) of every appended entry; num_pages * page_size (past the cache) for
    a position outside its request's sequence."""
    if _is_torch(positions):
        import torch
        b = batch_indices.long()
        pos = positions.long()
        indptr = kv_indptr.long()
        start, end = indptr[b], indptr[b + 1]
        seq_len = (end - start - 1) * page_size + kv_last_page_len.long()[b]
        it = start + torch.div(pos, page_size, rounding_mode="floor")
        ok = (pos >= 0) & (pos < seq_len) & (it < end)
        idx = kv_indices.long()
        page = idx[it.clamp(0, max(idx.numel() - 1, 0))] if idx.numel() else torch.zeros_like(it)
        return torch.where(ok, page * page_size + pos % page_size, torch.full_like(pos, num_pages * page_size))
    b = _host(batch_indices, "batch_indices").astype(np.int64)
    pos = _host(positions, "positions").astype(np.int64)
    indptr = _host(kv_indptr, "kv_indptr").astype(np.int64)
    last = _host(kv_last_page_len, "kv_last_page_len").astype(np.int64)
    idx = _host(kv_indices, "kv_indices").astype(np.int64)
    if b.shape != pos.shape:
        raise _bad(f"batch_indices: shape {b.shape} differs from positions' {pos.shape}")
    if b.size and (b.min() < 0 or b.max() + 1 >= indptr.size or b.max() >= last.size):
        raise _bad(f"batch_indices: a request index outside 0..{min(indptr.size - 1, last.size) - 1}")
    start, end = indptr[b], indptr[b + 1]
    seq_len = (end - start - 1) * page_size + last[b]
    it = start + pos // page_size
    ok = (pos >= 0) & (pos < seq_len) & (it < end) & (it >= 0)
    page = idx[np.clip(it, 0, max(idx.size - 1, 0))] if idx.size else np.zeros_like(it)
    return np.where(ok, page * page_size + pos % page_size, num_pages * page_size)


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
                          kv_last_page_len, kv_layout="NHD", stream=None):
    """Appends entries to a paged KV cache given FlashInfer's page table (flashinfer.page.append_paged_kv_cache).
    stream: as for kvhal.paged_caching (None: torch's current stream of the tensors' device)."""
    if kv_layout not in ("NHD", "HND"):
        raise _bad(f"kv_layout: {kv_layout!r} is not 'NHD' or 'HND'")
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise _bad("paged_kv_cache: expected (k_cache, v_cache) or one [pages, 2, ...] array")
        k_cache, v_cache = paged_kv_cache
        shape = tuple(k_cache.shape)
        if len(shape) != 4:
            raise _bad(f"paged_kv_cache: k_cache has {len(shape)} dims, not 4")
        page_size = shape[1] if kv_layout == "NHD" else shape[2]
    else:
        k_cache, v_cache = paged_kv_cache, None
        shape = tuple(k_cache.shape)
        if len(shape) != 5 or shape[1] != 2:
            raise _bad(f"paged_kv_cache: a single array is [pages, 2, ...] (5 dims), got shape {shape}")
        page_size = shape[2] if kv_layout == "NHD" else shape[3]
    slots = _slots(batch_indices, positions, kv_indices, kv_indptr, kv_last_page_len, page_size, shape[0])
    if isinstance(slots, np.ndarray) and isinstance(k_cache, Tensor) and not k_cache.device.startswith("cpu"):
        dev_slots = empty(slots.shape, "i64", k_cache.device)
        dev_slots.copy_from(np.ascontiguousarray(slots))
        slots = dev_slots
    elif isinstance(slots, np.ndarray) and _is_torch(k_cache) and k_cache.device.type != "cpu":
        import torch  # host slots of torch caches elsewhere: copied on torch's current stream of that device
        slots = torch.from_numpy(np.ascontiguousarray(slots)).to(k_cache.device, non_blocking=True)
    paged_caching(k_cache, v_cache, append_key, append_value, slots, stream=stream, layout=kv_layout)

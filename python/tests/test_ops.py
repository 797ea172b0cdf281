"""The ops from Python on every present device against the plain host reference: NumPy and torch arrays over
DLPack, every dtype, strides and offsets, kvhal.Tensor in and out, copy_blocks and tensor_copy."""
import numpy as np
import pytest

import kvhal
from conftest import host_reference_paged, torch

RNG = np.random.default_rng(14)
NB, BS, H, D = 6, 4, 2, 8
DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32}


def to_device(a, device):
    """A host array on device: itself on cpu, a kvhal.Tensor copy elsewhere (no DLPack producer there)."""
    if device.startswith("cpu"):
        return a
    t = kvhal.empty(a.shape, {np.float32: "f32", np.float16: "f16", np.int32: "i32", np.int64: "i64"}[a.dtype.type],
                    device)
    t.copy_from(np.ascontiguousarray(a))
    return t


def to_host(t, like):
    if isinstance(t, np.ndarray):
        return t
    out = np.empty(like.shape, like.dtype)
    t.copy_to(out)
    return out


@pytest.mark.parametrize("dt", ["f32", "f16"])
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_paged_caching_numpy(device, dt, slot_dtype):
    npdt = DTYPES[dt]
    kc = np.zeros((NB, BS, H, D), npdt)
    vc = np.zeros((NB, BS, H, D), npdt)
    k = RNG.standard_normal((7, H, D)).astype(npdt)
    v = RNG.standard_normal((7, H, D)).astype(npdt)
    slots = np.array([0, 5, -1, 9, 23, 12, 1], slot_dtype)
    rk, rv = host_reference_paged(kc.copy(), vc.copy(), k, v, slots)
    dkc, dvc = to_device(kc, device), to_device(vc, device)
    kvhal.paged_caching(dkc, dvc, to_device(k, device), to_device(v, device), to_device(slots, device))
    kvhal.synchronize(device)
    assert np.array_equal(to_host(dkc, kc), rk)
    assert np.array_equal(to_host(dvc, vc), rv)


def test_paged_caching_strided_inputs_and_offsets():
    """k, v as views with strides and a byte offset (a slice of a larger array), the HND cache as a permuted view."""
    big = RNG.standard_normal((10, H, 2 * D)).astype(np.float32)
    k = big[2:9, :, ::2]  # strided, offset
    v = big[1:8, :, 1::2]
    store_k = np.zeros((NB, H, BS, D), np.float32)  # HND storage
    store_v = np.zeros((NB, H, BS, D), np.float32)
    kc = store_k.transpose(0, 2, 1, 3)  # logical [blocks, block_size, heads, dim]
    vc = store_v.transpose(0, 2, 1, 3)
    slots = np.array([3, 4, 5, 6, 7, 8, 22], np.int64)[::1]
    rk, rv = host_reference_paged(np.zeros((NB, BS, H, D), np.float32), np.zeros((NB, BS, H, D), np.float32), k, v,
                                  slots)
    kvhal.paged_caching(kc, vc, k, v, slots)
    assert np.array_equal(kc, rk) and np.array_equal(vc, rv)


def test_paged_caching_batched():
    kc = np.zeros((NB, BS, H, D), np.float32)
    vc = np.zeros_like(kc)
    k = RNG.standard_normal((2, 3, H, D)).astype(np.float32)
    v = RNG.standard_normal((2, 3, H, D)).astype(np.float32)
    slots = np.array([[0, 1, 2], [8, 9, -1]], np.int64)
    rk, rv = host_reference_paged(kc.copy(), vc.copy(), k, v, slots)
    kvhal.paged_caching(kc, vc, k, v, slots, 1.0, 1.0, None)
    assert np.array_equal(kc, rk) and np.array_equal(vc, rv)


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_paged_caching_torch(dt):
    tdt = getattr(torch, dt)
    kc = torch.zeros(NB, BS, H, D, dtype=tdt)
    vc = torch.zeros_like(kc)
    k = torch.randn(5, H, D).to(tdt)
    v = torch.randn(5, H, D).to(tdt)
    slots = torch.tensor([2, 7, 11, -1, 20])
    kvhal.paged_caching(kc, vc, k, v, slots, k_scale=torch.tensor([1.0]), v_scale=1.0)
    ek, ev = torch.zeros_like(kc).view(-1, H, D), torch.zeros_like(vc).view(-1, H, D)
    keep = slots >= 0
    ek[slots[keep]] = k[keep]
    ev[slots[keep]] = v[keep]
    assert torch.equal(kc.view(-1, H, D), ek) and torch.equal(vc.view(-1, H, D), ev)


def test_dlpack_out_and_in_round_trip():
    t = kvhal.empty((4, 5), "f32")
    a = np.from_dlpack(t)  # kvhal -> NumPy, zero copies (NumPy 1.x marks it read-only)
    src = np.arange(20, dtype=np.float32).reshape(4, 5)
    t.copy_from(src)
    assert np.array_equal(a, src)  # the same memory
    w = np.arange(20, dtype=np.float32).reshape(4, 5)
    v = kvhal.from_dlpack(w)  # NumPy -> kvhal view of the same memory
    assert v.shape == (4, 5) and v.dtype == "f32" and v.device == "cpu:0"
    assert np.from_dlpack(v).ctypes.data == w.ctypes.data
    t.copy_from(np.full((4, 5), 99.0, np.float32))
    if torch is not None:
        tt = torch.from_dlpack(t)
        assert tt.shape == (4, 5) and float(tt[0, 0]) == 99.0
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_views_keep_strides_and_offsets():
    base = np.arange(60, dtype=np.float32).reshape(6, 10)
    view = base[1:5, 2:9:3]
    t = kvhal.from_dlpack(view)
    assert t.shape == view.shape
    assert t.strides == (10, 3)
    out = kvhal.empty(view.shape, "f32")
    kvhal.tensor_copy(out, view)
    got = np.zeros(view.shape, np.float32)
    out.copy_to(got)
    assert np.array_equal(got, view)


@pytest.mark.parametrize("dt", ["f32", "f16", "i32", "i64"])
def test_tensor_copy_every_device(device, dt):
    npdt = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}[dt]
    src_h = (RNG.standard_normal((3, 7)) * 100).astype(npdt)
    src = to_device(src_h, device)
    dst = kvhal.empty((3, 7), dt, device)
    kvhal.tensor_copy(dst, src)
    kvhal.synchronize(device)
    got = np.zeros_like(src_h)
    dst.copy_to(got)
    assert np.array_equal(got, src_h)


def test_copy_blocks_every_device(device):
    caches_h = [RNG.standard_normal((NB, BS, H, D)).astype(np.float32) for _ in range(3)]
    caches = [to_device(c, device) for c in caches_h]
    pairs = [(0, 3), (1, 4)]
    kvhal.copy_blocks(caches, pairs)
    kvhal.copy_blocks(caches, np.array([[2, 5]], np.int64))
    kvhal.synchronize(device)
    for c, ch in zip(caches, caches_h):
        ref = ch.copy()
        for s, d in pairs + [(2, 5)]:
            ref[d] = ch[s]
        assert np.array_equal(to_host(c, ch), ref)


def test_out_of_range_slot_on_devices_is_reported_per_stream(device):
    """cpu: the op raises OutOfRange and writes nothing; devices: the kernel skips the slot and the stream's
    check (or the device's) raises DeviceFault once."""
    kc = to_device(np.zeros((NB, BS, H, D), np.float32), device)
    vc = to_device(np.zeros((NB, BS, H, D), np.float32), device)
    k = to_device(np.ones((2, H, D), np.float32), device)
    slots = to_device(np.array([1, NB * BS], np.int64), device)
    if device.startswith("cpu"):
        with pytest.raises(kvhal.OutOfRange, match="slot_mapping"):
            kvhal.paged_caching(kc, vc, k, k, slots)
        return
    s = kvhal.Stream(device, kvhal.STREAM_LEGACY)
    kvhal.paged_caching(kc, vc, k, k, slots, stream=s)
    with pytest.raises(kvhal.DeviceFault, match="slot"):
        s.check_errors()
    s.check_errors()  # reported once
    kvhal.check_errors(device)

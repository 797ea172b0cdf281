"""kvhal.BlockPool, kvhal.Event and kvhal.paged_caching_mla against plain host references, on every device."""
import numpy as np
import pytest

import kvhal
from conftest import torch


def test_block_pool_reference_counts():
    p = kvhal.BlockPool(6)
    assert (p.num_total, p.num_free) == (6, 6)
    a = p.allocate(4)
    assert isinstance(a, kvhal.Pages) and len(set(a)) == 4 and p.num_free == 2
    p.share(a[:2])  # an array of ids
    p.share(int(a[0]))  # one id
    assert [p.ref_count(b) for b in a] == [3, 2, 1, 1]
    p.release(np.asarray(a))
    assert [p.ref_count(b) for b in a] == [2, 1, 0, 0] and p.num_free == 4
    with pytest.raises(kvhal.OutOfMemory):
        p.allocate(5)
    assert p.num_free == 4  # all or nothing
    with pytest.raises(kvhal.InvalidArgument, match=r"blocks\[1\]: block .* is free"):
        p.release([a[0], a[2]])
    assert p.ref_count(a[0]) == 2  # nothing changed on the refusal
    with pytest.raises(kvhal.OutOfRange, match=r"blocks\[0\]"):
        p.share([6])
    with pytest.raises(kvhal.OutOfRange, match="block"):
        p.ref_count(-1)
    with pytest.raises(kvhal.InvalidArgument, match="n"):
        p.allocate(-1)
    with pytest.raises(kvhal.InvalidArgument, match="num_blocks"):
        kvhal.BlockPool(0)
    with pytest.raises(kvhal.InvalidArgument, match="blocks"):
        p.share("x")
    p.check_integrity()
    if torch is not None:
        p.release(torch.tensor([int(a[0]), int(a[1])], dtype=torch.int64))
        assert p.ref_count(a[1]) == 0


def test_device_events(device):
    e = kvhal.Event(device)
    assert e.device == device
    assert e.query() is True  # never recorded: complete
    t = kvhal.empty((1 << 16,), "f32", device)
    t.copy_from(np.ones(1 << 16, np.float32))  # work queued before the record
    e.record()
    e.synchronize()
    assert e.query() is True
    e.wait()  # the default stream waits for it
    e.record(stream=None)
    s = kvhal.Stream(device)
    e.record(stream=s)
    e.wait(stream=s)
    e.synchronize()
    if device != "cpu:0":
        with pytest.raises(kvhal.DeviceMismatch, match="stream"):
            e.record(stream=kvhal.Stream("cpu:0"))
    with pytest.raises(kvhal.InvalidArgument, match="stream"):
        e.record(stream="fast")
    with pytest.raises(kvhal.InvalidArgument, match="device"):
        kvhal.Event(3)
    with pytest.raises(kvhal.ParseError):
        kvhal.Event("tpu:0")


def mla_reference(cache, kv_c, k_pe, slots):
    nb, bs = cache.shape[0], cache.shape[1]
    flat = cache.reshape(nb * bs, -1)
    row = kv_c if k_pe is None else np.concatenate([kv_c, k_pe], axis=1)
    for t, s in enumerate(slots):
        if s >= 0:
            flat[s] = row[t]
    return flat.reshape(cache.shape)


@pytest.mark.parametrize("with_pe", [True, False])
def test_paged_caching_mla(device, with_pe):
    rng = np.random.default_rng(5)
    blocks, bs, dc, dpe, n = 4, 4, 16, 8 if with_pe else 0, 6
    cache = kvhal.empty((blocks, bs, dc + dpe), "f32", device)
    kv_c = rng.standard_normal((n, dc)).astype(np.float32)
    k_pe = rng.standard_normal((n, dpe)).astype(np.float32) if with_pe else None
    slots = np.array([3, -1, 0, 15, 7, 8], np.int64)

    def dev(a):
        if device == "cpu:0":
            return a
        t = kvhal.empty(a.shape, "f32", device)
        t.copy_from(a)
        return t

    kvhal.paged_caching_mla(cache, dev(kv_c), dev(k_pe) if with_pe else None, dev(slots) if device == "cpu:0" else
                            _slots(slots, device))
    kvhal.synchronize(device)
    got = np.empty((blocks, bs, dc + dpe), np.float32)
    cache.copy_to(got)
    want = mla_reference(np.zeros_like(got), kv_c, k_pe, slots)
    np.testing.assert_array_equal(got, want)


def _slots(slots, device):
    t = kvhal.empty(slots.shape, "i64", device)
    t.copy_from(slots)
    return t


def test_paged_caching_mla_bad_arguments():
    cache = kvhal.empty((2, 4, 8), "f32")
    kv_c = np.zeros((2, 6), np.float32)
    with pytest.raises(kvhal.InvalidArgument, match="scale"):
        kvhal.paged_caching_mla(cache, kv_c, np.zeros((2, 2), np.float32), np.zeros(2, np.int32), scale="big")
    with pytest.raises(kvhal.ShapeMismatch):
        kvhal.paged_caching_mla(cache, kv_c, np.zeros((2, 3), np.float32), np.zeros(2, np.int32))
    with pytest.raises(kvhal.InvalidArgument, match="kv_c"):
        kvhal.paged_caching_mla(cache, "kv", None, np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="slot_mapping"):
        kvhal.paged_caching_mla(cache, kv_c, None)


def test_paged_caching_mla_large_on_the_host():
    """A write large enough that the call releases the GIL, against the reference."""
    rng = np.random.default_rng(9)
    n, dc, dpe = 1024, 64, 16
    cache = np.zeros((64, 16, dc + dpe), np.float32)
    kv_c = rng.standard_normal((n, dc)).astype(np.float32)
    k_pe = rng.standard_normal((n, dpe)).astype(np.float32)
    slots = rng.permutation(n).astype(np.int64)
    want = mla_reference(cache.copy(), kv_c, k_pe, slots)
    kvhal.paged_caching_mla(cache, kv_c, k_pe, slots)
    np.testing.assert_array_equal(cache, want)

"""Errors as exceptions and bad arguments: every refusal is a kvhal.Error subclass named after its status, with the
message of kvhal_last_error naming the argument; nothing is written."""
import numpy as np
import pytest

import kvhal
from conftest import torch


def caches():
    return np.zeros((4, 2, 2, 8), np.float32), np.zeros((4, 2, 2, 8), np.float32)


def test_hierarchy():
    assert issubclass(kvhal.InvalidArgument, kvhal.Error) and issubclass(kvhal.InvalidArgument, ValueError)
    assert issubclass(kvhal.OutOfRange, IndexError)
    assert kvhal.DeviceFault.status == "KVHAL_DEVICE_FAULT"
    assert len(kvhal.STATUS_ERRORS) == 22  # every status of kvhal.h but KVHAL_OK
    assert kvhal.STATUS_ERRORS["KVHAL_PEER_FAILED"].status == "KVHAL_PEER_FAILED"
    assert kvhal.STATUS_ERRORS["KVHAL_SHAPE_MISMATCH"] is kvhal.ShapeMismatch


def test_shape_mismatch_names_argument():
    kc, vc = caches()
    k = np.zeros((3, 2, 4), np.float32)  # head dim 4 != 8
    with pytest.raises(kvhal.ShapeMismatch) as e:
        kvhal.paged_caching(kc, vc, k, k, np.array([0, 1, 2]))
    assert "k" in str(e.value)
    assert kvhal.last_error() and str(e.value).startswith("KVHAL_SHAPE_MISMATCH")
    assert not kc.any()


def test_dtype_mismatch():
    kc, vc = caches()
    k = np.zeros((1, 2, 8), np.float16)
    with pytest.raises(kvhal.DtypeMismatch):
        kvhal.paged_caching(kc, vc, k, k.astype(np.float32), np.array([0]))


def test_not_an_array():
    kc, vc = caches()
    with pytest.raises(kvhal.InvalidArgument, match="k: a list is not a DLPack array"):
        kvhal.paged_caching(kc, vc, [1, 2], kc, np.array([0]))


def test_unsupported_dtype_and_negative_strides():
    kc, vc = caches()
    with pytest.raises(kvhal.InvalidArgument, match="dtype"):
        kvhal.paged_caching(kc, vc, np.zeros((1, 2, 8), np.float64), kc, np.array([0]))
    with pytest.raises(kvhal.InvalidArgument, match="negative"):
        kvhal.paged_caching(kc, vc, np.zeros((2, 2, 8), np.float32)[::-1], kc, np.array([0, 1]))


def test_read_only_cache_refused():
    kc, vc = caches()
    kc.flags.writeable = False
    with pytest.raises((kvhal.InvalidArgument, BufferError)):
        kvhal.paged_caching(kc, vc, np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32),
                            np.array([0]))


def test_bad_scale_and_stream_and_keywords():
    kc, vc = caches()
    k = np.zeros((1, 2, 8), np.float32)
    with pytest.raises(kvhal.InvalidArgument, match="k_scale"):
        kvhal.paged_caching(kc, vc, k, k, np.array([0]), k_scale="x")
    with pytest.raises(kvhal.InvalidArgument, match="stream"):
        kvhal.paged_caching(kc, vc, k, k, np.array([0]), stream=object())
    with pytest.raises(TypeError):
        kvhal.paged_caching(kc, vc, k, k)
    with pytest.raises(TypeError):
        kvhal.paged_caching(kc, vc, k, k, np.array([0]), bogus=1)


def test_bad_device_and_dtype_names():
    with pytest.raises(kvhal.ParseError):
        kvhal.empty((2,), "f32", "cpu:x")
    with pytest.raises(kvhal.NoDevice):
        kvhal.empty((2,), "f32", "cpu:7")
    with pytest.raises(kvhal.InvalidArgument, match="dtype"):
        kvhal.empty((2,), "f64")
    with pytest.raises(kvhal.InvalidArgument, match="shape"):
        kvhal.empty((), "f32")


def test_prefix_and_manager_bad_arguments():
    cm = kvhal.CacheManager(8, 1)
    with pytest.raises(kvhal.InvalidArgument, match="tokens"):
        cm.match("abc")
    with pytest.raises(kvhal.InvalidArgument, match="handle"):
        cm.unlock(42)
    other = kvhal.CacheManager(8, 1)
    h, _, _ = other.match([1, 2])
    with pytest.raises(kvhal.InvalidHandle, match="another cache"):
        cm.unlock(h)
    with pytest.raises(kvhal.OutOfMemory):
        cm.allocate(9)
    with pytest.raises(kvhal.InvalidArgument, match="tokens"):
        cm.match([1, 2 ** 40])
    with pytest.raises(kvhal.InvalidArgument):
        kvhal.PrefixCache("tree", 1)
    with pytest.raises(kvhal.Error):
        kvhal.PrefixCache("radix", 0)
    cm.check_integrity()


def test_errors_on_opencl_tensor_mismatch():
    devs = [d["device"] for d in kvhal.devices()]
    if "opencl:0" not in devs:
        pytest.skip("no OpenCL device")
    kc = kvhal.empty((4, 2, 2, 8), "f32", "opencl:0")
    with pytest.raises(kvhal.DeviceMismatch):
        kvhal.paged_caching(kc, kc, np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32),
                            np.array([0]))

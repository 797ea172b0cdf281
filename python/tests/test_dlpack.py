"""The DLPack protocol as a consumer and a producer: versioned and unversioned capsules, the capsule renamed
"used_dltensor(_versioned)" after import, the stream keyword passed only when the caller gives a stream (and dropped
for a host producer that refuses it), read-only flags, OpenCL tensors round-tripping through kvhal's own capsules,
and a large CPU call that releases the GIL."""
import ctypes
import math
import threading

import numpy as np
import pytest

import kvhal
from conftest import DEVICES

_name = ctypes.pythonapi.PyCapsule_GetName
_name.restype = ctypes.c_char_p
_name.argtypes = [ctypes.py_object]


class Producer:
    """Wraps a kvhal.Tensor (or array) and records how __dlpack__ was called and what it handed out."""

    def __init__(self, inner, versioned=True, refuse_stream=False):
        self.inner = inner
        self.versioned = versioned
        self.refuse_stream = refuse_stream
        self.calls = []
        self.capsules = []

    def __dlpack__(self, **kw):
        self.calls.append(dict(kw))
        if "max_version" in kw and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if kw.get("stream") is not None and self.refuse_stream:
            raise RuntimeError("host arrays take stream=None only")
        inner_kw = {}
        if self.versioned and "max_version" in kw:
            inner_kw["max_version"] = kw["max_version"]
        cap = self.inner.__dlpack__(**inner_kw)
        self.capsules.append(cap)
        return cap

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


@pytest.mark.parametrize("versioned", [True, False])
def test_consumer_versioned_and_unversioned(versioned):
    src = kvhal.empty((3, 4), "f32")
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    src.copy_from(data)
    p = Producer(src, versioned=versioned)
    dst = np.zeros((3, 4), np.float32)
    kvhal.tensor_copy(dst, p)
    assert np.array_equal(dst, data)
    assert p.calls[0].get("max_version") == (1, 0)  # versioned asked first
    assert "stream" not in p.calls[0]  # no stream given: none passed
    want = b"used_dltensor_versioned" if versioned else b"used_dltensor"
    assert _name(p.capsules[-1]) == want


def test_stream_passed_when_given_and_dropped_for_refusing_host_producer():
    src = kvhal.empty((5,), "f32")
    p = Producer(src)
    kvhal.tensor_copy(np.zeros(5, np.float32), p, stream=7)
    assert p.calls[0].get("stream") == 7
    q = Producer(src, refuse_stream=True)
    kvhal.tensor_copy(np.zeros(5, np.float32), q, stream=7)
    assert q.calls[-1].get("stream") is None  # asked again without it (a host array)
    kvhal.tensor_copy(np.zeros(5, np.float32), np.ones(5, np.float32), stream=7)  # NumPy refuses streams itself


def test_producer_capsules_and_flags():
    t = kvhal.empty((2, 3), "f16")
    v = t.__dlpack__(max_version=(1, 0))
    u = t.__dlpack__()
    assert _name(v) == b"dltensor_versioned" and _name(u) == b"dltensor"
    with pytest.raises(BufferError):
        t.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    assert t.__dlpack__(dl_device=(1, 0)) is not None


@pytest.mark.skipif("opencl:0" not in DEVICES, reason="no OpenCL device")
@pytest.mark.parametrize("versioned", [True, False])
def test_opencl_round_trip_through_capsules(versioned):
    src = kvhal.empty((4, 6), "f32", "opencl:0")
    data = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    src.copy_from(data)
    assert src.__dlpack_device__() == (4, 0)
    dst = kvhal.empty((4, 6), "f32", "opencl:0")
    kvhal.tensor_copy(dst, Producer(src, versioned=versioned))  # imported from a kDLOpenCL capsule (cl_mem)
    out = np.zeros_like(data)
    dst.copy_to(out)
    assert np.array_equal(out, data)
    view = kvhal.from_dlpack(Producer(src, versioned=versioned))
    assert view.device == "opencl:0" and view.shape == (4, 6)


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_pointer.restype = ctypes.c_void_p
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

KDL_UINT, KDL_FLOAT8_CODES = 1, (10, 11, 12, 13)  # DLPack's uint and float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) codes


@pytest.mark.parametrize("dt", ["fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz"])
def test_fp8_exports_one_byte_items(dt):
    """Every fp8 format crosses DLPack as 1-byte items (a float8 code where the build's DLPack header has them, else
    the uint8 bits), never as a wider type over its bytes; NumPy then sees 4 one-byte items over the 4 bytes."""
    t = kvhal.empty((4,), dt)
    t.copy_from(np.array([0x00, 0x38, 0x80, 0x7F], np.uint8))
    cap = t.__dlpack__()  # kept alive while its DLTensor is read
    dl = _DLTensor.from_address(_pointer(cap, b"dltensor"))
    code, bits, lanes = dl.dtype.code, dl.dtype.bits, dl.dtype.lanes
    del dl, cap
    assert (bits, lanes) == (8, 1)
    assert code == KDL_UINT or code in KDL_FLOAT8_CODES
    if code == KDL_UINT:  # NumPy has no float8 types: it takes the bits
        a = np.from_dlpack(t)
        assert a.itemsize == 1 and a.nbytes == 4 and a.shape == (4,)
        assert a.tolist() == [0x00, 0x38, 0x80, 0x7F]


def f32_to_fp8(x, kind):
    """The plain host reference of the fp8 conversion: round to nearest even, saturating (e4m3fn: bias 7, max 448;
    e5m2: bias 15, max 57344)."""
    m_bits, bias, max_code = (3, 7, 0x7E) if kind == "fp8_e4m3" else (2, 15, 0x7B)
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    min_normal = 2.0 ** (1 - bias)
    if a < min_normal:
        code = round(a / 2.0 ** (1 - bias - m_bits))  # subnormal steps; round() is half-to-even
    else:
        f, k = math.frexp(a)
        e = k - 1
        q = round((a / 2.0 ** e - 1.0) * 2 ** m_bits)
        if q == 2 ** m_bits:
            e, q = e + 1, 0
        code = ((e + bias) << m_bits) | q
    return sign | min(code, max_code)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", ["bf16", "fp8_e4m3", "fp8_e5m2"])
def test_byte_dtypes_on_every_device(device, dt):
    """bf16 caches from bf16 inputs (bit copies) and fp8 caches from f32 inputs (converted with the scales), on every
    device, against the plain host reference; arguments are kvhal.Tensor filled with raw bytes."""
    rng = np.random.default_rng(5)
    nb, bs, h, d = 4, 4, 2, 16
    kc = kvhal.empty((nb, bs, h, d), dt, device)
    vc = kvhal.empty((nb, bs, h, d), dt, device)
    slots_h = np.array([0, 7, -1, 15, 9], np.int64)
    slots = kvhal.empty((5,), "i64", device)
    slots.copy_from(slots_h)
    if dt == "bf16":
        store = np.uint16
        kin = rng.integers(0, 0x7F7F, (5, h, d)).astype(store)
        vin = rng.integers(0, 0x7F7F, (5, h, d)).astype(store)
        k, v = kvhal.empty((5, h, d), dt, device), kvhal.empty((5, h, d), dt, device)
        ref_in_k, ref_in_v = kin, vin
        scales = (1.0, 1.0)
    else:
        store = np.uint8
        kin = (rng.standard_normal((5, h, d)) * 40).astype(np.float32)
        vin = (rng.standard_normal((5, h, d)) * 4000).astype(np.float32)
        kin[0, 0, :4] = [1e6, -1e6, 0.0, -0.0]  # saturation and signed zeros
        k, v = kvhal.empty((5, h, d), "f32", device), kvhal.empty((5, h, d), "f32", device)
        scales = (0.5, 2.0)
        conv = np.vectorize(lambda x, s: f32_to_fp8(float(x) / s, dt), otypes=[np.uint8])
        ref_in_k, ref_in_v = conv(kin, scales[0]), conv(vin, scales[1])
    k.copy_from(kin)
    v.copy_from(vin)
    kvhal.paged_caching(kc, vc, k, v, slots, *scales)
    kvhal.synchronize(device)
    got_k = np.zeros((nb * bs, h, d), store)
    got_v = np.zeros((nb * bs, h, d), store)
    kc.copy_to(got_k)
    vc.copy_to(got_v)
    ref_k = np.zeros_like(got_k)
    ref_v = np.zeros_like(got_v)
    for t, s in enumerate(slots_h):
        if s >= 0:
            ref_k[s], ref_v[s] = ref_in_k[t], ref_in_v[t]
    assert np.array_equal(got_k, ref_k) and np.array_equal(got_v, ref_v)


def test_large_cpu_call_releases_the_gil():
    nb, bs, h, d, tokens = 64, 16, 8, 128, 512
    kc = np.zeros((nb, bs, h, d), np.float32)
    vc = np.zeros_like(kc)
    k = np.random.default_rng(1).standard_normal((tokens, h, d)).astype(np.float32)
    slots = np.random.default_rng(2).permutation(nb * bs)[:tokens].astype(np.int64)
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)

    th = threading.Thread(target=ticker)
    th.start()
    for _ in range(20):
        kvhal.paged_caching(kc, vc, k, k, slots)
    stop.set()
    th.join()
    assert np.array_equal(kc.reshape(-1, h, d)[slots], k)
    assert ticks  # the other thread ran

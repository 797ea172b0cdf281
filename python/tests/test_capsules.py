"""Hostile DLPack capsules, built field by field with ctypes: every field is checked before kvhal uses it (a NULL
shape or data, a byte offset of 2^63, offsets and spans past PTRDIFF_MAX, a view that wraps around the address
space, a bad version or rank), each refused with kvhal.InvalidArgument naming the argument, and the producer's
deleter called exactly once; NULL strides (compact row-major) are read correctly; a deleter that runs Python code,
or raises, never replaces the call's own exception or result (no SystemError). Foreign prefix handles raise
kvhal.InvalidHandle, as the C library says KVHAL_INVALID_HANDLE."""
import ctypes
import sys

import numpy as np
import pytest

import kvhal

KDL_CPU, KDL_FLOAT = 1, 2
PTRDIFF_MAX = 2 ** 63 - 1


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class ManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


# function objects of their own (item access makes a new one; attributes of ctypes.pythonapi are shared with the
# other test files, which declare other argument types)
_capsule_new = ctypes.pythonapi["PyCapsule_New"]
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

NAME_V, NAME_U = b"dltensor_versioned", b"dltensor"  # module constants: a capsule keeps the name's pointer
DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Hostile:
    """A producer whose __dlpack__ hands out one capsule built from the given fields. The deleter records its calls
    (and runs Python code: it allocates, formats, may raise); an unconsumed capsule's destructor calls it, as the
    protocol asks."""

    def __init__(self, versioned=True, data=None, ndim=1, shape=(4,), strides=None, byte_offset=0, null_shape=False,
                 major=1, keep=None, deleter_raises=False):
        self.versioned = versioned
        self.deleted = 0
        self.deleter_raises = deleter_raises
        self.keep = keep  # the memory data points into
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = (ctypes.c_int64 * max(len(strides), 1))(*strides) if strides is not None else None
        self.deleter = DELETER(self._delete)
        self.destructor = DESTRUCTOR(self._destroy)
        m = ManagedVersioned() if versioned else Managed()
        if versioned:
            m.major, m.minor = major, 0
        m.deleter = self.deleter
        t = m.dl_tensor
        t.data = data
        t.device_type, t.device_id = KDL_CPU, 0
        t.ndim = ndim
        t.dtype = DLDataType(KDL_FLOAT, 32, 1)
        t.shape = None if null_shape else ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64)) if self.strides is not None else None
        t.byte_offset = byte_offset
        self.managed = m

    def _delete(self, _ptr):
        self.deleted += 1
        "".join(str(i) for i in range(50))  # Python code in the deleter
        if self.deleter_raises:
            raise RuntimeError("the producer's deleter failed")

    def _destroy(self, cap):
        name = NAME_V if self.versioned else NAME_U
        if _capsule_valid(cap, name):  # not consumed: the tensor is still the capsule's
            self._delete(_capsule_pointer(cap, name))

    def __dlpack__(self, **kw):
        if not self.versioned and "max_version" in kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        name = NAME_V if self.versioned else NAME_U
        return _capsule_new(ctypes.addressof(self.managed), name, ctypes.cast(self.destructor, ctypes.c_void_p))

    def __dlpack_device__(self):
        return (KDL_CPU, 0)


def host(n=4):
    a = np.arange(n, dtype=np.float32) + 1
    return a, a.ctypes.data


def refused(producer, match, importer="copy"):
    with pytest.raises(kvhal.InvalidArgument, match=match) as e:
        if importer == "copy":
            kvhal.tensor_copy(np.zeros(4, np.float32), producer)
        else:
            kvhal.from_dlpack(producer)
    assert "src" in str(e.value) or importer != "copy"
    assert producer.deleted == 1  # the producer got its tensor back, once


BAD = {
    "null shape": (dict(null_shape=True), "shape is NULL"),
    "byte offset 2^63": (dict(byte_offset=2 ** 63), "PTRDIFF_MAX"),
    "byte offset 2^64 - 4": (dict(byte_offset=2 ** 64 - 4), "PTRDIFF_MAX"),
    "span past PTRDIFF_MAX": (dict(byte_offset=PTRDIFF_MAX - 3), "PTRDIFF_MAX"),
    "shape past PTRDIFF_MAX": (dict(shape=(2 ** 62,)), "PTRDIFF_MAX|overflow"),
    "strides past PTRDIFF_MAX": (dict(shape=(4,), strides=(2 ** 61,)), "PTRDIFF_MAX|overflow"),
    "strides overflow": (dict(shape=(4, 4), strides=(2 ** 62, 2 ** 62)), "PTRDIFF_MAX|overflow"),
    "null data": (dict(data=0), "data is NULL"),
    "wraps the address space": (dict(data=2 ** 64 - 8), "wraps around"),
    "rank 0": (dict(ndim=0), "dimensions"),
    "rank 40": (dict(ndim=40), "dimensions"),
    "negative extent": (dict(shape=(-4,)), "negative"),
    "negative stride": (dict(shape=(4,), strides=(-1,)), "negative"),
}


@pytest.mark.parametrize("versioned", [True, False])
@pytest.mark.parametrize("importer", ["copy", "from_dlpack"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_hostile_capsule_refused(case, versioned, importer):
    fields, match = BAD[case]
    keep, data = host()
    fields = dict(fields)
    fields.setdefault("data", data)
    refused(Hostile(versioned=versioned, keep=keep, **fields), match, importer)


def test_unknown_major_version_refused():
    keep, data = host()
    refused(Hostile(data=data, keep=keep, major=2), "major version 2")


@pytest.mark.parametrize("versioned", [True, False])
def test_null_strides_are_compact_row_major(versioned):
    src = np.arange(6, dtype=np.float32).reshape(2, 3) * 3
    p = Hostile(versioned=versioned, data=src.ctypes.data, ndim=2, shape=(2, 3), strides=None, keep=src)
    dst = np.zeros((2, 3), np.float32)
    kvhal.tensor_copy(dst, p)
    assert np.array_equal(dst, src)
    assert p.deleted == 1
    # the byte offset is honoured too (one row in)
    p = Hostile(versioned=versioned, data=src.ctypes.data, ndim=1, shape=(3,), byte_offset=12, keep=src)
    row = np.zeros(3, np.float32)
    kvhal.tensor_copy(row, p)
    assert np.array_equal(row, src[1])


def test_refusal_survives_a_deleter_running_python():
    """The import is refused (bad rank) with the exception pending while the producer's deleter runs Python code:
    the caller gets that exception, not a SystemError."""
    keep, data = host()
    p = Hostile(data=data, keep=keep, ndim=0)
    with pytest.raises(kvhal.InvalidArgument, match="dimensions"):
        kvhal.tensor_copy(np.zeros(4, np.float32), p)
    assert p.deleted == 1
    # an argument refused after the import (a shape mismatch found by the C library): the same
    p = Hostile(data=data, keep=keep, shape=(3,))
    with pytest.raises(kvhal.ShapeMismatch):
        kvhal.tensor_copy(np.zeros(4, np.float32), p)
    assert p.deleted == 1


def test_deleter_that_raises(monkeypatch):
    """A deleter that raises: reported as an exception in a destructor (sys.unraisablehook), never in place of the
    call's own result or exception."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    keep, data = host()
    p = Hostile(data=data, keep=keep, deleter_raises=True)
    dst = np.zeros(4, np.float32)
    kvhal.tensor_copy(dst, p)  # succeeds: the result stands
    assert np.array_equal(dst, keep) and p.deleted == 1
    p = Hostile(data=data, keep=keep, null_shape=True, deleter_raises=True)
    with pytest.raises(kvhal.InvalidArgument, match="shape is NULL"):
        kvhal.tensor_copy(np.zeros(4, np.float32), p)
    assert p.deleted == 1
    assert len(seen) == 2 and all("deleter failed" in str(e) for e in seen)


def test_from_dlpack_view_releases_once():
    keep, data = host()
    p = Hostile(data=data, keep=keep)
    v = kvhal.from_dlpack(p)
    out = np.zeros(4, np.float32)
    kvhal.tensor_copy(out, v)
    assert np.array_equal(out, keep) and p.deleted == 0
    del v
    assert p.deleted == 1


def test_foreign_prefix_handles_are_invalid_handles():
    cm, other = kvhal.CacheManager(8, 1), kvhal.CacheManager(8, 1)
    h, _, _ = other.match([1, 2])
    pages = other.allocate(2)
    for call in (lambda: cm.unlock(h), lambda: cm.lock(h),
                 lambda: cm.cache_finished([1, 2], pages, h),
                 lambda: cm.cache_finished_suffix(h, [1, 2], pages)):
        with pytest.raises(kvhal.InvalidHandle, match="another cache"):
            call()
    pc, pc2 = kvhal.PrefixCache("radix", 1), kvhal.PrefixCache("radix", 1)
    pc2.insert([5, 6], [0, 1])
    h2, n, _ = pc2.match([5, 6])
    assert n == 2
    for call in (lambda: pc.lock(h2), lambda: pc.unlock(h2)):
        with pytest.raises(kvhal.InvalidHandle, match="another cache"):
            call()
    other.cache_finished([1, 2], pages, h)  # the handle still works where it came from

"""The DLPack C exchange API path (the type attribute __dlpack_c_exchange_api__), driven by the test-only producer
_xapi_producer.XArray (built for the tests; the Debian PyTorch predates the API): which of the producer's functions
kvhal calls, fallbacks to __dlpack__, errors, the per-type cache and its invalidation, and reference counts."""
import sys

import numpy as np
import pytest

import kvhal
from conftest import host_reference_paged

xp = pytest.importorskip("_xapi_producer")
XArray = xp.XArray


@pytest.fixture(autouse=True)
def fresh_producer():
    xp.configure()
    xp.reset()
    yield
    xp.configure()


def problem(seed=0, slots=(0, 5, -1, 9, 14)):
    rng = np.random.default_rng(seed)
    kc = np.zeros((4, 4, 2, 8), np.float32)
    vc = np.zeros_like(kc)
    k = rng.standard_normal((len(slots), 2, 8)).astype(np.float32)
    v = rng.standard_normal((len(slots), 2, 8)).astype(np.float32)
    return kc, vc, k, v, np.array(slots, np.int64)


def check(kc, vc, k, v, s):
    rk, rv = host_reference_paged(np.zeros_like(kc), np.zeros_like(vc), k, v, s)
    assert np.array_equal(kc, rk) and np.array_equal(vc, rv)


def test_fast_path_borrows_a_dltensor_per_argument():
    arrays = problem()
    wrapped = [XArray(a) for a in arrays]
    assert kvhal.dlpack_path(wrapped[0]) == "c_exchange_api"
    assert kvhal.dlpack_path(arrays[0]) == "__dlpack__"
    kvhal.paged_caching(*wrapped)
    assert xp.counts() == {"dltensor": 5, "managed": 0, "stream": 0, "dlpack": 0, "deleter": 0}
    check(*arrays)


def test_managed_when_no_dltensor_function():
    xp.configure(dltensor=False)
    arrays = problem(1)
    kvhal.paged_caching(*[XArray(a) for a in arrays])
    c = xp.counts()
    assert (c["managed"], c["deleter"], c["dltensor"], c["dlpack"]) == (5, 5, 0, 0)
    check(*arrays)


def test_from_dlpack_takes_an_owning_tensor_and_releases_it():
    base = np.arange(6, dtype=np.float32)
    x = XArray(base)
    before = sys.getrefcount(x)
    view = kvhal.from_dlpack(x)
    assert xp.counts()["managed"] == 1 and xp.counts()["dltensor"] == 0
    assert sys.getrefcount(x) == before + 1  # the managed tensor owns the producer object
    assert np.array_equal(np.from_dlpack(view), base)
    del view
    assert xp.counts()["deleter"] == 1
    assert sys.getrefcount(x) == before


def test_read_only_flag_of_an_owning_import():
    kc = np.zeros((4, 4, 2, 8), np.float32)
    kc.flags.writeable = False
    view = kvhal.from_dlpack(XArray(kc))
    _, vc, k, v, s = problem()
    with pytest.raises(kvhal.InvalidArgument, match="k_cache: the array is read-only"):
        kvhal.paged_caching(view, vc, k, v, s)


def test_producer_errors_name_the_argument():
    kc, vc, k, v, s = problem()
    xp.configure(fail="dltensor")
    refused = "^KVHAL_INVALID_ARGUMENT: {}: the producer refused the export: RuntimeError: test producer: {} refused"
    with pytest.raises(kvhal.InvalidArgument, match=refused.format("k_cache", "dltensor")):
        kvhal.paged_caching(XArray(kc), vc, k, v, s)
    xp.configure(fail="managed", dltensor=False)
    with pytest.raises(kvhal.InvalidArgument, match=refused.format("slot_mapping", "managed")):
        kvhal.paged_caching(kc, vc, k, v, XArray(s))
    xp.configure(fail="null", dltensor=False)
    with pytest.raises(kvhal.InvalidArgument, match="v: the _xapi_producer.XArray's DLPack exchange API gave no"):
        kvhal.paged_caching(kc, vc, k, XArray(v), s)
    assert xp.counts()["deleter"] == 0  # nothing was taken


def test_other_major_falls_back_and_a_chain_is_walked():
    arrays = problem(2)
    xp.configure(major=2)

    class Fresh(XArray):  # a type kvhal has not seen: resolved with the major-2 table
        pass

    assert kvhal.dlpack_path(Fresh(arrays[0])) == "__dlpack__"
    kvhal.paged_caching(*[Fresh(a) for a in arrays])
    assert xp.counts()["dlpack"] == 5 and xp.counts()["dltensor"] == 0
    check(*arrays)

    class Chained(XArray):  # a major-2 header whose prev_api is the version-1 table
        __dlpack_c_exchange_api__ = xp.chained_capsule()

    xp.configure(major=1)
    xp.reset()
    arrays = problem(3)
    kvhal.paged_caching(*[Chained(a) for a in arrays])
    assert xp.counts()["dltensor"] == 5 and xp.counts()["dlpack"] == 0
    check(*arrays)


def test_first_revision_int_attribute():
    class Old(XArray):
        __dlpack_c_exchange_api__ = None
        __c_dlpack_exchange_api__ = xp.api_address()

    arrays = problem(4)
    assert kvhal.dlpack_path(Old(arrays[0])) == "c_exchange_api"
    kvhal.paged_caching(*[Old(a) for a in arrays])
    assert xp.counts()["dltensor"] == 5 and xp.counts()["dlpack"] == 0
    check(*arrays)


def test_not_the_api_falls_back():
    import ctypes

    make = ctypes.pythonapi.PyCapsule_New
    make.restype = ctypes.py_object
    make.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.create_string_buffer(b"not_dlpack_exchange_api")  # outlives the capsule (kept by the class)

    class WrongName(XArray):  # the table's address in a capsule of another name
        capsule_name = name
        __dlpack_c_exchange_api__ = make(xp.api_address(), ctypes.cast(name, ctypes.c_char_p), None)

    class Zero(XArray):
        __dlpack_c_exchange_api__ = 0

    for cls in (WrongName, Zero):
        xp.reset()
        arrays = problem(5)
        assert kvhal.dlpack_path(cls(arrays[0])) == "__dlpack__"
        kvhal.paged_caching(*[cls(a) for a in arrays])
        assert xp.counts()["dlpack"] == 5 and xp.counts()["dltensor"] == 0
        check(*arrays)


def test_attribute_changes_on_the_type_are_seen():
    class Sub(XArray):
        pass

    arrays = problem(6)
    kvhal.paged_caching(*[Sub(a) for a in arrays])
    assert xp.counts()["dltensor"] == 5
    saved = XArray.__dict__["__dlpack_c_exchange_api__"]
    Sub.__dlpack_c_exchange_api__ = None  # the type's version tag changes: looked up again
    xp.reset()
    kvhal.paged_caching(*[Sub(a) for a in problem(7)])
    assert xp.counts()["dlpack"] == 5 and xp.counts()["dltensor"] == 0
    Sub.__dlpack_c_exchange_api__ = saved
    xp.reset()
    kvhal.paged_caching(*[Sub(a) for a in problem(8)])
    assert xp.counts()["dltensor"] == 5 and xp.counts()["dlpack"] == 0


def test_gpu_stream_check():
    """A producer reporting a CUDA device: kvhal asks current_work_stream once per call and device and imports
    through the API whatever the call's stream (kvhal orders the producer's stream before it with an event; with no
    stream given the call runs on the producer's current stream); never through __dlpack__. Here the import is then
    refused (no CUDA device in this build) with a kvhal.Error; a producer's own failure becomes one too."""
    arrays = problem(9)
    on_gpu = [XArray(a, device=(2, 0)) for a in arrays]
    xp.configure(stream=0x5000)
    for stream in (0x5000, 0x7000, kvhal.STREAM_LEGACY, None):
        xp.reset()
        with pytest.raises(kvhal.Error):
            kvhal.paged_caching(*on_gpu, stream=stream)
        c = xp.counts()
        assert c["stream"] == 1 and c["dlpack"] == 0 and c["dltensor"] == 1, (stream, c)
    xp.configure(fail="stream")
    with pytest.raises(kvhal.InvalidArgument,
                       match="^KVHAL_INVALID_ARGUMENT: k_cache: the producer refused the export: RuntimeError: "
                             "test producer: stream refused") as e:
        kvhal.paged_caching(*on_gpu, stream=0x5000)
    assert isinstance(e.value.__cause__, RuntimeError)


def test_refcounts_flat_on_every_path():
    arrays = problem(10)
    wrapped = [XArray(a) for a in arrays]

    class Old(XArray):
        __dlpack_c_exchange_api__ = None
        __c_dlpack_exchange_api__ = xp.api_address()

    old = [Old(a) for a in arrays]
    kvhal.paged_caching(*old)  # the type is remembered (a reference) from its first call on
    objs = wrapped + old + list(arrays) + [XArray, Old]
    before = [sys.getrefcount(o) for o in objs]
    for i in range(200):
        xp.configure(dltensor=bool(i % 2))
        kvhal.paged_caching(*wrapped)
        kvhal.paged_caching(*old, k_scale=1.0)
        del_view = kvhal.from_dlpack(wrapped[i % 5])
        del del_view
        xp.configure(fail="dltensor" if i % 2 else "managed", dltensor=bool(i % 2))
        with pytest.raises(kvhal.InvalidArgument):
            kvhal.paged_caching(*wrapped)
        xp.configure()
    assert [sys.getrefcount(o) for o in objs] == before
    c = xp.counts()
    assert c["managed"] - c["deleter"] == 100  # every tensor taken was released; the 100 refused made none


def test_reused_addresses_of_other_sizes():
    """Wrapped ranges are remembered across calls by (device, address, bytes): arrays freed and made again, often at
    the same address with another size, must give the right results every time."""
    rng = np.random.default_rng(11)
    for i in range(60):
        nb = 2 + i % 5
        kc = np.zeros((nb, 4, 2, 8), np.float32)
        vc = np.zeros_like(kc)
        n = 1 + i % 7
        k = rng.standard_normal((n, 2, 8)).astype(np.float32)
        v = rng.standard_normal((n, 2, 8)).astype(np.float32)
        s = rng.permutation(nb * 4)[:n].astype(np.int64)
        args = (kc, vc, k, v, s) if i % 2 else tuple(XArray(a) for a in (kc, vc, k, v, s))
        kvhal.paged_caching(*args)
        check(kc, vc, k, v, s)
        del kc, vc, k, v, s, args


def test_stream_object_read_once_while_remembered():
    """A stream object's handle is read once and remembered (with a reference) until another stream object comes."""

    class S:
        calls = 0

        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            S.calls += 1
            return (0, self.handle)

    a, b = S(0x10), S(0x20)
    args = problem(12)
    base = sys.getrefcount(a)
    kvhal.paged_caching(*args, stream=a)
    kvhal.paged_caching(*args, stream=a)
    assert S.calls == 1 and sys.getrefcount(a) == base + 1
    kvhal.paged_caching(*args, stream=b)
    assert S.calls == 2 and sys.getrefcount(a) == base


def test_other_ops_take_exchange_api_arrays():
    rng = np.random.default_rng(14)
    kc = rng.standard_normal((4, 4, 2, 8)).astype(np.float32)
    vc = rng.standard_normal((4, 4, 2, 8)).astype(np.float32)
    ek, ev = kc.copy(), vc.copy()
    ek[3], ev[3] = kc[1], vc[1]
    kvhal.copy_blocks([XArray(kc), XArray(vc)], [(1, 3)])
    assert np.array_equal(kc, ek) and np.array_equal(vc, ev)
    dst = np.zeros_like(kc)
    kvhal.tensor_copy(XArray(dst), XArray(kc))
    assert np.array_equal(dst, kc)
    t = kvhal.empty(kc.shape, "f32")
    t.copy_from(XArray(kc))  # host copies (any dtype of the size) through the exchange API too
    back = np.zeros_like(kc)
    t.copy_to(XArray(back))
    assert np.array_equal(back, kc)
    assert xp.counts()["dlpack"] == 0 and xp.counts()["dltensor"] == 6


@pytest.mark.parametrize("hostile, message", [("neg_shape", "negative size"), ("neg_stride", "negative"),
                                              ("overflow", "overflow"), ("misaligned", "multiple of the element")])
@pytest.mark.parametrize("borrowed", [True, False])
def test_malformed_views_from_the_producer_are_refused(hostile, message, borrowed):
    """The binding checks a producer's view itself (it fills kvhal's tensor without kvhal_tensor_make): a negative
    size or stride, a shape whose byte span overflows, a byte offset that is not a multiple of the element size are
    each an InvalidArgument naming the argument, and nothing is written."""
    arrays = problem()
    before = [a.copy() for a in arrays]
    wrapped = [XArray(a) for a in arrays]
    xp.configure(dltensor=borrowed, hostile=hostile)
    with pytest.raises(kvhal.InvalidArgument, match="k_cache: .*" + message):
        kvhal.paged_caching(*wrapped)
    with pytest.raises(kvhal.InvalidArgument, match="array: .*" + message):
        kvhal.from_dlpack(wrapped[2])
    xp.configure()
    for a, b in zip(arrays, before):
        assert np.array_equal(a, b)
    if not borrowed:  # every managed tensor handed out was given back
        c = xp.counts()
        assert c["managed"] == c["deleter"]


@pytest.mark.parametrize("borrowed", [True, False])
def test_refused_dtype_names_it_after_the_tensor_is_given_back(borrowed):
    """The message about a dtype kvhal does not have is written from a copy: a managed tensor is given back first
    (ASan caught the message reading the freed tensor)."""
    kc, vc, k, v, s = problem()
    xp.configure(dltensor=borrowed)
    with pytest.raises(kvhal.InvalidArgument, match="k: DLPack dtype .code 2, 64 bits"):
        kvhal.paged_caching(XArray(kc), XArray(vc), XArray(k.astype(np.float64)), XArray(v), XArray(s))
    with pytest.raises(kvhal.InvalidArgument, match="array: DLPack dtype .code 2, 64 bits"):
        kvhal.from_dlpack(XArray(k.astype(np.float64)))
    if not borrowed:
        c = xp.counts()
        assert c["managed"] == c["deleter"]

"""The extension module as CPython sees it: each import of kvhal._kvhal (a second one through importlib) has its own
types, exceptions and caches; objects keep their module alive; the objects that hold references are visible to the
garbage collector (with their type); the types are final and immutable, as the C API made them."""
import gc
import sys
import importlib.util

import numpy as np
import pytest

import kvhal


def test_second_instance_has_its_own_state():
    spec = importlib.util.find_spec("kvhal._kvhal")
    m2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m2)
    assert m2.Tensor is not kvhal.Tensor and m2.InvalidArgument is not kvhal.InvalidArgument
    kc = np.zeros((4, 2, 2, 8), np.float32)
    k = np.ones((2, 2, 8), np.float32)
    m2.paged_caching(kc, kc.copy(), k, k, np.array([0, 1]))
    with pytest.raises(m2.OutOfRange):
        m2.paged_caching(kc, kc, k, k, np.array([0, 100]))
    t = m2.empty((3,), "f32")
    cm = m2.CacheManager(8)
    h, _, _ = cm.match([1, 2])
    del m2, spec
    gc.collect()
    assert np.from_dlpack(t).shape == (3,)  # the type holds the module, the module its state
    with pytest.raises(ValueError, match="max_version"):
        t.__dlpack__(max_version="x")
    cm.unlock(h)
    cm.check_integrity()


def test_gc_sees_manager_prefix_views_and_handles_need_not_be_seen():
    """A PrefixCache view of a manager is tracked (it refers to the manager). A handle is not: it refers only to its
    cache, and no kvhal object refers to handles, so no reference cycle can run through one; it still keeps its
    cache alive and drops it with itself."""
    cm = kvhal.CacheManager(8)
    h, _, _ = cm.match([1, 2])
    pre = cm.prefix
    assert gc.is_tracked(pre) and not gc.is_tracked(h)
    assert cm in gc.get_referents(pre) and type(pre) in gc.get_referents(pre)
    before = sys.getrefcount(cm)
    h2, _, _ = cm.match([1, 2])
    assert sys.getrefcount(cm) == before + 1
    cm.unlock(h2)
    del h2
    assert sys.getrefcount(cm) == before
    cm.unlock(h)


def test_types_are_final_and_immutable():
    for tp in (kvhal.Tensor, kvhal.Pages, kvhal.PrefixHandle):
        with pytest.raises(TypeError):
            tp()
    for tp in (kvhal.Tensor, kvhal.Stream, kvhal.Pages, kvhal.PrefixCache, kvhal.PrefixHandle, kvhal.CacheManager):
        with pytest.raises(TypeError):
            tp.extra = 1
        with pytest.raises(TypeError):
            type("Sub", (tp,), {})

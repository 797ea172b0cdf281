"""Reference counts: no call keeps (or drops) a reference to its arguments, DLPack exports release their owner,
and repeated calls do not grow the process (a coarse leak check; valgrind runs tools/python_valgrind.py)."""
import gc
import sys

import numpy as np

import kvhal
from conftest import torch


def test_op_arguments_refcounts():
    kc = np.zeros((4, 2, 2, 8), np.float32)
    vc = np.zeros_like(kc)
    k = np.ones((2, 2, 8), np.float32)
    s = np.array([0, 1])
    objs = [kc, vc, k, s]
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(100):
        kvhal.paged_caching(kc, vc, k, k, s)
        try:
            kvhal.paged_caching(kc, vc, k, k, np.array([0, 99]))
        except kvhal.OutOfRange:
            pass
        kvhal.copy_blocks([kc, vc], [(0, 1)])
        kvhal.tensor_copy(vc, kc)
    assert [sys.getrefcount(o) for o in objs] == before


def test_torch_arguments_refcounts():
    if torch is None:
        return
    kc = torch.zeros(4, 2, 2, 8)
    k = torch.ones(2, 2, 8)
    s = torch.tensor([0, 1])
    before = [sys.getrefcount(o) for o in (kc, k, s)]
    for _ in range(100):
        kvhal.paged_caching(kc, kc, k, k, s)
    assert [sys.getrefcount(o) for o in (kc, k, s)] == before


def test_export_releases_owner():
    t = kvhal.empty((3,), "f32")
    base = sys.getrefcount(t)
    cap = t.__dlpack__()
    assert sys.getrefcount(t) == base + 1
    del cap  # unconsumed capsule: its destructor releases the owner
    assert sys.getrefcount(t) == base
    a = np.from_dlpack(t)
    assert sys.getrefcount(t) == base + 1
    del a
    gc.collect()
    assert sys.getrefcount(t) == base
    v = kvhal.from_dlpack(np.zeros(3, np.float32))
    del v


def test_manager_handles_refcounts():
    cm = kvhal.CacheManager(32, 1)
    base = sys.getrefcount(cm)
    for _ in range(200):
        h, n, pm = cm.match([1, 2, 3])
        p = list(pm) + list(cm.allocate(3 - n))
        cm.cache_finished([1, 2, 3], p, h)
    del h
    assert sys.getrefcount(cm) == base

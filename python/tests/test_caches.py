"""The prefix cache and the cache manager from Python, against a plain model of page ownership."""
from array import array

import numpy as np
import pytest

import kvhal


@pytest.mark.parametrize("page_size", [1, 4])
def test_prefix_cache_insert_match_evict(page_size):
    pc = kvhal.PrefixCache("radix", page_size)
    toks = list(range(100, 116))
    pages = list(range(16 // page_size))
    assert pc.insert(toks, pages) == 0
    h, n, got = pc.match(toks[:10] + [1, 2])
    assert n == (10 // page_size) * page_size
    assert isinstance(got, array) and list(got) == pages[: n // page_size]
    pc.lock(h)
    freed = pc.evict(16)  # only the part past the locked match goes
    assert sorted(freed) == pages[n // page_size:]
    pc.unlock(h)
    freed = list(freed) + list(pc.evict(16))
    assert sorted(freed) == pages
    assert pc.size_info()["total_tokens"] == 0
    pc.check_integrity()


def test_prefix_inputs_as_numpy_and_array():
    pc = kvhal.PrefixCache("radix", 1)
    pc.insert(np.arange(8, dtype=np.int32), array("i", range(8)))
    _, n, p = pc.match(np.arange(8, dtype=np.int64))  # int64 converted
    assert n == 8 and list(p) == list(range(8))
    assert sorted(pc.reset()) == list(range(8))


def test_naive_never_matches():
    pc = kvhal.PrefixCache("naive", 1)
    assert pc.insert([1, 2, 3], [0, 1, 2]) == 3
    _, n, p = pc.match([1, 2, 3])
    assert n == 0 and len(p) == 0


@pytest.mark.parametrize("suffix", [False, True])
def test_manager_flow(suffix):
    cm = kvhal.CacheManager(64, 2)
    assert cm.available == 64 and cm.num_free == 64
    a = list(range(10))
    h, n, pa = cm.match(a)
    assert n == 0
    pages = cm.allocate(5)
    cm.cache_finished(a, pages, h)
    assert cm.num_free == 59
    b = a + [50, 51, 52]
    h, n, pb = cm.match(b)
    assert n == 10 and list(pb) == list(pages)
    more = cm.allocate(2)  # 3 tokens -> 2 pages
    if suffix:
        cm.cache_finished_suffix(h, b[n:], more)
    else:
        cm.cache_finished(b, array("i", list(pb) + list(more)), h)
    cm.check_integrity()
    assert cm.evict(100) > 0
    assert cm.pages_evicted > 0
    cm.check_integrity()
    assert cm.available == 64
    assert cm.prefix.page_size == 2


def test_manager_drop_request():
    cm = kvhal.CacheManager(16, 1)
    h, n, _ = cm.match([1, 2, 3])
    assert n == 0
    own = cm.allocate(3)
    cm.cache_finished([1, 2, 3], own, h)
    h, n, _ = cm.match([1, 2, 3, 4])  # a request that matched and is dropped
    assert n == 3
    own = cm.allocate(1)
    cm.free(own)
    cm.unlock(h)
    h2 = cm.match([9])[0]  # a request that matched nothing still holds a request handle
    cm.unlock(h2)
    with pytest.raises(kvhal.InvalidHandle):  # consumed: a second release is refused
        cm.unlock(h2)
    cm.check_integrity()
    assert cm.available == 16

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
    assert isinstance(got, kvhal.Pages) and list(got) == pages[: n // page_size]
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


def test_manager_tokens_as_torch_tensors():
    """Token and page lists as torch CPU int tensors (no buffer protocol: read over DLPack, any stride, int32 or
    int64) give what the same ids as an array.array give; a float, 2-D or out-of-int32 tensor is refused by name."""
    torch = pytest.importorskip("torch")
    cm, ref = kvhal.CacheManager(256, 1), kvhal.CacheManager(256, 1)
    toks = torch.arange(100, 140, dtype=torch.int64)
    for prompt, seq in ((toks, toks[::2]), (toks.to(torch.int32), toks.to(torch.int32)[::2])):
        for m, p, s in ((cm, prompt, seq), (ref, array("i", prompt.tolist()), array("i", seq.tolist()))):
            h, n, got = m.match(p)
            own = m.allocate(len(p) - n)
            m.cache_finished_suffix(h, p, torch.tensor(own, dtype=torch.int32) if m is cm else own, start=n)
            h, n, got = m.match(s)
            m.unlock(h)
    for m in (cm, ref):
        m.check_integrity()
    assert cm.match(toks[:30])[2].tolist() == ref.match(array("i", range(100, 130)))[2].tolist()
    with pytest.raises(kvhal.InvalidArgument, match="tokens: expected a 1-D int32 or int64"):
        cm.match(torch.arange(4.0))
    with pytest.raises(kvhal.InvalidArgument, match="tokens: expected a 1-D int32 or int64"):
        cm.match(torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(kvhal.InvalidArgument, match=r"tokens\[1\]: .* does not fit in int32"):
        cm.match(torch.tensor([1, 1 << 40]))


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


def test_pages_object():
    import pickle

    cm = kvhal.CacheManager(64, 1)
    p = cm.allocate(6)
    assert isinstance(p, kvhal.Pages) and len(p) == 6 and len(set(p)) == 6
    ids = p.tolist()
    assert list(p) == ids and p == ids and p == tuple(ids) and p == array("i", ids) and p != ids[:-1]
    assert p[0] == ids[0] and p[-1] == ids[-1] and p[1:4] == ids[1:4] and p[::-2] == ids[::-2]
    assert isinstance(p[1:4], kvhal.Pages) and p[1:4] == p[1:4] and p[1:4] != p[1:5]
    with pytest.raises(IndexError):
        p[6]
    with pytest.raises(TypeError):
        p["x"]
    with pytest.raises(TypeError):
        hash(p)
    n = np.asarray(p)  # the buffer protocol: int32, read-only, zero copy
    assert n.dtype == np.int32 and n.tolist() == ids and not n.flags.writeable
    assert memoryview(p).format == "i" and array("i", bytes(memoryview(p))) == array("i", ids)
    import ctypes
    with pytest.raises((BufferError, TypeError), match="read-only|not writable"):
        (ctypes.c_int32 * 6).from_buffer(p)  # asks for a writable buffer
    assert pickle.loads(pickle.dumps(p)) == array("i", ids)
    assert repr(cm.allocate(0)) == "kvhal.Pages([])"
    cm.free(p[:3])  # Pages go back in without a copy
    cm.free(np.asarray(p[3:]))
    assert cm.num_free == 64


def test_cache_finished_suffix_start():
    cm = kvhal.CacheManager(64, 1)
    h, n, _ = cm.match([1, 2, 3])
    first = cm.allocate(3)
    cm.cache_finished_suffix(h, [1, 2, 3], first, start=n)
    seq = array("i", [1, 2, 3, 4, 5])
    h, n, got = cm.match(seq)
    assert n == 3 and got == first
    own = cm.allocate(2)
    with pytest.raises(kvhal.InvalidArgument, match="start: 6 is outside the 5 tokens"):
        cm.cache_finished_suffix(h, seq, own, start=6)
    with pytest.raises(kvhal.InvalidArgument, match="start: -1"):
        cm.cache_finished_suffix(h, seq, own, start=-1)
    cm.cache_finished_suffix(h, seq, own, start=n)  # the same as seq[n:]
    h, n, got = cm.match(seq)
    assert n == 5 and got == first.tolist() + own.tolist()
    cm.unlock(h)
    cm.check_integrity()


def test_manager_page_views():
    """match_view and allocate_view give the ids match and allocate give, as views of the manager's own storage that
    kvhal calls take back; a view shows the next call of its kind; the manager is not re-initialised under a view."""
    cm, ref = kvhal.CacheManager(64, 4), kvhal.CacheManager(64, 4)
    prompt = array("i", range(1, 41))
    for m in (cm, ref):
        h, n, got = m.match(prompt)
        own = m.allocate(10)
        m.cache_finished(prompt, own, h)
    h, n, view = cm.match_view(prompt[:30])
    h2, n2, copy = ref.match(prompt[:30])
    assert (n, view.tolist(), len(view)) == (n2, copy.tolist(), len(copy)) == (28, copy.tolist(), 7)
    assert list(view) == copy.tolist() and view[-1] == copy[6] and np.asarray(view).tolist() == copy.tolist()
    assert memoryview(view).readonly and memoryview(view).format == "i"
    own = cm.allocate_view(3)
    own_ref = ref.allocate(3)
    assert own.tolist() == own_ref.tolist()
    seq = array("i", list(prompt[:30]) + [7, 7, 7, 7, 7])
    cm.cache_finished(seq, array("i", list(view) + list(own)), h)  # views go back in as int32 arrays
    ref.cache_finished(seq, array("i", list(copy) + list(own_ref)), h2)
    cm.check_integrity()
    assert view.tolist() == copy.tolist()  # the finish split the matched edge: the view is unchanged
    a1 = cm.allocate_view(2)
    first = a1.tolist()
    a2 = cm.allocate_view(2)  # other pages (the first two are held), in the same storage: a1 shows them
    assert a1.tolist() == a2.tolist() and not set(first) & set(a2.tolist())
    cm.free(a2)
    cm.free(first)
    h3, n3, view2 = cm.match_view(array("i", [999] * 8))  # nothing matches: the view of the first match is unchanged
    assert (n3, len(view2), len(view)) == (0, 0, 7)
    cm.prefix.unlock(h3)
    cm.check_integrity()
    with pytest.raises(kvhal.InvalidArgument, match="PagesView"):
        cm.__init__(64, 4)
    with pytest.raises(TypeError):
        kvhal.PagesView()
    with pytest.raises(TypeError):
        memoryview(view)[0] = 1  # read-only
    with pytest.raises(kvhal.OutOfMemory):
        cm.allocate_view(65)
    with pytest.raises(kvhal.InvalidArgument):
        cm.allocate_view(-1)
    del view, view2, own, a1, a2
    cm.__init__(64, 4)  # no view left: allowed


def test_manager_match_view_outlives_its_prefix():
    """A match within one edge is handed out without a copy; the view keeps its ids through the calls that split
    and evict that edge, until the next match_view."""
    cm = kvhal.CacheManager(64, 1)
    system = array("i", range(100, 140))
    h, n, _ = cm.match(system)
    cm.cache_finished(system, cm.allocate(40), h)
    h, n, view = cm.match_view(system[:25])  # splits the edge after 25 tokens
    ids = view.tolist()
    assert (n, len(ids)) == (25, 25)
    tail = array("i", list(system[:25]) + [1, 2, 3])
    cm.cache_finished_suffix(h, tail, cm.allocate_view(3), start=n)
    assert cm.evict(64) == 43 and cm.num_free == 64  # every node gone, the view's too
    assert view.tolist() == ids and np.asarray(view).tolist() == ids
    h2, n2, view2 = cm.match_view(array("i", [5, 6]))
    assert (n2, len(view2)) == (0, 0)
    cm.prefix.unlock(h2)
    cm.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_manager_admit_view(page_size):
    """admit_view is match_view + allocate_view in one call: the same handles' behaviour, cached lengths and page
    ids as the three-call sequence on a twin manager, the matched ids then the new ones in one list, which goes back
    whole into cache_finished_suffix with start=matched; a failed admission keeps nothing."""
    ps = page_size
    cm, ref = kvhal.CacheManager(64, ps), kvhal.CacheManager(64, ps)
    system = list(range(1000, 1000 + 6 * ps))
    reqs = [(system + [i] * (2 * ps + 1), [50 + i] * (3 * ps)) for i in range(4)] + [([7] * (3 * ps), [8] * ps)]
    for prompt, out in reqs + reqs:  # the second round hits what the first cached
        prompt, seq = array("i", prompt), array("i", prompt + out)
        h, n, row = cm.admit_view(prompt, len(out))
        h2, n2, got = ref.match_view(prompt)
        own = ref.allocate_view(-(-(len(seq)) // ps) - n2 // ps)
        assert n == n2 and len(row) == -(-len(seq) // ps) == len(got) + len(own)
        assert row.tolist() == got.tolist() + own.tolist()
        assert cm.available == ref.available and cm.num_free == ref.num_free
        cm.cache_finished_suffix(h, seq, row, start=n)  # the whole row: its pages from n // ps on are taken
        ref.cache_finished_suffix(h2, seq, own, start=n2)
        with pytest.raises(kvhal.InvalidHandle):
            cm.cache_finished_suffix(h, seq, row, start=n)  # a request finishes once, as match's handles
        cm.check_integrity()
        assert cm.prefix.size_info() == ref.prefix.size_info() and cm.num_free == ref.num_free
    # the row copied out (a page-table row, longer than needed) holds the pages of the whole request: its suffix
    # goes in as any page list does, the pages of tokens[n:]; the row as it came wants start = its matched length
    prompt = array("i", system + [9] * ps)
    h, n, row = cm.admit_view(prompt, 2 * ps)
    assert n == 6 * ps and len(row) == 9
    seq = array("i", list(prompt) + [3] * 2 * ps)
    with pytest.raises(kvhal.InvalidArgument, match=f"start: 0, but pages is admit_view's row.*start={n}"):
        cm.cache_finished_suffix(h, seq, row, start=0)
    table_row = np.zeros(16, dtype=np.int32)
    table_row[:len(row)] = row
    cm.cache_finished_suffix(h, seq, table_row[n // ps:], start=n)
    h, n, row = cm.admit_view(prompt[:6 * ps], 0)
    assert (n, len(row)) == (6 * ps, 6) and cm.num_free == ref.num_free - 3  # nothing new allocated
    cm.cache_finished_suffix(h, prompt[:6 * ps], row, start=n)
    h, n, row = cm.admit_view(seq, ps)  # the row whole into cache_finished: the whole request's pages
    cm.cache_finished(array("i", list(seq) + [4] * ps), row, h)
    cm.check_integrity()
    # a suffix list as long as the whole request (one surplus page per matched one) stays a suffix list
    p2 = array("i", system + [11] * ps)
    h, n, row = cm.admit_view(p2, 0)
    assert (n, len(row)) == (6 * ps, 7)
    own = cm.allocate(7)
    cm.free(row.tolist()[6:])
    cm.cache_finished_suffix(h, p2, own, start=n)  # own[0] holds tokens[n:]
    h2, n2, got = cm.match(p2)
    assert n2 == 7 * ps and got.tolist()[6:] == own.tolist()[:1]
    cm.unlock(h2)
    cm.free(own[1:])
    cm.check_integrity()


def test_manager_admit_view_refusals():
    """Bad arguments name the argument; when the pages cannot be had the match's lock is given back and nothing
    stays allocated (the three-call sequence's state after match + failed allocate + unlock)."""
    cm = kvhal.CacheManager(16, 1)
    prompt = array("i", range(10))
    h, n, row = cm.admit_view(prompt)
    assert (n, len(row)) == (0, 10)
    with pytest.raises(kvhal.InvalidArgument, match="extra_tokens: -1 is negative"):
        cm.admit_view(prompt, -1)
    with pytest.raises(TypeError):
        cm.admit_view(prompt, "3")
    with pytest.raises(TypeError):
        cm.admit_view()
    with pytest.raises(TypeError, match="unexpected keyword"):
        cm.admit_view(prompt, extra=3)
    with pytest.raises(kvhal.InvalidArgument, match="tokens"):
        cm.admit_view([1.5, 2])
    cm.cache_finished_suffix(h, prompt, row, start=n)
    held = cm.allocate(3)
    before = (cm.num_free, cm.available, cm.prefix.size_info())
    # 10 cached (locked by the match), 3 free: 4 more pages are not there
    with pytest.raises(kvhal.OutOfMemory, match="extra_tokens: .*need 4 pages.*only 3 free"):
        cm.admit_view(prompt, 4)
    assert (cm.num_free, cm.available, cm.prefix.size_info()) == before  # nothing locked, nothing allocated
    h2, n2, _ = cm.match_view(prompt)  # the three calls: match, a refused allocate, unlock: the same state
    with pytest.raises(kvhal.OutOfMemory):
        cm.allocate_view(4)
    cm.unlock(h2)
    assert (cm.num_free, cm.available, cm.prefix.size_info()) == before
    with pytest.raises(kvhal.OutOfMemory, match="extra_tokens"):
        cm.admit_view(prompt, 1 << 40)
    with pytest.raises(kvhal.OutOfMemory, match="extra_tokens"):
        cm.admit_view(prompt, 7)  # more than the manager has
    cm.free(held)
    cm.check_integrity()
    h, n, row = cm.admit_view(prompt, 6)  # exactly what is free
    assert (n, len(row), cm.num_free) == (10, 16, 0)
    cm.cache_finished_suffix(h, array("i", list(prompt) + [1] * 6), row, start=n)
    h, n, row = cm.admit_view(array("i", [77] * 4), 2)  # a miss: 6 pages, evicting the unlocked cached ones
    assert (n, len(row)) == (0, 6)
    cm.cache_finished_suffix(h, array("i", [77] * 6), row, start=n)
    cm.check_integrity()
    del row

"""kvhal.PagedCache and kvhal.TieredCacheManager: a host tier under the device pages, on every device. Every page's
content is derived from its tokens, so what a device match or a load-back hands back is checked value for value;
KV events are checked against the documented hash chain computed here in plain Python."""
from array import array

import numpy as np
import pytest

import kvhal
from conftest import DEVICES, torch

PS, LAYERS, HEADS, DIM = 4, 2, 1, 2
M64 = (1 << 64) - 1


def splitmix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def chain(tokens, ps=PS):
    """The documented page hash chain (kvhal.h), independent of the library."""
    h = splitmix64(0x6B7668616C2D6B76 ^ ps)
    out = []
    for i in range(len(tokens) // ps):
        parent = h
        for t in tokens[i * ps:(i + 1) * ps]:
            h = splitmix64(h ^ (int(t) & 0xFFFFFFFF))
        h = splitmix64(h ^ (ps << 32))
        out.append((parent, h))
    return out


def read(view):
    out = np.empty(view.shape, np.float32)
    view.copy_to(out)
    return out


def write(view, arr):
    view.copy_from(np.ascontiguousarray(arr, np.float32))


def page_value(tokens, i, layer, side):
    """What page i of a request holds in layer, side (0 K, 1 V): a function of its tokens."""
    t = np.asarray(tokens[i * PS:(i + 1) * PS], np.float32)
    return (t[:, None, None] * (1 + layer) + 0.5 * side) * np.ones((PS, HEADS, DIM), np.float32)


def write_pages(pc, tokens, pages, first):
    for layer in range(LAYERS):
        for side, view in enumerate(pc.layer(layer)):
            a = read(view)
            for i in range(first, len(tokens) // PS):
                a[pages[i]] = page_value(tokens, i, layer, side)
            write(view, a)


def expect_pages(pc, tokens, pages, first, n):
    for layer in range(LAYERS):
        for side, view in enumerate(pc.layer(layer)):
            a = read(view)
            for i in range(first, first + n):
                np.testing.assert_array_equal(a[pages[i]], page_value(tokens, i, layer, side),
                                              err_msg=f"page {i} layer {layer} side {side}")


def make(device, blocks=8, host_pages=32, policy="write_through", events=256):
    pc = kvhal.PagedCache(LAYERS, HEADS, DIM, PS, num_blocks=blocks, device=device)
    return pc, kvhal.TieredCacheManager(pc, host_pages=host_pages, policy=policy, event_capacity=events)


def run(tm, pc, tokens, content=True):
    """One request start to finish: match, load back, verify reused pages, write new ones, finish (content: False
    leaves the pages' values alone, for threads that would race on them)."""
    n = len(tokens)
    h, dl, hl, pages = tm.match_tiered(tokens)
    assert len(pages) == dl // PS
    if content:
        expect_pages(pc, tokens, pages, 0, dl // PS)
    pages = list(pages)
    if hl:
        loaded = tm.load_back(h, tokens)
        assert len(loaded) * PS == hl
        tm.transfer_wait()
        pages += list(loaded)
        if content:
            expect_pages(pc, tokens, pages, dl // PS, hl // PS)
    pages += list(tm.allocate(n // PS - len(pages)))
    if content:
        write_pages(pc, tokens, pages, (dl + hl) // PS)
    tm.cache_finished(tokens, pages, h)
    tm.check_integrity()
    return dl, hl


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_offload_and_load_back(device, policy):
    pc, tm = make(device, policy=policy)
    assert tm.policy == policy and tm.cache is pc and tm.page_size == PS
    assert tm.host_budget == 32 * pc.host_page_bytes
    a = np.arange(100, 132, dtype=np.int32)
    b = np.arange(500, 532, dtype=np.int32)
    assert run(tm, pc, a) == (0, 0)
    assert tm.stats()["pages_written"] == (8 if policy == "write_through" else 0)
    assert run(tm, pc, b) == (0, 0)  # evicts a from the device (8 pages in all)
    tm.transfer_wait()
    assert run(tm, pc, a) == (0, 32)  # a comes back from the host, verified in run()
    s = tm.stats()
    assert s["pages_loaded"] == 8 and s["host_pages_used"] >= 8 and s["host_pages_total"] == 32
    tm.transfer_wait()
    assert run(tm, pc, a) == (32, 0)  # now on the device again


def test_events_follow_the_hash_chain(device):
    pc, tm = make(device, policy="write_through")
    a = [7 * i + 3 for i in range(16)]
    run(tm, pc, a)
    tm.transfer_wait()
    evs = tm.events()
    assert all(isinstance(e, kvhal.KVEvent) for e in evs)
    want = chain(a)
    for tier in ("device", "host"):
        stored = [e for e in evs if e.kind == "stored" and e.tier == tier]
        assert [(e.parent_hash, e.hash) for e in stored] == want, tier
        assert [list(e.tokens) for e in stored] == [a[i * PS:(i + 1) * PS] for i in range(len(want))]
    assert [kvhal.kv_page_hash(p, a[i * PS:(i + 1) * PS]) for i, (p, _) in enumerate(want)] == [h for _, h in want]
    assert kvhal.kv_root_hash(PS) == want[0][0]
    assert tm.events() == []  # drained
    tm.evict(16)
    removed = [e for e in tm.events() if e.kind == "removed"]
    assert sorted(e.hash for e in removed) == sorted(h for _, h in want) and all(e.tier == "device" for e in removed)
    tm.host_tier_clear()
    cleared = tm.events(max=10)
    assert [(e.kind, e.tier) for e in cleared] == [("cleared", "host")]
    assert tm.stats()["host_pages_used"] == 0


def test_events_max_and_overflow():
    pc, tm = make("cpu:0", blocks=16, events=4)
    run(tm, pc, list(range(32)))  # 8 stored device + 8 stored host events into a queue of 4
    first = tm.events(max=1)
    assert len(first) == 1
    rest = tm.events()
    assert any(e.kind == "overflow" and e.dropped > 0 for e in first + rest)
    assert tm.stats()["events_dropped"] > 0


def test_page_ids_from_any_host_array():
    pc, tm = make("cpu:0")
    toks = list(range(40, 56))
    run(tm, pc, toks)
    forms = [np.asarray(toks, np.int64), array("i", toks), toks, np.asarray(toks, np.int32)]
    if torch is not None:
        forms += [torch.tensor(toks, dtype=torch.int32), torch.tensor(toks, dtype=torch.int64)]
    for f in forms:
        h, dl, hl, pages = tm.match_tiered(f)
        assert (dl, hl, len(pages)) == (16, 0, 4), type(f)
        tm.unlock(h)
    with pytest.raises(kvhal.InvalidArgument, match="tokens"):
        tm.match_tiered(np.zeros(8, np.float32))
    for dev in DEVICES:
        if not dev.startswith("cpu"):
            with pytest.raises(kvhal.InvalidArgument, match="tokens: page ids must be on the host"):
                tm.match_tiered(kvhal.empty((8,), "i32", dev))
    h, dl, hl, pages = tm.match_tiered(kvhal.from_dlpack(np.asarray(toks, np.int32)))  # a kvhal.Tensor
    assert dl == 16
    tm.unlock(h)
    if torch is not None:
        with pytest.raises(kvhal.InvalidArgument, match="tokens"):
            tm.match_tiered(torch.zeros(8, dtype=torch.float32))
        with pytest.raises(kvhal.InvalidArgument, match="tokens"):
            tm.match_tiered(torch.zeros((2, 4), dtype=torch.int32))


def test_paged_cache_views_keep_the_cache_alive(device):
    pc = kvhal.PagedCache(LAYERS, HEADS, DIM, PS, num_blocks=3, device=device, dtype="f16")
    assert (pc.num_blocks, pc.num_layers, pc.num_heads, pc.head_dim, pc.block_size) == (3, LAYERS, HEADS, DIM, PS)
    assert pc.dtype == "f16" and pc.device == device and pc.layout == "nhd" and pc.order == "layer_first"
    assert pc.host_page_bytes == 2 * LAYERS * PS * HEADS * DIM * 2 and not pc.shareable
    k, v = pc.layer(1)
    del pc
    assert k.shape == (3, PS, HEADS, DIM) and v.dtype == "f16"
    a = np.arange(k.shape[0] * PS * HEADS * DIM, dtype=np.float16).reshape(k.shape)
    k.copy_from(a)
    out = np.empty_like(a)
    k.copy_to(out)
    np.testing.assert_array_equal(out, a)


def test_paged_cache_update_and_copy_blocks():
    pc = kvhal.PagedCache(1, HEADS, DIM, PS, num_blocks=4, layout="hnd", order="page_first")
    k = np.arange(3 * HEADS * DIM, dtype=np.float32).reshape(3, HEADS, DIM)
    pc.update(0, k, -k, np.array([0, 5, 9], np.int64))
    kc, vc = (np.from_dlpack(t) for t in pc.layer(0))
    flat = kc.reshape(4 * PS, HEADS, DIM)
    np.testing.assert_array_equal(flat[[0, 5, 9]], k)
    np.testing.assert_array_equal(vc.reshape(4 * PS, HEADS, DIM)[[0, 5, 9]], -k)
    pc.copy_blocks(np.array([[1, 3]], np.int64))
    np.testing.assert_array_equal(kc[3], kc[1])
    with pytest.raises(kvhal.OutOfRange, match="layer"):
        pc.layer(1)
    with pytest.raises(kvhal.InvalidArgument, match="pairs"):
        pc.copy_blocks([1, 2, 3])


def test_bad_arguments():
    pc, tm = make("cpu:0")
    with pytest.raises(kvhal.InvalidArgument, match="cache"):
        kvhal.TieredCacheManager(object())
    with pytest.raises(kvhal.InvalidArgument, match="policy"):
        kvhal.TieredCacheManager(pc, policy="sometimes")
    with pytest.raises(kvhal.InvalidArgument, match="kind"):
        kvhal.TieredCacheManager(pc, kind="btree")
    with pytest.raises(kvhal.InvalidArgument, match="host_pages"):
        kvhal.TieredCacheManager(pc, host_pages=1, host_budget=100)
    with pytest.raises(kvhal.InvalidArgument, match="stream"):
        kvhal.TieredCacheManager(pc, stream=3)
    with pytest.raises(kvhal.InvalidArgument, match="event_capacity"):
        kvhal.TieredCacheManager(pc, event_capacity=-1)
    with pytest.raises(kvhal.InvalidArgument, match="total_pages"):  # more pages than the cache has blocks
        kvhal.TieredCacheManager(pc, total_pages=9)
    with pytest.raises(kvhal.InvalidArgument, match="num_blocks"):
        kvhal.PagedCache(1, 1, 1, 4)
    with pytest.raises(kvhal.InvalidArgument, match="num_blocks"):
        kvhal.PagedCache(1, 1, 1, 4, num_blocks=2, memory_budget=1 << 20)
    # a budget of 3 blocks' K and V (1 layer, 1 head, dim 2, 4 tokens, f32)
    assert kvhal.PagedCache(1, 1, 2, 4, memory_budget=3 * 2 * 4 * 2 * 4).num_blocks == 3
    with pytest.raises(kvhal.InvalidArgument, match="num_heads"):
        kvhal.PagedCache(1, 0, 1, 4, num_blocks=2)
    with pytest.raises(kvhal.InvalidArgument, match="layout"):
        kvhal.PagedCache(1, 1, 1, 4, num_blocks=2, layout="nchw")
    with pytest.raises(kvhal.InvalidArgument, match="dtype"):
        kvhal.PagedCache(1, 1, 1, 4, num_blocks=2, dtype="f128")
    other = kvhal.TieredCacheManager(pc)
    h, _, _, _ = other.match_tiered([1, 2, 3, 4])
    with pytest.raises(kvhal.InvalidHandle, match="handle"):
        tm.load_back(h, [1, 2, 3, 4])
    with pytest.raises(kvhal.InvalidArgument, match="handle"):
        tm.load_back("h", [1, 2, 3, 4])
    with pytest.raises(kvhal.InvalidArgument, match="max"):
        tm.events(max=-1)
    none = kvhal.TieredCacheManager(kvhal.PagedCache(1, 1, 1, 4, num_blocks=2))
    with pytest.raises(kvhal.InvalidArgument):
        none.events()
    plain = kvhal.TieredCacheManager.__new__(kvhal.TieredCacheManager)
    with pytest.raises(kvhal.InvalidArgument, match="initialised"):
        plain.stats()
    tm.transfer_wait()
    assert tm.transfer_query() is True  # nothing in flight after a wait


def test_load_back_releases_the_gil_and_stays_consistent_across_threads():
    """Two Python threads driving one manager (load_back and transfer_wait release the GIL): the C manager refuses a
    concurrent call (kvhal.Busy) rather than corrupting itself; integrity holds after. The threads leave the pages'
    values alone (their writes would race)."""
    import threading
    pc, tm = make("cpu:0", blocks=16, host_pages=64)
    errors = []

    def worker(base):
        for r in range(30):
            toks = list(range(base + 16 * (r % 5), base + 16 * (r % 5) + 16))
            try:
                run(tm, pc, toks, content=False)
            except kvhal.Busy:
                pass
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    ts = [threading.Thread(target=worker, args=(b,)) for b in (0, 10000)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tm.transfer_wait()
    tm.check_integrity()
    assert not [e for e in errors if not isinstance(e, (kvhal.Busy, kvhal.InvalidHandle, kvhal.OutOfMemory))]

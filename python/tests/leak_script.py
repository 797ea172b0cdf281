"""A small script over every entry of the package, run by `meson test` (object counts stay flat) and under valgrind
(`valgrind --leak-check=full python3 python/tests/leak_script.py`)."""
import gc
import sys

import numpy as np

import kvhal

try:  # the test-only producer of the DLPack C exchange API (built with the tests)
    from _xapi_producer import XArray, configure
except ImportError:
    XArray = configure = None


def once(i):
    kc = np.zeros((4, 2, 2, 8), np.float32)
    k = np.ones((2, 2, 8), np.float32)
    kvhal.paged_caching(kc, kc.copy(), k, k, np.array([0, 1 + i % 5]))
    try:
        kvhal.paged_caching(kc, kc, k, k, np.array([0, 100]))
    except kvhal.OutOfRange:
        pass
    kvhal.copy_blocks([kc], [(0, 1)])
    t = kvhal.empty((4, 2, 2, 8), "f32")
    kvhal.tensor_copy(t, kc)
    a = np.from_dlpack(t)
    v = kvhal.from_dlpack(kc)
    cap = t.__dlpack__(max_version=(1, 0))
    del a, v, cap, t
    cm = kvhal.CacheManager(16, 1)
    h, n, p = cm.match([1, 2, 3])
    pg = cm.allocate(3)
    cm.cache_finished([1, 2, 3], pg, h)
    h, n, p = cm.match([1, 2, 3, 4])
    if n:
        cm.unlock(h)
    cm.evict(10)
    pc = kvhal.PrefixCache("radix", 1)
    pc.insert([5, 6], [0, 1])
    pc.evict(2)
    kvhal.devices()
    if XArray is not None:
        configure(dltensor=bool(i % 2))
        kvhal.paged_caching(*(XArray(x) for x in (kc, kc.copy(), k, k, np.array([0, 1 + i % 5]))))
        w = kvhal.from_dlpack(XArray(k))
        configure(fail="dltensor")
        try:
            kvhal.paged_caching(XArray(kc), kc, k, k, np.array([0]))
        except kvhal.InvalidArgument:
            pass
        configure()
        del w


def serving_once(i):
    """The serving objects: paged cache views, the tiered manager and its events, the block pool, device events."""
    pc = kvhal.PagedCache(2, 1, 2, 4, num_blocks=4)
    k, v = pc.layer(i % 2)
    np.from_dlpack(k)
    tm = kvhal.TieredCacheManager(pc, host_pages=8, policy="write_back" if i % 2 else "write_through",
                                  event_capacity=16)
    toks = np.arange(8 * (i % 3), 8 * (i % 3) + 8, dtype=np.int32)
    h, dl, hl, pages = tm.match_tiered(toks)
    got = list(pages) + (list(tm.load_back(h, toks)) if hl else [])
    tm.transfer_wait()
    tm.cache_finished(toks, got + list(tm.allocate(2 - len(got))), h)
    tm.evict(4)
    tm.events()
    tm.stats()
    try:
        tm.load_back(None, toks)
    except kvhal.Error:
        pass
    bp = kvhal.BlockPool(4)
    b = bp.allocate(2)
    bp.share(b)
    bp.release(b)
    e = kvhal.Event()
    e.record()
    e.query()
    kvhal.paged_caching_mla(np.zeros((2, 4, 6), np.float32), np.ones((2, 4), np.float32), np.ones((2, 2), np.float32),
                            np.array([1, 5]))
    del k, v, pc, tm
    if i % 25 == 0 and getattr(kvhal._kvhal, "_have_xfer", 0):
        import kvhal.xfer as X
        with X.Agent("leak", transports="tcp") as a:
            a.register_cache(kvhal.PagedCache(1, 1, 1, 4, num_blocks=2))
            a.address
            a.progress(0)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500  # fewer under valgrind
    for i in range(50):
        once(i)
        serving_once(i)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(rounds):
        once(i)
        serving_once(i)
    gc.collect()
    after = len(gc.get_objects())
    print(f"objects before {before}, after {after}")
    if after > before + 50:
        print("leak: the object count grew", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

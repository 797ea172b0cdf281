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


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500  # fewer under valgrind
    for i in range(50):
        once(i)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(rounds):
        once(i)
    gc.collect()
    after = len(gc.get_objects())
    print(f"objects before {before}, after {after}")
    if after > before + 50:
        print("leak: the object count grew", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

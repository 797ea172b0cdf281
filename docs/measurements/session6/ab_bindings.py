"""A/B of the Python binding on bench_prefix's cache-manager loop: run once with PYTHONPATH at a build of the
session-5 binding (no kvhal.Pages: the loop slices seq[n:]) and once at this tree's build (start=n); prints the best
of 3 fresh-cache passes as JSON. Interleave the two a few times on a loaded machine."""
import json
import os
import sys
import time
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../python/bench"))
import bench_prefix as bp  # noqa: E402
import kvhal  # noqa: E402

new = hasattr(kvhal, "Pages")
reqs = bp.workload(64, 16, 2048, 128, 256)
arrs = [(array("i", p), array("i", p + o), len(o)) for p, o in reqs]
out = []
for _ in range(3):
    cm = kvhal.CacheManager(1 << 20, 1, "radix")
    t0 = time.perf_counter()
    if new:
        for prompt, seq, nout in arrs:
            h, n, got = cm.match(prompt)
            own = cm.allocate(len(prompt) - n + nout)
            cm.cache_finished_suffix(h, seq, own, start=n)
    else:
        for prompt, seq, nout in arrs:
            h, n, got = cm.match(prompt)
            own = cm.allocate(len(prompt) - n + nout)
            cm.cache_finished_suffix(h, seq[n:], own)
    out.append(len(arrs) / (time.perf_counter() - t0))
print(json.dumps({"binding": "new" if new else "old", "rps": max(out)}))

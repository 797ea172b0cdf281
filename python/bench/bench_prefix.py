"""Requests per second of a radix-cache scheduler loop in Python over kvhal.CacheManager against a pure-Python radix
cache (written here as the comparison, page size 1, LRU leaf eviction, lock counts, like mini-sglang's), on the
generated shared-prefix workload with kvhal-replay's default shape: 64 groups x 16 prompts, a 2048-token system
prompt per group, a 128-token question and 256 output tokens per request, groups interleaved. The token values
come from Python's random with a fixed seed (the same shape as kvhal-replay's generator, not the same ids).

Per request both loops do what a scheduler does: match (and lock) the prompt, allocate the uncached part plus the
output, and at the end insert the whole sequence and unlock (cache_finished). Only bookkeeping is timed; no K/V.
The kvhal loop is match -> allocate -> cache_finished_suffix(handle, seq, pages, start=matched): page lists come
back as kvhal.Pages and go back in without copies or slices.

Each of --passes passes (5) runs both loops, each on a fresh cache, alternating which goes first; the figures are
the median pass of each (ratio: of the medians) and the best pass (best_ratio). The baseline is the PyRadix class
below: a radix over bytes edges (one memcmp per edge, binary search on a mismatch), faster than a token-by-token
Python radix such as mini-sglang's.

usage: bench_prefix.py [--groups N] [--prompts N] [--system-len N] [--question-len N] [--output-len N]
                       [--pages N] [--passes N] [--json]"""
import argparse
import json
import random
import statistics
import sys
import time
from array import array

import kvhal


def workload(groups, prompts, system_len, question_len, output_len, seed=14):
    rng = random.Random(seed)
    systems = [[rng.randrange(128256) for _ in range(system_len)] for _ in range(groups)]
    reqs = []
    for p in range(prompts):
        for g in range(groups):
            q = [rng.randrange(128256) for _ in range(question_len + output_len)]
            reqs.append((systems[g] + q[:question_len], q[question_len:]))
    return reqs


class Node:
    __slots__ = ("children", "parent", "key", "value", "lock", "last")

    def __init__(self, parent=None, key=b"", value=None):
        self.children = {}
        self.parent = parent
        self.key = key  # the edge's token ids as int32 bytes
        self.value = value if value is not None else array("i")  # their page ids
        self.lock = 0
        self.last = 0


class PyRadix:
    """A pure-Python radix cache of token ids -> page ids (page size 1), LRU leaf eviction, lock counts. Edges are
    the tokens' int32 bytes, so an edge compares as one bytes comparison (memcmp) and a mismatch is found by binary
    search over slices: the fastest pure-Python layout we know (stdlib only)."""

    def __init__(self, total):
        self.root = Node()
        self.free = array("i", range(total))
        self.evictable = 0
        self.clock = 0

    def _split(self, node, n):
        child = Node(node.parent, node.key[:4 * n], node.value[:n])
        child.lock = node.lock
        child.last = node.last
        child.children = {node.key[4 * n:4 * n + 4]: node}
        node.parent.children[node.key[:4]] = child
        node.parent = child
        node.key = node.key[4 * n:]
        node.value = node.value[n:]
        return child

    def match(self, tb):
        node, i, pages = self.root, 0, array("i")
        total = len(tb) // 4
        self.clock += 1
        while i < total:
            child = node.children.get(tb[4 * i:4 * i + 4])
            if child is None:
                break
            child.last = self.clock
            k = child.key
            klen = len(k) // 4
            lim = min(klen, total - i)
            if tb[4 * i:4 * (i + lim)] == k[:4 * lim]:
                n = lim
            else:  # the first differing token, by binary search over slice comparisons
                lo, hi = 1, lim - 1
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if tb[4 * i:4 * (i + mid)] == k[:4 * mid]:
                        lo = mid
                    else:
                        hi = mid - 1
                n = lo
            if n < klen:
                child = self._split(child, n)
            pages.extend(child.value)
            i += n
            node = child
        return node, i, pages

    def lock(self, node, d):
        while node is not self.root:
            if node.lock == 0 and d > 0:
                self.evictable -= len(node.value)
            node.lock += d
            if node.lock == 0:
                self.evictable += len(node.value)
            node = node.parent

    def insert(self, tb, pages):
        node, i, _ = self.match(tb)
        if i < len(tb) // 4:
            new = Node(node, tb[4 * i:], pages[i:])
            new.last = self.clock
            node.children[tb[4 * i:4 * i + 4]] = new
            self.evictable += len(new.value)
        return i

    def evict(self, need):
        leaves = []
        stack = [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root and n.lock == 0:
                leaves.append(n)
            stack.extend(n.children.values())
        leaves.sort(key=lambda n: n.last)
        freed = 0
        while freed < need and leaves:
            n = leaves.pop(0)
            self.free.extend(n.value)
            freed += len(n.value)
            self.evictable -= len(n.value)
            p = n.parent
            del p.children[n.key[:4]]
            if not p.children and p is not self.root and p.lock == 0:
                leaves.append(p)
                leaves.sort(key=lambda x: x.last)
        return freed

    def allocate(self, n):
        if len(self.free) < n:
            self.evict(n - len(self.free))
        if len(self.free) < n:
            raise MemoryError
        out = self.free[len(self.free) - n:]
        del self.free[len(self.free) - n:]
        return out


def run_python(reqs, pages):
    c = PyRadix(pages)
    enc = [(array("i", p).tobytes(), array("i", p + o).tobytes(), len(p), len(o)) for p, o in reqs]  # tokenizer output
    matched = []
    t0 = time.perf_counter()
    for prompt, seq, plen, olen in enc:
        node, n, got = c.match(prompt)
        matched.append(n)
        c.lock(node, 1)
        own = c.allocate(plen - n + olen)
        allp = got + own
        before = c.insert(seq, allp)
        c.free.extend(allp[n:before])  # pages of tokens another request cached meanwhile
        c.lock(node, -1)
    return len(reqs) / (time.perf_counter() - t0), matched


def run_kvhal(reqs, pages):
    cm = kvhal.CacheManager(pages, 1, "radix")
    arrs = [(array("i", p), array("i", p + o), len(o)) for p, o in reqs]  # the tokenizer's output, in arrays
    matched = []
    t0 = time.perf_counter()
    for prompt, seq, nout in arrs:
        h, n, got = cm.match(prompt)
        matched.append(n)
        own = cm.allocate(len(prompt) - n + nout)
        cm.cache_finished_suffix(h, seq, own, start=n)
    rps = len(reqs) / (time.perf_counter() - t0)
    cm.check_integrity()
    return rps, matched


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--pages", type=int, default=1 << 20)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    reqs = workload(a.groups, a.prompts, a.system_len, a.question_len, a.output_len)
    pys, kvs = [], []
    for p in range(max(1, a.passes)):
        order = (run_python, run_kvhal) if p % 2 == 0 else (run_kvhal, run_python)
        got = {}
        for fn in order:
            got[fn] = fn(reqs, a.pages)
        (py, py_matched), (kv, kv_matched) = got[run_python], got[run_kvhal]
        if py_matched != kv_matched:  # the same policy without eviction: every request must match the same length
            print("bench_prefix: error: the two caches matched different prefix lengths", file=sys.stderr)
            return 1
        pys.append(py)
        kvs.append(kv)
    py, kv = statistics.median(pys), statistics.median(kvs)
    res = {"version": kvhal.__version__, "requests": len(reqs), "page_size": 1, "pages": a.pages,
           "cached_tokens": sum(kv_matched), "passes": len(pys), "load_average": __import__("os").getloadavg()[0],
           "baseline": "PyRadix (bytes edges, this file)",
           "python_radix_rps": py, "kvhal_rps": kv, "ratio": kv / py,
           "python_radix_best_rps": max(pys), "kvhal_best_rps": max(kvs), "best_ratio": max(kvs) / max(pys)}
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k:18s} {v:.1f}" if isinstance(v, float) else f"{k:18s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

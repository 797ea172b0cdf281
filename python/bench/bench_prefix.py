"""Requests per second of a radix-cache scheduler loop in Python over kvhal.CacheManager against two Python radix
caches written here as baselines (page size 1, LRU leaf eviction, lock counts), on the generated shared-prefix
workload with kvhal-replay's default shape: 64 groups x 16 prompts, a 2048-token system prompt per group, a 128-token
question and 256 output tokens per request, groups interleaved. The token values come from Python's random with a
fixed seed (the same shape as kvhal-replay's generator, not the same ids).

The baselines:
- MiniSglStyleRadix (ratio_minisgl): mini-sglang's radix prefix cache and cache manager (sgl-project/mini-sglang at
  commit 20fcd7f, kvcache/radix_cache.py and scheduler/cache.py), rewritten step for step: keys, values, free slots
  and the page table are CPU int32 torch tensors, children are found by ids[pos:][0].item(), an edge is compared
  by a native first-mismatch helper (theirs is C++ through tvm-ffi; here the same loop in C built with cc and
  called through ctypes, see the class), eviction is a heap of unlocked leaves by timestamp. This is the
  pure-Python radix of a current serving engine (about 20k requests/s at page size 1). Needs torch; skipped with a
  message without it.
- PyRadix (ratio): a stronger stdlib-only radix: edges are int32 bytes, so an edge compares as one memcmp and a
  mismatch is found by binary search over slices; no torch, no per-token or per-op overhead.

Per request every loop does what a scheduler does: match (and lock) the prompt, allocate the uncached part plus the
output, and at the end insert the whole sequence and unlock (cache_finished). Only bookkeeping is timed; no K/V.
The kvhal_admit loop (ratio, ratio_minisgl) is what an engine runs: admit_view(prompt, nout) matches and locks the
prompt and allocates the pages past the match in one call, handing back one list, the request's page-table row (the
matched page ids, then the new ones; an engine copies it into its page table), which goes back as it came into
cache_finished_suffix(handle, seq, row, start=matched) without copies or slices. Building that row is work both
baselines do too (PyRadix's got + own, the mini-sglang-style loop's page-table writes). The kvhal_view loop
(ratio_view, ratio_view_minisgl) does less: match_view -> allocate_view -> cache_finished_suffix(handle, seq, pages,
start=matched), two page lists as views of the manager's own storage (a match within one edge is the tree's own list,
not a copy) and no row built (an engine would copy both into its page table itself), one call more. The kvhal loop
(ratio_pages, ratio_pages_minisgl) is the three-call one with match and allocate, whose page lists are kvhal.Pages
objects of their own. Every pass checks that all loops matched the same prefix length for every request (else it
fails).

Each of --passes passes (9) runs every loop, each on a fresh cache, rotating which goes first; the figures are the
median pass of each (ratio: kvhal_admit's median over PyRadix's) and the best pass (best_ratio, ...). The garbage of
the previous loop is collected (gc.collect()) before each loop, outside its timing. --only NAME times one loop alone.
The timed pass of each loop is its cache's second: the workload runs once untimed, the cache is emptied through its
own eviction, then the timed pass runs, so that every loop finds memory it has touched before, as a cache in a
running server does (a first pass pays a page fault per 4 KiB of new tree memory, the C library's malloc'd tree
buffers and Python's objects alike). --cold times each cache's first pass instead.

usage: bench_prefix.py [--groups N] [--prompts N] [--system-len N] [--question-len N] [--output-len N]
                       [--pages N] [--passes N] [--only python|minisgl|kvhal|kvhal_view|kvhal_admit] [--cold]
                       [--json]"""
import argparse
import collections
import dataclasses
import gc
import heapq
import json
import os
import random
import statistics
import sys
import time
from array import array

import kvhal

try:
    import torch
except ImportError:  # the mini-sglang-style baseline needs it; the bench skips that baseline without it
    torch = None


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
    search over slices: the fastest pure-Python layout we know (stdlib only), several times faster than
    mini-sglang's torch-tensor radix (MiniSglStyleRadix below)."""

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


WARM = True  # --cold clears it


def warmed(cache, once, empty):
    """once(cache) timed on a cache in the state a running engine's is in: with --warm (the default) the workload
    runs once untimed and the cache is emptied through its own eviction (empty(cache)) first, so the timed pass
    finds the memory the cache has touched before, as it does in a server that has been running (every loop alike);
    with --cold the timed pass is the cache's first, paying its first touch of every page of memory."""
    if WARM:
        once(cache)
        empty(cache)
    return once(cache)


def run_python(reqs, pages):
    enc = [(array("i", p).tobytes(), array("i", p + o).tobytes(), len(p), len(o)) for p, o in reqs]  # tokenizer output

    def once(c):
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

    def empty(c):
        c.evict(c.evictable)
        if len(c.free) != pages:
            raise RuntimeError("PyRadix: eviction left pages behind")
    return warmed(PyRadix(pages), once, empty)


def empty_manager(cm):
    cm.evict(cm.page_size * cm.available)
    cm.check_integrity()
    if cm.num_free != cm.available:
        raise RuntimeError("CacheManager: eviction left pages behind")


def run_kvhal(reqs, pages, view=False):
    """The kvhal loop; view: page lists handed out as views of the manager's own storage (match_view,
    allocate_view), no page-list object sized and filled per call."""
    arrs = [(array("i", p), array("i", p + o), len(o)) for p, o in reqs]  # the tokenizer's output, in arrays

    def once(cm):
        match, allocate = (cm.match_view, cm.allocate_view) if view else (cm.match, cm.allocate)
        matched = []
        t0 = time.perf_counter()
        for prompt, seq, nout in arrs:
            h, n, got = match(prompt)
            matched.append(n)
            own = allocate(len(prompt) - n + nout)
            cm.cache_finished_suffix(h, seq, own, start=n)
        rps = len(reqs) / (time.perf_counter() - t0)
        del got, own  # views are valid until the next call on the manager
        cm.check_integrity()
        return rps, matched
    return warmed(kvhal.CacheManager(pages, 1, "radix"), once, empty_manager)


def run_kvhal_view(reqs, pages):
    return run_kvhal(reqs, pages, view=True)


def run_kvhal_admit(reqs, pages):
    """The kvhal loop with the fused call: admit_view (match, lock and the pages past the match, as one list of the
    matched page ids then the new ones) -> cache_finished_suffix(handle, seq, that list, start=matched)."""
    arrs = [(array("i", p), array("i", p + o), len(o)) for p, o in reqs]  # the tokenizer's output, in arrays

    def once(cm):
        admit, finish = cm.admit_view, cm.cache_finished_suffix
        matched = []
        t0 = time.perf_counter()
        for prompt, seq, nout in arrs:
            h, n, row = admit(prompt, nout)
            matched.append(n)
            finish(h, seq, row, start=n)
        rps = len(reqs) / (time.perf_counter() - t0)
        del row  # a view, valid until the next admit_view
        cm.check_integrity()
        return rps, matched
    return warmed(kvhal.CacheManager(pages, 1, "radix"), once, empty_manager)


# ---- the mini-sglang-style baseline -------------------------------------------------------------------------------
# A C mismatch helper built at run time with the system C compiler (see MiniSglStyleRadix's docstring for why).
_MISMATCH_SRC = r"""
#include <stddef.h>
#include <stdint.h>
size_t bench_mismatch_i32(const int32_t *a, const int32_t *b, size_t n)
{ size_t i = 0; while (i < n && a[i] == b[i]) i++; return i; }
size_t bench_mismatch_i64(const int64_t *a, const int64_t *b, size_t n)
{ size_t i = 0; while (i < n && a[i] == b[i]) i++; return i; }
"""
_compare = None  # (function, description), made on first use


def _first_diff_helper():
    """The compare mini-sglang's nodes call (its fast_compare_key): the length of the common prefix of two 1-D CPU
    int tensors, from their data pointers, in native code. Built once per process with cc into a temporary folder
    and called through ctypes; without a compiler, a torch-ops compare that returns the same value (slower)."""
    global _compare
    if _compare is not None:
        return _compare
    import ctypes
    import shutil
    import subprocess
    import tempfile
    try:
        d = tempfile.mkdtemp(prefix="bench_prefix_")
        src, so = os.path.join(d, "mismatch.c"), os.path.join(d, "mismatch.so")
        with open(src, "w") as f:
            f.write(_MISMATCH_SRC)
        subprocess.run([os.environ.get("CC", "cc"), "-O3", "-shared", "-fPIC", "-o", so, src], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lib = ctypes.CDLL(so)
        shutil.rmtree(d, ignore_errors=True)  # the library stays mapped
        f32, f64 = lib.bench_mismatch_i32, lib.bench_mismatch_i64
        for fn in (f32, f64):
            fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
            fn.restype = ctypes.c_size_t
        i32 = torch.int32

        def first_diff(a, b):
            if a.dtype is not b.dtype:
                raise TypeError("both keys must have one dtype")
            fn = f32 if a.dtype is i32 else f64
            return fn(a.data_ptr(), b.data_ptr(), min(len(a), len(b)))
        _compare = (first_diff, "native mismatch loop through ctypes (cc -O3), in place of tvm-ffi")
    except (OSError, subprocess.SubprocessError):
        def first_diff(a, b):
            n = min(len(a), len(b))
            a, b = a[:n], b[:n]
            if torch.equal(a, b):
                return n
            return int(torch.ne(a, b).to(torch.uint8).argmax())
        _compare = (first_diff, "torch ops (torch.equal, then ne+argmax): no C compiler found; slower than "
                                "mini-sglang's native helper, so ratio_minisgl reads high")
    return _compare


class MsNode:
    """A tree node as mini-sglang keeps it: key and value are CPU int32 tensors (token ids, page/slot ids), children
    by the first page's key (page size 1: the first token as a Python int), a reference count, an LRU timestamp
    from time.monotonic_ns(), and an id from a class counter."""
    serial = 0

    def __init__(self, key_of, stamp=None):
        self.key_of = key_of
        self.children = {}
        self._parent = None
        self.ref_count = 0
        self.uuid = MsNode.serial
        MsNode.serial += 1
        self.timestamp = stamp or time.monotonic_ns()

    def set_key_value(self, key, value):
        assert len(key) == len(value)
        self._key, self._value, self._length = key, value, len(key)

    def set_parent(self, parent):
        self._parent = parent
        parent.children[self.key_of(self._key)] = self

    @property
    def length(self):
        return self._length

    @property
    def parent(self):
        assert self._parent is not None
        return self._parent

    @property
    def value(self):
        return self._value

    def is_root(self):
        return self._parent is None

    def is_leaf(self):
        return len(self.children) == 0

    def get_match_len(self, ids):
        return _compare[0](self._key, ids)

    def split_at(self, pos):
        """Cut this edge after pos tokens; the new upper node takes the head and keeps the lock count."""
        assert 0 < pos < self.length
        up = MsNode(self.key_of, self.timestamp)
        up.set_key_value(self._key[:pos], self._value[:pos])
        up.set_parent(self.parent)
        up.ref_count = self.ref_count
        self.set_key_value(self._key[pos:], self._value[pos:])
        self.set_parent(up)
        return up

    def __lt__(self, other):
        return self.timestamp < other.timestamp


@dataclasses.dataclass(frozen=True)
class MsHandle:
    cached_len: int
    node: MsNode

    def get_matched_indices(self):
        parts, n = [], self.node
        while not n.is_root():
            parts.append(n.value)
            n = n.parent
        parts.reverse()
        return torch.cat(parts)


MsMatch = collections.namedtuple("MsMatch", "cuda_handle")
MsInsert = collections.namedtuple("MsInsert", "cached_len handle")
MsSizes = collections.namedtuple("MsSizes", "evictable_size protected_size")


class MiniSglStyleRadix:
    """The radix prefix cache and cache manager of mini-sglang (github.com/sgl-project/mini-sglang, commit
    20fcd7f3c6a1898a61139fae1c97cc7a40bd8d66: python/minisgl/kvcache/radix_cache.py, RadixPrefixCache and
    RadixTreeNode; python/minisgl/scheduler/cache.py, CacheManager; python/minisgl/kernel/radix.py and
    kernel/csrc/src/radix.cpp, fast_compare_key), rewritten here step for step, not copied:
    - keys and values are 1-D CPU int32 torch tensors (token ids as its tokenizer makes them; slot ids from the
      page table); a child is found in a dict keyed by key_fn(ids[pos:]) = ids[pos:][0].item() at page size 1
      (a tuple of the first page's ids otherwise); an edge is compared by fast_compare_key (first differing
      position, std::mismatch in C++ over both tensors' data); a partly matched edge is split during the walk,
      in match_prefix as in insert_prefix; every node on a walk gets the walk's monotonic_ns timestamp;
    - lock_handle walks to the root moving lengths between evictable and protected sizes; insert_prefix walks
      again and hangs one new node holding a clone of the slot ids; evict collects the unlocked leaves by a DFS,
      heapifies them by timestamp and pops, pushing a parent that becomes an unlocked leaf;
    - the manager keeps the free slots as an int32 tensor (taken from the front by slicing, freed by torch.cat),
      writes new slots into a page-table tensor through index tensors (its _write_page_table), copies the matched
      slots into the table row (get_matched_indices: torch.cat of the path's values) and on finish inserts the row,
      unlocks the old handle and frees the slots another request cached meanwhile (its cache_req(finished=True)).
    Deliberate differences: mini-sglang calls fast_compare_key through tvm-ffi (an AOT-built C++ module); tvm-ffi is
    not installable here, so the same loop in C is built with cc at first use and called through ctypes with the
    tensors' data_ptr() (about the same cost: one foreign call, two tensor pointers), or, without a compiler,
    torch ops. The page table and free slots live on the CPU (mini-sglang's are on the GPU, staged through pinned
    host tensors, so .to(device) is a no-op here and pin_memory is not used). match_req matches the whole prompt
    as the other loops do (mini-sglang's matches input_ids[:-1] so that prefill has a token; no prompt of the
    default workload is wholly cached, so the hit counts are the same); the token-id copies into the token pool
    and the table-row allocator are left out, as they are no part of the prefix cache."""

    def __init__(self, num_pages, page_size=1):
        _first_diff_helper()
        self.page_size = page_size
        self.key_fn = (lambda x: x[0].item()) if page_size == 1 else (lambda x: tuple(x[:page_size].tolist()))
        self.empty = torch.empty(0, dtype=torch.int32)
        self.evictable_size = 0
        self.protected_size = 0
        self.root = MsNode(self.key_fn)
        self.root.ref_count = 1
        self.num_pages = num_pages
        self.free_slots = torch.arange(num_pages, dtype=torch.int32) * page_size
        self.page_table = None  # made by the loop: (1, longest sequence) int32

    # -- the prefix cache (RadixPrefixCache) --
    def lock_handle(self, handle, unlock=False):
        n = handle.node
        if unlock:
            while not n.is_root():
                n.ref_count -= 1
                assert n.ref_count >= 0
                if n.ref_count == 0:
                    self.evictable_size += n.length
                    self.protected_size -= n.length
                n = n.parent
        else:
            while not n.is_root():
                if n.ref_count == 0:
                    self.evictable_size -= n.length
                    self.protected_size += n.length
                n.ref_count += 1
                n = n.parent

    def match_prefix(self, ids):
        node, got = self._walk(ids)
        return MsMatch(MsHandle(got, node))

    def insert_prefix(self, ids, slots):
        n = len(ids) // self.page_size * self.page_size
        ids, slots = ids[:n], slots[:n]
        node, got = self._walk(ids)
        if got != n:
            leaf = MsNode(self.key_fn)
            leaf.set_key_value(ids[got:], slots[got:].clone())
            leaf.set_parent(node)
            self.evictable_size += leaf.length
            node = leaf
        return MsInsert(got, MsHandle(n, node))

    def evict(self, size):
        if size == 0:
            return self.empty
        assert size <= self.evictable_size
        heap = self._unlocked_leaves()
        heapq.heapify(heap)
        out, done = [], 0
        while done < size:
            assert heap, "not enough evictable leaves"
            n = heapq.heappop(heap)
            assert n.ref_count == 0 and n.is_leaf() and not n.is_root()
            done += n.length
            out.append(n.value)
            self.evictable_size -= n.length
            p = n.parent
            del p.children[self.key_fn(n._key)]
            if p.is_leaf() and p.ref_count == 0:
                heapq.heappush(heap, p)
        return torch.cat(out)

    @property
    def size_info(self):
        return MsSizes(self.evictable_size, self.protected_size)

    def _unlocked_leaves(self):
        todo, leaves = [self.root], []
        while todo:
            n = todo.pop()
            if n.is_leaf():
                if n.ref_count == 0:
                    leaves.append(n)
            else:
                todo.extend(n.children.values())
        return leaves

    def _walk(self, ids):
        pos, total, node = 0, len(ids), self.root
        now = time.monotonic_ns()
        while pos < total:
            child = node.children.get(self.key_fn(ids[pos:]))
            if child is None:
                return node, pos
            node = child
            m = node.get_match_len(ids[pos:])
            m = m // self.page_size * self.page_size
            pos += m
            if m != node.length:
                return node.split_at(m), pos
            node.timestamp = now
        return node, pos

    # -- the cache manager (scheduler/cache.py) --
    def match_req(self, prompt):
        return self.match_prefix(prompt)

    @property
    def available_size(self):
        return self.size_info.evictable_size + len(self.free_slots) * self.page_size

    def lock(self, handle):
        self.lock_handle(handle, unlock=False)

    def unlock(self, handle):
        self.lock_handle(handle, unlock=True)

    def allocate_paged(self, row, cached_len, device_len):
        first, last = -(-cached_len // self.page_size), -(-device_len // self.page_size)
        if last > first:
            got = self._page_to_token(self._allocate(last - first))
            a, b = first * self.page_size, last * self.page_size
            rows = torch.empty(len(got), dtype=torch.int64)  # mini-sglang: pinned host tensors, then .to(device)
            cols = torch.empty(len(got), dtype=torch.int64)
            rows[0:b - a].fill_(row)
            torch.arange(a, b, out=cols[0:b - a])
            self.page_table[rows, cols] = got

    def cache_req(self, ids, row, cached_len, old):
        slots = self.page_table[row, :cached_len]
        before, new = self.insert_prefix(ids[:cached_len], slots)
        self.unlock(old)
        self._free(slots[old.cached_len:before])  # cached by another request meanwhile
        self._free(slots[new.cached_len:])  # finished: the tail that is not a whole page

    def check_integrity(self):
        if len(self.free_slots) + self.size_info.evictable_size + self.size_info.protected_size \
                != self.num_pages * self.page_size:
            raise RuntimeError("MiniSglStyleRadix: free + cached slots != all slots")

    def _allocate(self, pages):
        have = len(self.free_slots)
        if pages > have:
            ev = self.evict((pages - have) * self.page_size)
            self.free_slots = torch.cat([self.free_slots, ev[::self.page_size]])
            assert len(self.free_slots) >= pages
        got = self.free_slots[:pages]
        self.free_slots = self.free_slots[pages:]
        return got

    def _free(self, slots):
        if len(slots) > 0:
            self.free_slots = torch.cat([self.free_slots, slots[::self.page_size]])

    def _page_to_token(self, pages):
        if self.page_size == 1:
            return pages
        return (pages.unsqueeze(1) + torch.arange(self.page_size, dtype=torch.int32)).flatten()


def run_minisgl(reqs, pages):
    c = MiniSglStyleRadix(pages, 1)
    toks = [(torch.tensor(p, dtype=torch.int32), torch.tensor(p + o, dtype=torch.int32), len(p), len(o))
            for p, o in reqs]  # the tokenizer's output, as mini-sglang's: 1-D CPU int32 tensors
    c.page_table = torch.zeros((1, max(t[2] + t[3] for t in toks)), dtype=torch.int32)
    row = 0  # one request at a time: one table row

    def once(c):
        matched = []
        t0 = time.perf_counter()
        for prompt, seq, plen, olen in toks:
            h = c.match_req(prompt).cuda_handle  # PrefillAdder._try_allocate_one
            n = h.cached_len
            matched.append(n)
            need = plen - n + olen
            if need > c.available_size:
                raise MemoryError
            c.lock(h)
            if need > c.available_size:
                raise MemoryError
            if n > 0:
                c.page_table[row][:n].copy_(h.get_matched_indices())
            c.allocate_paged(row, n, plen + olen)  # Scheduler._prepare_batch
            c.cache_req(seq, row, plen + olen, h)  # decoding done: cache_req(req, finished=True)
        rps = len(reqs) / (time.perf_counter() - t0)
        c.check_integrity()
        if c.protected_size != 0:
            raise RuntimeError("MiniSglStyleRadix: a lock was left")
        return rps, matched

    def empty(c):
        c._free(c.evict(c.evictable_size))
        if len(c.free_slots) != pages:
            raise RuntimeError("MiniSglStyleRadix: eviction left slots behind")
    return warmed(c, once, empty)


LOOPS = {"python": "run_python", "minisgl": "run_minisgl", "kvhal": "run_kvhal", "kvhal_view": "run_kvhal_view",
         "kvhal_admit": "run_kvhal_admit"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--pages", type=int, default=1 << 20)
    ap.add_argument("--passes", type=int, default=9)
    ap.add_argument("--only", choices=sorted(LOOPS), help="time this loop alone (no ratios)")
    ap.add_argument("--cold", action="store_true", help="time each cache's first pass (no untimed pass first)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    global WARM
    WARM = not a.cold
    reqs = workload(a.groups, a.prompts, a.system_len, a.question_len, a.output_len)
    names = [a.only] if a.only else ["python", "minisgl", "kvhal", "kvhal_view", "kvhal_admit"]
    if "minisgl" in names and torch is None:
        print("bench_prefix: torch is not installed: the mini-sglang-style baseline (torch tensors) is skipped",
              file=sys.stderr)
        names.remove("minisgl")
        if not names:
            return 1
    rps = {k: [] for k in names}
    hits = None
    for p in range(max(1, a.passes)):
        order = names[p % len(names):] + names[:p % len(names)]  # each loop first, middle and last in turn
        got = {}
        for k in order:
            gc.collect()  # the previous loop's tree (reference cycles) is freed here, not inside the next timing
            got[k] = globals()[LOOPS[k]](reqs, a.pages)
        for k in names:
            rps[k].append(got[k][0])
        # the same policy without eviction: every request must match the same length in every cache
        for k in names[1:]:
            if got[k][1] != got[names[0]][1]:
                bad = sum(x != y for x, y in zip(got[k][1], got[names[0]][1]))
                print(f"bench_prefix: error: {k} and {names[0]} matched different prefix lengths "
                      f"({bad} of {len(reqs)} requests)", file=sys.stderr)
                return 1
        hits = got[names[0]][1]
    med = {k: statistics.median(v) for k, v in rps.items()}
    best = {k: max(v) for k, v in rps.items()}
    col = {"python": "python_radix", "minisgl": "minisgl_radix", "kvhal": "kvhal", "kvhal_view": "kvhal_view",
           "kvhal_admit": "kvhal_admit"}
    res = {"version": kvhal.__version__, "requests": len(reqs), "page_size": 1, "pages": a.pages,
           "cached_tokens": sum(hits), "hit_requests": sum(1 for h in hits if h),
           "hits_agree": "+".join(names), "passes": len(rps[names[0]]),
           "timed_pass": "warm (each cache's second pass, emptied by eviction after an untimed first)" if WARM
           else "cold (each cache's first pass)", "load_average": os.getloadavg()[0]}
    if "python" in names:
        res["baseline"] = "PyRadix (bytes edges, this file)"
    if "minisgl" in names:
        res["baseline_minisgl"] = ("MiniSglStyleRadix (this file; mini-sglang 20fcd7f radix_cache.py + "
                                   "scheduler/cache.py, torch 1-D int32 tensors; compare: " + _compare[1] + ")")
        res["torch"] = torch.__version__
    for prefix, fig in (("", med), ("best_", best)):  # the medians, then the best passes
        for k in names:
            res[col[k] + "_" + prefix + "rps"] = fig[k]
        for base, suffix in (("python", ""), ("minisgl", "_minisgl")):
            for loop, key in (("kvhal_admit", "ratio"), ("kvhal_view", "ratio_view"), ("kvhal", "ratio_pages")):
                if loop in names and base in names:
                    res[prefix + key + suffix] = fig[loop] / fig[base]
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for k, v in res.items():
            print(f"{k:22s} {v:.1f}" if isinstance(v, float) else f"{k:22s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

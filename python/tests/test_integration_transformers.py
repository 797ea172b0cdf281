"""kvhal.integrations.transformers on the CPU, without transformers: the attention function's paged write and
gather against plain attention over the full K/V, and the engine (scheduling, pages, prefix reuse, chunked prefill,
eviction, positions) driving a tiny Llama-shaped model in plain torch against full-recompute greedy decoding."""
import random
import types

import pytest

torch = pytest.importorskip("torch")

import kvhal  # noqa: E402
from kvhal.integrations import transformers as kt  # noqa: E402


def plain_attention(q, k, v, groups, scaling):
    """q [H, Lq, D] for the last Lq positions of k/v [KVH, L, D], causal."""
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    s = q @ k.transpose(-1, -2) * scaling
    L, Lq = k.shape[1], q.shape[1]
    mask = torch.arange(L)[None, :] <= torch.arange(L - Lq, L)[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def test_import_without_transformers():
    assert kt.ATTN_NAME == "kvhal_paged"
    assert kt.kvhal_device("cpu") == "cpu:0"


def test_paged_attention_matches_plain_attention():
    torch.manual_seed(0)
    H, KVH, D, P, pages = 8, 2, 16, 4, 64
    cache = kt.PagedKVCache(2, pages, P, KVH, D, torch.float32, "cpu")
    k0, _ = cache.pc.layer(1)
    assert cache.k[1].data_ptr() == torch.from_dlpack(k0).data_ptr()  # a view of kvhal's cache, not a copy
    mod = types.SimpleNamespace(layer_idx=1, num_key_value_groups=H // KVH)
    free = list(range(pages))
    random.Random(3).shuffle(free)
    reqs = [(0, 7), (9, 1), (12, 5), (0, 1), (20, 13)]  # (tokens already in pages, new tokens this step)
    fullk, fullv, pg = [], [], []
    for c, n in reqs:
        L = c + n
        fullk.append(torch.randn(KVH, L, D))
        fullv.append(torch.randn(KVH, L, D))
        pg.append([free.pop() for _ in range(-(-L // P))])
    for (c, n), k, v, p in zip(reqs, fullk, fullv, pg):  # the cached parts, written by an earlier step
        if c:
            s = torch.tensor([p[i // P] * P + i % P for i in range(c)])
            kvhal.paged_caching(cache.k[1], cache.v[1], k[:, :c].transpose(0, 1), v[:, :c].transpose(0, 1), s)
    qs = [torch.randn(H, n, D) for _, n in reqs]
    query = torch.cat(qs, 1)[None]
    key = torch.cat([k[:, c:] for (c, _), k in zip(reqs, fullk)], 1)[None]
    value = torch.cat([v[:, c:] for (c, _), v in zip(reqs, fullv)], 1)[None]
    slots, qlen, kvlen = [], [], []
    for (c, n), p in zip(reqs, pg):
        L = c + n
        slots += [p[i // P] * P + i % P for i in range(c, L)]
        qlen.append(n)
        kvlen.append(L)
    b = kt.KvhalBatch.from_lists(cache, slots, pg, qlen, kvlen, "cpu")
    # the read index lists every request's tokens in order, through its page table
    assert b.read_idx.tolist() == [p[i // P] * P + i % P for (c, n), p in zip(reqs, pg) for i in range(c + n)]
    assert b.cu_q.tolist() == [0, 7, 8, 13, 14, 27] and b.max_q == 13 and b.max_k == 33
    q0 = sum(qlen)
    out, _ = kt.kvhal_paged_attention(mod, query, key, value, None, scaling=D ** -0.5, kvhal_batch=b)
    assert out.shape == (1, q0, H, D)
    q0 = 0
    for (c, n), q, k, v in zip(reqs, qs, fullk, fullv):
        ref = plain_attention(q, k, v, H // KVH, D ** -0.5).transpose(0, 1)
        assert (out[0, q0:q0 + n] - ref).abs().max().item() < 1e-5
        q0 += n
    for (c, n), k, p in zip(reqs, fullk, pg):  # the pages hold every token's K/V at its slot
        got = cache.k[1][torch.tensor(p)].flatten(0, 1)[:c + n].transpose(0, 1)
        assert torch.equal(got, k)
    with pytest.raises(TypeError, match="kvhal_batch"):
        kt.kvhal_paged_attention(mod, query, key, value, None)


# ---- a tiny Llama-shaped model in plain torch, calling attention through a registry as transformers does --------
ATTN = {kt.ATTN_NAME: kt.kvhal_paged_attention}


def rope(x, pos, base=10000.0):  # x [1, h, T, D], pos [T]
    D = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, D, 2).float() / D)
    f = pos.float()[:, None] * inv[None]
    emb = torch.cat([f, f], -1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()


class Attn(torch.nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        self.layer_idx, self.cfg = i, cfg
        self.hd = cfg.hidden_size // cfg.num_attention_heads
        self.num_key_value_groups = cfg.num_attention_heads // cfg.num_key_value_heads
        self.q = torch.nn.Linear(cfg.hidden_size, cfg.num_attention_heads * self.hd, bias=False)
        self.k = torch.nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * self.hd, bias=False)
        self.v = torch.nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * self.hd, bias=False)
        self.o = torch.nn.Linear(cfg.num_attention_heads * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x, pos, **kw):
        T = x.shape[1]
        q = self.q(x).view(1, T, -1, self.hd).transpose(1, 2)
        k = self.k(x).view(1, T, -1, self.hd).transpose(1, 2)
        v = self.v(x).view(1, T, -1, self.hd).transpose(1, 2)
        q, k = rope(q, pos), rope(k, pos)
        if self.cfg._attn_implementation == "eager":  # the reference: full causal attention, no cache
            o = kt._sdpa(q, k, v, None, True, self.hd ** -0.5, self.num_key_value_groups).transpose(1, 2)
        else:
            o, _ = ATTN[self.cfg._attn_implementation](self, q, k, v, None, scaling=self.hd ** -0.5, **kw)
        return self.o(o.reshape(1, T, -1))


class TinyLM(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.emb = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = torch.nn.ModuleList(Attn(cfg, i) for i in range(cfg.num_hidden_layers))
        self.head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, position_ids=None, use_cache=False, logits_to_keep=0, **kw):
        x = self.emb(input_ids)
        pos = position_ids[0] if position_ids is not None else torch.arange(input_ids.shape[1])
        for layer in self.layers:
            x = x + layer(torch.nn.functional.layer_norm(x, x.shape[-1:]), pos, **kw)
        x = x if isinstance(logits_to_keep, int) and logits_to_keep == 0 else x[:, logits_to_keep]
        return types.SimpleNamespace(logits=self.head(x))


def greedy_reference(model, prompt, n):
    model.config._attn_implementation = "eager"
    seq = list(prompt)
    for _ in range(n):
        seq.append(model(torch.tensor([seq])).logits[0, -1].argmax().item())
    return seq[len(prompt):]


def make_tiny():
    torch.manual_seed(0)
    cfg = types.SimpleNamespace(vocab_size=97, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                num_hidden_layers=2, _attn_implementation="eager")
    model = TinyLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # peakier logits: fewer near-ties
    return model


@pytest.fixture(scope="module")
def tiny():
    model = make_tiny()
    rng = random.Random(5)
    tok = lambda n: [rng.randrange(97) for _ in range(n)]  # noqa: E731
    sys1, sys2 = tok(37), tok(50)
    reqs = [(tok(9), 6), (sys1 + tok(5), 8), (sys2 + tok(3), 1), (tok(1), 5), (sys1 + tok(9), 7),
            (sys2 + tok(11), 9), (sys1 + tok(4), 3), (tok(23), 12), (sys2 + tok(2), 4), (sys1, 6)]
    with torch.no_grad():
        refs = [greedy_reference(model, p, n) for p, n in reqs]
    return model, reqs, refs


@pytest.mark.parametrize("kw", [dict(max_batch=3), dict(max_batch=2, prefill_chunk=5), dict(max_batch=8),
                                dict(max_batch=8, max_step_tokens=7), dict(max_batch=8, share_running=False),
                                dict(max_batch=3, num_pages=24)],  # the last: small enough to evict prefixes
                         ids=["batch3", "chunked", "batch8", "step-budget", "no-sharing", "evicting"])
def test_engine_matches_full_recompute(tiny, kw):
    model, reqs, refs = tiny
    model.config._attn_implementation = kt.ATTN_NAME
    eng = kt.KvhalEngine(model, **{"num_pages": 256, "page_size": 4, **kw})
    rs = [eng.add(p, n) for p, n in reqs]
    assert len(eng.run()) == len(reqs)
    eng.cm.check_integrity()
    assert [r.rid for r, ref in zip(rs, refs) if r.out != ref] == []
    assert eng.cm.available == eng.cache.num_pages  # every page back: free or evictable
    s = eng.stats
    assert s["prefill_computed"] + s["cached_tokens"] == s["prompt_tokens"]
    if kw.get("num_pages") == 24:
        assert eng.cm.pages_evicted > 0
    else:
        assert s["cached_tokens"] > 0
        assert eng.hit_rate() <= kt.ideal_hit_rate([p for p, _ in reqs], 4) + 1e-9


def test_running_requests_share_prefixes(tiny):
    """Requests admitted together behind the same system prompt compute it once: the followers wait for the
    first one's prefill and match its pages, so the hit rate is the unbounded ideal (and without sharing, lower)."""
    model = tiny[0]
    model.config._attn_implementation = kt.ATTN_NAME
    rng = random.Random(11)
    tok = lambda n: [rng.randrange(97) for _ in range(n)]  # noqa: E731
    systems = [tok(21), tok(14)]
    reqs = [(systems[i % 2] + tok(3 + i), 2 + i % 3) for i in range(8)]
    ideal = kt.ideal_hit_rate([p for p, _ in reqs], 4)
    rates = {}
    for share in (True, False):
        eng = kt.KvhalEngine(model, num_pages=64, page_size=4, max_batch=8, share_running=share)
        rs = [eng.add(p, n) for p, n in reqs]
        eng.run()
        eng.cm.check_integrity()
        assert eng.cm.available == 64
        rates[share] = eng.hit_rate()
        with torch.no_grad():
            assert [r.out for r in rs] == [greedy_reference(model, p, n) for p, n in reqs]
        model.config._attn_implementation = kt.ATTN_NAME
        if share:
            assert eng.stats["waits_for_prefix"] > 0
    assert rates[True] == pytest.approx(ideal) and rates[False] < ideal


def test_host_tier_loads_back_what_the_device_evicted(tiny):
    """A device pool too small for the workload's prefixes, a host tier under it: prefixes the device evicted come
    back by load-back (host hits) instead of being computed again, and the tokens stay the reference's."""
    model = tiny[0]
    model.config._attn_implementation = kt.ATTN_NAME
    rng = random.Random(17)
    tok = lambda n: [rng.randrange(97) for _ in range(n)]  # noqa: E731
    systems = [tok(24) for _ in range(4)]
    reqs = [(systems[i % 4] + tok(2 + i % 3), 3) for i in range(16)]  # groups interleaved: each prefix comes back
    with torch.no_grad():
        refs = [greedy_reference(model, p, n) for p, n in reqs]
    model.config._attn_implementation = kt.ATTN_NAME
    computed = {}
    for host in (None, 64):
        eng = kt.KvhalEngine(model, num_pages=16, page_size=4, max_batch=2, host_pages=host,
                             event_capacity=256 if host else 0)
        rs = [eng.add(p, n) for p, n in reqs]
        eng.run()
        eng.cm.check_integrity()
        assert [r.out for r in rs] == refs
        assert eng.cm.pages_evicted > 0
        computed[host] = eng.stats["prefill_computed"]
        if host:
            st = eng.tier_stats()
            assert eng.stats["host_tokens"] > 0 and st["pages_loaded"] * 4 == eng.stats["host_tokens"]
            assert st["pages_written"] > 0
            kinds = {(e.kind, e.tier) for e in eng.events()}
            assert ("stored", "device") in kinds and ("stored", "host") in kinds and ("removed", "device") in kinds
        else:
            with pytest.raises(kvhal.InvalidArgument, match="events"):
                eng.events()
    assert computed[64] < computed[None]


def test_step_token_budget(tiny):
    model = tiny[0]
    model.config._attn_implementation = kt.ATTN_NAME
    eng = kt.KvhalEngine(model, num_pages=64, page_size=4, max_batch=4, max_step_tokens=5)
    for n in (13, 2, 9):
        eng.add(list(range(3, 3 + n)), 3)
    while eng.step():
        pass
    assert eng.stats["max_step_tokens"] == 5 and len(eng.done) == 3


def test_engine_argument_checks(tiny):
    model = tiny[0]
    with pytest.raises(ValueError, match="page_size"):
        kt.KvhalEngine(model, num_pages=8, page_size=0)
    with pytest.raises(TypeError, match="prefill_chunk"):
        kt.KvhalEngine(model, num_pages=8, prefill_chunk=2.5)
    with pytest.raises(ValueError, match="max_step_tokens"):
        kt.KvhalEngine(model, num_pages=8, max_step_tokens=0)
    with pytest.raises(ValueError, match="attention"):
        kt.KvhalEngine(model, num_pages=8, attention="flash")
    with pytest.raises(ValueError, match="varlen"):  # CPU, float32: the flash path does not apply
        kt.KvhalEngine(model, num_pages=8, attention="varlen")
    eng = kt.KvhalEngine(model, num_pages=8, page_size=4)
    with pytest.raises(ValueError, match="prompt"):
        eng.add([], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.add([1, 2], 0)
    with pytest.raises(kvhal.OutOfMemory):  # needs more pages than the pool has
        eng.add(list(range(40)), 2)
        eng.run()


PREFILL = r"""
import sys
from multiprocessing.connection import Client
from kvhal.integrations import disagg, transformers as kt
import test_integration_transformers as t
port, key, address, transports = int(sys.argv[1]), bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]
records = sys.argv[5] == "1"
conn = Client(("127.0.0.1", port), authkey=key)  # the control connection first: the decode side accepts it
model = t.make_tiny()
model.config._attn_implementation = kt.ATTN_NAME
t.ATTN[kt.ATTN_NAME] = kt.kvhal_paged_attention
server = disagg.PrefillServer(model, "kvhal-disagg-test", address, transports=transports, num_pages=64, page_size=4,
                              record_logits=records)
server.serve(conn)
server.close()
print("prefill served", server.engine.stats["requests"], "requests")
"""


def _serve_pair(model, reqs, transports, prefill_records=True):
    """A DecodeEngine (recording logits) here and a PrefillServer in a child process over transports: the decode
    side's requests, the engine, and the child's (returncode, stdout, stderr). An error of the run is raised after the
    child was stopped."""
    disagg = pytest.importorskip("kvhal.integrations.disagg", reason="kvhal built without libkvhal-xfer")
    import os
    import subprocess
    import sys
    from multiprocessing.connection import Listener
    eng = disagg.DecodeEngine(model, "kvhal-disagg-test", transports=transports, num_pages=96, page_size=4,
                              max_batch=3, record_logits=True)
    key = os.urandom(16)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with Listener(("127.0.0.1", 0), authkey=key) as lis:
        child = subprocess.Popen([sys.executable, "-c", PREFILL, str(lis.address[1]), key.hex(), eng.address.hex(),
                                  transports, str(int(prefill_records))], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env, text=True)
        try:
            eng.conn = lis.accept()
            eng.wait_peer(60)
            rs = [eng.add(p, n) for p, n in reqs]
            try:
                eng.run()
            finally:
                eng.close()
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
    return rs, eng, (child.returncode, out, err)


@pytest.mark.parametrize("transports", ["tcp", "shm"])
def test_disaggregated_prefill_and_decode(tiny, transports):
    """Prefill in another process, its K/V streamed layer by layer through libkvhal-xfer into the decode side's
    pages: the tokens are the single-process reference's, every request's timings are reported, and each token's
    logits row (the first one computed by the prefill process) is the single-process engine's."""
    model, reqs, refs = tiny
    model.config._attn_implementation = kt.ATTN_NAME
    one = kt.KvhalEngine(model, num_pages=96, page_size=4, max_batch=3, record_logits=True)
    ones = [one.add(p, n) for p, n in reqs]
    one.run()
    rs, eng, (rc, out, err) = _serve_pair(model, reqs, transports)
    assert rc == 0 and "prefill served 10 requests" in out, err
    assert [r.out for r in rs] == refs
    for r, o in zip(rs, ones):
        assert len(r.logits) == len(r.out) == len(o.logits)
        assert all(torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(r.logits, o.logits)), r.rid
    eng.cm.check_integrity()
    assert eng.cm.available == 96
    assert len(eng.timings) == len(reqs)
    for r in rs:
        t = r.t_first
        assert t["compute_s"] > 0 and t["exposed_s"] >= 0 and t["ttft_s"] >= t["compute_s"]


def test_disaggregated_logits_need_both_sides(tiny):
    """A decode side that records logits refuses a prefill process that sends none (its rows would pair with the
    wrong tokens), naming the argument; the prefill process still stops cleanly."""
    model, reqs, _ = tiny
    model.config._attn_implementation = kt.ATTN_NAME
    with pytest.raises(kvhal.InvalidArgument, match="record_logits"):
        _serve_pair(model, reqs, "tcp", prefill_records=False)

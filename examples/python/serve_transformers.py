"""Serves a seeded random Hugging Face causal LM with its KV pages in kvhal (kvhal.integrations.transformers) and
measures it against transformers' own generation on the same GPU, in the same process.

Workloads (--workload):
  shared  GROUPS groups x PER requests behind SYSTEM-token system prompts, a 16..64-token question each, NEW output
          tokens (default 64 x 16, 2048, 32): prints tokens/s of the kvhal engine beside stock generate_batch (its
          block sharing on; --kv-budget limits both to the same KV pages and turns stock's CPU offload on), prefill
          tokens computed, and the prefix hit rate against the unbounded ideal.
  mixed   COUNT requests, prompts of 16..4096 tokens (log-uniform), 1..256 output tokens: token for token against
          stock model.generate() (greedy; batched by length with left padding) and, in half precision, the
          log-probability differences of both engines to it (kvhal's and stock generate_batch's).
  tiered  the shared workload (use small --groups / --per-group) with kvhal's device pool at --kv-budget (default
          0.25) of its distinct KV and a host tier holding all of it: token for token against model.generate() as
          in mixed (in half precision beside stock generate_batch under the same pages, its CPU offload on).
  disaggregated  the mixed requests and LONG_COUNT prompts of LONG_PROMPT tokens prefilled by another process
          (--prefill-device; cuda:1 when there are two GPUs) and decoded here, the K/V streamed layer by layer
          through libkvhal-xfer: tokens against the single-process engine, the time-to-first-token breakdown
          (prefill compute, transfer exposed after it, first token seen here).

    python3 serve_transformers.py [--workload shared|mixed|both|tiered|disaggregated] [--arch llama,qwen3]
                                  [--dtype fp32,bf16] [--host-tier --kv-budget 0.25] [--check] [--json FILE]

--check exits 1 when, in float32, a request diverges from model.generate() where stock's top-2 logit gap is not
below --tie-gap, or when kvhal's half-precision log-prob error against the same weights in float32 (mean or p99,
along model.generate()'s tokens) exceeds stock generate_batch's by more than 10 %. Needs torch >= 2.10 and
transformers >= 5 (a GPU for useful speeds).
"""
import argparse
import json
import math
import random
import sys
import time

import torch

import kvhal
from kvhal.integrations import transformers as kt

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def log(*a):
    print(*a, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(arch, dtype, device, args, seed=0):
    """A seeded random causal LM of real layer shapes (grouped KV heads), no end-of-sequence token."""
    import transformers as tf
    common = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                  num_hidden_layers=args.layers, num_attention_heads=args.heads,
                  num_key_value_heads=args.kv_heads, head_dim=args.head_dim, max_position_embeddings=8192,
                  bos_token_id=1, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif arch == "qwen3":
        cfg, cls = tf.Qwen3Config(**common), tf.Qwen3ForCausalLM
    else:
        raise ValueError(f"--arch: unknown {arch!r} (llama, qwen3)")
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
    model = model.to(dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def mixed_workload(n, vocab, seed=1):
    """n requests: prompts 16..4096 tokens (log-uniform, both ends included), outputs 1..256."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        p = 16 if i == 0 else 4096 if i == 1 else int(math.exp(rng.uniform(math.log(16), math.log(4096))))
        m = 1 if i == 2 else 256 if i == 3 else rng.randint(1, 256)
        reqs.append(([rng.randrange(3, vocab) for _ in range(p)], m))
    return reqs


def shared_workload(groups, per, system, new, vocab, seed=2):
    """groups x per requests: a system prompt per group, then a 16..64-token question; arrival interleaves the
    groups (request k of every group, then k + 1)."""
    rng = random.Random(seed)
    tok = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    systems = [tok(system) for _ in range(groups)]
    return [(systems[g] + tok(rng.randint(16, 64)), new) for _ in range(per) for g in range(groups)]


def stock_generate(model, reqs, device, batch=8):
    """model.generate, greedy, batched by prompt length with left padding: per request (tokens, logits rows)."""
    kt.set_attention(model, "sdpa")
    order = sorted(range(len(reqs)), key=lambda i: len(reqs[i][0]))
    res = [None] * len(reqs)
    for b in range(0, len(order), batch):
        idx = order[b:b + batch]
        L, n = max(len(reqs[i][0]) for i in idx), max(reqs[i][1] for i in idx)
        ids = torch.zeros((len(idx), L), dtype=torch.long)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        for row, i in enumerate(idx):
            p = reqs[i][0]
            ids[row, L - len(p):] = torch.tensor(p)
            att[row, L - len(p):] = 1
        o = model.generate(ids.to(device), attention_mask=att.to(device), max_new_tokens=n, do_sample=False,
                           output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        lg = torch.stack(o.logits, 1).float().cpu()  # [batch, steps, vocab]
        for row, i in enumerate(idx):
            m = reqs[i][1]
            res[i] = (o.sequences[row, L:L + m].tolist(), lg[row, :m])
    return res


def stock_generate_batch(model, reqs, device, args, kv_pages=None, offload_gib=0.0):
    """transformers' continuous batching (generate_batch) with block sharing on, under the kvhal engine's limits
    (requests per batch, tokens per step): per request (tokens, logprobs), seconds, and the config used. One
    max_new_tokens for all (the largest); callers compare each request's own first tokens."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    kt.set_attention(model, "sdpa")
    gen = GenerationConfig(max_new_tokens=max(n for _, n in reqs), do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    cb = dict(block_size=args.stock_page_size, allow_block_sharing=True, return_logprobs=True,
              cpu_offload_space=offload_gib, max_requests_per_batch=args.max_batch,
              max_batch_tokens=args.step_tokens)
    if kv_pages is not None:
        cb["num_blocks"] = kv_pages
    cfg = ContinuousBatchingConfig(**cb)
    sync(device)
    t = time.perf_counter()
    out = model.generate_batch([p for p, _ in reqs], generation_config=gen, continuous_batching_config=cfg,
                               progress_bar=True)
    sync(device)
    dt = time.perf_counter() - t
    res = [(o.generated_tokens[:n], list(o.logprobs[:n])) for o, (_, n) in zip(out.values(), reqs)]
    if len(res) != len(reqs):
        raise RuntimeError(f"generate_batch returned {len(res)} of {len(reqs)} requests")
    return res, dt, cb


def kvhal_generate(model, reqs, device, record=False, **kw):
    """The requests through a KvhalEngine: engine, its Requests, seconds."""
    kt.set_attention(model, kt.ATTN_NAME)
    eng = kt.KvhalEngine(model, record_logits=record, **kw)
    rs = [eng.add(p, n) for p, n in reqs]
    sync(device)
    t = time.perf_counter()
    eng.run()
    sync(device)
    dt = time.perf_counter() - t
    kvhal.check_errors(kt.kvhal_device(device))  # an out-of-range slot would be reported here
    eng.cm.check_integrity()
    kt.set_attention(model, "sdpa")
    return eng, rs, dt


def first_divergence(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def compare_fp32(ref, rs, tie_gap):
    """Token for token against model.generate; a divergence where stock's top-2 gap < tie_gap is a tie."""
    same, ties, lines = 0, [], []
    for (st, sl), r in zip(ref, rs):
        n = first_divergence(st, r.out)
        if n == len(st) == len(r.out):
            same += 1
            continue
        top2 = sl[n].topk(2).values if n < len(sl) else None
        gap = (top2[0] - top2[1]).item() if top2 is not None else float("nan")
        if gap < tie_gap:
            ties.append(gap)
        lines.append(f"    request {r.rid}: prompt {len(r.prompt)}, {len(st)} new: diverges at output {n} "
                     f"(stock top-2 gap {gap:.3g}{', a tie' if gap < tie_gap else ''})")
    return same, ties, lines


def logprob_diffs(ref, outs):
    """Per request: identical or not, and |log-prob difference| to model.generate over the tokens both agree on
    (outs: per request (tokens, log-probs of those tokens))."""
    same, diffs = 0, []
    for (st, sl), (tok, lp) in zip(ref, outs):
        n = first_divergence(st, tok)
        same += n == len(st) == len(tok)
        ref_lp = torch.log_softmax(sl[:n], -1)
        for j in range(n):
            diffs.append(abs(ref_lp[j, st[j]].item() - lp[j]))
    return same, diffs


def fp32_truth(model, reqs, ref, device):
    """The log-probabilities of model.generate()'s tokens under the same weights in float32 (one teacher-forced
    forward per request): the reference each half-precision engine's error is measured against."""
    import copy
    m32 = copy.deepcopy(model).float()
    kt.set_attention(m32, "sdpa")
    truth = []
    with torch.no_grad():
        for (p, _), (st, _) in zip(reqs, ref):
            ids = torch.tensor([list(p) + list(st[:-1])], device=device)
            lg = m32(ids).logits[0, len(p) - 1:len(p) - 1 + len(st)].float()
            lp = torch.log_softmax(lg, -1)
            truth.append(lp[torch.arange(len(st), device=device), torch.tensor(st, device=device)].tolist())
    del m32
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return truth


def truth_diffs(ref, truth, outs):
    """|log-prob - float32 log-prob| over the tokens each engine shares with model.generate() (outs: per request
    (tokens, log-probs of those tokens))."""
    diffs = []
    for (st, _), tr, (tok, lp) in zip(ref, truth, outs):
        for j in range(first_divergence(st, tok)):
            diffs.append(abs(lp[j] - tr[j]))
    return diffs


def request_lps(r):
    """A recorded Request's (tokens, log-probs of those tokens)."""
    return r.out, [torch.log_softmax(x, -1)[t].item() for x, t in zip(r.logits, r.out)]


def half_errors(model, reqs, ref, device, engines):
    """In half precision: each engine's outputs (name -> per request (tokens, log-probs)) against model.generate()'s
    (ref) and against the same weights in float32 along generate()'s tokens (logged); name -> (identical,
    |diff to generate|, |error to float32|)."""
    truth = fp32_truth(model, reqs, ref, device)
    gen = [(st, torch.log_softmax(sl[:len(st)], -1)[torch.arange(len(st)), st].tolist()) for st, sl in ref]
    errs = {}
    for name, outs in [("generate", gen)] + list(engines.items()):
        same, d = logprob_diffs(ref, outs)
        e = truth_diffs(ref, truth, outs)
        errs[name] = (same, d, e)
        if name != "generate":
            log(f"  {name} vs generate: {same}/{len(outs)} identical, |log-prob diff| {stats_line(d)}")
        log(f"  {name} vs float32 weights: |log-prob error| {stats_line(e)} over {len(e)} tokens")
    return errs


def mean(d):
    return sum(d) / max(1, len(d))


def quantile(d, f):
    return sorted(d)[int(f * (len(d) - 1))] if d else 0.0


def stats_line(d):
    d = sorted(d) or [0.0]
    return f"max {d[-1]:.3g}, p99 {d[int(0.99 * (len(d) - 1))]:.3g}, mean {sum(d) / len(d):.3g}"


def run_mixed(args, arch, dtype, device, out, tiered=False):
    """mixed: the mixed requests against model.generate(). tiered: the shared workload (--groups x --per-group)
    with the device pool at --kv-budget of its distinct KV and a host tier holding all of it, against
    model.generate() (and, in half precision, stock generate_batch under the same pages with its CPU offload)."""
    model = build_model(arch, dtype, device, args)
    kw, stock_kw = dict(num_pages=args.pages), {}
    if tiered:
        reqs = shared_workload(args.groups, args.per_group, args.system, args.new, args.vocab)
        distinct = args.groups * args.system + sum(len(p) - args.system + n for p, n in reqs)
        pages = max(1, int(distinct * (args.kv_budget or 0.25)) // args.page_size)
        kw = dict(num_pages=pages, host_pages=distinct // args.page_size + len(reqs))
        stock_kw = dict(kv_pages=pages * args.page_size // args.stock_page_size, offload_gib=args.offload_gib)
        log(f"\n== tiered: {arch}, {str(dtype)[6:]}, {len(reqs)} requests ({args.groups} groups x "
            f"{args.per_group} behind {args.system}-token system prompts); device pool {pages} pages of "
            f"{args.page_size} ({100 * pages * args.page_size / distinct:.0f}% of the distinct KV, {distinct} "
            f"tokens), host tier {kw['host_pages']} pages ==")
    else:
        reqs = mixed_workload(args.count, args.vocab)
        log(f"\n== mixed: {arch}, {str(dtype)[6:]}, {len(reqs)} requests, prompts {min(len(p) for p, _ in reqs)}.."
            f"{max(len(p) for p, _ in reqs)}, outputs {min(n for _, n in reqs)}..{max(n for _, n in reqs)} ==")
    t = time.perf_counter()
    ref = stock_generate(model, reqs, device)
    log(f"  stock generate: {time.perf_counter() - t:.1f} s")
    eng, rs, t_kv = kvhal_generate(model, reqs, device, record=True, page_size=args.page_size,
                                   attention=args.attention,
                                   max_batch=args.max_batch, max_step_tokens=args.step_tokens,
                                   prefill_chunk=args.chunk, **kw)
    res = dict(workload="tiered" if tiered else "mixed", arch=arch, dtype=str(dtype)[6:], requests=len(reqs),
               kvhal_s=t_kv)
    if tiered:
        ts = eng.tier_stats()
        res.update(host_tokens=eng.stats["host_tokens"], device_hit_tokens=eng.stats["cached_tokens"],
                   pages_evicted=eng.cm.pages_evicted, pages_loaded=ts["pages_loaded"])
        log(f"  kvhal: {eng.stats['host_tokens']} prompt tokens loaded back from the host tier "
            f"({ts['pages_loaded']} pages), {eng.stats['cached_tokens']} hit on the device, {eng.cm.pages_evicted} "
            f"pages evicted, hit rate {100 * eng.hit_rate():.2f}%")
    if dtype == torch.float32:
        same, ties, lines = compare_fp32(ref, rs, args.tie_gap)
        log(f"  kvhal vs generate: {same}/{len(rs)} token-identical, {len(ties)} diverge at ties "
            f"(gaps {', '.join(f'{g:.2g}' for g in ties) or '-'}), {len(lines) - len(ties)} real divergences")
        for line in lines[:10]:
            log(line)
        res.update(identical=same, ties=len(ties), real=len(lines) - len(ties), ok=same + len(ties) == len(rs))
    else:
        gb, t_gb, _ = stock_generate_batch(model, reqs, device, args, **stock_kw)
        # Two half-precision engines differ from a third (generate) by rounding alone, so the error each makes is
        # measured against the same weights in float32 along generate()'s tokens: kvhal's mean and p99 within 10 %
        # of stock generate_batch's (the maxima are reported, not compared: one rounding step decides them).
        e = half_errors(model, reqs, ref, device, {"kvhal": [request_lps(r) for r in rs], "stock generate_batch": gb})
        (same_kv, _, e_kv), (same_gb, _, e_gb) = e["kvhal"], e["stock generate_batch"]
        ok = mean(e_kv) <= 1.1 * mean(e_gb) and quantile(e_kv, 0.99) <= 1.1 * quantile(e_gb, 0.99)
        res.update(identical=same_kv, stock_batch_identical=same_gb,
                   lp_diff_to_generate={k: dict(mean=mean(v[1]), p99=quantile(v[1], 0.99), max=max(v[1], default=0))
                                        for k, v in e.items() if k != "generate"},
                   fp32_error={k: dict(mean=mean(v[2]), p99=quantile(v[2], 0.99), max=max(v[2], default=0))
                               for k, v in e.items()}, ok=ok)
    out.append(res)
    del model
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return res["ok"]


def kv_bytes_per_token(model, dtype):
    c = model.config
    return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * torch.tensor([], dtype=dtype).element_size()


def run_shared(args, arch, dtype, device, out):
    model = build_model(arch, dtype, device, args)
    reqs = shared_workload(args.groups, args.per_group, args.system, args.new, args.vocab)
    ideal = kt.ideal_hit_rate([p for p, _ in reqs], args.page_size)
    distinct = args.groups * args.system + sum(len(p) - args.system + n for p, n in reqs)
    pages = args.pages
    if args.kv_budget:
        pages = max(1, int(distinct * args.kv_budget) // args.page_size)
    log(f"\n== shared: {arch}, {str(dtype)[6:]}, {args.groups} groups x {args.per_group} requests, "
        f"{args.system}-token system prompts, {args.new} new tokens each; KV pool {pages} pages of "
        f"{args.page_size} ({pages * args.page_size * kv_bytes_per_token(model, dtype) / 2**30:.2f} GiB; "
        f"distinct KV of the workload {distinct} tokens) ==")
    ntok = sum(n for _, n in reqs)
    tier = {}
    if args.host_tier:  # a host tier that holds the whole workload's distinct KV
        tier = dict(host_pages=distinct // args.page_size + len(reqs))
        log(f"  kvhal host tier: {tier['host_pages']} pages "
            f"({tier['host_pages'] * args.page_size * kv_bytes_per_token(model, dtype) / 2**30:.2f} GiB), "
            f"write-through")
    # warm-up of both paths (kernels, allocator, library handles)
    kvhal_generate(model, reqs[:4], device, num_pages=pages, page_size=args.page_size, **tier)
    offload = args.offload_gib if args.kv_budget else 0.0
    stock_pages = pages * args.page_size // args.stock_page_size
    rounds = []
    for rnd in range(args.rounds):  # interleaved rounds: kvhal, stock, kvhal, stock ...
        eng, rs, t_kv = kvhal_generate(model, reqs, device, num_pages=pages, page_size=args.page_size,
                                       max_batch=args.max_batch, max_step_tokens=args.step_tokens,
                                       prefill_chunk=args.chunk, **tier)
        s = eng.stats
        if tier:
            ts = eng.tier_stats()
            log(f"  round {rnd}: host tier: {s['host_tokens']} prompt tokens loaded back ({ts['pages_loaded']} "
                f"pages), {ts['pages_written']} pages written, {ts['host_evictions']} host evictions")
        log(f"  round {rnd}: kvhal {ntok / t_kv:.0f} tok/s ({t_kv:.2f} s): hit rate {100 * eng.hit_rate():.2f}% "
            f"(ideal {100 * ideal:.2f}%), prefill computed {s['prefill_computed']} of {s['prompt_tokens']} prompt "
            f"tokens, {s['steps']} steps, waits for a running prefix {s['waits_for_prefix']}, pages evicted "
            f"{eng.cm.pages_evicted}; host time {100 * s['host_s'] / t_kv:.1f}% of the run (cache manager "
            f"{100 * s['cm_s'] / t_kv:.2f}%)")
        res = dict(workload="shared", arch=arch, dtype=str(dtype)[6:], pages=pages, hit_rate=eng.hit_rate(),
                   ideal=ideal, host_tokens=s["host_tokens"], device_hit_tokens=s["cached_tokens"], prefill_computed=s["prefill_computed"], prompt_tokens=s["prompt_tokens"],
                   host_share=s["host_s"] / t_kv, cm_share=s["cm_s"] / t_kv)
        if rnd == 0:
            out.append(res)
            if args.profile_steps:
                res["decode_profile"] = profile_decode(model, reqs, device, args, pages)
        if args.no_stock:
            rounds.append((ntok / t_kv, None))
            continue
        gb, t_gb, cbcfg = stock_generate_batch(model, reqs, device, args, kv_pages=stock_pages, offload_gib=offload)
        agree = sum(r.out == g[0] for r, g in zip(rs, gb))
        rounds.append((ntok / t_kv, ntok / t_gb))
        log(f"  round {rnd}: stock generate_batch {ntok / t_gb:.0f} tok/s ({t_gb:.2f} s): kvhal/stock "
            f"{t_gb / t_kv:.2f}; identical outputs {agree}/{len(rs)}; its config {cbcfg}")
    out[-1].update(kvhal_tok_s=[r[0] for r in rounds], stock_tok_s=[r[1] for r in rounds])
    del model
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return True


def profile_decode(model, reqs, device, args, pages):
    """kvhal's share of decode steps: its kernels' device time (paged writes) and the host time of its calls."""
    from torch.profiler import ProfilerActivity, profile
    kt.set_attention(model, kt.ATTN_NAME)
    eng = kt.KvhalEngine(model, num_pages=pages, page_size=args.page_size, max_batch=args.max_batch,
                         max_step_tokens=args.step_tokens, prefill_chunk=args.chunk)
    for p, _ in reqs[:args.max_batch]:
        eng.add(p, 2 * args.profile_steps + 8)  # running through both timed passes
    while any(r.kv_len < len(r.prompt) for r in eng.running) or not eng.running:
        eng.step()
    for _ in range(3):
        eng.step()
    sync(device)
    # timed without the profiler (it adds host time to every torch call), then once more under it for the device
    # time of kvhal's kernels (the profiler does not stretch device time)
    h0, c0, b0 = eng.stats["host_s"], eng.stats["cm_s"], eng.stats["table_s"]
    t = time.perf_counter()
    for _ in range(args.profile_steps):
        eng.step()
    sync(device)
    wall = time.perf_counter() - t
    host = eng.stats["host_s"] - h0
    cm = eng.stats["cm_s"] - c0
    table = eng.stats["table_s"] - b0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profile_steps):
            eng.step()
        sync(device)
    kern = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0)]
    total_dev = sum(getattr(e, "self_device_time_total", 0) for e in kern) / 1e6
    kv_dev = sum(getattr(e, "self_device_time_total", 0) for e in kern if "kvhal" in e.key.lower()) / 1e6
    top = sorted(kern, key=lambda e: -getattr(e, "self_device_time_total", 0))[:8]
    for e in top:
        log(f"    device {100 * e.self_device_time_total / 1e6 / max(total_dev, 1e-9):5.1f}%  {e.key[:90]}")
    log(f"  decode steps with {len(eng.running)} requests: {1e3 * wall / args.profile_steps:.2f} ms/step; kvhal's "
        f"share {100 * (kv_dev + cm + table) / wall:.2f}%: its kernels (paged writes) {100 * kv_dev / wall:.2f}% "
        f"({100 * kv_dev / max(total_dev, 1e-9):.2f}% of device time), page tables (host lists, the device table, "
        f"slots and read index) {100 * table / wall:.2f}%, cache-manager calls {100 * cm / wall:.3f}%; the engine's "
        f"host time in all {100 * host / wall:.2f}%")
    kt.set_attention(model, "sdpa")
    return dict(requests=len(eng.running), step_ms=1e3 * wall / args.profile_steps, share=(kv_dev + cm + table) / wall,
                kernels=kv_dev / wall, tables=table / wall, cm=cm / wall, host=host / wall)


def weights_sum(model):
    return float(sum(p.double().sum().item() for p in list(model.parameters())[:4]))


def prefill_role(args):
    """The prefill process of --disaggregate (started by the decode process with --role prefill)."""
    from multiprocessing.connection import Client

    from kvhal.integrations import disagg
    conn = Client(("127.0.0.1", args.control), authkey=bytes.fromhex(args.key))
    device = torch.device(args.device)
    model = build_model(args.arch, DTYPES[args.dtype], device, args)
    conn.send(("ready", weights_sum(model), torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"))
    kt.register()
    kt.set_attention(model, kt.ATTN_NAME)
    server = disagg.PrefillServer(model, args.token, bytes.fromhex(args.address), num_pages=args.pages,
                                  page_size=args.page_size, record_logits=args.record)
    server.serve(conn)
    server.close()
    return 0


def long_workload(n, length, vocab, seed=3):
    rng = random.Random(seed)
    return [([rng.randrange(3, vocab) for _ in range(length)], 16) for _ in range(n)]


def run_disaggregated(args, arch, dtype, device, out):
    """The mixed workload (and prompts of --long-prompt tokens) prefilled in another process, decoded here:
    tokens against the single-process engine, and the time-to-first-token breakdown."""
    import os
    import subprocess
    from multiprocessing.connection import Listener

    from kvhal.integrations import disagg
    model = build_model(arch, dtype, device, args)
    reqs = mixed_workload(args.count, args.vocab) + long_workload(args.long_count, args.long_prompt, args.vocab)
    kw = dict(num_pages=args.pages, page_size=args.page_size, max_batch=args.max_batch,
              max_step_tokens=args.step_tokens)
    half = dtype != torch.float32
    _, ref, t_one = kvhal_generate(model, reqs, device, record=half, **kw)
    kt.set_attention(model, kt.ATTN_NAME)
    token = os.urandom(16).hex()
    eng = disagg.DecodeEngine(model, token, record_logits=half, **kw)
    key = os.urandom(16)
    dname = [k for k, v in DTYPES.items() if v == dtype][0]
    with Listener(("127.0.0.1", 0), authkey=key) as lis:
        cmd = [sys.executable, __file__, "--role", "prefill", "--control", str(lis.address[1]), "--key", key.hex(),
               "--address", eng.address.hex(), "--token", token, "--device", args.prefill_device, "--arch", arch,
               "--dtype", dname, "--pages", str(args.pages), "--page-size", str(args.page_size)]
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
            cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
        cmd += ["--record"] if half else []
        child = subprocess.Popen(cmd)
        try:
            eng.conn = lis.accept()
            _, wsum, pname = eng.conn.recv()
            if abs(wsum - weights_sum(model)) > 1e-6 * max(1.0, abs(wsum)):
                raise RuntimeError(f"the prefill process built other weights ({wsum} against {weights_sum(model)})")
            eng.wait_peer(120)
            rs = [eng.add(p, n) for p, n in reqs]
            sync(device)
            t = time.perf_counter()
            eng.run()
            sync(device)
            t_two = time.perf_counter() - t
            eng.close()
            child.wait(60)
        finally:
            if child.poll() is None:
                child.kill()
    kt.set_attention(model, "sdpa")
    same = sum(a.out == b.out for a, b in zip(rs, ref))
    log(f"\n== disaggregated: {arch}, {str(dtype)[6:]}, prefill on {args.prefill_device} ({pname}), decode on "
        f"{device}: {len(reqs)} requests ==")
    log(f"  tokens identical to the single-process engine: {same}/{len(reqs)}; wall {t_two:.2f} s (one process "
        f"{t_one:.2f} s)")
    longs = [r.t_first for r in rs if len(r.prompt) == args.long_prompt]
    for name, group in (("all", [r.t_first for r in rs]), (f"{args.long_prompt}-token prompts", longs)):
        if not group:
            continue
        c = sum(g["compute_s"] for g in group) / len(group)
        e = sum(g["exposed_s"] for g in group) / len(group)
        f = sum(g["ttft_s"] for g in group) / len(group)
        worst = max(g["exposed_s"] / g["compute_s"] for g in group)
        log(f"  {name}: prefill compute {1e3 * c:.2f} ms, transfer exposed after it {1e3 * e:.3f} ms "
            f"({100 * e / c:.1f}% of the compute; worst request {100 * worst:.1f}%), time to first token here "
            f"{1e3 * f:.2f} ms (mean of {len(group)})")
    res = dict(workload="disaggregated", arch=arch, dtype=str(dtype)[6:], prefill_device=args.prefill_device,
               identical=same, requests=len(reqs),
               long_exposed_share=[g["exposed_s"] / g["compute_s"] for g in longs])
    ok = same == len(reqs)
    if half:
        # in half precision the prefill process's batches of one round differently from one process's packed
        # steps: tokens may part, so its error against float32 is compared instead (mean and p99 within 10 %)
        gen = stock_generate(model, reqs, device)
        e = half_errors(model, reqs, gen, device, {"one process": [request_lps(r) for r in ref],
                                                   "disaggregated": [request_lps(r) for r in rs]})
        one, two = e["one process"][2], e["disaggregated"][2]
        ok = mean(two) <= 1.1 * mean(one) and quantile(two, 0.99) <= 1.1 * quantile(one, 0.99)
        res.update(fp32_error={k: dict(mean=mean(v[2]), p99=quantile(v[2], 0.99), max=max(v[2], default=0))
                               for k, v in e.items()})
    res.update(ok=ok)
    out.append(res)
    del model
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="shared", choices=["shared", "mixed", "both", "tiered", "disaggregated"])
    ap.add_argument("--prefill-device", default=None,
                    help="disaggregated: the prefill process's device (default: cuda:1 when there are two GPUs)")
    ap.add_argument("--long-prompt", type=int, default=4096, help="disaggregated: the long prompts' length")
    ap.add_argument("--long-count", type=int, default=8, help="disaggregated: how many long prompts")
    ap.add_argument("--role", default="serve", choices=["serve", "prefill"], help=argparse.SUPPRESS)
    ap.add_argument("--control", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--token", help=argparse.SUPPRESS)
    ap.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--arch", default="llama", help="comma-separated: llama, qwen3")
    ap.add_argument("--dtype", default="bf16", help="comma-separated: fp32, bf16, fp16")
    ap.add_argument("--check", action="store_true", help="exit 1 on a failed comparison (see above)")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--count", type=int, default=64, help="mixed: requests")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--per-group", type=int, default=16)
    ap.add_argument("--system", type=int, default=2048, help="shared: system prompt tokens")
    ap.add_argument("--new", type=int, default=32, help="shared: output tokens per request")
    ap.add_argument("--pages", type=int, default=32768, help="KV pages in kvhal's pool")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--stock-page-size", type=int, default=256, help="generate_batch's block size")
    ap.add_argument("--kv-budget", type=float, default=0.0,
                    help="shared: KV pool as a share of the workload's distinct KV (0: --pages)")
    ap.add_argument("--offload-gib", type=float, default=16.0, help="stock's CPU offload space with --kv-budget")
    ap.add_argument("--host-tier", action="store_true", help="shared: kvhal's host tier, holding the whole workload")
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--step-tokens", type=int, default=8192, help="tokens computed per step at most")
    ap.add_argument("--chunk", type=int, default=None, help="prompt tokens per request per step at most")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-stock", action="store_true", help="shared: run the kvhal engine only")
    ap.add_argument("--profile-steps", type=int, default=0, help="shared: profile this many decode steps")
    ap.add_argument("--attention", default="auto", choices=["auto", "varlen", "sdpa"],
                    help="mixed/tiered: the kvhal engine's attention path")
    ap.add_argument("--tie-gap", type=float, default=1e-5)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    if a.role == "prefill":
        return prefill_role(a)
    if a.prefill_device is None:
        a.prefill_device = "cuda:1" if torch.cuda.device_count() > 1 else a.device
    kt.register()
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    log(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, kvhal "
        f"{kvhal.__version__}, {name}")
    ok, out = True, []
    for arch in a.arch.split(","):
        for d in a.dtype.split(","):
            if d not in DTYPES:
                ap.error(f"--dtype: unknown {d!r}")
            if a.workload in ("mixed", "both"):
                ok &= run_mixed(a, arch, DTYPES[d], device, out)
            if a.workload in ("shared", "both"):
                ok &= run_shared(a, arch, DTYPES[d], device, out)
            if a.workload == "tiered":
                ok &= run_mixed(a, arch, DTYPES[d], device, out, tiered=True)
            if a.workload == "disaggregated":
                ok &= run_disaggregated(a, arch, DTYPES[d], device, out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=name, results=out), f, indent=1)
    log("CHECK " + ("PASSED" if ok else "FAILED"))
    return 1 if a.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())

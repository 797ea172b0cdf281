"""Serves a small random Hugging Face Llama with its KV pages in kvhal (kvhal.integrations.transformers) and checks it
token for token against transformers' own model.generate(do_sample=False) with stock sdpa attention.

Workloads: "mixed" (12 requests, prompts of 5..300 tokens, 1..64 new tokens) at batch 4 and at batch 8 with prefill
chunks of 48 tokens, and "shared" (3 groups of 6 requests behind 600-token system prompts, batch 3), where kvhal's
radix cache serves the shared prefixes. Prints per workload the agreement, tokens/s of the kvhal engine and of stock
generate (one request at a time), and the prefix hit rate against its ideal.

    python3 serve_transformers.py --check [--dtype fp32|bf16|both] [--device cuda:0] [--cudnn-sdp off]

Needs torch and transformers (and a GPU for useful speeds). With --check it exits 1 when a request diverges from
stock where stock's top-2 logit gap is not a tie (fp32: gap >= --tie-gap); bf16 divergences are reported only, as
one bf16 rounding step can flip a near-tie.
"""
import argparse
import random
import sys
import time

import torch

import kvhal
from kvhal.integrations import transformers as kt


def log(*a):
    print(*a, flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(dtype, device, seed=0, layers=4, hidden=512, heads=8, kv_heads=2, vocab=1024):
    """A seeded random LlamaForCausalLM with grouped KV heads and no end-of-sequence token."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=8192, bos_token_id=1, eos_token_id=None, pad_token_id=0,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def stock_generate(model, reqs, device, want_logits=True):
    """model.generate, greedy, one request at a time: [(tokens, logits [n, vocab] or None)], seconds."""
    kt.set_attention(model, "sdpa")
    res = []
    sync(device)
    t = time.perf_counter()
    for prompt, n in reqs:
        ids = torch.tensor([prompt], device=device)
        o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                           output_logits=want_logits, return_dict_in_generate=True, pad_token_id=0)
        lg = torch.stack(o.logits)[:, 0].float().cpu() if want_logits else None
        res.append((o.sequences[0, len(prompt):].tolist(), lg))
    sync(device)
    return res, time.perf_counter() - t


def kvhal_generate(model, reqs, device, record=True, **kw):
    """The same requests through a KvhalEngine: engine, its Requests, seconds."""
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


def compare(name, stock, rs, tie_gap):
    """Token-for-token comparison; a divergence where stock's top-2 logit gap < tie_gap counts as a tie.
    Returns (every request identical or a tie, number identical)."""
    same = ties = tokens = 0
    worst, lines = 0.0, []
    for (st, sl), r in zip(stock, rs):
        tokens += len(st)
        n = 0
        while n < min(len(st), len(r.out)) and st[n] == r.out[n]:
            n += 1
        if r.logits and sl is not None:
            for j in range(min(n, len(st))):
                worst = max(worst, (sl[j] - r.logits[j]).abs().max().item())
        if n == len(st) == len(r.out):
            same += 1
            continue
        gap = float("nan")
        if sl is not None and n < len(sl):
            top2 = sl[n].topk(2).values
            gap = (top2[0] - top2[1]).item()
        tie = gap < tie_gap
        ties += tie
        lines.append(f"    request {r.rid}: prompt {len(r.prompt)} cached {r.cached}: first divergence at output "
                     f"{n}/{len(st)} (stock {st[n] if n < len(st) else None} kvhal "
                     f"{r.out[n] if n < len(r.out) else None}); stock top-2 gap there {gap:.3g}"
                     f"{' (tie)' if tie else ''}")
    log(f"  {name}: {same}/{len(rs)} requests token-identical ({tokens} stock tokens), {ties} divergences are "
        f"ties (gap < {tie_gap:g}); max |logit diff| before divergence {worst:.3g}")
    for line in lines[:8]:
        log(line)
    return same + ties == len(rs), same


def workloads(seed, vocab):
    """(mixed, shared): lists of (prompt tokens, new tokens)."""
    rng = random.Random(seed)

    def tok(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    mixed = [(tok(n), m) for n, m in [(17, 40), (33, 1), (64, 64), (100, 23), (128, 48), (200, 64), (257, 12),
                                      (31, 64), (300, 30), (5, 50), (90, 64), (160, 7)]]
    groups, per, sys_len = 3, 6, 600
    systems = [tok(sys_len) for _ in range(groups)]
    leaders = [(systems[g] + tok(rng.randrange(16, 80)), 32) for g in range(groups)]
    follow = [(systems[g] + tok(rng.randrange(16, 80)), 32) for _ in range(per - 1) for g in range(groups)]
    return mixed, leaders + follow


SCENARIOS = {"mixed": ("mixed, batch 4", "mixed", dict(max_batch=4)),
             "chunked": ("mixed, batch 8, prefill chunks of 48", "mixed", dict(max_batch=8, prefill_chunk=48)),
             "shared": ("shared 600-token system prompts, 3 groups x 6, batch 3", "shared", dict(max_batch=3))}


def run_dtype(args, dtype, device, summary):
    """Every scenario at one dtype; True when none failed the check."""
    model = build_model(dtype, device)
    cfg = model.config
    log(f"\n== Llama {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads, "
        f"{cfg.num_key_value_heads} KV heads x {cfg.head_dim}, vocab {cfg.vocab_size}, {dtype} ==")
    tie = args.tie_gap if dtype == torch.float32 else 0.0
    mixed, shared = workloads(1, cfg.vocab_size)
    work = {"mixed": mixed, "shared": shared}
    # warm-up of both paths (kernels, allocator, library handles)
    stock_generate(model, mixed[:2], device, want_logits=False)
    kvhal_generate(model, mixed[:2], device, record=False, num_pages=256, page_size=args.page_size)
    ok, refs = True, {}
    for name, key, kw in [SCENARIOS[x] for x in args.scenarios.split(",")]:
        reqs = work[key]
        if key not in refs:
            refs[key] = stock_generate(model, reqs, device)
        stock, t_stock = refs[key]
        eng, rs, t_kv = kvhal_generate(model, reqs, device, num_pages=args.pages, page_size=args.page_size, **kw)
        s = eng.stats
        good, same = compare(name, stock, rs, tie)
        ok &= good if dtype == torch.float32 else True
        ntok = sum(len(x[0]) for x in stock)
        ideal = kt.ideal_hit_rate([p for p, _ in reqs], args.page_size)
        log(f"    {s['requests']} requests, {s['prompt_tokens']} prompt tokens, {s['cached_tokens']} from kvhal's "
            f"radix cache (hit rate {100 * eng.hit_rate():.1f}%, ideal {100 * ideal:.1f}%), prefill computed "
            f"{s['prefill_computed']}, {s['output_tokens']} output tokens in {s['steps']} steps (max "
            f"{s['max_step_tokens']} tokens/step), pages evicted {eng.cm.pages_evicted}")
        log(f"    tokens/s: kvhal engine {ntok / t_kv:.0f} ({t_kv:.2f} s, host scheduling "
            f"{100 * s['host_s'] / t_kv:.1f}%), stock generate one request at a time {ntok / t_stock:.0f} "
            f"({t_stock:.2f} s); KV pool {eng.cache.nbytes >> 20} MiB")
        summary.append(f"{str(dtype)[6:]:8s} {name}: {same}/{len(rs)} identical, hit {100 * eng.hit_rate():.1f}%, "
                       f"kvhal {ntok / t_kv:.0f} tok/s vs stock {ntok / t_stock:.0f} tok/s")
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ok


def check(args):
    kt.register()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    log(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, kvhal "
        f"{kvhal.__version__}, {name}")
    dtypes = {"fp32": [torch.float32], "bf16": [torch.bfloat16], "both": [torch.float32, torch.bfloat16]}
    ok, summary = True, []
    for dtype in dtypes[args.dtype]:
        ok &= run_dtype(args, dtype, device, summary)
    log("\n== summary ==")
    for line in summary:
        log("  " + line)
    log("CHECK " + ("PASSED" if ok else "FAILED") + " (fp32: token-identical or ties; bf16: reported)")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 on a divergence from model.generate that is not a tie")
    ap.add_argument("--dtype", default="both", choices=["both", "fp32", "bf16"])
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--pages", type=int, default=4096, help="KV pages in the pool")
    ap.add_argument("--page-size", type=int, default=16, help="tokens per page")
    ap.add_argument("--scenarios", default="mixed,chunked,shared", help="comma-separated: mixed, chunked, shared")
    ap.add_argument("--tie-gap", type=float, default=1e-5,
                    help="fp32: a divergence where stock's top-2 logit gap is below this is a tie")
    ap.add_argument("--cudnn-sdp", default="on", choices=["on", "off"],
                    help="off: disable cuDNN's SDPA kernels, for stock and kvhal alike")
    a = ap.parse_args()
    unknown = [s for s in a.scenarios.split(",") if s not in SCENARIOS]
    if unknown:
        ap.error(f"--scenarios: unknown {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if a.cudnn_sdp == "off" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
        log("cuDNN SDPA disabled for stock and kvhal alike (--cudnn-sdp off)")
    rc = check(a)
    return rc if a.check else 0


if __name__ == "__main__":
    sys.exit(main())

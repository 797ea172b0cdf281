"""Host time per kvhal.paged_caching call from Python against the C call's host time (kvhal-bench --op
host_overhead, same machine, same shape): llama3-8b layer (8 KV heads x 128, bf16), 256 tokens, descriptor cached,
all-padding slots (validation, dispatch and the slot scan, no copy), tensors passed directly.

usage: bench_host.py [--bench PATH_TO_kvhal-bench] [--device cpu:0|cuda:0] [--reps N] [--json]
Prints median ns per call for: the C call (from kvhal-bench), kvhal from Python (torch tensors, NumPy arrays where
the dtype allows), and the difference. On cuda the tensors are CUDA tensors and no synchronisation is timed."""
import argparse
import json
import statistics
import subprocess
import sys
import time

import kvhal


def c_overhead(bench, device):
    env = dict(**__import__("os").environ, KVHAL_DEVICE=device)
    out = subprocess.run([bench, "--op", "host_overhead", "--json"], capture_output=True, text=True, env=env,
                         check=True).stdout
    recs = json.loads(out)
    got = {r["op"]: r["ns"] for r in recs if r.get("preset") == "llama3-8b"}
    return got.get("host_overhead"), got.get("host_call")


def time_calls(fn, reps, rounds=15):
    """Mean ns per call of each round of reps calls: the median round (and, in MIN, the fastest: on a shared,
    loaded machine the fastest round is the closest to the call's own cost)."""
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            fn()
        per.append((time.perf_counter_ns() - t0) / reps)
    MIN[fn] = min(per)
    return statistics.median(per)


MIN = {}
FNS = {}


def timed(name, fn, reps):
    FNS[name] = fn
    return time_calls(fn, reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build-y/tools/kvhal-bench")
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import torch
    dev = "cpu" if a.device.startswith("cpu") else a.device
    tokens, heads, dim, block = 256, 8, 128, 16
    nb = tokens // block
    kc = torch.zeros(nb, block, heads, dim, dtype=torch.bfloat16, device=dev)
    vc = torch.zeros_like(kc)
    k = torch.randn(tokens, heads, dim, device=dev).to(torch.bfloat16)
    v = torch.randn(tokens, heads, dim, device=dev).to(torch.bfloat16)
    slots = torch.full((tokens,), -1, dtype=torch.int64, device=dev)
    stream = torch.cuda.current_stream() if dev != "cpu" else None
    kvhal.paged_caching(kc, vc, k, v, slots, stream=stream)  # descriptor made
    py_torch = timed("python_torch_ns", lambda: kvhal.paged_caching(kc, vc, k, v, slots, stream=stream), a.reps)
    py_torch_kw = timed("python_torch_positional_ns",
                        lambda: kvhal.paged_caching(kc, vc, k, v, slots, 1.0, 1.0, stream), a.reps)
    res = {"version": kvhal.__version__, "device": a.device, "shape": "llama3-8b bf16 256 tokens, padding slots",
           "torch": torch.__version__, "python_torch_ns": py_torch, "python_torch_positional_ns": py_torch_kw}
    if dev == "cpu":
        import numpy as np
        nkc = np.zeros((nb, block, heads, dim), np.float16)
        nvc = np.zeros_like(nkc)
        nk = np.ones((tokens, heads, dim), np.float16)
        ns = np.full((tokens,), -1, np.int64)
        res["python_numpy_f16_ns"] = timed("python_numpy_f16_ns", lambda: kvhal.paged_caching(nkc, nvc, nk, nk, ns),
                                           a.reps)
    # kvhal.Tensor views made once (kvhal.from_dlpack): what a graph's static buffers or an engine's caches cost
    tkc, tvc, tk, tv, ts = (kvhal.from_dlpack(x) for x in (kc, vc, k, v, slots))
    kstream = kvhal.Stream(a.device, stream) if stream is not None else None
    res["python_kvhal_tensor_ns"] = timed("python_kvhal_tensor_ns",
                                          lambda: kvhal.paged_caching(tkc, tvc, tk, tv, ts, stream=kstream), a.reps)
    # an eager engine: caches as views, each step's k, v, slots passed as torch tensors
    res["python_cache_views_torch_inputs_ns"] = timed(
        "python_cache_views_torch_inputs_ns", lambda: kvhal.paged_caching(tkc, tvc, k, v, slots, stream=stream),
        a.reps)
    try:
        c_pad, c_call = c_overhead(a.bench, a.device)
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"bench_host: error: kvhal-bench: {e}", file=sys.stderr)
        c_pad = c_call = None
    res["c_host_overhead_ns"] = c_pad
    res["python_minus_c_ns"] = None if c_pad is None else py_torch - c_pad
    res["python_views_minus_c_ns"] = None if c_pad is None else res["python_kvhal_tensor_ns"] - c_pad
    res["fastest_round_ns"] = {name: MIN[fn] for name, fn in FNS.items()}
    res["load_average"] = __import__("os").getloadavg()[0]
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for key, val in res.items():
            print(f"{key:28s} {val:.1f}" if isinstance(val, float) else f"{key:28s} {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

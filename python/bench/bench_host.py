"""Host time per kvhal.paged_caching call from Python against the C call's host time in the same process on the same
tensors (kvhal._kvhal._time_paged_caching: the arguments imported once, then back-to-back kvhal_paged_caching calls
timed in C): llama3-8b layer (8 KV heads x 128, bf16), 256 tokens, descriptor cached, all-padding slots
(validation, dispatch and the slot scan, no copy), tensors passed directly.

usage: bench_host.py [--device cpu:0|cuda:0] [--reps N] [--json]
Prints mean ns per call (median of rounds; fastest_round_ns: the fastest round) for: the C call, kvhal from Python
with torch tensors (stream=torch.cuda.current_stream() on cuda, None on cpu), vLLM's call
(kvhal.compat.vllm.reshape_and_cache_flash, torch tensors, kv_cache_dtype 'auto', no stream: what vLLM passes),
kvhal.Tensor views, NumPy arrays (cpu), and the differences; dlpack_path says how kvhal imports a torch tensor here:
'c_exchange_api' (the type attribute __dlpack_c_exchange_api__ of PyTorch builds that have it: no Python call per
argument) or '__dlpack__'. Beside them, torch's own index-assign of a write of the same shape (torch_index_assign_ns:
key_cache.view(-1, heads, dim)[slots] = key, the same for value; the slots real ones, since torch has no padding
slot: it copies the 256 tokens, which kvhal's padding-slot calls skip) and kvhal's call on those real slots
(python_torch_real_slots_ns). On cuda no synchronisation is timed (host time only; the copies run on the GPU)."""
import argparse
import json
import statistics
import sys
import time

import kvhal


ROUNDS = 15


def loop(fn, reps):
    """Mean ns per call of reps back-to-back calls."""
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        fn()
    return (time.perf_counter_ns() - t0) / reps


def measure(cases, reps):
    """cases: name -> a function of reps giving mean ns per call. The rounds interleave the cases (on a shared,
    loaded machine drift then hits all alike); per case the median round and the fastest."""
    per = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, run in cases.items():
            per[name].append(run(reps))
    return ({name: statistics.median(v) for name, v in per.items()}, {name: min(v) for name, v in per.items()})


def main():
    ap = argparse.ArgumentParser()
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
    from kvhal.compat import vllm
    real = torch.arange(tokens, dtype=torch.int64, device=dev)  # every token to its own slot
    kflat, vflat = kc.view(-1, heads, dim), vc.view(-1, heads, dim)

    def torch_assign():
        kflat[real] = k
        vflat[real] = v
    vllm.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", 1.0, 1.0)
    # kvhal.Tensor views made once (kvhal.from_dlpack): what a graph's static buffers or an engine's caches cost
    tkc, tvc, tk, tv, ts = (kvhal.from_dlpack(x) for x in (kc, vc, k, v, slots))
    kstream = kvhal.Stream(a.device, stream) if stream is not None else None
    cases = {
        # the C call: the same tensors imported once, kvhal_paged_caching timed in C
        "c_call_ns": lambda n: kvhal._kvhal._time_paged_caching(tkc, tvc, tk, tv, ts, n, stream=kstream),
        "python_torch_ns": lambda n: loop(lambda: kvhal.paged_caching(kc, vc, k, v, slots, stream=stream), n),
        "python_torch_positional_ns": lambda n: loop(lambda: kvhal.paged_caching(kc, vc, k, v, slots, 1.0, 1.0,
                                                                                 stream), n),
        # vLLM's call as vLLM makes it (caches, key, value, slot_mapping as torch tensors, no stream)
        "vllm_compat_torch_ns": lambda n: loop(lambda: vllm.reshape_and_cache_flash(k, v, kc, vc, slots, "auto",
                                                                                     1.0, 1.0), n),
        "torch_index_assign_ns": lambda n: loop(torch_assign, n),
        "python_torch_real_slots_ns": lambda n: loop(lambda: kvhal.paged_caching(kc, vc, k, v, real, stream=stream),
                                                     n),
        "python_kvhal_tensor_ns": lambda n: loop(lambda: kvhal.paged_caching(tkc, tvc, tk, tv, ts, stream=kstream),
                                                 n),
        # an eager engine: caches as views, each step's k, v, slots passed as torch tensors
        "python_cache_views_torch_inputs_ns": lambda n: loop(
            lambda: kvhal.paged_caching(tkc, tvc, k, v, slots, stream=stream), n),
    }
    if dev == "cpu":
        import numpy as np
        nkc = np.zeros((nb, block, heads, dim), np.float16)
        nvc = np.zeros_like(nkc)
        nk = np.ones((tokens, heads, dim), np.float16)
        ns = np.full((tokens,), -1, np.int64)
        cases["python_numpy_f16_ns"] = lambda n: loop(lambda: kvhal.paged_caching(nkc, nvc, nk, nk, ns), n)
        try:  # the tests' producer of the DLPack C exchange API (build tree, PYTHONPATH=<build>/python/tests)
            from _xapi_producer import XArray
            xs = [XArray(x) for x in (nkc, nvc, nk, nk, ns)]
            cases["python_xapi_test_producer_f16_ns"] = lambda n: loop(lambda: kvhal.paged_caching(*xs), n)
            cases["vllm_compat_xapi_test_producer_f16_ns"] = lambda n: loop(
                lambda: vllm.reshape_and_cache_flash(xs[2], xs[3], xs[0], xs[1], xs[4], "auto", 1.0, 1.0), n)
        except ImportError:
            pass
    med, fastest = measure(cases, a.reps)
    c_call = med["c_call_ns"]
    res = {"version": kvhal.__version__, "device": a.device, "shape": "llama3-8b bf16 256 tokens, padding slots",
           "torch": torch.__version__, "dlpack_path": kvhal.dlpack_path(kc),
           "torch_has_exchange_api": hasattr(type(kc), "__dlpack_c_exchange_api__") or
           hasattr(type(kc), "__c_dlpack_exchange_api__")}
    res.update(med)
    res["python_minus_c_ns"] = med["python_torch_ns"] - c_call
    res["vllm_compat_minus_c_ns"] = med["vllm_compat_torch_ns"] - c_call
    res["python_views_minus_c_ns"] = med["python_kvhal_tensor_ns"] - c_call
    if "python_xapi_test_producer_f16_ns" in med:
        res["python_xapi_test_producer_minus_c_ns"] = med["python_xapi_test_producer_f16_ns"] - c_call
        res["vllm_compat_xapi_test_producer_minus_c_ns"] = med["vllm_compat_xapi_test_producer_f16_ns"] - c_call
    res["target_torch_within_1500ns"] = res["python_minus_c_ns"] <= 1500
    res["target_vllm_within_2000ns"] = res["vllm_compat_minus_c_ns"] <= 2000
    res["fastest_round_ns"] = fastest
    res["load_average"] = __import__("os").getloadavg()[0]
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for key, val in res.items():
            print(f"{key:36s} {val:.1f}" if isinstance(val, float) else f"{key:36s} {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

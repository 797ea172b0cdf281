#!/bin/bash
# python-overhead.sh: host time per call of the Python package, and its cache-manager loop.
#
# What: python/bench/bench_host.py: host time per kvhal.paged_caching call from Python (llama3-8b layer, 8 KV heads
#   x 128 bf16, 256 tokens, descriptor cached, all-padding slots: validation, dispatch and the slot scan, no copy)
#   against the C call timed in the same process on the same tensors; rows for torch tensors passed directly,
#   kvhal.Tensor views and NumPy arrays, and which DLPack import path torch took. python/bench/bench_prefix.py:
#   requests/s of the cache-manager loop from Python (kvhal-replay's default workload shape) against two pure-Python
#   radix caches in the same passes (PyRadix, stdlib only; a mini-sglang-style radix over torch tensors).
#   PIN=1 pins the process to one core (taskset -c 1): the per-call figure then moves less with the machine.
# Machine: any; a device argument (or DEV=cuda:0) times CUDA tensors (needs PyTorch with CUDA), else CPU tensors.
#   Beside the C call and kvhal's Python call it times vLLM's call (kvhal.compat.vllm.reshape_and_cache_flash) and
#   torch's own index-assign of the same write. Figures in docs/performance.md: the host of
#   an H100 machine with PyTorch 2.11, and a 2-core Debian 12 VM.
# Run (repository root): bash bench/python-overhead.sh [DEVICE]   (e.g. cuda:0; default cpu:0)
#   B=build dir (default build-bench-py, configured with -Dpython=enabled), DEV=cpu:0, PY=python3, OUT=/tmp/kvhal-py.
# Output: $OUT/host-<dev>.json (c_call_ns, python_torch_ns, vllm_compat_torch_ns, torch_index_assign_ns,
#   python_kvhal_tensor_ns, ..., python_minus_c_ns, vllm_compat_minus_c_ns, python_views_minus_c_ns, dlpack_path)
#   and $OUT/prefix.json (requests/s per loop; ratio: the kvhal loop with admit_view, one call for match + allocate
#   handing out the request's page-table row, over PyRadix; ratio_minisgl: the same over the mini-sglang-style loop;
#   ratio_view: the loop with match_view and allocate_view, page lists as views of the manager's own storage and no
#   row built; ratio_pages: the loop with match and allocate, page lists as kvhal.Pages).
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
DEV=${1:-${DEV:-cpu:0}}
B=${B:-build-bench-py} PY=${PY:-python3} OUT=${OUT:-/tmp/kvhal-py}
mkdir -p "$OUT"
if [ ! -f "$B/build.ninja" ]; then
  backends=cpu; [ "${DEV%%:*}" != cpu ] && backends=auto
  meson setup "$B" -Dbackends=$backends -Dbuildtype=release -Dpython=enabled -Dtests=false > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends PYTHONPATH=$B/python
pin=; [ "${PIN:-0}" = 1 ] && pin="taskset -c 1"
rc=0
$pin "$PY" python/bench/bench_host.py --device "$DEV" --json > "$OUT/host-${DEV/:/}.json" || rc=1
"$PY" python/bench/bench_prefix.py --json > "$OUT/prefix.json" || rc=1
cat "$OUT/host-${DEV/:/}.json" "$OUT/prefix.json"
exit $rc

#!/bin/bash
# engine-transformers.sh: a Hugging Face transformers model serving with its KV in kvhal, against transformers' own
# generation on the same GPU, in the same process (examples/python/serve_transformers.py).
#
# What (each a run of the example; seeded random models of real layer shapes: 16 layers, hidden 2048, 16 heads,
#   8 KV heads x 128, intermediate 5632, vocab 8192):
#   mixed-<arch>   64 requests, prompts 16..4096, outputs 1..256, fp32: token for token against model.generate()
#                  (llama and qwen3); mixed-bf16: the same 64 in bf16, the log-prob differences of kvhal and of
#                  stock generate_batch to generate(), and each one's error against the same weights in float32
#   shared         64 groups x 16 requests behind 2048-token system prompts, 32 new tokens, bf16: tokens/s of the
#                  kvhal engine against stock generate_batch (block sharing on, the same batch and step-token
#                  limits), hit rate against the unbounded ideal, kvhal's share of a decode step (profiled)
#   tier           16 groups x 16 requests with the KV pool at 25 % of the workload's distinct KV: kvhal's host tier
#                  (write-through, load-back) against stock generate_batch with its CPU offload on
#   tiered-fp32    8 groups x 8 requests, the pool at 25 % and a host tier: fp32 token for token against generate()
#   tiered-bf16    4 groups x 8 requests, the same in bf16: errors against float32 beside stock generate_batch with
#                  its CPU offload under the same pages
#   profile        kvhal's share of a decode step of 128 requests (8 groups x 16), timed without the profiler
#   disagg         64 mixed requests and 8 prompts of 4096 tokens prefilled in another process on cuda:1
#                  (DISAGG_DEVICE), decoded on cuda:0, the K/V streamed layer by layer through libkvhal-xfer: fp32
#                  tokens against the single-process engine, the time-to-first-token breakdown
#   disagg-bf16    the same in bf16 (prefill batches of one round differently from one process's packed steps):
#                  each one's error against float32
#   disagg-1gpu    prefill and decode as two processes on cuda:0 (36 requests, 8192-page pools), fp32
# Machine: one NVIDIA GPU (two for disagg), PyTorch >= 2.10 and transformers >= 5 in $PY; UCX (libucx-dev).
# Run (repository root): bash bench/engine-transformers.sh
#   B=build dir (default build-bench-engine), PY=python3, OUT=/tmp/kvhal-engine, RUNS="mixed-llama mixed-qwen3 mixed-bf16
#   shared tier tiered-fp32 tiered-bf16 profile disagg disagg-bf16 disagg-1gpu", LIMIT=seconds per run (default 600), DISAGG_DEVICE=cuda:1
# Output: $OUT/<run>.log and $OUT/<run>.json (the example's --json), $OUT/machine.txt.
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
B=${B:-build-bench-engine} PY=${PY:-python3} OUT=${OUT:-/tmp/kvhal-engine} LIMIT=${LIMIT:-600}
RUNS=${RUNS:-mixed-llama mixed-qwen3 mixed-bf16 shared tier tiered-fp32 tiered-bf16 profile disagg disagg-bf16 disagg-1gpu} DISAGG_DEVICE=${DISAGG_DEVICE:-cuda:1}
mkdir -p "$OUT"
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dbackends=cpu,cuda -Dtransfer=ucx -Dpython=enabled -Dtests=false -Dexamples=false \
    -Dtools=false -Dbuildtype=release > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export PYTHONPATH=$B/python KVHAL_BACKEND_PATH=$B/backends
{ nvidia-smi -L; lscpu | grep 'Model name'; $PY -c 'import torch, transformers; print(torch.__version__,
  transformers.__version__)'; } > "$OUT/machine.txt" 2>&1
ex=examples/python/serve_transformers.py
for run in $RUNS; do
  case $run in
    mixed-llama) args="--workload mixed --dtype fp32 --arch llama --check" ;;
    mixed-qwen3) args="--workload mixed --dtype fp32 --arch qwen3 --check" ;;
    mixed-bf16) args="--workload mixed --dtype bf16 --arch llama --check" ;;
    shared) args="--workload shared --dtype bf16 --arch llama --rounds 1" ;;
    tier) args="--workload shared --dtype bf16 --arch llama --rounds 1 --groups 16 --kv-budget 0.25 --host-tier" ;;
    tiered-fp32) args="--workload tiered --dtype fp32 --arch llama --groups 8 --per-group 8 --check" ;;
    tiered-bf16) args="--workload tiered --dtype bf16 --arch llama --groups 4 --per-group 8 --check" ;;
    profile) args="--workload shared --dtype bf16 --arch llama --rounds 1 --no-stock --groups 8 --profile-steps 20" ;;
    disagg) args="--workload disaggregated --dtype fp32 --arch llama --count 64 --long-count 8
                  --prefill-device $DISAGG_DEVICE --check" ;;
    disagg-bf16) args="--workload disaggregated --dtype bf16 --arch llama --count 64 --long-count 8
                  --prefill-device $DISAGG_DEVICE --check" ;;
    disagg-1gpu) args="--workload disaggregated --dtype fp32 --arch llama --count 32 --long-count 4 --pages 8192
                  --device cuda:0 --prefill-device cuda:0 --check" ;;
    *) echo "unknown run $run"; exit 2 ;;
  esac
  echo "== $run: $ex $args"
  # shellcheck disable=SC2086
  timeout "$LIMIT" $PY $ex $args --json "$OUT/$run.json" > "$OUT/$run.log" 2>&1
  echo "   exit $? (124: stopped at $LIMIT s)"
  grep -v '^ *request \|Solving' "$OUT/$run.log" | tail -12
done

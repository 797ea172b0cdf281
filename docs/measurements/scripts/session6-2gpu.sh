#!/bin/bash
# Session 6 on two GPUs of one host: the KV transfer between two processes on cuda:0 and cuda:1, staged and over
# CUDA IPC, next to cudaMemcpyPeer (xfer-2gpu.sh), then the host tier's GPU checks (tier-gpu.sh, cuda:0: batched
# page transfer against pinned memcpy, tiered replay, write-back eviction times) on xfer-2gpu.sh's build.
# Carry .devdeps (with UCX); logs packed into one archive under $OUT.
set -uo pipefail
: "${OUT:?set OUT}"
rc=0
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; cat "$OUT/topo.txt"
mkdir -p "$OUT/xfer-2gpu"
OUT="$OUT/xfer-2gpu" timeout 330 bash docs/measurements/scripts/xfer-2gpu.sh > "$OUT/xfer-2gpu.log" 2>&1 || { echo "FAILED: xfer-2gpu"; rc=1; }
tail -30 "$OUT/xfer-2gpu.log"
mkdir -p "$OUT/tier"
OUT="$OUT/tier" KVHAL_GPU_B=/tmp/bx2 timeout 240 bash docs/measurements/scripts/tier-gpu.sh > "$OUT/tier.log" 2>&1 || { echo "FAILED: tier"; rc=1; }
tail -50 "$OUT/tier.log"
echo "session6-2gpu: rc=$rc"
(cd "$OUT" && tar czf /tmp/s6-2gpu.tgz . && rm -rf ./* && mv /tmp/s6-2gpu.tgz .)
exit $rc

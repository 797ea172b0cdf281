#!/bin/bash
# Session 5 on two GPUs of one host: the Python package's device restore across two GPUs (python-2gpu.sh), the KV
# transfer between two processes on cuda:0 and cuda:1 next to cudaMemcpyPeer (xfer-2gpu.sh), then the host tier's
# GPU checks (tier-gpu.sh, cuda:0, on xfer-2gpu.sh's build). Carry .devdeps (with UCX); logs packed under $OUT.
set -uo pipefail
: "${OUT:?set OUT}"
rc=0
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1; cat "$OUT/topo.txt"
for part in python-2gpu xfer-2gpu; do
  mkdir -p "$OUT/$part"
  OUT="$OUT/$part" timeout 240 bash docs/measurements/scripts/$part.sh > "$OUT/$part.log" 2>&1 || { echo "FAILED: $part"; rc=1; }
  tail -25 "$OUT/$part.log"
done
mkdir -p "$OUT/tier"
OUT="$OUT/tier" KVHAL_GPU_B=/tmp/bx2 timeout 300 bash docs/measurements/scripts/tier-gpu.sh > "$OUT/tier.log" 2>&1 || { echo "FAILED: tier"; rc=1; }
tail -45 "$OUT/tier.log"
echo "session5-2gpu: rc=$rc"
(cd "$OUT" && tar czf /tmp/s5-2gpu.tgz . && rm -rf ./* && mv /tmp/s5-2gpu.tgz .)
exit $rc

#!/bin/bash
# Plugin ABI 2 on the GPU machine: build every backend it can (cpu, cuda, opencl on NVIDIA), run every suite, then
# kvhal-bench on cuda:0 for the previous tree (a2b1c97, from .prevtree.tar) and this tree in interleaved rounds.
# Run by the device tool from the repository root with .devdeps and .prevtree.tar carried; logs go to $OUT.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
lscpu | grep 'Model name' >> "$OUT/gpu.txt"
meson setup /tmp/bc -Dbackends=cpu,cuda,opencl -Dwerror=true -Dnvcc_arch=90 > "$OUT/build.txt" 2>&1 &&
  ninja -C /tmp/bc >> "$OUT/build.txt" 2>&1 || { echo BUILD FAILED; tail -40 "$OUT/build.txt"; exit 1; }
/tmp/bc/tools/kvhal-info > "$OUT/info.txt" 2>&1
meson test -C /tmp/bc --print-errorlogs --num-processes 8 > "$OUT/tests.txt" 2>&1; echo "tests rc $?"
grep -E "^(Ok|Fail|Skipped|Expected|Timeout)" "$OUT/tests.txt"
grep -E " (FAIL|TIMEOUT) " "$OUT/tests.txt" | head
mkdir -p /tmp/prev && tar -xf .prevtree.tar -C /tmp/prev
(meson setup /tmp/bp /tmp/prev -Dbackends=cpu,cuda -Dtests=false -Dnvcc_arch=90 && ninja -C /tmp/bp) > "$OUT/build-prev.txt" 2>&1 || echo PREV BUILD FAILED
for r in 1 2 3; do
  for t in bp bc; do
    KVHAL_DEVICE=cuda:0 /tmp/$t/tools/kvhal-bench --quick --json > "$OUT/bench-$t-$r.json" 2> "$OUT/bench-$t-$r.err"
  done
done
echo done

#!/bin/bash
# After the review commits: all suites (cpu, cuda, NVIDIA OpenCL, PoCL) and kvhal-bench paged caching on
# NVIDIA OpenCL and CUDA.
cd "$(dirname "$0")/.."
source .devdeps/env.sh
B=/tmp/brv; rm -rf $B
meson setup $B -Dbackends=cpu,cuda,opencl -Dbuildtype=release > $OUT/build.log 2>&1 && ninja -C $B >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
nvidia-smi -L
timeout 240 meson test -C $B --print-errorlogs --num-processes 8 > $OUT/test.log 2>&1; echo "meson test rc=$?"
grep -E "^(Ok|Fail|Skipped|Expected Fail|Timeout):" $OUT/test.log; grep -E "FAIL " $OUT/test.log
ocl=$($B/tools/kvhal-info --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(x["device"] for x in d["devices"] if x["device"].startswith("opencl") and "NVIDIA" in (x["name"]+x["platform"])))')
KVHAL_DEVICE=${ocl%% *} timeout 120 $B/tools/kvhal-bench --op paged_caching --tokens 8192,65536 | tee $OUT/bench-ocl.txt
KVHAL_DEVICE=cuda:0 timeout 120 $B/tools/kvhal-bench --op paged_caching --tokens 8192,65536 | tee $OUT/bench-cuda.txt

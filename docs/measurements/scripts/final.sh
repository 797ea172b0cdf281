#!/bin/bash
# Lead's final device run: build (cpu, cuda, opencl), full test suite, kvhal-info, kvhal-bench on cuda:0 and on
# NVIDIA OpenCL, kvhal-replay on cuda:0, radix --no-kv on the host CPU. Logs in $OUT.
cd "$(dirname "$0")/.."
source .devdeps/env.sh
B=/tmp/b; rm -rf $B
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -1; lscpu | grep "Model name"; } > $OUT/info.txt 2>&1
meson setup $B -Dbackends=cpu,cuda,opencl -Dbuildtype=release > $OUT/build.log 2>&1 && ninja -C $B -j16 >> $OUT/build.log 2>&1 || { tail -60 $OUT/build.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
$B/tools/kvhal-info >> $OUT/info.txt 2>&1; cat $OUT/info.txt
timeout 240 meson test -C $B --print-errorlogs --num-processes 8 > $OUT/test.log 2>&1; echo "meson test rc=$?"
grep -E "^ *[0-9]+/[0-9]+ " $OUT/test.log; grep -E "^(Ok|Fail|Skipped|Timeout|Expected Fail):" $OUT/test.log
grep -hE "^\[  (PASSED|FAILED|SKIPPED) \]" $B/meson-logs/testlog.txt | sort | uniq -c
KVHAL_DEVICE=cuda:0 timeout 150 $B/tools/kvhal-bench > $OUT/bench-cuda.txt 2>&1; echo "bench cuda rc=$?"; cat $OUT/bench-cuda.txt
ocl=$($B/tools/kvhal-info --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join(x["device"] for x in d["devices"] if x["device"].startswith("opencl") and "NVIDIA" in (x["name"]+x["platform"])))')
for d in ${ocl%% *}; do
  KVHAL_DEVICE=$d timeout 120 $B/tools/kvhal-bench --op first_call > $OUT/bench-ocl.txt 2>&1
  KVHAL_DEVICE=$d timeout 120 $B/tools/kvhal-bench --op paged_caching --tokens 8192,65536 >> $OUT/bench-ocl.txt 2>&1
  KVHAL_DEVICE=$d timeout 60 $B/tools/kvhal-bench --op copy_blocks >> $OUT/bench-ocl.txt 2>&1
  echo "bench $d rc=$?"; cat $OUT/bench-ocl.txt
done
KVHAL_DEVICE=cuda:0 timeout 60 $B/tools/kvhal-replay --quiet > $OUT/replay.txt 2>&1; echo "replay cuda default rc=$?"
KVHAL_DEVICE=cuda:0 timeout 90 $B/tools/kvhal-replay --quiet --model llama3-8b --kv-budget 2GiB --groups 8 --prompts 8 >> $OUT/replay.txt 2>&1; echo "replay cuda llama3-8b rc=$?"
timeout 60 $B/tools/kvhal-replay --quiet --no-kv --repeat 50 --page-size 16 >> $OUT/replay.txt 2>&1
timeout 60 $B/tools/kvhal-replay --quiet --no-kv --repeat 20 --page-size 1 >> $OUT/replay.txt 2>&1
cat $OUT/replay.txt
echo "total: $(( $(date +%s) - t0 )) s"
{ gcc -std=c11 -D_POSIX_C_SOURCE=200809L -O2 -Iapi .gpu-run/probe.c -o /tmp/probe -L$B/core -lkvhal -Wl,-rpath,$B/core && KVHAL_BACKEND_PATH=$B/backends /tmp/probe;
  nvcc -O2 -arch=sm_90 .gpu-run/launch_probe2.cu -o /tmp/lp -lcuda && /tmp/lp; } > $OUT/probe.txt 2>&1
cat $OUT/probe.txt
KVHAL_BACKENDS=cpu,cuda timeout 150 compute-sanitizer --tool memcheck --report-api-errors no $B/tests/test_conformance > $OUT/memcheck.txt 2>&1; echo "memcheck conformance rc=$?"; grep -E "ERROR SUMMARY" $OUT/memcheck.txt
KVHAL_BACKENDS=cpu,cuda timeout 100 compute-sanitizer --tool racecheck $B/tests/test_gpu_paths > $OUT/racecheck.txt 2>&1; echo "racecheck gpu_paths rc=$?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY" $OUT/racecheck.txt

#!/bin/bash
# Session 11's GPU check of the merged tree (one GPU): build cpu + cuda + opencl with the transfer module and the
# tests (-Dwerror=true, sm_90); conformance on cuda:0 and on NVIDIA's OpenCL device, the GPU-path suite, the ipc
# suite, the transfer suite with CUDA caches (staged and CUDA IPC between processes; the copy-worker failure, thread
# and fork tests of this session), kvhal-xfer's IPC self-test; then, unless SKIP_BENCH=1, session11-gpu.sh's probe
# and kvhal-bench rows on the same GPU (so an H200, if the call gets one, answers session 9's question too). Run from
# the repository root with .devdeps carried; logs under $OUT.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NVCC_APPEND_FLAGS=--split-compile=0
B=/tmp/b11f; t0=$(date +%s); rc=0
nvidia-smi -L > $OUT/gpu.txt 2>&1
meson setup $B -Dbackends=cpu,cuda,opencl -Dtransfer=ucx -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled \
  -Dexamples=false > $OUT/build.txt 2>&1 && ninja -C $B -j16 >> $OUT/build.txt 2>&1 ||
  { tail -30 $OUT/build.txt; echo BUILD FAILED; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"; cat $OUT/gpu.txt
export KVHAL_BACKEND_PATH=$B/backends
KVHAL_TEST_DEVICE=cuda:0 timeout 150 $B/tests/test_conformance > $OUT/conformance-cuda.txt 2>&1 || { rc=1; echo "FAILED conformance cuda"; }
grep -E "^\[  (PASSED|FAILED)|^\[ device" $OUT/conformance-cuda.txt | head -4
ocl=$($B/tools/kvhal-info 2>/dev/null | grep -o "opencl:[0-9]*.*NVIDIA" | head -1 | cut -d' ' -f1)
echo "NVIDIA OpenCL device: ${ocl:-none}"
if [ -n "$ocl" ]; then
  KVHAL_TEST_DEVICE=$ocl timeout 150 $B/tests/test_conformance > $OUT/conformance-opencl.txt 2>&1 || { rc=1; echo "FAILED conformance opencl"; }
  grep -E "^\[  (PASSED|FAILED)|^\[ device" $OUT/conformance-opencl.txt | head -4
fi
KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_gpu_paths > $OUT/gpu_paths.txt 2>&1 || { rc=1; echo "FAILED gpu_paths"; }
grep -E "^\[  (PASSED|FAILED)" $OUT/gpu_paths.txt
KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_ipc > $OUT/ipc.txt 2>&1 || { rc=1; echo "FAILED ipc"; }
grep -E "^\[  (PASSED|FAILED)|^# " $OUT/ipc.txt
KVHAL_BACKENDS=cpu,cuda timeout 300 meson test -C $B --suite transfer --no-suite opencl --num-processes 1 > $OUT/transfer.txt 2>&1 || { rc=1; echo "FAILED transfer suite"; }
grep -E "^ *[0-9]+/|^Ok:|^Fail:" $OUT/transfer.txt; grep -h "^# cuda\|IPC\|worker\|fork" $B/meson-logs/testlog.txt | sort | uniq -c | head -20
cp $B/meson-logs/testlog.txt $OUT/transfer-testlog.txt 2>/dev/null
timeout 60 $B/tools/kvhal-xfer --self-test --ipc --send-device=cuda:0 --recv-device=cuda:0 > $OUT/selftest-ipc.txt 2>&1 || { rc=1; echo "FAILED ipc self-test"; }
grep "self-test" $OUT/selftest-ipc.txt
echo "suites $(( $(date +%s) - t0 )) s rc=$rc"
(cd $OUT && tar czf suites.tgz conformance-*.txt gpu_paths.txt ipc.txt transfer.txt transfer-testlog.txt selftest-ipc.txt build.txt && rm -f conformance-*.txt gpu_paths.txt ipc.txt transfer.txt transfer-testlog.txt selftest-ipc.txt build.txt)
if [ -z "${SKIP_BENCH:-}" ]; then
  mkdir -p $OUT/bench && OUT=$OUT/bench SKIP_NCU=1 bash docs/measurements/scripts/session11-gpu.sh > $OUT/bench-log.txt 2>&1 || rc=1
  grep -E "^#|memcpy|^ldst |ldst_u8|tma_s3_r8 |tma_s4_r16|tma_c_s3|^c0|^\| " $OUT/bench-log.txt | head -90
  (cd $OUT && tar czf bench.tgz bench && rm -rf bench)
fi
echo "total $(( $(date +%s) - t0 )) s rc=$rc"; exit $rc

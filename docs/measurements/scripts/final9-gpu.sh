#!/bin/bash
# Session 9's last GPU check of the merged tree (one GPU): build cpu + cuda + opencl with the transfer module
# (-Dwerror=true, sm_90), then conformance on cuda:0 and on NVIDIA's OpenCL device, the GPU-path suite, the transfer
# suite (cuda caches staged and over CUDA IPC between processes on the one GPU, tcp/shm/posix), kvhal-xfer's IPC
# self-test cuda:0 -> cuda:0, and kvhal-bench's MLA rows. Run from the repository root with .devdeps carried; logs
# under $OUT.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
B=/tmp/b9; t0=$(date +%s)
export NVCC_APPEND_FLAGS=--split-compile=0 # nvcc compiles each file's kernels on every core (session 9: build 159 -> 75 s)
nvidia-smi -L > $OUT/gpu.txt 2>&1
meson setup $B -Dbackends=cpu,cuda,opencl -Dtransfer=ucx -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled \
  -Dexamples=false > $OUT/build.txt 2>&1 && ninja -C $B -j16 >> $OUT/build.txt 2>&1 ||
  { tail -30 $OUT/build.txt; echo BUILD FAILED; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"; cat $OUT/gpu.txt
export KVHAL_BACKEND_PATH=$B/backends
rc=0
KVHAL_TEST_DEVICE=cuda:0 timeout 120 $B/tests/test_conformance > $OUT/conformance-cuda.txt 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED)|^\[ device" $OUT/conformance-cuda.txt | head
ocl=$($B/tools/kvhal-info 2>/dev/null | grep -o "opencl:[0-9]*.*NVIDIA" | head -1 | cut -d' ' -f1)
echo "NVIDIA OpenCL device: ${ocl:-none}"
if [ -n "$ocl" ]; then
  KVHAL_TEST_DEVICE=$ocl timeout 150 $B/tests/test_conformance > $OUT/conformance-opencl.txt 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED)|^\[ device" $OUT/conformance-opencl.txt | head
fi
KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_gpu_paths > $OUT/gpu_paths.txt 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED)" $OUT/gpu_paths.txt
KVHAL_BACKENDS=cpu,cuda timeout 200 meson test -C $B --suite transfer --no-suite opencl --num-processes 1 > $OUT/transfer.txt 2>&1 || rc=1
grep -E "^ *[0-9]+/|^Ok:|^Fail:" $OUT/transfer.txt; grep -h "^# cuda\|IPC" $B/meson-logs/testlog.txt | sort | uniq -c | head
timeout 60 $B/tools/kvhal-xfer --self-test --ipc --send-device=cuda:0 --recv-device=cuda:0 > $OUT/selftest-ipc.txt 2>&1 || rc=1
grep "self-test" $OUT/selftest-ipc.txt
timeout 60 $B/tools/kvhal-bench --device=cuda:0 --op=mla --tokens=8192 > $OUT/bench-mla.txt 2>&1 || rc=1
head -12 $OUT/bench-mla.txt
cp $B/meson-logs/testlog.txt $OUT/transfer-testlog.txt 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s rc=$rc"; exit $rc

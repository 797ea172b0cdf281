#!/bin/bash
# Session 6 on one GPU (H100), one build for everything: cpu + cuda + the HIP module on HIP's NVIDIA platform +
# OpenCL (NVIDIA's) + the Python package. Runs every suite (conformance on cpu, cuda:0, hip:0 and NVIDIA's OpenCL
# against the host reference), the Python package on CUDA tensors, CUDA-graph capture from C and from torch with the
# first kvhal call inside the capture, the HIP module's checks and a HIP-vs-CUDA kvhal-bench comparison.
# PART=all|suites|python|hip|kernels|ocl|tier selects sections (ocl: NVIDIA OpenCL's kvhal-bench rows of
# duplicate and copy_blocks). bench_host.py runs pinned to core 5 (unpinned, the C call moved 3.2-4.5 us between
# processes). The build folder ./build-gpu6 (B=...; TAG names the log archive) is kept while the machine stays warm, so a second call
# with other parts reuses it. Carry .devdeps and .hipnv; logs under $OUT.
set -uo pipefail
: "${OUT:?set OUT}"
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export PYTHONPATH=$PWD/.devdeps/root/usr/lib/python3/dist-packages
PART=${PART:-all}
want() { [[ ",$PART," == *",$1,"* ]] || { [ "$PART" = all ] && [ "$1" != transfer ]; }; }
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rc=0; fail() { echo "FAILED: $*"; rc=1; }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -1;
  python3 --version; python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)';
  python3 -c 'import pytest; print("pytest", pytest.__version__)'; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
B=${B:-$PWD/build-gpu6}   # session 7: B=$PWD/build-gpu7 TAG=session7
TAG=${TAG:-session6}
if ! { { [ -f $B/build.ninja ] || meson setup $B -Dbackends=cpu,cuda,hip,opencl -Dhip_platform=nvidia -Dnvcc_arch=90 -Dpython=enabled \
         -Dwerror=true; } && ninja -C $B -j16; } > "$OUT/build.txt" 2>&1; then
  echo BUILD FAILED; grep -E 'error|FAILED' "$OUT/build.txt" | head -30; tail -20 "$OUT/build.txt"; exit 1
fi
el build
export KVHAL_BACKEND_PATH=$B/backends:$B/examples/vendor-plugin
$B/tools/kvhal-info > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt" | head -40

if want suites; then
  # every suite but transfer and python (run below with their own limits); a hung test is cut at half its timeout
  timeout 300 meson test -C $B --print-errorlogs --num-processes 8 --no-suite slow --no-suite transfer --no-suite python \
    --timeout-multiplier 0.5 > "$OUT/tests.txt" 2>&1 || fail "meson test"
  cp $B/meson-logs/testlog.txt "$OUT/testlog.txt"
  grep -E "^(Ok|Fail|Skipped|Expected|Timeout)" "$OUT/tests.txt"; grep -E " (FAIL|TIMEOUT) " "$OUT/tests.txt" | head -20
  el "suites"
  for d in cuda:0 hip:0; do
    KVHAL_TEST_DEVICE=$d timeout 120 $B/tests/test_conformance > "$OUT/conformance-${d/:/}.txt" 2>&1 || fail "conformance $d"
    echo "$d: $(grep -cE '^\[       OK' "$OUT/conformance-${d/:/}.txt") ok, $(grep -cE '^\[  FAILED  \] [a-z]' "$OUT/conformance-${d/:/}.txt") failed"
  done
  OCL=$($B/tools/kvhal-info -l 2>/dev/null | grep -i nvidia | grep -o 'opencl:[0-9]*' | head -1)
  if [ -n "$OCL" ]; then
    KVHAL_TEST_DEVICE=$OCL timeout 200 $B/tests/test_conformance > "$OUT/conformance-ocl.txt" 2>&1 || fail "conformance $OCL"
    echo "$OCL: $(grep -cE '^\[       OK' "$OUT/conformance-ocl.txt") ok, $(grep -cE '^\[  FAILED  \] [a-z]' "$OUT/conformance-ocl.txt") failed"
  else echo "no NVIDIA OpenCL device listed"; fi
  el "conformance per device"
  if want transfer; then
    timeout 150 meson test -C $B --print-errorlogs --num-processes 2 --suite transfer --timeout-multiplier 0.4 \
      > "$OUT/tests-transfer.txt" 2>&1 || fail "transfer suite"
    grep -E "^ *[0-9]+/[0-9]+ " "$OUT/tests-transfer.txt" | head; el transfer
  fi
fi

if want python; then
  export PYTHONPATH=$B/python:$B/python/tests:$PYTHONPATH
  python3 -c 'import torch; print("exchange API:", [a for a in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__") if hasattr(torch.Tensor, a)])'
  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 60 python3 -m pytest -s -q -p no:cacheprovider python/tests/test_gpu_torch.py > "$OUT/py-gpu-torch-pytest.txt" 2>&1 || fail "pytest test_gpu_torch"
  grep -E "exchange API|passed|failed" "$OUT/py-gpu-torch-pytest.txt" | tail -3
  timeout 120 python3 python/tests/test_gpu_torch.py > "$OUT/py-gpu-torch.txt" 2>&1 || fail "test_gpu_torch"; tail -3 "$OUT/py-gpu-torch.txt"
  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 120 python3 -m pytest -q -p no:cacheprovider python/tests > "$OUT/py-pytest.txt" 2>&1 || fail "pytest python/tests"; tail -3 "$OUT/py-pytest.txt"
  gcc -std=c11 -O2 tests/gpu/graph_capture.c -Iapi -I/usr/local/cuda/include -L$B/core -lkvhal \
    -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$B/core -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/graph_capture &&
    KVHAL_BACKENDS=cpu,cuda timeout 60 /tmp/graph_capture > "$OUT/graph-capture-c.txt" 2>&1 || fail "graph_capture (C)"
  tail -5 "$OUT/graph-capture-c.txt"
  timeout 90 python3 examples/python/decode_cuda_graph.py --layers 32 --steps 20 > "$OUT/graph-capture-torch.txt" 2>&1 || fail "decode_cuda_graph"
  tail -3 "$OUT/graph-capture-torch.txt"
  timeout 60 python3 examples/python/radix_scheduler.py > "$OUT/radix-scheduler.txt" 2>&1 || fail "radix_scheduler"; tail -2 "$OUT/radix-scheduler.txt"
  for d in cuda:0 cpu:0; do
    timeout 90 taskset -c 5 python3 python/bench/bench_host.py --device $d --json > "$OUT/host-${d/:/}.json" 2>&1 || fail "bench_host $d"
    grep -E "dlpack_path|python_minus_c_ns|target_torch|torch_has" "$OUT/host-${d/:/}.json"
  done
  timeout 90 python3 python/bench/bench_prefix.py --json > "$OUT/prefix.json" 2>&1 || fail "bench_prefix"; tail -3 "$OUT/prefix.json"
  if [ -f docs/measurements/scripts/capture_probe.c ]; then
    gcc -std=c11 -O2 docs/measurements/scripts/capture_probe.c -Iapi -I$B/include -I/usr/local/cuda/include -L$B/core -lkvhal \
      -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$B/core -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/capture_probe &&
      KVHAL_BACKENDS=cpu,cuda timeout 60 /tmp/capture_probe > "$OUT/capture-probe.txt" 2>&1 || fail "capture_probe"
    tail -3 "$OUT/capture-probe.txt"
  fi
  el python
fi

if want hip; then
  grep -A1 '^  hip:0' "$OUT/info.txt" | head -2
  KVHAL_DEVICE=hip:0 timeout 120 $B/tools/kvhal-replay --quiet > "$OUT/replay-hip.txt" 2>&1 || fail "kvhal-replay hip:0"; tail -2 "$OUT/replay-hip.txt"
  for r in 1 2; do for d in hip cuda; do
    timeout 120 $B/tools/kvhal-bench --device=$d:0 --quick --json > "$OUT/bench-$d-$r.json" 2> "$OUT/bench-$d-$r.err" || fail "bench $d round $r"
  done; done
  el hip
fi
if want kernels; then
  mkdir -p "$OUT/kernels"
  OUT="$OUT/kernels" KVHAL_GPU_B=$B timeout 500 bash docs/measurements/scripts/kernels-gpu.sh > "$OUT/kernels.log" 2>&1 || fail kernels
  tail -70 "$OUT/kernels.log"; el kernels
fi

if want ocl; then
  OCL=$($B/tools/kvhal-info -l 2>/dev/null | grep -i nvidia | grep -o 'opencl:[0-9]*' | head -1)
  for r in 1 2; do
    for d in $OCL cuda:0; do
      { timeout 40 $B/tools/kvhal-bench --device=$d --op=duplicate; timeout 40 $B/tools/kvhal-bench --device=$d --op=copy_blocks; } \
        > "$OUT/bench-dup-${d/:/}-$r.txt" 2>&1 || fail "kvhal-bench duplicate/copy_blocks $d round $r"
      grep -E "^(duplicate|copy_blocks)" "$OUT/bench-dup-${d/:/}-$r.txt" | sed "s/^/$d r$r /"
    done
  done
  el ocl
fi

if want tier; then
  mkdir -p "$OUT/tier"
  OUT="$OUT/tier" KVHAL_GPU_B=$B timeout 330 bash docs/measurements/scripts/tier-gpu.sh > "$OUT/tier.log" 2>&1 || fail tier
  tail -45 "$OUT/tier.log"; el tier
fi

echo "$TAG-gpu: rc=$rc"
# only a few files come back from the machine: everything goes into one archive
cp $B/meson-logs/testlog.txt "$OUT/testlog-last.txt" 2>/dev/null
(cd "$OUT" && tar czf /tmp/$TAG-logs.tgz . && rm -rf ./* && mv /tmp/$TAG-logs.tgz .)
exit $rc

#!/bin/bash
# Session 10, issue 15: paged caching of same-dtype rows by Hopper's bulk copies (paged_bulk_kernel,
# KVHAL_GPU_BULK) on one GPU. Builds cpu + cuda with the tests (-Dwerror=true, sm_90), runs the conformance and
# GPU-path suites on cuda with the default settings, with every eligible call taking the bulk kernel
# (KVHAL_GPU_BULK_MIN_KIB=0) and with it off, then kernel-variants-gpu.sh's interleaved kvhal-bench rounds with
# KVHAL_GPU_BULK 0 and 1 (columns v0, v1). Run from the repository root with .devdeps carried; logs under $OUT.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NVCC_APPEND_FLAGS=--split-compile=0
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rc=0; fail() { echo "FAILED: $*"; rc=1; }
B=/tmp/b10
meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled \
  -Dexamples=false > "$OUT/build.txt" 2>&1 &&
  ninja -C $B -j16 backends/cuda/libkvhal-cuda.so tools/kvhal-bench tests/test_conformance tests/test_gpu_paths \
    >> "$OUT/build.txt" 2>&1 || { grep -E "error|FAILED" "$OUT/build.txt" | head -20; echo "BUILD FAILED"; exit 1; }
el build
export KVHAL_BACKEND_PATH=$B/backends
for cfg in default all off; do
  case $cfg in default) e="X=1" ;; all) e="KVHAL_GPU_BULK_MIN_KIB=0" ;; off) e="KVHAL_GPU_BULK=0" ;; esac
  env $e KVHAL_TEST_DEVICE=cuda:0 timeout 150 $B/tests/test_conformance > "$OUT/conformance-$cfg.txt" 2>&1 || fail "conformance $cfg"
  env $e KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_gpu_paths > "$OUT/gpu_paths-$cfg.txt" 2>&1 || fail "gpu_paths $cfg"
  echo "$cfg: conformance $(grep -c '^\[       OK' "$OUT/conformance-$cfg.txt") ok $(grep -c '^\[  FAILED  \] [a-z]' "$OUT/conformance-$cfg.txt") failed;" \
    "gpu_paths $(grep -c '^\[       OK' "$OUT/gpu_paths-$cfg.txt") ok $(grep -c '^\[  FAILED  \] [a-z]' "$OUT/gpu_paths-$cfg.txt") failed"
  grep -m1 '^\[ device   ] cuda' "$OUT/conformance-$cfg.txt"
  grep -h "FAILED\|Mismatch\|mismatch\|lacks" "$OUT/conformance-$cfg.txt" "$OUT/gpu_paths-$cfg.txt" | head -8
done
el suites
export ROWS=${ROWS:-"--op=mla --tokens=8192,65536
--op=paged_caching --preset=llama3-8b --tokens=8192,65536
--op=paged_caching --preset=llama2-7b --tokens=8192,65536
--op=paged_caching --preset=small --tokens=8192,65536"}
VAR_ENV=KVHAL_GPU_BULK VARIANTS="0 1" ROUNDS=${ROUNDS:-3} SKIP_SUITES=1 SKIP_FP8=1 KVHAL_GPU_B=$B \
  bash docs/measurements/scripts/kernel-variants-gpu.sh > "$OUT/bench.txt" 2>&1 || fail "kernel-variants-gpu.sh"
grep -E "variant|ratio|bf16 +bf16|f16 +f16|f32 +f32|round|total" "$OUT/bench.txt"
(cd "$OUT" && tar czf suites.tgz conformance-*.txt gpu_paths-*.txt && rm -f conformance-*.txt gpu_paths-*.txt)
el "session10-gpu: rc $rc"
exit $rc

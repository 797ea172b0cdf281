#!/bin/bash
# Session 7, issue 15: paged caching's row form (KVHAL_GPU_VARIANT 3-6) against the session-6 kernel (1) on one
# GPU. Builds only what it runs (cpu + cuda, sm_90, -Dwerror=true), runs the conformance suite on cuda:0 under each
# of CONF_VARIANTS (default: VARIANTS; "default" = KVHAL_GPU_VARIANT unset) and the GPU-path suite under
# PATHS_VARIANTS, then kernel-variants-gpu.sh's interleaved kvhal-bench rounds and table, and last, with FP8=1, the
# exhaustive fp8 check under the default variant in what is left of LIMIT seconds.
# Run from the repository root (or a copy of the tree) with .devdeps carried; logs under $OUT.
# Environment: VARIANTS (default "1 3 4 5"), ROUNDS (default 2), ROWS (kvhal-bench argument lines), FP8=1, LIMIT.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export PATH=/usr/local/cuda/bin:$PATH
export VARIANTS=${VARIANTS:-"1 3 4 5"} ROUNDS=${ROUNDS:-2}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
rc=0; fail() { echo "FAILED: $*"; rc=1; }
B=/tmp/b7
if [ ! -f $B/build.ninja ]; then
  meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled \
    -Dexamples=false > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; echo "SETUP FAILED"; exit 1; }
fi
ninja -C $B -j16 backends/cuda/libkvhal-cuda.so tools/kvhal-bench tools/kvhal-fp8-check tests/test_conformance \
  tests/test_gpu_paths >> "$OUT/build.txt" 2>&1 || { grep -E "error" "$OUT/build.txt" | head -20; echo "BUILD FAILED"; exit 1; }
el build
export KVHAL_BACKEND_PATH=$B/backends
for v in ${CONF_VARIANTS:-$VARIANTS}; do
  [ $v = default ] && v=""
  KVHAL_GPU_VARIANT=$v KVHAL_TEST_DEVICE=cuda:0 timeout 150 $B/tests/test_conformance > "$OUT/conformance-v$v.txt" 2>&1 ||
    fail "conformance, variant $v"
  echo "variant $v: conformance $(grep -c '^\[       OK' "$OUT/conformance-v$v.txt") ok," \
    "$(grep -c '^\[  FAILED  \] [a-z]' "$OUT/conformance-v$v.txt") failed; $(grep -m1 '^\[ device   ] cuda' "$OUT/conformance-v$v.txt")"
done
for v in ${PATHS_VARIANTS:-}; do
  [ $v = default ] && v=""
  KVHAL_GPU_VARIANT=$v KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_gpu_paths > "$OUT/gpu_paths-v$v.txt" 2>&1 ||
    fail "gpu_paths, variant $v"
  echo "variant $v: gpu_paths $(grep -c '^\[       OK' "$OUT/gpu_paths-v$v.txt") ok, $(grep -c '^\[  FAILED  \] [a-z]' "$OUT/gpu_paths-v$v.txt") failed"
done
el suites
export ROWS=${ROWS:-"--op=mla --tokens=8192,65536
--op=paged_caching --preset=llama3-8b --tokens=8192,65536
--op=paged_caching --preset=small --tokens=8192"}
SKIP_SUITES=1 SKIP_FP8=1 KVHAL_GPU_B=$B bash docs/measurements/scripts/kernel-variants-gpu.sh || fail "kernel-variants-gpu.sh"
el bench
# last, in what is left of LIMIT seconds (default 285): the exhaustive fp8 check under the default variant
if [ -n "${FP8:-}" ]; then
  left=$(( ${LIMIT:-285} - ($(date +%s) - t0) ))
  timeout $left $B/tools/kvhal-fp8-check --device=cuda:0 --chunk-log2=26 --scales=0.37,3e30,0x1.5p-64,0.5 \
    > "$OUT/fp8-check.txt" 2>&1 || fail "kvhal-fp8-check (given $left s)"
  echo "fp8 check: $(tail -1 "$OUT/fp8-check.txt")"; el fp8
fi
el "session7-gpu: rc $rc"
exit $rc

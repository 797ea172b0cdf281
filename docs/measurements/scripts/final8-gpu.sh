set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
B=/tmp/b8; t0=$(date +%s)
meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled -Dexamples=false > $OUT/build.txt 2>&1 &&
ninja -C $B -j16 backends/cuda/libkvhal-cuda.so tools/kvhal-bench tests/test_conformance tests/test_gpu_paths >> $OUT/build.txt 2>&1 || { tail -30 $OUT/build.txt; echo BUILD FAILED; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
export KVHAL_BACKEND_PATH=$B/backends
rc=0
KVHAL_TEST_DEVICE=cuda:0 timeout 120 $B/tests/test_conformance > $OUT/conformance-cuda.txt 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED)|^\[ device|paged_fp8_wide" $OUT/conformance-cuda.txt | head
KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_gpu_paths > $OUT/gpu_paths.txt 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED)" $OUT/gpu_paths.txt
timeout 60 $B/tools/kvhal-bench --device=cuda:0 --op=mla --tokens=8192 > $OUT/bench-mla.txt 2>&1 || rc=1
cat $OUT/bench-mla.txt | head -12
echo "total $(( $(date +%s) - t0 )) s rc=$rc"; exit $rc

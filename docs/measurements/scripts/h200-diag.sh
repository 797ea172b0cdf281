#!/bin/bash
# Session 9: where the H200's same-dtype gap comes from. kvhal-bench on one GPU, 3 rounds: paged caching of
# llama3-8b (8192, 65536 tokens) with slots drawn singly over the cache (the default) and in whole blocks
# (--slots=blocks: pages written whole), and the duplicate op (a contiguous copy kernel) against cudaMemcpy.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
B=/tmp/bd; t0=$(date +%s)
nvidia-smi -L > $OUT/gpu.txt
meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled \
  -Dexamples=false -Dtests=false > $OUT/build.txt 2>&1 &&
  NVCC_APPEND_FLAGS=--split-compile=0 ninja -C $B backends/cuda/libkvhal-cuda.so tools/kvhal-bench >> $OUT/build.txt 2>&1 ||
  { tail -20 $OUT/build.txt; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends KVHAL_DEVICE=cuda:0
for r in 1 2 3; do
  $B/tools/kvhal-bench --op=paged_caching --preset=llama3-8b --tokens=8192,65536 > $OUT/perm-$r.txt 2>&1
  $B/tools/kvhal-bench --op=paged_caching --preset=llama3-8b --tokens=8192,65536 --slots=blocks > $OUT/blocks-$r.txt 2>&1
  $B/tools/kvhal-bench --op=duplicate > $OUT/dup-$r.txt 2>&1
done
for f in perm blocks dup; do echo "== $f"; for r in 1 2 3; do grep -E "bf16  bf16|duplicate" $OUT/$f-$r.txt | head -6; done; done
echo "total $(( $(date +%s) - t0 )) s"

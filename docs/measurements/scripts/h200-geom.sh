#!/bin/bash
# Session 9, issue 15 on the H200: do the paged kernel's build-time geometry constants (kvhal_gpu_kernels.cuh) move
# the same-dtype cold rows (0.92 of cudaMemcpy on the H200, 0.95-0.96 on the H100)? One build per geometry (only
# the CUDA module and kvhal-bench, -D flags through NVCC_APPEND_FLAGS), then ROUNDS interleaved rounds of kvhal-bench
# (llama3-8b 8192 and 65536, MLA 65536), and a table of cold ratios (medians). Run from the repository root with
# .devdeps carried; logs under $OUT.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
GEOMS=${GEOMS:-"base: t256:-DKVHAL_GPU_PAGED_THREADS=256 mb4:-DKVHAL_GPU_PAGED_WIDE_MIN_BLOCKS=4 u4:-DKVHAL_GPU_PAGED_UNROLL=4"}
ROUNDS=${ROUNDS:-3}
t0=$(date +%s)
nvidia-smi -L > $OUT/gpu.txt
build() { # name flags
  local B=/tmp/bg-$1
  meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled \
    -Dexamples=false -Dtests=false > $OUT/build-$1.txt 2>&1 &&
  NVCC_APPEND_FLAGS="--split-compile=0 $2" ninja -C $B backends/cuda/libkvhal-cuda.so tools/kvhal-bench >> $OUT/build-$1.txt 2>&1 ||
    echo "BUILD $1 FAILED"
}
names=()
for g in $GEOMS; do n=${g%%:*}; f=${g#*:}; names+=($n); build $n "$f" & done
wait
echo "builds $(( $(date +%s) - t0 )) s"
for r in $(seq 1 $ROUNDS); do
  for n in "${names[@]}"; do
    B=/tmp/bg-$n
    for args in "--op=paged_caching --preset=llama3-8b --tokens=8192,65536" "--op=mla --tokens=65536"; do
      KVHAL_BACKEND_PATH=$B/backends KVHAL_DEVICE=cuda:0 timeout 60 $B/tools/kvhal-bench $args --json \
        > $OUT/r$r-$n-$(echo $args | tr -dc 'a-z0-9').json 2>> $OUT/err.txt
    done
  done
  echo "round $r $(( $(date +%s) - t0 )) s"
done
python3 - $OUT "${names[@]}" <<'PY' | tee $OUT/table.txt
import json, sys, glob, statistics, collections
out, names = sys.argv[1], sys.argv[2:]
v = collections.defaultdict(list)
for n in names:
    for f in glob.glob(f"{out}/r*-{n}-*.json"):
        try: rows = json.load(open(f))["records"]
        except Exception: continue
        for x in rows:
            if not x.get("cold"): continue
            key = (x["op"], x["preset"], x["tokens"], x["layout"], x["dtype"], x["cache_dtype"], x["scale"])
            v[(key, n)].append(x["cold"]["ratio_to_memcpy"])
keys = sorted({k for k, _ in v}, key=str)
print("| row | " + " | ".join(names) + " |"); print("|" + " --- |" * (len(names) + 1))
for k in keys:
    cells = [f"{statistics.median(v[(k, n)]):.3f}" if v[(k, n)] else "-" for n in names]
    print("| " + " ".join(str(c) for c in k if c is not None) + " | " + " | ".join(cells) + " |")
PY
cd $OUT && tar -czf geom-runs.tgz r*.json build-*.txt err.txt && rm -f r*.json build-*.txt
echo "total $(( $(date +%s) - t0 )) s"

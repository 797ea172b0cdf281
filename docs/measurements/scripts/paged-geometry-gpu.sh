#!/bin/bash
# Issue 15, session 6: the paged-caching kernel's compile-time geometry (KVHAL_GPU_PAGED_THREADS / _UNROLL /
# _MIN_BLOCKS in backends/gpu/kvhal_gpu_kernels.cuh) measured on one GPU: each geometry GEOMS entry
# ("name THREADS UNROLL MIN_BLOCKS") builds the CUDA module from a copy of the tree with those defaults, then
# kvhal-bench (one build of the tools) runs ROWS against each module in turn, ROUNDS times interleaved, and one table
# gives the cold (warm) ratio to memcpy per row and geometry. Run from the repository root with .devdeps carried, after
# kernel-variants-gpu.sh has built /tmp/bkv (or with KVHAL_GPU_B naming a cpu+cuda build); output under $OUT.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export PATH=/usr/local/cuda/bin:$PATH
B=${KVHAL_GPU_B:-/tmp/bkv}
ROUNDS=${ROUNDS:-2}
GEOMS=${GEOMS:-"base 128 2 12
u4 128 4 8
t256 256 2 6
u1 128 1 16"}
ROWS=${ROWS:-"--op=mla --tokens=8192,65536
--op=paged_caching --preset=llama3-8b --tokens=8192 --quick
--op=paged_caching --preset=llama2-7b --tokens=8192 --quick
--op=paged_caching --preset=small --tokens=8192,65536 --quick"}
SRC=$PWD
names=""
while read -r name th un mb; do
  [ -z "$name" ] && continue
  d=/tmp/geom-$name
  rm -rf $d && mkdir -p $d && cp -r $SRC/. $d/src 2>/dev/null
  sed -i -e "s/^#define KVHAL_GPU_PAGED_THREADS .*/#define KVHAL_GPU_PAGED_THREADS $th/" \
         -e "s/^#define KVHAL_GPU_PAGED_UNROLL .*/#define KVHAL_GPU_PAGED_UNROLL $un/" \
         -e "s/^#define KVHAL_GPU_PAGED_MIN_BLOCKS .*/#define KVHAL_GPU_PAGED_MIN_BLOCKS $mb/" \
         $d/src/backends/gpu/kvhal_gpu_kernels.cuh
  (cd $d/src && meson setup $d/b -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 > $d/build.txt 2>&1 &&
    ninja -C $d/b -j16 backends/cuda/libkvhal-cuda.so >> $d/build.txt 2>&1) || { tail -20 $d/build.txt; echo "BUILD FAILED: $name"; continue; }
  names="$names $name"
done <<< "$GEOMS"
echo "built:$names"
for r in $(seq 1 $ROUNDS); do
  i=0
  while IFS= read -r args; do
    [ -z "$args" ] && continue
    i=$((i + 1))
    for name in $names; do
      KVHAL_BACKEND_PATH=/tmp/geom-$name/b/backends timeout 240 $B/tools/kvhal-bench --device=cuda:0 $args --json \
        > "$OUT/geom-$name-r$r-$i.json" 2>/dev/null || echo "FAILED: $name $args"
    done
  done <<< "$ROWS"
done
python3 - "$OUT" $names <<'PY' | tee "$OUT/geometry.txt"
import glob, json, os, re, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
rows, order = {}, []
for f in sorted(glob.glob(os.path.join(out, "geom-*-r*-*.json"))):
    n = re.match(r"geom-(.+)-r\d+-\d+\.json", os.path.basename(f)).group(1)
    try: d = json.load(open(f))
    except Exception: continue
    for x in d["records"]:
        key = (x["op"], x["preset"], x["tokens"], x["layout"], x["cache_dtype"], x["scale"])
        if key not in rows: rows[key] = {}; order.append(key)
        for col in ("cold", "warm"):
            m = x.get(col)
            if m and m.get("ratio_to_memcpy") is not None: rows[key].setdefault((n, col), []).append(m["ratio_to_memcpy"])
print("%-17s %-12s %6s %-4s %-13s %-5s | " % ("op", "preset", "tokens", "lay", "cache", "scale") + " | ".join("%-13s" % n for n in names))
for key in order:
    cells = []
    for n in names:
        c, w = rows[key].get((n, "cold")), rows[key].get((n, "warm"))
        cells.append("%5s (%5s)" % ("%.3f" % statistics.median(c) if c else "-", "%.3f" % statistics.median(w) if w else "-"))
    op, pr, tok, lay, cdt, sc = key
    print("%-17s %-12s %6s %-4s %-13s %-5s | " % (op, pr, tok, lay, cdt, "-" if sc is None else "%.3g" % sc) + " | ".join(cells))
PY
(cd "$OUT" && tar czf geom-runs.tgz geom-*.json && rm -f geom-*.json)

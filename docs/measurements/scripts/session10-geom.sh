#!/bin/bash
# Session 10, issue 15: the bulk kernel's geometry (KVHAL_GPU_BULK_GEOM stages,KiB,blocks per SM) against the bulk
# copies off, kvhal-bench interleaved on one GPU (ROUNDS rounds, every config per row per round). CFGS: space-
# separated environment settings, one per config (config i is column i). Prints one table of cold (warm) ratios.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NVCC_APPEND_FLAGS=--split-compile=0
t0=$(date +%s)
B=/tmp/b10g
meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled \
  -Dexamples=false -Dtests=false > "$OUT/build.txt" 2>&1 && ninja -C $B -j16 backends/cuda/libkvhal-cuda.so tools/kvhal-bench \
  >> "$OUT/build.txt" 2>&1 || { grep -E "error|FAILED" "$OUT/build.txt" | head; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends
nvidia-smi -L > "$OUT/gpu.txt"
CFGS=(${CFGS:-KVHAL_GPU_BULK=0 KVHAL_GPU_BULK=1})
ROWS=${ROWS:-"--op=mla --tokens=8192,65536
--op=paged_caching --preset=llama3-8b --tokens=8192,65536"}
mkdir -p "$OUT/runs"
for r in $(seq 1 ${ROUNDS:-3}); do
  i=0
  while IFS= read -r args; do
    [ -z "$args" ] && continue; i=$((i + 1))
    for c in "${!CFGS[@]}"; do
      env ${CFGS[$c]//@/ } timeout 200 $B/tools/kvhal-bench --device=cuda:0 $args --json > "$OUT/runs/c$c-r$r-$i.json" 2> "$OUT/runs/c$c-r$r-$i.err" ||
        echo "FAILED ${CFGS[$c]} $args: $(tail -c 300 "$OUT/runs/c$c-r$r-$i.err")"
    done
  done <<< "$ROWS"
  echo "round $r: $(( $(date +%s) - t0 )) s"
done
python3 - "$OUT/runs" "${CFGS[@]}" <<'PY' | tee "$OUT/geom.txt"
import glob, json, os, re, statistics, sys
d, cfgs = sys.argv[1], sys.argv[2:]
rows, order, plat = {}, [], {}
for f in sorted(glob.glob(os.path.join(d, "c*-r*-*.json"))):
    c = int(re.match(r"c(\d+)-", os.path.basename(f)).group(1))
    try: j = json.load(open(f))
    except Exception: continue
    plat[c] = j.get("platform", "")
    for x in j.get("records", []):
        if x["dtype"] != x["cache_dtype"]: continue
        k = (x["op"], x["preset"], x["tokens"], x["layout"], x["dtype"])
        if k not in rows: rows[k] = {}; order.append(k)
        for col in ("cold", "warm"):
            m = x.get(col)
            if m and m.get("ratio_to_memcpy") is not None: rows[k].setdefault((c, col), []).append(m["ratio_to_memcpy"])
for c, e in enumerate(cfgs): print("c%d: %s | %s" % (c, e, plat.get(c, "(no run)")))
print("| row | " + " | ".join("c%d" % c for c in range(len(cfgs))) + " |")
for k in order:
    cells = []
    for c in range(len(cfgs)):
        a, w = rows[k].get((c, "cold")), rows[k].get((c, "warm"))
        cells.append("%s (%s)" % ("%.3f" % statistics.median(a) if a else "-", "%.3f" % statistics.median(w) if w else "-"))
    print("| %s %s %s %s %s | " % k + " | ".join(cells) + " |")
PY
(cd "$OUT" && tar czf runs.tgz runs && rm -rf runs)
echo "total $(( $(date +%s) - t0 )) s"

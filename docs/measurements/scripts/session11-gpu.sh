#!/bin/bash
# Session 11, issue 15: where the remaining cold-L2 gaps come from on whichever GPU the call gets (an H200 was the
# open question). 1. tma_probe.cu (session 10's standalone probe: ld/st and Hopper bulk copies, scattered and
# contiguous, against cudaMemcpy of the same bytes) at the issue's row sizes, 128-byte pieces (fp8 HND) included;
# 2. main's kvhal-bench rows (MLA, llama3-8b same-dtype and fp8 at 0.37, both layouts) under CFGS (environment
# settings, one column each), ROUNDS rounds interleaved; 3. with ncu when present: DRAM throughput of the paged
# kernels of the missing rows next to the memcpy's. Run from the repository root with .devdeps carried; logs in $OUT.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NVCC_APPEND_FLAGS=--split-compile=0
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv >> "$OUT/gpu.txt"
B=/tmp/b11
(meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled -Dtransfer=disabled \
  -Dexamples=false -Dtests=false > "$OUT/build.txt" 2>&1 && ninja -C $B -j14 backends/cuda/libkvhal-cuda.so tools/kvhal-bench \
  >> "$OUT/build.txt" 2>&1 || { grep -E "error|FAILED" "$OUT/build.txt" | head; echo BUILD FAILED; }) &
bpid=$!
nvcc -O3 -arch=sm_90 -o /tmp/tma_probe docs/measurements/scripts/tma_probe.cu > "$OUT/probe-build.txt" 2>&1 || echo "PROBE BUILD FAILED"
wait $bpid
el build
# 1. the probe (rounds inside it interleave the kernels)
if [ -x /tmp/tma_probe ]; then
  for a in ${PROBE_ROWS:-"2048@8192@2" "2048@65536@2" "1152@8192@1" "1152@65536@1" "576@8192@1" "576@65536@1" "256@65536@2" "128@8192@2" "128@65536@2"}; do
    a=${a//@/ }
    timeout 120 /tmp/tma_probe $a >> "$OUT/probe.txt" 2>&1 || echo "probe $a failed"
  done
  grep -E "^#|memcpy|^ldst |ldst_u8|tma_s3_r4 |tma_s3_r8 |tma_s4_r16|tma_c" "$OUT/probe.txt"
  el probe
fi
export KVHAL_BACKEND_PATH=$B/backends
CFGS=(${CFGS:-X=1})
ROWS=${ROWS:-"--op=mla --tokens=8192,65536
--op=paged_caching --preset=llama3-8b --tokens=8192,65536
--op=duplicate --tokens=65536"}
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
  el "round $r"
done
python3 - "$OUT/runs" "${CFGS[@]}" <<'PY' | tee "$OUT/rows.txt"
import glob, json, os, re, statistics, sys
d, cfgs = sys.argv[1], sys.argv[2:]
rows, order, plat = {}, [], {}
for f in sorted(glob.glob(os.path.join(d, "c*-r*-*.json"))):
    c = int(re.match(r"c(\d+)-", os.path.basename(f)).group(1))
    try: j = json.load(open(f))
    except Exception: continue
    plat[c] = j.get("platform", "")
    for x in j.get("records", []):
        k = (x["op"], x.get("preset", ""), x.get("tokens", ""), x.get("layout", ""), x.get("dtype", ""),
             x.get("cache_dtype", ""), "" if x.get("scale") is None else "%.3g" % x["scale"])
        if k not in rows: rows[k] = {}; order.append(k)
        for col in ("cold", "warm"):
            m = x.get(col)
            if m and m.get("ratio_to_memcpy") is not None: rows[k].setdefault((c, col), []).append(m["ratio_to_memcpy"])
for c, e in enumerate(cfgs): print("c%d: %s | %s" % (c, e, plat.get(c, "(no run)")))
print("cold (warm) ratio to the same run's cudaMemcpy, median over rounds")
print("| row | " + " | ".join("c%d" % c for c in range(len(cfgs))) + " |")
for k in order:
    cells = []
    for c in range(len(cfgs)):
        a, w = rows[k].get((c, "cold")), rows[k].get((c, "warm"))
        cells.append("%s (%s)" % ("%.3f" % statistics.median(a) if a else "-", "%.3f" % statistics.median(w) if w else "-"))
    print("| %s | " % " ".join(str(v) for v in k) + " | ".join(cells) + " |")
PY
(cd "$OUT" && tar czf runs.tgz runs && rm -rf runs)
# 3. ncu: DRAM throughput of the kernels of the rows that miss, and what else the GPU runs for a cudaMemcpy
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ -n "$NCU" ] && [ -z "${SKIP_NCU:-}" ] && [ $(( $(date +%s) - t0 )) -lt ${NCU_BEFORE:-420} ]; then
  for a in "--op=mla --tokens=8192" "--op=mla --tokens=65536" "--op=paged_caching --preset=llama3-8b --tokens=8192"; do
    timeout 150 $NCU --launch-skip 20 --launch-count 40 --metrics \
      gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
      --csv $B/tools/kvhal-bench --device=cuda:0 $a --no-cold --quick > "$OUT/ncu-$(echo $a | tr -c 'a-z0-9' _).csv" 2>&1 || echo "ncu $a failed"
  done
  el ncu
else
  echo "no ncu"
fi
(cd "$OUT" && ls ncu-*.csv >/dev/null 2>&1 && tar czf ncu.tgz ncu-*.csv && rm -f ncu-*.csv)
el done

#!/bin/bash
# Issue 15, session 6: the kernel variants of the GPU backends (KVHAL_GPU_VARIANT, kvhal_gpu_kernels.cuh) measured
# interleaved on one GPU. Builds cpu + cuda (-Dwerror=true, sm_90) unless KVHAL_GPU_B names a build folder, runs the
# conformance suite on cuda:0 under every variant (and the GPU-path suite, which checks that the variant took
# effect), the exhaustive fp8 check under the default variant, then kvhal-bench for each variant in turn, ROUNDS
# times (variants interleaved, so drift hits them alike), and prints one table: per row, the cold ratio to memcpy of
# each variant (median over rounds). Run from the repository root with .devdeps carried; logs and JSON go to $OUT.
# Environment: VARIANTS (default "0 1 2"), ROUNDS (default 2), ROWS (default: the issue's rows, see below),
# SKIP_SUITES=1, SKIP_FP8=1, VAR_ENV (default KVHAL_GPU_VARIANT: the variable VARIANTS' values are given to; session
# 10 measured KVHAL_GPU_BULK 0 against 1 with it). Exit status non-zero when the build, a suite, the fp8 check or a bench run failed.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export PATH=/usr/local/cuda/bin:$PATH
VARIANTS=${VARIANTS:-"0 1 2"}
ROUNDS=${ROUNDS:-2}
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
rc=0
fail() { echo "FAILED: $*"; rc=1; }
nvidia-smi -L 2>/dev/null | tee "$OUT/gpu.txt"
if [ -n "${KVHAL_GPU_B:-}" ]; then B=$KVHAL_GPU_B; else
  B=/tmp/bkv
  rm -rf $B
  meson setup $B -Dbackends=cpu,cuda -Dwerror=true -Dnvcc_arch=90 > "$OUT/build.txt" 2>&1 &&
    ninja -C $B -j16 >> "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; echo "BUILD FAILED"; exit 1; }
fi
echo "build: $(elapsed) s"
export KVHAL_BACKEND_PATH=$B/backends:$B/examples/vendor-plugin

# 1. conformance on cuda:0 and the GPU paths under every variant
if [ -z "${SKIP_SUITES:-}" ]; then
  for v in $VARIANTS; do
    KVHAL_GPU_VARIANT=$v KVHAL_TEST_DEVICE=cuda:0 timeout 150 $B/tests/test_conformance > "$OUT/conformance-v$v.txt" 2>&1 ||
      fail "conformance, variant $v"
    KVHAL_GPU_VARIANT=$v KVHAL_BACKENDS=cpu,cuda timeout 100 $B/tests/test_gpu_paths > "$OUT/gpu_paths-v$v.txt" 2>&1 ||
      fail "gpu_paths, variant $v"
    echo "variant $v: conformance $(grep -c '^\[       OK' "$OUT/conformance-v$v.txt") ok," \
      "$(grep -c '^\[  FAILED' "$OUT/conformance-v$v.txt") failed; $(grep '^\[ device   ] cuda' "$OUT/conformance-v$v.txt" | head -1)"
  done
  echo "suites: $(elapsed) s"
fi
# 2. the exhaustive fp8 check through the paged-caching kernel, under the default variant and FP8_VARIANTS
if [ -z "${SKIP_FP8:-}" ]; then
  for v in default ${FP8_VARIANTS:-}; do
    if [ $v = default ]; then unset KVHAL_GPU_VARIANT; else export KVHAL_GPU_VARIANT=$v; fi
    timeout 200 $B/tools/kvhal-fp8-check --device=cuda:0 --chunk-log2=26 --scales=0.37,3e30,0x1.5p-64,0.5 \
      > "$OUT/fp8-check-$v.txt" 2>&1 || fail "kvhal-fp8-check, variant $v"
    echo "fp8 check ($v): $(tail -1 "$OUT/fp8-check-$v.txt")"
  done
  unset KVHAL_GPU_VARIANT
  echo "fp8: $(elapsed) s"
fi
# 3. kvhal-bench per variant, interleaved. A row: kvhal-bench arguments (--json added).
ROWS=${ROWS:-"--op=copy_blocks
--op=mla --tokens=8192,65536
--op=paged_caching --preset=llama3-8b --tokens=8192,65536
--op=paged_caching --preset=llama2-7b --tokens=8192,65536
--op=paged_caching --preset=small --tokens=8192,65536"}
export ROWS # read again by the table below (rows run with --slots=blocks are marked)
for r in $(seq 1 $ROUNDS); do
  i=0
  while IFS= read -r args; do
    [ -z "$args" ] && continue
    i=$((i + 1))
    for v in $VARIANTS; do
      env "${VAR_ENV:-KVHAL_GPU_VARIANT}=$v" timeout 240 $B/tools/kvhal-bench --device=cuda:0 $args --json \
        > "$OUT/bench-v$v-r$r-$i.json" 2> "$OUT/bench-v$v-r$r-$i.err" || fail "kvhal-bench $args, variant $v"
    done
  done <<< "$ROWS"
  echo "bench round $r: $(elapsed) s"
done
python3 - "$OUT" $VARIANTS <<'PY' | tee "$OUT/variants.txt"
import glob, json, os, re, statistics, sys
out, variants = sys.argv[1], sys.argv[2:]
# rows run with --slots=blocks are told apart by their ROWS line (the file's last number)
lines = [l for l in os.environ.get("ROWS", "").split("\n") if l.strip()]
rows, names, order = {}, {}, []
for f in sorted(glob.glob(os.path.join(out, "bench-v*-r*-*.json"))):
    m = re.match(r"bench-v(\d+)-r\d+-(\d+)\.json", os.path.basename(f))
    v, line = m.group(1), int(m.group(2))
    blocks = line <= len(lines) and "--slots=blocks" in lines[line - 1]
    try:
        d = json.load(open(f))
    except Exception:
        continue
    names[v] = d.get("platform", "")
    for x in d["records"]:
        key = (x["op"] + ("/blk" if blocks else ""), x["preset"], x["tokens"], x["layout"], x["dtype"],
               x["cache_dtype"], x["scale"])
        if key not in rows:
            rows[key] = {}
            order.append(key)
        for col in ("cold", "warm"):
            m = x.get(col)
            if m and m.get("ratio_to_memcpy") is not None:
                rows[key].setdefault((v, col), []).append(m["ratio_to_memcpy"])
for v in variants:
    print("variant %s: %s" % (v, names.get(v, "(no run)")))
print("ratio to memcpy, median over rounds; cold (warm)")
print("%-21s %-12s %6s %-4s %-5s %-13s %-6s | " % ("op", "preset", "tokens", "lay", "dtype", "cache", "scale") +
      " | ".join("v%-12s" % v for v in variants))
for key in order:
    cells = []
    for v in variants:
        c, w = rows[key].get((v, "cold")), rows[key].get((v, "warm"))
        cells.append("%5s (%5s)" % ("%.3f" % statistics.median(c) if c else "-", "%.3f" % statistics.median(w) if w else "-"))
    op, pr, tok, lay, dt, cdt, sc = key
    print("%-21s %-12s %6s %-4s %-5s %-13s %-6s | " % (op, pr, tok, lay, dt, cdt, "-" if sc is None else "%.3g" % sc) +
          " | ".join(cells))
PY
# at most 8 files come back from the GPU machine: the raw runs go into one archive
(cd "$OUT" && files=$(ls bench-v*-r*-* conformance-v*.txt gpu_paths-v*.txt 2>/dev/null; true) && [ -n "$files" ] &&
  tar czf bench-runs.tgz $files && rm -f $files)
echo "total: $(elapsed) s, rc $rc"
exit $rc

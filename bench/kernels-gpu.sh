#!/bin/bash
# kernels-gpu.sh: bandwidth of kvhal's device ops against the same device's own memcpy.
#
# What: kvhal-bench on one device (default cuda:0): paged caching (llama3-8b bf16, llama2-7b f16, `small`; 8192 and
#   65536 tokens; NHD and HND; every fp8 format at scale 0.5 and at a calibrated 0.37), MLA, the serving loop,
#   decode, duplicate, copy_blocks, the descriptor cache, the device's opening and the first call, and page_transfer (host <-> device pages
#   against the backend's pinned memcpy). Each figure is a ratio to a memcpy of the same bytes (read + written)
#   on the same device, in the same run. "cold": L2 flushed before each call, slots a random permutation over a 4x
#   cache; "warm": back to back. ROUNDS runs; the table shows the median ratio over the rounds. On CUDA and HIP each
#   paged-caching and MLA row has a ceiling row before it (op "<op>_ceiling": the module's plain SM copy of the same
#   scattered rows, the fastest of kvhal_gpu_scatter_rows_form's 8 forms (4 or 8 loads in flight per thread, loads
#   allocated in L1 or not, blocks of 32 or 8 rows), each measured the same way; the table names the form) and its ratio to that row ("of
#   ceiling").
# Machine: any with a GPU and its toolchain (figures in docs/performance.md: one NVIDIA H200, one H100);
#   DEV=opencl:N measures an OpenCL device, DEV=cpu:0 the CPU backend (no cold column there).
# Run (repository root): bash bench/kernels-gpu.sh
#   B=build dir (default build-bench, configured with BACKENDS=cpu,cuda,opencl if it does not exist), DEV=cuda:0,
#   ROUNDS=3, OUT=/tmp/kvhal-kernels, TOKENS=8192,65536 (kvhal-bench --tokens), OPS="" (all; or e.g. "paged_caching mla").
# Output: $OUT/bench-<dev>-<round>.json (kvhal-bench --json) and $OUT/table.txt: the device's platform line once
#   opened (CUDA: "code: sm_90 cubin, N loaded in T ms", the kernels the module loaded when the device was opened;
#   KVHAL_GPU_LAZY_LOAD=1 in the environment leaves that to the driver), then one line per row:
#   op preset tokens layout dtype cache_dtype scale | cold ratio (p50 us) | warm ratio (p50 us) | host us, gpu us
#   | of ceiling
#   (device_open and first_call: host us, the device's opening and the process's first paged-caching call)
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
B=${B:-build-bench} BACKENDS=${BACKENDS:-cpu,cuda,opencl} DEV=${DEV:-cuda:0} ROUNDS=${ROUNDS:-3} OUT=${OUT:-/tmp/kvhal-kernels} TOKENS=${TOKENS:-8192,65536}
mkdir -p "$OUT"
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dbackends="$BACKENDS" -Dbuildtype=release > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
# the tools and the device modules the build dir has (the tools do not depend on them)
mods=$(ninja -C "$B" -t targets all 2> /dev/null | grep -o '^backends/[a-z0-9_]*/libkvhal-[a-z0-9_]*\.so' | sort -u)
ninja -C "$B" tools/kvhal-bench tools/kvhal-info $mods >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends
{ command -v nvidia-smi > /dev/null && nvidia-smi -L; lscpu | grep 'Model name'; "$B"/tools/kvhal-info; } > "$OUT/machine.txt" 2>&1
rc=0
for r in $(seq 1 "$ROUNDS"); do
  if [ -z "${OPS:-}" ]; then
    "$B"/tools/kvhal-bench --device="$DEV" --tokens="$TOKENS" --json > "$OUT/bench-${DEV/:/}-$r.json" || rc=1
  else
    for op in $OPS; do
      "$B"/tools/kvhal-bench --device="$DEV" --op="$op" --tokens="$TOKENS" --json > "$OUT/bench-${DEV/:/}-$r-$op.json" || rc=1
    done
  fi
done
python3 - "$OUT" "${DEV/:/}" <<'PY' | tee "$OUT/table.txt"
import collections, glob, json, statistics, sys
out, dev = sys.argv[1], sys.argv[2]
rows = collections.OrderedDict()
docs = []
for f in sorted(glob.glob(f"{out}/bench-{dev}-*.json")):
    try:
        d = json.load(open(f))
    except ValueError:
        continue
    docs.append(d)
    for r in d.get("records", []):
        key = (r["op"], r["preset"], r["tokens"], r["layout"], r["dtype"], r["cache_dtype"], r["scale"])
        rows.setdefault(key, []).append(r)
def med(rs, col, k):
    v = [r[col][k] for r in rs if r.get(col) and r[col].get(k) is not None]
    return "%.3f" % statistics.median(v) if v else "-"
def medv(rs, k):
    v = [r[k] for r in rs if r.get(k) is not None]
    return "%.2f" % statistics.median(v) if v else "-"
platforms = sorted({d.get("platform") for d in docs if d.get("platform")})
for p in platforms:
    print("platform: %s" % p) # the code path once the device was opened (CUDA: the functions loaded when opened)
for key, rs in rows.items():
    ceil = [r["ratio_to_ceiling"] for r in rs if r.get("ratio_to_ceiling") is not None]
    forms = sorted({int(r["ceiling_form"]) for r in rs if r.get("ceiling_form") is not None})
    print("%-17s %-11s %6s %-4s %-5s %-13s %-5s | cold %s (%s us) | warm %s (%s us) | host %s gpu %s | of ceiling %s%s" % (
        key[0], key[1], key[2], key[3], key[4], key[5], key[6] if key[6] is not None else "-",
        med(rs, "cold", "ratio_to_memcpy"), med(rs, "cold", "us_p50"), med(rs, "warm", "ratio_to_memcpy"),
        med(rs, "warm", "us_p50"), medv(rs, "host_us"), medv(rs, "gpu_us"),
        "%.3f" % statistics.median(ceil) if ceil else "-",
        " (form %s)" % ",".join(map(str, forms)) if forms else ""))
PY
exit $rc

#!/bin/bash
# Session 8, issue 15: variants 6 to 9 (row-form hints, kvhal_gpu_kernels.cuh) against the default (4) on
# one GPU, and the evidence session 7 lacked: which toolkit tools the device machine has, the SASS of the paged
# kernels (cuobjdump: instruction counts per kernel and opcode), and an Nsight Compute profile of chosen rows.
# Runs session7-gpu.sh (build, suites, interleaved kvhal-bench rounds, table: same environment as there), then,
# with PROFILE=1, the SASS summary and (unless NO_NCU=1) the ncu runs in what is left of LIMIT seconds (default 285).
# Run from the repository root (or a copy of the tree) with .devdeps carried; everything ends in $OUT/s8-run.tgz.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export PATH=/usr/local/cuda/bin:/opt/torch/.venv/bin:$PATH
t0=$(date +%s); left() { echo $(( ${LIMIT:-285} - ($(date +%s) - t0) )); }
B=/tmp/b7
{
  echo "== /usr/local/cuda/bin"; ls /usr/local/cuda/bin
  for t in ncu nsys cuobjdump nvdisasm; do echo "$t: $(command -v $t || echo none)"; done
  ls -d /opt/nvidia/nsight-compute/* /usr/local/cuda/nsight-compute* 2>/dev/null
  nvidia-smi -L; nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,power.limit --format=csv
} > "$OUT/tools.txt" 2>&1
bash docs/measurements/scripts/session7-gpu.sh; rc=$?
M=$B/backends/cuda/libkvhal-cuda.so
# FP8_VARIANT=v: the exhaustive fp8 check (all 2^32 f32 inputs, four scales) under variant v, in what is left
if [ -n "${FP8_VARIANT:-}" ]; then
  KVHAL_BACKEND_PATH=$B/backends KVHAL_GPU_VARIANT=$FP8_VARIANT timeout $(( $(left) - 20 )) $B/tools/kvhal-fp8-check \
    --device=cuda:0 --chunk-log2=26 --scales=0.37,3e30,0x1.5p-64,0.5 > "$OUT/fp8-check-v$FP8_VARIANT.txt" 2>&1 ||
    { echo "FAILED: kvhal-fp8-check under variant $FP8_VARIANT"; rc=1; }
  echo "fp8 check (variant $FP8_VARIANT): $(tail -1 "$OUT/fp8-check-v$FP8_VARIANT.txt"), $(( $(date +%s) - t0 )) s"
fi
export KVHAL_BACKEND_PATH=$B/backends
if [ -n "${PROFILE:-}" ] && command -v cuobjdump > /dev/null; then
  timeout 25 cuobjdump -sass "$M" > /tmp/sass.txt 2> "$OUT/sass-err.txt"
  python3 - /tmp/sass.txt "$OUT/sass-selected.txt" <<'PY' > "$OUT/sass-summary.txt"
import collections, re, sys
funcs, cur = {}, None
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1); funcs[cur] = []; continue
    m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(.*?)\s*;", line)
    if m and cur: funcs[cur].append(m.group(1))
pats = [r"XFp8VecILi2ELi3ELi1EEELi4ELi12ELi(0|12|16)E", r"XFp8VecILi2ELi3ELi1EEELi2ELi16ELi(0|12|16)E",
        r"XCopyI5uint4EELi4ELi12ELi0E", r"XCopyI5uint4EELi8ELi8ELi0E", r"XFp8VecILi0ELi3ELi1EEELi4ELi12ELi(0|12)E",
        r"XFp8VecILi2ELi3ELi0EEELi2ELi16ELi(0|12)E"]
sel = open(sys.argv[2], "w")
for name, ins in funcs.items():
    if "paged_caching_kernel" not in name or not any(re.search(p, name) for p in pats): continue
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0] for i in ins)
    print("%s: %d instructions" % (name, len(ins)))
    print("  " + " ".join("%s:%d" % kv for kv in sorted(ops.items(), key=lambda kv: -kv[1])))
    sel.write("\n==== %s\n" % name + "\n".join(ins) + "\n")
PY
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/nsight-compute*/ncu 2>/dev/null | head -1)
if [ -n "${PROFILE:-}" ] && [ -z "${NO_NCU:-}" ] && [ -n "$NCU" ]; then
  S="--kernel-name-base mangled --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"
  PROFILE_VARIANTS=${PROFILE_VARIANTS:-4}
  for v in $PROFILE_VARIANTS; do
    [ "$(left)" -lt 25 ] && break
    KVHAL_GPU_VARIANT=$v timeout 40 $NCU --clock-control none -k regex:XFp8VecILi2ELi3ELi1 -c 1 $S \
      $B/tools/kvhal-bench --device=cuda:0 --op=mla --tokens=8192 --quick --no-cold > "$OUT/ncu-mla-fp8-v$v.txt" 2>&1
    [ "$(left)" -lt 25 ] && break
    [ "$v" != "${PROFILE_VARIANTS%% *}" ] && continue # the rest for the first variant only
    KVHAL_GPU_VARIANT=$v timeout 40 $NCU --clock-control none -k regex:XCopyI5uint4 -c 1 $S \
      $B/tools/kvhal-bench --device=cuda:0 --op=mla --tokens=8192 --quick --no-cold > "$OUT/ncu-mla-bf16-v$v.txt" 2>&1
    [ "$(left)" -lt 30 ] && break
    # llama3-8b 8192, bf16 -> e4m3 at 0.37: every launch, NHD rows first, then HND (told apart by order)
    KVHAL_GPU_VARIANT=$v timeout 45 $NCU --clock-control none --kernel-name-base mangled -k regex:XFp8VecILi2ELi3ELi1 \
      -c 400 --csv --page raw \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum,lts__t_sectors_op_write.sum \
      $B/tools/kvhal-bench --device=cuda:0 --op=paged_caching --preset=llama3-8b --tokens=8192 --quick --no-cold \
      > "$OUT/ncu-llama-fp8-v$v.csv" 2>&1
  done
fi
# few files come back from the device machine: everything in one archive, the table and the SASS summary beside it
(cd "$OUT" && tar czf /tmp/s8-run.tgz --exclude=run.log . 2>/dev/null &&
  find . -maxdepth 1 -type f ! -name run.log ! -name variants.txt ! -name sass-summary.txt ! -name "fp8-check-v*.txt" -delete && mv /tmp/s8-run.tgz .)
echo "session8-gpu: rc $rc, $(( $(date +%s) - t0 )) s"
exit $rc

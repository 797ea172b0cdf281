#!/bin/bash
# figures.sh: the figures of docs/performance.md (docs/figures/), from short runs on the CPU device:
#   replay-timeline.png   kvhal-replay --timeline: hit rate per window of finished requests and pages evicted, a
#                         workload ~3x the device budget, without and with a host tier (write-through)
#   hit-rate-sweep.png    bench/hit-rate-sweep.sh: hit rate against the device budget, with a 16 MiB host tier,
#                         next to the unbounded cache on the same schedule
#   bench-paged.png       kvhal-bench --csv: paged caching GB/s (warm) of the small preset, --quick
# Hit rates depend on the workload and the schedule only (the same on any machine); the kvhal-bench figure is the
# machine's. Run (repository root): bash bench/figures.sh
#   B=build dir (default build-figures, cpu only), OUT=where the CSVs and figures go (default docs/figures).
set -euo pipefail
PY=${PYTHON:-python3}   # an interpreter with matplotlib (Debian: python3-matplotlib)
B=${B:-build-figures} OUT=${OUT:-docs/figures}
mkdir -p "$OUT"
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dbackends=cpu -Dbuildtype=release -Dtests=false -Dpython=disabled > "${TMPDIR:-/tmp}/kvhal-figures-build.log" 2>&1 ||
    { tail -30 "${TMPDIR:-/tmp}/kvhal-figures-build.log"; exit 1; }
fi
ninja -C "$B" tools/kvhal-replay tools/kvhal-bench > /dev/null
export KVHAL_BACKEND_PATH=$B/backends KVHAL_DEVICE=cpu:0
R=$B/tools/kvhal-replay
W="--groups 24 --prompts 8 --system-len 1024 --question-len 64 --output-len 32 --zipf 1.0 --seed 3 --quiet"
# shellcheck disable=SC2086
"$R" $W --kv-budget 4MiB --timeline "$OUT/timeline-device.csv" --timeline-window 8 > /dev/null
# shellcheck disable=SC2086
"$R" $W --kv-budget 4MiB --host-tier 16MiB --timeline "$OUT/timeline-host.csv" --timeline-window 8 > /dev/null
"$PY" bench/plot.py timeline "device only=$OUT/timeline-device.csv" "host tier 16 MiB=$OUT/timeline-host.csv" \
  -o "$OUT/replay-timeline.png" --title "kvhal-replay, 4 MiB device budget (working set ~3x): hits per window"
R=$R ARGS="$W --host-tier 16MiB" BUDGETS="1MiB 2MiB 4MiB 8MiB 16MiB 32MiB" bash bench/hit-rate-sweep.sh \
  > "$OUT/hit-rate-sweep.csv"
"$PY" bench/plot.py sweep "$OUT/hit-rate-sweep.csv" -o "$OUT/hit-rate-sweep.png" \
  --title "kvhal-replay: hit rate against the device budget (16 MiB host tier)"
"$B/tools/kvhal-bench" --quick --op paged_caching --preset small --csv "$OUT/bench-paged.csv" -q > /dev/null
"$PY" bench/plot.py bench "$OUT/bench-paged.csv" -o "$OUT/bench-paged.png" --column warm_gbps \
  --title "kvhal-bench --quick, paged caching (small preset), CPU: GB/s warm"
{ lscpu | grep 'Model name'; nproc; } > "$OUT/machine.txt"

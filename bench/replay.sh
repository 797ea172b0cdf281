#!/bin/bash
# replay.sh: the serving loop end to end: prefix cache, cache manager, paged cache and the host tier.
#
# What, in four parts (PARTS, default "radix serve tier evict"):
#   radix  the radix prefix cache and cache manager alone (kvhal-replay --no-kv --repeat 20, default workload: 64
#          groups x 16 prompts sharing 2048-token system prompts, 128-token questions, 256 output tokens): requests/s,
#          match / finish p50, evict(4096) p50, at page size 1 (cache_finished_suffix; --finish-whole; --cold-tokens)
#          and page size 16, ROUNDS interleaved rounds (a shared machine's speed drifts between minutes).
#   serve  the same workload writing real K/V on DEV (default cpu:0): the tool's default model, then llama3-8b under
#          eviction (2 GiB budget), every prefix hit read back and verified; the paged-caching GB/s it prints is the
#          library's, its request rate measures the tool's host-side K/V generation as much as the library.
#   tier   hit rates with and without the host tier on a working set ~2.7x the device budget (llama3-8b; every page
#          loaded back verified): unbounded, device only, write-through, write-back.
#   evict  evict(4096) with 12k-token requests, page size 1 and 16, no tier / write-through / write-back, 3 runs.
# Machine: any; DEV=cuda:0 (hip:0, opencl:0) runs serve/tier/evict on a GPU. Figures in docs/performance.md: a
#   2-core Debian 12 VM (AMD EPYC) and the Xeon host of an H200 machine (radix), an H100 (tier, evict).
# Run (repository root): bash bench/replay.sh
#   B=build dir (default build-bench-replay; cpu only when DEV=cpu:0), DEV=cpu:0, ROUNDS=6, OUT=/tmp/kvhal-replay.
# Output: $OUT/radix.txt (one line per run: name, requests/s, match/finish/evict p50 us, then medians per name),
#   $OUT/serve-*.txt, $OUT/tier-*.txt, $OUT/evict.txt (kvhal-replay's own reports).
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
B=${B:-build-bench-replay} DEV=${DEV:-cpu:0} ROUNDS=${ROUNDS:-6} OUT=${OUT:-/tmp/kvhal-replay}
PARTS=${PARTS:-radix serve tier evict}
mkdir -p "$OUT"
if [ ! -f "$B/build.ninja" ]; then
  backends=cpu; [ "${DEV%%:*}" != cpu ] && backends=auto
  meson setup "$B" -Dbackends=$backends -Dbuildtype=release -Dtests=false -Dpython=disabled > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" tools/kvhal-replay >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends KVHAL_DEVICE=$DEV
R=$B/tools/kvhal-replay
{ lscpu | grep 'Model name'; nproc; cut -d' ' -f1-3 /proc/loadavg; } > "$OUT/machine.txt"
rc=0
has() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }

if has radix; then
  : > "$OUT/radix.jsonl"
  for r in $(seq 1 "$ROUNDS"); do
    for v in "ps1 --page-size 1" "ps1-whole --page-size 1 --finish-whole" "ps1-cold --page-size 1 --cold-tokens" \
             "ps16 --page-size 16"; do
      set -- $v; name=$1; shift
      echo "$name $("$R" --no-kv --repeat 20 --quiet --json "$@")" >> "$OUT/radix.jsonl" || rc=1
    done
  done
  python3 - "$OUT/radix.jsonl" <<'PY' | tee "$OUT/radix.txt"
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, _, js = line.partition(" ")
    try:
        d = json.loads(js)
    except ValueError:
        print(name, "failed"); continue
    l = d["latency_us"]
    row = (d["requests_per_s"], l["match"].get("p50"), l["finish"].get("p50"), l["evict_4096"].get("p50"))
    runs[name].append(row)
    print(name, "%.0f requests/s, match %s finish %s evict(4096) %s us (p50), ok %s" % (row + (d["ok"],)))
for name, rs in runs.items():
    v = sorted(r[0] for r in rs)
    print(f"{name}: {v[0] / 1e3:.0f}k-{v[-1] / 1e3:.0f}k requests/s, median {statistics.median(v) / 1e3:.0f}k ({len(v)} rounds)")
PY
fi

if has serve; then
  timeout 300 "$R" > "$OUT/serve-default.txt" 2>&1 || { echo "serve default failed"; rc=1; }
  timeout 600 "$R" --model llama3-8b --kv-budget 2GiB --groups 8 --prompts 8 > "$OUT/serve-llama3-8b.txt" 2>&1 ||
    { echo "serve llama3-8b failed"; rc=1; }
  grep -hE "throughput|paged caching|verification|evicted" "$OUT"/serve-*.txt
fi

if has tier; then
  T="$R --model llama3-8b --groups 12 --prompts 6 --system-len 2048 --question-len 128 --output-len 64 --seed 5 --quiet --check-every 16"
  for v in "unbounded --kv-budget 8GiB" "device-only --kv-budget 1200MiB" \
           "through --kv-budget 1200MiB --host-tier 6GiB --write-policy through" \
           "back --kv-budget 1200MiB --host-tier 6GiB --write-policy back"; do
    set -- $v; name=$1; shift
    timeout 300 $T "$@" > "$OUT/tier-$name.txt" 2>&1 || { echo "tier $name failed"; rc=1; }
    echo "== $name: $*"; grep -E "prefix hits|host tier|verification" "$OUT/tier-$name.txt"
  done
fi

if has evict; then
  L="$R --groups 8 --prompts 4 --system-len 12288 --question-len 256 --output-len 32 --quiet --seed 7 --kv-budget 256MiB"
  for ps in 1 16; do
    for pol in none through back; do
      tier=""; [ $pol != none ] && tier="--host-tier 1GiB --write-policy $pol"
      for k in 1 2 3; do
        echo "page size $ps, host tier $pol, run $k: $(timeout 300 $L --page-size $ps $tier 2>&1 | grep -oE 'evict\(4096\) [0-9.]+ us')"
      done
    done
  done | tee "$OUT/evict.txt"
fi
exit $rc

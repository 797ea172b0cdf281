#!/bin/bash
# KV transfer between two processes on one host, host memory: kvhal-xfer's benchmark (a decode process and the
# prefill process it starts, 16-token pages of 256 KiB (4 layers x 8 heads x 128 bf16) scattered on both sides, 4
# transfers in flight, each one granted by the decode side first, the content of the last transfer of each size
# verified) next to ucx_perftest ucp_am_bw (the same UCX active messages, one contiguous buffer, the same message
# sizes, at its default window and at 4), over TCP loopback and over shared memory, interleaved in the same run;
# 640 MiB (at least ITERS messages) per size and tool.
# Usage: docs/measurements/scripts/xfer-host.sh [BUILD_DIR] [ROUNDS]   (writes to $OUT, default /tmp/xfer-host)
set -uo pipefail
B=${1:-build-x}
ROUNDS=${2:-3}
OUT=${OUT:-/tmp/xfer-host}
mkdir -p "$OUT"
SIZES=(262144 1048576 4194304 16777216)
ITERS=${ITERS:-40}
port=$((20000 + RANDOM % 20000))
{
  echo "# $(date -u +%FT%TZ) $(uname -n) $(lscpu | grep 'Model name' | sed 's/  */ /g')  nproc=$(nproc)"
  echo "# $(ucx_info -v | head -1)"
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env.txt"
perftest() { # transport size [window] -> GB/s (bytes / s, one direction); iterations: 640 MiB (at least 40)
  local tls=$1 size=$2 win=${3:-} eh=${4:-}
  local n=$(( 671088640 / size )); [ $n -lt $ITERS ] && n=$ITERS
  port=$((port + 1))
  UCX_TLS=$tls ucx_perftest ${eh:+-e} -p $port > /dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  local line
  line=$(UCX_TLS=$tls timeout 120 ucx_perftest ${eh:+-e} 127.0.0.1 -p $port -t ucp_am_bw -s "$size" -n "$n" -w 4 ${win:+-O $win} 2>&1 | grep -E "^Final:" || true)
  wait $srv 2>/dev/null
  # Final: iters typ avg overall bw(avg MB/s) bw(overall MB/s) ... -> column 6: bandwidth overall in MB/s (2^20)
  echo "$line" | awk '{ if (NF >= 7) printf "%.3f\n", $7 * 1048576 / 1e9; else print "nan" }'
}
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for tls in tcp shm; do
    for s in "${SIZES[@]}"; do
      n=$(( 671088640 / s )); [ $n -lt $ITERS ] && n=$ITERS
      "$B"/tools/kvhal-xfer --transport=$tls --sizes=$s --iters $n --window 4 --json > "$OUT/kvhal-$tls-$r-$s.json" 2> "$OUT/kvhal-$tls-$r-$s.err" || { echo "kvhal-xfer $tls $s round $r failed"; cat "$OUT/kvhal-$tls-$r-$s.err"; rc=1; }
      echo "$tls $s $(perftest $tls $s) $(perftest $tls $s 4) $(perftest $tls $s "" e)" >> "$OUT/perftest-$r.txt"
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
cat "$OUT/env.txt"
/usr/bin/python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics, collections
out, rounds = sys.argv[1], int(sys.argv[2])
k = collections.defaultdict(list); p = collections.defaultdict(list); p4 = collections.defaultdict(list); pe = collections.defaultdict(list)
lat = collections.defaultdict(list)
for r in range(1, rounds + 1):
    import glob
    for f in glob.glob(f"{out}/kvhal-*-{r}-*.json"):
        try: d = json.load(open(f))
        except Exception: continue
        for x in d.get("results", []):
            tls = x["transport"]
            k[(tls, int(x["bytes"]))].append(x["gbps"]); lat[(tls, int(x["bytes"]))].append((x["p50_us"], x["p99_us"]))
    for line in open(f"{out}/perftest-{r}.txt"):
        f = line.split()
        tls, size, v, v4 = f[:4]
        ve = f[4] if len(f) > 4 else "nan"
        if ve != "nan": pe[(tls, int(size))].append(float(ve))
        if v != "nan": p[(tls, int(size))].append(float(v))
        if v4 != "nan": p4[(tls, int(size))].append(float(v4))
print("| transport | batch | pages | kvhal-xfer GB/s, window 4 (median of %d; min-max) | ucx_perftest ucp_am_bw GB/s, default window / -O 4 | ratio to the better | perftest -e (peer-failure handling, as kvhal's endpoints) GB/s | ratio to -e | p50 us | p99 us |" % rounds)
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for key in sorted(k):
    km = statistics.median(k[key]); pm = statistics.median(p[key]) if p[key] else float("nan")
    pm4 = statistics.median(p4[key]) if p4[key] else float("nan")
    best = max(x for x in (pm, pm4) if x == x) if (pm == pm or pm4 == pm4) else float("nan")
    l50 = statistics.median(a for a, b in lat[key]); l99 = statistics.median(b for a, b in lat[key])
    pme = statistics.median(pe[key]) if pe[key] else float("nan")
    print(f"| {key[0]} | {key[1] >> 10} KiB | {key[1] // 262144} | {km:.3f} ({min(k[key]):.3f}-{max(k[key]):.3f}) | {pm:.3f} / {pm4:.3f} | {km / best:.2f} | {pme:.3f} | {km / pme:.2f} | {l50:.0f} | {l99:.0f} |")
PY
exit $rc

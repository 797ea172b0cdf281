#!/bin/bash
# transfer-host.sh: KV transfer between two processes over UCX's host transports, against ucx_perftest.
#
# What: kvhal-xfer's benchmark (a decode process and the prefill process it starts; 16-token pages of 256 KiB,
#   4 layers x 8 heads x 128 bf16, scattered on both sides; batches of 256 KiB, 1 and 16 MiB; WINDOW transfers in
#   flight, each granted by the decode side and acknowledged; the last transfer of each size verified) over TCP
#   loopback and over shared memory, interleaved in the same rounds with `ucx_perftest -t ucp_am_bw` (the same UCX
#   active messages, one contiguous buffer each side, the same message sizes and window). Over TCP two more anchors:
#   perftest with -e (endpoints with peer-failure handling, as kvhal's TCP endpoints need to see a killed peer), and
#   -e with UCX_TCP_RX_SEG_SIZE=256k (the receive segments kvhal sets: the like-for-like anchor). On one host
#   kvhal's host caches over shm take the CMA path (the receiver reads the sender's pages with process_vm_readv on
#   its copy workers). With SEND/RECV set to GPU devices the caches are GPU memory staged through pinned host memory.
# Machine: any Linux host with UCX (libucx-dev, ucx-utils for ucx_perftest); figures in docs/performance.md: the
#   32-core Xeon host of a 2 x H200 machine, and a 2-core Debian 12 VM. Only ratios of one run compare.
#   kvhal-xfer and the anchors alternate which goes first from round to round; medians over the rounds.
# Run (repository root): bash bench/transfer-host.sh   (7 rounds of 18 runs; the last line prints the time: a round
#   took 25 s on the loaded 2-core VM, meant to take well under that on a many-core host)
#   B=build dir (default build-bench-host, cpu only), ROUNDS=7, WINDOW=4, TLS="tcp shm", MIB=160 (MiB per size and
#   tool, at least 20 messages), SIZES="262144 1048576 16777216", SEND=cpu RECV=cpu (e.g. cuda:0 for the staged GPU
#   path), OUT=/tmp/kvhal-host.
# Output: $OUT/env.txt (machine, UCX version, load), $OUT/raw.txt (one line per measurement) and $OUT/table.txt:
#   transport, batch, kvhal-xfer GB/s (median, min-max), perftest GB/s (plain / -e / -e rx256), ratios, p50/p99 us.
set -uo pipefail
B=${B:-build-bench-host} ROUNDS=${ROUNDS:-7} WINDOW=${WINDOW:-4} MIB=${MIB:-160} OUT=${OUT:-/tmp/kvhal-host}
SEND=${SEND:-cpu} RECV=${RECV:-cpu}
TLS_LIST=(${TLS:-tcp shm}) SIZES=(${SIZES:-262144 1048576 16777216})
mkdir -p "$OUT"
t_start=$(date +%s)
if [ ! -f "$B/build.ninja" ]; then
  backends=cpu; [ "$SEND$RECV" != cpucpu ] && backends=auto
  meson setup "$B" -Dbackends=$backends -Dtransfer=ucx -Dtests=false -Dpython=disabled -Dbuildtype=release \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" tools/kvhal-xfer >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends
t_built=$(date +%s)
{
  echo "# $(date -u +%FT%TZ) $(lscpu | grep 'Model name' | sed 's/  */ /g') nproc=$(nproc)"
  echo "# $(ucx_info -v | head -1) rounds=$ROUNDS window=$WINDOW MiB/size/tool=$MIB send=$SEND recv=$RECV"
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env.txt"
: > "$OUT/raw.txt"
port=$((20000 + RANDOM % 20000))
iters() { local n=$(( MIB * 1048576 / $1 )); [ $n -lt 20 ] && n=20; echo $n; }
perftest() { # tls size [flag [VAR=value...]] -> GB/s (10^9 bytes/s, one direction)
  local tls=$1 size=$2 fl=${3:-}; shift 3 2>/dev/null || shift $#
  port=$((port + 1))
  env "$@" UCX_TLS=$tls timeout 60 ucx_perftest $fl -p $port > /dev/null 2>&1 &
  local srv=$! line
  sleep 0.25
  line=$(env "$@" UCX_TLS=$tls timeout 60 ucx_perftest $fl 127.0.0.1 -p $port -t ucp_am_bw -s "$size" \
         -n "$(iters "$size")" -w 4 -O "$WINDOW" 2>&1 | grep -E "^Final:" || true)
  wait $srv 2>/dev/null
  # "Final:" column 7 is the overall bandwidth in MB/s (2^20 bytes)
  echo "$line" | awk '{ if (NF >= 7) printf "%.3f\n", $7 * 1048576 / 1e9; else print "nan" }'
}
rc=0
kvhal() { # tls size round
  local f="$OUT/kvhal-$1-$2-$3.json"
  "$B"/tools/kvhal-xfer --transport="$1" --sizes="$2" --iters="$(iters "$2")" --window="$WINDOW" \
    --send-device="$SEND" --recv-device="$RECV" --json > "$f" 2> "${f%.json}.err" || { echo "kvhal-xfer $1 $2 round $3 failed"; rc=1; }
  python3 -c 'import json,sys
for x in json.load(open(sys.argv[1])).get("results", []): print("kvhal", sys.argv[2], sys.argv[3], x["gbps"], x["p50_us"], x["p99_us"])' \
    "$f" "$1" "$2" >> "$OUT/raw.txt" 2>/dev/null
}
anchors() { # tls size
  echo "pt $1 $2 $(perftest "$1" "$2" "")" >> "$OUT/raw.txt"
  if [ "$1" = tcp ]; then
    echo "pt_e $1 $2 $(perftest "$1" "$2" -e)" >> "$OUT/raw.txt"
    echo "pt_e_rx256 $1 $2 $(perftest "$1" "$2" -e UCX_TCP_RX_SEG_SIZE=256k)" >> "$OUT/raw.txt"
  fi
}
for r in $(seq 1 "$ROUNDS"); do
  for tls in "${TLS_LIST[@]}"; do
    for s in "${SIZES[@]}"; do
      if [ $((r % 2)) = 1 ]; then kvhal "$tls" "$s" "$r"; anchors "$tls" "$s"; else anchors "$tls" "$s"; kvhal "$tls" "$s" "$r"; fi
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
cat "$OUT/env.txt"
python3 - "$OUT/raw.txt" <<'PY' | tee "$OUT/table.txt"
import collections, statistics, sys
v, lat = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 4 or f[3] == "nan":
        continue
    v[(f[0], f[1], int(f[2]))].append(float(f[3]))
    if f[0] == "kvhal":
        lat[(f[1], int(f[2]))].append((float(f[4]), float(f[5])))
med = lambda k: statistics.median(v[k]) if v.get(k) else float("nan")
print("| transport | batch | kvhal-xfer GB/s (min-max) | perftest / -e / -e rx256 GB/s | of perftest | of -e | of -e rx256 | p50 / p99 us |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for tls, size in sorted({(k[1], k[2]) for k in v if k[0] == "kvhal"}):
    k = med(("kvhal", tls, size)); p, pe, pr = (med((n, tls, size)) for n in ("pt", "pt_e", "pt_e_rx256"))
    l = lat[(tls, size)]
    print(f"| {tls} | {size >> 10} KiB | {k:.2f} ({min(v[('kvhal', tls, size)]):.2f}-{max(v[('kvhal', tls, size)]):.2f}) "
          f"| {p:.2f} / {pe:.2f} / {pr:.2f} | {k / p:.2f} | {k / pe:.2f} | {k / pr:.2f} "
          f"| {statistics.median(a for a, b in l):.0f} / {statistics.median(b for a, b in l):.0f} |")
PY
echo "time: build $((t_built - t_start)) s, measurements $(($(date +%s) - t_built)) s"
exit $rc

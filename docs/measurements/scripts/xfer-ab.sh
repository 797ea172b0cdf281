#!/bin/bash
# Session 7: kvhal-xfer of several builds next to ucx_perftest ucp_am_bw, all in the same run, interleaved
# (each round: for each transport and size, every build, then the anchors), host memory, two processes on one host.
# The kvhal-xfer runs are those of xfer-host.sh (16-token pages of 256 KiB, scattered on both sides, 4 transfers in
# flight, each granted by the decode side first; the last transfer of each size verified); the anchors are
# ucx_perftest -t ucp_am_bw, one contiguous buffer each side, -O 4 like kvhal's window, and over TCP also with -e
# (endpoints with peer-failure handling, as kvhal's TCP endpoints must have).
# Usage: OUT=dir xfer-ab.sh ROUNDS name=builddir[@VAR=value] ...   (VAR=value: in the environment of that build's runs)
# MIB (default 320): MiB per size and tool (at least 20 messages). TLS (default "tcp shm"): the transports.
# PTX (session 10): more TCP anchors, "pt_name=flags[@VAR=value...]" each (flags "-e" or "-"; VAR=value: in the
# environment of both perftest processes), e.g. PTX="pt_e_rx256=-e@UCX_TCP_RX_SEG_SIZE=256k".
set -uo pipefail
ROUNDS=$1
shift
OUT=${OUT:-/tmp/xfer-ab}
MIB=${MIB:-320}
SIZES=(${SIZES:-262144 1048576 4194304 16777216})
TLS_LIST=(${TLS:-tcp shm})
mkdir -p "$OUT"
port=$((20000 + RANDOM % 20000))
{
  echo "# $(date -u +%FT%TZ) $(uname -n) $(lscpu | grep 'Model name' | sed 's/  */ /g')  nproc=$(nproc)"
  echo "# $(ucx_info -v | head -1)  builds: $*  rounds=$ROUNDS MiB/size/tool=$MIB"
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/env.txt"
iters() { local n=$(( MIB * 1048576 / $1 )); [ $n -lt 20 ] && n=20; echo $n; }
perftest() { # tls size [flag [VAR=value...]] -> GB/s (10^9 bytes/s)
  local tls=$1 size=$2 fl=${3:-}
  shift 3 2>/dev/null || shift $#
  [ "$fl" = - ] && fl=
  port=$((port + 1))
  env "$@" UCX_TLS=$tls timeout 60 ucx_perftest $fl -p $port > /dev/null 2>&1 &
  local srv=$!
  sleep 0.25
  local line
  line=$(env "$@" UCX_TLS=$tls timeout 60 ucx_perftest $fl 127.0.0.1 -p $port -t ucp_am_bw -s "$size" -n "$(iters "$size")" -w 4 -O 4 2>&1 | grep -E "^Final:" || true)
  wait $srv 2>/dev/null
  echo "$line" | awk '{ if (NF >= 7) printf "%.3f\n", $7 * 1048576 / 1e9; else print "nan" }'
}
for r in $(seq 1 "$ROUNDS"); do
  for tls in "${TLS_LIST[@]}"; do
    for s in "${SIZES[@]}"; do
      line="$r $tls $s"
      for nb in "$@"; do
        name=${nb%%=*} b=${nb#*=} ev=
        case $b in *@*) ev=${b#*@}; ev=${ev//@/ }; b=${b%%@*} ;; esac
        win=4 # XAB_WINDOW=N among a build's VAR=value (session 10): kvhal-xfer --window N
        case " $ev " in *" XAB_WINDOW="*) win=${ev#*XAB_WINDOW=}; win=${win%% *} ;; esac
        echo "== $name $tls $s round $r" >> "$OUT/err.txt"
        g=$(env $ev timeout 60 "$b"/tools/kvhal-xfer --transport=$tls --sizes=$s --iters "$(iters "$s")" --window $win --json 2>> "$OUT/err.txt" |
            python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.3f" % d["results"][0]["gbps"])' 2>/dev/null || echo nan)
        line="$line $name=$g"
      done
      line="$line pt=$(perftest $tls $s)"
      [ $tls = tcp ] && line="$line pt_e=$(perftest $tls $s -e)"
      if [ $tls = tcp ]; then
        for px in ${PTX:-}; do
          pn=${px%%=*} pv=${px#*=}
          pf=${pv%%@*} pev=
          case $pv in *@*) pev=${pv#*@}; pev=${pev//@/ } ;; esac
          line="$line $pn=$(perftest $tls $s $pf $pev)"
        done
      fi
      echo "$line" | tee -a "$OUT/raw.txt"
    done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/env.txt"
cat "$OUT/env.txt"
python3 - "$OUT/raw.txt" <<'PY'
import sys, statistics, collections
v = collections.defaultdict(list); names = []
for line in open(sys.argv[1]):
    f = line.split(); key = (f[1], int(f[2]))
    for kv in f[3:]:
        k, x = kv.split("=")
        if k not in names: names.append(k)
        if x != "nan": v[(key, k)].append(float(x))
builds = [n for n in names if not n.startswith("pt")]
med = lambda k, n: statistics.median(v[(k, n)]) if v[(k, n)] else float("nan")
print("| transport | batch | " + " | ".join(f"{n} GB/s med (min-max)" for n in names) + " | " +
      " | ".join(f"{b}/pt" for b in builds) + " | " + " | ".join(f"{b}/pt_e" for b in builds) + " |")
print("|" + " --- |" * (2 + len(names) + 2 * len(builds)))
for k in sorted({k for k, _ in v}):
    cells = [f"{med(k, n):.3f} ({min(v[(k, n)], default=float('nan')):.2f}-{max(v[(k, n)], default=float('nan')):.2f})" for n in names]
    r1 = [f"{med(k, b) / med(k, 'pt'):.2f}" for b in builds]
    r2 = [f"{med(k, b) / med(k, 'pt_e'):.2f}" if v[(k, 'pt_e')] else "-" for b in builds]
    print(f"| {k[0]} | {k[1] >> 10} KiB | " + " | ".join(cells) + " | " + " | ".join(r1) + " | " + " | ".join(r2) + " |")
PY

#!/bin/bash
# transfer-ipc.sh: KV transfer between two GPUs of one host on the IPC path, against cudaMemcpyPeer.
#
# What: kvhal-xfer --ipc, a prefill process on cuda:0 sending requests' K/V pages to a decode process on cuda:1
#   (16-token pages of 4 layers x 8 heads x 128 bf16 = 256 KiB, scattered on both sides; batches of 256 KiB, 1, 4
#   and 16 MiB; 4, 16 and 64 transfers in flight; 200 timed transfers each), the receiver copying the pages device
#   to device from the imported sender cache. Two ways of asking: grants (g: the receiver grants pages, the sender
#   sends) and offers (o: --offer, the sender names its pages first). Each round first measures cudaMemcpyPeer of
#   the same bytes between the same GPUs (bench/peer_bw.cu); the variants run in ABBA order (reversed every other
#   round) so that drift over the run does not favour one. Ratio = kvhal-xfer GB/s / cudaMemcpyPeer GB/s, medians.
# Machine: two NVIDIA GPUs with peer access in one host (figures in docs/performance.md: 2 x H100 NVLink), CUDA
#   toolkit (nvcc) and UCX (libucx-dev).
# Run (repository root): bash bench/transfer-ipc.sh
#   B=build dir (default build-bench-xfer), ROUNDS=10, WINDOWS="4 16 64", SEND=cuda:0 RECV=cuda:1, OUT=/tmp/kvhal-ipc,
#   TRANSPORT=shm (the UCX transport of the control messages; tcp works too), SELFTEST=1 (then the IPC self-test).
# Output: $OUT/r/<variant>-w<window>-<round>.json (kvhal-xfer --json), $OUT/r/peer-<round>.txt, and $OUT/ratio.txt:
#   "<KiB> KiB w<window> <g|o> <GB/s> GB/s peer <GB/s> ratio <r> p50 <us> us rounds <n>"
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
B=${B:-build-bench-xfer} ROUNDS=${ROUNDS:-10} WINDOWS=${WINDOWS:-4 16 64} OUT=${OUT:-/tmp/kvhal-ipc}
SEND=${SEND:-cuda:0} RECV=${RECV:-cuda:1} TRANSPORT=${TRANSPORT:-shm}
mkdir -p "$OUT/r"
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dbackends=cpu,cuda -Dtransfer=ucx -Dbuildtype=release -Dpython=disabled > "$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" tools/kvhal-xfer >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
nvcc -O2 -o "$OUT/peer_bw" bench/peer_bw.cu > "$OUT/peer-build.log" 2>&1 || { cat "$OUT/peer-build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends
{ nvidia-smi -L; nvidia-smi topo -m; lscpu | grep 'Model name'; } > "$OUT/machine.txt" 2>&1
rc=0
run() { # variant window round
  local extra=; [ "$1" = o ] && extra=--offer
  timeout 120 "$B"/tools/kvhal-xfer $extra --ipc --send-device="$SEND" --recv-device="$RECV" --transport="$TRANSPORT" \
    --window="$2" --iters=200 --json > "$OUT/r/$1-w$2-$3.json" 2> "$OUT/r/$1-w$2-$3.err" || { echo "$1 w$2 round $3 failed"; rc=1; }
}
for r in $(seq 1 "$ROUNDS"); do
  "$OUT/peer_bw" "${SEND#cuda:}" "${RECV#cuda:}" 200 > "$OUT/r/peer-$r.txt" 2>&1 || rc=1
  for w in $WINDOWS; do
    if [ $((r % 2)) = 1 ]; then run g "$w" "$r"; run o "$w" "$r"; else run o "$w" "$r"; run g "$w" "$r"; fi
  done
done
python3 - "$OUT/r" <<'PY' | tee "$OUT/ratio.txt"
import collections, glob, json, os, re, statistics, sys
d = sys.argv[1]
x, lat, peer = collections.defaultdict(list), collections.defaultdict(list), collections.defaultdict(list)
for f in glob.glob(d + "/*.json"):
    m = re.match(r"(.)-w(\d+)-(\d+)\.json", os.path.basename(f))
    try:
        js = json.load(open(f))
    except ValueError:
        continue
    for e in js.get("results", []):
        k = (int(e["bytes"]) >> 10, int(m.group(2)), m.group(1))
        x[k].append(e["gbps"]); lat[k].append(e.get("p50_us", 0))
for f in glob.glob(d + "/peer-*.txt"):
    for line in open(f):
        s = line.split()
        if s and s[0] == "peer":
            peer[int(s[1]) >> 10].append(float(s[2]))
for k in sorted(x):
    p, g = statistics.median(peer[k[0]]), statistics.median(x[k])
    print(f"{k[0]:6d} KiB w{k[1]:<3d} {k[2]} {g:7.1f} GB/s peer {p:6.1f} ratio {g / p:.3f} "
          f"p50 {statistics.median(lat[k]):.0f} us rounds {len(x[k])}")
PY
if [ "${SELFTEST:-1}" = 1 ]; then
  timeout 120 "$B"/tools/kvhal-xfer --self-test --ipc --send-device="$SEND" --recv-device="$RECV" > "$OUT/self-test.txt" 2>&1 ||
    { echo "IPC self-test failed"; rc=1; }
  tail -3 "$OUT/self-test.txt"
fi
exit $rc

#!/bin/bash
# transfer-ipc.sh: KV transfer between two GPUs of one host on the IPC path, against cudaMemcpyPeer.
#
# What: kvhal-xfer --ipc, a prefill process on cuda:0 sending requests' K/V pages to a decode process on cuda:1
#   (16-token pages of 4 layers x 8 heads x 128 bf16 = 256 KiB, scattered on both sides; batches of 256 KiB, 1 and
#   16 MiB; 4 and 16 transfers in flight; 200 timed transfers each, after as many untimed ones as are in flight),
#   the receiver copying the pages device to device from the imported sender cache. Two ways of asking: grants (g:
#   the receiver grants pages, the sender sends) and offers (o: --offer, the sender names its pages first). Each
#   round first measures cudaMemcpyPeer of the same bytes between the same GPUs (bench/peer_bw.cu); the variants run
#   in ABBA order (reversed every other round) so that drift over the run does not favour one. Ratio = kvhal-xfer
#   GB/s / cudaMemcpyPeer GB/s, medians over the rounds; p50 and p99 are the medians of each round's percentiles.
# Machine: two NVIDIA GPUs with peer access in one host (figures in docs/performance.md), CUDA toolkit (nvcc) and
#   UCX (libucx-dev). With SEND=cpu RECV=cpu it runs the same on any host (the CPU backend's shareable memory: POSIX
#   shared memory, copies by the CPU): GB/s and latencies only, no anchor.
# Run (repository root): bash bench/transfer-ipc.sh   (7 rounds of 4 kvhal-xfer runs and one peer_bw: meant to take
#   about a minute once built, the last line prints the time; the first run builds $B with the CUDA backend, minutes)
#   B=build dir (default build-bench-xfer), ROUNDS=7, WINDOWS="4 16", SIZES="262144 1048576 16777216", ITERS=200,
#   NVCC_ARCH=80,90 (the build's SM architectures; 90 alone builds faster on H100/H200), SEND=cuda:0 RECV=cuda:1,
#   OUT=/tmp/kvhal-ipc, TRANSPORT=shm (the UCX transport of the control messages; tcp works
#   too), SELFTEST=1 (then the IPC self-test). KVHAL_GPU_COPY_BATCH=kernel|engines (docs/guide.md), exported, reaches
#   both processes: the receiver's batched copy by the kernel always, or by the copy engines always (default: the
#   engines only where the ranges average 256 KiB; the pages here are copied in 32 KiB ranges).
# Output: $OUT/r/<variant>-w<window>-<round>.json (kvhal-xfer --json), $OUT/r/peer-<round>.txt, and $OUT/ratio.txt:
#   one row per batch, window and variant: GB/s, cudaMemcpyPeer GB/s, ratio, p50, p99, p99/p50, rounds; then the
#   targets met or missed (ratio >= 0.90 at 1 and 16 MiB, >= 0.80 at 256 KiB with 4 in flight, p99 <= 3 x p50).
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh   # a GPU machine's toolchain outside the system paths, if carried
B=${B:-build-bench-xfer} ROUNDS=${ROUNDS:-7} WINDOWS=${WINDOWS:-4 16} OUT=${OUT:-/tmp/kvhal-ipc}
SIZES=${SIZES:-262144 1048576 16777216} ITERS=${ITERS:-200}
SEND=${SEND:-cuda:0} RECV=${RECV:-cuda:1} TRANSPORT=${TRANSPORT:-shm}
gpu=1; case "$SEND$RECV" in *cpu*) gpu=0 ;; esac
mkdir -p "$OUT/r"
rm -f "$OUT"/r/*.json "$OUT"/r/*.err "$OUT"/r/peer-*.txt
t_start=$(date +%s)
if [ ! -f "$B/build.ninja" ]; then
  backends=cpu; [ $gpu = 1 ] && backends=cpu,cuda
  meson setup "$B" -Dbackends=$backends -Dnvcc_arch="${NVCC_ARCH:-80,90}" -Dtransfer=ucx -Dbuildtype=release \
    -Dpython=disabled -Dtests=false \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" tools/kvhal-xfer >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
if [ $gpu = 1 ]; then
  nvcc -O2 -o "$OUT/peer_bw" bench/peer_bw.cu > "$OUT/peer-build.log" 2>&1 || { cat "$OUT/peer-build.log"; exit 1; }
  { nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
fi
lscpu | grep 'Model name' >> "$OUT/machine.txt" 2>&1
export KVHAL_BACKEND_PATH=$B/backends
t_built=$(date +%s)
sizes_arg=$(echo $SIZES | tr ' ' ,)
rc=0
run() { # variant window round
  local extra=; [ "$1" = o ] && extra=--offer
  timeout 120 "$B"/tools/kvhal-xfer $extra --ipc --send-device="$SEND" --recv-device="$RECV" --transport="$TRANSPORT" \
    --window="$2" --iters="$ITERS" --sizes="$sizes_arg" --json > "$OUT/r/$1-w$2-$3.json" 2> "$OUT/r/$1-w$2-$3.err" ||
    { echo "$1 w$2 round $3 failed: $(tail -1 "$OUT/r/$1-w$2-$3.err")"; rc=1; }
}
for r in $(seq 1 "$ROUNDS"); do
  [ $gpu = 1 ] && { "$OUT/peer_bw" "${SEND#cuda:}" "${RECV#cuda:}" 200 > "$OUT/r/peer-$r.txt" 2>&1 || rc=1; }
  for w in $WINDOWS; do
    if [ $((r % 2)) = 1 ]; then run g "$w" "$r"; run o "$w" "$r"; else run o "$w" "$r"; run g "$w" "$r"; fi
  done
done
python3 - "$OUT/r" <<'PY' | tee "$OUT/ratio.txt"
import collections, glob, json, os, re, statistics, sys
d = sys.argv[1]
x, p50, p99, peer = (collections.defaultdict(list) for _ in range(4))
for f in glob.glob(d + "/*.json"):
    m = re.match(r"(.)-w(\d+)-(\d+)\.json", os.path.basename(f))
    try:
        js = json.load(open(f))
    except ValueError:
        continue
    for e in js.get("results", []):
        k = (int(e["bytes"]) >> 10, int(m.group(2)), m.group(1))
        x[k].append(e["gbps"]); p50[k].append(e["p50_us"]); p99[k].append(e["p99_us"])
for f in glob.glob(d + "/peer-*.txt"):
    for line in open(f):
        s = line.split()
        if s and s[0] == "peer":
            peer[int(s[1]) >> 10].append(float(s[2]))
med = statistics.median
print("| batch | in flight | asked by | GB/s (min-max) | cudaMemcpyPeer GB/s | ratio | p50 us | p99 us | p99/p50 | rounds |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
miss = []
for k in sorted(x):
    g, a, b = med(x[k]), med(p50[k]), med(p99[k])
    pk = med(peer[k[0]]) if peer.get(k[0]) else None
    r = g / pk if pk else None
    who = {"g": "grants", "o": "offers"}[k[2]]
    print(f"| {k[0]} KiB | {k[1]} | {who} | {g:.1f} ({min(x[k]):.1f}-{max(x[k]):.1f}) | "
          f"{f'{pk:.1f}' if pk else '-'} | {f'{r:.3f}' if r else '-'} | {a:.0f} | {b:.0f} | {b / a:.1f} | {len(x[k])} |")
    want = 0.90 if k[0] >= 1024 else 0.80 if k[1] == 4 else None
    if r is not None and want is not None and r < want:
        miss.append(f"{k[0]} KiB w{k[1]} {who}: ratio {r:.2f} < {want:.2f}")
    if b > 3 * a:
        miss.append(f"{k[0]} KiB w{k[1]} {who}: p99 {b:.0f} us > 3 x p50 {a:.0f} us")
print("targets: ratio >= 0.90 at 1 MiB and more, >= 0.80 at 256 KiB with 4 in flight, p99 <= 3 x p50" +
      (" (ratios: GPUs only)" if not peer else ""))
print("missed:\n  " + "\n  ".join(miss) if miss else "all met")
PY
if [ "${SELFTEST:-1}" = 1 ]; then
  timeout 120 "$B"/tools/kvhal-xfer --self-test --ipc --send-device="$SEND" --recv-device="$RECV" > "$OUT/self-test.txt" 2>&1 ||
    { echo "IPC self-test failed"; rc=1; }
  tail -1 "$OUT/self-test.txt"
fi
echo "time: build $((t_built - t_start)) s, measurements and self-test $(($(date +%s) - t_built)) s"
exit $rc

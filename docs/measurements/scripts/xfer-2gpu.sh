#!/bin/bash
# KV transfer between two processes on two GPUs of one host (issue 18), run on a 2-GPU machine by the device tool
# from the repository root with .devdeps carried (UCX added to it by xfer-devdeps.sh). Logs go to $OUT.
#  1. build cpu + cuda + opencl with libkvhal-xfer, in a fresh folder
#  2. the transfer suite: byte-exact transfers between cuda:0 and cuda:1 (and cpu, NVIDIA OpenCL) through UCX,
#     hostile frames, stalled and killed peers, over tcp and shm; kvhal-xfer --self-test
#  3. kvhal-xfer: a decode process on cuda:1 receiving from a prefill process on cuda:0, 16-token pages scattered
#     on both sides, 256 KiB .. 16 MiB batches, content of the last transfer of each size verified, over shm and
#     tcp, next to cudaMemcpyPeer of the same bytes between the same GPUs (xfer_peer_bw.cu) in the same run.
#     Two paths, each row of the table names the one its transfers took (kvhal-xfer's "path"):
#       staged  plain caches: staged through host memory (kvhal_memcpy_d2h / _h2d) and UCX's host transports
#               (Debian's UCX has no CUDA transports; ucx_info -d below records what this UCX has)
#       ipc     --ipc: the prefill cache is cudaMalloc'd (kvhal_paged_cache_create_shareable), its CUDA IPC handle
#               goes to the decode process at connect time, which copies the granted pages itself from cuda:0's
#               memory into its own on cuda:1 (one batched copy kernel per frame, peer to peer), then ACKs.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/xfer-2gpu}
mkdir -p "$OUT"
fail=0
nvidia-smi -L > "$OUT/gpu.txt" 2>&1; nvidia-smi topo -m >> "$OUT/gpu.txt" 2>&1
lscpu | grep 'Model name' >> "$OUT/gpu.txt"
pkg-config --modversion ucx > "$OUT/ucx.txt" 2>&1 || { echo "UCX not found: run xfer-devdeps.sh on the dev machine into .devdeps first"; exit 1; }
ucx_info -d 2>/dev/null | grep -E "Transport|Memory domain" | sort -u >> "$OUT/ucx.txt"
B=/tmp/bx2
rm -rf $B
export NVCC_APPEND_FLAGS=--split-compile=0 # nvcc on every core per file (build ~2x faster)
ROUNDS=${ROUNDS:-3}
meson setup $B -Dbackends=cpu,cuda,opencl -Dtransfer=ucx -Dwerror=true -Dnvcc_arch=90 > "$OUT/build.txt" 2>&1 &&
  ninja -C $B >> "$OUT/build.txt" 2>&1 || { echo BUILD FAILED; tail -40 "$OUT/build.txt"; exit 1; }
$B/tools/kvhal-info > "$OUT/info.txt" 2>&1
meson test -C $B --suite transfer --print-errorlogs --num-processes 1 > "$OUT/tests.txt" 2>&1 || fail=1
grep -E "^(Ok|Fail|Skipped|Timeout)|^#" "$OUT/tests.txt" $B/meson-logs/testlog.txt | head -30
nvcc -O2 -o /tmp/xfer_peer_bw docs/measurements/scripts/xfer_peer_bw.cu > "$OUT/peer-build.txt" 2>&1 || { echo PEER BUILD FAILED; fail=1; }
for r in $(seq 1 $ROUNDS); do
  /tmp/xfer_peer_bw 0 1 40 > "$OUT/peer-$r.txt" 2>&1 || fail=1
  for tls in shm tcp; do
    timeout 120 $B/tools/kvhal-xfer --send-device=cuda:0 --recv-device=cuda:1 --transport=$tls --iters 40 --json \
      > "$OUT/xfer-$tls-$r.json" 2> "$OUT/xfer-$tls-$r.err" || { echo "kvhal-xfer $tls round $r failed"; cat "$OUT/xfer-$tls-$r.err"; fail=1; }
    timeout 120 $B/tools/kvhal-xfer --ipc --send-device=cuda:0 --recv-device=cuda:1 --transport=$tls --iters 40 --json \
      > "$OUT/xfer-ipc-$tls-$r.json" 2> "$OUT/xfer-ipc-$tls-$r.err" || { echo "kvhal-xfer --ipc $tls round $r failed"; cat "$OUT/xfer-ipc-$tls-$r.err"; fail=1; }
  done
  for w in 1 16; do
    timeout 120 $B/tools/kvhal-xfer --ipc --window=$w --send-device=cuda:0 --recv-device=cuda:1 --transport=shm --iters 40 --json \
      > "$OUT/xfer-ipc-w$w-shm-$r.json" 2> "$OUT/xfer-ipc-w$w-shm-$r.err" || { echo "kvhal-xfer --ipc --window=$w round $r failed"; cat "$OUT/xfer-ipc-w$w-shm-$r.err"; fail=1; }
  done
done
# the IPC path's own check: two processes, every byte verified, every request by IPC (cuda:0 -> cuda:1 and on one GPU)
for pair in "cuda:0 cuda:1" "cuda:0 cuda:0"; do
  set -- $pair
  timeout 120 $B/tools/kvhal-xfer --self-test --ipc --send-device=$1 --recv-device=$2 > "$OUT/selftest-ipc-$1-$2.txt" 2>&1 ||
    { echo "kvhal-xfer --self-test --ipc $1 -> $2 failed"; cat "$OUT/selftest-ipc-$1-$2.txt"; fail=1; }
  grep "self-test" "$OUT/selftest-ipc-$1-$2.txt"
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics, collections
out = sys.argv[1]
x = collections.defaultdict(list); p = collections.defaultdict(list); lat = collections.defaultdict(list)
for r in range(1, int(sys.argv[2]) + 1):
    for tls in ("shm", "tcp"):
      for pre in ("", "ipc-", "ipc-w1-", "ipc-w16-"):
        try: d = json.load(open(f"{out}/xfer-{pre}{tls}-{r}.json"))
        except Exception: continue
        for e in d.get("results", []):
            k = (e.get("path", "?"), tls, int(e.get("window", 4)), int(e["bytes"]))
            x[k].append(e["gbps"]); lat[k].append((e["p50_us"], e["p99_us"]))
    try:
        for line in open(f"{out}/peer-{r}.txt"):
            f = line.split()
            if f and f[0] == "peer": p[int(f[1])].append(float(f[2]))
    except Exception: pass
print("| path | transport | window | batch | kvhal-xfer cuda:0 -> cuda:1 GB/s | cudaMemcpyPeer GB/s | ratio | p50 us | p99 us |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for k in sorted(x):
    km = statistics.median(x[k]); pm = statistics.median(p[k[3]]) if p[k[3]] else float("nan")
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3] >> 10} KiB | {km:.3f} | {pm:.3f} | {km / pm:.3f} | {statistics.median(a for a, b in lat[k]):.0f} | {statistics.median(b for a, b in lat[k]):.0f} |")
PY
echo "paths: staged = through host memory (kvhal_memcpy_d2h/h2d) + UCX host transport; ipc = CUDA IPC, the receiver copies peer to peer"
echo "medians of $ROUNDS rounds; target for ipc: ratio >= 0.8 of cudaMemcpyPeer"
exit $fail

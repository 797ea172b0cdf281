#!/bin/bash
# xfer-staged-gpu.sh — issue 18's staged path (a GPU cache through host memory and UCX) on one GPU, A/B.
# Two processes, prefill on cuda:0 and decode on cuda:0 (plain caches: no IPC, so pages go GPU -> host staging ->
# UCX (shm or tcp) -> host staging -> GPU), kvhal-xfer's default batches (256 KiB to 16 MiB of 16-token pages,
# window 4), ROUNDS interleaved rounds of builds A and B. Also kvhal-xfer --self-test with both sides on cuda:0
# (every byte verified) and the transfer suite (tcp, shm) under build B.
# Usage (from the device's checkout, .devdeps carried): OUT=dir bash xfer-staged-gpu.sh A_TREE B_TREE [ROUNDS]
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
OUT=${OUT:-/tmp/xfer-staged}
A_TREE=$1; B_TREE=$2; ROUNDS=${3:-3}
mkdir -p "$OUT"
fail=0
nvidia-smi -L > "$OUT/gpu.txt" 2>&1; lscpu | grep 'Model name' >> "$OUT/gpu.txt"
for v in A B; do
  tree=$A_TREE; [ $v = B ] && tree=$B_TREE
  b=/tmp/xs-$v; rm -rf $b
  (cd "$tree" && meson setup $b -Dbackends=cpu,cuda -Dtransfer=ucx -Dwerror=true -Dnvcc_arch=90 &&
     ninja -C $b -j16 tools/kvhal-xfer backends/cuda/libkvhal-cuda.so tests/test_xfer) > "$OUT/build-$v.txt" 2>&1 ||
    { echo "BUILD $v FAILED"; tail -30 "$OUT/build-$v.txt"; exit 1; }
done
KVHAL_BACKEND_PATH=/tmp/xs-B/backends timeout 120 /tmp/xs-B/tools/kvhal-xfer --self-test --send-device=cuda:0 \
  --recv-device=cuda:0 > "$OUT/selftest-B.txt" 2>&1 || { echo "self-test B failed"; fail=1; }
cat "$OUT/selftest-B.txt"
for tls in tcp shm; do # the transfer suite under B: staged cuda transfers (part-of-the-layers frames), IPC, faults
  TRANSFER_TLS=$tls KVHAL_BACKEND_PATH=/tmp/xs-B/backends timeout 300 /tmp/xs-B/tests/test_xfer > "$OUT/test_xfer-B-$tls.txt" 2>&1 ||
    { echo "test_xfer B $tls failed"; fail=1; }
  grep -E "^# |PASSED|FAILED" "$OUT/test_xfer-B-$tls.txt" | head -20
done
for r in $(seq 1 "$ROUNDS"); do
  for v in A B; do
    for tls in shm tcp; do
      KVHAL_BACKEND_PATH=/tmp/xs-$v/backends timeout 120 /tmp/xs-$v/tools/kvhal-xfer --send-device=cuda:0 \
        --recv-device=cuda:0 --transport=$tls --iters 40 --json > "$OUT/x-$v-$tls-$r.json" 2> "$OUT/x-$v-$tls-$r.err" ||
        { echo "kvhal-xfer $v $tls round $r failed"; tail -5 "$OUT/x-$v-$tls-$r.err"; fail=1; }
    done
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics, collections
out, rounds = sys.argv[1], int(sys.argv[2])
g = collections.defaultdict(list); p50 = collections.defaultdict(list); path = {}
for r in range(1, rounds + 1):
    for v in "AB":
        for tls in ("shm", "tcp"):
            try: d = json.load(open(f"{out}/x-{v}-{tls}-{r}.json"))
            except Exception: continue
            for e in d.get("results", []):
                k = (tls, int(e["bytes"]), v)
                g[k].append(e["gbps"]); p50[k].append(e["p50_us"]); path[k] = e.get("path", "?")
print("| transport | batch | A GB/s | B GB/s | B/A | A p50 us | B p50 us | path |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for tls, by in sorted({(k[0], k[1]) for k in g}):
    a, b = g.get((tls, by, "A"), []), g.get((tls, by, "B"), [])
    if not a or not b: continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {tls} | {by >> 10} KiB | {ma:.3f} | {mb:.3f} | {mb / ma:.2f} | {statistics.median(p50[(tls, by, 'A')]):.0f} | "
          f"{statistics.median(p50[(tls, by, 'B')]):.0f} | {path.get((tls, by, 'B'), '?')} |")
print(f"medians of {rounds} interleaved rounds; A and B: the builds given")
PY
exit $fail

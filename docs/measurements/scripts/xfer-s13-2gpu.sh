#!/bin/bash
# Session 13, issue 18: offers (kvhal_xfer_offer_pages) on the CUDA IPC path on two GPUs, run by the device tool on a
# 2-GPU machine from the repository root with .devdeps (UCX added) and .base.tar (`git archive <base>`) carried.
# As xfer-s12-2gpu.sh, with a third build per round: this tree's kvhal-xfer with --offer ("offer": the prefill
# offers every request's pages ahead, the decode side's receives take them without a grant).
#  1. builds this tree (cpu + cuda, UCX, tests) and, beside it, the base's libkvhal-xfer and kvhal-xfer (cpu only:
#     its runs load this tree's CUDA module through KVHAL_BACKEND_PATH; the core and the module did not change);
#  2. kvhal-xfer --ipc cuda:0 -> cuda:1 over shm, 256 KiB .. 16 MiB batches of 16-token pages, windows 4 and 16 (WINDOWS),
#     base and this tree (and the experiment knobs of the call's tree, if any: VARIANTS="name=ENV@ENV"), interleaved
#     per round with cudaMemcpyPeer of the same bytes between the same GPUs (xfer_peer_bw.cu);
#  3. this tree's transfer suite (cuda:0 and cuda:1 caches, staged and IPC between processes) and the IPC self-tests.
# Session 14 added: BUILD=0 keeps the builds a warm machine has already, DEADLINE=s starts no round after s seconds
# (the results so far are tabled); session 14's calls ran it with WINDOWS="4 16 64" or "16 64".
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NVCC_APPEND_FLAGS=--split-compile=0
OUT=${OUT:-/tmp/xs13}; W=/tmp/xs13w; T0=$(date +%s); mkdir -p "$OUT" "$W/base"
S=docs/measurements/scripts
{ nvidia-smi -L; nvidia-smi topo -m; lscpu | grep 'Model name'; } > "$OUT/machine.txt" 2>&1
if [ "${BUILD:-1}" = 1 ]; then
rm -rf "$W/base" "$W/b-new" "$W/b-base"; mkdir -p "$W/base"
tar -xf .base.tar -C "$W/base"
( meson setup "$W/b-new" -Dbackends=cpu,cuda -Dtransfer=ucx -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled && ninja -C "$W/b-new" ) > "$OUT/build-new.log" 2>&1 &
( cd "$W/base" && meson setup "$W/b-base" -Dbackends=cpu -Dtransfer=ucx -Dtests=false -Dexamples=false -Dpython=disabled && ninja -C "$W/b-base" tools/kvhal-xfer ) > "$OUT/build-base.log" 2>&1 &
nvcc -O2 -o "$W/peer_bw" $S/xfer_peer_bw.cu > "$OUT/peer-build.log" 2>&1 &
wait
fi
tail -n 2 "$OUT/build-new.log" "$OUT/build-base.log" "$OUT/peer-build.log"
N=$W/b-new B=$W/b-base
[ -x $N/tools/kvhal-xfer ] && [ -x $B/tools/kvhal-xfer ] || { echo BUILD FAILED; tail -30 "$OUT/build-new.log" "$OUT/build-base.log"; exit 1; }
ROUNDS=${ROUNDS:-3} ITERS=${ITERS:-200}
run() { # name window env...  (base runs get this tree's CUDA module)
  local name=$1 w=$2; shift 2
  local bin=$N/tools/kvhal-xfer; [ "${name%%_*}" = base ] && bin="env KVHAL_BACKEND_PATH=$N/backends/cuda $B/tools/kvhal-xfer"
  local extra=; [ "${name%%_*}" = offer ] && extra=--offer  # offer, offer_<variant>
  env "$@" timeout 120 $bin $extra --ipc --send-device=cuda:0 --recv-device=cuda:1 --transport=shm --window=$w \
    --iters=$ITERS --json > "$OUT/r/$name-w$w-$r.json" 2> "$OUT/r/$name-w$w-$r.err" || echo "$name w$w round $r failed: $(tail -2 "$OUT/r/$name-w$w-$r.err")"
}
mkdir -p "$OUT/r"
for r in $(seq 1 $ROUNDS); do
  [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) - T0 )) -gt $DEADLINE ] && { echo "stopped before round $r (deadline)"; break; }
  "$W/peer_bw" 0 1 $ITERS > "$OUT/r/peer-$r.txt" 2>&1
  for w in ${WINDOWS:-4 16}; do
    run base $w; run new $w; run offer $w
    for v in ${VARIANTS:-}; do n=${v%%=*}; e=${v#*=}; run $n $w ${e//@/ }; done
  done
done
python3 - "$OUT/r" <<'PY'
import json, sys, glob, statistics, collections, re, os
d = sys.argv[1]; x = collections.defaultdict(list); lat = collections.defaultdict(list); peer = collections.defaultdict(list); paths = collections.defaultdict(set)
for f in glob.glob(d + "/*.json"):
    m = re.match(r"(.*)-w(\d+)-(\d+)\.json", os.path.basename(f))
    try: js = json.load(open(f))
    except Exception: continue
    for e in js.get("results", []):
        k = (int(e["bytes"]), int(m.group(2)), m.group(1)); x[k].append(e["gbps"]); lat[k].append(e["p50_us"]); paths[k].add(e.get("path", "?"))
for f in glob.glob(d + "/peer-*.txt"):
    for line in open(f):
        s = line.split()
        if s and s[0] == "peer": peer[int(s[1])].append(float(s[2]))
print("| batch | window | build | kvhal-xfer GB/s (median) | cudaMemcpyPeer GB/s | ratio | p50 us | rounds | path |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for k in sorted(x):
    g = statistics.median(x[k]); p = statistics.median(peer[k[0]]) if peer[k[0]] else float("nan")
    print(f"| {k[0] >> 10} KiB | {k[1]} | {k[2]} | {g:.1f} | {p:.1f} | {g / p:.3f} | {statistics.median(lat[k]):.0f} | {len(x[k])} | {','.join(sorted(paths[k]))} |")
PY
[ "${SUITES:-1}" = 1 ] && {
  timeout 300 meson test -C $N --suite transfer --print-errorlogs --num-processes 1 > "$OUT/tests.txt" 2>&1; echo "transfer suite rc $?"
  grep -E "^(Ok|Fail|Skipped|Timeout):" "$OUT/tests.txt"; grep -hE "^# .*(cuda|IPC)" $N/meson-logs/testlog.txt | sort | uniq -c | head -20
  for pair in "cuda:0 cuda:1" "cuda:0 cuda:0"; do set -- $pair
    timeout 120 $N/tools/kvhal-xfer --self-test --ipc --send-device=$1 --recv-device=$2 2>&1 | grep -E "self-test|error"; done
  cp $N/meson-logs/testlog.txt "$OUT/testlog.txt"
}
cd "$OUT" && tar -czf runs.tgz r *.log testlog.txt 2>/dev/null; rm -rf r

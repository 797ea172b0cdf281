#!/bin/bash
# Session 15, issue 18: device events and chained launch groups on the CUDA IPC path, run by the device tool on a
# 2-GPU machine from the repository root with .devdeps carried.
#  1. builds this tree (cpu + cuda + opencl, UCX, tests, -Dwerror=true) and cudaMemcpyPeer's bandwidth probe;
#  2. the conformance suite on cuda:0 and cuda:1 (events among the device tests) and on NVIDIA's OpenCL if present;
#  3. ABBA rounds (xfer-s14-ab.sh's order: reversed every other round) of kvhal-xfer --ipc cuda:0 -> cuda:1 over shm,
#     one build, KVHAL_XFER_IPC_CHAIN_KIB=0 (no chaining: session 14's committed behaviour) against chaining, grants
#     (g) and offers (o), WINDOWS (default 4 16 64), until DEADLINE seconds from the start. Call 1 ran the knob as
#     KVHAL_XFER_IPC_CHAIN=1 (chain from one chunk waiting, any size: =1048576 KiB here); VARS picks others;
#  SUITES=0 skips steps 2 and 4.
#  4. the transfer suite (cuda:0 / cuda:1 caches, staged and IPC between processes) and the IPC self-tests.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH NVCC_APPEND_FLAGS=--split-compile=0
OUT=${OUT:-/tmp/xs15}; W=/tmp/xs15w; T0=$(date +%s); mkdir -p "$OUT/r" "$W"
S=docs/measurements/scripts N=$W/b
{ nvidia-smi -L; nvidia-smi topo -m; lscpu | grep 'Model name'; } > "$OUT/machine.txt" 2>&1
# a warm machine keeps the build folder: ninja rebuilds what changed
( { [ -f $N/build.ninja ] || meson setup $N -Dbackends=cpu,cuda,opencl -Dtransfer=ucx -Dwerror=true -Dnvcc_arch=90 -Dpython=disabled; } && ninja -C $N ) > "$OUT/build.log" 2>&1 &
nvcc -O2 -o "$W/peer_bw" $S/xfer_peer_bw.cu > "$OUT/peer-build.log" 2>&1 &
wait
tail -n 1 "$OUT/build.log"; echo "build $(( $(date +%s) - T0 )) s"
[ -x $N/tools/kvhal-xfer ] || { echo BUILD FAILED; tail -40 "$OUT/build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$N/backends
[ "${SUITES:-1}" = 1 ] && for d in cuda:0 cuda:1 opencl:0; do
  KVHAL_TEST_DEVICE=$d timeout 120 $N/tests/test_conformance > "$OUT/conf-$d.txt" 2>&1; echo "conformance $d rc $?"
  grep -E "events|PASSED|FAILED|device  " "$OUT/conf-$d.txt" | grep -v SKIPPED | head -6
done
VARS=${VARS:-"g0=KVHAL_XFER_IPC_CHAIN_KIB=0 g1=KVHAL_XFER_IPC_CHAIN_KIB=1048576 o0=KVHAL_XFER_IPC_CHAIN_KIB=0 o1=KVHAL_XFER_IPC_CHAIN_KIB=1048576"}
run() { local v=$1 w=$2 extra=; local name=${v%%=*} e=${v#*=}; [ "${name#o}" != "$name" ] && extra=--offer
  [ "$e" = - ] && e=; e=${e//@/ }
  env $e timeout 60 $N/tools/kvhal-xfer $extra --ipc --send-device=cuda:0 --recv-device=cuda:1 --transport=shm \
    --window=$w --iters=200 --json > $OUT/r/$name-w$w-$r.json 2>$OUT/r/$name-w$w-$r.err || echo "$name $w $r failed"; }
REV=$(echo $VARS | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq 1 ${ROUNDS:-16}); do
  [ $(( $(date +%s) - T0 )) -gt ${DEADLINE:-330} ] && { echo "stopped before round $r"; break; }
  $W/peer_bw 0 1 200 > $OUT/r/peer-$r.txt 2>&1
  for w in ${WINDOWS:-4 16 64}; do
    if [ $((r % 2)) = 1 ]; then for v in $VARS; do run $v $w; done; else for v in $REV; do run $v $w; done; fi
  done
done
python3 - $OUT/r <<'PY' | tee $OUT/ab.txt
import json,glob,sys,re,os,collections,statistics
d=sys.argv[1]; x=collections.defaultdict(list); peer=collections.defaultdict(list); lat=collections.defaultdict(list)
for f in glob.glob(d+"/*.json"):
    m=re.match(r"(.*)-w(\d+)-(\d+)\.json",os.path.basename(f))
    try: js=json.load(open(f))
    except Exception: continue
    for e in js.get("results",[]):
        k=(int(e["bytes"])>>10,int(m.group(2)),m.group(1)); x[k].append(e["gbps"]); lat[k].append(e.get("p50_us",0))
for f in glob.glob(d+"/peer-*.txt"):
    for l in open(f):
        s=l.split()
        if s and s[0]=="peer": peer[int(s[1])>>10].append(float(s[2]))
for k in sorted(x):
    p=statistics.median(peer[k[0]]); g=statistics.median(x[k])
    print(f"{k[0]:6d} KiB w{k[1]:<3d} {k[2]} {g:7.1f} GB/s peer {p:6.1f} ratio {g/p:.3f} p50 {statistics.median(lat[k]):.0f} us rounds {len(x[k])}")
PY
echo "bench done $(( $(date +%s) - T0 )) s"
[ "${SUITES:-1}" = 1 ] || { cd "$OUT" && tar -czf runs.tgz r && rm -rf r; exit 0; }
timeout ${SUITE_S:-170} meson test -C $N --suite transfer --print-errorlogs --num-processes 2 > "$OUT/tests.txt" 2>&1; echo "transfer suite rc $?"
grep -E "^(Ok|Fail|Skipped|Timeout):" "$OUT/tests.txt"; grep -hE "^# .*(cuda|IPC|chain)" $N/meson-logs/testlog.txt | sort | uniq -c | head -20
for pair in "cuda:0 cuda:1" "cuda:0 cuda:0"; do set -- $pair
  timeout 60 $N/tools/kvhal-xfer --self-test --ipc --send-device=$1 --recv-device=$2 2>&1 | grep -E "self-test|error"; done
cp $N/meson-logs/testlog.txt "$OUT/testlog.txt" 2>/dev/null
echo "all done $(( $(date +%s) - T0 )) s"
cd "$OUT" && tar -czf runs.tgz r conf-*.txt testlog.txt tests.txt 2>/dev/null; rm -rf r conf-*.txt testlog.txt

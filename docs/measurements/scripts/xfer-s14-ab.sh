# ABBA rounds of one build: variants set by the environment, run in one order on odd rounds and reversed on even ones.
# VARS: name=ENV@ENV ... (a name starting with "o" runs --offer; "-" for no variable); the default is call 5's: the
# event rule 0 (KVHAL_DIAG_EVRULE0 set: session 13's committed rule) against rule 1, grants (g) and offers (o), which
# needs docs/measurements/session14/diag/evrule0-env.patch applied to the tree; call 6's chained launch groups
# (KVHAL_DIAG_IPC_CHAIN) need diag/ipc-chain.patch. WINDOWS (default 16 64), ROUNDS (16), DEADLINE (270 s).
# Run by the device tool on a 2-GPU machine from the repository root with .devdeps carried.
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH NVCC_APPEND_FLAGS=--split-compile=0
W=/tmp/xab; mkdir -p $W $OUT/r
( meson setup $W/b -Dbackends=cpu,cuda -Dtransfer=ucx -Dnvcc_arch=90 -Dpython=disabled -Dtests=false && ninja -C $W/b tools/kvhal-xfer backends/cuda/libkvhal-cuda.so ) > $OUT/build.log 2>&1 &
nvcc -O2 -o $W/peer_bw docs/measurements/scripts/xfer_peer_bw.cu > $OUT/peer-build.log 2>&1 &
wait; tail -1 $OUT/build.log
T0=$(date +%s)
VARS=${VARS:-"g0=KVHAL_DIAG_EVRULE0=1 g1=- o0=KVHAL_DIAG_EVRULE0=1 o1=-"}
run() { local v=$1 w=$2 extra=; local name=${v%%=*} e=${v#*=}; [ "${name#o}" != "$name" ] && extra=--offer
  [ "$e" = - ] && e=; e=${e//@/ }
  env $e timeout 60 $W/b/tools/kvhal-xfer $extra --ipc --send-device=cuda:0 --recv-device=cuda:1 --transport=shm --window=$w --iters=200 --json > $OUT/r/$name-w$w-$r.json 2>$OUT/r/$name-w$w-$r.err || echo "$name $w $r failed"; }
REV=$(echo $VARS | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq 1 ${ROUNDS:-16}); do
  [ $(( $(date +%s) - T0 )) -gt ${DEADLINE:-270} ] && { echo "stopped before round $r"; break; }
  $W/peer_bw 0 1 200 > $OUT/r/peer-$r.txt 2>&1
  for w in ${WINDOWS:-16 64}; do
    if [ $((r % 2)) = 1 ]; then for v in $VARS; do run $v $w; done; else for v in $REV; do run $v $w; done; fi
  done
done
python3 - $OUT/r <<'PY'
import json,glob,sys,re,os,collections,statistics
d=sys.argv[1]; x=collections.defaultdict(list); peer=collections.defaultdict(list)
for f in glob.glob(d+"/*.json"):
    m=re.match(r"(.*)-w(\d+)-(\d+)\.json",os.path.basename(f))
    try: js=json.load(open(f))
    except Exception: continue
    for e in js.get("results",[]): x[(int(e["bytes"])>>10,int(m.group(2)),m.group(1))].append(e["gbps"])
for f in glob.glob(d+"/peer-*.txt"):
    for l in open(f):
        s=l.split()
        if s and s[0]=="peer": peer[int(s[1])>>10].append(float(s[2]))
for k in sorted(x):
    p=statistics.median(peer[k[0]]); g=statistics.median(x[k])
    print(f"{k[0]:6d} KiB w{k[1]:<3d} {k[2]} {g:7.1f} GB/s ratio {g/p:.3f} rounds {len(x[k])}")
PY
cd $OUT && tar -czf runs.tgz r && rm -rf r

# staged path (plain device caches, not shareable) cuda:0 -> cuda:1 over shm: the event rule 0 (session 13's) against 1
N=/tmp/xs13w/b-new
for r in 1 2 3; do for rule in 0 1; do
  KVHAL_DIAG_EVRULE=$rule timeout 100 $N/tools/kvhal-xfer --send-device=cuda:0 --recv-device=cuda:1 --transport=shm --window=16 --iters=60 --json > $OUT/staged-$rule-$r.json 2>$OUT/staged-$rule-$r.err || echo "staged $rule $r failed"
done; done
python3 - $OUT <<'PY'
import json,glob,sys,collections,statistics,os
x=collections.defaultdict(list)
for f in glob.glob(sys.argv[1]+"/staged-*.json"):
    rule=os.path.basename(f).split("-")[1]
    try: js=json.load(open(f))
    except Exception: continue
    for e in js.get("results",[]): x[(int(e["bytes"]),rule)].append(e["gbps"])
for k in sorted(x): print("staged w16", k[0]>>10, "KiB rule", k[1], "GB/s median %.2f" % statistics.median(x[k]), ["%.2f"%v for v in x[k]], e.get("path","?"))
PY

#!/bin/bash
# Session 3 device run: build (cpu, cuda, opencl, release), full test suite, kvhal-replay end to end on cuda:0
# (default and llama3-8b under eviction), the soak on cuda:0, and the radix benchmark (--no-kv) on the host Xeon:
# page size 1 (cache_finished_suffix, the default), page size 1 --finish-whole, page size 16, four rounds.
cd "$(dirname "$0")/.."
source .devdeps/env.sh
B=/tmp/b; rm -rf $B
t0=$(date +%s)
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"; } > $OUT/info.txt 2>&1
meson setup $B -Dbackends=cpu,cuda,opencl -Dbuildtype=release > $OUT/build.log 2>&1 && ninja -C $B -j16 >> $OUT/build.log 2>&1 || { tail -60 $OUT/build.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
$B/tools/kvhal-info >> $OUT/info.txt 2>&1; cat $OUT/info.txt
timeout 240 meson test -C $B --print-errorlogs --num-processes 8 > $OUT/test.log 2>&1; echo "meson test rc=$?"
grep -E "^ *[0-9]+/[0-9]+ " $OUT/test.log; grep -E "^(Ok|Fail|Skipped|Timeout|Expected Fail):" $OUT/test.log
grep -hE "^\[  (PASSED|FAILED|SKIPPED) \]" $B/meson-logs/testlog.txt | sort | uniq -c
KVHAL_DEVICE=cuda:0 timeout 60 $B/tools/kvhal-replay > $OUT/replay.txt 2>&1; echo "replay cuda default rc=$?"
KVHAL_DEVICE=cuda:0 timeout 90 $B/tools/kvhal-replay --model llama3-8b --kv-budget 2GiB --groups 8 --prompts 8 >> $OUT/replay.txt 2>&1; echo "replay cuda llama3-8b rc=$?"
KVHAL_DEVICE=cuda:0 timeout 120 $B/tools/kvhal-replay --soak --quiet >> $OUT/replay.txt 2>&1; echo "soak cuda rc=$?"
grep -vE "^kvhal-replay: [0-9]+%" $OUT/replay.txt | tail -40
for i in 1 2 3 4; do
  for v in "ps1 --page-size 1" "ps1-whole --page-size 1 --finish-whole" "ps16 --page-size 16"; do
    set -- $v; name=$1; shift
    echo "$name $($B/tools/kvhal-replay --no-kv --repeat 20 --quiet --json "$@")"
  done
done > $OUT/radix.txt
python3 - $OUT/radix.txt <<'PY'
import json,sys,statistics as st
rows={}
for l in open(sys.argv[1]):
    k,j=l.split(' ',1); d=json.loads(j); rows.setdefault(k,[]).append(d)
for k,v in rows.items():
    r=[d['requests_per_s'] for d in v]
    print(k,'requests/s min %.0f median %.0f max %.0f; best pass %.0f-%.0f; match %.2f-%.2f us; finish %.2f-%.2f us; evict(4096) %.1f-%.1f us; ok %s'%(min(r),st.median(r),max(r),min(d['requests_per_s_best_pass'] for d in v),max(d['requests_per_s_best_pass'] for d in v),min(d['match_us'] for d in v),max(d['match_us'] for d in v),min(d['insert_us'] for d in v),max(d['insert_us'] for d in v),min(d['evict_4096_us'] for d in v),max(d['evict_4096_us'] for d in v),all(d['ok'] for d in v)))
PY
echo "total: $(( $(date +%s) - t0 )) s"

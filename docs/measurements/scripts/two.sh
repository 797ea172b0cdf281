#!/bin/bash
# 2-GPU run: every suite with two CUDA devices (conformance on cuda:0 and cuda:1, peer copies, the contiguous cache
# over {0,1}), and kvhal-info.
cd "$(dirname "$0")/.."
source .devdeps/env.sh
B=/tmp/b2; rm -rf $B
{ nvidia-smi -L; nvidia-smi topo -m; } > $OUT/info.txt 2>&1
meson setup $B -Dbackends=cpu,cuda -Dbuildtype=release -Dnvcc_arch=90 > $OUT/build.log 2>&1 && ninja -C $B >> $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
$B/tools/kvhal-info >> $OUT/info.txt 2>&1; cat $OUT/info.txt
timeout 240 meson test -C $B --print-errorlogs --num-processes 8 > $OUT/test.log 2>&1; echo "meson test rc=$?"
grep -E "^ *[0-9]+/[0-9]+ |^(Ok|Fail|Skipped|Expected Fail|Timeout):" $OUT/test.log
grep -hE "cuda:1|peer|multi_device" $B/meson-logs/testlog.txt | grep -E "OK|PASSED|SKIPPED|FAILED|device" | sort | uniq -c | head -20
KVHAL_DEVICE=cuda:1 timeout 60 $B/tools/kvhal-bench --op paged_caching --preset llama3-8b --tokens 8192 | tail -4

source .devdeps/env.sh; export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH NVCC_APPEND_FLAGS=--split-compile=0
B=/tmp/bt; (meson setup $B -Dbackends=cpu,cuda -Dtransfer=ucx -Dtests=false -Dexamples=false -Dnvcc_arch=90 -Dpython=disabled && ninja -C $B) > $OUT/build.log 2>&1 || { tail $OUT/build.log; exit 1; }
for sz in 256KiB 1MiB 16MiB; do for w in 1 4 64; do for m in new offer; do
  x=; [ $m = offer ] && x=--offer
  KVHAL_XFER_X_TRACE=1 timeout 60 $B/tools/kvhal-xfer $x --ipc --send-device=cuda:0 --recv-device=cuda:1 --transport=shm --window=$w --iters=400 --sizes=$sz --json > $OUT/$m-$sz-$w.json 2> $OUT/$m-$sz-$w.err
  python3 -c "
import json,sys; e=json.load(open('$OUT/$m-$sz-$w.json'))['results'][0]; print('$m $sz w$w', round(e['gbps'],1), 'GB/s p10/50/90/max', e['p10_us'], e['p50_us'], e['p90_us'], e['max_us'])" 2>&1 | tail -1
  grep trace $OUT/$m-$sz-$w.err | sed 's/^/   /'
done; done; done

# Session 13 diagnosis (not a benchmark): which transfers of kvhal-xfer --offer with 64 in flight take milliseconds
source .devdeps/env.sh; export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH NVCC_APPEND_FLAGS=--split-compile=0
B=/tmp/bt; (meson setup $B -Dbackends=cpu,cuda -Dtransfer=ucx -Dtests=false -Dexamples=false -Dnvcc_arch=90 -Dpython=disabled && ninja -C $B) > $OUT/build.log 2>&1 || { tail $OUT/build.log; exit 1; }
X="$B/tools/kvhal-xfer --ipc --send-device=cuda:0 --recv-device=cuda:1 --transport=shm --iters=200"
for cfg in "--offer --window=64 --sizes=4MiB" "--offer --window=64 --sizes=256KiB,4MiB" "--window=64 --sizes=256KiB,4MiB" "--offer --window=16 --sizes=256KiB,4MiB"; do
 for ah in 256 128; do
  echo "== $cfg ahead $ah"; KVHAL_XFER_X_AHEAD=$ah KVHAL_XFER_X_SLOW=1 timeout 60 $X $cfg > $OUT/o.txt 2> $OUT/e.txt; grep -E "GB/s" $OUT/o.txt
  echo "slow: $(grep -c slow $OUT/e.txt)"; grep slow $OUT/e.txt | head -4; grep slow $OUT/e.txt | tail -2; grep -v slow $OUT/e.txt | head -3
 done
done

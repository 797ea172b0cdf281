#!/bin/bash
# A/B of the Python binding's host time per paged_caching call on the GPU machine: the binding of the tree this
# runs in (NEW, default: the repository root) against another tree's python/kvhal/_kvhal.c (OLD) compiled against
# the same libkvhal, bench_host.py alternated OLD/NEW ROUNDS times on cuda:0 and on cpu:0; then NEW's Python tests
# on CUDA tensors. Run from the repository root the device copies; carry .devdeps (and the NEW tree if it is a
# carried folder: NEW=.wt-p). Each bench process is pinned to one core (CPU, default 5): unpinned, the C call itself moved
# 3.2-4.5 us between processes. Logs under $OUT.
set -uo pipefail
: "${OUT:?set OUT}"
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export PYTHONPATH=$PWD/.devdeps/root/usr/lib/python3/dist-packages
NEW=${NEW:-.} OLD=${OLD:-.} ROUNDS=${ROUNDS:-4}
B=/tmp/bpy
(cd "$NEW" && { [ -f $B/build.ninja ] || meson setup $B -Dbackends=cpu,cuda -Dnvcc_arch=90 -Dpython=enabled -Dbuildtype=release \
   -Dtools=false -Dexamples=false; } && ninja -C $B -j16) > "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
PYINC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
EXT=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
rm -rf /tmp/oldpy && mkdir -p /tmp/oldpy/kvhal && cp $B/python/kvhal/__init__.py /tmp/oldpy/kvhal/
cc -O3 -std=c11 -fPIC -shared -fvisibility=hidden -DNDEBUG -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -I"$OLD/python/kvhal" \
  -I"$OLD/api" -I"$PYINC" "$OLD/python/kvhal/_kvhal.c" -L$B/core -lkvhal -Wl,-rpath,$B/core -o /tmp/oldpy/kvhal/_kvhal$EXT \
  > "$OUT/build-old.txt" 2>&1 || { cat "$OUT/build-old.txt"; exit 1; }
export LD_LIBRARY_PATH=$B/core:$LD_LIBRARY_PATH
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; uptime; } > "$OUT/machine.txt" 2>&1; cat "$OUT/machine.txt"
for dev in cuda:0 cpu:0; do
  for r in $(seq 1 "$ROUNDS"); do
    for which in old new; do
      pp=$B/python; [ $which = old ] && pp=/tmp/oldpy
      PYTHONPATH=$pp:$B/python/tests:$PYTHONPATH taskset -c ${CPU:-5} python3 "$NEW/python/bench/bench_host.py" --device $dev --json \
        > "$OUT/host-${dev/:/}-$which-$r.json" 2>&1
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], 'torch-C %.0f ns (fastest round %.0f), views-C %.0f, c_call %.0f, path %s' % (d['python_minus_c_ns'], d['fastest_round_ns']['python_torch_ns']-d['fastest_round_ns']['c_call_ns'], d['python_views_minus_c_ns'], d['c_call_ns'], d['dlpack_path']))" \
        "$OUT/host-${dev/:/}-$which-$r.json" $dev $which || tail -5 "$OUT/host-${dev/:/}-$which-$r.json"
    done
  done
done
export PYTHONPATH=$B/python:$B/python/tests:$PYTHONPATH
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 120 python3 -m pytest -q -p no:cacheprovider "$NEW/python/tests" > "$OUT/pytest.txt" 2>&1; tail -2 "$OUT/pytest.txt"
timeout 120 python3 "$NEW/python/tests/test_gpu_torch.py" > "$OUT/test_gpu_torch.txt" 2>&1; echo "test_gpu_torch rc=$?"; tail -2 "$OUT/test_gpu_torch.txt"

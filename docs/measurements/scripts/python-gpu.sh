#!/bin/bash
# Issue 14 on one GPU (H100): build in a fresh folder with the Python package (the machine's /opt/torch venv
# Python), run the cuda suites, the Python package's tests on cuda (CUDA tensors from the machine's PyTorch), the C
# graph-capture check (first kvhal call inside cudaStreamBeginCapture, 32 layers, replays with new slots bit-exact,
# current device kept, legacy and per-thread streams), the torch.cuda.graph example (first kvhal call inside the
# capture), and the host time per call from Python against kvhal-bench's. Logs in $OUT; exit non-zero on failure.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
fail=0
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
B=/tmp/bpy
# werror off here: the venv's Python headers are not the ones CI builds against (CI here builds with -Dwerror=true)
meson setup $B -Dbackends=cpu,cuda,opencl -Dnvcc_arch=90 -Dpython=enabled > "$OUT/build.txt" 2>&1 && ninja -C $B >> "$OUT/build.txt" 2>&1 ||
  { echo BUILD FAILED; tail -40 "$OUT/build.txt"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends PYTHONPATH=$B/python
# the suites this change touches (cuda, OpenCL on NVIDIA, PoCL): buffers and streams, conformance (the per-stream
# fault check), bad inputs, the vendor example's fallback, and the Python package on every device
pytests="python python_refcount_valgrind_script"
python3 -c 'import pytest, numpy' 2>/dev/null ||
  { pytests=""; echo "NOTE: pytest or numpy missing in this Python: the python suite (CPU, OpenCL and cuda devices) did not run"; }
meson test -C $B --print-errorlogs --num-processes 8 buffer conformance bad_inputs vendor_plugin gpu_paths \
  $pytests > "$OUT/tests.txt" 2>&1 || fail=1
grep -E "^(Ok|Fail|Skipped|Timeout)" "$OUT/tests.txt"
# CUDA tensors from PyTorch (runs without pytest)
python3 python/tests/test_gpu_torch.py > "$OUT/test-gpu-torch.txt" 2>&1 || fail=1
cat "$OUT/test-gpu-torch.txt"
# the C capture check
gcc -std=c11 -O2 tests/gpu/graph_capture.c -Iapi -I/usr/local/cuda/include -L$B/core -lkvhal \
  -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,$B/core -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/graph_capture &&
  KVHAL_BACKENDS=cpu,cuda /tmp/graph_capture > "$OUT/graph-capture-c.txt" 2>&1 || fail=1
# the same with every module loading inside the capture (OpenCL on NVIDIA included): reported, not required
/tmp/graph_capture > "$OUT/graph-capture-c-all-modules.txt" 2>&1; echo "all modules inside the capture: rc $?"
cat "$OUT/graph-capture-c.txt"
# torch.cuda.graph: the decode example (first kvhal call inside the capture; every step checked)
KVHAL_BACKENDS=cpu,cuda python3 examples/python/decode_cuda_graph.py --layers 32 --steps 20 > "$OUT/graph-capture-torch.txt" 2>&1 || fail=1
tail -3 "$OUT/graph-capture-torch.txt"
python3 examples/python/radix_scheduler.py > "$OUT/radix-scheduler.txt" 2>&1 || fail=1
python3 python/bench/bench_host.py --bench $B/tools/kvhal-bench --device cuda:0 --json > "$OUT/host-cuda.json" 2>&1 || fail=1
python3 -c "import numpy" 2>/dev/null && { python3 python/bench/bench_host.py --bench $B/tools/kvhal-bench --device cpu:0 --json > "$OUT/host-cpu.json" 2>&1 || fail=1; }
python3 python/bench/bench_prefix.py --json > "$OUT/prefix.json" 2>&1 || fail=1
cat "$OUT/host-cuda.json" "$OUT/prefix.json"
echo "python-gpu: fail=$fail"
exit $fail

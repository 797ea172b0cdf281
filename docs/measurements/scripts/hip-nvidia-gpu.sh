#!/bin/bash
# The HIP module's own code on an NVIDIA GPU (issue 19): builds cpu + cuda + the HIP module on HIP's NVIDIA platform
# (-Dhip_platform=nvidia: nvcc with HIP's headers from .hipnv, made by hipnv-assemble.py on the development machine),
# then
#   1. kvhal-info: both modules loaded, one device each, and which code each device runs
#   2. every suite (the conformance suite runs every op on every device: cpu, cuda:0 and hip:0 against the host
#      reference; test_gpu_paths runs the GPU kernels' paths on cuda and hip)
#   3. the conformance suite again on hip:0 alone (KVHAL_TEST_DEVICE=hip:0), the GPU-path suite, and kvhal-replay
#      on hip:0 (KVHAL_DEVICE=hip:0)
#   4. kvhal-bench --quick --json on hip:0 and cuda:0, three interleaved rounds, and a comparison of each row's
#      median (hip / cuda): bandwidth rows must be within 5% (they gate the exit status); per-call time rows
#      (first call, host time) are printed beside them, not gated (a first call includes one-time set-up)
# Run from the repository root with .hipnv and .devdeps carried; logs go to $OUT. Exits non-zero when the build, a
# suite, a module or device check, or the 5% comparison fails. About 4 minutes on 1 x H100.
set -uo pipefail
: "${OUT:?set OUT to the log folder}"
[ -f .hipnv/include/hip/hip_runtime.h ] || { echo "no .hipnv/include (run hipnv-assemble.py here first)"; exit 1; }
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
status=0
fail() { echo "FAIL: $*"; status=1; }

nvidia-smi -L > "$OUT/gpu.txt" 2>&1
nvcc --version | tail -2 >> "$OUT/gpu.txt"
git log --oneline -1 >> "$OUT/gpu.txt" 2>/dev/null
B=/tmp/kvhal-hipnv
rm -rf "$B"
if ! { meson setup "$B" -Dbackends=cpu,cuda,hip -Dhip_platform=nvidia -Dnvcc_arch=90 -Dwerror=true &&
       ninja -C "$B"; } > "$OUT/build.txt" 2>&1; then
  echo "BUILD FAILED"; tail -40 "$OUT/build.txt"; exit 1
fi
export KVHAL_BACKEND_PATH="$B/backends"

# 1. both modules, one device each, and their code paths
"$B/tools/kvhal-info" > "$OUT/info.txt" 2>&1
"$B/tools/kvhal-info" --json > "$OUT/info.json" 2>&1
cat "$OUT/info.txt"
grep -q 'device type hip (id 2), [1-9]' "$OUT/info.txt" || fail "the HIP module has no device"
grep -q 'device type cuda (id 1), [1-9]' "$OUT/info.txt" || fail "the CUDA module has no device"
grep -A1 '^  hip:0' "$OUT/info.txt" | grep -q 'code: sm_90 cubin' || fail "hip:0 does not name its code path"

# 2. every suite
meson test -C "$B" --print-errorlogs --num-processes 8 > "$OUT/tests.txt" 2>&1 || fail "meson test"
grep -E "^(Ok|Fail|Skipped|Expected|Timeout)" "$OUT/tests.txt"
grep -E " (FAIL|TIMEOUT) " "$OUT/tests.txt" | head

# 3. hip:0 alone: conformance (every op against the host reference) and the GPU kernels' paths
KVHAL_TEST_DEVICE=hip:0 "$B/tests/test_conformance" > "$OUT/conformance-hip.txt" 2>&1 || fail "conformance on hip:0"
grep -q '^\[ device   \] hip:0' "$OUT/conformance-hip.txt" || fail "conformance did not run on hip:0"
grep -E 'PASSED|FAILED|device' "$OUT/conformance-hip.txt" | head -5
"$B/tests/test_gpu_paths" > "$OUT/gpu-paths.txt" 2>&1 || fail "gpu_paths (cuda and hip)"
grep -E 'PASSED|FAILED|SKIPPED' "$OUT/gpu-paths.txt" | head -5
# the serving workload end to end on hip:0, every prefix hit read back and verified
KVHAL_DEVICE=hip:0 "$B/tools/kvhal-replay" --quiet > "$OUT/replay-hip.txt" 2>&1 || fail "kvhal-replay on hip:0"
tail -3 "$OUT/replay-hip.txt"

# 4. kvhal-bench, interleaved
for r in 1 2 3; do
  for d in hip cuda; do
    KVHAL_DEVICE=$d:0 "$B/tools/kvhal-bench" --quick --json > "$OUT/bench-$d-$r.json" 2> "$OUT/bench-$d-$r.err" ||
      fail "kvhal-bench on $d:0 round $r"
  done
done
python3 - "$OUT" > "$OUT/bench-compare.txt" <<'EOF' || fail "kvhal-bench: a HIP row is not within 5% of CUDA's"
import json, statistics, sys
out = sys.argv[1]
def rows(dev):
    acc = {}
    for r in (1, 2, 3):
        for row in json.load(open('%s/bench-%s-%d.json' % (out, dev, r))):
            key = (row['op'], row['preset'], row['tokens'], row['layout'], row['dtype'], row['cache_dtype'])
            acc.setdefault(key, []).append(row)
    return acc
hip, cuda = rows('hip'), rows('cuda')
bad = 0
print('%-16s %-10s %7s %-5s %-9s %-9s %10s %10s %7s' % ('op', 'preset', 'tokens', 'lay', 'dtype', 'cache', 'hip', 'cuda', 'hip/cuda'))
for key in sorted(set(hip) | set(cuda), key=str):
    if key not in hip or key not in cuda:
        print('%s: only on %s' % (key, 'hip' if key in hip else 'cuda')); bad += 1; continue
    gb = [statistics.median(r['gbps'] for r in x[key]) for x in (hip, cuda)]
    if gb[0] > 0 and gb[1] > 0:
        unit, h, c, q = 'GB/s', gb[0], gb[1], gb[0] / gb[1]
    else:  # per-call rows: time, lower is better
        h = statistics.median(r['us'] for r in hip[key]); c = statistics.median(r['us'] for r in cuda[key])
        unit, q = 'us', (c / h if h > 0 else 0)
    ok = q >= 0.95 or unit == 'us'
    bad += not ok
    print('%-16s %-10s %7d %-5s %-9s %-9s %10.3f %10.3f %7.3f %s%s' % (key + (h, c, q, unit, '' if ok else '  <-- over 5%')))
print('rows: %d, bandwidth rows more than 5%% slower on hip: %d' % (len(set(hip) | set(cuda)), bad))
sys.exit(1 if bad else 0)
EOF
cat "$OUT/bench-compare.txt"
echo "hip-nvidia-gpu: status $status"
exit $status

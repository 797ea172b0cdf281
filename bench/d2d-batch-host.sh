#!/bin/bash
# d2d-batch-host.sh: what one kvhal_memcpy_d2d_batch costs the host, the IPC path's receiver's cost per launch group.
#
# What: bench/d2d_batch_host.c on one device: batches of 8, 32, 192 and 512 scattered ranges of 32 KiB (256 KiB to
#   16 MiB of the transfer benchmark's pages), each ITERS times: the call's own host time (p50, p90), the time from
#   the call until a stream query sees the copy done (p50, p90), and GB/s with the calls queued back to back. Each
#   round runs the probe once per KVHAL_GPU_COPY_BATCH mode (unset: by range size; kernel; engines), the modes in
#   rotated order from round to round; medians over the rounds.
# Machine: a CUDA GPU (DEVICE=cuda:N); any other device runs too (cpu:0: the CPU's copies, no mode applies).
# Run (repository root): bash bench/d2d-batch-host.sh   B=build dir (default build-bench-xfer, made as
#   bench/transfer-ipc.sh makes it when missing), DEVICE=cuda:1, ROUNDS=5, ITERS=200, OUT=/tmp/kvhal-d2d,
#   NVCC_ARCH=80,90. The probe uses the public API only: B may be another tree's build (the same probe, another
#   library), for a comparison.
# Output: $OUT/r/<mode>-<round>.txt (the probe's lines) and $OUT/summary.txt: per mode and batch, the medians.
set -uo pipefail
[ -f .devdeps/env.sh ] && . .devdeps/env.sh
B=${B:-build-bench-xfer} DEVICE=${DEVICE:-cuda:1} ROUNDS=${ROUNDS:-5} ITERS=${ITERS:-200} OUT=${OUT:-/tmp/kvhal-d2d}
mkdir -p "$OUT/r"
rm -f "$OUT"/r/*.txt
if [ ! -f "$B/build.ninja" ]; then
  backends=cpu; case "$DEVICE" in cuda*) backends=cpu,cuda ;; esac
  meson setup "$B" -Dbackends=$backends -Dnvcc_arch="${NVCC_ARCH:-80,90}" -Dbuildtype=release -Dpython=disabled \
    -Dtests=false > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
ninja -C "$B" >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cc -std=c11 -O2 -Iinclude bench/d2d_batch_host.c -o "$OUT/probe" -L"$B/core" -lkvhal -Wl,-rpath,"$(cd "$B/core" && pwd)" \
  > "$OUT/probe-build.log" 2>&1 || { cat "$OUT/probe-build.log"; exit 1; }
export KVHAL_BACKEND_PATH=$B/backends
modes=(auto kernel engines)
rc=0
for r in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2; do
    m=${modes[$(((k + r) % 3))]}
    if [ "$m" = auto ]; then env -u KVHAL_GPU_COPY_BATCH "$OUT/probe" "$DEVICE" "$ITERS" > "$OUT/r/$m-$r.txt" 2>&1
    else KVHAL_GPU_COPY_BATCH=$m "$OUT/probe" "$DEVICE" "$ITERS" > "$OUT/r/$m-$r.txt" 2>&1; fi ||
      { echo "$m round $r failed: $(tail -1 "$OUT/r/$m-$r.txt")"; rc=1; }
  done
done
python3 - "$OUT/r" <<'PY' | tee "$OUT/summary.txt"
import collections, glob, os, statistics, sys
rows = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/*.txt"):
    mode = os.path.basename(f).split("-")[0]
    for line in open(f):
        s = line.split()
        if s and s[0] == "batch":
            rows[(mode, int(s[1]))].append([float(s[i]) for i in (4, 5, 7, 8, 10)])
print("| mode | ranges | call us p50 / p90 | call to seen done us p50 / p90 | GB/s back to back | rounds |")
print("| --- | --- | --- | --- | --- | --- |")
for (mode, n) in sorted(rows):
    v = [statistics.median(c) for c in zip(*rows[(mode, n)])]
    print(f"| {mode} | {n} | {v[0]:.2f} / {v[1]:.2f} | {v[2]:.2f} / {v[3]:.2f} | {v[4]:.1f} | {len(rows[(mode, n)])} |")
PY
exit $rc

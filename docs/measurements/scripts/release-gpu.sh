#!/bin/bash
# Release-grade library (issue 16) on the GPU machine: build cpu, cuda and opencl (NVIDIA) in a fresh folder and
# run every suite (the examples included, on cuda:0 too); install the tree and check that the installed kvhal-info
# finds the CUDA module in <libdir>/kvhal-0 beside the library; build the examples against the installed tree with
# pkg-config and run them on cuda:0; kvhal-replay --json on cuda:0 (version, ok, per-call percentiles, null where not
# measured); a CUDA graph capture of paged caching (capture_probe.c); kvhal-bench on cuda:0. Run by the device tool from the repository root with .devdeps carried; logs go to
# $OUT. Exits non-zero on any failure; a few minutes on one H100.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
fail=0
bad() { echo "FAIL: $*"; fail=1; }
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
lscpu | grep 'Model name' >> "$OUT/gpu.txt"
b=/tmp/kvhal-release-gpu; inst=/tmp/kvhal-release-inst
rm -rf "$b" "$inst"
meson setup "$b" -Dbackends=cpu,cuda,opencl -Dwerror=true -Dnvcc_arch=90 --prefix="$inst" \
  --libdir=lib/x86_64-linux-gnu > "$OUT/build.txt" 2>&1 &&
  ninja -C "$b" >> "$OUT/build.txt" 2>&1 || { echo BUILD FAILED; tail -40 "$OUT/build.txt"; exit 1; }
"$b/tools/kvhal-info" > "$OUT/info.txt" 2>&1
"$b/tools/kvhal-info" -l > "$OUT/info-l.txt" 2>&1
grep -q '^cuda:0' "$OUT/info-l.txt" || bad "kvhal-info -l lists no cuda:0"

# every suite, then the examples again on cuda:0 (the in-tree example tests run on cpu, opencl and npu)
meson test -C "$b" --print-errorlogs --num-processes 8 > "$OUT/tests.txt" 2>&1 || bad "meson test"
grep -E "^(Ok|Fail|Skipped|Expected|Timeout)" "$OUT/tests.txt"
grep -E " (FAIL|TIMEOUT) " "$OUT/tests.txt" | head
for ex in paged_cache engine_step; do
  KVHAL_DEVICE=cuda:0 "$b/examples/example_$ex" > "$OUT/example-$ex-cuda.txt" 2>&1 || bad "example $ex on cuda:0"
done

# installed tree: modules in kvhal-0, found relative to the library; the examples built with pkg-config
meson install -C "$b" --quiet > "$OUT/install.txt" 2>&1 || bad "meson install"
libdir=$inst/lib/x86_64-linux-gnu
test -f "$libdir/kvhal-0/libkvhal-cuda.so" || bad "no $libdir/kvhal-0/libkvhal-cuda.so"
KVHAL_BACKEND_PATH= "$inst/bin/kvhal-info" --json > "$OUT/info-installed.json" 2>&1
python3 - "$OUT/info-installed.json" <<'PY' || bad "installed kvhal-info: cuda module"
import json, sys
d = json.load(open(sys.argv[1]))
m = {x["name"]: x for x in d["modules"]}
assert d["ok"] is True and d["version"], d
assert m["cuda"]["loaded"] and "/kvhal-0/" in m["cuda"]["path"] and m["cuda"]["devices"] >= 1, m["cuda"]
print("installed: cuda module", m["cuda"]["path"], m["cuda"]["devices"], "devices")
PY
export PKG_CONFIG_PATH=$libdir/pkgconfig
for ex in paged_cache engine_step; do
  cc -std=c11 -Wall -Wextra -pedantic -Werror examples/$ex.c $(pkg-config --cflags --libs kvhal) -Wl,-rpath,"$libdir" \
    -o "/tmp/$ex-installed" > "$OUT/consumer-$ex.txt" 2>&1 &&
    KVHAL_BACKEND_PATH= KVHAL_DEVICE=cuda:0 "/tmp/$ex-installed" >> "$OUT/consumer-$ex.txt" 2>&1 ||
    bad "installed consumer $ex on cuda:0"
done

# what kvhal.h says about graph capture: paged caching captured on a wrapped stream (global mode) and replayed
cc -std=c11 -Wall -Wextra -Werror docs/measurements/scripts/capture_probe.c $(pkg-config --cflags --libs kvhal) \
  -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,"$libdir" -Wl,-rpath,/usr/local/cuda/lib64 \
  -o /tmp/capture_probe > "$OUT/capture.txt" 2>&1 &&
  KVHAL_BACKEND_PATH= /tmp/capture_probe >> "$OUT/capture.txt" 2>&1 || bad "graph capture probe (see capture.txt)"
cat "$OUT/capture.txt"

# the tools' JSON on cuda:0
KVHAL_DEVICE=cuda:0 "$b/tools/kvhal-replay" --model=llama3-8b --kv-budget=2GiB --groups 16 --prompts 8 --json --quiet \
  > "$OUT/replay-cuda.json" 2> "$OUT/replay-cuda.err" || bad "kvhal-replay on cuda:0"
python3 - "$OUT/replay-cuda.json" <<'PY' || bad "kvhal-replay JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ok"] is True and d["device"] == "cuda:0" and d["version"], d
for k in ("match", "finish"):
    p = d["latency_us"][k]
    assert p["n"] > 0 and p["p50"] <= p["p90"] <= p["p99"], p
assert d["write_gb_per_s"] is not None
print("replay cuda:0: %.1f GB/s paged caching, match p50/p99 %.2f/%.2f us, finish p50/p99 %.2f/%.2f us" % (
    d["write_gb_per_s"], d["latency_us"]["match"]["p50"], d["latency_us"]["match"]["p99"],
    d["latency_us"]["finish"]["p50"], d["latency_us"]["finish"]["p99"]))
PY
KVHAL_DEVICE=cuda:0 "$b/tools/kvhal-bench" --quick --json > "$OUT/bench-cuda.json" 2> "$OUT/bench-cuda.err" ||
  bad "kvhal-bench on cuda:0"
echo "release-gpu: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail

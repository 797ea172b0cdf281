#!/bin/bash
# Session 8, issue 15 on NVIDIA's OpenCL (one H100): the tree before (a copy of the checkout's root, BEFORE=.., with
# this tree's tools/kvhal-bench.c) and after (this tree) built side by side (cpu + opencl, -Dwerror=true), conformance of the new tree on NVIDIA's OpenCL device, then
# kvhal-bench's paged-caching rows (PRESETS, tokens 8192 and 65536) and MLA rows, before and after alternating per
# preset (ROUNDS rounds), then (FP8CHECK=1) kvhal-fp8-check on the NVIDIA device for FP8_FORMATS at FP8_SCALES.
# Stages are cut to fit LIMIT seconds in all (the device call's limit less the archive). Logs under $OUT, archived
# into one .tgz. Run from the new tree: `source .devdeps/env.sh && cd .wt-o && OUT=... bash <this>`.
set -uo pipefail
: "${OUT:?set OUT}"
export PATH=/opt/torch/.venv/bin:$PATH
BEFORE=${BEFORE:-..}
PRESETS=${PRESETS:-llama3-8b llama2-7b mla}
ROUNDS=${ROUNDS:-1}
LIMIT=${LIMIT:-280}
FP8CHECK=${FP8CHECK:-0}
FP8_FORMATS=${FP8_FORMATS:-fp8_e4m3fnuz,fp8_e5m2fnuz}
FP8_SCALES=${FP8_SCALES:-0.37,3e30,0x1.5p-64,0.5}
CONF=${CONF:-1}
# VARIANTS="name:c_args ...": this tree built again with extra C arguments (e.g. g4:-DKVHAL_OCL_GPU_GROUP=4), benched
# after the main rows on VARIANT_PRESETS at VARIANT_TOKENS beside the after build
VARIANTS=${VARIANTS:-}
VARIANT_PRESETS=${VARIANT_PRESETS:-llama3-8b mla}
VARIANT_TOKENS=${VARIANT_TOKENS:-8192}
FP8_FIRST=${FP8_FIRST:-0} # 1: the fp8 check before the bench rows
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
rc=0; fail() { echo "FAILED: $*"; rc=1; }
finish() {
  echo "session8-ocl: rc=$rc"
  (cd "$OUT" && tar czf /tmp/s8-ocl-logs.tgz . && rm -rf ./* && mv /tmp/s8-ocl-logs.tgz .)
  exit $rc
}
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
A=/tmp/s8-before B=/tmp/s8-after
# the before tree as a copy, with this tree's kvhal-bench.c (the same measuring tool for both; the library's
# public API is unchanged)
SA=/tmp/s8-before-src
if [ ! -d $SA ]; then
  mkdir -p $SA && tar -C "$BEFORE" --exclude=./.wt-o --exclude=./.wt-k --exclude=./.wt-x --exclude=./.devdeps \
    --exclude=./.git --exclude=./.hipnv -cf - . | tar -C $SA -xf - && cp tools/kvhal-bench.c $SA/tools/kvhal-bench.c
fi
build() { # src dir log
  { [ -f "$2/build.ninja" ] || meson setup "$2" "$1" -Dbackends=cpu,opencl -Dwerror=true; } > "$3" 2>&1 &&
    ninja -C "$2" -j8 >> "$3" 2>&1
}
build $SA $A "$OUT/build-before.txt" & pa=$!
build . $B "$OUT/build-after.txt" & pb=$!
pv=()
for v in $VARIANTS; do
  n=${v%%:*} ca=${v#*:}
  { { [ -f /tmp/s8-$n/build.ninja ] || meson setup /tmp/s8-$n . -Dbackends=cpu,opencl -Dwerror=true "-Dc_args=$ca"; } &&
      ninja -C /tmp/s8-$n -j8 tools/kvhal-bench backends/opencl/libkvhal-opencl.so; } > "$OUT/build-$n.txt" 2>&1 & pv+=($!)
done
wait $pb || { echo "BUILD (after) FAILED"; grep -E 'error|FAILED' "$OUT/build-after.txt" | head -30; rc=1; finish; }
wait $pa || { echo "BUILD (before) FAILED"; grep -E 'error|FAILED' "$OUT/build-before.txt" | head -10; rc=1; finish; }
grep -ci warning "$OUT/build-after.txt" | sed 's/^/warnings (after): /'
el build
OCL=$(KVHAL_BACKEND_PATH=$B/backends $B/tools/kvhal-info -l 2>/dev/null | grep -i nvidia | grep -o 'opencl:[0-9]*' | head -1)
echo "NVIDIA OpenCL device: ${OCL:-none}"
[ -n "$OCL" ] || { rc=1; finish; }

if [ "$CONF" = 1 ]; then
  KVHAL_BACKEND_PATH=$B/backends KVHAL_TEST_DEVICE=$OCL timeout $(( $(left) - 60 )) $B/tests/test_conformance \
    > "$OUT/conformance-ocl.txt" 2>&1 || fail "conformance $OCL"
  echo "$OCL: $(grep -cE '^\[       OK' "$OUT/conformance-ocl.txt") ok, $(grep -cE '^\[  FAILED  \] [a-z]' "$OUT/conformance-ocl.txt") failed"
  grep -E "FAILED|info|mismatch" "$OUT/conformance-ocl.txt" | head -20
  el conformance
fi

for i in "${!pv[@]}"; do wait ${pv[$i]} || { echo "BUILD variant $i FAILED"; tail -5 "$OUT/build-${VARIANTS%%:*}.txt"; }; done
fp8check() {
  if [ "$FP8CHECK" = 1 ] && [ "$(left)" -gt 30 ]; then
    KVHAL_BACKEND_PATH=$B/backends timeout $(( $(left) - 5 )) $B/tools/kvhal-fp8-check --device=$OCL \
      --formats=$FP8_FORMATS --scales=$FP8_SCALES > "$OUT/fp8-check-ocl.txt" 2>&1 || fail "fp8-check $OCL"
    tail -20 "$OUT/fp8-check-ocl.txt"
    el fp8-check
  fi
}

TOKENS=8192,65536
bench() { # build tag preset round
  local args
  if [ "$3" = mla ]; then args="--op=mla --tokens=$TOKENS"
  else args="--op=paged_caching --preset=$3 --tokens=$TOKENS"; fi
  KVHAL_BACKEND_PATH=$1/backends timeout $(( $(left) > 5 ? $(left) - 5 : 1 )) $1/tools/kvhal-bench --device=$OCL $args \
    > "$OUT/bench-$2-$3-r$4.txt" 2>&1 || fail "bench $2 $3 r$4"
  grep -E "^paged" "$OUT/bench-$2-$3-r$4.txt" | sed "s/^/$2 r$4 /"
}
[ "$FP8_FIRST" = 1 ] && { fp8check; FP8CHECK=0; }
for r in $(seq 1 "$ROUNDS"); do
  for p in $PRESETS; do
    [ "$(left)" -gt 40 ] || { echo "skipped $p r$r (time)"; continue; }
    bench $A before $p $r
    [ "$(left)" -gt 20 ] || { echo "skipped after $p r$r (time)"; continue; }
    bench $B after $p $r
    el "bench $p r$r"
  done
done

TOKENS=$VARIANT_TOKENS
for v in $VARIANTS; do
  n=${v%%:*}
  for p in $VARIANT_PRESETS; do
    [ "$(left)" -gt 40 ] || { echo "skipped variant $n $p (time)"; continue; }
    bench $B after-v-$n $p 1
    bench /tmp/s8-$n $n $p 1
    el "variant $n $p"
  done
done
fp8check
finish

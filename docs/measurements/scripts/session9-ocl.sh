#!/bin/bash
# Session 9, issue 15 on NVIDIA's OpenCL: session8-ocl.sh's stages (before = a copy of the checkout's root, BEFORE=..,
# with this tree's tools/kvhal-bench.c; after = this tree; cpu + opencl builds, -Dwerror=true), but the variants are
# environment settings of the after build (ENV_VARIANTS="name:VAR=v,VAR=v ..."; ocl_paged_caching.c reads them per
# plan), so that every variant runs from one build and beside the default in every round. Stages:
#   conformance of the after build on NVIDIA's OpenCL device, default and under each CONF_ENVS variant (in parallel);
#   ROUNDS rounds, each: before, after, then each variant, for llama3-8b paged caching (LLAMA_TOKENS) and the MLA
#   rows (MLA_TOKENS); then (FP8CHECK=1) kvhal-fp8-check under FP8_ENV on FP8_FORMATS at FP8_SCALES.
# Stages are cut to fit LIMIT seconds. Logs under $OUT, archived into one .tgz.
# The knobs the session-9 variants used (KVHAL_OCL_NV_FP8_VEC, KVHAL_OCL_GPU_GROUP_CONVERT, KVHAL_OCL_PC_LOCAL,
# KVHAL_OCL_PC_TOKPAD, KVHAL_OCL_PC_OPTIONS with PC_CS / PC_IDX) exist in backends/opencl of s9-o commit 55ae2c9
# only; none won, so the branch's final tree has main's kernels and ignores them (restore them with
# `git checkout 55ae2c9 -- backends/opencl` to measure again). See docs/measurements/session9/README-opencl.md.
# Run from the new tree: `source .devdeps/env.sh && cd .wt-o && OUT=... bash <this>`.
set -uo pipefail
: "${OUT:?set OUT}"
export PATH=/opt/torch/.venv/bin:$PATH
BEFORE=${BEFORE:-..}
ROUNDS=${ROUNDS:-3}
LIMIT=${LIMIT:-280}
LLAMA_TOKENS=${LLAMA_TOKENS:-8192}
MLA_TOKENS=${MLA_TOKENS:-8192,65536}
ENV_VARIANTS=${ENV_VARIANTS:-} # e.g. "v8g2:KVHAL_OCL_NV_FP8_VEC=8,KVHAL_OCL_GPU_GROUP_CONVERT=2 cs:KVHAL_OCL_PC_OPTIONS=-DPC_CS=1+-DPC_IDX=1"
CONF_ENVS=${CONF_ENVS:-$ENV_VARIANTS}
FP8CHECK=${FP8CHECK:-0}
FP8_ENV=${FP8_ENV:-} # "A=1,B=2" as in a variant
FP8_FORMATS=${FP8_FORMATS:-fp8_e4m3,fp8_e5m2,fp8_e4m3fnuz,fp8_e5m2fnuz}
FP8_SCALES=${FP8_SCALES:-0.37}
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
rc=0; fail() { echo "FAILED: $*"; rc=1; }
finish() {
  echo "session9-ocl: rc=$rc"
  (cd "$OUT" && tar czf /tmp/s9-ocl-logs.tgz . && rm -rf ./* && mv /tmp/s9-ocl-logs.tgz .)
  exit $rc
}
# "name:A=1,B=x+y" -> lines "A=1", "B=x y" ('+' stands for a space inside a value)
envs() { echo "${1#*:}" | tr ',' '\n' | tr '+' ' ' | grep -v '^$'; }
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
A=/tmp/s9-before B=/tmp/s9-after SA=/tmp/s9-before-src
if [ ! -d $SA ]; then
  mkdir -p $SA && tar -C "$BEFORE" --exclude=./.wt-o --exclude=./.wt-k --exclude=./.wt-x --exclude=./.devdeps \
    --exclude=./.git --exclude=./.hipnv -cf - . | tar -C $SA -xf - && cp tools/kvhal-bench.c $SA/tools/kvhal-bench.c
fi
build() { # src dir log
  { [ -f "$2/build.ninja" ] || meson setup "$2" "$1" -Dbackends=cpu,opencl -Dpython=disabled -Dwerror=true; } > "$3" 2>&1 &&
    ninja -C "$2" -j8 backends/opencl/libkvhal-opencl.so tools/kvhal-bench tools/kvhal-fp8-check tools/kvhal-info tests/test_conformance >> "$3" 2>&1
}
build $SA $A "$OUT/build-before.txt" & pa=$!
build . $B "$OUT/build-after.txt" & pb=$!
wait $pb || { echo "BUILD (after) FAILED"; grep -E 'error|FAILED' "$OUT/build-after.txt" | head -30; rc=1; finish; }
wait $pa || { echo "BUILD (before) FAILED"; grep -E 'error|FAILED' "$OUT/build-before.txt" | head -10; rc=1; finish; }
echo "warnings (after): $(grep -ci 'warning:' "$OUT/build-after.txt")"
el build
OCL=${OCL_DEVICE:-}; [ -n "$OCL" ] || OCL=$(KVHAL_BACKEND_PATH=$B/backends $B/tools/kvhal-info -l 2>/dev/null | grep -i nvidia | grep -o 'opencl:[0-9]*' | head -1)
echo "NVIDIA OpenCL device: ${OCL:-none}"
[ -n "$OCL" ] || { rc=1; finish; }

conf() { # tag env...
  local tag=$1; shift
  env "$@" KVHAL_BACKEND_PATH=$B/backends KVHAL_TEST_DEVICE=$OCL timeout $(( $(left) - 60 )) $B/tests/test_conformance \
    > "$OUT/conformance-$tag.txt" 2>&1 || echo "FAILED: conformance $tag $OCL" >> "$OUT/conformance-$tag.txt"
}
pc=()
conf default & pc+=($!)
for v in $CONF_ENVS; do mapfile -t E < <(envs "$v"); conf "${v%%:*}" "${E[@]}" & pc+=($!); done
for p in "${pc[@]}"; do wait $p; done
for f in "$OUT"/conformance-*.txt; do
  echo "$(basename $f .txt): $(grep -cE '^\[       OK' $f) ok, $(grep -cE '^\[  FAILED  \] [a-z]' $f) failed"
  grep -E "FAILED|info|mismatch" $f | head -8
  grep -q "^FAILED" $f && rc=1
done
el conformance

bench() { # build tag round env...
  local b=$1 tag=$2 r=$3; shift 3
  [ "$(left)" -gt 25 ] || { echo "skipped $tag r$r (time)"; return; }
  env "$@" KVHAL_BACKEND_PATH=$b/backends timeout $(( $(left) - 10 )) $b/tools/kvhal-bench --device=$OCL \
    --op=paged_caching --preset=llama3-8b --tokens=$LLAMA_TOKENS > "$OUT/bench-$tag-llama3-r$r.txt" 2>&1 ||
    fail "bench $tag llama3 r$r"
  env "$@" KVHAL_BACKEND_PATH=$b/backends timeout $(( $(left) > 15 ? $(left) - 10 : 5 )) $b/tools/kvhal-bench \
    --device=$OCL --op=mla --tokens=$MLA_TOKENS > "$OUT/bench-$tag-mla-r$r.txt" 2>&1 || fail "bench $tag mla r$r"
}
for r in $(seq 1 "$ROUNDS"); do
  bench $A before $r
  bench $B after $r
  for v in $ENV_VARIANTS; do mapfile -t E < <(envs "$v"); bench $B "${v%%:*}" $r "${E[@]}"; done
  el "round $r"
done

# medians over the rounds of the cold and warm ratios per (tag, row), from the files the rounds left
summary() {
  for f in "$OUT"/bench-*-r*.txt; do
    t=$(basename "$f" .txt); t=${t#bench-}; t=${t%-llama3-r*}; t=${t%-mla-r*}
    grep -E "^paged" "$f" | awk -F'|' -v t="$t" '{split($1,a," "); split($2,b," "); split($3,c," ");
      print t, a[2], a[3], a[4], a[6], a[7], b[3], c[3]}'
  done | sort -s -k2,6 -k1,1 | awk '
    function med(s,  n, v, i, j, x) { n = split(s, v, " "); if (!n) return "-"; for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] + 0 > x + 0; j--) v[j + 1] = v[j]; v[j + 1] = x }
      return n % 2 ? v[(n + 1) / 2] : sprintf("%.3f", (v[n / 2] + v[n / 2 + 1]) / 2) }
    { k = $1 " " $2 " " $3 " " $4 " " $5 " " $6; if (!(k in cold)) order[++n] = k; cold[k] = cold[k] " " ($7 == "-" ? "" : $7); warm[k] = warm[k] " " $8; all[k] = all[k] " " $7 }
    END { for (i = 1; i <= n; i++) { k = order[i]; print k, "cold", med(cold[k]), "warm", med(warm[k]), "| cold rounds" all[k] } }'
}
summary > "$OUT/summary.txt"
grep -v "^[^ ]* llama3-8b [0-9]* [A-Z]* bf16 -" "$OUT/summary.txt" | cut -c1-120

if [ "$FP8CHECK" = 1 ] && [ "$(left)" -gt 20 ]; then
  mapfile -t E < <(envs "x:$FP8_ENV")
  env "${E[@]}" KVHAL_BACKEND_PATH=$B/backends timeout $(( $(left) - 5 )) $B/tools/kvhal-fp8-check --device=$OCL \
    --formats=$FP8_FORMATS --scales=$FP8_SCALES > "$OUT/fp8-check.txt" 2>&1 || fail "fp8-check $OCL ($FP8_ENV)"
  echo "fp8-check env: ${FP8_ENV:-default}"; tail -12 "$OUT/fp8-check.txt"
  el fp8-check
fi
finish

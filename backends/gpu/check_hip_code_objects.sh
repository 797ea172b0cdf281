#!/bin/sh
# Fails unless the HIP module carries a code object for every target it was built for (the hip_targets option) in
# every offload bundle it holds (one per source file with kernels), the bundles holding every kernel between them:
# a module without one would load but fail at the first launch of that kernel on that GPU.
# Usage: check_hip_code_objects.sh libkvhal-hip.so gfx90a gfx940 ...
set -eu
mod="$1"
shift
kernels="paged_caching_kernel copy_blocks_kernel copy_batch_kernel tensor_copy_kernel page_transfer_kernel"
bundler=""
for b in clang-offload-bundler clang-offload-bundler-15 /usr/lib/llvm-*/bin/clang-offload-bundler; do
  if command -v "$b" >/dev/null 2>&1; then bundler="$b"; fi
done
if [ -z "$bundler" ]; then
  echo "no clang-offload-bundler: cannot list the code objects"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
objcopy -O binary --only-section=.hip_fatbin "$mod" "$tmp/fatbin"
if [ ! -s "$tmp/fatbin" ]; then
  echo "$mod has no .hip_fatbin section"
  exit 1
fi
# The linker concatenates the objects' bundles (each aligned, so padding may follow one); split at each header.
size=$(wc -c <"$tmp/fatbin")
starts=$(grep -obUa '__CLANG_OFFLOAD_BUNDLE__' "$tmp/fatbin" | cut -d: -f1)
status=0
n=0
for start in $starts; do
  end=$size
  for s in $starts; do
    if [ "$s" -gt "$start" ]; then end=$s; break; fi
  done
  n=$((n + 1))
  tail -c +$((start + 1)) "$tmp/fatbin" | head -c $((end - start)) >"$tmp/b$n"
  list=$("$bundler" --list --type=o --input="$tmp/b$n")
  echo "bundle $n: $(echo $list)"
  for t in "$@"; do
    id="hipv4-amdgcn-amd-amdhsa--$t"
    if ! printf '%s\n' "$list" | grep -qxF "$id"; then
      echo "missing in bundle $n: $id"
      status=1
      continue
    fi
    "$bundler" --unbundle --type=o --input="$tmp/b$n" --targets="$id" --output="$tmp/b$n.$t.co"
    readelf -sW "$tmp/b$n.$t.co" >>"$tmp/$t.syms"
  done
done
if [ "$n" -eq 0 ]; then
  echo "$mod: no offload bundle in .hip_fatbin"
  exit 1
fi
for t in "$@"; do
  for k in $kernels; do
    c=$(grep -c "$k" "$tmp/$t.syms" 2>/dev/null || true)
    if [ "${c:-0}" -eq 0 ]; then
      echo "$t: no code object holds $k"
      status=1
    else
      echo "$t: $c $k symbols"
    fi
  done
done
exit $status

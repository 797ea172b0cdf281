#!/bin/sh
# Fails unless the HIP module carries a code object for every target it was built for (the hip_targets option),
# each of them holding the kernels: a module without one would load but fail at the first launch on that GPU.
# Usage: check_hip_code_objects.sh libkvhal-hip.so gfx90a gfx940 ...
set -eu
mod="$1"
shift
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
list=$("$bundler" --list --type=o --input="$tmp/fatbin")
echo "code objects in $mod:"
echo "$list"
status=0
for t in "$@"; do
  id="hipv4-amdgcn-amd-amdhsa--$t"
  if ! printf '%s\n' "$list" | grep -qxF "$id"; then
    echo "missing: $id"
    status=1
    continue
  fi
  "$bundler" --unbundle --type=o --input="$tmp/fatbin" --targets="$id" --output="$tmp/$t.co"
  n=$(readelf -sW "$tmp/$t.co" | grep -c 'paged_caching_kernel' || true)
  if [ "$n" -eq 0 ]; then
    echo "$t: code object holds no paged_caching_kernel"
    status=1
  else
    echo "$t: $n paged_caching_kernel instantiations"
  fi
done
exit $status

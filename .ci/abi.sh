#!/bin/bash
# CI stage (runs alone too): the ABI of libkvhal.so.0 and of libkvhal-xfer.so.0 (the transfer library) against the
# committed baselines abi/libkvhal.so.0.abi and abi/libkvhal-xfer.so.0.abi (docs/ABI.md). abidiff's exit status is a
# bit mask: 1 tool error, 2 usage, 4 an ABI change, 8 an incompatible change. abidiff calls a changed struct layout
# reached through a pointer (a field added to a config struct) a change (4), not incompatible, yet it breaks callers
# that allocate the struct: so this fails on 1, 2, 8, and on any removed or changed function or variable; what passes
# is additions only (functions added; enumerators appended, which libabigail filters as harmless).
#   .ci/abi.sh            check
#   .ci/abi.sh --update   rebuild and rewrite the baselines (at a release, or after an intended change; commit them)
# The test hooks (include/kvhal/kvhal_test.h, symbol version KVHAL_TEST_0) are left out: abi/test-hooks.suppr. The
# check also fails if any other symbol than those carries a version (all of the ABI is the base version).
set -euo pipefail
cd "$(dirname "$0")/.."
b=${KVHAL_ABI_BUILD:-/tmp/kvhal-abi-build}
rm -rf "$b"
# debug info is what abidw reads; only the public headers' types count (--headers-dir)
meson setup "$b" -Dbackends=cpu -Dtests=false -Dtools=false -Dexamples=false -Dtransfer=ucx \
  -Dbuildtype=debugoptimized >/dev/null
ninja -C "$b" core/libkvhal.so.0.1.0 transfer/libkvhal-xfer.so.0.1.0 >/dev/null 2>&1 || ninja -C "$b" >/dev/null

# check_lib BASELINE LIBRARY: rewrite the baseline (--update) or compare the library with it
check_lib() {
  local baseline=$1 lib=$2 name
  name=$(basename "$baseline" .abi)
  if [ "${update:-}" = 1 ]; then
    abidw --headers-dir include/kvhal --suppressions abi/test-hooks.suppr --no-corpus-path --out-file "$baseline" "$lib"
    echo "abi: $baseline rewritten from $(basename "$lib"): $(grep -c '<elf-symbol ' "$baseline") symbols; commit it"
    return 0
  fi
  test -f "$baseline" || { echo "abi: no baseline $baseline (run .ci/abi.sh --update)" >&2; return 1; }
  local rc=0 changed
  abidiff --headers-dir2 include/kvhal --suppressions abi/test-hooks.suppr "$baseline" "$lib" > "$b/abidiff-$name.txt" || rc=$?
  cat "$b/abidiff-$name.txt"
  changed=$( (grep -E '^(Functions|Variables) changes summary:' "$b/abidiff-$name.txt" || true) |
            sed -E 's/.*summary: ([0-9]+) Removed(.*), ([0-9]+) Changed.*/\1 \3/' | awk '{s += $1 + $2} END {print s + 0}')
  if [ $((rc & 8)) -ne 0 ] || [ $((rc & 3)) -ne 0 ] || [ "$changed" -ne 0 ]; then
    echo "abi: INCOMPATIBLE change of $name against $baseline (abidiff exit $rc, $changed removed or changed" \
         "functions and variables); see docs/ABI.md (an intended change before a release: .ci/abi.sh --update)" >&2
    return 1
  fi
  if [ $((rc & 4)) -ne 0 ]; then echo "abi: $name: compatible change against the baseline (abidiff exit $rc)"
  else echo "abi: $name: identical to the baseline"; fi
}

update=0
[ "${1:-}" = "--update" ] && update=1
status=0
check_lib abi/libkvhal.so.0.abi "$(ls "$b"/core/libkvhal.so.0.*.* | head -1)" || status=1
check_lib abi/libkvhal-xfer.so.0.abi "$(ls "$b"/transfer/libkvhal-xfer.so.0.*.* | head -1)" || status=1
# the symbol versions: KVHAL_TEST_0 for the four test hooks, nothing else versioned
lib=$(ls "$b"/core/libkvhal.so.0.*.* | head -1)
tv=$(objdump -T "$lib" | awk '$NF ~ /^kvhal_/ && $(NF-1) == "KVHAL_TEST_0" {print $NF}' | sort | tr '\n' ' ')
other=$(objdump -T "$lib" | awk '$NF ~ /^kvhal_/ && $(NF-1) != "Base" && $(NF-1) != "KVHAL_TEST_0" {print $NF}')
if [ "$tv" != "kvhal_fault_alloc_count kvhal_fault_hold_streams kvhal_fault_inject_alloc kvhal_fault_stream_waits " ] ||
   [ -n "$other" ]; then
  echo "abi: symbol versions: KVHAL_TEST_0 holds '$tv', other versioned: '$other'" >&2; status=1
else
  echo "abi: the four test hooks are KVHAL_TEST_0, every other symbol the base version"
fi
exit $status

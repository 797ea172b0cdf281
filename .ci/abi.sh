#!/bin/bash
# CI stage (runs alone too): the ABI of libkvhal.so.0 against the committed baseline abi/libkvhal.so.0.abi
# (docs/ABI.md). abidiff's exit status is a bit mask: 1 tool error, 2 usage, 4 an ABI change, 8 an incompatible
# change. abidiff calls a changed struct layout reached through a pointer (a field added to a config struct) a
# change (4), not incompatible, yet it breaks callers that allocate the struct: so this fails on 1, 2, 8, and on
# any removed or changed function or variable; what passes is additions only (functions added; enumerators appended,
# which libabigail filters as harmless).
#   .ci/abi.sh            check
#   .ci/abi.sh --update   rebuild and rewrite the baseline (at a release, or after an intended change; commit it)
set -euo pipefail
cd "$(dirname "$0")/.."
b=${KVHAL_ABI_BUILD:-/tmp/kvhal-abi-build}
baseline=abi/libkvhal.so.0.abi
rm -rf "$b"
# debug info is what abidw reads; only the public headers' types count (--headers-dir)
meson setup "$b" -Dbackends=cpu -Dtests=false -Dtools=false -Dexamples=false -Dbuildtype=debugoptimized >/dev/null
ninja -C "$b" core/libkvhal.so.0.1.0 >/dev/null 2>&1 || ninja -C "$b" >/dev/null
lib=$(ls "$b"/core/libkvhal.so.0.*.* | head -1)
if [ "${1:-}" = "--update" ]; then
  abidw --headers-dir api --no-corpus-path --out-file "$baseline" "$lib"
  echo "abi: baseline rewritten from $(basename "$lib"): $(grep -c '<elf-symbol ' "$baseline") symbols; commit $baseline"
  exit 0
fi
test -f "$baseline" || { echo "abi: no baseline $baseline (run .ci/abi.sh --update)" >&2; exit 1; }
set +e
abidiff --headers-dir2 api "$baseline" "$lib" > "$b/abidiff.txt"
rc=$?
set -e
cat "$b/abidiff.txt"
changed=$( (grep -E '^(Functions|Variables) changes summary:' "$b/abidiff.txt" || true) |
          sed -E 's/.*summary: ([0-9]+) Removed(.*), ([0-9]+) Changed.*/\1 \3/' | awk '{s += $1 + $2} END {print s + 0}')
if [ $((rc & 8)) -ne 0 ] || [ $((rc & 3)) -ne 0 ] || [ "$changed" -ne 0 ]; then
  echo "abi: INCOMPATIBLE change against $baseline (abidiff exit $rc, $changed removed or changed functions and" \
       "variables); see docs/ABI.md (an intended change before a release: .ci/abi.sh --update)" >&2
  exit 1
fi
if [ $((rc & 4)) -ne 0 ]; then echo "abi: compatible change against the baseline (abidiff exit $rc)"; else echo "abi: identical to the baseline"; fi

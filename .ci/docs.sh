#!/bin/bash
# CI stage (runs alone too): the reference documentation. Doxygen with WARN_AS_ERROR and every undocumented public
# symbol or parameter of include/kvhal/kvhal.h, kvhal_backend.h, kvhal_xfer.h and kvhal_numerics.h a warning
# (docs/Doxyfile.in), through -Ddocs=true. A header without a @file block would be skipped without a warning, so
# every function each header declares must be in its HTML page.
set -euo pipefail
cd "$(dirname "$0")/.."
b=${KVHAL_DOCS_BUILD:-/tmp/kvhal-docs-build}
rm -rf "$b"
meson setup "$b" -Dbackends=cpu -Dtests=false -Dtools=false -Dexamples=false -Ddocs=true >/dev/null
if ! ninja -C "$b" docs/html; then
  echo "docs: Doxygen reported warnings:" >&2
  cat "$b/docs/warnings.log" >&2 || true
  exit 1
fi
test -s "$b/docs/html/kvhal_8h.html"
test ! -s "$b/docs/warnings.log"
# header, page, the pattern of its function declarations
while read -r hdr page pat; do
  names=$(grep -o "$pat" "include/kvhal/$hdr" | sed 's/.*[ *]\([a-z_0-9]*\)($/\1/' | sort -u)
  n=$(echo "$names" | grep -c .)
  missing=$(for f in $names; do grep -q ">$f</a>" "$b/docs/html/$page" || echo "$f"; done)
  [ "$n" -gt 0 ] && [ -z "$missing" ] || { echo "docs: $hdr: $n functions, not in $page: $missing" >&2; exit 1; }
  echo "docs: $hdr: all $n functions in $page"
done <<'HEADERS'
kvhal.h kvhal_8h.html ^KVHAL_API[^(]*(
kvhal_xfer.h kvhal__xfer_8h.html ^KVHAL_API[^(]*(
kvhal_numerics.h kvhal__numerics_8h.html ^KVHAL_NUM_HD [^(]*(
HEADERS
echo "docs: $(ls "$b/docs/html" | wc -l) files in $b/docs/html, no warnings"

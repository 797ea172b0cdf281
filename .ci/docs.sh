#!/bin/bash
# CI stage (runs alone too): the reference documentation. Doxygen with WARN_AS_ERROR and every undocumented public
# symbol or parameter of include/kvhal/kvhal.h, kvhal_backend.h and kvhal_xfer.h a warning (docs/Doxyfile.in), through -Ddocs=true.
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
echo "docs: $(ls "$b/docs/html" | wc -l) files in $b/docs/html, no warnings"

#!/bin/bash
# Session 13, issue 18: host caches over TCP and shared memory (the CMA path) on the GPU machine's host, main
# (.base.tar: `git archive <base>`) against this tree, with ucx_perftest ucp_am_bw (and -e over TCP) in the same
# rounds (xfer-ab.sh: 4 in flight, 256 KiB .. 16 MiB). Run from the repository root with .devdeps carried and OUT set.
set -uo pipefail
source .devdeps/env.sh
export PATH=/opt/torch/.venv/bin:$PATH
W=/tmp/s13h; mkdir -p "$W/base" "$OUT"
tar -xf .base.tar -C "$W/base"
( cd "$W/base" && meson setup "$W/b-base" -Dbackends=cpu -Dtransfer=ucx -Dtests=false -Dpython=disabled && ninja -C "$W/b-base" tools/kvhal-xfer ) > "$OUT/build-base.log" 2>&1 &
( meson setup "$W/b-new" -Dbackends=cpu -Dtransfer=ucx -Dtests=false -Dpython=disabled && ninja -C "$W/b-new" tools/kvhal-xfer ) > "$OUT/build-new.log" 2>&1 &
wait
[ -x "$W/b-base/tools/kvhal-xfer" ] && [ -x "$W/b-new/tools/kvhal-xfer" ] || { echo BUILD FAILED; tail -20 "$OUT"/build-*.log; exit 1; }
MIB=${MIB:-160} OUT=$OUT bash docs/measurements/scripts/xfer-ab.sh "${ROUNDS:-2}" base=$W/b-base new=$W/b-new

#!/bin/bash
# Session 9's device call for TCP (the 16-core host of the GPU machine, CPU only), run from the worktree's root with
# OUT set: builds kvhal-xfer from main (.base.tar: `git archive main`) and from this tree side by side, then
# xfer-ab.sh: main against this tree's copy workers gathering TCP frames, and ucx_perftest (plain and -e).
#   explore (call 1, over TCP): frames cut to KVHAL_XFER_FRAME_KIB and gather-ahead KVHAL_XFER_GA_KIB (knobs of the
#            experiment build, commit-less: see docs/measurements/session9/README-xfer.md);
#   final   (call 2, TCP and shm): the final code with 0 workers, all frames to the workers, 2 MiB frames.
set -uo pipefail
export PATH=/opt/torch/.venv/bin:$PATH
S=$(dirname "$0")
W=/tmp/s9
mkdir -p "$W/base" "$OUT"
tar -xf .base.tar -C "$W/base"
( cd "$W/base" && meson setup "$W/b-base" -Dbackends=cpu -Dtests=false && ninja -C "$W/b-base" tools/kvhal-xfer ) > "$OUT/build-base.log" 2>&1 &
( meson setup "$W/b-new" -Dbackends=cpu -Dtests=false && ninja -C "$W/b-new" tools/kvhal-xfer ) > "$OUT/build-new.log" 2>&1 &
wait
tail -n 1 "$OUT/build-base.log" "$OUT/build-new.log"
B=$W/b-base N=$W/b-new
{ lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node|L3'; free -g | head -2; ucx_info -v | head -2; } > "$OUT/machine.txt"
case ${1:-explore} in
explore) # the knobs of the experiment build (frames cut to KVHAL_XFER_FRAME_KIB, gather-ahead KVHAL_XFER_GA_KIB)
  TLS=tcp OUT=$OUT/ab MIB=${MIB:-256} timeout ${ABT:-200} bash "$S/xfer-ab.sh" ${ROUNDS:-3} base=$B new=$N \
    f1m=$N@KVHAL_XFER_FRAME_KIB=1024 f512=$N@KVHAL_XFER_FRAME_KIB=512 \
    f1m_ga8=$N@KVHAL_XFER_FRAME_KIB=1024@KVHAL_XFER_GA_KIB=8192 f2m_ga8=$N@KVHAL_XFER_FRAME_KIB=2048@KVHAL_XFER_GA_KIB=8192 \
    f1m_w0=$N@KVHAL_XFER_FRAME_KIB=1024@KVHAL_XFER_CMA_THREADS=0 > "$OUT/ab.log" 2>&1 ;;
final) # the final code: frames of 1 MiB, 8 MiB gathered ahead, frames of 1 MiB and more gathered by the workers
  OUT=$OUT/ab MIB=${MIB:-512} timeout ${ABT:-300} bash "$S/xfer-ab.sh" ${ROUNDS:-5} base=$B new=$N \
    w0=$N@KVHAL_XFER_CMA_THREADS=0 g0=$N@KVHAL_XFER_GATHER_KIB=0 f2m=$N@KVHAL_XFER_GATHER_FRAME_KIB=2048 > "$OUT/ab.log" 2>&1 ;;
esac
cd "$OUT" && tar -czf runs.tgz ab build-*.log && rm -rf ab

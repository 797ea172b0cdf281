#!/bin/bash
# Session 8's device calls (the 16-core host of the H100 machine, CPU only), run from the worktree's root with OUT
# set: builds kvhal-xfer from main (.base.tar: `git archive main`) and from this tree side by side, then
#   explore: the CMA copy workers' count and piece size against main and perftest over shm (xfer-ab.sh, 3 rounds),
#            and TCP with larger socket buffers (2 rounds);
#   final:   main against this tree over tcp and shm (xfer-ab.sh, 5 rounds: also this tree with 0 and 8 workers and
#            with 4 MiB TCP socket buffers), then xfer-host.sh on this tree (3 rounds).
set -uo pipefail
STAGE=${1:-explore}
export PATH=/opt/torch/.venv/bin:$PATH
S=$(dirname "$0")
W=/tmp/s8
mkdir -p "$W/base" "$OUT"
tar -xf .base.tar -C "$W/base"
( cd "$W/base" && meson setup "$W/b-base" -Dbackends=cpu -Dtests=false && ninja -C "$W/b-base" tools/kvhal-xfer ) > "$OUT/build-base.log" 2>&1 &
( meson setup "$W/b-new" -Dbackends=cpu -Dtests=false && ninja -C "$W/b-new" tools/kvhal-xfer ) > "$OUT/build-new.log" 2>&1 &
wait
tail -n 1 "$OUT/build-base.log" "$OUT/build-new.log"
B=$W/b-base N=$W/b-new
{ lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node|L3'; free -g | head -2; ucx_info -v | head -2; cat .bench-commit 2>/dev/null; } > "$OUT/machine.txt"
case $STAGE in
explore)
  TLS=shm OUT=$OUT/ab-shm MIB=256 timeout 150 bash "$S/xfer-ab.sh" 3 base=$B new=$N w0=$N@KVHAL_XFER_CMA_THREADS=0 \
    w2=$N@KVHAL_XFER_CMA_THREADS=2 w8=$N@KVHAL_XFER_CMA_THREADS=8 p128=$N@KVHAL_XFER_CMA_PIECE_KIB=128 \
    p2m=$N@KVHAL_XFER_CMA_PIECE_KIB=2048 > "$OUT/ab-shm.log" 2>&1
  TLS=tcp OUT=$OUT/ab-tcp MIB=256 timeout 80 bash "$S/xfer-ab.sh" 2 base=$B new=$N \
    buf=$N@UCX_TCP_SNDBUF=4m@UCX_TCP_RCVBUF=4m@UCX_WARN_UNUSED_ENV_VARS=n > "$OUT/ab-tcp.log" 2>&1
  ;;
final)
  OUT=$OUT/ab MIB=512 timeout 170 bash "$S/xfer-ab.sh" 5 base=$B new=$N w0=$N@KVHAL_XFER_CMA_THREADS=0 \
    w8=$N@KVHAL_XFER_CMA_THREADS=8 buf=$N@UCX_TCP_SNDBUF=4m@UCX_TCP_RCVBUF=4m@UCX_WARN_UNUSED_ENV_VARS=n > "$OUT/ab.log" 2>&1
  OUT=$OUT/host timeout 90 bash "$S/xfer-host.sh" "$N" 3 > "$OUT/host.log" 2>&1
  ;;
esac

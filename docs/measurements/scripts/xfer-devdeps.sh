#!/bin/bash
# Adds UCX (libucx0, libucx-dev, ucx-utils and the libraries they need) to a .devdeps root for the GPU machine,
# which has no internet: run here (Debian 12, apt works) before carrying .devdeps, e.g.
#   bash docs/measurements/scripts/xfer-devdeps.sh /work/main/.devdeps
# UCX finds its transport modules next to libucs (root/usr/lib/x86_64-linux-gnu/ucx), and .devdeps/env.sh already
# puts root/usr/lib/x86_64-linux-gnu on LD_LIBRARY_PATH and its pkgconfig folder on PKG_CONFIG_PATH.
set -euo pipefail
DEST=${1:?usage: xfer-devdeps.sh <.devdeps folder>}
mkdir -p "$DEST/root"
tmp=$(mktemp -d)
cd "$tmp"
apt-get download libucx0 libucx-dev ucx-utils libibverbs1 librdmacm1 libnuma1 ibverbs-providers
for d in *.deb; do dpkg-deb -x "$d" "$DEST/root"; done
ls "$DEST/root/usr/lib/x86_64-linux-gnu/pkgconfig/ucx.pc" "$DEST/root/usr/bin/ucx_perftest"
rm -rf "$tmp"
echo "UCX added to $DEST/root"

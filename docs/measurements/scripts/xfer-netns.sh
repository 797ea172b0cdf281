#!/bin/bash
# Two "hosts" on one machine: network namespaces kvx-a and kvx-b joined by a veth pair (10.77.0.1 / 10.77.0.2),
# no loopback shortcut between them. The decode side runs in kvx-a (kvhal-xfer --listen), the prefill side in kvx-b
# (kvhal-xfer --connect); the address blob goes through a file, the bytes over TCP across the veth link.
# Runs the self-test (every byte verified) and the benchmark, then removes the namespaces. Needs root and iproute2.
# Usage: docs/measurements/scripts/xfer-netns.sh [BUILD_DIR]   (writes to $OUT, default /tmp/xfer-netns)
set -uo pipefail
B=$(realpath "${1:-build-x}")
OUT=${OUT:-/tmp/xfer-netns}
mkdir -p "$OUT"
cleanup() { ip netns del kvx-a 2>/dev/null; ip netns del kvx-b 2>/dev/null; }
trap cleanup EXIT
cleanup
set -e
ip netns add kvx-a
ip netns add kvx-b
ip link add kvx-va type veth peer name kvx-vb
ip link set kvx-va netns kvx-a
ip link set kvx-vb netns kvx-b
ip -n kvx-a addr add 10.77.0.1/24 dev kvx-va
ip -n kvx-b addr add 10.77.0.2/24 dev kvx-vb
for n in a b; do ip -n kvx-$n link set lo up; ip -n kvx-$n link set kvx-v$n up; done
ip -n kvx-a addr show kvx-va > "$OUT/links.txt"; ip -n kvx-b addr show kvx-vb >> "$OUT/links.txt"
set +e
rc=0
run() { # name, extra args
  local blob=/tmp/kvx-blob-$$; rm -f $blob
  ip netns exec kvx-b "$B"/tools/kvhal-xfer --connect=$blob --transport=tcp "${@:2}" > "$OUT/$1-prefill.txt" 2>&1 &
  local p=$!
  UCX_NET_DEVICES=kvx-va ip netns exec kvx-a "$B"/tools/kvhal-xfer --listen=$blob --transport=tcp "${@:2}" > "$OUT/$1-decode.txt" 2>&1
  local d=$?
  wait $p; local pr=$?
  rm -f $blob
  echo "$1: decode rc $d, prefill rc $pr"; cat "$OUT/$1-decode.txt"
  [ $d -eq 0 ] && [ $pr -eq 0 ] || rc=1
}
run selftest --self-test
run bench --iters 20
exit $rc

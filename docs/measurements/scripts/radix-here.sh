#!/bin/bash
# Radix benchmark here, six interleaved rounds: this tree (page size 1 default = cache_finished_suffix; page size 1
# --finish-whole; page size 1 --cold-tokens; page size 16) and the previous session's final tree (ff4ce55) at
# page sizes 1 and 16, in the same rounds. Usage: radix2.sh NEW_BUILD OLD_BUILD
N=$1; O=$2
for i in 1 2 3 4 5 6; do
  for v in "new-ps1 $N --page-size 1" "new-ps1-whole $N --page-size 1 --finish-whole" "new-ps1-cold $N --page-size 1 --cold-tokens" "new-ps16 $N --page-size 16" "old-ps1 $O --page-size 1" "old-ps16 $O --page-size 16"; do
    set -- $v; name=$1; b=$2; shift 2
    echo "$name $($b/tools/kvhal-replay --no-kv --repeat 20 --quiet --json "$@")"
  done
done

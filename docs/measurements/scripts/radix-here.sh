#!/bin/bash
# Radix benchmark here (kvhal-replay --no-kv --repeat 20, default workload), six interleaved rounds of:
#   old      the previous session's final tree (library and tool as they were: ff4ce55)
#   oldlib   the previous library under this tree's tool, --finish-whole (what the tool's accounting alone changes)
#   whole    this tree, --finish-whole (cache_finished, as the old library was driven)
#   new      this tree, default (cache_finished_suffix)
# at page size 1 (and old / new at page size 16). Usage: radix-here.sh NEW_BUILD OLD_BUILD
N=$1; O=$2
for i in 1 2 3 4 5 6; do
  echo "old-ps1 $($O/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 1)"
  echo "oldlib-ps1 $(LD_LIBRARY_PATH=$O/core $N/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 1 --finish-whole)"
  echo "whole-ps1 $($N/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 1 --finish-whole)"
  echo "new-ps1 $($N/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 1)"
  echo "new-ps1-cold $($N/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 1 --cold-tokens)"
  echo "old-ps16 $($O/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 16)"
  echo "new-ps16 $($N/tools/kvhal-replay --no-kv --repeat 20 --quiet --json --page-size 16)"
done

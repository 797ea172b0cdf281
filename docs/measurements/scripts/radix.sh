#!/bin/bash
# kvhal-replay --no-kv on the GPU machine's Xeon (a quieter CPU than the dev VM), page sizes 1 and 16.
cd "$(dirname "$0")/.."
source .devdeps/env.sh
B=/tmp/br; rm -rf $B
meson setup $B -Dbackends=cpu -Dbuildtype=release > /dev/null 2>&1 && ninja -C $B tools/kvhal-replay > /dev/null 2>&1 || exit 1
lscpu | grep "Model name"
for i in 1 2 3; do for ps in 1 16; do
  echo "ps $ps: $($B/tools/kvhal-replay --no-kv --page-size $ps --repeat 20 --quiet | grep -E 'throughput|cache ops' | sed 's/ tokens\/s.*best pass/, best pass/' | paste -sd' ')"
done; done

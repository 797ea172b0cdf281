#!/bin/bash
# first_run.sh: the CPU time of the README's first command, from a clean clone.
#
# What: a fresh clone of this repository (git clone of HEAD into $OUT/clone), then the README's first command's
#   three steps, each under the shell's `times` accounting (user + system CPU of the step and its children):
#   the package set-up (`bash .ci/setup cpu`: only when run as root; otherwise the packages must already be there
#   and the line says "not run"), `meson setup build -Dbackends=cpu -Dtests=false` with `ninja -C build
#   tools/kvhal-replay`, and `build/tools/kvhal-replay` (the main job). CPU time, not wall time: on a shared machine
#   the wall time depends on the other work running.
# Machine: any Debian 12; the README's figure: a 2-core x86-64 machine shared with other builds.
# Run (repository root): bash bench/first_run.sh      OUT=/tmp/kvhal-first-run (removed and made again)
# Output: one line per step, "<step>: <user> s user, <sys> s system", and the total.
set -euo pipefail
src=$(pwd -P)
OUT=${OUT:-/tmp/kvhal-first-run}
rm -rf "$OUT" && mkdir -p "$OUT"
git clone -q "$src" "$OUT/clone"
cd "$OUT/clone"
# cpu_of CMD...: runs CMD in a child shell and prints the CPU seconds it and its children used (user system)
cpu_of() {
  bash -c 'set -e; "$@" > /dev/null 2>&1; times' _ "$@" | tail -1 |
    awk '{ split($1, u, "m"); split($2, s, "m"); printf "%.1f %.1f\n", u[1] * 60 + u[2], s[1] * 60 + s[2] }'
}
total_u=0 total_s=0
step() {
  local name=$1; shift
  read -r u s < <(cpu_of "$@")
  printf '%-28s %6.1f s user, %5.1f s system\n' "$name:" "$u" "$s"
  total_u=$(echo "$total_u + $u" | bc) total_s=$(echo "$total_s + $s" | bc)
}
if [ "$(id -u)" = 0 ]; then step "set-up (.ci/setup cpu)" bash .ci/setup cpu
else echo "set-up (.ci/setup cpu):      not run (not root); the packages must already be installed"; fi
step "build (cpu, kvhal-replay)" bash -c 'meson setup build -Dbackends=cpu -Dtests=false && ninja -C build tools/kvhal-replay'
step "main job (kvhal-replay)" build/tools/kvhal-replay
printf '%-28s %6.1f s user, %5.1f s system\n' "total:" "$total_u" "$total_s"

#!/bin/bash
# Wavefront 64 (gfx90a) and 32 (gfx1030): every GPU source compiled by hipcc for both, with the compiler's per-kernel
# resource report: kernels, largest VGPR count, kernels with scratch memory or VGPR spills (memory: a kernel whose
# vector registers do not fit the wave size's budget), kernels with SGPR spills (into VGPR lanes, no memory traffic).
# Fails on scratch or VGPR spills. Run from the repository root on the development machine.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for arch in gfx90a gfx1030; do
  for src in backends/gpu/gpu_*.cu; do
    hipcc -x hip -std=c++20 -O3 --offload-arch=$arch -Rpass-analysis=kernel-resource-usage -Iapi -Ibackends/gpu \
      -c "$src" -o "$tmp/o.o" 2>>"$tmp/$arch.txt"
  done
  k=$(grep -c 'Function Name:' "$tmp/$arch.txt" || true)
  vg=$(grep -o 'VGPRs: [0-9]*' "$tmp/$arch.txt" | awk '{if ($2 > m) m = $2} END {print m + 0}')
  sp=$(grep -cE 'ScratchSize \[bytes/lane\]: [1-9]|VGPRs Spill: [1-9]' "$tmp/$arch.txt" || true)
  ss=$(grep -cE 'SGPRs Spill: [1-9]' "$tmp/$arch.txt" || true)
  occ=$(grep -o 'Occupancy \[waves/SIMD\]: [0-9]*' "$tmp/$arch.txt" | awk '{print $3}' | sort -n | uniq -c | tr '\n' ' ')
  echo "$arch: $k kernels, max VGPRs $vg, with scratch or VGPR spills: $sp, with SGPR spills (to VGPR lanes): $ss, occupancy (kernels x waves/SIMD): $occ"
  [ "$sp" -eq 0 ] || status=1
done
exit $status

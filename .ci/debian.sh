#!/bin/bash
# CI stage (runs alone too): the Debian packages. dpkg-buildpackage -us -uc -b on a copy of the tree (the working
# tree stays clean), lintian on the result (no errors), the .debs unpacked into a scratch root (dpkg -x) and used:
# kvhal-info finds the OpenCL module in <libdir>/kvhal-0 beside the library, and a consumer is built against the
# -dev package with pkg-config and with CMake and run.
#   DEB_BUILD_PROFILES="pkg.kvhal.nocuda pkg.kvhal.nohip" .ci/debian.sh   # without the GPU modules (faster)
#   DEB_BUILD_OPTIONS=nocheck .ci/debian.sh                                # without the package's test suites
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin
work=${KVHAL_DEB_DIR:-/tmp/kvhal-deb}
version=$(dpkg-parsechangelog -S Version)
rm -rf "$work" && mkdir -p "$work/kvhal-$version"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work/kvhal-$version"
git diff --name-only -z | xargs -0 -r -I{} cp {} "$work/kvhal-$version/{}"   # uncommitted changes of a local run
git ls-files -z --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work/kvhal-$version"
if [ -z "${DEB_BUILD_PROFILES:-}" ] && ! command -v nvcc >/dev/null; then
  export DEB_BUILD_PROFILES="pkg.kvhal.nocuda"; echo "debian: no nvcc, building without the CUDA package"
fi
echo "debian: dpkg-buildpackage -us -uc -b (profiles: ${DEB_BUILD_PROFILES:-none}, options: ${DEB_BUILD_OPTIONS:-none})"
(cd "$work/kvhal-$version" && dpkg-buildpackage -us -uc -b -j2 > "$work/build.log" 2>&1) ||
  { tail -60 "$work/build.log" >&2; echo "debian: dpkg-buildpackage failed (log: $work/build.log)" >&2; exit 1; }
ls -1 "$work"/*.deb
changes=$(ls "$work"/kvhal_*.changes)

echo "debian: lintian"
lintian --fail-on error "$changes" | tee "$work/lintian.txt" || {
  echo "debian: lintian reported errors" >&2; exit 1; }
echo "lintian: $(grep -c '^E:' "$work/lintian.txt" || true) errors, $(grep -c '^W:' "$work/lintian.txt" || true) warnings"

echo "debian: no file in two packages (dpkg would refuse to install the second)"
for d in "$work"/*.deb; do dpkg -c "$d" | awk '$1 !~ /^d/ {print $6}'; done | sort | uniq -d > "$work/shared-files.txt"
if [ -s "$work/shared-files.txt" ]; then echo "debian: files in more than one package:" >&2; cat "$work/shared-files.txt" >&2; exit 1; fi

echo "debian: unpack into a scratch root and use it"
root=$work/root
for d in "$work"/*.deb; do dpkg -x "$d" "$root"; done
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=$root/usr/lib/$ma
test -f "$libdir/kvhal-0/libkvhal-opencl.so"
LD_LIBRARY_PATH=$libdir KVHAL_BACKEND_PATH= "$root/usr/bin/kvhal-info" --version
LD_LIBRARY_PATH=$libdir KVHAL_BACKEND_PATH= "$root/usr/bin/kvhal-info" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
m = {x["name"]: x for x in d["modules"]}
assert "opencl" in m and "/kvhal-0/" in m["opencl"]["path"], m
print("packaged modules:", ", ".join("%s (%s, loaded=%s)" % (n, x["path"], x["loaded"]) for n, x in m.items()))'
pcflags() { PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --define-variable=prefix="$root/usr" "$@" kvhal; }
cc -std=c11 -Wall -Wextra -pedantic -Werror examples/engine_step.c $(pcflags --cflags --libs) -o "$work/engine_step"
LD_LIBRARY_PATH=$libdir "$work/engine_step"
mkdir -p "$work/cmake-src"
cp .ci/consumer/CMakeLists.txt .ci/consumer/consumer.cpp .ci/consumer/xfer_consumer.c examples/paged_cache.c "$work/cmake-src/"
cmake -S "$work/cmake-src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$root/usr" -DKVHAL_CONSUMER_XFER=ON >/dev/null
cmake --build "$work/cmake-build" -j2 >/dev/null
LD_LIBRARY_PATH=$libdir "$work/cmake-build/paged_cache"
LD_LIBRARY_PATH=$libdir "$work/cmake-build/xfer_consumer"
# libkvhal-xfer: a consumer through its pkg-config file (which requires kvhal's; CMake's kvhal::xfer above), and
# the packaged tool's self-test
test -f "$libdir/libkvhal-xfer.so.0"
cc -std=c11 -Wall -Wextra -pedantic -Werror .ci/consumer/xfer_consumer.c $(pcflags --cflags --libs kvhal-xfer) -o "$work/xfer_consumer"
LD_LIBRARY_PATH=$libdir "$work/xfer_consumer"
LD_LIBRARY_PATH=$libdir KVHAL_BACKEND_PATH= "$root/usr/bin/kvhal-xfer" --self-test --quiet
# the tools' man pages are in the packages, one per tool; kvhal-doc holds the HTML reference, the guides, the examples
for t in "$root"/usr/bin/kvhal-*; do
  test -s "$root/usr/share/man/man1/$(basename "$t").1.gz" || { echo "debian: no man page for $(basename "$t")" >&2; exit 1; }
done
for f in html/kvhal_8h.html html/kvhal__xfer_8h.html html/kvhal__numerics_8h.html guide.md vendor-guide.md \
         ARCHITECTURE.md examples/vendor-plugin/npu_ops.c; do
  test -e "$root/usr/share/doc/kvhal/$f" || test -e "$root/usr/share/doc/kvhal/$f.gz" ||
    { echo "debian: kvhal-doc lacks usr/share/doc/kvhal/$f" >&2; exit 1; }
done
# the packaged kvhal-conformance on the CPU
LD_LIBRARY_PATH=$libdir KVHAL_BACKEND_PATH= "$root/usr/bin/kvhal-conformance" --device=cpu:0 >/dev/null
# python3-kvhal: the packaged Python package over the packaged library, a vLLM-style call through it
(cd /tmp && PYTHONPATH=$root/usr/lib/python3/dist-packages LD_LIBRARY_PATH=$libdir KVHAL_BACKEND_PATH= /usr/bin/python3 -c '
import numpy as np, kvhal
from kvhal.compat import vllm
assert kvhal.__file__.startswith("'"$root"'"), kvhal.__file__
kc = np.zeros((2, 4, 1, 8), np.float16); k = np.ones((3, 1, 8), np.float16)
vllm.reshape_and_cache_flash(k, k, kc, kc.copy(), np.array([0, 5], np.int64), "auto", 1.0, 1.0)
assert kc[0, 0].all() and kc[1, 1].all() and not kc[0, 1].any()
print("python3-kvhal:", kvhal.__file__)')
echo "debian: packages built, lintian clean of errors, consumers built against them and run"

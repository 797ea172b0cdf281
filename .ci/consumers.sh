#!/bin/bash
# CI stage (runs alone too): kvhal consumed the four ways an engine's build does it.
#   1. C through pkg-config from an installed tree (#include <kvhal/kvhal.h>), run; libkvhal-xfer through
#      pkg-config kvhal-xfer, run.
#   2. C++ (g++ -std=c++17 -Wall -Wextra -pedantic -Werror) through pkg-config, run.
#   3. CMake find_package(kvhal 0.1 COMPONENTS xfer) -> kvhal::kvhal and kvhal::xfer, run; find_package(kvhal 1)
#      and an unknown component must fail.
#   4. Meson: a project using kvhal as a subproject (dependency('kvhal') and dependency('kvhal-xfer'), no cmocka, no
#      kvhal tests or tools).
# The tree is installed with its own prefix (/tmp/kvhal-consumers/usr) and moved afterwards, to check that pkg-config
# (--define-variable=prefix), CMake and the tools' $ORIGIN runpath do not depend on where it was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=${KVHAL_CONSUMERS_DIR:-/tmp/kvhal-consumers}
rm -rf "$work" && mkdir -p "$work"
step() { printf '\n--- consumers: %s ---\n' "$*"; }

step "build and install (cpu, static library too) into $work/usr"
meson setup "$work/build" -Dbackends=cpu -Dtests=false -Dexamples=false -Dstatic_library=true -Dtransfer=ucx \
  --prefix="$work/usr" --libdir=lib/x86_64-linux-gnu >/dev/null
ninja -C "$work/build" >/dev/null
meson install -C "$work/build" --quiet
mv "$work/usr" "$work/moved"   # relocated: nothing below may rely on the install prefix
root=$work/moved; libdir=$root/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR= 
pcflags() { pkg-config --define-variable=prefix="$root" "$@" kvhal; }
echo "pkg-config --cflags: $(pcflags --cflags)"
echo "pkg-config --libs:   $(pcflags --libs)"
echo "moduledir:           $(pkg-config --define-variable=prefix="$root" --variable=moduledir kvhal)"
test "$(pkg-config --define-variable=prefix="$root" --variable=moduledir kvhal)" = "$libdir/kvhal-0"
test -x "$root/bin/kvhal-info"
"$root/bin/kvhal-info" --version   # $ORIGIN runpath: found libkvhal.so.0 after the move, no LD_LIBRARY_PATH

step "1. C through pkg-config"
cc -std=c11 -Wall -Wextra -pedantic -Werror examples/paged_cache.c $(pcflags --cflags --libs) \
  -Wl,-rpath,"$libdir" -o "$work/paged_cache_c"
"$work/paged_cache_c"
step "1b. C, static (pkg-config --static)"
cc -std=c11 -Wall -Wextra -pedantic -Werror examples/engine_step.c $(pcflags --cflags) \
  "$libdir/libkvhal.a" $(pkg-config --libs-only-l --static kvhal | sed 's/-lkvhal//') \
  -o "$work/engine_step_static"
if objdump -p "$work/engine_step_static" | grep -q 'NEEDED.*libkvhal'; then echo "static link needs libkvhal.so" >&2; exit 1; fi
"$work/engine_step_static"

step "1b'. a fully static program (cc -static): loading a module is refused with a message, cpu:0 works"
make -s -C examples/vendor-plugin O="$work/npu" PKG_CONFIG="pkg-config --define-variable=prefix=$root" EXTRA_CFLAGS=-Werror
cc -std=c11 -Wall -Wextra -pedantic -Werror -static .ci/consumer/static_load.c $(pcflags --cflags) \
  "$libdir/libkvhal.a" $(pkg-config --libs-only-l --static kvhal | sed 's/-lkvhal//') -o "$work/static_load" 2>"$work/static_link.log" ||
  { cat "$work/static_link.log" >&2; exit 1; }
"$work/static_load" "$work/npu/libkvhal-npu.so"

step "1c. C through pkg-config kvhal-xfer (libkvhal-xfer, which requires kvhal)"
cc -std=c11 -Wall -Wextra -pedantic -Werror .ci/consumer/xfer_consumer.c $(pkg-config --define-variable=prefix="$root" \
  --cflags --libs kvhal-xfer) -Wl,-rpath,"$libdir" -o "$work/xfer_consumer_c"
"$work/xfer_consumer_c"

step "2. C++ (g++ -Wall -Wextra -pedantic)"
g++ -std=c++17 -Wall -Wextra -pedantic -Werror .ci/consumer/consumer.cpp $(pcflags --cflags --libs) \
  -Wl,-rpath,"$libdir" -o "$work/consumer_cpp"
"$work/consumer_cpp"

step "3. CMake find_package(kvhal)"
mkdir -p "$work/cmake-src"
cp .ci/consumer/CMakeLists.txt .ci/consumer/consumer.cpp .ci/consumer/xfer_consumer.c examples/paged_cache.c "$work/cmake-src/"
cmake -S "$work/cmake-src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$root" -DCMAKE_BUILD_TYPE=Release -DKVHAL_CONSUMER_XFER=ON \
  -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" -DCMAKE_CXX_FLAGS="-Wall -Wextra -pedantic -Werror" | grep -i kvhal
cmake --build "$work/cmake-build" -j2 >/dev/null
"$work/cmake-build/paged_cache"
"$work/cmake-build/consumer_cpp"
"$work/cmake-build/xfer_consumer"
mkdir -p "$work/cmake-nosuch"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(v C)\nfind_package(kvhal 0.1 REQUIRED COMPONENTS nosuch)\n' > "$work/cmake-nosuch/CMakeLists.txt"
if cmake -S "$work/cmake-nosuch" -B "$work/cmake-nosuch/b" -DCMAKE_PREFIX_PATH="$root" >/dev/null 2>&1; then
  echo "find_package(kvhal COMPONENTS nosuch) accepted" >&2; exit 1
fi
echo "find_package(kvhal COMPONENTS nosuch) refused, as it must be"
mkdir -p "$work/cmake-v1"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(v C)\nfind_package(kvhal 1 REQUIRED)\n' > "$work/cmake-v1/CMakeLists.txt"
if cmake -S "$work/cmake-v1" -B "$work/cmake-v1/b" -DCMAKE_PREFIX_PATH="$root" >/dev/null 2>&1; then
  echo "find_package(kvhal 1) accepted kvhal $(pkg-config --modversion kvhal)" >&2; exit 1
fi
echo "find_package(kvhal 1) refused, as it must be"

step "4. Meson: kvhal as a subproject"
mkdir -p "$work/meson-src/subprojects"
cp .ci/consumer/meson.build .ci/consumer/xfer_consumer.c examples/engine_step.c "$work/meson-src/"
git ls-files -z | tar --null -T - -cf - | (mkdir -p "$work/meson-src/subprojects/kvhal" && tar -xf - -C "$work/meson-src/subprojects/kvhal")
# the working tree's uncommitted changes too (CI runs on commits; this keeps a local run honest)
git diff --name-only -z | xargs -0 -r -I{} cp {} "$work/meson-src/subprojects/kvhal/{}"
PKG_CONFIG_PATH= meson setup "$work/meson-build" "$work/meson-src" --force-fallback-for=kvhal >/dev/null
ninja -C "$work/meson-build" >/dev/null
for d in tests tools examples/example_paged_cache; do
  if [ -e "$work/meson-build/subprojects/kvhal/$d" ]; then echo "subproject built kvhal's $d" >&2; exit 1; fi
done
meson test -C "$work/meson-build" --print-errorlogs
echo "consumers: all four build systems OK"

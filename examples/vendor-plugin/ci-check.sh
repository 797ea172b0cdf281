#!/bin/sh
# ci-check.sh <install-root> <build-dir>
# Proves that a vendor can build and test a backend module outside the kvhal tree: builds this example with its
# Makefile against the kvhal installed under <install-root> (a `meson install --destdir <install-root>` tree, found
# through its kvhal.pc with PKG_CONFIG_SYSROOT_DIR, so every -I points into that tree), checks the module exports
# kvhal_backend_entry only and needs no libkvhal, then runs the installed kvhal-conformance on npu:0 with only this
# module on KVHAL_BACKEND_PATH, and the installed kvhal-info listing the module and its devices. Last, a copy of the
# module with one op made wrong (copy_blocks skips its last pair) must fail kvhal-conformance, which names the op.
# <build-dir> only holds the scratch folder (vendor-plugin-ci).
set -eu

if [ $# -ne 2 ]; then
  echo "usage: $0 <install-root> <build-dir>" >&2
  exit 2
fi
root=$(cd "$1" && pwd -P)
build=$(cd "$2" && pwd -P)
here=$(cd "$(dirname "$0")" && pwd -P)
out="$build/vendor-plugin-ci"

# ---- the installed kvhal.pc: lib/<arch>/pkgconfig or lib/pkgconfig under any prefix of the install tree ----
pcdirs=$(find "$root" -name kvhal.pc -path '*/pkgconfig/*' -exec dirname {} \; | sort -u | tr '\n' ':')
if [ -z "$pcdirs" ]; then
  echo "ci-check: no kvhal.pc under $root (run: meson install -C <build> --destdir $root)" >&2
  exit 1
fi
# PKG_CONFIG_LIBDIR (not _PATH): only the install tree is searched, never a kvhal installed on this machine.
PKG_CONFIG_LIBDIR=${pcdirs%:}
PKG_CONFIG_SYSROOT_DIR=$root
export PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR
cflags=$(pkg-config --cflags kvhal)
echo "ci-check: pkg-config --cflags kvhal = $cflags"
case "$cflags" in
  *"-I$root/"*) ;;
  *) echo "ci-check: the include path does not point into $root" >&2; exit 1 ;;
esac

# ---- build from a copy of this folder outside the tree, so nothing can reach into kvhal's sources ----
rm -rf "$out"
mkdir -p "$out/src"
cp "$here/Makefile" "$here"/*.c "$here"/*.h "$out/src/"
make -C "$out/src" O="$out" EXTRA_CFLAGS=-Werror
module="$out/libkvhal-npu.so"

exports=$(nm -D --defined-only "$module" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}')
if [ "$exports" != "kvhal_backend_entry" ]; then
  echo "ci-check: $module exports more or less than kvhal_backend_entry:" >&2
  echo "$exports" >&2
  exit 1
fi
if readelf -d "$module" | grep -q 'NEEDED.*libkvhal'; then
  echo "ci-check: $module links libkvhal; a module must not" >&2
  exit 1
fi
echo "ci-check: $module exports kvhal_backend_entry only and links no libkvhal"

# ---- the install tree's tools (with its libkvhal) ----
# pkgconf may or may not put the sysroot in front of a variable: take it off, then put it on.
in_root() { echo "$root$(pkg-config --variable="$1" kvhal | sed "s|^$root||")"; }
bindir="$(in_root prefix)/bin"
libdir=$(in_root libdir)
for t in kvhal-conformance kvhal-info; do
  [ -x "$bindir/$t" ] || { echo "ci-check: $bindir/$t is not installed" >&2; exit 1; }
done
run_installed() {
  LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
}

# ---- the installed kvhal-conformance on npu:0, with this module the only one on the path ----
KVHAL_BACKEND_PATH="$out" run_installed "$bindir/kvhal-conformance" --device=npu:0
info="$bindir/kvhal-info"
# KVHAL_DEVICE=npu:1: kvhal-info fails unless the module's second device is there.
status=0
listing=$(KVHAL_BACKEND_PATH="$out" KVHAL_DEVICE=npu:1 run_installed "$info") || status=$?
echo "$listing"
[ "$status" -eq 0 ] || { echo "ci-check: $info failed ($status)" >&2; exit 1; }
echo "$listing" | grep -q "example-npu $module" || { echo "ci-check: kvhal-info does not list $module" >&2; exit 1; }
echo "$listing" | grep -q "ABI 2, loaded, device type npu" || { echo "ci-check: the module did not load" >&2; exit 1; }

# ---- a wrong module: the same sources with copy_blocks skipping its last pair must fail, naming copy_blocks ----
bad="$out/bad"
mkdir -p "$bad/src"
cp "$out/src"/* "$bad/src/"
sed -i 's/for (int32_t i = 0; i < a->num_pairs; i++) {/for (int32_t i = 0; i + 1 < a->num_pairs; i++) {/' "$bad/src/npu_ops.c"
if cmp -s "$out/src/npu_ops.c" "$bad/src/npu_ops.c"; then
  echo "ci-check: could not make the wrong module (npu_copy_blocks changed?)" >&2
  exit 1
fi
make -s -C "$bad/src" O="$bad" EXTRA_CFLAGS=-Werror
status=0
err=$(KVHAL_BACKEND_PATH="$bad" run_installed "$bindir/kvhal-conformance" --device=npu:0 2>&1 >/dev/null) || status=$?
echo "$err"
[ "$status" -eq 1 ] || { echo "ci-check: kvhal-conformance on the wrong module: exit status $status, expected 1" >&2; exit 1; }
echo "$err" | grep -q "npu:0: op copy_blocks failed" || { echo "ci-check: the failure does not name copy_blocks" >&2; exit 1; }
echo "ci-check: the wrong module fails kvhal-conformance, naming copy_blocks"
echo "ci-check: ok"

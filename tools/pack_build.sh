#!/usr/bin/env bash
# Packs what tools/gpu_check.sh runs from a cuda preset build into DEST (for the GPU host, where a
# transfer carries at most 64 MiB): the stripped binaries as one xz tarball (~21 MB; unstripped they
# are ~190 MB) and the Debian-only shared libraries (tools/ship_libs.sh).
# Usage: tools/pack_build.sh BUILD_DIR DEST
#   on the GPU host: mkdir -p BUILD_DIR && tar xJf DEST/build.tar.xz -C BUILD_DIR
set -euo pipefail
build=$(realpath "${1:?usage: pack_build.sh BUILD_DIR DEST}")
dest=${2:?usage: pack_build.sh BUILD_DIR DEST}
cd "$(dirname "$0")/.."
bash tools/ship_libs.sh "$build" >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for f in mlaserve bench/mla_bench_gpu tests/mlaserve_gpu_tests src/backend/gpu/mla_gpu_info; do
  mkdir -p "$stage/$(dirname "$f")"
  strip -o "$stage/$f" "$build/$f"
done
cp -r "$build/shipped-libs" "$stage/"
mkdir -p "$dest"
tar cf - -C "$stage" . | xz -6 -T"$(nproc)" >"$dest/build.tar.xz"
ls -l "$dest/build.tar.xz"

#!/usr/bin/env bash
# Copies the Debian-only shared libraries a build's binaries need into BUILD_DIR/shipped-libs, so the
# build can run on the GPU host (Ubuntu, no Debian packages; see shared/GPU.md). gpu_check.sh puts
# that folder on LD_LIBRARY_PATH. Usage: tools/ship_libs.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: ship_libs.sh BUILD_DIR}
dest="$build/shipped-libs"
mkdir -p "$dest"
for bin in "$build"/mlaserve "$build"/tests/mlaserve* "$build"/tests/mla_bench* "$build"/bench/mla_bench* \
           "$build"/src/backend/gpu/mla_gpu_info; do
  [ -x "$bin" ] && [ -f "$bin" ] || continue
  ldd "$bin" | awk '/=>/ {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libfmt.so.*|libopenblas.so.*|libgfortran.so.*|libquadmath.so.*|libgomp.so.*|libcpp-httplib.so.*|libbrotli*.so.*) cp -L "$lib" "$dest/" ;;
    esac
  done
done
ls "$dest"

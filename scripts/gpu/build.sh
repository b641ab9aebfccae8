#!/usr/bin/env bash
# GPU machine build: unpacks the staged .debs (.deps/debs, from ../shared/device/stage-debs.sh),
# configures a Release build with CUDA and the system python's LibTorch, builds everything the
# tests need with -j16. Usage: scripts/gpu/build.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/build.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
log=$OUTDIR/logs/build.log
cd "$GPU_ROOT" || exit 1

if [ ! -d "$DEPS_PREFIX" ]; then
  if ! ls .deps/debs/*.deb >/dev/null 2>&1; then
    record build FAIL "no .deps/debs/*.deb: run ../shared/device/stage-debs.sh on the dev machine and carry .deps"
    exit 1
  fi
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/prefix || { record build FAIL "dpkg -x $f failed"; exit 1; }; done
fi
# The .pc files of the unpacked packages say prefix=/usr: the sysroot points them into .deps.
# A machine without pkg-config (CMake's find_package(PkgConfig) needs one) can use a staged one
# (stage-debs.sh pkgconf pkgconf-bin libpkgconf3).
export PKG_CONFIG_LIBDIR=$DEPS_PREFIX/lib/x86_64-linux-gnu/pkgconfig:$DEPS_PREFIX/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$GPU_ROOT/.deps/prefix
if ! command -v pkg-config >/dev/null && [ -x "$DEPS_PREFIX/bin/pkg-config" ]; then
  export PATH="$DEPS_PREFIX/bin:$PATH"
fi
torch_prefix=$("$PYTHON" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>>"$log") \
  || { record build FAIL "$PYTHON cannot import torch (see logs/build.log)"; exit 1; }

start=$SECONDS
{
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DOURGPIPE_WITH_CUDA=ON -DOURGPIPE_WITH_TORCH=ON -DOURGPIPE_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 -DOURGPIPE_PYTHON="$(command -v "$PYTHON")" \
    -DCMAKE_PREFIX_PATH="$DEPS_PREFIX;$torch_prefix" &&
  cmake --build "$BUILD_DIR" -j 16
} >>"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  record build FAIL "cmake configure/build failed, rc=$rc, $((SECONDS - start)) s (tail of logs/build.log: $(tail -n 3 "$log" | tr '|\n' '/ ' | cut -c1-300))"
  exit 1
fi
record build PASS "Release, CUDA + LibTorch $("$PYTHON" -c 'import torch;print(torch.__version__)'), $((SECONDS - start)) s"

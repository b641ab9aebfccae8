#!/usr/bin/env bash
# GPU machine build step, for a bare machine:
#   1. a build already here (GPU_CHECK_BUILD_DIR with gpipe_runner): use it;
#   2. else the archive an earlier call returned, carried as .gpu-bin/gpu-bin.tar.gz: unpack it;
#   3. else check every staged package up front (naming what is missing), configure a Release
#      build with CUDA and the system python's LibTorch, build only the targets the checks need
#      (GPU_BUILD_TARGETS) with one job per core, and pack them, stripped, as $GPU_CHECK_OUT/gpu-bin.tar.gz
#      (under 16 MiB) for the next calls.
# TensorBoard event files are left out (no check reads them, and the GPU image's own protobuf, found
# before the staged packages, need not match what the trainer was tested with).
# GPU_CHECK_CMAKE_ARGS adds configure arguments (the rehearsal hides this machine's protobuf and
# Boost, which the GPU image lacks).
# Usage: scripts/gpu/build.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/build.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
log=$OUTDIR/logs/build.log
cd "$GPU_ROOT" || exit 1
start=$SECONDS

if [ -x "$RUNNER" ] && [ -f "$SHIM" ]; then
  record build PASS "reused $BUILD_DIR"
  exit 0
fi
archive=$GPU_ROOT/.gpu-bin/gpu-bin.tar.gz
if [ -f "$archive" ]; then
  mkdir -p "$BUILD_DIR"
  if tar -C "$BUILD_DIR" -xzf "$archive" >>"$log" 2>&1 && [ -x "$RUNNER" ] && [ -f "$SHIM" ]; then
    record build PASS "unpacked .gpu-bin/gpu-bin.tar.gz ($(tar -tzf "$archive" | grep -vc '/$') files) in $((SECONDS - start)) s"
    exit 0
  fi
  record build INFO "could not use .gpu-bin/gpu-bin.tar.gz (logs/build.log): building instead"
fi

# What the build takes from the staged packages (scripts/gpu/stage-debs.sh), checked before
# anything is configured: "file|package".
need_staged=(
  "include/spdlog/spdlog.h|libspdlog-dev"
  "include/fmt/format.h|libfmt-dev"
  "include/tbb/tbb.h|libtbb-dev"
  "include/yaml-cpp/yaml.h|libyaml-cpp-dev"
  "include/CLI/CLI.hpp|libcli11-dev"
  "include/nlohmann/json.hpp|nlohmann-json3-dev"
  "include/gtest/gtest.h|libgtest-dev"
  "include/gmock/gmock.h|libgmock-dev"
  "include/gloo/algorithm.h|libgloo-dev (c10d's ProcessGroupGloo headers)"
  "include/zlib.h|zlib1g-dev"
  "include/GL/gl.h|libgl-dev (the shim's GL interop wrappers)"
  "include/KHR/khrplatform.h|libgl-dev"
  "include/EGL/egl.h|libegl-dev (the shim's EGL interop wrappers)"
  "include/vdpau/vdpau.h|libvdpau-dev (the shim's VDPAU interop wrappers)"
)
if ! ensure_deps; then
  record build FAIL "no .deps/debs/*.deb: run scripts/gpu/stage-debs.sh on the dev machine and carry .deps"
  exit 1
fi
missing=()
for entry in "${need_staged[@]}"; do
  file=${entry%%|*}
  [ -e "$DEPS_PREFIX/$file" ] || [ -e "/usr/$file" ] || missing+=("${entry#*|}")
done
command -v pkg-config >/dev/null || [ -x "$DEPS_PREFIX/bin/pkg-config" ] || missing+=("pkgconf (pkg-config)")
command -v cmake >/dev/null || missing+=("cmake (not stageable: the GPU image must have it)")
command -v ninja >/dev/null || missing+=("ninja (not stageable: the GPU image must have it)")
if [ ${#missing[@]} -gt 0 ]; then
  record build FAIL "missing before configure: ${missing[*]} (add them to scripts/gpu/stage-debs.sh, stage, carry .deps)"
  exit 1
fi
# The .pc files of the unpacked packages say prefix=/usr: the sysroot points them into .deps.
export PKG_CONFIG_LIBDIR=$DEPS_PREFIX/lib/x86_64-linux-gnu/pkgconfig:$DEPS_PREFIX/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$GPU_ROOT/.deps/prefix
if ! command -v pkg-config >/dev/null && [ -x "$DEPS_PREFIX/bin/pkg-config" ]; then
  export PATH="$DEPS_PREFIX/bin:$PATH"
fi
torch_prefix=$("$PYTHON" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>>"$log") \
  || { record build FAIL "$PYTHON cannot import torch (see logs/build.log)"; exit 1; }

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DOURGPIPE_WITH_CUDA=ON -DOURGPIPE_WITH_TORCH=ON -DOURGPIPE_BUILD_BENCHMARKS=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 -DOURGPIPE_PYTHON="$(command -v "$PYTHON")" \
  -DCMAKE_PREFIX_PATH="$DEPS_PREFIX;$torch_prefix" -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON \
  ${GPU_CHECK_CMAKE_ARGS:-} >>"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  record build FAIL "cmake configure failed, rc=$rc, $((SECONDS - start)) s (tail of logs/build.log: $(tail -n 3 "$log" | tr '|\n' '/ ' | cut -c1-300))"
  exit 1
fi
# Only what the checks and the GPU-labelled tests run; a target this configuration lacks (no
# NVRTC: no gpu_driver_rules) is left out and named.
targets=()
absent=()
for t in $GPU_BUILD_TARGETS; do
  if ninja -C "$BUILD_DIR" -t query "$t" >/dev/null 2>&1; then targets+=("$t"); else absent+=("$t"); fi
done
cmake --build "$BUILD_DIR" -j "${GPU_CHECK_JOBS:-$(nproc)}" --target "${targets[@]}" -- -k 0 >>"$log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  record build FAIL "build failed, rc=$rc, $((SECONDS - start)) s (tail of logs/build.log: $(tail -n 3 "$log" | tr '|\n' '/ ' | cut -c1-300))"
  exit 1
fi
built="Release, CUDA + LibTorch $("$PYTHON" -c 'import torch;print(torch.__version__)'), ${#targets[@]} targets in $((SECONDS - start)) s${absent[*]:+ (not in this configuration: ${absent[*]})}"
if [ -n "${GPU_CHECK_OUT:-}" ]; then
  if packed=$("$(dirname "$0")/pack_binaries.sh" "$BUILD_DIR" "$GPU_CHECK_OUT/gpu-bin.tar.gz" $GPU_PACKED_FILES 2>>"$log"); then
    built="$built; $packed"
  else
    built="$built; packing the archive failed (logs/build.log): later calls must build"
  fi
fi
record build PASS "$built"

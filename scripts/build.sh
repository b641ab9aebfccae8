#!/usr/bin/env bash
# Configure and build into build/ (or $OURGPIPE_BUILD_DIR). Extra arguments go to cmake's configure.
# Configures only when the build folder is new or the arguments changed (ninja re-runs cmake by
# itself when a CMakeLists.txt changes); OURGPIPE_RECONFIGURE=1 forces it.
# OURGPIPE_TARGETS="gpipe_runner gpu_scheduler" builds only those targets (scripts/run.sh builds
# what it runs; scripts/test.sh builds everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${OURGPIPE_BUILD_DIR:-$root/build}
jobs=${OURGPIPE_JOBS:-$(nproc)}
mkdir -p "$build"
log=$build/configure.log
args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${OURGPIPE_BUILD_TYPE:-RelWithDebInfo} "$@")
stamp=$build/.ourgpipe-configure-args
if [ "${OURGPIPE_RECONFIGURE:-0}" = "1" ] || [ ! -f "$build/build.ninja" ] \
   || [ "$(cat "$stamp" 2>/dev/null)" != "${args[*]}" ]; then
  rm -f "$stamp"
  cmake "${args[@]}" >"$log" 2>&1 || { cat "$log"; echo "[build] cmake configure failed (log above)"; exit 1; }
  printf '%s' "${args[*]}" >"$stamp"
fi
grep -E "^-- OurGPipe:" "$log" || true
targets=()
for t in ${OURGPIPE_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$jobs" "${targets[@]}"

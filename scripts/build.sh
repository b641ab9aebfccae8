#!/usr/bin/env bash
# Configure and build into build/ (or $OURGPIPE_BUILD_DIR). Extra arguments go to cmake's configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${OURGPIPE_BUILD_DIR:-$root/build}
jobs=${OURGPIPE_JOBS:-$(nproc)}
mkdir -p "$build"
log=$build/configure.log
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${OURGPIPE_BUILD_TYPE:-RelWithDebInfo} "$@" >"$log" 2>&1 \
  || { cat "$log"; echo "[build] cmake configure failed (log above)"; exit 1; }
grep -E "^-- OurGPipe:" "$log" || true
cmake --build "$build" -j "$jobs"

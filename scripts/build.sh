#!/usr/bin/env bash
# Configure and build into build/ (or $OURGPIPE_BUILD_DIR). Extra arguments go to cmake's configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${OURGPIPE_BUILD_DIR:-$root/build}
jobs=${OURGPIPE_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${OURGPIPE_BUILD_TYPE:-RelWithDebInfo} "$@" >"$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; echo "[build] cmake configure failed (log above)"; exit 1; }
grep -E "^-- OurGPipe:" "$build.configure.log" || true
cmake --build "$build" -j "$jobs"

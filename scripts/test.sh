#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest; then rebuilds the
# scheduler and shim suites under ThreadSanitizer and AddressSanitizer and runs those too.
# OURGPIPE_SKIP_SANITIZERS=1 skips the sanitizer passes (quick local runs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 900

if [ "${OURGPIPE_SKIP_SANITIZERS:-0}" != "1" ]; then
  for san in thread address; do
    echo "[test] $san sanitizer pass (tests labelled 'sanitize')"
    OURGPIPE_BUILD_DIR=$root/build-$san scripts/build.sh -DOURGPIPE_SANITIZE=$san \
      -DOURGPIPE_WITH_TORCH=OFF -DOURGPIPE_BUILD_BENCHMARKS=OFF
    ctest --test-dir "build-$san" -L sanitize --output-on-failure -j "$(nproc)" --timeout 900
  done
fi

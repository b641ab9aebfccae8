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

# The sanitizer passes build only the suites whose tests carry the label (target sanitize_tests),
# and must find as many of those tests as the full build did: a suite missing from the target
# would otherwise just not be there.
count_sanitize_tests() { ctest --test-dir "$1" -L sanitize -N | sed -n 's/^Total Tests: //p'; }
if [ "${OURGPIPE_SKIP_SANITIZERS:-0}" != "1" ]; then
  want=$(count_sanitize_tests build)
  for san in thread address; do
    echo "[test] $san sanitizer pass (tests labelled 'sanitize')"
    OURGPIPE_BUILD_DIR=$root/build-$san OURGPIPE_TARGETS=sanitize_tests scripts/build.sh -DOURGPIPE_SANITIZE=$san \
      -DOURGPIPE_WITH_TORCH=OFF -DOURGPIPE_BUILD_BENCHMARKS=OFF
    got=$(count_sanitize_tests "build-$san")
    if [ "$got" != "$want" ]; then
      echo "[test] build-$san has $got tests labelled sanitize, build has $want: a sanitize suite is missing from" \
           "the sanitize_tests target (tests/CMakeLists.txt, ourgpipe_sanitize_suite)" >&2
      exit 1
    fi
    ctest --test-dir "build-$san" -L sanitize --output-on-failure -j "$(nproc)" --timeout 900
  done
fi

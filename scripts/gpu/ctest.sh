#!/usr/bin/env bash
# Runs every registered test of the GPU build (GPU-only tests run here instead of skipping).
# Usage: scripts/gpu/ctest.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/ctest.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
log=$OUTDIR/logs/ctest.log
start=$SECONDS
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 8 --timeout 120 >"$log" 2>&1
rc=$?
summary=$(grep -E "tests passed|tests failed" "$log" | tail -n 1)
skipped=$(grep -c "Skipped" "$log")
if [ $rc -ne 0 ] || [ -z "$summary" ]; then
  record ctest FAIL "${summary:-no ctest summary} (rc=$rc; failures: $(grep -E '^\s+[0-9]+ - ' "$log" | tr -s ' ' | tr '\n' ';' | cut -c1-300))"
  exit 1
fi
record ctest PASS "$summary; $skipped skipped; $((SECONDS - start)) s"

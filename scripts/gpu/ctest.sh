#!/usr/bin/env bash
# Runs the tests labelled `gpu` (the CUDA-only ones, which skip on CPU) on the GPU machine, -j16.
# The CPU suite is CI's job: here it would spend the device's minutes on what CI already ran.
# Usage: scripts/gpu/ctest.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/ctest.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
log=$OUTDIR/logs/ctest.log
start=$SECONDS
# -V, not --output-on-failure: a failed CUDA test next to a skipped one is reported as skipped
# (SKIP_REGULAR_EXPRESSION), and its output must still reach the log.
ctest --test-dir "$BUILD_DIR" -L '^gpu$' -V -j 16 --timeout 120 >"$log" 2>&1
rc=$?
summary=$(grep -E "tests passed|tests failed" "$log" | tail -n 1)
skipped=$(grep -c '\*\*\*Skipped' "$log")  # one line per skipped test (not the summary's list)
if grep -q "No tests were found" "$log"; then
  record ctest FAIL "no test labelled gpu in $BUILD_DIR (were engine_tests and replay_gpu_gpu_tests built?)"
  exit 1
fi
if [ $rc -ne 0 ] || [ -z "$summary" ]; then
  record ctest FAIL "${summary:-no ctest summary} (rc=$rc; failures: $(grep -E '^\s+[0-9]+ - ' "$log" | tr -s ' ' | tr '\n' ';' | cut -c1-300))"
  exit 1
fi
if [ "$skipped" -gt 0 ]; then  # a GPU-only test that skips on the GPU machine proved nothing
  record ctest FAIL "$summary, but $skipped skipped (logs/ctest.log says why); $((SECONDS - start)) s"
  exit 1
fi
record ctest PASS "$summary; $((SECONDS - start)) s"

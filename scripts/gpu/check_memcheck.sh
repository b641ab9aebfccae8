#!/usr/bin/env bash
# Check (c): compute-sanitizer memcheck on gpu_hp_be_kernels running under the shim (the shim's
# deferred launches, argument copies and frees are what memcheck can catch); 20 HP iterations
# with 2 BE kernels each keep it short under instrumentation.
# Usage: scripts/gpu/check_memcheck.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_memcheck.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
exe=$(find "$BUILD_DIR" -name gpu_hp_be_kernels -type f -perm -u+x 2>/dev/null | head -n 1)
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
missing=()
[ -n "$exe" ] || missing+=("gpu_hp_be_kernels (not built)")
[ -f "$SHIM" ] || missing+=("$SHIM")
[ -x "$sanitizer" ] || missing+=("compute-sanitizer (not on PATH nor in /usr/local/cuda/bin)")
if [ ${#missing[@]} -gt 0 ]; then
  record "c: memcheck" FAIL "missing: ${missing[*]}"
  exit 1
fi
log=$OUTDIR/logs/memcheck.log
# The shim goes in LD_PRELOAD *around* compute-sanitizer: the sanitizer adds its own injection
# library to the target's LD_PRELOAD, and setting LD_PRELOAD inside its command (env ...) would
# replace that. The shim in the sanitizer's own process passes every call through (it makes no
# CUDA calls of its own that the shim holds).
LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=orion \
  timeout 120 "$sanitizer" --tool memcheck --error-exitcode 99 --target-processes all \
  "$exe" 20 2 >"$log" 2>&1; rc=$?
summary=$(grep -E "ERROR SUMMARY" "$log" | tail -n 1)
if [ $rc -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" "$log"; then
  record "c: memcheck" FAIL "rc=$rc ${summary:-no ERROR SUMMARY line} (logs/memcheck.log)"
  exit 1
fi
if ! grep -q "orion_scheduler=on" "$log"; then
  record "c: memcheck" FAIL "clean, but the shim was not active under compute-sanitizer (no orion_scheduler=on in logs/memcheck.log)"
  exit 1
fi
record "c: memcheck" PASS "$summary (gpu_hp_be_kernels under the shim)"

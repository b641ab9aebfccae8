#!/usr/bin/env bash
# Check (c): compute-sanitizer memcheck on gpu_hp_be_kernels running under the shim (the shim's
# deferred launches, argument copies and frees are what memcheck can catch); 20 HP iterations
# with 2 BE kernels each keep it short under instrumentation. Then one trainer step under the shim.
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
# memcheck ROW LOGNAME SECONDS SHIM_EVIDENCE WHAT -- PROGRAM ARGS...: the program under memcheck and
# the shim; PASS needs "ERROR SUMMARY: 0 errors" and SHIM_EVIDENCE (a regex) in the log.
# The shim goes in LD_PRELOAD *around* compute-sanitizer: the sanitizer adds its own injection
# library to the target's LD_PRELOAD, and setting LD_PRELOAD inside its command (env ...) would
# replace that. The shim in the sanitizer's own process passes every call through (it makes no
# CUDA calls of its own that the shim holds).
memcheck() {
  local row=$1 logname=$2 seconds=$3 evidence=$4 what=$5 log rc summary
  shift 6
  log=$OUTDIR/logs/$logname.log
  LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=orion \
    timeout "$seconds" "$sanitizer" --tool memcheck --error-exitcode 99 --target-processes all "$@" >"$log" 2>&1; rc=$?
  summary=$(grep -E "ERROR SUMMARY" "$log" | tail -n 1)
  if [ $rc -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" "$log"; then
    record "$row" FAIL "rc=$rc ${summary:-no ERROR SUMMARY line} (logs/$logname.log)"
    return 1
  fi
  if ! grep -Eq "$evidence" "$log"; then
    record "$row" FAIL "clean, but the shim was not active under compute-sanitizer (no '$evidence' in logs/$logname.log)"
    return 1
  fi
  record "$row" PASS "$summary ($what)"
}

memcheck "c: memcheck" memcheck 120 "orion_scheduler=on" "gpu_hp_be_kernels under the shim" -- "$exe" 20 2 || exit 1

# One trainer step under the shim (configs/gpt_cpu_tiny.yaml on cuda: 4 ranks on the GPU, bf16,
# 8 micro-batches, async_threaded, ORION_POLICY=orion): LibTorch's kernels, the executor's
# streams and events, and the shim's deferred launches and argument copies, all instrumented.
if [ ! -x "$RUNNER" ]; then
  record "c: memcheck, trainer step" FAIL "missing $RUNNER"
  exit 1
fi
# Evidence: the trainer's own shim summary at exit with work in it (the sanitizer's process has the
# shim preloaded too, and its summary says 0 ops; a bare "libgpu_scheduler" could come from there).
memcheck "c: memcheck, trainer step" memcheck_trainer 150 "[1-9][0-9]* ops submitted" \
  "gpipe_runner gpt_cpu_tiny on cuda, 1 step, 4 ranks, under the shim" -- \
  "$RUNNER" --config "$GPU_ROOT/configs/gpt_cpu_tiny.yaml" --output-dir "$OUTDIR/memcheck_trainer" \
  --set parallel.device=cuda --set training.dtype=bf16 --set training.max_steps=1 \
  --set training.profile_iteration=-1 --set parallel.use_orion_scheduler=true

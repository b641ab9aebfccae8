#!/usr/bin/env bash
# Check (f): the driver rules of issue 11 on the GPU, each without the shim (reference) and with
# it (LD_PRELOAD libgpu_scheduler.so, USE_ORION_SCHEDULER=1, ORION_POLICY=priority):
#   f1  gpu_driver_rules contexts: two threads on two contexts of device 0 (the primary one
#       through the runtime API, one from cuCtxCreate through the driver API), each launching
#       many kernels on a high-priority and a priority-0 stream: results right and each thread's
#       current context still its own; with the shim some work must have been deferred (or the
#       run exercised nothing)
#   f2  gpu_driver_rules capture: a cudaStreamCaptureModeGlobal capture on a third stream while
#       a long high-priority kernel runs and long best-effort kernels are queued (with the shim
#       ORION_BE_MAX_WAIT_US=200000 keeps them queued, and the program must report work queued
#       when the capture began): not invalidated, the graph's and the streams' results right
#   f3  tests/gpu/nccl_under_shim.py: an NCCL all-reduce of 2 ranks (2 GPUs) issued from a
#       priority-0 stream while high-priority matmuls run must not wait (1 GPU: one rank, where NCCL
#       launches no communication kernel, so the row is figures without a verdict): with the shim (ORION_BE_MAX_WAIT_US=200000,
#       what a wait would cost) its median latency must stay within 10 x the no-shim median with
#       the same load + 1 ms
#   f4  proc_address_check (no shim): the real driver's cuGetProcAddress answers every (name,
#       version, per-thread flag) of the shim's table (driver_functions.inc, from cudaTypedefs.h)
#       with the ABI symbol the shim maps it to; a mismatch means libcudart or NCCL would get a
#       wrapper of the wrong ABI (issue 24)
#   f5  driver_model_check: the fake driver's model of context ends, captures and launches (a
#       primary context's retains, reset and last release, a green context's destroy, the handles
#       each leaves behind, a PTX kernel in and out of its context; one child process per probe;
#       probes on freed handles recorded, not judged) against the real driver, without the shim (a disagreement is a
#       rule the fake gets wrong: fix tests/intercept/fake_cuda and driver_model.json) and
#       through it (the shim must change no answer)
# Logs: OUTDIR/logs/driver_rules_*.log, OUTDIR/nccl_*shim.json.
# Usage: scripts/gpu/check_driver_rules.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_driver_rules.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
# Large enough that a best-effort op held back by the policy is unmistakable (and stays queued).
be_max_wait_us=200000
shim_env=(LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=priority)
failed=0

# key_of LINE KEY: the value of KEY=value in a summary line (empty if absent).
key_of() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }
# row_text TEXT: a results.md cell (no '|', no newline, at most 600 characters).
row_text() { printf '%s' "$1" | tr '|\n' '/ ' | cut -c1-600; }

exe=$(find "$BUILD_DIR" -name gpu_driver_rules -type f -perm -u+x 2>/dev/null | head -n 1)
missing=""
[ -n "$exe" ] || missing="gpu_driver_rules under $BUILD_DIR (tests/intercept/gpu/driver_rules_gpu.cu: built with nvcc and NVRTC)"
[ -f "$SHIM" ] || missing="${missing:+$missing, }$SHIM"
if [ -n "$missing" ]; then
  for row in "f1: two contexts, two threads" "f2: global capture beside queued work"; do
    record "$row" FAIL "missing $missing"
  done
  failed=1
else
  # program_check ROW MODE EXERCISE_KEY: runs `gpu_driver_rules MODE` without and with the shim;
  # with the shim the counter EXERCISE_KEY of its summary line must be > 0.
  program_check() {
    local row=$1 mode=$2 key=$3 no_shim=$OUTDIR/logs/driver_rules_${2}_no_shim.log
    local with_shim=$OUTDIR/logs/driver_rules_${2}_shim.log rc1 rc2 line1 line2 n
    timeout 60 "$exe" "$mode" >"$no_shim" 2>&1; rc1=$?
    env "${shim_env[@]}" ORION_BE_MAX_WAIT_US=$be_max_wait_us timeout 60 "$exe" "$mode" >"$with_shim" 2>&1; rc2=$?
    line1=$(grep "^$mode: " "$no_shim" | tail -n 1)
    line2=$(grep "^$mode: " "$with_shim" | tail -n 1)
    if [ $rc1 -ne 0 ]; then
      # Without the shim: the program or the GPU is at fault, not the shim. Still a failure.
      record "$row" FAIL "$(row_text "without the shim rc=$rc1 (logs/${no_shim##*/}): ${line1:-$(tail -n 1 "$no_shim")}")"
      return 1
    fi
    if [ $rc2 -ne 0 ]; then
      record "$row" FAIL "$(row_text "with the shim rc=$rc2 (logs/${with_shim##*/}): ${line2:-$(tail -n 1 "$with_shim")}")"
      return 1
    fi
    if [ "$(key_of "$line1" orion_scheduler)" != not-loaded ] || [ "$(key_of "$line2" orion_scheduler)" != on ]; then
      record "$row" FAIL "$(row_text "shim mode $(key_of "$line1" orion_scheduler) without / $(key_of "$line2" orion_scheduler) with the shim (want not-loaded / on)")"
      return 1
    fi
    n=$(key_of "$line2" "$key")
    if ! [ "${n:-0}" -gt 0 ] 2>/dev/null; then
      record "$row" FAIL "$(row_text "passed but exercised nothing: $key=${n:-absent} under the shim: $line2")"
      return 1
    fi
    record "$row" PASS "$(row_text "${line2#"$mode: PASS "} (no shim: ${line1#"$mode: PASS "})")"
  }
  program_check "f1: two contexts, two threads" contexts deferred || failed=1
  program_check "f2: global capture beside queued work" capture be_queued_at_capture || failed=1
fi

row="f4: cuGetProcAddress answers match the shim's ABI table"
checker=$(find "$BUILD_DIR" -name proc_address_check -type f -perm -u+x 2>/dev/null | head -n 1)
if [ -z "$checker" ]; then
  record "$row" FAIL "missing proc_address_check under $BUILD_DIR"
  failed=1
else
  timeout 60 "$checker" >"$OUTDIR/logs/proc_address_check.log" 2>&1; rc=$?
  # Both summary lines: the table's match, then the early per-thread and newer-ABI answers.
  summary=$(grep '^proc_address_check:' "$OUTDIR/logs/proc_address_check.log" | sed 's/^proc_address_check: //' | paste -sd ';' -)
  if [ $rc -eq 0 ]; then
    record "$row" PASS "$(row_text "$summary")"
  else
    record "$row" FAIL "$(row_text "rc=$rc: $summary; $(grep -m 5 '^mismatch' "$OUTDIR/logs/proc_address_check.log" | tr '\n' ';')")"
    failed=1
  fi
fi

row="f5: the fake driver's model (context ends, captures, launches) against the real driver"
model_check=$(find "$BUILD_DIR" -name driver_model_check -type f -perm -u+x 2>/dev/null | head -n 1)
model=$GPU_ROOT/tests/intercept/fake_cuda/driver_model.json
if [ -z "$model_check" ] || [ ! -f "$SHIM" ]; then
  record "$row" FAIL "missing driver_model_check under $BUILD_DIR or $SHIM"
  failed=1
else
  # The real answers come back as logs/driver_model_answers.json (driver_model.json's form).
  timeout 45 "$model_check" --expect "$model" --timeout-s 5 --answers "$OUTDIR/logs/driver_model_answers.json" \
    >"$OUTDIR/logs/driver_model_no_shim.log" 2>&1; rc1=$?
  env "${shim_env[@]}" timeout 45 "$model_check" --expect "$model" --timeout-s 5 --through-shim \
    >"$OUTDIR/logs/driver_model_shim.log" 2>&1; rc2=$?
  line1=$(grep '^driver_model_check:' "$OUTDIR/logs/driver_model_no_shim.log" | tail -n 1)
  # Through the shim the answers must be the driver's own, whatever the fake believes.
  if ! diff <(grep -E '^(agree|DISAGREE) ' "$OUTDIR/logs/driver_model_no_shim.log" | sed 's/^[A-Z]* *//') \
            <(grep -E '^(agree|DISAGREE) ' "$OUTDIR/logs/driver_model_shim.log" | sed 's/^[A-Z]* *//') \
            >"$OUTDIR/logs/driver_model_shim.diff" 2>&1; then
    record "$row" FAIL "$(row_text "the shim changes answers (logs/driver_model_shim.diff): $(head -c 300 "$OUTDIR/logs/driver_model_shim.diff")")"
    failed=1
  elif [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]; then
    record "$row" PASS "$(row_text "${line1#driver_model_check: }; the shim changes no answer")"
  else
    record "$row" FAIL "$(row_text "rc=$rc1 without / rc=$rc2 with the shim (logs/driver_model_*.log, the real answers in logs/driver_model_answers.json): ${line1:-$(tail -n 1 "$OUTDIR/logs/driver_model_no_shim.log")}")"
    failed=1
  fi
fi

row="f3: NCCL all-reduce on a priority-0 stream beside HP work"
program=tests/gpu/nccl_under_shim.py
if [ ! -f "$SHIM" ] || [ ! -f "$program" ]; then
  record "$row" FAIL "missing $SHIM or $program"
  exit 1
fi
# 20 timed all-reduces per op and load: with the shim a held-back one costs up to a few times
# ORION_BE_MAX_WAIT_US (each queued op of the collective waits its turn), and the step has 120 s.
# Two ranks when the machine has two GPUs: only then does an NCCL communication kernel reach the
# shim (one rank: NCCL copies, and the row gives figures without a verdict).
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
world=1
[ "$gpus" -ge 2 ] && world=2
nccl_args=(--iterations 20 --warmup 2 --world-size "$world")
no_json=$OUTDIR/nccl_no_shim.json
shim_json=$OUTDIR/nccl_shim.json
rm -f "$no_json" "$shim_json"
timeout 100 "$PYTHON" "$program" "${nccl_args[@]}" --output "$no_json" >"$OUTDIR/logs/nccl_no_shim.log" 2>&1; rc1=$?
env "${shim_env[@]}" ORION_BE_MAX_WAIT_US=$be_max_wait_us \
  timeout 100 "$PYTHON" "$program" "${nccl_args[@]}" --output "$shim_json" >"$OUTDIR/logs/nccl_shim.log" 2>&1; rc2=$?
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
  why=""
  for f in "$no_json" "$shim_json"; do
    [ -f "$f" ] && why="$why $("$PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("; ".join(d["wrong"]+d["timed_out"]))' "$f" 2>/dev/null)"
  done
  record "$row" FAIL "$(row_text "rc=$rc1 without shim, rc=$rc2 with shim (logs/nccl_*shim.log: ${why:-$(tail -n 1 "$OUTDIR/logs/nccl_shim.log")})")"
  exit 1
fi
verdict=$("$PYTHON" "$program" --compare "$no_json" "$shim_json" 2>&1); rc=$?
if [ $rc -eq 3 ]; then
  record "$row" INFO "$(row_text "1 GPU: $verdict")"
  exit $failed
fi
if [ $rc -ne 0 ]; then
  record "$row" FAIL "$(row_text "$verdict")"
  exit 1
fi
record "$row" PASS "$(row_text "$verdict")"
exit $failed

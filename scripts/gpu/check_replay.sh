#!/usr/bin/env bash
# Check (h): the simulator's workloads on the GPU (issue 14): orion-replay-gpu replays
# scheduler/workloads/orion_inference_training.jsonl and pipeline_stage.jsonl without the shim
# (and every client alone), then under the shim with passthrough, priority, orion and partition,
# each in its own process, and prints orion-sim's study table measured, with the simulator's
# prediction and its error per run (--simulate). One row per workload: HP p99 / alone and BE
# throughput / alone per run, and the simulator's relative error (a measurement: the row fails
# only when a run fails or its result is incomplete).
# Logs: OUTDIR/logs/replay_<workload>.log (the tables), OUTDIR/replay_<workload>.json.
# Usage: scripts/gpu/check_replay.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_replay.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
policies=passthrough,priority,orion,partition
exe=$(find "$BUILD_DIR" -name orion-replay-gpu -type f -perm -u+x 2>/dev/null | head -n 1)
missing=""
[ -n "$exe" ] || missing="orion-replay-gpu under $BUILD_DIR (replay_gpu/: built with nvcc)"
[ -f "$SHIM" ] || missing="${missing:+$missing, }$SHIM"
failed=0
for name in orion_inference_training pipeline_stage; do
  row="h: replay $name.jsonl"
  workload=scheduler/workloads/$name.jsonl
  if [ -n "$missing" ]; then
    record "$row" FAIL "missing $missing"
    failed=1
    continue
  fi
  log=$OUTDIR/logs/replay_$name.log
  json=$OUTDIR/replay_$name.json
  rm -f "$json"
  timeout 55 "$exe" "$workload" --policies "$policies" --shim "$SHIM" --simulate --json "$json" >"$log" 2>&1; rc=$?
  if [ $rc -ne 0 ]; then
    record "$row" FAIL "orion-replay-gpu rc=$rc (logs/${log##*/}: $(grep -m1 'orion-replay-gpu:' "$log" | tr '|\n' '/ ' | cut -c1-300))"
    failed=1
    continue
  fi
  detail=$("$PYTHON" "$(dirname "$0")/replay_summary.py" "$json" --policies "$policies"); rc=$?
  if [ $rc -ne 0 ]; then
    record "$row" FAIL "$(printf '%s' "$detail" | tr '|\n' '/ ' | cut -c1-600)"
    failed=1
    continue
  fi
  record "$row" PASS "$(printf '%s' "$detail" | tr '|\n' '/ ' | cut -c1-900) (logs/${log##*/})"
done
exit $failed

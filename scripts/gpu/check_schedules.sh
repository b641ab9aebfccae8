#!/usr/bin/env bash
# Check (g): schedules with and without overlapped forward+backward pairs (parallel.overlap_f_b),
# with and without the shim, 4 ranks co-located on the one GPU (configs/gpt_350m_gpu.yaml, bf16,
# async_threaded): 1f1b (no pairs / every steady-state F paired with the next B) and dualpipev
# (no pairs / torch's OVERLAP_F_B pairs), each shim off and shim `orion`; every other schedule
# (gpipe, interleaved_1f1b, zb_h1, looped_bfs, interleaved_zb, zbv) shim off, pairs off and on. Per run: mean step
# time against 1f1b without pairs or shim, and from the profiled step's Kineto trace the share of
# GPU busy time in which forward and backward kernels ran at once (scripts/gpu/kernel_overlap.py).
# What overlap is for: the paired forward (best-effort class, its own lane thread) filling the SMs
# the paired backward (high priority) leaves idle, which only the shim can arrange.
# Usage: scripts/gpu/check_schedules.sh OUTDIR   (env: GPU_CHECK_SCHEDULE_STEPS, default 5, of which 2 warm-up)
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_schedules.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
warmup=2    # steps 0 and 1 are left out of the table (schedules_summary.py --warmup)
profiled=$((warmup - 1))  # the last warm-up step is traced: a profiled step is never a timed one
need_trainer "g: schedules" || exit 1
dir=$OUTDIR/schedules
mkdir -p "$dir"
failed=0
run() {  # variant schedule overlap shim(0|1)
  local variant=$1 schedule=$2 overlap=$3 shim=$4 v=1
  case "$schedule" in interleaved_1f1b | looped_bfs | interleaved_zb | zbv | dualpipev) v=2 ;; esac
  local args=(--set parallel.scheduler=async_threaded --set "parallel.schedule=$schedule"
              --set "parallel.virtual_stages=$v" --set "parallel.overlap_f_b=$overlap")
  if [ "$shim" = 1 ]; then
    LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=orion GPU_RUNNER_TIMEOUT=100 \
      gpu_runner "schedules_$variant" "$dir/$variant" "${GPU_CHECK_SCHEDULE_STEPS:-5}" "$profiled" "${args[@]}" \
      --set parallel.use_orion_scheduler=true || { echo "gpipe_runner $variant failed"; failed=1; }
  else
    GPU_RUNNER_TIMEOUT=100 gpu_runner "schedules_$variant" "$dir/$variant" "${GPU_CHECK_SCHEDULE_STEPS:-5}" \
      "$profiled" "${args[@]}" || { echo "gpipe_runner $variant failed"; failed=1; }
  fi
  local trace
  trace=$(ls "$dir/$variant"/profiler_async_threaded/rank0/*.pt.trace.json 2>/dev/null | head -n 1)
  if [ -n "$trace" ]; then
    "$PYTHON" scripts/gpu/kernel_overlap.py "$trace" --json "$dir/$variant/kernel_overlap.json" \
      >"$OUTDIR/logs/schedules_${variant}_overlap.log" 2>&1 || echo "kernel_overlap.py failed for $variant"
  fi
}
run 1f1b 1f1b false 0
run 1f1b_pairs 1f1b true 0
run 1f1b_shim 1f1b false 1
run 1f1b_pairs_shim 1f1b true 1
run dualpipev dualpipev false 0
run dualpipev_pairs dualpipev auto 0
run dualpipev_shim dualpipev false 1
run dualpipev_pairs_shim dualpipev auto 1
# Every other schedule, shim off, pairs off and on (true: each steady-state F paired with a B).
for schedule in gpipe interleaved_1f1b zb_h1 looped_bfs interleaved_zb zbv; do
  run "$schedule" "$schedule" false 0
  run "${schedule}_pairs" "$schedule" true 0
done
report_runs "g: schedules" "$failed" "20 runs completed, losses finite; ratios in the rows above" \
  "logs/schedules_*.log" scripts/gpu/schedules_summary.py "$dir" --warmup "$warmup"

#!/usr/bin/env bash
# The GPU machine's one-shot check: build (Release, CUDA on), ctest, then the GPU checks
#   a  gpu_hp_be_kernels with and without the shim (HP latency ratio)
#   b  PyTorch under the shim: cuBLASLt bf16, cuDNN, Triton, CUDA graph, NCCL (results, launch counts)
#   c  compute-sanitizer memcheck on (a) under the shim
#   d  gpipe_runner on configs/gpt_350m_gpu.yaml vs PyTorch eager, async vs naive, shim on/off
#   e  the pipeline across processes: one process on cuda, 2 processes over NCCL (>= 2 GPUs) or a
#      one-rank NCCL self-test (1 GPU)
#   f  the driver rules of issue 11, with and without the shim (ORION_POLICY=priority):
#      gpu_driver_rules contexts (two threads on two contexts: results, each thread's current
#      context kept), gpu_driver_rules capture (a global-mode capture while best-effort work is
#      queued: not invalidated, results), tests/gpu/nccl_under_shim.py (a one-rank NCCL
#      all-reduce from a priority-0 stream beside high-priority matmuls must not wait)
#   g  schedules with and without overlapped forward+backward pairs, shim off and `orion`
#      (1f1b, dualpipev; 4 ranks on the one GPU): step time ratios, F/B kernel overlap share
#   h  the simulator's workloads on the GPU: orion-replay-gpu --simulate over
#      scheduler/workloads/orion_inference_training.jsonl and pipeline_stage.jsonl, no shim then
#      passthrough, priority, orion, partition under the shim: HP p99 / BE throughput against
#      each client alone, and the simulator's error per run
# Each writes a log under OUTDIR/logs and a row to OUTDIR/results.md; a failed check does not stop
# the others; the exit status is non-zero if any check failed or could not run.
#
#   scripts/gpu_check.sh OUTDIR
# Environment: GPU_CHECK_ONLY ("build ctest a b c d e f g h", a subset to run), GPU_CHECK_SKIP_BUILD=1 (reuse
# build-gpu), GPU_CHECK_BUDGET_S (540: checks that no longer fit are recorded as not run),
# GPU_CHECK_PYTHON (python3), GPU_CHECK_BUILD_DIR (build-gpu), GPU_CHECK_TRAINER_STEPS (6).
# Needs .deps/ (../shared/device/stage-debs.sh python3-yaml libgloo-dev on the dev machine: Gloo's
# headers for c10d's ProcessGroupGloo) carried to the GPU machine.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: scripts/gpu_check.sh OUTDIR" >&2; exit 2; }
mkdir -p "$1" || exit 2
OUTDIR=$(cd "$1" && pwd)
export OUTDIR
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gpu/common.sh
source "$here/gpu/common.sh"
budget=${GPU_CHECK_BUDGET_S:-540}
only=" ${GPU_CHECK_ONLY:-build ctest a b c d e f g h} "
known=" build ctest a b c d e f g h "
for name in $only; do
  case "$known" in
    *" $name "*) ;;
    *) echo "GPU_CHECK_ONLY: unknown check '$name' (known:${known% })" >&2; exit 2 ;;
  esac
done
[ "${GPU_CHECK_SKIP_BUILD:-0}" = 1 ] && only=${only/ build / }

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- GPU: ${gpu:-none visible (nvidia-smi failed)}"
  echo "- Host: $(nproc) cores; $("$PYTHON" -c 'import torch;print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "no torch in $PYTHON")"
  echo "- Tree: $(git -C "$GPU_ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git metadata') ; command: scripts/gpu_check.sh $1"
  echo
  echo "| check | status | detail |"
  echo "|---|---|---|"
} >"$OUTDIR/results.md"

# step NAME SCRIPT SECONDS: runs one check under a time limit; records what the check did not.
step() {
  local name=$1 script=$2 limit=$3 rows_before rc
  case "$only" in *" $name "*) ;; *) return 0 ;; esac
  local left=$((budget - SECONDS))
  if [ "$left" -lt 30 ]; then
    record "$name" FAIL "not run: only ${left}s of the ${budget}s budget left"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  rows_before=$(wc -l <"$OUTDIR/results.md")
  echo "[gpu_check] $name (limit ${limit}s, ${SECONDS}s elapsed)"
  timeout "$limit" "$here/gpu/$script" "$OUTDIR"; rc=$?
  if [ $rc -eq 124 ]; then
    record "$name" FAIL "timed out after ${limit}s (logs/)"
  elif [ "$(wc -l <"$OUTDIR/results.md")" -eq "$rows_before" ]; then
    record "$name" FAIL "exited with status $rc without a result row"
  fi
}

step build build.sh 240
step ctest ctest.sh 90
step a check_hp_be.sh 45
step b check_torch_shim.sh 150
step c check_memcheck.sh 60
step d check_trainer.sh 450
step e check_distributed.sh 90
step f check_driver_rules.sh 120
step g check_schedules.sh 480
step h check_replay.sh 120

failed=$(grep -c '| FAIL |' "$OUTDIR/results.md")
echo "[gpu_check] done in ${SECONDS}s: $failed failed; table in $OUTDIR/results.md"
cat "$OUTDIR/results.md"
[ "$failed" -eq 0 ]

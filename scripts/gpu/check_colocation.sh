#!/usr/bin/env bash
# Check (j): another process in the pipeline's bubbles (issue 25). gpipe_runner on
# configs/gpt_350m_gpu.yaml (4 ranks on the one GPU) publishing its idle windows to orion-gpud, and
# tests/gpu/be_matmul_job.py (bf16 matmuls on a priority-0 stream) beside it:
#   alone        the pipeline alone; the job alone
#   unmanaged    both at once, no shim on the job (what CUDA does without MPS: time slicing)
#   managed      both at once, the job under the shim with ORION_POLICY=gpud (its launches only
#                inside the published windows)
#   mps_unmanaged, mps_managed   the same two under NVIDIA MPS (kernels of both processes run at
#                once), when nvidia-cuda-mps-control can start a daemon of this user's; else an INFO
#                row says why
# Rows (scripts/gpu/colocation_summary.py): pipeline step time against alone, the job's matmuls/s
# during the pipeline's timed steps against alone, per mode; a managed mode must show the gating
# at work (the shim held launches back, the daemon saw windows published and launches admitted:
# orion-gpud status polled every second while both run). The job runs until the pipeline ends
# (a stop file), so it overlaps every timed step.
# Usage: scripts/gpu/check_colocation.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_colocation.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
need_trainer "j: colocation" || exit 1
daemon_exe=$(find "$BUILD_DIR" -name orion-gpud -type f -perm -u+x 2>/dev/null | head -n 1)
if [ -z "$daemon_exe" ]; then
  record "j: colocation" FAIL "missing orion-gpud (not built; GPU_BUILD_TARGETS)"
  exit 1
fi
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
if [ -z "$uuid" ]; then
  record "j: colocation" FAIL "no GPU UUID from nvidia-smi"
  exit 1
fi
dir=$OUTDIR/colocation
mkdir -p "$dir"
# The daemon's socket is gpu-<GPU-uuid>.sock (49 characters, more while it is bound): under the
# work folder it could pass the 108 characters a Unix socket path may have, so a short folder of
# its own (mktemp -d: mode 0700, as the daemon wants).
ORION_GPUD_DIR=$(mktemp -d /tmp/gpud.XXXXXX) || { record "j: colocation" FAIL "mktemp -d /tmp/gpud.XXXXXX failed"; exit 1; }
export ORION_GPUD_DIR
trap 'rm -rf "$ORION_GPUD_DIR"' EXIT
steps=${GPU_CHECK_COLOCATION_STEPS:-8}
job_s=${GPU_CHECK_COLOCATION_JOB_S:-15}  # the job alone; beside the pipeline it runs until told to stop
job() {  # name, then env assignments for the job; beside a pipeline, stop_job NAME ends it
  local name=$1; shift
  local until=(--seconds "$job_s")
  [ "$name" = alone ] || until=(--seconds 110 --stop-file "$dir/stop_$name")
  env "$@" timeout 120 "$PYTHON" tests/gpu/be_matmul_job.py "${until[@]}" >"$dir/job_$name.json" \
    2>"$OUTDIR/logs/colocation_job_$name.log"
}
stop_job() { touch "$dir/stop_$1"; }
poll_status() {  # name: orion-gpud status every second into status_NAME.jsonl until stop_job NAME
  while [ ! -e "$dir/stop_$1" ]; do
    timeout 5 "$daemon_exe" status --gpu "$uuid" 2>/dev/null | tr -d '\n' >>"$dir/status_$1.jsonl"
    echo >>"$dir/status_$1.jsonl"
    sleep 1
  done
}
beside() {  # name, then env assignments for the job: the job and the pipeline at once
  local name=$1 managed=0 jp sp=""; shift
  case $name in *_managed|managed) managed=1 ;; esac
  job "$name" "$@" & jp=$!
  if [ $managed = 1 ]; then
    poll_status "$name" & sp=$!
    pipeline "$name" --set "parallel.publish_bubbles_gpu=$uuid" || failed=1
  else
    pipeline "$name" || failed=1
  fi
  stop_job "$name"
  wait $jp || failed=1
  [ -z "$sp" ] || wait "$sp"
}
pipeline() {  # name, then extra gpipe_runner arguments
  local name=$1; shift
  GPU_RUNNER_TIMEOUT=120 gpu_runner "colocation_pipeline_$name" "$dir/pipeline_$name" "$steps" -1 "$@"
}
failed=0
pipeline alone || failed=1
job alone || failed=1
beside unmanaged
"$daemon_exe" serve --gpu "$uuid" >"$OUTDIR/logs/colocation_daemon.log" 2>&1 & dp=$!
for _ in $(seq 100); do [ -S "$ORION_GPUD_DIR/gpu-$uuid.sock" ] && break; sleep 0.05; done
if [ ! -S "$ORION_GPUD_DIR/gpu-$uuid.sock" ]; then
  # The managed runs would run unmanaged and pass: say why instead.
  record "j: colocation managed" FAIL "orion-gpud made no socket in $ORION_GPUD_DIR within 5 s (logs/colocation_daemon.log)"
  failed=1
fi
beside managed LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=gpud "ORION_POLICY_PARAMS=gpu=$uuid"
runs=6
# MPS: a control daemon of our own (its pipe and log folders under OUTDIR); every CUDA process
# started with the same CUDA_MPS_PIPE_DIRECTORY joins it.
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  mkdir -p "$dir/mps/pipe" "$dir/mps/log"
  if CUDA_MPS_PIPE_DIRECTORY=$dir/mps/pipe CUDA_MPS_LOG_DIRECTORY=$dir/mps/log \
       timeout 20 nvidia-cuda-mps-control -d >"$OUTDIR/logs/colocation_mps_start.log" 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY=$dir/mps/pipe CUDA_MPS_LOG_DIRECTORY=$dir/mps/log
    beside mps_unmanaged
    beside mps_managed LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=gpud "ORION_POLICY_PARAMS=gpu=$uuid"
    echo quit | timeout 20 nvidia-cuda-mps-control >>"$OUTDIR/logs/colocation_mps_start.log" 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    runs=10
  else
    record "j: colocation mps" INFO "MPS could not start here (logs/colocation_mps_start.log): rows without MPS only"
  fi
else
  record "j: colocation mps" INFO "no nvidia-cuda-mps-control on this machine: rows without MPS only"
fi
kill "$dp" 2>/dev/null; wait "$dp" 2>/dev/null
report_runs "j: colocation" "$failed" "$runs runs completed" "logs/colocation_*.log" \
  "$(dirname "$0")/colocation_summary.py" "$dir"

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
# Rows: pipeline step time against alone, the job's matmuls/s against alone, per mode.
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
job_s=${GPU_CHECK_COLOCATION_JOB_S:-15}
job() {  # name, then env assignments for the job
  local name=$1; shift
  env "$@" timeout 60 "$PYTHON" tests/gpu/be_matmul_job.py --seconds "$job_s" >"$dir/job_$name.json" \
    2>"$OUTDIR/logs/colocation_job_$name.log"
}
pipeline() {  # name, then extra gpipe_runner arguments
  local name=$1; shift
  GPU_RUNNER_TIMEOUT=120 gpu_runner "colocation_pipeline_$name" "$dir/pipeline_$name" "$steps" -1 "$@"
}
failed=0
pipeline alone || failed=1
job alone || failed=1
job unmanaged & jp=$!
pipeline unmanaged || failed=1
wait $jp || failed=1
"$daemon_exe" serve --gpu "$uuid" >"$OUTDIR/logs/colocation_daemon.log" 2>&1 & dp=$!
for _ in $(seq 100); do [ -S "$ORION_GPUD_DIR/gpu-$uuid.sock" ] && break; sleep 0.05; done
if [ ! -S "$ORION_GPUD_DIR/gpu-$uuid.sock" ]; then
  # The managed runs would run unmanaged and pass: say why instead.
  record "j: colocation managed" FAIL "orion-gpud made no socket in $ORION_GPUD_DIR within 5 s (logs/colocation_daemon.log)"
  failed=1
fi
job managed LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=gpud "ORION_POLICY_PARAMS=gpu=$uuid" & jp=$!
pipeline managed --set "parallel.publish_bubbles_gpu=$uuid" || failed=1
wait $jp || failed=1
runs=6
# MPS: a control daemon of our own (its pipe and log folders under OUTDIR); every CUDA process
# started with the same CUDA_MPS_PIPE_DIRECTORY joins it.
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  mkdir -p "$dir/mps/pipe" "$dir/mps/log"
  if CUDA_MPS_PIPE_DIRECTORY=$dir/mps/pipe CUDA_MPS_LOG_DIRECTORY=$dir/mps/log \
       timeout 20 nvidia-cuda-mps-control -d >"$OUTDIR/logs/colocation_mps_start.log" 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY=$dir/mps/pipe CUDA_MPS_LOG_DIRECTORY=$dir/mps/log
    job mps_unmanaged & jp=$!
    pipeline mps_unmanaged || failed=1
    wait $jp || failed=1
    job mps_managed LD_PRELOAD="$SHIM" USE_ORION_SCHEDULER=1 ORION_POLICY=gpud "ORION_POLICY_PARAMS=gpu=$uuid" & jp=$!
    pipeline mps_managed --set "parallel.publish_bubbles_gpu=$uuid" || failed=1
    wait $jp || failed=1
    echo quit | timeout 20 nvidia-cuda-mps-control >>"$OUTDIR/logs/colocation_mps_start.log" 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    runs=10
  else
    record "j: colocation mps" INFO "MPS could not start here (logs/colocation_mps_start.log): rows without MPS only"
  fi
else
  record "j: colocation mps" INFO "no nvidia-cuda-mps-control on this machine: rows without MPS only"
fi
"$daemon_exe" status --gpu "$uuid" >"$dir/status_after.json" 2>&1
kill "$dp" 2>/dev/null; wait "$dp" 2>/dev/null
report_runs "j: colocation" "$failed" "$runs runs completed" "logs/colocation_*.log" - "$dir" "$steps" <<'PY'
import json, statistics, sys
from pathlib import Path
d, steps = Path(sys.argv[1]), int(sys.argv[2])
def step_ms(name):
    ms = [json.loads(l)["step_time_ms"] for l in (d / f"pipeline_{name}" / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return statistics.mean(ms[2:] or ms)
def job(name):
    return json.loads((d / f"job_{name}.json").read_text())["matmuls_per_s"]
ok = True
try:
    base, jbase = step_ms("alone"), job("alone")
except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
    print(f"| j: colocation alone | FAIL | {e} |")
    base = jbase = None
    ok = False
for mode in ("unmanaged", "managed", "mps_unmanaged", "mps_managed"):
    if base is None or not (d / f"job_{mode}.json").exists():
        continue
    try:  # one mode's missing run (killed at the limit) leaves the others' rows
        print(f"| j: colocation {mode} | INFO | pipeline step {step_ms(mode):.1f} ms / alone {base:.1f} ms = "
              f"{step_ms(mode) / base:.3f}; job {job(mode):.1f} matmuls/s / alone {jbase:.1f} = {job(mode) / jbase:.3f} |")
    except (OSError, ValueError, KeyError, ZeroDivisionError) as e:
        print(f"| j: colocation {mode} | FAIL | {e} |")
        ok = False
        continue
    # A managed job that ran without the shim was never gated: its row would compare nothing.
    if mode.endswith("managed") and not mode.endswith("unmanaged"):
        try:
            loaded = json.loads((d / f"job_{mode}.json").read_text()).get("shim_loaded")
        except (OSError, ValueError):
            loaded = None
        if loaded is not True:
            print(f"| j: colocation {mode} | FAIL | the best-effort job ran without libgpu_scheduler.so "
                  f"(shim_loaded={loaded}): its launches were not gated |")
            ok = False
sys.exit(0 if ok else 1)
PY

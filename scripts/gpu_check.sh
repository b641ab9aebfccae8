#!/usr/bin/env bash
# The GPU machine's check: build (Release, CUDA on), ctest of the GPU-only tests, then the checks
#   a  gpu_hp_be_kernels with and without the shim (HP latency ratio)
#   b  PyTorch under the shim: cuBLASLt bf16, cuDNN, Triton, CUDA graph, NCCL (results, launch counts)
#   c  compute-sanitizer memcheck on (a) under the shim
#   d  a fresh thread's first attention call per SDPA kernel (tests/gpu/sdpa_threads.py); gpipe_runner
#      on configs/gpt_350m_gpu.yaml vs PyTorch eager, async vs naive, shim on/off
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
#   i  the planner: gpipe_runner --plan --verify 2 on configs/gpt_350m_gpu.yaml (layers measured
#      on the GPU): predicted against measured step time and peak memory of the top candidates
#   j  another process in the pipeline's bubbles: gpipe_runner publishing its idle windows to
#      orion-gpud, a bf16 matmul job beside it unmanaged and under ORION_POLICY=gpud: step time and
#      the job's throughput against each alone
#
#   scripts/gpu_check.sh [--call 1|2|3] OUT
#
# The GPU machine is lent in commands of at most 10 minutes, each usually on a bare machine, and
# gives back at most 8 files, two folders down, 16 MiB each. So the checks are split into three
# calls that each stand alone (GPU_CALL_PLAN below; docs/results/README.md has the budget), and OUT
# only ever holds results.md, logs.tar.gz (logs and small JSON summaries, no traces) and, after
# call 1, gpu-bin.tar.gz (the stripped binaries later calls unpack instead of building: carry it
# as .gpu-bin/gpu-bin.tar.gz). Both are refreshed after every step, so a command killed at its
# limit still returns what it did. Everything else is written to the work folder
# ($GPU_CHECK_WORK, default .gpu-work/, emptied first).
#
# Each step runs under a time limit with GPU_CHECK_STEP_TAG in its environment; when it ends
# (or is killed), every process still carrying its tag is killed too, whatever process group or
# session it made for itself, and a row says so.
#
# Environment: GPU_CHECK_ONLY ("build ctest a b c d e f g h i j", a subset; overrides --call),
# GPU_CHECK_BUDGET_S (540: checks that no longer fit are recorded as not run; GPU_CHECK_MIN_STEP_S,
# 30, is the least a step starts with), GPU_CHECK_STEP_DIR (the step scripts), GPU_CHECK_PYTHON
# (python3), GPU_CHECK_BUILD_DIR (build-gpu), GPU_CHECK_TRAINER_STEPS (6), GPU_CHECK_COMMIT (the
# commit the tree is, for the results: the GPU machine's copy has no .git), GPU_CHECK_WORK.
# Needs .deps/ (scripts/gpu/stage-debs.sh on the dev machine) carried to the GPU machine.
set -uo pipefail
usage="usage: scripts/gpu_check.sh [--call 1|2|3] OUT   (--help: what it checks and its environment)"
case "${1:-}" in
  -h | --help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
call=""
if [ "${1:-}" = "--call" ]; then
  [ $# -ge 2 ] || { echo "--call needs 1, 2 or 3; $usage" >&2; exit 2; }
  call=$2
  shift 2
fi
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
case "$1" in -*) echo "OUT '$1' looks like an option; $usage" >&2; exit 2 ;; esac
# Everything that can be refused is refused before anything is made or emptied.
# The three device calls. Each starts with `build`, which on a bare machine unpacks the archive
# call 1 returned (carried as .gpu-bin/gpu-bin.tar.gz) or else builds just what the checks need.
# Measured on the H100 (2026-11-27): build 96 s on 16 cores, ctest 4 s, a..d 130 s, e f 45 s,
# g (8 runs) 110 s, h 10 s; a machine start about 30 s. With 15 device minutes only calls 1 and 2
# run: call 1 holds what the last GPU run asked for first (d: the async trainer; h: the orion
# duration gate on replayed workloads), c (memcheck) last; call 2 the schedules (g: deferred
# receives) and the colocation (j: finished-event windows) before f and e; i (the planner's
# verify runs, 200 s) waits for a third call.
declare -A GPU_CALL_PLAN=(
  [1]="build ctest a b d h c"
  [2]="build g j f e"
  [3]="build i"
)
if [ -n "$call" ]; then
  [ -n "${GPU_CALL_PLAN[$call]:-}" ] || { echo "--call: 1, 2 or 3 (got '$call')" >&2; exit 2; }
  only=" ${GPU_CHECK_ONLY:-${GPU_CALL_PLAN[$call]}} "
else
  only=" ${GPU_CHECK_ONLY:-build ctest a b c d e f g h i j} "
fi
# GPU_CHECK_TIME_SCALE (1) stretches the budget and every step's limit: the CPU rehearsal
# (scripts/gpu/rehearse.py) builds on far fewer cores than the GPU machine's 16.
scale=${GPU_CHECK_TIME_SCALE:-1}
budget=$(( ${GPU_CHECK_BUDGET_S:-540} * scale ))
known=" build ctest a b c d e f g h i j "
for name in $only; do
  case "$known" in
    *" $name "*) ;;
    *) echo "GPU_CHECK_ONLY: unknown check '$name' (known:${known% })" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
OUT=$(realpath -m "$1")
WORK=$(realpath -m "${GPU_CHECK_WORK:-$root/.gpu-work}")
case "$WORK" in "$OUT" | "$OUT"/*) echo "GPU_CHECK_WORK must lie outside OUT" >&2; exit 2 ;; esac
case "$OUT" in "$WORK"/*) echo "OUT must lie outside GPU_CHECK_WORK ($WORK), which is emptied first" >&2; exit 2 ;; esac
case "$WORK" in
  / | "$root" | "$HOME") echo "GPU_CHECK_WORK=$WORK: a folder of its own, please (it is emptied first)" >&2; exit 2 ;;
esac
mkdir -p "$OUT" || exit 2
rm -rf "$WORK" && mkdir -p "$WORK" || exit 2
OUTDIR=$(cd "$WORK" && pwd)
export OUTDIR GPU_CHECK_OUT=$OUT
# shellcheck source=scripts/gpu/common.sh
source "$here/gpu/common.sh"
# Where the step scripts live (a test points this at stand-ins).
step_dir=${GPU_CHECK_STEP_DIR:-$here/gpu}


gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
commit=${GPU_CHECK_COMMIT:-$(git -C "$GPU_ROOT" rev-parse --short HEAD 2>/dev/null || echo 'unknown: set GPU_CHECK_COMMIT')}
{
  echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- GPU: ${gpu:-none visible (nvidia-smi failed)}"
  echo "- Host: $(nproc) cores; $("$PYTHON" -c 'import torch;print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "no torch in $PYTHON")"
  echo "- Tree: $commit ; command: scripts/gpu_check.sh ${call:+--call $call }OUT ; checks:$only"
  echo
  echo "| check | status | detail |"
  echo "|---|---|---|"
} >"$OUTDIR/results.md"

# publish: results.md and logs.tar.gz into OUT, replaced atomically. The archive holds the work
# folder's logs and small summaries (.log .json .jsonl .md .txt .csv .png under 1 MiB), never traces.
publish() {
  cp "$OUTDIR/results.md" "$OUT/results.md.tmp" && mv "$OUT/results.md.tmp" "$OUT/results.md"
  (cd "$OUTDIR" && find . -type f -size -1024k \
      \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.txt' -o -name '*.csv' -o -name '*.png' \) \
      ! -name '*trace*.json' -print0 | tar --null -czf "$OUT/logs.tar.gz.tmp" -T -) \
    && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
  rm -f "$OUT/logs.tar.gz.tmp"
}

# sweep TAG: kills every process whose environment carries GPU_CHECK_STEP_TAG=TAG; prints how many.
# A process in the middle of an exec (a step's `setsid prog &` just before the step exits) can
# read as having no environment for that instant: the folder is looked at again until two looks
# in a row, 0.2 s apart, find none (at most 10 looks).
sweep() {
  local tag=$1 pid n=0 found quiet=0 look
  for look in 1 2 3 4 5 6 7 8 9 10; do
    found=0
    for pid in $(grep -lsxa "GPU_CHECK_STEP_TAG=$tag" --null-data /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3); do
      [ "$pid" = "$$" ] && continue
      kill -KILL "$pid" 2>/dev/null && found=$((found + 1))
    done
    n=$((n + found))
    if [ "$found" -eq 0 ]; then
      quiet=$((quiet + 1))
      [ "$quiet" -ge 2 ] && break
    else
      quiet=0
    fi
    sleep 0.2
  done
  echo "$n"
}

# step NAME SCRIPT SECONDS: runs one check under a time limit; records what the check did not.
step() {
  local name=$1 script=$2 limit=$(($3 * scale)) rows_before rc left tag leftover
  case "$only" in *" $name "*) ;; *) return 0 ;; esac
  left=$((budget - SECONDS))
  if [ "$left" -lt "${GPU_CHECK_MIN_STEP_S:-30}" ]; then
    record "$name" FAIL "not run: only ${left}s of the ${budget}s budget left"
    publish
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  rows_before=$(wc -l <"$OUTDIR/results.md")
  tag="$name.$$.$SECONDS.$RANDOM"
  echo "[gpu_check] $name (limit ${limit}s, ${SECONDS}s elapsed)"
  GPU_CHECK_STEP_TAG=$tag timeout -k 5 "$limit" "$step_dir/$script" "$OUTDIR"; rc=$?
  leftover=$(sweep "$tag")
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" FAIL "timed out after ${limit}s (logs.tar.gz)"
  elif [ "$(wc -l <"$OUTDIR/results.md")" -eq "$rows_before" ]; then
    record "$name" FAIL "exited with status $rc without a result row"
  fi
  if [ "$leftover" -gt 0 ]; then
    record "$name: processes" INFO "$leftover process(es) of this step outlived it and were killed"
  fi
  publish
}

publish
step build build.sh 300
step ctest ctest.sh 120
step a check_hp_be.sh 60
step b check_torch_shim.sh 150
step d check_trainer.sh 450
step h check_replay.sh 120
step c check_memcheck.sh 200
step g check_schedules.sh 480
step j check_colocation.sh 240
step f check_driver_rules.sh 120
step e check_distributed.sh 150
step i check_plan.sh 200

if ! rules=$("$PYTHON" "$here/gpu/check_outdir.py" "$OUT" --only results.md logs.tar.gz gpu-bin.tar.gz 2>&1); then
  record "returned folder" FAIL "$rules"
fi
publish
failed=$(grep -c '| FAIL |' "$OUTDIR/results.md")
echo "[gpu_check] done in ${SECONDS}s: $failed failed; table in $OUT/results.md, logs in $OUT/logs.tar.gz"
cat "$OUTDIR/results.md"
[ "$failed" -eq 0 ]

# shellcheck shell=bash
# ORION_GPUD=1 (sourced by scripts/slurm/common.sh inside the batch job): one orion-gpud per GPU on
# every node of the allocation, up before the training step starts and stopped when the job
# script ends. Every process of the job finds them through ORION_GPUD_DIR (gpipe_runner with
# parallel.publish_bubbles_gpu, best-effort jobs with ORION_POLICY=gpud, orion-gpud status).
#   gpud_start   runs scripts/slurm/start_gpud.sh once per node as a background srun step that
#                overlaps the others (--overlap: it shares the nodes' CPUs and GPUs with the
#                training step) and waits until every node said it is ready; ends the job with
#                the reason if one fails or does not within ORION_GPUD_WAIT_S + 60 s.
#   gpud_stop    sends that step's tasks SIGTERM (start_gpud.sh stops its daemons); runs at exit.
# Environment: ORION_GPUD_BIN (default build/gpud/orion-gpud), ORION_GPUD_DIR (default
# /tmp/orion-gpud-<job id>: one folder per job, the same path on every node; short, for the
# socket's path), ORION_GPUD_WAIT_S (per node, default 10).

ORION_GPUD_BIN=${ORION_GPUD_BIN:-$OURGPIPE_ROOT/build/gpud/orion-gpud}
ORION_GPUD_DIR=${ORION_GPUD_DIR:-/tmp/orion-gpud-$SLURM_JOB_ID}
ORION_GPUD_WAIT_S=${ORION_GPUD_WAIT_S:-10}
export ORION_GPUD_BIN ORION_GPUD_DIR ORION_GPUD_WAIT_S
_gpud_step_pid=""
_gpud_step_log=""

gpud_stop() {
  if [ -n "$_gpud_step_pid" ]; then
    # SIGTERM to srun would end the step with SIGKILL: signal the step's tasks instead, so that
    # start_gpud.sh stops its daemons (which remove their sockets) and removes its folder.
    local step
    step=$(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' 2>/dev/null | awk '$2 == "orion-gpud" { print $1; exit }')
    [ -z "$step" ] || scancel --signal=TERM "$step" 2>/dev/null || true
    for _ in $(seq 150); do
      kill -0 "$_gpud_step_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -TERM "$_gpud_step_pid" 2>/dev/null || true  # still there after 15 s: end it outright
    wait "$_gpud_step_pid" 2>/dev/null || true
    _gpud_step_pid=""
  fi
  [ -z "$_gpud_step_log" ] || rm -f "$_gpud_step_log"
}

gpud_start() {
  [ -x "$ORION_GPUD_BIN" ] || {
    echo "submit: ORION_GPUD=1 but ORION_GPUD_BIN '$ORION_GPUD_BIN' is not executable (build first: scripts/build.sh)" >&2
    exit 2
  }
  local nodes=${SLURM_JOB_NUM_NODES:-1} ready=0 i
  _gpud_step_log=$(mktemp "${TMPDIR:-/tmp}/orion-gpud-$SLURM_JOB_ID.XXXXXX")
  trap gpud_stop EXIT
  echo "submit: starting orion-gpud on $nodes node(s), one per GPU, in $ORION_GPUD_DIR"
  # Its output goes to the job's log and to a file read below for the nodes' "ready" lines.
  srun --overlap --job-name=orion-gpud --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 \
    "$OURGPIPE_ROOT/scripts/slurm/start_gpud.sh" > >(tee "$_gpud_step_log") 2>&1 &
  _gpud_step_pid=$!
  for ((i = 0; i < (ORION_GPUD_WAIT_S + 60) * 10; i++)); do
    ready=$(grep -c '^start_gpud: .* ready: ' "$_gpud_step_log") || true
    if [ "$ready" -ge "$nodes" ]; then
      echo "submit: orion-gpud ready on $nodes node(s)"
      return 0
    fi
    kill -0 "$_gpud_step_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "submit: orion-gpud ready on $ready of $nodes node(s) (see start_gpud's lines above): not starting the training" >&2
  exit 1
}

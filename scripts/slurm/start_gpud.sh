#!/usr/bin/env bash
# One orion-gpud per GPU of this node for the length of a Slurm job (ORION_GPUD=1: scripts/slurm/
# gpud.sh runs this once per node, an srun step that overlaps the training step). For each GPU
# that `nvidia-smi --query-gpu=uuid` lists it starts `orion-gpud serve --gpu <uuid> --dir
# $ORION_GPUD_DIR`, waits up to ORION_GPUD_WAIT_S seconds for each socket, says
#   start_gpud: <host> ready: <n> GPU(s) in <dir>
# and stays until SIGTERM/SIGINT/SIGHUP (the step or the job ends), then stops the daemons and
# removes the folder if it made it. Exits 1 with the reason when a daemon fails to come up.
# Environment: ORION_GPUD_BIN (the orion-gpud binary), ORION_GPUD_DIR (runtime folder),
# ORION_GPUD_WAIT_S (default 10).
set -euo pipefail

bin=${ORION_GPUD_BIN:?ORION_GPUD_BIN must name the orion-gpud binary}
dir=${ORION_GPUD_DIR:?ORION_GPUD_DIR must name the runtime folder}
wait_s=${ORION_GPUD_WAIT_S:-10}
host=$(hostname -s 2>/dev/null || hostname)
die() {
  echo "start_gpud: $host: $*" >&2
  exit 1
}

[ -x "$bin" ] || die "ORION_GPUD_BIN '$bin' is not executable (build it: scripts/build.sh)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: cannot list this node's GPUs"
listing=$(nvidia-smi --query-gpu=uuid --format=csv,noheader) || die "nvidia-smi --query-gpu=uuid failed"
mapfile -t uuids < <(tr -d ' \t' <<<"$listing" | sed '/^$/d')
[ ${#uuids[@]} -gt 0 ] || die "nvidia-smi lists no GPU (does the job ask for GPUs, e.g. --gpus-per-node?)"

made_dir=0
[ -e "$dir" ] || made_dir=1
pids=()
stop() {
  trap - TERM INT HUP
  [ ${#pids[@]} -eq 0 ] || kill -TERM "${pids[@]}" 2>/dev/null || true
  wait || true  # each daemon stops within a tick of SIGTERM and removes its socket
  [ "$made_dir" = 0 ] || rm -rf -- "$dir"
}
trap stop EXIT
trap 'exit 0' TERM INT HUP

for uuid in "${uuids[@]}"; do
  "$bin" serve --gpu "$uuid" --dir "$dir" &
  pids+=($!)
done
deadline=$((SECONDS + wait_s))
for i in "${!uuids[@]}"; do
  socket="$dir/gpu-${uuids[i]}.sock"
  until [ -S "$socket" ]; do
    kill -0 "${pids[i]}" 2>/dev/null || die "orion-gpud for GPU ${uuids[i]} exited (its error is above)"
    [ "$SECONDS" -lt "$deadline" ] || die "no socket $socket after ${wait_s} s: orion-gpud for GPU ${uuids[i]} did not come up"
    sleep 0.1
  done
done
echo "start_gpud: $host ready: ${#uuids[@]} GPU(s) in $dir"

# Until the job ends. A daemon that dies meanwhile is reported; the others keep serving.
left=${#pids[@]}
while [ "$left" -gt 0 ]; do
  status=0
  wait -n || status=$?
  left=$((left - 1))
  echo "start_gpud: $host: an orion-gpud exited during the job (status $status); $left still serve" >&2
done

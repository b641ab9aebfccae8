#!/usr/bin/env bash
# ORION_GPUD=1 under real Slurm on one machine (tests/slurm/localhost_cluster.sh): submits
# scripts/submit_gpipe_1node.sh with a stand-in nvidia-smi (one GPU) and a stand-in gpipe_runner
# that asks the node's orion-gpud for its status; requires the job to complete with every rank
# having reached the daemon, the daemon gone and its folder removed afterwards; then a daemon that
# never comes up must fail the job before any rank starts.
# Usage: gpud_slurm_check.sh /path/to/orion-gpud /path/to/repo
# Exit: 0 pass, 1 fail, 77 skipped (no Slurm/munge installed, or not root).
set -u
gpud=$(realpath "$1"); repo=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)

# shellcheck source=tests/slurm/localhost_cluster.sh
source "$here/localhost_cluster.sh"
slurm_check_begin gpud-slurm-check

gpu=GPU-slurm-${tmp##*.}
run=$tmp/gpud  # ORION_GPUD_DIR: job ids restart at 1 in every private cluster
mkdir -p "$tmp/bin" "$tmp/submit/logs"
printf '#!/bin/sh\necho %s\n' "$gpu" >"$tmp/bin/nvidia-smi"
cat >"$tmp/bin/runner" <<EOF
#!/bin/sh
# Stands in for gpipe_runner: the node's daemon must answer, found through ORION_GPUD_DIR.
"$gpud" status --gpu $gpu >/dev/null || exit 3
echo "runner \$SLURM_PROCID: orion-gpud of $gpu answered in \$ORION_GPUD_DIR"
EOF
printf '#!/bin/sh\nexec sleep 300\n' >"$tmp/bin/silent-gpud"
chmod +x "$tmp"/bin/*

slurm_cluster_start "$tmp/cluster" || fail "the localhost cluster did not come up"
echo "ok   cluster up: $(sinfo -h -o '%P %D %t %c CPUs')"

# Submits the 1-node script (2 ranks, CPU only) with ORION_GPUD=1 and `orion-gpud` as
# ORION_GPUD_BIN; waits for it; $jobid, $state.
submit() {  # orion-gpud binary
  (cd "$tmp/submit" && PATH="$tmp/bin:$PATH" ORION_GPUD=1 ORION_GPUD_BIN=$1 ORION_GPUD_WAIT_S=2 ORION_GPUD_DIR=$run \
    GPIPE_RUNNER=$tmp/bin/runner CONFIG=$repo/configs/gpt_cpu_tiny.yaml \
    exec sbatch --wait --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 \
      --time=3 "$repo/scripts/submit_gpipe_1node.sh" >"$tmp/jobid") &
  sbatch_pid=$!
  wait "$sbatch_pid"
  sbatch_pid=""
  jobid=$(cat "$tmp/jobid")
  state=$(scontrol show job "$jobid" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
}

submit "$gpud"
[ "$state" = COMPLETED ] || fail "job $jobid ended $state, not COMPLETED"
log=$tmp/submit/logs/gpipe-1node-$jobid.out
grep -q "^start_gpud: .* ready: 1 GPU(s) in $run" "$log" || fail "no ready line in $log"
for r in 0 1; do
  grep -q "^runner $r: orion-gpud of $gpu answered in $run" "$log" || fail "rank $r did not reach the daemon"
done
echo "ok   job $jobid COMPLETED; both ranks reached the node's orion-gpud"
for _ in $(seq 50); do pgrep -f "serve --gpu $gpu" >/dev/null || break; sleep 0.1; done
! pgrep -f "serve --gpu $gpu" >/dev/null || fail "orion-gpud still runs after the job"
[ ! -e "$run" ] || fail "$run is still there after the job"
echo "ok   the daemon stopped with the job and its folder is gone"

rm -f "$tmp"/submit/logs/*
submit "$tmp/bin/silent-gpud"
[ "$state" = FAILED ] || fail "job $jobid with a daemon that never comes up ended $state, not FAILED"
grep -q "no socket $run/gpu-$gpu.sock after 2 s" "$tmp"/submit/logs/* || fail "no reason in the job log"
! grep -q "^runner " "$tmp"/submit/logs/* || fail "the ranks started without a daemon"
echo "ok   a daemon that never comes up fails job $jobid before any rank starts"
echo "gpud_slurm_check: pass"

#!/usr/bin/env bash
# Real Slurm on one machine: starts a private munged + slurmctld + slurmd, submits
# scripts/submit_gpipe_1node.sh as a 2-rank CPU pipeline (one gpipe_runner process per rank,
# rendezvous through MASTER_ADDR/MASTER_PORT), runs the same config in one process without
# Slurm, and requires the job to complete and both runs to log the same losses.
# Usage: local_slurm_check.sh /path/to/gpipe_runner /path/to/repo
# Exit: 0 pass, 1 fail, 77 skipped (no Slurm/munge installed, or not root).
set -u
runner=$(realpath "$1"); repo=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
ranks=2

# shellcheck source=tests/slurm/localhost_cluster.sh
source "$here/localhost_cluster.sh"
slurm_check_begin gpipe-slurm-check

slurm_cluster_start "$tmp/cluster" || fail "the localhost cluster did not come up"
echo "ok   cluster up: $(sinfo -h -o '%P %D %t %c CPUs')"

overrides=(--set parallel.model_parallel_size="$ranks" --set training.max_steps=5
           --set parallel.device=cpu --set training.log_interval=1)
mkdir -p "$tmp/submit/logs"
# sbatch --wait ARGS... from $tmp/submit, in the background: `wait` returns at once on a signal, a
# foreground sbatch --wait would not. Sets rc (sbatch's exit) and jobid.
submit_and_wait() {
  (cd "$tmp/submit" && GPIPE_RUNNER=$runner CONFIG=$repo/configs/gpt_cpu_tiny.yaml \
    exec sbatch --wait --parsable "$@" >"$tmp/jobid") &
  sbatch_pid=$!
  wait "$sbatch_pid"
  rc=$?
  sbatch_pid=""
  jobid=$(cat "$tmp/jobid")
}
# Overrides of the script's GPU header (see scripts/submit_gpipe_1node.sh); --time (minutes)
# bounds a hang well inside ctest's TIMEOUT, so the daemons still get stopped.
submit_and_wait --nodes=1 --ntasks-per-node=$ranks --cpus-per-task=1 --gpus-per-node=0 --time=5 \
  "$repo/scripts/submit_gpipe_1node.sh" "${overrides[@]}" --set "training.output_dir=$tmp/slurm_run"
[ "$rc" -eq 0 ] || fail "sbatch --wait exited $rc (job ${jobid:-?})"
state=$(scontrol show job "$jobid" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
[ "$state" = COMPLETED ] || fail "job $jobid ended $state, not COMPLETED"
echo "ok   job $jobid COMPLETED"
for r in $(seq 0 $((ranks - 1))); do
  grep -qF "[rank $r/$ranks]" "$tmp"/submit/logs/* || fail "no '[rank $r/$ranks]' line in the job log: the ranks did not run as separate processes"
done
echo "ok   the job log has lines of every rank 0..$((ranks - 1))"

# The batch script itself (task 0 of the batch step, SLURM_PROCID=0 and SLURM_NTASKS=2 of the
# allocation) runs the runner without srun: one process with both ranks as threads, not rank 0
# of 2 waiting for a rank 1 that never starts (--peer-timeout bounds that wait if it comes back).
submit_and_wait --nodes=1 --ntasks=$ranks --cpus-per-task=1 --time=5 --output="$tmp/submit/logs/batch_direct.out" \
  --wrap "$runner --config $repo/configs/gpt_cpu_tiny.yaml ${overrides[*]} --peer-timeout 15 --set training.output_dir=$tmp/batch_run"
batch_job=$jobid
[ "$rc" -eq 0 ] || { tail -20 "$tmp/submit/logs/batch_direct.out"; fail "the batch script running the runner directly exited $rc (job ${batch_job:-?})"; }
! grep -qF "joining:" "$tmp/submit/logs/batch_direct.out" ||
  { tail -20 "$tmp/submit/logs/batch_direct.out"; fail "the batch script's runner joined a SLURM world instead of running as one process"; }
[ "$(grep -c '"step"' "$tmp/batch_run/metrics.jsonl" 2>/dev/null)" = 5 ] || fail "the batch script's runner did not log 5 steps"

echo "ok   job $batch_job: the batch script's own runner ran as one process"

timeout 180 "$runner" --config "$repo/configs/gpt_cpu_tiny.yaml" "${overrides[@]}" --set "training.output_dir=$tmp/local_run" \
  >"$tmp/local_run.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || { tail -20 "$tmp/local_run.log"; fail "the one-process run exited $rc"; }
echo "ok   one-process run"

python3 - "$tmp/slurm_run/metrics.jsonl" "$tmp/local_run/metrics.jsonl" <<'PY' || fail "the losses differ"
import json, math, sys
def losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f))}
slurm, local = map(losses, sys.argv[1:])
assert len(local) == 5, f"one-process run logged steps {sorted(local)}, want 5"
assert slurm.keys() == local.keys(), f"steps differ: slurm {sorted(slurm)} vs one-process {sorted(local)}"
for step in sorted(local):
    a, b = slurm[step], local[step]
    assert math.isclose(a, b, rel_tol=1e-6), f"step {step}: slurm loss {a} vs one-process {b}"
print(f"ok   same losses at steps {sorted(local)}: {[round(local[s], 4) for s in sorted(local)]}")
PY
echo "local_slurm_check: pass"

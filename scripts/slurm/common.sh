# shellcheck shell=bash
# Sourced by scripts/submit_gpipe_*.sh inside the batch job, after they have set OURGPIPE_ROOT and
# the default CONFIG. Launches one gpipe_runner per Slurm task; the runner reads its rank, world
# size and local rank from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, and the rendezvous from
# MASTER_ADDR / MASTER_PORT exported here. ORION_GPUD=1 first starts one orion-gpud per GPU on
# every node (scripts/slurm/gpud.sh).
set -euo pipefail
[ -n "${SLURM_JOB_ID:-}" ] || { echo "submit: not inside a Slurm job; submit with sbatch (or run inside salloc)" >&2; exit 2; }

GPIPE_RUNNER=${GPIPE_RUNNER:-$OURGPIPE_ROOT/build/trainer/gpipe_runner}
case $CONFIG in /*) ;; *) CONFIG=$OURGPIPE_ROOT/$CONFIG ;; esac
[ -x "$GPIPE_RUNNER" ] || { echo "submit: GPIPE_RUNNER '$GPIPE_RUNNER' is not executable (build first: scripts/build.sh)" >&2; exit 2; }
[ -r "$CONFIG" ] || { echo "submit: CONFIG '$CONFIG' is not readable" >&2; exit 2; }

# The first host of the allocation hosts the c10d TCPStore (rank 0 runs there: tasks are placed in
# block order by default).
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)}
# Derived from the job id so that two jobs sharing a node do not fight over one port; kept below
# Linux's ephemeral range (32768+) so that no outgoing connection already holds it.
MASTER_PORT=${MASTER_PORT:-$((15000 + SLURM_JOB_ID % 15000))}
# Torch would otherwise start one intra-op thread per core of the node in every rank.
OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
# Since 22.05 srun no longer inherits sbatch's --cpus-per-task: without this every rank would get
# one CPU on clusters that bind tasks to CPUs.
SRUN_CPUS_PER_TASK=${SRUN_CPUS_PER_TASK:-${SLURM_CPUS_PER_TASK:-1}}
export MASTER_ADDR MASTER_PORT OMP_NUM_THREADS SRUN_CPUS_PER_TASK

# ORION_GPUD=1: one orion-gpud per GPU on every node, up before the training step and stopped at
# the end (cross-process bubble filling, issue 25; scripts/slurm/gpud.sh).
if [ "${ORION_GPUD:-0}" = 1 ]; then
  # shellcheck source=scripts/slurm/gpud.sh
  source "$OURGPIPE_ROOT/scripts/slurm/gpud.sh"
  gpud_start
fi

echo "submit: job $SLURM_JOB_ID, $SLURM_NTASKS task(s) on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT"
echo "submit: $GPIPE_RUNNER --config $CONFIG $*"
# --kill-on-bad-exit: when one rank dies the others would otherwise block in a collective until
# the time limit; this ends the step at once and the job fails (srun exits with the largest task
# exit code: 143 for the peers it terminated). Every task sees all GPUs of its node (no
# --gpu-bind), so the runner picks its device by SLURM_LOCALID.
srun --kill-on-bad-exit=1 "$GPIPE_RUNNER" --config "$CONFIG" "$@"

#!/usr/bin/env bash
# GPipe training on 1 node x 4 GPUs = 4 pipeline ranks with gpt_small.yaml (one task per GPU).
#   mkdir -p logs && sbatch scripts/submit_gpipe_1node.sh [gpipe_runner flags, e.g. --set training.max_steps=100]
# sbatch opens logs/ before the job starts and fails the job if it is missing: create it first,
# in the folder you submit from. Environment: CONFIG, GPIPE_RUNNER, MASTER_ADDR, MASTER_PORT,
# OURGPIPE_ROOT override the defaults (see scripts/slurm/common.sh); ORION_GPUD=1 also runs one
# orion-gpud per GPU on every node for the job (scripts/slurm/gpud.sh). CPU-only cluster or test:
#   sbatch --gpus-per-node=0 --cpus-per-task=1 ... --set parallel.device=cpu
#SBATCH --job-name=gpipe-1node
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=8
# A request on the command line replaces this one: Slurm 22.05 accepts --gpus-per-node=0 on a
# cluster without GPUs, whereas --gres=none does not cancel a --gpus-per-node given here.
#SBATCH --gpus-per-node=4
#SBATCH --time=04:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err
CONFIG=${CONFIG:-configs/gpt_small.yaml}
# sbatch runs a copy of this script from the spool folder: find the checkout from the submitted
# path, which scontrol reports followed by the arguments.
submitted=$(scontrol show job "${SLURM_JOB_ID:-0}" 2>/dev/null | sed -n 's/^ *Command=//p')
[ $# -eq 0 ] || submitted=${submitted%" $*"}
for OURGPIPE_ROOT in "${OURGPIPE_ROOT:-}" "$(dirname "$0")/.." "$(dirname "$submitted")/.." \
    "${SLURM_SUBMIT_DIR:-.}" "${SLURM_SUBMIT_DIR:-.}/.." ""; do
  [ -f "$OURGPIPE_ROOT/scripts/slurm/common.sh" ] && break
done
[ -n "$OURGPIPE_ROOT" ] || { echo "submit: cannot find the checkout; set OURGPIPE_ROOT" >&2; exit 2; }
OURGPIPE_ROOT=$(cd "$OURGPIPE_ROOT" && pwd)
source "$OURGPIPE_ROOT/scripts/slurm/common.sh"

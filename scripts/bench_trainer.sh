#!/usr/bin/env bash
# Trainer throughput on this machine's CPU, ours vs the PyTorch peers, on one config:
#   ours, 4 stages in one process (parallel.scheduler=async_threaded, parallel.schedule=1f1b)
#   ours, 1 stage (the unpipelined model)
#   PyTorch eager (scripts/peers/bench_eager.py)
#   torch.distributed.pipelining, 4 Gloo processes, Schedule1F1B (scripts/peers/bench_pipelining.py)
# Each runs WARMUP + STEPS steps; the first WARMUP are left out of every number. Prints a table of
# tokens/s and ours/peer ratios and writes it to docs/results/<date>-trainer-cpu.md.
#
#   scripts/bench_trainer.sh [CONFIG]       (default configs/gpt_cpu_tiny.yaml)
# Environment: STEPS (100), WARMUP (5), GPIPE_RUNNER (path of gpipe_runner; default: the first of
# build/, build-engine/, build-peers/ that has trainer/gpipe_runner), OURGPIPE_PYTHON (python with
# torch 2.11; default .venv/bin/python), BENCH_OUT (run folder; default runs/bench_trainer/<time>),
# BENCH_THREADS (torch intra-op threads of every run, stage thread or process: default 1, because
# on a loaded 2-core machine a second spinning OpenMP thread per stage makes every run several
# times slower and the comparison meaningless).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
config=${1:-configs/gpt_cpu_tiny.yaml}
steps=${STEPS:-100}
warmup=${WARMUP:-5}
threads=${BENCH_THREADS:-1}
command_line="STEPS=$steps WARMUP=$warmup BENCH_THREADS=$threads scripts/bench_trainer.sh $config"
export OMP_NUM_THREADS=$threads  # LibTorch's intra-op pool in gpipe_runner (the peers get --threads)

die() { echo "[bench_trainer] error: $*" >&2; exit 1; }
[ -f "$config" ] || die "config '$config' does not exist (give a YAML file as the first argument)"
python=${OURGPIPE_PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || die "no python at '$python': run scripts/install-deps.sh or set OURGPIPE_PYTHON"
"$python" -c 'import torch, yaml' 2>/dev/null || die "'$python' lacks torch or yaml: run scripts/install-deps.sh"

runner=${GPIPE_RUNNER:-}
if [ -z "$runner" ]; then
  for dir in build build-engine build-peers; do
    if [ -x "$root/$dir/trainer/gpipe_runner" ]; then runner=$root/$dir/trainer/gpipe_runner; break; fi
  done
fi
if [ -z "$runner" ] || [ ! -x "$runner" ]; then die "gpipe_runner not found (looked in build/, build-engine/, build-peers/ under trainer/): build it with scripts/build.sh or set GPIPE_RUNNER"; fi

out=${BENCH_OUT:-$root/runs/bench_trainer/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
total=$((warmup + steps))
echo "[bench_trainer] config=$config steps=$steps warmup=$warmup threads=$threads runner=$runner out=$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# Steps are capped by max_steps; the timeline is taken at the first timed step and the run goes on.
common_sets=(--set "training.max_steps=$total"
             --set "training.profile_iteration=$warmup" --set "training.exit_after_profile=false"
             --set "parallel.device=cpu")
run_ours() {  # name, extra --set arguments
  local name=$1; shift
  echo "[bench_trainer] $name ..."
  "$runner" --config "$config" --output-dir "$out/$name" "${common_sets[@]}" "$@" >"$out/$name.log" 2>&1 \
    || die "gpipe_runner ($name) failed: see $out/$name.log"
}
run_peer() {  # name, script, extra arguments
  local name=$1 script=$2; shift 2
  echo "[bench_trainer] $name ..."
  "$python" "scripts/peers/$script" --config "$config" --steps "$steps" --warmup "$warmup" \
    --set parallel.device=cpu --threads "$threads" --output "$out/$name.json" "$@" >"$out/$name.log" 2>&1 \
    || die "$script failed: see $out/$name.log"
}

run_ours ours_4stage --set parallel.model_parallel_size=4 --set parallel.scheduler=async_threaded \
  --set parallel.schedule=1f1b
run_ours ours_1stage --set parallel.model_parallel_size=1 --set parallel.scheduler=async_threaded \
  --set parallel.schedule=1f1b
run_peer eager bench_eager.py --device cpu
run_peer pipelining bench_pipelining.py --schedule 1f1b --stages 4

"$python" scripts/peers/trainer_table.py --dir "$out" --warmup "$warmup" --config "$config" \
  --command "$command_line" --threads "$threads" --load "$load_before" --markdown "docs/results/$(date -u +%Y-%m-%d)-trainer-cpu.md"
if [ -f "$out/ours_4stage/timeline.json" ]; then
  "$python" scripts/plot_timeline.py "$out/ours_4stage/timeline.json" -o "$out/ours_4stage_timeline.png" \
    --title "gpipe_runner, 4 stages, 1f1b, async_threaded (CPU)" || die "plotting the timeline failed"
fi

# Shared by the multi-process CPU benchmarks (bench_distributed.sh, bench_data_parallel.sh):
# sourced after `steps` is set; defines root, runner, py, work (removed on exit), cfg (the tiny
# GPT for `steps` steps on CPU, quiet) and port (a random base for --master-port).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
runner=${GPIPE_RUNNER:-$root/build/trainer/gpipe_runner}
py=${OURGPIPE_PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cfg=(--config "$root/configs/gpt_cpu_tiny.yaml" --steps "$steps" --set training.profile_iteration=-1
     --set training.log_interval=1000 --device cpu)
# One intra-op thread per pipeline rank in every layout, so only the layout differs.
export OMP_NUM_THREADS=1
port=$((20000 + RANDOM % 20000))

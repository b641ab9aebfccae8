#!/usr/bin/env bash
# Replicated stages (parallel.data_parallel_size) against pipeline-only layouts on CPU over Gloo,
# same global batch (16) and micro-batches (8), measured in one run: step time ratio against a
# 2-stage pipeline in 2 processes, the largest loss difference from it over all steps (the
# layouts train the same trajectory), and how many gradient buckets the hooks started during
# the stages' last backward.
# Usage: scripts/bench_data_parallel.sh [STEPS] [OUT.md]   (build first: scripts/build.sh)
set -euo pipefail
steps=${1:-30}
out_md=${2:-}
source "$(dirname "$0")/lib/multiprocess_bench.sh"
run() {  # name, then the layout's flags
  local name=$1
  shift
  port=$((port + 1))
  "$runner" "${cfg[@]}" "$@" --output-dir "$work/$name" --master-port $port > "$work/$name.log" 2>&1
}
run pp2 --stages 2 --nproc-per-node 2
run dp2 --stages 1 --data-parallel-size 2 --nproc-per-node 2
run dp2_small_buckets --stages 1 --data-parallel-size 2 --nproc-per-node 2 --set parallel.dp_bucket_mb=0.05
run pp2_dp2 --stages 2 --data-parallel-size 2 --nproc-per-node 4
"$py" - "$work" "$steps" "$out_md" "$(getconf _NPROCESSORS_ONLN)" <<'PY'
import json, re, sys, datetime
work, steps, out_md, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def summary(name):
    return json.load(open(f"{work}/{name}/summary.json"))
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{work}/{name}/metrics.jsonl") if l.strip()]
def buckets(name):
    found = re.findall(r"gradient all-reduce: (\d+) of (\d+) buckets started during", open(f"{work}/{name}.log").read())
    return "-" if not found else ", ".join(f"{a}/{b}" for a, b in found)
ref, ref_losses = summary("pp2"), losses("pp2")
layouts = [("pp2", "2 stages x 1 replica (2 processes)", "-"),
           ("dp2", "1 stage x 2 replicas (2 processes), 25 MiB buckets (one per stage here)", ""),
           ("dp2_small_buckets", "1 stage x 2 replicas (2 processes), 0.05 MiB buckets", ""),
           ("pp2_dp2", "2 stages x 2 replicas (4 processes on the same cores)", "")]
rows = []
for name, label, _ in layouts:
    s = summary(name)
    diff = max(abs(a - b) for a, b in zip(losses(name), ref_losses))
    rows.append(f"| {label} | {s['step_time_ms_mean']:.1f} | {s['step_time_ms_mean'] / ref['step_time_ms_mean']:.2f} | "
                f"{s['tokens_per_s']:.0f} | "
                f"{diff:.2e} | {buckets(name)} |")
text = "\n".join([
    f"Measured {datetime.date.today()} on {cores} CPU cores, configs/gpt_cpu_tiny.yaml (global batch 16, 8 "
    f"micro-batches, 1f1b), {steps} steps, OMP_NUM_THREADS=1, Gloo, `scripts/bench_data_parallel.sh {steps}`.",
    "",
    "| layout | step ms (mean, first step excluded) | vs 2 stages | tokens/s | max abs loss difference from 2 stages | buckets started during the last backward (per stage process, last step) |",
    "|---|---|---|---|---|---|",
    *rows,
])
print(text)
if out_md:
    open(out_md, "a").write(text + "\n")
PY

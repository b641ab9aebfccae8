#!/usr/bin/env bash
# Multi-process Gloo pipeline against the in-process pipeline on CPU, same config and step
# count, measured in one run: step time ratio (multi-process / in-process) and the bytes sent
# between processes per step against the activation + gradient bytes the model implies.
# Usage: scripts/bench_distributed.sh [STEPS] [OUT.md]   (build first: scripts/build.sh)
set -euo pipefail
steps=${1:-20}
out_md=${2:-}
source "$(dirname "$0")/lib/multiprocess_bench.sh"
"$runner" "${cfg[@]}" --output-dir "$work/inprocess" > "$work/inprocess.log" 2>&1
"$runner" "${cfg[@]}" --output-dir "$work/gloo2" --nproc-per-node 2 --master-port $port > "$work/gloo2.log" 2>&1
"$runner" "${cfg[@]}" --output-dir "$work/gloo4" --nproc-per-node 4 --master-port $((port + 1)) > "$work/gloo4.log" 2>&1
"$py" - "$work" "$steps" "$out_md" "$(getconf _NPROCESSORS_ONLN)" <<'PY'
import json, re, sys, datetime
work, steps, out_md, cores = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def summary(name):
    return json.load(open(f"{work}/{name}/summary.json"))
def bytes_line(name):
    m = re.search(r"bytes sent between processes: (\d+) per step over (\d+) process boundar\w+ \(the model implies (\d+)",
                  open(f"{work}/{name}.log").read())
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)
ref = summary("inprocess")
rows = []
for name, procs in (("gloo2", 2), ("gloo4", 4)):
    s = summary(name)
    sent, boundaries, implied = bytes_line(name)
    same = abs(s["final_loss"] - ref["final_loss"]) <= 1e-6 * abs(ref["final_loss"])
    rows.append(f"| {procs} processes x {4 // procs} ranks (gloo) | {s['step_time_ms_mean']:.1f} | "
                f"{s['step_time_ms_mean'] / ref['step_time_ms_mean']:.2f} | {sent} | {implied} | "
                f"{sent / implied:.4f} | {'yes' if same else 'NO'} |")
text = "\n".join([
    f"Measured {datetime.date.today()} on {cores} CPU cores, configs/gpt_cpu_tiny.yaml (4 pipeline ranks, 1f1b, "
    f"8 micro-batches), {steps} steps, OMP_NUM_THREADS=1, `scripts/bench_distributed.sh {steps}`.",
    "",
    "| layout | step ms (mean, first step excluded) | vs in-process | bytes sent / step | implied by the model | ratio | same final loss |",
    "|---|---|---|---|---|---|---|",
    f"| 1 process x 4 ranks (in memory) | {ref['step_time_ms_mean']:.1f} | 1.00 | 0 | 0 | - | - |",
    *rows,
])
print(text)
if out_md:
    open(out_md, "a").write(text + "\n")
PY

#!/usr/bin/env bash
# Every schedule gpipe_runner generates, with and without overlapped forward+backward pairs
# (parallel.overlap_f_b), against 1F1B on one config: mean step time, the runner's measured bubble,
# the simulated bubble (unit costs, --print-schedule) and the peak activations per rank. Runs are
# interleaved schedule by schedule in REPEAT rounds, so machine load hits all of them alike; the
# table gives each run's mean step time over the rounds and its ratio to 1F1B's. Writes the table
# to docs/results/<date>-schedules-<device>.md.
#
#   scripts/bench_schedules.sh [CONFIG]      (default configs/gpt_cpu_tiny.yaml)
# Environment: STEPS (30 timed steps), WARMUP (5 steps left out), REPEAT (2 rounds), DEVICE (cpu;
# cuda runs the same table on the GPU), GPIPE_RUNNER (default: build/trainer/gpipe_runner),
# OURGPIPE_PYTHON (default .venv/bin/python), BENCH_OUT (default runs/bench_schedules/<time>),
# BENCH_THREADS (torch intra-op threads per stage thread: default 1, see bench_trainer.sh),
# EXTRA_ARGS (more gpipe_runner flags for every run, e.g. "--set parallel.use_orion_scheduler=true").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
: "${STEPS:=30}" "${WARMUP:=5}" "${REPEAT:=2}" "${DEVICE:=cpu}" "${BENCH_THREADS:=1}" "${EXTRA_ARGS:=}"
config=${1:-configs/gpt_cpu_tiny.yaml} steps=$STEPS warmup=$WARMUP repeat=$REPEAT device=$DEVICE
threads=$BENCH_THREADS extra=$EXTRA_ARGS
export OMP_NUM_THREADS=$threads
die() { echo "[bench_schedules] error: $*" >&2; exit 1; }
[ -f "$config" ] || die "config '$config' does not exist (give a YAML file as the first argument)"
runner=${GPIPE_RUNNER:-$root/build/trainer/gpipe_runner}
[ -x "$runner" ] || die "gpipe_runner not found at '$runner': build it with scripts/build.sh or set GPIPE_RUNNER"
python=${OURGPIPE_PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || die "no python at '$python': run scripts/install-deps.sh or set OURGPIPE_PYTHON"
out=${BENCH_OUT:-$root/runs/bench_schedules/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
command_line="STEPS=$steps WARMUP=$warmup REPEAT=$repeat DEVICE=$device BENCH_THREADS=$threads scripts/bench_schedules.sh $config"

# name | schedule | virtual stages | overlap_f_b
runs=(
  "1f1b|1f1b|1|false" "1f1b+overlap|1f1b|1|true"
  "zb_h1|zb_h1|1|false" "zb_h1+overlap|zb_h1|1|true"
  "interleaved_1f1b|interleaved_1f1b|2|false" "interleaved_1f1b+overlap|interleaved_1f1b|2|true"
  "looped_bfs|looped_bfs|2|false" "looped_bfs+overlap|looped_bfs|2|true"
  "interleaved_zb|interleaved_zb|2|false" "interleaved_zb+overlap|interleaved_zb|2|true"
  "zbv|zbv|2|false" "zbv+overlap|zbv|2|true"
  "dualpipev (no pairs)|dualpipev|2|false" "dualpipev (torch's pairs)|dualpipev|2|auto"
  "dualpipev+overlap|dualpipev|2|true"
)
for round in $(seq 1 "$repeat"); do
  for run in "${runs[@]}"; do
    IFS='|' read -r name schedule v overlap <<<"$run"
    dir="$out/$(echo "$name" | tr -c 'A-Za-z0-9_\n' '_')_$round"
    args=(--config "$config" --schedule "$schedule" --virtual-stages "$v" --overlap-f-b "$overlap" --device "$device")
    if [ "$round" = 1 ]; then
      # shellcheck disable=SC2086
      "$runner" "${args[@]}" $extra --print-schedule >"$dir.schedule.txt" 2>&1 \
        || die "$name: --print-schedule failed: $(tail -n 3 "$dir.schedule.txt")"
    fi
    echo "[bench_schedules] round $round/$repeat: $name"
    # shellcheck disable=SC2086
    "$runner" "${args[@]}" $extra --steps $((warmup + steps)) --output-dir "$dir" >"$dir.log" 2>&1 \
      || die "$name: gpipe_runner failed (log $dir.log): $(tail -n 3 "$dir.log")"
  done
done

"$python" - "$out" "$warmup" "$repeat" "$command_line" "$device" "${runs[@]}" <<'PY'
import datetime, json, os, re, statistics, sys
out, warmup, repeat, command_line, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
runs = [r.split("|") for r in sys.argv[6:]]
def slug(name):
    return re.sub(r"[^A-Za-z0-9_]", "_", name)
rows = {}
for name, schedule, v, overlap in runs:
    means, bubbles = [], []
    for rnd in range(1, repeat + 1):
        its = [json.loads(l) for l in open(os.path.join(out, f"{slug(name)}_{rnd}", "metrics.jsonl"))]
        timed = [it for it in its if it["step"] >= warmup] or its
        means.append(statistics.mean(it["step_time_ms"] for it in timed))
        bubbles.append(statistics.mean(it["bubble_fraction"] for it in timed))
    text = open(os.path.join(out, f"{slug(name)}_1.schedule.txt")).read()
    sim = re.search(r"simulated bubble ([0-9.]+)%", text)
    peak = re.search(r"peak activations per rank[^:]*:([ 0-9]+)", text)
    pairs = len(re.findall(r"\([^()|]*;[^()|]*\)", text.split("simulated bubble")[0]))
    rows[name] = dict(schedule=schedule, v=v, overlap=overlap, ms=statistics.mean(means), runs=means,
                      bubble=statistics.mean(bubbles), sim=float(sim.group(1)) if sim else float("nan"),
                      peak=peak.group(1).strip() if peak else "?", pairs=pairs)
base = rows[runs[0][0]]["ms"]
now = datetime.datetime.now(datetime.timezone.utc)
lines = [f"# Schedules on {device}, {now:%Y-%m-%d %H:%M} UTC", "",
         f"- Command: `{command_line}`",
         f"- Load average when the table was written: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
         f"- Each run: {warmup} warm-up steps left out; {repeat} rounds, schedules interleaved within each round.",
         "- Simulated bubble: unit costs (F=1, B=2 per micro-batch and rank, chunks scaled by 1/v), free "
         "communication; an overlapped pair costs its two halves back to back (what overlap gains is measured on a GPU).",
         "- Overlapped pairs (grid cells): how many forward+backward pairs the step has over all ranks.", "",
         "| run | step ms (mean) | per round | / 1f1b | measured bubble | simulated bubble | pairs | peak activations per rank |",
         "|---|---:|---|---:|---:|---:|---:|---|"]
for name, *_ in runs:
    r = rows[name]
    lines.append(f"| {name} | {r['ms']:.1f} | {', '.join(f'{x:.1f}' for x in r['runs'])} | {r['ms'] / base:.2f} | "
                 f"{100 * r['bubble']:.1f}% | {r['sim']:.1f}% | {r['pairs']} | {r['peak']} |")
table = "\n".join(lines) + "\n"
print(table)
dest = os.path.join("docs", "results", f"{now:%Y-%m-%d}-schedules-{device}.md")
with open(dest, "w") as f:
    f.write(table)
print(f"[bench_schedules] wrote {dest}")
PY

#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains a small GPT as a 4-stage 1F1B
# pipeline (one thread per stage) on the embedded corpus. Prints the loss as it falls and the
# end-of-run summary, and writes runs/gpt_cpu_tiny/{metrics.jsonl,summary.json,timeline.json}
# plus a Gantt chart of the timeline (timeline.png).
# Extra arguments go to gpipe_runner, e.g. `scripts/run.sh --schedule zb_h1 --steps 50`, or
# `scripts/run.sh --config configs/gpt_small.yaml`; the output folder is $OURGPIPE_RUN_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
# Only what this script runs: the runner and the shim it may preload (scripts/test.sh builds the
# tests and tools too). About 6 minutes on 2 cores the first time; seconds after.
OURGPIPE_TARGETS=${OURGPIPE_TARGETS:-run_targets} scripts/build.sh
config=configs/gpt_cpu_tiny.yaml
out=${OURGPIPE_RUN_DIR:-runs/gpt_cpu_tiny}
build/trainer/gpipe_runner --config "$config" --output-dir "$out" "$@"
if [ -f "$out/timeline.json" ]; then
  .venv/bin/python scripts/plot_timeline.py "$out/timeline.json" -o "$out/timeline.png" \
    && echo "[run] timeline: $out/timeline.json (open in ui.perfetto.dev or chrome://tracing), Gantt chart: $out/timeline.png"
fi

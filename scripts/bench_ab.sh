#!/usr/bin/env bash
# Two builds of gpipe_runner (before and after a change) on one config, in alternating rounds on
# this machine, so that both see the same load: per round, each runs STEPS steps (A first in odd
# rounds, B first in even ones); the first WARMUP of every run are left out; per build the median
# step time of each round, then the median of those; prints the ratio B / A. Extra arguments go to both runs (e.g. --set parallel.scheduler=naive).
#
#   scripts/bench_ab.sh RUNNER_A RUNNER_B [CONFIG [ARGS...]]   (CONFIG default configs/gpt_cpu_tiny.yaml)
# Environment: STEPS (40), WARMUP (2), ROUNDS (3), BENCH_OUT (run folder; default a fresh temp dir),
# OURGPIPE_PYTHON (python for the summary; default .venv/bin/python, else python3).
# Keep the first build: `cp build/trainer/gpipe_runner /tmp/runner_a` before rebuilding.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "[bench_ab] error: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: scripts/bench_ab.sh RUNNER_A RUNNER_B [CONFIG [ARGS...]]"
a=$1 b=$2; shift 2
config=${1:-$root/configs/gpt_cpu_tiny.yaml}; [ $# -gt 0 ] && shift
for r in "$a" "$b"; do [ -f "$r" ] && [ -x "$r" ] || die "'$r' is not an executable gpipe_runner"; done
[ -f "$config" ] || die "config '$config' does not exist"
steps=${STEPS:-40} warmup=${WARMUP:-2} rounds=${ROUNDS:-3}
for v in "STEPS=$steps" "WARMUP=$warmup" "ROUNDS=$rounds"; do
  [[ ${v#*=} =~ ^[0-9]+$ ]] || die "$v is not a whole number"
done
[ "$steps" -gt "$warmup" ] || die "STEPS ($steps) must exceed WARMUP ($warmup)"
[ "$rounds" -ge 1 ] || die "ROUNDS must be at least 1"
python=${OURGPIPE_PYTHON:-$root/.venv/bin/python}; [ -x "$python" ] || python=python3
out=${BENCH_OUT:-$(mktemp -d /tmp/bench_ab.XXXXXX)}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  order="a b"; [ $((round % 2)) = 0 ] && order="b a"
  for side in $order; do
    runner=$a; [ $side = b ] && runner=$b
    dir=$out/${side}_$round
    if ! "$runner" --config "$config" --steps "$steps" --output-dir "$dir" --set training.profile_iteration=-1 \
         --set training.log_interval=1000000 "$@" >"$dir.log" 2>&1; then
      die "$side ($runner) failed in round $round: see $dir.log"
    fi
  done
done
"$python" - "$out" "$rounds" "$warmup" "$a" "$b" "$steps" <<'PY'
import json, statistics, sys
out, rounds, warmup, a, b, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6])
med = {}
for side, runner in (("a", a), ("b", b)):
    per_round = []
    for r in range(1, rounds + 1):
        steps = [json.loads(l)["step_time_ms"] for l in open(f"{out}/{side}_{r}/metrics.jsonl") if l.strip()]
        if len(steps) != want:
            sys.exit(f"[bench_ab] error: {side} ran {len(steps)} steps in round {r}, not STEPS={want} "
                     f"(a shorter dataset or a max_steps override?): see {out}/{side}_{r}.log")
        per_round.append(statistics.median(steps[warmup:]))
    med[side] = statistics.median(per_round)
    print(f"{side}: {runner}: step ms per round {', '.join(f'{x:.2f}' for x in per_round)}; median {med[side]:.2f}")
print(f"B / A step time: {med['b'] / med['a']:.3f}")
PY
[ -n "${BENCH_OUT:-}" ] || rm -rf "$out"  # a temp folder of our own; BENCH_OUT keeps the runs

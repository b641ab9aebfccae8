#!/usr/bin/env bash
# Check (i): the planner on the GPU. gpipe_runner --plan on configs/gpt_350m_gpu.yaml (4 ranks on
# the one GPU, bf16): measures every layer's F / I / W time and memory on the GPU, simulates the
# candidates, then --verify runs the top GPU_CHECK_PLAN_VERIFY (2) for 5 steps each. Rows:
# predicted against measured step time and peak allocated memory per verified candidate.
# Usage: scripts/gpu/check_plan.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_plan.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
need_trainer "i: plan" || exit 1
dir=$OUTDIR/plan
mkdir -p "$dir"
timeout -k 5 "${GPU_PLAN_TIMEOUT:-190}" "$RUNNER" --config "$GPU_ROOT/$GPU_CONFIG" --set parallel.device=cuda \
  --output-dir "$dir" --plan --plan-schedules 1f1b,zb_h1,interleaved_1f1b,dualpipev --plan-max-microbatches 8 \
  --verify "${GPU_CHECK_PLAN_VERIFY:-2}" --verify-steps 5 >"$OUTDIR/logs/plan.log" 2>&1
rc=$?
"$PYTHON" - "$dir/plan.json" "$rc" <<'PY' | tee -a "$OUTDIR/results.md"
import json, sys
path, rc = sys.argv[1], int(sys.argv[2])
try:
    report = json.load(open(path))
    p = report["profile"]
    print(f"| i: plan, profile | INFO | {p['device']}: measured in {p['seconds']:.1f} s; {report['considered']} "
          f"configurations simulated; pick {report['ranked'][0]['label']} at "
          f"{report['ranked'][0]['predicted_step_ms']:.1f} ms |")
    verify = report["verify"]
except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
    # A partial plan.json (a run killed at its limit) still gets its row.
    print(f"| i: plan | FAIL | gpipe_runner --plan exit {rc}, no complete plan.json ({type(e).__name__}: {e}); "
          f"logs/plan.log |")
    sys.exit(0)
ok = rc == 0 and bool(verify)
for v in verify:
    if v["exit_code"] != 0 or v["measured_step_ms"] <= 0:
        ok = False
        print(f"| i: plan #{v['rank']} {v['label']} | FAIL | run exit {v['exit_code']} (logs/plan.log) |")
        continue
    err = v["predicted_step_ms"] / v["measured_step_ms"] - 1
    mem = v["predicted_peak_bytes"] / v["measured_peak_bytes"] - 1 if v["measured_peak_bytes"] > 0 else float("nan")
    print(f"| i: plan #{v['rank']} {v['label']} | INFO | step predicted {v['predicted_step_ms']:.1f} ms, measured "
          f"{v['measured_step_ms']:.1f} ms ({100*err:+.1f}%); peak predicted {v['predicted_peak_bytes']/2**20:.0f} MiB, "
          f"measured {v['measured_peak_bytes']/2**20:.0f} MiB ({100*mem:+.1f}%) |")
print(f"| i: plan | {'PASS' if ok else 'FAIL'} | --plan --verify on {p['device']} (exit {rc}); plan.json in logs |")
PY
cp "$dir/plan.json" "$OUTDIR/logs/plan.json" 2>/dev/null
cp "$dir/plan.yaml" "$OUTDIR/logs/plan.yaml.txt" 2>/dev/null
exit 0

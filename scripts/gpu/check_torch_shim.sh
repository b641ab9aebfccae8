#!/usr/bin/env bash
# Check (b): tests/gpu/torch_under_shim.py (cuBLASLt bf16 training step, cuDNN conv, Triton from
# torch.compile, CUDA graph replay, one-rank NCCL all-reduce) without and with the shim: results
# bitwise equal, and the shim's kernel count equal to torch.profiler's. Usage: scripts/gpu/check_torch_shim.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_torch_shim.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
need "$SHIM" "libgpu_scheduler.so from the build" || { record "b: torch under shim" FAIL "missing $SHIM"; exit 1; }
program=tests/gpu/torch_under_shim.py
# Inductor compiles in this process (no worker pool): a preloaded worker would write the shim's
# trace file too, at its own exit.
export TORCHINDUCTOR_COMPILE_THREADS=1
timeout 200 "$PYTHON" "$program" --time-iterations 20 --output "$OUTDIR/torch_no_shim.json" \
  >"$OUTDIR/logs/torch_no_shim.log" 2>&1; rc1=$?
LD_PRELOAD=$SHIM USE_ORION_SCHEDULER=1 ORION_POLICY=orion ORION_TRACE=$OUTDIR/torch_shim_orion_trace.json \
  timeout 200 "$PYTHON" "$program" --output "$OUTDIR/torch_shim.json" >"$OUTDIR/logs/torch_shim.log" 2>&1; rc2=$?
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
  record "b: torch under shim" FAIL "rc=$rc1 without shim, rc=$rc2 with shim (logs/torch_*shim.log: $(tail -n 1 "$OUTDIR/logs/torch_shim.log" | tr '|' '/' | cut -c1-200))"
  exit 1
fi
verdict=$("$PYTHON" "$program" --compare "$OUTDIR/torch_no_shim.json" "$OUTDIR/torch_shim.json" 2>&1); rc=$?
if [ $rc -ne 0 ]; then
  record "b: torch under shim" FAIL "$(printf '%s' "$verdict" | tr '|\n' '/ ')"
  exit 1
fi
# What the release_all default cost this PyTorch program (issue 24): the shim's exit line.
releases=$(grep -o '[0-9]* release-class driver calls.*' "$OUTDIR/logs/torch_shim.log" | tail -n 1 | cut -c1-300)
record "b: torch under shim" PASS "results bitwise equal; $(printf '%s' "$verdict" | tr '|\n' '/ '); ${releases:-no release-class driver call}"

# Pass-through cost: the shim preloaded with USE_ORION_SCHEDULER=0 against no shim, time per run
# of each phase over 20 runs (issue 27's goal: at most 1.01x), outputs again equal.
LD_PRELOAD=$SHIM USE_ORION_SCHEDULER=0 timeout 200 "$PYTHON" "$program" --time-iterations 20 \
  --output "$OUTDIR/torch_passthrough.json" >"$OUTDIR/logs/torch_passthrough.log" 2>&1; rc3=$?
if [ $rc3 -ne 0 ]; then
  record "b: pass-through time" FAIL "rc=$rc3 with the shim in pass-through (logs/torch_passthrough.log)"
  exit 1
fi
same=$("$PYTHON" - "$OUTDIR/torch_no_shim.json" "$OUTDIR/torch_passthrough.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["phases"] for p in sys.argv[1:])
print("equal" if all(a[k].get("sha256") == b.get(k, {}).get("sha256") for k in a) else "DIFFER")
PY
)
ratio=$("$PYTHON" "$program" --timing "$OUTDIR/torch_no_shim.json" "$OUTDIR/torch_passthrough.json" 2>&1)
if [ "$same" != "equal" ]; then
  record "b: pass-through time" FAIL "outputs differ from the run without the shim; $ratio"
  exit 1
fi
record "b: pass-through time" INFO "time per run, shim in pass-through / no shim: $ratio; outputs equal"

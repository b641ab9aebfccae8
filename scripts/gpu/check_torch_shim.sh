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
timeout 200 "$PYTHON" "$program" --output "$OUTDIR/torch_no_shim.json" >"$OUTDIR/logs/torch_no_shim.log" 2>&1; rc1=$?
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

#!/usr/bin/env bash
# Check (d): gpipe_runner on configs/gpt_350m_gpu.yaml (bf16, seq 1024): async_threaded vs naive
# executor, shim off vs on, and the PyTorch eager peer on the same GPT; tokens/s and MFU.
# Usage: scripts/gpu/check_trainer.sh OUTDIR   (env: GPU_CHECK_TRAINER_STEPS, default 6, of which 2 warm-up)
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_trainer.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
config=configs/gpt_350m_gpu.yaml
steps=${GPU_CHECK_TRAINER_STEPS:-6}
warmup=2
for f in "$RUNNER" "$config" "$SHIM"; do
  need "$f" "gpipe_runner, the GPU config and the shim" || { record "d: trainer" FAIL "missing $f"; exit 1; }
done
dir=$OUTDIR/trainer
mkdir -p "$dir"
failed=0
run_ours() {  # variant, then extra arguments
  local variant=$1; shift
  timeout 150 "$RUNNER" --config "$config" --output-dir "$dir/$variant" \
    --set "training.max_steps=$steps" --set training.exit_after_profile=false \
    --set "training.profile_iteration=$warmup" --set parallel.device=cuda "$@" \
    >"$OUTDIR/logs/trainer_$variant.log" 2>&1 \
    || { echo "gpipe_runner $variant failed: logs/trainer_$variant.log"; failed=1; }
}
run_ours async --set parallel.scheduler=async_threaded
run_ours naive --set parallel.scheduler=naive
LD_PRELOAD=$SHIM USE_ORION_SCHEDULER=1 ORION_POLICY=orion run_ours async_shim \
  --set parallel.scheduler=async_threaded --set parallel.use_orion_scheduler=true
timeout 150 "$PYTHON" scripts/peers/bench_eager.py --config "$config" --device cuda \
  --steps $((steps - warmup)) --warmup "$warmup" --output "$dir/eager.json" \
  >"$OUTDIR/logs/trainer_eager.log" 2>&1 || { echo "bench_eager.py failed: logs/trainer_eager.log"; failed=1; }
# Evidence that the shim was on in the shim run: its start-up/exit log lines name the library.
if grep -q "libgpu_scheduler" "$OUTDIR/logs/trainer_async_shim.log" 2>/dev/null; then
  record "d: shim active in the shim run" INFO "yes (libgpu_scheduler lines in logs/trainer_async_shim.log)"
else
  record "d: shim active in the shim run" INFO "unknown: no libgpu_scheduler line in logs/trainer_async_shim.log"
fi
if [ -f "$dir/async/timeline.json" ]; then
  "$PYTHON" scripts/plot_timeline.py "$dir/async/timeline.json" -o "$OUTDIR/timeline_async_gpu.png" \
    --title "gpipe_runner gpt_350m_gpu, async_threaded" >/dev/null 2>&1 || echo "warning: plotting the timeline failed (a picture only, not a check)"
fi
rows=$("$PYTHON" scripts/gpu/trainer_summary.py "$dir" --warmup "$warmup"); rc=$?
printf '%s\n' "$rows" >>"$OUTDIR/results.md"
printf '%s\n' "$rows"
if [ $rc -ne 0 ] || [ $failed -ne 0 ]; then
  record "d: trainer" FAIL "a run failed or a loss is not finite (rows above; logs/trainer_*.log)"
  exit 1
fi
record "d: trainer" PASS "4 runs completed, losses finite; numbers in the rows above"

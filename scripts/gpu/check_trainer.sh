#!/usr/bin/env bash
# Check (d): first, tests/gpu/sdpa_threads.py (a thread's first attention call, per SDPA kernel);
# then gpipe_runner on configs/gpt_350m_gpu.yaml (bf16, seq 1024, 4 ranks on the one GPU):
# async_threaded vs naive executor, per-micro-batch streams vs one stream per rank, 1f1b vs zb_h1 (peak memory), shim off vs shim `priority` vs shim `orion` vs shim
# `partition` (best-effort forwards on half the SMs), and the PyTorch
# eager peer on the same GPT; tokens/s and MFU; and from each async run's Kineto trace, the share
# of GPU busy time in which forward and backward kernels of different streams ran at once.
# Usage: scripts/gpu/check_trainer.sh OUTDIR   (env: GPU_CHECK_TRAINER_STEPS, default 6, of which 2 warm-up)
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_trainer.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
config=$GPU_CONFIG
steps=${GPU_CHECK_TRAINER_STEPS:-6}
warmup=2
need_trainer "d: trainer" || exit 1
dir=$OUTDIR/trainer
mkdir -p "$dir"
failed=0
# First: what a thread's first attention call costs per SDPA kernel (cuDNN's attention graphs are
# cached per CPU thread), the suspect for the async executor's slow first actions on the H100.
if timeout -k 5 90 "$PYTHON" tests/gpu/sdpa_threads.py --output "$dir/sdpa_threads.json" \
    >"$OUTDIR/logs/sdpa_threads.log" 2>"$OUTDIR/logs/sdpa_threads.err"; then
  while IFS= read -r line; do
    record "d: SDPA first call per thread" INFO "$line"
  done <"$OUTDIR/logs/sdpa_threads.log"
else
  record "d: SDPA first call per thread" FAIL "tests/gpu/sdpa_threads.py failed (logs/sdpa_threads.err)"
  failed=1
fi
run_ours() {  # variant, then extra arguments
  local variant=$1 start=$SECONDS; shift
  # The last warm-up step is the profiled one: a profiled step is never a timed one.
  if gpu_runner "trainer_$variant" "$dir/$variant" "$steps" "$((warmup - 1))" "$@"; then
    # A row per run as it ends: the table at the end needs every run, and a check killed at its
    # limit must still say what it measured.
    record "d: run $variant" INFO "$((SECONDS - start)) s; $(json_get "$dir/$variant/summary.json" tokens_per_s) tokens/s, step $(json_get "$dir/$variant/summary.json" step_time_ms_mean) ms (mean of the unprofiled steps after the first), final loss $(json_get "$dir/$variant/summary.json" final_loss)"
  else
    record "d: run $variant" FAIL "gpipe_runner failed after $((SECONDS - start)) s (logs/trainer_$variant.log)"
    failed=1
  fi
}
run_ours async --set parallel.scheduler=async_threaded
run_ours naive --set parallel.scheduler=naive
run_ours async_rank_stream --set parallel.scheduler=async_threaded --set parallel.streams=per_rank
run_ours one_stage --set parallel.scheduler=async_threaded --set parallel.model_parallel_size=1
run_ours zb_h1 --set parallel.scheduler=async_threaded --set parallel.schedule=zb_h1
LD_PRELOAD=$SHIM USE_ORION_SCHEDULER=1 ORION_POLICY=orion run_ours async_shim \
  --set parallel.scheduler=async_threaded --set parallel.use_orion_scheduler=true
LD_PRELOAD=$SHIM USE_ORION_SCHEDULER=1 ORION_POLICY=priority run_ours async_shim_priority \
  --set parallel.scheduler=async_threaded --set parallel.use_orion_scheduler=true
LD_PRELOAD=$SHIM USE_ORION_SCHEDULER=1 ORION_POLICY=partition ORION_POLICY_PARAMS=be_sm_frac=0.5 \
  run_ours async_shim_partition --set parallel.scheduler=async_threaded --set parallel.use_orion_scheduler=true
timeout 150 "$PYTHON" scripts/peers/bench_eager.py --config "$config" --device cuda \
  --steps $((steps - warmup)) --warmup "$warmup" --output "$dir/eager.json" \
  >"$OUTDIR/logs/trainer_eager.log" 2>&1 || { echo "bench_eager.py failed: logs/trainer_eager.log"; failed=1; }
# Evidence that the shim was on in the shim run: its start-up/exit log lines name the library,
# and its exit line counts the ops classed by the runner's per-action thread class.
if grep -q "libgpu_scheduler" "$OUTDIR/logs/trainer_async_shim.log" 2>/dev/null; then
  record "d: shim active in the shim run" INFO "yes: $(grep -o '[0-9]* ops submitted.*' "$OUTDIR/logs/trainer_async_shim.log" | tail -n 1)"
else
  record "d: shim active in the shim run" INFO "unknown: no libgpu_scheduler line in logs/trainer_async_shim.log"
fi
if [ -f "$dir/async/timeline.json" ]; then
  "$PYTHON" scripts/plot_timeline.py "$dir/async/timeline.json" -o "$OUTDIR/timeline_async_gpu.png" \
    --title "gpipe_runner gpt_350m_gpu, async_threaded" >/dev/null 2>&1 || echo "warning: plotting the timeline failed (a picture only, not a check)"
fi
# Forward and backward kernels of different micro-batches at the same time, from the Kineto trace
# of the profiled step (training.profile_iteration) of each async run.
for variant in async async_rank_stream async_shim_priority async_shim async_shim_partition; do
  trace=$(ls "$dir/$variant"/profiler_async_threaded/rank0/*.pt.trace.json 2>/dev/null | head -n 1)
  if [ -z "$trace" ]; then
    record "d: F/B kernel overlap ($variant)" FAIL "no Kineto trace under $dir/$variant/profiler_async_threaded/rank0"
    failed=1
    continue
  fi
  if line=$("$PYTHON" scripts/gpu/kernel_overlap.py "$trace" --json "$dir/$variant/kernel_overlap.json" 2>&1); then
    record "d: F/B kernel overlap ($variant)" INFO "$line"
  else
    record "d: F/B kernel overlap ($variant)" FAIL "$line"
    failed=1
  fi
done
# Where each traced step's time went (GPU busy share, idle gaps and the CUDA call each thread was
# in, runtime calls, time outside CPU ops per thread): the traces stay here, the digests come back.
for variant in async naive async_rank_stream one_stage async_shim; do
  trace=$(ls "$dir/$variant"/profiler_*/rank0/*.pt.trace.json 2>/dev/null | head -n 1)
  [ -n "$trace" ] || continue
  "$PYTHON" scripts/gpu/trace_digest.py "$trace" --json "$dir/$variant/digest.json" \
    >"$OUTDIR/logs/digest_$variant.log" 2>&1 || echo "trace_digest.py failed for $variant (logs/digest_$variant.log)"
  record "d: where the time went ($variant)" INFO "$(head -n 1 "$OUTDIR/logs/digest_$variant.log") (logs/digest_$variant.log)"
done
report_runs "d: trainer" "$failed" "9 runs completed, losses finite; numbers in the rows above" \
  "logs/trainer_*.log" scripts/gpu/trainer_summary.py "$dir" --warmup "$warmup"

#!/usr/bin/env bash
# End-to-end checks of the gpipe_runner executable: exit codes and messages for bad input, the
# schedule grid, and a short real run that writes its outputs.
# Usage: runner_cli_test.sh /path/to/gpipe_runner /path/to/repo /path/to/python (with torch)
set -u
runner=$1; repo=$2; python=${3:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
failures=0
expect() {  # expect NAME WANT_RC PATTERN -- ARGS...
  local name=$1 want=$2 pattern=$3; shift 4
  "$runner" "$@" >"$tmp/out" 2>&1; local rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -qE -- "$pattern" "$tmp/out"; then
    echo "FAIL $name: rc=$rc (want $want), output did not match /$pattern/:"; sed 's/^/  | /' "$tmp/out" | tail -5
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}
cfg=$repo/configs/gpt_cpu_tiny.yaml
expect missing_config 2 "cannot read config file '/no/such.yaml'" -- --config /no/such.yaml
expect config_is_a_folder 2 "config file '$tmp' is a folder" -- --config "$tmp"
expect microbatches_divide 2 "does not divide dataset.batch_size" -- --config "$cfg" --set training.num_microbatches=3 --validate-only
expect stages_vs_layers 2 "every stage needs at least one transformer block" -- --config "$cfg" --stages 64 --validate-only
expect unknown_schedule 2 "parallel.schedule" -- --config "$cfg" --schedule nope --validate-only
expect unknown_flag 2 "--bogus" -- --bogus
expect nproc_zero 2 "--nproc-per-node: Value 0 not in range 1 to 2147483647" -- --config "$cfg" --nproc-per-node 0
expect link_gbps_zero 2 "'0' is not a number > 0" -- --config "$cfg" --plan --link-gbps 0
printf 'model:\n  hidden_size: [1\n' >"$tmp/bad.yaml"
expect bad_yaml 2 "bad.yaml:[0-9]+:[0-9]+" -- --config "$tmp/bad.yaml"
expect model_too_large 2 "the model cannot fit: model.num_layers=1000000000000" -- --config "$cfg" --steps 1 \
  --set model.num_layers=1000000000000 --output-dir "$tmp/run_huge"
: >"$tmp/empty.yaml"
expect empty_config 2 "empty.yaml' is empty" -- --config "$tmp/empty.yaml" --validate-only
# VPipe's partition file and the seed's list form: folded into an explicit partition.
printf '{"partition": [1, 3, 3, 1], "recompute_ratio": [0.5, 0, 0, 0]}\n' >"$tmp/partition.json"
expect partition_file 0 "partition_layers: \[1, 3, 3, 1\]" -- --config "$cfg" --print-config \
  --set parallel.partition_file="$tmp/partition.json"
grep -q "recompute_ratio: \[0.5, 0, 0, 0\]" "$tmp/out" \
  || { echo "FAIL partition_file: recompute_ratio not taken from the file"; failures=$((failures + 1)); }
expect partition_file_missing 2 "partition_file '/no/such.json'" -- --config "$cfg" --validate-only \
  --set parallel.partition_file=/no/such.json
expect partition_list 0 "partition_layers: \[2, 2, 2, 2\]" -- --config "$cfg" --print-config --set "parallel.partition=[2,2,2,2]"
expect unknown_model 2 "unknown model 'nope'" -- --config "$cfg" --set model.name=nope --steps 1 --output-dir "$tmp/run0"
expect print_schedule 0 "step +\| rank 0 +\| rank 1" -- --config "$cfg" --print-schedule
expect short_run 0 "Training summary" -- --config "$cfg" --steps 2 --output-dir "$tmp/run"
for f in summary.json metrics.jsonl timeline.json; do
  [ -s "$tmp/run/$f" ] || { echo "FAIL short_run: $f not written"; failures=$((failures + 1)); }
done
# BERT (models/bert) through the same runner: a masked-LM run on 4 stages, the tied embedding on
# stage 0 and the MLM head on stage 3; its first loss is about ln(258) (257 byte ids + [MASK]).
bert_cfg=$repo/configs/bert_4stage.yaml
expect bert_run 0 "Training summary" -- --config "$bert_cfg" --steps 3 --device cpu --output-dir "$tmp/run_bert"
awk -F'"loss":' 'NF > 1 {split($2, a, ","); n++; if (n == 1 && (a[1] < 5.0 || a[1] > 6.2)) bad = 1; if (a[1] != a[1] + 0) bad = 1}
                 END {exit bad || n != 3}' "$tmp/run_bert/metrics.jsonl" 2>/dev/null \
  || { echo "FAIL bert_run: metrics.jsonl lacks 3 steps starting near ln(258)"; failures=$((failures + 1)); }
expect bert_pre_norm 0 "Training summary" -- --config "$bert_cfg" --steps 1 --device cpu --set model.norm_position=pre \
  --output-dir "$tmp/run_bert_pre"
# model.attention: the run says which SDPA kernel ran; a CUDA-only kernel on CPU is refused by name.
expect attention_math 0 "attention math \(model.attention=math\)" -- --config "$cfg" --steps 1 \
  --set model.attention=math --output-dir "$tmp/run_math"
grep -q '"attention": *"math"' "$tmp/run_math/summary.json" \
  || { echo "FAIL attention_math: summary.json does not say attention math"; failures=$((failures + 1)); }
expect attention_cudnn_cpu 2 "model.attention=cudnn is a CUDA kernel" -- --config "$cfg" --steps 1 --device cpu \
  --set model.attention=cudnn --output-dir "$tmp/run_cudnn"
expect gpt_post_norm 2 "model.norm_position 'post'" -- --config "$cfg" --set model.norm_position=post --steps 1 \
  --output-dir "$tmp/run_gpt_post"
# --resume may train longer than the checkpoint's run: only --steps changed.
expect checkpointed_run 0 "Training summary" -- --config "$cfg" --steps 2 --output-dir "$tmp/run_ckpt" \
  --checkpoint-interval 1
expect resume_longer 0 "this run trains 4 steps in all" -- --config "$cfg" --steps 4 --output-dir "$tmp/run_ckpt" \
  --checkpoint-interval 1 --resume
# The resumed run keeps the metrics of the steps before its checkpoint in the same folder.
steps=$(grep -o '"step":[0-9]*' "$tmp/run_ckpt/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
[ "$steps" = "0 1 2 3 " ] || { echo "FAIL resume_metrics: metrics.jsonl steps '$steps', wanted '0 1 2 3 '"; failures=$((failures + 1)); }
# A fresh run with another configuration into that folder is refused before its first step: its
# step folders would replace the earlier run's, and pruning deleted its own as they came.
expect foreign_checkpoints 2 "holds [0-9]+ checkpoints? of another configuration" -- --config "$cfg" --steps 2 \
  --output-dir "$tmp/run_ckpt" --checkpoint-interval 1 --lr 0.001
[ -f "$tmp/run_ckpt/checkpoints/step_00000004/manifest.json" ] \
  || { echo "FAIL foreign_checkpoints: the earlier run's newest checkpoint is gone"; failures=$((failures + 1)); }
# ... and so is a fresh run of the same configuration: the earlier run's newer step folders would
# win every prune (its own were deleted as they came) and a later --resume would pick the earlier
# run's.
expect own_earlier_checkpoints 2 "holds [0-9]+ checkpoints? of this configuration from an earlier run" -- \
  --config "$cfg" --steps 2 --output-dir "$tmp/run_ckpt" --checkpoint-interval 1
# The run's last steps are checkpointed even between two intervals (max_steps 5, interval 3:
# step_3 and step_5), so a longer resume goes on from step 5 instead of repeating 3 and 4.
expect last_step_checkpoint 0 "saving the last step's checkpoint \(step 5" -- --config "$cfg" --steps 5 \
  --output-dir "$tmp/run_last" --checkpoint-interval 3
[ -f "$tmp/run_last/checkpoints/step_00000005/manifest.json" ] \
  || { echo "FAIL last_step_checkpoint: no step_00000005 checkpoint"; failures=$((failures + 1)); }
expect last_step_resume 0 "resumed from .*step_00000005: 5 steps done" -- --config "$cfg" --steps 6 \
  --output-dir "$tmp/run_last" --checkpoint-interval 3 --resume
# A checkpoint folder that cannot be written is named before the first step, not at the first save.
expect checkpoint_dir_unwritable 2 "training.checkpoint_dir: cannot write checkpoints to '/proc/nope'" -- --config "$cfg" \
  --steps 2 --checkpoint-interval 1 --checkpoint-dir /proc/nope --output-dir "$tmp/run_ckpt_bad"
grep -q '"step"' "$tmp/run_ckpt_bad/metrics.jsonl" 2>/dev/null \
  && { echo "FAIL checkpoint_dir_unwritable: a step ran before the refusal"; failures=$((failures + 1)); }
# ... but not with another learning rate, and the refusal names the field.
expect resume_other_lr 2 "training.learning_rate: 0.002 vs 0.005" -- --config "$cfg" --steps 5 \
  --output-dir "$tmp/run_ckpt" --lr 0.005 --resume
# Resuming a run that has nothing left to train keeps its summary (it was blanked to 0 steps).
cp "$tmp/run_ckpt/summary.json" "$tmp/summary_before.json"
expect resume_nothing_left 0 "nothing left to train after step 4" -- --config "$cfg" --steps 4 \
  --output-dir "$tmp/run_ckpt" --checkpoint-interval 1 --resume
cmp -s "$tmp/summary_before.json" "$tmp/run_ckpt/summary.json" \
  || { echo "FAIL resume_nothing_left: summary.json changed"; failures=$((failures + 1)); }
# The seed's dataset.num_workers loads but does nothing, and the run says so.
expect num_workers_said 0 "dataset.num_workers=2 changes nothing" -- --config "$cfg" --steps 1 \
  --output-dir "$tmp/run_workers" --set dataset.num_workers=2
# The process layout is not the trajectory: another priority, transport and placement resume.
expect resume_other_layout 0 "Training summary" -- --config "$cfg" --steps 5 --output-dir "$tmp/run_ckpt" \
  --checkpoint-interval 1 --resume --set parallel.priority=none --transport inprocess --placement "[0,0,0,0]"
# The same configuration on other data: the checkpoint names the data it was trained on.
mkdir -p "$tmp/corpus" && cp "$repo/README.md" "$tmp/corpus/"
expect data_checkpointed 0 "Training summary" -- --config "$cfg" --steps 2 --output-dir "$tmp/run_data" \
  --checkpoint-interval 1 --set dataset.name=text --set dataset.path="$tmp/corpus"
cp "$repo/docs/ARCHITECTURE.md" "$tmp/corpus/"
expect resume_other_data 2 "was trained on other data" -- --config "$cfg" --steps 4 --output-dir "$tmp/run_data" \
  --checkpoint-interval 1 --resume --set dataset.name=text --set dataset.path="$tmp/corpus"
# A checkpoint of a build that ordered epochs otherwise (no data_order: seed + epoch) resumes
# with a warning that the rest of its epoch is visited in another order.
latest=$(ls -d "$tmp"/run_data/checkpoints/step_* 2>/dev/null | tail -n 1)
if [ -n "$latest" ] && "${python:-python3}" - "$latest/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
assert m["data_order"], "a new checkpoint records its data order"
del m["data_order"]
json.dump(m, open(sys.argv[1], "w"))
PY
then
  rm -f "$tmp/corpus/ARCHITECTURE.md"
  expect resume_old_data_order 0 "ordered epochs otherwise \\(seed \\+ epoch\\)" -- --config "$cfg" --steps 3 \
    --output-dir "$tmp/run_data" --checkpoint-interval 1 --resume --set dataset.name=text --set dataset.path="$tmp/corpus"
else
  echo "FAIL resume_old_data_order: no checkpoint manifest with data_order under $tmp/run_data"; failures=$((failures + 1))
fi
# On CPU busy time and bubble are host-timed, and the summary says so (a GPU run says cuda_events).
grep -q '"bubble_clock": *"host"' "$tmp/run/summary.json" \
  || { echo "FAIL short_run: summary.json does not say bubble_clock host"; failures=$((failures + 1)); }
# parallel.use_orion_scheduler: the runner restarts itself with the scheduler library built beside
# it preloaded and USE_ORION_SCHEDULER=1, and the restarted run reports the library loaded.
shim=$(dirname "$runner")/../intercept/libgpu_scheduler.so
if [ -f "$shim" ]; then
  expect orion_restart 0 "restarting with LD_PRELOAD=[^ ]*libgpu_scheduler.so USE_ORION_SCHEDULER=1" -- \
    --config "$cfg" --steps 1 --device auto --set parallel.use_orion_scheduler=true --output-dir "$tmp/run_orion"
  grep -q "Orion scheduler library loaded: yes" "$tmp/out" \
    || { echo "FAIL orion_restart: the restarted run does not report the library loaded"; failures=$((failures + 1)); }
  grep -q '"orion_env": *"1"' "$tmp/run_orion/summary.json" \
    || { echo "FAIL orion_restart: summary.json lacks orion_env 1"; failures=$((failures + 1)); }
else
  echo "skip orion_restart: $shim is not built (it needs the CUDA toolkit)"
fi
# Schedules as torch's CSV, both ways: the printed 1F1B schedule, loaded back with
# --schedule-file, trains to the same losses as the generated one; a broken file is refused
# naming the cell.
"$runner" --config "$cfg" --print-schedule --format csv >"$tmp/1f1b.csv" 2>"$tmp/print.err" \
  || { echo "FAIL schedule_csv: --print-schedule --format csv failed: $(tail -n 2 "$tmp/print.err")"; failures=$((failures + 1)); }
expect schedule_file_run 0 "Training summary" -- --config "$cfg" --steps 2 --schedule-file "$tmp/1f1b.csv" --output-dir "$tmp/run_csv"
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl"; }
if [ "$(losses "$tmp/run")" != "$(losses "$tmp/run_csv")" ]; then
  echo "FAIL schedule_file_run: losses differ from the generated schedule's:"; paste <(losses "$tmp/run") <(losses "$tmp/run_csv") | sed 's/^/  | /'
  failures=$((failures + 1))
fi
# The summary names the file that ran, not the config's unused parallel.schedule.
grep -q "\"schedule\": \"file $tmp/1f1b.csv\"" "$tmp/run_csv/summary.json" \
  || { echo "FAIL schedule_file_run: summary.json does not name the schedule file"; failures=$((failures + 1)); }
sed '1s/^0F0/0Z0/' "$tmp/1f1b.csv" >"$tmp/bad.csv"
# With replicas, --print-schedule and --validate-only schedule one replica's share of the
# micro-batches, as the run does: its grid loads back for the same launch, and a whole step's
# (8) is refused naming the per-replica count.
dp=(--config "$cfg" --stages 2 --data-parallel-size 2)
expect dp_print_schedule 0 "2 rank\(s\) x 1 stage\(s\) per rank, 4 micro-batch\(es\)" -- "${dp[@]}" --print-schedule
"$runner" "${dp[@]}" --print-schedule --format csv_compute_only >"$tmp/dp.csv" 2>/dev/null
expect dp_schedule_file 0 "config ok" -- "${dp[@]}" --schedule-file "$tmp/dp.csv" --validate-only
"$runner" --config "$cfg" --stages 2 --print-schedule --format csv_compute_only >"$tmp/whole.csv" 2>/dev/null
expect dp_whole_step_file 2 "training.num_microbatches / parallel.data_parallel_size \(one replica's\) 4" -- \
  "${dp[@]}" --schedule-file "$tmp/whole.csv" --validate-only
expect schedule_file_bad_cell 2 "bad.csv.*0Z0" -- --config "$cfg" --steps 1 --schedule-file "$tmp/bad.csv" --output-dir "$tmp/run_bad"
# The same four schedules generated natively (parallel.schedule): the same losses as interleaved
# 1F1B's run of the same steps.
expect interleaved_native 0 "Training summary" -- --config "$cfg" --steps 2 --virtual-stages 2 \
  --schedule interleaved_1f1b --output-dir "$tmp/run_i1f1b_native"
for s in looped_bfs interleaved_zb zbv dualpipev; do
  expect "native_$s" 0 "Training summary" -- --config "$cfg" --steps 2 --virtual-stages 2 --schedule $s \
    --output-dir "$tmp/run_native_$s"
  paste -d' ' <(grep -o '"loss":[^,]*' "$tmp/run_i1f1b_native/metrics.jsonl") \
              <(grep -o '"loss":[^,]*' "$tmp/run_native_$s/metrics.jsonl") |
    awk '{split($1, a, ":"); split($2, b, ":"); d = a[2] - b[2]; if (d < 0) d = -d; if (NF != 2 || d > 1e-6 * a[2]) bad = 1}
         END {exit bad}' \
    || { echo "FAIL native_$s: losses differ from interleaved 1F1B's"; failures=$((failures + 1)); }
done
# Overlapped forward+backward pairs (parallel.overlap_f_b): printed as one grid cell, refused
# when misspelt, and trained to the same losses as without them (they change when the halves run,
# not what they compute): 1F1B with pairs against the plain 1F1B run above, and dualpipev without
# its own pairs against the native dualpipev run.
expect overlap_grid 0 "\(F[0-9]+;B[0-9]+\)" -- --config "$cfg" --overlap-f-b true --print-schedule
expect overlap_bad_value 2 "parallel.overlap_f_b" -- --config "$cfg" --overlap-f-b maybe --validate-only
expect overlap_run 0 "Training summary" -- --config "$cfg" --steps 2 --overlap-f-b true --output-dir "$tmp/run_overlap"
expect dualpipev_no_overlap 0 "Training summary" -- --config "$cfg" --steps 2 --virtual-stages 2 --schedule dualpipev \
  --overlap-f-b false --output-dir "$tmp/run_dualpipev_plain"
for pair in "run run_overlap" "run_native_dualpipev run_dualpipev_plain"; do
  set -- $pair
  paste -d' ' <(losses "$tmp/$1") <(losses "$tmp/$2") |
    awk '{split($1, a, ":"); split($2, b, ":"); d = a[2] - b[2]; if (d < 0) d = -d; if (NF != 2 || d > 1e-6 * a[2]) bad = 1}
         END {exit bad}' \
    || { echo "FAIL overlap: losses of $2 differ from $1's"; failures=$((failures + 1)); }
done
# torch's own LoopedBFS / InterleavedZeroBubble / ZBV / DualPipeV orders (4 ranks x 2 stages, V
# placement for the last two) run through gpipe_runner and give the generated interleaved 1F1B's
# losses (same model, same data: the order changes nothing but rounding).
if [ -n "$python" ] && "$python" -c "import torch" 2>/dev/null; then
  expect interleaved_run 0 "Training summary" -- --config "$cfg" --steps 2 --virtual-stages 2 \
    --schedule interleaved_1f1b --output-dir "$tmp/run_i1f1b"
  for s in looped_bfs interleaved_zb zbv dualpipev; do
    "$python" "$repo/tests/trainer/torch_schedule_to_csv.py" $s 4 8 "$tmp/torch_$s.csv" \
      || { echo "FAIL torch_$s: torch did not write its schedule"; failures=$((failures + 1)); continue; }
    expect "torch_$s" 0 "Training summary" -- --config "$cfg" --steps 2 --virtual-stages 2 \
      --schedule-file "$tmp/torch_$s.csv" --output-dir "$tmp/run_$s"
    "$python" - "$tmp/run_i1f1b/metrics.jsonl" "$tmp/run_$s/metrics.jsonl" <<'PY' \
      || { echo "FAIL torch_$s: losses differ from interleaved 1F1B's"; failures=$((failures + 1)); }
import json, math, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
sys.exit(0 if len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b)) else 1)
PY
  done
else
  # The build's Python (OURGPIPE_PYTHON) always has torch (scripts/install-deps.sh): its absence is
  # a broken install, not a reason to pass without these checks.
  echo "FAIL torch_schedules: no python with torch at '$python' (OURGPIPE_PYTHON; scripts/install-deps.sh installs it)"
  failures=$((failures + 1))
fi
ORION_SCHEDULER_LIB=/no/such.so expect orion_library_missing 2 "ORION_SCHEDULER_LIB=/no/such.so is not a file" -- \
  --config "$cfg" --steps 1 --device auto --set parallel.use_orion_scheduler=true --output-dir "$tmp/run_orion2"
# A SentencePiece model trained here, as README's workflow does (spm_train, Debian's sentencepiece
# package). Debian's libsentencepiece carries its own protobuf: with libprotobuf.so in the runner
# its symbols were preempted and every model load failed ("compiled against version 3.14.0").
if command -v spm_train >/dev/null; then
  spm_train --input="$repo/README.md" --model_prefix="$tmp/spm" --vocab_size=500 >"$tmp/spm.log" 2>&1 \
    || { echo "FAIL sentencepiece: spm_train failed:"; tail -3 "$tmp/spm.log"; failures=$((failures + 1)); }
  expect sentencepiece_run 0 "Training summary" -- --config "$cfg" --steps 1 --output-dir "$tmp/run_spm" \
    --set dataset.tokenizer=sentencepiece --set dataset.tokenizer_model="$tmp/spm.model"
else
  echo "FAIL sentencepiece: spm_train not found (Debian's sentencepiece package; scripts/install-deps.sh installs it)"
  failures=$((failures + 1))
fi
echo "runner_cli_test: $failures failure(s)"
[ "$failures" -eq 0 ]

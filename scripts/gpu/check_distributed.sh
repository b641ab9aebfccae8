#!/usr/bin/env bash
# Check (e): the pipeline across processes on the GPU machine.
#   e1  every stage in one process on cuda (the in-memory transport), fp32
#   e2  with >= 2 GPUs: 2 processes (--nproc-per-node 2) over the NCCL transport, same config:
#       losses equal e1's within 1e-4 relative (cuBLAS may pick other kernels per process)
#   e3  with 1 GPU (NCCL refuses two ranks of one communicator on one GPU): a one-rank NCCL
#       self-test through PyTorch (init, all-reduce, result checked)
#   e4  with 1 GPU: 2 processes over the NCCL transport on it are refused at start-up, every rank
#       naming the shared GPU and the fix (gpu_sharing.h), within 90 s, never NCCL's error later
# Usage: scripts/gpu/check_distributed.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: scripts/gpu/check_distributed.sh OUTDIR}
# shellcheck source=scripts/gpu/common.sh
source "$(dirname "$0")/common.sh"
cd "$GPU_ROOT" || exit 1
need "$RUNNER" "gpipe_runner" || { record "e: distributed" FAIL "missing $RUNNER"; exit 1; }
dir=$OUTDIR/distributed
mkdir -p "$dir"
common=(--config configs/gpt_cpu_tiny.yaml --device cuda --dtype fp32 --steps 5
        --set training.profile_iteration=-1 --set training.log_interval=1)
failed=0
timeout 120 "$RUNNER" "${common[@]}" --output-dir "$dir/one_process" >"$OUTDIR/logs/dist_one_process.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  record "e1: 4 ranks in one process on cuda" PASS "final loss $(json_get "$dir/one_process/summary.json" final_loss)"
else
  record "e1: 4 ranks in one process on cuda" FAIL "exit $rc (logs/dist_one_process.log)"; failed=1
fi
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  timeout 180 "$RUNNER" "${common[@]}" --output-dir "$dir/nccl2" --transport nccl --nproc-per-node 2 \
    --master-port 29611 >"$OUTDIR/logs/dist_nccl2.log" 2>&1
  rc=$?
  verdict=$("$PYTHON" - "$dir/one_process/metrics.jsonl" "$dir/nccl2/metrics.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
ok = len(a) == len(b) and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b))
print(("PASS" if ok else "FAIL") + f" losses one process {a} vs 2 processes over NCCL {b}")
PY
  ) || verdict="FAIL could not compare (logs/dist_nccl2.log)"
  [ $rc -eq 0 ] || verdict="FAIL exit $rc (logs/dist_nccl2.log)"
  record "e2: 2 processes over the NCCL transport" "${verdict%% *}" "${verdict#* }"
  [ "${verdict%% *}" = PASS ] || failed=1
else
  record "e2: 2 processes over the NCCL transport" INFO "not run: $gpus GPU (NCCL needs one GPU per rank)"
  out=$(timeout 120 "$PYTHON" - 2>&1 <<'PY'
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29612")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
t = torch.arange(4, device="cuda", dtype=torch.float32)
dist.all_reduce(t)
torch.cuda.synchronize()
assert t.tolist() == [0.0, 1.0, 2.0, 3.0], t
print("nccl", ".".join(map(str, torch.cuda.nccl.version())), "one-rank all-reduce ok")
dist.destroy_process_group()
PY
  )
  rc=$?
  echo "$out" >"$OUTDIR/logs/dist_nccl_self_test.log"
  if [ $rc -eq 0 ]; then record "e3: one-rank NCCL self-test" PASS "$(tail -n 1 <<<"$out")"
  else record "e3: one-rank NCCL self-test" FAIL "exit $rc (logs/dist_nccl_self_test.log)"; failed=1; fi
  log=$OUTDIR/logs/dist_shared_gpu_nccl.log
  timeout 90 "$RUNNER" "${common[@]}" --output-dir "$dir/shared_nccl" --transport nccl --nproc-per-node 2 \
    --master-port 29613 >"$log" 2>&1
  rc=$?
  named=$(grep -c "share GPU-.*NCCL cannot run two ranks of one communicator on one GPU" "$log")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$named" -ge 2 ]; then
    record "e4: 2 processes over NCCL on 1 GPU refused" PASS "exit $rc, both ranks named the shared GPU"
  else
    record "e4: 2 processes over NCCL on 1 GPU refused" FAIL "exit $rc, $named ranks named the shared GPU (logs/dist_shared_gpu_nccl.log)"
    failed=1
  fi
fi
exit $failed

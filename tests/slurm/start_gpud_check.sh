#!/usr/bin/env bash
# scripts/slurm/start_gpud.sh without Slurm (what each node's task does): with a stand-in
# nvidia-smi listing two GPUs it starts one orion-gpud per GPU, says ready once both answer
# `orion-gpud status`, and on SIGTERM stops them and removes its folder; a daemon that cannot
# start, and one whose socket never appears, each fail it with the reason within the bound.
# Usage: start_gpud_check.sh /path/to/orion-gpud /path/to/repo      Exit: 0 pass, 1 fail.
set -u
gpud=$(realpath "$1")
start=$(realpath "$2")/scripts/slurm/start_gpud.sh
tmp=$(mktemp -d /tmp/gpud-start-check.XXXXXX)
pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  [ ! -f "$tmp/out" ] || { echo "----- start_gpud.sh said:"; cat "$tmp/out"; }
  exit 1
}

mkdir "$tmp/bin"
fake_nvidia_smi() {  # the GPU UUIDs it lists, one per argument
  printf '#!/bin/sh\nprintf "%%s\\n" %s\n' "$*" >"$tmp/bin/nvidia-smi"
  chmod +x "$tmp/bin/nvidia-smi"
}
# start_gpud.sh in the background, its output in $tmp/out; ORION_GPUD_DIR is $tmp/run.
run_start() {  # [orion-gpud binary]
  PATH="$tmp/bin:$PATH" ORION_GPUD_BIN=${1:-$gpud} ORION_GPUD_DIR="$tmp/run" ORION_GPUD_WAIT_S=1 \
    "$start" >"$tmp/out" 2>&1 &
  pid=$!
}
# Waits up to 5 s for start_gpud.sh to exit: $status is its exit status, or "running".
finish() {
  status=running
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid"; status=$?; pid=""; return; }
    sleep 0.1
  done
}

fake_nvidia_smi GPU-check-0 GPU-check-1
run_start
for _ in $(seq 100); do grep -q "ready: 2 GPU(s) in $tmp/run" "$tmp/out" && break; sleep 0.1; done
grep -q "ready: 2 GPU(s) in $tmp/run" "$tmp/out" || fail "not ready within 10 s"
for g in GPU-check-0 GPU-check-1; do
  "$gpud" status --gpu "$g" --dir "$tmp/run" >"$tmp/status" 2>&1 || fail "orion-gpud status --gpu $g: $(cat "$tmp/status")"
  grep -q "\"gpu\": \"$g\"" "$tmp/status" || fail "status of $g: $(cat "$tmp/status")"
done
echo "ok   two daemons serve, one per GPU nvidia-smi lists"
daemons=$(pgrep -P "$pid" | tr '\n' ' ')
kill -TERM "$pid"
finish
[ "$status" = 0 ] || fail "start_gpud.sh did not exit 0 within 5 s of SIGTERM"
for d in $daemons; do ! kill -0 "$d" 2>/dev/null || fail "orion-gpud (pid $d) still runs after SIGTERM"; done
[ ! -e "$tmp/run" ] || fail "$tmp/run is still there"
echo "ok   SIGTERM stops them and removes the folder"

fake_nvidia_smi "GPU-check-0" "GPU/bad"
run_start
finish
[ "$status" = 1 ] || fail "a daemon that cannot start did not fail start_gpud.sh"
grep -q "orion-gpud for GPU GPU/bad exited" "$tmp/out" || fail "no reason given for GPU/bad"
echo "ok   a daemon that cannot start fails it by name"

printf '#!/bin/sh\nexec sleep 30\n' >"$tmp/bin/silent-gpud"
chmod +x "$tmp/bin/silent-gpud"
fake_nvidia_smi "GPU-check-0"
run_start "$tmp/bin/silent-gpud"
finish
[ "$status" = 1 ] || fail "a daemon without a socket did not fail start_gpud.sh within the bound"
grep -q "no socket $tmp/run/gpu-GPU-check-0.sock after 1 s" "$tmp/out" || fail "no reason given for the missing socket"
echo "ok   a socket that does not appear within ORION_GPUD_WAIT_S fails it"

fake_nvidia_smi ""
run_start
finish
[ "$status" = 1 ] || fail "no GPU listed did not fail start_gpud.sh"
grep -q "nvidia-smi lists no GPU" "$tmp/out" || fail "no reason given for no GPU"
echo "ok   no GPU listed is an error"
echo "start_gpud_check: pass"

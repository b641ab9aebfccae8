#!/usr/bin/env bash
# driver_model_check can fail: a probe whose stated answer is not the driver's is a DISAGREE that
# names the probe, the real answer and the fake's belief (exit 1); a file that misses a probe or
# lists an unknown one, a driver that cannot be opened, and --through-shim without the shim are
# refused with exit 2 and a message naming the problem.
# Usage: driver_model_check_test.sh PROGRAM FAKE_DRIVER MODEL_JSON
set -uo pipefail
program=$1 driver=$2 model=$3
j=--judge-undefined  # on the fake every probe is judged
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
# Probe counts from the model file, so that a new probe needs no edit here.
n=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["probes"]))' "$model")
ub=$(python3 -c 'import json, sys
print(sum(1 for p in json.load(open(sys.argv[1]))["probes"].values() if p.get("undefined_behaviour")))' "$model")
expect() {  # expect RC PATTERN ARGS...
  local want=$1 pattern=$2 out rc
  shift 2
  out=$("$program" "$@" 2>&1); rc=$?
  if [ $rc -ne "$want" ] || ! grep -q -- "$pattern" <<<"$out"; then
    echo "FAIL $*: exit $rc, wanted $want and '$pattern' in:"; tail -n 5 <<<"$out" | sed 's/^/  | /'
    failures=$((failures + 1))
  else
    echo "ok   exit $rc: $(grep -m1 -- "$pattern" <<<"$out")"
  fi
}
edit() {  # edit OUT PYTHON-STATEMENT: a copy of the model with the statement applied to `m`
  python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
exec(sys.argv[3])
json.dump(m, open(sys.argv[2], "w"))' "$model" "$1" "$2"
}
edit "$work/wrong.json" 'm["probes"]["stream.flags"]["expect"] = "default=1 non-blocking=1"'
expect 1 "DISAGREE  stream.flags: default=0 non-blocking=1" --driver "$driver" --expect "$work/wrong.json" $j
expect 1 "the fake's model: default=1 non-blocking=1" --driver "$driver" --expect "$work/wrong.json" --only stream.flags
expect 1 "$((n - 1)) of $n probes agree.*disagree: stream.flags" --driver "$driver" --expect "$work/wrong.json" $j
edit "$work/missing.json" 'del m["probes"]["stream.flags"]'
expect 2 "has no entry for the probe 'stream.flags'" --driver "$driver" --expect "$work/missing.json"
edit "$work/unknown.json" 'm["probes"]["stream.bogus"] = {"expect": "x", "why": "y"}'
expect 2 "lists 'stream.bogus', which this program does not have" --driver "$driver" --expect "$work/unknown.json"
edit "$work/nowhy.json" 'del m["probes"]["stream.flags"]["why"]'
expect 2 "'stream.flags' needs the strings 'expect' and 'why'" --driver "$driver" --expect "$work/nowhy.json"
printf '{"probes": ' >"$work/bad.json"
expect 2 "bad.json: " --driver "$driver" --expect "$work/bad.json"
expect 2 "cannot open /nonexistent/libcuda.so.1" --driver /nonexistent/libcuda.so.1 --expect "$model"
expect 2 "no probe 'bogus'" --driver "$driver" --expect "$model" --only bogus
expect 2 "give --expect" --driver "$driver"
expect 2 "is libgpu_scheduler.so in LD_PRELOAD" --driver "$driver" --expect "$model" --through-shim
expect 0 "$n of $n probes agree" --driver "$driver" --expect "$model" $j
# Without --judge-undefined (the real driver): probes on freed handles are recorded, not judged.
edit "$work/ub.json" 'm["probes"]["created.destroy_ends_streams"]["expect"] = "anything"'
expect 0 "$((n - ub)) of $((n - ub)) probes agree .*$ub more recorded, undefined behaviour" --driver "$driver" --expect "$work/ub.json"
expect 0 "recorded  created.destroy_ends_streams: stream query=CUDA_ERROR_INVALID_HANDLE" --driver "$driver" --expect "$work/ub.json"
expect 1 "DISAGREE  created.destroy_ends_streams" --driver "$driver" --expect "$work/ub.json" $j
edit "$work/badub.json" 'm["probes"]["stream.flags"]["undefined_behaviour"] = "yes"'
expect 2 "'stream.flags': 'undefined_behaviour' is true or false" --driver "$driver" --expect "$work/badub.json"
# A probe that crashes, hangs, or whose driver leaves a process holding the probe's pipe: an
# answer of its own, in bounded time, and nothing left running.
FAKE_CUDA_INIT_FAULT=crash expect 1 "DISAGREE  stream.flags: crashed: Segmentation fault" \
  --driver "$driver" --expect "$model" --only stream.flags --answers "$work/crash.json"
# A probe that could not ask keeps the fake's answer in --answers, its failure beside it.
if python3 -c 'import json, sys
f = json.load(open(sys.argv[1]))["probes"]["stream.flags"]
assert f["expect"] == "default=0 non-blocking=1" and f["no_answer"].startswith("crashed: "), f' "$work/crash.json"; then
  echo "ok   --answers keeps the fake's answer for a probe that crashed"
else
  echo "FAIL --answers after a crash"; failures=$((failures + 1))
fi
start=$SECONDS
FAKE_CUDA_INIT_FAULT=hang expect 1 "DISAGREE  stream.flags: no answer within 1 s (killed)" \
  --driver "$driver" --expect "$model" --only stream.flags --timeout-s 1
[ $((SECONDS - start)) -le 5 ] || { echo "FAIL a hanging probe took $((SECONDS - start)) s"; failures=$((failures + 1)); }
start=$SECONDS
FAKE_CUDA_INIT_FAULT=spawn FAKE_CUDA_INIT_FAULT_FILE="$work/spawned" expect 0 "agree     stream.flags: default=0" \
  --driver "$driver" --expect "$model" --only stream.flags --timeout-s 20
[ $((SECONDS - start)) -le 5 ] || { echo "FAIL the spawned process delayed the answer $((SECONDS - start)) s"; failures=$((failures + 1)); }
spawned=$(cat "$work/spawned" 2>/dev/null)
sleep 0.2
if [ -z "$spawned" ]; then
  echo "FAIL the spawn fault wrote no pid"; failures=$((failures + 1))
elif kill -0 "$spawned" 2>/dev/null && [ "$(ps -o stat= -p "$spawned" | cut -c1)" != Z ]; then
  echo "FAIL process $spawned, started by the probe's driver, outlived the probe"; failures=$((failures + 1))
else
  echo "ok   the process the probe's driver started ($spawned) was killed with the probe"
fi
# --answers: the driver's answers in the file's form, the fake's kept beside a disagreeing one.
expect 1 "$((n - 1)) of $n probes agree" --driver "$driver" --expect "$work/wrong.json" $j --answers "$work/answers.json"
if python3 -c 'import json, sys
a = json.load(open(sys.argv[1]))["probes"]
f = a["stream.flags"]
assert f["expect"] == "default=0 non-blocking=1" and f["fake_answer"] == "default=1 non-blocking=1", f
assert f["why"].startswith("measured: ") and f["fake_why"].startswith("cuda.h"), f
assert "fake_answer" not in a["event.never_recorded"] and len(a) == int(sys.argv[2]), a' "$work/answers.json" "$n"; then
  echo "ok   --answers holds every probe, the disagreeing one with its fake_answer"
else
  echo "FAIL --answers"; failures=$((failures + 1))
fi
expect 2 "cannot write /nonexistent/answers.json" --driver "$driver" --expect "$model" --only stream.flags \
  --answers /nonexistent/answers.json
exit $((failures > 0))

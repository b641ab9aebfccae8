#!/usr/bin/env bash
# driver_model_check can fail: a probe whose stated answer is not the driver's is a DISAGREE that
# names the probe, the real answer and the fake's belief (exit 1); a file that misses a probe or
# lists an unknown one, a driver that cannot be opened, and --through-shim without the shim are
# refused with exit 2 and a message naming the problem.
# Usage: driver_model_check_test.sh PROGRAM FAKE_DRIVER MODEL_JSON
set -uo pipefail
program=$1 driver=$2 model=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
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
expect 1 "DISAGREE  stream.flags: default=0 non-blocking=1" --driver "$driver" --expect "$work/wrong.json"
expect 1 "the fake's model: default=1 non-blocking=1" --driver "$driver" --expect "$work/wrong.json" --only stream.flags
expect 1 "19 of 20 probes agree.*disagree: stream.flags" --driver "$driver" --expect "$work/wrong.json"
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
expect 0 "20 of 20 probes agree" --driver "$driver" --expect "$model"
# --answers: the driver's answers in the file's form, the fake's kept beside a disagreeing one.
expect 1 "19 of 20 probes agree" --driver "$driver" --expect "$work/wrong.json" --answers "$work/answers.json"
if python3 -c 'import json, sys
a = json.load(open(sys.argv[1]))["probes"]
assert a["stream.flags"] == {"expect": "default=0 non-blocking=1", "why": a["stream.flags"]["why"],
                             "fake_answer": "default=1 non-blocking=1"}, a["stream.flags"]
assert "fake_answer" not in a["event.never_recorded"] and len(a) == 20, a' "$work/answers.json"; then
  echo "ok   --answers holds every probe, the disagreeing one with its fake_answer"
else
  echo "FAIL --answers"; failures=$((failures + 1))
fi
expect 2 "cannot write /nonexistent/answers.json" --driver "$driver" --expect "$model" --only stream.flags \
  --answers /nonexistent/answers.json
exit $((failures > 0))

#!/usr/bin/env bash
# scripts/bench_ab.sh end to end with one gpipe_runner as both builds: both sides run, the summary
# names each build's per-round medians and the B / A ratio; a missing runner and too few steps
# are refused with exit 2 and a message naming the problem; a run that stops short is an error.
# Usage: bench_ab_test.sh GPIPE_RUNNER PROJECT_ROOT
set -uo pipefail
runner=$1 root=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
out=$(STEPS=3 WARMUP=1 ROUNDS=2 BENCH_OUT=$tmp/runs "$root/scripts/bench_ab.sh" "$runner" "$runner" \
      "$root/configs/gpt_cpu_tiny.yaml" --set model.num_layers=4 2>&1) || fail "bench_ab.sh exited $?: $out"
echo "$out"
echo "$out" | grep -Eq '^a: .*step ms per round [0-9.]+, [0-9.]+; median [0-9.]+$' || fail "no per-round line for a"
echo "$out" | grep -Eq '^b: .*step ms per round [0-9.]+, [0-9.]+; median [0-9.]+$' || fail "no per-round line for b"
echo "$out" | grep -Eq '^B / A step time: [0-9]+\.[0-9]{3}$' || fail "no ratio line"
for f in a_1 a_2 b_1 b_2; do
  [ "$(wc -l <"$tmp/runs/$f/metrics.jsonl")" = 3 ] || fail "$f ran $(wc -l <"$tmp/runs/$f/metrics.jsonl") steps, not 3"
done
msg=$("$root/scripts/bench_ab.sh" "$tmp/missing" "$runner" 2>&1); rc=$?
[ $rc = 2 ] && echo "$msg" | grep -q "is not an executable gpipe_runner" || fail "a missing runner: rc $rc, '$msg'"
msg=$(STEPS=2 WARMUP=2 "$root/scripts/bench_ab.sh" "$runner" "$runner" 2>&1); rc=$?
[ $rc = 2 ] && echo "$msg" | grep -q "must exceed WARMUP" || fail "STEPS <= WARMUP: rc $rc, '$msg'"
# A stand-in runner that stops after 2 steps, whatever --steps says.
cat >"$tmp/short_runner" <<'SH'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --output-dir ] && dir=$2; shift; done
mkdir -p "$dir" && printf '{"step_time_ms": 1.0}\n{"step_time_ms": 1.0}\n' >"$dir/metrics.jsonl"
SH
chmod +x "$tmp/short_runner"
msg=$(STEPS=3 WARMUP=1 ROUNDS=1 "$root/scripts/bench_ab.sh" "$runner" "$tmp/short_runner" 2>&1); rc=$?
[ $rc != 0 ] && echo "$msg" | grep -q "b ran 2 steps in round 1, not STEPS=3" || fail "a run cut short: rc $rc, '$msg'"
echo PASS

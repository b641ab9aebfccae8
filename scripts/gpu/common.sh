# shellcheck shell=bash disable=SC2034
# Sourced by scripts/gpu_check.sh and the check scripts in scripts/gpu/. Needs OUTDIR set: the
# work folder (gpu_check.sh's, not the folder that comes back from the GPU machine; gpu_check.sh
# publishes results.md and logs.tar.gz from it after every step).
# Every check writes its log under $OUTDIR/logs/ and one row to $OUTDIR/results.md.

GPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_DIR=${GPU_CHECK_BUILD_DIR:-$GPU_ROOT/build-gpu}
DEPS_PREFIX=$GPU_ROOT/.deps/prefix/usr
PYTHON=${GPU_CHECK_PYTHON:-python3}
SHIM=$BUILD_DIR/intercept/libgpu_scheduler.so
RUNNER=$BUILD_DIR/trainer/gpipe_runner
# What the GPU build makes: the programs the checks run and the executables of the tests labelled
# `gpu` (scripts/gpu/ctest.sh). The archive for later calls holds the programs only (ctest runs in
# call 1), found by name under the build folder.
GPU_BUILD_TARGETS="gpipe_runner gpu_scheduler gpu_hp_be_kernels gpu_driver_rules proc_address_check driver_model_check orion-replay-gpu orion-gpud engine_tests replay_gpu_gpu_tests"
GPU_PACKED_FILES="gpipe_runner libgpu_scheduler.so gpu_hp_be_kernels gpu_driver_rules proc_address_check driver_model_check orion-replay-gpu orion-gpud"
# Every call on the GPU machine starts bare: the staged Debian packages (.deps/debs, carried) are
# unpacked here, by whichever script runs first, not only by the build step (a carried .deps
# replaces the machine's copy, so an earlier call's .deps/prefix is gone).
# The prefix is trusted only with its stamp, which lists the checksums of the .debs it was unpacked
# from: a carried .deps/prefix unpacked before a package was added to (or changed in)
# stage-debs.sh is unpacked again. Checksums, not times: the copy to the GPU machine need not keep
# modification times.
staged_debs_digest() { (cd "$GPU_ROOT/.deps/debs" && sha256sum -- *.deb 2>/dev/null); }
ensure_deps() {
  local stamp="$GPU_ROOT/.deps/prefix/.unpacked" f digest
  digest=$(staged_debs_digest)
  if [ -f "$stamp" ] && { [ -z "$digest" ] || [ "$(cat "$stamp")" = "$digest" ]; }; then
    return 0
  fi
  [ -n "$digest" ] || { [ -d "$DEPS_PREFIX" ]; return; }
  rm -rf "$GPU_ROOT/.deps/prefix"
  for f in "$GPU_ROOT"/.deps/debs/*.deb; do
    dpkg -x "$f" "$GPU_ROOT/.deps/prefix" || { rm -rf "$GPU_ROOT/.deps/prefix"; return 1; }
  done
  printf '%s\n' "$digest" >"$stamp"
}
ensure_deps || true  # the build step names what is missing; the other checks need only the libraries
export LD_LIBRARY_PATH="$DEPS_PREFIX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
mkdir -p "$OUTDIR/logs"

# record CHECK STATUS DETAIL: STATUS is PASS, FAIL or INFO (a measurement without a verdict).
record() {
  printf '| %s | %s | %s |\n' "$1" "$2" "$3" >>"$OUTDIR/results.md"
  echo "[gpu_check] $1: $2 $3"
}

# need FILE WHAT: fails the calling check, naming what is missing and who provides it.
need() {
  if [ ! -e "$1" ]; then
    echo "missing: $1 ($2)" >&2
    return 1
  fi
}

# The trainer checks (d, g) run gpipe_runner on this config: 4 ranks on the one GPU, bf16.
GPU_CONFIG=configs/gpt_350m_gpu.yaml

# need_trainer CHECK: the runner, the GPU config and the shim are there, or CHECK gets a FAIL row.
need_trainer() {
  local f
  for f in "$RUNNER" "$GPU_ROOT/$GPU_CONFIG" "$SHIM"; do
    need "$f" "gpipe_runner, the GPU config and the shim" || { record "$1" FAIL "missing $f"; return 1; }
  done
}

# gpu_runner LOG DIR STEPS PROFILED_STEP [ARGS...]: gpipe_runner on GPU_CONFIG on cuda for STEPS
# steps, the Kineto trace of PROFILED_STEP kept, output in DIR, log in OUTDIR/logs/LOG.log, at
# most GPU_RUNNER_TIMEOUT (150) seconds.
gpu_runner() {
  local log=$1 out=$2 steps=$3 profiled=$4
  shift 4
  timeout "${GPU_RUNNER_TIMEOUT:-150}" "$RUNNER" --config "$GPU_ROOT/$GPU_CONFIG" --output-dir "$out" \
    --set "training.max_steps=$steps" --set training.exit_after_profile=false \
    --set "training.profile_iteration=$profiled" --set parallel.device=cuda "$@" >"$OUTDIR/logs/$log.log" 2>&1
}

# report_runs CHECK FAILED PASS_DETAIL LOGS SUMMARY_SCRIPT [ARGS...]: the summary script's rows go to
# results.md; CHECK fails if a run failed (FAILED non-zero) or the summary exits non-zero.
report_runs() {
  local check=$1 failed=$2 pass_detail=$3 logs=$4 rows rc
  shift 4
  rows=$("$PYTHON" "$@"); rc=$?
  printf '%s\n' "$rows" | tee -a "$OUTDIR/results.md"
  if [ $rc -ne 0 ] || [ "$failed" -ne 0 ]; then
    record "$check" FAIL "a run failed or a loss is not finite (rows above; $logs)"
    return 1
  fi
  record "$check" PASS "$pass_detail"
}

# json_get FILE KEY: one top-level key of a JSON object file (empty if absent).
json_get() {
  "$PYTHON" -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print("" if v is None else v)' "$1" "$2"
}

# The GPU machine's python may lack PyYAML (the peers read the YAML configs with it): use the
# staged Debian python3-yaml (stage-debs.sh python3-yaml); its C extension is for another Python
# version, so PyYAML falls back to its pure-Python parser.
if ! "$PYTHON" -c 'import yaml' 2>/dev/null && [ -d "$DEPS_PREFIX/lib/python3/dist-packages/yaml" ]; then
  export PYTHONPATH="$DEPS_PREFIX/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
fi

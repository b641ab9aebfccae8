# shellcheck shell=bash disable=SC2034
# Sourced by scripts/gpu_check.sh and the check scripts in scripts/gpu/. Needs OUTDIR set.
# Every check writes its log under $OUTDIR/logs/ and one row to $OUTDIR/results.md.

GPU_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_DIR=${GPU_CHECK_BUILD_DIR:-$GPU_ROOT/build-gpu}
DEPS_PREFIX=$GPU_ROOT/.deps/prefix/usr
PYTHON=${GPU_CHECK_PYTHON:-python3}
SHIM=$BUILD_DIR/intercept/libgpu_scheduler.so
RUNNER=$BUILD_DIR/trainer/gpipe_runner
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

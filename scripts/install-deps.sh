#!/usr/bin/env bash
# Install what the build needs, idempotently: Debian packages (apt-get update only when one is
# missing) and LibTorch as shipped in the PyTorch 2.11.0 wheel from PyPI, in a git-ignored
# virtual environment (.venv, or $OURGPIPE_VENV), with TensorBoard (the runs' scalars and traces). The CUDA toolkit is used where it is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
TORCH_VERSION=2.11.0
venv=${OURGPIPE_VENV:-$root/.venv}

debs=(cmake ninja-build g++ pkg-config python3-venv zlib1g-dev
      libspdlog-dev libfmt-dev libtbb-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
      libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev sentencepiece
      libprotobuf-dev protobuf-compiler libboost-dev
      libgl-dev libegl-dev libvdpau-dev)  # headers only: the shim wraps the driver's GL/EGL/VDPAU interop functions
# Slurm and munge for tests/slurm/local_slurm_check.sh (a one-machine cluster; it needs root).
if [ "${OURGPIPE_WITH_SLURM:-0}" = "1" ] || { [ -n "${CI:-}" ] && [ "$(id -u)" -eq 0 ]; }; then
  debs+=(slurm-wlm munge)
fi
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install-deps] installing Debian packages: ${missing[*]}"
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "${OURGPIPE_NO_TORCH:-0}" != "1" ]; then
  if ! "$venv/bin/python" -c "import torch,sys,yaml,matplotlib,tensorboard,torch_tb_profiler; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
    # The CUDA wheel and its nvidia-* libraries take about 5 GiB installed, and pip holds the
    # downloaded wheels (about 3 GiB) in a temp folder while it installs: check the room first (only
    # when torch itself is to be installed), so a full disk is named here rather than as pip's
    # OSError halfway through. No pip cache: it would keep a third copy.
    if ! "$venv/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
      mkdir -p "$(dirname "$venv")"
      tmp=${TMPDIR:-/tmp}
      free_kib() { df -Pk "$1" 2>/dev/null | awk 'NR==2 {print $4}' || true; }
      need() {  # folder, GiB: fails naming the folder when it has less
        local free; free=$(free_kib "$1")
        if [ -n "$free" ] && [ "$free" -lt $(($2 * 1024 * 1024)) ]; then
          echo "[install-deps] error: $1 has $((free / 1024)) MiB free; installing PyTorch $TORCH_VERSION needs about $2 GiB there." >&2
          echo "[install-deps] Free some space (old build folders, clones, ~/.cache/pip), or point OURGPIPE_VENV / TMPDIR at a larger disk, and rerun." >&2
          exit 1
        fi
      }
      if [ ! -d "$tmp" ] || [ "$(stat -c %d "$tmp")" = "$(stat -c %d "$(dirname "$venv")")" ]; then
        need "$(dirname "$venv")" 9   # one disk holds both (or pip picks another temp folder)
      else
        need "$(dirname "$venv")" 6
        need "$tmp" 4
      fi
    fi
    echo "[install-deps] installing PyTorch $TORCH_VERSION (LibTorch inside the wheel) into $venv"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "torch==$TORCH_VERSION" numpy pyyaml matplotlib tensorboard torch-tb-profiler
  fi
fi
echo "[install-deps] ok"

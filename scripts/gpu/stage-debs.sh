#!/usr/bin/env bash
# Stages, as Debian packages in .deps/debs/ (git-ignored), everything the GPU build takes that the
# GPU image lacks (it has CUDA, cmake, ninja, python with PyTorch; no apt, no network): the C++
# libraries, Gloo's headers (c10d's ProcessGroupGloo), zlib's headers, the GL, EGL and VDPAU headers
# (the shim wraps the driver's interop functions; headers only, nothing links them), pkg-config,
# PyYAML for the Python peers. scripts/gpu/build.sh checks each of these up front and names what is missing.
# TensorBoard's protobuf and Boost are left out on purpose: the GPU runner writes metrics.jsonl
# and says it writes no TensorBoard scalars. Extra package names may be given as arguments.
# Run on the development machine, in any folder of the project; then carry .deps to the GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
if [ -d .git ]; then
  grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >> .git/info/exclude
fi
pkgs=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
      libtbb-dev libtbb12 libtbbbind-2-5 libtbbmalloc2 libhwloc15
      libyaml-cpp-dev libyaml-cpp0.7 libcli11-dev nlohmann-json3-dev
      libgtest-dev libgmock-dev googletest
      libsentencepiece-dev libsentencepiece0
      libgloo-dev libgloo0 zlib1g-dev pkgconf pkgconf-bin libpkgconf3
      libgl-dev libegl-dev libvdpau-dev
      python3-yaml libyaml-0-2 "$@")
mkdir -p .deps/debs
cd .deps/debs
[ -n "$(find /var/lib/apt/lists -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update >/dev/null
apt-get download "${pkgs[@]}" 2>&1 | grep -v -e '^W: Download is performed unsandboxed' -e '^Get:' || true
missing=()
for p in "${pkgs[@]}"; do ls "${p}"_*.deb >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "stage-debs: could not download: ${missing[*]}" >&2
  exit 1
fi
echo "staged $(ls ./*.deb | wc -l) packages ($(du -sh . | cut -f1)) in .deps/debs"

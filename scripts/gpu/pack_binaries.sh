#!/usr/bin/env bash
# Packs the GPU build's programs (NAME..., found by name under BUILD) stripped, with their
# paths relative to BUILD, into ARCHIVE (tar.gz), which must stay under 16 MiB (the most a file
# that comes back from the GPU machine may be). Prints one line: what it packed and its size.
# A later call unpacks it into its own build folder (scripts/gpu/build.sh).
# Usage: scripts/gpu/pack_binaries.sh BUILD ARCHIVE NAME...   (build.sh passes GPU_PACKED_FILES)
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: pack_binaries.sh BUILD ARCHIVE NAME..." >&2; exit 2; }
build=$1
archive=$2
shift 2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
n=0
missing=()
for name in "$@"; do
  file=$(cd "$build" && find . -name "$name" -type f ! -path '*/CMakeFiles/*' | head -n 1)
  if [ -z "$file" ]; then missing+=("$name"); continue; fi
  mkdir -p "$stage/$(dirname "$file")"
  strip --strip-unneeded -o "$stage/$file" "$build/$file" 2>/dev/null || cp -p "$build/$file" "$stage/$file"
  chmod --reference="$build/$file" "$stage/$file"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "pack_binaries: none of $* under $build" >&2; exit 1; }
tar -C "$stage" -czf "$archive.tmp" . || { rm -f "$archive.tmp"; exit 1; }
size=$(stat -c %s "$archive.tmp")
if [ "$size" -gt $((16 << 20)) ]; then
  rm -f "$archive.tmp"
  echo "pack_binaries: $((size >> 20)) MiB, over the 16 MiB a returned file may have" >&2
  exit 1
fi
mv "$archive.tmp" "$archive"
echo "gpu-bin.tar.gz: $n programs, $((size >> 10)) KiB${missing[*]:+ (not built: ${missing[*]})}"

#!/usr/bin/env python3
"""Checks a folder against what the GPU machine gives back of its output folder.

    check_outdir.py OUT [--only NAME ...]

The device tool returns at most 8 files, no more than two folders down, 16 MiB each and 64 MiB in
all, only plain files with plain names (no links, nothing else). A file breaking a rule does not
come back, and a command killed at its limit returns only what was already there. With --only,
every file must also be one of the names given (gpu_check.sh: results.md, logs.tar.gz,
gpu-bin.tar.gz). Prints each problem and exits 1, or prints a one-line summary and exits 0.
"""
import argparse
import os
import re
import sys

MAX_FILES = 8
MAX_DEPTH = 2          # folders between OUT and a file
MAX_FILE = 16 << 20
MAX_TOTAL = 64 << 20
PLAIN_NAME = re.compile(r"^[A-Za-z0-9._+-]+$")


def problems(out, only=None):
    found = []
    errors = []
    for dirpath, dirnames, filenames in os.walk(out, followlinks=False):
        rel_dir = os.path.relpath(dirpath, out)
        depth = 0 if rel_dir == "." else rel_dir.count(os.sep) + 1
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if not PLAIN_NAME.match(name):
                errors.append(f"{rel}: a name with odd characters does not come back")
            if os.path.islink(path):
                errors.append(f"{rel}: a link does not come back")
                continue
            if name in dirnames:
                continue
            if not os.path.isfile(path):
                errors.append(f"{rel}: not a plain file")
                continue
            if depth > MAX_DEPTH:
                errors.append(f"{rel}: {depth} folders down (at most {MAX_DEPTH} come back)")
            size = os.path.getsize(path)
            if size > MAX_FILE:
                errors.append(f"{rel}: {size / 2**20:.1f} MiB (at most 16 MiB a file)")
            if only is not None and rel not in only:
                errors.append(f"{rel}: not one of the files this folder may hold ({', '.join(sorted(only))})")
            found.append((rel, size))
    if len(found) > MAX_FILES:
        errors.append(f"{len(found)} files (at most {MAX_FILES} come back): {', '.join(r for r, _ in found)}")
    total = sum(size for _, size in found)
    if total > MAX_TOTAL:
        errors.append(f"{total / 2**20:.1f} MiB in all (at most 64 MiB come back)")
    return errors, found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--only", nargs="+", help="the only file names allowed")
    args = parser.parse_args()
    if not os.path.isdir(args.out):
        print(f"{args.out}: no such folder", file=sys.stderr)
        return 2
    errors, found = problems(args.out, set(args.only) if args.only else None)
    if errors:
        print("; ".join(errors))
        return 1
    total = sum(size for _, size in found)
    print(f"{len(found)} files, {total / 2**20:.2f} MiB: all come back")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Per-target compile times from ninja's own log (<build>/.ninja_log), and a before/after table.

    scripts/compile_times.py build                      # one build: seconds per target
    scripts/compile_times.py build-nopch build          # two builds: before, after, ratio

A target's time is the sum of its compile steps (each object file, and the precompiled header
for the target that builds it); links are listed apart. ninja logs each output's latest build
only once it finished, so run this after a build from scratch of the targets being compared
(a target rebuilt in part shows only the part). Times are wall seconds of each step, taken on
whatever machine built it, with `-j` jobs competing for its cores: compare builds made with the
same `-j` on the same machine.
"""
import argparse
import collections
import pathlib
import re
import sys

OBJECT = re.compile(r"CMakeFiles/(?P<target>[^/]+)\.dir/")


def read_log(build_dir):
    """output -> seconds of its latest build step, from ninja's log format v5 or later."""
    log = pathlib.Path(build_dir) / ".ninja_log"
    if not log.is_file():
        sys.exit(f"compile_times: no ninja log at {log}: build that folder first (scripts/build.sh)")
    latest = {}
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        start_ms, end_ms, output = int(fields[0]), int(fields[1]), fields[3]
        latest[output] = (end_ms - start_ms) / 1000.0
    return latest


def per_target(build_dir):
    """target -> (compile seconds, compile steps); links under 'link: <output>'."""
    totals = collections.defaultdict(lambda: [0.0, 0])
    for output, seconds in read_log(build_dir).items():
        match = OBJECT.search(output)
        if match and (output.endswith(".o") or output.endswith(".gch")):
            key = match.group("target")
        elif output.endswith((".a", ".so")) or "/" in output and "." not in output.rsplit("/", 1)[1]:
            key = "link: " + output
        else:
            continue  # generated sources, stamps, custom commands
        totals[key][0] += seconds
        totals[key][1] += 1
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="one build folder, or two: before and after")
    parser.add_argument("--links", action="store_true", help="list link steps too")
    args = parser.parse_args()
    if len(args.builds) > 2:
        parser.error("give one build folder, or two (before, after)")
    tables = [per_target(b) for b in args.builds]
    keys = set().union(*tables)
    if not args.links:
        keys = {k for k in keys if not k.startswith("link: ")}
    if len(tables) == 1:
        (t,) = tables
        print(f"{'target':40} {'units':>5} {'seconds':>9}")
        for key in sorted(keys, key=lambda k: -t[k][0]):
            print(f"{key:40} {t[key][1]:5d} {t[key][0]:9.1f}")
        print(f"{'total':40} {sum(t[k][1] for k in keys):5d} {sum(t[k][0] for k in keys):9.1f}")
        return
    before, after = tables
    # Only targets both builds made: a target one of them never built is not a saving.
    both = sorted((k for k in keys if k in before and k in after), key=lambda k: -before[k][0])
    print(f"{'target':40} {'units':>5} {'before s':>9} {'after s':>9} {'after/before':>12}")
    for key in both:
        b, a = before[key][0], after[key][0]
        print(f"{key:40} {after[key][1]:5d} {b:9.1f} {a:9.1f} {a / b if b else float('nan'):12.2f}")
    tb, ta = sum(before[k][0] for k in both), sum(after[k][0] for k in both)
    # The precompiled header itself is a cost only the after-build pays: count it.
    extra = sum(after[k][0] for k in keys if k in after and k not in before)
    print(f"{'total (targets in both)':40} {'':5} {tb:9.1f} {ta:9.1f} {ta / tb if tb else float('nan'):12.2f}")
    if extra:
        print(f"{'+ targets only the after-build has':40} {'':5} {'':9} {extra:9.1f}")
        print(f"{'total with them':40} {'':5} {tb:9.1f} {ta + extra:9.1f} {(ta + extra) / tb:12.2f}")


if __name__ == "__main__":
    main()

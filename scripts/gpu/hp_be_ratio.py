#!/usr/bin/env python3
"""HP latency with the shim vs without, from two gpu_hp_be_kernels logs.

gpu_hp_be_kernels (tests/intercept/gpu/hp_be_kernels.cu) prints
    orion_scheduler=<on|pass-through|not-loaded> hp_iterations=N be_kernels_per_hp=M
    hp_latency_us median=X p90=X p99=X max=X
    wall_ms=X results=<ok|WRONG> (K mismatches)
Prints "median ratio=<shim/no-shim> ..." and exits 1 when the shim made the HP median latency
worse than --max-ratio (Orion's point is to protect the HP client), 2 when a log does not say
what is expected (wrong mode, wrong results, no latency line).
"""
import argparse
import re
import sys

LATENCY = re.compile(r"hp_latency_us median=([\d.]+) p90=([\d.]+) p99=([\d.]+) max=([\d.]+)")
MODE = re.compile(r"orion_scheduler=(\S+)")
WALL = re.compile(r"wall_ms=([\d.]+) results=(\S+)")


def parse(path: str, expected_mode: str) -> dict:
    with open(path, errors="replace") as f:
        text = f.read()
    lat, mode, wall = LATENCY.search(text), MODE.search(text), WALL.search(text)
    if not (lat and mode and wall):
        raise ValueError(f"{path}: no hp_latency_us / orion_scheduler / wall_ms lines "
                         "(gpu_hp_be_kernels output changed?)")
    if mode.group(1) != expected_mode:
        raise ValueError(f"{path}: orion_scheduler={mode.group(1)}, expected {expected_mode}")
    if wall.group(2) != "ok":
        raise ValueError(f"{path}: results={wall.group(2)}")
    median, p90, p99, mx = map(float, lat.groups())
    return {"median": median, "p99": p99, "wall_ms": float(wall.group(1))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("no_shim_log")
    p.add_argument("shim_log")
    p.add_argument("--max-ratio", type=float, default=1.1)
    args = p.parse_args()
    try:
        base = parse(args.no_shim_log, "not-loaded")
        shim = parse(args.shim_log, "on")
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 2
    ratio = shim["median"] / base["median"]
    print(f"HP latency median ratio shim/no-shim={ratio:.3f} ({base['median']:g} -> {shim['median']:g} us; "
          f"p99 {base['p99']:g} -> {shim['p99']:g} us); wall {base['wall_ms']:g} -> {shim['wall_ms']:g} ms")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())

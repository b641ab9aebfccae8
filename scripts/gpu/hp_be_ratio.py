#!/usr/bin/env python3
"""HP latency with the shim vs without, from gpu_hp_be_kernels logs.

gpu_hp_be_kernels (tests/intercept/gpu/hp_be_kernels.cu) prints
    orion_scheduler=<on|pass-through|not-loaded> hp_iterations=N be_kernels_per_hp=M
    hp_latency_us median=X p90=X p99=X max=X
    wall_ms=X results=<ok|WRONG> (K mismatches)

    hp_be_ratio.py NO_SHIM_LOG SHIM_LOG                     one run each
    hp_be_ratio.py --no-shim N1 N2 N3 --shim S1 S2 S3 [--alone A1 A2 A3]

With several runs per side (the check alternates them), each side's figure is the median over its
runs of the per-run median (and p99): on the H100 the no-shim median moved from 23 to 46 us between
two runs minutes apart, so a single pair decides nothing. --alone logs (be_kernels_per_hp=0: the
HP client with no best-effort load) give the HP-alone reference and BE-free wall time.
Prints "HP latency median ratio shim/no-shim=<r> ..." and exits 1 when the shim made the HP median
latency worse than --max-ratio (Orion's point is to protect the HP client), 2 when a log does not
say what is expected (wrong mode, wrong results, no latency line).
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


def median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def combine(paths: list[str], expected_mode: str) -> dict:
    runs = [parse(p, expected_mode) for p in paths]
    return {"median": median([r["median"] for r in runs]), "p99": median([r["p99"] for r in runs]),
            "wall_ms": median([r["wall_ms"] for r in runs]), "runs": len(runs),
            "medians": [r["median"] for r in runs]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="*", help="NO_SHIM_LOG SHIM_LOG (one run each)")
    p.add_argument("--no-shim", nargs="+", default=[], help="runs without the shim")
    p.add_argument("--shim", nargs="+", default=[], help="runs with the shim")
    p.add_argument("--alone", nargs="+", default=[], help="runs of the HP client alone, no shim")
    p.add_argument("--shim-mode", default="on", help="what the shim runs must print as orion_scheduler=")
    p.add_argument("--max-ratio", type=float, default=1.1)
    args = p.parse_args()
    no_shim, shim = list(args.no_shim), list(args.shim)
    if args.logs:
        if len(args.logs) != 2 or no_shim or shim:
            p.error("give NO_SHIM_LOG SHIM_LOG, or --no-shim ... --shim ...")
        no_shim, shim = [args.logs[0]], [args.logs[1]]
    if not no_shim or not shim:
        p.error("need runs without and with the shim")
    try:
        base = combine(no_shim, "not-loaded")
        with_shim = combine(shim, args.shim_mode)
        alone = combine(args.alone, "not-loaded") if args.alone else None
    except (ValueError, OSError) as e:
        print(f"error: {e}")
        return 2
    ratio = with_shim["median"] / base["median"]
    runs = f"; medians of {base['runs']} runs each (no shim {'/'.join(f'{m:g}' for m in base['medians'])}, " \
           f"shim {'/'.join(f'{m:g}' for m in with_shim['medians'])})" if base["runs"] > 1 else ""
    ref = ""
    if alone:
        ref = (f"; HP alone median {alone['median']:g} us p99 {alone['p99']:g} us: shim/alone "
               f"{with_shim['median'] / alone['median']:.3f}, no-shim/alone {base['median'] / alone['median']:.3f}")
    print(f"HP latency median ratio shim/no-shim={ratio:.3f} ({base['median']:g} -> {with_shim['median']:g} us; "
          f"p99 {base['p99']:g} -> {with_shim['p99']:g} us); wall {base['wall_ms']:g} -> {with_shim['wall_ms']:g} ms"
          f"{ref}{runs}")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Check (g)'s table: gpipe_runner runs of one config under several schedules, with and without
overlapped pairs and the shim (scripts/gpu/check_schedules.sh).

Reads DIR/<variant>/metrics.jsonl (and kernel_overlap.json when the trace was measured), leaves
out --warmup steps, and prints one results.md row per run: mean step time, its ratio to the
first variant's (the reference of the same run), and the forward/backward kernel overlap share.
Exits 1 if a run is missing or a loss is not finite.
Usage: schedules_summary.py DIR [--warmup N] [--variants a,b,...]
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

# 1f1b and dualpipev with and without the shim; every other schedule without it, pairs off and on.
OTHER_SCHEDULES = ["gpipe", "interleaved_1f1b", "zb_h1", "looped_bfs", "interleaved_zb", "zbv"]
VARIANTS = ["1f1b", "1f1b_pairs", "1f1b_shim", "1f1b_pairs_shim",
            "dualpipev", "dualpipev_pairs", "dualpipev_shim", "dualpipev_pairs_shim"] + \
           [f"{s}{pairs}" for s in OTHER_SCHEDULES for pairs in ("", "_pairs")]


def run_row(folder: Path, warmup: int):
    its = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not its:
        raise ValueError(f"{folder}/metrics.jsonl has no step")
    if not all(math.isfinite(it["loss"]) for it in its):
        raise ValueError(f"{folder}: a loss is not finite")
    # A profiled step runs with the PyTorch profiler's overhead: never a timed one.
    timed = [it for it in its if it["step"] >= warmup and not it.get("profiled", False)] or its
    row = {"ms": statistics.mean(it["step_time_ms"] for it in timed), "steps": len(timed), "fb": None}
    overlap = folder / "kernel_overlap.json"
    if overlap.exists():
        row["fb"] = json.loads(overlap.read_text()).get("fb_overlap_share")
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    variants = args.variants.split(",")
    rows, ok = {}, True
    for name in variants:
        try:
            rows[name] = run_row(args.dir / name, args.warmup)
        except (OSError, ValueError, KeyError) as e:
            print(f"| g: {name} | FAIL | {e} |")
            ok = False
    base = rows.get(variants[0])
    for name in variants:
        if name not in rows:
            continue
        r = rows[name]
        ratio = f"{r['ms'] / base['ms']:.3f}" if base else "n/a"
        fb = "n/a (no trace)" if r["fb"] is None else f"{r['fb']:.3f}"
        print(f"| g: {name} | INFO | step {r['ms']:.1f} ms over {r['steps']} steps; / {variants[0]} {ratio}; "
              f"F/B kernel overlap share {fb} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One results.md detail line from an `orion-replay-gpu --simulate --json FILE` run.

Prints, per run (no-shim, then each policy): HP p99 / alone (and its execution part's p99 / alone:
from the request's first kernel starting on the GPU, so the difference is time spent queued, in
the shim or behind other work), BE throughput / alone, the host's issue lag p99 (how late the
replayer's launch calls returned: a shim that blocks the launching thread shows here), and the
relative error of the simulator's HP p99 and BE throughput for that run. Exits 2 when the
file lacks what the replayer writes (a run missing, a shim run not scheduling, ops not completed,
no prediction), 0 otherwise: the numbers are a measurement, not a verdict.
"""
import argparse
import json
import sys


def ratio(value, reference):
    return f"{value / reference:.2f}x" if reference else "n/a"


def summarise(data: dict, policies: list) -> str:
    runs = {r["label"]: r for r in data["runs"]}
    want = ["no-shim"] + policies
    missing = [p for p in want if p not in runs]
    if missing:
        raise ValueError(f"runs missing: {', '.join(missing)}")
    alone = data["alone"]["row"]
    parts = []
    for label in want:
        run = runs[label]
        if label != "no-shim" and not run["shim_active"]:
            raise ValueError(f"run {label}: the shim was not scheduling")
        together = run["together"]
        if together["ops_completed"] <= 0 or not together["requests"]:
            raise ValueError(f"run {label}: nothing completed")
        if "relative_error" not in run:
            raise ValueError(f"run {label}: no simulator prediction (--simulate)")
        row, err = run["row"], run["relative_error"]
        parts.append(f"{label} HP p99 {ratio(row['hp_p99_ms'], alone['hp_p99_ms'])} "
                     f"(exec {ratio(row['hp_exec_p99_ms'], alone['hp_exec_p99_ms'])}) BE "
                     f"{ratio(row['be_requests_per_s'], alone['be_requests_per_s'])} "
                     f"lag p99 {run['issue_lag_p99_us']:.0f} us "
                     f"(sim err p99 {err['hp_p99'] * 100:+.0f}%, BE {err['be_requests_per_s'] * 100:+.0f}%)")
    gpu = data["runs"][0]["gpu"]
    return f"{gpu['name']} {gpu['sm_count']} SMs: " + "; ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json_file")
    p.add_argument("--policies", default="passthrough,priority,orion,partition")
    args = p.parse_args()
    try:
        with open(args.json_file) as f:
            data = json.load(f)
        print(summarise(data, [x for x in args.policies.split(",") if x]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{args.json_file}: {e}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A best-effort GPU job for check (j): bf16 matmuls on a priority-0 stream (best effort under the
shim) for --seconds, or until --stop-file exists, kept --depth deep in flight. Prints one JSON
line: matmuls done per second, the completions per --bucket-s interval by Unix time (so that
check j can take the job's rate over the pipeline's timed steps alone), whether the shim was
loaded, and its orion_get_stats (how many launches it held back: the gating at work).

    python3 tests/gpu/be_matmul_job.py --seconds 20                       # unmanaged
    USE_ORION_SCHEDULER=1 ORION_POLICY=gpud ORION_POLICY_PARAMS=gpu=<uuid> \\
        LD_PRELOAD=build-gpu/intercept/libgpu_scheduler.so python3 tests/gpu/be_matmul_job.py --seconds 20
Exit status 2 without a GPU.
"""
import argparse
import json
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shim_counters  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--size", type=int, default=4096, help="square bf16 matmul size")
    p.add_argument("--depth", type=int, default=4, help="matmuls kept in flight")
    p.add_argument("--stop-file", help="stop as soon as this file exists (checked every 10 ms)")
    p.add_argument("--bucket-s", type=float, default=0.1, help="width of the completion-count intervals")
    args = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("error: torch sees no GPU (this job needs one)", file=sys.stderr)
        return 2
    stream = torch.cuda.Stream(priority=0)
    with torch.cuda.stream(stream):
        a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
    stream.synchronize()
    pending, done = deque(), 0
    start = time.perf_counter()
    start_unix = time.time()
    buckets: list[int] = []  # completions seen in [start_unix + i * bucket_s, ... + bucket_s)
    stop_file = Path(args.stop_file) if args.stop_file else None
    next_stop_look = start
    while time.perf_counter() - start < args.seconds:
        now = time.perf_counter()
        if stop_file is not None and now >= next_stop_look:
            if stop_file.exists():
                break
            next_stop_look = now + 0.01
        while pending and pending[0].query():
            pending.popleft()
            done += 1
            i = int((time.perf_counter() - start) / args.bucket_s)
            buckets.extend([0] * (i + 1 - len(buckets)))
            buckets[i] += 1
        while len(pending) < args.depth:
            with torch.cuda.stream(stream):
                torch.matmul(a, b, out=c)
                ev = torch.cuda.Event()
                ev.record(stream)
            pending.append(ev)
        time.sleep(0.0005)
    wall = time.perf_counter() - start
    # Intervals without a completion up to the end count too (a job held back at the end ran then).
    buckets.extend([0] * (int(wall / args.bucket_s) + 1 - len(buckets)))
    active = shim_counters.shim_is_loaded()
    print(json.dumps({"matmuls_per_s": done / wall, "matmuls": done, "wall_s": wall, "size": args.size,
                      "start_unix_s": start_unix, "bucket_s": args.bucket_s, "completions": buckets,
                      "shim_loaded": active, "shim_stats": shim_counters.shim_stats()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

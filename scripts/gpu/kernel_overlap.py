#!/usr/bin/env python3
"""How much forward and backward GPU work ran at the same time, from a PyTorch profiler (Kineto)
trace: the figure the product exists for (forward kernels of one micro-batch filling the gaps of
another's backward on the same GPU).

Each GPU kernel is attributed to the CPU thread and time of its launch (the runtime/driver launch
event with the same correlation id); it is backward work when an enclosing CPU op on that thread
is an autograd backward node ("autograd::engine::evaluate_function: ...", "...Backward..."),
forward work otherwise. A sweep over kernel start/end times then measures
  busy        time with at least one kernel running
  concurrent  time with kernels of two or more streams running at once
  f_b         time with a forward kernel and a backward kernel running at once on different
              streams (in gpipe_runner, different streams are different micro-batches)
and prints, on one line, the shares of busy time:
  kernels=N streams=S busy_ms=X concurrent_share=Y fb_overlap_share=Z
Usage: kernel_overlap.py TRACE.json [--json OUT.json]; exit 1 when the trace holds no kernel.
"""
import argparse
import bisect
import json
import sys
from collections import defaultdict

LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def is_backward_op(name):
    return name.startswith("autograd::engine::evaluate_function") or "Backward" in name


def backward_depth_lookup(ops):
    """For one thread's backward ops (start, end), a function t -> number of them enclosing t."""
    points = sorted([(s, 1) for s, _ in ops] + [(e, -1) for _, e in ops])
    times, depth, running = [], [], 0
    for t, d in points:
        running += d
        times.append(t)
        depth.append(running)
    def lookup(t):
        i = bisect.bisect_right(times, t) - 1
        return depth[i] if i >= 0 else 0
    return lookup


def analyse(trace):
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    backward_ops = defaultdict(list)
    launches = {}
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        args = e.get("args", {}) or {}
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat in ("cpu_op", "user_annotation") and is_backward_op(name):
            backward_ops[e.get("tid")].append((ts, ts + dur))
        elif cat in LAUNCH_CATS and "correlation" in args:
            launches[args["correlation"]] = (e.get("tid"), ts)
        elif cat == "kernel":
            kernels.append((ts, ts + dur, args.get("stream", -1), args.get("correlation")))
    lookups = {tid: backward_depth_lookup(ops) for tid, ops in backward_ops.items()}
    points = []
    for start, end, stream, corr in kernels:
        tid, launch_ts = launches.get(corr, (None, None))
        backward = tid in lookups and lookups[tid](launch_ts) > 0
        phase = "b" if backward else "f"
        points.append((start, 1, phase, stream))
        points.append((end, -1, phase, stream))
    points.sort(key=lambda p: (p[0], p[1]))  # ends before starts at the same time
    active = defaultdict(int)  # (phase, stream) -> running kernels
    busy = concurrent = fb = 0.0
    last = None
    for t, delta, phase, stream in points:
        if last is not None and t > last:
            span = t - last
            running = [k for k, n in active.items() if n > 0]
            streams = {s for _, s in running}
            if running:
                busy += span
            if len(streams) >= 2:
                concurrent += span
            f_streams = {s for p, s in running if p == "f"}
            b_streams = {s for p, s in running if p == "b"}
            if any(fs != bs for fs in f_streams for bs in b_streams):
                fb += span
        active[(phase, stream)] += delta
        last = t
    n_backward = sum(1 for p in points if p[1] == 1 and p[2] == "b")
    return {
        "kernels": len(kernels),
        "backward_kernels": n_backward,
        "streams": len({k[2] for k in kernels}),
        "busy_ms": busy / 1e3,
        "concurrent_share": concurrent / busy if busy else 0.0,
        "fb_overlap_share": fb / busy if busy else 0.0,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--json", help="also write the figures to this file")
    a = parser.parse_args()
    with open(a.trace) as f:
        result = analyse(json.load(f))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print("kernels={kernels} backward_kernels={backward_kernels} streams={streams} busy_ms={busy_ms:.3f} "
          "concurrent_share={concurrent_share:.3f} fb_overlap_share={fb_overlap_share:.3f}".format(**result))
    if result["kernels"] == 0:
        print("no GPU kernel in the trace (was it taken on a GPU, with CUDA activities?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

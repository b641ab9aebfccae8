#!/usr/bin/env python3
"""Where a profiled step's time went, from a PyTorch profiler (Kineto) trace, small enough to come
back from the GPU machine (the traces themselves are hundreds of MB and stay there).

On the H100 (2026-11-27) the async_threaded executor's step took 2.9x the naive one's while the GPU
was busy for about a fifth of it: the question is what the rank threads waited on. This prints
  gpu      busy time (union of kernels, copies, sets) against the span of GPU work, and the
           longest idle gaps with the CUDA runtime/driver call each CPU thread was in at the time
  runtime  per CUDA runtime/driver call name: count, total and longest duration (synchronizations,
           cudaMalloc/cudaFree, event waits and launch cost show here)
  threads  per CPU thread (named as the trace names it: gpipe_runner's rank threads are "rank<r>"):
           the span of its events, the share of it covered by its top-level CPU ops (the rest is time
           the thread was outside any op: waiting on a receive, a lock, a peer), and the CUDA calls it
           spent most time in
  ops      the top CPU ops by total time over all threads
as text and, with --json, as one JSON document.
Usage: trace_digest.py TRACE.json [--json OUT.json] [--top N]; exit 1 when the trace has no GPU work.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}


def union_ms(intervals):
    """Total length of the union of (start, end) intervals, in the trace's unit (us) / 1000."""
    total, end = 0.0, None
    start = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total / 1e3


def top_level(intervals):
    """The intervals not enclosed by another one of the same thread (ops nest)."""
    out, end = [], None
    for s, e in sorted(intervals, key=lambda x: (x[0], -x[1])):
        if end is None or s >= end:
            out.append((s, e))
            end = e
    return out


def digest(trace, top=12):
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    gpu, runtime, ops_by_thread = [], defaultdict(list), defaultdict(list)
    calls_by_thread = defaultdict(list)
    names = {e.get("tid"): e.get("args", {}).get("name") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}

    def label(tid):  # Kineto spells a name "thread 13566 (rank0)": keep "13566 (rank0)"
        name = names.get(tid)
        if not name:
            return str(tid)
        m = re.fullmatch(r"thread \S+ \((.*)\)", name)
        return f"{tid} ({m.group(1) if m else name})"

    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        if cat in GPU_CATS:
            gpu.append((ts, ts + dur))
        elif cat in LAUNCH_CATS:
            runtime[name].append(dur)
            calls_by_thread[e.get("tid")].append((ts, ts + dur, name))
        elif cat in ("cpu_op", "user_annotation"):
            ops_by_thread[e.get("tid")].append((ts, ts + dur, name))
    if not gpu:
        return None
    gpu.sort()
    span = (gpu[-1][1] if gpu else 0) - gpu[0][0]
    busy = union_ms(gpu)
    # Idle gaps between merged GPU intervals, longest first, with what each thread was calling.
    merged, gaps = [], []
    for s, e in gpu:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    for (_, a), (b, _) in zip(merged, merged[1:]):
        gaps.append((b - a, a, b))
    gaps.sort(reverse=True)
    gap_rows = []
    for length, a, b in gaps[:top]:
        during = {}
        for tid, calls in calls_by_thread.items():
            in_calls = sorted({n for s, e, n in calls if s < b and e > a and (min(e, b) - max(s, a)) > 0.5 * length})
            if in_calls:
                during[label(tid)] = in_calls
        gap_rows.append({"ms": length / 1e3, "at_ms": (a - gpu[0][0]) / 1e3, "threads_in": during})
    runtime_rows = sorted(({"name": n, "count": len(d), "total_ms": sum(d) / 1e3, "max_ms": max(d) / 1e3}
                           for n, d in runtime.items()), key=lambda r: -r["total_ms"])
    thread_rows = []
    op_totals = defaultdict(lambda: [0, 0.0])
    for tid, ops in ops_by_thread.items():
        intervals = [(s, e) for s, e, _ in ops]
        first, last = min(s for s, _ in intervals), max(e for _, e in intervals)
        covered = union_ms(top_level(intervals))
        call_ms = defaultdict(float)
        for s, e, name in calls_by_thread.get(tid, []):
            call_ms[name] += (e - s) / 1e3
        top_calls = sorted(call_ms.items(), key=lambda kv: -kv[1])[:3]
        thread_rows.append({"tid": label(tid), "ops": len(ops), "span_ms": (last - first) / 1e3,
                            "in_ops_share": covered / max(1e-9, (last - first) / 1e3),
                            "top_cuda_calls_ms": [[n, t] for n, t in top_calls]})
        for s, e, name in ops:
            op_totals[name][0] += 1
            op_totals[name][1] += (e - s) / 1e3
    thread_rows.sort(key=lambda r: -r["span_ms"])
    op_rows = sorted(({"name": n, "count": c, "total_ms": t} for n, (c, t) in op_totals.items()),
                     key=lambda r: -r["total_ms"])
    return {"gpu": {"events": len(gpu), "span_ms": span / 1e3, "busy_ms": busy,
                    "busy_share": busy / max(1e-9, span / 1e3), "longest_idle_gaps": gap_rows},
            "runtime": runtime_rows[:top], "threads": thread_rows, "ops": op_rows[:top]}


def render(d):
    g = d["gpu"]
    lines = [f"gpu: {g['events']} events over {g['span_ms']:.1f} ms, busy {g['busy_ms']:.1f} ms "
             f"({100 * g['busy_share']:.1f}%)"]
    for gap in g["longest_idle_gaps"]:
        who = "; ".join(f"tid {t}: {', '.join(n)}" for t, n in gap["threads_in"].items()) or "no thread in a CUDA call"
        lines.append(f"  idle {gap['ms']:.2f} ms at {gap['at_ms']:.1f} ms ({who})")
    lines.append("runtime (count, total ms, max ms):")
    lines += [f"  {r['name']}: {r['count']}, {r['total_ms']:.1f}, {r['max_ms']:.2f}" for r in d["runtime"]]
    lines.append("threads (span ms, share of it inside a CPU op; CUDA calls it spent most time in):")
    for r in d["threads"]:
        calls = ", ".join(f"{n} {t:.1f} ms" for n, t in r.get("top_cuda_calls_ms", []))
        lines.append(f"  tid {r['tid']}: {r['span_ms']:.1f}, {100 * r['in_ops_share']:.1f}% ({r['ops']} ops)"
                     + (f"; {calls}" if calls else ""))
    lines.append("CPU ops (count, total ms over all threads):")
    lines += [f"  {r['name']}: {r['count']}, {r['total_ms']:.1f}" for r in d["ops"]]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--json", help="also write the digest here")
    p.add_argument("--top", type=int, default=12, help="rows per table")
    args = p.parse_args()
    try:
        with open(args.trace) as f:
            trace = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read {args.trace}: {e}", file=sys.stderr)
        return 2
    d = digest(trace, args.top)
    if d is None:
        print(f"error: {args.trace} has no GPU kernel, copy or set", file=sys.stderr)
        return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(d, f, indent=1)
    print(render(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A torch.distributed NCCL all-reduce issued from a priority-0 stream while a high-priority
stream runs matmuls: under libgpu_scheduler.so it must not wait behind the scheduling policy.

Issue 11's check. `--world-size N` ranks (default 1), one process and one GPU each (rank r on
device r; N > 1 re-runs this program once per rank with RANK/WORLD_SIZE set, init over
tcp://127.0.0.1 on a free port; rank 0 writes the result). Streams: `torch.cuda.Stream(priority=-1)` (high priority under the shim:
ORION_HP_PRIORITY=-1) runs bf16 matmuls, kept `--hp-depth` deep in flight the whole time, and
`torch.cuda.Stream(priority=0)` (best effort under the shim) issues the all-reduces. For each
reduce op (`--ops`, default sum and avg) and each load (none, high-priority matmuls), after
`--warmup` untimed rounds, `--iterations` rounds of:

    fill the tensor with the round's value on the priority-0 stream, wait for it (untimed)
    t0; all_reduce(async_op=True) with the priority-0 stream current; poll work.is_completed()
    (a query of the collective's end event: the shim forces nothing out for a query, unlike a
    synchronisation) until it completes, topping up the matmuls; t1
    work.wait(), check the result (untimed)

The latency is t1 - t0 (host clock). Every result is checked (one rank: the tensor keeps its
value, for avg too). The polling is what a training loop or torch's watchdog does; a
synchronisation would make the shim submit the queued work at once and hide a wait.

With one rank NCCL launches no ncclDevKernel: an in-place sum is a no-op and avg launches its
`oneRankReduce` kernel (ncclLaunchOneRank). So what reaches the shim is torch's collective
bookkeeping on priority-0 streams (the input-ready event recorded on the issuing stream, the
NCCL stream's wait on it, the NCCL stream's end event; for avg one kernel): best-effort work like
any other, which the policy rightly holds up to ORION_BE_MAX_WAIT_US per op (H100: 400 ms for
sum, 600 ms for avg at 200 ms). Only with two or more ranks does a communication kernel reach
the shim, so --compare gives a verdict only for world size >= 2 and exits 3 (no verdict, the
figures printed) for one rank. The JSON gives the shim's counters per phase (deferred,
forced_by_starvation, communication_streams).

    python3 tests/gpu/nccl_under_shim.py --output no_shim.json
    LD_PRELOAD=build-gpu/intercept/libgpu_scheduler.so USE_ORION_SCHEDULER=1 ORION_POLICY=priority \\
        ORION_BE_MAX_WAIT_US=200000 python3 tests/gpu/nccl_under_shim.py --output shim.json
    python3 tests/gpu/nccl_under_shim.py --compare no_shim.json shim.json

Prints one JSON line (and writes it to --output). Exit status: 0 done, every result right;
1 a wrong result or an all-reduce that did not complete within --timeout-s; 2 cannot run (no
GPU, no NCCL, bad arguments). --compare exits 0 when, for every op, the median latency under
the shim with the high-priority load is at most FACTOR x the median without the shim with the
load + SLACK ms (default 10 x + 1 ms): an all-reduce held back by the policy takes about
ORION_BE_MAX_WAIT_US (the starvation bound, set large for the shim run); 1 when it is above the
bound, or when the bound is not below the shim run's ORION_BE_MAX_WAIT_US (the check could not
tell a wait from no wait); 2 on unusable input; 3 for runs of one rank (no verdict possible).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import sys
import time
import traceback
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shim_counters  # noqa: E402

LOADS = ("no_load", "hp_load")


def shim_stats() -> dict[str, int] | None:
    """orion_get_stats of the preloaded shim (None without it; no ORION_TRACE needed)."""
    if not shim_counters.shim_is_loaded():
        return None
    lib = ctypes.CDLL(None)
    get = lib.orion_get_stats
    get.argtypes = [ctypes.POINTER(shim_counters.OrionStats), ctypes.c_size_t]
    stats = shim_counters.OrionStats()
    rc = get(ctypes.byref(stats), ctypes.sizeof(stats))
    if rc != 0:
        raise RuntimeError(f"orion_get_stats returned {rc}")
    return {name: getattr(stats, name) for name, _ in shim_counters.OrionStats._fields_}


def shim_active() -> bool:
    return shim_counters.shim_is_loaded() and ctypes.CDLL(None).orion_is_active() == 1


class HpLoad:
    """bf16 matmuls on a high-priority stream, kept `depth` deep in flight while topped up."""

    def __init__(self, torch, stream, size: int, depth: int):
        self.torch, self.stream, self.depth = torch, stream, depth
        gen = torch.Generator().manual_seed(11)
        with torch.cuda.stream(stream):
            self.a = torch.randn(size, size, generator=gen).to("cuda", torch.bfloat16)
            self.b = torch.randn(size, size, generator=gen).to("cuda", torch.bfloat16)
            self.c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
        stream.synchronize()
        self.pending: deque = deque()
        self.launched = 0

    def top_up(self) -> None:
        while self.pending and self.pending[0].query():
            self.pending.popleft()
        while len(self.pending) < self.depth:
            with self.torch.cuda.stream(self.stream):
                self.torch.matmul(self.a, self.b, out=self.c)
                done = self.torch.cuda.Event()
                done.record(self.stream)
            self.pending.append(done)
            self.launched += 1

    def drain(self) -> None:
        self.stream.synchronize()
        self.pending.clear()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn_ranks(args) -> int:
    """Runs this program once per rank (RANK set, one GPU each); rank 0 writes --output. Every rank
    is bounded by the same deadline and killed past it: a rank that dies leaves the others waiting
    in NCCL, which the deadline ends."""
    import subprocess
    port = str(free_port())
    argv = [a for a in sys.argv[1:]]
    procs = []
    for rank in range(args.world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.world_size), NCCL_UNDER_SHIM_PORT=port)
        rank_argv = argv if rank == 0 else [a for a in drop_output(argv)]
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *rank_argv], env=env,
                                      stdout=None if rank == 0 else subprocess.DEVNULL))
    deadline = time.monotonic() + args.timeout_s * (args.warmup + args.iterations) * 4 + 120
    status = 0
    for rank, proc in enumerate(procs):
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            print(f"error: rank {rank} did not finish in time; all ranks killed", file=sys.stderr)
            return 1
        status = max(status, rc)
    return status


def drop_output(argv: list[str]):
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--output":
            skip = True
            continue
        if a.startswith("--output="):
            continue
        yield a


def summary(latencies_ms: list[float]) -> dict:
    s = sorted(latencies_ms)
    return {"n": len(s), "median_ms": statistics.median(s), "p90_ms": s[min(len(s) - 1, int(0.9 * len(s)))],
            "max_ms": s[-1], "min_ms": s[0]}


def measure(args) -> tuple[dict, int]:
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise SystemExit("error: torch sees no GPU (this check needs one)")
    if not dist.is_nccl_available():
        raise SystemExit("error: this torch build has no NCCL backend")
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
    unknown = set(args.ops.split(",")) - set(ops)
    if unknown:
        raise SystemExit(f"error: unknown op(s) {sorted(unknown)}; known: {', '.join(ops)}")
    rank, world = int(os.environ.get("RANK", "0")), args.world_size
    if torch.cuda.device_count() < world:
        raise SystemExit(f"error: --world-size {world} needs {world} GPUs, torch sees {torch.cuda.device_count()}")
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    port = os.environ.get("NCCL_UNDER_SHIM_PORT") or str(free_port())
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=device)
    result = {
        "device": torch.cuda.get_device_name(), "torch_version": torch.__version__,
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())), "world_size": dist.get_world_size(),
        "shim_loaded": shim_counters.shim_is_loaded(), "shim_active": shim_active(),
        "orion_policy": os.environ.get("ORION_POLICY"),
        "be_max_wait_us": int(os.environ["ORION_BE_MAX_WAIT_US"]) if os.environ.get("ORION_BE_MAX_WAIT_US") else None,
        "iterations": args.iterations, "elements": args.elements, "matmul": args.matmul, "hp_depth": args.hp_depth,
        "phases": {}, "wrong": [], "timed_out": [],
    }
    failed = False
    try:
        hp = torch.cuda.Stream(priority=-1)
        be = torch.cuda.Stream(priority=0)
        result["stream_priorities"] = {"hp": hp.priority, "issuing": be.priority}
        load = HpLoad(torch, hp, args.matmul, args.hp_depth)
        y = torch.empty(args.elements, device=device, dtype=torch.float32)
        for op_name in args.ops.split(","):
            for load_name in LOADS:
                latencies, matmuls_before = [], load.launched
                stats_before = shim_stats()
                for i in range(args.warmup + args.iterations):
                    value = float(i + 1)
                    with torch.cuda.stream(be):
                        y.fill_(value)
                    be.synchronize()  # the input is ready before the clock starts
                    if load_name == "hp_load":
                        load.top_up()
                    t0 = time.perf_counter()
                    with torch.cuda.stream(be):
                        work = dist.all_reduce(y, op=ops[op_name], async_op=True)
                    # Completion as the collective's own end event says (a query): no op of ours
                    # on the priority-0 stream is part of the measurement.
                    while not work.is_completed():
                        if load_name == "hp_load":
                            load.top_up()
                        if time.perf_counter() - t0 > args.timeout_s:
                            break
                    t1 = time.perf_counter()
                    expected = value * world if op_name == "sum" else value
                    if not work.is_completed():
                        result["timed_out"].append(f"{op_name}/{load_name} round {i}: not complete after "
                                                   f"{args.timeout_s} s")
                        failed = True
                        break
                    with torch.cuda.stream(be):
                        work.wait()  # the stream waits for the collective before reading y
                        ok = bool(torch.all(y == expected).item())
                    if not ok:
                        with torch.cuda.stream(be):
                            wrong = int((y != expected).sum().item())
                        result["wrong"].append(f"{op_name}/{load_name} round {i}: {wrong} of {args.elements} "
                                               f"elements differ from {expected}")
                        failed = True
                    if i >= args.warmup:
                        latencies.append((t1 - t0) * 1e3)
                load.drain()
                phase = summary(latencies) if latencies else {"n": 0}
                phase["matmuls"] = load.launched - matmuls_before
                stats_after = shim_stats()
                if stats_before is not None:
                    phase["shim"] = {k: stats_after[k] - stats_before[k] for k in stats_after
                                     if k not in ("queued_now", "tracked_in_flight")}
                result["phases"][f"{op_name}/{load_name}"] = phase
                print(f"{op_name}/{load_name}: {phase}", file=sys.stderr, flush=True)
                if failed:
                    break
            if failed:
                break
    finally:
        dist.destroy_process_group()
    return result, 1 if failed else 0


def compare(no_shim_path: str, shim_path: str, factor: float, slack_ms: float) -> int:
    try:
        a, b = (json.loads(Path(p).read_text()) for p in (no_shim_path, shim_path))
    except (OSError, json.JSONDecodeError) as e:
        print(f"cannot read the results: {e}")
        return 2
    problems = []
    if a.get("shim_loaded"):
        problems.append(f"{no_shim_path} ran with the shim loaded")
    if not b.get("shim_active"):
        problems.append(f"{shim_path} ran without the shim scheduling (LD_PRELOAD libgpu_scheduler.so, "
                        "USE_ORION_SCHEDULER=1)")
    if problems:
        print("; ".join(problems))
        return 2
    max_wait_ms = b["be_max_wait_us"] / 1e3 if b.get("be_max_wait_us") is not None else None
    failures, notes = [], []
    ops = [k.split("/")[0] for k in a["phases"] if k.endswith("/hp_load")]
    if not ops:
        print(f"no hp_load phase in {no_shim_path}")
        return 2
    for op in ops:
        ref = a["phases"][f"{op}/hp_load"]
        got = b["phases"].get(f"{op}/hp_load")
        if got is None or not got.get("n") or not ref.get("n"):
            failures.append(f"{op}: no measurement in both runs")
            continue
        bound = factor * ref["median_ms"] + slack_ms
        shim = got.get("shim", {})
        no_load = (b["phases"].get(f"{op}/no_load", {}).get("median_ms", float("nan")),
                   a["phases"].get(f"{op}/no_load", {}).get("median_ms", float("nan")))
        text = (f"{op} with HP load: median {got['median_ms']:.3f} ms shim vs {ref['median_ms']:.3f} ms no shim "
                f"(bound {bound:.3f}; no load {no_load[0]:.3f} vs {no_load[1]:.3f}; shim deferred "
                f"{shim.get('deferred', '?')} forced {shim.get('forced_by_starvation', '?')} communication streams "
                f"{shim.get('communication_streams', '?')})")
        if max_wait_ms is not None and bound >= max_wait_ms:
            failures.append(f"inconclusive: {text}: bound not below ORION_BE_MAX_WAIT_US "
                            f"({max_wait_ms:g} ms), a wait would not show")
        elif got["median_ms"] > bound:
            failures.append(f"waited: {text}")
        else:
            notes.append(text)
    if max_wait_ms is None:
        notes.append("the shim run did not set ORION_BE_MAX_WAIT_US (default 2 ms: a wait is hard to see)")
    if min(a.get("world_size", 1), b.get("world_size", 1)) < 2:
        # One rank: no communication kernel reaches the shim (see the docstring); what it held is
        # ordinary best-effort work, so a wait here says nothing about the rule.
        print("no verdict with one rank (NCCL launches no communication kernel; the collective's "
              "bookkeeping is best-effort work the policy holds): " + "; ".join(failures + notes))
        return 3
    print("; ".join(failures + notes))
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=30, help="timed all-reduces per op and load")
    p.add_argument("--warmup", type=int, default=3, help="untimed all-reduces before them")
    p.add_argument("--elements", type=int, default=1 << 20, help="float32 elements all-reduced")
    p.add_argument("--matmul", type=int, default=8192, help="the high-priority load's square bf16 matmul size")
    p.add_argument("--hp-depth", type=int, default=2, help="matmuls kept in flight on the high-priority stream")
    p.add_argument("--ops", default="sum,avg", help="comma-separated reduce ops: sum, avg")
    p.add_argument("--timeout-s", type=float, default=10.0, help="give up on an all-reduce after this long")
    p.add_argument("--output", help="also write the JSON result to this file")
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")),
                   help="ranks, one process and GPU each (default 1)")
    p.add_argument("--compare", nargs=2, metavar=("NO_SHIM_JSON", "SHIM_JSON"))
    p.add_argument("--factor", type=float, default=10.0, help="--compare: bound = FACTOR x no-shim median + SLACK")
    p.add_argument("--slack-ms", type=float, default=1.0)
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare, args.factor, args.slack_ms)
    if min(args.iterations, args.elements, args.matmul, args.hp_depth) < 1 or args.warmup < 0:
        p.error("--iterations, --elements, --matmul, --hp-depth must be >= 1 and --warmup >= 0")
    if args.world_size < 1:
        p.error("--world-size must be >= 1")
    if args.world_size > 1 and "RANK" not in os.environ:
        return spawn_ranks(args)
    try:
        result, status = measure(args)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    except Exception:  # a CUDA/NCCL/torch error: the check could not run (not a wrong result)
        traceback.print_exc()
        return 2
    text = json.dumps(result, sort_keys=True)
    if int(os.environ.get("RANK", "0")) != 0:
        return status
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())

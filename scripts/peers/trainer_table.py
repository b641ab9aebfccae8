#!/usr/bin/env python3
"""Builds the trainer comparison table (scripts/bench_trainer.sh) from the four runs' outputs.

gpipe_runner runs are read from OUTPUT_DIR/metrics.jsonl (per step) and summary.json, leaving
out the first --warmup steps; the Python peers from their JSON lines (they exclude their own
warm-up). Prints the table and writes it, with date, machine and command, as Markdown.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path


class ResultError(RuntimeError):
    pass


def runner_result(run_dir: Path, warmup: int) -> dict:
    summary_path, metrics_path = run_dir / "summary.json", run_dir / "metrics.jsonl"
    for p in (summary_path, metrics_path):
        if not p.is_file():
            raise ResultError(f"gpipe_runner wrote no {p} (see the run's log)")
    summary = json.loads(summary_path.read_text())
    steps = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    # A profiled step runs with the PyTorch profiler's overhead: never a timed one.
    timed = [s for s in steps[warmup:] if not s.get("profiled", False)]
    if not timed:
        raise ResultError(f"{metrics_path}: {len(steps)} steps, none left after {warmup} warm-up steps "
                          f"and the profiled one")
    if "tokens_per_step" not in summary:
        raise ResultError(f"{summary_path} has no 'tokens_per_step'")
    seconds = sum(s["step_time_ms"] for s in timed) / 1e3
    # The CUDA caching allocator's cudaMalloc calls in the timed steps (None on CPU).
    mallocs = [s["device_mallocs"] for s in timed if s.get("device_mallocs") is not None]
    return {"timed_device_mallocs": sum(mallocs) if mallocs else None,
            "tokens_per_s": summary["tokens_per_step"] * len(timed) / seconds,
            "step_time_ms_mean": 1e3 * seconds / len(timed),
            "first_loss": steps[0]["loss"], "final_loss": steps[-1]["loss"],
            "steps": len(timed), "bubble_fraction": summary.get("bubble_fraction"),
            "detail": f"{summary.get('stages')} stage(s), {summary.get('executor')}, "
                      f"{summary.get('schedule')}, {summary.get('microbatches')} micro-batches"}


def peer_result(path: Path) -> dict:
    if not path.is_file() or not path.read_text().strip():
        raise ResultError(f"peer result {path} is missing or empty (see the peer's log)")
    r = json.loads(path.read_text().strip().splitlines()[-1])
    detail = (f"{r['stages']} Gloo processes, {r['schedule']}, {r['threads_per_stage']} thread(s) each"
              if "stages" in r else f"1 process, {r['threads']} thread(s), {r['precision']}")
    return {**r, "detail": detail}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def render(rows: dict[str, dict], ratios: list[tuple[str, str, str]]) -> str:
    lines = ["| run | tokens/s | step ms (mean) | first loss | final loss | timed steps | setup |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {r['step_time_ms_mean']:.1f} | "
                     f"{r['first_loss']:.4f} | {r['final_loss']:.4f} | {r['steps']} | {r['detail']} |")
    lines += ["", "| ratio | value |", "|---|---:|"]
    for label, a, b in ratios:
        lines.append(f"| {label} | {rows[a]['tokens_per_s'] / rows[b]['tokens_per_s']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="folder with the four runs' outputs")
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--command", required=True, help="the command line to record")
    p.add_argument("--markdown", type=Path, required=True)
    p.add_argument("--threads", type=int, required=True, help="intra-op threads given to every run")
    p.add_argument("--load", default="?", help="load average (1, 5, 15 min) when the runs began")
    args = p.parse_args()
    try:
        rows = {
            "ours: 4 stages (async_threaded, 1f1b)": runner_result(args.dir / "ours_4stage", args.warmup),
            "ours: 1 stage (unpipelined)": runner_result(args.dir / "ours_1stage", args.warmup),
            "PyTorch eager": peer_result(args.dir / "eager.json"),
            "torch.distributed.pipelining 4 stages": peer_result(args.dir / "pipelining.json"),
        }
    except (ResultError, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    names = list(rows)
    table = render(rows, [("ours 4 stages / torch.distributed.pipelining 4 stages", names[0], names[3]),
                          ("ours 1 stage / PyTorch eager", names[1], names[2]),
                          ("ours 4 stages / PyTorch eager", names[0], names[2])])
    print(table)
    now = dt.datetime.now(dt.timezone.utc)
    bubble = rows[names[0]].get("bubble_fraction")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(
        f"# Trainer throughput on CPU, {now:%Y-%m-%d %H:%M} UTC\n\n"
        f"- Machine: {cpu_model()}, {os.cpu_count()} logical cores "
        f"(shared with other jobs; load average {args.load} when the runs began: treat small "
        "differences as noise)\n"
        f"- Threads: {args.threads} torch intra-op thread(s) per stage thread / process in every run "
        "(OMP_NUM_THREADS for gpipe_runner, --threads for the peers)\n"
        f"- Config: `{args.config}`; {args.warmup} warm-up steps left out of every number\n"
        f"- Command: `{args.command}`\n"
        f"- Bubble fraction of the 4-stage run (runner's own measure): "
        f"{bubble if bubble is None else f'{bubble:.3f}'}\n"
        "- The Python peers train on random tokens of the same shape (throughput does not depend "
        "on token values); gpipe_runner on the byte-tokenised corpus, so losses compare within "
        "each pair (same init, same data), not across them.\n"
        "- On a loaded machine a run with more threads (4 stage threads, 4 processes) also gets a "
        "larger share of the CPU than a 1-thread run: read the 4-stage/1-process ratios with that "
        "in mind.\n\n" + table + "\n")
    print(f"\nwrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

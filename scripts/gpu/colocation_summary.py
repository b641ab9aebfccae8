#!/usr/bin/env python3
"""Rows of GPU check (j), the best-effort job in the pipeline's bubbles, from its run folder.

    colocation_summary.py DIR

DIR holds pipeline_<mode>/metrics.jsonl (gpipe_runner), job_<mode>.json (tests/gpu/be_matmul_job.py)
and, for the managed modes, status_<mode>.jsonl (orion-gpud status, polled while both ran), for
mode in alone, unmanaged, managed, mps_unmanaged, mps_managed (absent modes are skipped).

Per mode beside the pipeline: the pipeline's step time against alone (steps after the first two),
and the job's matmuls/s during those same steps (its per-interval completion counts, lined up with
the steps' end_unix_s) against the job alone. A job that did not run through the pipeline's timed
steps compares nothing: FAIL. A managed mode must show the gating at work, or its row says why it
FAILs: the job ran under the shim (shim_loaded) which never stopped holding work and held launches
back (shim_stats.deferred > 0), and the daemon saw the pipeline publish windows and admitted the
job's launches (windows_published, launches_admitted > 0; the filled share is reported).
Exit status 1 when a row FAILs.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MODES = ("unmanaged", "managed", "mps_unmanaged", "mps_managed")


class Missing(Exception):
    pass


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Missing(f"{path.name}: {e}") from None


def steps(d: Path, mode: str) -> list[dict]:
    path = d / f"pipeline_{mode}" / "metrics.jsonl"
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise Missing(f"pipeline_{mode}/metrics.jsonl: {e}") from None
    if not rows:
        raise Missing(f"pipeline_{mode}/metrics.jsonl has no steps")
    return rows[2:] or rows  # the first two warm up (allocator, autotuning)


def step_ms(rows: list[dict]) -> float:
    return statistics.mean(r["step_time_ms"] for r in rows)


def timed_window(rows: list[dict]) -> tuple[float, float] | None:
    """Unix seconds from the first timed step's start to the last one's end (None: not recorded)."""
    if any(not r.get("end_unix_s") for r in rows):
        return None
    return rows[0]["end_unix_s"] - rows[0]["step_time_ms"] / 1e3, rows[-1]["end_unix_s"]


def job_rate(job: dict, window: tuple[float, float] | None) -> tuple[float, str]:
    """matmuls/s over `window` (the job's intervals that lie inside it), or over the whole job."""
    if window is None:
        return job["matmuls_per_s"], "whole job"
    counts, width, t0 = job.get("completions"), job.get("bucket_s"), job.get("start_unix_s")
    if not counts or not width or t0 is None:
        raise Missing("the job recorded no completion intervals (an older be_matmul_job.py?)")
    start, end = window
    job_end = t0 + len(counts) * width
    if t0 > start + width or job_end < end - width:
        raise Missing(f"the job ran {t0 - start:+.1f} s .. {job_end - end:+.1f} s around the pipeline's timed "
                      "steps, not through them: nothing overlapped to compare")
    inside = [c for i, c in enumerate(counts) if t0 + i * width >= start and t0 + (i + 1) * width <= end]
    if not inside:
        raise Missing(f"the pipeline's timed steps ({end - start:.2f} s) are shorter than one job interval ({width} s)")
    return sum(inside) / (len(inside) * width), "during the timed steps"


def gating(d: Path, mode: str, job: dict) -> tuple[list[str], str]:
    """(reasons the managed mode did not show gating, what it showed)."""
    problems = []
    if job.get("shim_loaded") is not True:
        problems.append(f"the job ran without libgpu_scheduler.so (shim_loaded={job.get('shim_loaded')}): not gated")
    stats = job.get("shim_stats") or {}
    if stats.get("holding_stopped"):
        problems.append("the shim stopped holding work (holding_stopped; its log names the entry point)")
    deferred = stats.get("deferred", 0)
    if not deferred:
        problems.append("the shim held back none of the job's launches (shim_stats.deferred 0)")
    best = None  # the snapshot with the most launches admitted
    path = d / f"status_{mode}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        try:
            s = json.loads(line)
        except ValueError:
            continue  # the daemon not up yet, or gone
        pipeline = s.get("pipeline") if isinstance(s, dict) else None
        jobs = [c for c in s.get("clients", []) if c.get("role") == "best_effort"] if isinstance(s, dict) else []
        if not isinstance(pipeline, dict) or not jobs:
            continue
        admitted = sum(c.get("launches_admitted", 0) for c in jobs)
        if best is None or admitted >= best[0]:
            best = (admitted, pipeline)
    if best is None:
        problems.append(f"no daemon status showed the pipeline and the job attached together ({len(lines)} polled)")
        return problems, f"shim deferred {deferred}"
    admitted, pipeline = best
    windows = pipeline.get("windows_published", 0)
    if not windows:
        problems.append("the pipeline published no windows")
    if not admitted:
        problems.append("the daemon admitted none of the job's launches")
    return problems, (f"gpud: {windows} windows, {admitted} launches admitted, filled share "
                      f"{pipeline.get('filled_share', 0):.3f}; shim deferred {deferred}")


def rows(d: Path) -> tuple[list[str], bool]:
    out, ok = [], True
    try:
        alone = steps(d, "alone")
        base, jbase = step_ms(alone), read_json(d / "job_alone.json")["matmuls_per_s"]
    except (Missing, KeyError, ZeroDivisionError) as e:
        return [f"| j: colocation alone | FAIL | {e} |"], False
    for mode in MODES:
        if not (d / f"job_{mode}.json").exists() and not (d / f"pipeline_{mode}").exists():
            continue  # not run here (no MPS)
        managed = mode.endswith("managed") and not mode.endswith("unmanaged")
        try:  # one mode's missing run (killed at the limit) leaves the others' rows
            run, job = steps(d, mode), read_json(d / f"job_{mode}.json")
            rate, over = job_rate(job, timed_window(run))
            row = (f"pipeline step {step_ms(run):.1f} ms / alone {base:.1f} ms = {step_ms(run) / base:.3f}; "
                   f"job {rate:.1f} matmuls/s ({over}) / alone {jbase:.1f} = {rate / jbase:.3f}")
            problems = []
            if managed:
                problems, shown = gating(d, mode, job)
                row += f"; {shown}"
        except (Missing, KeyError, ZeroDivisionError) as e:
            out.append(f"| j: colocation {mode} | FAIL | {e} |")
            ok = False
            continue
        if problems:
            out.append(f"| j: colocation {mode} | FAIL | {row}; not shown gated: {'; '.join(problems)} |")
            ok = False
        else:
            out.append(f"| j: colocation {mode} | INFO | {row} |")
    return out, ok


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    lines, ok = rows(Path(sys.argv[1]))
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

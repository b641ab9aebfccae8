#!/usr/bin/env python3
"""Rehearses the GPU plan on a machine without a GPU, as the GPU machine would run it.

    scripts/gpu/rehearse.py OUT [--calls 1 2 3] [--python .venv/bin/python]

For each call of scripts/gpu_check.sh's plan: a bare copy of the work tree (what the device tool
copies: tracked and untracked-but-not-ignored files, no .git), with only .deps/debs carried (run
scripts/gpu/stage-debs.sh first) and, from call 2 on, the archive call 1 returned carried as
.gpu-bin/gpu-bin.tar.gz; then `scripts/gpu_check.sh --call N` in it. The CUDA toolkit compiles
here and nothing CUDA runs, so each check goes as far as its first GPU call and fails there (its
row says why); that is expected. What the rehearsal asserts, per call:
  - the returned folder obeys the device tool's rules (scripts/gpu/check_outdir.py --only ...);
  - no process of the call is left when it ends (each carries REHEARSAL_MARKER);
  - every step after the build ends within GPU_REHEARSAL_STEP_S (60) seconds: on a machine
    without the GPU a check fails at once, it never waits;
  - the call's CPU time, divided by the GPU machine's 16 cores, fits the call's budget
    (GPU_CHECK_BUDGET_S, 540): a lower bound of its time there (perfect parallelism, no GPU work).
Writes OUT/rehearsal.md (a table per call, every call's results.md) and exits 1 if a rule broke.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU_CORES = 16
BUDGET_S = int(os.environ.get("GPU_CHECK_BUDGET_S", "540"))
STEP_S = int(os.environ.get("GPU_REHEARSAL_STEP_S", "60"))
RETURNED = ["results.md", "logs.tar.gz", "gpu-bin.tar.gz"]


def bare_copy(dest: Path):
    """The work tree as the device tool copies it: no .git, nothing git ignores."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.split(b"\0")
    dest.mkdir(parents=True)
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.exists() or src.is_dir():
            continue  # deleted in the work tree, or a submodule
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel, follow_symlinks=False)


def marked_processes(marker: str):
    pids = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env.read_bytes().split(b"\0"):
                pids.append(int(env.parent.name))
        except OSError:
            continue
    return pids


def step_durations(stdout: str, total: float):
    """Seconds each step ran, from gpu_check.sh's '[gpu_check] NAME (limit ..., Ns elapsed)' lines."""
    starts = [(m.group(1), int(m.group(2))) for m in
              re.finditer(r"^\[gpu_check\] (\S+) \(limit \d+s, (\d+)s elapsed\)$", stdout, re.M)]
    end = re.search(r"^\[gpu_check\] done in (\d+)s", stdout, re.M)
    stop = int(end.group(1)) if end else int(total)
    return {name: (starts[i + 1][1] if i + 1 < len(starts) else stop) - at for i, (name, at) in enumerate(starts)}


def rehearse_call(n: int, work: Path, python: str, commit: str, archive):
    tree, out = work / f"call{n}" / "tree", work / f"call{n}" / "out"
    bare_copy(tree)
    shutil.copytree(ROOT / ".deps" / "debs", tree / ".deps" / "debs")
    if archive is not None:
        (tree / ".gpu-bin").mkdir()
        shutil.copy2(archive, tree / ".gpu-bin" / "gpu-bin.tar.gz")
    marker = f"REHEARSAL_MARKER={os.getpid()}.{n}"
    # Steps get their limits stretched by the cores this machine lacks (16 / cores here), so the
    # build is judged by its CPU time over 16 cores, not killed by a limit made for 16 cores.
    scale = max(1, GPU_CORES // (os.cpu_count() or 1))
    # The GPU image has no protobuf or Boost: hide this machine's, so the build takes the same path.
    env = dict(os.environ, GPU_CHECK_COMMIT=commit, GPU_CHECK_PYTHON=python, GPU_CHECK_TIME_SCALE=str(scale),
               GPU_CHECK_CMAKE_ARGS="-DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON",
               REHEARSAL_MARKER=marker.split("=", 1)[1])
    env.pop("LD_PRELOAD", None)
    before = os.times()
    start = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--call", str(n), str(out)], cwd=tree, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    left = marked_processes(marker)
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    (work / f"call{n}" / "stdout.log").write_text(proc.stdout + proc.stderr)
    rules = subprocess.run([sys.executable, str(ROOT / "scripts/gpu/check_outdir.py"), str(out), "--only", *RETURNED],
                           capture_output=True, text=True)
    steps = step_durations(proc.stdout, wall)
    problems = []
    if rules.returncode != 0:
        problems.append(f"returned folder: {rules.stdout.strip()}")
    if left:
        problems.append(f"{len(left)} process(es) outlived the call: {left}")
    slow = {k: v for k, v in steps.items() if k != "build" and v > STEP_S}
    if slow:
        problems.append(f"steps that waited instead of failing at once: {slow}")
    if cpu / GPU_CORES > BUDGET_S:
        problems.append(f"CPU time {cpu:.0f} s / {GPU_CORES} cores = {cpu / GPU_CORES:.0f} s, over the {BUDGET_S} s budget")
    results = (out / "results.md").read_text() if (out / "results.md").exists() else "(no results.md came back)\n"
    if not (out / "results.md").exists():
        problems.append("no results.md in the returned folder")
    leaked = re.findall(r"^\| (\S+): processes \| INFO \| (.*) \|$", results, re.M)
    if leaked:  # the harness killed them; a check that leaks processes is still worth knowing
        problems.append("steps whose processes outlived them (killed by the harness): " +
                        ", ".join(f"{step} ({what})" for step, what in leaked))
    if n == 1 and not (out / "gpu-bin.tar.gz").exists():
        problems.append("call 1 returned no gpu-bin.tar.gz (later calls would build again)")
    return {"n": n, "wall": wall, "cpu": cpu, "steps": steps, "rules": rules.stdout.strip(), "results": results,
            "problems": problems, "archive": out / "gpu-bin.tar.gz" if (out / "gpu-bin.tar.gz").exists() else None,
            "rc": proc.returncode}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a folder for the report (rehearsal.md) and each call's copy")
    parser.add_argument("--calls", nargs="+", type=int, default=[1, 2, 3],
                        help="which of gpu_check.sh's calls to rehearse, in order (default: 1 2 3)")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                        help="the python with torch the GPU machine's system python stands for")
    args = parser.parse_args()
    if not list((ROOT / ".deps" / "debs").glob("*.deb")):
        sys.exit("rehearse: no .deps/debs/*.deb: run scripts/gpu/stage-debs.sh first")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    commit += "+changes" if dirty else ""
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    archive = None
    calls = []
    for n in args.calls:
        print(f"[rehearse] call {n} ...", flush=True)
        call = rehearse_call(n, work, args.python, commit, archive if n > 1 else None)
        if n == 1:
            archive = call["archive"]
        elif archive is None:
            call["problems"].append("no archive from call 1 to carry: this call built for itself")
        calls.append(call)
        print(f"[rehearse] call {n}: {call['wall']:.0f} s wall, {call['cpu']:.0f} s CPU; "
              f"{'; '.join(call['problems']) or 'rules kept'}", flush=True)
    lines = [f"# GPU plan rehearsed on CPU ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit})", "",
             f"Machine: {os.cpu_count()} cores, no GPU. Command: `scripts/gpu/rehearse.py OUT`. Budget per call: "
             f"{BUDGET_S} s; CPU time is scaled to the GPU machine's {GPU_CORES} cores.", "",
             "| call | wall here s | CPU s | CPU/16 s | steps (s each) | returned folder | verdict |",
             "|---|---|---|---|---|---|---|"]
    for c in calls:
        steps = ", ".join(f"{k} {v}" for k, v in c["steps"].items())
        verdict = "; ".join(c["problems"]) or "rules kept"
        lines.append(f"| {c['n']} | {c['wall']:.0f} | {c['cpu']:.0f} | {c['cpu'] / GPU_CORES:.0f} | {steps} | "
                     f"{c['rules']} | {verdict} |")
    for c in calls:
        lines += ["", f"## call {c['n']}: results.md as it came back", "", c["results"]]
    (args.out / "rehearsal.md").write_text("\n".join(lines) + "\n")
    print(f"[rehearse] report: {args.out / 'rehearsal.md'}")
    return 1 if any(c["problems"] for c in calls) else 0


if __name__ == "__main__":
    sys.exit(main())

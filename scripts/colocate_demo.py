#!/usr/bin/env python3
"""Cross-process bubble filling in one command, on CPU (issue 25): orion-gpud, a pipeline that
publishes its idle windows (gpipe_runner, the synthetic model, parallel.publish_bubbles_rank) and
a best-effort job admitted into them (orion-gpud-fill), against the pipeline alone.

    scripts/colocate_demo.py [--build build] [--steps 12] [--rank 3] [--job cpu|cuda] [--json OUT]

--job cuda runs, instead of the CPU job, a CUDA program over the fake driver under the shim with
ORION_POLICY=gpud (tests/intercept/gpud_be_job.cpp: nonstop launches on a priority-0 stream and the
legacy stream), and fails unless every launch that reached the (fake) driver while the pipeline
was attached did so inside a window the pipeline published.

Prints the pipeline's mean step time alone and with the best-effort job (their ratio), the idle
time of the publishing rank over the steps that had windows (every step after the first: windows
are predicted from the step before), the best-effort work admitted into windows, and the share of
that idle time it filled. On CPU the synthetic model's layers sleep, so this shows the protocol
filling bubbles, not protection from contention (that needs the GPU and the shim's gating).
Exit status 0 when it ran and the job worked inside windows, 1 otherwise, 2 on a missing program.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def daemon_status(build: Path, env) -> dict:
    """`orion-gpud status`: clients, grants, and the bubbles published and filled."""
    r = subprocess.run([str(build / "gpud/orion-gpud"), "status", "--gpu", "cpu-demo"], env=env, capture_output=True,
                       text=True, timeout=10)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def run_pipeline(build: Path, out: Path, steps: int, extra: list[str], env=None, watch=None) -> list[dict]:
    """Runs gpipe_runner; `watch()` is called every 0.2 s while it runs (the daemon's status)."""
    cmd = [str(build / "trainer/gpipe_runner"), "--config", str(ROOT / "configs/synthetic_cpu.yaml"),
           "--output-dir", str(out), "--set", f"training.max_steps={steps}", "--set", "training.profile_iteration=-1",
           *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        if watch:
            watch()
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    err = proc.communicate()[1]
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stderr=err)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def report_cuda_job(args, alone, shared, job, rc, status) -> int:
    timed = lambda ms: statistics.mean(m["step_time_ms"] for m in ms[1:])  # noqa: E731
    print(f"pipeline step: alone {timed(alone):.1f} ms, with the CUDA job {timed(shared):.1f} ms "
          f"(ratio {timed(shared) / timed(alone):.3f})")
    if not job:
        print("error: the CUDA job printed nothing (see its stderr above)", file=sys.stderr)
        return 1
    print(f"CUDA job (fake driver, shim with ORION_POLICY=gpud): {job['launched']} launches, "
          f"{job['while_gated']} reached the driver while the pipeline was attached: {job['inside_windows']} inside "
          f"its {job['windows_seen']} windows, {job['outside_windows']} outside")
    # No share filled here: the fake driver's kernels take no real time, so nothing bounds how much
    # kernel time fits a window (on a GPU, the in-flight budget and the window do).
    if args.json:
        args.json.write_text(json.dumps({"job": job, "daemon_status": status}, indent=1) + "\n")
    return 0 if rc == 0 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--build", type=Path, default=ROOT / "build")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rank", type=int, default=3, help="the pipeline rank whose idle time is published")
    p.add_argument("--chunk-us", type=float, default=500)
    p.add_argument("--json", type=Path)
    p.add_argument("--job", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: orion-gpud-fill; cuda: a CUDA job over the fake driver under the shim")
    args = p.parse_args()
    needed = ["trainer/gpipe_runner", "gpud/orion-gpud", "gpud/orion-gpud-fill"]
    if args.job == "cuda":
        needed += ["tests/intercept/icpt_gpud_be_job", "intercept/libgpu_scheduler.so",
                   "tests/intercept/fake_driver/libcuda.so.1"]
    for exe in needed:
        if not (args.build / exe).exists():
            print(f"error: {args.build / exe} is missing: build it first (scripts/build.sh)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="gdemo") as tmp:
        tmp = Path(tmp)
        env = dict(os.environ, ORION_GPUD_DIR=str(tmp / "gpud"))
        alone = run_pipeline(args.build, tmp / "alone", args.steps, [])
        daemon = subprocess.Popen([str(args.build / "gpud/orion-gpud"), "serve", "--gpu", "cpu-demo"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            sock = tmp / "gpud/gpu-cpu-demo.sock"
            for _ in range(500):
                if sock.exists():
                    break
                time.sleep(0.01)
            seconds = max(5.0, 2.0 * sum(m["step_time_ms"] for m in alone) / 1e3 + 3)
            if args.job == "cuda":
                job_env = dict(env, LD_PRELOAD=str(args.build / "intercept/libgpu_scheduler.so"),
                               LD_LIBRARY_PATH=str(args.build / "tests/intercept/fake_driver"), USE_ORION_SCHEDULER="1",
                               ORION_POLICY="gpud", ORION_POLICY_PARAMS=f"gpu=cpu-demo,dir={tmp / 'gpud'}",
                               ORION_LOG_LEVEL="warn")
                filler = subprocess.Popen([str(args.build / "tests/intercept/icpt_gpud_be_job"), "--gpu", "cpu-demo",
                                           "--dir", str(tmp / "gpud"), "--seconds", str(seconds)], env=job_env,
                                          stdout=subprocess.PIPE, text=True)
            else:
                filler = subprocess.Popen([str(args.build / "gpud/orion-gpud-fill"), "--gpu", "cpu-demo", "--seconds",
                                           str(seconds), "--chunk-us", str(args.chunk_us)], env=env,
                                          stdout=subprocess.PIPE, text=True)
            status = {}

            def watch():  # the daemon's account while the pipeline is attached
                s = daemon_status(args.build, env)
                if s.get("pipeline"):
                    status.update(s)

            shared = run_pipeline(args.build, tmp / "shared", args.steps,
                                  ["--set", "parallel.publish_bubbles_gpu=cpu-demo",
                                   "--set", f"parallel.publish_bubbles_rank={args.rank}"], env, watch)
            fill_out = filler.communicate(timeout=seconds + 30)[0]
            fill = json.loads(fill_out) if fill_out.strip() else {}
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
    if args.job == "cuda":
        return report_cuda_job(args, alone, shared, fill, filler.returncode, status)
    timed = lambda ms: statistics.mean(m["step_time_ms"] for m in ms[1:])  # noqa: E731
    idle_s = sum((1 - m["rank_busy"][args.rank]) * m["step_time_ms"] / 1e3 for m in shared[1:])
    in_windows_s = fill["reasons"].get("fits the window", 0) * args.chunk_us / 1e6
    result = {"step_ms_alone": timed(alone), "step_ms_shared": timed(shared),
              "step_ratio": timed(shared) / timed(alone), "rank": args.rank, "rank_idle_s": idle_s,
              "best_effort_in_windows_s": in_windows_s, "filled_share": in_windows_s / idle_s if idle_s else 0.0,
              "filler": fill, "daemon_status": status}
    print(f"pipeline step: alone {result['step_ms_alone']:.1f} ms, with the best-effort job "
          f"{result['step_ms_shared']:.1f} ms (ratio {result['step_ratio']:.3f})")
    print(f"rank {args.rank} idle over steps 2..{args.steps}: {idle_s:.2f} s; best-effort work admitted into its "
          f"windows: {in_windows_s:.2f} s ({100 * result['filled_share']:.1f}% of it filled)")
    print(f"filler decisions: {json.dumps(fill['reasons'])}")
    if status.get("pipeline"):
        p = status["pipeline"]
        print(f"orion-gpud status (last while the pipeline ran): {p['windows_published']} windows, "
              f"{p['window_ms_published']:.0f} ms of idle time offered, {100 * p['filled_share']:.1f}% of it filled by "
              + ", ".join(f"{c['name']} ({c['launches_admitted']} launches)" for c in status["clients"]
                          if c["role"] == "best_effort"))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if in_windows_s > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

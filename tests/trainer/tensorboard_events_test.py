#!/usr/bin/env python3
"""gpipe_runner's TensorBoard scalars, read back with TensorBoard's own reader.

Trains the tiny GPT for a few steps (one process, then two processes of two ranks each) and
reads the run folder with tensorboard's EventAccumulator, the loader `tensorboard --logdir` uses.
Every scalar of every step must equal the same step's value in metrics.jsonl (to float32, the
precision TensorBoard stores), no tag may be missing or extra, and the profiler trace that
TensorBoard's profiler plugin reads must sit in the same folder.
With the shim and the fake driver (a build with the intercept tests), one more run has the
shim preloaded and must report its held/admitted counts as scalars.
Usage: tensorboard_events_test.py GPIPE_RUNNER PROJECT_ROOT [SHIM_SO FAKE_DRIVER_DIR]
"""
import os
import json
import math
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as error:  # a missing reader is a failure, never a skip
    sys.exit(f"tensorboard_events_test: cannot import TensorBoard's reader ({error}): "
             "run scripts/install-deps.sh, which installs the tensorboard package into .venv")

RUNNER = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None
ROOT = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else pathlib.Path(__file__).resolve().parents[2]
SHIM = pathlib.Path(sys.argv[3]) if len(sys.argv) > 4 else None
FAKE_DRIVER_DIR = pathlib.Path(sys.argv[4]) if len(sys.argv) > 4 else None
CONFIG = ROOT / "configs" / "gpt_cpu_tiny.yaml"
MIB = 1024.0 * 1024.0
SPDLOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[(info|warning|error)\] ")


def expected_scalars(record):
    """The scalars one metrics.jsonl line implies, tag -> value (the writer's documented tags)."""
    out = {
        "train/loss": record["loss"],
        "train/learning_rate": record["lr"],
        "train/grad_norm": record["grad_norm"],
        "throughput/tokens_per_s": record["tokens_per_s"],
        "throughput/step_time_ms": record["step_time_ms"],
        "pipeline/bubble_fraction": record["bubble_fraction"],
        "memory/peak_MiB": record["peak_memory_bytes"] / MIB,
    }
    if record["mfu"] is not None:
        out["throughput/mfu"] = record["mfu"]
    for rank, busy in enumerate(record["rank_busy"]):
        out[f"pipeline/rank{rank}_busy"] = busy
    if record["scheduler_held"] is not None:
        out["scheduler/held"] = record["scheduler_held"]
        out["scheduler/admitted"] = record["scheduler_admitted"]
    if record["device_mallocs"] is not None:  # a GPU run: the caching allocator's traffic
        out["memory/device_mallocs"] = record["device_mallocs"]
        out["memory/alloc_retries"] = record["alloc_retries"]
        out["memory/reserved_peak_MiB"] = record["reserved_peak_bytes"] / MIB
    return out


def run(out_dir, *extra, env=None):
    cmd = [str(RUNNER), "--config", str(CONFIG), "--steps", "4", "--output-dir", str(out_dir),
           "--set", "training.log_interval=1", "--set", "training.profile_iteration=1", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


class TensorBoardEvents(unittest.TestCase):
    def check_run(self, out_dir, ranks):
        records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
        self.assertEqual([r["step"] for r in records], [0, 1, 2, 3])
        files = sorted(out_dir.glob("events.out.tfevents.*"))
        self.assertEqual(len(files), 1, f"one event file expected in {out_dir}, found {files}")
        acc = event_accumulator.EventAccumulator(str(out_dir), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        want_tags = set()
        for record in records:
            self.assertEqual(len(record["rank_busy"]), ranks)
            want_tags |= set(expected_scalars(record))
        self.assertEqual(tags, want_tags)
        for tag in sorted(tags):
            by_step = {e.step: e.value for e in acc.Scalars(tag)}
            self.assertEqual(sorted(by_step), [r["step"] for r in records], tag)
            for record in records:
                want = expected_scalars(record)[tag]
                got = by_step[record["step"]]
                # float32 storage: 2^-24 relative, and tiny values may flush to float32's range.
                self.assertTrue(math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-30),
                                f"{tag} at step {record['step']}: TensorBoard {got}, metrics.jsonl {want}")
        return records

    def check_log_is_the_runners_own(self, log, steps):
        """Every line is the runner's: spdlog's `[time] [level]` lines or the summary block. A CPU
        run's profiled step once added LibTorch's callback warnings and Kineto's
        `ERROR: ... gpuGetDeviceCount failed` (nothing a user can act on)."""
        in_summary = False
        foreign = []
        for line in log.splitlines():
            if line.startswith("===================="):
                in_summary = not in_summary
                continue
            if in_summary or SPDLOG_LINE.match(line):
                continue
            foreign.append(line)
        self.assertEqual(foreign, [], "lines in the run's log that are not the runner's own")
        self.assertFalse(in_summary, "the summary block was not closed")
        # Progress: step N of the total, elapsed and time left, on every step (log_interval=1).
        for n in range(1, steps + 1):
            self.assertRegex(log, rf"step {n}/{steps} \(epoch 0\) \| loss .* \| elapsed \d+:\d\d \| left \d+:\d\d")
        # What the profiled step's trace holds, said once by the runner.
        self.assertIn("no GPU activity (a CPU run)", log)

    def test_one_process_every_scalar_matches_metrics_jsonl(self):
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = pathlib.Path(tmp) / "run"
            log = run(out_dir)
            records = self.check_run(out_dir, ranks=4)
            # Every rank of the 1F1B pipeline computed during every step, and none was busy longer
            # than the step.
            for record in records:
                for busy in record["rank_busy"]:
                    self.assertGreater(busy, 0.0)
                    self.assertLessEqual(busy, 1.0 + 1e-9)
                self.assertIsNone(record["scheduler_held"])  # no shim preloaded
                self.assertIsNone(record["device_mallocs"])  # no CUDA caching allocator on CPU
            # The profiler plugin's trace lies under the same --logdir.
            self.assertTrue(list(out_dir.glob("profiler_*/rank0/*.pt.trace.json")), "no profiler trace under the run")
            self.assertIn("tensorboard --logdir", log)
            self.check_log_is_the_runners_own(log, steps=4)

    def test_two_processes_report_every_rank(self):
        # Each process runs two of the four ranks; the busy shares of all four reach rank 0's file.
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = pathlib.Path(tmp) / "run2"
            run(out_dir, "--nproc-per-node", "2")
            for record in self.check_run(out_dir, ranks=4):
                for rank, busy in enumerate(record["rank_busy"]):
                    self.assertGreater(busy, 0.0, f"rank {rank} at step {record['step']}")

    def test_under_the_shim_its_counts_are_scalars(self):
        if SHIM is None:
            self.skipTest("this build has no shim or no fake driver (OURGPIPE_BUILD_INTERCEPT off or no CUDA toolkit)")
        env = dict(os.environ, LD_PRELOAD=str(SHIM), USE_ORION_SCHEDULER="1",
                   LD_LIBRARY_PATH=f"{FAKE_DRIVER_DIR}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        with tempfile.TemporaryDirectory() as tmp:
            out_dir = pathlib.Path(tmp) / "run_shim"
            run(out_dir, env=env)
            records = self.check_run(out_dir, ranks=4)
            for record in records:
                # A CPU run makes no CUDA call: the shim is loaded and scheduling, and held nothing.
                self.assertEqual((record["scheduler_held"], record["scheduler_admitted"]), (0, 0))


if __name__ == "__main__":
    if RUNNER is None or not RUNNER.exists():
        sys.exit(f"usage: {sys.argv[0]} GPIPE_RUNNER PROJECT_ROOT (gpipe_runner not found: {RUNNER})")
    unittest.main(argv=sys.argv[:1], verbosity=2)

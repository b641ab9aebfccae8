"""trainer_table.runner_result: a gpipe_runner folder's timed steps (tokens/s, step time, and the
CUDA allocator's cudaMalloc calls in them, None on CPU)."""
import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer_table import ResultError, runner_result  # noqa: E402


class RunnerResultTest(unittest.TestCase):
    def run_dir(self, steps):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = Path(tmp.name)
        (d / "summary.json").write_text(json.dumps({"tokens_per_step": 1000}))
        (d / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
        return d

    def test_timed_steps_leave_out_the_warm_up(self):
        d = self.run_dir([{"step_time_ms": 900, "loss": 5.0, "device_mallocs": 40},
                          {"step_time_ms": 100, "loss": 4.0, "device_mallocs": 3},
                          {"step_time_ms": 100, "loss": 3.0, "device_mallocs": 0}])
        r = runner_result(d, warmup=1)
        self.assertEqual(r["steps"], 2)
        self.assertAlmostEqual(r["tokens_per_s"], 10000.0)
        self.assertEqual(r["timed_device_mallocs"], 3)  # the warm-up step's 40 left out
        self.assertEqual((r["first_loss"], r["final_loss"]), (5.0, 3.0))

    def test_the_profiled_step_is_never_timed(self):
        # gpipe_runner marks the step run under the PyTorch profiler; its overhead is not the runner's.
        d = self.run_dir([{"step_time_ms": 900, "loss": 5.0},
                          {"step_time_ms": 400, "loss": 4.0, "profiled": True},
                          {"step_time_ms": 100, "loss": 3.0, "profiled": False}])
        r = runner_result(d, warmup=1)
        self.assertEqual(r["steps"], 1)
        self.assertAlmostEqual(r["step_time_ms_mean"], 100.0)

    def test_a_cpu_run_has_no_allocator_figure(self):
        d = self.run_dir([{"step_time_ms": 100, "loss": 1.0, "device_mallocs": None}] * 3)
        self.assertIsNone(runner_result(d, warmup=1)["timed_device_mallocs"])

    def test_no_step_left_after_the_warm_up_is_an_error(self):
        with self.assertRaises(ResultError):
            runner_result(self.run_dir([{"step_time_ms": 100, "loss": 1.0}]), warmup=1)


if __name__ == "__main__":
    unittest.main()

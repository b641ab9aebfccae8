#!/usr/bin/env python3
"""gpipe_runner --plan --verify on the synthetic model (layers that wait, so a step's time does
not depend on this machine's cores): every candidate of a small grid is predicted, then run, and
the planner must predict each within issue 26's goals (median |error| <= 5%, max <= 15%) and pick
one within 5% of the best measured. Also: the YAML it writes is a config the runner accepts, and
impossible requests end with exit 2 naming the constraint.

Usage: plan_synthetic_test.py GPIPE_RUNNER PROJECT_ROOT
"""
import json
import statistics
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

RUNNER = sys.argv[1] if len(sys.argv) > 1 else "build/trainer/gpipe_runner"
ROOT = Path(sys.argv[2] if len(sys.argv) > 2 else ".")
CONFIG = ROOT / "configs" / "synthetic_cpu.yaml"
# 8 blocks of 2 ms per part: a step of tens of milliseconds; world of 2 ranks (p2, or p1 x dp2).
SMALL = ["--set", "model.num_layers=8", "--set", "synthetic.forward_ms=2", "--set", "synthetic.input_grad_ms=2",
         "--set", "synthetic.weight_grad_ms=2"]


def runner(*args, timeout=600):
    return subprocess.run([RUNNER, "--config", str(CONFIG), *SMALL, *args], capture_output=True, text=True,
                          timeout=timeout)


class PlanVerifySynthetic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = Path(cls.tmp.name)
        cls.proc = runner("--plan", "--world-size", "2", "--plan-schedules", "1f1b,zb_h1",
                          "--plan-max-microbatches", "4", "--verify", "1000", "--verify-steps", "5",
                          "--output-dir", str(out))
        cls.out = out
        cls.report = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else None

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_plan_ran(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stdout[-3000:] + self.proc.stderr[-3000:])
        self.assertIsNotNone(self.report)
        self.assertIn("Why the others lost", self.proc.stdout)

    def test_every_candidate_was_verified(self):
        ranked = self.report["ranked"]
        verify = self.report["verify"]
        self.assertGreaterEqual(len(ranked), 10, "the grid should hold both schedules, m 1..4, p2 and dp2")
        self.assertEqual(len(verify), len(ranked))
        failed = [v for v in verify if v["exit_code"] != 0 or v["measured_step_ms"] <= 0]
        self.assertEqual(failed, [], "runs failed: see their run.log")

    def test_prediction_error_within_the_goals(self):
        errors = [abs(v["predicted_step_ms"] / v["measured_step_ms"] - 1) for v in self.report["verify"]]
        table = "\n".join(f"{v['label']}: predicted {v['predicted_step_ms']:.1f}, measured {v['measured_step_ms']:.1f}"
                          for v in self.report["verify"])
        self.assertLessEqual(statistics.median(errors), 0.05, table)
        self.assertLessEqual(max(errors), 0.15, table)

    def test_pick_is_within_five_percent_of_the_best_measured(self):
        verify = self.report["verify"]
        best = min(v["measured_step_ms"] for v in verify)
        pick = next(v for v in verify if v["rank"] == 1)
        self.assertLessEqual(pick["measured_step_ms"], 1.05 * best,
                             f"pick {pick['label']} measured {pick['measured_step_ms']:.1f} ms, best {best:.1f} ms")

    def test_peak_memory_is_counted_and_predicted(self):
        for v in self.report["verify"]:
            self.assertGreater(v["measured_peak_bytes"], 0, f"{v['label']}: no allocation statistics")
            self.assertGreater(v["predicted_peak_bytes"], 0)

    def test_written_yaml_is_a_config_the_runner_accepts(self):
        yaml = self.out / "plan.yaml"
        text = yaml.read_text()
        self.assertIn("# Written by gpipe_runner --plan", text)
        self.assertIn(self.report["ranked"][0]["schedule"], text)
        check = subprocess.run([RUNNER, "--config", str(yaml), "--validate-only"], capture_output=True, text=True,
                               timeout=120)
        self.assertEqual(check.returncode, 0, check.stderr)


class PlanBadInput(unittest.TestCase):
    def test_no_legal_world_is_exit_2_naming_the_constraint(self):
        with tempfile.TemporaryDirectory() as out:
            proc = runner("--set", "model.num_layers=2", "--stages", "1", "--plan", "--world-size", "9", "--output-dir", out)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:])
        self.assertIn("world of 9 ranks", proc.stderr)
        self.assertIn("--world-size", proc.stderr)

    def test_nothing_fits_the_memory_is_exit_2_naming_the_nearest(self):
        with tempfile.TemporaryDirectory() as out:
            proc = runner("--plan", "--memory-budget-gib", "0.0001", "--output-dir", out)
        self.assertEqual(proc.returncode, 2, proc.stdout[-2000:])
        self.assertIn("no configuration fits the memory", proc.stderr)
        self.assertIn("nearest", proc.stderr)

    def test_unknown_schedule_is_exit_2(self):
        with tempfile.TemporaryDirectory() as out:
            proc = runner("--plan", "--plan-schedules", "1f1b,nonsense", "--output-dir", out)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("nonsense", proc.stderr)

    def test_verify_needs_plan(self):
        proc = runner("--verify", "2")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--plan", proc.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)

"""The two peers train the same model: torch.distributed.pipelining (4 Gloo processes) must give
the eager run's per-step losses, for both schedules. Runs the real scripts as a user would."""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

PEERS = Path(__file__).resolve().parents[1]
CONFIG = """model: {name: gpt, hidden_size: 64, num_layers: 4, num_heads: 4, sequence_length: 32}
dataset: {batch_size: 8}
training: {num_microbatches: 4, learning_rate: 0.001}
parallel: {device: cpu}
"""


def run(script: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, str(PEERS / script), *args], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"{script} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class PeersAgreeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.config = Path(cls.tmp.name) / "tiny.yaml"
        cls.config.write_text(CONFIG)
        cls.eager = run("bench_eager.py", "--config", str(cls.config), "--steps", "2", "--warmup", "1",
                        "--threads", "1")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_eager_reports_throughput_and_learns(self):
        self.assertGreater(self.eager["tokens_per_s"], 0)
        self.assertEqual(len(self.eager["losses"]), 3)
        self.assertIsNone(self.eager["mfu"])  # no peak FLOPs on CPU without OURGPIPE_PEAK_TFLOPS

    def test_pipelining_matches_eager_losses(self):
        for schedule in ("1f1b", "gpipe"):
            with self.subTest(schedule=schedule):
                piped = run("bench_pipelining.py", "--config", str(self.config), "--steps", "2",
                            "--warmup", "1", "--schedule", schedule, "--threads", "1")
                self.assertEqual(piped["stages"], 4)
                self.assertEqual(len(piped["losses"]), 3)
                for a, b in zip(piped["losses"], self.eager["losses"]):
                    self.assertAlmostEqual(a, b, delta=1e-4)

    def test_bad_config_fails_with_the_key(self):
        out = subprocess.run([sys.executable, str(PEERS / "bench_eager.py"), "--config", str(self.config),
                              "--set", "model.hidden=3"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stderr)  # a field to fix, as gpipe_runner
        self.assertIn("bench_eager.py: error: ", out.stderr)
        self.assertIn("model.hidden", out.stderr)

    def test_no_timed_steps_is_refused(self):
        out = subprocess.run([sys.executable, str(PEERS / "bench_eager.py"), "--config", str(self.config),
                              "--steps", "0"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("need --steps >= 1", out.stderr)

    def test_more_stages_than_blocks_is_one_error_line(self):
        out = subprocess.run([sys.executable, str(PEERS / "bench_pipelining.py"), "--config", str(self.config),
                              "--stages", "40"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assertIn("bench_pipelining.py: error: --stages 40: 40 stages for", out.stderr)
        self.assertNotIn("Traceback", out.stderr)


if __name__ == "__main__":
    unittest.main()

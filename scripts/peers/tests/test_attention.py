"""model.attention in the peers (bench_common.use_attention), as gpipe_runner applies it."""
import contextlib
import io
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench_common import use_attention  # noqa: E402
from config import GPTShape  # noqa: E402

SHAPE = GPTShape(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, sequence_length=16,
                 ffn_hidden_size=48, dropout=0.0, batch_size=4, num_microbatches=2)
CPU = torch.device("cpu")


class UseAttentionTest(unittest.TestCase):
    def tearDown(self):
        use_attention("auto", SHAPE, CPU, torch.float32)

    def refused(self, *args) -> str:
        """use_attention's refusal: exit code 2 (a setting to fix, as gpipe_runner) and its line."""
        err = io.StringIO()
        with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(err):
            use_attention(*args)
        self.assertEqual(e.exception.code, 2)
        return err.getvalue()

    def test_a_named_kernel_is_the_one_chosen_and_auto_restores_the_rest(self):
        self.assertEqual(use_attention("math", SHAPE, CPU, torch.float32), "math")
        self.assertFalse(torch.backends.cuda.flash_sdp_enabled())
        self.assertEqual(use_attention("flash", SHAPE, CPU, torch.float32), "flash")
        self.assertFalse(torch.backends.cuda.math_sdp_enabled())
        self.assertIn(use_attention("auto", SHAPE, CPU, torch.float32), ("flash", "math"))
        self.assertTrue(torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled())

    def test_cuda_kernels_on_cpu_and_unknown_names_exit_naming_the_field(self):
        for name in ("cudnn", "efficient", "fa3"):
            line = self.refused(name, SHAPE, CPU, torch.float32)
            self.assertIn("error: model.attention", line)
            self.assertIn(name, line)

    def test_a_kernel_that_cannot_run_the_model_exits_with_torchs_reason(self):
        with_dropout = GPTShape(**{**SHAPE.__dict__, "dropout": 0.1})
        line = self.refused("flash", with_dropout, CPU, torch.float32)
        self.assertIn("model.attention=flash cannot run this model's attention", line)
        self.assertEqual(use_attention("auto", with_dropout, CPU, torch.float32), "math")


if __name__ == "__main__":
    unittest.main()

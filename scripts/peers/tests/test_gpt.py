"""The Python GPT: parameter count and FLOPs formulas, partition, partition-independent init."""
import math
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from config import GPTShape  # noqa: E402
from gpt import (create_layers, create_model, lm_loss, parameter_counts,  # noqa: E402
                 training_flops_per_token, uniform_blocks, uniform_partition)

SHAPE = GPTShape(vocab_size=97, hidden_size=32, num_layers=5, num_heads=4, sequence_length=16,
                 ffn_hidden_size=48, dropout=0.0, batch_size=4, num_microbatches=2)


class GPTTest(unittest.TestCase):
    def test_parameter_count_formula_matches_the_model(self):
        model = create_model(SHAPE, seed=1)
        total, non_embedding = parameter_counts(SHAPE)
        self.assertEqual(total, sum(p.numel() for p in model.parameters()))
        self.assertEqual(non_embedding, total - 97 * 32 - 16 * 32)

    def test_flops_per_token(self):
        _, n = parameter_counts(SHAPE)
        self.assertEqual(training_flops_per_token(SHAPE), 6 * n + 12 * 5 * 32 * 16)

    def test_uniform_partition_covers_every_layer_once(self):
        for stages in (1, 2, 4, 5):
            ranges = uniform_partition(SHAPE.num_layers, stages)
            self.assertEqual(ranges[0][0], 0)
            self.assertEqual(ranges[-1][1], SHAPE.num_layers + 2)
            for (_, end), (start, _) in zip(ranges, ranges[1:]):
                self.assertEqual(end, start)
        self.assertEqual(uniform_partition(5, 2), [(0, 4), (4, 7)])
        # As trainer/partition/partition.cpp: the remainder to middle stages, then stage 0, then the last.
        self.assertEqual(uniform_blocks(6, 4), [1, 2, 2, 1])
        self.assertEqual(uniform_blocks(7, 4), [2, 2, 2, 1])
        self.assertEqual(uniform_blocks(11, 4), [3, 3, 3, 2])
        with self.assertRaisesRegex(ValueError, "stages"):
            uniform_partition(5, 6)

    def test_init_depends_on_layer_index_not_partition(self):
        full = create_model(SHAPE, seed=7)
        stage = create_layers(SHAPE, 2, 4, seed=7)
        for a, b in zip(stage.state_dict().values(), list(full.state_dict().values())[len(full[0].state_dict())
                                                                                     + len(full[1].state_dict()):]):
            self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(full[1].attn.c_attn.weight, full[2].attn.c_attn.weight))
        self.assertFalse(torch.equal(create_model(SHAPE, seed=8)[1].mlp.c_fc.weight, full[1].mlp.c_fc.weight))

    def test_gpt2_init_statistics(self):
        big = GPTShape(vocab_size=50, hidden_size=256, num_layers=8, num_heads=4, sequence_length=8,
                       ffn_hidden_size=1024, dropout=0.0, batch_size=1, num_microbatches=1)
        block = create_layers(big, 1, 2, seed=3)[0]
        self.assertAlmostEqual(block.mlp.c_fc.weight.std().item(), 0.02, delta=0.001)
        self.assertAlmostEqual(block.mlp.c_proj.weight.std().item(), 0.02 / math.sqrt(16), delta=0.0005)
        self.assertEqual(block.attn.c_attn.bias.abs().sum().item(), 0.0)
        self.assertTrue(torch.equal(block.ln_1.weight, torch.ones(256)))

    def test_forward_is_causal_and_initial_loss_near_uniform(self):
        model = create_model(SHAPE, seed=1)
        ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
        logits = model(ids)
        self.assertEqual(tuple(logits.shape), (2, 16, 97))
        changed = ids.clone()
        changed[:, 10] = (changed[:, 10] + 1) % 97
        # Positions before the change cannot see it (causal attention).
        self.assertTrue(torch.allclose(model(changed)[:, :10], logits[:, :10]))
        self.assertFalse(torch.allclose(model(changed)[:, 10:], logits[:, 10:]))
        self.assertAlmostEqual(lm_loss(logits, ids).item(), math.log(97), delta=0.1)


if __name__ == "__main__":
    unittest.main()

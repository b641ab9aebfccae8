"""Training batches for the peers: uniformly random token ids of the real shapes.

Throughput does not depend on token values, so the peers use random tokens rather than reading
the corpus; the C++ runner reads the byte-tokenised corpus. Batch `index` is a pure function of
(seed, index), so every process of a pipelined run sees the same global batch.
"""
from __future__ import annotations

import torch

from config import GPTShape


def global_batch(s: GPTShape, seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, targets), both int64 [batch_size, sequence_length]; targets are the inputs
    shifted by one position, as for next-token prediction on real text."""
    g = torch.Generator().manual_seed((seed * 7_919 + index) % (2**63))
    tokens = torch.randint(0, s.vocab_size, (s.batch_size, s.sequence_length + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

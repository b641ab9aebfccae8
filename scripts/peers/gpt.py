"""The project's GPT in Python PyTorch, layer for layer the model the C++ trainer builds.

GPT-2 style, pre-LayerNorm, fp32 parameters. Layer 0 is the embedding, layers 1..L the
transformer blocks, layer L+1 the final LayerNorm + untied LM head; each is an nn.Module mapping
one tensor to one tensor, so any contiguous slice of layers is a pipeline stage.
Each layer is initialised from its own generator seeded from (seed, layer index), so a stage
built alone starts from the same weights as the same layers inside the full model.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from config import GPTShape

LN_EPS = 1e-5
INIT_STD = 0.02


def layer_seed(seed: int, index: int) -> int:
    """The init seed of layer `index` (documented in docs/results/README.md)."""
    return (seed * 1_000_003 + index) % (2**63)


class Embedding(nn.Module):
    """Layer 0: token + learned position embeddings."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.hidden_size)
        self.wpe = nn.Embedding(s.sequence_length, s.hidden_size)
        self.drop = nn.Dropout(s.dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.wte(ids) + self.wpe(positions))


class Attention(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.num_heads = s.num_heads
        self.c_attn = nn.Linear(s.hidden_size, 3 * s.hidden_size)
        self.c_proj = nn.Linear(s.hidden_size, s.hidden_size)
        self.dropout = s.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.c_attn(x).split(h, dim=2)
        q, k, v = (z.view(b, t, self.num_heads, h // self.num_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, h))


class MLP(nn.Module):
    def __init__(self, s: GPTShape):
        super().__init__()
        self.c_fc = nn.Linear(s.hidden_size, s.ffn_hidden_size)
        self.c_proj = nn.Linear(s.ffn_hidden_size, s.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """Layers 1..L: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.hidden_size, eps=LN_EPS)
        self.attn = Attention(s)
        self.ln_2 = nn.LayerNorm(s.hidden_size, eps=LN_EPS)
        self.mlp = MLP(s)
        self.drop = nn.Dropout(s.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class Head(nn.Module):
    """Layer L+1: final LayerNorm and the LM head (not tied to wte: they live on different stages)."""

    def __init__(self, s: GPTShape):
        super().__init__()
        self.ln_f = nn.LayerNorm(s.hidden_size, eps=LN_EPS)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def _init_layer(layer: nn.Module, num_layers: int, generator: torch.Generator) -> None:
    """GPT-2 init: N(0, 0.02) weights, zero biases, unit LayerNorm; residual projections scaled."""
    residual_std = INIT_STD / math.sqrt(2 * num_layers)
    # named_modules() order is the construction order, so the draw sequence is fixed.
    for name, mod in layer.named_modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            std = residual_std if name.endswith("c_proj") else INIT_STD
            with torch.no_grad():
                mod.weight.normal_(0.0, std, generator=generator)
            if getattr(mod, "bias", None) is not None:
                nn.init.zeros_(mod.bias)
        elif isinstance(mod, nn.LayerNorm):
            nn.init.ones_(mod.weight)
            nn.init.zeros_(mod.bias)


def create_layer(s: GPTShape, index: int, seed: int) -> nn.Module:
    """Layer `index` of [embedding, block_1..block_L, head], initialised from (seed, index)."""
    if not 0 <= index <= s.num_layers + 1:
        raise IndexError(f"layer index {index} outside [0, {s.num_layers + 1}]")
    layer = Embedding(s) if index == 0 else Head(s) if index == s.num_layers + 1 else Block(s)
    _init_layer(layer, s.num_layers, torch.Generator().manual_seed(layer_seed(seed, index)))
    return layer


def create_layers(s: GPTShape, first: int, last: int, seed: int) -> nn.Sequential:
    """Layers [first, last) as one module (a pipeline stage, or the whole model for [0, L+2))."""
    return nn.Sequential(*(create_layer(s, i, seed) for i in range(first, last)))


def create_model(s: GPTShape, seed: int) -> nn.Sequential:
    return create_layers(s, 0, s.num_layers + 2, seed)


def uniform_blocks(num_layers: int, num_stages: int) -> list[int]:
    """Transformer blocks per stage, as the C++ trainer's uniform split (trainer/partition/partition.cpp):
    an even share each; the remainder goes to the middle stages first, then to stage 0 (an
    embedding lookup is cheap), then to the last stage (the LM head is the heaviest layer)."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"{num_stages} stages for {num_layers} transformer blocks: need "
                         "1 <= stages <= model.num_layers")
    base, extra = divmod(num_layers, num_stages)
    blocks = [base] * num_stages
    for stage in [*range(1, num_stages - 1), 0, num_stages - 1][:extra]:
        blocks[stage] += 1
    return blocks


def uniform_partition(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    """[first, last) layer ranges per stage: uniform_blocks, the embedding (layer 0) on the first
    stage and the head (layer L+1) on the last."""
    ranges, start = [], 1
    blocks = uniform_blocks(num_layers, num_stages)
    for stage, count in enumerate(blocks):
        end = start + count
        ranges.append((0 if stage == 0 else start, end + (1 if stage == num_stages - 1 else 0)))
        start = end
    return ranges


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all B*T positions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def parameter_counts(s: GPTShape) -> tuple[int, int]:
    """(all parameters, non-embedding parameters), from the shape (no model is built).
    Non-embedding excludes wte and wpe only; the untied LM head is counted (it is a matmul)."""
    h, f, v, t, n = s.hidden_size, s.ffn_hidden_size, s.vocab_size, s.sequence_length, s.num_layers
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    head = 2 * h + h * v
    non_embedding = n * block + head
    return non_embedding + v * h + t * h, non_embedding


def training_flops_per_token(s: GPTShape) -> float:
    """FLOPs of one training step (forward + backward) per token, PaLM/Megatron convention:
    6 * N_non_embedding + 12 * L * H * T (the second term is causal-agnostic attention scores)."""
    _, non_embedding = parameter_counts(s)
    return 6.0 * non_embedding + 12.0 * s.num_layers * s.hidden_size * s.sequence_length

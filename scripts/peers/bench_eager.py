#!/usr/bin/env python3
"""PyTorch eager training of the project's GPT, unpipelined: the reference peer for gpipe_runner.

One step = the global batch split into training.num_microbatches micro-batches, gradients
accumulated (each micro-batch loss divided by their count), gradient clipping at
training.grad_clip, one AdamW step (constant learning rate: throughput does not depend on it).
bf16 autocast on GPU under training.dtype=auto, fp32 on CPU. Prints one JSON line.

    python scripts/peers/bench_eager.py --config configs/gpt_cpu_tiny.yaml --steps 10 --warmup 3
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_common import (autocast_for, common_parser, emit, load_shape, peak_flops,  # noqa: E402
                          resolve_device, synchronize, use_attention)
from data import global_batch  # noqa: E402
from gpt import create_model, lm_loss, parameter_counts, training_flops_per_token  # noqa: E402


def main() -> None:
    p = common_parser(__doc__.splitlines()[1])
    p.add_argument("--device", help="cpu | cuda | auto (default: the config's parallel.device)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (default: eager)")
    args = p.parse_args()
    cfg, s = load_shape(args)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    train = cfg["training"]
    device = resolve_device(args.device or cfg["parallel"]["device"])
    autocast, precision = autocast_for(train["dtype"], device)
    attention = use_attention(cfg["model"]["attention"], s, device,
                              torch.bfloat16 if precision == "bf16" else torch.float32)
    seed = train["seed"]
    torch.manual_seed(seed)

    model = create_model(s, seed).to(device)
    run = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=train["learning_rate"],
                            weight_decay=train["weight_decay"])
    m, mb = s.num_microbatches, s.microbatch_size

    def step(index: int) -> torch.Tensor:
        ids, targets = (t.to(device, non_blocking=True) for t in global_batch(s, seed, index))
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for i in range(m):
            with autocast:
                loss = lm_loss(run(ids[i * mb:(i + 1) * mb]), targets[i * mb:(i + 1) * mb]) / m
            loss.backward()
            total += loss.detach()
        if train["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        opt.step()
        return total

    losses = [step(i) for i in range(args.warmup)]
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    losses += [step(args.warmup + i) for i in range(args.steps)]
    synchronize(device)
    elapsed = time.perf_counter() - start

    tokens_per_s = args.steps * s.batch_size * s.sequence_length / elapsed
    flops_per_token = training_flops_per_token(s)
    peak = peak_flops(device)
    n_params, n_non_embedding = parameter_counts(s)
    emit({
        "peer": "pytorch_eager" + ("_compiled" if args.compile else ""),
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops_per_token / peak if peak else None,
        "step_time_ms_mean": 1e3 * elapsed / args.steps,
        "first_loss": losses[0].item(), "final_loss": losses[-1].item(),
        "losses": [loss.item() for loss in losses],
        "steps": args.steps, "warmup_steps": args.warmup,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": precision, "attention": attention, "threads": torch.get_num_threads(),
        "params": n_params, "params_non_embedding": n_non_embedding,
        "flops_per_token": flops_per_token, "peak_flops": peak,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "batch_size": s.batch_size, "microbatches": m, "sequence_length": s.sequence_length,
        "torch_version": torch.__version__,
    }, args.output)


if __name__ == "__main__":
    main()

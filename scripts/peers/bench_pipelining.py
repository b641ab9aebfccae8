#!/usr/bin/env python3
"""torch.distributed.pipelining training of the project's GPT: the pipelined peer of gpipe_runner.

Spawns one process per stage (default 4) on this machine's CPU, joined by a Gloo process group
(MASTER_ADDR=127.0.0.1, a free port). Stage r holds the layers of the same uniform partition as
the C++ trainer (embedding on stage 0, head on the last). Each step runs Schedule1F1B or
ScheduleGPipe over training.num_microbatches micro-batches (gradients scaled by 1/m, as a mean
loss), clips the global gradient norm at training.grad_clip, and takes one AdamW step per stage.
Prints one JSON line.

    python scripts/peers/bench_pipelining.py --config configs/gpt_cpu_tiny.yaml --schedule 1f1b
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # noqa: E402

from bench_common import common_parser, emit, fail, load_shape, use_attention  # noqa: E402
from data import global_batch  # noqa: E402
from gpt import create_layers, lm_loss, parameter_counts, training_flops_per_token, uniform_partition  # noqa: E402

SCHEDULES = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clip_global_grad_norm(params: list[torch.Tensor], max_norm: float) -> None:
    """clip_grad_norm_ over the whole model: each stage holds a part, so sum the squares first."""
    sq = torch.zeros(())
    for p in params:
        if p.grad is not None:
            sq += p.grad.detach().float().pow(2).sum()
    dist.all_reduce(sq)
    coef = max_norm / (sq.sqrt().item() + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)


def run_rank(rank: int, world: int, args, cfg, s, port: int, result_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads if args.threads > 0 else max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        attention = use_attention(cfg["model"]["attention"], s, torch.device("cpu"), torch.float32)
        train = cfg["training"]
        seed = train["seed"]
        first, last = uniform_partition(s.num_layers, world)[rank]
        module = create_layers(s, first, last, seed)
        stage = PipelineStage(module, rank, world, torch.device("cpu"))
        schedule = SCHEDULES[args.schedule](stage, s.num_microbatches, loss_fn=lm_loss)
        params = list(module.parameters())
        opt = torch.optim.AdamW(params, lr=train["learning_rate"], weight_decay=train["weight_decay"])

        def step(index: int) -> float | None:
            ids, targets = global_batch(s, seed, index)
            opt.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            if rank == 0:
                schedule.step(ids)
            elif rank == world - 1:
                schedule.step(target=targets, losses=losses)
            else:
                schedule.step()
            if train["grad_clip"] > 0:
                clip_global_grad_norm(params, train["grad_clip"])
            opt.step()
            return torch.stack(losses).mean().item() if losses else None

        losses = [step(i) for i in range(args.warmup)]
        dist.barrier()
        start = time.perf_counter()
        losses += [step(args.warmup + i) for i in range(args.steps)]
        dist.barrier()
        elapsed = time.perf_counter() - start
        if rank == world - 1:
            Path(result_path).write_text(json.dumps({"elapsed": elapsed, "losses": losses, "attention": attention,
                                                     "threads": torch.get_num_threads()}))
    finally:
        dist.destroy_process_group()


def main() -> None:
    p = common_parser(__doc__.splitlines()[1])
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default=None,
                   help="pipeline schedule (default: the config's parallel.schedule)")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages = processes")
    args = p.parse_args()
    cfg, s = load_shape(args)
    args.schedule = args.schedule or cfg["parallel"]["schedule"]
    if args.schedule not in SCHEDULES:
        fail(f"schedule '{args.schedule}': the pipelining peer runs {sorted(SCHEDULES)} "
                 "(pass --schedule)")
    try:
        uniform_partition(s.num_layers, args.stages)  # fails early, naming the rule, if impossible
    except ValueError as e:
        fail(f"--stages {args.stages}: {e}")
    use_attention(cfg["model"]["attention"], s, torch.device("cpu"), torch.float32)  # and this (each rank sets it again)

    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        mp.spawn(run_rank, args=(args.stages, args, cfg, s, free_port(), result_path),
                 nprocs=args.stages, join=True)
        r = json.loads(Path(result_path).read_text())

    tokens_per_s = args.steps * s.batch_size * s.sequence_length / r["elapsed"]
    n_params, n_non_embedding = parameter_counts(s)
    emit({
        "peer": "torch_distributed_pipelining",
        "schedule": args.schedule, "stages": args.stages, "backend": "gloo", "device": "cpu",
        "tokens_per_s": tokens_per_s, "attention": r["attention"],
        "step_time_ms_mean": 1e3 * r["elapsed"] / args.steps,
        "first_loss": r["losses"][0], "final_loss": r["losses"][-1], "losses": r["losses"],
        "steps": args.steps, "warmup_steps": args.warmup, "threads_per_stage": r["threads"],
        "params": n_params, "params_non_embedding": n_non_embedding,
        "flops_per_token": training_flops_per_token(s),
        "batch_size": s.batch_size, "microbatches": s.num_microbatches,
        "sequence_length": s.sequence_length, "torch_version": torch.__version__,
    }, args.output)


if __name__ == "__main__":
    main()

"""What both peer benchmarks share: command line, device and precision choice, MFU, JSON output."""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import NoReturn

import torch

from config import ConfigError, gpt_shape, load_config
from sdpa_kernels import BACKEND_NAMES, KERNELS, use_kernels

def peak_bf16_flops_for_name(device_name: str) -> float | None:
    """Dense bf16 tensor-core peak (FLOP/s) from the vendors' data sheets, by device name: the
    rules of gpipe_runner's peak_flops_for_device_name (trainer/metrics/metrics.cpp), so that ours
    and the peers' MFU share a peak. None for an unknown device."""
    name = device_name.upper()
    if any(k in name for k in ("H100", "H200", "H800")):
        if "PCIE" in name:
            return 756e12
        return 835e12 if "NVL" in name else 989e12
    if "A100" in name or "A800" in name:
        return 312e12
    if "L40S" in name:
        return 362e12
    if "A10" in name or "V100" in name:
        return 125e12
    return None


def fail(message: str) -> NoReturn:
    """A setting the user can fix: one line on stderr and exit code 2, as gpipe_runner (and
    argparse) answer a bad flag or field; 1 is left to failures while running."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def common_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", required=True, help="YAML config (the schema gpipe_runner reads)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config field (repeatable), as gpipe_runner --set")
    p.add_argument("--steps", type=int, default=10, help="timed training steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--output", help="also write the JSON result to this file")
    return p


def load_shape(args: argparse.Namespace):
    """The config with --set applied and the GPT's shape; also checks the common flags."""
    if args.steps < 1 or args.warmup < 0:
        fail(f"--steps {args.steps} --warmup {args.warmup}: need --steps >= 1 and --warmup >= 0")
    try:
        cfg = load_config(args.config, args.set)
        return cfg, gpt_shape(cfg)
    except ConfigError as e:
        fail(str(e))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        fail("parallel.device=cuda but torch sees no CUDA device (use --set parallel.device=cpu)")
    if name not in ("cpu", "cuda"):
        fail(f"parallel.device='{name}': use auto, cpu or cuda")
    return torch.device(name)


def autocast_for(dtype: str, device: torch.device):
    """training.dtype: auto = bf16 autocast on GPU and fp32 on CPU (as gpipe_runner); bf16; fp32."""
    if dtype not in ("auto", "bf16", "fp32"):
        fail(f"training.dtype='{dtype}': use auto, bf16 or fp32")
    use_bf16 = dtype == "bf16" or (dtype == "auto" and device.type == "cuda")
    if not use_bf16:
        return nullcontext(), "fp32"
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16), "bf16"


def use_attention(setting: str, shape, device: torch.device, dtype: torch.dtype) -> str:
    """model.attention, as gpipe_runner applies it (trainer/model/attention_backend.h): auto is
    PyTorch's default set of SDPA kernels, a name is that kernel alone. Returns the kernel SDPA
    picks for the GPT's attention; exits naming model.attention when that kernel cannot run it."""
    if setting != "auto" and setting not in KERNELS:
        fail(f"model.attention='{setting}': use auto, {', '.join(KERNELS)}")
    if device.type == "cpu" and setting in ("efficient", "cudnn"):
        fail(f"model.attention={setting} is a CUDA kernel and this run is on the CPU: use auto, flash or math")
    use_kernels(setting)
    head_dim = shape.hidden_size // shape.num_heads
    q = torch.empty(1, shape.num_heads, shape.sequence_length, head_dim, device=device, dtype=dtype,
                    requires_grad=True)
    try:
        choice = torch._fused_sdp_choice(q, q, q, dropout_p=shape.dropout, is_causal=True)
    except RuntimeError as e:
        fail(f"model.attention={setting} cannot run this model's attention on {device} in {dtype}: {e}")
    return BACKEND_NAMES.get(choice, f"unknown ({choice})")


def peak_flops(device: torch.device) -> float | None:
    override = os.environ.get("OURGPIPE_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12
    if device.type != "cuda":
        return None
    return peak_bf16_flops_for_name(torch.cuda.get_device_name(device))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def emit(result: dict, output: str | None) -> None:
    text = json.dumps(result, sort_keys=True)
    print(text, flush=True)
    if output:
        Path(output).write_text(text + "\n")

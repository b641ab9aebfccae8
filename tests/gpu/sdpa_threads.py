#!/usr/bin/env python3
"""What a CPU thread's first scaled_dot_product_attention costs, per SDPA kernel.

Why: on the H100 (docs/results/2026-11-27-gpu-h100.md) each pipeline rank's first forward of a
step took 60-90 ms against 3-9 ms later, in an executor that started one thread per rank per step.
PyTorch prefers cuDNN's attention on an H100 with a cuDNN newer than 9.15, and ATen keeps cuDNN's built
attention graphs in thread_local caches (aten/src/ATen/native/cudnn/MHA.cpp), one for forward
and one for backward: a thread's first call of each builds a graph. The trainer's executors run
backward on the rank's own thread (autograd multithreading off, trainer/execution/action_runner.h),
so a rank thread's first backward builds one too. This measures exactly that, on the trainer's
attention shape (configs/gpt_350m_gpu.yaml: micro-batch 2, 16 heads, 1024 positions, head dim 64,
bf16, causal), with backward run as the trainer runs it (on the calling thread):

  for each kernel (model.attention: auto, and each named one; one that cannot run the shape gets a
  "cannot run this shape" line with ATen's reason; on CPU only auto, flash and math are tried)
    forward on the main thread: the first call, then warm calls (median)
    forward on fresh threads: each new thread's first call, then its second
    backward on fresh threads that ran one forward first (forward+backward timed), against warm
  and the same for the MLP's up-projection GEMM as a control (no cuDNN: a fresh thread should pay
  little there)

Prints one line per kernel and a JSON document (--output). On CPU it runs the same steps on a
small shape (a smoke test of this script; the CPU kernels keep no per-thread state, and on a busy
machine the shared intra-op pool makes its figures noise).

    python3 tests/gpu/sdpa_threads.py --output sdpa_threads.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "peers"))
from sdpa_kernels import BACKEND_NAMES, KERNELS, use_kernels  # noqa: E402

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return 1e3 * (time.perf_counter() - start)


def cuda_device(name: str) -> torch.device:
    """The device with its index ("cuda" is the current one): torch.cuda.set_device needs one."""
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def in_fresh_thread(fn, device: torch.device):
    """Runs fn on a new thread bound to the device; returns its result (re-raising its error)."""
    box: dict = {}

    def body():
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device.index)
            with torch.autograd.set_multithreading_enabled(False):  # backward here, as the trainer
                box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def measure_op(label: str, kernel: str, forward, inputs: tuple, device: torch.device, fresh: int,
               warm: int) -> dict:
    """The first-call costs of `forward` (and its backward, run on the calling thread)."""
    def backward():
        # The gradients are returned, not accumulated into .grad: every call does the same work.
        y = forward()
        torch.autograd.grad(y, inputs, torch.ones_like(y))

    main_first = timed_ms(forward, device)
    main_warm = statistics.median(timed_ms(forward, device) for _ in range(warm))
    fresh_first, fresh_second = [], []
    for _ in range(fresh):
        first, second = in_fresh_thread(lambda: (timed_ms(forward, device), timed_ms(forward, device)), device)
        fresh_first.append(first)
        fresh_second.append(second)
    with torch.autograd.set_multithreading_enabled(False):  # backward on this thread, as the trainer
        timed_ms(backward, device)  # this thread's first backward
        backward_warm = statistics.median(timed_ms(backward, device) for _ in range(warm))
    # A fresh thread that has run one forward (its forward cache warm): what its first backward
    # adds over a warm thread's is the backward's per-thread state.
    backward_fresh = [in_fresh_thread(lambda: (forward(), timed_ms(backward, device))[1], device) for _ in range(fresh)]
    return {
        "setting": label, "runnable": True, "kernel": kernel,
        "forward_main_first_ms": main_first, "forward_warm_ms": main_warm,
        "forward_fresh_thread_first_ms": statistics.median(fresh_first),
        "forward_fresh_thread_second_ms": statistics.median(fresh_second),
        "forward_fresh_thread_first_all_ms": fresh_first,
        "fwd_bwd_warm_ms": backward_warm,
        "fwd_bwd_fresh_thread_ms": statistics.median(backward_fresh),
    }


def measure(setting: str, shape: tuple, device: torch.device, dtype: torch.dtype, fresh: int, warm: int) -> dict:
    use_kernels(setting)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    try:
        chosen = BACKEND_NAMES.get(torch._fused_sdp_choice(q, k, v, is_causal=True), "unknown")
    except RuntimeError as e:
        return {"setting": setting, "runnable": False, "reason": str(e).splitlines()[0]}
    return measure_op(setting, chosen,
                      lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                      (q, k, v), device, fresh, warm)


def measure_linear_control(shape: tuple, device: torch.device, dtype: torch.dtype, fresh: int, warm: int) -> dict:
    """The same steps on the block's MLP up-projection (a GEMM, no cuDNN): what a fresh thread pays
    that is not attention's (cuBLAS handles come from a pool that threads hand back)."""
    batch, heads, positions, head_dim = shape
    hidden = heads * head_dim
    x = torch.randn(batch * positions, hidden, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(4 * hidden, hidden, device=device, dtype=dtype, requires_grad=True)
    return measure_op("control: linear", "gemm", lambda: torch.nn.functional.linear(x, w), (x, w), device, fresh,
                      warm)


def line(r: dict) -> str:
    if not r["runnable"]:
        return f"{r['setting']}: cannot run this shape ({r['reason']})"
    ratio = r["forward_fresh_thread_first_ms"] / max(r["forward_warm_ms"], 1e-6)
    return (f"{r['setting']} (kernel {r['kernel']}): forward on a fresh thread {r['forward_fresh_thread_first_ms']:.2f} ms "
            f"vs warm {r['forward_warm_ms']:.2f} ms ({ratio:.1f}x; its second call "
            f"{r['forward_fresh_thread_second_ms']:.2f} ms; this setting's first call on the main thread "
            f"{r['forward_main_first_ms']:.2f} ms) | "
            f"forward+backward on a fresh thread after one forward {r['fwd_bwd_fresh_thread_ms']:.2f} ms vs warm "
            f"{r['fwd_bwd_warm_ms']:.2f} ms")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test on a small shape)")
    p.add_argument("--fresh-threads", type=int, default=3, help="fresh threads per measurement (median)")
    p.add_argument("--warm-calls", type=int, default=5, help="warm calls per measurement (median)")
    p.add_argument("--output", help="also write the JSON here")
    args = p.parse_args()
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but torch sees no CUDA device (use --device cpu for the smoke test)", file=sys.stderr)
        return 2
    device = cuda_device(args.device)
    if device.type == "cuda":
        shape, dtype = (2, 16, 1024, 64), torch.bfloat16
    else:
        shape, dtype = (2, 4, 64, 16), torch.float32
    settings = ["auto"] + [k for k in KERNELS if device.type == "cuda" or k in ("flash", "math")]
    results = [measure(s, shape, device, dtype, args.fresh_threads, args.warm_calls) for s in settings]
    use_kernels("auto")
    results.append(measure_linear_control(shape, device, dtype, args.fresh_threads, args.warm_calls))
    doc = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
           "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "causal": True, "results": results}
    for r in results:
        print(line(r))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

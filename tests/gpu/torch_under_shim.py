#!/usr/bin/env python3
"""PyTorch 2.11 under libgpu_scheduler.so: every kind of launch a real training job makes.

Phases, each built in setup() and then run once as warm-up and once measured:
  train_step_bf16_cublaslt  Linear-GELU-Linear, bf16 autocast, backward, AdamW step, with
                            cuBLASLt as the preferred BLAS (bf16 GEMMs with bias epilogues)
  cudnn_conv                Conv2d forward + backward through cuDNN (deterministic algorithms)
  triton_compiled           a torch.compile'd pointwise function (a Triton kernel on GPU, launched
                            through dlsym(libcuda, "cuLaunchKernelEx"))
  cuda_graph_replay         a captured graph (torch.cuda.graphs) replayed 3 times (GPU only)
  nccl_allreduce            all_reduce in a one-rank NCCL process group (Gloo on CPU)

Writes JSON: per phase a SHA-256 of the results (bitwise comparison of a run with and without
the shim), the kernels torch.profiler recorded in the measured run (Chrome-trace events of
category "kernel", i.e. CUPTI kernel records: graph-launched kernels appear one by one), and,
when the shim is loaded, the ops it scheduled in the measured run, by kind, from its trace
(tests/gpu/shim_counters.py; needs ORION_TRACE). A phase's count is right when the shim's
"kernel" ops == profiler kernels and it saw no graph launch (graph phase: "graph_launch" ops ==
replays, no kernel ops, and profiler kernels == replays x the kernels of one eager run of the
graph's body).

    python3 tests/gpu/torch_under_shim.py --output no_shim.json
    LD_PRELOAD=build-gpu/intercept/libgpu_scheduler.so USE_ORION_SCHEDULER=1 \\
        ORION_TRACE=/tmp/orion_trace.json python3 tests/gpu/torch_under_shim.py --output shim.json
    python3 tests/gpu/torch_under_shim.py --compare no_shim.json shim.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import shim_counters  # noqa: E402

GRAPH_REPLAYS = 3


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def seeded(device: torch.device, *shape: int, seed: int) -> torch.Tensor:
    # Drawn on the CPU so the values do not depend on the device's generator.
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


# --- phases: setup(device) -> run() -> list of result tensors ---------------------------------

def setup_train_step(device):
    if device.type == "cuda":
        torch.backends.cuda.preferred_blas_library("cublaslt")

    def run():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(approximate="tanh"), nn.Linear(1024, 256)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        x = seeded(device, 64, 256, seed=1)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return [loss, *model.parameters()]
    return run


def setup_conv(device):
    if device.type == "cuda" and not torch.backends.cudnn.is_available():
        raise RuntimeError("cuDNN is not available to this torch build: the conv phase needs it")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True

    def run():
        torch.manual_seed(0)
        conv = nn.Conv2d(16, 32, kernel_size=3, padding=1).to(device)
        x = seeded(device, 8, 16, 32, 32, seed=2).requires_grad_()
        out = conv(x)
        out.square().mean().backward()
        return [out, x.grad, conv.weight.grad]
    return run


def setup_triton(device):
    @torch.compile(fullgraph=True)
    def fused(a, b):
        return torch.nn.functional.gelu(a) * b + a.sin()

    a, b = seeded(device, 4096, seed=3), seeded(device, 4096, seed=4)
    return lambda: [fused(a, b)]


def setup_graph(device):
    if device.type != "cuda":
        return None  # CUDA graphs need a GPU
    x, w = seeded(device, 128, 128, seed=5), seeded(device, 128, 128, seed=6)

    def body():
        return (x @ w).relu() + 1.0

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up the body outside capture, as the docs ask
        body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()
    torch.cuda.synchronize()
    eager_kernels = count_profiled_kernels(body, device)[1]

    def run():
        for _ in range(GRAPH_REPLAYS):
            graph.replay()
        return [out]
    run.graph_kernels_per_replay = eager_kernels
    return run


def setup_allreduce(device):
    backend = "nccl" if device.type == "cuda" else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device())
                            if device.type == "cuda" else None)
    t = seeded(device, 1 << 16, seed=7)

    def run():
        y = t.clone()
        dist.all_reduce(y)
        return [y]
    return run


PHASES = {
    "train_step_bf16_cublaslt": setup_train_step,
    "cudnn_conv": setup_conv,
    "triton_compiled": setup_triton,
    "cuda_graph_replay": setup_graph,
    "nccl_allreduce": setup_allreduce,
}


# --- measurement --------------------------------------------------------------------------------

def count_profiled_kernels(run, device):
    """Runs `run` under torch.profiler; returns (its result, kernels recorded on the GPU)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        result = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text()).get("traceEvents", [])
    return result, sum(1 for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


def measure(name, setup, device, shim, time_iterations=0):
    run = setup(device)
    if run is None:
        return {"skipped": f"{name} needs a CUDA device"}
    run()  # warm-up: compilation, autotuning, handles, communicators
    if device.type == "cuda":
        torch.cuda.synchronize()
    before = shim.read() if shim else None
    result, kernels = count_profiled_kernels(run, device)
    after = shim.read() if shim else None
    out = {"sha256": digest(result), "profiler_kernels": kernels if device.type == "cuda" else None}
    if time_iterations > 0:
        # Wall time per run, the GPU drained at both ends: what the shim's interception costs.
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(time_iterations):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out["ms_per_run"] = (time.perf_counter() - t0) * 1e3 / time_iterations
    if before is not None:
        seen = shim_counters.delta(after, before)
        launches, graphs = seen.get("kernel", 0), seen.get("graph_launch", 0)
        out.update(shim_kernel_launches=launches, shim_graph_launches=graphs, shim_ops=seen)
        per_replay = getattr(run, "graph_kernels_per_replay", None)
        if per_replay is not None:
            out["graph_kernels_per_replay"] = per_replay
            out["count_ok"] = (graphs == GRAPH_REPLAYS and launches == 0
                               and kernels == GRAPH_REPLAYS * per_replay)
        else:
            out["count_ok"] = launches == kernels and graphs == 0
    return out


def compare(a_path: str, b_path: str) -> int:
    """Exit 0 when every phase's results are bitwise equal and the shim run's counts are right."""
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    failures, notes = [], []
    for name in dict.fromkeys([*a["phases"], *b["phases"]]):
        pa, pb = a["phases"].get(name, {}), b["phases"].get(name, {})
        if "skipped" in pa or "skipped" in pb:
            notes.append(f"{name}: skipped ({pa.get('skipped') or pb.get('skipped')})")
            continue
        if pa.get("sha256") != pb.get("sha256"):
            failures.append(f"{name}: results differ")
        if pa.get("profiler_kernels") != pb.get("profiler_kernels"):
            # The shim must not add, drop or split kernels: the GPU ran the same work.
            failures.append(f"{name}: the profiler saw {pa.get('profiler_kernels')} vs "
                            f"{pb.get('profiler_kernels')} kernels")
        shim_run = pb if "count_ok" in pb else pa if "count_ok" in pa else None
        if shim_run is None:
            if a.get("shim_loaded") or b.get("shim_loaded"):
                failures.append(f"{name}: no shim counts")
            continue
        counts = (f"shim {shim_run['shim_kernel_launches']} kernels/{shim_run['shim_graph_launches']} graphs"
                  f" vs profiler {shim_run['profiler_kernels']} kernels")
        (notes if shim_run["count_ok"] else failures).append(f"{name}: {counts}")
    if not (a.get("shim_loaded") or b.get("shim_loaded")):
        failures.append("neither run had the shim loaded (LD_PRELOAD libgpu_scheduler.so)")
    print("; ".join(failures + notes) or "no phases")
    return 1 if failures else 0


def timing(reference_path: str, other_path: str) -> int:
    """Per phase, ms per run of OTHER against REFERENCE (e.g. the shim in pass-through against no
    shim), and over all phases; a figure (exit 0), 2 when a run was not timed."""
    a, b = json.loads(Path(reference_path).read_text()), json.loads(Path(other_path).read_text())
    rows, total_a, total_b = [], 0.0, 0.0
    for name, pa in a["phases"].items():
        pb = b["phases"].get(name, {})
        if "ms_per_run" not in pa or "ms_per_run" not in pb:
            if "skipped" in pa or "skipped" in pb:
                continue
            print(f"{name}: not timed in both runs (--time-iterations)")
            return 2
        total_a += pa["ms_per_run"]
        total_b += pb["ms_per_run"]
        rows.append(f"{name} {pb['ms_per_run'] / pa['ms_per_run']:.3f}")
    if not rows:
        print("no timed phase")
        return 2
    print(f"all phases {total_b / total_a:.3f} ({total_b:.2f} vs {total_a:.2f} ms per round); " + ", ".join(rows))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset of the phases")
    p.add_argument("--output", help="write the JSON result here (default: stdout only)")
    p.add_argument("--compare", nargs=2, metavar=("NO_SHIM_JSON", "SHIM_JSON"))
    p.add_argument("--time-iterations", type=int, default=0, help="also time each phase over this many runs")
    p.add_argument("--timing", nargs=2, metavar=("REFERENCE_JSON", "OTHER_JSON"),
                   help="print OTHER's time per phase against REFERENCE's")
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.timing:
        return timing(*args.timing)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          args.device if args.device != "auto" else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch sees no GPU")
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        sys.exit(f"error: unknown phase(s) {sorted(unknown)}; known: {', '.join(PHASES)}")
    torch.use_deterministic_algorithms(True, warn_only=True)
    shim = shim_counters.ShimCounters.if_loaded()
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch_version": torch.__version__, "shim_loaded": shim is not None, "phases": {}}
    try:
        for name in args.phases.split(","):
            result["phases"][name] = measure(name, PHASES[name], device, shim, args.time_iterations)
            print(f"{name}: {result['phases'][name]}", file=sys.stderr, flush=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    text = json.dumps(result, indent=1, sort_keys=True)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

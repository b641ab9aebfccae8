"""model.attention's kernels in Python, as trainer/model/attention_backend.cpp sets them in C++:
torch's process-wide SDPA switch of each kernel, and the numbers torch._fused_sdp_choice answers
with (at::SDPBackend). Shared by the peers (bench_common.py) and tests/gpu/sdpa_threads.py."""
import torch

KERNELS = {"flash": "flash_sdp", "efficient": "mem_efficient_sdp", "cudnn": "cudnn_sdp", "math": "math_sdp"}
BACKEND_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def use_kernels(setting: str) -> None:
    """auto: PyTorch's default set; a kernel's name: that kernel alone."""
    for name, switch in KERNELS.items():
        getattr(torch.backends.cuda, "enable_" + switch)(setting in ("auto", name))

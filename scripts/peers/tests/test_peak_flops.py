"""bench_common.peak_bf16_flops_for_name: the peers' MFU peak, by the same rules and figures as
gpipe_runner's peak_flops_for_device_name (tests/trainer/test_metrics.cpp pins the same names)."""
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_common import peak_bf16_flops_for_name  # noqa: E402


class PeakFlopsTest(unittest.TestCase):
    def test_the_runners_figures(self):
        for name, peak in [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H200", 989e12), ("NVIDIA H100 PCIe", 756e12),
                           ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA H800 PCIe", 756e12),
                           ("NVIDIA GH200 480GB", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12)]:
            self.assertEqual(peak_bf16_flops_for_name(name), peak, name)
        self.assertIsNone(peak_bf16_flops_for_name("cpu"))


if __name__ == "__main__":
    unittest.main()

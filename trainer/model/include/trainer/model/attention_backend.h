// model.attention: which of ATen's kernels at::scaled_dot_product_attention may use, and which
// one it will pick for the model's attention on the run's device and dtype.
//
// Why the trainer names it: on an H100 with cuDNN >= 9.15 PyTorch picks cuDNN's attention first,
// and ATen keeps cuDNN's built attention graphs in thread_local caches (aten/src/ATen/native/
// cudnn/MHA.cpp), one for forward and one for backward. A CPU thread's first forward and first
// backward each pay a graph build (the executors run backward on the rank's own thread,
// trainer/execution/action_runner.h); an executor that made its threads per step paid them every
// step. The run log and summary.json say which kernel ran, so a GPU figure can be read with it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "trainer/model/interfaces.h"

namespace gpipe {

// Sets ATen's process-wide SDPA switches for `setting` (auto | flash | efficient | cudnn | math):
// "auto" enables PyTorch's default set, any other name enables that kernel alone. Throws
// ConfigError naming model.attention for another value.
void use_attention_backend(const std::string& setting);

// The kernel ATen will run for `shape` (one sample, gradients on) on `device` in `dtype` under the
// current switches: "flash", "efficient", "cudnn", "math" (or "overrideable"). Throws ConfigError
// naming model.attention, the device and dtype, with ATen's reasons, when none can run it.
std::string chosen_attention_backend(const std::string& setting, const AttentionShape& shape, c10::Device device,
                                     at::ScalarType dtype);

// Both: switches set, then the kernel chosen (the trainer calls this before building stages, the
// planner before measuring). A refusal leaves the switches as they were.
std::string select_attention_backend(const std::string& setting, const AttentionShape& shape, c10::Device device,
                                     at::ScalarType dtype);

}  // namespace gpipe

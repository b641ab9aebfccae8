// The LibTorch headers precompiled once for every LibTorch translation unit of the trainer,
// the models, gpipe_runner and their tests (ourgpipe_use_torch_pch in trainer/CMakeLists.txt).
// Parsing these costs 10 to 15 s per translation unit; loading them precompiled well under one.
// Only headers that many units include, and nothing CUDA-specific (the CPU and CUDA builds
// share this list). Sources still include what they use: the list is a build speed-up, never
// a dependency.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

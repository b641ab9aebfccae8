// AdamW through ATen's fused multi-tensor kernel. torch::optim::AdamW::step() loops over the
// parameters in C++ and launches about ten kernels per parameter (thousands per step for a GPT);
// _fused_adamw_ updates every parameter of a (device, dtype) group in one launch on CUDA and in
// one vectorised pass on CPU. The state stays in the optimizer's own AdamWParamState objects, so
// torch::optim serialisation (checkpoints) and the LR schedule (group options) are unchanged.
#pragma once

#include <torch/optim/adamw.h>

namespace gpipe {

// One AdamW step for every parameter of `optimizer` that has a gradient: the same update as
// optimizer.step() (decoupled weight decay, bias correction, amsgrad when the group asks for it),
// with each group's lr, betas, eps and weight decay. Creates missing state as step() would.
// `keep_autograd_versions`: write the parameters through variable_data() (same storage, not the
// parameters' autograd version counter), for asynchronous pipelines whose in-flight micro-batches'
// graphs saved these parameters and run their backward after this update (weight_stash.h).
void fused_adamw_step(torch::optim::AdamW& optimizer, bool keep_autograd_versions = false);

}  // namespace gpipe

// The synthetic model's layers (model.name: synthetic): each waits instead of computing. Forward
// takes synthetic.forward_ms and keeps synthetic.activation_bytes_per_token x tokens until its
// backward; the input gradient takes synthetic.input_grad_ms and the weight gradient
// synthetic.weight_grad_ms, as separate autograd nodes. Under a zero-bubble schedule the I call
// runs with a WeightGradStore::Defer active: the weight-gradient waits are deferred to the store
// and run at W (flush), as split_linear's GEMMs are.
// Waiting rather than computing makes a step's time independent of the cores: schedules, the
// simulator and the planner can be studied on a 2-core machine. On CUDA tensors the waits are
// spin kernels on the current stream (at::cuda::sleep), so they occupy the GPU's timeline as a
// kernel would; on CPU the calling thread sleeps.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>

#include "common/layered_model.h"
#include "trainer/config/config.h"

namespace gpipe::synthetic {

// How often each part ran, for tests (process-wide, all layers).
struct Counters {
  std::atomic<int64_t> forwards{0};
  std::atomic<int64_t> input_grads{0};
  std::atomic<int64_t> weight_grads{0};
  std::atomic<int64_t> activations_held{0};  // forward done, its backward not yet
};
Counters& counters();

// One layer: out = wait_forward(x) + weight_term(weight), hidden states [B, T, H] in and out. The
// first layer (index 0) takes token ids [B, T] and makes hidden states of zeros; the weight term
// is zero-valued, so every layer's output is its input (the loss stays a constant of the data).
class SyntheticLayer final : public models::SequentialLayer {
 public:
  SyntheticLayer(const ModelConfig& config, bool takes_token_ids);
  at::Tensor forward(const at::Tensor& x) override;

 private:
  SyntheticLayerConfig timing_;
  int64_t hidden_size_;
  bool takes_token_ids_;
  at::Tensor weight_;  // [H]; its gradient is all zeros
};

// Waits `ms` milliseconds on `like`'s device (a spin kernel on the current CUDA stream, or a sleep).
void wait_ms(double ms, const at::Tensor& like);

}  // namespace gpipe::synthetic

// The synthetic model's layers: waits in place of compute, a held activation, and the input and
// weight gradients as separate autograd nodes (see synthetic_layers.h).
#include "synthetic_layers.h"

#include "trainer/model/weight_grad_store.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <cmath>
#include <thread>

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <ATen/cuda/Sleep.h>
#include <cuda_runtime_api.h>
#endif

namespace gpipe::synthetic {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The input path: forward waits and keeps the activation; backward waits the input-gradient time
// and passes the gradient through (the output is the input).
struct InputPath : torch::autograd::Function<InputPath> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double forward_ms, double input_grad_ms,
                            int64_t activation_bytes) {
    wait_ms(forward_ms, x);
    counters().forwards.fetch_add(1, std::memory_order_relaxed);
    ctx->saved_data["input_grad_ms"] = input_grad_ms;
    if (activation_bytes > 0) {
      // What a real layer keeps for its backward: freed when the node is (after backward).
      ctx->saved_data["activation"] = at::empty({activation_bytes}, x.options().dtype(at::kByte));
      counters().activations_held.fetch_add(1, std::memory_order_relaxed);
      ctx->saved_data["holds"] = true;
    }
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    wait_ms(ctx->saved_data["input_grad_ms"].toDouble(), grads[0]);
    counters().input_grads.fetch_add(1, std::memory_order_relaxed);
    if (ctx->saved_data.count("holds") != 0) {
      counters().activations_held.fetch_sub(1, std::memory_order_relaxed);
      ctx->saved_data.erase("activation");
      ctx->saved_data.erase("holds");
    }
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The weight path: a zero-valued term of the output's shape that depends on the weight only (the
// layer's input reaches it detached), so only a gradient for the weights runs its backward.
struct WeightPath : torch::autograd::Function<WeightPath> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& like,
                            double weight_grad_ms) {
    ctx->saved_data["weight_grad_ms"] = weight_grad_ms;
    ctx->saved_data["weight_size"] = weight.size(0);
    return at::zeros_like(like);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const double ms = ctx->saved_data["weight_grad_ms"].toDouble();
    at::Tensor like = grads[0];
    auto weight_gradient = [ms, like] {
      wait_ms(ms, like);
      counters().weight_grads.fetch_add(1, std::memory_order_relaxed);
    };
    // A zero-bubble schedule's I runs under a WeightGradStore::Defer: the wait is W's (flush()).
    if (WeightGradStore* store = WeightGradStore::deferring()) {
      store->add_task(weight_gradient);
    } else {
      weight_gradient();
    }
    // The gradient's value is zero either way (the weight term is zero-valued).
    return {at::zeros({ctx->saved_data["weight_size"].toInt()}, grads[0].options()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Counters& counters() {
  static Counters c;
  return c;
}

void wait_ms(double ms, const at::Tensor& like) {
  if (!(ms > 0)) return;
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (like.is_cuda()) {
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, like.get_device()) == cudaSuccess && khz > 0) {
      at::cuda::sleep(static_cast<int64_t>(ms * khz));  // clock64() cycles at the SM clock
      return;
    }
  }
#endif
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

SyntheticLayer::SyntheticLayer(const ModelConfig& config, bool takes_token_ids)
    : timing_(config.synthetic), hidden_size_(config.hidden_size), takes_token_ids_(takes_token_ids) {
  weight_ = register_parameter("weight", at::zeros({config.hidden_size}));
}

at::Tensor SyntheticLayer::forward(const at::Tensor& x) {
  at::Tensor hidden = x;
  if (takes_token_ids_) {
    // Token ids [B, T] -> hidden states [B, T, H] of zeros (the data does not matter).
    hidden = at::zeros({x.size(0), x.size(1), hidden_size_}, weight_.options());
  }
  const auto tokens = static_cast<double>(hidden.numel() / std::max<int64_t>(hidden_size_, 1));
  // Held only when a backward will free it (the first layer's zeros need no input gradient).
  const bool backward_follows = at::GradMode::is_enabled() && hidden.requires_grad();
  const auto bytes =
      backward_follows ? static_cast<int64_t>(std::llround(timing_.activation_bytes_per_token * tokens)) : 0;
  at::Tensor out = InputPath::apply(hidden, timing_.forward_ms, timing_.input_grad_ms, bytes);
  return out + WeightPath::apply(weight_, out.detach(), timing_.weight_grad_ms);
}

}  // namespace gpipe::synthetic

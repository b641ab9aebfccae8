// split_linear as a custom autograd function, and the store its backward defers weight GEMMs to.
#include "trainer/model/weight_grad_store.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace gpipe {
namespace {

thread_local WeightGradStore* t_deferred = nullptr;
thread_local WeightCastCache* t_weight_casts = nullptr;

// grad_output^T @ input over the flattened leading dimensions: [out, in].
at::Tensor weight_grad(const at::Tensor& input, const at::Tensor& grad_output) {
  return grad_output.reshape({-1, grad_output.size(-1)}).t().matmul(input.reshape({-1, input.size(-1)}));
}

at::Tensor bias_grad(const at::Tensor& grad_output) { return grad_output.reshape({-1, grad_output.size(-1)}).sum(0); }

// The gradient in the parameter's own dtype (fp32 weights under bf16 autocast).
at::Tensor like_param(const at::Tensor& grad, const at::Tensor& param) {
  return grad.scalar_type() == param.scalar_type() ? grad : grad.to(param.scalar_type());
}

// The bias travels as a list of zero or one tensor: Function::apply takes no undefined tensor.
struct SplitLinear : torch::autograd::Function<SplitLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            at::TensorList bias_list) {
    const at::Tensor bias = bias_list.empty() ? at::Tensor() : bias_list.front();
    // Under autocast the matmul runs in the low precision (as at::linear would); keep the cast
    // operands for backward. The cast is made here, not through autocast's weight cache: a cached
    // copy made without grad would cut the gradient of any other use of the weight.
    at::Tensor x = input, w = weight, b = bias;
    const auto device = input.device().type();
    if (at::autocast::is_autocast_available(device) && at::autocast::is_autocast_enabled(device)) {
      const auto dtype = at::autocast::get_autocast_dtype(device);
      auto cast = [&](const at::Tensor& t) { return t.defined() && t.is_floating_point() ? t.to(dtype) : t; };
      x = cast(input);
      if (t_weight_casts != nullptr) {
        w = t_weight_casts->get(weight, dtype);
        b = bias.defined() ? t_weight_casts->get(bias, dtype) : bias;
      } else {
        w = cast(weight);
        b = cast(bias);
      }
    }
    ctx->save_for_backward({x, w, weight, bias});
    return at::linear(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor& weight = saved[2];
    const at::Tensor& bias = saved[3];
    at::Tensor dy = grads[0];
    if (dy.scalar_type() != w.scalar_type()) dy = dy.to(w.scalar_type());
    const at::Tensor dx = ctx->needs_input_grad(0) ? dy.matmul(w) : at::Tensor();
    const bool want_w = ctx->needs_input_grad(1);
    const bool has_bias = bias.defined();
    const bool want_b = has_bias && ctx->needs_input_grad(2);
    torch::autograd::variable_list out{dx, at::Tensor()};
    if (has_bias) out.emplace_back();
    if (t_deferred != nullptr && (want_w || want_b)) {
      t_deferred->add(want_w ? weight : at::Tensor(), want_b ? bias : at::Tensor(), x, dy);
      return out;
    }
    if (want_w) out[1] = like_param(weight_grad(x, dy), weight);
    if (want_b) out[2] = like_param(bias_grad(dy), bias);
    return out;
  }
};

// Adds a gradient into param's .grad. A low-precision gradient adds into an fp32 .grad in one
// kernel (type promotion), without first making an fp32 copy of it.
void accumulate(const at::Tensor& param, const at::Tensor& grad) {
  at::Tensor& g = param.mutable_grad();
  if (g.defined()) {
    g.add_(grad);
  } else {
    g = grad.detach().to(param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }
}

}  // namespace

WeightCastCache::Use::Use(WeightCastCache& cache) : previous_(t_weight_casts) { t_weight_casts = &cache; }
WeightCastCache::Use::~Use() { t_weight_casts = previous_; }

at::Tensor WeightCastCache::get(const at::Tensor& param, at::ScalarType dtype) {
  if (!param.is_floating_point() || param.scalar_type() == dtype) return param;
  std::lock_guard<std::mutex> lock(mu_);
  auto& entry = copies_[param.unsafeGetTensorImpl()];
  if (entry.second.defined() && entry.second.scalar_type() == dtype) {
    ++hits_;
    return entry.second;
  }
  at::NoGradGuard no_grad;  // split_linear routes the gradient to the parameter itself
  entry = {param, param.to(dtype)};
  return entry.second;
}

std::size_t WeightCastCache::casts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copies_.size();
}

std::size_t WeightCastCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

WeightGradStore::Defer::Defer(WeightGradStore& store) : previous_(t_deferred) { t_deferred = &store; }
WeightGradStore::Defer::~Defer() { t_deferred = previous_; }

void WeightGradStore::add(at::Tensor weight, at::Tensor bias, at::Tensor input, at::Tensor grad_output) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(Entry{std::move(weight), std::move(bias), std::move(input), std::move(grad_output)});
}

void WeightGradStore::add_task(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
}

WeightGradStore* WeightGradStore::deferring() { return t_deferred; }

void WeightGradStore::flush(const std::function<void(const at::Tensor&)>& on_use) {
  std::vector<Entry> entries;
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.swap(entries_);
    tasks.swap(tasks_);
  }
  at::NoGradGuard no_grad;
  for (const Entry& e : entries) {
    if (on_use) {
      on_use(e.input);
      on_use(e.grad_output);
    }
    if (e.weight.defined()) accumulate(e.weight, weight_grad(e.input, e.grad_output));
    if (e.bias.defined()) accumulate(e.bias, bias_grad(e.grad_output));
  }
  for (const auto& task : tasks) task();
}

std::size_t WeightGradStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size() + tasks_.size();
}

void WeightGradStore::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  tasks_.clear();
}

at::Tensor split_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias) {
  std::vector<at::Tensor> bias_list;
  if (bias.defined()) bias_list.push_back(bias);
  return SplitLinear::apply(input, weight, at::TensorList(bias_list));
}

}  // namespace gpipe

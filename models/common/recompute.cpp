// Activation recomputation as one custom autograd node: forward runs the layers without grad
// (autograd::Function::apply disables grad mode) and saves only their input; backward re-runs
// them with grad and returns the gradients of the input and of every parameter, so both
// backward() and ZB-H1's split autograd::grad() calls work unchanged.
#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "common/layered_model.h"

namespace gpipe::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs besides the saved input; a capsule keeps it alive in the node.
struct RecomputedRun : torch::CustomClassHolder {
  std::vector<std::shared_ptr<SequentialLayer>> layers;
  std::vector<at::Tensor> parameters;  // those requiring grad, in a fixed order
  bool input_requires_grad = false;
  // Autocast as it was in forward: backward runs on autograd's thread, where it is off.
  at::DeviceType device_type = at::kCPU;
  bool autocast_enabled = false;
  at::ScalarType autocast_dtype = at::kFloat;
};

class AutocastRestore {
 public:
  AutocastRestore(at::DeviceType type, bool enabled, at::ScalarType dtype)
      : type_(type), was_enabled_(at::autocast::is_autocast_enabled(type)), was_dtype_(at::autocast::get_autocast_dtype(type)) {
    at::autocast::set_autocast_enabled(type_, enabled);
    at::autocast::set_autocast_dtype(type_, dtype);
    // Autocast keeps a per-thread cache of low-precision weight copies that only the outermost
    // scope clears. On CUDA this runs on autograd's device thread, where no scope of ours is open:
    // without nesting the cache would never be cleared and later steps would recompute with the
    // bf16 copies of step 0's weights. Count ourselves as a scope and clear when outermost.
    at::autocast::increment_nesting();
  }
  ~AutocastRestore() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, was_dtype_);
  }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  at::DeviceType type_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

at::Tensor run_layers(const std::vector<std::shared_ptr<SequentialLayer>>& layers, at::Tensor x) {
  for (const auto& layer : layers) x = layer->forward(x);
  return x;
}

struct RecomputeTail : torch::autograd::Function<RecomputeTail> {
  // Argument positions: 0 run (not a tensor), 1 input, 2.. parameters.
  static at::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<RecomputedRun> run, const at::Tensor& input,
                            at::TensorList /*parameters: inputs of this node so their grads flow*/) {
    ctx->save_for_backward({input});
    at::Tensor output = run_layers(run->layers, input);
    ctx->saved_data["run"] = c10::IValue::make_capsule(std::move(run));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto run = c10::static_intrusive_pointer_cast<RecomputedRun>(ctx->saved_data["run"].toCapsule());
    const at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(run->input_requires_grad);
    at::Tensor output;
    {
      AutocastRestore autocast(run->device_type, run->autocast_enabled, run->autocast_dtype);
      at::AutoGradMode grad_on(true);
      output = run_layers(run->layers, input);
    }
    std::vector<at::Tensor> wrt;
    if (run->input_requires_grad) wrt.push_back(input);
    wrt.insert(wrt.end(), run->parameters.begin(), run->parameters.end());
    const variable_list grads = torch::autograd::grad({output}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
    variable_list result;
    result.reserve(2 + run->parameters.size());
    result.emplace_back();  // run
    size_t next = 0;
    result.push_back(run->input_requires_grad ? grads[next++] : at::Tensor());
    for (size_t i = 0; i < run->parameters.size(); ++i) result.push_back(grads[next++]);
    return result;
  }
};

}  // namespace

int64_t recomputed_block_count(double ratio, int64_t blocks) {
  if (!(ratio >= 0.0 && ratio <= 1.0)) {
    throw std::invalid_argument("recompute ratio " + std::to_string(ratio) + " is outside [0, 1] (parallel.recompute_ratio)");
  }
  // The epsilon keeps 0.5 * 4 from becoming 3 through rounding noise in the ratio.
  return std::min<int64_t>(blocks, static_cast<int64_t>(std::ceil(ratio * static_cast<double>(blocks) - 1e-9)));
}

at::Tensor run_recomputed(const std::vector<std::shared_ptr<SequentialLayer>>& layers, const at::Tensor& input) {
  if (!at::GradMode::is_enabled()) return run_layers(layers, input);
  auto run = c10::make_intrusive<RecomputedRun>();
  run->layers = layers;
  for (const auto& layer : layers) {
    for (const auto& parameter : layer->parameters()) {
      if (parameter.requires_grad()) run->parameters.push_back(parameter);
    }
  }
  run->input_requires_grad = input.requires_grad();
  if (!run->input_requires_grad && run->parameters.empty()) return run_layers(layers, input);
  run->device_type = input.device().type();
  run->autocast_enabled = at::autocast::is_autocast_enabled(run->device_type);
  run->autocast_dtype = at::autocast::get_autocast_dtype(run->device_type);
  const std::vector<at::Tensor> parameters = run->parameters;
  return RecomputeTail::apply(std::move(run), input, at::TensorList(parameters));
}

}  // namespace gpipe::models

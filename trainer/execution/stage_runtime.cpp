// StageRuntime: the compute half of a pipeline stage. Gradients for I and W use
// torch::autograd::grad with explicit inputs, so I computes only the input gradient and W only
// the weight gradients (W walks the retained graph a second time: correctness first).
#include "trainer/execution/stage_runtime.h"

#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <stdexcept>

#include "trainer/device/device.h"

namespace gpipe {

StageRuntime::StageRuntime(StageSpec spec, std::shared_ptr<StageModule> module, const StageInterface& stage_interface,
                           c10::Device device, int num_microbatches)
    : spec_(spec), module_(std::move(module)), stage_interface_(stage_interface), device_(device),
      num_microbatches_(num_microbatches) {
  if (!module_) throw std::invalid_argument(fmt::format("stage {}: create_sub_model returned no module", spec_.stage));
  if (num_microbatches_ < 1) throw std::invalid_argument("num_microbatches must be >= 1");
  module_->to(device_);
  module_->train();
}

std::vector<at::Tensor> StageRuntime::parameters() const { return module_->parameters(); }

StageRuntime::Stash& StageRuntime::stash_for(int microbatch, const char* action) {
  auto it = stash_.find(microbatch);
  if (it == stash_.end()) {
    throw std::logic_error(fmt::format("stage {}: {} of micro-batch {} before its forward (schedule order bug)",
                                       spec_.stage, action, microbatch));
  }
  return it->second;
}

at::Tensor StageRuntime::forward(int microbatch, const Batch& batch, const at::Tensor& activation) {
  if (stash_.count(microbatch)) {
    throw std::logic_error(fmt::format("stage {}: forward of micro-batch {} ran twice", spec_.stage, microbatch));
  }
  Stash stash;
  if (spec_.is_first()) {
    stash.input = stage_interface_.prepare_input(batch).to(device_);
  } else {
    if (!activation.defined()) {
      throw std::logic_error(fmt::format("stage {}: forward of micro-batch {} has no input activation "
                                         "(the schedule lacks its receive)", spec_.stage, microbatch));
    }
    // A leaf of this stage's graph: backward stops here and leaves the gradient to send back.
    stash.input = activation.to(device_).detach().requires_grad_(activation.is_floating_point());
  }
  at::Tensor out = module_->forward(stash.input);
  at::Tensor result;
  if (spec_.is_last()) {
    Batch on_device{batch.input_ids.to(device_), batch.targets.to(device_)};
    at::Tensor loss = stage_interface_.compute_loss(out, on_device);
    losses_.push_back(loss.detach());
    stash.output = loss / static_cast<double>(num_microbatches_);
    result = loss.detach();
  } else {
    stash.output = out;
    result = out.detach();
  }
  stash_.emplace(microbatch, std::move(stash));
  return result;
}

at::Tensor StageRuntime::on_stage_device(const at::Tensor& tensor) const {
  // A gradient received from a neighbour on another device (ranks on cuda:(r % N), or a CPU
  // transport buffer) must reach autograd on this stage's device, as forward's input does: the
  // engine rejects a root gradient on another device than its output.
  return tensor.device() == device_ ? tensor : tensor.to(device_, /*non_blocking=*/true);
}

at::Tensor StageRuntime::take_input_grad(Stash& stash, const at::Tensor& output_grad) {
  if (spec_.is_first() || !stash.input.requires_grad()) return {};
  auto grads = torch::autograd::grad({stash.output}, {stash.input}, {output_grad},
                                     /*retain_graph=*/true, /*create_graph=*/false, /*allow_unused=*/true);
  return grads.at(0);
}

at::Tensor StageRuntime::backward(int microbatch, const at::Tensor& output_grad) {
  Stash& stash = stash_for(microbatch, "B");
  if (!spec_.is_last() && !output_grad.defined()) {
    throw std::logic_error(fmt::format("stage {}: backward of micro-batch {} has no output gradient "
                                       "(the schedule lacks its receive)", spec_.stage, microbatch));
  }
  const at::Tensor grad = spec_.is_last() ? at::Tensor() : on_stage_device(output_grad);
  torch::autograd::backward({stash.output}, {grad});
  at::Tensor input_grad = (spec_.is_first() || !stash.input.requires_grad()) ? at::Tensor() : stash.input.grad();
  stash_.erase(microbatch);
  return input_grad;
}

at::Tensor StageRuntime::backward_input(int microbatch, const at::Tensor& output_grad) {
  Stash& stash = stash_for(microbatch, "I");
  if (stash.input_grad_done) {
    throw std::logic_error(fmt::format("stage {}: I of micro-batch {} ran twice", spec_.stage, microbatch));
  }
  if (!spec_.is_last() && !output_grad.defined()) {
    throw std::logic_error(fmt::format("stage {}: I of micro-batch {} has no output gradient", spec_.stage, microbatch));
  }
  stash.output_grad = spec_.is_last() ? at::Tensor() : on_stage_device(output_grad);
  stash.input_grad_done = true;
  return take_input_grad(stash, stash.output_grad);
}

void StageRuntime::backward_weight(int microbatch) {
  Stash& stash = stash_for(microbatch, "W");
  if (!stash.input_grad_done) {
    throw std::logic_error(fmt::format("stage {}: W of micro-batch {} before its I", spec_.stage, microbatch));
  }
  std::vector<at::Tensor> params;
  for (const auto& p : module_->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  if (!params.empty()) {
    auto grads = torch::autograd::grad({stash.output}, params, {stash.output_grad},
                                       /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      // Autograd made grads[i] on the stream of the forward op it belongs to (F(mb)'s) and made
      // this stream wait for it; the add below runs here, so the allocator must not hand its
      // memory back to F(mb)'s stream when grads dies, before this stream has read it.
      record_stream_use(grads[i]);
      at::Tensor& g = params[i].mutable_grad();
      if (g.defined()) {
        g.add_(grads[i]);
      } else {
        g = grads[i].detach().clone();
      }
    }
  }
  stash_.erase(microbatch);
}

double StageRuntime::loss_sum() const {
  double sum = 0;
  for (const auto& l : losses_) sum += l.item<double>();
  return sum;
}

void StageRuntime::begin_step() {
  if (!stash_.empty()) {
    throw std::logic_error(fmt::format("stage {}: {} micro-batch(es) still stashed from the previous step "
                                       "(a schedule without their backward)", spec_.stage, stash_.size()));
  }
  losses_.clear();
}

void StageRuntime::discard_step() {
  stash_.clear();
  losses_.clear();
}

void StageRuntime::zero_grad() {
  for (auto& p : module_->parameters()) {
    if (p.mutable_grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

}  // namespace gpipe

// StageRuntime: the compute half of a pipeline stage. B is one autograd backward; I is the same
// backward with split_linear's weight GEMMs deferred to a WeightGradStore, and W runs only those
// GEMMs (the zero-bubble split: no second walk of the graph, which I already freed).
#include "trainer/execution/stage_runtime.h"

#include <torch/csrc/autograd/autograd.h>

#include <fmt/format.h>

#include <optional>
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stash_.find(microbatch);
  if (it == stash_.end()) {
    throw std::logic_error(fmt::format("stage {}: {} of micro-batch {} before its forward (schedule order bug)",
                                       spec_.stage, action, microbatch));
  }
  return it->second;
}

void StageRuntime::erase_stash(int microbatch) {
  std::lock_guard<std::mutex> lock(mu_);
  stash_.erase(microbatch);
}

at::Tensor StageRuntime::forward(int microbatch, const Batch& batch, const at::Tensor& activation) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stash_.count(microbatch)) {
      throw std::logic_error(fmt::format("stage {}: forward of micro-batch {} ran twice", spec_.stage, microbatch));
    }
  }
  if (weight_stash_) weight_stash_->forward(microbatch);  // runs on the newest weights
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
  at::Tensor out;
  {
    std::optional<DropoutScope> dropout;
    if (dropout_origin_) dropout.emplace(dropout_origin_(microbatch));
    out = module_->forward(stash.input);
  }
  at::Tensor result;
  if (spec_.is_last()) {
    Batch on_device{batch.input_ids.to(device_), batch.targets.to(device_)};
    at::Tensor loss = stage_interface_.compute_loss(out, on_device);
    std::lock_guard<std::mutex> lock(mu_);
    losses_[microbatch] = loss.detach();
    stash.output = loss / (loss_divisor_ > 0 ? loss_divisor_ : static_cast<double>(num_microbatches_));
    result = loss.detach();
  } else {
    stash.output = out;
    result = out.detach();
  }
  std::lock_guard<std::mutex> lock(mu_);
  stash_.emplace(microbatch, std::move(stash));
  return result;
}

at::Tensor StageRuntime::on_stage_device(const at::Tensor& tensor) const {
  // A gradient received from a neighbour on another device (ranks on cuda:(r % N), or a CPU
  // transport buffer) must reach autograd on this stage's device, as forward's input does: the
  // engine rejects a root gradient on another device than its output.
  return tensor.device() == device_ ? tensor : tensor.to(device_, /*non_blocking=*/true);
}

at::Tensor StageRuntime::run_backward(Stash& stash, int microbatch, const at::Tensor& output_grad, const char* action,
                                      WeightGradStore* defer_to) {
  if (!spec_.is_last() && !output_grad.defined()) {
    throw std::logic_error(fmt::format("stage {}: {} of micro-batch {} has no output gradient (the schedule lacks "
                                       "its receive)", spec_.stage, action, microbatch));
  }
  const at::Tensor grad = spec_.is_last() ? at::Tensor() : on_stage_device(output_grad);
  {
    std::optional<WeightGradStore::Defer> defer;
    if (defer_to != nullptr) defer.emplace(*defer_to);
    torch::autograd::backward({stash.output}, {grad});
  }
  at::Tensor input_grad = (spec_.is_first() || !stash.input.requires_grad()) ? at::Tensor() : stash.input.grad();
  stash.input = at::Tensor();  // the graph is freed: nothing of it stays alive until W
  stash.output = at::Tensor();
  return input_grad;
}

at::Tensor StageRuntime::backward(int microbatch, const at::Tensor& output_grad) {
  Stash& stash = stash_for(microbatch, "B");
  if (!weight_stash_) {
    at::Tensor input_grad = run_backward(stash, microbatch, output_grad, "B", nullptr);
    erase_stash(microbatch);
    return input_grad;
  }
  // asp: the backward on the weights its forward used (stashing), the newest back afterwards.
  weight_stash_->begin_backward(microbatch);
  at::Tensor input_grad;
  try {
    input_grad = run_backward(stash, microbatch, output_grad, "B", nullptr);
  } catch (...) {
    weight_stash_->end_backward(microbatch);
    throw;
  }
  weight_stash_->end_backward(microbatch);
  erase_stash(microbatch);
  return input_grad;
}

void StageRuntime::enable_async(bool stashing) {
  weight_stash_ = std::make_unique<WeightStash>(module_->parameters(), stashing);
  loss_divisor_ = 1.0;
}

void StageRuntime::apply_update(const std::function<void()>& step) {
  if (!weight_stash_) throw std::logic_error("apply_update: the stage is not asynchronous (enable_async)");
  weight_stash_->before_update();
  step();
  // The step reads each gradient on this stream (the rank's backward stream), while autograd made
  // it on its forward's stream: freed unrecorded, the allocator would hand the memory to that
  // stream's next forward (another stage of this rank, not ordered after this update) before the
  // step has read it. CUDA only; a GPU check, not a CPU test, can show it.
  for (const auto& p : module_->parameters()) record_stream_use(p.grad());
  zero_grad();
  weight_stash_->after_update();
}

at::Tensor StageRuntime::backward_input(int microbatch, const at::Tensor& output_grad) {
  Stash& stash = stash_for(microbatch, "I");
  if (stash.input_grad_done) {
    throw std::logic_error(fmt::format("stage {}: I of micro-batch {} ran twice", spec_.stage, microbatch));
  }
  // The whole backward but split_linear's weight GEMMs, which wait in the store for W.
  stash.weight_grads = std::make_shared<WeightGradStore>();
  at::Tensor input_grad = run_backward(stash, microbatch, output_grad, "I", stash.weight_grads.get());
  stash.input_grad_done = true;
  return input_grad;
}

void StageRuntime::backward_weight(int microbatch) {
  Stash& stash = stash_for(microbatch, "W");
  if (!stash.input_grad_done) {
    throw std::logic_error(fmt::format("stage {}: W of micro-batch {} before its I", spec_.stage, microbatch));
  }
  // The stored tensors were made on F(mb)'s stream (autograd runs each node on its forward's
  // stream) and are read on this one: the allocator must not reuse them before this stream is done.
  stash.weight_grads->flush(record_stream_use);
  erase_stash(microbatch);
}

size_t StageRuntime::deferred_weight_grads(int microbatch) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stash_.find(microbatch);
  return it == stash_.end() || !it->second.weight_grads ? 0 : it->second.weight_grads->size();
}

double StageRuntime::loss_sum() const {
  std::lock_guard<std::mutex> lock(mu_);
  double sum = 0;
  for (const auto& [mb, l] : losses_) sum += l.item<double>();
  return sum;
}

double StageRuntime::loss_sum(int first_microbatch, int count) const {
  std::lock_guard<std::mutex> lock(mu_);
  double sum = 0;
  for (int mb = first_microbatch; mb < first_microbatch + count; ++mb) {
    auto it = losses_.find(mb);
    if (it == losses_.end()) {
      throw std::logic_error(fmt::format("stage {}: no loss of micro-batch {} was recorded this step", spec_.stage, mb));
    }
    sum += it->second.item<double>();
  }
  return sum;
}

void StageRuntime::begin_step() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stash_.empty()) {
    throw std::logic_error(fmt::format("stage {}: {} micro-batch(es) still stashed from the previous step "
                                       "(a schedule without their backward)", spec_.stage, stash_.size()));
  }
  losses_.clear();
}

void StageRuntime::discard_step() {
  if (weight_stash_) weight_stash_->reset_in_flight();
  std::lock_guard<std::mutex> lock(mu_);
  stash_.clear();
  losses_.clear();
}

void StageRuntime::zero_grad() {
  for (auto& p : module_->parameters()) {
    if (p.mutable_grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

}  // namespace gpipe

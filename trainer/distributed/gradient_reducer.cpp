// GradientReducer: a stage's bucketed gradient all-reduce over its replicas (gradient_reducer.h).
#include "trainer/distributed/gradient_reducer.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

#include <fmt/format.h>

#include "trainer/distributed/distributed.h"

namespace gpipe {
namespace {

class ProcessGroupCollective final : public ReplicaCollective {
 public:
  explicit ProcessGroupCollective(std::unique_ptr<ProcessGroup> group) : group_(std::move(group)) {}
  int size() const override { return group_->size(); }
  std::function<void()> start_sum(at::Tensor flat) override {
    auto pending = std::make_shared<ProcessGroup::Pending>(group_->start_all_reduce_sum(std::move(flat)));
    return [pending] { pending->wait(); };
  }

 private:
  std::unique_ptr<ProcessGroup> group_;
};

// Autograd calls it after adding a gradient into the parameter's .grad, on the thread (and, on
// CUDA, the stream) that ran the accumulation.
class AccumulatedHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  AccumulatedHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn_(); }

 private:
  std::function<void()> fn_;
};

}  // namespace

std::unique_ptr<ReplicaCollective> replica_collective(std::unique_ptr<ProcessGroup> group) {
  return std::make_unique<ProcessGroupCollective>(std::move(group));
}

GradientReducer::GradientReducer(std::string name, std::vector<at::Tensor> parameters,
                                 std::unique_ptr<ReplicaCollective> replicas, size_t bucket_bytes)
    : name_(std::move(name)), replicas_(std::move(replicas)) {
  for (auto& p : parameters) {
    if (p.requires_grad()) params_.push_back(p);
  }
  fired_.assign(params_.size(), 0);
  expected_.assign(params_.size(), 0);
  bucket_of_.assign(params_.size(), 0);
  // Reverse registration order: a backward produces the last layer's gradients first. A bucket
  // closes when it reaches bucket_bytes or the next parameter has another dtype or device.
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const bool fits = !buckets_.empty() && bytes < bucket_bytes &&
                      params_[buckets_.back().params.front()].scalar_type() == p.scalar_type() &&
                      params_[buckets_.back().params.front()].device() == p.device();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().params.push_back(k);
    buckets_.back().numel += p.numel();
    bytes += static_cast<size_t>(p.numel()) * p.element_size();
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (torch::autograd::impl::post_acc_grad_hooks(params_[k])) {
      throw std::logic_error(fmt::format("{}: parameter {} already has a post-accumulate-grad hook", name_, k));
    }
    torch::autograd::impl::set_post_acc_grad_hooks(params_[k],
                                                   std::make_unique<AccumulatedHook>([this, k] { on_accumulated(k); }));
  }
}

GradientReducer::~GradientReducer() {
  for (auto& p : params_) torch::autograd::impl::post_acc_grad_hooks(p).reset();
}

std::vector<std::vector<size_t>> GradientReducer::bucket_members() const {
  std::vector<std::vector<size_t>> members;
  for (const auto& b : buckets_) members.push_back(b.params);
  return members;
}

void GradientReducer::begin_last_backward() {
  std::fill(fired_.begin(), fired_.end(), 0);
  graph_changed_.clear();
  next_bucket_ = 0;
  started_early_ = 0;
  for (auto& b : buckets_) {
    b.flat = at::Tensor();
    b.wait = nullptr;
    b.remaining = 0;
    for (size_t k : b.params) b.remaining += expected_[k];
  }
  armed_ = true;
}

void GradientReducer::on_accumulated(size_t param) {
  if (!armed_) return;  // an earlier micro-batch's backward: more gradient is coming
  ++fired_[param];
  if (!learned_) return;
  if (fired_[param] > expected_[param]) {
    if (graph_changed_.empty()) {
      graph_changed_ = fmt::format("{}: parameter {} received {} gradient(s) in the stage's last backward, {} in the "
                                   "first step's; its bucket's all-reduce may have started before the last one "
                                   "(the stage's graph must be the same every step)",
                                   name_, param, fired_[param], expected_[param]);
    }
    return;
  }
  Bucket& bucket = buckets_[bucket_of_[param]];
  --bucket.remaining;
  if (bucket.hookable && bucket.remaining == 0) start_ready_buckets(false);
}

void GradientReducer::start_ready_buckets(bool all) {
  while (next_bucket_ < buckets_.size()) {
    Bucket& b = buckets_[next_bucket_];
    if (!all && !(b.hookable && b.remaining == 0)) return;
    if (!all) ++started_early_;
    start(b);
    ++next_bucket_;
  }
}

void GradientReducer::start(Bucket& bucket) {
  std::vector<at::Tensor> parts;
  for (size_t k : bucket.params) {
    const at::Tensor& p = params_[k];
    const at::Tensor& g = p.grad();
    // A parameter without a gradient here may have one on another replica: it joins with zeros.
    parts.push_back(g.defined() ? g.reshape({-1}) : at::zeros({p.numel()}, p.options()));
  }
  bucket.flat = at::cat(parts);
  bucket.wait = replicas_->start_sum(bucket.flat);
}

void GradientReducer::end_last_backward() {
  armed_ = false;
  if (!learned_) {
    expected_ = fired_;
    for (auto& b : buckets_) {
      b.hookable = true;
      for (size_t k : b.params) b.hookable = b.hookable && expected_[k] > 0;
    }
    learned_ = true;
  }
  if (!graph_changed_.empty()) throw std::runtime_error(graph_changed_);
  start_ready_buckets(true);
}

void GradientReducer::finish() {
  if (next_bucket_ != buckets_.size()) {
    throw std::logic_error(fmt::format("{}: the step ended with {} of {} gradient buckets not started (the executor "
                                       "never ran the stage's last backward)", name_, buckets_.size() - next_bucket_,
                                       buckets_.size()));
  }
  const double replicas = static_cast<double>(replicas_->size());
  for (auto& b : buckets_) {
    b.wait();
    b.flat.div_(replicas);
    int64_t offset = 0;
    for (size_t k : b.params) {
      at::Tensor& p = params_[k];
      const at::Tensor mean = b.flat.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      if (p.grad().defined()) p.mutable_grad().copy_(mean);
      else p.mutable_grad() = mean.clone();
    }
    if (b.flat.is_cuda()) {
      // Made on the backward's stream, read here on this thread's: the allocator must not hand
      // the memory back to the backward's stream before these copies ran.
      b.flat.record_stream(c10::impl::VirtualGuardImpl(b.flat.device().type()).getStream(b.flat.device()));
    }
    b.flat = at::Tensor();
    b.wait = nullptr;
  }
  next_bucket_ = 0;
}

void GradientReducer::discard() {
  armed_ = false;
  for (auto& b : buckets_) {
    b.flat = at::Tensor();
    b.wait = nullptr;
  }
  next_bucket_ = 0;
}

}  // namespace gpipe

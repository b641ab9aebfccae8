// TiedParameters: keeping the copies of tied parameters equal (tied_parameters.h).
#include "tied_parameters.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "trainer/distributed/distributed.h"
#include "trainer/execution/stage_runtime.h"

namespace gpipe {
namespace {

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

TiedParameters::TiedParameters(const ModelInterface& model, const std::vector<StageSpec>& specs,
                               const std::vector<std::unique_ptr<StageRuntime>>& stages, const Schedule& schedule,
                               const Placement& placement, ProcessGroup* replica_processes)
    : group_(replica_processes) {
  for (TiedParameter& tied : model.tied_parameters()) {
    if (tied.members.size() < 2) continue;  // nothing shared
    Group group;
    std::set<int> processes;
    for (size_t m = 0; m < tied.members.size(); ++m) {
      const TiedParameter::Member& member = tied.members[m];
      int stage = -1;
      for (const StageSpec& spec : specs) {
        if (member.layer >= spec.first_layer && member.layer < spec.last_layer) stage = spec.stage;
      }
      if (stage < 0 || static_cast<size_t>(stage) >= stages.size()) {
        throw std::logic_error(fmt::format("tied parameter '{}': no stage holds layer {}", tied.name, member.layer));
      }
      processes.insert(placement.process_of(schedule.rank_of_stage(stage)));
      const StageRuntime* runtime = stages[static_cast<size_t>(stage)].get();
      if (runtime == nullptr) continue;  // another process's stage
      const at::Tensor copy = runtime->module_ptr()->layer_parameter(member.layer, member.name);
      if (!copy.defined()) {
        throw std::logic_error(fmt::format(
            "tied parameter '{}': stage {} holds layer {} but its module does not return parameter '{}' from "
            "StageModule::layer_parameter(); a model with tied parameters must implement it",
            tied.name, stage, member.layer, member.name));
      }
      if (copy.sizes() != at::IntArrayRef(tied.shape)) {
        throw std::logic_error(fmt::format("tied parameter '{}': layer {}'s '{}' has shape {}, the group says {}",
                                           tied.name, member.layer, member.name, shape_text(copy.sizes()),
                                           shape_text(tied.shape)));
      }
      if (m == 0) group.owner_local = true;
      bool seen = false;
      for (const at::Tensor& other : group.copies) seen = seen || other.is_same(copy);
      if (!seen) group.copies.push_back(copy);
    }
    group.spans_processes = processes.size() > 1;
    // The owner's copy is copies[0] when local (member 0 is resolved first); the others are
    // left out of the norm. A process without the owner leaves all its copies out.
    for (size_t i = group.owner_local ? 1 : 0; i < group.copies.size(); ++i) {
      duplicates_.insert(group.copies[i].unsafeGetTensorImpl());
    }
    if (group.copies.size() > 1 || group.spans_processes) {
      group.tied = std::move(tied);
      groups_.push_back(std::move(group));
    }
  }
}

at::Tensor TiedParameters::total(const Group& group, const std::vector<at::Tensor>& parts) const {
  at::Tensor sum;
  for (const at::Tensor& part : parts) {
    if (!part.defined()) continue;
    if (!sum.defined()) sum = part.detach().clone();
    else sum.add_(part.detach().to(sum.device()));
  }
  if (!group.spans_processes) return sum;
  if (!group_) throw std::logic_error("a tied parameter spans processes but the trainer has no process group");
  // Every process joins, those without a copy (or without a gradient) with zeros.
  at::Tensor host = sum.defined() ? sum.to(at::kCPU).contiguous()
                                  : at::zeros(group.tied.shape, at::TensorOptions().dtype(
                                                                    group.copies.empty() ? at::kFloat
                                                                                         : group.copies.front().scalar_type()));
  group_->all_reduce_sum_in_place(host);
  if (group.copies.empty()) return {};
  return host.to(group.copies.front().device());
}

void TiedParameters::synchronize_values() {
  at::NoGradGuard no_grad;
  for (const Group& group : groups_) {
    // The owner's values: local when member 0 is here; else from the process that has it.
    std::vector<at::Tensor> parts;
    if (group.owner_local) parts.push_back(group.copies.front());
    const at::Tensor values = total(group, parts);
    for (const at::Tensor& copy : group.copies) {
      if (!copy.is_same(values)) copy.copy_(values);
    }
  }
}

void TiedParameters::reduce_gradients() {
  at::NoGradGuard no_grad;
  for (const Group& group : groups_) {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& copy : group.copies) grads.push_back(copy.grad());
    const at::Tensor sum = total(group, grads);
    if (!sum.defined()) continue;  // no copy here, or no gradient anywhere
    for (const at::Tensor& copy : group.copies) {
      at::Tensor grad = copy.grad();
      if (grad.defined()) grad.copy_(sum);
      else copy.mutable_grad() = sum.to(copy.device()).clone();
    }
  }
}

}  // namespace gpipe

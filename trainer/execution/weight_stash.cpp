#include "trainer/execution/weight_stash.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gpipe {

WeightStash::WeightStash(std::vector<at::Tensor> parameters, bool stashing)
    : params_(std::move(parameters)), stashing_(stashing) {}

std::vector<at::Tensor> WeightStash::snapshot() const {
  std::vector<at::Tensor> out;
  out.reserve(params_.size());
  for (const auto& p : params_) out.push_back(p.detach().clone());
  return out;
}

void WeightStash::write(const std::vector<at::Tensor>& values) {
  at::NoGradGuard no_grad;
  // variable_data(): the parameters' storage without their autograd version counter (see the header).
  for (size_t i = 0; i < params_.size(); ++i) params_[i].variable_data().copy_(values[i]);
}

void WeightStash::forward(int microbatch) {
  if (!in_flight_.emplace(microbatch, version_).second) {
    throw std::logic_error(fmt::format("weight stash: forward of micro-batch {} while it is in flight", microbatch));
  }
}

int WeightStash::forward_version(int microbatch) const {
  auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) {
    throw std::logic_error(fmt::format("weight stash: micro-batch {} has no forward in flight", microbatch));
  }
  return it->second;
}

void WeightStash::begin_backward(int microbatch) {
  const int v = forward_version(microbatch);
  if (!stashing_ || v == version_) return;
  auto it = copies_.find(v);
  if (it == copies_.end()) {
    throw std::logic_error(fmt::format("weight stash: version {} of micro-batch {} was not kept", v, microbatch));
  }
  newest_ = snapshot();
  write(it->second);
}

void WeightStash::end_backward(int microbatch) {
  if (!newest_.empty()) {
    write(newest_);
    newest_.clear();
  }
  in_flight_.erase(microbatch);
}

bool WeightStash::needed(int version) const {
  return std::any_of(in_flight_.begin(), in_flight_.end(), [&](const auto& e) { return e.second == version; });
}

void WeightStash::drop_unneeded() {
  for (auto it = copies_.begin(); it != copies_.end();) it = needed(it->first) ? std::next(it) : copies_.erase(it);
}

void WeightStash::before_update() {
  drop_unneeded();  // the backward that just ended may have been the last user of a version
  if (!stashing_ || copies_.count(version_) != 0) return;
  if (needed(version_)) copies_.emplace(version_, snapshot());
  most_held_ = std::max(most_held_, copies_.size());
}

void WeightStash::after_update() {
  ++version_;
  drop_unneeded();
}

void WeightStash::reset_in_flight() {
  if (!newest_.empty()) {
    write(newest_);
    newest_.clear();
  }
  in_flight_.clear();
  copies_.clear();
}

}  // namespace gpipe

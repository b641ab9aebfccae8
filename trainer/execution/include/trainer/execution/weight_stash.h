// Weight stashing for asynchronous pipelines (parallel.sync_mode: asp, PipeDream 1F1B-async): a
// stage updates its weights after every backward while other micro-batches are still in flight,
// and each of those must run its backward with the weights its forward used.
//
// How, without a second copy of the model: the parameters keep one storage, the newest version.
//  * An update (the optimizer) and every swap write through Tensor::variable_data(), an alias that
//    shares the storage but not autograd's version counter, so the graphs of micro-batches in
//    flight (which saved these parameters) do not fail "modified by an inplace operation".
//  * Before an update, a version that in-flight micro-batches still need is copied aside.
//  * Around a backward whose forward ran on an older version, that version's values are copied into
//    the parameters and the newest copied back afterwards (two copies per stale backward: the cost
//    of keeping every module's own parameter tensors, and recomputation, working unchanged).
// Without stashing (the comparison PipeDream makes) a backward simply sees the newest weights.
//
// One WeightStash per stage, used from the thread that runs the stage's F and B (the rank's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <vector>

namespace gpipe {

class WeightStash {
 public:
  WeightStash(std::vector<at::Tensor> parameters, bool stashing);

  bool stashing() const { return stashing_; }
  // Updates so far (the newest version's number).
  int version() const { return version_; }
  // F of `microbatch` runs now, on the newest version.
  void forward(int microbatch);
  // The version `microbatch`'s forward ran on (throws std::logic_error if it has none).
  int forward_version(int microbatch) const;
  // Around B of `microbatch`: its forward's version in the parameters (stashing), then the newest
  // back; after end_backward the micro-batch is no longer in flight.
  void begin_backward(int microbatch);
  void end_backward(int microbatch);
  // Around an update of the parameters (through variable_data()): keeps the newest version if an
  // in-flight micro-batch still needs it, then counts the update and drops unneeded copies.
  void before_update();
  void after_update();
  // Versions held aside now, and the most held at once so far.
  size_t held() const { return copies_.size(); }
  size_t most_held() const { return most_held_; }
  // A failed step: nothing is in flight any more, copies dropped, the newest values kept.
  void reset_in_flight();

 private:
  std::vector<at::Tensor> snapshot() const;
  bool needed(int version) const;  // by a micro-batch in flight
  void drop_unneeded();
  void write(const std::vector<at::Tensor>& values);

  std::vector<at::Tensor> params_;
  bool stashing_;
  int version_ = 0;
  std::map<int, int> in_flight_;                   // micro-batch -> its forward's version
  std::map<int, std::vector<at::Tensor>> copies_;  // version -> values, while needed
  std::vector<at::Tensor> newest_;                 // the newest values during a stale backward
  size_t most_held_ = 0;
};

}  // namespace gpipe

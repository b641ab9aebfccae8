// One virtual stage at run time: its sub-model, what it stashes per micro-batch between forward
// and backward, and one method per compute action (F, B, I, W). The last stage computes the loss,
// scaled by 1/num_microbatches so that accumulated gradients equal the full-batch mean's.
// A forward and a backward of different micro-batches may run at once on two threads (an
// overlapped pair); they share only the stash map and the losses, which a lock guards.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "trainer/execution/weight_stash.h"
#include "trainer/model/dropout.h"
#include "trainer/model/interfaces.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe {

class StageRuntime {
 public:
  // `stage_interface` (prepare_input / compute_loss) must outlive the runtime.
  StageRuntime(StageSpec spec, std::shared_ptr<StageModule> module, const StageInterface& stage_interface,
               c10::Device device, int num_microbatches);

  const StageSpec& spec() const { return spec_; }
  StageModule& module() { return *module_; }
  const std::shared_ptr<StageModule>& module_ptr() const { return module_; }
  c10::Device device() const { return device_; }
  std::vector<at::Tensor> parameters() const;

  // F: the first stage feeds prepare_input(microbatch), the others `activation` (the previous
  // stage's output, which this stage differentiates against). Returns what to send to the next
  // stage; on the last stage, returns the unscaled loss (detached) and keeps the scaled one.
  at::Tensor forward(int microbatch, const Batch& batch, const at::Tensor& activation);
  // B: full backward of `microbatch` (`output_grad` is ignored on the last stage). Returns the
  // gradient for the previous stage (undefined on the first) and frees the stash.
  at::Tensor backward(int microbatch, const at::Tensor& output_grad);
  // I: the backward without the weight GEMMs of split_linear layers (zero-bubble schedules):
  // returns the input gradient, accumulates the other parameters' gradients, keeps what those
  // GEMMs need in the micro-batch's WeightGradStore and frees the graph.
  at::Tensor backward_input(int microbatch, const at::Tensor& output_grad);
  // W: the deferred weight GEMMs of a micro-batch whose I ran; accumulates into .grad and frees
  // the stash.
  void backward_weight(int microbatch);
  // Deferred weight-gradient entries of `microbatch` waiting for its W (0 when none or no stash).
  size_t deferred_weight_grads(int microbatch) const;

  // Sum of the unscaled micro-batch losses since begin_step() (last stage only; 0 otherwise).
  double loss_sum() const;
  // The same over micro-batches [first_microbatch, first_microbatch + count) (one step of an asp
  // window); throws std::logic_error naming a micro-batch without a loss.
  double loss_sum(int first_microbatch, int count) const;
  int losses_recorded() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(losses_.size());
  }
  // Clears losses; throws std::logic_error if a previous step left micro-batches stashed.
  void begin_step();
  // Where the forward of micro-batch k (of this run of the schedule) draws its dropout masks
  // (trainer/model/dropout.h); unset, from the process's default generators.
  void set_dropout_origin(std::function<DropoutOrigin(int microbatch)> origin) { dropout_origin_ = std::move(origin); }
  void zero_grad();
  // Drops whatever a failed step left stashed (and its losses), so the next step can run.
  void discard_step();

  // Asynchronous pipelines (parallel.sync_mode: asp): the stage is updated after every backward,
  // each micro-batch's loss counts whole (not divided by the micro-batches: every micro-batch is
  // its own update), and with `stashing` every backward runs on its forward's weights
  // (weight_stash.h). Call once, before the first step.
  void enable_async(bool stashing);
  // asp, after B: `step` updates the parameters from their gradients (through variable_data(), as
  // fused_adamw_step(..., /*keep_autograd_versions=*/true) does); then the gradients are cleared
  // and the version counted.
  void apply_update(const std::function<void()>& step);
  const WeightStash* weight_stash() const { return weight_stash_.get(); }
  size_t stashed_microbatches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stash_.size();
  }

 private:
  std::unique_ptr<WeightStash> weight_stash_;  // asp only
  std::function<DropoutOrigin(int)> dropout_origin_;
  double loss_divisor_ = 0;                    // 0: num_microbatches_ (bsp)

  struct Stash {
    at::Tensor input;        // requires grad on non-first stages
    at::Tensor output;       // activation, or the scaled loss on the last stage
    bool input_grad_done = false;
    // split_linear's inputs and output gradients, from I until W.
    std::shared_ptr<WeightGradStore> weight_grads;
  };
  // The micro-batch's stash (a map node: it stays put while other micro-batches come and go).
  Stash& stash_for(int microbatch, const char* action);
  void erase_stash(int microbatch);
  // B's and I's shared part: backward from the stash's output (with split_linear's weight GEMMs
  // deferred to `defer_to` when given), the input gradient returned and the graph released.
  at::Tensor run_backward(Stash& stash, int microbatch, const at::Tensor& output_grad, const char* action,
                          WeightGradStore* defer_to);
  // `tensor` on this stage's device (a copy when it arrived on another one).
  at::Tensor on_stage_device(const at::Tensor& tensor) const;

  StageSpec spec_;
  std::shared_ptr<StageModule> module_;
  const StageInterface& stage_interface_;
  c10::Device device_;
  int num_microbatches_;
  mutable std::mutex mu_;  // guards stash_ (the map, not its entries) and losses_
  std::map<int, Stash> stash_;
  std::map<int, at::Tensor> losses_;  // detached, unscaled, by micro-batch
};

}  // namespace gpipe

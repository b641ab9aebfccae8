// Replicated stages (parallel.data_parallel_size): one stage's gradient all-reduce over its
// replicas, DDP style. The stage's parameters go into buckets of about parallel.dp_bucket_mb, in
// reverse registration order (the order a backward produces them). During the stage's last
// backward of the step (the executor's before/after_last_gradient), each parameter's
// post-accumulate-grad hook counts down its bucket; a full bucket is flattened and its sum
// started at once, in bucket order (every replica starts the same collectives in the same
// order), while the backward goes on. After that action, the buckets not started yet start;
// finish() waits for all and writes the replicas' mean into each .grad.
//
// How many times a parameter's gradient is accumulated in that last action is learned in the
// first step (no bucket starts early then), as DDP's static_graph does: a parameter used twice
// (a weight tied within the stage) fires twice, one whose gradient a later W writes directly
// never fires, and its bucket waits for the end. A later step that fires a parameter more often
// than learned (the graph changed after its bucket started) is an error, never a silent stale sum.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gpipe {

class ProcessGroup;

// The sum GradientReducer runs over the stage's replicas: a ProcessGroup in a run, a fake in tests.
class ReplicaCollective {
 public:
  virtual ~ReplicaCollective() = default;
  virtual int size() const = 0;
  // Starts the in-place sum of `flat` over the replicas; the returned function waits for it.
  virtual std::function<void()> start_sum(at::Tensor flat) = 0;
};
std::unique_ptr<ReplicaCollective> replica_collective(std::unique_ptr<ProcessGroup> group);

class GradientReducer {
 public:
  // `parameters`: the stage's, in registration order (those without requires_grad are skipped).
  GradientReducer(std::string name, std::vector<at::Tensor> parameters, std::unique_ptr<ReplicaCollective> replicas,
                  size_t bucket_bytes);
  ~GradientReducer();  // removes the hooks
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // The executor's hooks, on the stage's rank thread.
  void begin_last_backward();
  void end_last_backward();
  // After the executor: waits for every bucket's sum and writes sum / replicas into each .grad.
  void finish();
  // A failed step: forgets what was started (the run is ending; the peers fail too).
  void discard();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Parameter indices (into the constructor's list) of each bucket, in start order.
  std::vector<std::vector<size_t>> bucket_members() const;
  // Buckets the last step started inside the last backward (overlapped with it), not after.
  int started_during_backward() const { return started_early_; }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    int64_t numel = 0;
    int remaining = 0;           // parameters still to fire their learned count this step
    bool hookable = false;       // every member fires in the last action (learned)
    at::Tensor flat;
    std::function<void()> wait;
  };
  void on_accumulated(size_t param);  // a parameter's post-accumulate-grad hook
  void start_ready_buckets(bool all);
  void start(Bucket& bucket);

  std::string name_;
  std::vector<at::Tensor> params_;
  std::vector<size_t> bucket_of_;     // param -> bucket
  std::vector<int> fired_, expected_;  // per param, this step / learned
  bool learned_ = false;
  bool armed_ = false;
  std::string graph_changed_;  // set by a hook that fired more than learned
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;  // buckets start in order
  int started_early_ = 0;
  std::unique_ptr<ReplicaCollective> replicas_;
};

}  // namespace gpipe

// The weight-gradient split of zero-bubble schedules (ZB-H1: backward = I, the gradient of the
// stage input, then later W, the gradients of the weights). A model that builds its linear layers
// with split_linear() lets the trainer run I without the weight GEMMs: while a
// WeightGradStore::Defer is active on the calling thread, split_linear's backward computes only the
// input gradient and leaves (input, output gradient) in the store; W runs just the weight GEMMs
// from it (flush). Outside a Defer, split_linear is an ordinary linear layer. Parameters of other
// layers (norms, embeddings) get their gradients at I, as do all of a model that does not use it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpipe {

class WeightGradStore {
 public:
  // Makes `store` the destination of split_linear's deferred weight gradients on the calling
  // thread (autograd runs backward there: the executors turn its worker threads off) until the
  // Defer dies; nests, restoring the previous destination.
  class Defer {
   public:
    explicit Defer(WeightGradStore& store);
    ~Defer();
    Defer(const Defer&) = delete;
    Defer& operator=(const Defer&) = delete;

   private:
    WeightGradStore* previous_;
  };

  // What split_linear's backward leaves behind: the weight's gradient is grad_output^T @ input
  // (flattened over the leading dimensions), the bias's the sum of grad_output.
  void add(at::Tensor weight, at::Tensor bias, at::Tensor input, at::Tensor grad_output);
  // Any other deferred weight-gradient work (the synthetic model's weight-gradient wait): run by
  // flush() after the GEMMs, counted by size().
  void add_task(std::function<void()> task);
  // The store the calling thread defers to (an active Defer), or nullptr.
  static WeightGradStore* deferring();
  // Runs every stored weight (and bias) gradient GEMM, adds the results into the parameters'
  // .grad (in the parameters' dtype), and empties the store. `on_use` is called with each stored
  // tensor first (the trainer tells the CUDA caching allocator that they are used on this stream).
  void flush(const std::function<void(const at::Tensor&)>& on_use = {});
  std::size_t size() const;
  void clear();

 private:
  struct Entry {
    at::Tensor weight, bias, input, grad_output;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<std::function<void()>> tasks_;
};

// Low-precision copies of parameters made once per step. Under bf16 autocast split_linear casts
// its weight and bias at every forward; with a cache active on the calling thread (a Use), a
// parameter is cast at its first forward of the step and that copy serves every later
// micro-batch. The copies live as long as the cache: keep it until the device work that reads them
// is done, and make a new one per step (the optimizer changes the weights in place). On CUDA the
// first forward casts on its own stream: later forwards on other streams must wait for it (the
// executor orders every forward of a stage after the step's first one).
class WeightCastCache {
 public:
  class Use {
   public:
    explicit Use(WeightCastCache& cache);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    WeightCastCache* previous_;
  };
  // `param` in `dtype`: the cached copy, or a new one (kept).
  at::Tensor get(const at::Tensor& param, at::ScalarType dtype);
  std::size_t casts() const;  // copies made
  std::size_t hits() const;   // copies reused

 private:
  mutable std::mutex mu_;
  // Parameter identity -> (parameter, copy); the parameter is held so its address is not reused.
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> copies_;
  std::size_t hits_ = 0;
};

// y = input @ weight^T + bias (bias may be undefined), as at::linear, bf16 autocast included; its
// backward defers the weight GEMMs to the active WeightGradStore (see above). Deferred weight
// gradients add into the parameters' .grad in their low precision (one add kernel, no fp32 copy).
at::Tensor split_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace gpipe

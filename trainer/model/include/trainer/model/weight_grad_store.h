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
};

// y = input @ weight^T + bias (bias may be undefined), as at::linear, bf16 autocast included; its
// backward defers the weight GEMMs to the active WeightGradStore (see above).
at::Tensor split_linear(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace gpipe

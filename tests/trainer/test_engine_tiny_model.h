// A tiny test-only language model behind the trainer's interfaces, so the engine tests do not
// depend on the GPT: embedding -> residual tanh-MLP blocks -> linear head, cross-entropy loss.
// Blocks can sleep a fixed time in forward and in backward: a cost model that does not compete
// for the CPU cores (used to measure the bubble fraction).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/AutogradState.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trainer/model/interfaces.h"

namespace gpipe::testing {

// Identity whose backward sleeps: the backward cost of a sleeping block.
struct SleepInBackward : torch::autograd::Function<SleepInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t ms) {
    ctx->saved_data["ms"] = ms;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx->saved_data["ms"].toInt()));
    return {grads[0], at::Tensor()};
  }
};

// Identity that records, in its backward, whether autograd could have handed the backward to its
// worker threads (the calling thread's multithreading setting, which the engine carries into the
// backward) and which thread ran it; its forward records the forward's thread.
struct BackwardThreadProbe : torch::autograd::Function<BackwardThreadProbe> {
  struct Log {
    std::mutex mu;
    std::vector<std::thread::id> forward_threads, backward_threads;
    int backward_calls = 0;
    int backward_calls_with_autograd_threads = 0;
  };
  static Log& log() {
    static Log instance;
    return instance;
  }
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    std::lock_guard<std::mutex> lock(log().mu);
    log().forward_threads.push_back(std::this_thread::get_id());
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list grads) {
    std::lock_guard<std::mutex> lock(log().mu);
    log().backward_threads.push_back(std::this_thread::get_id());
    ++log().backward_calls;
    if (c10::AutogradState::get_tls_state().get_multithreading_enabled()) ++log().backward_calls_with_autograd_threads;
    return {grads[0]};
  }
};

class TinyLayer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
};

class TinyEmbedding final : public TinyLayer {
 public:
  TinyEmbedding(int64_t vocab, int64_t hidden) { emb_ = register_module("emb", torch::nn::Embedding(vocab, hidden)); }
  at::Tensor forward(const at::Tensor& x) override { return emb_->forward(x); }

 private:
  torch::nn::Embedding emb_{nullptr};
};

class TinyBlock final : public TinyLayer {
 public:
  TinyBlock(int64_t hidden, int64_t forward_sleep_ms, int64_t backward_sleep_ms, bool probe_threads = false)
      : forward_sleep_ms_(forward_sleep_ms), backward_sleep_ms_(backward_sleep_ms), probe_threads_(probe_threads) {
    fc_ = register_module("fc", torch::nn::Linear(hidden, hidden));
  }
  at::Tensor forward(const at::Tensor& x) override {
    if (forward_sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(forward_sleep_ms_));
    at::Tensor y = x + at::tanh(fc_->forward(x));
    if (backward_sleep_ms_ > 0) y = SleepInBackward::apply(y, backward_sleep_ms_);
    if (probe_threads_) y = BackwardThreadProbe::apply(y);
    return y;
  }

 private:
  int64_t forward_sleep_ms_, backward_sleep_ms_;
  bool probe_threads_;
  torch::nn::Linear fc_{nullptr};
};

class TinyHead final : public TinyLayer {
 public:
  TinyHead(int64_t hidden, int64_t vocab) { fc_ = register_module("fc", torch::nn::Linear(hidden, vocab)); }
  at::Tensor forward(const at::Tensor& x) override { return fc_->forward(x); }

 private:
  torch::nn::Linear fc_{nullptr};
};

class TinyStageModule final : public StageModule {
 public:
  explicit TinyStageModule(std::vector<std::shared_ptr<TinyLayer>> layers) : layers_(std::move(layers)) {
    for (size_t i = 0; i < layers_.size(); ++i) register_module("layer" + std::to_string(i), layers_[i]);
  }
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input;
    for (auto& l : layers_) x = l->forward(x);
    return x;
  }

 private:
  std::vector<std::shared_ptr<TinyLayer>> layers_;
};

struct TinyCosts {
  int64_t forward_sleep_ms = 0;
  int64_t backward_sleep_ms = 0;
  bool probe_threads = false;  // every block logs its threads in BackwardThreadProbe::log()
};

class TinyModel final : public ModelInterface {
 public:
  TinyModel(int64_t blocks, TinyCosts costs = {}) : blocks_(blocks), costs_(costs) {}
  void configure(const ModelConfig& config) override { config_ = config; }
  const ModelConfig& get_model_config() const override { return config_; }
  std::vector<LayerCost> layer_costs() const override {
    std::vector<LayerCost> costs(static_cast<size_t>(blocks_ + 2));
    for (auto& c : costs) c.name = "layer";
    return costs;
  }
  // Blocks spread evenly; the embedding rides on stage 0 and the head on the last stage.
  std::vector<StageSpec> get_stage_partition(const ParallelConfig&, int num_stages,
                                             const std::vector<double>& = {}) const override {
    if (num_stages > blocks_) throw std::invalid_argument("more stages than blocks");
    std::vector<StageSpec> specs;
    int64_t next = 1;
    for (int s = 0; s < num_stages; ++s) {
      const int64_t count = blocks_ / num_stages + (s < blocks_ % num_stages ? 1 : 0);
      StageSpec spec{s, num_stages, s == 0 ? 0 : next, next + count, 0.0};
      next += count;
      if (s == num_stages - 1) spec.last_layer = blocks_ + 2;
      specs.push_back(spec);
    }
    return specs;
  }
  std::shared_ptr<torch::nn::Module> create_layer(int64_t index, uint64_t seed) const override {
    at::manual_seed(seed * 7919 + static_cast<uint64_t>(index));
    if (index == 0) return std::make_shared<TinyEmbedding>(config_.vocab_size, config_.hidden_size);
    if (index == blocks_ + 1) return std::make_shared<TinyHead>(config_.hidden_size, config_.vocab_size);
    return std::make_shared<TinyBlock>(config_.hidden_size, costs_.forward_sleep_ms, costs_.backward_sleep_ms,
                                       costs_.probe_threads);
  }
  double training_flops_per_token() const override { return 6.0 * 1000; }

 private:
  int64_t blocks_;
  TinyCosts costs_;
  ModelConfig config_;
};

class TinyStage final : public StageInterface {
 public:
  at::Tensor prepare_input(const Batch& mb) const override { return mb.input_ids; }
  at::Tensor compute_loss(const at::Tensor& logits, const Batch& mb) const override {
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), mb.targets.reshape({-1}));
  }
  std::shared_ptr<StageModule> create_sub_model(const ModelInterface& model, const StageSpec& spec,
                                                uint64_t seed) const override {
    std::vector<std::shared_ptr<TinyLayer>> layers;
    for (int64_t i = spec.first_layer; i < spec.last_layer; ++i) {
      layers.push_back(std::dynamic_pointer_cast<TinyLayer>(model.create_layer(i, seed)));
    }
    return std::make_shared<TinyStageModule>(std::move(layers));
  }
};

// A deterministic batch of token ids in [0, vocab).
inline Batch tiny_batch(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor tokens = at::randint(vocab, {batch, seq + 1}, at::kLong);
  return Batch{tokens.narrow(1, 0, seq).contiguous(), tokens.narrow(1, 1, seq).contiguous()};
}

}  // namespace gpipe::testing

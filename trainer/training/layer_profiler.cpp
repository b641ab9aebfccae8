// measure_layer_ms: times each layer alone, forward + backward, through the model's interfaces.
#include "trainer/training/layer_profiler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/AutogradState.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "trainer/device/device.h"

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gpipe {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

std::vector<double> measure_layer_ms(const ModelInterface& model, const StageInterface& stage,
                                     const PipelineConfig& config, c10::Device device,
                                     const LayerProfileOptions& options) {
  if (options.timed_runs < 1) {
    throw std::invalid_argument("measure_layer_ms: needs timed_runs >= 1");
  }
  const ModelConfig& mc = model.get_model_config();
  const int64_t num_layers = static_cast<int64_t>(model.layer_costs().size());
  if (num_layers < 1) throw std::invalid_argument("measure_layer_ms: the model has no layers");
  if (mc.vocab_size <= 0) throw std::invalid_argument("measure_layer_ms: model.vocab_size is unresolved");
  const int64_t microbatches = std::max(1, config.training.num_microbatches);
  const int64_t mb = std::max<int64_t>(1, config.dataset.batch_size / microbatches);
  const int64_t seq = mc.sequence_length;

#ifdef OURGPIPE_HAVE_TORCH_CUDA
  c10::cuda::OptionalCUDAGuard cuda_guard;
  if (device.is_cuda()) cuda_guard.set_device(device);
#endif
  c10::AutoGradMode grad_on(true);
  const std::vector<c10::Device> devices{device};
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(config.training.seed ^ 0x9e3779b97f4a7c15ULL);

  // A micro-batch of random token ids (input and targets), on the device.
  const Batch microbatch{at::randint(mc.vocab_size, {mb, seq}, gen, at::TensorOptions().dtype(at::kLong)).to(device),
                         at::randint(mc.vocab_size, {mb, seq}, gen, at::TensorOptions().dtype(at::kLong)).to(device)};

  // Every layer is built first; then warm-up rounds over all layers in order (the first one also
  // learns each layer's output shape, the next layer's input), then timed rounds, each timing
  // every layer once. Round-robin spreads drift (allocator growth, frequency, other processes)
  // over all layers instead of penalising the first ones.
  struct Probe {
    std::shared_ptr<StageModule> module;
    at::Tensor input;
    at::Tensor output_grad;  // drawn once the output's shape is known; undefined for the last layer
    std::vector<double> ms;
  };
  std::vector<Probe> probes(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) {
    StageSpec spec;
    spec.stage = static_cast<int>(i);  // is_first() / is_last() agree with the layer index
    spec.num_stages = static_cast<int>(num_layers);
    spec.first_layer = i;
    spec.last_layer = i + 1;
    spec.recompute_ratio = 0.0;
    Probe& probe = probes[static_cast<size_t>(i)];
    probe.module = stage.create_sub_model(model, spec, config.training.seed);
    probe.module->to(device);
    probe.module->train();
  }
  probes.front().input = stage.prepare_input(microbatch).to(device);

  auto run = [&](int64_t i) {
    Probe& probe = probes[static_cast<size_t>(i)];
    AutocastScope autocast(device, options.bf16_autocast);
    at::Tensor y = probe.module->forward(probe.input);
    if (i == num_layers - 1) {
      stage.compute_loss(y, microbatch).backward();
    } else {
      if (!probe.output_grad.defined()) {
        probe.output_grad = at::randn(y.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(device, y.scalar_type());
      }
      y.backward(probe.output_grad);
    }
    if (probe.input.requires_grad()) probe.input.mutable_grad() = at::Tensor();
    return y.detach();
  };
  const int warmup_rounds = std::max(1, options.warmup_runs);
  const int rounds = warmup_rounds + options.timed_runs;
  int rounds_done = 0;
  auto round_done = [&] {
    if (options.on_round) options.on_round(++rounds_done, rounds);
  };
  for (int w = 0; w < warmup_rounds; ++w) {
    for (int64_t i = 0; i < num_layers; ++i) {
      const at::Tensor y = run(i);
      if (w == 0 && i + 1 < num_layers) {
        probes[static_cast<size_t>(i + 1)].input = at::randn(y.sizes(), gen, at::TensorOptions().dtype(at::kFloat))
                                                       .to(device, y.scalar_type())
                                                       .requires_grad_(y.is_floating_point());
      }
    }
    round_done();
  }
  for (int r = 0; r < options.timed_runs; ++r) {
    for (int64_t i = 0; i < num_layers; ++i) {
      synchronize_devices(devices);
      const auto start = std::chrono::steady_clock::now();
      (void)run(i);
      synchronize_devices(devices);
      probes[static_cast<size_t>(i)].ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    round_done();
  }
  std::vector<double> out;
  out.reserve(probes.size());
  // partition_blocks wants costs > 0 to be meaningful; a clock tick is the floor.
  for (auto& probe : probes) out.push_back(std::max(median(std::move(probe.ms)), 1e-6));
  return out;
}

double concurrent_wall_ms(int k, int rounds, c10::Device device, const std::function<void(int)>& work) {
  if (k < 1 || rounds < 1) throw std::invalid_argument("concurrent_wall_ms needs k >= 1 threads and rounds >= 1");
  // Round r = 0 is the warm-up. Two barriers per round: the start releases every thread at once,
  // the finish tells this thread the round's work is done on all of them.
  std::barrier start_line(k + 1), finish_line(k + 1);
  std::mutex error_mu;
  std::exception_ptr error;
  std::atomic<bool> abandoned{false};  // a thread could not be started: the others skip their work
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(k));
  auto keep = [&](std::exception_ptr e) {  // the first one is rethrown at the end
    std::lock_guard<std::mutex> lock(error_mu);
    if (!error) error = std::move(e);
  };
  // Runs f; an exception is kept instead of escaping the thread.
  auto guarded = [&](const std::function<void()>& f) {
    try {
      f();
      return true;
    } catch (...) {
      keep(std::current_exception());
      return false;
    }
  };
  auto thread_body = [&](int i) {
    std::shared_ptr<void> own_stream;  // a rank's kernels run on a stream of its own
    // A thread that cannot set up still meets every barrier (and runs no work).
    const bool ready = guarded([&] {
      bind_thread_to_device(device);
      own_stream = use_own_stream(device);
    });
    c10::AutoGradMode grad_on(true);
    c10::AutogradState::get_tls_state().set_multithreading_enabled(false);  // backward here
    for (int r = 0; r <= rounds; ++r) {
      start_line.arrive_and_wait();
      if (ready && !abandoned.load()) {
        guarded([&] {
          work(i);
          synchronize_current_stream(device);  // the round ends when this thread's GPU work did
        });
      }
      finish_line.arrive_and_wait();
    }
  };
  try {
    for (int i = 0; i < k; ++i) threads.emplace_back(thread_body, i);
  } catch (...) {  // a thread that could not start: the started ones must not wait for it
    keep(std::current_exception());
    abandoned = true;
    for (size_t missing = threads.size(); missing < static_cast<size_t>(k); ++missing) {
      start_line.arrive_and_drop();
      finish_line.arrive_and_drop();
    }
  }
  std::vector<double> walls;
  for (int r = 0; r <= rounds; ++r) {
    start_line.arrive_and_wait();  // the clock starts when every thread is released, not before
    const auto start = std::chrono::steady_clock::now();
    finish_line.arrive_and_wait();
    if (r > 0) walls.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return median(std::move(walls));
}

}  // namespace gpipe

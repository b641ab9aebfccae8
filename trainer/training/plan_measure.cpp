// --plan's measurement: measure_device_profile, each layer alone, the transport, the device's
// sharing between ranks (plan_command.cpp runs the plan, its calibration and --verify).
#include "trainer/training/plan_command.h"
#include "plan_internal.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <exception>
#include <chrono>
#include <sstream>
#include <thread>

#include "trainer/config/config.h"
#include "trainer/device/device.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/transport.h"
#include "trainer/model/attention_backend.h"
#include "trainer/model/weight_grad_store.h"
#include "trainer/training/fused_adamw.h"
#include "trainer/training/layer_profiler.h"

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gpipe {
namespace {

using namespace plan_detail;

// One layer built alone as a one-layer stage module, with its input, ready to run F, I and W.
struct LayerProbe {
  std::shared_ptr<StageModule> module;
  at::Tensor input;        // token ids (first layer) or a hidden state that requires grad
  at::Tensor output_grad;  // undefined for the last layer (its loss is the root)
  bool last = false;
};

struct PartTimes {
  double forward = 0, input_grad = 0, weight_grad = 0;
};

class LayerRunner {
 public:
  // `own_stream_only`: wait for the calling thread's current stream alone between the parts, as
  // several of these run at once, each on a stream of its own (concurrent_wall_ms): a device-wide
  // wait would make each thread wait for the others' work. Otherwise the whole device.
  LayerRunner(const StageInterface& stage, const Batch& microbatch, c10::Device device, bool bf16,
              bool own_stream_only = false)
      : stage_(stage), microbatch_(microbatch), device_(device), bf16_(bf16), own_stream_only_(own_stream_only) {}

  // One F, I (weight GEMMs deferred), W of `probe`; fills `memory` when given.
  PartTimes run(LayerProbe& probe, LayerMeasurement* memory = nullptr) const {
    const std::vector<c10::Device> devices{device_};
    const auto wait_for_work = [this](const std::vector<c10::Device>& all) {
      if (own_stream_only_) {
        synchronize_current_stream(device_);
      } else {
        gpipe::synchronize_devices(all);
      }
    };
    PartTimes t;
    wait_for_work(devices);
    const int64_t a0 = allocated_bytes(device_);
    reset_peak_allocated(devices);
    auto start = Clock::now();
    at::Tensor y;
    {
      AutocastScope autocast(device_, bf16_);
      y = probe.module->forward(probe.input);
    }
    wait_for_work(devices);
    t.forward = ms_since(start);
    const int64_t a1 = allocated_bytes(device_), peak_f = peak_allocated_bytes(devices);
    reset_peak_allocated(devices);
    WeightGradStore store;
    start = Clock::now();
    {
      WeightGradStore::Defer defer(store);
      if (probe.last) {
        at::Tensor loss;
        {
          AutocastScope autocast(device_, bf16_);
          loss = stage_.compute_loss(y, microbatch_);
        }
        loss.backward();
      } else {
        y.backward(probe.output_grad);
      }
    }
    wait_for_work(devices);
    t.input_grad = ms_since(start);
    const int64_t peak_i = peak_allocated_bytes(devices);
    const int64_t output_bytes = static_cast<int64_t>(y.nbytes());
    y = at::Tensor();
    if (probe.input.requires_grad()) probe.input.mutable_grad() = at::Tensor();
    const int64_t a2 = allocated_bytes(device_);
    reset_peak_allocated(devices);
    start = Clock::now();
    store.flush();
    wait_for_work(devices);
    t.weight_grad = ms_since(start);
    const int64_t peak_w = peak_allocated_bytes(devices);
    if (memory != nullptr && a0 >= 0) {
      memory->activation_bytes = static_cast<double>(std::max<int64_t>(0, a1 - a0));
      memory->weight_grad_bytes = static_cast<double>(std::max<int64_t>(0, a2 - a0));
      memory->output_bytes = static_cast<double>(output_bytes);
      memory->workspace_bytes = static_cast<double>(
          std::max({int64_t{0}, peak_f - a1, peak_i - a1, peak_w - std::max(a0, a2)}));
    }
    return t;
  }

 private:
  const StageInterface& stage_;
  const Batch& microbatch_;
  c10::Device device_;
  bool bf16_;
  bool own_stream_only_;
};

LayerProbe make_probe(const ModelInterface& model, const StageInterface& stage, const PipelineConfig& config,
                      int64_t layer, int64_t num_layers, c10::Device device, const at::Tensor& input) {
  StageSpec spec;
  spec.stage = static_cast<int>(layer);
  spec.num_stages = static_cast<int>(num_layers);
  spec.first_layer = layer;
  spec.last_layer = layer + 1;
  LayerProbe probe;
  probe.module = stage.create_sub_model(model, spec, config.training.seed);
  probe.module->to(device);
  probe.module->train();
  probe.input = input;
  probe.last = layer == num_layers - 1;
  return probe;
}

// A hidden state shaped like `like`, requiring grad (the next layer's input).
at::Tensor random_like(const at::Tensor& like, at::Generator& gen, c10::Device device) {
  return at::randn(like.sizes(), gen, at::TensorOptions().dtype(at::kFloat))
      .to(device, like.scalar_type())
      .requires_grad_(like.is_floating_point());
}

// The in-process transport's cost of one transfer: a round trip between two threads, halved,
// for a one-element tensor and one of `bytes`.
std::pair<double, double> measure_inprocess_link(double bytes, c10::Device device) {
  auto transport = make_inprocess_transport(2);
  const auto elements = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4));
  auto one_way_ms = [&](int64_t n) {
    const at::Tensor t = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(device));
    constexpr int kRounds = 50;
    std::exception_ptr echo_error;
    std::thread echo([&] {
      try {
        for (int i = 0; i < kRounds; ++i) {
          Message m = transport->recv(TransferKey{TransferKind::kActivation, 1, i}, std::chrono::seconds(30));
          transport->send(TransferKey{TransferKind::kGradient, 0, i}, std::move(m));
        }
      } catch (...) {
        echo_error = std::current_exception();
        transport->abort("the echo thread failed");
      }
    });
    std::vector<double> round_trips;  // the median: one descheduled round must not count
    try {
      for (int i = 0; i < kRounds; ++i) {
        const auto start = Clock::now();
        transport->send(TransferKey{TransferKind::kActivation, 1, i}, Message{t, nullptr});
        (void)transport->recv(TransferKey{TransferKind::kGradient, 0, i}, std::chrono::seconds(30));
        round_trips.push_back(ms_since(start));
      }
    } catch (...) {
      transport->abort("the measuring thread failed");
      echo.join();
      if (echo_error) std::rethrow_exception(echo_error);
      throw;
    }
    echo.join();
    if (echo_error) std::rethrow_exception(echo_error);
    transport->reset();
    return median(round_trips) / 2.0;
  };
  const double small = one_way_ms(1);
  const double large = one_way_ms(elements);
  return {small, std::max(0.0, large - small) / std::max(1.0, bytes)};
}

}  // namespace

DeviceProfile measure_device_profile(const PipelineConfig& config, const PipelineComponents& components,
                                     const ProfileOptions& options, std::ostream& log) {
  const ModelInterface& model = *components.model;
  const StageInterface& stage = *components.stage;
  const c10::Device device = resolve_rank_devices(config.parallel.device, 1).front();
  if (device.is_cpu()) install_cpu_allocation_counter();
  const bool bf16 = device.is_cuda() && config.training.dtype != "fp32";
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  c10::cuda::OptionalCUDAGuard cuda_guard;
  if (device.is_cuda()) cuda_guard.set_device(device);
#endif
  // The profile times the kernel the run's attention will use (model.attention).
  if (const auto shape = model.attention_shape()) {
    const std::string kernel =  // chosen before anything is printed: a refusal is one error line
        select_attention_backend(config.model.attention, *shape, device, bf16 ? at::kBFloat16 : at::kFloat);
    log << "attention: " << kernel << " (model.attention=" << config.model.attention << ")\n";
  }
  // The run's intra-op threads: each of the config's ranks gets its share of the cores on CPU.
  if (device.is_cpu() && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    at::set_num_threads(std::max(1, cores / std::max(1, config.parallel.model_parallel_size)));
  }
  c10::AutoGradMode grad_on(true);
  DeviceProfile profile;
  profile.device = device.is_cpu() ? "cpu" : device_display_name(device);
  const std::vector<LayerCost> costs = model.layer_costs();
  const auto num_layers = static_cast<int64_t>(costs.size());
  for (const LayerCost& c : costs) {
    profile.layer_names.push_back(c.name);
    profile.layer_parameters.push_back(c.parameters);
  }
  profile.microbatch_sizes = options.microbatch_sizes;
  profile.base_bytes = static_cast<double>(std::max<int64_t>(0, allocated_bytes(device)));
  const ModelConfig& mc = model.get_model_config();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(config.training.seed ^ 0x5bd1e995ULL);

  // Every layer at every micro-batch size: one layer built at a time.
  LayerProbe middle;  // a block, kept for the concurrency measurements
  for (size_t size_index = 0; size_index < options.microbatch_sizes.size(); ++size_index) {
    const int64_t mb = options.microbatch_sizes[size_index];
    log << "  layers at micro-batch size " << mb << ":";
    log.flush();
    const Batch microbatch{
        at::randint(mc.vocab_size, {mb, mc.sequence_length}, gen, at::TensorOptions().dtype(at::kLong)).to(device),
        at::randint(mc.vocab_size, {mb, mc.sequence_length}, gen, at::TensorOptions().dtype(at::kLong)).to(device)};
    LayerRunner runner(stage, microbatch, device, bf16);
    std::vector<LayerMeasurement> layers;
    at::Tensor input = stage.prepare_input(microbatch).to(device);
    for (int64_t l = 0; l < num_layers; ++l) {
      LayerProbe probe = make_probe(model, stage, config, l, num_layers, device, input);
      if (!probe.last) {
        // The output's shape (and the gradient it gets) from one forward without grad.
        at::Tensor y;
        {
          c10::NoGradGuard no_grad;
          AutocastScope autocast(device, bf16);
          y = probe.module->forward(probe.input);
        }
        probe.output_grad = at::randn(y.sizes(), gen, at::TensorOptions().dtype(at::kFloat)).to(device, y.scalar_type());
        input = random_like(y, gen, device);
      }
      for (int w = 0; w < std::max(1, options.warmup_runs); ++w) (void)runner.run(probe);
      std::vector<double> f, i, wg;
      LayerMeasurement m;
      for (int r = 0; r < std::max(1, options.timed_runs); ++r) {
        const PartTimes t = runner.run(probe, r == 0 ? &m : nullptr);
        f.push_back(t.forward);
        i.push_back(t.input_grad);
        wg.push_back(t.weight_grad);
      }
      m.forward_ms = median(f);
      m.input_grad_ms = median(i);
      m.weight_grad_ms = median(wg);
      layers.push_back(m);
      if (size_index == 0 && l == std::min<int64_t>(1, num_layers - 1)) middle = probe;
      log << " " << l;
      log.flush();
    }
    log << "\n";
    profile.layers.push_back(std::move(layers));
  }

  // The optimizer: gradient norm + AdamW over a block's parameters, per parameter.
  {
    const auto params = middle.module->parameters();
    int64_t count = 0;
    for (auto& p : params) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      count += p.numel();
    }
    torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-4));
    std::vector<double> ms;
    for (int r = 0; r < 2 + std::max(1, options.timed_runs); ++r) {
      const auto start = Clock::now();
      std::vector<at::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad());
      (void)at::stack(at::_foreach_norm(grads, 2, at::kFloat)).pow(2).sum().item<double>();
      fused_adamw_step(optimizer);
      synchronize_devices({device});
      if (r >= 2) ms.push_back(ms_since(start));
    }
    profile.optimizer_ms_per_parameter = count > 0 ? median(ms) / static_cast<double>(count) : 0.0;
  }

  // Transfers between the ranks of one process (the in-process transport), or as given.
  const double boundary = profile.layers.front()[static_cast<size_t>(std::min<int64_t>(1, num_layers - 1))].output_bytes;
  // The in-process transport, always measured: calibration runs use it, whatever link is given.
  std::tie(profile.inprocess_latency_ms, profile.inprocess_ms_per_byte) = measure_inprocess_link(boundary, device);
  profile.link_latency_ms = profile.inprocess_latency_ms;
  profile.link_ms_per_byte = profile.inprocess_ms_per_byte;
  profile.link_source = "measured, in-process transport";
  if (options.link_gbps > 0 || options.link_latency_us >= 0) {
    if (options.link_gbps > 0) profile.link_ms_per_byte = 1e3 / (options.link_gbps * 1e9);
    if (options.link_latency_us >= 0) profile.link_latency_ms = options.link_latency_us / 1e3;
    profile.link_source = "given (--link-gbps / --link-latency-us)";
  }
  if (options.link_gbps > 0) {
    profile.replica_link_ms_per_byte = profile.link_ms_per_byte;
    profile.replica_link_latency_ms = options.link_latency_us >= 0 ? options.link_latency_us / 1e3 : 0.02;
    profile.replica_link_source = "given (--link-gbps)";
  } else if (device.is_cpu()) {
    // Replicas on CPU are processes joined by Gloo: one all-reduce between two local ranks.
    try {
      const LinkCost gloo = measure_gloo_allreduce(4 * 1024 * 1024);
      profile.replica_link_latency_ms = gloo.latency_ms / 2;  // a 2-rank ring all-reduce: 2 steps
      profile.replica_link_ms_per_byte = gloo.ms_per_byte;
      profile.replica_link_source = "measured, Gloo all-reduce between two local ranks";
    } catch (const std::exception& e) {
      profile.replica_link_ms_per_byte = 1e3 / (2.0 * 1e9);
      profile.replica_link_latency_ms = 0.05;
      profile.replica_link_source = std::string("assumed 2 GB/s, 50 us (the Gloo measurement failed: ") + e.what() + ")";
    }
  } else {
    // NCCL between GPUs needs two GPUs' processes: assumed unless given.
    profile.replica_link_ms_per_byte = 1e3 / (100.0 * 1e9);
    profile.replica_link_latency_ms = 0.02;
    profile.replica_link_source = "assumed 100 GB/s, 20 us (NCCL; give --link-gbps)";
  }

  // Ranks that share the device: what k of them achieve together (one block's F + I + W on each
  // of k threads, each with its own copy of the layer), and how much an overlapped pair's halves
  // (a forward and a backward on two threads) slow each other.
  {
    const int max_k = std::max(1, std::min(8, config.parallel.model_parallel_size * config.parallel.data_parallel_size));
    const int64_t mb = options.microbatch_sizes.front();
    const Batch microbatch{
        at::randint(mc.vocab_size, {mb, mc.sequence_length}, gen, at::TensorOptions().dtype(at::kLong)).to(device),
        at::randint(mc.vocab_size, {mb, mc.sequence_length}, gen, at::TensorOptions().dtype(at::kLong)).to(device)};
    LayerRunner runner(stage, microbatch, device, bf16);
    std::vector<LayerProbe> copies;
    const int64_t block = std::min<int64_t>(1, num_layers - 1);
    for (int i = 0; i < max_k; ++i) {
      LayerProbe p = make_probe(model, stage, config, block, num_layers, device, middle.input.detach().clone().requires_grad_(middle.input.requires_grad()));
      p.output_grad = middle.output_grad;
      (void)runner.run(p);
      copies.push_back(std::move(p));
    }
    const int rounds = 5;
    // The same parts, each thread on its own stream and waiting for it alone.
    const LayerRunner on_own_stream(stage, microbatch, device, bf16, /*own_stream_only=*/true);
    const auto one_block = [&](int i) { (void)on_own_stream.run(copies[static_cast<size_t>(i)]); };
    const double one = concurrent_wall_ms(1, rounds, device, one_block);
    for (int k = 1; k <= max_k; ++k) {
      const double wall = k == 1 ? one : concurrent_wall_ms(k, rounds, device, one_block);
      // More ranks never do less in all than fewer did (a dip is a noisy round, not the device).
      const double achieved = std::max(1e-3, k * one / std::max(1e-9, wall));
      profile.rank_concurrency.push_back(profile.rank_concurrency.empty()
                                             ? achieved
                                             : std::max(achieved, profile.rank_concurrency.back()));
    }
    if (max_k >= 2) {
      // A pair: thread 0 runs the forward alone, thread 1 a whole F + I + W (its backward part
      // overlaps thread 0's forward). Serial share = (together - longer) / shorter.
      const LayerMeasurement& lm = profile.layers.front()[static_cast<size_t>(block)];
      const double f = lm.forward_ms, whole = lm.forward_ms + lm.input_grad_ms + lm.weight_grad_ms;
      const double together = concurrent_wall_ms(2, rounds, device, [&](int i) {
        if (i == 0) {
          AutocastScope autocast(device, bf16);
          (void)copies[0].module->forward(copies[0].input);
        } else {
          (void)on_own_stream.run(copies[1]);
        }
      });
      profile.pair_serial_share = std::clamp((together - whole) / std::max(1e-9, f), 0.0, 1.0);
    }
  }

  // bf16 autocast keeps a bf16 copy of every weight per step (WeightCastCache).
  profile.cast_bytes_per_parameter = bf16 ? 2 : 0;
  // Memory per device: given, or the device's.
  // GPUs visible (the runner puts rank r on GPU r % that count): one rank per device over 64.
  profile.devices = device.is_cuda() ? std::max(1, count_distinct_devices(resolve_rank_devices(config.parallel.device, 64)))
                                     : 1;
  if (options.memory_budget_gib > 0) {
    profile.memory_per_device_bytes = options.memory_budget_gib * 1024.0 * kMiB;
  } else if (const auto gpu = gpu_memory(device)) {
    profile.memory_per_device_bytes = usable_device_bytes(gpu->total, gpu->free, gpu->reserved_here);
  } else {
    profile.memory_per_device_bytes = static_cast<double>(total_memory_bytes({device}));
  }
  return profile;
}


}  // namespace gpipe

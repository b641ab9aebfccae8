// gpipe_runner --plan: measure (measure_device_profile), plan (planner.h), report, verify.
#include "trainer/training/plan_command.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <exception>
#include <mutex>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include "trainer/config/config.h"
#include "trainer/device/device.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/transport.h"
#include "trainer/model/weight_grad_store.h"
#include "trainer/training/fused_adamw.h"

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace gpipe {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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
  LayerRunner(const StageInterface& stage, const Batch& microbatch, c10::Device device, bool bf16)
      : stage_(stage), microbatch_(microbatch), device_(device), bf16_(bf16) {}

  // One F, I (weight GEMMs deferred), W of `probe`; fills `memory` when given.
  PartTimes run(LayerProbe& probe, LayerMeasurement* memory = nullptr) const {
    const std::vector<c10::Device> devices{device_};
    PartTimes t;
    synchronize_devices(devices);
    const int64_t a0 = allocated_bytes(device_);
    reset_peak_allocated(devices);
    auto start = Clock::now();
    at::Tensor y;
    {
      AutocastScope autocast(device_, bf16_);
      y = probe.module->forward(probe.input);
    }
    synchronize_devices(devices);
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
    synchronize_devices(devices);
    t.input_grad = ms_since(start);
    const int64_t peak_i = peak_allocated_bytes(devices);
    const int64_t output_bytes = static_cast<int64_t>(y.nbytes());
    y = at::Tensor();
    if (probe.input.requires_grad()) probe.input.mutable_grad() = at::Tensor();
    const int64_t a2 = allocated_bytes(device_);
    reset_peak_allocated(devices);
    start = Clock::now();
    store.flush();
    synchronize_devices(devices);
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

// Runs `work` on k threads at once (released together, each bound to `device`), `rounds` times;
// the median wall time. A thread's exception is rethrown here once all have joined.
double concurrent_ms(int k, int rounds, c10::Device device, const std::function<void(int)>& work) {
  std::vector<double> walls;
  for (int r = 0; r < rounds; ++r) {
    std::barrier sync(k + 1);
    std::vector<std::thread> threads;
    std::mutex error_mu;
    std::exception_ptr error;
    for (int i = 0; i < k; ++i) {
      threads.emplace_back([&, i] {
        bind_thread_to_device(device);
        c10::AutoGradMode grad_on(true);
        sync.arrive_and_wait();
        try {
          work(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!error) error = std::current_exception();
        }
      });
    }
    const auto start = Clock::now();
    sync.arrive_and_wait();
    for (auto& t : threads) t.join();
    if (error) std::rethrow_exception(error);
    walls.push_back(ms_since(start));
  }
  return median(walls);
}

std::string gib_text(double bytes) {
  std::ostringstream s;
  s.precision(3);
  s << bytes / (1024.0 * kMiB) << " GiB";
  return s.str();
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
      profile.replica_link_latency_ms = gloo.latency_ms;
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
    const double one = concurrent_ms(1, rounds, device, [&](int i) { (void)runner.run(copies[static_cast<size_t>(i)]); });
    for (int k = 1; k <= max_k; ++k) {
      const double wall = k == 1 ? one : concurrent_ms(k, rounds, device, [&](int i) { (void)runner.run(copies[static_cast<size_t>(i)]); });
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
      const double together = concurrent_ms(2, rounds, device, [&](int i) {
        if (i == 0) {
          AutocastScope autocast(device, bf16);
          (void)copies[0].module->forward(copies[0].input);
        } else {
          (void)runner.run(copies[1]);
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
  profile.memory_per_device_bytes = options.memory_budget_gib > 0 ? options.memory_budget_gib * 1024.0 * kMiB
                                                                  : static_cast<double>(total_memory_bytes({device}));
  return profile;
}

namespace {

// Runs `argv` with its output in `log_path`, in its own process group; kills the group after
// `timeout`. Returns the exit code (128 + signal when killed).
int run_child(const std::vector<std::string>& argv, const std::string& log_path, std::chrono::seconds timeout) {
  // Everything the child needs is made before fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("--plan: cannot write " + log_path + " (check the output folder)");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    throw std::runtime_error("--plan: fork failed for a calibration or --verify run");
  }
  if (pid == 0) {
    setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // an interrupted --plan takes its runs with it
    if (getppid() != parent) _exit(125);  // it was interrupted before the line above
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    static const char kExecFailed[] = "--plan: execv of gpipe_runner failed\n";
    (void)!write(2, kExecFailed, sizeof kExecFailed - 1);
    _exit(127);
  }
  close(fd);
  setpgid(pid, pid);
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (Clock::now() > deadline) {
      kill(-pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 124;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

VerifyResult verify_candidate(const PipelineConfig& base, const PlannedCandidate& pick, const PlanRequest& request, const std::string& self_exe, const std::string& dir) {
  VerifyResult v;
  v.candidate = pick.candidate;
  v.predicted_ms = pick.prediction.step_ms;
  v.predicted_peak_bytes = *std::max_element(pick.prediction.peak_bytes_per_device.begin(),
                                             pick.prediction.peak_bytes_per_device.end());
  v.output_dir = dir;
  std::filesystem::create_directories(dir);
  PipelineConfig run = plan_config(base, pick.candidate);
  run.training.max_steps = request.verify_steps;
  run.training.output_dir = dir;
  run.training.profile_iteration = 1 << 30;  // no profiled step among the timed ones
  run.training.exit_after_profile = false;
  run.training.checkpoint_interval = 0;
  run.training.log_interval = 1000;
  const std::string yaml = dir + "/config.yaml";
  std::ofstream(yaml) << run.to_yaml();
  std::vector<std::string> argv{self_exe, "--config", yaml};
  if (pick.candidate.data_parallel > 1) {
    argv.push_back("--nproc-per-node");
    argv.push_back(std::to_string(pick.candidate.data_parallel));
    argv.push_back("--master-port");
    argv.push_back(std::to_string(29500 + (::getpid() % 1000)));
  }
  const auto timeout = std::chrono::seconds(120 + static_cast<int64_t>(request.verify_steps * pick.prediction.step_ms * 20 / 1e3));
  v.exit_code = run_child(argv, dir + "/run.log", timeout);
  std::ifstream metrics(dir + "/metrics.jsonl");
  std::vector<double> steps;
  std::string line;
  for (int index = 0; std::getline(metrics, line); ++index) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (index >= 2) steps.push_back(j.value("step_time_ms", 0.0));  // two warm-up steps
    v.measured_peak_bytes = std::max(v.measured_peak_bytes, static_cast<double>(j.value("peak_allocated_bytes", int64_t{-1})));
  }
  v.measured_ms = median(steps);
  return v;
}

nlohmann::json candidate_json(const PlannedCandidate& pc) {
  const auto& c = pc.candidate;
  const auto& p = pc.prediction;
  return {{"label", c.label()},
          {"schedule", c.schedule},
          {"pipeline_ranks", c.pipeline_ranks},
          {"virtual_stages", c.virtual_stages},
          {"microbatches", c.microbatches},
          {"data_parallel", c.data_parallel},
          {"overlap", c.overlap},
          {"blocks_per_stage", c.blocks_per_stage},
          {"recompute_ratio", c.recompute_ratio},
          {"predicted_step_ms", p.step_ms},
          {"predicted_pipeline_ms", p.pipeline_ms},
          {"predicted_bubble", p.bubble},
          {"predicted_tokens_per_s", p.tokens_per_s},
          {"predicted_peak_bytes_per_rank", p.peak_bytes_per_rank},
          {"predicted_peak_bytes_per_device", p.peak_bytes_per_device},
          {"fits", p.fits},
          {"note", p.why_not}};
}

nlohmann::json profile_json(const DeviceProfile& d, double seconds) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t s = 0; s < d.layers.size(); ++s) {
    for (size_t l = 0; l < d.layers[s].size(); ++l) {
      const LayerMeasurement& m = d.layers[s][l];
      layers.push_back({{"microbatch_size", d.microbatch_sizes[s]}, {"layer", l}, {"name", d.layer_names[l]},
                        {"forward_ms", m.forward_ms}, {"input_grad_ms", m.input_grad_ms},
                        {"weight_grad_ms", m.weight_grad_ms}, {"activation_bytes", m.activation_bytes},
                        {"weight_grad_bytes", m.weight_grad_bytes}, {"output_bytes", m.output_bytes},
                        {"workspace_bytes", m.workspace_bytes}});
    }
  }
  return {{"device", d.device},
          {"seconds", seconds},
          {"layers", layers},
          {"optimizer_ms_per_parameter", d.optimizer_ms_per_parameter},
          {"base_bytes", d.base_bytes},
          {"link_latency_ms", d.link_latency_ms},
          {"link_ms_per_byte", d.link_ms_per_byte},
          {"link_source", d.link_source},
          {"replica_link_source", d.replica_link_source},
          {"pair_serial_share", d.pair_serial_share},
          {"rank_concurrency", d.rank_concurrency},
          {"sharing_efficiency", d.sharing_efficiency},
          {"handoff_ms", d.handoff_ms},
          {"action_overhead_ms", d.action_overhead_ms},
          {"replica_step_ms", d.replica_step_ms},
          {"memory_per_device_bytes", d.memory_per_device_bytes},
          {"devices", d.devices}};
}

// The user's own configuration as a candidate (nullopt: one the planner does not model, a
// schedule file or an asynchronous pipeline).
std::optional<PlanCandidate> candidate_of_config(const PipelineConfig& config, const ModelInterface& model,
                                                 const DeviceProfile& profile) {
  const ParallelConfig& p = config.parallel;
  if (!p.schedule_file.empty() || p.sync_mode != "bsp") return std::nullopt;
  PlanCandidate c;
  c.schedule = p.schedule;
  c.pipeline_ranks = p.model_parallel_size;
  c.virtual_stages = p.virtual_stages;
  c.microbatches = config.training.num_microbatches;
  c.data_parallel = p.data_parallel_size;
  c.overlap = p.overlap_f_b == "true";
  const int stages = p.model_parallel_size * p.virtual_stages;
  std::vector<double> layer_ms;
  const int64_t microbatch_size = config.dataset.batch_size / std::max(1, config.training.num_microbatches);
  for (size_t l = 0; l < profile.layer_names.size(); ++l) {
    const LayerMeasurement m = profile.layer_at(l, microbatch_size);
    layer_ms.push_back(m.forward_ms + m.input_grad_ms + m.weight_grad_ms);
  }
  for (const StageSpec& spec : model.get_stage_partition(p, stages, layer_ms)) {
    const int64_t first_block = std::max<int64_t>(spec.first_layer, 1);
    const int64_t last_block = std::min<int64_t>(spec.last_layer, static_cast<int64_t>(profile.layer_names.size()) - 1);
    c.blocks_per_stage.push_back(last_block - first_block);
    c.recompute_ratio.push_back(spec.recompute_ratio);
  }
  return c;
}

// Runs `candidate` for 5 steps as calibration run `name`; its median step in ms (<= 0: failed).
double calibration_run(const PipelineConfig& config, const PlanCandidate& candidate, const DeviceProfile& profile,
                       const PlanRequest& request, const std::string& self_exe, const std::string& name,
                       std::ostream& out) {
  PlannedCandidate planned = predict_candidate(candidate, config, profile, false);
  PlanRequest calibrate_request = request;
  calibrate_request.verify_steps = 5;
  out << "  calibrating: " << candidate.label() << " for 5 steps\n";
  out.flush();
  const VerifyResult run =
      verify_candidate(config, planned, calibrate_request, self_exe,
                       (std::filesystem::path(config.training.output_dir) / "plan_verify" / name).string());
  return run.exit_code == 0 ? run.measured_ms : -1.0;
}

std::string calibrate_profile(const PipelineConfig& config, const ModelInterface& model, const PlanRequest& request,
                              const std::string& self_exe, DeviceProfile& profile, std::ostream& out) {
  const std::optional<PlanCandidate> own = candidate_of_config(config, model, profile);
  if (!own) return "not calibrated: the configuration uses a schedule file or sync_mode asp";
  // The second run: the same ranks, replicas and micro-batches, interleaved with the most virtual
  // stages the model allows (at most 4), no pairs.
  std::optional<PlanCandidate> more;
  PlanOptions options;
  options.world_size = own->pipeline_ranks * own->data_parallel;
  options.schedules = {"interleaved_1f1b"};
  options.allow_overlap = false;
  try {
    for (const PlanCandidate& c : enumerate_candidates(config, profile, options)) {
      if (c.pipeline_ranks == own->pipeline_ranks && c.microbatches == own->microbatches &&
          c.data_parallel == own->data_parallel && (!more || c.virtual_stages > more->virtual_stages)) {
        more = c;
      }
    }
  } catch (const ConfigError&) {
  }
  if (more && more->virtual_stages == own->virtual_stages) more.reset();
  const double measured_own = calibration_run(config, *own, profile, request, self_exe, "calibration_1", out);
  if (measured_own <= 0) return "not calibrated: the run of your configuration failed (plan_verify/calibration_1/run.log)";
  const double measured_more =
      more ? calibration_run(config, *more, profile, request, self_exe, "calibration_2", out) : -1.0;
  // The second parameter: how long a hand-off from one rank to the next takes beyond the
  // transport's own measured latency (a rank woken on a busy device waits for its turn).
  // The calibration runs are single processes: their ranks talk through the in-process
  // transport, whatever link the plan is given for its candidates.
  auto predicted = [&](const PlanCandidate& c, double efficiency, double handoff, double per_action = 0.0) {
    DeviceProfile p = profile;
    p.sharing_efficiency = efficiency;
    p.action_overhead_ms = per_action;
    p.link_latency_ms = profile.inprocess_latency_ms + handoff;
    p.link_ms_per_byte = profile.inprocess_ms_per_byte;
    return predict_candidate(c, config, p, false).prediction.step_ms;
  };
  // The efficiency that makes `own` come out as measured, for a given overhead (the predicted
  // step falls as the efficiency rises).
  // At most 1: copies of one layer on k threads are the best case a pipeline's ranks can reach.
  auto fit_efficiency = [&](double overhead) {
    double lo = 0.2, hi = 1.0;
    if (predicted(*own, hi, overhead) >= measured_own) return hi;
    if (predicted(*own, lo, overhead) <= measured_own) return lo;
    for (int i = 0; i < 30; ++i) {
      const double mid = 0.5 * (lo + hi);
      (predicted(*own, mid, overhead) > measured_own ? lo : hi) = mid;
    }
    return 0.5 * (lo + hi);
  };
  const double before_own = predicted(*own, 1.0, 0.0);
  double overhead = 0;
  if (measured_more > 0) {
    // More actions per rank than `own`: the overhead that makes both come out as measured.
    double lo = 0, hi = std::max(0.1, measured_more / 20.0);
    for (int i = 0; i < 30; ++i) {
      const double mid = 0.5 * (lo + hi);
      (predicted(*more, fit_efficiency(mid), mid) < measured_more ? lo : hi) = mid;
    }
    overhead = 0.5 * (lo + hi);
  }
  profile.link_latency_ms += overhead;  // every hand-off pays it, on whatever link
  profile.handoff_ms = overhead;
  profile.sharing_efficiency = fit_efficiency(overhead);
  // Still fast at full efficiency: the executor's own cost per action (queues, autograd entry,
  // stash) is a share of the step the layers do not show (small models with ~1 ms actions).
  if (predicted(*own, profile.sharing_efficiency, overhead) < 0.98 * measured_own) {
    double lo = 0, hi = std::max(0.1, measured_own / 10.0);
    for (int i = 0; i < 30; ++i) {
      const double mid = 0.5 * (lo + hi);
      (predicted(*own, profile.sharing_efficiency, overhead, mid) < measured_own ? lo : hi) = mid;
    }
    profile.action_overhead_ms = 0.5 * (lo + hi);
  }
  // A third run when replicas are possible: the same schedule and micro-batches as 2 replicas of
  // half the ranks, for what a multi-process step costs beyond its all-reduces.
  std::optional<PlanCandidate> replicated;
  double measured_replicated = -1;
  if (own->data_parallel == 1 && own->pipeline_ranks % 2 == 0) {
    PlanOptions dp_options;
    dp_options.world_size = own->pipeline_ranks;
    dp_options.schedules = {own->schedule};
    dp_options.allow_overlap = false;
    try {
      for (const PlanCandidate& c : enumerate_candidates(config, profile, dp_options)) {
        if (c.data_parallel == 2 && c.microbatches == own->microbatches && c.virtual_stages == own->virtual_stages) {
          replicated = c;
          break;
        }
      }
    } catch (const ConfigError&) {
    }
    if (replicated) {
      measured_replicated = calibration_run(config, *replicated, profile, request, self_exe, "calibration_3", out);
      if (measured_replicated > 0) {
        DeviceProfile local = profile;  // its ranks share one process: the in-process transport
        local.link_latency_ms = profile.inprocess_latency_ms + overhead;
        local.link_ms_per_byte = profile.inprocess_ms_per_byte;
        profile.replica_step_ms =
            std::max(0.0, measured_replicated - predict_candidate(*replicated, config, local, false).prediction.step_ms);
      }
    }
  }
  std::ostringstream text;
  text.precision(4);
  text << own->label() << " ran at " << measured_own << " ms/step (" << before_own << " predicted from the layers alone)";
  if (more) {
    text << ", " << more->label() << " at " << measured_more << " ms/step";
  } else {
    text << " (no second configuration with more virtual stages: hand-off time not fitted)";
  }
  if (replicated && measured_replicated > 0) text << ", " << replicated->label() << " at " << measured_replicated << " ms/step";
  text << "; fitted: ranks sharing a device run at " << profile.sharing_efficiency
       << " of their measured concurrency, a hand-off between ranks takes " << profile.handoff_ms
       << " ms more than the transport's own latency, an action " << profile.action_overhead_ms
       << " ms more than its layers, a step of replicas " << profile.replica_step_ms << " ms more than its all-reduces";
  return text.str();
}

}  // namespace

int run_plan_command(PipelineConfig config, const PlanRequest& request, const std::string& self_exe,
                     std::ostream& out) {
  const auto started = Clock::now();
  for (const std::string& s : request.schedules) {
    try {
      (void)parse_schedule_kind(s);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("--plan-schedules: ") + e.what());
    }
  }
  PipelineComponents components = create_components(config);  // validates; resolves vocab_size
  components.model->configure(config.model);
  // Micro-batch sizes the candidates can have: the batch over each count that divides it.
  std::vector<int64_t> sizes;
  for (int64_t m = 1; m <= config.dataset.batch_size; ++m)
    if (config.dataset.batch_size % m == 0 && m <= request.max_microbatches) sizes.push_back(config.dataset.batch_size / m);
  std::sort(sizes.begin(), sizes.end());
  ProfileOptions popts;
  // Every size when there are at most four, else the smallest, the largest and two between
  // (spread evenly over the sorted sizes); the others are interpolated.
  if (sizes.size() <= 4) {
    popts.microbatch_sizes = sizes;
  } else {
    for (size_t i = 0; i < 4; ++i) popts.microbatch_sizes.push_back(sizes[i * (sizes.size() - 1) / 3]);
  }
  popts.link_gbps = request.link_gbps;
  popts.link_latency_us = request.link_latency_us;
  popts.memory_budget_gib = request.memory_budget_gib;
  out << "gpipe_runner --plan: measuring " << components.model->layer_costs().size() << " layers of model '"
      << config.model.name << "' on " << resolve_rank_devices(config.parallel.device, 1).front().str() << "\n";
  DeviceProfile profile = measure_device_profile(config, components, popts, out);

  // Calibration: up to three short runs, the user's own configuration, the same with the most
  // virtual stages, and the same as 2 replicas. How well ranks sharing a device share it in a
  // real pipeline (DeviceProfile::sharing_efficiency), what a hand-off between ranks costs beyond
  // the transport (handoff_ms) and what a step of replicas costs beyond its all-reduces
  // (replica_step_ms) are fitted to them; everything else stays as measured.
  std::string calibration = "not calibrated (--plan-calibrate 0)";
  if (request.calibrate) calibration = calibrate_profile(config, *components.model, request, self_exe, profile, out);
  const double measured_s = ms_since(started) / 1e3;

  PlanOptions options;
  options.world_size = request.world_size;
  options.schedules = request.schedules;
  options.max_microbatches = request.max_microbatches;
  const Plan plan = make_plan(config, profile, options);
  out << "\n" << render_plan_table(plan, profile, request.rows);
  out << "\nmeasured in " << measured_s << " s; link " << profile.link_source << ": " << profile.link_latency_ms * 1e3
      << " us + " << profile.link_ms_per_byte * kMiB << " ms/MiB; replicas' link " << profile.replica_link_source
      << "; ranks together on one device run " << (profile.rank_concurrency.empty() ? 1.0 : profile.rank_concurrency.back())
      << "x one rank; overlapped halves " << 100 * profile.pair_serial_share << "% serial; memory budget "
      << gib_text(profile.memory_per_device_bytes) << " per device\ncalibration: " << calibration << "\n";

  const std::string output = request.output.empty()
                                 ? (std::filesystem::path(config.training.output_dir) / "plan.yaml").string()
                                 : request.output;
  if (!std::filesystem::path(output).parent_path().empty())
    std::filesystem::create_directories(std::filesystem::path(output).parent_path());
  {
    std::ofstream file(output);
    if (!file) throw ConfigError("--plan-output " + output + ": cannot write the file (check the folder)");
    file << plan_yaml(config, plan.ranked.front(), profile);
  }
  out << "wrote " << output << ": train with gpipe_runner --config " << output << "\n";
  // Everything behind the table, for scripts and tests: <output without extension>.json.
  nlohmann::json report = {{"profile", profile_json(profile, measured_s)},
                           {"considered", plan.considered},
                           {"ranked", nlohmann::json::array()},
                           {"rejected", nlohmann::json::array()},
                           {"notes", plan.notes},
                           {"verify", nlohmann::json::array()}};
  for (const auto& pc : plan.ranked) report["ranked"].push_back(candidate_json(pc));
  for (const auto& pc : plan.rejected) report["rejected"].push_back(candidate_json(pc));
  std::string report_path = (std::filesystem::path(output).replace_extension(".json")).string();
  if (report_path == output) report_path = (std::filesystem::path(output).replace_extension(".report.json")).string();
  auto write_report = [&] { std::ofstream(report_path) << report.dump(1) << "\n"; };
  write_report();
  out << "wrote " << report_path << " (the profile, every candidate's prediction" << (request.verify > 0 ? ", the verify runs" : "")
      << ")\n";

  if (request.verify > 0) {
    const int k = std::min<int>(request.verify, static_cast<int>(plan.ranked.size()));
    out << "\n--verify: running the top " << k << " for " << request.verify_steps
        << " steps each (steps after the first two compared)\n";
    out << "  #  candidate                          predicted ms  measured ms   error   predicted MiB  measured MiB   error\n";
    std::vector<double> errors;
    int failed = 0;
    for (int i = 0; i < k; ++i) {
      const std::string dir = (std::filesystem::path(config.training.output_dir) / "plan_verify" /
                               ("candidate_" + std::to_string(i + 1))).string();
      const VerifyResult v = verify_candidate(config, plan.ranked[static_cast<size_t>(i)], request, self_exe, dir);
      report["verify"].push_back({{"rank", i + 1},
                                  {"label", v.candidate.label()},
                                  {"exit_code", v.exit_code},
                                  {"predicted_step_ms", v.predicted_ms},
                                  {"measured_step_ms", v.measured_ms},
                                  {"predicted_peak_bytes", v.predicted_peak_bytes},
                                  {"measured_peak_bytes", v.measured_peak_bytes},
                                  {"output_dir", v.output_dir}});
      write_report();
      char row[256];
      if (v.exit_code != 0 || v.measured_ms <= 0) {
        const std::string why = v.exit_code == 124 ? "timed out"
                                : v.exit_code == 0  ? "fewer than 3 steps in metrics.jsonl (a shorter dataset?)"
                                                    : "run failed (exit " + std::to_string(v.exit_code) + ")";
        std::snprintf(row, sizeof row, "%3d  %-34s  %s: see %s/run.log\n", i + 1, v.candidate.label().c_str(),
                      why.c_str(), dir.c_str());
        out << row;
        ++failed;
        continue;
      }
      const double err = v.predicted_ms / v.measured_ms - 1;
      errors.push_back(std::abs(err));
      const double mem_err = v.measured_peak_bytes > 0 ? v.predicted_peak_bytes / v.measured_peak_bytes - 1 : NAN;
      std::snprintf(row, sizeof row, "%3d  %-34s %12.1f %12.1f %+7.1f%% %14.1f %13.1f %+7.1f%%\n", i + 1,
                    v.candidate.label().c_str(), v.predicted_ms, v.measured_ms, 100 * err,
                    v.predicted_peak_bytes / kMiB, v.measured_peak_bytes / kMiB, 100 * mem_err);
      out << row;
      out.flush();
    }
    if (!errors.empty()) {
      out << "step time: median |error| " << 100 * median(errors) << "%, max "
          << 100 * *std::max_element(errors.begin(), errors.end()) << "% (error = predicted / measured - 1)\n";
    }
    if (failed > 0) {
      out << failed << " of " << k << " verify runs failed (their run.log says why)\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace gpipe

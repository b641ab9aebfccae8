// predict_candidate and make_plan: a candidate's step time from simulate_step with the measured
// per-stage costs, its memory from walking the simulated timeline, recompute raised where
// memory needs it, and the ranking.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "trainer/planner/planner.h"

namespace gpipe {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The layers of each virtual stage: [first, last) over the profile's layers.
std::vector<std::pair<size_t, size_t>> stage_layers(const std::vector<int64_t>& blocks_per_stage, size_t num_layers) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t next = 1;
  for (size_t s = 0; s < blocks_per_stage.size(); ++s) {
    const size_t first = s == 0 ? 0 : next;
    next += static_cast<size_t>(blocks_per_stage[s]);
    const size_t last = s + 1 == blocks_per_stage.size() ? num_layers : next;
    out.emplace_back(first, last);
  }
  return out;
}

struct StageModel {
  StageCosts costs;
  double held_bytes = 0;         // from F's end to B / I's end
  double weight_grad_bytes = 0;  // from I's end to W's end
  double workspace_bytes = 0;
  double parameters = 0;
};

// A stage's costs at `microbatch_size` with `recompute` of its blocks recomputed in backward:
// ceil(ratio x blocks) of them, its last blocks (before the head), run as one autograd node
// (models/common/recompute.cpp). Forward keeps none of their activations, only the run's input
// (the previous layer's output, counted there) and its output (the next layer's input); backward
// runs them all again before their gradients, so all their activations are live at once.
StageModel model_stage(const DeviceProfile& profile, size_t first, size_t last, int64_t microbatch_size,
                       double recompute, size_t num_layers) {
  StageModel st;
  st.costs = StageCosts{0, 0, 0, 0, 0};
  const size_t first_block = std::max<size_t>(first, 1);
  const size_t last_block = std::min(last, num_layers - 1);
  const size_t blocks = last_block > first_block ? last_block - first_block : 0;
  const size_t recomputed =
      recompute > 0 ? std::min(blocks, static_cast<size_t>(std::ceil(recompute * static_cast<double>(blocks) - 1e-9))) : 0;
  const size_t run_begin = last_block - recomputed;  // the run: [run_begin, last_block)
  double run_activations = 0, run_workspace = 0;
  for (size_t l = first; l < last; ++l) {
    const LayerMeasurement m = profile.layer_at(l, microbatch_size);
    const bool is_recomputed = recomputed > 0 && l >= run_begin && l < last_block;
    st.costs.forward += m.forward_ms;
    st.costs.backward_input += m.input_grad_ms + (is_recomputed ? m.forward_ms : 0.0);
    st.costs.backward_weight += m.weight_grad_ms;
    st.weight_grad_bytes += m.weight_grad_bytes;
    if (is_recomputed) {
      run_activations += m.activation_bytes;
      run_workspace = std::max(run_workspace, m.workspace_bytes);
      if (l + 1 == last_block) st.held_bytes += m.output_bytes;  // the run's output
    } else {
      st.held_bytes += m.activation_bytes;
      st.workspace_bytes = std::max(st.workspace_bytes, m.workspace_bytes);
    }
    st.parameters += static_cast<double>(profile.layer_parameters[l]);
  }
  st.workspace_bytes = std::max(st.workspace_bytes, run_activations + run_workspace);
  // The executor's own cost per action (queues, autograd engine entry, transport hand-off).
  st.costs.forward += profile.action_overhead_ms;
  st.costs.backward_input += profile.action_overhead_ms;
  st.costs.backward_weight += profile.action_overhead_ms;
  // Its output goes forward; the gradient it sends back is shaped like its input.
  const double output = profile.layer_at(last - 1, microbatch_size).output_bytes;
  const double input = first > 0 ? profile.layer_at(first - 1, microbatch_size).output_bytes : 0.0;
  st.costs.send_activation = profile.link_latency_ms + output * profile.link_ms_per_byte;
  st.costs.send_gradient = profile.link_latency_ms + input * profile.link_ms_per_byte;
  return st;
}

// The devices one replica's ranks run on, as the runner places them: on CPU the machine; on
// GPUs, one process puts rank r on GPU r % GPUs, and each replica's process sits on one GPU.
int replica_devices(const PlanCandidate& c, const DeviceProfile& profile) {
  if (profile.device == "cpu" || c.data_parallel > 1) return 1;
  return std::max(1, std::min(profile.devices, c.pipeline_ranks));
}

bool detail_is_backward(ActionType t) {
  return t == ActionType::kBackward || t == ActionType::kBackwardInput || t == ActionType::kBackwardWeight;
}

struct MemoryWalk {
  std::vector<double> rank_peak;    // static + activations + workspace, per rank
  std::vector<double> device_peak;  // base + its ranks' static + their activations over time + workspace
};

// `replicated` (data_parallel > 1): each stage's gradient all-reduce copies its gradients into
// flat buckets (GradientReducer::start) from its last gradient action on, kept to the step's end.
MemoryWalk walk_memory(const Schedule& schedule, const SimulatedStep& step, const std::vector<StageModel>& stages,
                       const DeviceProfile& profile, int devices, bool replicated) {
  const int P = schedule.num_ranks;
  MemoryWalk out;
  out.rank_peak.assign(static_cast<size_t>(P), 0.0);
  out.device_peak.assign(static_cast<size_t>(devices), profile.base_bytes);
  std::vector<double> rank_static(static_cast<size_t>(P), 0.0), rank_workspace(static_cast<size_t>(P), 0.0);
  for (int s = 0; s < schedule.num_stages(); ++s) {
    const auto r = static_cast<size_t>(schedule.rank_of_stage(s));
    rank_static[r] += profile.state_bytes_per_parameter * stages[static_cast<size_t>(s)].parameters;
    rank_workspace[r] = std::max(rank_workspace[r], stages[static_cast<size_t>(s)].workspace_bytes);
  }
  // (time, rank, delta): frees before allocations at the same instant.
  struct Event {
    double time;
    int rank;
    double delta;
  };
  std::vector<Event> events;
  std::vector<bool> has_grads(stages.size(), false), has_casts(stages.size(), false);
  std::vector<const SimulatedAction*> last_gradient(stages.size(), nullptr);
  std::vector<int> last_gradient_rank(stages.size(), 0);
  for (int r = 0; r < P; ++r) {
    for (const SimulatedAction& sa : step.timeline[static_cast<size_t>(r)]) {
      const auto s = static_cast<size_t>(sa.action.stage);
      const StageModel& st = stages[s];
      if (detail_is_backward(sa.action.type) && (last_gradient[s] == nullptr || sa.start > last_gradient[s]->start)) {
        last_gradient[s] = &sa;
        last_gradient_rank[s] = r;
      }
      // A stage's gradients appear at its first backward, its autocast copies at its first forward.
      if (detail_is_backward(sa.action.type) && !has_grads[s]) {
        has_grads[s] = true;
        events.push_back({sa.start, r, profile.grad_bytes_per_parameter * st.parameters});
      }
      if (sa.action.type == ActionType::kForward && !has_casts[s] && profile.cast_bytes_per_parameter > 0) {
        has_casts[s] = true;
        events.push_back({sa.start, r, profile.cast_bytes_per_parameter * st.parameters});
      }
      switch (sa.action.type) {
        // Held from the forward's start: it allocates as it runs, and an overlapped pair's backward
        // (same span) frees only at its end, so both halves' activations are live at once.
        case ActionType::kForward: events.push_back({sa.start, r, st.held_bytes}); break;
        case ActionType::kBackward: events.push_back({sa.end, r, -st.held_bytes}); break;
        case ActionType::kBackwardInput:
          events.push_back({sa.end, r, -(st.held_bytes - st.weight_grad_bytes)});
          break;
        case ActionType::kBackwardWeight: events.push_back({sa.end, r, -st.weight_grad_bytes}); break;
        default: break;
      }
    }
  }
  for (size_t s = 0; replicated && s < stages.size(); ++s) {
    if (last_gradient[s] != nullptr) {
      events.push_back({last_gradient[s]->start, last_gradient_rank[s], profile.grad_bytes_per_parameter * stages[s].parameters});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.delta < b.delta;
  });
  std::vector<double> rank_now(static_cast<size_t>(P), 0.0), rank_max(static_cast<size_t>(P), 0.0);
  std::vector<double> device_now(static_cast<size_t>(devices), 0.0), device_max(static_cast<size_t>(devices), 0.0);
  for (const Event& e : events) {
    const auto r = static_cast<size_t>(e.rank);
    const auto d = static_cast<size_t>(e.rank % devices);
    rank_now[r] += e.delta;
    device_now[d] += e.delta;
    rank_max[r] = std::max(rank_max[r], rank_now[r]);
    device_max[d] = std::max(device_max[d], device_now[d]);
  }
  for (int r = 0; r < P; ++r) {
    const auto ri = static_cast<size_t>(r);
    out.rank_peak[ri] = rank_static[ri] + rank_max[ri] + rank_workspace[ri];
  }
  std::vector<double> device_workspace(static_cast<size_t>(devices), 0.0);
  for (int r = 0; r < P; ++r) {
    const auto d = static_cast<size_t>(r % devices);
    out.device_peak[d] += rank_static[static_cast<size_t>(r)];
    device_workspace[d] = std::max(device_workspace[d], rank_workspace[static_cast<size_t>(r)]);
  }
  for (int d = 0; d < devices; ++d) {
    out.device_peak[static_cast<size_t>(d)] += device_max[static_cast<size_t>(d)] + device_workspace[static_cast<size_t>(d)];
  }
  return out;
}

Schedule candidate_schedule(const PlanCandidate& c) {
  Schedule compute = make_schedule(parse_schedule_kind(c.schedule), c.pipeline_ranks, c.microbatches / c.data_parallel,
                                   c.virtual_stages);
  if (c.overlap) compute = with_overlap(compute, OverlapMode::kOn);
  // As the executors run it: with its sends and receives (a receive only posts; the compute
  // that needs the tensor waits for it).
  return with_communication(compute);
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / (1024.0 * kMiB)); }

}  // namespace

LayerMeasurement DeviceProfile::layer_at(size_t layer, int64_t microbatch_size) const {
  if (layers.empty() || layer >= layers.front().size()) throw std::out_of_range("DeviceProfile::layer_at: no such layer");
  if (layers.size() == 1 || microbatch_sizes.size() < 2) {
    // One size measured: scale the memory with the tokens, keep the time (no slope known).
    LayerMeasurement m = layers.front()[layer];
    const double k = static_cast<double>(microbatch_size) / static_cast<double>(microbatch_sizes.front());
    m.activation_bytes *= k;
    m.weight_grad_bytes *= k;
    m.output_bytes *= k;
    m.workspace_bytes *= k;
    return m;
  }
  // Piecewise linear between the measured sizes (ascending), extended from the end segments.
  size_t hi = 1;
  while (hi + 1 < microbatch_sizes.size() && microbatch_sizes[hi] < microbatch_size) ++hi;
  const LayerMeasurement& a = layers[hi - 1][layer];
  const LayerMeasurement& b = layers[hi][layer];
  const double t = static_cast<double>(microbatch_size - microbatch_sizes[hi - 1]) /
                   static_cast<double>(microbatch_sizes[hi] - microbatch_sizes[hi - 1]);
  auto lerp = [&](double x, double y) { return std::max(0.0, x + t * (y - x)); };
  return LayerMeasurement{lerp(a.forward_ms, b.forward_ms),          lerp(a.input_grad_ms, b.input_grad_ms),
                          lerp(a.weight_grad_ms, b.weight_grad_ms),  lerp(a.activation_bytes, b.activation_bytes),
                          lerp(a.weight_grad_bytes, b.weight_grad_bytes), lerp(a.output_bytes, b.output_bytes),
                          lerp(a.workspace_bytes, b.workspace_bytes)};
}

PlannedCandidate predict_candidate(const PlanCandidate& candidate, const PipelineConfig& config,
                                   const DeviceProfile& profile, bool allow_recompute) {
  PlannedCandidate out{candidate, {}};
  PlanCandidate& c = out.candidate;
  // The runtime refuses recomputation with dropout (new masks in the replay): never raise it then,
  // or the written plan would not load.
  const bool dropout = config.model.dropout > 0;
  allow_recompute = allow_recompute && !dropout;
  const Schedule schedule = candidate_schedule(c);
  const size_t num_layers = profile.layer_names.size();
  const auto stages_wanted = static_cast<size_t>(schedule.num_stages());
  int64_t blocks = 0;
  for (int64_t b : c.blocks_per_stage) blocks += b;
  if (c.blocks_per_stage.size() != stages_wanted || c.recompute_ratio.size() != stages_wanted ||
      num_layers < 3 || blocks != static_cast<int64_t>(num_layers) - 2 ||
      std::any_of(c.blocks_per_stage.begin(), c.blocks_per_stage.end(), [](int64_t b) { return b < 1; })) {
    throw std::invalid_argument("predict_candidate: " + c.label() + " needs one block count (>= 1) and one recompute "
                                "ratio per stage (" + std::to_string(stages_wanted) + "), the blocks summing to the "
                                "model's " + std::to_string(num_layers > 2 ? num_layers - 2 : 0));
  }
  const int64_t microbatch_size = config.dataset.batch_size / c.microbatches;
  const auto ranges = stage_layers(c.blocks_per_stage, num_layers);
  double total_parameters = 0;
  for (int64_t p : profile.layer_parameters) total_parameters += static_cast<double>(p);
  // On one machine's CPU the replicas' processes share its memory.
  const double budget = profile.device == "cpu" ? profile.memory_per_device_bytes / c.data_parallel
                                                : profile.memory_per_device_bytes;
  SimulateOptions sim;
  sim.pair_serial_share = profile.pair_serial_share;
  // Ranks that share a device share its throughput (measured); on CPU the replicas' processes
  // share the machine's cores too.
  sim.rank_concurrency = profile.rank_concurrency;
  for (size_t k = 1; k < sim.rank_concurrency.size(); ++k) sim.rank_concurrency[k] *= profile.sharing_efficiency;
  sim.devices = replica_devices(c, profile);
  sim.replicas = profile.device == "cpu" ? c.data_parallel : 1;
  for (int attempt = 0;; ++attempt) {
    std::vector<StageModel> stages;
    std::vector<StageCosts> costs;
    for (size_t s = 0; s < ranges.size(); ++s) {
      stages.push_back(model_stage(profile, ranges[s].first, ranges[s].second, microbatch_size, c.recompute_ratio[s],
                                   num_layers));
      costs.push_back(stages.back().costs);
    }
    const SimulatedStep step = simulate_step(schedule, costs, sim);
    const MemoryWalk mem = walk_memory(schedule, step, stages, profile, sim.devices, c.data_parallel > 1);
    PlanPrediction& p = out.prediction;
    p.pipeline_ms = step.makespan;
    p.bubble = step.bubble;
    // The optimizer steps every stage of a process in turn. Replicas first average their
    // gradients: one all-reduce per stage (each stage's own group; a stage's gradients, ring:
    // 2 (d-1)/d of its bytes on the link), started when its last backward ends; the last stage
    // to finish (stage 0's rank, usually) leaves its own collectives after the pipeline, the
    // latency of every stage's collective included (they queue on one Gloo / NCCL connection).
    double allreduce_ms = 0;
    if (c.data_parallel > 1) {
      allreduce_ms += profile.replica_step_ms;
      const double d = c.data_parallel;
      for (const StageModel& st : stages) {
        allreduce_ms += profile.replica_link_latency_ms * 2 * (d - 1) +
                        2.0 * (d - 1) / d * 4.0 * st.parameters * profile.replica_link_ms_per_byte;
      }
    }
    // Ranks sharing a device cannot run more than its capacity at once: the step is at least
    // their work divided by what k busy ranks achieve together.
    p.step_ms = p.pipeline_ms + profile.optimizer_ms_per_parameter * total_parameters + allreduce_ms;
    p.tokens_per_s = static_cast<double>(config.dataset.batch_size * config.model.sequence_length) / (p.step_ms / 1e3);
    p.peak_bytes_per_rank = mem.rank_peak;
    p.peak_bytes_per_device = mem.device_peak;
    const auto worst = std::max_element(mem.device_peak.begin(), mem.device_peak.end());
    p.fits = budget <= 0 || *worst <= budget;
    if (p.fits) {
      if (attempt > 0) p.why_not = "recompute raised to fit memory";
      return out;
    }
    // Over budget: raise the recompute of the stages of the fullest rank on that device.
    const int device = static_cast<int>(worst - mem.device_peak.begin());
    // (devices: as above, one entry of mem.device_peak each)
    int fullest = -1;
    for (int r = 0; r < schedule.num_ranks; ++r) {
      if (r % sim.devices != device) continue;
      bool can_raise = false;
      for (int s = 0; s < schedule.num_stages(); ++s)
        if (schedule.rank_of_stage(s) == r && c.recompute_ratio[static_cast<size_t>(s)] < 1.0) can_raise = true;
      if (can_raise && (fullest < 0 || mem.rank_peak[static_cast<size_t>(r)] > mem.rank_peak[static_cast<size_t>(fullest)]))
        fullest = r;
    }
    if (!allow_recompute || fullest < 0) {
      p.why_not = fmt::format("needs {} on device {}, the budget is {}{}", gib(*worst), device, gib(budget),
                              allow_recompute ? " (with every block recomputed)"
                              : dropout       ? " (no recomputation: model.dropout > 0)"
                                              : "");
      return out;
    }
    for (int s = 0; s < schedule.num_stages(); ++s) {
      if (schedule.rank_of_stage(s) != fullest) continue;
      double& r = c.recompute_ratio[static_cast<size_t>(s)];
      r = std::min(1.0, r + 0.25);
    }
  }
}

double usable_device_bytes(int64_t total, int64_t free, int64_t reserved_here) {
  return 0.95 * static_cast<double>(std::min(total, std::max<int64_t>(0, free) + std::max<int64_t>(0, reserved_here)));
}

Plan make_plan(const PipelineConfig& config, const DeviceProfile& profile, const PlanOptions& options) {
  Plan plan;
  const std::vector<PlanCandidate> candidates = enumerate_candidates(config, profile, options, &plan.notes);
  for (const PlanCandidate& c : candidates) {
    PlannedCandidate planned = predict_candidate(c, config, profile, options.allow_recompute);
    ++plan.considered;
    (planned.prediction.fits ? plan.ranked : plan.rejected).push_back(std::move(planned));
  }
  auto worst_device = [](const PlannedCandidate& p) {
    return *std::max_element(p.prediction.peak_bytes_per_device.begin(), p.prediction.peak_bytes_per_device.end());
  };
  std::stable_sort(plan.ranked.begin(), plan.ranked.end(), [](const PlannedCandidate& a, const PlannedCandidate& b) {
    return a.prediction.step_ms < b.prediction.step_ms;
  });
  std::stable_sort(plan.rejected.begin(), plan.rejected.end(), [&](const PlannedCandidate& a, const PlannedCandidate& b) {
    return worst_device(a) < worst_device(b);
  });
  plan.notes.push_back("sync_mode asp is not considered: it changes what is trained, not only how fast");
  if (options.allow_recompute && config.model.dropout > 0) {
    plan.notes.push_back("recompute_ratio stays 0: model.dropout > 0, and a recomputed block would draw new masks");
  }
  if (plan.ranked.empty()) {
    const PlannedCandidate& nearest = plan.rejected.front();
    throw ConfigError(fmt::format(
        "no configuration fits the memory: {} candidates considered; the nearest, {}, {}. Give more memory "
        "(--memory-budget-gib, more GPUs: --world-size), a smaller model or a smaller dataset.batch_size",
        plan.considered, nearest.candidate.label(), nearest.prediction.why_not));
  }
  return plan;
}

}  // namespace gpipe

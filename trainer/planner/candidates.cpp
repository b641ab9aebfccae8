// enumerate_candidates: the legal pipeline configurations for a model, batch and world size.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "trainer/partition/partition.h"
#include "trainer/planner/planner.h"

namespace gpipe {
namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

// Virtual stages per rank each family takes (1 for the one-stage kinds, 2 for the V shapes; the
// multi-stage kinds from 2: with 1 they are 1F1B / GPipe again).
std::vector<int> virtual_stage_choices(ScheduleKind kind, int max_virtual) {
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1:
      return {1};
    case ScheduleKind::kZeroBubbleV:
    case ScheduleKind::kDualPipeV:
      return {2};
    default: {
      std::vector<int> out;
      for (int v = 2; v <= max_virtual; ++v) out.push_back(v);
      return out;
    }
  }
}

bool legal(const Schedule& compute_only) {
  try {
    return validate(with_communication(compute_only)).ok;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

}  // namespace

std::string PlanCandidate::label() const {
  std::string out = fmt::format("{} p{} v{} m{} dp{}", schedule, pipeline_ranks, virtual_stages, microbatches, data_parallel);
  if (overlap) out += " +ovl";
  if (std::any_of(recompute_ratio.begin(), recompute_ratio.end(), [](double r) { return r > 0; })) out += " +rc";
  return out;
}

std::vector<PlanCandidate> enumerate_candidates(const PipelineConfig& config, const DeviceProfile& profile,
                                                const PlanOptions& options, std::vector<std::string>* notes) {
  const int64_t num_layers = static_cast<int64_t>(profile.layer_names.size());
  const int64_t blocks = num_layers - 2;
  if (blocks < 1) throw ConfigError("the planner needs a model with at least one block between its first and last layer");
  const int world = options.world_size > 0 ? options.world_size
                                           : config.parallel.model_parallel_size * config.parallel.data_parallel_size;
  const int64_t batch = config.dataset.batch_size;
  std::vector<std::string> kinds = options.schedules;
  if (kinds.empty()) {
    for (auto k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1,
                   ScheduleKind::kInterleavedOneFOneB, ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kLoopedBFS,
                   ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV}) {
      kinds.emplace_back(to_string(k));
    }
  }
  auto note = [&](const std::string& text) {
    if (notes && std::find(notes->begin(), notes->end(), text) == notes->end()) notes->push_back(text);
  };
  std::vector<PlanCandidate> out;
  for (int dp : divisors(world)) {
    const int ranks = world / dp;
    if (ranks > blocks) {
      note(fmt::format("{} pipeline ranks (data_parallel_size {}): more ranks than the model's {} blocks", ranks, dp, blocks));
      continue;
    }
    if (profile.device != "cpu" && dp > std::max(1, profile.devices)) {
      note(fmt::format("data_parallel_size {}: each replica's process needs a GPU of its own (NCCL refuses two on "
                       "one), {} visible", dp, std::max(1, profile.devices)));
      continue;
    }
    if (batch % dp != 0) {
      note(fmt::format("data_parallel_size {}: does not divide dataset.batch_size {}", dp, batch));
      continue;
    }
    for (const std::string& name : kinds) {
      const ScheduleKind kind = parse_schedule_kind(name);
      for (int v : virtual_stage_choices(kind, options.max_virtual_stages)) {
        const int stages = ranks * v;
        if (stages > blocks) {
          note(fmt::format("{} with {} virtual stages on {} ranks: {} stages for {} blocks", name, v, ranks, stages, blocks));
          continue;
        }
        for (int m : divisors(batch)) {
          if (m > options.max_microbatches || m % dp != 0) continue;
          Schedule compute;
          try {
            compute = make_schedule(kind, ranks, m / dp, v);
          } catch (const std::invalid_argument& e) {
            note(fmt::format("{} v{} m{} on {} ranks: {}", name, v, m, ranks, e.what()));
            continue;
          }
          if (!legal(compute)) continue;
          const int64_t microbatch_size = batch / m;
          std::vector<double> layer_ms;
          for (int64_t l = 0; l < num_layers; ++l) {
            const LayerMeasurement lm = profile.layer_at(static_cast<size_t>(l), microbatch_size);
            layer_ms.push_back(std::max(1e-9, lm.forward_ms + lm.input_grad_ms + lm.weight_grad_ms));
          }
          PlanCandidate c;
          c.schedule = name;
          c.pipeline_ranks = ranks;
          c.virtual_stages = v;
          c.microbatches = m;
          c.data_parallel = dp;
          c.blocks_per_stage = partition_blocks("time", layer_ms, stages);
          c.recompute_ratio.assign(static_cast<size_t>(stages), 0.0);
          try {
            // What the runner will check: the config, and its stream layout against the
            // schedule's pairs (parallel.streams=per_rank runs no pair; dualpipev's are built in).
            const PipelineConfig planned = plan_config(config, c);
            planned.validate();
            check_stream_layout(planned.parallel, compute);
          } catch (const ConfigError& e) {
            note(fmt::format("{}: {}", c.label(), e.what()));
            continue;
          }
          out.push_back(c);
          if (options.allow_overlap && kind != ScheduleKind::kGPipe && kind != ScheduleKind::kDualPipeV) {
            try {
              const Schedule paired = with_overlap(compute, OverlapMode::kOn);
              if (count_overlapped_pairs(paired) > 0 && legal(paired)) {
                c.overlap = true;
                check_stream_layout(plan_config(config, c).parallel, paired);
                out.push_back(c);
              }
            } catch (const std::invalid_argument&) {
            } catch (const ConfigError& e) {
              note(fmt::format("{}: {}", c.label(), e.what()));
            }
          }
        }
      }
    }
  }
  if (out.empty()) {
    std::string why;
    if (notes) {
      for (size_t i = 0; i < std::min<size_t>(3, notes->size()); ++i) why += "; " + (*notes)[i];
    }
    throw ConfigError(fmt::format(
        "no pipeline configuration is legal for a world of {} ranks, {} blocks and dataset.batch_size {}{}: give a "
        "world size (--world-size) of at most {} pipeline ranks, a batch with more divisors, or fewer restrictions "
        "(--plan-schedules, --plan-max-microbatches)", world, blocks, batch, why, blocks));
  }
  return out;
}

}  // namespace gpipe

// What --plan shows and writes: the ranked table, why the other families lost, and the chosen
// configuration as YAML the runner takes unchanged.
#include <algorithm>
#include <map>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "trainer/planner/planner.h"

namespace gpipe {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::string recompute_text(const std::vector<double>& r) {
  if (std::none_of(r.begin(), r.end(), [](double x) { return x > 0; })) return "-";
  std::string out;
  for (size_t i = 0; i < r.size(); ++i) out += (i ? "," : "") + fmt::format("{:g}", r[i]);
  return out;
}

}  // namespace

PipelineConfig plan_config(const PipelineConfig& base, const PlanCandidate& c) {
  PipelineConfig out = base;
  auto& p = out.parallel;
  p.schedule = c.schedule;
  p.schedule_file.clear();
  p.model_parallel_size = c.pipeline_ranks;
  p.virtual_stages = c.virtual_stages;
  p.data_parallel_size = c.data_parallel;
  p.overlap_f_b = c.overlap ? "true" : "auto";
  p.sync_mode = "bsp";
  p.asp_window_steps = 1;  // an asp setting: bsp refuses any other
  p.partition = "explicit";
  p.partition_file.clear();
  p.partition_layers = c.blocks_per_stage;
  p.recompute_ratio.clear();
  if (std::any_of(c.recompute_ratio.begin(), c.recompute_ratio.end(), [](double r) { return r > 0; }))
    p.recompute_ratio = c.recompute_ratio;
  p.placement.clear();
  out.training.num_microbatches = c.microbatches;
  return out;
}

std::string plan_train_command(const PlanCandidate& candidate, const std::string& config_path) {
  std::string command = "gpipe_runner --config " + config_path;
  if (candidate.data_parallel > 1) {
    command += fmt::format(" --nproc-per-node {0} ({0} replicas, a process each; or torchrun / srun with {0} processes)",
                           candidate.data_parallel);
  }
  return command;
}

std::string plan_yaml(const PipelineConfig& base, const PlannedCandidate& pick, const DeviceProfile& profile) {
  const PlanPrediction& p = pick.prediction;
  std::ostringstream out;
  out << "# Written by gpipe_runner --plan: " << pick.candidate.label() << "\n";
  out << fmt::format("# Measured on {}: {} layers at micro-batch sizes {}; optimizer {:.3g} ms per million parameters; "
                     "link {:.3g} ms + {:.3g} ms/MiB ({}); overlapped pairs run {:.0f}% serially; ranks sharing a "
                     "device reach {:.2f} of their measured concurrency, an action costs {:.3g} ms beyond its layers, replicas "
                     "{:.3g} ms per step (calibrated).\n",
                     profile.device, profile.layer_names.size(), join(profile.microbatch_sizes),
                     profile.optimizer_ms_per_parameter * 1e6, profile.link_latency_ms, profile.link_ms_per_byte * kMiB,
                     profile.link_source, 100 * profile.pair_serial_share, profile.sharing_efficiency,
                     profile.action_overhead_ms, profile.replica_step_ms);
  out << fmt::format("# Predicted: step {:.1f} ms (pipeline {:.1f} ms), bubble {:.1f}%, {:.0f} tokens/s, peak {:.1f} MiB "
                     "on the fullest rank, {:.1f} MiB on the fullest device.\n",
                     p.step_ms, p.pipeline_ms, 100 * p.bubble, p.tokens_per_s, max_of(p.peak_bytes_per_rank) / kMiB,
                     max_of(p.peak_bytes_per_device) / kMiB);
  out << "# Train with it: " << plan_train_command(pick.candidate, "<this file>")
      << ". Plan again (other flags) with --plan on the original config.\n";
  out << plan_config(base, pick.candidate).to_yaml();
  return out.str();
}

std::string render_plan_table(const Plan& plan, const DeviceProfile& profile, int rows) {
  std::ostringstream out;
  out << fmt::format("{} configurations simulated on {}'s measured costs: {} fit, {} do not fit the memory\n\n",
                     plan.considered, profile.device, plan.ranked.size(), plan.rejected.size());
  out << fmt::format("{:>3}  {:<34} {:>10} {:>8} {:>10} {:>11} {:>11}  {:<18} {}\n", "#", "candidate", "step ms",
                     "bubble", "tokens/s", "rank MiB", "device MiB", "blocks/stage", "recompute");
  const double best = plan.ranked.empty() ? 0.0 : plan.ranked.front().prediction.step_ms;
  for (int i = 0; i < std::min<int>(rows, static_cast<int>(plan.ranked.size())); ++i) {
    const auto& [c, p] = plan.ranked[static_cast<size_t>(i)];
    out << fmt::format("{:>3}  {:<34} {:>10.1f} {:>7.1f}% {:>10.0f} {:>11.1f} {:>11.1f}  {:<18} {}\n", i + 1, c.label(),
                       p.step_ms, 100 * p.bubble, p.tokens_per_s, max_of(p.peak_bytes_per_rank) / kMiB,
                       max_of(p.peak_bytes_per_device) / kMiB, join(c.blocks_per_stage), recompute_text(c.recompute_ratio));
  }
  // Why the others lost: each family's best against the pick.
  std::map<std::string, const PlannedCandidate*> family_best;
  for (const auto& pc : plan.ranked) {
    const auto it = family_best.find(pc.candidate.schedule);
    if (it == family_best.end()) family_best[pc.candidate.schedule] = &pc;
  }
  if (!plan.ranked.empty()) {
    out << "\nWhy the others lost (each schedule's best against the pick):\n";
    for (const auto& [name, pc] : family_best) {
      const double slower = pc->prediction.step_ms / best - 1;
      const auto& pick = plan.ranked.front().prediction;
      const bool is_pick = pc == &plan.ranked.front();
      std::string why = is_pick ? "the pick" : slower <= 0 ? "ties the pick" : fmt::format("{:+.1f}% step time", 100 * slower);
      if (slower > 0) {
        if (pc->prediction.bubble > pick.bubble + 0.01)
          why += fmt::format(": bubble {:.1f}% vs {:.1f}%", 100 * pc->prediction.bubble, 100 * pick.bubble);
        else
          why += fmt::format(": pipeline {:.1f} ms vs {:.1f} ms (more per-action overhead, transfers or optimizer)",
                             pc->prediction.pipeline_ms, pick.pipeline_ms);
      }
      out << fmt::format("  {:<18} {:<34} {}\n", name, pc->candidate.label(), why);
    }
  }
  if (!plan.rejected.empty()) {
    out << "\nDo not fit the memory (" << plan.rejected.size() << "), nearest first:\n";
    for (size_t i = 0; i < std::min<size_t>(3, plan.rejected.size()); ++i)
      out << fmt::format("  {:<34} {}\n", plan.rejected[i].candidate.label(), plan.rejected[i].prediction.why_not);
  }
  constexpr size_t kNotes = 6;
  for (size_t i = 0; i < std::min(kNotes, plan.notes.size()); ++i) out << "note: " << plan.notes[i] << "\n";
  if (plan.notes.size() > kNotes) out << "note: ... and " << plan.notes.size() - kNotes << " more (plan.json)\n";
  return out.str();
}

}  // namespace gpipe

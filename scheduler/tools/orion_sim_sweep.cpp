// orion-sim sweep: every policy over a grid of its parameters on one workload, the trade-off
// between high-priority latency and best-effort throughput (each against its client alone), and
// the Pareto front. The grid: priority; orion at a few SM thresholds; partition with the
// best-effort share stepped by the granularity, high priority on all SMs or the rest, and no
// gating or orion's gating inside the partition; the adaptive partition at a few latency targets,
// starting from half the SMs.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "orion_sim.h"

namespace orion_sim {

namespace {
constexpr double kGoalHpP99 = 1.10;  // issue 14: HP p99 at most 1.10x of alone ...
constexpr double kGoalBe = 0.60;     // ... while best effort keeps at least 0.60x of its alone throughput
}  // namespace

Sweep run_sweep(const sched::Workload& workload, const StudyOptions& options) {
  Sweep sweep;
  sweep.alone = run_alone(workload, options);
  std::vector<SweepPoint> grid;
  grid.push_back({"priority", "priority", {}});
  for (const char* frac : {"0.25", "0.5", "0.75", "1"})
    grid.push_back({std::string("orion sm_threshold_frac=") + frac, "orion", {{"sm_threshold_frac", frac}}});
  const int sms = options.gpu.sm_count;
  constexpr int kGranularity = 8;
  // At most about 16 sizes (a big --sms would make hundreds of points), each a whole number of
  // granularity steps, and only those be_sm_frac can name (the policy takes 0.01 .. 0.99).
  const int step = kGranularity * std::max(1, sms / kGranularity / 16);
  for (int be = kGranularity; be <= sms - kGranularity; be += step) {
    // be_sm_frac chosen so that the policy's rounding lands on exactly `be` SMs.
    const double fraction = (static_cast<double>(be) + 0.5) / static_cast<double>(sms);
    if (fraction < 0.01 || fraction > 0.99) continue;
    char frac[32];
    std::snprintf(frac, sizeof frac, "%.6f", fraction);
    for (const char* rest : {"0", "1"}) {
      for (const char* gate : {"0", "2"}) {
        grid.push_back({"partition be_sms=" + std::to_string(be) + " hp_rest=" + rest + " gate=" + gate, "partition",
                        {{"be_sm_frac", frac}, {"hp_rest", rest}, {"gate", gate}}});
      }
    }
  }
  for (const char* target : {"1.05", "1.10", "1.25", "1.5"}) {
    for (const char* rest : {"0", "1"}) {
      grid.push_back({std::string("partition adaptive target=") + target + " hp_rest=" + rest, "partition",
                      {{"adaptive", "1"}, {"hp_latency_target", target}, {"hp_rest", rest}}});
    }
  }
  for (SweepPoint& p : grid) {
    const StudyRow row = run_point(workload, options, p.policy, p.params);
    p.hp_p99_ratio = sweep.alone.hp_p99_ns > 0 ? row.hp_p99_ns / sweep.alone.hp_p99_ns : 0;
    p.be_ratio = sweep.alone.be_per_s > 0 ? row.be_per_s / sweep.alone.be_per_s : 0;
    p.meets_goal = p.hp_p99_ratio <= kGoalHpP99 && p.be_ratio >= kGoalBe;
    p.mean_be_sms = row.mean_be_sms;
    p.resizes = row.partition_resizes;
  }
  for (SweepPoint& p : grid) {
    p.pareto = true;
    for (const SweepPoint& q : grid) {
      const bool no_worse = q.hp_p99_ratio <= p.hp_p99_ratio && q.be_ratio >= p.be_ratio;
      const bool better = q.hp_p99_ratio < p.hp_p99_ratio || q.be_ratio > p.be_ratio;
      if (&q != &p && no_worse && better) p.pareto = false;
    }
  }
  sweep.points = std::move(grid);
  return sweep;
}

std::string format_sweep(const Sweep& s) {
  std::ostringstream out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "alone: HP p99 %.3f ms, BE %.2f requests/s; goal: HP p99 <= %.2fx and BE >= %.2fx\n\n",
                s.alone.hp_p99_ns / 1e6, s.alone.be_per_s, kGoalHpP99, kGoalBe);
  out << buf
      << "| point | HP p99 / alone | BE / alone | BE SMs (mean) | resizes | Pareto front | meets goal |\n"
         "|---|---|---|---|---|---|---|\n";
  for (const SweepPoint& p : s.points) {
    char sms[32] = "-";
    if (p.mean_be_sms > 0) std::snprintf(sms, sizeof sms, "%.1f", p.mean_be_sms);
    std::snprintf(buf, sizeof buf, "| %s | %.2fx | %.2fx | %s | %llu | %s | %s |\n", p.label.c_str(), p.hp_p99_ratio,
                  p.be_ratio, sms, static_cast<unsigned long long>(p.resizes), p.pareto ? "yes" : "",
                  p.meets_goal ? "yes" : "");
    out << buf;
  }
  return out.str();
}

std::string sweep_csv(const Sweep& s) {
  std::ostringstream out;
  out << "point,policy,hp_p99_ratio,be_ratio,pareto,meets_goal,mean_be_sms,resizes\n";
  for (const SweepPoint& p : s.points) {
    // The adaptive partition gets its own name here (and its own colour in scripts/plot_sweep.py).
    const auto adaptive = p.params.find("adaptive");
    const bool is_adaptive = adaptive != p.params.end() && adaptive->second == "1";
    out << '"' << p.label << "\"," << (is_adaptive ? "partition-adaptive" : p.policy) << ',' << p.hp_p99_ratio << ','
        << p.be_ratio << ',' << p.pareto << ',' << p.meets_goal << ',' << p.mean_be_sms << ',' << p.resizes << '\n';
  }
  return out.str();
}

}  // namespace orion_sim

// The study: each client alone for reference, then the whole workload under each policy (rows and
// tables in study.cpp, shared with orion-replay-gpu).
#include "orion_sim.h"

namespace orion_sim {

Study run_study(const sched::Workload& workload, const StudyOptions& options) {
  Study study;
  study.alone = run_alone(workload, options);
  std::vector<std::string> policies = options.policies.empty() ? sched::policy_names() : options.policies;
  for (const std::string& policy : policies) {
    const std::string trace = options.trace_dir.empty() ? "" : options.trace_dir + "/" + policy + ".trace.json";
    study.rows.push_back(run_point(workload, options, policy, params_for(policy, options.params), trace));
  }
  return study;
}

}  // namespace orion_sim

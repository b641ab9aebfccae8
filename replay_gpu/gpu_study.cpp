// Child runs, the measured and predicted studies, and their JSON (gpu_study.h).
#include "gpu_study.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "child_process.h"

namespace replay_gpu {

using nlohmann::json;

std::vector<RunSpec> run_specs(const std::vector<std::string>& policies) {
  std::vector<RunSpec> specs;
  specs.push_back({kNoShimLabel, "passthrough", false, true});
  for (const std::string& p : policies) specs.push_back({p, p, true, false});
  return specs;
}

std::map<std::string, std::optional<std::string>> child_environment(const RunSpec& spec, const StudyConfig& config) {
  std::map<std::string, std::optional<std::string>> env = {
      {"LD_PRELOAD", std::nullopt}, {"USE_ORION_SCHEDULER", std::nullopt}, {"ORION_POLICY", std::nullopt},
      {"ORION_POLICY_PARAMS", std::nullopt}, {"ORION_BE_MAX_WAIT_US", std::nullopt}};
  if (!spec.shim) return env;
  if (config.shim_path.empty()) throw std::invalid_argument("run " + spec.label + " needs the shim: pass --shim PATH/libgpu_scheduler.so");
  env["LD_PRELOAD"] = config.shim_path;
  env["USE_ORION_SCHEDULER"] = "1";
  env["ORION_POLICY"] = spec.policy;
  std::string params;
  for (const auto& [k, v] : orion_sim::params_for(spec.policy, config.params)) {
    params += (params.empty() ? "" : ",") + k + "=" + v;
  }
  if (!params.empty()) env["ORION_POLICY_PARAMS"] = params;
  env["ORION_BE_MAX_WAIT_US"] = std::to_string(config.be_max_wait_ns / 1000);
  return env;
}

std::vector<std::string> child_command(const RunSpec& spec, const StudyConfig& config, const std::string& output) {
  std::vector<std::string> cmd = {self_executable(), config.workload_path, "--child", spec.label, "--child-output", output};
  if (spec.shim) cmd.insert(cmd.end(), {"--child-policy", spec.policy});
  if (spec.alone) cmd.push_back("--child-alone");
  cmd.insert(cmd.end(), config.child_args.begin(), config.child_args.end());
  return cmd;
}

std::vector<ChildResult> run_children(const std::vector<RunSpec>& specs, const StudyConfig& config) {
  std::vector<ChildResult> results;
  for (const RunSpec& spec : specs) {
    const std::string output = config.result_dir + "/" + spec.label + ".json";
    const int rc = run_child(child_command(spec, config, output), child_environment(spec, config));
    if (rc == kExitNoGpu) {
      throw std::runtime_error("run " + spec.label + ": no CUDA device (see the message above)");
    }
    if (rc != 0) {
      throw std::runtime_error("run " + spec.label + (spec.shim ? " (shim " + config.shim_path + ")" : "") +
                               " failed with exit status " + std::to_string(rc) + " (its message is above)");
    }
    results.push_back(read_child_result(output));
  }
  return results;
}

orion_sim::Study measured_study(const std::vector<ChildResult>& runs) {
  orion_sim::Study study;
  for (const ChildResult& r : runs) {
    if (!r.alone.empty()) study.alone = orion_sim::alone_row(r.alone);
    orion_sim::StudyRow row = orion_sim::summarise(r.together);
    row.policy = r.label;
    study.rows.push_back(row);
  }
  return study;
}

orion_sim::Study predicted_study(const sched::Workload& workload, const std::vector<RunSpec>& specs,
                                 const sched::PolicyParams& params, const sched::SimGpuConfig& gpu,
                                 int64_t be_max_wait_ns) {
  orion_sim::StudyOptions options;
  options.gpu = gpu;
  options.be_max_wait_ns = be_max_wait_ns;
  options.hw_priority = "on";
  orion_sim::Study study;
  study.alone = orion_sim::run_alone(workload, options);
  for (const RunSpec& spec : specs) {
    orion_sim::StudyRow row = orion_sim::run_point(workload, options, spec.policy, orion_sim::params_for(spec.policy, params));
    row.policy = spec.label;
    study.rows.push_back(row);
  }
  return study;
}

namespace {

json row_json(const orion_sim::StudyRow& r) {
  json j = {{"policy", r.policy},
            {"hp_p50_ms", r.hp_p50_ns / 1e6},
            {"hp_p99_ms", r.hp_p99_ns / 1e6},
            {"hp_exec_p99_ms", r.hp_exec_p99_ns / 1e6},
            {"be_requests_per_s", r.be_per_s},
            {"makespan_ms", static_cast<double>(r.makespan_ns) / 1e6},
            {"forced_by_starvation", r.forced_by_starvation}};
  j["sm_utilisation"] = r.sm_utilisation < 0 ? json(nullptr) : json(r.sm_utilisation);
  return j;
}

double relative_error(double measured, double predicted) {
  return predicted == 0 ? 0.0 : (measured - predicted) / predicted;
}

json errors_json(const orion_sim::StudyRow& m, const orion_sim::StudyRow& p) {
  return {{"hp_p50", relative_error(m.hp_p50_ns, p.hp_p50_ns)},
          {"hp_p99", relative_error(m.hp_p99_ns, p.hp_p99_ns)},
          {"hp_exec_p99", relative_error(m.hp_exec_p99_ns, p.hp_exec_p99_ns)},
          {"be_requests_per_s", relative_error(m.be_per_s, p.be_per_s)},
          {"makespan", relative_error(static_cast<double>(m.makespan_ns), static_cast<double>(p.makespan_ns))}};
}

}  // namespace

json study_json(const std::string& workload_path, const std::vector<ChildResult>& runs,
                const orion_sim::Study& measured, const orion_sim::Study* predicted) {
  json out;
  out["workload"] = workload_path;
  out["table"] = orion_sim::format_study(measured);
  out["alone"] = {{"row", row_json(measured.alone)}};
  if (predicted != nullptr) {
    out["alone"]["predicted"] = row_json(predicted->alone);
    out["alone"]["relative_error"] = errors_json(measured.alone, predicted->alone);
    out["prediction_table"] = orion_sim::format_prediction(measured, *predicted);
  }
  out["runs"] = json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    json run = to_json(runs[i]);
    run["row"] = row_json(measured.rows.at(i));
    if (predicted != nullptr) {
      run["predicted"] = row_json(predicted->rows.at(i));
      run["relative_error"] = errors_json(measured.rows.at(i), predicted->rows.at(i));
    }
    out["runs"].push_back(std::move(run));
  }
  return out;
}

}  // namespace replay_gpu

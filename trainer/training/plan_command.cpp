// gpipe_runner --plan: plan (planner.h) on the measured profile (plan_measure.cpp), calibrate on
// short runs, report, and --verify the top candidates as their own gpipe_runner processes.
#include "trainer/training/plan_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "plan_internal.h"
#include "trainer/config/config.h"
#include "trainer/device/device.h"

namespace gpipe {
using namespace plan_detail;

namespace {

std::string gib_text(double bytes) {
  std::ostringstream s;
  s.precision(3);
  s << bytes / (1024.0 * kMiB) << " GiB";
  return s.str();
}

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
  out << "wrote " << output << ": train with " << plan_train_command(plan.ranked.front().candidate, output) << "\n";
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

// The study table is one printer shared by orion-sim and orion-replay-gpu: given the same results
// (here simulated ones, passed through the replayer's child-result JSON as a GPU run's would be),
// both print the same text, and it is the text the orion-sim executable prints.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gpu_study.h"
#include "run_json.h"
#include "study.h"
#include "test_util.h"

namespace replay_gpu {
namespace {

const char* kWorkload = OURGPIPE_WORKLOAD_DIR "/orion_inference_training.jsonl";

// orion-sim run's defaults.
sched::SimGpuConfig orion_sim_gpu() {
  sched::SimGpuConfig gpu;
  gpu.jitter = 0.05;
  gpu.block_spread = 0.2;
  return gpu;
}

// What a child would report, made by the simulator instead of a GPU, through a JSON file.
std::vector<ChildResult> simulated_children(const sched::Workload& w, const std::vector<std::string>& policies,
                                            const replay_gpu_test::ScratchDir& dir) {
  std::vector<ChildResult> children;
  for (size_t i = 0; i < policies.size(); ++i) {
    sched::ReplayOptions o;
    o.gpu = orion_sim_gpu();
    o.policy = policies[i];
    ChildResult c;
    c.label = policies[i];
    c.policy = policies[i];
    c.timer = "simulated";
    c.gpu.name = "SimulatedGpu";
    c.gpu.sm_count = o.gpu.sm_count;
    if (i == 0) {
      for (const std::string& client : w.clients()) {
        sched::ReplayOptions alone = o;
        alone.policy = "passthrough";
        c.alone.push_back(sched::replay_workload(w.only_client(client), alone));
      }
    }
    c.together = sched::replay_workload(w, o);
    const std::string path = dir.path() + "/" + c.label + ".json";
    write_child_result(path, c);
    children.push_back(read_child_result(path));
  }
  return children;
}

TEST(SharedReport, ReplayerAndOrionSimPrintTheSameTableFromTheSameResults) {
  const sched::Workload w = sched::load_workload(kWorkload);
  replay_gpu_test::ScratchDir dir;
  const std::vector<std::string> policies = {"passthrough", "orion", "partition"};

  // orion-sim's path (library).
  orion_sim::StudyOptions options;
  options.gpu = orion_sim_gpu();
  orion_sim::Study sim;
  sim.alone = orion_sim::run_alone(w, options);
  for (const std::string& p : policies) sim.rows.push_back(orion_sim::run_point(w, options, p, {}));
  const std::string sim_text = orion_sim::format_study(sim);

  // The replayer's path: child results (JSON round trip) -> measured_study -> the same printer.
  const std::string replay_text = orion_sim::format_study(measured_study(simulated_children(w, policies, dir)));
  EXPECT_EQ(replay_text, sim_text);

  // And the orion-sim executable prints that very table.
  int rc = 0;
  const std::string out = replay_gpu_test::run_command(
      std::string(ORION_SIM_EXE) + " run " + kWorkload + " --policy passthrough --policy orion --policy partition", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(sim_text), std::string::npos) << "orion-sim printed:\n" << out << "\nexpected:\n" << sim_text;
}

TEST(SharedReport, UnmeasuredSmUtilisationIsPrintedAsNotAvailable) {
  orion_sim::Study s;
  s.alone.hp_p50_ns = 1e6;
  s.alone.hp_p99_ns = 2e6;
  s.alone.hp_exec_p99_ns = 1e6;
  s.alone.be_per_s = 10;
  orion_sim::StudyRow row = s.alone;
  row.policy = "orion";
  row.makespan_ns = 5'000'000;
  row.sm_utilisation = -1;
  row.forced_by_starvation = 3;
  s.rows.push_back(row);
  const std::string text = orion_sim::format_study(s);
  EXPECT_NE(text.find("| orion | 1.000 (1.00x) | 2.000 (1.00x) | 1.000 (1.00x) | 10.000 (1.00x) | 5.00 | n/a | 3 |"),
            std::string::npos)
      << text;
}

TEST(SharedReport, PredictionTableGivesMeasuredSimulatedAndRelativeError) {
  orion_sim::Study measured, predicted;
  measured.alone.policy = predicted.alone.policy = "alone";
  measured.alone.hp_p50_ns = 1.1e6;
  predicted.alone.hp_p50_ns = 1.0e6;
  orion_sim::StudyRow m;
  m.policy = "orion";
  m.hp_p99_ns = 0.9e6;
  m.be_per_s = 50;
  m.makespan_ns = 10'000'000;
  orion_sim::StudyRow p = m;
  p.hp_p99_ns = 1.0e6;
  p.be_per_s = 40;
  measured.rows.push_back(m);
  predicted.rows.push_back(p);
  const std::string text = orion_sim::format_prediction(measured, predicted);
  EXPECT_NE(text.find("| alone | 1.100 / 1.000 (+10.0%) |"), std::string::npos) << text;
  EXPECT_NE(text.find("| orion | 0.000 / 0.000 (n/a) | 0.900 / 1.000 (-10.0%) |"), std::string::npos) << text;
  EXPECT_NE(text.find("50.00 / 40.00 (+25.0%)"), std::string::npos) << text;
}

TEST(ChildResultJson, RoundTripKeepsEveryField) {
  ChildResult c;
  c.label = "orion";
  c.policy = "orion";
  c.shim_loaded = c.shim_active = true;
  c.gpu = {"NVIDIA H100 80GB HBM3", 132, 9, 0, 1980000, 13000};
  c.h2d_gbps = 51.25;
  c.copy_scale = 2.05;
  c.timer = "globaltimer";
  sched::RequestResult r;
  r.client = "inference";
  r.request = "req7";
  r.cls = sched::StreamClass::kHighPriority;
  r.arrival_ns = 123;
  r.done_ns = 456789;
  r.first_start_ns = 200;
  r.ops = 16;
  c.together.policy = "orion";
  c.together.requests = {r};
  c.together.makespan_ns = 456789;
  c.together.sm_utilisation = -1;
  c.together.ops_completed = 16;
  c.together.forced_by_starvation = 4;
  c.alone = {c.together};
  c.issue_lag_p99_us = 3.5;
  c.issue_lag_max_us = 40.25;
  const ChildResult back = child_result_from_json(to_json(c));
  EXPECT_EQ(to_json(back), to_json(c));
  EXPECT_EQ(back.together.requests.at(0).cls, sched::StreamClass::kHighPriority);
  EXPECT_EQ(back.together.requests.at(0).latency_ns(), 456789 - 123);
  EXPECT_EQ(back.gpu.name, "NVIDIA H100 80GB HBM3");
}

TEST(ChildResultJson, MissingFieldIsNamed) {
  nlohmann::json j = to_json(ChildResult{});
  j.erase("together");
  try {
    child_result_from_json(j);
    FAIL() << "accepted a result without \"together\"";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("together"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_child_result("/nonexistent/replay.json"), std::runtime_error);
}

TEST(ChildRuns, EachPolicyRunsUnderTheShimWithItsSettings) {
  StudyConfig config;
  config.shim_path = "/opt/libgpu_scheduler.so";
  config.params = {{"partition.be_sm_frac", "0.5"}, {"sm_threshold_frac", "0.75"}};
  config.be_max_wait_ns = 3'000'000;
  const std::vector<RunSpec> specs = run_specs({"priority", "orion", "partition"});
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].label, kNoShimLabel);
  EXPECT_FALSE(specs[0].shim);
  EXPECT_TRUE(specs[0].alone);  // the no-shim run measures the clients alone
  EXPECT_FALSE(specs[2].alone);

  auto none = child_environment(specs[0], config);
  EXPECT_FALSE(none.at("LD_PRELOAD").has_value());
  EXPECT_FALSE(none.at("USE_ORION_SCHEDULER").has_value());
  EXPECT_FALSE(none.at("ORION_POLICY").has_value());

  auto orion = child_environment(specs[2], config);
  EXPECT_EQ(orion.at("LD_PRELOAD"), "/opt/libgpu_scheduler.so");
  EXPECT_EQ(orion.at("USE_ORION_SCHEDULER"), "1");
  EXPECT_EQ(orion.at("ORION_POLICY"), "orion");
  EXPECT_EQ(orion.at("ORION_POLICY_PARAMS"), "sm_threshold_frac=0.75");
  EXPECT_EQ(orion.at("ORION_BE_MAX_WAIT_US"), "3000");
  auto partition = child_environment(specs[3], config);
  EXPECT_EQ(partition.at("ORION_POLICY_PARAMS"), "be_sm_frac=0.5");
  EXPECT_FALSE(child_environment(specs[1], config).at("ORION_POLICY_PARAMS").has_value());

  const std::vector<std::string> cmd = child_command(specs[3], config, "/tmp/x.json");
  EXPECT_NE(std::find(cmd.begin(), cmd.end(), "--child-policy"), cmd.end());
  config.shim_path.clear();
  EXPECT_THROW(child_environment(specs[1], config), std::invalid_argument);
}

}  // namespace
}  // namespace replay_gpu

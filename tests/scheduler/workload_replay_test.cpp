// Workload replay through the Dispatcher on the simulated GPU, and orion-sim end to end.
#include "scheduler/workload.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <unistd.h>

namespace sched {
namespace {

// A latency-critical client (closed loop, 6 small kernels per request) next to a best-effort
// client with long kernels whose blocks take all of an SM's threads (an HP block waits for a slot).
std::string tiny_colocation() {
  std::ostringstream w;
  w << "# tiny co-location workload\n";
  for (int r = 0; r < 12; ++r) {
    for (int k = 0; k < 6; ++k) {
      w << R"({"arrival_us": )" << (r == 0 ? k : 0) << R"(, "stream": "hp", "class": "hp", "name": "infer)"
        << k << R"(", "grid": 16, "block": 256, "duration_us": 10, "profile": ")" << (k % 2 ? "memory" : "compute")
        << R"(", "client": "inference", "request": "r)" << r << '"';
      if (r > 0) w << R"(, "after_request": "r)" << r - 1 << R"(", "after_us": )" << 20 + k;
      w << "}\n";
    }
  }
  for (int i = 0; i < 80; ++i) {
    w << R"({"arrival_us": 0, "stream": "be", "class": "be", "name": "train)" << i % 3
      << R"(", "grid": 2048, "block": 1024, "duration_us": 200, "profile": "compute", "client": "training", "request": "it)"
      << i / 20 << "\"}\n";
  }
  return w.str();
}

Workload tiny() {
  std::istringstream in(tiny_colocation());
  return parse_workload(in, "tiny.jsonl");
}

ReplayResult run(const Workload& w, const std::string& policy) {
  ReplayOptions o;
  o.policy = policy;
  o.gpu.sm_count = 16;
  return replay_workload(w, o);
}

TEST(WorkloadReplay, EveryOpCompletesAndRequestsAreCounted) {
  Workload w = tiny();
  ReplayResult r = run(w, "passthrough");
  EXPECT_EQ(r.ops_completed, w.ops.size());
  std::map<StreamClass, int> per_class;
  for (const RequestResult& q : r.requests) {
    ++per_class[q.cls];
    EXPECT_GT(q.latency_ns(), 0);
  }
  EXPECT_EQ(per_class[StreamClass::kHighPriority], 12);
  EXPECT_EQ(per_class[StreamClass::kBestEffort], 4);
  EXPECT_GT(r.makespan_ns, 0);
  EXPECT_GT(r.sm_utilisation, 0.0);
  EXPECT_LE(r.sm_utilisation, 1.0);
}

TEST(WorkloadReplay, ClosedLoopRequestWaitsForItsPredecessor) {
  Workload w = tiny().only_client("inference");
  ReplayResult r = run(w, "passthrough");
  std::map<std::string, RequestResult> by_name;
  for (const RequestResult& q : r.requests) by_name[q.request] = q;
  ASSERT_EQ(by_name.size(), 12u);
  for (int i = 1; i < 12; ++i) {
    const RequestResult& prev = by_name["r" + std::to_string(i - 1)];
    const RequestResult& cur = by_name["r" + std::to_string(i)];
    EXPECT_EQ(cur.arrival_ns, prev.done_ns + 20'000) << "request " << i;  // think time 20 us
  }
  // Alone, one request is its 6 kernels back to back (one wave each; launches 1 us apart).
  EXPECT_EQ(by_name["r3"].latency_ns(), 6 * 10'000);
}

TEST(WorkloadReplay, OrionKeepsHighPriorityLatencyCloserToAloneThanPassthrough) {
  Workload w = tiny();
  ReplayResult alone = run(w.only_client("inference"), "passthrough");
  ReplayResult pass = run(w, "passthrough");
  ReplayResult orion = run(w, "orion");
  double alone_p50 = latency_percentile_ns(alone, StreamClass::kHighPriority, 50);
  double pass_p50 = latency_percentile_ns(pass, StreamClass::kHighPriority, 50);
  double orion_p50 = latency_percentile_ns(orion, StreamClass::kHighPriority, 50);
  EXPECT_LT(orion_p50, pass_p50);
  EXPECT_GE(orion_p50, alone_p50);
  EXPECT_GT(requests_per_second(orion, StreamClass::kBestEffort), 0.0);
}

// Space instead of time: with best effort on half the SMs, high priority finds free SMs at once.
TEST(WorkloadReplay, APartitionKeepsHighPriorityLatencyNearerAloneThanPriority) {
  Workload w = tiny();
  ReplayResult alone = run(w.only_client("inference"), "passthrough");
  ReplayResult priority = run(w, "priority");
  ReplayOptions o;
  o.policy = "partition";
  o.policy_params = {{"be_sm_frac", "0.5"}, {"granularity", "4"}};
  o.gpu.sm_count = 16;
  o.gpu.jitter = 0;
  ReplayResult part = replay_workload(w, o);
  const double alone_p99 = latency_percentile_ns(alone, StreamClass::kHighPriority, 99);
  EXPECT_LT(latency_percentile_ns(part, StreamClass::kHighPriority, 99),
            latency_percentile_ns(priority, StreamClass::kHighPriority, 99));
  EXPECT_GE(latency_percentile_ns(part, StreamClass::kHighPriority, 99), alone_p99);
  EXPECT_GT(requests_per_second(part, StreamClass::kBestEffort), 0.0) << "best effort still runs, on its SMs";
}

TEST(WorkloadReplay, SameSeedSameResult) {
  Workload w = tiny();
  ReplayOptions o;
  o.policy = "orion";
  o.gpu.sm_count = 16;
  o.gpu.jitter = 0.1;
  o.gpu.seed = 9;
  ReplayResult a = replay_workload(w, o), b = replay_workload(w, o);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].request, b.requests[i].request);
    EXPECT_EQ(a.requests[i].done_ns, b.requests[i].done_ns);
  }
}

TEST(WorkloadReplay, UnknownPolicyIsAnError) {
  EXPECT_THROW(run(tiny(), "fastest"), std::invalid_argument);
}

// Replaying `w` under `policy` fails with a message naming `where` (source:line).
void expect_refused_naming(const Workload& w, const char* policy, const std::string& where) {
  try {
    run(w, policy);
    ADD_FAILURE() << "an op that cannot fit an SM was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(where), std::string::npos) << e.what();
  }
}

TEST(WorkloadReplay, LaunchThatCannotFitNamesTheLine) {
  std::istringstream in(R"({"stream": "s", "class": "hp", "name": "k", "grid": 1, "block": 32, "smem": 300000, "block_us": 1})");
  expect_refused_naming(parse_workload(in, "big.jsonl"), "passthrough", "big.jsonl:1");
}

// The same, for a best-effort kernel the priority policy holds behind high-priority work: it only
// reaches the GPU from the dispatcher's queue, whose error used to go unseen ("replay stuck").
TEST(WorkloadReplay, AHeldLaunchThatCannotFitNamesItsLineToo) {
  std::istringstream in(
      "{\"stream\": \"h\", \"class\": \"hp\", \"name\": \"a\", \"grid\": 1, \"block\": 32, \"block_us\": 100}\n"
      "{\"stream\": \"b\", \"class\": \"be\", \"name\": \"k\", \"grid\": 1, \"block\": 32, \"smem\": 300000, \"block_us\": 1}\n");
  expect_refused_naming(parse_workload(in, "held.jsonl"), "priority", "held.jsonl:2");
}

// The starvation bound acts on time, not on events: a best-effort kernel held behind a 10 ms
// high-priority kernel goes out at the 2 ms bound, as the shim's pump thread would send it; the
// replay used to wake only at device events and arrivals, and started it at 10 ms, not forced.
TEST(WorkloadReplay, TheStarvationBoundForcesAHeldKernelOutOnTime) {
  std::istringstream in(
      "{\"stream\": \"h\", \"class\": \"hp\", \"name\": \"long\", \"grid\": 1, \"block\": 32, \"block_us\": 10000}\n"
      "{\"stream\": \"b\", \"class\": \"be\", \"name\": \"small\", \"grid\": 1, \"block\": 32, \"block_us\": 10}\n");
  const ReplayResult r = run(parse_workload(in, "starve.jsonl"), "priority");
  EXPECT_EQ(r.forced_by_starvation, 1u);
  bool seen = false;
  for (const RequestResult& q : r.requests) {
    if (q.cls != StreamClass::kBestEffort) continue;
    seen = true;
    EXPECT_GE(q.first_start_ns, 2'000'000);
    EXPECT_LE(q.first_start_ns, 2'100'000);
  }
  EXPECT_TRUE(seen);
}

TEST(WorkloadReplay, ShippedWorkloadsParse) {
  for (const char* name : {"orion_inference_training.jsonl", "pipeline_stage.jsonl", "pipeline_stage_sync.jsonl"}) {
    Workload w = load_workload(std::string(OURGPIPE_WORKLOAD_DIR) + "/" + name);
    EXPECT_GT(w.ops.size(), 100u) << name;
    bool hp = false, be = false;
    for (const WorkloadOp& op : w.ops) {
      hp |= op.cls == StreamClass::kHighPriority;
      be |= op.cls == StreamClass::kBestEffort;
    }
    EXPECT_TRUE(hp && be) << name << " needs both classes";
  }
}

// The CLI end to end: run orion-sim on the tiny workload and read its table.
TEST(OrionSimCli, PrintsOneRowPerPolicyWithOrionAheadOfPassthrough) {
  auto dir = std::filesystem::temp_directory_path() / ("orion_sim_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tiny.jsonl") << tiny_colocation();
  std::string cmd = std::string(ORION_SIM_EXE) + " run " + (dir / "tiny.jsonl").string() +
                    " --sms 16 --jitter 0 --trace-dir " + dir.string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe)) output += buf;
  int rc = pclose(pipe);
  ASSERT_EQ(rc, 0) << output;
  std::map<std::string, double> p50;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    for (const char* policy : {"passthrough", "priority", "orion"}) {
      std::string prefix = std::string("| ") + policy + " | ";
      if (line.rfind(prefix, 0) == 0) p50[policy] = std::stod(line.substr(prefix.size()));
    }
  }
  ASSERT_EQ(p50.size(), 3u) << output;
  EXPECT_LT(p50["orion"], p50["passthrough"]) << output;
  EXPECT_TRUE(std::filesystem::exists(dir / "orion.trace.json"));
  EXPECT_GT(std::filesystem::file_size(dir / "orion.trace.json"), 100u);
  std::filesystem::remove_all(dir);
}

std::string run_command(const std::string& cmd, int* rc) {
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string output;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) output += buf;
  *rc = pclose(pipe);
  return output;
}

std::string without_generated_by(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("# generated by:", 0) != 0) out += line + "\n";
  }
  return out;
}

// orion-sim sweep: a row per grid point, the Pareto front marked, the CSV written.
TEST(OrionSimCli, SweepPrintsTheGridAndItsParetoFront) {
  auto dir = std::filesystem::temp_directory_path() / ("orion_sim_sweep_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tiny.jsonl") << tiny_colocation();
  int rc = 0;
  const std::string output = run_command(std::string(ORION_SIM_EXE) + " sweep " + (dir / "tiny.jsonl").string() +
                                             " --sms 32 --csv " + (dir / "sweep.csv").string() + " 2>&1",
                                         &rc);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("| priority |"), std::string::npos) << output;
  EXPECT_NE(output.find("| partition be_sms=8 hp_rest=0 gate=0 |"), std::string::npos) << output;
  EXPECT_NE(output.find("| partition be_sms=24 hp_rest=1 gate=2 |"), std::string::npos) << output;
  EXPECT_EQ(output.find("be_sms=32"), std::string::npos) << "the whole GPU is not a partition";
  EXPECT_NE(output.find("| yes |"), std::string::npos) << "no Pareto point marked";
  std::ifstream csv(dir / "sweep.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "point,policy,hp_p99_ratio,be_ratio,pareto,meets_goal,mean_be_sms,resizes");
  EXPECT_NE(output.find("| partition adaptive target=1.10 hp_rest=0 |"), std::string::npos) << output;
  size_t rows = 0, adaptive_rows = 0;
  for (std::string line; std::getline(csv, line);) {
    ++rows;
    if (line.find(",partition-adaptive,") != std::string::npos) ++adaptive_rows;
  }
  EXPECT_EQ(rows, 1u + 4u + 3u * 4u + 4u * 2u)
      << "priority, 4 orion thresholds, 3 partition sizes x 4, 4 adaptive targets x 2";
  EXPECT_EQ(adaptive_rows, 8u);
  // A big GPU: a bounded grid of the sizes be_sm_frac can name (it refused 0.99+ and aborted).
  const std::string big = run_command(std::string(ORION_SIM_EXE) + " sweep " + (dir / "tiny.jsonl").string() +
                                          " --sms 1000 2>&1",
                                      &rc);
  ASSERT_EQ(rc, 0) << big;
  size_t partition_rows = 0;
  for (size_t at = big.find("| partition be_sms="); at != std::string::npos; at = big.find("| partition be_sms=", at + 1)) {
    ++partition_rows;
  }
  EXPECT_GT(partition_rows, 0u);
  EXPECT_LE(partition_rows, 17u * 4u);
  std::filesystem::remove_all(dir);
}

// orion-sim colocate (issue 25): a pipeline stage and a training job in two processes. Without
// management the job slows the pipeline past the goal in both sharing modes; the gpud policy keeps
// the pipeline within 1.02x while the job uses at least half of its idle time; a job with
// high-priority streams is refused (the policy gates best-effort work).
TEST(OrionSimCli, ColocateGatedJobFillsBubblesWithoutSlowingThePipeline) {
  auto dir = std::filesystem::temp_directory_path() / ("orion_sim_colocate_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string sim = ORION_SIM_EXE;
  int rc = 0;
  std::string output = run_command(sim + " generate pipeline-stage --micro-batches 4 --layers 2 --other-layers 2 --seq 512 -o " +
                                       (dir / "pipe.jsonl").string() + " 2>&1",
                                   &rc);
  ASSERT_EQ(rc, 0) << output;
  output = run_command(sim + " colocate --pipeline " + (dir / "pipe.jsonl").string() +
                           " --steps 3 --budget-us 1000 --sms 32 --csv " + (dir / "c.csv").string() + " 2>&1",
                       &rc);
  ASSERT_EQ(rc, 0) << output;
  std::ifstream csv(dir / "c.csv");
  std::string line;
  std::getline(csv, line);
  ASSERT_EQ(line, "sharing,management,budget_us,step_ratio,bubble_used,job_ratio,pipeline_p99_ratio,context_switches,meets_goals");
  std::map<std::string, std::vector<double>> rows;  // "sharing/management" -> numbers
  while (std::getline(csv, line)) {
    std::istringstream fields(line);
    std::string sharing, management, value;
    std::getline(fields, sharing, ',');
    std::getline(fields, management, ',');
    std::vector<double> numbers;
    while (std::getline(fields, value, ',')) numbers.push_back(std::stod(value));
    ASSERT_EQ(numbers.size(), 7u) << line;
    rows[sharing + "/" + management] = numbers;
  }
  ASSERT_EQ(rows.size(), 5u) << output;
  for (const char* gated : {"time-slice/gpud", "mps/gpud"}) {
    EXPECT_LE(rows[gated][1], 1.02) << gated << "\n" << output;
    EXPECT_GE(rows[gated][2], 0.50) << gated << "\n" << output;
    EXPECT_EQ(rows[gated][6], 1.0) << gated;
  }
  for (const char* unmanaged : {"time-slice/unmanaged", "mps/unmanaged"}) {
    EXPECT_GT(rows[unmanaged][1], 1.10) << unmanaged << "\n" << output;
  }
  EXPECT_GT(rows["time-slice/unmanaged"][5], 0) << "time slicing switches contexts";
  EXPECT_EQ(rows["mps/gpud"][5], 0) << "MPS never switches";

  std::ofstream(dir / "hp_job.jsonl") << R"({"stream": "j", "class": "high_priority", "name": "k", "grid": 8, "block": 256, "duration_us": 10})"
                                      << "\n";
  output = run_command(sim + " colocate --pipeline " + (dir / "pipe.jsonl").string() + " --job " +
                           (dir / "hp_job.jsonl").string() + " 2>&1",
                       &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(output.find("must be best_effort"), std::string::npos) << output;
  std::filesystem::remove_all(dir);
}

// The shipped workloads are exactly what the generator writes (nobody hand-edited them, and the
// generator is deterministic).
TEST(OrionSimCli, ShippedWorkloadsMatchTheGenerator) {
  for (auto [args, file] : {std::pair{"inference-training", "orion_inference_training.jsonl"},
                            std::pair{"pipeline-stage", "pipeline_stage.jsonl"},
                            std::pair{"pipeline-stage --pacing sync", "pipeline_stage_sync.jsonl"}}) {
    int rc = -1;
    std::string generated = run_command(std::string(ORION_SIM_EXE) + " generate " + args, &rc);
    ASSERT_EQ(rc, 0) << generated;
    std::ifstream in(std::string(OURGPIPE_WORKLOAD_DIR) + "/" + file);
    std::stringstream shipped;
    shipped << in.rdbuf();
    EXPECT_EQ(without_generated_by(generated), without_generated_by(shipped.str())) << file;
  }
}

// --pacing: async (default) issues forward j with backward j-(p-s) (after the request that
// backward follows, its launches after the backward's), sync when that backward finished.
TEST(OrionSimCli, PipelinePacingPicksWhatTheForwardFollows) {
  auto forward_after = [](const std::string& file) {
    Workload w = load_workload(std::string(OURGPIPE_WORKLOAD_DIR) + "/" + file);
    std::map<std::string, std::pair<std::string, int64_t>> first;  // request -> (after, after_ns)
    for (const WorkloadOp& op : w.ops) {
      if (op.client == "forward" && !first.count(op.request)) first[op.request] = {op.after_request, op.after_ns};
    }
    return first;
  };
  auto async = forward_after("pipeline_stage.jsonl"), sync = forward_after("pipeline_stage_sync.jsonl");
  // Stage 1 of 4: p-s = 3, so forward 3 follows backward 0 (sync) or its gradient (async).
  EXPECT_EQ(async.at("fwd_mb0").first, "");
  EXPECT_EQ(sync.at("fwd_mb0").first, "");
  EXPECT_EQ(sync.at("fwd_mb3").first, "bwd_mb0");
  EXPECT_EQ(sync.at("fwd_mb3").second, 0);
  EXPECT_EQ(async.at("fwd_mb3").first, "down_mb0");
  EXPECT_EQ(async.at("fwd_mb7").first, "down_mb4");
  EXPECT_GT(async.at("fwd_mb3").second, 0);  // after the backward's launches
  int rc = -1;
  std::string out = run_command(std::string(ORION_SIM_EXE) + " generate pipeline-stage --pacing later 2>&1", &rc);
  EXPECT_NE(rc, 0) << out;
}

TEST(OrionSimCli, BadWorkloadExitsNonZeroNamingTheLine) {
  auto dir = std::filesystem::temp_directory_path() / ("orion_sim_bad_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "bad.jsonl") << R"({"stream": "s", "class": "hp", "name": "k", "grid": 1, "block": 32})" << "\n";
  std::string cmd = std::string(ORION_SIM_EXE) + " run " + (dir / "bad.jsonl").string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof buf, pipe)) output += buf;
  EXPECT_NE(pclose(pipe), 0);
  EXPECT_NE(output.find("bad.jsonl:1: field \"block_us\""), std::string::npos) << output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sched

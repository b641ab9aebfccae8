// Several processes on one simulated GPU (replay_processes, issue 25): each process's ids stay its
// own, time slicing keeps their kernels apart while MPS lets them overlap, and a best-effort
// process under the gpud policy runs only inside the window the pipeline publishes.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>

#include "scheduler/gpud_policy.h"
#include "scheduler/profile_store.h"
#include "scheduler/workload.h"

namespace sched {
namespace {

Workload three_kernels(const std::string& stream, const char* cls, double duration_us, const std::string& source) {
  std::ostringstream text;
  for (int i = 0; i < 3; ++i) {
    text << R"({"stream": ")" << stream << R"(", "class": ")" << cls << R"(", "name": "k)" << stream << i
         << R"(", "grid": 8, "block": 256, "blocks_per_sm": 1, "duration_us": )" << duration_us << "}\n";
  }
  std::istringstream in(text.str());
  return parse_workload(in, source);
}

SimGpuConfig gpu16(ContextSharing sharing) {
  SimGpuConfig cfg;
  cfg.sm_count = 16;
  cfg.context_sharing = sharing;
  cfg.context_switch_ns = 10'000;
  return cfg;
}

bool overlap(const std::vector<Completion>& a, const std::vector<Completion>& b) {
  for (const Completion& x : a) {
    for (const Completion& y : b) {
      if (x.kind == OpKind::kKernel && y.kind == OpKind::kKernel && x.start_ns < y.end_ns && y.start_ns < x.end_ns) return true;
    }
  }
  return false;
}

TEST(ReplayProcesses, TimeSlicedProcessesNeverOverlapMpsOnesDo) {
  const Workload a = three_kernels("s", "high_priority", 100, "a.jsonl");
  const Workload b = three_kernels("s", "best_effort", 100, "b.jsonl");  // same stream name, own ids
  for (ContextSharing sharing : {ContextSharing::kTimeSlice, ContextSharing::kMps}) {
    std::vector<ProcessSpec> specs(2);
    specs[0].name = "a";
    specs[0].workload = &a;
    specs[1].name = "b";
    specs[1].workload = &b;
    const ColocatedResult r = replay_processes(specs, gpu16(sharing));
    ASSERT_EQ(r.processes.size(), 2u);
    for (const ProcessResult& p : r.processes) {
      ASSERT_EQ(p.completions.size(), 3u) << p.name;
      for (const Completion& c : p.completions) EXPECT_EQ(c.stream, 1u) << "each process sees its own stream id";
      EXPECT_EQ(p.replay.requests.size(), 3u);
    }
    if (sharing == ContextSharing::kTimeSlice) {
      EXPECT_FALSE(overlap(r.processes[0].completions, r.processes[1].completions));
      EXPECT_GE(r.context_switches, 1u);
    } else {
      EXPECT_TRUE(overlap(r.processes[0].completions, r.processes[1].completions))
          << "8 blocks each on 16 SMs: MPS runs them side by side";
      EXPECT_EQ(r.context_switches, 0u);
    }
  }
}

TEST(ReplayProcesses, OneProcessIsReplayWorkload) {
  const Workload a = three_kernels("s", "high_priority", 100, "a.jsonl");
  ReplayOptions o;
  o.gpu = gpu16(ContextSharing::kTimeSlice);
  const ReplayResult single = replay_workload(a, o);
  ProcessSpec spec;
  spec.workload = &a;
  const ColocatedResult r = replay_processes({spec}, o.gpu);
  EXPECT_EQ(r.processes[0].replay.makespan_ns, single.makespan_ns);
  EXPECT_EQ(single.makespan_ns, 300'000);
  EXPECT_EQ(r.context_switches, 0u) << "one process never switches";
}

TEST(ReplayProcesses, AProcessWithoutAWorkloadIsAnError) {
  EXPECT_THROW(replay_processes({}, SimGpuConfig{}), std::invalid_argument);
  ProcessSpec spec;
  spec.name = "nothing";
  EXPECT_THROW(replay_processes({spec}, SimGpuConfig{}), std::invalid_argument);
}

// The best-effort process's shim runs the gpud policy on the virtual clock: with a window
// [1 ms, 1.25 ms) published and kernels of 100 us known from a profile, exactly two fit (guard
// 10 us: 250 - 10 >= 200), the third waits; once the pipeline is gone (no heartbeat) it runs.
TEST(ReplayProcesses, GpudPolicyAdmitsOnlyWhatFitsThePublishedWindow) {
  const Workload pipe = three_kernels("p", "high_priority", 100, "pipeline.jsonl");
  const Workload job = three_kernels("j", "best_effort", 100, "job.jsonl");
  const int64_t open = 1'000'000, close = 1'250'000, pipeline_gone = 2'000'000;
  std::vector<ProcessSpec> specs(2);
  specs[0].name = "pipeline";
  specs[0].workload = &pipe;
  specs[1].name = "job";
  specs[1].workload = &job;
  specs[1].seed_profiles = [&job](ProfileStore& store) {
    for (const WorkloadOp& op : job.ops) store.record_completion(op.kernel_id, 0, 100'000);
  };
  specs[1].make_custom_policy = [&](Device& device) {
    GpudSource source;
    source.now_ns = [&device] { return device.now_ns(); };
    source.window = [&](int64_t now) {
      gpud::WindowView w;
      w.open_ns = open;
      w.close_ns = close;
      w.windows_published = 1;
      w.heartbeat_ns = now < pipeline_gone ? now + 1 : 0;  // 0 means "no pipeline"
      return w;
    };
    source.grant = [&](int64_t now) {  // as the daemon: free once the pipeline is gone
      gpud::GrantView g;
      g.mode = now < pipeline_gone ? gpud::GrantMode::kGated : gpud::GrantMode::kFree;
      g.lease_expiry_ns = std::numeric_limits<int64_t>::max();
      g.inflight_budget_ns = 1'000'000;
      return g;
    };
    gpud::AdmissionConfig config;
    config.guard_ns = 10'000;
    return make_gpud_policy(std::move(source), config);
  };
  specs[1].next_wakeup_ns = [&](int64_t now) { return now < open ? open : (now < pipeline_gone ? pipeline_gone : -1); };
  const ColocatedResult r = replay_processes(specs, gpu16(ContextSharing::kMps));
  const std::vector<Completion>& done = r.processes[1].completions;
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].start_ns, open) << "held until the window opened";
  EXPECT_EQ(done[1].end_ns, open + 200'000);
  EXPECT_LE(done[1].end_ns, close);
  EXPECT_EQ(done[2].start_ns, pipeline_gone) << "did not fit the window: ran once the daemon freed the grant";
  EXPECT_EQ(r.processes[1].replay.policy, "gpud");
}

}  // namespace
}  // namespace sched

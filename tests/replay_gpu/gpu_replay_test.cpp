// The replayer on a real GPU (skipped, with the reason, where there is none): a small workload with
// every op kind the shipped workloads use, measured against what its kernels must take.
#include "gpu_replayer.h"

#include <gtest/gtest.h>

#include <map>

#include "driver.h"
#include "test_util.h"

namespace replay_gpu {
namespace {

// A closed-loop HP client (4 requests of two 200 us kernels, 100 us apart), a BE client (one
// request: a copy, a memset, an event record, and a 3-wave kernel), a stream waiting on it.
std::string small_workload() {
  std::string w;
  for (int r = 0; r < 4; ++r) {
    for (int k = 0; k < 2; ++k) {
      w += R"({"stream":"hp","class":"hp","client":"infer","name":"hp_k)" + std::to_string(k) +
           R"(","grid":16,"block":128,"smem":16384,"block_us":200,"request":"r)" + std::to_string(r) + '"';
      if (r > 0) w += R"(,"after_request":"r)" + std::to_string(r - 1) + R"(","after_us":100)";
      w += "}\n";
    }
  }
  w += R"({"stream":"be","class":"be","client":"train","kind":"copy","bytes":2500000,"request":"it0"})" "\n";
  w += R"({"stream":"be","class":"be","client":"train","kind":"memset","bytes":1000000,"request":"it0"})" "\n";
  w += R"({"stream":"be","class":"be","client":"train","name":"be_gemm","grid":1024,"block":256,"smem":73728,"duration_us":600,"request":"it0"})" "\n";
  w += R"({"stream":"be","class":"be","client":"train","kind":"event_record","event":"e0","request":"it0"})" "\n";
  w += R"({"stream":"side","class":"comm","client":"train","kind":"stream_wait_event","event":"e0","request":"it1"})" "\n";
  w += R"({"stream":"side","class":"comm","client":"train","kind":"memset","bytes":4096,"request":"it1"})" "\n";
  return w;
}

class GpuReplay : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      gpu_ = probe_device(0);
    } catch (const NoGpuError& e) {
      GTEST_SKIP() << "no GPU: " << e.what();
    }
  }
  DeviceInfo gpu_;
};

TEST_F(GpuReplay, RequestsTakeAtLeastTheirKernelsTimeAndEveryOpCompletes) {
  const sched::Workload w = replay_gpu_test::workload_from(small_workload());
  GpuReplayer replayer(w, {});
  EXPECT_EQ(replayer.gpu().sm_count, gpu_.sm_count);
  const sched::ReplayResult alone = replayer.run(w.only_client("infer"), "alone infer");
  ASSERT_EQ(alone.requests.size(), 4u);
  for (const sched::RequestResult& r : alone.requests) {
    EXPECT_EQ(r.cls, sched::StreamClass::kHighPriority);
    EXPECT_EQ(r.ops, 2u);
    // Two 200 us kernels back to back (one wave each), plus launch and polling overhead.
    EXPECT_GE(r.latency_ns(), 380'000) << r.request;
    EXPECT_LT(r.latency_ns(), 5'000'000) << r.request;
    EXPECT_GE(r.execution_ns(), 380'000) << r.request;
    EXPECT_LE(r.execution_ns(), r.latency_ns()) << r.request;
  }
  // Closed loop: each request starts at least 100 us after the previous one completed.
  std::map<std::string, sched::RequestResult> by_name;
  for (const auto& r : alone.requests) by_name[r.request] = r;
  const std::vector<std::string> names = {"r0", "r1", "r2", "r3"};
  for (size_t i = 1; i < names.size(); ++i) {
    EXPECT_GE(by_name[names[i]].arrival_ns, by_name[names[i - 1]].done_ns + 100'000) << names[i];
  }

  const sched::ReplayResult together = replayer.run(w, "together");
  EXPECT_EQ(together.ops_completed, w.ops.size());
  EXPECT_EQ(together.requests.size(), 6u);
  for (const auto& r : together.requests) {
    if (r.request == "it0") {
      EXPECT_GE(r.latency_ns(), 550'000) << "a 600 us kernel";
    }
  }
  EXPECT_LT(replayer.last_issue_lag_p99_us(), 1000.0);
}

TEST_F(GpuReplay, ExecutableRunsTheNoShimStudy) {
  replay_gpu_test::ScratchDir dir;
  const std::string path = dir.write("small.jsonl", small_workload());
  int rc = 0;
  const std::string out = replay_gpu_test::run_command(
      std::string(REPLAY_GPU_EXE) + " " + path + " --simulate --json " + dir.path() + "/out.json", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("| policy | HP p50 ms (/ alone) |"), std::string::npos) << out;
  EXPECT_NE(out.find("| no-shim | "), std::string::npos) << out;
  EXPECT_NE(out.find("measured / simulated"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/out.json"));
}

}  // namespace
}  // namespace replay_gpu

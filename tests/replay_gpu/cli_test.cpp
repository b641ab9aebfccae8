// orion-replay-gpu's command line: --dry-run without CUDA, and every bad input refused with a
// message that names the problem, with a non-zero status.
#include <gtest/gtest.h>

#include "driver.h"
#include "test_util.h"

namespace {

using replay_gpu_test::run_command;

const std::string kExe = REPLAY_GPU_EXE;
const std::string kInference = OURGPIPE_WORKLOAD_DIR "/orion_inference_training.jsonl";

bool have_gpu() {
  try {
    replay_gpu::probe_device(0);
    return true;
  } catch (const replay_gpu::NoGpuError&) {
    return false;
  }
}

TEST(ReplayCli, DryRunPrintsThePlanWithoutCuda) {
  int rc = -1;
  const std::string out = run_command(kExe + " " + kInference + " --dry-run", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("5280 ops, 2 clients, 2 streams (1 high priority, 1 best effort"), std::string::npos) << out;
  EXPECT_NE(out.find("312 requests (310 closed loop)"), std::string::npos) << out;
  EXPECT_NE(out.find("plan for 132 SMs"), std::string::npos) << out;
  EXPECT_NE(out.find("total expected busy time"), std::string::npos) << out;
  const std::string small = run_command(kExe + " " + kInference + " --dry-run --sms 66", &rc);
  EXPECT_EQ(rc, 0) << small;
  EXPECT_NE(small.find("plan for 66 SMs"), std::string::npos) << small;
}

TEST(ReplayCli, MissingWorkloadFileIsNamed) {
  int rc = 0;
  const std::string out = run_command(kExe + " /nonexistent/w.jsonl --dry-run", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("/nonexistent/w.jsonl"), std::string::npos) << out;
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
}

TEST(ReplayCli, BadJsonlNamesFileAndLine) {
  replay_gpu_test::ScratchDir dir;
  const std::string bad = dir.write("bad.jsonl", "# comment\n{\"stream\": \"s\", oops}\n");
  int rc = 0;
  std::string out = run_command(kExe + " " + bad + " --dry-run", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("bad.jsonl:2: not valid JSON"), std::string::npos) << out;
  const std::string no_class = dir.write("noclass.jsonl", R"({"stream":"s","name":"k","grid":1,"block":32,"block_us":1})" "\n");
  out = run_command(kExe + " " + no_class + " --dry-run", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("noclass.jsonl:1: field \"class\""), std::string::npos) << out;
  const std::string too_big =
      dir.write("big.jsonl", R"({"stream":"s","class":"hp","name":"k","grid":1,"block":2048,"block_us":1})" "\n");
  out = run_command(kExe + " " + too_big + " --dry-run", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("big.jsonl:1: field \"block\""), std::string::npos) << out;
  EXPECT_NE(out.find("CUDA's block limits"), std::string::npos) << out;
}

// Arguments `bad` (after the workload) are refused with exit status `status` (any non-zero one
// for -1), naming `needle`; `good`, the same kind of argument done right, run.
void expect_refused_but(const std::string& bad, int status, const std::string& needle, const std::string& good) {
  int rc = 0;
  const std::string out = run_command(kExe + " " + kInference + " " + bad, &rc);
  if (status < 0) {
    EXPECT_NE(rc, 0) << out;
  } else {
    EXPECT_EQ(rc, status) << out;
  }
  EXPECT_NE(out.find(needle), std::string::npos) << out;
  const std::string ok = run_command(kExe + " " + kInference + " " + good, &rc);
  EXPECT_EQ(rc, 0) << ok;
}

// The shim takes ORION_BE_MAX_WAIT_US in whole microseconds: 0.5 gave it 0 (every best-effort
// head forced at once) while the simulator's prediction used 500 ns.
TEST(ReplayCli, AFractionOfAMicrosecondAsStarvationBoundIsRefused) {
  expect_refused_but("--dry-run --be-max-wait-us 0.5", -1, "--be-max-wait-us", "--dry-run --be-max-wait-us 500");
}

TEST(ReplayCli, UnknownPolicyIsRefusedListingTheKnownOnes) {
  int rc = 0;
  const std::string out = run_command(kExe + " " + kInference + " --policies orion,fastest --shim " + kExe, &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("fastest"), std::string::npos) << out;
  EXPECT_NE(out.find("partition"), std::string::npos) << out;  // the list of known policies
}

// A policy parameter is checked before any GPU work, as orion-sim checks it (even with --dry-run).
TEST(ReplayCli, BadPolicyParameterIsRefusedBeforeTheRun) {
  expect_refused_but("--policies orion --param bogus=1 --dry-run", 2,
                     "--policies orion: policy 'orion': unknown parameter 'bogus'",
                     "--policies orion --param dur_threshold_us=50 --dry-run");
}

TEST(ReplayCli, PoliciesNeedTheShim) {
  int rc = 0;
  const std::string out = run_command(kExe + " " + kInference + " --policies orion", &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--shim"), std::string::npos) << out;
}

TEST(ReplayCli, RealRunWithoutGpuSaysNoCudaDevice) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present here: the no-GPU error cannot be produced";
  int rc = 0;
  const std::string out = run_command(kExe + " " + kInference, &rc);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("no CUDA device"), std::string::npos) << out;
  EXPECT_NE(out.find("--dry-run"), std::string::npos) << out;  // what to do instead
}

}  // namespace

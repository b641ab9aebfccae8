// Metrics: GPU peak table and override, JSONL records, summary keys, LR schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "trainer/training/lr_schedule.h"
#include "trainer/device/device.h"
#include "trainer/metrics/metrics.h"

namespace gpipe {
namespace {

TEST(MetricsTest, PeakFlopsFromDeviceName) {
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA H200"), 989e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA H200 NVL"), 835e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA H800 PCIe"), 756e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA GH200 480GB"), 989e12);
  EXPECT_EQ(peak_flops_for_device_name("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_FALSE(peak_flops_for_device_name("cpu").has_value());
}

TEST(MetricsTest, PeakOverrideFromEnvironment) {
  ::setenv("OURGPIPE_PEAK_TFLOPS", "100", 1);
  EXPECT_EQ(peak_flops_override_from_env(), 100e12);
  ::setenv("OURGPIPE_PEAK_TFLOPS", "fast", 1);
  EXPECT_THROW(peak_flops_override_from_env(), std::invalid_argument);
  ::unsetenv("OURGPIPE_PEAK_TFLOPS");
  EXPECT_FALSE(peak_flops_override_from_env().has_value());
}

TEST(MetricsTest, JsonlAndSummary) {
  const std::string dir = testing::fresh_temp_dir("metrics_test");
  RunInfo info;
  info.schedule = "1f1b";
  info.executor = "async_threaded";
  info.device = "cuda";
  info.ranks = info.stages = 4;
  info.microbatches = 8;
  info.tokens_per_step = 1000;
  info.flops_per_token = 1e9;
  info.peak_flops_per_gpu = 1e12;
  info.num_gpus = 4;
  {
    MetricsLog log(dir, info);
    log.begin_at(0, /*resumed=*/false);
    for (int i = 0; i < 4; ++i) {
      IterationMetrics m;
      m.step = i;
      m.loss = 5.0 - i;
      // The first (warm-up) step and the profiled one (the profiler's overhead) are left out of means.
      m.profiled = i == 3;
      m.step_time_ms = i == 0 ? 900 : i == 3 ? 500 : 100;
      m.bubble_fraction = i == 0 ? 0.9 : i == 3 ? 0.8 : 0.3;
      m.peak_memory_bytes = 10 + i;
      if (i > 0) {  // the allocator's traffic, as a GPU run's steps report it
        m.device_mallocs = 2 * i;
        m.device_frees = 0;
        m.alloc_retries = i - 1;
        m.reserved_peak_bytes = 1 << 20;
      }
      log.add(m);
    }
    const auto s = log.summary();
    for (const char* key : {"tokens_per_s", "mfu", "bubble_fraction", "bubble_clock", "peak_memory_bytes", "step_time_ms_mean",
                            "final_loss", "first_loss", "steps", "schedule", "executor", "stages", "microbatches"}) {
      EXPECT_TRUE(s.contains(key)) << key;
    }
    EXPECT_DOUBLE_EQ(s["step_time_ms_mean"].get<double>(), 100.0);
    EXPECT_DOUBLE_EQ(s["tokens_per_s"].get<double>(), 10000.0);
    EXPECT_DOUBLE_EQ(s["mfu"].get<double>(), 1e9 * 1e4 / (1e12 * 4));
    EXPECT_DOUBLE_EQ(s["bubble_fraction"].get<double>(), 0.3);
    EXPECT_EQ(s["peak_memory_bytes"].get<int64_t>(), 13);
    EXPECT_EQ(s["first_loss"].get<double>(), 5.0);
    EXPECT_EQ(s["final_loss"].get<double>(), 2.0);
    EXPECT_EQ(s["steps"].get<int>(), 4);
    EXPECT_EQ(s["device_mallocs_after_first_step"].get<int>(), 2 + 4 + 6);  // steps 1 to 3
    EXPECT_EQ(s["alloc_retries"].get<int>(), 0 + 1 + 2);
    log.write_summary();
    EXPECT_NE(log.summary_text().find("MFU"), std::string::npos);
    EXPECT_NE(log.summary_text().find("CUDA allocator: 12 cudaMalloc after the first step | 3 retried"), std::string::npos)
        << log.summary_text();
  }
  std::ifstream jsonl(dir + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(jsonl, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("step").get<int>(), lines);
    EXPECT_EQ(j.at("profiled").get<bool>(), lines == 3);
    if (lines == 0) {
      for (const char* key : {"device_mallocs", "device_frees", "alloc_retries", "reserved_peak_bytes"}) {
        EXPECT_TRUE(j.at(key).is_null()) << key << " without allocator figures must be null, not 0";
      }
    } else {
      EXPECT_EQ(j.at("device_mallocs").get<int>(), 2 * lines);
      EXPECT_EQ(j.at("alloc_retries").get<int>(), lines - 1);
      EXPECT_EQ(j.at("reserved_peak_bytes").get<int64_t>(), 1 << 20);
    }
    ++lines;
  }
  EXPECT_EQ(lines, 4);
  std::ifstream summary(dir + "/summary.json");
  EXPECT_EQ(nlohmann::json::parse(summary).at("schedule"), "1f1b");
  testing::remove_tree(dir);
}

// A run resumed into its own output folder keeps the metrics of the steps before its checkpoint
// (the lines of steps it takes again go, and so does a line that is not a step's); a fresh run
// starts the file empty.
TEST(MetricsTest, AResumedRunKeepsTheEarlierStepsLines) {
  const std::string dir = testing::fresh_temp_dir("metrics_resume_test");
  auto run = [&](int64_t first, int64_t last, bool resumed) {
    MetricsLog log(dir, RunInfo{});
    log.begin_at(first, resumed);
    for (int64_t i = first; i < last; ++i) {
      IterationMetrics m;
      m.step = i;
      m.loss = 10.0 - static_cast<double>(i);
      log.add(m);
    }
  };
  auto steps = [&] {
    std::vector<int64_t> out;
    std::ifstream in(dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
    return out;
  };
  run(0, 5, false);  // steps 0-4; the checkpoint was at step 3
  { std::ofstream(dir + "/metrics.jsonl", std::ios::app) << "not json\n"; }
  run(3, 6, true);
  EXPECT_EQ(steps(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  run(0, 2, false);
  EXPECT_EQ(steps(), (std::vector<int64_t>{0, 1})) << "a fresh run starts the file empty";
  testing::remove_tree(dir);
}

// A full disk is an error naming the file, not metrics silently lost (/dev/full fails every write).
TEST(MetricsTest, AFailedWriteIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine to fail writes with";
  const std::string dir = testing::fresh_temp_dir("metrics_full");
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink("/dev/full", dir + "/metrics.jsonl");
  RunInfo info;
  info.device = "cpu";
  MetricsLog log(dir, info);
  log.begin_at(0, /*resumed=*/false);
  IterationMetrics m;
  m.step = 7;
  try {
    log.add(m);
    ADD_FAILURE() << "a write to /dev/full went unnoticed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos) << e.what();
  }
  testing::remove_tree(dir);
}

TEST(MetricsTest, CpuRunsHaveNoMfu) {
  const std::string dir = testing::fresh_temp_dir("metrics_cpu_test");
  RunInfo info;
  info.device = "cpu";
  info.flops_per_token = 1e9;
  MetricsLog log(dir, info);
  EXPECT_FALSE(log.mfu(1000.0).has_value());
  EXPECT_TRUE(log.summary()["mfu"].is_null());
  EXPECT_TRUE(log.summary()["alloc_retries"].is_null());
  EXPECT_NE(log.summary_text().find("n/a (CPU)"), std::string::npos);
  EXPECT_EQ(log.summary_text().find("CUDA allocator"), std::string::npos);
  testing::remove_tree(dir);
}

// The user's to fix: std::invalid_argument (gpipe_runner exits 2, as for --checkpoint-dir; it
// was a runtime_error, exit 1, a failed run).
TEST(MetricsTest, UnwritableOutputDirIsANamedError) {
  try {
    MetricsLog log("/proc/definitely/not/writable", RunInfo{});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("training.output_dir"), std::string::npos) << e.what();
  }
}

TEST(LrScheduleTest, WarmupThenCosineToFloor) {
  const double base = 1e-3;
  EXPECT_DOUBLE_EQ(learning_rate_at(0, 100, base, 10, 0.1), base / 10);
  EXPECT_DOUBLE_EQ(learning_rate_at(9, 100, base, 10, 0.1), base);
  EXPECT_DOUBLE_EQ(learning_rate_at(10, 100, base, 10, 0.1), base);
  EXPECT_NEAR(learning_rate_at(99, 100, base, 10, 0.1), 0.1 * base, 1e-12);
  EXPECT_NEAR(learning_rate_at(500, 100, base, 10, 0.1), 0.1 * base, 1e-12);
  const double mid = learning_rate_at(10 + 89 / 2, 100, base, 10, 0.1);
  EXPECT_GT(mid, 0.1 * base);
  EXPECT_LT(mid, base);
  for (int64_t s = 10; s < 99; ++s) {
    EXPECT_GE(learning_rate_at(s, 100, base, 10, 0.1), learning_rate_at(s + 1, 100, base, 10, 0.1));
  }
  EXPECT_DOUBLE_EQ(learning_rate_at(0, 1, base, 0, 0.1), base);
}

// The planner reads the allocator's baseline before the process has made any CUDA tensor; on the
// H100 that threw "Invalid device argument" (the caching allocator was not initialized yet). A
// threadsafe death test runs the body in a freshly exec'd process, where CUDA is untouched.
TEST(AllocationStatsCudaTest, ReadableBeforeTheFirstCudaTensor) {
  if (!cuda_usable()) GTEST_SKIP() << "GPU-only: no CUDA device visible (runs in ctest -L gpu on the GPU machine)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const c10::Device gpu(c10::kCUDA, 0);
        const bool ok = allocated_bytes(gpu) == 0 && peak_allocated_bytes({gpu}) == 0;
        reset_peak_allocated({gpu});
        reset_peak_memory({gpu});
        std::exit(ok && peak_memory_bytes({gpu}) == 0 ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gpipe

// A best-effort CUDA job over the fake driver, for `scripts/colocate_demo.py --job cuda` (issue
// 25): run under the shim with ORION_POLICY=gpud, it launches kernels nonstop on a priority-0
// stream and on the legacy stream (PyTorch's default), while a thread watches the pipeline's page
// and this GPU's grant as an observer client. At the end it checks, from the fake driver's log
// (each call stamped with CLOCK_MONOTONIC), that every launch that reached the driver while the
// daemon gated best effort (a live pipeline) did so inside a window the pipeline had published,
// and prints the counts as JSON. Exit 0 when launches went inside windows and none outside.
//
//   LD_PRELOAD=libgpu_scheduler.so LD_LIBRARY_PATH=<fake_driver> USE_ORION_SCHEDULER=1
//   ORION_POLICY=gpud ORION_POLICY_PARAMS=gpu=<uuid>,dir=<dir> icpt_gpud_be_job --gpu <uuid> --dir <dir>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "fake_cuda.h"
#include "gpud/gpud.h"

namespace {

struct Span {
  int64_t begin = 0, end = 0;
};

// What the observer saw: the windows (a window published again with the same open, cut short by
// demand, keeps its latest close) and the periods the daemon gated best effort.
struct Observed {
  std::mutex mu;
  std::vector<Span> windows;
  std::vector<Span> gated;
  // Between two samples that show more than one publication, what happened is not known (a window
  // cut or replaced unseen): launches there are counted as neither inside nor outside.
  std::vector<Span> unverifiable;
};

void watch(const gpud::Client& observer, const std::atomic<bool>& stop, Observed& seen) {
  bool was_gated = false;
  uint64_t last_published = 0;
  int64_t last_sample = gpud::monotonic_ns();
  while (!stop.load()) {
    const gpud::WindowView w = gpud::read_window(observer.pipeline());
    const int64_t now = gpud::monotonic_ns();
    // Gated, and the pipeline's page live: launches must fall in its windows (a pipeline that left
    // resets its page at once, the grant follows at the daemon's next tick; admit() holds in
    // between, which this check does not require).
    const bool gated = gpud::read_grant(observer.grant()).mode == gpud::GrantMode::kGated && w.heartbeat_ns > 0 &&
                       now - w.heartbeat_ns < 50'000'000;
    {
      std::lock_guard<std::mutex> lock(seen.mu);
      if (w.windows_published > last_published + 1) {
        // Publications missed: the window seen last was verified only up to the last sample.
        if (!seen.windows.empty()) seen.windows.back().end = std::min(seen.windows.back().end, last_sample);
        seen.unverifiable.push_back({last_sample, now});
        seen.windows.push_back({0, 0});  // the next window starts a new entry even with the same open
      }
      last_published = w.windows_published;
      last_sample = now;
      if (w.windows_published > 0 && w.close_ns > w.open_ns) {
        if (!seen.windows.empty() && seen.windows.back().begin == w.open_ns) {
          seen.windows.back().end = w.close_ns;
        } else {
          seen.windows.push_back({w.open_ns, w.close_ns});
        }
      }
      if (gated && !was_gated) seen.gated.push_back({now, now});
      if (gated) seen.gated.back().end = now;
    }
    was_gated = gated;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

bool inside(const std::vector<Span>& spans, int64_t t, int64_t before, int64_t after) {
  for (const Span& s : spans) {
    if (t >= s.begin - before && t < s.end + after) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A best-effort CUDA job over the fake driver, checked against the pipeline's windows"};
  std::string gpu, dir;
  double seconds = 8, kernel_us = 200, gap_us = 100;
  app.add_option("--gpu", gpu, "The GPU UUID orion-gpud serves")->required();
  app.add_option("--dir", dir, "orion-gpud's runtime folder")->required();
  app.add_option("--seconds", seconds, "How long to launch")->capture_default_str();
  app.add_option("--kernel-us", kernel_us, "Each kernel's length on the fake GPU")->capture_default_str();
  app.add_option("--gap-us", gap_us, "CPU time between launches")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  CUdevice device = 0;
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&device, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS || cuCtxSetCurrent(context) != CUDA_SUCCESS ||
      cuStreamCreateWithPriority(&stream, 0, 0) != CUDA_SUCCESS) {
    std::cerr << "icpt_gpud_be_job: the (fake) driver did not start: is LD_LIBRARY_PATH its folder?\n";
    return 2;
  }
  CUfunction kernel = fake_cuda_make_function("be_job_gemm", 0, nullptr);
  fake_cuda_set_kernel_duration_ns(kernel, static_cast<int64_t>(kernel_us * 1e3));

  Observed seen;
  std::atomic<bool> stop{false};
  gpud::Client observer = gpud::Client::connect(dir, gpu, gpud::Role::kBestEffort, "be-job observer");
  std::thread watcher([&] { watch(observer, stop, seen); });

  const int64_t start = gpud::monotonic_ns(), end = start + static_cast<int64_t>(seconds * 1e9);
  uint64_t launched = 0;
  int rc = 0;
  while (gpud::monotonic_ns() < end && rc == 0) {
    // Alternate a created stream and the legacy stream: the whole process is gated.
    rc = cuLaunchKernel(kernel, 1, 1, 1, 128, 1, 1, 0, launched % 2 ? stream : nullptr, nullptr, nullptr);
    ++launched;
    if (launched % 64 == 0) (void)cuStreamQuery(stream);  // polls, forces nothing out
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(gap_us)));
  }
  const int64_t stopped = gpud::monotonic_ns();
  stop = true;
  watcher.join();
  if (rc != 0) {
    std::cerr << "icpt_gpud_be_job: cuLaunchKernel returned " << rc << "\n";
    return 1;
  }

  // Launches that reached the driver while the daemon gated best effort (1 ms inside each gated
  // period, for the observer's 20 us sampling and a tick's lag), each inside a window or not (2 ms
  // of slack after a close: an admission made just before a cut reaches the driver after it, later
  // still when the 2-core machine preempts the thread in between; a launch that ignored the windows
  // lands anywhere in the pipeline's busy time, hundreds of ms here).
  uint64_t gated = 0, in_window = 0, outside = 0, reached = 0;
  std::vector<double> late_us;  // outside launches: how long after a window's close (-1: before any)
  std::vector<Span> gated_core;
  for (const Span& g : seen.gated) {
    if (g.end - g.begin > 2'000'000) gated_core.push_back({g.begin + 1'000'000, g.end - 1'000'000});
  }
  for (size_t i = 0, n = fake_cuda_call_count(); i < n; ++i) {
    fake_cuda_call c{};
    if (fake_cuda_get_call(i, &c) != 0 || std::strncmp(c.name, "cuLaunch", 8) != 0 ||
        c.function != reinterpret_cast<uint64_t>(kernel) || c.time_ns > stopped) {
      continue;
    }
    ++reached;
    if (!inside(gated_core, c.time_ns, 0, 0) || inside(seen.unverifiable, c.time_ns, 0, 0)) continue;
    ++gated;
    if (inside(seen.windows, c.time_ns, 0, 2'000'000)) {
      ++in_window;
    } else {
      ++outside;
      int64_t since_close = -1;  // after the latest window that closed before it
      for (const Span& w : seen.windows) {
        if (w.end <= c.time_ns) since_close = c.time_ns - w.end;
      }
      late_us.push_back(since_close < 0 ? -1.0 : static_cast<double>(since_close) / 1e3);
    }
  }
  const nlohmann::json out = {{"launched", launched},          {"reached_driver", reached},
                              {"while_gated", gated},          {"inside_windows", in_window},
                              {"outside_windows", outside},    {"windows_seen", seen.windows.size()},
                              {"gated_periods", seen.gated.size()},
                              {"unverifiable_spans", seen.unverifiable.size()},
                              {"outside_us_after_close", late_us}};
  std::cout << out.dump() << std::endl;
  return in_window > 0 && outside == 0 ? 0 : 1;
}

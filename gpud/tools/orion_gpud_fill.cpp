// orion-gpud-fill: a best-effort job for trying bubble filling without a GPU. It does work in
// chunks of --chunk-us of CPU (standing in for kernels of a known length), each admitted by
// gpud::admit against the pipeline's published window and its grant, for --seconds; with
// --unmanaged it runs every chunk at once (no daemon), the co-location a researcher has today.
// Prints one JSON line: work done, chunks admitted, polls held, and why.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "gpud/gpud.h"

namespace {
void spin_for(int64_t ns) {
  const int64_t end = gpud::monotonic_ns() + ns;
  volatile uint64_t x = 0;
  while (gpud::monotonic_ns() < end) x = x + 1;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"orion-gpud-fill: a best-effort CPU job admitted into a pipeline's idle windows"};
  std::string gpu, dir, fallback = "hold";
  double seconds = 10, chunk_us = 500;
  bool unmanaged = false;
  app.add_option("--gpu", gpu, "the GPU's UUID served by orion-gpud");
  app.add_option("--dir", dir, "orion-gpud's runtime folder");
  app.add_option("--seconds", seconds, "how long to run")->check(CLI::PositiveNumber);
  app.add_option("--chunk-us", chunk_us, "one unit of work (a 'kernel' of known length)")->check(CLI::PositiveNumber);
  app.add_option("--fallback", fallback, "when the daemon is gone: hold or pass")->check(CLI::IsMember({"hold", "pass"}));
  app.add_flag("--unmanaged", unmanaged, "run every chunk at once, no daemon (the reference)");
  CLI11_PARSE(app, argc, argv);
  if (!unmanaged && gpu.empty()) {
    std::fprintf(stderr, "orion-gpud-fill: --gpu is required unless --unmanaged\n");
    return 2;
  }
  try {
    std::optional<gpud::Client> client;
    if (!unmanaged) {
      client.emplace(gpud::Client::connect(dir.empty() ? gpud::default_runtime_dir() : std::filesystem::path(dir), gpu,
                                           gpud::Role::kBestEffort, "orion-gpud-fill"));
    }
    gpud::AdmissionConfig config;
    config.fallback = fallback == "pass" ? gpud::Fallback::kPassThrough : gpud::Fallback::kHold;
    const auto chunk_ns = static_cast<int64_t>(chunk_us * 1e3);
    const int64_t start = gpud::monotonic_ns(), end = start + static_cast<int64_t>(seconds * 1e9);
    int64_t work_ns = 0, chunks = 0, held = 0;
    std::map<std::string, int64_t> reasons;
    // A daemon killed mid-write leaves the grant page torn for good: held only while the last good
    // lease runs, then --fallback applies (it used to hold for ever, even with pass).
    std::atomic<int64_t> last_good_lease_ns{0};
    while (gpud::monotonic_ns() < end) {
      if (client) {
        const int64_t now = gpud::monotonic_ns();
        const gpud::Decision d = gpud::admit(gpud::read_window(client->pipeline()),
                                             gpud::read_grant_keeping_lease(client->grant(), now, last_good_lease_ns),
                                             now, chunk_ns, 0, config);
        ++reasons[d.reason];
        if (d.verdict == gpud::Verdict::kHold) {
          ++held;
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          continue;
        }
        if (d.in_window) gpud::record_admitted(client->usage(), chunk_ns);  // orion-gpud status: bubbles filled
      }
      spin_for(chunk_ns);
      work_ns += chunk_ns;
      ++chunks;
    }
    const double wall = static_cast<double>(gpud::monotonic_ns() - start) / 1e9;
    nlohmann::json out = {{"managed", !unmanaged}, {"wall_s", wall}, {"work_s", static_cast<double>(work_ns) / 1e9},
                          {"work_share", static_cast<double>(work_ns) / 1e9 / wall}, {"chunks", chunks},
                          {"held_polls", held}, {"reasons", reasons}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-gpud-fill: error: %s\n", e.what());
    return 1;
  }
}

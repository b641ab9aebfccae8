// orion-gpud: the per-GPU daemon of cross-process bubble filling, and its status command.
//   orion-gpud serve  --gpu UUID [--dir D] [--allow-uid U ...] [--lease-ms 500] [--stale-ms 200]
//   orion-gpud status --gpu UUID [--dir D]          # clients, grants, the pipeline's windows (JSON)
// The GPU's UUID comes from `nvidia-smi -L` (one daemon per GPU per node; scripts/slurm starts one
// per GPU of a node). The runtime folder is $ORION_GPUD_DIR, else $XDG_RUNTIME_DIR/orion-gpud,
// else /tmp/orion-gpud-<uid>.
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "gpud/gpud.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"orion-gpud: one per GPU; the pipeline publishes its idle windows, best-effort processes fill them"};
  app.require_subcommand(1);
  std::string gpu, dir;
  std::vector<uid_t> allowed;
  double lease_ms = 500, stale_ms = 200, budget_us = 2000;
  auto* serve = app.add_subcommand("serve", "serve one GPU until SIGINT, SIGTERM or SIGHUP");
  serve->add_option("--gpu", gpu, "the GPU's UUID (nvidia-smi -L)")->required();
  serve->add_option("--dir", dir, "runtime folder (default: $ORION_GPUD_DIR, $XDG_RUNTIME_DIR/orion-gpud, /tmp/orion-gpud-<uid>)");
  serve->add_option("--allow-uid", allowed, "other uids that may connect (the socket is then open to all, "
                                            "SO_PEERCRED decides); clients trust only a daemon of their own "
                                            "uid or root, so a daemon shared by several users runs as root");
  // Bounds that can work: a lease must outlive several 10 ms ticks (renewed every tick), a pipeline
  // heartbeats every 5 ms, and an hour is far past any use (and far from int64 nanoseconds).
  serve->add_option("--lease-ms", lease_ms, "a best-effort grant's lease, renewed every 10 ms tick")
      ->check(CLI::Range(50.0, 3.6e6));
  serve->add_option("--stale-ms", stale_ms, "a pipeline heartbeat older than this frees best-effort work (the "
                                            "pipeline beats every 5 ms)")
      ->check(CLI::Range(20.0, 3.6e6));
  serve->add_option("--inflight-budget-us", budget_us, "best-effort work allowed in flight in a window")
      ->check(CLI::Range(1.0, 3.6e9));
  auto* status = app.add_subcommand("status", "print the daemon's clients, grants and the pipeline's windows");
  status->add_option("--gpu", gpu, "the GPU's UUID")->required();
  status->add_option("--dir", dir, "runtime folder");
  CLI11_PARSE(app, argc, argv);

  try {
    if (*serve) {
      // Not dumpable: a process of the same uid cannot open the daemon's descriptors through
      // /proc/<pid>/fd (the pipeline page read-write, every client's usage page) or ptrace it.
      ::prctl(PR_SET_DUMPABLE, 0);
      gpud::DaemonOptions o;
      o.gpu = gpu;
      o.dir = dir;
      o.allowed_uids = allowed;
      o.grants.lease_ns = static_cast<int64_t>(lease_ms * 1e6);
      o.grants.stale_after_ns = static_cast<int64_t>(stale_ms * 1e6);
      o.grants.inflight_budget_ns = static_cast<int64_t>(budget_us * 1e3);
      gpud::Daemon daemon(o);
      std::signal(SIGINT, on_signal);
      std::signal(SIGTERM, on_signal);
      std::signal(SIGHUP, on_signal);  // a closed terminal stops it in order: grants revoked
      std::signal(SIGPIPE, SIG_IGN);
      spdlog::info("orion-gpud: serving GPU {} on {}", gpu, daemon.socket().string());
      daemon.run(g_stop);
      spdlog::info("orion-gpud: stopped");
      return 0;
    }
    gpud::Client c = gpud::Client::connect(dir.empty() ? gpud::default_runtime_dir() : std::filesystem::path(dir), gpu,
                                           gpud::Role::kObserver, "orion-gpud status");
    std::cout << c.status().dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-gpud: error: %s\n", e.what());
    return 1;
  }
}

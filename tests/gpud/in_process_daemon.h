// orion-gpud on a thread of the test process, for the daemon's own tests and its clients' tests.
#pragma once

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "gpud/gpud.h"

namespace gpud::testing {

// A fresh short folder (a Unix socket path must fit in 108 bytes), removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/gpudtXXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A daemon serving `options` (in the caller's folder) until scope exit.
struct DaemonThread {
  std::atomic<bool> stop{false};
  std::unique_ptr<Daemon> daemon;
  std::thread server;
  explicit DaemonThread(DaemonOptions options) : daemon(std::make_unique<Daemon>(std::move(options))) {
    server = std::thread([this] { daemon->run(stop); });
  }
  ~DaemonThread() {
    stop = true;
    server.join();
  }
};

// A heartbeat stale only after 10 s: for tests in which the pipeline leaves by disconnecting, so
// that a heartbeat thread starved on a loaded machine never frees held work by itself.
inline GrantConfig patient_grants() {
  GrantConfig g;
  g.stale_after_ns = 10'000'000'000;
  return g;
}

// A daemon for `gpu` in a folder of its own, ticking every `tick_ns`.
struct InProcessDaemon {
  TempDir folder;
  const std::filesystem::path& dir = folder.path;
  DaemonOptions options;
  std::unique_ptr<DaemonThread> running;

  explicit InProcessDaemon(const std::string& gpu, int64_t tick_ns = 2'000'000, GrantConfig grants = {}) {
    options.gpu = gpu;
    options.dir = dir;
    options.tick_ns = tick_ns;
    options.grants = grants;
    running = std::make_unique<DaemonThread>(options);
  }
};

}  // namespace gpud::testing

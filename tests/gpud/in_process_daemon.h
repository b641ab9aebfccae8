// An orion-gpud on a thread of the test process, in a fresh short folder (a Unix socket path must
// fit in 108 bytes), stopped and removed at scope exit. For tests of orion-gpud's clients.
#pragma once

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "gpud/gpud.h"

namespace gpud::testing {

struct InProcessDaemon {
  std::filesystem::path dir;
  DaemonOptions options;
  std::atomic<bool> stop{false};
  std::unique_ptr<Daemon> daemon;
  std::thread server;

  explicit InProcessDaemon(const std::string& gpu, int64_t tick_ns = 2'000'000) {
    char tmpl[] = "/tmp/gpudtXXXXXX";
    dir = mkdtemp(tmpl);
    options.gpu = gpu;
    options.dir = dir;
    options.tick_ns = tick_ns;
    daemon = std::make_unique<Daemon>(options);
    server = std::thread([this] { daemon->run(stop); });
  }
  ~InProcessDaemon() {
    stop = true;
    server.join();
    daemon.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace gpud::testing

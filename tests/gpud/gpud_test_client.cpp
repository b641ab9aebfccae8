// A client process for the daemon's tests: attaches in a role, says "attached <id>" on stdout,
// then (pipeline) heartbeats and publishes a window every --heartbeat-ms, or (best effort) waits,
// until killed. Separate processes, so the tests can kill each party for real. With --leave it
// then closes its connection (says "left") and goes on writing through its mapping: a pipeline
// that left but lives on.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "gpud/gpud.h"

namespace {
// Shuts this process's connection to the daemon (its only socket) down, keeping the Client and
// so its mapping of the pipeline page.
void leave_connection() {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) shutdown(fd, SHUT_RDWR);
  }
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpud test client"};
  std::string dir, gpu, role_name = "best_effort";
  int heartbeat_ms = 5;
  int as_uid = -1;
  bool leave = false;
  app.add_option("--dir", dir)->required();
  app.add_option("--gpu", gpu)->required();
  app.add_option("--role", role_name)->check(CLI::IsMember({"pipeline", "best_effort"}));
  app.add_option("--heartbeat-ms", heartbeat_ms)->check(CLI::PositiveNumber);
  app.add_option("--as-uid", as_uid, "become this uid first (root only); print why a refusal came");
  app.add_flag("--leave", leave, "after attaching, close the connection and go on writing the page");
  CLI11_PARSE(app, argc, argv);
  if (as_uid >= 0 && setuid(static_cast<uid_t>(as_uid)) != 0) {
    std::printf("setuid failed\n");
    return 2;
  }
  try {
    const gpud::Role role = *gpud::role_from_string(role_name);
    gpud::Client client = gpud::Client::connect(dir, gpu, role, "test-" + role_name);
    std::printf("attached %d\n", client.id());
    if (leave) {
      leave_connection();
      std::printf("left\n");
    }
    std::fflush(stdout);
    for (;;) {
      if (role == gpud::Role::kPipeline) {
        const int64_t now = gpud::monotonic_ns();
        gpud::heartbeat(client.pipeline_writable(), now);
        gpud::publish_window(client.pipeline_writable(), now, now + 1'000'000'000);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(heartbeat_ms));
    }
  } catch (const std::exception& e) {
    std::printf("refused: %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
